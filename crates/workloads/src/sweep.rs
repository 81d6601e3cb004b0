//! `vramlab sweep`: a grid of short training runs, each in its own process (so one run's
//! memory cannot leak into another's figures, and an out-of-memory run does not end the
//! sweep; started and read back by [`crate::child_run`]), summarised as CSV + markdown.
//!
//! `--sweep.<field>=a,b,c` names an axis; several axes make the full grid. A killed sweep can
//! be started again with the same `--output_dir`: finished points are kept.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;
use vramlab_train::StepRecord;
use vramlab_bytes::human;
use vramlab_train::metrics::median_by;

use crate::child_run::{last_error, read_jsonl, train_command};
use crate::config::{self, RunConfig};
use crate::error::{Result, WorkloadError};
use crate::training::timestamp;

struct Point {
    name: String,
    settings: Vec<(String, String)>,
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Aggregates of one point's run: steps after the first (which pays one-time costs: thread
/// pools, first-use buffers) when there are several.
#[derive(Default, Clone)]
struct Summary {
    ok: bool,
    error: String,
    steps: usize,
    step_time: f64,
    peak_fwd: u64,
    peak_bwd: u64,
    peak_opt: u64,
    peak_step: u64,
    reserved: u64,
    params: u64,
    grads: u64,
    optim: u64,
    activations: u64,
    loss_first: f64,
    loss_last: f64,
}

fn summarize(records: &[StepRecord]) -> Summary {
    let steady = if records.len() > 1 { &records[1..] } else { records };
    let max = |f: fn(&StepRecord) -> u64| steady.iter().map(f).max().unwrap_or(0);
    Summary {
        ok: !records.is_empty(),
        error: String::new(),
        steps: records.len(),
        step_time: median_by(records, 1, |r| r.step_time_s),
        peak_fwd: max(|r| r.peak_forward_bytes),
        peak_bwd: max(|r| r.peak_backward_bytes),
        peak_opt: max(|r| r.peak_optimizer_bytes),
        peak_step: max(|r| r.peak_step_bytes),
        reserved: max(|r| r.peak_reserved_bytes),
        params: max(|r| r.param_bytes),
        grads: max(|r| r.grad_bytes),
        optim: max(|r| r.optimizer_state_bytes),
        activations: max(|r| r.activation_bytes),
        loss_first: records.first().map_or(f64::NAN, |r| r.loss),
        loss_last: records.last().map_or(f64::NAN, |r| r.loss),
    }
}

fn read_records(path: &Path) -> Vec<StepRecord> {
    read_jsonl(path)
}

/// A sweep: the base config (file + flags other than `sweep.*` and `output_dir`) and its axes.
pub struct SweepSpec<'a> {
    /// `vramlab` itself: each point is `exe train …` in its own process.
    pub exe: &'a Path,
    pub config_file: Option<&'a Path>,
    /// Every flag of the command line, `sweep.*` included.
    pub overrides: &'a [(String, String)],
    /// The command line, for the report.
    pub command_line: String,
}

/// Flatten nested axes (`sweep.policy.preset`) into dotted names with their values.
fn axes_of(sweep: &serde_json::Map<String, Value>) -> Vec<(String, Vec<String>)> {
    fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, Vec<String>)>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    flatten(&if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") }, v, out);
                }
            }
            Value::Array(a) => out.push((prefix.to_string(), a.iter().map(value_text).collect())),
            other => out.push((prefix.to_string(), vec![value_text(other)])),
        }
    }
    let mut axes = Vec::new();
    for (k, v) in sweep {
        flatten(k, v, &mut axes);
    }
    axes
}

/// The full grid of the axes, each point named `a=1__b=x`.
fn grid(axes: &[(String, Vec<String>)]) -> Vec<Point> {
    let mut points = vec![Point { name: String::new(), settings: Vec::new() }];
    for (axis, values) in axes {
        let short = axis.rsplit('.').next().unwrap_or(axis);
        points = points
            .into_iter()
            .flat_map(|p| {
                values.iter().map(move |v| {
                    let mut s = p.settings.clone();
                    s.push((axis.clone(), v.clone()));
                    let sep = if p.name.is_empty() { "" } else { "__" };
                    Point { name: format!("{}{sep}{short}={v}", p.name), settings: s }
                })
            })
            .collect();
    }
    points
}

