//! The training loop: steps, accumulation, measurement, checkpoints, resume.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use crate::optim_kernels::OptimKernels;
use serde::{Deserialize, Serialize};
use vramlab_probe::MemoryProbe;

use crate::recompute::{CheckpointMode, PhaseHooks, staged_forward_backward};
use crate::metrics::{StepRecord, summary_markdown};
use crate::model::{LossParts, TrainModel};
use crate::checkpoint;
use crate::optim::{OptimConfig, Optimizer, grad_bytes, param_bytes, trainable_params};
use crate::schedule::LrSchedule;
pub use crate::error::{BoxError, TrainError};
use crate::error::io;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainConfig {
    pub steps: u64,
    pub batch_size: u64,
    pub grad_accum_steps: u64,
    pub optim: OptimConfig,
    pub schedule: LrSchedule,
    pub gradient_checkpointing: CheckpointMode,
    /// Dynamic loss scaling (f16): start scale; None disables.
    pub loss_scale: Option<f64>,
    pub seed: u64,
    /// Save a checkpoint every `save_freq` steps (and always at the end); 0 = only at the end.
    pub save_freq: u64,
    /// Write checkpoints at all (lerobot's `save_checkpoint`); `false` for measurement-only runs.
    pub save_checkpoint: bool,
    pub output_dir: PathBuf,
    pub resume: bool,
    /// Steps whose every heap allocation and free is written as a PyTorch memory snapshot,
    /// `memory_timeline/step_<N>.pickle` ([`crate::memory_timeline`]); empty: none.
    #[serde(default)]
    pub memory_timeline: Vec<u64>,
    /// Leave the events of smaller blocks out of those snapshots (0: every event).
    #[serde(default)]
    pub memory_timeline_min_bytes: u64,
}

/// What is saved next to the weights, to continue exactly.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TrainerState {
    pub step: u64,
    pub optimizer_step: u64,
    pub loss_scale: Option<f64>,
    pub good_steps_since_scale: u64,
    /// Randomness is a pure function of (seed, step, micro-batch): nothing else to restore.
    pub seed: u64,
    pub rng: String,
    pub schedule: LrSchedule,
}

pub struct TrainOutcome<M> {
    pub model: M,
    pub records: Vec<StepRecord>,
    pub last_checkpoint: Option<PathBuf>,
    pub interrupted: bool,
}

/// Trains any [`TrainModel`], measuring memory with any [`MemoryProbe`]. Built with
/// [`Trainer::builder`].
pub struct Trainer<'a> {
    config: TrainConfig,
    probe: &'a dyn MemoryProbe,
    /// Extra files written into every checkpoint (e.g. the model's `config.json`).
    checkpoint_files: Vec<(String, Vec<u8>)>,
    /// Set from outside (Ctrl-C) to stop after the current step with a checkpoint.
    stop: Arc<AtomicBool>,
    /// Header lines for the summary.
    summary_header: Vec<(String, String)>,
}

/// Builds a [`Trainer`]: `Trainer::builder(config, probe).checkpoint_file(..).build()`.
pub struct TrainerBuilder<'a> {
    trainer: Trainer<'a>,
}

impl<'a> TrainerBuilder<'a> {
    /// Write `bytes` as `name` into every checkpoint directory.
    pub fn checkpoint_file(mut self, name: impl Into<String>, bytes: Vec<u8>) -> Self {
        self.trainer.checkpoint_files.push((name.into(), bytes));
        self
    }

    /// Stop after the current step (with a checkpoint) once `flag` is set.
    pub fn stop(mut self, flag: Arc<AtomicBool>) -> Self {
        self.trainer.stop = flag;
        self
    }

    /// `(name, value)` lines at the top of `summary.md`.
    pub fn summary_header(mut self, lines: Vec<(String, String)>) -> Self {
        self.trainer.summary_header = lines;
        self
    }

    pub fn build(self) -> Trainer<'a> {
        self.trainer
    }
}

