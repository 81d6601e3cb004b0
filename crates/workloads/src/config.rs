//! Run configuration, parsed once and up front: a TOML file (or lerobot's `train_config.json`,
//! see [`crate::lerobot_compat`]) plus lerobot-style dotted overrides, typed into [`RunConfig`]
//! and checked by [`RunConfig::validate`] before any data is generated or any model is built.
//!
//! `--policy.chunk_size=50 --batch_size=24` are applied to the TOML tree before it is typed,
//! so a flag and a file line are the same thing. Every switch is a serde enum (backend,
//! precision, checkpointing, dataset type, optimizer, scheduler) and `policy` is the typed
//! per-policy config ([`crate::PolicyConfig`]). Unknown names are errors that list the valid
//! ones.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use vramlab_lerobot::hub::{HubEnv, HubRequest};
use vramlab_models::nn::Precision;
use vramlab_train::{CheckpointMode, OptimKind, ScheduleKind};

use crate::WorkloadError;
use crate::backend::BackendKind;
use crate::policy::PolicyConfig;

/// Everything a run needs. Field names are the CLI flag names.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Model type and fields (`policy.type`, then the model config's own field names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyConfig>,
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
    #[serde(default)]
    pub backend: BackendKind,
    /// Device index for wgpu/cuda (0 = first).
    #[serde(default)]
    pub device: usize,
    /// wgpu/cuda: CubeCL's autotune effort (`minimal`, `balanced`, `extensive`, `full`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autotune: Option<crate::backend::AutotuneLevel>,
    /// wgpu/cuda: where compiled kernels and autotune results persist across runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_cache_dir: Option<PathBuf>,
    #[serde(default, deserialize_with = "parsed_precision", serialize_with = "precision_name")]
    pub precision: Precision,
    #[serde(default, deserialize_with = "parsed_checkpointing", serialize_with = "checkpointing_name")]
    pub gradient_checkpointing: CheckpointMode,
    #[serde(default = "d_seed")]
    pub seed: u64,
    #[serde(default)]
    pub resume: bool,
    /// Checkpoint every N steps (0 = only at the end).
    #[serde(default)]
    pub save_freq: u64,
    /// Write checkpoints (lerobot's `save_checkpoint`); `false` measures without saving.
    #[serde(default = "d_true")]
    pub save_checkpoint: bool,
    /// Steps whose every heap allocation and free is written as a PyTorch memory snapshot,
    /// `<output_dir>/memory_timeline/step_<N>.pickle` (for <https://pytorch.org/memory_viz>):
    /// `3` or `3,4`; empty: none. The CPU heap's events: flex backend only.
    #[serde(default, deserialize_with = "step_list", skip_serializing_if = "Vec::is_empty")]
    pub memory_timeline: Vec<u64>,
    /// Leave the events of blocks smaller than this out of those snapshots (0: every event;
    /// most heap blocks are a few bytes of bookkeeping, and a step has tens of thousands).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory_timeline_min_bytes: u64,
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
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub sweep: serde_json::Map<String, Value>,
    /// What the user should know before the run starts (lerobot keys mapped or ignored, the ACT
    /// backbone's missing ImageNet weights); printed by the CLI. See [`crate::lerobot_compat`].
    #[serde(skip)]
    pub notes: Vec<String>,
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
fn d_seed() -> u64 {
    1000
}
fn d_workers() -> usize {
    2
}
fn d_prefetch() -> usize {
    2
}

/// A switch given as a word, a boolean or a number (`--gradient_checkpointing=true`), read by
/// the switch's own parser; an unknown word lists the valid ones.
fn parsed<'de, D: Deserializer<'de>, T>(d: D, parse: fn(&str) -> Option<T>, valid: &str) -> Result<T, D::Error> {
    let text = match Value::deserialize(d)? {
        Value::String(s) => s,
        other => other.to_string(),
    };
    parse(&text).ok_or_else(|| D::Error::custom(format!("unknown value `{text}`; valid: {valid}")))
}

