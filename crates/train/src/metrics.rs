//! Per-step records (JSONL) and the run summary.

use serde::{Deserialize, Serialize};
use vramlab_bytes::human;

/// One optimizer step. Bytes are bytes; times are seconds.
///
/// Memory fields (see README "What the numbers mean"):
/// - `peak_forward_bytes`, `peak_backward_bytes`, `peak_optimizer_bytes`: the highest
///   *allocated* bytes during each phase (all micro-batches of the step). On flex this is exact
///   (counting allocator); on wgpu/cuda it is the maximum over probe samples.
/// - `peak_reserved_bytes`: highest reserved bytes seen in the step (process RSS on CPU; the
///   CubeCL memory pools on GPU).
/// - `param_bytes`, `grad_bytes`, `optimizer_state_bytes`: sizes of those tensors.
/// - `activation_bytes`: peak during forward minus live bytes before the forward (largest
///   micro-batch).
/// - `loader_peak_bytes`: highest host bytes held by the data loader during the step (its
///   workers' decoding and batching, batches waiting in the prefetch queue); exact, counted by
///   the counting allocator apart from the model's figures above. Absent when the counting
///   allocator is not installed.
/// - `peak_device_used_bytes`: the device's used memory from the driver (NVML on CUDA: what
///   `nvidia-smi` shows, all processes and the CUDA context included), maximum over the probe
///   points of the step; absent where the driver cannot be asked.
/// - `kernel_launches`, `kernels_compiled`, `kernels_from_cache`, `autotune_searches`,
///   `autotune_s`, `top_kernels`, and with `VRAMLAB_KERNEL_ACCOUNTING=time` `kernel_time_s` and
///   `top_kernel_time` ([`KernelStep`]): on CubeCL backends (wgpu, cuda) only; absent
///   on flex.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StepRecord {
    pub step: u64,
    pub loss: f64,
    pub loss_parts: Vec<(String, f64)>,
    pub lr: f64,
    pub grad_norm: f64,
    pub step_time_s: f64,
    pub data_wait_s: f64,
    pub forward_time_s: f64,
    pub backward_time_s: f64,
    pub optimizer_time_s: f64,
    pub live_before_forward_bytes: u64,
    pub peak_forward_bytes: u64,
    pub peak_backward_bytes: u64,
    pub peak_optimizer_bytes: u64,
    pub peak_step_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub param_bytes: u64,
    pub grad_bytes: u64,
    pub optimizer_state_bytes: u64,
    pub activation_bytes: u64,
    pub samples: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub loss_scale: Option<f64>,
    #[serde(default)]
    pub skipped: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub loader_peak_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub peak_device_used_bytes: Option<u64>,
    /// Kernels of the step, where the backend runs kernels and they are counted.
    #[serde(flatten, skip_serializing_if = "Option::is_none", default)]
    pub kernels: Option<KernelStep>,
}

/// How many of a step's most launched kernels its record keeps (`top_kernels`).
pub const TOP_KERNELS_PER_STEP: usize = 20;
/// How many kernels the summary's table shows.
const TOP_KERNELS_IN_SUMMARY: usize = 15;

/// A step's kernels on a CubeCL backend, counted from CubeCL's log messages
/// (`vramlab_probe::kernels` says how and how exact each count is).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct KernelStep {
    /// Kernel launches (autotune's benchmark launches included). The total over a run is exact;
    /// a few launches can be counted in the next step (CubeCL reports launches from a thread).
    pub kernel_launches: u64,
    /// Kernels compiled in the step (each distinct kernel once per process): exact.
    pub kernels_compiled: u64,
    /// Compiled kernels read from CubeCL's disk cache instead (CUDA PTX): exact.
    pub kernels_from_cache: u64,
    /// Autotune searches (keys missing from the autotune cache): exact.
    pub autotune_searches: u64,
    /// Wall time of those searches (compiling and benchmarking every candidate), seconds.
    pub autotune_s: f64,
    /// The step's [`TOP_KERNELS_PER_STEP`] most launched kernels, `[name, launches]`, most
    /// launched first; names as CubeCL logs them, long ones cut (`vramlab_probe::kernels::short_name`:
    /// matmul variants that share their first parts are added up).
    /// Exact counts; the launches of the kernels left out are `kernel_launches` minus their sum.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub top_kernels: Vec<(String, u64)>,
    /// Timed kernels only (`VRAMLAB_KERNEL_ACCOUNTING=time`: CubeCL times each kernel alone,
    /// which slows the step; `vramlab_probe::kernels` says how): the seconds of all the step's
    /// timed kernels. Absent when kernels are not timed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kernel_time_s: Option<f64>,
    /// The step's [`TOP_KERNELS_PER_STEP`] kernels with the most time, `[name, seconds]`, most
    /// first (short names as in `top_kernels`). Empty when kernels are not timed.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub top_kernel_time: Vec<(String, f64)>,
}

