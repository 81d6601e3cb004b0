//! The run config's types: [`RunConfig`] and its sections, every switch a serde enum (backend,
//! precision, checkpointing, dataset type, optimizer, scheduler) with the serde helpers that
//! read a switch given as a word, a boolean or a number. Loading is [`super::load`], checking
//! is [`super::validate`]; the typed `policy` section is [`super::policy`].

use std::path::PathBuf;
use std::sync::OnceLock;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use vramlab_models::nn::Precision;
use vramlab_train::{CheckpointMode, OptimKind, ScheduleKind};

use super::policy::PolicyConfig;
use crate::backend::{AutotuneLevel, BackendKind, GpuMemoryPool, GpuOptions};
use crate::error::WorkloadError;

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
    pub autotune: Option<AutotuneLevel>,
    /// wgpu/cuda: where compiled kernels and autotune results persist across runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_cache_dir: Option<PathBuf>,
    /// wgpu/cuda: autotune matrix products (Burn's search per shape and layout) instead of
    /// CubeCL's fixed kernel (`nn::cube::matmul`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub matmul_autotune: bool,
    /// wgpu/cuda: Burn's full autotune search for the convolutions (forward, weight gradient)
    /// instead of the short one of `nn::cube::conv` (none on a device without matrix units).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub conv_full_autotune: bool,
    /// wgpu/cuda: `exact` (every buffer its tensor's size; cuda's default) or `pages` (CubeCL's
    /// pools, pages sized by the device's memory; wgpu's default): `backend::GpuMemoryPool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_pool: Option<GpuMemoryPool>,
    #[serde(default, deserialize_with = "parsed_precision", serialize_with = "serialize_precision")]
    pub precision: Precision,
    #[serde(default, deserialize_with = "parsed_checkpointing", serialize_with = "serialize_checkpointing")]
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
    /// Not a field: the step of the checkpoint a `--resume` continues from, when loading the
    /// config already verified it ([`super::load`] reads that checkpoint's run config), so the
    /// run's checks do not verify it again (the trainer does, under the run's lock).
    #[serde(skip)]
    pub resume_verified: Option<u64>,
    /// What the user should know before any command runs (lerobot keys mapped or ignored);
    /// printed by the CLI. See [`super::lerobot`]; what concerns training only is
    /// [`RunConfig::training_notes`].
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

fn serialize_precision<S: Serializer>(p: &Precision, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

fn parsed_checkpointing<'de, D: Deserializer<'de>>(d: D) -> Result<CheckpointMode, D::Error> {
    parsed(d, CheckpointMode::parse, CheckpointMode::NAMES)
}

fn serialize_checkpointing<S: Serializer>(m: &CheckpointMode, s: S) -> Result<S::Ok, S::Error> {
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


impl RunConfig {
    /// CubeCL's caches and autotune level for the GPU backends.
    pub fn gpu_options(&self) -> GpuOptions {
        GpuOptions { kernel_cache_dir: self.kernel_cache_dir.clone(), autotune: self.autotune, matmul_autotune: self.matmul_autotune, conv_full_autotune: self.conv_full_autotune, memory_pool: self.gpu_memory_pool }
    }

    /// What a command that trains (`train`, `warmup`, `sweep`, `fit`) says before it starts, on
    /// top of [`RunConfig::notes`]: the ACT backbone's missing ImageNet weights
    /// ([`PolicyConfig::notes`]). `estimate` and `info` do not print them.
    pub fn training_notes(&self) -> Vec<String> {
        self.policy.as_ref().map(PolicyConfig::notes).unwrap_or_default()
    }

    /// The policy, or an error saying how to name one.
    pub fn policy(&self) -> Result<&PolicyConfig, WorkloadError> {
        self.policy.as_ref().ok_or_else(|| WorkloadError::invalid("policy.type", format!("required (--policy.type=…); valid: {}", PolicyConfig::names())))
    }
}
