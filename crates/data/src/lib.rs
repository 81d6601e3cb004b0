//! Voxel-grid data for vramlab's 3D convolutional VAE (4D radar voxel grids).
//!
//! The crate deliberately does not depend on burn: it produces plain
//! `Vec<f32>` buffers together with their shapes, in row-major (C order)
//! layout, which the training crates turn into tensors.
//!
//! # Layout
//!
//! One sample is a grid of shape `(C, D, H, W)` with `C = 4` channels; a batch
//! is `(B, C, D, H, W)`. `D` is the vertical (z) axis, `H` and `W` are the
//! horizontal axes of a radar bird's-eye-view grid: `H` runs along the range
//! (forward, x) direction away from the sensor and `W` across it (lateral, y).
//! The sensor sits at `H = 0`, `W = W / 2`. A typical size is `(4, 32, 128, 128)`.
//! Element `(c, d, h, w)` is at index `((c * D + d) * H + h) * W + w`.
//!
//! # Channels
//!
//! | index | constant | meaning |
//! |---|---|---|
//! | 0 | [`CH_OCCUPANCY`] | occupancy, `0.0` or `1.0` |
//! | 1 | [`CH_INTENSITY`] | mean return intensity (synthetic data: in `[0, 1]`) |
//! | 2 | [`CH_DOPPLER`] | mean Doppler (radial) velocity (synthetic: in `[-1, 1]`, positive = receding) |
//! | 3 | [`CH_DOPPLER_VAR`] | Doppler variance (synthetic: `>= 0`) |
//!
//! Features are non-zero only on occupied voxels; radar grids are sparse.
//!
//! # Sources
//!
//! * [`synth`]: a seeded procedural scene generator ([`VoxelSceneGenerator`],
//!   [`VoxelDataset`]) — deterministic per `(seed, index)`.
//! * [`npz`]: a reader for the `.npz` voxel files written by the 4D-Radar
//!   (NTU4DRadLM) preprocessing ([`load_radar_voxels`], [`NpzVoxelDataset`]),
//!   its arrays parsed by `ndarray-npy` ([`npy`]).
//!
//! # Example
//!
//! ```
//! use vramlab_data::{SynthConfig, VoxelDataset, CH_OCCUPANCY};
//!
//! let cfg = SynthConfig { depth: 16, height: 64, width: 64, ..Default::default() };
//! let ds = VoxelDataset::new(cfg, 42, 1000)?;
//! let batch = ds.batch(&[0, 1, 2]);
//! assert_eq!(batch.shape, [3, 4, 16, 64, 64]);
//! let first = batch.sample(0).unwrap();
//! let voxels = 16 * 64 * 64;
//! let occupied = first[CH_OCCUPANCY * voxels..][..voxels].iter().filter(|&&v| v == 1.0).count();
//! assert!(occupied > 0);
//! # Ok::<(), vramlab_data::DataError>(())
//! ```

pub mod error;
pub mod npy;
pub mod npz;
pub mod push;
pub mod synth;

pub use error::DataError;
pub use npy::{NpyArray, parse_npy, read_npy};
pub use npz::{
    NpzFile, NpzVoxelDataset, load_radar_npy, load_radar_voxels, load_radar_voxels_cropped,
    parse_npz, radar_voxels_from_npz, read_npz,
};
pub use synth::{SynthConfig, VoxelDataset, VoxelSceneGenerator};

/// Number of channels of every voxel grid.
pub const CHANNELS: usize = 4;
/// Channel 0: occupancy (0 or 1).
pub const CH_OCCUPANCY: usize = 0;
/// Channel 1: mean intensity.
pub const CH_INTENSITY: usize = 1;
/// Channel 2: mean Doppler velocity.
pub const CH_DOPPLER: usize = 2;
/// Channel 3: Doppler variance.
pub const CH_DOPPLER_VAR: usize = 3;

/// One voxel grid, `(C, D, H, W)` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct VoxelGrid {
    /// Values, `shape.iter().product()` of them.
    pub data: Vec<f32>,
    /// `(C, D, H, W)`.
    pub shape: [usize; 4],
}

impl VoxelGrid {
    /// Fraction of voxels whose occupancy channel is set.
    pub fn occupancy_fraction(&self) -> f32 {
        let [_, d, h, w] = self.shape;
        occupancy_fraction(&self.data, d * h * w)
    }
}

/// A batch of voxel grids, `(B, C, D, H, W)` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct VoxelBatch {
    /// Values, `shape.iter().product()` of them.
    pub data: Vec<f32>,
    /// `(B, C, D, H, W)`.
    pub shape: [usize; 5],
}

impl VoxelBatch {
    /// Number of samples `B`.
    pub fn batch_size(&self) -> usize {
        self.shape[0]
    }

    /// Elements per sample, `C * D * H * W`.
    pub fn sample_len(&self) -> usize {
        self.shape[1..].iter().product()
    }

    /// The `(C, D, H, W)` values of sample `i`, if it exists.
    pub fn sample(&self, i: usize) -> Option<&[f32]> {
        let n = self.sample_len();
        let start = i.checked_mul(n)?;
        self.data.get(start..start.checked_add(n)?)
    }
}

/// Occupied fraction of a `(C, D, H, W)` buffer whose spatial size is `voxels = D * H * W`.
pub(crate) fn occupancy_fraction(data: &[f32], voxels: usize) -> f32 {
    if voxels == 0 {
        return 0.0;
    }
    let occ = data.iter().take(voxels).filter(|&&v| v > 0.0).count();
    occ as f32 / voxels as f32
}
