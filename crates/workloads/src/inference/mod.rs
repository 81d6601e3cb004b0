//! `vramlab bench-inference`: drive a policy checkpoint at a fixed control rate with a
//! synthetic robot and measure the latency of every `select_action` call against the frame
//! budget (1/fps), with lerobot 0.4.4's semantics (`ACTPolicy.select_action` with its action
//! queue or `ACTTemporalEnsembler`, `DiffusionPolicy.select_action` with its observation and
//! action queues).
//!
//! - [`robot`]: cameras with a new uint8 frame per call, random-walk states.
//! - [`policy`]: pre/post-processing (normaliser stats of the checkpoint when present) and the
//!   `select_action` runners.
//! - [`report`]: percentiles, machine and CPU governor, markdown, `latency.jsonl`, `summary.md`.

pub mod policy;
pub mod report;
pub mod robot;

use vramlab_models::nn::LeanBackend;
use crate::backend::TrainBackend;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vramlab_models::act::{ActConfig, ActPolicyRunner};
use vramlab_models::diffusion::{DiffusionConfig, PolicyFeatures};
use vramlab_models::nn::Precision;
use vramlab_probe::MemoryProbe;

use crate::backend::{BackendInfo, BackendKind, Job, dispatch};
use crate::error::{Result, WorkloadError};
use crate::layout::{CONFIG_FILE, checkpoint_type, pretrained_dir};
use policy::{PolicyIo, Processor, Runner, Stats};
pub use report::{Governor, LatencyStats, Machine, percentile};
use robot::SyntheticRobot;

/// The coefficient of the original ACT work (lerobot's `ACTConfig` docs), used for the
/// ensembling mode when neither the flag nor the checkpoint's config sets one.
pub const DEFAULT_ENSEMBLE_COEFF: f64 = 0.01;

/// Which `select_action` modes to measure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModeChoice {
    /// ACT: queue and temporal ensembling; Diffusion: queue.
    #[default]
    Both,
    Queue,
    Ensemble,
}

/// One measured `select_action` mode.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// The action queue: the model runs every `n_action_steps` calls.
    Queue { n_action_steps: usize },
    /// ACT's temporal ensembling: the model runs on every call.
    Ensemble { coeff: f64 },
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Queue { .. } => "queue",
            Mode::Ensemble { .. } => "ensemble",
        }
    }

    pub fn label(&self) -> String {
        match self {
            Mode::Queue { n_action_steps } => format!("queue, n_action_steps={n_action_steps}"),
            Mode::Ensemble { coeff } => format!("temporal ensemble, coeff={coeff}"),
        }
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchRequest {
    /// A `pretrained_model/` dir, or a checkpoint dir holding one.
    pub checkpoint: PathBuf,
    pub fps: f64,
    /// Measured calls per mode.
    pub calls: usize,
    /// Calls before the measured ones (then the policy is reset).
    pub warmup: usize,
    pub modes: ModeChoice,
    /// Queue mode's `n_action_steps` (default: the checkpoint's).
    pub n_action_steps: Option<usize>,
    /// The ensembling coefficient (default: the checkpoint's, else [`DEFAULT_ENSEMBLE_COEFF`]).
    pub temporal_ensemble_coeff: Option<f64>,
    pub precision: Precision,
    pub seed: u64,
}

/// One measured call.
#[derive(Clone, Debug, PartialEq)]
pub struct CallRecord {
    pub call: usize,
    pub ran_model: bool,
    pub latency_ms: f64,
}

/// The measured calls of one mode.
#[derive(Clone, Debug)]
pub struct ModeRun {
    pub mode: Mode,
    pub records: Vec<CallRecord>,
    /// Wall time of the measured calls, sleeps included.
    pub wall_s: f64,
}

/// Everything [`bench`] measured, with what the report prints about it.
#[derive(Clone, Debug)]
pub struct BenchReport {
    pub checkpoint: PathBuf,
    /// The policy and its shape-deciding fields.
    pub policy: String,
    pub backend: BackendKind,
    pub precision: Precision,
    pub fps: f64,
    pub warmup: usize,
    pub machine: Machine,
    /// Where the normaliser stats came from.
    pub normalisation: String,
    pub notes: Vec<String>,
    pub runs: Vec<ModeRun>,
}

/// Measure `req` on `backend` (device index `device`); `machine` goes into the report.
pub fn bench(req: &BenchRequest, backend: BackendKind, device: usize, machine: Machine) -> Result<BenchReport> {
    dispatch(backend, device, &crate::backend::GpuOptions::default(), Default::default(), req.precision, BenchJob { req, backend, machine })
}

struct BenchJob<'a> {
    req: &'a BenchRequest,
    backend: BackendKind,
    machine: Machine,
}

