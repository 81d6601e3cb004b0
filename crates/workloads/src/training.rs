//! One training run of any workload: the trainer's settings from the run config and the
//! policy's optimizer preset, the output directory, checkpoint files, and the summary header.
//! What the user sees while it runs is the caller's [`TrainObserver`].

use crate::backend::TrainBackend;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use vramlab_models::policy::{LrSchedulerKind, OptimizerKind, OptimizerPreset};
use vramlab_probe::MemoryProbe;
use vramlab_train::trainer::BoxError;
use vramlab_train::{LrSchedule, OptimConfig, OptimKind, ParamGroup, ScheduleKind, StepRecord, TrainConfig, TrainModel, Trainer};

use crate::backend::BackendInfo;
use crate::config::RunConfig;
use crate::error::{Result, WorkloadError};
use crate::layout::{CONFIG_FILE, RUN_CONFIG_FILE, RUN_CONFIG_TOP_FILE, TRAIN_CONFIG_FILE, in_pretrained};

/// The trainer's settings: the run config where it says something, the policy's optimizer
/// preset (lerobot's `get_optimizer_preset`, from the model config) elsewhere.
pub fn train_config(cfg: &RunConfig, output_dir: PathBuf, preset: &OptimizerPreset) -> Result<TrainConfig> {
    let o = &cfg.optimizer;
    let clip = o.grad_clip_norm.or(preset.grad_clip_norm).unwrap_or(0.0);
    let groups = match &preset.backbone {
        Some(g) => vec![ParamGroup { prefix: g.prefix.clone(), lr: o.lr_backbone.unwrap_or(g.lr) }],
        None if o.lr_backbone.is_some() => return Err(WorkloadError::invalid("optimizer.lr_backbone", "this policy has no vision backbone".into())),
        None => Vec::new(),
    };
    let preset_kind = match preset.kind {
        OptimizerKind::Adam => OptimKind::Adam,
        OptimizerKind::AdamW => OptimKind::AdamW,
    };
    // No scheduler preset: constant learning rate, no warmup.
    let (preset_schedule, preset_warmup) = match preset.scheduler {
        None => (ScheduleKind::Constant, 0),
        Some(s) => (
            match s.kind {
                LrSchedulerKind::Constant => ScheduleKind::Constant,
                LrSchedulerKind::Cosine => ScheduleKind::Cosine,
            },
            s.warmup_steps,
        ),
    };
    let [b1, b2] = o.betas.unwrap_or([preset.betas.0, preset.betas.1]);
    Ok(TrainConfig {
        steps: cfg.steps,
        batch_size: cfg.batch_size,
        grad_accum_steps: cfg.grad_accum_steps,
        optim: OptimConfig {
            kind: o.kind.unwrap_or(preset_kind),
            lr: o.lr.unwrap_or(preset.lr),
            betas: (b1, b2),
            eps: o.eps.unwrap_or(preset.eps),
            weight_decay: o.weight_decay.unwrap_or(preset.weight_decay),
            grad_clip_norm: (clip > 0.0).then_some(clip),
            groups,
        },
        schedule: LrSchedule {
            kind: cfg.scheduler.kind.unwrap_or(preset_schedule),
            warmup_steps: cfg.scheduler.warmup_steps.unwrap_or(preset_warmup),
            total_steps: cfg.steps,
        },
        gradient_checkpointing: cfg.gradient_checkpointing,
        loss_scale: (cfg.precision == vramlab_models::nn::Precision::F16).then_some(65536.0),
        seed: cfg.seed,
        save_freq: cfg.save_freq,
        save_checkpoint: cfg.save_checkpoint,
        output_dir,
        resume: cfg.resume,
        memory_timeline: cfg.memory_timeline.clone(),
        memory_timeline_min_bytes: cfg.memory_timeline_min_bytes,
    })
}

/// `output_dir`, or `runs/<job_name or policy>-<UTC timestamp>`.
pub fn output_dir(cfg: &RunConfig, policy: &str) -> PathBuf {
    cfg.output_dir.clone().unwrap_or_else(|| {
        let name = cfg.job_name.clone().unwrap_or_else(|| policy.to_string());
        PathBuf::from("runs").join(format!("{name}-{}", timestamp()))
    })
}

/// UTC timestamp `YYYYmmdd-HHMMSS` for default run names.
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// What a run is about to do (for the caller's start line and progress bar).
pub struct RunStart<'a> {
    pub policy: &'static str,
    pub num_params: usize,
    pub backend: &'a BackendInfo,
    pub config: &'a RunConfig,
    pub output_dir: &'a Path,
    /// The step a resumed run continues after (0 for a new run).
    pub start_step: u64,
}

/// How a run ended.
pub struct RunEnd<'a> {
    pub records: &'a [StepRecord],
    pub output_dir: &'a Path,
    pub interrupted: bool,
}

