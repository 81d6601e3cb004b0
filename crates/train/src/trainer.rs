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
use serde::{Deserialize, Serialize};
use vramlab_probe::MemoryProbe;

use crate::checkpointing::{CheckpointMode, PhaseHooks, staged_forward_backward};
use crate::metrics::{StepRecord, summary_markdown};
use crate::model::TrainModel;
use crate::optim::{OptimConfig, Optimizer, grad_bytes, param_bytes};
use crate::schedule::LrSchedule;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] vramlab_store::WeightError),
    #[error("{path}: bad trainer state: {msg}")]
    State { path: PathBuf, msg: String },
    #[error("data for step {step}: {source}")]
    Data { step: u64, source: BoxError },
    #[error("loss is {value} at step {step}; stopped. Last good checkpoint: {checkpoint}")]
    NonFinite { step: u64, value: f64, checkpoint: String },
    #[error("--resume: no checkpoint in {0}")]
    NothingToResume(PathBuf),
    #[error("{0} already holds checkpoints: pass --resume to continue that run, or choose another --output_dir")]
    OutputExists(PathBuf),
    #[error("--gradient_checkpointing=blocks: this model offers no stage view")]
    NoStages,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io { path: path.to_path_buf(), source }
}

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
    pub output_dir: PathBuf,
    pub resume: bool,
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

/// Trains any [`TrainModel`], measuring memory with any [`MemoryProbe`].
pub struct Trainer<'a> {
    pub config: TrainConfig,
    pub probe: &'a dyn MemoryProbe,
    /// Extra files written into every checkpoint (e.g. the model's `config.json`).
    pub checkpoint_files: Vec<(String, Vec<u8>)>,
    /// Set from outside (Ctrl-C) to stop after the current step with a checkpoint.
    pub stop: Arc<AtomicBool>,
    /// Header lines for the summary.
    pub summary_header: Vec<(String, String)>,
}

struct Hooks<'a> {
    probe: &'a dyn MemoryProbe,
    t0: Instant,
    fwd_peak: u64,
    fwd_time: f64,
}

impl PhaseHooks for Hooks<'_> {
    fn forward_done(&mut self) {
        self.fwd_peak = self.probe.peak().allocated;
        self.fwd_time = self.t0.elapsed().as_secs_f64();
        self.probe.reset_peak();
    }
}

impl<'a> Trainer<'a> {
    pub fn new(config: TrainConfig, probe: &'a dyn MemoryProbe) -> Self {
        Self { config, probe, checkpoint_files: Vec::new(), stop: Arc::new(AtomicBool::new(false)), summary_header: Vec::new() }
    }

    pub fn checkpoints_dir(&self) -> PathBuf {
        self.config.output_dir.join("checkpoints")
    }

