//! Where the VAE's voxel grids come from: procedural scenes or 4D-Radar `.npz` files.

use vramlab_data::{NpzVoxelDataset, SynthConfig, VoxelBatch, VoxelDataset};

use crate::config::{DatasetConfig, DatasetType};
use crate::{Result, WorkloadError};

/// Where voxel grids come from.
pub enum VoxelSource {
    Synthetic(VoxelDataset),
    Npz(NpzVoxelDataset),
}

impl VoxelSource {
    /// Open the run's voxel data (`dataset.type` = voxels or npz).
    pub fn open(cfg: &DatasetConfig, kind: DatasetType, seed: u64) -> Result<Self> {
        let grid = cfg.grid;
        match kind {
            DatasetType::Npz => {
                let root = cfg.root.as_deref().ok_or_else(|| WorkloadError::invalid("dataset.root", "required for dataset.type=npz".into()))?;
                let ds = NpzVoxelDataset::open(root, Some(grid))?;
                if ds.is_empty() {
                    return Err(WorkloadError::invalid("dataset.root", format!("{}: no .npz files", root.display())));
                }
                Ok(Self::Npz(ds))
            }
            _ => {
                let synth = SynthConfig {
                    depth: grid[0],
                    height: grid[1],
                    width: grid[2],
                    num_static_boxes: cfg.num_static_boxes,
                    num_movers: cfg.num_movers,
                    ..SynthConfig::default()
                };
                Ok(Self::Synthetic(VoxelDataset::new(synth, seed, cfg.num_scenes)?))
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> u64 {
        match self {
            Self::Synthetic(d) => d.len(),
            Self::Npz(d) => d.len() as u64,
        }
    }

    /// The grids of `indices`. Building them is charged to the loader's memory account; the
    /// finished batch is the caller's (see [`vramlab_probe::adopt`]).
    pub fn batch(&self, indices: &[u64]) -> Result<VoxelBatch> {
        let vb = {
            let _loader = vramlab_probe::charge_to(vramlab_probe::Account::Loader);
            match self {
                Self::Synthetic(d) => d.batch(indices),
                Self::Npz(d) => d.batch(indices)?,
            }
        };
        vramlab_probe::adopt(&vb.data);
        Ok(vb)
    }
}

