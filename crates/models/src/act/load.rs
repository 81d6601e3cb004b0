//! Loading and saving ACT checkpoints in lerobot's `pretrained_model/` layout.
//!
//! A lerobot directory holds `config.json` ([`ActConfig`]'s JSON) and `model.safetensors`,
//! the `ACTPolicy` state dict: the `ACT` module's keys under the policy's `model.` prefix
//! (`model.backbone.layer1.0.conv1.weight`, `model.vae_encoder_pos_enc`, …). vramlab's
//! parameter names are the `ACT` module's, so loading strips `model.` and saving adds it:
//! either side reads the other's files. Every weight must be present with the right shape
//! and every file tensor must be used (errors name the file and the key).
//!
//! Checkpoints written by lerobot before 0.4 also hold the policy's normalisation buffers
//! (`normalize_inputs.*`, `normalize_targets.*`, `unnormalize_outputs.*`): data statistics,
//! not model weights; they are skipped (see [`NORMALIZATION_PREFIXES`]).

use std::path::Path;

use crate::nn::LeanBackend;

use super::config::ActConfig;
use super::model::Act;
use crate::policy::{CONFIG_FILE, CheckpointError, NORMALIZATION_PREFIXES, WEIGHTS_FILE, write_config_file};
use crate::weights::{WeightError, load_safetensors, named_tensors, write_safetensors};

/// The policy's attribute holding the `ACT` module: the prefix of every model key.
pub const KEY_PREFIX: &str = "model.";

/// A checkpoint could not be read or written (the same error for every model).
pub type ActLoadError = CheckpointError;

/// A lerobot file key → the model's name: `model.` stripped; normalisation buffers skipped
/// (`None`); any other key is kept as is (so it is reported as unused).
pub fn model_key(file_key: &str) -> Option<String> {
    if NORMALIZATION_PREFIXES.iter().any(|p| file_key.starts_with(p)) {
        return None;
    }
    Some(file_key.strip_prefix(KEY_PREFIX).unwrap_or(file_key).to_string())
}

/// Read `dir/config.json` and `dir/model.safetensors` of any lerobot ACT `pretrained_model/`
/// directory (or one written by [`save_pretrained`]). With `freeze_backbone` in the config
/// the backbone comes back frozen.
pub fn load_pretrained<B: LeanBackend>(dir: &Path, device: &B::Device) -> Result<(ActConfig, Act<B>), ActLoadError> {
    let config = ActConfig::from_json_file(&dir.join(CONFIG_FILE))?;
    let model = load_weights(config.init(device), &dir.join(WEIGHTS_FILE))?;
    Ok((config, model))
}

/// Load a lerobot-named safetensors file into an already built model (`require_grad` flags
/// are kept).
pub fn load_weights<B: LeanBackend>(model: Act<B>, path: &Path) -> Result<Act<B>, WeightError> {
    load_safetensors(model, path, model_key)
}

/// Write the model's tensors (parameters and buffers, f32) under lerobot's `model.` names.
pub fn save_weights<B: LeanBackend>(model: &Act<B>, path: &Path) -> Result<(), WeightError> {
    let tensors: Vec<_> = named_tensors::<B, _>(model).into_iter().map(|(k, v)| (format!("{KEY_PREFIX}{k}"), v)).collect();
    write_safetensors(&tensors, path)
}

/// Write `dir/config.json` (lerobot format, `"type": "act"`) and `dir/model.safetensors`
/// (lerobot key names). Creates `dir` if needed.
pub fn save_pretrained<B: LeanBackend>(config: &ActConfig, model: &Act<B>, dir: &Path) -> Result<(), ActLoadError> {
    write_config_file(dir, &config.to_json_string())?;
    save_weights(model, &dir.join(WEIGHTS_FILE))?;
    Ok(())
}
