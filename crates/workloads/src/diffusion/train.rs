//! Diffusion Policy's training adapter: the trainable wrapper and its batches. The forward is
//! the model's own: lerobot's `compute_loss` as [`Diffusion`]'s stage plan, which the trainer
//! folds over or recomputes stage by stage (`--gradient_checkpointing=blocks`).

use crate::backend::TrainBackend;
use std::path::Path;

use burn::module::Module;
use burn::prelude::*;
use rand::Rng;
use vramlab_models::diffusion::{Diffusion, DiffusionBatch, DiffusionConfig, DiffusionCtx, DiffusionInput, PolicyFeatures};
use vramlab_models::nn::Precision;
use vramlab_store::WeightError;
use vramlab_train::{LossParts, TrainModel, step_rng};

use crate::policy_data::HostBatch;

/// The trainable wrapper: Diffusion Policy plus the compute precision of its forward pass.
#[derive(Module, Debug)]
pub struct DiffusionTrain<B: Backend> {
    pub model: Diffusion<B>,
    pub precision: Precision,
}

/// A training micro-batch: the model inputs plus the diffusion randomness (noise, timesteps,
/// random-crop offsets), all drawn on the host from the run's seed.
#[derive(Clone, Debug)]
pub struct DiffusionTrainBatch<B: Backend> {
    pub batch: DiffusionBatch<B>,
    pub noise: Tensor<B, 3>,
    pub timesteps: Vec<usize>,
    /// `[top, left]` per RGB encoder (one crop for the whole batch, as torchvision's
    /// `RandomCrop` on a batched tensor).
    pub crop_offsets: Vec<[usize; 2]>,
}

/// The device batch of host batch `h` (micro-batch `micro` of `step`).
pub fn to_batch<B: Backend>(h: HostBatch, cfg: &DiffusionConfig, seed: u64, step: u64, micro: u64, device: &B::Device) -> DiffusionTrainBatch<B> {
    let mut rng = step_rng(seed, step, micro);
    let b = h.batch_size;
    let (s, hz, a) = (cfg.n_obs_steps, cfg.horizon, cfg.action_dim());
    let state = Tensor::from_data(TensorData::new(h.state, [b, s, cfg.state_dim()]), device);
    let images = cfg
        .image_features()
        .iter()
        .zip(h.images)
        .map(|((_, sh), v)| Tensor::from_data(TensorData::new(v, [b, s, sh[0], sh[1], sh[2]]), device))
        .collect();
    let action = Tensor::from_data(TensorData::new(h.action, [b, hz, a]), device);
    let action_is_pad = Tensor::<B, 2, Bool>::from_data(TensorData::new(h.action_is_pad, [b, hz]), device);
    let noise = Tensor::from_data(TensorData::new(crate::normal_vec(&mut rng, b * hz * a), [b, hz, a]), device);
    let timesteps = (0..b).map(|_| rng.random_range(0..cfg.num_train_timesteps)).collect();
    let crop_offsets = match cfg.random_crop_max_offset() {
        Some([mt, ml]) => (0..cfg.num_rgb_encoders()).map(|_| [rng.random_range(0..=mt), rng.random_range(0..=ml)]).collect(),
        None => Vec::new(),
    };
    DiffusionTrainBatch {
        batch: DiffusionBatch { state, images, env_state: None, action: Some(action), action_is_pad: Some(action_is_pad) },
        noise,
        timesteps,
        crop_offsets,
    }
}

impl<B: TrainBackend> TrainModel<B> for DiffusionTrain<B> {
    type Batch = DiffusionTrainBatch<B>;
    type Model = Diffusion<B>;

    fn model(&self) -> &Diffusion<B> {
        &self.model
    }

    /// Training mode with the batch's noise, timesteps and crop offsets.
    fn input(&self, b: &DiffusionTrainBatch<B>) -> DiffusionInput<B> {
        let ctx = DiffusionCtx::train(self.precision);
        let ctx = if b.crop_offsets.is_empty() { ctx } else { ctx.with_crop_offsets(b.crop_offsets.clone()) };
        DiffusionInput { batch: b.batch.clone(), noise: b.noise.clone(), timesteps: b.timesteps.clone(), ctx }
    }

