//! ACT's training adapter: the trainable wrapper and its batches. The forward is the model's
//! own ([`Act`]'s stage plan): the trainer folds over it, or recomputes it stage by stage
//! (`--gradient_checkpointing=blocks`).

use crate::backend::TrainBackend;
use std::path::Path;

use burn::module::Module;
use burn::prelude::*;
use rand::Rng;
use vramlab_models::act::{Act, ActBatch, ActConfig, ActCtx, ActInput, ActOutput, PolicyFeatures};
use vramlab_models::nn::Precision;
use vramlab_store::WeightError;
use vramlab_train::{LossParts, TrainModel, step_rng};

use crate::config::DataFeatures;
use crate::policy_data::{HostBatch, Window};

/// The trainable wrapper: ACT plus the compute precision of its forward pass. The trainer sees
/// ACT's parameters under `act.` (`act.backbone.conv1.weight`, …).
#[derive(Module, Debug)]
pub struct ActTrain<B: Backend> {
    pub act: Act<B>,
    #[module(skip)]
    pub precision: Precision,
}

/// One training batch: model inputs with target actions, the VAE noise and the dropout seed.
pub struct ActTrainBatch<B: Backend> {
    pub batch: ActBatch<B>,
    pub eps: Option<Tensor<B, 2>>,
    pub dropout_seed: u64,
}

impl<B: TrainBackend> TrainModel<B> for ActTrain<B> {
    type Batch = ActTrainBatch<B>;
    type Model = Act<B>;

    fn model(&self) -> &Act<B> {
        &self.act
    }

    /// Training mode with the batch's VAE noise and, when the config has dropout, its masks.
    fn input(&self, b: &ActTrainBatch<B>) -> ActInput<B> {
        let mut ctx = ActCtx::train(self.precision);
        if let Some(eps) = &b.eps {
            ctx = ctx.with_eps(eps.clone());
        }
        if self.act.config.dropout > 0.0 {
            ctx = ctx.with_dropout(b.dropout_seed);
        }
        ActInput { batch: b.batch.clone(), ctx }
    }

    fn loss(&self, out: ActOutput<B>, b: &ActTrainBatch<B>) -> LossParts<B> {
        let action = b.batch.action.clone().expect("training batches carry actions");
        let l = self.act.loss(&out, action, b.batch.action_is_pad.clone());
        let parts = LossParts::new(l.loss).with("l1_loss", l.l1_loss);
        match l.kld_loss {
            Some(k) => parts.with("kld_loss", k),
            None => parts,
        }
    }

    fn save_weights(&self, path: &Path) -> Result<(), WeightError> {
        vramlab_models::act::save_weights(&self.act, path)
    }

    fn load_weights(self, path: &Path) -> Result<Self, WeightError> {
        let act = vramlab_models::act::load_weights(self.act, path)?.set_trainable();
        Ok(Self { act, precision: self.precision })
    }
}

/// The device batch of host batch `h` (micro-batch `micro` of `step`): the VAE noise and the
/// dropout seed are drawn here from `step_rng(seed, step, micro)`.
pub fn to_batch<B: Backend>(h: HostBatch, cfg: &ActConfig, seed: u64, step: u64, micro: u64, device: &B::Device) -> ActTrainBatch<B> {
    let mut rng = step_rng(seed, step, micro);
    let b = h.batch_size;
    let (c, a) = (cfg.chunk_size, cfg.action_dim());
    let state = cfg.robot_state_dim().map(|d| Tensor::from_data(TensorData::new(h.state, [b, d]), device));
    let images = cfg
        .image_features()
        .iter()
        .zip(h.images)
        .map(|((_, s), v)| Tensor::from_data(TensorData::new(v, [b, s[0], s[1], s[2]]), device))
        .collect();
    let action = Tensor::from_data(TensorData::new(h.action, [b, c, a]), device);
    let action_is_pad = Tensor::<B, 2, Bool>::from_data(TensorData::new(h.action_is_pad, [b, c]), device);
    let eps = cfg.use_vae.then(|| {
        let e = crate::normal_vec(&mut rng, b * cfg.latent_dim);
        Tensor::from_data(TensorData::new(e, [b, cfg.latent_dim]), device)
    });
    ActTrainBatch {
        batch: ActBatch { state, env_state: None, images, action: Some(action), action_is_pad: Some(action_is_pad) },
        eps,
        dropout_seed: rng.random::<u64>(),
    }
}

