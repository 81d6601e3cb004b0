//! `vramlab estimate`: the predicted peak memory of a config's training step, from shapes
//! alone. Prints the markdown report; with `--output_dir` also writes `estimate.json` and
//! `estimate.md` there.

use anyhow::{Context, Result};
use vramlab_workloads::RunConfig;

pub fn run(cfg: &RunConfig) -> Result<()> {
    let est = vramlab_workloads::estimate::estimate(cfg)?;
    let md = est.markdown();
    print!("{md}");
    if let Some(dir) = &cfg.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let json = serde_json::to_string_pretty(&est).context("estimate to JSON")?;
        std::fs::write(dir.join("estimate.json"), json).with_context(|| format!("cannot write {}", dir.join("estimate.json").display()))?;
        std::fs::write(dir.join("estimate.md"), md).with_context(|| format!("cannot write {}", dir.join("estimate.md").display()))?;
    }
    Ok(())
}
