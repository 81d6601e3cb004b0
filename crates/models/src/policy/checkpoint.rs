//! The checkpoint directory every model uses (lerobot's `pretrained_model/`): file names, the
//! error, writing the config. The models' loaders read these names here; the rest of the
//! checkpoint layout (where `pretrained_model/` sits in a run's checkpoints, the `type` of its
//! config, vramlab's run config) is the workloads crate's `layout` module, which re-exports
//! these two names so that its users name one module.

use std::path::{Path, PathBuf};

use super::ConfigFileError;

/// File names inside a checkpoint (`pretrained_model/`) directory, for every model.
pub const CONFIG_FILE: &str = "config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// Policy-level keys of pre-0.4 lerobot checkpoints that are skipped on load.
pub const NORMALIZATION_PREFIXES: [&str; 3] = ["normalize_inputs.", "normalize_targets.", "unnormalize_outputs."];

/// A checkpoint directory could not be read or written; each variant names the file (and the
/// field or weight key where there is one).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Config(#[from] ConfigFileError),
    #[error(transparent)]
    Weights(#[from] crate::weights::WeightError),
    #[error("{path}: cannot write: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Create `dir` and write `dir/config.json` (`text` plus a final newline).
pub fn write_config_file(dir: &Path, text: &str) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|source| CheckpointError::Write { path: dir.to_path_buf(), source })?;
    let path = dir.join(CONFIG_FILE);
    std::fs::write(&path, format!("{text}\n")).map_err(|source| CheckpointError::Write { path, source })
}