    /// Train `model` for `config.steps` optimizer steps. `data(step, micro)` returns the batch
    /// for micro-batch `micro` of step `step` (deterministic in its arguments, so resume works).
    pub fn run<B, M>(
        &self,
        mut model: M,
        device: &B::Device,
        data: &mut dyn FnMut(u64, u64) -> Result<M::Batch, BoxError>,
        on_step: &mut dyn FnMut(&StepRecord),
    ) -> Result<TrainOutcome<M>, TrainError>
    where
        B: AutodiffBackend,
        M: TrainModel<B> + AutodiffModule<B>,
    {
        let cfg = &self.config;
        let ckpt_dir = self.checkpoints_dir();
        let metrics_path = cfg.output_dir.join("metrics.jsonl");
        fs::create_dir_all(&ckpt_dir).map_err(io(&ckpt_dir))?;
        if cfg.gradient_checkpointing == CheckpointMode::Blocks && model.staged().is_none() {
            return Err(TrainError::NoStages);
        }

        let mut optim = Optimizer::<B>::new(cfg.optim.clone());
        let mut state = TrainerState {
            step: 0,
            optimizer_step: 0,
            loss_scale: cfg.loss_scale,
            good_steps_since_scale: 0,
            seed: cfg.seed,
            rng: "splitmix64(seed, step, micro) per micro-batch".into(),
            schedule: cfg.schedule.clone(),
        };
        let latest = latest_checkpoint(&ckpt_dir)?;
        if cfg.resume {
            let Some((_, dir)) = latest else { return Err(TrainError::NothingToResume(ckpt_dir)) };
            let state_path = dir.join("trainer_state.json");
            let text = fs::read_to_string(&state_path).map_err(io(&state_path))?;
            state = serde_json::from_str(&text).map_err(|e| TrainError::State { path: state_path.clone(), msg: e.to_string() })?;
            model = model.load_weights(&dir.join("model.safetensors"))?;
            optim.load(&dir.join("optimizer.safetensors"), state.optimizer_step, device)?;
            truncate_metrics(&metrics_path, state.step)?;
        } else if latest.is_some() {
            return Err(TrainError::OutputExists(cfg.output_dir.clone()));
        } else if metrics_path.exists() {
            fs::remove_file(&metrics_path).map_err(io(&metrics_path))?;
        }

        let mut metrics = OpenOptions::new().create(true).append(true).open(&metrics_path).map_err(io(&metrics_path))?;
        let (p_bytes, _, _) = param_bytes::<B, M>(&model);
        let accum = cfg.grad_accum_steps.max(1);
        let mut records = Vec::new();
        let mut last_checkpoint = None;
        let mut interrupted = false;

        while state.step < cfg.steps {
            let step = state.step + 1;
            let t_step = Instant::now();
            let lr_factor = cfg.schedule.factor(state.optimizer_step);
            let loss_scale = state.loss_scale.unwrap_or(1.0);
            let mut acc = GradientsAccumulator::<M>::new();
            let (mut data_wait, mut fwd_time, mut bwd_time) = (0.0, 0.0, 0.0);
            let (mut peak_fwd, mut peak_bwd, mut activation, mut live_before_fwd, mut reserved) = (0u64, 0u64, 0u64, 0u64, 0u64);
            let mut loss_sum = 0.0;
            let mut parts_sum: Vec<(String, f64)> = Vec::new();
            for micro in 0..accum {
                let t_data = Instant::now();
                let batch = data(step, micro).map_err(|source| TrainError::Data { step, source })?;
                data_wait += t_data.elapsed().as_secs_f64();

                let live = self.probe.sample().allocated;
                live_before_fwd = live_before_fwd.max(live);
                self.probe.reset_peak();
                let t0 = Instant::now();
                let (parts, grads, fwd_peak_micro, fwd_t) = if cfg.gradient_checkpointing == CheckpointMode::Blocks {
                    let mut hooks = Hooks { probe: self.probe, t0, fwd_peak: 0, fwd_time: 0.0 };
                    let (parts, grads) = staged_forward_backward(&model, &batch, loss_scale as f32, &mut hooks).ok_or(TrainError::NoStages)?;
                    (parts, grads, hooks.fwd_peak, hooks.fwd_time)
                } else {
                    let parts = model.forward_loss(&batch);
                    let fwd_peak = self.probe.peak().allocated;
                    let fwd_t = t0.elapsed().as_secs_f64();
                    self.probe.reset_peak();
                    let scaled = if loss_scale == 1.0 { parts.loss.clone() } else { parts.loss.clone() * loss_scale };
                    let mut g = scaled.backward();
                    let grads = GradientsParams::from_module(&mut g, &model);
                    drop(g);
                    (parts, grads, fwd_peak, fwd_t)
                };
                drop(batch);
                let bwd_peak_micro = self.probe.peak();
                fwd_time += fwd_t;
                bwd_time += t0.elapsed().as_secs_f64() - fwd_t;
                peak_fwd = peak_fwd.max(fwd_peak_micro);
                peak_bwd = peak_bwd.max(bwd_peak_micro.allocated);
                reserved = reserved.max(bwd_peak_micro.reserved);
                activation = activation.max(fwd_peak_micro.saturating_sub(live));
                acc.accumulate(&model, grads);

                let loss = parts.loss.into_scalar().elem::<f64>();
                loss_sum += loss;
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
                let checkpoint = if state.step > 0 {
                    let dir = self.save_checkpoint::<B, M>(&model, &optim, &state)?;
                    dir.display().to_string()
                } else {
                    "none (failed at the first step)".into()
                };
                return Err(TrainError::NonFinite { step, value: loss, checkpoint });
            }
            let grads = acc.grads();
            let g_bytes = grad_bytes::<B, M>(&model, &grads);

            self.probe.reset_peak();
            let t_opt = Instant::now();
            let (new_model, info) = optim.step(model, grads, loss_scale * accum as f64, lr_factor);
            model = new_model;
            let opt_peak = self.probe.peak();
            let opt_time = t_opt.elapsed().as_secs_f64();
            reserved = reserved.max(opt_peak.reserved);

            let mut skipped = false;
            if !info.applied {
                match state.loss_scale {
                    Some(s) => {
                        // f16 overflow: skip the step, halve the scale (torch GradScaler).
                        state.loss_scale = Some(s / 2.0);
                        state.good_steps_since_scale = 0;
                        skipped = true;
                    }
                    None => {
                        let dir = if state.step > 0 { self.save_checkpoint::<B, M>(&model, &optim, &state)?.display().to_string() } else { "none".into() };
                        return Err(TrainError::NonFinite { step, value: info.grad_norm, checkpoint: dir });
                    }
                }
            } else if let Some(s) = state.loss_scale {
                state.good_steps_since_scale += 1;
                if state.good_steps_since_scale >= 2000 {
                    state.loss_scale = Some(s * 2.0);
                    state.good_steps_since_scale = 0;
                }
            }
            state.step = step;
            state.optimizer_step = optim.step;

            let record = StepRecord {
                step,
                loss,
                loss_parts: parts_sum.into_iter().map(|(k, v)| (k, v / accum as f64)).collect(),
                lr: cfg.optim.lr * lr_factor,
                grad_norm: info.grad_norm,
                step_time_s: t_step.elapsed().as_secs_f64(),
                data_wait_s: data_wait,
                forward_time_s: fwd_time,
                backward_time_s: bwd_time,
                optimizer_time_s: opt_time,
                live_before_forward_bytes: live_before_fwd,
                peak_forward_bytes: peak_fwd,
                peak_backward_bytes: peak_bwd,
                peak_optimizer_bytes: opt_peak.allocated,
                peak_step_bytes: peak_fwd.max(peak_bwd).max(opt_peak.allocated),
                peak_reserved_bytes: reserved,
                param_bytes: p_bytes,
                grad_bytes: g_bytes,
                optimizer_state_bytes: optim.state_bytes(),
                activation_bytes: activation,
                samples: cfg.batch_size * accum,
                loss_scale: state.loss_scale,
                skipped,
            };
            let line = serde_json::to_string(&record).unwrap_or_default();
            writeln!(metrics, "{line}").and_then(|_| metrics.flush()).map_err(io(&metrics_path))?;
            on_step(&record);
            records.push(record);

            let stop = self.stop.load(Ordering::Relaxed);
            let periodic = cfg.save_freq > 0 && step.is_multiple_of(cfg.save_freq);
            if periodic || step == cfg.steps || stop {
                last_checkpoint = Some(self.save_checkpoint::<B, M>(&model, &optim, &state)?);
            }
            if stop {
                interrupted = true;
                break;
            }
        }
        let summary = summary_markdown(&format!("vramlab run: {}", cfg.output_dir.display()), &self.summary_header, &records);
        let summary_path = cfg.output_dir.join("summary.md");
        fs::write(&summary_path, summary).map_err(io(&summary_path))?;
        Ok(TrainOutcome { model, records, last_checkpoint, interrupted })
    }

