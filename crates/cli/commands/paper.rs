//! `vramlab estimate --config configs/estimate/F.toml`: a model described on paper (a generic
//! transformer / VLA, a `[paper]` table), estimated by `vramlab-paper` without Burn.

use std::path::Path;

use anyhow::{Result, bail};
use vramlab_paper as paper;

/// Whether `file` is a paper description rather than a training config.
pub fn is_paper(file: &Path) -> bool {
    std::fs::read_to_string(file).is_ok_and(|t| paper::is_paper_config(&t))
}

pub fn run(file: &Path, overrides: &[(String, String)]) -> Result<()> {
    let mut out_dir = None;
    for (k, v) in overrides {
        match k.as_str() {
            "output_dir" => out_dir = Some(v.clone()),
            _ => bail!("--{k}: {} describes a model on paper; change it in the file (flags apply to training configs only)", file.display()),
        }
    }
    let cfg = paper::PaperConfig::from_file(file)?;
    let report = paper::report(&cfg);
    let md = report.markdown();
    print!("{md}");
    if let Some(dir) = out_dir {
        super::write_estimate(Path::new(&dir), &report, &md)?;
    }
    Ok(())
}