fn parsed_precision<'de, D: Deserializer<'de>>(d: D) -> Result<Precision, D::Error> {
    parsed(d, Precision::parse, "f32, bf16, f16")
}

fn precision_name<S: Serializer>(p: &Precision, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

fn parsed_checkpointing<'de, D: Deserializer<'de>>(d: D) -> Result<CheckpointMode, D::Error> {
    parsed(d, CheckpointMode::parse, CheckpointMode::NAMES)
}

fn checkpointing_name<S: Serializer>(m: &CheckpointMode, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(m)
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Step numbers: one (`--memory_timeline=3` is a number) or a list; "" is none.
fn step_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    let bad = |v: &Value| D::Error::custom(format!("expected step numbers (3 or 3,4), found {v}"));
    match Value::deserialize(d)? {
        Value::String(s) if s.trim().is_empty() => Ok(Vec::new()),
        Value::Array(items) => items.iter().map(|v| v.as_u64().ok_or_else(|| bad(v))).collect(),
        v => v.as_u64().map(|s| vec![s]).ok_or_else(|| bad(&v)),
    }
}

/// Where the training data comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetType {
    /// The 3D-VAE's built-in procedural radar voxel scenes.
    Voxels,
    /// 4D-Radar preprocessed `.npz` voxel files in `dataset.root` (3D-VAE).
    Npz,
    /// The built-in push demonstrations (robot policies), generated on first use.
    Sim,
    /// A LeRobot v2.1 / v3.0 dataset at `dataset.root` or from the hub (`dataset.repo_id`)
    /// (robot policies).
    Lerobot,
    /// Random inputs of the policy's shapes (robot policies; memory measurement).
    Random,
}

impl DatasetType {
    pub fn name(self) -> &'static str {
        match self {
            Self::Voxels => "voxels",
            Self::Npz => "npz",
            Self::Sim => "sim",
            Self::Lerobot => "lerobot",
            Self::Random => "random",
        }
    }
}

/// `dataset.type`: a [`DatasetType`], or `synthetic`, the old name that meant the built-in
/// data of whichever policy ran (voxel scenes for the VAE, push demos for policies): like an
/// absent type, [`RunConfig::dataset_type`] resolves it per policy.
fn dataset_type_or_built_in<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DatasetType>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) if s == "synthetic" => Ok(None),
        Some(s) => DatasetType::deserialize(serde::de::value::StrDeserializer::<D::Error>::new(&s)).map(Some),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    /// vae3d: `voxels` (built-in procedural scenes; the default) or `npz`. ACT / Diffusion:
    /// `sim` (built-in push demonstrations; the default), `lerobot` or `random`.
    #[serde(rename = "type", default, deserialize_with = "dataset_type_or_built_in")]
    pub kind: Option<DatasetType>,
    /// Directory of `.npz` files (type = npz) or of a LeRobot dataset (type = lerobot; with
    /// `repo_id`, where the dataset is or is downloaded to, lerobot's `root`; for type = sim,
    /// where the generated dataset is kept).
    #[serde(default)]
    pub root: Option<PathBuf>,
    /// lerobot's `--dataset.repo_id`: a LeRobot dataset on the Hugging Face hub
    /// (`lerobot/aloha_sim_insertion_human`); implies `type = lerobot`. Used from `root`, the hub
    /// cache or `$HF_LEROBOT_HOME/<repo_id>` when there, else downloaded into `root` or the hub
    /// cache before training starts ([`vramlab_lerobot::hub`] lists the differences from
    /// lerobot, which downloads into `$HF_LEROBOT_HOME/<repo_id>`).
    #[serde(default)]
    pub repo_id: Option<String>,
    /// lerobot's `--dataset.revision`: branch, tag or commit of `repo_id` (absent: lerobot's
    /// codebase version tag, `v3.0`, or the closest compatible version tag).
    #[serde(default)]
    pub revision: Option<String>,
    /// Resize camera frames to `[H, W]` (LeRobot datasets).
    #[serde(default)]
    pub image_size: Option<[usize; 2]>,
    /// lerobot's `image_transforms` (`--dataset.image_transforms.enable=true`).
    #[serde(default)]
    pub image_transforms: vramlab_lerobot::transforms::ImageTransformsConfig,
    /// lerobot's `--dataset.episodes`: train on these episode indices only (LeRobot datasets and
    /// the built-in demonstrations; absent: every episode).
    #[serde(default)]
    pub episodes: Option<Vec<usize>>,
    /// Shuffle frames each epoch (seeded).
    #[serde(default = "d_true")]
    pub shuffle: bool,
    /// Episodes of the built-in demonstrations (type = sim).
    #[serde(default = "d_sim_episodes")]
    pub num_episodes: usize,
    /// Grid size (D, H, W): generated size for voxel scenes, center crop for npz.
    #[serde(default = "d_grid")]
    pub grid: [usize; 3],
    /// Number of distinct voxel scenes / random samples (the epoch length).
    #[serde(default = "d_scenes")]
    pub num_scenes: u64,
    /// Static boxes / moving objects per voxel scene.
    #[serde(default = "d_boxes")]
    pub num_static_boxes: usize,
    #[serde(default = "d_movers")]
    pub num_movers: usize,
    /// Not a flag: the LeRobot dataset directory once resolved ([`RunConfig::lerobot_root`]), so
    /// `repo_id` is looked up (and downloaded) once, by `validate`, and training opens the same
    /// directory. Leave it empty (`..Default::default()`).
    #[serde(skip)]
    pub resolved_root: OnceLock<PathBuf>,
}

