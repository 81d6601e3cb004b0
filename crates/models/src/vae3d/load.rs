//! Loading and saving 3D-VAE checkpoints in the reference's layout.
//!
//! Reference: mlkh21/4D-Radar `diffusion_consistency_radar/cm/vae_3d.py` @ 08c7eb9. A
//! checkpoint directory holds `config.json` (the `VAE3D` constructor arguments plus
//! `"type": "vae3d"`) and `model.safetensors` (its `state_dict()`). vramlab's parameter names
//! equal the reference's keys, so loading needs no remap table, and vramlab writes its own
//! checkpoints in the same layout: either side can read the other's.

use std::path::Path;

use crate::nn::LeanBackend;

use super::config::Vae3dConfig;
use super::model::Vae3d;
use crate::policy::{CONFIG_FILE, CheckpointError, WEIGHTS_FILE, write_config_file};
use crate::weights::{WeightError, load_safetensors, save_safetensors};


/// A checkpoint could not be read or written (the same error for every model).
pub type Vae3dLoadError = CheckpointError;

/// Read `dir/config.json` and `dir/model.safetensors` (a reference checkpoint or one written
/// by [`save_pretrained`]). Every parameter must be present with the right shape, and every
/// tensor in the file must be used.
pub fn load_pretrained<B: LeanBackend>(dir: &Path, device: &B::Device) -> Result<(Vae3dConfig, Vae3d<B>), Vae3dLoadError> {
    let config = Vae3dConfig::from_json_file(&dir.join(CONFIG_FILE))?;
    let model = load_weights(config.init(device), &dir.join(WEIGHTS_FILE))?;
    Ok((config, model))
}

/// Load a reference-named safetensors file into an already built model.
pub fn load_weights<B: LeanBackend>(model: Vae3d<B>, path: &Path) -> Result<Vae3d<B>, WeightError> {
    load_safetensors(model, path, |k| Some(k.to_string()))
}

/// Write `dir/config.json` (reference format, see [`Vae3dConfig::to_reference_json`]) and
/// `dir/model.safetensors` (f32, reference key names). Creates `dir` if needed.
pub fn save_pretrained<B: LeanBackend>(config: &Vae3dConfig, model: &Vae3d<B>, dir: &Path) -> Result<(), Vae3dLoadError> {
    write_config_file(dir, &serde_json::to_string_pretty(&config.to_reference_json()).expect("a JSON value always serializes"))?;
    save_safetensors(model, &dir.join(WEIGHTS_FILE))?;
    Ok(())
}
