//! The commands' entry points: [`train`], [`info`], [`predict`], [`estimate`],
//! [`bench_inference`]. Each only dispatches: one `match` on the [`Workload`] (or, for a
//! checkpoint, its `type`) with one arm per model calling that model module's entry point of
//! the same name, run on the backend the run config names ([`crate::backend::dispatch`]).

use crate::backend::TrainBackend;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use vramlab_models::nn::LeanBackend;
use vramlab_models::nn::Precision;
use vramlab_probe::MemoryProbe;

use crate::backend::{BackendInfo, BackendKind, GpuOptions, Job, dispatch};
use crate::config::{RunConfig, Workload};
use crate::error::{Result, WorkloadError};
use crate::estimate::{MemoryEstimate, Shapes, estimate_from};
use crate::inference::policy::Stats;
use crate::inference::{BenchReport, BenchRequest, Machine};
use crate::inputs::Inputs;
use crate::layout::{self, checkpoint_type};
use crate::model_info::InfoReport;
use crate::training::{TrainObserver, run_training};
use crate::{act, diffusion, vae3d};

/// Validate `cfg` (before any data or model exists), check that its estimated peak fits the
/// memory available ([`crate::preflight`]), then train on its backend.
pub fn train(cfg: RunConfig, observer: &mut dyn TrainObserver) -> Result<()> {
    cfg.validate()?;
    if let Some(avail) = crate::preflight::applies(&cfg) {
        crate::preflight::check_train(&cfg, &estimate_of(&cfg)?, &avail)?;
    }
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

/// Parameter counts of `cfg`'s model (built on the CPU side of its backend, never trained),
/// after the checks `train` makes and a check that its parameters fit the memory available.
pub fn info(cfg: &RunConfig) -> Result<InfoReport> {
    // `info` describes the shorthand features (no dataset is opened).
    cfg.validate()?;
    if let Some(avail) = crate::preflight::applies(cfg) {
        crate::preflight::check_info(cfg, num_params(cfg)?, &avail)?;
    }
    dispatch(cfg.backend, cfg.device, &cfg.gpu_options(), cfg.gradient_checkpointing, cfg.precision, InfoJob { cfg })
}

struct InfoJob<'a> {
    cfg: &'a RunConfig,
}