impl Job for BenchJob<'_> {
    type Output = BenchReport;

    fn run<B: TrainBackend>(self, device: B::Device, _probe: &dyn MemoryProbe, _info: &BackendInfo) -> Result<BenchReport> {
        bench_on::<B::InnerBackend>(self.req, self.backend, self.machine, &device)
    }
}

/// [`bench`] on backend `B` (`backend` names it in the report).
pub fn bench_on<B: LeanBackend>(req: &BenchRequest, backend: BackendKind, machine: Machine, device: &B::Device) -> Result<BenchReport> {
    if !(req.fps.is_finite() && req.fps > 0.0) {
        return Err(WorkloadError::invalid("fps", format!("must be a positive number, got {}", req.fps)));
    }
    if req.calls == 0 {
        return Err(WorkloadError::invalid("calls", "must be at least 1".into()));
    }
    let dir = pretrained_dir(&req.checkpoint);
    let kind = checkpoint_type(&dir)?;
    let stats = Stats::read(&dir)?;
    let mut report = BenchReport {
        checkpoint: dir.clone(),
        policy: String::new(),
        backend,
        precision: req.precision,
        fps: req.fps,
        warmup: req.warmup,
        machine,
        normalisation: String::new(),
        notes: Vec::new(),
        runs: Vec::new(),
    };
    match kind.as_str() {
        "act" => bench_act::<B>(req, &dir, &stats, device, &mut report)?,
        "diffusion" => bench_diffusion::<B>(req, &dir, &stats, device, &mut report)?,
        other => {
            return Err(WorkloadError::file(dir.join(CONFIG_FILE), format!("policy type `{other}` has no select_action to bench (supported: act, diffusion)")));
        }
    }
    Ok(report)
}

/// A config value the policy refuses, named as the bench flag that set it.
fn invalid(e: vramlab_models::policy::InvalidField) -> WorkloadError {
    WorkloadError::invalid(e.field, e.msg)
}

fn bench_act<B: LeanBackend>(req: &BenchRequest, dir: &Path, stats: &Stats, device: &B::Device, report: &mut BenchReport) -> Result<()> {
    let (cfg, model) = vramlab_models::act::load_pretrained::<B>(dir, device)?;
    let cams: Vec<String> = cfg.image_features().iter().map(|(k, s)| format!("{k} {s:?}")).collect();
    report.policy = format!(
        "act: chunk_size {}, dim_model {}, {} encoder / {} decoder layers, {}, state {}, action {}, cameras [{}], {} parameters",
        cfg.chunk_size,
        cfg.dim_model,
        cfg.n_encoder_layers,
        cfg.n_decoder_layers,
        cfg.vision_backbone,
        cfg.robot_state_dim().map_or("none".into(), |d| d.to_string()),
        cfg.action_dim(),
        cams.join(", "),
        crate::thousands(model.num_parameters() as u64)
    );
    let io = PolicyIo {
        cameras: cfg.image_features().iter().map(|(k, s)| (k.to_string(), *s)).collect(),
        state: cfg.robot_state_dim().map(|d| (vramlab_models::policy::OBS_STATE.to_string(), d)),
        env_state: cfg.env_state().map(|(k, d)| (k.to_string(), d)),
        action_dim: cfg.action_dim(),
        mapping: cfg.normalization_mapping.clone(),
    };
    let processor = Processor::<B>::new(&io, stats, device)?;
    report.normalisation = stats.note(&processor.neutral);
    let mut modes = Vec::new();
    if req.modes != ModeChoice::Ensemble {
        modes.push(ActConfig { n_action_steps: req.n_action_steps.unwrap_or(cfg.n_action_steps), temporal_ensemble_coeff: None, ..cfg.clone() });
    }
    if req.modes != ModeChoice::Queue {
        let coeff = req.temporal_ensemble_coeff.or(cfg.temporal_ensemble_coeff).unwrap_or(DEFAULT_ENSEMBLE_COEFF);
        modes.push(ActConfig { n_action_steps: 1, temporal_ensemble_coeff: Some(coeff), ..cfg.clone() });
        report.notes.push("temporal ensembling requires n_action_steps = 1 (lerobot's ACTConfig): the ensemble mode runs with it".into());
    }
    for c in modes {
        c.validate().map_err(invalid)?;
        let mode = match c.temporal_ensemble_coeff {
            Some(coeff) => Mode::Ensemble { coeff },
            None => Mode::Queue { n_action_steps: c.n_action_steps },
        };
        let runner = Runner::Act { model: &model, runner: ActPolicyRunner::new(&c) };
        report.runs.push(run_mode(req, mode, &io, &processor, runner)?);
    }
    Ok(())
}

