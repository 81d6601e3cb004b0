//! The built-in demonstrations: scripted-expert episodes of the push simulator
//! (`vramlab_data::push`), recorded as a LeRobot v3.0 dataset, generated on first use.

use std::path::{Path, PathBuf};

use crate::{Result, WorkloadError};

/// Seed of episode `e` of the built-in demonstrations.
const SIM_SEED: u64 = 0x5EED_0000;

/// What [`generate`] wrote.
pub struct Generated {
    pub episodes: usize,
    /// Episodes the expert solved.
    pub solved: usize,
    pub frames: usize,
}

/// Record `episodes` scripted-expert episodes of the push simulator into a LeRobot v3.0
/// dataset at `root`, calling `on_episode` after each.
pub fn generate(root: &Path, episodes: usize, image_size: usize, on_episode: &mut dyn FnMut()) -> Result<Generated> {
    if episodes == 0 {
        return Err(WorkloadError::invalid("episodes", "must be at least 1".into()));
    }
    if !(16..=1024).contains(&image_size) {
        return Err(WorkloadError::invalid("image_size", format!("must be in 16..=1024, found {image_size}")));
    }
    if let Some(dir) = root.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| WorkloadError::Io { path: dir.to_path_buf(), source })?;
    }
    // Claimed before the episodes are recorded: a refusal comes at once.
    let staging = vramlab_lerobot::writer::Staging::open(root)?;
    let eps: Vec<_> = (0..episodes)
        .map(|e| {
            let ep = vramlab_data::push::record_episode(SIM_SEED + e as u64, 300, image_size);
            on_episode();
            ep
        })
        .collect();
    let solved = eps.iter().filter(|e| e.success.iter().any(|&s| s)).count();
    let frames: usize = eps.iter().map(|e| e.frames.len()).sum();
    staging.write(&vramlab_data::push::dataset_spec(image_size), &eps)?;
    Ok(Generated { episodes, solved, frames })
}

/// Camera size (square) of the built-in demonstrations recorded for training.
pub const IMAGE_SIZE: usize = 96;

/// Where the built-in demonstrations of `episodes` episodes are recorded by default.
pub fn default_root(episodes: usize) -> PathBuf {
    PathBuf::from(format!("datasets/generated/push_v30_{episodes}ep"))
}

/// The built-in demonstrations for training: `root`, or `datasets/generated/push_v30_<N>ep`,
/// generated on first use.
pub fn ensure_dataset(root: Option<&Path>, episodes: usize) -> Result<PathBuf> {
    let root = root.map(Path::to_path_buf).unwrap_or_else(|| default_root(episodes));
    if !root.join("meta/info.json").exists() {
        eprintln!("built-in demonstrations: generating {} ({episodes} episodes)", root.display());
        generate(&root, episodes, IMAGE_SIZE, &mut || {})?;
    }
    Ok(root)
}
