//! `vramlab dataset info PATH` and `vramlab dataset bench PATH`: what a LeRobot dataset holds
//! and how fast vramlab reads it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, anyhow, bail};
use vramlab_lerobot::{FeatureKind, LeRobotDataset, SampleOptions};

use crate::Cli;

pub fn run(cli: &Cli, args: &[String]) -> Result<()> {
    let (Some(sub), Some(path)) = (args.first(), args.get(1)) else {
        bail!("usage: vramlab dataset info PATH | vramlab dataset bench PATH [--samples=N] [--workers=1,2]");
    };
    let root = PathBuf::from(path);
    match sub.as_str() {
        "info" => info(&root),
        "bench" => {
            let mut samples = 64usize;
            let mut workers = vec![1usize, 2];
            for (k, v) in &cli.overrides {
                match k.as_str() {
                    "samples" => samples = v.parse().map_err(|_| anyhow!("--samples={v}: expected a number"))?,
                    "workers" => {
                        workers = v.split(',').map(|w| w.trim().parse().map_err(|_| anyhow!("--workers={v}: expected numbers"))).collect::<Result<_>>()?
                    }
                    other => bail!("dataset bench: unknown flag --{other}; valid: --samples, --workers"),
                }
            }
            bench(&root, samples, &workers)
        }
        other => bail!("dataset {other}: unknown; valid: info, bench"),
    }
}

fn info(root: &Path) -> Result<()> {
    let ds = LeRobotDataset::open(root)?;
    println!("{}", root.display());
    println!("  version   {:?}", ds.version());
    println!("  episodes  {}", ds.num_episodes());
    println!("  frames    {}", ds.num_frames());
    println!("  fps       {}", ds.fps());
    println!("  features:");
    for (k, f) in ds.features() {
        let extra = match f.kind() {
            FeatureKind::Video => {
                let codec = f.info.as_ref().and_then(|i| i.get("video.codec")).and_then(|c| c.as_str()).unwrap_or("?");
                let pix = f.info.as_ref().and_then(|i| i.get("video.pix_fmt")).and_then(|c| c.as_str()).unwrap_or("?");
                format!("video, codec {codec}, {pix}")
            }
            FeatureKind::Image => "image in parquet".into(),
            _ => String::new(),
        };
        println!("    {k:<32} {:<8} {:?} {extra}", f.dtype, f.shape);
    }
    Ok(())
}

/// Decoded frames/s (cameras) and samples/s (ACT-style samples: state, 100 actions, cameras)
/// with 1..N worker threads sharing the dataset.
fn bench(root: &Path, samples: usize, workers: &[usize]) -> Result<()> {
    let ds = Arc::new(LeRobotDataset::open(root)?);
    let n = ds.num_frames();
    let cams = ds.video_keys().len().max(1);
    println!("| workers | samples | seconds | samples/s | decoded frames/s |\n|---:|---:|---:|---:|---:|");
    for &w in workers {
        let t0 = Instant::now();
        let per = samples.div_ceil(w.max(1));
        let handles: Vec<_> = (0..w.max(1))
            .map(|wi| {
                let ds = ds.clone();
                std::thread::spawn(move || -> Result<usize> {
                    let opts = SampleOptions::new(vramlab_lerobot::act_delta_indices(ds.info(), 100));
                    let mut done = 0;
                    for i in 0..per {
                        // A fixed scattered order: random access, as a shuffling loader does.
                        let idx = (wi * per + i).wrapping_mul(2_654_435_761) % n;
                        ds.sample(idx, &opts)?;
                        done += 1;
                    }
                    Ok(done)
                })
            })
            .collect();
        let mut total = 0;
        for h in handles {
            total += h.join().map_err(|_| anyhow!("a bench worker panicked"))??;
        }
        let secs = t0.elapsed().as_secs_f64();
        println!("| {w} | {total} | {secs:.2} | {:.1} | {:.1} |", total as f64 / secs, (total * cams) as f64 / secs);
    }
    Ok(())
}