    /// The forward is lerobot's `compute_loss`: its output is the loss.
    fn loss(&self, loss: Tensor<B, 1>, _b: &DiffusionTrainBatch<B>) -> LossParts<B> {
        LossParts::new(loss)
    }

    fn save_weights(&self, path: &Path) -> Result<(), WeightError> {
        vramlab_models::diffusion::save_weights(&self.model, path)
    }

    fn load_weights(self, path: &Path) -> Result<Self, WeightError> {
        let model = vramlab_models::diffusion::load_weights(self.model, path)?.set_trainable();
        Ok(Self { model, precision: self.precision })
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::module::AutodiffModule;
    use vramlab_train::CheckpointMode;
    use vramlab_train::recompute::{GradientProbe, NamedGradients, check_checkpointing_modes, named_gradients};

    use super::*;

    /// A tiny Diffusion Policy: two cameras with their own encoders (resnet18 trunks on 28×28
    /// random crops), two observation steps, a 2-level UNet, padding masked in the loss.
    fn tiny() -> DiffusionConfig {
        DiffusionConfig {
            crop_shape: Some([28, 28]),
            use_separate_rgb_encoder_per_camera: true,
            down_dims: vec![16, 32],
            diffusion_step_embed_dim: 8,
            spatial_softmax_num_keypoints: 4,
            horizon: 8,
            n_action_steps: 4,
            num_train_timesteps: 20,
            do_mask_loss_for_padding: true,
            ..DiffusionConfig::default()
        }
        .with_robot_state(3)
        .with_camera("observation.images.a", [3, 32, 32])
        .with_camera("observation.images.b", [3, 32, 32])
        .with_action(3)
    }

    /// Batch 2 of random (seeded) normalised data, the last action step padded.
    fn host_batch(cfg: &DiffusionConfig) -> HostBatch {
        let mut rng = step_rng(5, 0, 0);
        let (b, s, h, a) = (2, cfg.n_obs_steps, cfg.horizon, cfg.action_dim());
        HostBatch {
            batch_size: b,
            state: crate::normal_vec(&mut rng, b * s * 3),
            images: (0..2).map(|_| crate::normal_vec(&mut rng, b * s * 3 * 32 * 32)).collect(),
            action: crate::normal_vec(&mut rng, b * h * a),
            action_is_pad: (0..b * h).map(|i| i % h == h - 1).collect(),
        }
    }

    struct Probe(Diffusion<Flex>, DiffusionConfig);

    impl GradientProbe<Flex> for Probe {
        fn gradients<C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy>(&self, mode: CheckpointMode) -> (f32, NamedGradients) {
            let model = DiffusionTrain::<burn::backend::Autodiff<Flex, C>> { model: Diffusion::<burn::backend::Autodiff<Flex, C>>::from_inner(self.0.clone()).set_trainable(), precision: Precision::F32 };
            let batch = to_batch::<burn::backend::Autodiff<Flex, C>>(host_batch(&self.1), &self.1, 3, 1, 0, &Default::default());
            named_gradients(&model, &batch, mode)
        }
    }

    /// Block recomputation (the trainer's `--gradient_checkpointing=blocks` path on the model's
    /// stage plan: ResNet stages, conditioning, UNet blocks) and Burn's balanced checkpointing
    /// leave the gradients equal to the plain run (≤ 1e-5 relative to the largest gradient).
    #[test]
    fn checkpointing_modes_give_equal_gradients() {
        let cfg = tiny();
        let inner = cfg.init::<Flex>(&Default::default());
        // Parameters initialise lazily and each clone of an uninitialised one draws its own
        // values: read them once so every copy shares the same weights.
        let _ = vramlab_store::named_tensors::<Flex, _>(&inner);
        let (plain, gaps) = check_checkpointing_modes(&Probe(inner, cfg.clone()), 1e-5).unwrap();
        assert_eq!(plain.iter().map(|(_, g)| g.len()).sum::<usize>(), cfg.num_params(), "every parameter has a gradient");
        println!("diffusion: max |Δgrad| / max |grad| per mode: {gaps:?}");
    }
}