impl KernelStep {
    /// The counts between two readings of `vramlab_probe::kernels::totals`.
    pub fn between(before: vramlab_probe::KernelCounts, after: vramlab_probe::KernelCounts) -> Self {
        let d = after - before;
        // Two names can shorten to one (matmul variants, the same kernel over two runtimes): add them up.
        let mut top: Vec<(String, u64)> = Vec::new();
        for (name, n) in &d.by_kernel {
            let short = vramlab_probe::kernels::short_name(name);
            match top.iter_mut().find(|(k, _)| *k == short) {
                Some(e) => e.1 += n,
                None => top.push((short, *n)),
            }
        }
        top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        top.truncate(TOP_KERNELS_PER_STEP);
        let mut time: Vec<(String, f64)> = Vec::new();
        for (name, t) in &d.time_by_kernel {
            let short = vramlab_probe::kernels::short_name(name);
            match time.iter_mut().find(|(k, _)| *k == short) {
                Some(e) => e.1 += t,
                None => time.push((short, *t)),
            }
        }
        let kernel_time_s = (!time.is_empty()).then(|| time.iter().map(|(_, t)| t).sum());
        time.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        time.truncate(TOP_KERNELS_PER_STEP);
        Self { kernel_launches: d.launches, kernels_compiled: d.compiled, kernels_from_cache: d.from_cache, autotune_searches: d.autotune_searches, autotune_s: d.autotune_s, top_kernels: top, kernel_time_s, top_kernel_time: time }
    }
}

