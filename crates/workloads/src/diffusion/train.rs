//! Diffusion Policy's training adapter: the trainable wrapper, its batches, and the stage chain.

use std::path::Path;

use burn::prelude::*;
use vramlab_models::diffusion::{DiffusionBatch, DiffusionConfig, DiffusionCtx};
use vramlab_models::nn::Precision;

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use rand::Rng;
use vramlab_models::diffusion::{ConditionalUnet1d, Diffusion};
use vramlab_store::WeightError;
use vramlab_train::{LossParts, StageTensor, Staged, TrainModel, step_rng};

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

/// One link of the staged forward pass.
#[derive(Clone, Copy, Debug, PartialEq)]
enum DiffStage {
    /// ResNet stem / stage `i` of every RGB encoder.
    Stem,
    Layer(usize),
    /// Encoder heads, global conditioning, step embedding → `[x, cond]`.
    Cond,
    /// UNet residual block `(level, j)`; `j = 1` also stores the skip and downsamples.
    Down(usize, usize),
    Mid(usize),
    /// `j = 0` also concatenates the skip; `j = 1` also upsamples.
    Up(usize, usize),
    Out,
}

impl<B: Backend> DiffusionTrain<B> {
    fn ctx(&self, b: &DiffusionTrainBatch<B>) -> DiffusionCtx {
        let ctx = DiffusionCtx::train(self.precision);
        if b.crop_offsets.is_empty() { ctx } else { ctx.with_crop_offsets(b.crop_offsets.clone()) }
    }

    fn plan(&self) -> Vec<DiffStage> {
        let m = &self.model;
        let mut v = Vec::new();
        if m.num_rgb_encoders() > 0 {
            v.push(DiffStage::Stem);
            v.extend((0..4).map(DiffStage::Layer));
        }
        v.push(DiffStage::Cond);
        for i in 0..m.unet.num_levels() {
            v.extend([DiffStage::Down(i, 0), DiffStage::Down(i, 1)]);
        }
        v.extend((0..m.unet.mid_modules.len()).map(DiffStage::Mid));
        for i in 0..m.unet.up_modules.len() {
            v.extend([DiffStage::Up(i, 0), DiffStage::Up(i, 1)]);
        }
        v.push(DiffStage::Out);
        v
    }

    fn loss_parts(&self, pred: Tensor<B, 3>, b: &DiffusionTrainBatch<B>) -> LossParts<B> {
        let action = b.batch.action.clone().expect("training batches carry actions");
        LossParts::new(self.model.loss_from_prediction(pred, action, b.noise.clone(), b.batch.action_is_pad.clone()))
    }
}

impl<B: AutodiffBackend> TrainModel<B> for DiffusionTrain<B> {
    type Batch = DiffusionTrainBatch<B>;

    fn forward_loss(&self, b: &Self::Batch) -> LossParts<B> {
        let m = &self.model;
        let ctx = self.ctx(b);
        let cond = m.prepare_global_conditioning(&b.batch, &ctx);
        let action = b.batch.action.clone().expect("training batches carry actions");
        let noisy = m.noise_scheduler.add_noise(action, b.noise.clone(), &b.timesteps);
        let pred = m.unet.forward(noisy, &b.timesteps, cond, self.precision);
        self.loss_parts(pred, b)
    }

    fn staged(&self) -> Option<&dyn Staged<B, Self::Batch>> {
        Some(self)
    }

    fn save_weights(&self, path: &Path) -> Result<(), WeightError> {
        vramlab_models::diffusion::save_weights(&self.model, path)
    }

    fn load_weights(self, path: &Path) -> Result<Self, WeightError> {
        let model = vramlab_models::diffusion::load_weights(self.model, path)?.set_trainable();
        Ok(Self { model, precision: self.precision })
    }
}


