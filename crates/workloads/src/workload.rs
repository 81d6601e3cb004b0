//! The commands' entry points. Each matches on the workload once and runs on the backend the
//! run config names ([`crate::backend::dispatch`]).

use crate::backend::TrainBackend;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use vramlab_models::nn::Precision;
use vramlab_probe::MemoryProbe;

use crate::backend::{BackendInfo, Job, dispatch};
use crate::config::RunConfig;
use crate::inputs::Inputs;
use crate::policy::Workload;
use crate::training::{TrainObserver, run_training};
use crate::{Result, WorkloadError, act, diffusion, vae3d};

/// Validate `cfg` (before any data or model exists), then train on its backend.
pub fn train(cfg: RunConfig, observer: &mut dyn TrainObserver) -> Result<()> {
    cfg.validate()?;
    let (backend, device, mode, precision) = (cfg.backend, cfg.device, cfg.gradient_checkpointing, cfg.precision);
    let gpu = cfg.gpu_options();
    dispatch(backend, device, &gpu, mode, precision, TrainJob { cfg, observer })
}

struct TrainJob<'o> {
    cfg: RunConfig,
    observer: &'o mut dyn TrainObserver,
}

impl Job for TrainJob<'_> {
    type Output = ();

    fn run<B: TrainBackend>(self, device: B::Device, probe: &dyn MemoryProbe, info: &BackendInfo) -> Result<()> {
        let Self { cfg, observer } = self;
        match &cfg.policy()?.kind {
            Workload::Vae3d(p) => run_training::<B, _>(&cfg, info, probe, &device, vae3d::setup::<B>(p, &cfg, &device)?, observer),
            Workload::Act(p) => run_training::<B, _>(&cfg, info, probe, &device, act::setup::<B>(p, &cfg, &device)?, observer),
            Workload::Diffusion(p) => run_training::<B, _>(&cfg, info, probe, &device, diffusion::setup::<B>(p, &cfg, &device)?, observer),
        }
    }
}

/// Parameter counts of a config, per module: `(module, parameters, trainable)`.
pub struct InfoReport {
    /// The policy and its shape-deciding fields.
    pub title: String,
    pub rows: Vec<(String, u64, u64)>,
    /// Further lines (buffers that are not parameters).
    pub notes: Vec<String>,
}

impl InfoReport {
    pub fn total(&self) -> u64 {
        self.rows.iter().map(|r| r.1).sum()
    }

    pub fn trainable(&self) -> u64 {
        self.rows.iter().map(|r| r.2).sum()
    }
}

/// Parameter counts of `cfg`'s model (built on the CPU side of its backend, never trained).
pub fn info(cfg: &RunConfig) -> Result<InfoReport> {
    // `info` describes the shorthand features (no dataset is opened).
    if let Workload::Vae3d(p) = &cfg.policy()?.kind {
        p.config.validate().map_err(|e| WorkloadError::invalid("policy", format!("(vae3d) {e}")))?;
    }
    dispatch(cfg.backend, cfg.device, &cfg.gpu_options(), cfg.gradient_checkpointing, cfg.precision, InfoJob { cfg })
}

struct InfoJob<'a> {
    cfg: &'a RunConfig,
}

/// Rows grouped by the first segment of each parameter name.
fn rows_by_top_module(shapes: &[(String, Vec<usize>)]) -> Vec<(String, u64, u64)> {
    let mut per_module: BTreeMap<String, u64> = BTreeMap::new();
    for (name, shape) in shapes {
        let top = name.split('.').next().unwrap_or(name).to_string();
        *per_module.entry(top).or_default() += shape.iter().product::<usize>() as u64;
    }
    per_module.into_iter().map(|(m, n)| (m, n, n)).collect()
}

impl Job for InfoJob<'_> {
    type Output = InfoReport;

    fn run<B: TrainBackend>(self, device: B::Device, _probe: &dyn MemoryProbe, _info: &BackendInfo) -> Result<InfoReport> {
        match &self.cfg.policy()?.kind {
            Workload::Vae3d(p) => {
                let model = p.config.init::<B::InnerBackend>(&device);
                let shapes = vramlab_store::param_shapes::<B::InnerBackend, _>(&model);
                let json = serde_json::to_string(&p.config).expect("a VAE config serialises");
                Ok(InfoReport { title: format!("vae3d {json}"), rows: rows_by_top_module(&shapes), notes: Vec::new() })
            }
            Workload::Act(p) => act::info::<B::InnerBackend>(&p.resolve()?, &device),
            Workload::Diffusion(p) => diffusion::info::<B::InnerBackend>(&p.resolve()?, &device),
        }
    }
}

/// The `type` of a checkpoint directory's `config.json`.
pub(crate) fn checkpoint_type(dir: &Path) -> Result<String> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| WorkloadError::Io { path: path.clone(), source })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| WorkloadError::file(&path, format!("invalid JSON: {e}")))?;
    match v.get("type").and_then(|t| t.as_str()) {
        Some(t) => Ok(t.to_string()),
        None => Err(WorkloadError::file(&path, "field `type` is missing (expected \"vae3d\", \"act\" or \"diffusion\")".into())),
    }
}