fn d_true() -> bool {
    true
}
fn d_sim_episodes() -> usize {
    20
}
fn d_grid() -> [usize; 3] {
    [8, 32, 32]
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

/// A struct whose every field has a serde default, built from an empty object.
fn all_defaults<T: DeserializeOwned>() -> T {
    serde_json::from_value(Value::Object(Default::default())).expect("every field has a default")
}

impl Default for DatasetConfig {
    fn default() -> Self {
        all_defaults()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// `adam` or `adamw` (absent: the policy's preset).
    #[serde(rename = "type", default)]
    pub kind: Option<OptimKind>,
    /// Base learning rate (absent: the policy's preset, e.g. lerobot's `optimizer_lr`).
    #[serde(default)]
    pub lr: Option<f64>,
    /// Absent: the policy's preset (PyTorch's (0.9, 0.999) unless the policy says otherwise).
    #[serde(default)]
    pub betas: Option<[f64; 2]>,
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
        all_defaults()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    /// `constant` or `cosine` (with linear warmup); absent: the policy's preset.
    #[serde(rename = "type", default)]
    pub kind: Option<ScheduleKind>,
    /// Absent: the policy's preset.
    #[serde(default)]
    pub warmup_steps: Option<u64>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        all_defaults()
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
        && f.is_finite()
    {
        return Value::from(f);
    }
    Value::String(t.to_string())
}

/// Set `a.b.c = value` in a JSON tree, creating objects on the way.
pub fn set_dotted(root: &mut serde_json::Map<String, Value>, key: &str, value: Value) -> Result<(), WorkloadError> {
    let bad = |msg: String| WorkloadError::Flag { flag: key.to_string(), msg };
    let mut parts = key.split('.').peekable();
    let mut cur = root;
    while let Some(p) = parts.next() {
        if p.is_empty() {
            return Err(bad("empty name segment".into()));
        }
        if parts.peek().is_none() {
            cur.insert(p.to_string(), value);
            return Ok(());
        }
        let entry = cur.entry(p.to_string()).or_insert_with(|| Value::Object(Default::default()));
        cur = entry.as_object_mut().ok_or_else(|| bad(format!("`{p}` is a value, not a group of fields")))?;
    }
    Ok(())
}

/// The config file (if any: TOML, or lerobot's `train_config.json`) with the overrides applied,
/// as a JSON tree (what `sweep` varies).
pub fn load_tree(file: Option<&Path>, overrides: &[(String, String)]) -> Result<serde_json::Map<String, Value>, WorkloadError> {
    load_tree_noted(file, overrides).map(|(tree, _)| tree)
}

/// [`load_tree`] and the notes of reading the file: a `.json` file is lerobot's
/// `train_config.json` ([`crate::lerobot_compat::train_config_tree`]), anything else TOML.
fn load_tree_noted(file: Option<&Path>, overrides: &[(String, String)]) -> Result<(serde_json::Map<String, Value>, Vec<String>), WorkloadError> {
    let mut notes = Vec::new();
    let mut tree = serde_json::Map::new();
    if file.is_none()
        && let Some((resumed, resume_notes)) = resumed_run_config(overrides)?
    {
        (tree, notes) = (resumed, resume_notes);
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|source| WorkloadError::Io { path: path.to_path_buf(), source })?;
        if path.extension().is_some_and(|e| e == "json") {
            (tree, notes) = crate::lerobot_compat::train_config_tree(&text, path)?;
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
    Ok((tree, notes))
}

/// `--resume --output_dir=DIR` without a config file: the run config saved in DIR's newest
/// intact checkpoint, so no flag needs repeating (flags given now still apply on top, e.g.
/// `--steps` to train longer). A checkpoint written by lerobot has no vramlab run config: its
/// `pretrained_model/train_config.json` is read as `--config_path` would read it. `None` when
/// not resuming.
type Noted = (serde_json::Map<String, Value>, Vec<String>);
fn resumed_run_config(overrides: &[(String, String)]) -> Result<Option<Noted>, WorkloadError> {
    let get = |name: &str| overrides.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    if !matches!(get("resume"), Some("true" | "1")) {
        return Ok(None);
    }
    let Some(out) = get("output_dir") else {
        return Err(WorkloadError::invalid("resume", "needs --output_dir: the run directory to continue".into()));
    };
    let ckpts = Path::new(out).join("checkpoints");
    // The trainer reports skipped checkpoints when it resumes; here only the choice matters.
    let vramlab_train::checkpoint::Intact { newest, skipped, .. } =
        vramlab_train::checkpoint::newest_intact(&ckpts).map_err(|e| WorkloadError::invalid("resume", e.to_string()))?;
    let Some((_, dir)) = newest else {
        let why: Vec<String> = skipped.iter().map(|s| format!("{}: {}", s.dir.display(), s.reason)).collect();
        let msg = if why.is_empty() { format!("no checkpoint in {}", ckpts.display()) } else { format!("no intact checkpoint in {}: {}", ckpts.display(), why.join("; ")) };
        return Err(WorkloadError::invalid("resume", msg));
    };
    let path = dir.join(crate::training::RUN_CONFIG_FILE);
    if !path.exists() {
        let lerobot = dir.join("pretrained_model/train_config.json");
        if lerobot.exists() {
            let text = std::fs::read_to_string(&lerobot).map_err(|source| WorkloadError::Io { path: lerobot.clone(), source })?;
            return crate::lerobot_compat::train_config_tree(&text, &lerobot).map(Some);
        }
    }
    let text = std::fs::read_to_string(&path).map_err(|source| WorkloadError::Io { path: path.clone(), source })?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => Ok(Some((m, Vec::new()))),
        Ok(_) => Err(WorkloadError::ConfigFile { path, msg: "not a JSON object".into() }),
        Err(e) => Err(WorkloadError::ConfigFile { path, msg: e.to_string() }),
    }
}

/// Load `file` (if any), apply overrides, and type the result. Shape and name errors are
/// reported here; [`RunConfig::validate`] then checks ranges, toggles and files.
pub fn load(file: Option<&Path>, overrides: &[(String, String)]) -> Result<RunConfig, WorkloadError> {
    let (tree, notes) = load_tree_noted(file, overrides)?;
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
    let policy_notes = crate::lerobot_compat::apply_policy_keys(&mut cfg, &tree)?;
    cfg.notes = notes.into_iter().chain(policy_notes).collect();
    Ok(cfg)
}

impl RunConfig {
    /// CubeCL's caches and autotune level for the GPU backends.
    pub fn gpu_options(&self) -> crate::backend::GpuOptions {
        crate::backend::GpuOptions { kernel_cache_dir: self.kernel_cache_dir.clone(), autotune: self.autotune }
    }

    /// The policy, or an error saying how to name one.
    pub fn policy(&self) -> Result<&PolicyConfig, WorkloadError> {
        self.policy.as_ref().ok_or_else(|| WorkloadError::invalid("policy.type", format!("required (--policy.type=…); valid: {}", PolicyConfig::NAMES)))
    }

    /// The dataset type of this run (`lerobot` with a `repo_id`, else the policy's built-in data
    /// when not given).
    pub fn dataset_type(&self) -> Result<DatasetType, WorkloadError> {
        let vae = self.policy()?.is_vae3d();
        let built_in = if vae { DatasetType::Voxels } else { DatasetType::Sim };
        let t = match (self.dataset.kind, &self.dataset.repo_id) {
            (Some(t), Some(id)) if t != DatasetType::Lerobot => {
                return Err(WorkloadError::invalid("dataset.repo_id", format!("`{id}` is a LeRobot dataset on the hub; it cannot be used with dataset.type={}", t.name())));
            }
            (Some(t), _) => t,
            (None, Some(_)) => DatasetType::Lerobot,
            (None, None) => built_in,
        };
        let ok = if vae { matches!(t, DatasetType::Voxels | DatasetType::Npz) } else { matches!(t, DatasetType::Sim | DatasetType::Lerobot | DatasetType::Random) };
        if !ok && self.dataset.repo_id.is_some() {
            return Err(WorkloadError::invalid("dataset.repo_id", format!("LeRobot datasets train robot policies, not policy.type={}", self.policy()?.name())));
        }
        if !ok {
            let valid = if vae { "voxels (built-in scenes), npz (with dataset.root)" } else { "sim (built-in push demonstrations), lerobot (with dataset.root), random" };
            return Err(WorkloadError::invalid("dataset.type", format!("`{}` does not fit policy.type={}; valid: {valid}", t.name(), self.policy()?.name())));
        }
        Ok(t)
    }

    /// Everything that can be checked before data is generated or a model is built: ranges,
    /// toggles that do not fit together, and the files the run will read (a `dataset.repo_id`
    /// is found or downloaded here, with the process's Hugging Face environment).
    pub fn validate(&self) -> Result<(), WorkloadError> {
        self.validate_with(&HubEnv::from_process())
    }

    /// [`Self::validate`] with the given Hugging Face environment (cache, offline, endpoint).
    pub fn validate_with(&self, hub: &HubEnv) -> Result<(), WorkloadError> {
        let policy = self.policy()?;
        for (name, v) in [("steps", self.steps), ("batch_size", self.batch_size), ("grad_accum_steps", self.grad_accum_steps)] {
            if v == 0 {
                return Err(WorkloadError::invalid(name, "must be at least 1".into()));
            }
        }
        if self.prefetch_factor == 0 {
            return Err(WorkloadError::invalid("prefetch_factor", "must be at least 1".into()));
        }
        if let Some(s) = self.memory_timeline.iter().find(|&&s| s == 0 || s > self.steps) {
            return Err(WorkloadError::invalid("memory_timeline", format!("step {s} is not a step of this run (1..={})", self.steps)));
        }
        if !self.memory_timeline.is_empty() && self.backend != BackendKind::Flex {
            return Err(WorkloadError::invalid("memory_timeline", format!("records the CPU heap's allocations: needs --backend=flex, not {}", self.backend)));
        }
        let o = &self.optimizer;
        for (name, v) in [("optimizer.lr", o.lr), ("optimizer.lr_backbone", o.lr_backbone), ("optimizer.eps", o.eps)] {
            if v.is_some_and(|x| !(x > 0.0 && x.is_finite())) {
                return Err(WorkloadError::invalid(name, format!("must be a positive number, found {}", v.unwrap_or_default())));
            }
        }
        for (name, v) in [("optimizer.weight_decay", o.weight_decay), ("optimizer.grad_clip_norm", o.grad_clip_norm)] {
            if v.is_some_and(|x| !(x >= 0.0 && x.is_finite())) {
                return Err(WorkloadError::invalid(name, format!("must be ≥ 0, found {}", v.unwrap_or_default())));
            }
        }
        if let Some(b) = o.betas
            && !b.iter().all(|x| (0.0..1.0).contains(x))
        {
            return Err(WorkloadError::invalid("optimizer.betas", format!("each must be in [0, 1), found {b:?}")));
        }
        if o.lr_backbone.is_some() && !policy.has_backbone() {
            return Err(WorkloadError::invalid("optimizer.lr_backbone", "this policy has no vision backbone".into()));
        }
        let dataset = self.dataset_type()?;
        policy.validate(dataset)?;
        if let crate::Workload::Vae3d(v) = &policy.kind
            && let Some(why) = crate::vae3d::grid_mismatch(&v.config, self.dataset.grid)
        {
            return Err(WorkloadError::invalid("dataset.grid", why));
        }
        self.validate_dataset_files(dataset, hub)
    }

    /// The LeRobot dataset of a `dataset.type=lerobot` run: `dataset.root`, or with `repo_id` its
    /// local copy (found or downloaded with the process's environment unless `validate` already
    /// resolved it).
    pub fn lerobot_root(&self) -> Result<PathBuf, WorkloadError> {
        match self.dataset.resolved_root.get() {
            Some(root) => Ok(root.clone()),
            None => self.resolve_lerobot_root(&HubEnv::from_process()),
        }
    }

    /// [`Self::lerobot_root`] with the given Hugging Face environment; remembered for later calls.
    pub fn resolve_lerobot_root(&self, hub: &HubEnv) -> Result<PathBuf, WorkloadError> {
        if let Some(root) = self.dataset.resolved_root.get() {
            return Ok(root.clone());
        }
        let d = &self.dataset;
        let root = match &d.repo_id {
            None => d.root.clone().ok_or_else(|| WorkloadError::invalid("dataset.root", "required for dataset.type=lerobot (or give dataset.repo_id)".into()))?,
            Some(repo_id) => {
                let req = HubRequest { repo_id, revision: d.revision.as_deref(), root: d.root.as_deref() };
                vramlab_lerobot::hub::resolve(&req, hub).map_err(|e| WorkloadError::invalid("dataset.repo_id", e.to_string()))?.root
            }
        };
        Ok(self.dataset.resolved_root.get_or_init(|| root).clone())
    }

    fn validate_dataset_files(&self, dataset: DatasetType, hub: &HubEnv) -> Result<(), WorkloadError> {
        let root = self.dataset.root.as_deref();
        if self.dataset.revision.is_some() && self.dataset.repo_id.is_none() {
            return Err(WorkloadError::invalid("dataset.revision", "selects a version of dataset.repo_id, which is not given".into()));
        }
        match dataset {
            DatasetType::Lerobot if self.dataset.repo_id.is_some() => {
                self.resolve_lerobot_root(hub)?;
            }
            DatasetType::Npz | DatasetType::Lerobot => {
                let also = if dataset == DatasetType::Lerobot { " (or dataset.repo_id)" } else { "" };
                let root = root.ok_or_else(|| WorkloadError::invalid("dataset.root", format!("required for dataset.type={}{also}", dataset.name())))?;
                if !root.is_dir() {
                    return Err(WorkloadError::invalid("dataset.root", format!("{}: no such directory", root.display())));
                }
                let info = root.join("meta/info.json");
                if dataset == DatasetType::Lerobot && !info.is_file() {
                    return Err(WorkloadError::invalid("dataset.root", format!("{}: not a LeRobot dataset ({} is missing)", root.display(), info.display())));
                }
            }
            DatasetType::Sim | DatasetType::Voxels | DatasetType::Random => {}
        }
        match &self.dataset.episodes {
            Some(e) if e.is_empty() => return Err(WorkloadError::invalid("dataset.episodes", "an empty list selects no episode".into())),
            Some(_) if !matches!(dataset, DatasetType::Sim | DatasetType::Lerobot) => {
                return Err(WorkloadError::invalid("dataset.episodes", format!("selects episodes of a LeRobot dataset; dataset.type={} has none", dataset.name())));
            }
            Some(e) if dataset == DatasetType::Sim && e.iter().any(|&i| i >= self.dataset.num_episodes) => {
                return Err(WorkloadError::invalid(
                    "dataset.episodes",
                    format!("{e:?}: the built-in demonstrations have episodes 0..{} (dataset.num_episodes)", self.dataset.num_episodes),
                ));
            }
            _ => {}
        }
        if dataset == DatasetType::Sim && self.dataset.num_episodes == 0 {
            return Err(WorkloadError::invalid("dataset.num_episodes", "must be at least 1".into()));
        }
        if matches!(dataset, DatasetType::Voxels | DatasetType::Random) && self.dataset.num_scenes == 0 {
            return Err(WorkloadError::invalid("dataset.num_scenes", "must be at least 1".into()));
        }
        if self.dataset.grid.contains(&0) {
            return Err(WorkloadError::invalid("dataset.grid", format!("sizes must be at least 1, found {:?}", self.dataset.grid)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ov(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

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
        for (flag, valid) in [("precision", "bf16"), ("gradient_checkpointing", "balanced"), ("backend", "wgpu"), ("optimizer.type", "adamw"), ("scheduler.type", "cosine"), ("dataset.type", "lerobot")] {
            let err = load(None, &ov(&[(flag, "nope")])).unwrap_err().to_string();
            assert!(err.contains("nope") && err.contains(valid), "{flag}: {err}");
        }
    }

    #[test]
    fn policy_typos_are_found_while_loading() {
        let err = load(None, &ov(&[("policy.type", "act"), ("policy.chunk_sise", "50")])).unwrap_err().to_string();
        assert!(err.contains("chunk_sise") && err.contains("chunk_size"), "{err}");
        let err = load(None, &ov(&[("policy.type", "actt")])).unwrap_err().to_string();
        assert!(err.contains("actt") && err.contains("diffusion"), "{err}");
    }

    #[test]
    fn validation_catches_ranges_toggles_and_missing_files() {
        let check = |pairs: &[(&str, &str)], want: &[&str]| {
            let err = load(None, &ov(pairs)).and_then(|c| c.validate()).unwrap_err().to_string();
            assert!(want.iter().all(|w| err.contains(w)), "{pairs:?}: {err}");
        };
        check(&[("policy.type", "act"), ("steps", "0")], &["steps", "at least 1"]);
        check(&[("policy.type", "vae3d"), ("optimizer.lr_backbone", "1e-5")], &["lr_backbone", "no vision backbone"]);
        check(&[("policy.type", "vae3d"), ("dataset.type", "sim")], &["dataset.type", "voxels"]);
        check(&[("policy.type", "act"), ("dataset.type", "voxels")], &["dataset.type", "sim"]);
        check(&[("policy.type", "act"), ("dataset.type", "lerobot")], &["dataset.root", "required"]);
        check(&[("policy.type", "act"), ("dataset.type", "lerobot"), ("dataset.root", "/nonexistent/ds")], &["/nonexistent/ds", "no such directory"]);
        check(&[("policy.type", "act"), ("policy.state_dim", "3")], &["policy.state_dim", "defines the features"]);
        check(&[("policy.type", "act"), ("policy.chunk_size", "0")], &["chunk_size"]);
        check(&[("steps", "3")], &["policy.type", "required"]);
        check(&[("policy.type", "act"), ("dataset.episodes", "[]")], &["dataset.episodes", "no episode"]);
        check(&[("policy.type", "vae3d"), ("dataset.episodes", "0,1")], &["dataset.episodes", "voxels"]);
        check(&[("policy.type", "act"), ("dataset.episodes", "3,20")], &["dataset.episodes", "0..20"]);
    }

    #[test]
    fn synthetic_means_each_policys_built_in_data() {
        let t = |p: &str| load(None, &ov(&[("policy.type", p), ("dataset.type", "synthetic")])).unwrap().dataset_type().unwrap();
        assert_eq!(t("vae3d"), DatasetType::Voxels);
        assert_eq!(t("act"), DatasetType::Sim);
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
