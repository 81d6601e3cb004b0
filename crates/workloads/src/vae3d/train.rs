//! The 3D-VAE's training adapter: the trainable wrapper, its batches, and the stage chain.

use std::path::Path;

use burn::module::Module;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use rand::Rng;
use vramlab_models::nn::Precision;
use vramlab_models::vae3d::{StageCtx, Vae3d, Vae3dConfig, split_moments};
use vramlab_store::WeightError;
use vramlab_train::{LossParts, StageTensor, Staged, TrainModel, step_rng};

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
    let f = vae.downsample_factor();
    let [b, _, d, h, w] = vb.shape;
    for (axis, (size, factor)) in ["D", "H", "W"].iter().zip([d, h, w].into_iter().zip(f)) {
        if size % factor != 0 {
            return Err(WorkloadError::invalid("dataset.grid", format!("{axis}={size} is not divisible by the VAE's downsampling factor {factor} along {axis}")));
        }
    }
    let latent = [b, vae.latent_dim, d / f[0], h / f[1], w / f[2]];
    let eps = crate::normal_vec(&mut rng, latent.iter().product());
    let x = Tensor::from_data(TensorData::new(vb.data, vb.shape), device);
    let eps = Tensor::from_data(TensorData::new(eps, latent), device);
    Ok(Vae3dBatch { x, eps })
}


#[cfg(test)]
mod tests {
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    use burn::backend::{Autodiff, Flex};
    use burn::module::{AutodiffModule, ModuleVisitor, Param};

    use burn::optim::GradientsParams;
    use vramlab_train::checkpointing::{PhaseHooks, staged_forward_backward};

    use super::*;
    use crate::config::{DatasetConfig, DatasetType};

    struct NoHooks;
    impl PhaseHooks for NoHooks {
        fn forward_done(&mut self) {}
    }

    /// Every parameter's gradient, flattened in visit order.
    fn flat_grads<B: AutodiffBackend>(model: &Vae3dTrain<B>, grads: &GradientsParams) -> Vec<f32> {
        struct V<'a>(&'a GradientsParams, Vec<f32>);
        impl<B: AutodiffBackend> ModuleVisitor<B> for V<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
                let g = self.0.get::<B::InnerBackend, D>(p.id);
                assert!(g.is_some(), "no gradient for a parameter of shape {:?} (require_grad {})", p.shape(), p.is_require_grad());
                self.1.extend(g.unwrap().into_data().to_vec::<f32>().expect("f32 grads"));
            }
        }
        let mut v = V(grads, Vec::new());
        model.visit(&mut v);
        v.1
    }

    fn grads_of<B: AutodiffBackend>(inner: &Vae3d<B::InnerBackend>, cfg: &Vae3dConfig, staged: bool) -> (f32, Vec<f32>) {
        let device = Default::default();
        struct RequireGrad;
        impl<B: AutodiffBackend> burn::module::ModuleMapper<B> for RequireGrad {
            fn map_float<const D: usize>(&mut self, p: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
                let (id, t, mapper) = p.consume();
                Param::from_mapped_value(id, t.require_grad(), mapper)
            }
        }
        // `from_inner` keeps the inner parameters' require_grad = false: mark them trainable.
        let vae = Vae3d::<B>::from_inner(inner.clone()).map(&mut RequireGrad);
        let model = Vae3dTrain::<B> { vae, precision: Precision::F32 };
        let source = VoxelSource::open(&DatasetConfig { grid: [4, 16, 16], ..DatasetConfig::default() }, DatasetType::Voxels, 3).unwrap();
        let batch = make_batch::<B>(&source, cfg, 2, 3, 1, 0, &device).unwrap();
        if staged {
            let (parts, grads) = staged_forward_backward(&model, &batch, 1.0, &mut NoHooks).unwrap();
            (parts.loss.into_scalar().elem(), flat_grads(&model, &grads))
        } else {
            let parts = model.forward_loss(&batch);
            let mut g = parts.loss.backward();
            let grads = GradientsParams::from_module(&mut g, &model);
            (parts.loss.into_scalar().elem(), flat_grads(&model, &grads))
        }
    }

    fn assert_close(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len());
        let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-5 * scale, "{what}: max |Δgrad| {worst} vs max |grad| {scale}");
    }

    /// Block recomputation and Burn's balanced checkpointing leave the gradients equal to the
    /// plain run (≤ 1e-5 relative to the largest gradient).
    #[test]
    fn checkpointing_modes_give_equal_gradients() {
        let cfg = Vae3dConfig::preset("ultra_lightweight").unwrap();
        let inner = cfg.init::<Flex>(&Default::default());
        // Parameters initialise lazily and each clone of an uninitialised one draws its own
        // values: read them once so every copy below shares the same weights.
        let _ = vramlab_store::named_tensors::<Flex, _>(&inner);
        let (l0, plain) = grads_of::<Autodiff<Flex>>(&inner, &cfg, false);
        let (l1, blocks) = grads_of::<Autodiff<Flex>>(&inner, &cfg, true);
        let (l2, balanced) = grads_of::<Autodiff<Flex, BalancedCheckpointing>>(&inner, &cfg, false);
        assert_eq!(plain.len(), cfg.num_params());
        assert!((l0 - l1).abs() <= 1e-6 * l0.abs() && (l0 - l2).abs() <= 1e-6 * l0.abs(), "{l0} {l1} {l2}");
        assert_close(&plain, &blocks, "blocks");
        assert_close(&plain, &balanced, "balanced");
    }
}
