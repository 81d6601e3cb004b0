//! One error type for everything a workload can report. Every message names what to fix: the
//! config field or flag, or the file (and the tensor or field inside it).

use std::path::PathBuf;

/// What went wrong, typed; the CLI prints it as it is.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The merged config (file + flags) does not type: an unknown name, a wrong shape.
    #[error("{origin}: {msg}")]
    Config { origin: String, msg: String },
    /// A config file that cannot be parsed.
    #[error("{path}: {msg}", path = path.display())]
    ConfigFile { path: PathBuf, msg: String },
    /// A flag that cannot be applied (`--a..b=1`).
    #[error("--{flag}: {msg}")]
    Flag { flag: String, msg: String },
    /// A config field whose value does not work (range, incompatible toggles, missing files).
    #[error("{field}: {msg}")]
    Invalid { field: String, msg: String },
    /// A file of the user's (inputs, checkpoint) that does not fit what it is used for.
    #[error("{path}: {msg}", path = path.display())]
    File { path: PathBuf, msg: String },
    #[error("{path}: {source}", path = path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The backend or device cannot run the request.
    #[error("{0}")]
    Backend(String),
    /// The run would need more memory than the machine has ([`crate::preflight`]).
    #[error("{0}")]
    Preflight(String),
    #[error(transparent)]
    LoaderSpawn(#[from] vramlab_lerobot::SpawnError),
    #[error(transparent)]
    Train(#[from] vramlab_train::TrainError),
    #[error(transparent)]
    Dataset(#[from] vramlab_lerobot::DatasetError),
    #[error(transparent)]
    Data(#[from] vramlab_data::DataError),
    #[error(transparent)]
    Weights(#[from] vramlab_store::WeightError),
    #[error(transparent)]
    Checkpoint(#[from] vramlab_models::policy::CheckpointError),
}

impl WorkloadError {
    /// `field` (a config path such as `policy.chunk_size`) cannot take its value.
    pub fn invalid(field: &str, msg: String) -> Self {
        Self::Invalid { field: field.to_string(), msg }
    }

    /// `path` does not fit its use.
    pub fn file(path: impl Into<PathBuf>, msg: String) -> Self {
        Self::File { path: path.into(), msg }
    }
}

pub type Result<T, E = WorkloadError> = std::result::Result<T, E>;