/// The policy's action chunk (`eval_actions` of ACT, `ddim_actions` of Diffusion) through the
/// postprocessor: `action_chunk` [B, T, A] and its first step `action` [B, A].
fn actions_in_dataset_units(outputs: &[(String, TensorData)], p: &crate::processors::Processors) -> Result<Vec<(String, TensorData)>> {
    let Some((_, chunk)) = outputs.iter().find(|(k, _)| k == "eval_actions" || k == "ddim_actions") else { return Ok(Vec::new()) };
    let shape = chunk.shape.to_vec();
    let mut v = chunk.clone().to_vec::<f32>().map_err(|e| WorkloadError::invalid("predict", format!("{e:?}")))?;
    p.unnormalize.unnormalize("action", &mut v).map_err(|e| WorkloadError::invalid("predict", e.to_string()))?;
    let (b, t, a) = (shape[0], shape[1], shape[2]);
    let first: Vec<f32> = v.chunks_exact(t * a).flat_map(|s| s[..a].to_vec()).collect();
    Ok(vec![("action_chunk".into(), TensorData::new(v, shape)), ("action".into(), TensorData::new(first, [b, a]))])
}

/// What `vramlab predict` needs: a checkpoint directory, an inputs file, where to write.
pub struct PredictRequest {
    pub checkpoint: PathBuf,
    pub inputs: PathBuf,
    pub out: PathBuf,
}

/// Run a checkpoint on model-level inputs (checked against its config first) and write the
/// outputs under the fixture's tensor names. Returns the written tensors' names and shapes.
///
/// `checkpoint` is a `pretrained_model/` directory or a checkpoint step directory holding one.
/// Where it has lerobot's processors (every checkpoint vramlab trains from a dataset), inputs
/// are raw observations normalised as lerobot's preprocessor does, and `action_chunk` /
/// `action` (the first step, what lerobot's `select_action` returns first) are added in the
/// dataset's units; without processors inputs are taken as already normalised.
pub fn predict(req: &PredictRequest, cfg: &RunConfig) -> Result<Vec<(String, Vec<usize>)>> {
    let dir = pretrained_dir(&req.checkpoint);
    let kind = checkpoint_type(&dir)?;
    let mut inputs = Inputs::read(&req.inputs)?;
    let processors = crate::processors::read(&dir)?;
    if let Some(p) = &processors {
        inputs.normalize(p)?;
    }
    dispatch(cfg.backend, cfg.device, &cfg.gpu_options(), cfg.gradient_checkpointing, cfg.precision, PredictJob { kind, dir, out: &req.out, inputs, processors, precision: cfg.precision })
}

/// The `pretrained_model/` a path names: `dir/pretrained_model/` (a checkpoint step
/// directory), then `dir/last/pretrained_model/` (a run's `checkpoints/`), else `dir` itself
/// (a `pretrained_model/` directory, or a fixture with the files directly in it).
pub fn pretrained_dir(dir: &Path) -> PathBuf {
    let model = vramlab_train::checkpoint::PRETRAINED_MODEL_DIR;
    [dir.join(model), dir.join(vramlab_train::checkpoint::LAST_LINK).join(model)]
        .into_iter()
        .find(|d| d.join(vramlab_models::policy::CONFIG_FILE).is_file())
        .unwrap_or_else(|| dir.to_path_buf())
}

struct PredictJob<'a> {
    kind: String,
    dir: PathBuf,
    out: &'a Path,
    inputs: Inputs,
    processors: Option<crate::processors::Processors>,
    precision: Precision,
}

impl Job for PredictJob<'_> {
    type Output = Vec<(String, Vec<usize>)>;

    fn run<B: TrainBackend>(self, device: B::Device, _probe: &dyn MemoryProbe, _info: &BackendInfo) -> Result<Self::Output> {
        let Self { kind, dir, out, mut inputs, processors, precision } = self;
        let dir = &dir;
        let outputs: Vec<(String, TensorData)> = match kind.as_str() {
            "vae3d" => vae3d::predict::<B::InnerBackend>(dir, &mut inputs, precision, &device)?,
            "act" => act::predict::<B::InnerBackend>(dir, &mut inputs, precision, &device)?,
            "diffusion" => diffusion::predict::<B::InnerBackend>(dir, &mut inputs, precision, &device)?,
            other => {
                return Err(WorkloadError::file(dir.join("config.json"), format!("policy type `{other}` is not supported by this build (supported: vae3d, act, diffusion)")));
            }
        };
        let mut outputs: Vec<(String, TensorData)> = outputs.into_iter().map(|(k, d)| (k, d.convert::<f32>())).collect();
        if let Some(p) = &processors {
            outputs.extend(actions_in_dataset_units(&outputs, p)?);
        }
        vramlab_store::write_safetensors(&outputs, out)?;
        Ok(outputs.into_iter().map(|(k, d)| (k, d.shape.to_vec())).collect())
    }
}
