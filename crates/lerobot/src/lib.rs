//! vramlab-lerobot: native reader for LeRobot-format datasets (v2.0/v2.1 and v3.0).
//!
//! - metadata (`info.json`, episodes, tasks, stats) and tabular parquet data
//!   ([`LeRobotDataset::open`], [`LeRobotDataset::frame`]);
//! - lerobot-compatible delta windows and padding masks ([`delta`], [`LeRobotDataset::sample`]);
//! - normalisation from dataset stats ([`normalize`]);
//! - AV1 mp4 decoding in pure Rust ([`video`], feature `video`, on by default);
//! - datasets from the Hugging Face hub by repo id, cached as `huggingface_hub` does ([`hub`],
//!   downloads with feature `hub`, on by default).
//!
//! No tensor library: everything comes out as `Vec<f32>` with shapes.

pub mod dataset;
pub mod delta;
pub mod error;
pub mod hub;
pub mod image;
pub mod info;
pub mod loader;
pub mod meta;
pub mod normalize;
mod table;
pub mod transforms;
pub mod writer;
pub mod video;

pub use dataset::{Array, Frame, LeRobotDataset, Sample, SampleOptions, DEFAULT_TOLERANCE_S};
pub use delta::{resolve_delta_indices, DeltaIndices};
pub use error::DatasetError;
pub use loader::{EpochSampler, LoaderConfig, Prefetcher, SpawnError};
pub use info::{Feature, FeatureKind, Info, Version};
pub use meta::{Episode, EpisodeVideo, FeatureStats, Stats};
pub use normalize::{FeatureSpec, NormMode, Normalizer};
pub use video::{RgbImage, VideoReader};

