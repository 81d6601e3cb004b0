//! Run configuration: a TOML file plus lerobot-style dotted overrides.
//!
//! `--policy.chunk_size=50 --batch_size=24` are applied to the TOML tree before it is typed,
//! so a flag and a file line are the same thing. Unknown names are errors that list the valid
//! ones (serde's `deny_unknown_fields` for trainer/dataset fields; the model's own config
//! fields for `policy.*`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Everything a run needs. Field names are the CLI flag names.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Model type and fields (`policy.type`, then the model config's own field names).
    #[serde(default)]
    pub policy: serde_json::Map<String, Value>,
    #[serde(default)]
    pub dataset: DatasetConfig,
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    #[serde(default = "d_batch")]
    pub batch_size: u64,
    #[serde(default = "d_steps")]
    pub steps: u64,
    #[serde(default = "d_one")]
    pub grad_accum_steps: u64,
    #[serde(default)]
    pub output_dir: Option<PathBuf>,
    #[serde(default)]
    pub job_name: Option<String>,
    #[serde(default = "d_backend")]
    pub backend: String,
    /// Device index for wgpu/cuda (0 = first).
    #[serde(default)]
    pub device: usize,
    #[serde(default = "d_precision")]
    pub precision: String,
    #[serde(default = "d_off")]
    pub gradient_checkpointing: String,
    #[serde(default = "d_seed")]
    pub seed: u64,
    #[serde(default)]
    pub resume: bool,
    /// Checkpoint every N steps (0 = only at the end).
    #[serde(default)]
    pub save_freq: u64,
    /// Print a log line every N steps besides the progress bar (0 = bar only).
    #[serde(default)]
    pub log_freq: u64,
    /// Loader worker threads building batches ahead of the trainer (LeRobot datasets; 0 =
    /// build each batch on the training thread when it is needed).
    #[serde(default = "d_workers")]
    pub num_workers: usize,
    /// Batches in flight per worker.
    #[serde(default = "d_prefetch")]
    pub prefetch_factor: usize,
    /// Keep workers across epochs (otherwise they restart at each epoch, as PyTorch's).
    #[serde(default)]
    pub persistent_workers: bool,
    /// Sweep axes (`--sweep.<field>=a,b,c`); used by `vramlab sweep` only.
    #[serde(default)]
    pub sweep: serde_json::Map<String, Value>,
}

fn d_batch() -> u64 {
    8
}
fn d_steps() -> u64 {
    100
}
fn d_one() -> u64 {
    1
}
fn d_backend() -> String {
    "flex".into()
}
fn d_precision() -> String {
    "f32".into()
}
fn d_off() -> String {
    "off".into()
}
fn d_seed() -> u64 {
    1000
}
fn d_workers() -> usize {
    2
}
fn d_prefetch() -> usize {
    2
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    /// vae3d: `synthetic` (built-in procedural voxel scenes) or `npz` (4D-Radar preprocessed
    /// files). ACT / Diffusion: `sim` (the built-in push-T demonstrations, generated on first
    /// use), `lerobot` (a LeRobot dataset at `root`) or `random` (random inputs, for memory
    /// measurement).
    #[serde(rename = "type", default = "d_synth")]
    pub kind: String,
    /// Directory of `.npz` files (type = npz) or of a LeRobot dataset (type = lerobot; for
    /// type = sim, where the generated dataset is kept).
    #[serde(default)]
    pub root: Option<PathBuf>,
    /// Resize camera frames to `[H, W]` (LeRobot datasets).
    #[serde(default)]
    pub image_size: Option<[usize; 2]>,
    /// lerobot's `image_transforms` (`--dataset.image_transforms.enable=true`).
    #[serde(default)]
    pub image_transforms: vramlab_lerobot::transforms::ImageTransformsConfig,
    /// Shuffle frames each epoch (seeded).
    #[serde(default = "d_true")]
    pub shuffle: bool,
    /// Episodes of the built-in demonstrations (type = sim).
    #[serde(default = "d_sim_episodes")]
    pub num_episodes: usize,
    /// Grid size (D, H, W): generated size for synthetic data, center crop for npz.
    #[serde(default = "d_grid")]
    pub grid: Vec<usize>,
    /// Number of distinct synthetic scenes (the epoch length).
    #[serde(default = "d_scenes")]
    pub num_scenes: u64,
    /// Static boxes / moving objects per synthetic scene.
    #[serde(default = "d_boxes")]
    pub num_static_boxes: usize,
    #[serde(default = "d_movers")]
    pub num_movers: usize,
}

fn d_true() -> bool {
    true
}
fn d_sim_episodes() -> usize {
    20
}
fn d_synth() -> String {
    "synthetic".into()
}
fn d_grid() -> Vec<usize> {
    vec![8, 32, 32]
}
fn d_scenes() -> u64 {
    512
}
fn d_boxes() -> usize {
    6
}
fn d_movers() -> usize {
    3
}

