//! `vramlab train`: a progress bar and start / end lines around the workloads library's run.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use vramlab_train::StepRecord;
use vramlab_bytes::human;
use vramlab_workloads::{RunConfig, RunEnd, RunStart, TrainObserver};

pub fn run(cfg: RunConfig) -> Result<()> {
    let mut progress = Progress { bar: None, every: cfg.log_freq, peak_kind: "peak", stop: stop_flag() };
    vramlab_workloads::train(cfg, &mut progress)?;
    Ok(())
}

/// `vramlab warmup`: one training step of the config (its shapes, precision and toggles) in a
/// scratch directory that is removed afterwards. On wgpu/cuda this compiles and autotunes every
/// kernel that step needs into the kernel cache printed at start, so the first step of the
/// real run is fast, and a container image can be pre-warmed.
pub fn warmup(mut cfg: RunConfig) -> Result<()> {
    let scratch = std::env::temp_dir().join(format!("vramlab-warmup-{}", std::process::id()));
    (cfg.steps, cfg.save_freq, cfg.resume, cfg.output_dir) = (1, 0, false, Some(scratch.clone()));
    let t = std::time::Instant::now();
    let result = run(cfg);
    let _ = std::fs::remove_dir_all(&scratch);
    result?;
    eprintln!("warmup: one step compiled, tuned and run in {:.1} s; later runs of this config reuse the kernel cache", t.elapsed().as_secs_f64());
    Ok(())
}

/// Progress bar on a terminal; plain log lines otherwise (CI logs).
struct Progress {
    bar: Option<ProgressBar>,
    every: u64,
    peak_kind: &'static str,
    stop: Arc<AtomicBool>,
}

impl TrainObserver for Progress {
    fn started(&mut self, r: &RunStart<'_>) {
        let c = r.config;
        eprintln!(
            "vramlab train: {} ({} parameters) on {} [{}], {} steps, batch {} × {} → {}",
            r.policy,
            r.num_params,
            r.backend.backend,
            c.precision.name(),
            c.steps,
            c.batch_size,
            c.grad_accum_steps,
            r.output_dir.display()
        );
        self.peak_kind = match r.backend.peak_kind {
            vramlab_probe::PeakKind::Exact => "peak",
            vramlab_probe::PeakKind::Sampled => "peak≥",
        };
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(c.steps).with_position(r.start_step);
            bar.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}<{eta_precise}] {bar:30} {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            self.bar = Some(bar);
        } else if self.every == 0 {
            self.every = (c.steps / 10).max(1);
        }
    }

    fn step(&mut self, r: &StepRecord) {
        let msg = format!(
            "loss {:.5} | {:.3} s/step | data {:.3} s | {} {} | act {}",
            r.loss,
            r.step_time_s,
            r.data_wait_s,
            self.peak_kind,
            human(r.peak_step_bytes),
            human(r.activation_bytes)
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

    fn finished(&mut self, r: &RunEnd<'_>) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let (Some(first), Some(last)) = (r.records.first(), r.records.last()) {
            eprintln!(
                "done: loss {:.5} → {:.5} over steps {}..{}; peak {} (activations {}); summary: {}",
                first.loss,
                last.loss,
                first.step,
                last.step,
                human(r.records.iter().map(|r| r.peak_step_bytes).max().unwrap_or(0)),
                human(r.records.iter().map(|r| r.activation_bytes).max().unwrap_or(0)),
                r.output_dir.join("summary.md").display()
            );
        }
        if r.interrupted {
            eprintln!("interrupted; continue with: vramlab train ... --output_dir={} --resume", r.output_dir.display());
        }
    }

    fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }
}

/// Stop flag set by Ctrl-C / SIGTERM: the trainer finishes the step and checkpoints; a second
/// signal exits at once.
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
