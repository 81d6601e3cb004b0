//! `vramlab fit --budget=24GiB`: what fits a memory budget, and which of it is fastest, decided
//! by short measured runs.
//!
//! Two searches, each trial a short `vramlab train` in its own process (like `sweep`), capped
//! at the budget:
//! 1. **Largest batch** with the toggles as configured: doubling from the configured batch
//!    until a trial runs out of memory, then bisection between the last fit and the first
//!    out-of-memory.
//! 2. **Fastest toggle set** for the effective batch asked for (`batch_size ×
//!    grad_accum_steps`): every combination of precision (f32, bf16), gradient checkpointing
//!    (off, blocks) and a frozen vision backbone (where the policy has one), each at the
//!    largest micro-batch dividing the effective batch that fits (the rest made up by
//!    accumulation). Candidates the estimator puts well over the budget are not run.
//!
//! On the CPU backend the counting allocator enforces the budget as a cap: an allocation that
//! would cross it ends the trial at once with a clean out-of-memory result
//! ([`vramlab_probe::OUT_OF_MEMORY_EXIT_CODE`]). On wgpu/cuda a device out-of-memory error ends
//! the trial the same way, and a trial whose measured peak exceeds the budget does not fit.
//!
//! The recommendation is re-measured in a fresh process before it is printed; a configuration
//! whose measured peak exceeds the budget is never recommended. Every finished trial is one
//! line of `fit.jsonl`: a killed `fit` started again with the same `--output_dir` keeps them.
//!
//! Here: the searches and the trial runner; what a trial is in [`trial`], the reports in
//! `report.rs`, the child process (command, records, error line) in [`crate::child_run`].

mod report;
mod trial;

pub use trial::{FitSpec, Status, Toggles, Trial};

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use vramlab_train::StepRecord;
use vramlab_bytes::human;
use vramlab_train::metrics::median_by;

use crate::backend::BackendKind;
use crate::child_run::{last_error, read_jsonl, train_command};
use crate::config::{self, RunConfig};
use crate::error::{Result, WorkloadError};
use crate::training::timestamp;
use report::{io, write_reports};

/// What `fit` found.
pub struct FitOutcome {
    pub output_dir: PathBuf,
    pub largest_batch: Option<u64>,
    pub recommended: Option<Trial>,
    pub command: Option<String>,
}

/// The peak an estimator predicts for a config, if it can (pruning and ordering only).
pub type Estimator<'a> = dyn Fn(&RunConfig) -> Option<u64> + 'a;

struct Ctx<'a> {
    spec: &'a FitSpec<'a>,
    base: Vec<(String, String)>,
    out: PathBuf,
    done: Vec<Trial>,
    backend: BackendKind,
    estimate: &'a Estimator<'a>,
    count: usize,
}

