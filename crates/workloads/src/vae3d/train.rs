//! The 3D-VAE's training adapter: the trainable wrapper and its batches. The forward is the
//! model's own ([`Vae3d`]'s stage plan), folded over by the trainer or recomputed stage by
//! stage (`--gradient_checkpointing=blocks`).

use crate::backend::TrainBackend;
use std::path::Path;

use burn::module::Module;
use burn::prelude::*;
use rand::Rng;
use vramlab_models::nn::Precision;
use vramlab_models::vae3d::{Vae3d, Vae3dConfig, Vae3dInput, Vae3dOutput};
use vramlab_store::WeightError;
use vramlab_train::{LossParts, TrainModel, step_rng};

use super::data::VoxelSource;
use crate::{Result, WorkloadError};

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

impl<B: TrainBackend> TrainModel<B> for Vae3dTrain<B> {
    type Batch = Vae3dBatch<B>;
    type Model = Vae3d<B>;

    fn model(&self) -> &Vae3d<B> {
        &self.vae
    }

    fn input(&self, b: &Vae3dBatch<B>) -> Vae3dInput<B> {
        Vae3dInput { x: b.x.clone(), eps: Some(b.eps.clone()), precision: self.precision }
    }

    fn loss(&self, out: Vae3dOutput<B>, b: &Vae3dBatch<B>) -> LossParts<B> {
        let l = self.vae.compute_loss(b.x.clone(), &out);
        LossParts::new(l.loss).with("recon_loss", l.recon_loss).with("kl_loss", l.kl_loss)
    }

    fn save_weights(&self, path: &Path) -> Result<(), WeightError> {
        vramlab_store::save_safetensors::<B, _>(&self.vae, path)
    }

    fn load_weights(self, path: &Path) -> Result<Self, WeightError> {
        let vae = vramlab_store::load_safetensors(self.vae, path, |k| Some(k.to_string()))?;
        Ok(Self { vae, precision: self.precision })
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
        return Err(WorkloadError::invalid("policy.in_channels", format!("{} but the data has {} channels", vae.in_channels, vb.shape[1])));
    }
    let [b, _, d, h, w] = vb.shape;
    if let Some(why) = crate::config::grid_mismatch(vae, [d, h, w]) {
        return Err(WorkloadError::invalid("dataset.grid", why));
    }
    let f = vae.downsample_factor();
    let latent = [b, vae.latent_dim, d / f[0], h / f[1], w / f[2]];
    let eps = crate::normal_vec(&mut rng, latent.iter().product());
    let x = Tensor::from_data(TensorData::new(vb.data, vb.shape), device);
    let eps = Tensor::from_data(TensorData::new(eps, latent), device);
    Ok(Vae3dBatch { x, eps })
}


#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::module::AutodiffModule;
    use vramlab_train::CheckpointMode;
    use vramlab_train::recompute::{GradientProbe, NamedGradients, check_checkpointing_modes, named_gradients};

    use super::*;
    use crate::config::{DatasetConfig, DatasetType};

    /// The ultra-lightweight VAE on a batch of 2 built-in scenes.
    struct Probe(Vae3d<Flex>, Vae3dConfig);

    impl GradientProbe<Flex> for Probe {
        fn gradients<C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy>(&self, mode: CheckpointMode) -> (f32, NamedGradients) {
            let model = Vae3dTrain::<burn::backend::Autodiff<Flex, C>> { vae: Vae3d::<burn::backend::Autodiff<Flex, C>>::from_inner(self.0.clone()).set_trainable(), precision: Precision::F32 };
            let source = VoxelSource::open(&DatasetConfig { grid: [4, 16, 16], ..DatasetConfig::default() }, DatasetType::Voxels, 3).unwrap();
            let batch = make_batch::<burn::backend::Autodiff<Flex, C>>(&source, &self.1, 2, 3, 1, 0, &Default::default()).unwrap();
            named_gradients(&model, &batch, mode)
        }
    }

    /// Block recomputation (the trainer's `--gradient_checkpointing=blocks` path on the VAE's
    /// stage plan) and Burn's balanced checkpointing leave the gradients equal to the plain
    /// run (≤ 1e-5 relative to the largest gradient).
    #[test]
    fn checkpointing_modes_give_equal_gradients() {
        let cfg = Vae3dConfig::preset("ultra_lightweight").unwrap();
        let inner = cfg.init::<Flex>(&Default::default());
        // Parameters initialise lazily and each clone of an uninitialised one draws its own
        // values: read them once so every copy shares the same weights.
        let _ = vramlab_store::named_tensors::<Flex, _>(&inner);
        let (plain, gaps) = check_checkpointing_modes(&Probe(inner, cfg.clone()), 1e-5).unwrap();
        assert_eq!(plain.iter().map(|(_, g)| g.len()).sum::<usize>(), cfg.num_params(), "every parameter has a gradient");
        println!("vae3d: max |Δgrad| / max |grad| per mode: {gaps:?}");
    }
}