impl Default for DatasetConfig {
    fn default() -> Self {
        serde_json::from_value(Value::Object(Default::default())).expect("dataset defaults")
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// `adam` or `adamw` (absent: the policy's preset).
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// Base learning rate (absent: the policy's preset, e.g. lerobot's `optimizer_lr`).
    #[serde(default)]
    pub lr: Option<f64>,
    /// Absent: the policy's preset (PyTorch's (0.9, 0.999) unless the policy says otherwise).
    #[serde(default)]
    pub betas: Option<Vec<f64>>,
    /// Absent: the policy's preset, PyTorch's 1e-8 (Burn's AdamW default is 1e-5).
    #[serde(default)]
    pub eps: Option<f64>,
    /// Absent: the policy's preset.
    #[serde(default)]
    pub weight_decay: Option<f64>,
    /// Clip the global gradient norm (0 = off; absent: the policy's preset).
    #[serde(default)]
    pub grad_clip_norm: Option<f64>,
    /// Learning rate of the vision backbone (absent: the policy's preset, e.g. lerobot's
    /// `optimizer_lr_backbone`).
    #[serde(default)]
    pub lr_backbone: Option<f64>,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        serde_json::from_value(Value::Object(Default::default())).expect("optimizer defaults")
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    /// `constant` or `cosine` (with linear warmup); absent: the policy's preset.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// Absent: the policy's preset.
    #[serde(default)]
    pub warmup_steps: Option<u64>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        serde_json::from_value(Value::Object(Default::default())).expect("scheduler defaults")
    }
}

/// Parse a flag value the way a user means it: numbers, booleans, lists (`1,2,4`, `[1,2,4]`,
/// `(1,2,4)`), otherwise a string.
pub fn parse_value(s: &str) -> Value {
    let t = s.trim();
    let inner = t
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .or_else(|| t.strip_prefix('(').and_then(|x| x.strip_suffix(')')));
    if let Some(inner) = inner {
        let items: Vec<Value> = inner.split(',').map(str::trim).filter(|x| !x.is_empty()).map(parse_value).collect();
        return Value::Array(items);
    }
    if t.contains(',') {
        return Value::Array(t.split(',').map(parse_value).collect());
    }
    match t {
        "true" | "True" => return Value::Bool(true),
        "false" | "False" => return Value::Bool(false),
        "null" | "None" | "none" => return Value::Null,
        _ => {}
    }
    if let Ok(i) = t.parse::<i64>() {
        return Value::from(i);
    }
    if let Ok(f) = t.parse::<f64>()
        && f.is_finite() {
            return Value::from(f);
        }
    Value::String(t.to_string())
}

/// Set `a.b.c = value` in a JSON tree, creating objects on the way.
pub fn set_dotted(root: &mut serde_json::Map<String, Value>, key: &str, value: Value) -> Result<()> {
    let mut parts = key.split('.').peekable();
    let mut cur = root;
    while let Some(p) = parts.next() {
        if p.is_empty() {
            bail!("--{key}: empty name segment");
        }
        if parts.peek().is_none() {
            cur.insert(p.to_string(), value);
            return Ok(());
        }
        let entry = cur.entry(p.to_string()).or_insert_with(|| Value::Object(Default::default()));
        cur = entry.as_object_mut().ok_or_else(|| anyhow!("--{key}: `{p}` is a value, not a group of fields"))?;
    }
    Ok(())
}

/// Load `file` (if any), apply overrides, and type the result.
pub fn load(file: Option<&Path>, overrides: &[(String, String)]) -> Result<RunConfig> {
    let mut tree = serde_json::Map::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read config", path.display()))?;
        let table: toml::Table = toml::from_str(&text).with_context(|| format!("{}: invalid TOML", path.display()))?;
        tree = match serde_json::to_value(table)? {
            Value::Object(m) => m,
            _ => unreachable!("a TOML table is an object"),
        };
    }
    for (k, v) in overrides {
        set_dotted(&mut tree, k, parse_value(v))?;
    }
    let where_ = file.map_or("command line".to_string(), |p| format!("{} + command line", p.display()));
    let cfg: RunConfig = serde_json::from_value(Value::Object(tree)).map_err(|e| anyhow!("{where_}: {e}"))?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_as_meant() {
        assert_eq!(parse_value("50"), Value::from(50));
        assert_eq!(parse_value("1e-4"), Value::from(1e-4));
        assert_eq!(parse_value("true"), Value::Bool(true));
        assert_eq!(parse_value("1,2,4"), serde_json::json!([1, 2, 4]));
        assert_eq!(parse_value("(1,2,4)"), serde_json::json!([1, 2, 4]));
        assert_eq!(parse_value("[4]"), serde_json::json!([4]));
        assert_eq!(parse_value("runs/x"), Value::String("runs/x".into()));
    }

    #[test]
    fn unknown_top_level_flag_lists_valid_names() {
        let err = load(None, &[("batchsize".into(), "4".into())]).unwrap_err().to_string();
        assert!(err.contains("unknown field `batchsize`") && err.contains("batch_size"), "{err}");
    }

    #[test]
    fn overrides_reach_nested_fields() {
        let c = load(None, &[("optimizer.lr".into(), "0.5".into()), ("dataset.grid".into(), "4,16,16".into())]).unwrap();
        assert_eq!(c.optimizer.lr, Some(0.5));
        assert_eq!(c.dataset.grid, vec![4, 16, 16]);
        let err = load(None, &[("dataset.nope".into(), "1".into())]).unwrap_err().to_string();
        assert!(err.contains("nope") && err.contains("num_scenes"), "{err}");
    }

    #[test]
    fn every_shipped_config_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                let c = load(Some(&p), &[]).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
                crate::workloads::PolicyType::from_config(&c).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
                n += 1;
            }
        }
        assert!(n >= 8, "{n} configs");
    }
}