/// What the caller sees of a run: the CLI draws a progress bar, tests stay quiet.
pub trait TrainObserver {
    fn started(&mut self, run: &RunStart<'_>);
    fn step(&mut self, record: &StepRecord);
    fn finished(&mut self, run: &RunEnd<'_>);
    /// Set (from a Ctrl-C handler, say) to stop after the current step with a checkpoint.
    fn stop_flag(&self) -> Arc<AtomicBool>;
}

/// What a workload hands to the generic training run.
pub struct TrainSetup<'a, M, Batch> {
    pub policy: &'static str,
    pub model: M,
    /// The model's `config.json` text (reference / lerobot format, with its `type`), written
    /// verbatim into every checkpoint (a JSON value would lose the features' order).
    pub config_json: String,
    /// More files for every checkpoint's `pretrained_model/` (a policy's processors).
    pub pretrained_files: Vec<(String, Vec<u8>)>,
    pub num_params: usize,
    /// The model's optimizer preset, its backbone group named as the trainer sees it.
    pub optim: OptimizerPreset,
    pub data_desc: String,
    pub data: Box<dyn FnMut(u64, u64) -> std::result::Result<Batch, BoxError> + 'a>,
}

/// lerobot's `train_config.json` (`TrainPipelineConfig` as lerobot 0.4.4 saves it) for this
/// run: the fields lerobot has, with this run's values; vramlab's own switches (backend,
/// precision, checkpointing, …) are in [`RUN_CONFIG_FILE`].
fn lerobot_train_config(cfg: &RunConfig, config_json: &str, policy: &str, out: &Path, t: &TrainConfig) -> String {
    use serde_json::{Value, json};
    let dataset = serde_json::to_value(&cfg.dataset).unwrap_or(Value::Null);
    let pick = |k: &str| dataset.get(k).cloned().unwrap_or(Value::Null);
    let o = &t.optim;
    let scheduler = match t.schedule.kind {
        ScheduleKind::Constant if t.schedule.warmup_steps == 0 => Value::Null,
        ScheduleKind::Constant => json!({"type": "diffuser", "name": "constant_with_warmup", "num_warmup_steps": t.schedule.warmup_steps}),
        ScheduleKind::Cosine => json!({"type": "diffuser", "name": "cosine", "num_warmup_steps": t.schedule.warmup_steps}),
    };
    let v = json!({
        "dataset": {
            "repo_id": pick("repo_id"),
            "root": pick("root"),
            "episodes": pick("episodes"),
            "image_transforms": pick("image_transforms"),
            "revision": pick("revision"),
            "use_imagenet_stats": true,
            "video_backend": "pyav",
            "streaming": false,
        },
        "env": null,
        "policy": serde_json::from_str::<Value>(config_json).unwrap_or(Value::Null),
        "output_dir": out,
        "job_name": cfg.job_name.clone().unwrap_or_else(|| policy.to_string()),
        "resume": false,
        "seed": cfg.seed,
        "num_workers": cfg.num_workers,
        "batch_size": cfg.batch_size,
        "steps": cfg.steps,
        "log_freq": cfg.log_freq,
        "save_checkpoint": cfg.save_checkpoint,
        "save_freq": cfg.save_freq,
        "use_policy_training_preset": false,
        "optimizer": {
            "type": match o.kind { OptimKind::Adam => "adam", OptimKind::AdamW => "adamw" },
            "lr": o.lr,
            "weight_decay": o.weight_decay,
            "grad_clip_norm": o.grad_clip_norm.unwrap_or(0.0),
            "betas": [o.betas.0, o.betas.1],
            "eps": o.eps,
        },
        "scheduler": scheduler,
        "wandb": {"enable": false},
    });
    serde_json::to_string_pretty(&v).expect("JSON values serialise")
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|source| WorkloadError::Io { path: path.to_path_buf(), source })
}

/// What a run may not do to its output directory, checked before anything is written into it:
/// a new run into a directory that holds checkpoints (they would be mixed with another run's),
/// a new run over a `metrics.jsonl` that no vramlab run wrote (no `run_config.json` beside it),
/// and a `--resume` of a run that already reached `--steps` (it would rewrite the summary
/// with no steps).
fn check_output_dir(cfg: &RunConfig, out: &Path) -> Result<()> {
    let ckpts = out.join("checkpoints");
    let train_err = |e: vramlab_train::checkpoint::CheckpointError| WorkloadError::from(vramlab_train::TrainError::from(e));
    if cfg.resume {
        // Verified once when the config was read from it (else here); the trainer verifies
        // what it loads.
        let step = match cfg.resume_verified {
            Some(step) => step,
            None => vramlab_train::trainer::resume_step(&ckpts)?,
        };
        if step >= cfg.steps {
            return Err(WorkloadError::invalid(
                "resume",
                format!("{} is already at step {step} (--steps={}): nothing to train; to train longer, resume with --steps above {step}, e.g. --steps={}", out.display(), cfg.steps, step + cfg.steps.max(1)),
            ));
        }
        return Ok(());
    }
    if out.is_dir() && !vramlab_train::checkpoint::step_dirs(&ckpts).map_err(train_err)?.is_empty() {
        return Err(WorkloadError::from(vramlab_train::TrainError::OutputExists(out.to_path_buf())));
    }
    // A run that diverged before its first good checkpoint: its directory, not a fresh one.
    let aside = crate::layout::set_aside_checkpoints(&ckpts);
    if !aside.is_empty() {
        return Err(WorkloadError::invalid(
            "output_dir",
            format!(
                "{} is the directory of a run that diverged (checkpoints set aside: {}; no good checkpoint to resume from); choose another --output_dir for a new run",
                out.display(),
                aside.join(", ")
            ),
        ));
    }
    if out.join("metrics.jsonl").exists() && !out.join(RUN_CONFIG_TOP_FILE).exists() {
        return Err(WorkloadError::invalid(
            "output_dir",
            format!("{} holds a metrics.jsonl that no vramlab run wrote (no {RUN_CONFIG_TOP_FILE} beside it); choose another --output_dir", out.display()),
        ));
    }
    Ok(())
}