fn bench_diffusion<B: LeanBackend>(req: &BenchRequest, dir: &Path, stats: &Stats, device: &B::Device, report: &mut BenchReport) -> Result<()> {
    if req.modes == ModeChoice::Ensemble || req.temporal_ensemble_coeff.is_some() {
        return Err(WorkloadError::invalid("temporal_ensemble_coeff", "temporal ensembling is ACT's; lerobot's DiffusionPolicy has none".into()));
    }
    let (cfg, mut model) = vramlab_models::diffusion::load_pretrained::<B>(dir, device)?;
    let cfg = DiffusionConfig { n_action_steps: req.n_action_steps.unwrap_or(cfg.n_action_steps), ..cfg };
    cfg.validate().map_err(invalid)?;
    let cams: Vec<String> = cfg.image_features().iter().map(|(k, s)| format!("{k} {s:?}")).collect();
    // `generate_actions` keeps the model config's n_action_steps actions.
    model.config.n_action_steps = cfg.n_action_steps;
    report.policy = format!(
        "diffusion: n_obs_steps {}, horizon {}, {} {} inference steps, down_dims {:?}, crop {}, state {}, action {}, cameras [{}], {} parameters",
        cfg.n_obs_steps,
        cfg.horizon,
        cfg.noise_scheduler_type,
        cfg.inference_steps(),
        cfg.down_dims,
        cfg.crop_shape.map_or("none".into(), |c| format!("{c:?}")),
        cfg.state_dim(),
        cfg.action_dim(),
        cams.join(", "),
        crate::thousands(model.num_parameters() as u64)
    );
    let io = PolicyIo {
        cameras: cfg.image_features().iter().map(|(k, s)| (k.to_string(), *s)).collect(),
        state: Some((vramlab_models::policy::OBS_STATE.to_string(), cfg.state_dim())),
        env_state: cfg.env_state().map(|(k, d)| (k.to_string(), d)),
        action_dim: cfg.action_dim(),
        mapping: cfg.normalization_mapping.clone(),
    };
    let processor = Processor::<B>::new(&io, stats, device)?;
    report.normalisation = stats.note(&processor.neutral);
    let runner = Runner::Diffusion { model: &model, runner: vramlab_models::diffusion::DiffusionPolicyRunner::new(&cfg) };
    report.runs.push(run_mode(req, Mode::Queue { n_action_steps: cfg.n_action_steps }, &io, &processor, runner)?);
    if req.modes == ModeChoice::Both {
        report.notes.push("Diffusion Policy has no temporal ensembling in lerobot: queue mode only".into());
    }
    Ok(())
}

