//! The trainer's error ([`TrainError`]) and the boxed error a data source returns
//! ([`BoxError`]): a leaf, so the loop, the memory timeline and the checkpoints all take it
//! from here.

use std::path::{Path, PathBuf};

use crate::checkpoint::CheckpointError;
use crate::optim::OptimError;

/// What a batch source ([`crate::Trainer::run`]'s `data`) may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything a training run can fail with; each message names the path, step or flag to fix.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] vramlab_store::WeightError),
    #[error("{path}: bad trainer state: {msg}")]
    State { path: PathBuf, msg: String },
    #[error("data for step {step}: {source}")]
    Data { step: u64, source: BoxError },
    /// A non-finite loss, gradient norm or weights at `step`: nothing of that step, or of the
    /// weights that produced it, is checkpointed; `last_good` (verified, finite) is where
    /// `--resume` continues, `None` when there is nothing to resume from. `what` says what was
    /// non-finite, `outcome` what became of the checkpoints.
    #[error("{what} at step {step}; stopped. {outcome}")]
    NonFinite { step: u64, what: String, outcome: String, last_good: Option<PathBuf> },
    #[error("--resume: no checkpoint in {0}")]
    NothingToResume(PathBuf),
    #[error("--resume: no intact checkpoint in {dir}: {}", why.join("; "))]
    NoIntactCheckpoint { dir: PathBuf, why: Vec<String> },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{0} already holds checkpoints: pass --resume to continue that run, or choose another --output_dir")]
    OutputExists(PathBuf),
    #[error(transparent)]
    Optim(#[from] OptimError),
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io { path: path.to_path_buf(), source }
}
