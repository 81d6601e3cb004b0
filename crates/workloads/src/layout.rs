//! The checkpoint layout, one home for every name and path rule the workloads use:
//!
//! ```text
//! <output_dir>/
//!   run_config.json                  the run's config as typed (RUN_CONFIG_TOP_FILE)
//!   checkpoints/<step>/              one per save (vramlab_train::checkpoint: step dirs, manifest)
//!     pretrained_model/              PRETRAINED_MODEL_DIR: what `predict` and `--policy.path` read
//!       config.json                  CONFIG_FILE: the model config, its `type` names the model
//!       model.safetensors            WEIGHTS_FILE
//!       train_config.json            TRAIN_CONFIG_FILE: lerobot's TrainPipelineConfig
//!       policy_*.json, *.safetensors lerobot's processors (crate::processors)
//!     training_state/run_config.json RUN_CONFIG_FILE: what `--resume` continues with
//!   checkpoints/last -> <step>       LAST_LINK
//! ```
//!
//! The model files' names belong to the models (their loaders read them:
//! `vramlab_models::policy`), the run checkpoint's to the trainer (`vramlab_train::checkpoint`);
//! they are re-exported here so that every user in this crate names one module. What only the
//! workloads read (`type`, the run config, finding the `pretrained_model/` of a path) is defined
//! here.

use std::path::{Path, PathBuf};

pub use vramlab_models::policy::{CONFIG_FILE, WEIGHTS_FILE};
pub use vramlab_train::checkpoint::{LAST_LINK, PRETRAINED_MODEL_DIR};

use vramlab_train::checkpoint::LoadCheck;

use crate::error::{Result, WorkloadError};

/// The `type` of every model this build knows, as a checkpoint's `config.json` and
/// `policy.type` name it, in [`crate::config::Workload`]'s order.
pub const MODEL_TYPES: [&str; 3] = ["vae3d", "act", "diffusion"];

/// vramlab's own run config inside each checkpoint: what `--resume` continues with.
pub const RUN_CONFIG_FILE: &str = "training_state/run_config.json";
/// The run config at the top of the output directory (what the run was started with).
pub const RUN_CONFIG_TOP_FILE: &str = "run_config.json";
/// lerobot's `train_config.json` (`TrainPipelineConfig`), inside `pretrained_model/`.
pub const TRAIN_CONFIG_FILE: &str = "train_config.json";

/// `pretrained_model/<name>`: a file of a checkpoint's model directory, relative to the step
/// directory.
pub fn in_pretrained(name: &str) -> String {
    format!("{PRETRAINED_MODEL_DIR}/{name}")
}

/// The `pretrained_model/` a path names: `dir/pretrained_model/` (a checkpoint step
/// directory), then `dir/last/pretrained_model/` (a run's `checkpoints/`), else `dir` itself
/// (a `pretrained_model/` directory, or a fixture with the files directly in it).
pub fn pretrained_dir(dir: &Path) -> PathBuf {
    [dir.join(PRETRAINED_MODEL_DIR), dir.join(LAST_LINK).join(PRETRAINED_MODEL_DIR)]
        .into_iter()
        .find(|d| d.join(CONFIG_FILE).is_file())
        .unwrap_or_else(|| dir.to_path_buf())
}

/// [`pretrained_dir`], verified before anything in it is loaded (`predict`, `--policy.path`,
/// `bench-inference`): where it lies in a vramlab checkpoint, its files must match that
/// checkpoint's manifest and be covered by it; without a manifest (lerobot's checkpoints, a
/// bare `pretrained_model/`) it loads with a note on stderr. `flag` names what gave the path.
pub fn verified_pretrained_dir(dir: &Path, flag: &str) -> Result<PathBuf> {
    let pretrained = pretrained_dir(dir);
    match vramlab_train::checkpoint::verify_for_load(&pretrained) {
        Ok(LoadCheck::Verified) => {}
        Ok(LoadCheck::Unverified(why)) => eprintln!("note: {flag}: {why}: its files are not verified"),
        Err(e) => return Err(WorkloadError::Flag { flag: flag.to_string(), msg: format!("{e}; refusing to load it") }),
    }
    Ok(pretrained)
}

/// The `type` of a checkpoint directory's `config.json`.
pub fn checkpoint_type(dir: &Path) -> Result<String> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| WorkloadError::Io { path: path.clone(), source })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| WorkloadError::file(&path, format!("invalid JSON: {e}")))?;
    match v.get("type").and_then(|t| t.as_str()) {
        Some(t) => Ok(t.to_string()),
        None => {
            let quoted: Vec<String> = MODEL_TYPES.iter().map(|t| format!("\"{t}\"")).collect();
            let (last, rest) = quoted.split_last().expect("at least one model type");
            Err(WorkloadError::file(&path, format!("field `type` is missing (expected {} or {last})", rest.join(", "))))
        }
    }
}

/// The checkpoints of `ckpts` (a run's `checkpoints/`) that a diverged run set aside
/// (`<step>.nonfinite/`, [`vramlab_train::checkpoint::NON_FINITE_SUFFIX`]), by name, sorted.
pub fn set_aside_checkpoints(ckpts: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(ckpts)
        .map(|rd| rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.ends_with(vramlab_train::checkpoint::NON_FINITE_SUFFIX)).collect())
        .unwrap_or_default();
    names.sort();
    names
}
