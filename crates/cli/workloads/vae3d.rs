//! The 3D-VAE as a trainable workload: config resolution, data, and the `TrainModel` adapter.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use rand::Rng;
use serde_json::Value;
use vramlab_data::{NpzVoxelDataset, SynthConfig, VoxelBatch, VoxelDataset};
use vramlab_models::nn::Precision;
use vramlab_models::vae3d::{StageCtx, Vae3d, Vae3dConfig, split_moments};
use vramlab_store::WeightError;
use vramlab_train::{LossParts, StageTensor, Staged, TrainModel, step_rng};

use crate::config::{DatasetConfig, RunConfig};

/// `policy.*` → model config: start from `policy.preset` (or the reference defaults), then
/// apply the other fields by their reference names.
pub fn resolve_config(policy: &serde_json::Map<String, Value>) -> Result<Vae3dConfig> {
    let base = match policy.get("preset") {
        Some(Value::String(name)) => Vae3dConfig::preset(name).ok_or_else(|| {
            anyhow!("policy.preset={name}: unknown preset; valid: {}", Vae3dConfig::preset_names().join(", "))
        })?,
        Some(other) => bail!("policy.preset: expected a string, found {other}"),
        None => Vae3dConfig::default(),
    };
    let Value::Object(mut merged) = serde_json::to_value(&base)? else { bail!("vae3d config is not an object") };
    for (k, v) in policy {
        if k != "type" && k != "preset" {
            merged.insert(k.clone(), v.clone());
        }
    }
    let cfg: Vae3dConfig = serde_json::from_value(Value::Object(merged)).map_err(|e| anyhow!("policy (vae3d): {e}"))?;
    cfg.validate().map_err(|e| anyhow!("policy (vae3d): {e}"))?;
    Ok(cfg)
}

/// The trainable wrapper: the VAE plus the compute precision of its forward pass.
#[derive(Module, Debug)]
pub struct Vae3dTrain<B: Backend> {
    pub vae: Vae3d<B>,
    #[module(skip)]
    pub precision: Precision,
}

/// A batch: voxel grids and the posterior noise for this step.
pub struct Vae3dBatch<B: Backend> {
    pub x: Tensor<B, 5>,
    pub eps: Tensor<B, 5>,
}

fn parts<B: Backend>(l: vramlab_models::vae3d::Vae3dLoss<B>) -> LossParts<B> {
    LossParts::new(l.loss).with("recon_loss", l.recon_loss).with("kl_loss", l.kl_loss)
}

impl<B: AutodiffBackend> TrainModel<B> for Vae3dTrain<B> {
    type Batch = Vae3dBatch<B>;

    fn forward_loss(&self, b: &Self::Batch) -> LossParts<B> {
        let out = self.vae.forward(b.x.clone(), Some(b.eps.clone()), self.precision);
        parts(self.vae.compute_loss(b.x.clone(), &out))
    }

    fn staged(&self) -> Option<&dyn Staged<B, Self::Batch>> {
        Some(self)
    }

    fn save_weights(&self, path: &Path) -> Result<(), WeightError> {
        vramlab_store::save_safetensors::<B, _>(&self.vae, path)
    }

    fn load_weights(self, path: &Path) -> Result<Self, WeightError> {
        let vae = vramlab_store::load_safetensors(self.vae, path, |k| Some(k.to_string()))?;
        Ok(Self { vae, precision: self.precision })
    }
}

/// Stage chain: `[h]` through the encoder; from the moments stage on, `[h, moments]` (the
/// moments ride along to the loss, which needs them for the KL term).
impl<B: AutodiffBackend> Staged<B, Vae3dBatch<B>> for Vae3dTrain<B> {
    fn num_stages(&self) -> usize {
        self.vae.num_stages()
    }

    fn input(&self, b: &Vae3dBatch<B>) -> Vec<StageTensor<B>> {
        vec![StageTensor::R5(b.x.clone())]
    }

