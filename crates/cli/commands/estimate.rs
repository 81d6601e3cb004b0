//! `vramlab estimate`: the predicted peak memory of a config's training step, from shapes
//! alone. Prints the markdown report; with `--output_dir` also writes `estimate.json` and
//! `estimate.md` there.

use anyhow::Result;
use vramlab_workloads::RunConfig;
use vramlab_workloads::torch_target::Target;

pub fn run(cfg: &RunConfig, target: &str) -> Result<()> {
    if Target::parse(target)? == Target::PytorchCuda {
        let est = vramlab_workloads::torch_target::estimate_torch(cfg)?;
        let md = est.markdown();
        print!("{md}");
        if let Some(dir) = &cfg.output_dir {
            super::write_estimate(dir, &est, &md)?;
        }
        return Ok(());
    }
    let est = vramlab_workloads::estimate(cfg)?;
    let md = est.markdown();
    print!("{md}");
    if let Some(dir) = &cfg.output_dir {
        super::write_estimate(dir, &est, &md)?;
    }
    Ok(())
}

/// A model on paper has no PyTorch graph: `--target=pytorch-cuda` is refused there.
pub fn refuse_target_for_paper(target: &str) -> Result<()> {
    anyhow::ensure!(Target::parse(target)? == Target::Vramlab, "--target=pytorch-cuda needs a training config (ACT, Diffusion, VAE); a `[paper]` config is estimated on paper only");
    Ok(())
}
