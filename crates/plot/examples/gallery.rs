//! Every chart from made-up numbers, written as SVG into a directory: a quick look at the
//! layouts without a training run.
//!
//! `cargo run -p vramlab-plot --example gallery -- /tmp/gallery`

use std::path::PathBuf;

use vramlab_plot::{Breakdown, Candidate, StepMemory};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "gallery".into()));
    std::fs::create_dir_all(&dir)?;
    let steps: Vec<StepMemory> = (1..=24)
        .map(|s| {
            let act = 900 * MIB + (s % 3) * 20 * MIB;
            StepMemory {
                step: s,
                peak_forward: 700 * MIB + act,
                peak_backward: 1100 * MIB + act / 2,
                peak_optimizer: 1000 * MIB,
                peak_step: 1100 * MIB + act / 2,
                peak_reserved: 2300 * MIB,
                parameters: 250 * MIB,
                gradients: 250 * MIB,
                optimizer_state: if s == 1 { 0 } else { 500 * MIB },
                activations: act,
            }
        })
        .collect();
    let write = |name: &str, svg: String| std::fs::write(dir.join(name), svg);
    write("memory.svg", vramlab_plot::memory_per_step("vramlab run: runs/example", &steps)?)?;
    write("memory_breakdown.svg", vramlab_plot::stacked_breakdown("vramlab run: runs/example — memory breakdown", &steps)?)?;
    let series: Vec<(String, Vec<(f64, f64)>)> = [
        ("precision=f32, gradient_checkpointing=off", 1.0),
        ("precision=bf16, gradient_checkpointing=off", 0.55),
        ("precision=bf16, gradient_checkpointing=blocks", 0.3),
    ]
    .into_iter()
    .map(|(l, k)| (l.to_string(), [1.0, 2.0, 4.0, 8.0, 16.0, 32.0].iter().map(|&b| (b, (300.0 + k * 160.0 * b) * MIB as f64)).collect()))
    .collect();
    write("sweep_peak.svg", vramlab_plot::sweep_peak_vs_batch("vramlab sweep: peak allocated vs batch size", "batch_size", "", &series, Some(4 * GIB))?)?;
    let points: Vec<(String, Breakdown)> = series
        .iter()
        .flat_map(|(l, pts)| pts.iter().map(move |(b, y)| (format!("batch_size={b} {l}"), *y)))
        .map(|(l, y)| {
            (
                l,
                Breakdown {
                    parameters: 100 * MIB,
                    gradients: 100 * MIB,
                    optimizer_state: 200 * MIB,
                    activations: (y as u64).saturating_sub(350 * MIB),
                    peak: y as u64,
                },
            )
        })
        .collect();
    write("sweep_breakdown.svg", vramlab_plot::stacked_bars("vramlab sweep: memory breakdown per point", "", &points)?)?;
    let cands = vec![
        Candidate { label: "batch 16, f32".into(), peak_bytes: 11 * GIB, fits: true, oom: false, samples_per_s: Some(310.0) },
        Candidate { label: "batch 32, bf16".into(), peak_bytes: 14 * GIB, fits: true, oom: false, samples_per_s: Some(640.0) },
        Candidate { label: "batch 64, bf16".into(), peak_bytes: 0, fits: false, oom: true, samples_per_s: None },
        Candidate { label: "batch 64, bf16, checkpointing".into(), peak_bytes: 15 * GIB, fits: true, oom: false, samples_per_s: Some(505.2) },
        Candidate { label: "batch 128, bf16, checkpointing".into(), peak_bytes: 19 * GIB, fits: false, oom: false, samples_per_s: None },
    ];
    write("fit.svg", vramlab_plot::fit_candidates("vramlab fit: candidates for a 16 GiB budget", &cands, 16 * GIB)?)?;
    eprintln!("wrote 5 charts to {}", dir.display());
    Ok(())
}