    fn stage(&self, i: usize, state: Vec<StageTensor<B>>, b: &Vae3dBatch<B>) -> Vec<StageTensor<B>> {
        let mut it = state.into_iter();
        let (Some(StageTensor::R5(h)), rest) = (it.next(), it.next()) else { unreachable!("vae3d stages carry rank-5 tensors") };
        let ctx = StageCtx { eps: Some(b.eps.clone()), precision: self.precision };
        let m = self.vae.moments_stage();
        let out = self.vae.stage(i, h.clone(), &ctx);
        match i.cmp(&m) {
            std::cmp::Ordering::Less => vec![StageTensor::R5(out)],
            std::cmp::Ordering::Equal => vec![StageTensor::R5(out.clone()), StageTensor::R5(out)],
            std::cmp::Ordering::Greater => {
                let _ = h;
                vec![StageTensor::R5(out), rest.expect("moments travel after the moments stage")]
            }
        }
    }

    fn loss(&self, state: Vec<StageTensor<B>>, b: &Vae3dBatch<B>) -> LossParts<B> {
        let mut it = state.into_iter();
        let (Some(StageTensor::R5(recon)), Some(StageTensor::R5(moments))) = (it.next(), it.next()) else {
            unreachable!("vae3d final state is [recon, moments]")
        };
        let _ = split_moments::<B>; // the loss splits and clamps the moments itself
        parts(self.vae.loss_from_parts(b.x.clone(), moments, recon))
    }
}

/// Where voxel grids come from.
pub enum VoxelSource {
    Synthetic(VoxelDataset),
    Npz(NpzVoxelDataset),
}

impl VoxelSource {
    pub fn open(cfg: &DatasetConfig, seed: u64) -> Result<Self> {
        let grid: [usize; 3] = cfg
            .grid
            .as_slice()
            .try_into()
            .map_err(|_| anyhow!("dataset.grid: expected three sizes D,H,W, found {:?}", cfg.grid))?;
        match cfg.kind.as_str() {
            "synthetic" => {
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
            "npz" => {
                let root = cfg.root.as_deref().ok_or_else(|| anyhow!("dataset.root is required for dataset.type=npz"))?;
                let ds = NpzVoxelDataset::open(root, Some(grid))?;
                if ds.is_empty() {
                    bail!("{}: no .npz files", root.display());
                }
                Ok(Self::Npz(ds))
            }
            other => bail!("dataset.type={other}: unknown; valid: synthetic, npz"),
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            Self::Synthetic(d) => d.len(),
            Self::Npz(d) => d.len() as u64,
        }
    }

    pub fn batch(&self, indices: &[u64]) -> Result<VoxelBatch> {
        match self {
            Self::Synthetic(d) => Ok(d.batch(indices)),
            Self::Npz(d) => Ok(d.batch(indices)?),
        }
    }
}

/// Batch `micro` of step `step`: sample indices and posterior noise drawn from
/// `step_rng(seed, step, micro)`, so any step can be rebuilt exactly (resume).
pub fn make_batch<B: Backend>(
    source: &VoxelSource,
    vae: &Vae3dConfig,
    batch_size: usize,
    seed: u64,
    step: u64,
    micro: u64,
    device: &B::Device,
) -> Result<Vae3dBatch<B>> {
    let mut rng = step_rng(seed, step, micro);
    let n = source.len();
    let indices: Vec<u64> = (0..batch_size).map(|_| rng.random_range(0..n)).collect();
    let vb = source.batch(&indices)?;
    if vb.shape[1] != vae.in_channels {
        bail!("data has {} channels, policy.in_channels is {}", vb.shape[1], vae.in_channels);
    }
    let f = vae.downsample_factor();
    let [b, _, d, h, w] = vb.shape;
    for (axis, (size, factor)) in ["D", "H", "W"].iter().zip([d, h, w].into_iter().zip(f)) {
        if size % factor != 0 {
            bail!("dataset.grid: {axis}={size} is not divisible by the VAE's downsampling factor {factor} along {axis}");
        }
    }
    let latent = [b, vae.latent_dim, d / f[0], h / f[1], w / f[2]];
    let eps = crate::workloads::normal_vec(&mut rng, latent.iter().product());
    let x = Tensor::from_data(TensorData::new(vb.data, vb.shape), device);
    let eps = Tensor::from_data(TensorData::new(eps, latent), device);
    Ok(Vae3dBatch { x, eps })
}

/// Read a reference-format `config.json` of a checkpoint directory.
pub fn checkpoint_config(dir: &Path) -> Result<Vae3dConfig> {
    let path = dir.join("config.json");
    Vae3dConfig::from_json_file(&path).with_context(|| format!("{}: cannot load the VAE config", path.display()))
}
