//! The run's pictures next to `summary.md`: `memory.svg` (peaks per phase over the steps) and
//! `memory_breakdown.svg` (what each step's peak is made of).
//!
//! A picture that cannot be drawn or written is a warning, never a failed run.

use std::path::Path;

use vramlab_plot::StepMemory;

use crate::metrics::StepRecord;

/// The memory fields of a step record, as the plot crate takes them.
pub fn step_memory(r: &StepRecord) -> StepMemory {
    StepMemory {
        step: r.step,
        peak_forward: r.peak_forward_bytes,
        peak_backward: r.peak_backward_bytes,
        peak_optimizer: r.peak_optimizer_bytes,
        peak_step: r.peak_step_bytes,
        peak_reserved: r.peak_reserved_bytes,
        parameters: r.param_bytes,
        gradients: r.grad_bytes,
        optimizer_state: r.optimizer_state_bytes,
        activations: r.activation_bytes,
    }
}

/// Write `memory.svg` and `memory_breakdown.svg` into the run directory `dir` (titled with its
/// name); returns the markdown that shows the ones written (empty when there are no records or
/// none could be written).
pub fn write_memory_plots(dir: &Path, records: &[StepRecord]) -> String {
    if records.is_empty() {
        return String::new();
    }
    let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
    let title = format!("vramlab run {name}");
    let steps: Vec<StepMemory> = records.iter().map(step_memory).collect();
    let charts = [
        ("memory.svg", "memory per step", vramlab_plot::memory_per_step(&format!("{title}: memory per step"), &steps)),
        ("memory_breakdown.svg", "memory breakdown per step", vramlab_plot::stacked_breakdown(&format!("{title}: what the peak is made of"), &steps)),
    ];
    let mut md = String::new();
    for (file, alt, svg) in charts {
        let path = dir.join(file);
        match svg.map_err(|e| e.to_string()).and_then(|s| std::fs::write(&path, s).map_err(|e| e.to_string())) {
            Ok(()) => md.push_str(&format!("\n![{alt}]({file})\n")),
            Err(e) => eprintln!("warning: {}: {e} (the run itself is fine)", path.display()),
        }
    }
    if md.is_empty() { md } else { format!("\n## Pictures\n{md}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(step: u64) -> StepRecord {
        StepRecord {
            step,
            loss: 1.0,
            loss_parts: vec![],
            lr: 1e-3,
            grad_norm: 1.0,
            step_time_s: 0.1,
            data_wait_s: 0.0,
            forward_time_s: 0.03,
            backward_time_s: 0.05,
            optimizer_time_s: 0.02,
            live_before_forward_bytes: 3 << 20,
            peak_forward_bytes: 10 << 20,
            peak_backward_bytes: 12 << 20,
            peak_optimizer_bytes: 6 << 20,
            peak_step_bytes: 12 << 20,
            peak_reserved_bytes: 20 << 20,
            param_bytes: 1 << 20,
            grad_bytes: 1 << 20,
            optimizer_state_bytes: 2 << 20,
            activation_bytes: 7 << 20,
            samples: 4,
            loss_scale: None,
            loader_peak_bytes: None,
            peak_device_used_bytes: None,
            kernels: None,
            skipped: false,
        }
    }

    #[test]
    fn writes_both_pictures_and_links_them() {
        let dir = vramlab_testkit::temp_dir("train-plots");
        let md = write_memory_plots(dir.path(), &[record(1), record(2)]);
        assert!(md.contains("![memory per step](memory.svg)"), "{md}");
        assert!(md.contains("](memory_breakdown.svg)"), "{md}");
        for f in ["memory.svg", "memory_breakdown.svg"] {
            assert!(std::fs::read_to_string(dir.path().join(f)).unwrap().contains("</svg>"));
        }
    }

    #[test]
    fn an_unwritable_directory_is_only_a_warning() {
        let dir = vramlab_testkit::temp_dir("train-plots");
        let missing = dir.path().join("does/not/exist");
        assert_eq!(write_memory_plots(&missing, &[record(1)]), "");
        assert_eq!(write_memory_plots(dir.path(), &[]), "");
    }
}