/// `warmup` calls, a reset (as at an episode start), then `calls` measured calls, each
/// starting a period of 1/fps.
fn run_mode<B: LeanBackend>(req: &BenchRequest, mode: Mode, io: &PolicyIo, processor: &Processor<B>, mut runner: Runner<'_, B>) -> Result<ModeRun> {
    let period = Duration::from_secs_f64(1.0 / req.fps);
    let cams: Vec<[usize; 3]> = io.cameras.iter().map(|(_, s)| *s).collect();
    let mut robot = SyntheticRobot::new(&cams, io.state.as_ref().map(|s| s.1), io.env_state.as_ref().map(|s| s.1), req.seed);
    eprintln!("bench-inference: {} — {} warmup + {} calls at {} fps", mode.label(), req.warmup, req.calls, req.fps);
    let mut records = Vec::with_capacity(req.calls);
    let mut start = Instant::now();
    for i in 0..req.warmup + req.calls {
        if i == req.warmup {
            runner.reset();
            start = Instant::now();
        }
        let tick = Instant::now();
        let obs = robot.observe();
        let t0 = Instant::now();
        let (action, ran_model) = runner.select_action(processor.observation(obs), req.precision);
        let action = processor.action(action)?;
        let latency = t0.elapsed();
        std::hint::black_box(action);
        if i >= req.warmup {
            records.push(CallRecord { call: i - req.warmup, ran_model, latency_ms: latency.as_secs_f64() * 1e3 });
        }
        if let Some(rest) = period.checked_sub(tick.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    Ok(ModeRun { mode, records, wall_s: start.elapsed().as_secs_f64() })
}

#[cfg(test)]
mod tests {
    use super::*;

    use vramlab_testkit::shared_dir;

    /// The bench on flex (`bench` itself dispatches, which needs the CLI's counting allocator).
    fn run(req: &BenchRequest) -> Result<BenchReport> {
        bench_on::<burn::backend::Flex>(req, BackendKind::Flex, Machine::read(), &Default::default())
    }

    fn request(checkpoint: PathBuf) -> BenchRequest {
        BenchRequest {
            checkpoint,
            fps: 1000.0,
            calls: 9,
            warmup: 2,
            modes: ModeChoice::Both,
            n_action_steps: Some(4),
            temporal_ensemble_coeff: None,
            precision: Precision::F32,
            seed: 0,
        }
    }

    #[test]
    fn act_fixture_runs_the_model_every_n_action_steps_and_every_call_when_ensembling() {
        let Some(shared) = shared_dir() else { return };
        // A step dir holding `pretrained_model/` resolves to it.
        let step = tempfile::tempdir().unwrap();
        let inner = step.path().join("pretrained_model");
        std::fs::create_dir(&inner).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::os::unix::fs::symlink(shared.join("oracle/act_small/pretrained_model").join(f), inner.join(f)).unwrap();
        }
        assert_eq!(crate::layout::pretrained_dir(step.path()), inner);
        let report = run(&request(step.path().to_path_buf())).unwrap();
        assert_eq!(report.runs.len(), 2);
        let (queue, ens) = (&report.runs[0], &report.runs[1]);
        assert_eq!(queue.mode, Mode::Queue { n_action_steps: 4 });
        assert_eq!(ens.mode, Mode::Ensemble { coeff: DEFAULT_ENSEMBLE_COEFF });
        let ran: Vec<bool> = queue.records.iter().map(|r| r.ran_model).collect();
        assert_eq!(ran, [true, false, false, false, true, false, false, false, true]);
        assert!(ens.records.len() == 9 && ens.records.iter().all(|r| r.ran_model));
        assert!(queue.records.iter().enumerate().all(|(i, r)| r.call == i && r.latency_ms > 0.0));
        let out = tempfile::tempdir().unwrap();
        report.write(out.path(), "vramlab bench-inference (test)").unwrap();
        let lines = std::fs::read_to_string(out.path().join("latency.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 18);
        let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
        assert_eq!((first["mode"].as_str(), first["call"].as_u64(), first["ran_model"].as_bool()), (Some("queue"), Some(0), Some(true)));
        let summary = std::fs::read_to_string(out.path().join("summary.md")).unwrap();
        for want in ["model-running", "all (each runs the model)", "p99 ms", "machine:", "governor"] {
            assert!(summary.contains(want), "{want} missing from:\n{summary}");
        }
    }

    #[test]
    fn diffusion_fixture_queues_observations_and_actions() {
        let Some(shared) = shared_dir() else { return };
        let req = BenchRequest { calls: 6, warmup: 1, n_action_steps: Some(3), ..request(shared.join("oracle/diffusion_small/pretrained_model")) };
        let report = run(&req).unwrap();
        assert_eq!(report.runs.len(), 1);
        let ran: Vec<bool> = report.runs[0].records.iter().map(|r| r.ran_model).collect();
        assert_eq!(ran, [true, false, false, true, false, false]);
        let err = run(&BenchRequest { temporal_ensemble_coeff: Some(0.01), ..req.clone() }).unwrap_err();
        assert!(err.to_string().contains("temporal_ensemble_coeff"), "{err}");
        let err = run(&BenchRequest { n_action_steps: Some(99), ..req }).unwrap_err();
        assert!(err.to_string().contains("n_action_steps"), "{err}");
    }
}
