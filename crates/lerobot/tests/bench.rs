//! Throughput numbers (ignored by default): `cargo test -p vramlab-lerobot --test bench -- --ignored --nocapture`.
mod common;

use std::time::Instant;

use vramlab_lerobot::*;
use common::act_delta_indices;

#[test]
#[ignore]
fn throughput() {
    let Some(root) = common::shared_dataset("g1_v21_subset") else { return };
    let t = Instant::now();
    let ds = LeRobotDataset::open(&root).unwrap();
    println!("open g1 (1461 frames, 4 parquet files): {:?}", t.elapsed());
    let mut opts = SampleOptions::new(act_delta_indices(ds.info(), 100));
    opts.cameras = false;
    let t = Instant::now();
    for i in 0..ds.num_frames() {
        std::hint::black_box(ds.sample(i, &opts).unwrap());
    }
    println!("ACT samples (chunk 100, no camera): {:.1} us/sample", t.elapsed().as_secs_f64() * 1e6 / 1461.0);
    let key = "observation.images.cam_high";
    let t = Instant::now();
    for i in 0..60 {
        ds.camera_frame(key, i).unwrap();
    }
    println!("640x480 AV1 sequential: {:.1} ms/frame", t.elapsed().as_secs_f64() * 1e3 / 60.0);
    let t = Instant::now();
    let mut x = 12345u64;
    for _ in 0..30 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ds.camera_frame(key, (x >> 33) as usize % ds.num_frames()).unwrap();
    }
    println!("640x480 AV1 random access (GOP 2): {:.1} ms/frame", t.elapsed().as_secs_f64() * 1e3 / 30.0);
    let mut opts = SampleOptions::new(act_delta_indices(ds.info(), 100));
    opts.cameras = true;
    let t = Instant::now();
    for i in (0..ds.num_frames()).step_by(50) {
        std::hint::black_box(ds.sample(i, &opts).unwrap());
    }
    println!("ACT samples with camera (random-ish): {:.1} ms/sample", t.elapsed().as_secs_f64() * 1e3 / 30.0);
}