/// Memory and time of one micro-batch's forward and backward.
#[derive(Default)]
struct MicroMeasure {
    live_before: u64,
    fwd_peak: u64,
    bwd_peak: u64,
    reserved: u64,
    device_used: Option<u64>,
    fwd_time: f64,
    bwd_time: f64,
}

struct Hooks<'a> {
    probe: &'a dyn MemoryProbe,
    t0: Instant,
    fwd_peak: u64,
    fwd_time: f64,
}

impl PhaseHooks for Hooks<'_> {
    fn forward_done(&mut self) {
        self.fwd_peak = self.probe.take_peak().allocated;
        self.fwd_time = self.t0.elapsed().as_secs_f64();
    }
}

impl<'a> Trainer<'a> {
    pub fn builder(config: TrainConfig, probe: &'a dyn MemoryProbe) -> TrainerBuilder<'a> {
        let trainer = Self { config, probe, checkpoint_files: Vec::new(), stop: Arc::new(AtomicBool::new(false)), summary_header: Vec::new() };
        TrainerBuilder { trainer }
    }

    /// A trainer with no extra checkpoint files, stop flag or summary header.
    pub fn new(config: TrainConfig, probe: &'a dyn MemoryProbe) -> Self {
        Self::builder(config, probe).build()
    }

    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    pub fn checkpoints_dir(&self) -> PathBuf {
        self.config.output_dir.join("checkpoints")
    }

    /// Train `model` for `config.steps` optimizer steps. `data(step, micro)` returns the batch
    /// for micro-batch `micro` of step `step` (deterministic in its arguments, so resume works).
    pub fn run<B, M>(
        &self,
        model: M,
        device: &B::Device,
        data: &mut dyn FnMut(u64, u64) -> Result<M::Batch, BoxError>,
        on_step: &mut dyn FnMut(&StepRecord),
    ) -> Result<TrainOutcome<M>, TrainError>
    where
        B: AutodiffBackend<InnerBackend: OptimKernels>,
        M: TrainModel<B> + AutodiffModule<B>,
    {
        let cfg = &self.config;
        cfg.optim.check_groups::<B, M>(&model)?;
        crate::recompute::materialize::<B, M>(&model);
        let mut optim = Optimizer::<B>::new(cfg.optim.clone());
        let (mut model, mut state) = self.start_or_resume(model, &mut optim, device)?;
        let metrics_path = cfg.output_dir.join("metrics.jsonl");
        let mut metrics = OpenOptions::new().create(true).append(true).open(&metrics_path).map_err(io(&metrics_path))?;
        let (p_bytes, _, _) = param_bytes::<B, M>(&model);
        let mut records = Vec::new();
        let mut last_checkpoint = None;
        let mut interrupted = false;
        let mut timelines = Vec::new();
        while state.step < cfg.steps {
            let window = crate::memory_timeline::Window::start(&cfg.memory_timeline, state.step + 1, self.probe);
            let (new_model, record) = match self.step(model, &mut optim, &mut state, data, p_bytes) {
                Err(TrainError::NonFinite { step, what, .. }) => return Err(self.diverged(step, what, true)),
                other => other?,
            };
            if let Some(w) = window {
                timelines.push(w.finish(&cfg.output_dir, cfg.memory_timeline_min_bytes, &record)?);
            }
            model = new_model;
            let line = serde_json::to_string(&record).unwrap_or_default();
            writeln!(metrics, "{line}").and_then(|_| metrics.flush()).map_err(io(&metrics_path))?;
            on_step(&record);
            records.push(record);

            let step = state.step;
            let stop = self.stop.load(Ordering::Relaxed);
            let periodic = cfg.save_freq > 0 && step.is_multiple_of(cfg.save_freq);
            if cfg.save_checkpoint && (periodic || step == cfg.steps || stop) {
                last_checkpoint = Some(match self.save_checkpoint::<B, M>(&model, &optim, &state) {
                    // The weights of this step were not saved; those before gave a finite loss.
                    Err(TrainError::NonFinite { step, what, .. }) => return Err(self.diverged(step, what, false)),
                    other => other?,
                });
            }
            if stop {
                interrupted = true;
                break;
            }
        }
        let mut summary = summary_markdown(&format!("vramlab run: {}", cfg.output_dir.display()), &self.summary_header, &records);
        summary.push_str(&crate::plots::write_memory_plots(&cfg.output_dir, &records));
        summary.push_str(&crate::memory_timeline::summary_section(&timelines));
        crate::memory_timeline::write_attribution(&cfg.output_dir, &timelines).map_err(io(&cfg.output_dir.join(crate::memory_timeline::ATTRIBUTION_FILE)))?;
        let summary_path = cfg.output_dir.join("summary.md");
        fs::write(&summary_path, summary).map_err(io(&summary_path))?;
        Ok(TrainOutcome { model, records, last_checkpoint, interrupted })
    }

    /// A fresh state (refusing a directory that already holds checkpoints), or the state,
    /// weights and optimizer of the latest checkpoint with `--resume`; the metrics file is cut
    /// back to the resumed step.
    fn start_or_resume<B, M>(&self, mut model: M, optim: &mut Optimizer<B>, device: &B::Device) -> Result<(M, TrainerState), TrainError>
    where
        B: AutodiffBackend<InnerBackend: OptimKernels>,
        M: TrainModel<B> + AutodiffModule<B>,
    {
        let cfg = &self.config;
        let ckpt_dir = self.checkpoints_dir();
        let metrics_path = cfg.output_dir.join("metrics.jsonl");
        fs::create_dir_all(&ckpt_dir).map_err(io(&ckpt_dir))?;
        let mut state = TrainerState {
            step: 0,
            optimizer_step: 0,
            loss_scale: cfg.loss_scale,
            good_steps_since_scale: 0,
            seed: cfg.seed,
            rng: "splitmix64(seed, step, micro) per micro-batch".into(),
            schedule: cfg.schedule.clone(),
        };
        let has_checkpoints = !checkpoint::step_dirs(&ckpt_dir)?.is_empty();
        if cfg.resume {
            let dir = resume_dir(&ckpt_dir)?;
            let state_path = dir.join(checkpoint::TRAINER_STATE_FILE);
            if state_path.exists() {
                let text = fs::read_to_string(&state_path).map_err(io(&state_path))?;
                state = serde_json::from_str(&text).map_err(|e| TrainError::State { path: state_path.clone(), msg: e.to_string() })?;
            } else {
                // lerobot's checkpoint: `training_step.json` only; one optimizer step per step.
                let step_path = dir.join(checkpoint::TRAINING_STEP_FILE);
                let text = fs::read_to_string(&step_path).map_err(io(&step_path))?;
                let step = serde_json::from_str::<serde_json::Value>(&text).ok().and_then(|v| v["step"].as_u64());
                let step = step.ok_or_else(|| TrainError::State { path: step_path.clone(), msg: "expected {\"step\": N}".into() })?;
                (state.step, state.optimizer_step) = (step, step);
            }
            model = model.load_weights(&dir.join(checkpoint::MODEL_FILE))?;
            let params = trainable_params::<B, M>(&model);
            optim.load(&dir.join(checkpoint::OPTIMIZER_STATE_FILE), &dir.join(checkpoint::OPTIMIZER_GROUPS_FILE), &params, state.optimizer_step, device)?;
            truncate_metrics(&metrics_path, state.step)?;
        } else if has_checkpoints {
            return Err(TrainError::OutputExists(cfg.output_dir.clone()));
        } else if metrics_path.exists() {
            fs::remove_file(&metrics_path).map_err(io(&metrics_path))?;
        }
        Ok((model, state))
    }

    /// One optimizer step: every micro-batch's forward and backward, the accumulated update,
    /// loss scaling, and the step's record (`p_bytes`: the parameters' bytes, fixed for the run).
    fn step<B, M>(
        &self,
        model: M,
        optim: &mut Optimizer<B>,
        state: &mut TrainerState,
        data: &mut dyn FnMut(u64, u64) -> Result<M::Batch, BoxError>,
        p_bytes: u64,
    ) -> Result<(M, StepRecord), TrainError>
    where
        B: AutodiffBackend<InnerBackend: OptimKernels>,
        M: TrainModel<B> + AutodiffModule<B>,
    {
        let cfg = &self.config;
        let step = state.step + 1;
        let kernels_before = self.probe.kernel_counts();
        let t_step = Instant::now();
        let counting = vramlab_probe::CountingAllocator::is_installed();
        if counting {
            vramlab_probe::CountingAllocator::reset_peak_of(vramlab_probe::Account::Loader);
        }
        let lr_factor = cfg.schedule.factor(state.optimizer_step);
        let loss_scale = state.loss_scale.unwrap_or(1.0);
        let accum = cfg.grad_accum_steps.max(1);
        let mut acc = GradientsAccumulator::<M>::new();
        let (mut data_wait, mut m) = (0.0, MicroMeasure::default());
        let (mut activation, mut loss_sum) = (0u64, 0.0);
        let mut parts_sum: Vec<(String, f64)> = Vec::new();
        for micro in 0..accum {
            let t_data = Instant::now();
            let data_scope = crate::memory_timeline::scope("data");
            let batch = data(step, micro).map_err(|source| TrainError::Data { step, source })?;
            drop(data_scope);
            data_wait += t_data.elapsed().as_secs_f64();
            let (parts, grads, mm) = self.forward_backward(&model, &batch, loss_scale)?;
            drop(batch);
            m.live_before = m.live_before.max(mm.live_before);
            m.fwd_peak = m.fwd_peak.max(mm.fwd_peak);
            m.bwd_peak = m.bwd_peak.max(mm.bwd_peak);
            m.reserved = m.reserved.max(mm.reserved);
            m.device_used = m.device_used.max(mm.device_used);
            (m.fwd_time, m.bwd_time) = (m.fwd_time + mm.fwd_time, m.bwd_time + mm.bwd_time);
            activation = activation.max(mm.fwd_peak.saturating_sub(mm.live_before));
            acc.accumulate(&model, grads);
            loss_sum += parts.loss.into_scalar().elem::<f64>();
            for (i, (k, v)) in parts.parts.into_iter().enumerate() {
                let v = v.into_scalar().elem::<f64>();
                match parts_sum.get_mut(i) {
                    Some(p) => p.1 += v,
                    None => parts_sum.push((k.to_string(), v)),
                }
            }
        }
        let loss = loss_sum / accum as f64;
        if !loss.is_finite() {
            // Nothing is saved: these weights (of step - 1) gave it ([`Trainer::diverged`]).
            return Err(TrainError::NonFinite { step, what: format!("loss is {loss}"), outcome: String::new(), last_good: None });
        }
        let grads = acc.grads();
        let g_bytes = grad_bytes::<B, M>(&model, &grads);

        let opt_scope = crate::memory_timeline::scope("optimizer");
        self.probe.reset_peak();
        let t_opt = Instant::now();
        let (model, info) = optim.step(model, grads, loss_scale * accum as f64, lr_factor);
        let opt_peak = self.probe.peak();
        drop(opt_scope);
        let opt_time = t_opt.elapsed().as_secs_f64();
        let skipped = match self.update_loss_scale(state, info.applied) {
            Ok(skipped) => skipped,
            Err(()) => {
                let what = format!("gradient norm is {}", info.grad_norm);
                return Err(TrainError::NonFinite { step, what, outcome: String::new(), last_good: None });
            }
        };
        state.step = step;
        state.optimizer_step = optim.step;
        let step_time = t_step.elapsed().as_secs_f64();
        // After the optimizer's probe sample (a device sync): every launch of the step is submitted.
        let kernels = kernels_before.zip(self.probe.kernel_counts()).map(|(a, b)| crate::metrics::KernelStep::between(a, b));

        let record = StepRecord {
            step,
            loss,
            loss_parts: parts_sum.into_iter().map(|(k, v)| (k, v / accum as f64)).collect(),
            lr: cfg.optim.lr * lr_factor,
            grad_norm: info.grad_norm,
            step_time_s: step_time,
            data_wait_s: data_wait,
            forward_time_s: m.fwd_time,
            backward_time_s: m.bwd_time,
            optimizer_time_s: opt_time,
            live_before_forward_bytes: m.live_before,
            peak_forward_bytes: m.fwd_peak,
            peak_backward_bytes: m.bwd_peak,
            peak_optimizer_bytes: opt_peak.allocated,
            peak_step_bytes: m.fwd_peak.max(m.bwd_peak).max(opt_peak.allocated),
            peak_reserved_bytes: m.reserved.max(opt_peak.reserved),
            param_bytes: p_bytes,
            grad_bytes: g_bytes,
            optimizer_state_bytes: optim.state_bytes(),
            activation_bytes: activation,
            samples: cfg.batch_size * accum,
            loss_scale: state.loss_scale,
            skipped,
            peak_device_used_bytes: m.device_used.max(opt_peak.device_used),
            loader_peak_bytes: counting.then(|| vramlab_probe::CountingAllocator::peak_of(vramlab_probe::Account::Loader)),
            kernels,
        };
        Ok((model, record))
    }

    /// Forward and backward of one micro-batch (plain, or block-recomputed), measured.
    fn forward_backward<B, M>(&self, model: &M, batch: &M::Batch, loss_scale: f64) -> Result<(LossParts<B>, GradientsParams, MicroMeasure), TrainError>
    where
        B: AutodiffBackend<InnerBackend: OptimKernels>,
        M: TrainModel<B> + AutodiffModule<B>,
    {
        // One probe sample at each window edge (`restart`, `take_peak`): on CubeCL each is a device
        // sync (and on CUDA an NVML query).
        let live_before = self.probe.restart().allocated;
        let t0 = Instant::now();
        let (parts, grads, fwd_peak, fwd_time) = if self.config.gradient_checkpointing == CheckpointMode::Blocks {
            let mut hooks = Hooks { probe: self.probe, t0, fwd_peak: 0, fwd_time: 0.0 };
            let (parts, grads) = staged_forward_backward(model, batch, loss_scale as f32, &mut hooks);
            (parts, grads, hooks.fwd_peak, hooks.fwd_time)
        } else {
            let parts = crate::memory_timeline::forward_loss(model, batch);
            let fwd_peak = self.probe.take_peak().allocated;
            let fwd_time = t0.elapsed().as_secs_f64();
            let _backward = crate::memory_timeline::scope("backward");
            let scaled = if loss_scale == 1.0 { parts.loss.clone() } else { parts.loss.clone() * loss_scale };
            let mut g = scaled.backward();
            let grads = GradientsParams::from_module(&mut g, model);
            drop(g);
            (parts, grads, fwd_peak, fwd_time)
        };
        let bwd = self.probe.peak();
        let bwd_time = t0.elapsed().as_secs_f64() - fwd_time;
        Ok((parts, grads, MicroMeasure { live_before, fwd_peak, bwd_peak: bwd.allocated, reserved: bwd.reserved, device_used: bwd.device_used, fwd_time, bwd_time }))
    }

    /// Dynamic loss scaling after an optimizer step (torch's GradScaler): an f16 overflow skips
    /// the step and halves the scale (`Ok(true)`); 2000 good steps double it. A non-finite step
    /// without loss scaling is `Err`.
    fn update_loss_scale(&self, state: &mut TrainerState, applied: bool) -> Result<bool, ()> {
        match (applied, state.loss_scale) {
            (false, Some(s)) => {
                state.loss_scale = Some(s / 2.0);
                state.good_steps_since_scale = 0;
                Ok(true)
            }
            (false, None) => Err(()),
            (true, Some(s)) => {
                state.good_steps_since_scale += 1;
                if state.good_steps_since_scale >= 2000 {
                    state.loss_scale = Some(s * 2.0);
                    state.good_steps_since_scale = 0;
                }
                Ok(false)
            }
            (true, None) => Ok(false),
        }
    }

    /// Write `checkpoints/<step>/` in lerobot's layout ([`checkpoint`]) atomically: build it
    /// under a temporary name, write its manifest last, rename, then point `last` at it.
    fn save_checkpoint<B: AutodiffBackend, M: TrainModel<B>>(
        &self,
        model: &M,
        optim: &Optimizer<B>,
        state: &TrainerState,
    ) -> Result<PathBuf, TrainError> {
        let root = self.checkpoints_dir();
        let name = checkpoint::step_dir_name(state.step, self.config.steps);
        let final_dir = root.join(&name);
        let tmp = root.join(format!(".{name}.tmp"));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        for sub in [checkpoint::PRETRAINED_MODEL_DIR, checkpoint::TRAINING_STATE_DIR] {
            let d = tmp.join(sub);
            fs::create_dir_all(&d).map_err(io(&d))?;
        }
        let write = |rel: &str, bytes: &[u8]| -> Result<(), TrainError> {
            let p = tmp.join(rel);
            if let Some(parent) = p.parent() {
                fs::create_dir_all(parent).map_err(io(parent))?;
            }
            fs::write(&p, bytes).map_err(io(&p))
        };
        model.save_weights(&tmp.join(checkpoint::MODEL_FILE))?;
        let params = trainable_params::<B, M>(model);
        // The lr the next step would use, as torch's param groups hold it after scheduler.step().
        let lr_factor = self.config.schedule.factor(state.optimizer_step);
        optim.save(&tmp.join(checkpoint::OPTIMIZER_STATE_FILE), &tmp.join(checkpoint::OPTIMIZER_GROUPS_FILE), &params, lr_factor)?;
        // Never a checkpoint of non-finite weights: read back what was written, before the rename.
        if let Err(vramlab_store::WeightError::NonFinite { path, key, count, total }) = checkpoint::check_finite(&tmp) {
            fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
            let file = path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default();
            let what = format!("the update made the weights non-finite ({file}: tensor `{key}` has {count} NaN/inf value(s) of {total})");
            return Err(TrainError::NonFinite { step: state.step, what, outcome: String::new(), last_good: None });
        }
        let json = |v: &serde_json::Value| serde_json::to_string_pretty(v).expect("JSON values serialise");
        write(checkpoint::TRAINING_STEP_FILE, json(&serde_json::json!({ "step": state.step })).as_bytes())?;
        if let Some(sched) = scheduler_state(&self.config, state.optimizer_step) {
            write(checkpoint::SCHEDULER_STATE_FILE, json(&sched).as_bytes())?;
        }
        write(checkpoint::TRAINER_STATE_FILE, serde_json::to_string_pretty(state).unwrap_or_default().as_bytes())?;
        for (rel, bytes) in &self.checkpoint_files {
            write(rel, bytes)?;
        }
        checkpoint::write_manifest(&tmp, state.step)?;
        if final_dir.exists() {
            fs::remove_dir_all(&final_dir).map_err(io(&final_dir))?;
        }
        fs::rename(&tmp, &final_dir).map_err(io(&final_dir))?;
        checkpoint::update_last_link(&root, &name)?;
        Ok(final_dir)
    }
}

impl Trainer<'_> {
    /// What a non-finite `what` at `step` leaves. A non-finite loss or gradient came from the
    /// weights of step - 1 (`previous_gave_it`), so their checkpoint (if one was written) is
    /// set aside as `<step>.nonfinite/`. The last good checkpoint is then the newest intact one
    /// with finite weights (`last` points at it), or there is none and nothing to resume from.
    fn diverged(&self, step: u64, what: String, previous_gave_it: bool) -> TrainError {
        let root = self.checkpoints_dir();
        let mut outcome = Vec::new();
        let aside = if previous_gave_it { checkpoint::set_aside(&root, step.saturating_sub(1)) } else { Ok(None) };
        match aside {
            Ok(Some(aside)) => outcome.push(format!("The checkpoint of step {} holds the weights that gave it: set aside as {}.", step - 1, aside.display())),
            Ok(None) => {}
            Err(e) => outcome.push(format!("The checkpoint of step {} holds the weights that gave it, but could not be set aside ({e}): do not resume from it.", step - 1)),
        }
        let last_good = checkpoint::newest_intact(&root).ok().and_then(|i| i.newest);
        let link = match &last_good {
            Some((_, dir)) => checkpoint::update_last_link(&root, &dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default()),
            None => checkpoint::remove_last_link(&root),
        };
        if let Err(e) = link {
            outcome.push(format!("({e})"));
        }
        match &last_good {
            Some((_, dir)) => outcome.push(format!(
                "Last good checkpoint: {} (verified, weights finite); continue from it with --resume and a smaller --optimizer.lr.",
                dir.display()
            )),
            None => outcome.push("No checkpoint was written before the step that went bad: there is nothing to resume from (start again with a smaller --optimizer.lr).".into()),
        }
        TrainError::NonFinite { step, what, outcome: outcome.join(" "), last_good: last_good.map(|(_, d)| d) }
    }
}