/// Run the grid (keeping points a killed sweep already finished), then write `sweep.csv` and
/// `sweep.md` into the output directory.
pub fn run(spec: &SweepSpec<'_>) -> Result<PathBuf> {
    let cfg = config::load(spec.config_file, spec.overrides)?;
    if cfg.sweep.is_empty() {
        return Err(WorkloadError::invalid("sweep", "no axis given; use --sweep.<field>=v1,v2,… (e.g. --sweep.batch_size=1,2,4)".into()));
    }
    cfg.validate_output_dir()?;
    let axes = axes_of(&cfg.sweep);
    if let Some((axis, _)) = axes.iter().find(|(_, values)| values.is_empty()) {
        return Err(WorkloadError::Flag { flag: format!("sweep.{axis}"), msg: "an empty list: give the values to sweep (e.g. --sweep.batch_size=1,2,4)".into() });
    }
    // Every point must make a valid config, with the checks `train` makes (fail before hours
    // of runs): each axis value on its own first (the clearer message), then each combination.
    let base: Vec<(String, String)> = spec.overrides.iter().filter(|(k, _)| !k.starts_with("sweep.") && k != "output_dir").cloned().collect();
    let check = |settings: &[(String, String)]| {
        let o: Vec<(String, String)> = base.iter().chain(settings).cloned().collect();
        config::load(spec.config_file, &o).and_then(|c| c.validate()).map_err(|e| {
            let flags: Vec<String> = settings.iter().map(|(k, v)| format!("sweep.{k}={v}")).collect();
            WorkloadError::Flag { flag: flags.join(" --"), msg: e.to_string() }
        })
    };
    for (axis, values) in &axes {
        for v in values {
            check(&[(axis.clone(), v.clone())])?;
        }
    }
    let points = grid(&axes);
    if axes.len() > 1 {
        for p in &points {
            check(&p.settings)?;
        }
    }
    for note in cfg.training_notes() {
        eprintln!("{note}");
    }
    let out_dir = cfg.output_dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(format!("sweep-{}", timestamp())));
    std::fs::create_dir_all(&out_dir).map_err(|source| WorkloadError::Io { path: out_dir.clone(), source })?;
    // The sweep directory is this process's; each point's `train` locks its own directory.
    let _lock = crate::lock::lock_dir(&out_dir, "output_dir")?;
    // Finished points are kept only for the same config and flags (the axes may change: a
    // point is named by its settings).
    let request = serde_json::json!({ "config_file": spec.config_file, "flags": base });
    crate::child_run::check_request(&out_dir, "sweep_request.json", &request)?;
    eprintln!("sweep: {} points × {} steps → {}", points.len(), cfg.steps, out_dir.display());

    let mut results = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let dir = out_dir.join("points").join(p.name.replace(['/', ' '], "_"));
        let metrics = dir.join("metrics.jsonl");
        let done_marker = dir.join("summary.md");
        let mut summary = if done_marker.exists() { summarize(&read_records(&metrics)) } else { Summary::default() };
        if !summary.ok {
            eprintln!("[{}/{}] {}", i + 1, points.len(), p.name);
            summary = run_point(spec, &base, p, &dir)?;
        }
        if summary.ok {
            eprintln!("    peak {} | act {} | {:.3} s/step", human(summary.peak_step), human(summary.activations), summary.step_time);
        }
        results.push((p, summary));
    }
    let names: Vec<&str> = axes.iter().map(|(a, _)| a.as_str()).collect();
    write_out(&out_dir.join("sweep.csv"), &csv(&names, &results))?;
    let pictures = write_plots(&out_dir, &axes, &results);
    write_out(&out_dir.join("sweep.md"), &(markdown(&cfg, &spec.command_line, &axes, &results) + &pictures))?;
    eprintln!("wrote {} and {}", out_dir.join("sweep.csv").display(), out_dir.join("sweep.md").display());
    Ok(out_dir)
}

fn write_out(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| WorkloadError::Io { path: path.to_path_buf(), source })
}

/// One point in its own process; a failed run is a failed point (its last error line kept),
/// not a failed sweep.
fn run_point(spec: &SweepSpec<'_>, base: &[(String, String)], p: &Point, dir: &Path) -> Result<Summary> {
    crate::child_run::clear_run_dir(dir)?;
    let flags: Vec<(String, String)> = base.iter().chain(p.settings.iter()).cloned().collect();
    let output = train_command(spec.exe, spec.config_file, &flags, dir).output().map_err(|source| WorkloadError::Io { path: spec.exe.to_path_buf(), source })?;
    let mut summary = summarize(&read_records(&dir.join("metrics.jsonl")));
    if !output.status.success() {
        let last = last_error(&String::from_utf8_lossy(&output.stderr)).unwrap_or_else(|| format!("exit status {}", output.status));
        eprintln!("    {last}");
        summary.ok = false;
        summary.error = last;
    }
    Ok(summary)
}

