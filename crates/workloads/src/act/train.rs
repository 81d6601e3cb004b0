//! ACT's training adapter: the trainable wrapper, its batches, and the stage chain.

use std::path::Path;

use burn::prelude::*;
use vramlab_models::act::{Act, ActBatch, ActConfig, ActCtx};
use vramlab_models::nn::Precision;

use crate::policy_data::{DataFeatures, HostBatch, Window};

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