impl Ctx<'_> {
    fn config_with(&self, t: &Toggles) -> Result<RunConfig> {
        let mut o = self.base.clone();
        o.extend(t.flags());
        let cfg = config::load(self.spec.config_file, &o)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The trial for these toggles: kept from an earlier `fit` in this directory, or run now.
    fn trial(&mut self, search: &str, t: &Toggles) -> Result<Trial> {
        let name = format!("{search}-{}", t.name());
        if let Some(done) = self.done.iter().find(|d| d.name == name) {
            eprintln!("  {:<44} {} (kept from the earlier run)", t.describe(), line(done));
            return Ok(done.clone());
        }
        let cfg = self.config_with(t)?;
        let estimate = (self.estimate)(&cfg);
        let budget = self.spec.budget;
        let calibrated = estimate.map(|e| self.calibrated(t, e));
        let trial = match (estimate, calibrated) {
            (Some(e), Some((c, how))) if search != "verify" && c > self.spec.prune * budget as f64 => Trial {
                name,
                search: search.into(),
                toggles: t.clone(),
                status: Status::Pruned,
                peak_bytes: None,
                reserved_bytes: None,
                step_time_s: None,
                samples_per_s: None,
                estimate_bytes: Some(e),
                steps_done: 0,
                message: format!("estimated peak {}{how} > {:.2} × budget", human(c as u64), self.spec.prune),
            },
            _ => {
                self.count += 1;
                self.run(search, name, t, estimate)?
            }
        };
        eprintln!("  {:<44} {}", t.describe(), line(&trial));
        append_line(&self.out.join("fit.jsonl"), &trial)?;
        self.done.push(trial.clone());
        Ok(trial)
    }

    /// The estimate scaled by measured ÷ estimated of the finished trial nearest to these
    /// toggles (same precision, checkpointing and backbone first, then the closest batch), so
    /// a systematic error of the estimator cannot prune what fits. Unscaled until a trial has
    /// been measured.
    fn calibrated(&self, t: &Toggles, estimate: u64) -> (f64, String) {
        let same = |d: &Trial| d.toggles.precision == t.precision && d.toggles.gradient_checkpointing == t.gradient_checkpointing && d.toggles.freeze_backbone.unwrap_or(false) == t.freeze_backbone.unwrap_or(false);
        let nearest = self
            .done
            .iter()
            .filter(|d| matches!(d.status, Status::Fits | Status::OverBudget) && d.peak_bytes.is_some() && d.estimate_bytes.is_some_and(|e| e > 0))
            .min_by_key(|d| (!same(d), d.toggles.batch_size.abs_diff(t.batch_size)));
        match nearest {
            Some(d) => {
                let ratio = d.peak_bytes.unwrap_or(0) as f64 / d.estimate_bytes.unwrap_or(1) as f64;
                (estimate as f64 * ratio, format!(" (estimate {} × {ratio:.2}, measured ÷ estimated at batch {})", human(estimate), d.toggles.batch_size))
            }
            None => (estimate as f64, String::new()),
        }
    }

    fn run(&self, search: &str, name: String, t: &Toggles, estimate: Option<u64>) -> Result<Trial> {
        let dir = self.out.join("trials").join(&name);
        crate::child_run::clear_run_dir(&dir)?;
        let steps = if search == "verify" { self.spec.trial_steps + 2 } else { self.spec.trial_steps };
        let mut flags: Vec<(String, String)> = self.base.iter().cloned().chain(t.flags()).collect();
        flags.extend([("steps", steps.to_string()), ("save_checkpoint", "false".into()), ("resume", "false".into()), ("log_freq", "0".into())].map(|(k, v)| (k.to_string(), v)));
        let mut cmd = train_command(self.spec.exe, self.spec.config_file, &flags, &dir);
        if self.backend == BackendKind::Flex {
            cmd.env(vramlab_probe::BUDGET_ENV, self.spec.budget.to_string());
        }
        let output = cmd.output().map_err(|source| WorkloadError::Io { path: self.spec.exe.to_path_buf(), source })?;
        let records: Vec<StepRecord> = read_jsonl(&dir.join("metrics.jsonl"));
        let stderr = String::from_utf8_lossy(&output.stderr);
        let peak = records.iter().map(|r| r.peak_step_bytes).max();
        let reserved = records.iter().map(|r| r.peak_reserved_bytes).max();
        let step_time = (records.len() > 1).then(|| median_by(&records, 1, |r| r.step_time_s));
        let effective = (t.batch_size * t.grad_accum_steps) as f64;
        // A trial the pre-flight check refused needs more memory than the machine has: it does
        // not fit, as an out-of-memory trial does not.
        let oom_line = stderr.lines().find(|l| l.starts_with(vramlab_probe::OUT_OF_MEMORY_MESSAGE) || is_device_oom(l) || l.contains(crate::preflight::REFUSAL) || l.contains(crate::preflight::BEYOND));
        let (status, message) = if output.status.code() == Some(vramlab_probe::OUT_OF_MEMORY_EXIT_CODE) || oom_line.is_some() {
            let at = format!("during step {}", records.len() + 1);
            (Status::OutOfMemory, format!("{at}: {}", oom_line.unwrap_or("device out of memory").trim()))
        } else if !output.status.success() {
            (Status::Failed, last_error(&stderr).unwrap_or_else(|| format!("exit status {}", output.status)))
        } else if (records.len() as u64) < steps {
            (Status::Failed, format!("ran {} of {steps} steps", records.len()))
        } else {
            // GPU backends have no cap: the device's reserved bytes are what must fit.
            let measured = if self.backend == BackendKind::Flex { peak } else { reserved.max(peak) };
            match measured {
                Some(p) if p <= self.spec.budget => (Status::Fits, String::new()),
                Some(p) => (Status::OverBudget, format!("measured peak {} > budget", human(p))),
                None => (Status::Failed, "no step records".into()),
            }
        };
        // A trial's own run directory is scratch: the line in fit.jsonl is its result.
        let _ = crate::child_run::clear_run_dir(&dir);
        Ok(Trial {
            name,
            search: search.into(),
            toggles: t.clone(),
            status,
            // An out-of-memory trial's peak is the budget it crossed, not its finished steps'.
            peak_bytes: peak.filter(|_| status != Status::OutOfMemory),
            reserved_bytes: reserved,
            step_time_s: step_time.filter(|_| status == Status::Fits || status == Status::OverBudget),
            samples_per_s: step_time.filter(|s| *s > 0.0 && status == Status::Fits).map(|s| effective / s),
            estimate_bytes: estimate,
            steps_done: records.len() as u64,
            message,
        })
    }
}

