//! Loading and saving Diffusion Policy checkpoints in lerobot's `pretrained_model/` layout.
//!
//! A lerobot directory holds `config.json` ([`DiffusionConfig`]'s JSON) and
//! `model.safetensors`, the `DiffusionPolicy` state dict: the `DiffusionModel`'s keys under
//! the policy's `diffusion.` prefix. vramlab's names are the model's, except the backbone:
//! lerobot keeps the trunk as an `nn.Sequential` (`rgb_encoder.backbone.0.weight`,
//! `rgb_encoder.backbone.4.0.conv1.weight`, with per-camera encoders
//! `rgb_encoder.<i>.backbone.…`), vramlab as [`crate::resnet::ResNet`] with torchvision's
//! names (`conv1.weight`, `layer1.0.conv1.weight`). [`model_key`] and [`file_key`] map both
//! ways, so either side reads the other's files. Every weight must be present with the right
//! shape and every file tensor must be used (errors name the file and the key).
//!
//! Pre-0.4 lerobot checkpoints' normalisation buffers (`normalize_inputs.*`, …) are skipped.

use std::path::Path;

use crate::nn::LeanBackend;

use super::config::DiffusionConfig;
use super::model::Diffusion;
use crate::resnet::torchvision_key_from_sequential;
use crate::policy::{CONFIG_FILE, CheckpointError, NORMALIZATION_PREFIXES, WEIGHTS_FILE, write_config_file};
use crate::weights::{WeightError, load_safetensors, named_tensors, write_safetensors};

/// The policy's attribute holding the `DiffusionModel`: the prefix of every model key.
pub const KEY_PREFIX: &str = "diffusion.";

/// A checkpoint could not be read or written (the same error for every model).
pub type DiffusionLoadError = CheckpointError;

/// Split `rgb_encoder.backbone.<rest>` / `rgb_encoder.<i>.backbone.<rest>` into
/// (`"rgb_encoder.backbone."` or `"rgb_encoder.<i>.backbone."`, `<rest>`).
fn split_backbone(key: &str) -> Option<(&str, &str)> {
    let after = key.strip_prefix("rgb_encoder.")?;
    let head_len = if after.starts_with("backbone.") {
        "rgb_encoder.backbone.".len()
    } else {
        let (idx, tail) = after.split_once('.')?;
        if !idx.bytes().all(|b| b.is_ascii_digit()) || !tail.starts_with("backbone.") {
            return None;
        }
        "rgb_encoder.".len() + idx.len() + 1 + "backbone.".len()
    };
    Some(key.split_at(head_len))
}

/// torchvision child name → index in `nn.Sequential(*resnet.children()[:-2])` (inverse of
/// [`torchvision_key_from_sequential`]).
fn sequential_key_from_torchvision(key: &str) -> String {
    let (head, rest) = key.split_once('.').unwrap_or((key, ""));
    let idx = match head {
        "conv1" => "0",
        "bn1" => "1",
        "layer1" => "4",
        "layer2" => "5",
        "layer3" => "6",
        "layer4" => "7",
        _ => return key.to_string(),
    };
    if rest.is_empty() { idx.to_string() } else { format!("{idx}.{rest}") }
}

/// A lerobot file key → the model's name: `diffusion.` stripped, backbone Sequential indices
/// mapped to torchvision names; normalisation buffers skipped (`None`); other keys kept as
/// they are (so they are reported as unused).
pub fn model_key(file_key: &str) -> Option<String> {
    if NORMALIZATION_PREFIXES.iter().any(|p| file_key.starts_with(p)) {
        return None;
    }
    let key = file_key.strip_prefix(KEY_PREFIX).unwrap_or(file_key);
    Some(match split_backbone(key) {
        Some((head, rest)) => format!("{head}{}", torchvision_key_from_sequential(rest)),
        None => key.to_string(),
    })
}

/// The model's name → lerobot's file key (inverse of [`model_key`]).
pub fn file_key(model_key: &str) -> String {
    let key = match split_backbone(model_key) {
        Some((head, rest)) => format!("{head}{}", sequential_key_from_torchvision(rest)),
        None => model_key.to_string(),
    };
    format!("{KEY_PREFIX}{key}")
}

/// Read `dir/config.json` and `dir/model.safetensors` of a lerobot Diffusion Policy
/// `pretrained_model/` directory (or one written by [`save_pretrained`]).
pub fn load_pretrained<B: LeanBackend>(dir: &Path, device: &B::Device) -> Result<(DiffusionConfig, Diffusion<B>), DiffusionLoadError> {
    let config = DiffusionConfig::from_json_file(&dir.join(CONFIG_FILE))?;
    let model = load_weights(config.init(device), &dir.join(WEIGHTS_FILE))?;
    Ok((config, model))
}

/// Load a lerobot-named safetensors file into an already built model (`require_grad` flags
/// are kept).
pub fn load_weights<B: LeanBackend>(model: Diffusion<B>, path: &Path) -> Result<Diffusion<B>, WeightError> {
    load_safetensors(model, path, model_key)
}

/// Write the model's tensors (parameters and the `pos_grid` buffers, f32) under lerobot's names.
pub fn save_weights<B: LeanBackend>(model: &Diffusion<B>, path: &Path) -> Result<(), WeightError> {
    let tensors: Vec<_> = named_tensors::<B, _>(model).into_iter().map(|(k, v)| (file_key(&k), v)).collect();
    write_safetensors(&tensors, path)
}

/// Write `dir/config.json` (lerobot format, `"type": "diffusion"`) and `dir/model.safetensors`
/// (lerobot key names). Creates `dir` if needed.
pub fn save_pretrained<B: LeanBackend>(config: &DiffusionConfig, model: &Diffusion<B>, dir: &Path) -> Result<(), DiffusionLoadError> {
    write_config_file(dir, &config.to_json_string())?;
    save_weights(model, &dir.join(WEIGHTS_FILE))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_both_ways() {
        let cases = [
            ("diffusion.rgb_encoder.backbone.0.weight", "rgb_encoder.backbone.conv1.weight"),
            ("diffusion.rgb_encoder.backbone.1.bias", "rgb_encoder.backbone.bn1.bias"),
            ("diffusion.rgb_encoder.backbone.5.0.downsample.1.weight", "rgb_encoder.backbone.layer2.0.downsample.1.weight"),
            ("diffusion.rgb_encoder.1.backbone.7.1.conv2.weight", "rgb_encoder.1.backbone.layer4.1.conv2.weight"),
            ("diffusion.rgb_encoder.pool.pos_grid", "rgb_encoder.pool.pos_grid"),
            ("diffusion.rgb_encoder.0.out.weight", "rgb_encoder.0.out.weight"),
            ("diffusion.unet.down_modules.0.0.conv1.block.0.weight", "unet.down_modules.0.0.conv1.block.0.weight"),
        ];
        for (file, model) in cases {
            assert_eq!(model_key(file).as_deref(), Some(model), "{file}");
            assert_eq!(file_key(model), file, "{model}");
        }
        assert_eq!(model_key("normalize_inputs.buffer_observation_state.mean"), None);
    }
}