/// Train any workload: output directory, checkpoint files, summary header, observer.
pub fn run_training<B, M>(
    cfg: &RunConfig,
    info: &BackendInfo,
    probe: &dyn MemoryProbe,
    device: &B::Device,
    setup: TrainSetup<'_, M, M::Batch>,
    observer: &mut dyn TrainObserver,
) -> Result<()>
where
    B: TrainBackend,
    M: TrainModel<B>,
{
    let TrainSetup { policy, model, config_json, pretrained_files, num_params, optim, data_desc, mut data } = setup;
    let out = output_dir(cfg, policy);
    let tcfg = train_config(cfg, out.clone(), &optim)?;
    // Every refusal before the first write; a new run's checked again under the lock (another
    // process may have written checkpoints in between; a resume's checkpoints are verified once
    // more by the trainer).
    check_output_dir(cfg, &out)?;
    std::fs::create_dir_all(&out).map_err(|source| WorkloadError::Io { path: out.clone(), source })?;
    let _lock = crate::lock::lock_dir(&out, "output_dir")?;
    if !cfg.resume {
        check_output_dir(cfg, &out)?;
    }
    let run_json = serde_json::to_string_pretty(cfg).expect("a run config serialises");
    write_file(&out.join(RUN_CONFIG_TOP_FILE), run_json.as_bytes())?;
    let o = &tcfg.optim;
    let compact_config = serde_json::from_str::<serde_json::Value>(&config_json).map(|v| v.to_string()).unwrap_or_default();
    let mut summary_header = vec![
        ("policy".into(), format!("{policy} ({num_params} parameters) {compact_config}")),
        ("backend".into(), format!("{} (probe: {}, peak: {:?})", info.backend, info.probe, info.peak_kind)),
        ("memory figures".into(), info.memory_note()),
        ("kernel cache".into(), info.kernel_cache.clone().unwrap_or_else(|| "none (CPU backend)".into())),
        ("precision".into(), cfg.precision.name().into()),
        ("gradient_checkpointing".into(), cfg.gradient_checkpointing.to_string()),
        ("batch_size × grad_accum_steps".into(), format!("{} × {}", cfg.batch_size, cfg.grad_accum_steps)),
        ("optimizer".into(), format!("{:?} lr {} (groups {:?}), weight_decay {}, clip {:?}", o.kind, o.lr, o.groups, o.weight_decay, o.grad_clip_norm)),
        ("data".into(), data_desc),
    ];
    if let Some(note) = &info.device_memory {
        summary_header.insert(3, ("device memory (driver)".into(), note.clone()));
    }
    #[cfg(feature = "flex")]
    if info.backend == crate::backend::BackendKind::Flex {
        summary_header.insert(2, ("cpu kernels (flex)".into(), vramlab_models::nn::flex_isa()));
        if let Some(heap) = vramlab_probe::heap::described() {
            summary_header.insert(3, ("heap (flex)".into(), heap.into()));
        }
    }
    let train_config = lerobot_train_config(cfg, &config_json, policy, &out, &tcfg);
    let mut builder = Trainer::builder(tcfg, probe)
        .checkpoint_file(in_pretrained(CONFIG_FILE), format!("{config_json}\n").into_bytes())
        .checkpoint_file(in_pretrained(TRAIN_CONFIG_FILE), train_config.into_bytes())
        .checkpoint_file(RUN_CONFIG_FILE, run_json.into_bytes());
    for (name, bytes) in pretrained_files {
        builder = builder.checkpoint_file(in_pretrained(&name), bytes);
    }
    let trainer = builder.stop(observer.stop_flag()).summary_header(summary_header).build();
    // Where the progress bar starts: the newest checkpoint (the trainer verifies it and may fall
    // back to an older one; the bar follows the steps it then reports).
    let start_step = if cfg.resume { vramlab_train::checkpoint::step_dirs(&trainer.checkpoints_dir()).map_err(vramlab_train::TrainError::from)?.first().map_or(0, |(s, _)| *s) } else { 0 };
    observer.started(&RunStart { policy, num_params, backend: info, config: cfg, output_dir: &out, start_step });
    let outcome = trainer.run::<B, M>(model, device, &mut *data, &mut |r| observer.step(r))?;
    observer.finished(&RunEnd { records: &outcome.records, output_dir: &out, interrupted: outcome.interrupted });
    Ok(())
}
