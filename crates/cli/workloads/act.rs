//! ACT (lerobot) as a vramlab workload: config resolution from flags, info, predict.

use std::path::Path;

use anyhow::{Result, anyhow, bail};
use burn::prelude::*;
use serde_json::Value;
use vramlab_models::act::{Act, ActBatch, ActConfig, ActCtx, is_act_buffer};
use vramlab_models::nn::Precision;
use vramlab_models::resnet::count_params_and_buffers;

/// vramlab's shorthand for the features when no dataset defines them (lerobot takes them from
/// the dataset): robot state / action sizes and the cameras. Defaults: ALOHA-like, 14-dim
/// state and action, one 480×640 camera.
const FEATURE_KEYS: [&str; 4] = ["state_dim", "action_dim", "camera_shape", "num_cameras"];

pub use crate::workloads::policy_data::DataFeatures;
use crate::workloads::policy_data::{HostBatch, Window};

/// Policy fields + the features of a dataset (lerobot takes the features from the dataset).
pub fn resolve_config_for(policy: &serde_json::Map<String, Value>, f: &DataFeatures) -> Result<ActConfig> {
    let mut fields = serde_json::Map::new();
    for (k, v) in policy {
        if FEATURE_KEYS.contains(&k.as_str()) {
            bail!("policy.{k}: the dataset defines the features; drop this flag");
        }
        if k != "type" {
            fields.insert(k.clone(), v.clone());
        }
    }
    let mut cfg: ActConfig = serde_json::from_value(Value::Object(fields)).map_err(|e| anyhow!("policy (act): {e}"))?;
    if let Some(d) = f.state_dim {
        cfg = cfg.with_robot_state(d);
    }
    for (k, s) in &f.cameras {
        cfg = cfg.with_camera(k, *s);
    }
    cfg = cfg.with_action(f.action_dim);
    cfg.validate().map_err(|e| anyhow!("policy (act): {e}"))?;
    Ok(cfg)
}

pub fn resolve_config(policy: &serde_json::Map<String, Value>) -> Result<ActConfig> {
    let (fields, feat) = crate::workloads::split_policy(policy, &FEATURE_KEYS);
    let mut cfg: ActConfig = serde_json::from_value(Value::Object(fields)).map_err(|e| anyhow!("policy (act): {e}"))?;
    use crate::workloads::{camera_shape, feature_uint};
    let state = feature_uint(&feat, "state_dim", 14)?;
    let action = feature_uint(&feat, "action_dim", 14)?;
    let cams = feature_uint(&feat, "num_cameras", 1)?;
    let shape = camera_shape(&feat, "camera_shape", [3, 480, 640])?;
    if state > 0 {
        cfg = cfg.with_robot_state(state);
    }
    for i in 0..cams {
        let key = if cams == 1 { "observation.images.top".to_string() } else { format!("observation.images.cam{i}") };
        cfg = cfg.with_camera(&key, shape);
    }
    cfg = cfg.with_action(action);
    cfg.validate().map_err(|e| anyhow!("policy (act): {e}"))?;
    Ok(cfg)
}

/// Parameter rows for `vramlab info`: (module, parameters, trainable).
pub fn info_rows<B: Backend>(model: &Act<B>) -> Vec<(String, u64, u64)> {
    let count = |m: &dyn Fn() -> (usize, usize)| m().0 as u64;
    let backbone = model.backbone.as_ref().map_or(0, |b| count(&|| count_params_and_buffers::<B, _>(b, is_act_buffer)));
    let vae = model.vae_encoder.as_ref().map_or(0, |e| count(&|| count_params_and_buffers::<B, _>(e, is_act_buffer)));
    let enc = count(&|| count_params_and_buffers::<B, _>(&model.encoder, is_act_buffer));
    let dec = count(&|| count_params_and_buffers::<B, _>(&model.decoder, is_act_buffer));
    let total = model.num_parameters() as u64;
    let frozen = model.config.freeze_backbone;
    vec![
        ("backbone".into(), backbone, if frozen { 0 } else { backbone }),
        ("vae_encoder".into(), vae, vae),
        ("encoder".into(), enc, enc),
        ("decoder".into(), dec, dec),
        ("projections + embeddings".into(), total - backbone - vae - enc - dec, total - backbone - vae - enc - dec),
    ]
}

