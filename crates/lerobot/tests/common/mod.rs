#![allow(dead_code)]
use std::path::PathBuf;

use vramlab_lerobot::normalize::{NormMap, NormMode};
use vramlab_lerobot::{resolve_delta_indices, DeltaIndices, Info};

/// ACT's window in lerobot 0.4.4 (`action_delta_indices = range(chunk_size)`, no observation
/// history). Training takes it from `ActConfig::delta_indices`; tests state the numbers.
pub fn act_delta_indices(info: &Info, chunk_size: usize) -> DeltaIndices {
    let a: Vec<i64> = (0..chunk_size as i64).collect();
    resolve_delta_indices(info, None, Some(&a), None)
}

/// Diffusion Policy's window (observations `range(1 - n_obs_steps, 1)`, actions
/// `range(1 - n_obs_steps, 1 - n_obs_steps + horizon)`).
pub fn diffusion_delta_indices(info: &Info, n_obs_steps: usize, horizon: usize) -> DeltaIndices {
    let n = n_obs_steps as i64;
    let o: Vec<i64> = (1 - n..1).collect();
    let a: Vec<i64> = (1 - n..1 - n + horizon as i64).collect();
    resolve_delta_indices(info, Some(&o), Some(&a), None)
}

/// ACT's default `normalization_mapping`: everything MEAN_STD.
pub fn act_norm_map() -> NormMap {
    [("VISUAL", NormMode::MeanStd), ("STATE", NormMode::MeanStd), ("ACTION", NormMode::MeanStd)].into()
}

/// Diffusion Policy's default mapping: cameras MEAN_STD, state / action MIN_MAX.
pub fn diffusion_norm_map() -> NormMap {
    [("VISUAL", NormMode::MeanStd), ("STATE", NormMode::MinMax), ("ACTION", NormMode::MinMax)].into()
}

/// `../shared/datasets/<name>` beside the repository, or None (with a message) when it has no
/// `meta/info.json`; a failure instead under `VRAMLAB_REQUIRE_SHARED=1` ([`vramlab_testkit::shared`]).
pub fn shared_dataset(name: &str) -> Option<PathBuf> {
    let info = vramlab_testkit::shared(&format!("datasets/{name}/meta/info.json"))?;
    info.ancestors().nth(2).map(PathBuf::from)
}
pub mod synth;

/// Recursively copy a directory (small datasets only).
pub fn copy_dir(src: &std::path::Path, dst: &std::path::Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
            let mut perm = std::fs::metadata(&to).unwrap().permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perm.set_readonly(false);
            std::fs::set_permissions(&to, perm).unwrap();
        }
    }
}

/// Seconds to decode one 96x96 AV1 frame (pusht frame 0): ~0.3 s when rav1d is built with
/// debug assertions (the workspace dev profile), a few ms otherwise.
pub fn av1_probe_secs(pusht_root: &std::path::Path) -> f64 {
    let p = pusht_root.join("videos/observation.image/chunk-000/file-000.mp4");
    let mut r = vramlab_lerobot::VideoReader::open(&p).unwrap();
    let t = std::time::Instant::now();
    r.frame(0).unwrap();
    t.elapsed().as_secs_f64()
}

pub const SLOW_AV1_NOTE: &str = "rav1d is built with debug assertions (slow DisjointMut checks); add \
    `[profile.dev.package.rav1d] debug-assertions = false` and `overflow-checks = false` to the workspace \
    Cargo.toml to run the full video checks";
