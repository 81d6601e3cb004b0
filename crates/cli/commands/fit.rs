//! `vramlab fit`: the budget parsed, the search run by the workloads library, the
//! recommendation printed (stdout: the command line alone, for scripts).

use anyhow::{Context, Result, bail};
use vramlab_workloads::fit::{self, FitSpec};

use crate::args::FitArgs;

pub fn run(args: &FitArgs, overrides: &[(String, String)]) -> Result<()> {
    let Some(budget) = vramlab_bytes::parse(&args.budget) else {
        bail!("--budget={}: not a byte count (e.g. 24GiB, 512MiB, 16GB)", args.budget);
    };
    if vramlab_workloads::torch_target::Target::parse(&args.target)? == vramlab_workloads::torch_target::Target::PytorchCuda {
        let cfg = super::run_config(&args.run, overrides)?;
        print!("{}", vramlab_workloads::torch_target::fit_batch(&cfg, budget, args.max_batch)?.markdown());
        return Ok(());
    }
    let exe = std::env::current_exe().context("cannot find the vramlab executable")?;
    let all = super::all_overrides(&args.run, overrides);
    let spec = FitSpec {
        exe: &exe,
        config_file: args.run.config.as_deref(),
        overrides: &all,
        budget,
        trial_steps: args.trial_steps,
        max_batch: args.max_batch,
        prune: if args.prune > 0.0 { args.prune } else { f64::INFINITY },
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
    };
    // The shape-only estimate prunes candidates far over the budget and is shown next to each
    // measurement; a config it cannot estimate is simply run.
    let estimate = |cfg: &vramlab_workloads::RunConfig| vramlab_workloads::estimate(cfg).ok().map(|e| e.peak_step_bytes);
    let outcome = fit::run(&spec, &estimate)?;
    if let Some(c) = outcome.command {
        println!("{c}");
    }
    Ok(())
}
