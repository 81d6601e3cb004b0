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
    s
}
