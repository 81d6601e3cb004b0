//! Loading a run config: the file (TOML, or lerobot's `train_config.json` through
//! [`super::lerobot`]; with `--resume` and no file, the run config saved in the newest
//! checkpoint), the dotted overrides applied to its tree ([`super::tree`]), then typed into
//! [`RunConfig`]. Shape and name errors are reported here; [`RunConfig::validate`] checks the
//! rest.

use std::path::Path;

use serde_json::Value;

use super::lerobot::{apply_policy_keys, train_config_tree};
use super::tree::{parse_value, set_dotted};
use super::types::RunConfig;
use crate::error::WorkloadError;
use crate::layout;

/// The config file (if any: TOML, or lerobot's `train_config.json`) with the overrides applied,
/// as a JSON tree (what `sweep` varies).
pub fn load_tree(file: Option<&Path>, overrides: &[(String, String)]) -> Result<serde_json::Map<String, Value>, WorkloadError> {
    load_tree_noted(file, overrides).map(|(tree, _, _)| tree)
}

/// [`load_tree`] and the notes of reading the file: a `.json` file is lerobot's
/// `train_config.json` ([`super::lerobot::train_config_tree`]), anything else TOML.
/// Also the verified step of the checkpoint a `--resume` without a file reads its config from.
fn load_tree_noted(file: Option<&Path>, overrides: &[(String, String)]) -> Result<(serde_json::Map<String, Value>, Vec<String>, Option<u64>), WorkloadError> {
    let mut notes = Vec::new();
    let mut tree = serde_json::Map::new();
    let mut step = None;
    if file.is_none()
        && let Some((resumed, resume_notes, verified)) = resumed_run_config(overrides)?
    {
        (tree, notes, step) = (resumed, resume_notes, Some(verified));
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|source| WorkloadError::Io { path: path.to_path_buf(), source })?;
        if path.extension().is_some_and(|e| e == "json") {
            (tree, notes) = train_config_tree(&text, path)?;
        } else {
            let table: toml::Table = toml::from_str(&text).map_err(|e| WorkloadError::ConfigFile { path: path.to_path_buf(), msg: e.to_string() })?;
            if let Ok(Value::Object(m)) = serde_json::to_value(table) {
                tree = m;
            }
        }
    }
    for (k, v) in overrides {
        set_dotted(&mut tree, k, parse_value(v))?;
    }
    Ok((tree, notes, step))
}

