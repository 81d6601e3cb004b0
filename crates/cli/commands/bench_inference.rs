//! `vramlab bench-inference`: per-call `select_action` latency of a policy checkpoint at a fixed
//! control rate (the workloads library's [`vramlab_workloads::inference`]).

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};
use vramlab_workloads::config;
use vramlab_workloads::inference::{BenchRequest, Machine, ModeChoice};

#[derive(Args, Debug)]
pub struct BenchInferenceArgs {
    /// A policy `pretrained_model/` dir (config.json + model.safetensors), a checkpoint dir
    /// holding one (vramlab's `checkpoints/<step>/`), or a run's `checkpoints/` (its `last`).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// Control rate: one `select_action` call per 1/fps seconds (the frame budget).
    #[arg(long, default_value_t = 30.0)]
    pub fps: f64,
    /// Measured calls per mode.
    #[arg(long, default_value_t = 300)]
    pub calls: usize,
    /// Calls before the measured ones, excluded (then the policy is reset).
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// both: ACT's action queue and temporal ensembling (Diffusion: queue only).
    #[arg(long, value_enum, default_value_t = ModeArg::Both)]
    pub mode: ModeArg,
    /// Queue mode's actions per model call [default: the checkpoint's].
    #[arg(long = "n_action_steps", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub n_action_steps: Option<u64>,
    /// ACT ensembling weight decay wᵢ = exp(−coeff·i) [default: the checkpoint's, else 0.01];
    /// ensembling runs with n_action_steps = 1, as lerobot requires.
    #[arg(long = "temporal_ensemble_coeff", value_name = "C")]
    pub temporal_ensemble_coeff: Option<f64>,
    /// flex (CPU, default), wgpu or cuda — those compiled into this binary.
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,
    /// GPU index for wgpu / cuda [default: 0].
    #[arg(long, value_name = "N")]
    pub device: Option<String>,
    /// f32 (default), bf16 or f16: compute precision.
    #[arg(long, value_name = "P")]
    pub precision: Option<String>,
    /// Seed of the synthetic cameras, states and diffusion noise.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write `latency.jsonl` (one line per call) and `summary.md` here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    Both,
    Queue,
    Ensemble,
}

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
    let report = vramlab_workloads::inference::bench(&req, cfg.backend, cfg.device, machine)?;
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