fn is_device_oom(l: &str) -> bool {
    let l = l.to_ascii_lowercase();
    // CubeCL: "An out-of-memory error happened during launch"; CUDA: CUDA_ERROR_OUT_OF_MEMORY.
    ["out of memory", "out-of-memory", "outofmemory", "out_of_memory"].iter().any(|p| l.contains(p))
}

fn line(t: &Trial) -> String {
    let mut s = t.status.text().to_string();
    if let Some(p) = t.peak_bytes {
        let _ = write!(s, " | peak {}", human(p));
    }
    if let Some(v) = t.samples_per_s {
        let _ = write!(s, " | {v:.2} samples/s");
    }
    if !t.message.is_empty() && t.status != Status::Fits {
        let _ = write!(s, " | {}", t.message);
    }
    s
}

fn append_line(path: &Path, t: &Trial) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io(path))?;
    let line = serde_json::to_string(t).expect("a trial serialises");
    writeln!(f, "{line}").and_then(|_| f.sync_data()).map_err(io(path))
}

/// What a `fit` directory was asked (`fit_request.json`, [`crate::child_run::check_request`]):
/// a later `fit` keeps its trials only when it asks the same (budget, steps per trial, config
/// file, other flags); otherwise it is refused, so trials measured under another budget are
/// never reused.
fn check_request(out: &Path, spec: &FitSpec<'_>, base: &[(String, String)]) -> Result<()> {
    let request = serde_json::json!({
        "budget": spec.budget,
        "trial_steps": spec.trial_steps,
        "config_file": spec.config_file,
        "flags": base,
    });
    crate::child_run::check_request(out, "fit_request.json", &request)
}

/// Trials an earlier `fit` in this directory finished (a torn last line is dropped).
fn finished_trials(out: &Path) -> Vec<Trial> {
    read_jsonl(&out.join("fit.jsonl"))
}