/// Median of the step records after the first `skip` (warm-up) steps.
pub fn median_by(records: &[StepRecord], skip: usize, f: impl Fn(&StepRecord) -> f64) -> f64 {
    let mut v: Vec<f64> = records.iter().skip(skip.min(records.len().saturating_sub(1))).map(f).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Markdown summary of a run.
pub fn summary_markdown(title: &str, header: &[(String, String)], records: &[StepRecord]) -> String {
    let mut s = format!("# {title}\n\n");
    for (k, v) in header {
        s.push_str(&format!("- **{k}**: {v}\n"));
    }
    let Some(last) = records.last() else {
        s.push_str("\nNo steps recorded.\n");
        return s;
    };
    let first = &records[0];
    // Memory of the steady state: step 1 also pays one-time allocations.
    let steady = if records.len() > 1 { &records[1..] } else { records };
    let max = |f: fn(&StepRecord) -> u64| steady.iter().map(f).max().unwrap_or(0);
    s.push_str(&format!(
        "\n## Result\n\n| | value |\n|---|---|\n| steps | {} → {} |\n| loss | {:.6} → {:.6} |\n| step {} time (includes kernel compilation and autotuning on wgpu/cuda) | {:.3} s |\n| median step time (steps after the first) | {:.3} s |\n| median data wait | {:.4} s |\n",
        first.step,
        last.step,
        first.loss,
        last.loss,
        first.step,
        first.step_time_s,
        median_by(records, 1, |r| r.step_time_s),
        median_by(records, 1, |r| r.data_wait_s),
    ));
    s.push_str("\n## Memory (max over steps after the first)\n\n| quantity | bytes | human |\n|---|---:|---:|\n");
    let rows: [(&str, u64); 9] = [
        ("peak allocated, forward", max(|r| r.peak_forward_bytes)),
        ("peak allocated, backward", max(|r| r.peak_backward_bytes)),
        ("peak allocated, optimizer", max(|r| r.peak_optimizer_bytes)),
        ("peak allocated, step", max(|r| r.peak_step_bytes)),
        ("peak reserved", max(|r| r.peak_reserved_bytes)),
        ("parameters", max(|r| r.param_bytes)),
        ("gradients", max(|r| r.grad_bytes)),
        ("optimizer state", max(|r| r.optimizer_state_bytes)),
        ("activations (fwd peak − live before)", max(|r| r.activation_bytes)),
    ];
    for (k, v) in rows {
        s.push_str(&format!("| {k} | {v} | {} |\n", human(v)));
    }
    if let Some(v) = steady.iter().filter_map(|r| r.peak_device_used_bytes).max() {
        s.push_str(&format!("| device used, NVML (what nvidia-smi shows; whole device, sampled) | {v} | {} |\n", human(v)));
    }
    if let Some(v) = steady.iter().filter_map(|r| r.loader_peak_bytes).max() {
        s.push_str(&format!("| data loader host memory (workers + prefetch queue; not in the rows above) | {v} | {} |\n", human(v)));
    }
    s.push_str(&kernels_markdown(records));
    s
}

/// The summary's kernel section (CubeCL backends; empty when no step counted kernels): step 1
/// against the steady steps.
fn kernels_markdown(records: &[StepRecord]) -> String {
    let Some(k1) = records.first().and_then(|r| r.kernels.as_ref()) else {
        return String::new();
    };
    let first = &records[0];
    let rest: Vec<&StepRecord> = records.iter().skip(1).filter(|r| r.kernels.is_some()).collect();
    let median = |f: fn(&KernelStep) -> f64| {
        let mut v: Vec<f64> = rest.iter().filter_map(|r| r.kernels.as_ref().map(f)).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied()
    };
    let sum = |f: fn(&KernelStep) -> u64| rest.iter().filter_map(|r| r.kernels.as_ref().map(f)).sum::<u64>();
    let cell = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.0}"));
    let mut s = format!(
        "\n## Kernels (CubeCL)\n\n| | step {} | steps after the first |\n|---|---:|---:|\n| kernel launches (per step; after the first: median) | {} | {} |\n| kernels compiled (after the first: total) | {} | {} |\n| kernels read from the disk cache (CUDA PTX) | {} | {} |\n| autotune searches | {} | {} |\n| autotune time, s (compiling + benchmarking the candidates) | {:.2} | {:.2} |\n",
        first.step,
        k1.kernel_launches,
        cell(median(|k| k.kernel_launches as f64)),
        k1.kernels_compiled,
        sum(|k| k.kernels_compiled),
        k1.kernels_from_cache,
        sum(|k| k.kernels_from_cache),
        k1.autotune_searches,
        sum(|k| k.autotune_searches),
        k1.autotune_s,
        rest.iter().filter_map(|r| r.kernels.as_ref().map(|k| k.autotune_s)).sum::<f64>(),
    );
    if !rest.is_empty() {
        let steady = median_by(records, 1, |r| r.step_time_s);
        s.push_str(&format!(
            "\nStep {} took {:.2} s more than the median later step: kernel compilation, autotuning ({:.2} s of it, measured) and first allocations (the rest, inferred, not measured apart). Launches are counted from CubeCL's profiling log (level `minimal`); compilations and autotune searches from its compile and autotune messages (`vramlab_probe::kernels`).\n",
            first.step,
            first.step_time_s - steady,
            k1.autotune_s,
        ));
    }
    let steady = if rest.is_empty() { &records[..1] } else { &records[1..] };
    s.push_str(&top_kernels_markdown(steady));
    s.push_str(&kernel_time_markdown(steady));
    s
}

