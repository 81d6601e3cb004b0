//! Diffusion Policy (lerobot) in the CLI: config from flags, info, predict.

use std::path::Path;

use anyhow::{Result, anyhow};
use burn::prelude::*;
use serde_json::Value;
use vramlab_models::diffusion::{DiffusionBatch, DiffusionConfig, DiffusionCtx};
use vramlab_models::nn::Precision;

/// Features when no dataset defines them: PushT (state 2, action 2, one 96×96 camera).
const FEATURE_KEYS: [&str; 3] = ["state_dim", "action_dim", "camera_shape"];

pub fn resolve_config(policy: &serde_json::Map<String, Value>) -> Result<DiffusionConfig> {
    let (mut fields, feat) = crate::workloads::split_policy(policy, &FEATURE_KEYS);
    // PushT's crop unless the flags say otherwise (lerobot's own default is no crop).
    fields.entry("crop_shape").or_insert(serde_json::json!([84, 84]));
    let mut cfg: DiffusionConfig = serde_json::from_value(Value::Object(fields)).map_err(|e| anyhow!("policy (diffusion): {e}"))?;
    use crate::workloads::{camera_shape, feature_uint};
    let shape = camera_shape(&feat, "camera_shape", [3, 96, 96])?;
    cfg = cfg
        .with_robot_state(feature_uint(&feat, "state_dim", 2)?)
        .with_camera("observation.image", shape)
        .with_action(feature_uint(&feat, "action_dim", 2)?);
    cfg.validate().map_err(|e| anyhow!("policy (diffusion): {e}"))?;
    Ok(cfg)
}

/// `vramlab predict` for a lerobot Diffusion `pretrained_model/` dir with the fixture's names:
/// `global_cond`; with `x_t` + `timesteps`, `unet_eps`; with `initial_noise`, `ddim_actions`
/// (the configured scheduler's sampling, DDIM in the fixture).
pub fn predict<B: Backend>(dir: &Path, inputs: &Path, precision: Precision, device: &B::Device) -> Result<Vec<(String, TensorData)>> {
    let (cfg, model) = vramlab_models::diffusion::load_pretrained::<B>(dir, device).map_err(|e| anyhow!(e))?;
    let map = vramlab_store::read_safetensors(inputs)?;
    let state = crate::workloads::input_tensor::<B, 3>(&map, inputs, "observation.state", device)?;
    let images = cfg.image_features().iter().map(|(k, _)| crate::workloads::input_tensor::<B, 5>(&map, inputs, k, device)).collect::<Result<Vec<_>>>()?;
    let batch = DiffusionBatch { state, images, env_state: None, action: None, action_is_pad: None };
    let ctx = DiffusionCtx::eval(precision);
    let cond = model.prepare_global_conditioning(&batch, &ctx);
    let mut out = vec![("global_cond".to_string(), cond.clone().into_data())];
    if let (Some(x), Some(t)) = (map.get("x_t"), map.get("timesteps")) {
        let x = Tensor::<B, 3>::from_data(x.clone().convert::<f32>(), device);
        let t: Vec<usize> = t.clone().convert::<i64>().to_vec::<i64>().map_err(|e| anyhow!("{}: timesteps: {e:?}", inputs.display()))?.into_iter().map(|v| v.max(0) as usize).collect();
        out.push(("unet_eps".into(), model.unet.forward(x, &t, cond.clone(), precision).into_data()));
    }
    if map.contains_key("initial_noise") {
        let noise = crate::workloads::input_tensor::<B, 3>(&map, inputs, "initial_noise", device)?;
        // DDPM draws fresh noise per step: predict is deterministic only for DDIM.
        let actions = model.generate_actions(&batch, noise, |_| None, &ctx);
        out.push(("ddim_actions".into(), actions.into_data()));
    }
    Ok(out)
}

/// Policy fields + the features of a dataset (lerobot takes the features from the dataset).
pub fn resolve_config_for(policy: &serde_json::Map<String, Value>, f: &DataFeatures) -> Result<DiffusionConfig> {
    let (mut fields, feat) = crate::workloads::split_policy(policy, &FEATURE_KEYS);
    if let Some(k) = feat.keys().next() {
        bail!("policy.{k}: the dataset defines the features; drop this flag");
    }
    fields.entry("crop_shape").or_insert(serde_json::json!([84, 84]));
    let mut cfg: DiffusionConfig = serde_json::from_value(Value::Object(fields)).map_err(|e| anyhow!("policy (diffusion): {e}"))?;
    let state = f.state_dim.ok_or_else(|| anyhow!("Diffusion Policy needs `observation.state`; the dataset has none"))?;
    cfg = cfg.with_robot_state(state);
    for (k, s) in &f.cameras {
        cfg = cfg.with_camera(k, *s);
    }
    cfg = cfg.with_action(f.action_dim);
    cfg.validate().map_err(|e| anyhow!("policy (diffusion): {e}"))?;
    Ok(cfg)
}

/// The config fields that shape the data window (before the features are known).
pub fn window_params(policy: &serde_json::Map<String, Value>) -> Result<DiffusionConfig> {
    let (fields, _) = crate::workloads::split_policy(policy, &FEATURE_KEYS);
    serde_json::from_value(Value::Object(fields)).map_err(|e| anyhow!("policy (diffusion): {e}"))
}

/// The features of a config (for random data).
pub fn features_of(cfg: &DiffusionConfig) -> DataFeatures {
    DataFeatures {
        state_dim: Some(cfg.state_dim()),
        action_dim: cfg.action_dim(),
        cameras: cfg.image_features().iter().map(|(k, s)| (k.to_string(), *s)).collect(),
    }
}

// ---------------------------------------------------------------------------------------------
// Training adapter

use anyhow::bail;
use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use rand::Rng;
use vramlab_models::diffusion::{ConditionalUnet1d, Diffusion};
use vramlab_store::WeightError;
use vramlab_train::{LossParts, StageTensor, Staged, TrainModel, step_rng};

use crate::workloads::policy_data::{DataFeatures, HostBatch};

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
    let noise = Tensor::from_data(TensorData::new(crate::workloads::normal_vec(&mut rng, b * hz * a), [b, hz, a]), device);
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