    /// Write `checkpoints/<step>/` atomically: build it under a temporary name, then rename.
    fn save_checkpoint<B: AutodiffBackend, M: TrainModel<B>>(
        &self,
        model: &M,
        optim: &Optimizer<B>,
        state: &TrainerState,
    ) -> Result<PathBuf, TrainError> {
        let root = self.checkpoints_dir();
        let final_dir = root.join(format!("{:06}", state.step));
        let tmp = root.join(format!(".{:06}.tmp", state.step));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        model.save_weights(&tmp.join("model.safetensors"))?;
        optim.save(&tmp.join("optimizer.safetensors"))?;
        let state_json = serde_json::to_string_pretty(state).unwrap_or_default();
        fs::write(tmp.join("trainer_state.json"), state_json).map_err(io(&tmp))?;
        for (name, bytes) in &self.checkpoint_files {
            let p = tmp.join(name);
            fs::write(&p, bytes).map_err(io(&p))?;
        }
        if final_dir.exists() {
            fs::remove_dir_all(&final_dir).map_err(io(&final_dir))?;
        }
        fs::rename(&tmp, &final_dir).map_err(io(&final_dir))?;
        Ok(final_dir)
    }
}

/// The checkpoint with the highest step (complete ones only: temporaries start with '.').
pub fn latest_checkpoint(dir: &Path) -> Result<Option<(u64, PathBuf)>, TrainError> {
    if !dir.exists() {
        return Ok(None);
    }
    let mut best = None;
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if let Ok(step) = name.parse::<u64>()
            && entry.path().join("trainer_state.json").exists() && best.as_ref().is_none_or(|(s, _)| step > *s) {
                best = Some((step, entry.path()));
            }
    }
    Ok(best)
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