fn csv(names: &[&str], results: &[(&Point, Summary)]) -> String {
    let mut csv = String::new();
    let _ = writeln!(
        csv,
        "{},status,steps,median_step_time_s,peak_forward_bytes,peak_backward_bytes,peak_optimizer_bytes,peak_step_bytes,peak_reserved_bytes,param_bytes,grad_bytes,optimizer_state_bytes,activation_bytes,loss_first,loss_last",
        names.join(",")
    );
    for (p, s) in results {
        let vals: Vec<&str> = p.settings.iter().map(|(_, v)| v.as_str()).collect();
        let status = if s.ok { "ok".to_string() } else { format!("\"{}\"", s.error.replace('"', "'")) };
        let _ = writeln!(
            csv,
            "{},{status},{},{:.4},{},{},{},{},{},{},{},{},{},{:.6},{:.6}",
            vals.join(","),
            s.steps,
            s.step_time,
            s.peak_fwd,
            s.peak_bwd,
            s.peak_opt,
            s.peak_step,
            s.reserved,
            s.params,
            s.grads,
            s.optim,
            s.activations,
            s.loss_first,
            s.loss_last
        );
    }
    csv
}

fn markdown(cfg: &RunConfig, command_line: &str, axes: &[(String, Vec<String>)], results: &[(&Point, Summary)]) -> String {
    let names: Vec<&str> = axes.iter().map(|(a, _)| a.as_str()).collect();
    let mut md = String::new();
    let _ = writeln!(md, "# vramlab sweep\n\nCommand: `{command_line}`\n");
    let _ = writeln!(md, "Backend `{}`; {} steps per point; memory in MiB = max over steps 2..N, step time = median over steps 2..N (step 1 pays one-time costs).\n", cfg.backend, cfg.steps);
    let _ = writeln!(md, "| {} | peak fwd | peak bwd | peak opt | **peak step** | reserved | params | grads | optim | **activations** | s/step | loss |", names.join(" | "));
    let _ = writeln!(md, "|{}---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", "---|".repeat(names.len()));
    for (p, s) in results {
        let vals: Vec<&str> = p.settings.iter().map(|(_, v)| v.as_str()).collect();
        if s.ok {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | **{}** | {} | {} | {} | {} | **{}** | {:.3} | {:.4}→{:.4} |",
                vals.join(" | "),
                vramlab_bytes::mib_text(s.peak_fwd),
                vramlab_bytes::mib_text(s.peak_bwd),
                vramlab_bytes::mib_text(s.peak_opt),
                vramlab_bytes::mib_text(s.peak_step),
                vramlab_bytes::mib_text(s.reserved),
                vramlab_bytes::mib_text(s.params),
                vramlab_bytes::mib_text(s.grads),
                vramlab_bytes::mib_text(s.optim),
                vramlab_bytes::mib_text(s.activations),
                s.step_time,
                s.loss_first,
                s.loss_last
            );
        } else {
            let _ = writeln!(md, "| {} | failed: {} |", vals.join(" | "), s.error);
        }
    }
    for (ai, (axis, values)) in axes.iter().enumerate() {
        if values.len() >= 2 {
            effect_table(&mut md, ai, axis, values, results);
        }
    }
    md
}