/// torch's `LambdaLR.state_dict()` as lerobot saves it (`scheduler_state.json`); `None` for a
/// constant lr without warmup, where lerobot has no scheduler either.
fn scheduler_state(cfg: &TrainConfig, optimizer_step: u64) -> Option<serde_json::Value> {
    let s = &cfg.schedule;
    if s.kind == crate::schedule::ScheduleKind::Constant && s.warmup_steps == 0 {
        return None;
    }
    let base: Vec<f64> = std::iter::once(cfg.optim.lr).chain(cfg.optim.groups.iter().map(|g| g.lr)).collect();
    let factor = s.factor(optimizer_step);
    Some(serde_json::json!({
        "base_lrs": base,
        "last_epoch": optimizer_step,
        "_step_count": optimizer_step + 1,
        "_is_initial": false,
        "_get_lr_called_within_step": false,
        "_last_lr": base.iter().map(|b| b * factor).collect::<Vec<_>>(),
        "lr_lambdas": vec![serde_json::Value::Null; base.len()],
    }))
}

/// The checkpoint `--resume` continues from: the newest whose files match its manifest. Newer
/// ones that do not (a run killed while a disk filled up, a file truncated by a copy) are
/// reported on stderr and skipped.
pub fn resume_dir(ckpt_dir: &Path) -> Result<PathBuf, TrainError> {
    let checkpoint::Intact { newest: best, skipped, unverified } = checkpoint::newest_intact(ckpt_dir)?;
    for s in &skipped {
        eprintln!("warning: --resume: skipping {}: {}", s.dir.display(), s.reason);
    }
    if let (true, Some((_, dir))) = (unverified, &best) {
        eprintln!("note: --resume: {} has no manifest.json (written by lerobot): its files are not verified", dir.display());
    }
    match best {
        Some((_, dir)) => {
            if !skipped.is_empty() {
                eprintln!("warning: --resume: continuing from the newest intact checkpoint, {}", dir.display());
            }
            Ok(dir)
        }
        None if skipped.is_empty() => Err(TrainError::NothingToResume(ckpt_dir.to_path_buf())),
        None => Err(TrainError::NoIntactCheckpoint { dir: ckpt_dir.to_path_buf(), why: skipped.iter().map(|s| format!("{}: {}", s.dir.display(), s.reason)).collect() }),
    }
}

/// The step of the checkpoint `--resume` would continue from (0 when there is none).
pub fn resume_step(ckpt_dir: &Path) -> Result<u64, TrainError> {
    Ok(checkpoint::newest_intact(ckpt_dir)?.newest.map_or(0, |(step, _)| step))
}

/// Drop metric lines past `step` (a killed run may have logged steps after its last checkpoint).
fn truncate_metrics(path: &Path, step: u64) -> Result<(), TrainError> {
    if !path.exists() {
        return Ok(());
    }
    let f = File::open(path).map_err(io(path))?;
    let mut kept = String::new();
    for line in BufReader::new(f).lines() {
        let line = line.map_err(io(path))?;
        match serde_json::from_str::<StepRecord>(&line) {
            Ok(r) if r.step <= step => {
                kept.push_str(&line);
                kept.push('\n');
            }
            _ => {}
        }
    }
    let tmp = path.with_extension("jsonl.tmp");
    fs::write(&tmp, kept).map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
}
