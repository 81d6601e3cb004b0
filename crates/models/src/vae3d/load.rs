//! Loading and saving 3D-VAE checkpoints in the reference's layout.
//!
//! Reference: mlkh21/4D-Radar `diffusion_consistency_radar/cm/vae_3d.py` @ 08c7eb9. A
//! checkpoint directory holds `config.json` (the `VAE3D` constructor arguments plus
//! `"type": "vae3d"`) and `model.safetensors` (its `state_dict()`). vramlab's parameter names
//! equal the reference's keys, so loading needs no remap table, and vramlab writes its own
//! checkpoints in the same layout: either side can read the other's.

use std::path::{Path, PathBuf};

use burn::prelude::*;

use super::config::{Vae3dConfig, Vae3dConfigError};
use super::model::Vae3d;
use crate::weights::{WeightError, load_safetensors, save_safetensors};

/// File names inside a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";

/// A checkpoint could not be read or written; each variant names the file (and the field or
/// weight key where there is one).
#[derive(Debug, thiserror::Error)]
pub enum Vae3dLoadError {
    #[error(transparent)]
    Config(#[from] Vae3dConfigError),
    #[error(transparent)]
    Weights(#[from] WeightError),
    #[error("{path}: cannot write: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Read `dir/config.json` and `dir/model.safetensors` (a reference checkpoint or one written
/// by [`save_pretrained`]). Every parameter must be present with the right shape, and every
/// tensor in the file must be used.
pub fn load_pretrained<B: Backend>(dir: &Path, device: &B::Device) -> Result<(Vae3dConfig, Vae3d<B>), Vae3dLoadError> {
    let config = Vae3dConfig::from_json_file(&dir.join(CONFIG_FILE))?;
    let model = load_weights(config.init(device), &dir.join(WEIGHTS_FILE))?;
    Ok((config, model))
}

/// Load a reference-named safetensors file into an already built model.
pub fn load_weights<B: Backend>(model: Vae3d<B>, path: &Path) -> Result<Vae3d<B>, WeightError> {
    load_safetensors(model, path, |k| Some(k.to_string()))
}

/// Write `dir/config.json` (reference format, see [`Vae3dConfig::to_reference_json`]) and
/// `dir/model.safetensors` (f32, reference key names). Creates `dir` if needed.
pub fn save_pretrained<B: Backend>(config: &Vae3dConfig, model: &Vae3d<B>, dir: &Path) -> Result<(), Vae3dLoadError> {
    std::fs::create_dir_all(dir).map_err(|source| Vae3dLoadError::Write { path: dir.to_path_buf(), source })?;
    let path = dir.join(CONFIG_FILE);
    let mut text = serde_json::to_string_pretty(&config.to_reference_json()).expect("a JSON value always serializes");
    text.push('\n');
    std::fs::write(&path, text).map_err(|source| Vae3dLoadError::Write { path, source })?;
    save_safetensors(model, &dir.join(WEIGHTS_FILE))?;
    Ok(())
}
