//! `vramlab bench-inference`: per-call `select_action` latency of a policy checkpoint at a fixed
//! control rate (the workloads library's [`vramlab_workloads::bench_inference`] over
//! [`vramlab_workloads::inference`]).

use anyhow::Result;
use vramlab_workloads::config;
use vramlab_workloads::inference::{BenchRequest, Machine, ModeChoice};

use crate::args::{BenchInferenceArgs, ModeArg};

pub fn run(a: &BenchInferenceArgs) -> Result<()> {
    // --backend/--device/--precision are the run config's fields: the same parsing and errors
    // as `vramlab train`.
    let fields = [("backend", &a.backend), ("device", &a.device), ("precision", &a.precision)];
    let overrides: Vec<(String, String)> = fields.iter().filter_map(|(k, v)| v.as_ref().map(|v| (k.to_string(), v.clone()))).collect();
    let cfg = config::load(None, &overrides)?;
    let req = BenchRequest {
        checkpoint: a.checkpoint.clone(),
        fps: a.fps,
        calls: a.calls,
        warmup: a.warmup,
        modes: match a.mode {
            ModeArg::Both => ModeChoice::Both,
            ModeArg::Queue => ModeChoice::Queue,
            ModeArg::Ensemble => ModeChoice::Ensemble,
        },
        n_action_steps: a.n_action_steps.map(|n| n as usize),
        temporal_ensemble_coeff: a.temporal_ensemble_coeff,
        precision: cfg.precision,
        seed: a.seed,
    };
    let machine = Machine::read();
    eprintln!("{}", machine.line());
    if let Some(w) = machine.governor.warning() {
        eprintln!("\n{w}\n");
    }
    let report = vramlab_workloads::bench_inference(&req, cfg.backend, cfg.device, machine)?;
    for line in report.header() {
        println!("{line}");
    }
    println!("\n{}", report.table());
    for note in &report.notes {
        println!("note: {note}");
    }
    if let Some(w) = report.machine.governor.warning() {
        println!("\n{w}");
    }
    if let Some(dir) = &a.out {
        let command_line = std::env::args().collect::<Vec<_>>().join(" ");
        report.write(dir, &command_line)?;
        eprintln!("wrote {} and {}", dir.join("latency.jsonl").display(), dir.join("summary.md").display());
    }
    Ok(())
}
