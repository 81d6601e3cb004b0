//! `fit`'s reports: `fit.md` (the recommendation, the candidates fastest first, the
//! largest-batch search), `fit.svg` (the candidates against the budget) and `fit.csv` (every
//! trial), each written whole or not at all.

use std::fmt::Write as _;
use std::path::Path;

use vramlab_bytes::human;

use super::trial::{FitSpec, Status, Trial};
use crate::backend::BackendKind;
use crate::config::RunConfig;
use crate::error::{Result, WorkloadError};

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WorkloadError + '_ {
    move |source| WorkloadError::Io { path: path.to_path_buf(), source }
}

/// Write `text` to `path` whole or not at all (temporary file, then rename).
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// `fit.svg`: the toggle-set candidates (fastest first) against the budget line. A plot that
/// cannot be drawn is a warning: the tables are the result.
fn write_plot(spec: &FitSpec<'_>, out: &Path, rows: &[&Trial]) {
    let cands: Vec<vramlab_plot::Candidate> = rows
        .iter()
        .map(|t| {
            let g = &t.toggles;
            let mut label = format!("b{}×{} {} ckpt-{}", g.batch_size, g.grad_accum_steps, g.precision, g.gradient_checkpointing);
            if g.freeze_backbone == Some(true) {
                label.push_str(" frozen");
            }
            vramlab_plot::Candidate {
                label,
                // Skipped by the estimate: its estimated peak; out of memory: unknown (over the line).
                peak_bytes: t.peak_bytes.or(t.estimate_bytes.filter(|_| t.status == Status::Pruned)).unwrap_or(0),
                fits: t.status == Status::Fits,
                oom: t.status == Status::OutOfMemory,
                samples_per_s: t.samples_per_s,
            }
        })
        .collect();
    if cands.is_empty() {
        return;
    }
    let path = out.join("fit.svg");
    match vramlab_plot::fit_candidates("vramlab fit: candidates against the budget", &cands, spec.budget) {
        Ok(svg) => {
            if let Err(e) = write_atomic(&path, svg.as_bytes()) {
                eprintln!("warning: {e}");
            }
        }
        Err(e) => eprintln!("warning: {}: {e}", path.display()),
    }
}

/// A MiB column, `–` when there is no figure.
fn mib(b: Option<u64>) -> String {
    b.map_or("–".into(), vramlab_bytes::mib_text)
}

