//! `vramlab train`: build the workload, run the trainer, show progress, write results.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, anyhow, bail};
use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressStyle};
use vramlab_probe::MemoryProbe;
use vramlab_train::metrics::fmt_bytes;
use vramlab_train::trainer::BoxError;
use vramlab_train::{LrSchedule, OptimConfig, OptimKind, ParamGroup, ScheduleKind, StepRecord, TrainConfig, TrainModel, Trainer};

use super::{Switches, timestamp};
use crate::Cli;
use crate::backend::{BackendInfo, Job, dispatch};
use crate::config::{self, RunConfig};
use crate::workloads::PolicyType;
use crate::workloads::policy_data::{DataOptions, LeRobotPolicyData, PolicyLoader, PolicySource, RandomPolicyData, Window};
use crate::workloads::{act, diffusion};
use vramlab_lerobot::LoaderConfig;
use crate::workloads::vae3d::{self, Vae3dTrain, VoxelSource};

pub fn run(cli: &Cli) -> Result<()> {
    let cfg = config::load(cli.config.as_deref(), &cli.overrides)?;
    let sw = Switches::from(&cfg)?;
    match PolicyType::from_config(&cfg)? {
        PolicyType::Vae3d => dispatch(sw.backend, cfg.device, sw.checkpointing, sw.precision, Vae3dJob { cfg, sw }),
        PolicyType::Act => dispatch(sw.backend, cfg.device, sw.checkpointing, sw.precision, ActJob { cfg, sw }),
        PolicyType::Diffusion => dispatch(sw.backend, cfg.device, sw.checkpointing, sw.precision, DiffusionJob { cfg, sw }),
    }
}

/// A policy's optimizer defaults (lerobot's `get_optimizer_preset`), used where the run
/// config leaves a field out.
pub struct OptimPreset {
    pub kind: OptimKind,
    pub betas: (f64, f64),
    pub eps: f64,
    /// LR schedule and warmup steps.
    pub schedule: (ScheduleKind, u64),
    pub lr: f64,
    pub weight_decay: f64,
    pub grad_clip_norm: f64,
    /// (parameter-name prefix, lr) of the vision backbone, if the policy has one.
    pub backbone: Option<(String, f64)>,
}

impl OptimPreset {
    /// PyTorch's AdamW defaults, constant schedule (fill in lr / weight decay / clip).
    pub fn pytorch_adamw() -> Self {
        Self {
            kind: OptimKind::AdamW,
            betas: (0.9, 0.999),
            eps: 1e-8,
            schedule: (ScheduleKind::Constant, 0),
            lr: 1e-3,
            weight_decay: 1e-2,
            grad_clip_norm: 0.0,
            backbone: None,
        }
    }
}

/// The trainer's settings from the run config.
pub fn train_config(cfg: &RunConfig, sw: &Switches, output_dir: PathBuf, preset: &OptimPreset) -> Result<TrainConfig> {
    let o = &cfg.optimizer;
    let clip = o.grad_clip_norm.unwrap_or(preset.grad_clip_norm);
    let groups = match &preset.backbone {
        Some((prefix, lr)) => vec![ParamGroup { prefix: prefix.clone(), lr: o.lr_backbone.unwrap_or(*lr) }],
        None if o.lr_backbone.is_some() => bail!("optimizer.lr_backbone: this policy has no vision backbone"),
        None => Vec::new(),
    };
    let kind = match o.kind.as_deref() {
        None => preset.kind,
        Some("adam") => OptimKind::Adam,
        Some("adamw") => OptimKind::AdamW,
        Some(other) => bail!("optimizer.type={other}: unknown; valid: adam, adamw"),
    };
    let (b1, b2) = match o.betas.as_deref() {
        None => preset.betas,
        Some([b1, b2]) => (*b1, *b2),
        Some(other) => bail!("optimizer.betas: expected two values, found {other:?}"),
    };
    if cfg.steps == 0 || cfg.batch_size == 0 || cfg.grad_accum_steps == 0 {
        bail!("steps, batch_size and grad_accum_steps must be at least 1");
    }
    let schedule_kind = match cfg.scheduler.kind.as_deref() {
        None => preset.schedule.0,
        Some("constant") => ScheduleKind::Constant,
        Some("cosine") => ScheduleKind::Cosine,
        Some(other) => bail!("scheduler.type={other}: unknown; valid: constant, cosine"),
    };
    let warmup_steps = cfg.scheduler.warmup_steps.unwrap_or(preset.schedule.1);
    Ok(TrainConfig {
        steps: cfg.steps,
        batch_size: cfg.batch_size,
        grad_accum_steps: cfg.grad_accum_steps,
        optim: OptimConfig {
            kind,
            lr: o.lr.unwrap_or(preset.lr),
            betas: (b1, b2),
            eps: o.eps.unwrap_or(preset.eps),
            weight_decay: o.weight_decay.unwrap_or(preset.weight_decay),
            grad_clip_norm: (clip > 0.0).then_some(clip),
            groups,
        },
        schedule: LrSchedule { kind: schedule_kind, warmup_steps, total_steps: cfg.steps },
        gradient_checkpointing: sw.checkpointing,
        loss_scale: (sw.precision == vramlab_models::nn::Precision::F16).then_some(65536.0),
        seed: cfg.seed,
        save_freq: cfg.save_freq,
        output_dir,
        resume: cfg.resume,
    })
}

