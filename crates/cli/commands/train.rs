//! `vramlab train`: a progress bar and start / end lines around the workloads library's run.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

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
        // What concerns training only (the ACT backbone's missing ImageNet weights), once the
        // run's checks have passed: a refused run prints only its error.
        for note in c.training_notes() {
            eprintln!("{note}");
        }
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
            if let Some(code) = signals::exit_code() {
                INTERRUPT_EXIT.store(code, Ordering::Relaxed);
            }
            eprintln!("interrupted; continue with: vramlab train ... --output_dir={} --resume", r.output_dir.display());
        }
    }

    fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }
}

/// Exit status of a run stopped by a signal after its checkpoint: 128 + the signal's number
/// (130 for SIGINT / Ctrl-C, 143 for SIGTERM), as a shell reports a job the signal killed, so
/// a scheduler (SLURM, Kubernetes) requeues it; `None` when no signal stopped a run.
static INTERRUPT_EXIT: AtomicU8 = AtomicU8::new(0);

pub fn interrupt_exit_code() -> Option<u8> {
    Some(INTERRUPT_EXIT.load(Ordering::Relaxed)).filter(|&c| c != 0)
}

/// Stop flag set by Ctrl-C / SIGTERM / SIGHUP: the trainer finishes the step and checkpoints; a
/// second signal exits at once.
#[cfg(unix)]
fn stop_flag() -> Arc<AtomicBool> {
    signals::install()
}

#[cfg(not(unix))]
fn stop_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    let _ = ctrlc::set_handler(move || {
        if f.swap(true, Ordering::Relaxed) {
            std::process::exit(130);
        }
        signals::SIGNAL.store(2, Ordering::Relaxed);
        eprintln!("\ninterrupt: finishing this step and writing a checkpoint (again to abort)");
    });
    flag
}

/// The signal handler (unix): it records which signal came (ctrlc's handler does not say), so
/// that the exit status can name it. Only async-signal-safe work happens in the handler: atomics,
/// `write(2)` and `_exit(2)`.
mod signals {
    use std::sync::atomic::{AtomicI32, Ordering};
    #[cfg(unix)]
    use std::sync::atomic::AtomicBool;
    #[cfg(unix)]
    use std::sync::{Arc, OnceLock};

    /// The first stopping signal's number (0: none yet).
    pub static SIGNAL: AtomicI32 = AtomicI32::new(0);
    #[cfg(unix)]
    static STOP: OnceLock<Arc<AtomicBool>> = OnceLock::new();

    /// 128 + the signal that stopped the run, if one did.
    pub fn exit_code() -> Option<u8> {
        u8::try_from(SIGNAL.load(Ordering::Relaxed)).ok().filter(|&s| s != 0).map(|s| 128u8.saturating_add(s))
    }

    #[cfg(unix)]
    extern "C" fn on_signal(sig: libc::c_int) {
        if SIGNAL.swap(sig, Ordering::SeqCst) != 0 {
            // SAFETY: `_exit` is async-signal-safe.
            unsafe { libc::_exit(128 + sig) }
        }
        if let Some(f) = STOP.get() {
            f.store(true, Ordering::SeqCst);
        }
        let msg = b"\ninterrupt: finishing this step and writing a checkpoint (again to abort)\n";
        // SAFETY: `write` is async-signal-safe; the buffer is static.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    }

    /// Handlers for SIGINT, SIGTERM and SIGHUP that set the returned flag (one flag per process).
    #[cfg(unix)]
    pub fn install() -> Arc<AtomicBool> {
        let flag = STOP.get_or_init(|| {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                // SAFETY: a zeroed sigaction with a plain handler, an empty mask and no flags
                // but SA_RESTART; `on_signal` only does async-signal-safe work.
                unsafe {
                    let mut action: libc::sigaction = std::mem::zeroed();
                    action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                    action.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut action.sa_mask);
                    libc::sigaction(sig, &action, std::ptr::null_mut());
                }
            }
            Arc::new(AtomicBool::new(false))
        });
        flag.clone()
    }
}