/// Run both searches, re-measure the recommendation, and write `fit.md`, `fit.csv` and
/// `fit.svg`. Fails when nothing fits.
pub fn run(spec: &FitSpec<'_>, estimate: &Estimator<'_>) -> Result<FitOutcome> {
    if spec.trial_steps < 2 {
        return Err(WorkloadError::invalid("trial_steps", "at least 2: the first step pays one-time costs, the others give the speed".into()));
    }
    if spec.max_batch == 0 {
        return Err(WorkloadError::invalid("max_batch", "must be at least 1: the largest batch the search may try".into()));
    }
    if spec.budget == 0 {
        return Err(WorkloadError::invalid("budget", "must be more than 0 bytes".into()));
    }
    let cfg = config::load(spec.config_file, spec.overrides)?;
    cfg.validate()?;
    // Bounds before any trial: the f32 master weights stay whatever the toggles, so a model
    // whose parameters alone exceed the budget fits at no batch.
    let params = crate::estimate(&cfg)?.param_bytes;
    if params > spec.budget {
        return Err(WorkloadError::invalid(
            "budget",
            format!("{}: the model's f32 parameters alone take {} ({params} bytes), more than the budget at any batch or setting; raise --budget or choose a smaller model", human(spec.budget), human(params)),
        ));
    }
    for note in cfg.training_notes() {
        eprintln!("{note}");
    }
    if !cfg.sweep.is_empty() {
        return Err(WorkloadError::invalid("sweep", "fit chooses the settings itself; drop the --sweep.* flags".into()));
    }
    let base: Vec<(String, String)> = spec
        .overrides
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "output_dir" | "batch_size" | "grad_accum_steps" | "precision" | "gradient_checkpointing" | "policy.freeze_backbone" | "steps" | "resume"))
        .cloned()
        .collect();
    let out = cfg.output_dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(format!("fit-{}", timestamp())));
    std::fs::create_dir_all(&out).map_err(io(&out))?;
    // The fit directory is this process's; each trial's `train` locks its own directory.
    let _lock = crate::lock::lock_dir(&out, "output_dir")?;
    check_request(&out, spec, &base)?;
    let done = finished_trials(&out);
    let asked = Toggles {
        batch_size: cfg.batch_size,
        grad_accum_steps: cfg.grad_accum_steps,
        precision: cfg.precision.name().to_string(),
        gradient_checkpointing: cfg.gradient_checkpointing.to_string(),
        freeze_backbone: None,
    };
    let effective = cfg.batch_size * cfg.grad_accum_steps;
    let mut ctx = Ctx { spec, base, out: out.clone(), done, backend: cfg.backend, estimate, count: 0 };
    let budget_note = match cfg.backend {
        BackendKind::Flex => "enforced as a cap on the allocated bytes (counting allocator, exact)",
        _ => "compared with each trial's measured peak reserved bytes (no cap on GPU backends)",
    };
    eprintln!(
        "vramlab fit: budget {} on {} ({budget_note}); effective batch {effective}; {} steps per trial → {}",
        human(spec.budget),
        cfg.backend,
        spec.trial_steps,
        out.display()
    );
    if !ctx.done.is_empty() {
        eprintln!("  {} trials kept from the earlier run in this directory", ctx.done.len());
    }

    // 1. Largest micro-batch with the toggles as configured (no accumulation).
    eprintln!("largest batch ({}, checkpointing {}):", asked.precision, asked.gradient_checkpointing);
    let largest = largest_batch(&mut ctx, &asked)?;

    // 2. Fastest toggle set at the effective batch asked for.
    eprintln!("fastest settings for an effective batch of {effective}:");
    let freeze_options: Vec<Option<bool>> = {
        let frozen = Toggles { freeze_backbone: Some(true), ..asked.clone() };
        if ctx.config_with(&frozen).is_ok() { vec![Some(false), Some(true)] } else { vec![None] }
    };
    let divisors: Vec<u64> = (1..=effective).rev().filter(|b| effective.is_multiple_of(*b)).collect();
    for precision in ["f32", "bf16"] {
        for ckpt in ["off", "blocks"] {
            for &freeze in &freeze_options {
                let set = |b: u64| Toggles { batch_size: b, grad_accum_steps: effective / b, precision: precision.into(), gradient_checkpointing: ckpt.into(), freeze_backbone: freeze };
                if ctx.config_with(&set(effective)).is_err() {
                    continue; // e.g. bf16 on a backend without it
                }
                // The largest micro-batch that fits is the fastest of this set (fewer, fuller
                // passes); smaller ones are tried only after an out-of-memory.
                for &b in &divisors {
                    let t = ctx.trial("toggles", &set(b))?;
                    if matches!(t.status, Status::Fits | Status::Failed) {
                        break;
                    }
                }
            }
        }
    }

    // 3. Recommend the fastest candidate that fits, re-measured in a fresh process.
    let mut fitting: Vec<&Trial> = ctx.done.iter().filter(|t| t.search == "toggles" && t.status == Status::Fits && t.samples_per_s.is_some()).collect();
    fitting.sort_by(|a, b| b.samples_per_s.partial_cmp(&a.samples_per_s).unwrap_or(std::cmp::Ordering::Equal));
    let candidates: Vec<Toggles> = fitting.iter().map(|t| t.toggles.clone()).collect();
    // The speed candidates were ranked by (one short run each; the re-measurement's own speed
    // is another sample of the same noise).
    let fitting_speed: Vec<f64> = fitting.iter().map(|t| t.samples_per_s.unwrap_or(0.0)).collect();
    let mut recommended = None;
    for (t, ranked) in candidates.into_iter().zip(fitting_speed) {
        eprintln!("re-measuring the fastest candidate:");
        let v = ctx.trial("verify", &t)?;
        if v.status == Status::Fits {
            recommended = Some((v, ranked));
            break;
        }
        eprintln!("  did not hold on re-measurement; trying the next candidate");
    }
    let command = recommended.as_ref().map(|(r, _)| recommended_command(spec, &ctx.base, &r.toggles));
    write_reports(spec, &ctx.out, &ctx.done, &cfg, largest, recommended.as_ref(), command.as_deref())?;
    match (&recommended, &command) {
        (Some((r, ranked)), Some(c)) => {
            if r.toggles.freeze_backbone == Some(true) {
                let whole = ctx.done.iter().filter(|t| t.search == "toggles" && t.status == Status::Fits && t.toggles.freeze_backbone != Some(true)).max_by(|a, b| {
                    a.samples_per_s.partial_cmp(&b.samples_per_s).unwrap_or(std::cmp::Ordering::Equal)
                });
                eprintln!("note: the recommendation freezes the vision backbone (it is no longer trained)");
                if let Some(w) = whole {
                    eprintln!(
                        "  fastest that trains everything: {} ({:.2} samples/s against {ranked:.2} in the same search)\n  {}",
                        w.toggles.describe(),
                        w.samples_per_s.unwrap_or(0.0),
                        recommended_command(spec, &ctx.base, &w.toggles)
                    );
                }
            }
            eprintln!(
                "recommended: {} — the fastest in the search ({ranked:.2} samples/s); re-measured in a fresh process: peak {} ≤ budget {} ({:.2} samples/s)\n  {c}",
                r.toggles.describe(),
                human(r.peak_bytes.unwrap_or(0)),
                human(spec.budget),
                r.samples_per_s.unwrap_or(0.0)
            );
        }
        _ => {
            return Err(WorkloadError::invalid(
                "budget",
                format!("nothing fits {} at an effective batch of {effective} (see {})", human(spec.budget), out.join("fit.md").display()),
            ));
        }
    }
    eprintln!("{} new trials; wrote {}", ctx.count, out.join("fit.md").display());
    Ok(FitOutcome { output_dir: out, largest_batch: largest, recommended: recommended.map(|(r, _)| r), command })
}