fn output_dir(cfg: &RunConfig, policy: &str) -> PathBuf {
    cfg.output_dir.clone().unwrap_or_else(|| {
        let name = cfg.job_name.clone().unwrap_or_else(|| policy.to_string());
        PathBuf::from("runs").join(format!("{name}-{}", timestamp()))
    })
}

/// Progress bar on a terminal; plain log lines otherwise (CI logs).
pub struct Progress {
    bar: Option<ProgressBar>,
    every: u64,
    peak_kind: &'static str,
}

impl Progress {
    pub fn new(steps: u64, start: u64, log_freq: u64, info: &BackendInfo) -> Self {
        let peak_kind = match info.peak_kind {
            vramlab_probe::PeakKind::Exact => "peak",
            vramlab_probe::PeakKind::Sampled => "peak≥",
        };
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(steps).with_position(start);
            bar.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}<{eta_precise}] {bar:30} {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            Self { bar: Some(bar), every: log_freq, peak_kind }
        } else {
            let every = if log_freq > 0 { log_freq } else { (steps / 10).max(1) };
            Self { bar: None, every, peak_kind }
        }
    }

    pub fn step(&self, r: &StepRecord) {
        let msg = format!(
            "loss {:.5} | {:.3} s/step | data {:.3} s | {} {} | act {}",
            r.loss,
            r.step_time_s,
            r.data_wait_s,
            self.peak_kind,
            fmt_bytes(r.peak_step_bytes),
            fmt_bytes(r.activation_bytes)
        );
        match &self.bar {
            Some(bar) => {
                bar.set_position(r.step);
                bar.set_message(msg.clone());
                if self.every > 0 && r.step.is_multiple_of(self.every) {
                    bar.println(format!("step {} {msg}", r.step));
                }
            }
            None if r.step.is_multiple_of(self.every) || r.step == 1 => eprintln!("step {} {msg}", r.step),
            None => {}
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Stop flag set by Ctrl-C / SIGTERM: the trainer finishes the step and checkpoints.
fn stop_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    let _ = ctrlc::set_handler(move || {
        if f.swap(true, Ordering::Relaxed) {
            std::process::exit(130);
        }
        eprintln!("\ninterrupt: finishing this step and writing a checkpoint (again to abort)");
    });
    flag
}

/// What a workload hands to the generic training run.
pub struct Workload<'a, M, Batch> {
    pub policy: &'static str,
    pub model: M,
    /// The model's `config.json` text (reference / lerobot format, with its `type`), written
    /// verbatim into every checkpoint (a JSON value would lose the features' order).
    pub config_json: String,
    pub num_params: usize,
    pub optim: OptimPreset,
    pub data_desc: String,
    pub data: Box<dyn FnMut(u64, u64) -> Result<Batch, BoxError> + 'a>,
}