/// State layout between stages:
/// - backbone: `[encoder inputs / features…, noisy actions]`
/// - UNet: `[x, cond, skips…]`; after `Out`: `[prediction]`
impl<B: AutodiffBackend> Staged<B, DiffusionTrainBatch<B>> for DiffusionTrain<B> {
    fn num_stages(&self) -> usize {
        self.plan().len()
    }

    fn input(&self, b: &DiffusionTrainBatch<B>) -> Vec<StageTensor<B>> {
        let m = &self.model;
        let ctx = self.ctx(b);
        let mut v: Vec<StageTensor<B>> = (0..m.num_rgb_encoders()).map(|e| StageTensor::R4(m.encoder_input(e, &b.batch.images, &ctx))).collect();
        let action = b.batch.action.clone().expect("training batches carry actions");
        v.push(StageTensor::R3(m.noise_scheduler.add_noise(action, b.noise.clone(), &b.timesteps)));
        v
    }

    fn stage(&self, i: usize, s: Vec<StageTensor<B>>, b: &DiffusionTrainBatch<B>) -> Vec<StageTensor<B>> {
        let m = &self.model;
        let p = self.precision;
        let n_enc = m.num_rgb_encoders();
        let map_enc = |s: Vec<StageTensor<B>>, f: &dyn Fn(usize, Tensor<B, 4>) -> Tensor<B, 4>| -> Vec<StageTensor<B>> {
            s.into_iter().enumerate().map(|(e, t)| if e < n_enc { StageTensor::R4(f(e, t.r4())) } else { t }).collect()
        };
        let push = |mut s: Vec<StageTensor<B>>, x: Tensor<B, 3>| {
            s[0] = StageTensor::R3(x);
            s
        };
        match self.plan()[i] {
            DiffStage::Stem => map_enc(s, &|e, x| m.rgb_encoder(e).backbone.stem(x, p)),
            DiffStage::Layer(l) => map_enc(s, &|e, x| m.rgb_encoder(e).backbone.layer(l, x, p)),
            DiffStage::Cond => {
                let [bsz, steps, _] = b.batch.state.dims();
                let feats = (n_enc > 0).then(|| {
                    let heads = (0..n_enc).map(|e| m.rgb_encoder(e).head(s[e].r4(), p)).collect();
                    Diffusion::<B>::image_features_from_heads(heads, bsz, steps)
                });
                let gc = m.global_conditioning(b.batch.state.clone(), feats, b.batch.env_state.clone());
                let cond = m.unet.cond_feature(&b.timesteps, gc, p);
                vec![StageTensor::R3(ConditionalUnet1d::<B>::input(s[n_enc].r3())), StageTensor::R2(cond)]
            }
            DiffStage::Down(l, j) => {
                let x = m.unet.down_block(l, j, s[0].r3(), &s[1].r2(), p);
                if j == 1 {
                    let mut s = s;
                    s.push(StageTensor::R3(x.clone()));
                    push(s, m.unet.downsample(l, x, p))
                } else {
                    push(s, x)
                }
            }
            DiffStage::Mid(j) => {
                let x = m.unet.mid_block(j, s[0].r3(), &s[1].r2(), p);
                push(s, x)
            }
            DiffStage::Up(l, 0) => {
                let mut s = s;
                let skip = s.pop().map(|t| t.r3()).expect("one skip per level");
                let x = ConditionalUnet1d::<B>::up_concat(s[0].r3(), skip, p);
                let x = m.unet.up_block(l, 0, x, &s[1].r2(), p);
                push(s, x)
            }
            DiffStage::Up(l, _) => {
                let x = m.unet.up_block(l, 1, s[0].r3(), &s[1].r2(), p);
                push(s, m.unet.upsample(l, x, p))
            }
            DiffStage::Out => vec![StageTensor::R3(m.unet.output(s[0].r3(), p))],
        }
    }

    fn loss(&self, s: Vec<StageTensor<B>>, b: &DiffusionTrainBatch<B>) -> LossParts<B> {
        self.loss_parts(s[0].r3(), b)
    }
}
