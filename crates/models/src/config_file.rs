//! What every model config shares: a validation error that names the field, and reading a
//! `config.json` with errors that name the file.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// A config value that cannot build a model: the field and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("field `{field}`: {msg}")]
pub struct InvalidField {
    pub field: &'static str,
    pub msg: String,
}

/// Reading a `config.json` failed: the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("{path}: cannot read: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// Malformed JSON, a wrong type, or an unknown key (serde's message names the field).
    #[error("{path}: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{path}: {source}")]
    Invalid { path: PathBuf, source: InvalidField },
}

/// Read `path` as JSON into `T`, then validate it.
pub fn read_config<T: DeserializeOwned>(path: &Path, validate: impl Fn(&T) -> Result<(), InvalidField>) -> Result<T, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Io { path: path.to_path_buf(), source })?;
    let cfg: T = serde_json::from_str(&text).map_err(|source| ConfigFileError::Json { path: path.to_path_buf(), source })?;
    validate(&cfg).map_err(|source| ConfigFileError::Invalid { path: path.to_path_buf(), source })?;
    Ok(cfg)
}
