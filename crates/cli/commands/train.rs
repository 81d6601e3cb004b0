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
use crate::workloads::act;
use crate::workloads::vae3d::{self, Vae3dTrain, VoxelSource};

pub fn run(cli: &Cli) -> Result<()> {
    let cfg = config::load(cli.config.as_deref(), &cli.overrides)?;
    let sw = Switches::from(&cfg)?;
    match PolicyType::from_config(&cfg)? {
        PolicyType::Vae3d => dispatch(sw.backend, cfg.device, sw.checkpointing, sw.precision, Vae3dJob { cfg, sw }),
        PolicyType::Act => dispatch(sw.backend, cfg.device, sw.checkpointing, sw.precision, ActJob { cfg, sw }),
        PolicyType::Diffusion => bail!("policy.type=diffusion: training Diffusion Policy through the trainer is the next step (issue 5); `vramlab info` and `vramlab predict` support it"),
    }
}

/// A policy's optimizer defaults (lerobot's `get_optimizer_preset`), used where the run
/// config leaves a field out.
pub struct OptimPreset {
    pub lr: f64,
    pub weight_decay: f64,
    pub grad_clip_norm: f64,
    /// (parameter-name prefix, lr) of the vision backbone, if the policy has one.
    pub backbone: Option<(String, f64)>,
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
    let kind = match o.kind.as_str() {
        "adam" => OptimKind::Adam,
        "adamw" => OptimKind::AdamW,
        other => bail!("optimizer.type={other}: unknown; valid: adam, adamw"),
    };
    let [b1, b2] = o.betas.as_slice() else { bail!("optimizer.betas: expected two values, found {:?}", o.betas) };
    if cfg.steps == 0 || cfg.batch_size == 0 || cfg.grad_accum_steps == 0 {
        bail!("steps, batch_size and grad_accum_steps must be at least 1");
    }
    let schedule_kind = match cfg.scheduler.kind.as_str() {
        "constant" => ScheduleKind::Constant,
        "cosine" => ScheduleKind::Cosine,
        other => bail!("scheduler.type={other}: unknown; valid: constant, cosine"),
    };
    Ok(TrainConfig {
        steps: cfg.steps,
        batch_size: cfg.batch_size,
        grad_accum_steps: cfg.grad_accum_steps,
        optim: OptimConfig {
            kind,
            lr: o.lr.unwrap_or(preset.lr),
            betas: (*b1, *b2),
            eps: o.eps,
            weight_decay: o.weight_decay.unwrap_or(preset.weight_decay),
            grad_clip_norm: (clip > 0.0).then_some(clip),
            groups,
        },
        schedule: LrSchedule { kind: schedule_kind, warmup_steps: cfg.scheduler.warmup_steps, total_steps: cfg.steps },
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
    /// The model's `config.json` (reference / lerobot format), written into every checkpoint.
    pub config_json: serde_json::Value,
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
        ("config.json".into(), serde_json::to_vec_pretty(&config_json)?),
        ("run_config.json".into(), run_json.into_bytes()),
    ];
    trainer.stop = stop_flag();
    let o = &trainer.config.optim;
    trainer.summary_header = vec![
        ("policy".into(), format!("{policy} ({num_params} parameters) {}", serde_json::to_string(&config_json)?)),
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
        let mut config_json = vae_cfg.to_reference_json();
        if let Some(obj) = config_json.as_object_mut() {
            obj.insert("type".into(), "vae3d".into());
        }
        let bs = cfg.batch_size as usize;
        let (seed, dev) = (cfg.seed, device.clone());
        let vc = vae_cfg.clone();
        let w = Workload {
            policy: "vae3d",
            model,
            config_json,
            num_params: vae_cfg.num_params(),
            optim: OptimPreset { lr: 1e-4, weight_decay: 0.0, grad_clip_norm: 0.0, backbone: None },
            data_desc: format!("{} grid {:?}", cfg.dataset.kind, cfg.dataset.grid),
            data: Box::new(move |step, micro| vae3d::make_batch::<B>(&source, &vc, bs, seed, step, micro, &dev).map_err(|e| e.into())),
        };
        run_training::<B, _>(&cfg, &sw, info, probe, &device, w)
    }
}

struct ActJob {
    cfg: RunConfig,
    sw: Switches,
}

impl Job for ActJob {
    type Output = ();

    fn run<B: AutodiffBackend>(self, device: B::Device, probe: &dyn MemoryProbe, info: &BackendInfo) -> Result<()> {
        let Self { cfg, sw } = self;
        enum Source {
            Random(act::RandomActData),
            LeRobot(Box<act::LeRobotActData>),
        }
        let (ac, source) = match cfg.dataset.kind.as_str() {
            "synthetic" | "random" => (
                act::resolve_config(&cfg.policy)?,
                Source::Random(act::RandomActData { num_samples: cfg.dataset.num_scenes, seed: cfg.seed }),
            ),
            "lerobot" => {
                let root = cfg.dataset.root.as_deref().ok_or_else(|| anyhow!("dataset.root is required for dataset.type=lerobot"))?;
                let chunk = cfg.policy.get("chunk_size").and_then(|v| v.as_u64()).unwrap_or(100) as usize;
                let (data, features) = act::LeRobotActData::open(root, chunk)?;
                (act::resolve_config_for(&cfg.policy, &features)?, Source::LeRobot(Box::new(data)))
            }
            other => bail!("dataset.type={other}: unknown for ACT; valid: lerobot (with dataset.root), random"),
        };
        B::seed(&device, cfg.seed);
        let mut model = ac.init::<B>(&device);
        if ac.freeze_backbone {
            model = model.with_frozen_backbone();
        }
        let model = act::ActTrain::<B> { act: model, precision: sw.precision };
        let mut config_json: serde_json::Value = serde_json::from_str(&ac.to_json_string())?;
        if let Some(obj) = config_json.as_object_mut() {
            // As on hub checkpoints: lets `vramlab predict` (and lerobot) tell the policy type.
            obj.insert("type".into(), "act".into());
        }
        let bs = cfg.batch_size as usize;
        let (seed, dev) = (cfg.seed, device.clone());
        let acc = ac.clone();
        let cams: Vec<String> = ac.image_features().iter().map(|(k, s)| format!("{k} {s:?}")).collect();
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
            },
            data_desc: match &source {
                Source::Random(r) => format!("random normalised inputs ({} fixed samples; shapes only matter for memory): cameras [{}]", r.num_samples, cams.join(", ")),
                Source::LeRobot(d) => format!(
                    "LeRobot {:?} dataset {} ({} episodes, {} frames, {} fps): cameras [{}]",
                    d.ds.version(),
                    cfg.dataset.root.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                    d.ds.num_episodes(),
                    d.ds.num_frames(),
                    d.ds.fps(),
                    cams.join(", ")
                ),
            },
            data: Box::new(move |step, micro| match &source {
                Source::Random(r) => Ok(r.batch::<B>(&acc, bs, seed, step, micro, &dev)),
                Source::LeRobot(d) => d.batch::<B>(&acc, bs, seed, step, micro, &dev).map_err(|e| e.into()),
            }),
        };
        run_training::<B, _>(&cfg, &sw, info, probe, &device, w)
    }
}