/// The kernels with the most time in the given steps (the steady ones), where kernels were timed
/// (`VRAMLAB_KERNEL_ACCOUNTING=time`): seconds per step (mean over the steps), share of all timed
/// kernel time, and launches per step. Empty when no step was timed.
fn kernel_time_markdown(steps: &[StepRecord]) -> String {
    let ks: Vec<(&StepRecord, &KernelStep)> = steps.iter().filter_map(|r| Some((r, r.kernels.as_ref()?))).filter(|(_, k)| k.kernel_time_s.is_some()).collect();
    if ks.is_empty() {
        return String::new();
    }
    let n = ks.len() as f64;
    let mut sums: Vec<(&str, f64)> = Vec::new();
    for (_, k) in &ks {
        for (name, t) in &k.top_kernel_time {
            match sums.iter_mut().find(|(s, _)| s == name) {
                Some(e) => e.1 += t,
                None => sums.push((name, *t)),
            }
        }
    }
    sums.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let total: f64 = ks.iter().filter_map(|(_, k)| k.kernel_time_s).sum();
    let step_s: f64 = ks.iter().map(|(r, _)| r.step_time_s).sum();
    let launches = |name: &str| -> String {
        let all: Vec<u64> = ks.iter().filter_map(|(_, k)| k.top_kernels.iter().find(|(k, _)| k == name).map(|e| e.1)).collect();
        if all.len() == ks.len() { format!("{:.0}", all.iter().sum::<u64>() as f64 / n) } else { "–".into() }
    };
    let (first, last) = (ks[0].0.step, ks[ks.len() - 1].0.step);
    let span = if first == last { format!("step {first}") } else { format!("steps {first}–{last}") };
    let mut s = format!(
        "\n### Time by kernel ({span}; seconds per step, mean)\n\nKernels timed one by one (`VRAMLAB_KERNEL_ACCOUNTING=time`: CubeCL's profiling level `basic`). Timing changes the step: CubeCL wraps each launch in `ComputeClient::profile`, which flushes the work before it (or synchronises the device, where the adapter has no timestamp queries) and submits the kernel alone, so kernels never overlap or share a submission and the timed step ({:.2} s per step here) is slower than an untimed one. A kernel's time is its device timestamps (or the host's wall time between the syncs): where the step goes, kernel by kernel. Timed kernels: {:.2} s per step, {:.0} % of the step; the rest is host work between kernels (Burn's graph, the autodiff tape, allocation, the probe's syncs). Each step records its {TOP_KERNELS_PER_STEP} costliest kernels (`top_kernel_time` in metrics.jsonl).\n\n| kernel | s/step | share of kernel time | launches/step |\n|---|---:|---:|---:|\n",
        step_s / n,
        total / n,
        100.0 * total / step_s.max(f64::MIN_POSITIVE),
    );
    let mut shown = 0.0;
    for (name, t) in sums.iter().take(TOP_KERNELS_IN_SUMMARY) {
        shown += t;
        s.push_str(&format!("| `{}` | {:.4} | {:.1} % | {} |\n", name.replace('|', "\\|"), t / n, 100.0 * t / total.max(f64::MIN_POSITIVE), launches(name)));
    }
    let other = (total - shown).max(0.0);
    s.push_str(&format!("| all other kernels | {:.4} | {:.1} % | |\n| **all timed kernels** | {:.4} | 100 % | |\n", other / n, 100.0 * other / total.max(f64::MIN_POSITIVE), total / n));
    s
}