/// Doubling from the configured batch, then bisection: the largest batch (no accumulation)
/// whose trial fits.
fn largest_batch(ctx: &mut Ctx<'_>, asked: &Toggles) -> Result<Option<u64>> {
    let at = |b: u64| Toggles { batch_size: b, grad_accum_steps: 1, ..asked.clone() };
    let fits = |t: &Trial| t.status == Status::Fits;
    let max = ctx.spec.max_batch.max(1);
    let mut b = asked.batch_size.clamp(1, max);
    let (mut lo, mut hi): (Option<u64>, Option<u64>) = (None, None); // last fit, first non-fit
    loop {
        let t = ctx.trial("batch", &at(b))?;
        if t.status == Status::Failed {
            return Err(WorkloadError::invalid("fit", format!("the trial at batch {b} failed: {}", t.message)));
        }
        if fits(&t) {
            lo = Some(b);
            if b >= max || hi.is_some() {
                break;
            }
            b = (b * 2).min(max);
        } else {
            hi = Some(b);
            if b == 1 || lo.is_some() {
                break;
            }
            b /= 2;
        }
    }
    let (Some(mut l), Some(mut h)) = (lo, hi) else { return Ok(lo) };
    while h - l > 1 {
        let mid = l + (h - l) / 2;
        let t = ctx.trial("batch", &at(mid))?;
        if fits(&t) { l = mid } else { h = mid }
    }
    Ok(Some(l))
}

