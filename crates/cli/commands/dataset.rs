//! `vramlab dataset info|bench|generate PATH`: what a LeRobot dataset holds, how fast vramlab
//! reads it, and the built-in demonstrations.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use vramlab_lerobot::{EpochSampler, FeatureKind, LeRobotDataset, LoaderConfig, Prefetcher, SampleOptions, VideoReader};

use crate::args::DatasetCommand;

pub fn run(cmd: &DatasetCommand) -> Result<()> {
    match cmd {
        DatasetCommand::Info { path } => info(path),
        DatasetCommand::Bench { path, samples, workers, batch_size } => bench(path, *samples, *batch_size as usize, workers),
        DatasetCommand::Generate { path, episodes, image_size } => generate(path, *episodes, *image_size),
    }
}

/// Record the built-in demonstrations with a progress bar.
fn generate(root: &Path, episodes: usize, image_size: usize) -> Result<()> {
    let bar = ProgressBar::new(episodes as u64).with_message("recording expert episodes");
    bar.set_style(ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} [{elapsed}]").unwrap_or_else(|_| ProgressStyle::default_bar()));
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let g = vramlab_workloads::sim::generate(root, episodes, image_size, &mut || bar.inc(1))?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {}: LeRobot v3.0, {} episodes ({} solved by the expert), {} frames, 10 fps, {image_size}×{image_size} PNG frames in parquet",
        root.display(),
        g.episodes,
        g.solved,
        g.frames
    );
    Ok(())
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
    let max = vramlab_workloads::config::validate::MAX_WORKERS;
    if let Some(w) = workers.iter().find(|&&w| w > max) {
        anyhow::bail!("--workers={w}: at most {max} loader threads");
    }
    let ds = Arc::new(LeRobotDataset::open(root)?);
    let cams = ds.camera_keys().len();
    // ACT-like samples: the current frame and a chunk of 100 actions.
    let actions: Vec<i64> = (0..100).collect();
    let opts = Arc::new(SampleOptions::new(vramlab_lerobot::resolve_delta_indices(ds.info(), None, Some(&actions), None)));
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