/// ACT's sample window: the current observation, `chunk_size` actions.
pub fn window(cfg_chunk_size: usize) -> Window {
    Window { obs_steps: None, actions: cfg_chunk_size }
}

/// The features of a config (for random data).
pub fn features_of(cfg: &ActConfig) -> DataFeatures {
    DataFeatures {
        state_dim: cfg.robot_state_dim(),
        action_dim: cfg.action_dim(),
        cameras: cfg.image_features().iter().map(|(k, s)| (k.to_string(), *s)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::module::AutodiffModule;
    use vramlab_train::CheckpointMode;
    use vramlab_train::recompute::{GradientProbe, NamedGradients, check_checkpointing_modes, named_gradients};

    use super::*;

    /// A tiny ACT with every part: VAE encoder, one camera (the full resnet18 trunk on 32×32),
    /// robot state, dropout.
    fn tiny(freeze_backbone: bool) -> ActConfig {
        ActConfig {
            chunk_size: 4,
            n_action_steps: 4,
            dim_model: 16,
            n_heads: 2,
            dim_feedforward: 32,
            n_encoder_layers: 2,
            n_vae_encoder_layers: 2,
            latent_dim: 4,
            freeze_backbone,
            ..ActConfig::default()
        }
        .with_robot_state(3)
        .with_camera("observation.images.top", [3, 32, 32])
        .with_action(3)
    }

    /// Batch 2 of random (seeded) normalised data, the last action step padded.
    fn host_batch(cfg: &ActConfig) -> HostBatch {
        let mut rng = step_rng(5, 0, 0);
        let (b, c, a) = (2, cfg.chunk_size, cfg.action_dim());
        HostBatch {
            batch_size: b,
            state: crate::normal_vec(&mut rng, b * 3),
            images: vec![crate::normal_vec(&mut rng, b * 3 * 32 * 32)],
            action: crate::normal_vec(&mut rng, b * c * a),
            action_is_pad: (0..b * c).map(|i| i % c == c - 1).collect(),
        }
    }

    struct Probe(Act<Flex>, ActConfig);

    impl GradientProbe<Flex> for Probe {
        fn gradients<C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy>(&self, mode: CheckpointMode) -> (f32, NamedGradients) {
            let model = ActTrain::<burn::backend::Autodiff<Flex, C>> { act: Act::<burn::backend::Autodiff<Flex, C>>::from_inner(self.0.clone()).set_trainable(), precision: Precision::F32 };
            let batch = to_batch::<burn::backend::Autodiff<Flex, C>>(host_batch(&self.1), &self.1, 3, 1, 0, &Default::default());
            named_gradients(&model, &batch, mode)
        }
    }

    /// Block recomputation (the trainer's `--gradient_checkpointing=blocks` path on ACT's stage
    /// plan) and Burn's balanced checkpointing leave the gradients equal to the plain run
    /// (≤ 1e-5 relative to the largest gradient), with and without a frozen backbone.
    #[test]
    fn checkpointing_modes_give_equal_gradients() {
        for freeze in [false, true] {
            let cfg = tiny(freeze);
            let inner = cfg.init::<Flex>(&Default::default());
            // Parameters initialise lazily and each clone of an uninitialised one draws its own
            // values: read them once so every copy shares the same weights.
            let _ = vramlab_store::named_tensors::<Flex, _>(&inner);
            let (plain, gaps) = check_checkpointing_modes(&Probe(inner, cfg.clone()), 1e-5).unwrap();
            let trainable = cfg.num_params() - if freeze { cfg.backbone_config().unwrap().num_parameters() } else { 0 };
            assert_eq!(plain.iter().map(|(_, g)| g.len()).sum::<usize>(), trainable, "every trainable parameter has a gradient");
            println!("act (freeze_backbone {freeze}): max |Δgrad| / max |grad| per mode: {gaps:?}");
        }
    }

    /// The optimizer preset's backbone group names the backbone as the trainer sees it.
    #[test]
    fn the_backbone_group_matches_the_wrapper() {
        let cfg = tiny(false);
        let model = ActTrain::<Flex> { act: cfg.init(&Default::default()), precision: Precision::F32 };
        let group = cfg.optimizer_preset().backbone.unwrap().under("act");
        let optim = vramlab_train::OptimConfig { groups: vec![vramlab_train::ParamGroup { prefix: group.prefix, lr: group.lr }], ..Default::default() };
        optim.check_groups::<Flex, _>(&model).unwrap();
    }
}
