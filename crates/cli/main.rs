//! `vramlab`: train, measure and sweep memory-hungry robot-learning workloads on Burn.
//!
//! The binary is thin: flags → [`config::RunConfig`] → a command. Models, data, the trainer and
//! the memory probe live in the library crates under `crates/`.

mod backend;
mod commands;
mod config;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use vramlab_probe::CountingAllocator;

/// Counts every heap byte: on CPU backends this is the device memory the probe reports.
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const USAGE: &str = "\
vramlab — memory-instrumented training on Burn

USAGE:
  vramlab train   [--config FILE] [--policy.type=vae3d|act|diffusion] [--policy.<field>=V] [--dataset.<field>=V]
                  [--batch_size=N] [--steps=N] [--grad_accum_steps=N] [--output_dir=DIR]
                  [--num_workers=N] [--prefetch_factor=N] [--persistent_workers]
                  [--backend=flex|wgpu|cuda] [--precision=f32|bf16|f16]
                  [--gradient_checkpointing=off|blocks|balanced] [--seed=N] [--resume]
  vramlab info    [--config FILE] [--policy.type=…] [overrides]   parameter counts, static bytes
  vramlab sweep   --config FILE --sweep.<field>=v1,v2,… [overrides] grid of measured runs → CSV + markdown
  vramlab predict --checkpoint DIR --inputs FILE.safetensors --out FILE.safetensors [--backend=…]
  vramlab dataset info PATH                                        a LeRobot v2.1/v3.0 dataset
  vramlab dataset bench PATH [--samples=N] [--workers=0,1,2]       loader throughput per worker count
  vramlab dataset generate PATH [--episodes=N] [--image_size=96]   record the built-in push demonstrations

Any config field can be set as --a.b.c=value (lists: 1,2,4). Unknown names are errors.
";

/// Parsed command line: the command, `--config`, and every other `--key=value`.
pub struct Cli {
    pub command: String,
    /// Positional words after the command (`dataset info PATH`).
    pub positional: Vec<String>,
    pub config: Option<PathBuf>,
    pub overrides: Vec<(String, String)>,
}

fn parse_args(args: Vec<String>) -> Result<Cli> {
    let mut it = args.into_iter().peekable();
    let Some(command) = it.next() else { bail!("no command given\n\n{USAGE}") };
    if command == "--help" || command == "-h" || command == "help" {
        bail!("{USAGE}");
    }
    let mut config = None;
    let mut overrides = Vec::new();
    let mut positional = Vec::new();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            if command == "dataset" {
                positional.push(arg);
                continue;
            }
            bail!("unexpected argument `{arg}` (flags look like --name=value)\n\n{USAGE}")
        };
        let (key, value) = match flag.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => match it.peek() {
                Some(next) if !next.starts_with("--") => (flag.to_string(), it.next().unwrap_or_default()),
                // A bare flag is a boolean switch (`--resume`).
                _ => (flag.to_string(), "true".to_string()),
            },
        };
        if key == "help" {
            bail!("{USAGE}");
        }
        if key == "config" || key == "config_path" {
            config = Some(PathBuf::from(value));
        } else {
            overrides.push((key, value));
        }
    }
    Ok(Cli { command, positional, config, overrides })
}

fn run() -> Result<()> {
    let cli = parse_args(std::env::args().skip(1).collect())?;
    match cli.command.as_str() {
        "train" => commands::train::run(&cli),
        "info" => commands::info::run(&cli),
        "sweep" => commands::sweep::run(&cli),
        "predict" => commands::predict::run(&cli),
        "dataset" => commands::dataset::run(&cli, &cli.positional),
        other => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = format!("{e:#}");
            if msg.starts_with("vramlab —") {
                println!("{msg}");
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
    }
}
