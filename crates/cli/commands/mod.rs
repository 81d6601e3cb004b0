//! One module per subcommand; each turns parsed args into a validated config and calls the
//! workloads library.

mod bench_inference;
mod dataset;
mod estimate;
mod fit;
mod paper;
mod info;
mod train;

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use vramlab_workloads::{PredictRequest, RunConfig, config};

use crate::args::{Cli, Command, RunArgs};

/// The run config of a command: file, then top-level flags, then dotted overrides.
fn run_config(run: &RunArgs, overrides: &[(String, String)]) -> Result<RunConfig> {
    let all = all_overrides(run, overrides);
    let cfg = config::load(run.config.as_deref(), &all)?;
    // lerobot keys mapped or ignored: said before anything runs (what concerns training only,
    // `RunConfig::training_notes`, the commands that train print).
    for note in &cfg.notes {
        eprintln!("{note}");
    }
    Ok(cfg)
}

fn all_overrides(run: &RunArgs, overrides: &[(String, String)]) -> Vec<(String, String)> {
    let mut all = run.flags.overrides();
    all.extend(overrides.iter().cloned());
    all
}

/// `estimate.json` and `estimate.md` in `dir` (created), for both estimators: a training
/// config's ([`estimate`]) and a model on paper's ([`paper`]).
fn write_estimate(dir: &Path, report: &impl Serialize, md: &str) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let json = serde_json::to_string_pretty(report).context("estimate to JSON")?;
    std::fs::write(dir.join("estimate.json"), json).with_context(|| format!("cannot write {}", dir.join("estimate.json").display()))?;
    std::fs::write(dir.join("estimate.md"), md).with_context(|| format!("cannot write {}", dir.join("estimate.md").display()))?;
    Ok(())
}

/// The exit status of a command that returned `Ok`: 0, or 128 + the signal that stopped a
/// training run after its checkpoint (130 for Ctrl-C, 143 for SIGTERM).
pub fn ok_exit_code() -> u8 {
    train::interrupt_exit_code().unwrap_or(0)
}

pub fn run(cli: Cli) -> Result<()> {
    let overrides = &cli.overrides;
    match &cli.command {
        Command::Train(run) => train::run(run_config(run, overrides)?),
        Command::Warmup(run) => train::warmup(run_config(run, overrides)?),
        Command::Info(run) => info::run(&run_config(run, overrides)?),
        Command::ProbeCheck(run) => {
            let check = vramlab_workloads::probe_check::run(&run_config(run, overrides)?)?;
            print!("{}", check.markdown());
            anyhow::ensure!(check.passed(), "probe-check: the {} probe disagrees with the known pattern", check.backend);
            Ok(())
        }
        Command::Estimate(e) => match e.run.config.as_deref().filter(|f| paper::is_paper(f)) {
            Some(file) => estimate::refuse_target_for_paper(&e.target).and_then(|_| paper::run(file, &all_overrides(&e.run, overrides))),
            None => estimate::run(&run_config(&e.run, overrides)?, &e.target),
        },
        Command::Sweep(run) => {
            let exe = std::env::current_exe().context("cannot find the vramlab executable")?;
            let all = all_overrides(run, overrides);
            let command_line = std::env::args().collect::<Vec<_>>().join(" ");
            let spec = vramlab_workloads::sweep::SweepSpec { exe: &exe, config_file: run.config.as_deref(), overrides: &all, command_line };
            vramlab_workloads::sweep::run(&spec)?;
            Ok(())
        }
        Command::Fit(f) => fit::run(f, overrides),
        Command::Predict(p) => {
            let cfg = run_config(&p.run, overrides)?;
            let req = PredictRequest { checkpoint: p.checkpoint.clone(), inputs: p.inputs.clone(), out: p.out.clone() };
            for (name, shape) in vramlab_workloads::predict(&req, &cfg)? {
                eprintln!("{name}: {shape:?}");
            }
            eprintln!("wrote {}", p.out.display());
            Ok(())
        }
        Command::BenchInference(b) => bench_inference::run(b),
        Command::Dataset(d) => dataset::run(d),
        Command::Completions { shell } => {
            crate::args::completions(*shell);
            Ok(())
        }
    }
}