/// `vramlab predict` for a lerobot (or vramlab) ACT `pretrained_model/` directory, with the
/// fixture's tensor names: `eval_actions` (z = 0), and with actions given, the training pass
/// with the VAE noise set to 0 (`train_actions_z_mu`, `vae_mu`, `vae_log_sigma_x2`, `loss`,
/// `l1_loss`, `kld_loss`).
pub fn predict<B: Backend>(dir: &Path, inputs: &Path, precision: Precision, device: &B::Device) -> Result<Vec<(String, TensorData)>> {
    let (cfg, model) = vramlab_models::act::load_pretrained::<B>(dir, device).map_err(|e| anyhow!(e))?;
    let map = vramlab_store::read_safetensors(inputs)?;
    let state = match cfg.robot_state_dim() {
        Some(_) => Some(crate::workloads::input_tensor::<B, 2>(&map, inputs, "observation.state", device)?),
        None => None,
    };
    let env_state = match cfg.env_state() {
        Some((key, _)) => Some(crate::workloads::input_tensor::<B, 2>(&map, inputs, key, device)?),
        None => None,
    };
    let images = cfg.image_features().iter().map(|(k, _)| crate::workloads::input_tensor::<B, 4>(&map, inputs, k, device)).collect::<Result<Vec<_>>>()?;
    let action = match map.contains_key("action") {
        true => Some(crate::workloads::input_tensor::<B, 3>(&map, inputs, "action", device)?),
        false => None,
    };
    let action_is_pad = map.get("action_is_pad").map(|d| Tensor::<B, 2, Bool>::from_data(d.clone(), device));
    let mut batch = ActBatch { state, env_state, images, action: None, action_is_pad: None };
    let mut out = vec![("eval_actions".to_string(), model.forward(&batch, &ActCtx::eval(precision)).actions.into_data())];
    if let Some(action) = action {
        batch.action = Some(action.clone());
        batch.action_is_pad = action_is_pad.clone();
        let o = model.forward(&batch, &ActCtx::train(precision));
        let loss = model.loss(&o, action, action_is_pad);
        out.push(("train_actions_z_mu".into(), o.actions.into_data()));
        if let (Some(mu), Some(ls)) = (o.mu, o.log_sigma_x2) {
            out.push(("vae_mu".into(), mu.into_data()));
            out.push(("vae_log_sigma_x2".into(), ls.into_data()));
        }
        out.push(("loss".into(), loss.loss.into_data()));
        out.push(("l1_loss".into(), loss.l1_loss.into_data()));
        if let Some(k) = loss.kld_loss {
            out.push(("kld_loss".into(), k.into_data()));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Training adapter

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use rand::Rng;
use vramlab_models::act::ActOutput;
use vramlab_store::WeightError;
use vramlab_train::{LossParts, StageTensor, Staged, TrainModel, step_rng};

/// The trainable wrapper: ACT plus the compute precision of its forward pass.
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

impl<B: Backend> ActTrain<B> {
    fn ctx(&self, b: &ActTrainBatch<B>) -> ActCtx<B> {
        let mut ctx = ActCtx::train(self.precision);
        if let Some(eps) = &b.eps {
            ctx = ctx.with_eps(eps.clone());
        }
        if self.act.config.dropout > 0.0 {
            ctx = ctx.with_dropout(b.dropout_seed);
        }
        ctx
    }

    fn loss_parts(&self, out: &ActOutput<B>, b: &ActTrainBatch<B>) -> LossParts<B> {
        let action = b.batch.action.clone().expect("training batches carry actions");
        let l = self.act.loss(out, action, b.batch.action_is_pad.clone());
        let mut parts = LossParts::new(l.loss).with("l1_loss", l.l1_loss);
        if let Some(k) = l.kld_loss {
            parts = parts.with("kld_loss", k);
        }
        parts
    }

    fn has_vae(&self) -> bool {
        self.act.config.use_vae
    }

    /// The chain: backbone stem and 4 stages (all cameras at once), VAE input + each VAE
    /// layer, encoder input, each encoder layer, each decoder layer (the first also applies the
    /// encoder's final norm, the last the action head).
    fn plan(&self) -> Vec<ActStage> {
        let c = &self.act.config;
        let mut v = Vec::new();
        if !c.image_features().is_empty() {
            v.push(ActStage::Stem);
            v.extend((0..4).map(ActStage::Layer));
        }
        if self.has_vae() {
            v.push(ActStage::VaeIn);
            v.extend((0..c.n_vae_encoder_layers).map(ActStage::VaeLayer));
        }
        v.push(ActStage::EncIn);
        v.extend((0..c.n_encoder_layers).map(ActStage::EncLayer));
        v.extend((0..c.n_decoder_layers).map(ActStage::DecLayer));
        v
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum ActStage {
    Stem,
    Layer(usize),
    VaeIn,
    VaeLayer(usize),
    EncIn,
    EncLayer(usize),
    DecLayer(usize),
}

impl<B: AutodiffBackend> TrainModel<B> for ActTrain<B> {
    type Batch = ActTrainBatch<B>;

    fn forward_loss(&self, b: &Self::Batch) -> LossParts<B> {
        let out = self.act.forward(&b.batch, &self.ctx(b));
        self.loss_parts(&out, b)
    }

    fn staged(&self) -> Option<&dyn Staged<B, Self::Batch>> {
        Some(self)
    }

    fn save_weights(&self, path: &Path) -> Result<(), WeightError> {
        vramlab_models::act::save_weights(&self.act, path)
    }

    fn load_weights(self, path: &Path) -> Result<Self, WeightError> {
        let act = vramlab_models::act::load_weights(self.act, path)?.set_trainable();
        Ok(Self { act, precision: self.precision })
    }
}


/// State layout between stages:
/// - backbone: `[cam features…]`
/// - VAE: `[cam features…, vae tokens]`
/// - encoder: `[tokens, pos, (mu, log_sigma_x2)]`
/// - decoder: `[queries, encoder out, pos, (mu, log_sigma_x2)]`; after the last: `[actions, (mu, ls)]`
impl<B: AutodiffBackend> Staged<B, ActTrainBatch<B>> for ActTrain<B> {
    fn num_stages(&self) -> usize {
        self.plan().len()
    }

    fn input(&self, b: &ActTrainBatch<B>) -> Vec<StageTensor<B>> {
        b.batch.images.iter().cloned().map(StageTensor::R4).collect()
    }

    fn stage(&self, i: usize, s: Vec<StageTensor<B>>, b: &ActTrainBatch<B>) -> Vec<StageTensor<B>> {
        let plan = self.plan();
        let p = self.precision;
        let ctx = self.ctx(b);
        let a = &self.act;
        let cams = a.config.image_features().len();
        let backbone = || a.backbone.as_ref().expect("cameras need the backbone");
        match plan[i] {
            ActStage::Stem => s.iter().map(|t| StageTensor::R4(backbone().stem(t.r4(), p))).collect(),
            ActStage::Layer(l) => s.iter().map(|t| StageTensor::R4(backbone().layer(l, t.r4(), p))).collect(),
            ActStage::VaeIn => {
                let action = b.batch.action.clone().expect("training batches carry actions");
                let mut out = s;
                out.push(StageTensor::R3(a.vae_encoder_input(b.batch.state.clone(), action, p)));
                out
            }
            ActStage::VaeLayer(l) => {
                let mut out = s;
                let x = out.pop().map(|t| t.r3()).expect("vae tokens");
                let bsz = x.dims()[0];
                let mask = a.vae_key_padding_mask(bsz, b.batch.action_is_pad.clone(), &x.device());
                out.push(StageTensor::R3(a.vae_encoder_layer(l, x, &mask, &ctx)));
                out
            }
            ActStage::EncIn => {
                let feats: Vec<Tensor<B, 4>> = s.iter().take(cams).map(StageTensor::r4).collect();
                let bsz = b.batch.action.as_ref().map(|x| x.dims()[0]).unwrap_or_else(|| b.batch.batch_size());
                let (z, vae) = if self.has_vae() {
                    let (mu, ls) = a.vae_latent_params(s[cams].r3(), p);
                    (Act::<B>::latent_sample(mu.clone(), ls.clone(), ctx.eps.clone()), Some((mu, ls)))
                } else {
                    let device = b.batch.action.as_ref().map(|x| x.device()).expect("actions");
                    (Tensor::zeros([bsz, a.config.latent_dim], &device), None)
                };
                let (x, pos) = a.encoder_input(z, b.batch.state.clone(), b.batch.env_state.clone(), feats, p);
                let mut out = vec![StageTensor::R3(x), StageTensor::R3(pos)];
                if let Some((mu, ls)) = vae {
                    out.push(StageTensor::R2(mu));
                    out.push(StageTensor::R2(ls));
                }
                out
            }
            ActStage::EncLayer(l) => {
                let mut out = s;
                out[0] = StageTensor::R3(a.encoder_layer(l, out[0].r3(), &out[1].r3(), &ctx));
                out
            }
            ActStage::DecLayer(l) => {
                // Enter the decoder: [tokens, pos, vae…] → [queries, encoder out, pos, vae…].
                let s = if l == 0 {
                    let enc = a.encoder_final_norm(s[0].r3());
                    let q = a.decoder_input(enc.dims()[0], &enc.device());
                    let mut v = vec![StageTensor::R3(q), StageTensor::R3(enc)];
                    v.extend(s.into_iter().skip(1));
                    v
                } else {
                    s
                };
                let y = a.decoder_layer(l, s[0].r3(), s[1].r3(), &s[2].r3(), &ctx);
                if l + 1 == a.config.n_decoder_layers {
                    let mut v = vec![StageTensor::R3(a.action_head_out(y, p))];
                    v.extend(s.into_iter().skip(3));
                    v
                } else {
                    let mut v = s;
                    v[0] = StageTensor::R3(y);
                    v
                }
            }
        }
    }

    fn loss(&self, s: Vec<StageTensor<B>>, b: &ActTrainBatch<B>) -> LossParts<B> {
        let out = ActOutput {
            actions: s[0].r3(),
            mu: s.get(1).map(StageTensor::r2),
            log_sigma_x2: s.get(2).map(StageTensor::r2),
        };
        self.loss_parts(&out, b)
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
        let e = crate::workloads::normal_vec(&mut rng, b * cfg.latent_dim);
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