/// The kernels launched most in the given steps (the steady ones): launches per step (mean over
/// the steps) and their share of all launches. Empty when no step lists its kernels.
fn top_kernels_markdown(steps: &[StepRecord]) -> String {
    let ks: Vec<&KernelStep> = steps.iter().filter_map(|r| r.kernels.as_ref()).filter(|k| !k.top_kernels.is_empty()).collect();
    if ks.is_empty() {
        return String::new();
    }
    let n = ks.len() as f64;
    let mut sums: Vec<(&str, u64)> = Vec::new();
    for k in &ks {
        for (name, c) in &k.top_kernels {
            match sums.iter_mut().find(|(s, _)| s == name) {
                Some(e) => e.1 += c,
                None => sums.push((name, *c)),
            }
        }
    }
    sums.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let total: u64 = ks.iter().map(|k| k.kernel_launches).sum();
    let (first, last) = (steps[0].step, steps[steps.len() - 1].step);
    let span = if first == last { format!("step {first}") } else { format!("steps {first}–{last}") };
    let mut s = format!(
        "\n### Most launched kernels ({span}; launches per step, mean)\n\nEach step records its {TOP_KERNELS_PER_STEP} most launched kernels (`top_kernels` in metrics.jsonl; names as CubeCL logs them, long ones cut after 4 parts).\n\n| kernel | launches/step | share |\n|---|---:|---:|\n"
    );
    let mut shown = 0;
    for (name, c) in sums.iter().take(TOP_KERNELS_IN_SUMMARY) {
        shown += c;
        s.push_str(&format!("| `{}` | {:.0} | {:.1} % |\n", name.replace('|', "\\|"), *c as f64 / n, 100.0 * *c as f64 / total.max(1) as f64));
    }
    let other = total.saturating_sub(shown);
    s.push_str(&format!("| all other kernels | {:.0} | {:.1} % |\n| **all** | {:.0} | 100 % |\n", other as f64 / n, 100.0 * other as f64 / total.max(1) as f64, total as f64 / n));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(step: u64, kernels: Option<KernelStep>) -> StepRecord {
        let line = format!(
            r#"{{"step":{step},"loss":1.0,"loss_parts":[],"lr":0.001,"grad_norm":1.0,"step_time_s":{},"data_wait_s":0.0,"forward_time_s":0.1,"backward_time_s":0.1,"optimizer_time_s":0.1,"live_before_forward_bytes":0,"peak_forward_bytes":0,"peak_backward_bytes":0,"peak_optimizer_bytes":0,"peak_step_bytes":0,"peak_reserved_bytes":0,"param_bytes":0,"grad_bytes":0,"optimizer_state_bytes":0,"activation_bytes":0,"samples":1}}"#,
            if step == 1 { 10.0 } else { 1.0 }
        );
        StepRecord { kernels, ..serde_json::from_str(&line).unwrap() }
    }

    #[test]
    fn kernel_fields_are_flat_in_the_jsonl_and_absent_without_counts() {
        let k = KernelStep { kernel_launches: 812, kernels_compiled: 95, kernels_from_cache: 0, autotune_searches: 6, autotune_s: 4.5, top_kernels: vec![("Matmul<f32>".into(), 700), ("Copy".into(), 12)], kernel_time_s: None, top_kernel_time: vec![] };
        let line = serde_json::to_string(&record(1, Some(k.clone()))).unwrap();
        assert!(line.contains(r#""kernel_launches":812"#) && line.contains(r#""kernels_compiled":95"#), "{line}");
        assert!(line.contains(r#""top_kernels":[["Matmul<f32>",700],["Copy",12]]"#), "{line}");
        assert_eq!(serde_json::from_str::<StepRecord>(&line).unwrap().kernels, Some(k));
        let flex = serde_json::to_string(&record(1, None)).unwrap();
        assert!(!flex.contains("kernel"), "{flex}");
        assert!(!line.contains("kernel_time"), "untimed: {line}");
        assert_eq!(serde_json::from_str::<StepRecord>(&flex).unwrap().kernels, None);
    }

    #[test]
    fn the_summary_shows_step_one_against_the_later_steps_only_when_kernels_were_counted() {
        let k = |launches, compiled, tune| Some(KernelStep { kernel_launches: launches, kernels_compiled: compiled, kernels_from_cache: 0, autotune_searches: compiled / 10, autotune_s: tune, top_kernels: vec![], kernel_time_s: None, top_kernel_time: vec![] });
        let records = vec![record(1, k(900, 120, 3.0)), record(2, k(500, 2, 0.0)), record(3, k(502, 0, 0.0)), record(4, k(498, 0, 0.0))];
        let md = summary_markdown("t", &[], &records);
        assert!(md.contains("## Kernels (CubeCL)"), "{md}");
        assert!(md.contains("| kernel launches (per step; after the first: median) | 900 | 500 |"), "{md}");
        assert!(md.contains("| kernels compiled (after the first: total) | 120 | 2 |"), "{md}");
        assert!(md.contains("took 9.00 s more than the median later step"), "{md}");
        assert!(!md.contains("Most launched"), "no step listed its kernels: {md}");
        let flex: Vec<StepRecord> = records.into_iter().map(|r| StepRecord { kernels: None, ..r }).collect();
        assert!(!summary_markdown("t", &[], &flex).contains("Kernels"));
    }

    #[test]
    fn a_step_keeps_its_most_launched_kernels_by_short_name() {
        let counts = |v: &[(&str, u64)]| vramlab_probe::KernelCounts { launches: v.iter().map(|(_, n)| n).sum(), by_kernel: v.iter().map(|(k, n)| (k.to_string(), *n)).collect(), ..Default::default() };
        let before = counts(&[("a::Mm<f32>", 5), ("a::Copy", 1)]);
        let mut after: Vec<(String, u64)> = (0..30).map(|i| (format!("k::K{i:02}"), i + 1)).collect();
        after.extend([("a::Mm<f32>".to_string(), 105), ("b::Mm<f32>".to_string(), 7), ("a::Copy".to_string(), 1)]);
        let after = counts(&after.iter().map(|(k, n)| (k.as_str(), *n)).collect::<Vec<_>>());
        let k = KernelStep::between(before, after);
        assert_eq!(k.kernel_launches, (1..=30).sum::<u64>() + 100 + 7);
        assert_eq!(k.top_kernels.len(), TOP_KERNELS_PER_STEP);
        // `a::Mm<f32>` and `b::Mm<f32>` are one short name; `Copy` had no launch in the step.
        assert_eq!(k.top_kernels[0], ("Mm<f32>".to_string(), 107));
        assert_eq!(k.top_kernels[1], ("K29".to_string(), 30));
        assert!(k.top_kernels.iter().all(|(name, _)| name != "Copy"));
    }

    #[test]
    fn the_summary_lists_the_steady_steps_most_launched_kernels() {
        let k = |top: &[(&str, u64)], other: u64| Some(KernelStep { kernel_launches: top.iter().map(|(_, n)| n).sum::<u64>() + other, kernels_compiled: 0, kernels_from_cache: 0, autotune_searches: 0, autotune_s: 0.0, top_kernels: top.iter().map(|(k, n)| (k.to_string(), *n)).collect(), kernel_time_s: None, top_kernel_time: vec![] });
        let mut top: Vec<(String, u64)> = (0..16).map(|i| (format!("K{i:02}"), 100 - i)).collect();
        top.push(("Or|Pipe".into(), 200));
        let top: Vec<(&str, u64)> = top.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        // Step 1 (autotune's launches) is not in the table; a kernel missing from a step counts 0.
        let records = vec![record(1, k(&[("Tune", 9000)], 0)), record(2, k(&top, 50)), record(3, k(&top[1..], 50))];
        let md = summary_markdown("t", &[], &records);
        assert!(md.contains("### Most launched kernels (steps 2–3; launches per step, mean)"), "{md}");
        assert!(!md.contains("`Tune`"), "{md}");
        assert!(md.contains("| `Or\\|Pipe` | 200 |"), "{md}");
        // K00: 100 launches in step 2, none in step 3: 50 per step, below the 15 shown.
        assert!(md.contains("| `K14` | 86 |") && !md.contains("`K15`") && !md.contains("`K00`"), "15 rows only: {md}");
        let all = (records[1].kernels.as_ref().unwrap().kernel_launches + records[2].kernels.as_ref().unwrap().kernel_launches) as f64 / 2.0;
        assert!(md.contains(&format!("| **all** | {all:.0} | 100 % |")), "{md}");
    }

    #[test]
    fn timed_kernels_are_recorded_by_short_name_and_tabled_by_time() {
        let counts = |t: &[(&str, f64)]| vramlab_probe::KernelCounts { launches: 10, by_kernel: t.iter().map(|(k, _)| (k.to_string(), 5)).collect(), time_by_kernel: t.iter().map(|(k, s)| (k.to_string(), *s)).collect(), ..Default::default() };
        let before = counts(&[("a::Conv<f32>", 1.0)]);
        let after = counts(&[("a::Conv<f32>", 1.25), ("b::Conv<f32>", 0.5), ("x::Add", 0.125)]);
        let k = KernelStep::between(before, after);
        // `a::Conv` and `b::Conv` shorten to one name: 0.25 s in the step (1.0 s before it) + 0.5 s.
        assert_eq!(k.top_kernel_time, vec![("Conv<f32>".to_string(), 0.75), ("Add".to_string(), 0.125)]);
        assert_eq!(k.kernel_time_s, Some(0.875));
        let line = serde_json::to_string(&record(2, Some(k.clone()))).unwrap();
        assert!(line.contains(r#""kernel_time_s":0.875"#) && line.contains(r#""top_kernel_time":[["Conv<f32>",0.75],["Add",0.125]]"#), "{line}");
        let mut slow = k.clone();
        slow.top_kernel_time[0].1 = 1.75;
        slow.kernel_time_s = Some(1.875);
        // Step 1 is not tabled; steps 2 and 3 (1 s each) have 0.875 and 1.875 s of kernels.
        let md = summary_markdown("t", &[], &[record(1, Some(KernelStep { kernel_time_s: Some(100.0), top_kernel_time: vec![("Tune".into(), 100.0)], ..k.clone() })), record(2, Some(k)), record(3, Some(slow))]);
        assert!(md.contains("### Time by kernel (steps 2–3; seconds per step, mean)"), "{md}");
        assert!(md.contains("Timing changes the step"), "{md}");
        assert!(md.contains("Timed kernels: 1.38 s per step, 138 % of the step"), "{md}");
        assert!(md.contains("| `Conv<f32>` | 1.2500 | 90.9 % | 5 |"), "{md}");
        assert!(md.contains("| `Add` | 0.1250 | 9.1 % | 5 |") && !md.contains("`Tune`"), "{md}");
        assert!(md.contains("| **all timed kernels** | 1.3750 | 100 % | |"), "{md}");
        // Untimed runs have no such table.
        let untimed = |r: StepRecord| StepRecord { kernels: r.kernels.map(|k| KernelStep { kernel_time_s: None, top_kernel_time: vec![], ..k }), ..r };
        assert!(!summary_markdown("t", &[], &[untimed(record(1, None)), untimed(record(2, Some(KernelStep::between(Default::default(), Default::default()))))]).contains("Time by kernel"));
    }
}
