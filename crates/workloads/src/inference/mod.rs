//! `vramlab bench-inference`'s model-agnostic machinery: drive a policy checkpoint at a fixed
//! control rate with a synthetic robot and measure the latency of every `select_action` call
//! against the frame budget (1/fps), with lerobot 0.4.4's semantics. What is model-specific
//! (loading, the measured modes, the `select_action` runner) is each robot policy's
//! `bench_inference` ([`crate::act::bench_inference`], [`crate::diffusion::bench_inference`]),
//! and [`crate::bench_inference`] dispatches on the checkpoint's `type` (`workload.rs`).
//!
//! - this file: the request, the modes, [`run_mode`] (the timed loop) and [`BenchReport`].
//! - [`robot`]: cameras with a new uint8 frame per call, random-walk states.
//! - [`policy`]: pre/post-processing (normaliser stats of the checkpoint when present) and
//!   [`SelectAction`](policy::SelectAction), what the timed loop calls.
//! - [`report`]: percentiles, machine and CPU governor, markdown, `latency.jsonl`, `summary.md`.

pub mod policy;
pub mod report;
pub mod robot;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vramlab_models::nn::{LeanBackend, Precision};

use crate::backend::BackendKind;
use crate::error::{Result, WorkloadError};
use policy::{PolicyIo, Processor, SelectAction};
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

/// Everything [`crate::bench_inference`] measured, with what the report prints about it.
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

impl BenchRequest {
    /// The request's own fields, checked before any checkpoint is read.
    pub fn validate(&self) -> Result<()> {
        if !(self.fps.is_finite() && self.fps > 0.0) {
            return Err(WorkloadError::invalid("fps", format!("must be a positive number, got {}", self.fps)));
        }
        if self.calls == 0 {
            return Err(WorkloadError::invalid("calls", "must be at least 1".into()));
        }
        Ok(())
    }
}

impl BenchReport {
    /// An empty report of `req` on the checkpoint `dir`: the model's `bench_inference` fills
    /// in the policy, the normalisation note, the notes and the runs.
    pub fn new(req: &BenchRequest, dir: PathBuf, backend: BackendKind, machine: Machine) -> Self {
        BenchReport {
            checkpoint: dir,
            policy: String::new(),
            backend,
            precision: req.precision,
            fps: req.fps,
            warmup: req.warmup,
            machine,
            normalisation: String::new(),
            notes: Vec::new(),
            runs: Vec::new(),
        }
    }
}

/// A config value the policy refuses, named as the bench flag that set it.
pub fn invalid(e: vramlab_models::policy::InvalidField) -> WorkloadError {
    WorkloadError::invalid(e.field, e.msg)
}

/// `warmup` calls, a reset (as at an episode start), then `calls` measured calls, each
/// starting a period of 1/fps.
pub fn run_mode<B: LeanBackend>(req: &BenchRequest, mode: Mode, io: &PolicyIo, processor: &Processor<B>, mut runner: impl SelectAction<B>) -> Result<ModeRun> {
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

    /// The bench on flex (`bench_inference` itself dispatches to a backend, which needs the
    /// CLI's counting allocator).
    fn run(req: &BenchRequest) -> Result<BenchReport> {
        crate::workload::bench_inference_on::<burn::backend::Flex>(req, BackendKind::Flex, Machine::read(), &Default::default())
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
        let step = vramlab_testkit::temp_dir("bench-step");
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
        let out = vramlab_testkit::temp_dir("bench-out");
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