/// `fit.md`, `fit.svg` and `fit.csv` in `out` from the finished trials `done`.
pub(super) fn write_reports(spec: &FitSpec<'_>, out: &Path, done: &[Trial], cfg: &RunConfig, largest: Option<u64>, rec: Option<&(Trial, f64)>, command: Option<&str>) -> Result<()> {
    let mut md = String::new();
    let _ = writeln!(md, "# vramlab fit\n\nCommand: `{}`\n", spec.command_line);
    let cap = match cfg.backend {
        BackendKind::Flex => "enforced in every trial as a cap on allocated bytes (the counting allocator: exact); a trial that crosses it ends at that allocation",
        _ => "compared with each trial's peak reserved bytes (CubeCL pools); a device out-of-memory error ends a trial",
    };
    let _ = writeln!(md, "- **budget**: {} ({} bytes), {cap}", human(spec.budget), spec.budget);
    let _ = writeln!(md, "- **backend**: {}; {} steps per trial (peak = max over all steps; speed = median of steps 2..N)", cfg.backend, spec.trial_steps);
    let next = largest.and_then(|b| done.iter().find(|t| t.search == "batch" && t.toggles.batch_size == b + 1));
    let bound = match next {
        Some(t) if t.status == Status::Pruned => format!(" (batch {}: skipped, {})", t.toggles.batch_size, t.message),
        Some(t) => format!(" (batch {}: {})", t.toggles.batch_size, t.status.text()),
        None => format!(" (the search's upper end, --max_batch={})", spec.max_batch),
    };
    let _ = writeln!(
        md,
        "- **largest batch** ({}, checkpointing {}, no accumulation): {}",
        cfg.precision.name(),
        cfg.gradient_checkpointing,
        largest.map_or("none fits".into(), |b| format!("{b}{bound}"))
    );
    match (rec, command) {
        (Some((r, ranked)), Some(c)) => {
            let _ = writeln!(
                md,
                "- **recommended**: {} — the fastest that fits ({ranked:.2} samples/s in the search); re-measured in a fresh process: peak {} ≤ {}, {:.2} samples/s\n\n```\n{c}\n```\n",
                r.toggles.describe(),
                human(r.peak_bytes.unwrap_or(0)),
                human(spec.budget),
                r.samples_per_s.unwrap_or(0.0)
            );
            if r.toggles.freeze_backbone == Some(true) {
                let _ = writeln!(md, "  The recommendation freezes the vision backbone: it is no longer trained. Without it, see the fastest row without \"frozen backbone\" below.\n");
            }
        }
        _ => {
            let _ = writeln!(md, "- **recommended**: nothing fits this budget\n");
        }
    }
    let _ = writeln!(md, "![candidates against the budget](fit.svg)\n");
    let _ = writeln!(md, "## Candidates, fastest first\n");
    let _ = writeln!(md, "| rank | settings | status | peak MiB | estimate MiB | s/step | samples/s | note |\n|---:|---|---|---:|---:|---:|---:|---|");
    let mut rows: Vec<&Trial> = done.iter().filter(|t| t.search == "toggles").collect();
    rows.sort_by(|a, b| {
        let key = |t: &Trial| (t.status != Status::Fits, -(t.samples_per_s.unwrap_or(0.0)));
        key(a).partial_cmp(&key(b)).unwrap_or(std::cmp::Ordering::Equal)
    });
    for (i, t) in rows.iter().enumerate() {
        let rank = if t.status == Status::Fits { (i + 1).to_string() } else { "–".into() };
        let _ = writeln!(
            md,
            "| {rank} | {} | {} | {} | {} | {} | {} | {} |",
            t.toggles.describe(),
            t.status.text(),
            mib(t.peak_bytes),
            mib(t.estimate_bytes),
            t.step_time_s.map_or("–".into(), |s| format!("{s:.3}")),
            t.samples_per_s.map_or("–".into(), |s| format!("{s:.2}")),
            t.message.replace('|', "/")
        );
    }
    let _ = writeln!(md, "\n## Largest-batch search\n\n| batch | status | peak MiB | estimate MiB | s/step | note |\n|---:|---|---:|---:|---:|---|");
    let mut batch: Vec<&Trial> = done.iter().filter(|t| t.search == "batch").collect();
    batch.sort_by_key(|t| t.toggles.batch_size);
    for t in batch {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            t.toggles.batch_size,
            t.status.text(),
            mib(t.peak_bytes),
            mib(t.estimate_bytes),
            t.step_time_s.map_or("–".into(), |s| format!("{s:.3}")),
            t.message.replace('|', "/")
        );
    }
    write_atomic(&out.join("fit.md"), md.as_bytes())?;
    write_plot(spec, out, &rows);

    let mut csv = String::from("search,batch_size,grad_accum_steps,precision,gradient_checkpointing,freeze_backbone,status,peak_bytes,reserved_bytes,estimate_bytes,step_time_s,samples_per_s,message\n");
    for t in done {
        let o = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.4}"));
        let g = &t.toggles;
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},\"{}\"",
            t.search,
            g.batch_size,
            g.grad_accum_steps,
            g.precision,
            g.gradient_checkpointing,
            g.freeze_backbone.map_or(String::new(), |b| b.to_string()),
            t.status.text(),
            o(t.peak_bytes),
            o(t.reserved_bytes),
            o(t.estimate_bytes),
            f(t.step_time_s),
            f(t.samples_per_s),
            t.message.replace('"', "'")
        );
    }
    write_atomic(&out.join("fit.csv"), csv.as_bytes())?;
    Ok(())
}
