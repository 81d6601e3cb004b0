//! `vramlab estimate`: the predicted peak memory of a config's training step, from shapes
//! alone. Prints the markdown report; with `--output_dir` also writes `estimate.json` and
//! `estimate.md` there.

use anyhow::Result;
use vramlab_workloads::RunConfig;

pub fn run(cfg: &RunConfig) -> Result<()> {
    let est = vramlab_workloads::estimate(cfg)?;
    let md = est.markdown();
    print!("{md}");
    if let Some(dir) = &cfg.output_dir {
        super::write_estimate(dir, &est, &md)?;
    }
    Ok(())
}