fn recommended_command(spec: &FitSpec<'_>, base: &[(String, String)], t: &Toggles) -> String {
    let mut c = String::from("vramlab train");
    if let Some(f) = spec.config_file {
        let _ = write!(c, " --config {}", f.display());
    }
    for (k, v) in base.iter().chain(t.flags().iter()) {
        if k == "policy.freeze_backbone" && v == "false" {
            continue;
        }
        let _ = write!(c, " --{k}={v}");
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--budget` and the probe's budget variable are read by `vramlab_bytes::parse`.
    #[test]
    fn byte_sizes_parse_binary_and_decimal_units() {
        let parse_bytes = vramlab_bytes::parse;
        assert_eq!(parse_bytes("2GiB"), Some(2 << 30));
        assert_eq!(parse_bytes("1.5 GiB"), Some(3 << 29));
        assert_eq!(parse_bytes("100MiB"), Some(100 << 20));
        assert_eq!(parse_bytes("24gb"), Some(24_000_000_000));
        assert_eq!(parse_bytes("1000000"), Some(1_000_000));
        assert_eq!(parse_bytes("2e9"), Some(2_000_000_000));
        assert_eq!(parse_bytes("12 parsecs"), None);
        assert_eq!(parse_bytes("-1GiB"), None);
        assert_eq!(parse_bytes(""), None);
    }

    #[test]
    fn device_out_of_memory_messages_are_recognised() {
        assert!(is_device_oom("An out-of-memory error happened during launch"));
        assert!(is_device_oom("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"));
        assert!(!is_device_oom("error: --policy.chunk_size: must be at least 1"));
    }

    #[test]
    fn trial_names_and_flags_carry_every_toggle() {
        let t = Toggles { batch_size: 4, grad_accum_steps: 2, precision: "bf16".into(), gradient_checkpointing: "blocks".into(), freeze_backbone: Some(true) };
        assert_eq!(t.name(), "b4x2_bf16_ckpt-blocks_frozen");
        let flags = t.flags();
        assert!(flags.contains(&("policy.freeze_backbone".into(), "true".into())) && flags.contains(&("grad_accum_steps".into(), "2".into())));
        let none = Toggles { freeze_backbone: None, ..t };
        assert!(!none.flags().iter().any(|(k, _)| k == "policy.freeze_backbone"));
    }

    #[test]
    fn a_torn_last_line_of_fit_jsonl_is_dropped() {
        let dir = vramlab_testkit::temp_dir("fit");
        let t = Trial {
            name: "batch-b1x1_f32_ckpt-off".into(),
            search: "batch".into(),
            toggles: Toggles { batch_size: 1, grad_accum_steps: 1, precision: "f32".into(), gradient_checkpointing: "off".into(), freeze_backbone: None },
            status: Status::Fits,
            peak_bytes: Some(10),
            reserved_bytes: None,
            step_time_s: Some(0.1),
            samples_per_s: Some(10.0),
            estimate_bytes: None,
            steps_done: 3,
            message: String::new(),
        };
        append_line(&dir.path().join("fit.jsonl"), &t).unwrap();
        std::fs::write(dir.path().join("fit.jsonl"), format!("{}{{\"name\":\"bat", std::fs::read_to_string(dir.path().join("fit.jsonl")).unwrap())).unwrap();
        let kept = finished_trials(dir.path());
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].name, t.name);
    }
}