impl Job for InfoJob<'_> {
    type Output = InfoReport;

    fn run<B: TrainBackend>(self, device: B::Device, _probe: &dyn MemoryProbe, _info: &BackendInfo) -> Result<InfoReport> {
        match &self.cfg.policy()?.kind {
            Workload::Vae3d(p) => vae3d::info::<B::InnerBackend>(p, &device),
            Workload::Act(p) => act::info::<B::InnerBackend>(p, &device),
            Workload::Diffusion(p) => diffusion::info::<B::InnerBackend>(p, &device),
        }
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
    let dir = layout::verified_pretrained_dir(&req.checkpoint, "checkpoint")?;
    let kind = checkpoint_type(&dir)?;
    let mut inputs = Inputs::read(&req.inputs)?;
    let processors = crate::processors::read(&dir)?;
    if let Some(p) = &processors {
        inputs.normalize(p)?;
    }
    dispatch(cfg.backend, cfg.device, &cfg.gpu_options(), cfg.gradient_checkpointing, cfg.precision, PredictJob { kind, dir, out: &req.out, inputs, processors, precision: cfg.precision })
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
                return Err(WorkloadError::file(dir.join(layout::CONFIG_FILE), format!("policy type `{other}` is not supported by this build (supported: {})", layout::MODEL_TYPES.join(", "))));
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

/// The shapes of `cfg`'s training step, from its model module.
pub(crate) fn shapes(cfg: &RunConfig) -> Result<Shapes> {
    match &cfg.policy()?.kind {
        Workload::Vae3d(p) => vae3d::estimate(p, cfg),
        Workload::Act(p) => act::estimate(p, cfg),
        Workload::Diffusion(p) => diffusion::estimate(p, cfg),
    }
}

/// The exact parameter count of `cfg`'s model, from its config (nothing built).
fn num_params(cfg: &RunConfig) -> Result<u64> {
    Ok(match &cfg.policy()?.kind {
        Workload::Vae3d(p) => p.config.num_params() as u64,
        Workload::Act(p) => p.resolve()?.num_params() as u64,
        Workload::Diffusion(p) => p.resolve()?.num_params() as u64,
    })
}

/// `vramlab estimate`: the peak memory of `cfg`'s training step on flex, predicted from shapes
/// alone ([`crate::estimate`]), after the checks `train` makes.
pub fn estimate(cfg: &RunConfig) -> Result<MemoryEstimate> {
    cfg.validate()?;
    estimate_of(cfg)
}

/// [`estimate`] of a validated config. Its own time and memory do not grow with the batch; a
/// batch whose figures would not fit in 64 bits is an error naming `batch_size`.
pub(crate) fn estimate_of(cfg: &RunConfig) -> Result<MemoryEstimate> {
    if cfg.batch_size > 1 {
        // Every figure grows at most linearly with the batch: bounded by batch × batch 1's.
        let one = RunConfig { batch_size: 1, ..cfg.clone() };
        let e1 = estimate_from(&one, shapes(&one)?);
        let b = u128::from(cfg.batch_size);
        if u128::from(e1.peak_step_bytes) * b > u128::from(u64::MAX >> 2) {
            // What grows with the batch: the stored activations and the batch itself.
            let fixed = e1.param_bytes + e1.grad_bytes + e1.optimizer_state_bytes;
            let about = u128::from(fixed) + b * u128::from(e1.stored_activation_bytes + e1.batch_bytes);
            return Err(WorkloadError::invalid(
                "batch_size",
                format!("{}: a training step would need about {about} bytes (an estimate: the batch-1 stored activations and batch times {}), {}; lower --batch_size", cfg.batch_size, cfg.batch_size, crate::preflight::BEYOND),
            ));
        }
    }
    Ok(estimate_from(cfg, shapes(cfg)?))
}

/// `vramlab bench-inference`: measure `req` on `backend` (device index `device`) with the
/// model-agnostic machinery of [`crate::inference`]; `machine` goes into the report.
pub fn bench_inference(req: &BenchRequest, backend: BackendKind, device: usize, machine: Machine) -> Result<BenchReport> {
    dispatch(backend, device, &GpuOptions::default(), Default::default(), req.precision, BenchJob { req, backend, machine })
}

struct BenchJob<'a> {
    req: &'a BenchRequest,
    backend: BackendKind,
    machine: Machine,
}

impl Job for BenchJob<'_> {
    type Output = BenchReport;

    fn run<B: TrainBackend>(self, device: B::Device, _probe: &dyn MemoryProbe, _info: &BackendInfo) -> Result<BenchReport> {
        bench_inference_on::<B::InnerBackend>(self.req, self.backend, self.machine, &device)
    }
}

/// [`bench_inference`] on backend `B` (`backend` names it in the report): by the checkpoint's
/// `type`, the robot policy's `bench_inference`.
pub fn bench_inference_on<B: LeanBackend>(req: &BenchRequest, backend: BackendKind, machine: Machine, device: &B::Device) -> Result<BenchReport> {
    req.validate()?;
    let dir = layout::verified_pretrained_dir(&req.checkpoint, "checkpoint")?;
    let kind = checkpoint_type(&dir)?;
    let stats = Stats::read(&dir)?;
    let mut report = BenchReport::new(req, dir.clone(), backend, machine);
    match kind.as_str() {
        "act" => act::bench_inference::<B>(req, &dir, &stats, device, &mut report)?,
        "diffusion" => diffusion::bench_inference::<B>(req, &dir, &stats, device, &mut report)?,
        other => {
            return Err(WorkloadError::file(dir.join(layout::CONFIG_FILE), format!("policy type `{other}` has no select_action to bench (supported: act, diffusion)")));
        }
    }
    Ok(report)
}