/// `--resume --output_dir=DIR` without a config file: the run config saved in DIR's newest
/// intact checkpoint, so no flag needs repeating (flags given now still apply on top, e.g.
/// `--steps` to train longer). A checkpoint written by lerobot has no vramlab run config: its
/// `pretrained_model/train_config.json` is read as `--config_path` would read it. `None` when
/// not resuming.
type Noted = (serde_json::Map<String, Value>, Vec<String>, u64);
fn resumed_run_config(overrides: &[(String, String)]) -> Result<Option<Noted>, WorkloadError> {
    let get = |name: &str| overrides.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    if !matches!(get("resume"), Some("true" | "1")) {
        return Ok(None);
    }
    let Some(out) = get("output_dir") else {
        return Err(WorkloadError::invalid("resume", "needs --output_dir: the run directory to continue".into()));
    };
    if Path::new(out).is_file() {
        return Err(WorkloadError::invalid("output_dir", format!("{out} is a file, not a run directory")));
    }
    let ckpts = Path::new(out).join("checkpoints");
    // The trainer reports skipped checkpoints when it resumes; here only the choice matters.
    let vramlab_train::checkpoint::Intact { newest, skipped, .. } =
        vramlab_train::checkpoint::newest_intact(&ckpts).map_err(|e| WorkloadError::invalid("resume", e.to_string()))?;
    let Some((step, dir)) = newest else {
        let why: Vec<String> = skipped.iter().map(|s| format!("{}: {}", s.dir.display(), s.reason)).collect();
        let aside = layout::set_aside_checkpoints(&ckpts);
        let msg = match (why.is_empty(), aside.is_empty()) {
            (true, false) => format!(
                "no checkpoint to resume from in {}: the run diverged before its first good checkpoint (set aside: {}); start a new run (with a smaller --optimizer.lr) in another --output_dir",
                ckpts.display(),
                aside.join(", ")
            ),
            (true, true) => format!("no checkpoint in {}", ckpts.display()),
            (false, _) => format!("no intact checkpoint in {}: {}", ckpts.display(), why.join("; ")),
        };
        return Err(WorkloadError::invalid("resume", msg));
    };
    let path = dir.join(layout::RUN_CONFIG_FILE);
    if !path.exists() {
        let lerobot = dir.join(layout::PRETRAINED_MODEL_DIR).join(layout::TRAIN_CONFIG_FILE);
        if lerobot.exists() {
            let text = std::fs::read_to_string(&lerobot).map_err(|source| WorkloadError::Io { path: lerobot.clone(), source })?;
            return train_config_tree(&text, &lerobot).map(|(tree, notes)| Some((tree, notes, step)));
        }
    }
    let text = std::fs::read_to_string(&path).map_err(|source| WorkloadError::Io { path: path.clone(), source })?;
    let tree = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(WorkloadError::ConfigFile { path, msg: "not a JSON object".into() }),
        Err(e) => return Err(WorkloadError::ConfigFile { path, msg: e.to_string() }),
    };
    // Another policy on top of the checkpoint's would fail on the first field it lacks: say
    // what the checkpoint is instead.
    let saved = tree.get("policy").and_then(|p| p.get("type")).and_then(Value::as_str);
    if let (Some(asked), Some(saved)) = (get("policy.type"), saved)
        && asked != saved
    {
        return Err(WorkloadError::invalid(
            "policy.type",
            format!("{asked}: this checkpoint is a {saved} run ({}); --resume continues its policy: drop --policy.type, or start a new run in another --output_dir", dir.display()),
        ));
    }
    Ok(Some((tree, Vec::new(), step)))
}