/// Train any workload: output directory, checkpoint files, progress, summary.
pub fn run_training<B, M>(cfg: &RunConfig, sw: &Switches, info: &BackendInfo, probe: &dyn MemoryProbe, device: &B::Device, w: Workload<'_, M, M::Batch>) -> Result<()>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
{
    let Workload { policy, model, config_json, num_params, optim, data_desc, mut data } = w;
    let out = output_dir(cfg, policy);
    let tcfg = train_config(cfg, sw, out.clone(), &optim)?;
    std::fs::create_dir_all(&out).with_context(|| format!("{}: cannot create output_dir", out.display()))?;
    let run_json = serde_json::to_string_pretty(cfg)?;
    std::fs::write(out.join("run_config.json"), &run_json).with_context(|| format!("{}: cannot write", out.display()))?;
    let mut trainer = Trainer::new(tcfg, probe);
    trainer.checkpoint_files = vec![
        ("config.json".into(), config_json.clone().into_bytes()),
        ("run_config.json".into(), run_json.into_bytes()),
    ];
    trainer.stop = stop_flag();
    let o = &trainer.config.optim;
    trainer.summary_header = vec![
        ("policy".into(), format!("{policy} ({num_params} parameters) {}", serde_json::to_string(&serde_json::from_str::<serde_json::Value>(&config_json)?)?)),
        ("backend".into(), format!("{} (probe: {}, peak: {:?})", info.backend, info.probe, info.peak_kind)),
        ("precision".into(), sw.precision.name().into()),
        ("gradient_checkpointing".into(), sw.checkpointing.to_string()),
        ("batch_size × grad_accum_steps".into(), format!("{} × {}", cfg.batch_size, cfg.grad_accum_steps)),
        ("optimizer".into(), format!("{:?} lr {} (groups {:?}), weight_decay {}, clip {:?}", o.kind, o.lr, o.groups, o.weight_decay, o.grad_clip_norm)),
        ("data".into(), data_desc),
    ];
    let start = if cfg.resume { vramlab_train::trainer::latest_checkpoint(&trainer.checkpoints_dir())?.map_or(0, |c| c.0) } else { 0 };
    eprintln!(
        "vramlab train: {policy} ({num_params} parameters) on {} [{}], {} steps, batch {} × {} → {}",
        info.backend,
        sw.precision.name(),
        cfg.steps,
        cfg.batch_size,
        cfg.grad_accum_steps,
        out.display()
    );
    let progress = Progress::new(cfg.steps, start, cfg.log_freq, info);
    let result = trainer.run::<B, M>(model, device, &mut *data, &mut |r| progress.step(r));
    progress.finish();
    let outcome = result.map_err(|e| anyhow!(e))?;
    if let (Some(first), Some(last)) = (outcome.records.first(), outcome.records.last()) {
        eprintln!(
            "done: loss {:.5} → {:.5} over steps {}..{}; peak {} (activations {}); summary: {}",
            first.loss,
            last.loss,
            first.step,
            last.step,
            fmt_bytes(outcome.records.iter().map(|r| r.peak_step_bytes).max().unwrap_or(0)),
            fmt_bytes(outcome.records.iter().map(|r| r.activation_bytes).max().unwrap_or(0)),
            out.join("summary.md").display()
        );
    }
    if outcome.interrupted {
        eprintln!("interrupted; continue with: vramlab train ... --output_dir={} --resume", out.display());
    }
    Ok(())
}

struct Vae3dJob {
    cfg: RunConfig,
    sw: Switches,
}

impl Job for Vae3dJob {
    type Output = ();

    fn run<B: AutodiffBackend>(self, device: B::Device, probe: &dyn MemoryProbe, info: &BackendInfo) -> Result<()> {
        let Self { cfg, sw } = self;
        let vae_cfg = vae3d::resolve_config(&cfg.policy)?;
        let source = VoxelSource::open(&cfg.dataset, cfg.seed)?;
        // Seed the backend before the weights are drawn: same seed, same initial model.
        B::seed(&device, cfg.seed);
        let model = Vae3dTrain::<B> { vae: vae_cfg.init(&device), precision: sw.precision };
        // The reference JSON carries `"type": "vae3d"` (how `vramlab predict` tells the model).
        let config_json = serde_json::to_string_pretty(&vae_cfg.to_reference_json())?;
        let bs = cfg.batch_size as usize;
        let (seed, dev) = (cfg.seed, device.clone());
        let vc = vae_cfg.clone();
        let w = Workload {
            policy: "vae3d",
            model,
            config_json,
            num_params: vae_cfg.num_params(),
            optim: OptimPreset { lr: 1e-4, weight_decay: 0.0, grad_clip_norm: 0.0, backbone: None, ..OptimPreset::pytorch_adamw() },
            data_desc: format!("{} grid {:?}", cfg.dataset.kind, cfg.dataset.grid),
            data: Box::new(move |step, micro| vae3d::make_batch::<B>(&source, &vc, bs, seed, step, micro, &dev).map_err(|e| e.into())),
        };
        run_training::<B, _>(&cfg, &sw, info, probe, &device, w)
    }
}

/// The loader settings of a run.
fn data_options(cfg: &RunConfig, drop_n_last_frames: usize) -> DataOptions {
    DataOptions {
        seed: cfg.seed,
        batch_size: cfg.batch_size as usize,
        image_size: cfg.dataset.image_size,
        image_transforms: cfg.dataset.image_transforms.clone(),
        shuffle: cfg.dataset.shuffle,
        drop_n_last_frames,
        loader: loader_config(cfg),
    }
}

/// `--num_workers`, `--prefetch_factor`, `--persistent_workers`.
fn loader_config(cfg: &RunConfig) -> LoaderConfig {
    LoaderConfig { num_workers: cfg.num_workers, prefetch_factor: cfg.prefetch_factor, persistent_workers: cfg.persistent_workers, batches_per_epoch: 0 }
}

/// Open the robot-policy data of a run: a LeRobot dataset (`lerobot`, or the built-in
/// demonstrations `sim`/`synthetic`), whose features then define the policy's inputs, or random
/// inputs (`random`, features from the policy flags).
fn open_policy_data(
    cfg: &RunConfig,
    window: Window,
    delta: impl FnOnce(&vramlab_lerobot::Info) -> vramlab_lerobot::DeltaIndices,
    norm_map: &vramlab_lerobot::normalize::NormMap,
    drop_n_last_frames: usize,
) -> Result<Option<LeRobotPolicyData>> {
    let root = match cfg.dataset.kind.as_str() {
        "random" => return Ok(None),
        "lerobot" => cfg.dataset.root.clone().ok_or_else(|| anyhow!("dataset.root is required for dataset.type=lerobot"))?,
        "sim" | "synthetic" => crate::commands::dataset::ensure_sim_dataset(cfg.dataset.root.as_deref(), cfg.dataset.num_episodes)?,
        other => bail!("dataset.type={other}: unknown for robot policies; valid: sim (built-in demonstrations), lerobot (with dataset.root), random"),
    };
    Ok(Some(LeRobotPolicyData::open(&root, window, delta, norm_map, data_options(cfg, drop_n_last_frames))?))
}

/// Random inputs with the policy's features (`dataset.type=random`).
fn random_source(cfg: &RunConfig, window: Window, features: crate::workloads::policy_data::DataFeatures) -> PolicySource {
    PolicySource::Random(RandomPolicyData { num_samples: cfg.dataset.num_scenes, seed: cfg.seed, batch_size: cfg.batch_size as usize, window, features })
}

/// The loader of a policy source.
fn policy_loader(cfg: &RunConfig, source: PolicySource) -> PolicyLoader {
    PolicyLoader::new(Arc::new(source), loader_config(cfg), cfg.grad_accum_steps)
}

struct ActJob {
    cfg: RunConfig,
    sw: Switches,
}

impl Job for ActJob {
    type Output = ();

    fn run<B: AutodiffBackend>(self, device: B::Device, probe: &dyn MemoryProbe, info: &BackendInfo) -> Result<()> {
        let Self { cfg, sw } = self;
        let chunk = cfg.policy.get("chunk_size").and_then(|v| v.as_u64()).unwrap_or(100) as usize;
        let window = act::window(chunk);
        let norm = vramlab_lerobot::normalize::act_norm_map();
        let (ac, source) = match open_policy_data(&cfg, window, |i| vramlab_lerobot::act_delta_indices(i, chunk), &norm, 0)? {
            Some(data) => (act::resolve_config_for(&cfg.policy, data.features())?, PolicySource::LeRobot(Box::new(data))),
            None => {
                let ac = act::resolve_config(&cfg.policy)?;
                let r = random_source(&cfg, window, act::features_of(&ac));
                (ac, r)
            }
        };
        B::seed(&device, cfg.seed);
        let mut model = ac.init::<B>(&device);
        if ac.freeze_backbone {
            model = model.with_frozen_backbone();
        }
        let model = act::ActTrain::<B> { act: model, precision: sw.precision };
        // lerobot's layout, `"type": "act"` first, as on hub checkpoints.
        let config_json = ac.to_json_string();
        let data_desc = source.describe();
        let mut loader = policy_loader(&cfg, source);
        let (seed, dev) = (cfg.seed, device.clone());
        let acc = ac.clone();
        let w = Workload {
            policy: "act",
            model,
            config_json,
            num_params: ac.num_params(),
            optim: OptimPreset {
                lr: ac.optimizer_lr,
                weight_decay: ac.optimizer_weight_decay,
                grad_clip_norm: 10.0,
                backbone: (!ac.image_features().is_empty()).then(|| ("act.backbone".to_string(), ac.optimizer_lr_backbone)),
                ..OptimPreset::pytorch_adamw()
            },
            data_desc,
            data: Box::new(move |step, micro| {
                let h = loader.get(step, micro).map_err(BoxError::from)?;
                Ok(act::to_batch::<B>(h, &acc, seed, step, micro, &dev))
            }),
        };
        run_training::<B, _>(&cfg, &sw, info, probe, &device, w)
    }
}

struct DiffusionJob {
    cfg: RunConfig,
    sw: Switches,
}

impl Job for DiffusionJob {
    type Output = ();

    fn run<B: AutodiffBackend>(self, device: B::Device, probe: &dyn MemoryProbe, info: &BackendInfo) -> Result<()> {
        let Self { cfg, sw } = self;
        let base = diffusion::window_params(&cfg.policy)?;
        let window = Window { obs_steps: Some(base.n_obs_steps), actions: base.horizon };
        let norm = vramlab_lerobot::normalize::diffusion_norm_map();
        let delta = |i: &vramlab_lerobot::Info| vramlab_lerobot::diffusion_delta_indices(i, base.n_obs_steps, base.horizon);
        let (dc, source) = match open_policy_data(&cfg, window, delta, &norm, base.drop_n_last_frames)? {
            Some(data) => (diffusion::resolve_config_for(&cfg.policy, data.features())?, PolicySource::LeRobot(Box::new(data))),
            None => {
                let dc = diffusion::resolve_config(&cfg.policy)?;
                let r = random_source(&cfg, window, diffusion::features_of(&dc));
                (dc, r)
            }
        };
        B::seed(&device, cfg.seed);
        let model = diffusion::DiffusionTrain::<B> { model: dc.init(&device), precision: sw.precision };
        let config_json = dc.to_json_string();
        let data_desc = source.describe();
        let mut loader = policy_loader(&cfg, source);
        let (seed, dev) = (cfg.seed, device.clone());
        let dcc = dc.clone();
        let w = Workload {
            policy: "diffusion",
            model,
            config_json,
            num_params: dc.num_params(),
            optim: OptimPreset {
                kind: OptimKind::Adam,
                betas: (dc.optimizer_betas[0], dc.optimizer_betas[1]),
                eps: dc.optimizer_eps,
                schedule: (ScheduleKind::Cosine, dc.scheduler_warmup_steps as u64),
                lr: dc.optimizer_lr,
                weight_decay: dc.optimizer_weight_decay,
                grad_clip_norm: 10.0,
                backbone: None,
            },
            data_desc,
            data: Box::new(move |step, micro| {
                let h = loader.get(step, micro).map_err(BoxError::from)?;
                Ok(diffusion::to_batch::<B>(h, &dcc, seed, step, micro, &dev))
            }),
        };
        run_training::<B, _>(&cfg, &sw, info, probe, &device, w)
    }
}