/// `sweep_peak.svg` (peak allocated against the batch size, or else the first numeric axis,
/// one line per setting of the other axes) and `sweep_breakdown.svg` (one stacked bar per
/// point); returns the markdown showing those written. A picture that cannot be drawn or
/// written is a warning, not a failed sweep.
fn write_plots(out_dir: &Path, axes: &[(String, Vec<String>)], results: &[(&Point, Summary)]) -> String {
    let short = |axis: &str| axis.rsplit('.').next().unwrap_or(axis).to_string();
    let numeric = |(_, values): &&(String, Vec<String>)| values.iter().all(|v| v.parse::<f64>().is_ok());
    let x_axis = axes
        .iter()
        .position(|(a, _)| short(a) == "batch_size")
        .filter(|&i| numeric(&&axes[i]))
        .or_else(|| axes.iter().position(|a| numeric(&a)));
    // Series: the settings of the other axes (`axis=value, …`, or the values alone under a
    // legend heading naming the axes when that would not fit on a legend line); x: the x
    // axis' value, or the point's number.
    let others_of = |p: &Point| p.settings.iter().enumerate().filter(|(j, _)| Some(*j) != x_axis).map(|(_, kv)| kv.clone()).collect::<Vec<_>>();
    let values_only = results.iter().any(|(p, _)| others_of(p).iter().map(|(k, v)| format!("{}={v}, ", short(k))).collect::<String>().len() > 32);
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for (n, (p, s)) in results.iter().enumerate() {
        if !s.ok {
            continue;
        }
        let others: Vec<String> = others_of(p).iter().map(|(k, v)| if values_only { v.clone() } else { format!("{}={v}", short(k)) }).collect();
        let key = if others.is_empty() || x_axis.is_none() { "peak allocated (step)".to_string() } else { others.join(", ") };
        let x = x_axis.and_then(|i| p.settings[i].1.parse().ok()).unwrap_or((n + 1) as f64);
        match series.iter_mut().find(|(k, _)| *k == key) {
            Some((_, pts)) => pts.push((x, s.peak_step as f64)),
            None => series.push((key, vec![(x, s.peak_step as f64)])),
        }
    }
    let x_label = x_axis.map_or_else(|| "point (row of the table)".to_string(), |i| short(&axes[i].0));
    let legend_title = match (values_only, x_axis) {
        (true, Some(_)) => axes.iter().enumerate().filter(|(j, _)| Some(*j) != x_axis).map(|(_, (a, _))| short(a)).collect::<Vec<_>>().join(", "),
        _ => String::new(),
    };
    let peak = vramlab_plot::sweep_peak_vs_batch(&format!("vramlab sweep: peak allocated vs {x_label}"), &x_label, &legend_title, &series, None);
    // Bars: `axis=value` a line each when short enough to read under a bar (on one line, turned
    // upwards, at most 36 characters), else the values alone, the axes named under them.
    let labels: Vec<String> = results.iter().map(|(p, _)| p.settings.iter().map(|(k, v)| format!("{}={v}", short(k))).collect::<Vec<_>>().join("\n")).collect();
    let values_long = labels.iter().any(|l| l.chars().count() > 36);
    let points: Vec<(String, vramlab_plot::Breakdown)> = results
        .iter()
        .zip(labels)
        .map(|((p, s), label)| {
            let label = if values_long { p.settings.iter().map(|(_, v)| v.as_str()).collect::<Vec<_>>().join("\n") } else { label };
            let label = if s.ok { label } else { format!("{label} (failed)") };
            (label, vramlab_plot::Breakdown { parameters: s.params, gradients: s.grads, optimizer_state: s.optim, activations: s.activations, peak: s.peak_step })
        })
        .collect();
    let x_desc = if values_long { axes.iter().map(|(a, _)| short(a)).collect::<Vec<_>>().join(", ") } else { String::new() };
    let bars = vramlab_plot::stacked_bars("vramlab sweep: memory per point", &x_desc, &points);
    let mut md = String::new();
    for (file, alt, svg) in [("sweep_peak.svg", "peak allocated per setting", peak), ("sweep_breakdown.svg", "memory breakdown per point", bars)] {
        let path = out_dir.join(file);
        match svg.map_err(|e| e.to_string()).and_then(|t| std::fs::write(&path, t).map_err(|e| e.to_string())) {
            Ok(()) => {
                let _ = write!(md, "\n![{alt}]({file})\n");
            }
            Err(e) => eprintln!("warning: {}: {e} (the sweep's tables are written)", path.display()),
        }
    }
    if md.is_empty() { md } else { format!("\n## Pictures\n{md}") }
}

/// Effect of one axis against its first value, all other settings equal.
fn effect_table(md: &mut String, ai: usize, axis: &str, values: &[String], results: &[(&Point, Summary)]) {
    let _ = writeln!(md, "\n## Effect of `{axis}` (vs `{}`, all other settings equal)\n", values[0]);
    let _ = writeln!(md, "| setting | other settings | activations | peak step | step time |\n|---|---|---:|---:|---:|");
    for (p, s) in results {
        if p.settings[ai].1 == values[0] || !s.ok {
            continue;
        }
        let base = results.iter().find(|(q, _)| q.settings.iter().enumerate().all(|(j, (_, v))| if j == ai { *v == values[0] } else { *v == p.settings[j].1 }));
        let Some((_, b)) = base.filter(|(_, b)| b.ok) else { continue };
        let pct = |new: f64, old: f64| if old > 0.0 { format!("{:+.1}%", 100.0 * (new - old) / old) } else { "n/a".into() };
        let others: Vec<String> = p.settings.iter().enumerate().filter(|(j, _)| *j != ai).map(|(_, (k, v))| format!("{}={v}", k.rsplit('.').next().unwrap_or(k))).collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} → {} MiB ({}) | {} → {} MiB ({}) | {:.3} → {:.3} s ({}) |",
            p.settings[ai].1,
            others.join(", "),
            vramlab_bytes::mib_text(b.activations),
            vramlab_bytes::mib_text(s.activations),
            pct(s.activations as f64, b.activations as f64),
            vramlab_bytes::mib_text(b.peak_step),
            vramlab_bytes::mib_text(s.peak_step),
            pct(s.peak_step as f64, b.peak_step as f64),
            b.step_time,
            s.step_time,
            pct(s.step_time, b.step_time)
        );
    }
}