/// Load `file` (if any), apply overrides, and type the result. Shape and name errors are
/// reported here; [`RunConfig::validate`] then checks ranges, toggles and files.
pub fn load(file: Option<&Path>, overrides: &[(String, String)]) -> Result<RunConfig, WorkloadError> {
    let (tree, notes, resume_verified) = load_tree_noted(file, overrides)?;
    let origin = file.map_or("command line".to_string(), |p| format!("{} + command line", p.display()));
    let mut cfg: RunConfig = serde_path_to_error::deserialize(Value::Object(tree.clone())).map_err(|e| {
        // The path names the field (`dataset.type: unknown variant …`); `policy` errors name
        // their field themselves.
        let path = e.path().to_string();
        let msg = e.inner().to_string();
        let msg = if path == "." || path.starts_with("policy") { msg } else { format!("{path}: {msg}") };
        WorkloadError::Config { origin, msg }
    })?;
    // lerobot's policy.device / use_amp act on the run (backend, precision).
    let policy_notes = apply_policy_keys(&mut cfg, &tree)?;
    cfg.notes = notes.into_iter().chain(policy_notes).collect();
    cfg.resume_verified = resume_verified.filter(|_| cfg.resume);
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use vramlab_models::nn::Precision;
    use vramlab_train::{CheckpointMode, OptimKind, ScheduleKind};

    use super::*;

    fn ov(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn memory_timeline_takes_one_step_or_a_list_within_the_run() {
        let steps = |v: &str| load(None, &ov(&[("policy.type", "vae3d"), ("memory_timeline", v)])).map(|c| c.memory_timeline);
        assert_eq!(steps("2").unwrap(), [2]);
        assert_eq!(steps("3,4").unwrap(), [3, 4]);
        assert_eq!(steps("").unwrap(), Vec::<u64>::new());
        assert!(steps("two").unwrap_err().to_string().contains("step numbers"));
        let invalid = |pairs: &[(&str, &str)]| load(None, &ov(pairs)).and_then(|c| c.validate()).unwrap_err().to_string();
        let err = invalid(&[("policy.type", "vae3d"), ("steps", "3"), ("memory_timeline", "4")]);
        assert!(err.contains("memory_timeline") && err.contains("1..=3"), "{err}");
        let err = invalid(&[("policy.type", "vae3d"), ("backend", "wgpu"), ("memory_timeline", "1")]);
        assert!(err.contains("memory_timeline") && err.contains("flex"), "{err}");
    }

    #[test]
    fn unknown_top_level_flag_lists_valid_names() {
        let err = load(None, &ov(&[("batchsize", "4")])).unwrap_err().to_string();
        assert!(err.contains("unknown field `batchsize`") && err.contains("batch_size"), "{err}");
    }

    #[test]
    fn overrides_reach_nested_fields() {
        let c = load(None, &ov(&[("optimizer.lr", "0.5"), ("dataset.grid", "4,16,16")])).unwrap();
        assert_eq!(c.optimizer.lr, Some(0.5));
        assert_eq!(c.dataset.grid, [4, 16, 16]);
        let err = load(None, &ov(&[("dataset.nope", "1")])).unwrap_err().to_string();
        assert!(err.contains("nope") && err.contains("num_scenes"), "{err}");
    }

    #[test]
    fn switches_are_typed_with_their_valid_names() {
        let c = load(None, &ov(&[("precision", "bf16"), ("gradient_checkpointing", "true"), ("optimizer.type", "adam"), ("scheduler.type", "cosine")])).unwrap();
        assert_eq!((c.precision, c.gradient_checkpointing), (Precision::Bf16, CheckpointMode::Blocks));
        assert_eq!((c.optimizer.kind, c.scheduler.kind), (Some(OptimKind::Adam), Some(ScheduleKind::Cosine)));
        for (flag, valid) in [("precision", "bf16"), ("gradient_checkpointing", "balanced"), ("backend", "wgpu"), ("optimizer.type", "adamw"), ("scheduler.type", "cosine"), ("dataset.type", "lerobot"), ("gpu_memory_pool", "exact")] {
            let err = load(None, &ov(&[(flag, "nope")])).unwrap_err().to_string();
            assert!(err.contains("nope") && err.contains(valid), "{flag}: {err}");
        }
    }

    #[test]
    fn gpu_memory_pool_is_the_flag_else_the_backends_default() {
        use crate::backend::{BackendKind, GpuMemoryPool};
        let pool = |v: &[(&str, &str)]| load(None, &ov(v)).unwrap().gpu_options().memory_pool;
        assert_eq!(pool(&[("gpu_memory_pool", "pages"), ("backend", "cuda")]), Some(GpuMemoryPool::Pages));
        assert_eq!(pool(&[("gpu_memory_pool", "exact")]), Some(GpuMemoryPool::Exact));
        assert_eq!(pool(&[("backend", "cuda")]), None);
        assert_eq!(GpuMemoryPool::default_for(BackendKind::Cuda), GpuMemoryPool::Exact);
        assert_eq!(GpuMemoryPool::default_for(BackendKind::Wgpu), GpuMemoryPool::Pages);
    }

    #[test]
    fn policy_typos_are_found_while_loading() {
        let err = load(None, &ov(&[("policy.type", "act"), ("policy.chunk_sise", "50")])).unwrap_err().to_string();
        assert!(err.contains("chunk_sise") && err.contains("chunk_size"), "{err}");
        let err = load(None, &ov(&[("policy.type", "actt")])).unwrap_err().to_string();
        assert!(err.contains("actt") && err.contains("diffusion"), "{err}");
    }

    #[test]
    fn every_shipped_config_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                let c = load(Some(&p), &[]).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                c.policy().unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                c.dataset_type().unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                n += 1;
            }
        }
        assert!(n >= 8, "{n} configs");
    }
}
