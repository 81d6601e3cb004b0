//! `vramlab dataset info|bench|generate PATH`: what a LeRobot dataset holds, how fast vramlab
//! reads it, and the built-in demonstrations.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use vramlab_lerobot::{EpochSampler, FeatureKind, LeRobotDataset, LoaderConfig, Prefetcher, SampleOptions, VideoReader};

use crate::Cli;

const USAGE: &str = "usage: vramlab dataset info PATH | bench PATH [--samples=N] [--workers=0,1,2] [--batch_size=8] | generate PATH [--episodes=N] [--image_size=96]";

pub fn run(cli: &Cli, args: &[String]) -> Result<()> {
    let (Some(sub), Some(path)) = (args.first(), args.get(1)) else {
        bail!("{USAGE}");
    };
    let root = PathBuf::from(path);
    let num = |k: &str, v: &str| v.trim().parse::<usize>().map_err(|_| anyhow!("--{k}={v}: expected a number"));
    match sub.as_str() {
        "info" => info(&root),
        "bench" => {
            let (mut samples, mut batch) = (96usize, 8usize);
            let mut workers = vec![0usize, 1, 2];
            for (k, v) in &cli.overrides {
                match k.as_str() {
                    "samples" => samples = num(k, v)?,
                    "batch_size" => batch = num(k, v)?.max(1),
                    "workers" => workers = v.split(',').map(|w| num(k, w)).collect::<Result<_>>()?,
                    other => bail!("dataset bench: unknown flag --{other}; valid: --samples, --workers, --batch_size"),
                }
            }
            bench(&root, samples, batch, &workers)
        }
        "generate" => {
            let (mut episodes, mut size) = (20usize, 96usize);
            for (k, v) in &cli.overrides {
                match k.as_str() {
                    "episodes" => episodes = num(k, v)?,
                    "image_size" => size = num(k, v)?,
                    other => bail!("dataset generate: unknown flag --{other}; valid: --episodes, --image_size"),
                }
            }
            generate(&root, episodes, size)
        }
        other => bail!("dataset {other}: unknown. {USAGE}"),
    }
}

/// Seed of episode `e` of the built-in demonstrations.
const SIM_SEED: u64 = 0x5EED_0000;

/// Record `episodes` scripted-expert episodes of the push simulator into a LeRobot v3.0 dataset.
pub fn generate(root: &Path, episodes: usize, image_size: usize) -> Result<()> {
    if episodes == 0 || !(16..=1024).contains(&image_size) {
        bail!("dataset generate: need --episodes ≥ 1 and 16 ≤ --image_size ≤ 1024");
    }
    let bar = ProgressBar::new(episodes as u64).with_message("recording expert episodes");
    bar.set_style(ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} [{elapsed}]").unwrap_or_else(|_| ProgressStyle::default_bar()));
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let eps: Vec<_> = (0..episodes)
        .map(|e| {
            let ep = vramlab_data::push::record_episode(SIM_SEED + e as u64, 300, image_size);
            bar.inc(1);
            ep
        })
        .collect();
    bar.finish_and_clear();
    let solved = eps.iter().filter(|e| e.success.iter().any(|&s| s)).count();
    let frames: usize = eps.iter().map(|e| e.frames.len()).sum();
    if let Some(dir) = root.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| anyhow!("{}: cannot create: {e}", dir.display()))?;
    }
    vramlab_lerobot::writer::write_dataset(root, &vramlab_data::push::dataset_spec(image_size), &eps)?;
    eprintln!(
        "wrote {}: LeRobot v3.0, {episodes} episodes ({solved} solved by the expert), {frames} frames, 10 fps, {image_size}×{image_size} PNG frames in parquet",
        root.display()
    );
    Ok(())
}

/// The built-in demonstrations for training: `root`, or `datasets/generated/push_v30_<N>ep`,
/// generated on first use.
pub fn ensure_sim_dataset(root: Option<&Path>, episodes: usize) -> Result<PathBuf> {
    let root = root.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(format!("datasets/generated/push_v30_{episodes}ep")));
    if !root.join("meta/info.json").exists() {
        eprintln!("built-in demonstrations: generating {} ({episodes} episodes)", root.display());
        generate(&root, episodes, 96)?;
    }
    Ok(root)
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

/// Loader throughput: ACT-style samples (state, 100 actions, every camera) in batches, through
/// the prefetching loader with 0..N workers; and sequential decoding of one whole video.
fn bench(root: &Path, samples: usize, batch: usize, workers: &[usize]) -> Result<()> {
    let ds = Arc::new(LeRobotDataset::open(root)?);
    let cams = ds.camera_keys().len();
    let opts = Arc::new(SampleOptions::new(vramlab_lerobot::act_delta_indices(ds.info(), 100)));
    let ranges: Vec<(usize, usize)> = ds.episodes().iter().map(|e| (e.dataset_from_index, e.dataset_to_index)).collect();
    let sampler = Arc::new(EpochSampler::new(ranges, 0, 0, true));
    let batches = samples.div_ceil(batch) as u64;
    println!("{}: {} frames, {} camera(s); batches of {batch} shuffled samples (state + 100 actions + cameras)\n", root.display(), ds.num_frames(), cams);
    println!("| workers | samples | seconds | samples/s | camera frames/s |\n|---:|---:|---:|---:|---:|");
    for &w in workers {
        let (ds, opts, sampler) = (ds.clone(), opts.clone(), sampler.clone());
        let make = Arc::new(move |k: u64| -> Result<usize> {
            for i in 0..batch as u64 {
                ds.sample(sampler.index(k * batch as u64 + i), &opts)?;
            }
            Ok(batch)
        });
        let cfg = LoaderConfig { num_workers: w, prefetch_factor: 2, persistent_workers: true, batches_per_epoch: 0 };
        let mut loader = Prefetcher::new(cfg, make);
        let t0 = Instant::now();
        let mut total = 0;
        for k in 0..batches {
            total += loader.get(k)?;
        }
        let secs = t0.elapsed().as_secs_f64();
        println!("| {w} | {total} | {secs:.2} | {:.1} | {:.1} |", total as f64 / secs, (total * cams) as f64 / secs);
    }
    let first_video = ds.video_keys().first().zip(ds.episodes().first()).and_then(|(key, ep)| ep.videos.get(key));
    if let Some(v) = first_video {
        let path = ds.root().join(&v.file);
        let mut r = VideoReader::open(&path)?;
        let t0 = Instant::now();
        let n = r.num_frames();
        for i in 0..n {
            r.frame(i)?;
        }
        let secs = t0.elapsed().as_secs_f64();
        println!("\nSequential decode of {} ({n} frames, to RGB): {secs:.2} s, {:.1} frames/s", path.display(), n as f64 / secs);
    }
    Ok(())
}
