//! The Action Chunking Transformer, natively in Burn: the model and its stage plan.
//!
//! Reference: huggingface/lerobot v0.4.4 `src/lerobot/policies/act/modeling_act.py` — `ACT`
//! and `ACTPolicy.forward` (the loss). Its transformer layers and position embeddings are in
//! [`super::layers`].
//!
//! Field names are lerobot's `ACT` attribute names, so the parameter names are the policy's
//! state-dict keys without the policy's `model.` prefix (the loader adds / strips it, see
//! [`super::load`]). Optional parts (VAE encoder, robot-state / env-state projections,
//! backbone) are `Option`s, absent exactly when lerobot does not build them.
//!
//! # Layout and precision
//! Tensors are batch-first (`[batch, seq, dim]`; lerobot is sequence-first, which changes no
//! arithmetic). Matmuls and convolutions run in the forward's [`Precision`]; the residual
//! stream of the transformers, LayerNorm, softmax, positions, the outputs (`actions`, the
//! posterior `[mu | log_sigma_x2]`) and the loss are f32 (as torch autocast: LayerNorm outputs f32, so the
//! post-norm residual stream is f32 there too).
//!
//! # Training vs eval ([`ActCtx`])
//! As lerobot: the VAE encoder runs only when `use_vae`, training and actions are given; then
//! `z = mu + exp(log_sigma_x2 / 2) · eps` with the caller's `eps` (`None` → `z = mu`, i.e.
//! eps = 0). Otherwise `z = 0` and the posterior is `None`. Where [`LeanBackend::lean_loss_nodes`]
//! (CubeCL) the sample and the loss are nodes reading the posterior's `[b, 2·latent]`
//! parameters whole ([`crate::nn::lean::posterior_sample`], [`crate::nn::lean::act_loss`]): two
//! launches for the sample with its backward, three for the loss, where the composed ops took 53
//! (ACT on lavapipe, `benches/results/kernels/wgpu/launch_trims.md`); flex composes them here. Dropout (rate
//! `config.dropout`) applies only in training and only with a [`DropoutCtx`] (deterministic
//! masks); without one it is off.
//!
//! # Stages
//! [`Act`] implements [`Staged`]: [`Act::forward`] is the fold over this plan (`ActInput` is
//! the batch and the [`ActCtx`]); block checkpointing runs the same stages.
//!
//! | stage ([`ActStage`]) | computes | state after ([`ActState`]) |
//! |---|---|---|
//! | `VaeInput` (VAE pass only) | cls, robot-state and action projections; the key padding mask from `action_is_pad` | `Vae`: tokens `[b, 2+chunk, d]` f32, the mask (a [`Constant`]: built once, not differentiated) |
//! | `VaeLayer(i)` | VAE encoder layer `i` | `Vae` |
//! | `VaePosterior` | final norm (`pre_norm`), cls token, `vae_encoder_latent_output_proj` | `Backbone`: no maps yet, [`Posterior`] `[mu | log_sigma_x2]` `[b, 2·latent]` |
//! | `Backbone(s)` (cameras only) | the [`ResNet`] stage `s` on every camera (the stem reads the batch's images) | `Backbone`: maps `[b, c, h, w]` |
//! | `EncoderInput` | `z` (posterior sample, or 0), input projections, 1×1 image projection, positions | `Encoder`: tokens `[b, s, d]` f32, pos `[1, s, d]` f32 |
//! | `EncoderLayer(i)` | encoder layer `i` | `Encoder` |
//! | `DecoderInput` | the encoder's final norm (`pre_norm`); zero queries | `Decoder`: queries `[b, chunk, d]`, memory `[b, s, d]`, pos |
//! | `DecoderLayer(i)` | decoder layer `i` | `Decoder` |
//! | `ActionHead` | `decoder.norm`, `action_head` | `Actions`: `[b, chunk, action_dim]` f32 |
//!
//! The posterior rides along to the output (the loss's KL term needs it); the encoder's `pos`
//! depends on a parameter (`encoder_1d_feature_pos_embed`), so it travels in the state too.
//! [`Act::loss`] is lerobot's `ACTPolicy.forward` loss on the output.

use burn::module::{Module, Param};
use burn::nn::PaddingConfig2d;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::prelude::*;
use crate::nn::LeanBackend;
use burn::tensor::TensorData;

use super::config::{ActConfig, PolicyFeatures};
use super::layers::{
    ActDecoder, ActDecoderLayer, ActEncoder, BLOCK_DECODER, BLOCK_ENCODER, BLOCK_VAE, LayerCtx, sinusoidal_pos_embedding_1d, sinusoidal_pos_embedding_2d,
};
use crate::nn::{DropoutCtx, Embedding, KeyPaddingMask, LayerNorm, Linear, Precision, conv2d_p, to_f32};
use crate::resnet::{FROZEN_BN_CONTAINER, OUT_CHANNELS, ResNet, ResNetStage, count_params_and_buffers, set_trainable};
use crate::stages::{Constant, Staged};

/// How the forward runs: precision, training mode, the VAE noise and dropout masks.
#[derive(Clone, Debug)]
pub struct ActCtx<B: Backend> {
    pub precision: Precision,
    /// lerobot's `self.training`: enables the VAE encoder (with actions) and dropout.
    pub training: bool,
    /// VAE noise `[b, latent]` (training with the VAE only): `None` → `z = mu`.
    pub eps: Option<Tensor<B, 2>>,
    /// Dropout masks (training only): `None` → no dropout even when `config.dropout > 0`.
    pub dropout: Option<DropoutCtx>,
}

impl<B: LeanBackend> ActCtx<B> {
    /// Inference: `z = 0`, no dropout.
    pub fn eval(precision: Precision) -> Self {
        Self { precision, training: false, eps: None, dropout: None }
    }

    /// Training: VAE encoder on (when configured), `z = mu` until [`ActCtx::with_eps`], no
    /// dropout until [`ActCtx::with_dropout`].
    pub fn train(precision: Precision) -> Self {
        Self { precision, training: true, eps: None, dropout: None }
    }

    pub fn with_eps(mut self, eps: Tensor<B, 2>) -> Self {
        self.eps = Some(eps);
        self
    }

    pub fn with_dropout(mut self, seed: u64) -> Self {
        self.dropout = Some(DropoutCtx::new(seed));
        self
    }
}

/// Model inputs (already normalised, as `policy.model(batch)` sees them).
#[derive(Clone, Debug)]
pub struct ActBatch<B: Backend> {
    /// `observation.state` `[b, state_dim]` (required when the config has it).
    pub state: Option<Tensor<B, 2>>,
    /// The ENV input `[b, env_dim]` (required when the config has it).
    pub env_state: Option<Tensor<B, 2>>,
    /// One `[b, 3, h, w]` per camera, in [`ActConfig::image_features`] order.
    pub images: Vec<Tensor<B, 4>>,
    /// Target actions `[b, chunk, action_dim]` (training).
    pub action: Option<Tensor<B, 3>>,
    /// `[b, chunk]`, `true` = padding (absent: no padding).
    pub action_is_pad: Option<Tensor<B, 2, Bool>>,
}

impl<B: LeanBackend> ActBatch<B> {
    pub fn batch_size(&self) -> usize {
        self.images
            .first()
            .map(|i| i.dims()[0])
            .or_else(|| self.env_state.as_ref().map(|e| e.dims()[0]))
            .expect("ActBatch: needs images or env_state")
    }

    pub fn device(&self) -> B::Device {
        self.images.first().map(|i| i.device()).or_else(|| self.env_state.as_ref().map(|e| e.device())).expect("ActBatch: needs images or env_state")
    }
}

/// What [`Act::forward`] returns; all f32.
#[derive(Clone, Debug)]
pub struct ActOutput<B: Backend> {
    /// `[b, chunk, action_dim]`
    pub actions: Tensor<B, 3>,
    /// The VAE posterior's parameters `[mu | log_sigma_x2]`, `[b, 2·latent]`
    /// (`vae_encoder_latent_output_proj`'s output; VAE training pass only)
    pub posterior: Option<Tensor<B, 2>>,
}

impl<B: Backend> ActOutput<B> {
    /// `mu`, `[b, latent]` (VAE training pass only).
    pub fn mu(&self) -> Option<Tensor<B, 2>> {
        self.posterior.clone().map(|p| Posterior { params: p }.mu())
    }
    /// `log_sigma_x2` (`2·log σ`), `[b, latent]` (VAE training pass only).
    pub fn log_sigma_x2(&self) -> Option<Tensor<B, 2>> {
        self.posterior.clone().map(|p| Posterior { params: p }.log_sigma_x2())
    }
}

/// lerobot's `ACTPolicy.forward` loss; each `[1]`, f32.
#[derive(Clone, Debug)]
pub struct ActLoss<B: Backend> {
    /// `l1_loss + kl_weight · kld_loss` (just `l1_loss` without the KL term)
    pub loss: Tensor<B, 1>,
    /// `(|a − â| · ¬pad).mean()` over all elements (padded ones count in the denominator)
    pub l1_loss: Tensor<B, 1>,
    /// `mean_b Σ_latent −½(1 + log σ² − μ² − σ²)`, when the posterior is present
    pub kld_loss: Option<Tensor<B, 1>>,
}

/// What the stages of [`Act`] read: the model inputs and how the forward runs.
#[derive(Clone, Debug)]
pub struct ActInput<B: Backend> {
    pub batch: ActBatch<B>,
    pub ctx: ActCtx<B>,
}

/// The VAE posterior: its parameters `[mu | log_sigma_x2]`, `[b, 2·latent]` f32.
#[derive(Clone, Debug)]
pub struct Posterior<B: Backend> {
    pub params: Tensor<B, 2>,
}
vramlab_stages::tensor_bundle!(struct Posterior { params });

impl<B: Backend> Posterior<B> {
    fn latent(&self) -> usize {
        self.params.dims()[1] / 2
    }
    /// `[b, latent]`
    pub fn mu(&self) -> Tensor<B, 2> {
        self.params.clone().narrow(1, 0, self.latent())
    }
    /// `2·log σ`, `[b, latent]`
    pub fn log_sigma_x2(&self) -> Tensor<B, 2> {
        let l = self.latent();
        self.params.clone().narrow(1, l, l)
    }
}

/// What flows between [`Act`]'s stages (see the module docs for the plan). Every variant after
/// the VAE carries the posterior (when the VAE encoder ran) to the output, for the KL term.
#[derive(Clone, Debug)]
pub enum ActState<B: Backend> {
    /// Nothing computed yet (every input comes from the batch).
    Start {},
    /// VAE encoder tokens `[b, 2+chunk, d]` f32 and their key padding mask (from
    /// `action_is_pad`; built once for the encoder's layers, not differentiated).
    Vae { tokens: Tensor<B, 3>, key_padding_mask: Constant<KeyPaddingMask<B>> },
    /// Per-camera backbone maps so far (empty before the stem, which reads the batch's images).
    Backbone { features: Vec<Tensor<B, 4>>, posterior: Option<Posterior<B>> },
    /// Encoder tokens `[b, s, d]` f32 and their positions `[1, s, d]` (which depend on a
    /// parameter, so they travel with their gradient).
    Encoder { tokens: Tensor<B, 3>, pos: Tensor<B, 3>, posterior: Option<Posterior<B>> },
    /// Decoder queries `[b, chunk, d]`, the encoder output (`memory`) and its positions.
    Decoder { queries: Tensor<B, 3>, memory: Tensor<B, 3>, pos: Tensor<B, 3>, posterior: Option<Posterior<B>> },
    /// The actions `[b, chunk, action_dim]` f32.
    Actions { actions: Tensor<B, 3>, posterior: Option<Posterior<B>> },
}
vramlab_stages::tensor_bundle!(enum ActState {
    Start {},
    Vae { tokens, key_padding_mask },
    Backbone { features, posterior },
    Encoder { tokens, pos, posterior },
    Decoder { queries, memory, pos, posterior },
    Actions { actions, posterior },
});

impl<B: LeanBackend> ActState<B> {
    fn unexpected(&self, stage: ActStage) -> ! {
        let name = match self {
            Self::Start {} => "Start",
            Self::Vae { .. } => "Vae",
            Self::Backbone { .. } => "Backbone",
            Self::Encoder { .. } => "Encoder",
            Self::Decoder { .. } => "Decoder",
            Self::Actions { .. } => "Actions",
        };
        panic!("Act: stage {stage:?} cannot follow a {name} state (stage plan bug)")
    }
}

/// A stage of [`Act`] (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActStage {
    /// VAE encoder tokens: cls, robot-state and action projections.
    VaeInput,
    /// VAE encoder layer `i`.
    VaeLayer(usize),
    /// The VAE encoder's final norm and latent projection: the posterior.
    VaePosterior,
    /// A backbone stage, on every camera.
    Backbone(ResNetStage),
    /// The latent sample, the input projections and the positions.
    EncoderInput,
    /// Transformer encoder layer `i`.
    EncoderLayer(usize),
    /// The encoder's final norm; the zero decoder queries.
    DecoderInput,
    /// Decoder layer `i`.
    DecoderLayer(usize),
    /// `decoder.norm`, `action_head`.
    ActionHead,
}

/// lerobot's `ACT` module.
#[derive(Module, Debug)]
pub struct Act<B: Backend> {
    pub vae_encoder: Option<ActEncoder<B>>,
    pub vae_encoder_cls_embed: Option<Embedding<B>>,
    pub vae_encoder_robot_state_input_proj: Option<Linear<B>>,
    pub vae_encoder_action_input_proj: Option<Linear<B>>,
    pub vae_encoder_latent_output_proj: Option<Linear<B>>,
    /// Buffer `[1, 2+chunk, d]` (1+chunk without robot state): fixed sine positions.
    pub vae_encoder_pos_enc: Option<Param<Tensor<B, 3>>>,
    pub backbone: Option<ResNet<B>>,
    pub encoder: ActEncoder<B>,
    pub decoder: ActDecoder<B>,
    pub encoder_robot_state_input_proj: Option<Linear<B>>,
    pub encoder_env_state_input_proj: Option<Linear<B>>,
    pub encoder_latent_input_proj: Linear<B>,
    /// 1×1 conv `512 → d` over the layer4 map.
    pub encoder_img_feat_input_proj: Option<Conv2d<B>>,
    pub encoder_1d_feature_pos_embed: Embedding<B>,
    pub decoder_pos_embed: Embedding<B>,
    pub action_head: Linear<B>,
    /// The config the model was built from (not a parameter).
    pub config: ActConfig,
}

/// The buffer rule of [`Act`] (PyTorch `register_buffer` / FrozenBatchNorm2d tensors).
pub fn is_act_buffer(container: &str, field: &str) -> bool {
    container == FROZEN_BN_CONTAINER || (container == "Struct:Act" && field == "vae_encoder_pos_enc")
}

impl ActConfig {
    /// Build the model with lerobot's initialisation (Xavier-uniform transformer matrices,
    /// PyTorch defaults elsewhere; the backbone gets torchvision's random init — lerobot's
    /// default ImageNet weights are not fetched). With `freeze_backbone` the backbone is
    /// frozen. Panics on an invalid config; call [`ActConfig::validate`] for an error instead.
    pub fn init<B: LeanBackend>(&self, device: &B::Device) -> Act<B> {
        if let Err(e) = self.validate() {
            panic!("invalid ActConfig: {e}");
        }
        let d = self.dim_model;
        let state = self.robot_state_dim();
        let a = self.action_dim();
        let vae = self.use_vae;
        let pos_enc = || {
            let n = self.vae_seq_len();
            let t = Tensor::<B, 3>::from_data(TensorData::new(sinusoidal_pos_embedding_1d(n, d), [1, n, d]), device);
            Param::from_tensor(t).set_require_grad(false)
        };
        let backbone = self.backbone_config().map(|bb| bb.init(device));
        let model = Act {
            vae_encoder: vae.then(|| ActEncoder::new(self, self.n_vae_encoder_layers, device)),
            vae_encoder_cls_embed: vae.then(|| Embedding::new(1, d, device)),
            vae_encoder_robot_state_input_proj: state.filter(|_| vae).map(|s| Linear::new(s, d, device)),
            vae_encoder_action_input_proj: vae.then(|| Linear::new(a, d, device)),
            vae_encoder_latent_output_proj: vae.then(|| Linear::new(d, 2 * self.latent_dim, device)),
            vae_encoder_pos_enc: vae.then(pos_enc),
            encoder_img_feat_input_proj: backbone.as_ref().map(|_| {
                Conv2dConfig::new([OUT_CHANNELS, d], [1, 1]).with_padding(PaddingConfig2d::Valid).init(device)
            }),
            backbone,
            encoder: ActEncoder::new(self, self.n_encoder_layers, device),
            decoder: ActDecoder {
                layers: (0..self.n_decoder_layers).map(|_| ActDecoderLayer::new(self, device)).collect(),
                norm: LayerNorm::new(d, device),
            },
            encoder_robot_state_input_proj: state.map(|s| Linear::new(s, d, device)),
            encoder_env_state_input_proj: self.env_state_dim().map(|e| Linear::new(e, d, device)),
            encoder_latent_input_proj: Linear::new(self.latent_dim, d, device),
            encoder_1d_feature_pos_embed: Embedding::new(self.n_1d_tokens(), d, device),
            decoder_pos_embed: Embedding::new(self.chunk_size, d, device),
            action_head: Linear::new(d, a, device),
            config: self.clone(),
        };
        if self.freeze_backbone { model.with_frozen_backbone() } else { model }
    }
}

impl<B: LeanBackend> Act<B> {
    fn layer_ctx<'a>(&self, ctx: &'a ActCtx<B>, block: u64, layer: usize) -> LayerCtx<'a> {
        LayerCtx {
            precision: ctx.precision,
            dropout: ctx.dropout.as_ref().filter(|_| ctx.training),
            rate: self.config.dropout,
            block,
            layer,
        }
    }

    /// Whether a forward with `ctx` and `action` runs the VAE encoder (lerobot:
    /// `use_vae and ACTION in batch and self.training`).
    pub fn uses_vae_encoder(&self, ctx: &ActCtx<B>, has_action: bool) -> bool {
        self.config.use_vae && ctx.training && has_action
    }

    /// lerobot's `ACT.forward`: the fold over [`Act`]'s stages (see the module docs).
    pub fn forward(&self, batch: &ActBatch<B>, ctx: &ActCtx<B>) -> ActOutput<B> {
        self.run(&ActInput { batch: batch.clone(), ctx: ctx.clone() })
    }

    /// VAE encoder tokens `[cls, (robot state), actions…]`.
    ///
    /// # Shapes
    /// - state: `[b, state_dim]`; action: `[b, chunk, action_dim]` → `[b, 2+chunk, d]` f32
    fn vae_encoder_input(&self, state: Option<Tensor<B, 2>>, action: Tensor<B, 3>, p: Precision) -> Tensor<B, 3> {
        let [b, _, _] = action.dims();
        let d = self.config.dim_model;
        let cls = self.vae_encoder_cls_embed.as_ref().expect("use_vae").weight.val().reshape([1, 1, d]).expand([b, 1, d]);
        let mut tokens = vec![cls];
        if let Some(proj) = &self.vae_encoder_robot_state_input_proj {
            let s = state.expect("ActBatch.state is required: the config has observation.state");
            tokens.push(to_f32(proj.forward(s, p)).reshape([b, 1, d]));
        }
        let proj = self.vae_encoder_action_input_proj.as_ref().expect("use_vae");
        tokens.push(to_f32(proj.forward(action, p)));
        Tensor::cat(tokens, 1)
    }

    /// `[False (cls), False (state), action_is_pad…]` as `[b, 2+chunk]` (`true` = ignore).
    fn vae_key_padding_mask(&self, batch_size: usize, action_is_pad: Option<Tensor<B, 2, Bool>>, device: &B::Device) -> KeyPaddingMask<B> {
        let lead = self.config.vae_seq_len() - self.config.chunk_size;
        let pad = action_is_pad.unwrap_or_else(|| Tensor::<B, 2, Bool>::zeros([batch_size, self.config.chunk_size], device));
        let head = Tensor::<B, 2, Bool>::zeros([batch_size, lead], device);
        KeyPaddingMask::new(Tensor::cat(vec![head, pad], 1))
    }

    /// VAE encoder layer `i` (positions: the `vae_encoder_pos_enc` buffer).
    fn vae_encoder_layer(&self, i: usize, x: Tensor<B, 3>, mask: &KeyPaddingMask<B>, ctx: &ActCtx<B>) -> Tensor<B, 3> {
        let enc = self.vae_encoder.as_ref().expect("use_vae");
        let pos = self.vae_encoder_pos_enc.as_ref().expect("use_vae").val();
        enc.layers[i].forward(x, Some(&pos), Some(mask), &self.layer_ctx(ctx, BLOCK_VAE, i))
    }

    /// The posterior from the VAE encoder's last layer output: the encoder's final norm
    /// (`pre_norm` only; per token, so applied to the cls token alone), then
    /// `vae_encoder_latent_output_proj` on the cls token.
    fn vae_posterior(&self, x: Tensor<B, 3>, p: Precision) -> Posterior<B> {
        let [b, _, d] = x.dims();
        let cls = x.narrow(1, 0, 1);
        let cls = self.vae_encoder.as_ref().expect("use_vae").final_norm(cls).reshape([b, d]);
        Posterior { params: to_f32(self.vae_encoder_latent_output_proj.as_ref().expect("use_vae").forward(cls, p)) } // [b, 2l]
    }

    /// Transformer encoder tokens `[latent, (state), (env state), camera pixels…]` and their
    /// positions (`encoder_1d_feature_pos_embed` rows, then the 2-D sine table per camera).
    /// `z = mu + exp(log_sigma_x2 / 2) · eps` with the posterior (`eps = None` → `mu`), else 0.
    ///
    /// # Shapes
    /// - cam_features: layer4 maps `[b, 512, h', w']`
    /// - returns tokens `[b, s, d]` f32 and pos `[1, s, d]` f32
    fn encoder_input(&self, posterior: Option<&Posterior<B>>, cam_features: Vec<Tensor<B, 4>>, input: &ActInput<B>) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let (batch, p) = (&input.batch, input.ctx.precision);
        let (b, d, device) = (batch.batch_size(), self.config.dim_model, batch.device());
        let z = match posterior {
            Some(post) => match &input.ctx.eps {
                Some(eps) => {
                    assert_eq!(eps.dims(), [b, post.latent()], "ActCtx.eps must be [batch, latent_dim]");
                    sample(post, to_f32(eps.clone()), B::lean_loss_nodes())
                }
                None => post.mu(),
            },
            None => Tensor::zeros([b, self.config.latent_dim], &device),
        };
        let mut tokens = vec![to_f32(self.encoder_latent_input_proj.forward(z, p)).reshape([b, 1, d])];
        if let Some(proj) = &self.encoder_robot_state_input_proj {
            let s = batch.state.clone().expect("ActBatch.state is required: the config has observation.state");
            tokens.push(to_f32(proj.forward(s, p)).reshape([b, 1, d]));
        }
        if let Some(proj) = &self.encoder_env_state_input_proj {
            let e = batch.env_state.clone().expect("ActBatch.env_state is required: the config has an ENV input");
            tokens.push(to_f32(proj.forward(e, p)).reshape([b, 1, d]));
        }
        let mut pos = vec![self.encoder_1d_feature_pos_embed.weight.val()]; // [n_1d, d]
        for feats in cam_features {
            let [_, _, h, w] = feats.dims();
            let proj = self.encoder_img_feat_input_proj.as_ref().expect("the config has no camera");
            let f = to_f32(conv2d_p(proj, feats, p)); // [b, d, h, w]
            tokens.push(f.reshape([b, d, h * w]).swap_dims(1, 2)); // [b, h·w, d]
            pos.push(Tensor::from_data(TensorData::new(sinusoidal_pos_embedding_2d(h, w, d), [h * w, d]), &device));
        }
        let tokens = Tensor::cat(tokens, 1);
        let pos = Tensor::cat(pos, 0).unsqueeze_dim::<3>(0);
        (tokens, pos)
    }

    /// Decoder layer `i`: queries get `decoder_pos_embed`, keys `encoder_pos`.
    fn decoder_layer(&self, i: usize, x: Tensor<B, 3>, memory: Tensor<B, 3>, encoder_pos: &Tensor<B, 3>, ctx: &ActCtx<B>) -> Tensor<B, 3> {
        let dec_pos = self.decoder_pos_embed.weight.val().unsqueeze_dim::<3>(0); // [1, chunk, d]
        self.decoder.layers[i].forward(x, memory, Some(&dec_pos), Some(encoder_pos), &self.layer_ctx(ctx, BLOCK_DECODER, i))
    }

    /// lerobot's `ACTPolicy.forward` loss (f32). `action_is_pad = None`: nothing padded.
    ///
    /// # Shapes
    /// - action: `[b, chunk, action_dim]`; action_is_pad: `[b, chunk]`
    pub fn loss(&self, out: &ActOutput<B>, action: Tensor<B, 3>, action_is_pad: Option<Tensor<B, 2, Bool>>) -> ActLoss<B> {
        let kl_weight = self.config.use_vae.then_some(self.config.kl_weight);
        loss_with(out, action, action_is_pad, kl_weight, B::lean_loss_nodes())
    }

    /// PyTorch's `sum(p.numel() for p in parameters())`: buffers excluded.
    pub fn num_parameters(&self) -> usize {
        count_params_and_buffers::<B, _>(self, is_act_buffer).0
    }

    /// Elements of buffers (`vae_encoder_pos_enc`, FrozenBatchNorm2d tensors). Burn's
    /// `Module::num_params` is `num_parameters() + num_buffer_elements()`.
    pub fn num_buffer_elements(&self) -> usize {
        count_params_and_buffers::<B, _>(self, is_act_buffer).1
    }

    /// The same model with the backbone frozen (`require_grad = false` throughout).
    pub fn with_frozen_backbone(mut self) -> Self {
        self.backbone = self.backbone.map(ResNet::frozen);
        self.config.freeze_backbone = true;
        self
    }

    /// Set every tensor's `require_grad` from the model's rules: buffers never, the backbone
    /// not when `config.freeze_backbone`, everything else yes. Call after
    /// `AutodiffModule::from_inner` (which leaves all tensors without gradient).
    pub fn set_trainable(self) -> Self {
        let frozen: &[&str] = if self.config.freeze_backbone { &["backbone"] } else { &[] };
        set_trainable(self, is_act_buffer, frozen)
    }
}

impl<B: LeanBackend> Staged<B> for Act<B> {
    type Input = ActInput<B>;
    type State = ActState<B>;
    type Output = ActOutput<B>;
    type Stage = ActStage;

    fn plan(&self, input: &ActInput<B>) -> Vec<ActStage> {
        let mut plan = Vec::new();
        if self.uses_vae_encoder(&input.ctx, input.batch.action.is_some()) {
            let layers = self.vae_encoder.as_ref().map_or(0, |e| e.layers.len());
            plan.push(ActStage::VaeInput);
            plan.extend((0..layers).map(ActStage::VaeLayer));
            plan.push(ActStage::VaePosterior);
        }
        if let Some(bb) = &self.backbone {
            plan.extend(bb.stages().into_iter().map(ActStage::Backbone));
        }
        plan.push(ActStage::EncoderInput);
        plan.extend((0..self.encoder.layers.len()).map(ActStage::EncoderLayer));
        plan.push(ActStage::DecoderInput);
        plan.extend((0..self.decoder.layers.len()).map(ActStage::DecoderLayer));
        plan.push(ActStage::ActionHead);
        plan
    }

    fn enter(&self, input: &ActInput<B>) -> ActState<B> {
        let cams = self.config.image_features();
        assert_eq!(input.batch.images.len(), cams.len(), "ActBatch.images: one tensor per camera of the config ({cams:?})");
        ActState::Start {}
    }

    fn stage(&self, stage: ActStage, state: ActState<B>, input: &ActInput<B>) -> ActState<B> {
        let (batch, ctx, p) = (&input.batch, &input.ctx, input.ctx.precision);
        match (stage, state) {
            (ActStage::VaeInput, ActState::Start {}) => {
                let action = batch.action.clone().expect("the VAE encoder runs only with actions");
                let tokens = self.vae_encoder_input(batch.state.clone(), action, p);
                let mask = self.vae_key_padding_mask(tokens.dims()[0], batch.action_is_pad.clone(), &tokens.device());
                ActState::Vae { tokens, key_padding_mask: Constant(mask) }
            }
            (ActStage::VaeLayer(i), ActState::Vae { tokens, key_padding_mask }) => {
                let tokens = self.vae_encoder_layer(i, tokens, &key_padding_mask.0, ctx);
                ActState::Vae { tokens, key_padding_mask }
            }
            (ActStage::VaePosterior, ActState::Vae { tokens, .. }) => {
                ActState::Backbone { features: Vec::new(), posterior: Some(self.vae_posterior(tokens, p)) }
            }
            (ActStage::Backbone(s), state @ (ActState::Start {} | ActState::Backbone { .. })) => {
                let (features, posterior) = into_backbone(state);
                let bb = self.backbone.as_ref().expect("backbone stages need the backbone");
                let features = match s {
                    ResNetStage::Stem => batch.images.iter().map(|img| bb.stage(s, img.clone(), p)).collect(),
                    ResNetStage::Layer(_) => features.into_iter().map(|f| bb.stage(s, f, p)).collect(),
                };
                ActState::Backbone { features, posterior }
            }
            (ActStage::EncoderInput, state @ (ActState::Start {} | ActState::Backbone { .. })) => {
                let (features, posterior) = into_backbone(state);
                let (tokens, pos) = self.encoder_input(posterior.as_ref(), features, input);
                ActState::Encoder { tokens, pos, posterior }
            }
            (ActStage::EncoderLayer(i), ActState::Encoder { tokens, pos, posterior }) => {
                let tokens = self.encoder.layers[i].forward(tokens, Some(&pos), None, &self.layer_ctx(ctx, BLOCK_ENCODER, i));
                ActState::Encoder { tokens, pos, posterior }
            }
            (ActStage::DecoderInput, ActState::Encoder { tokens, pos, posterior }) => {
                let memory = self.encoder.final_norm(tokens);
                let [b, _, d] = memory.dims();
                let queries = Tensor::zeros([b, self.config.chunk_size, d], &memory.device());
                ActState::Decoder { queries, memory, pos, posterior }
            }
            (ActStage::DecoderLayer(i), ActState::Decoder { queries, memory, pos, posterior }) => {
                let queries = self.decoder_layer(i, queries, memory.clone(), &pos, ctx);
                ActState::Decoder { queries, memory, pos, posterior }
            }
            (ActStage::ActionHead, ActState::Decoder { queries, posterior, .. }) => {
                let actions = to_f32(self.action_head.forward(self.decoder.norm.forward(queries), p));
                ActState::Actions { actions, posterior }
            }
            (stage, state) => state.unexpected(stage),
        }
    }

    fn exit(&self, state: ActState<B>, _input: &ActInput<B>) -> ActOutput<B> {
        match state {
            ActState::Actions { actions, posterior } => {
                ActOutput { actions, posterior: posterior.map(|p| p.params) }
            }
            other => other.unexpected(ActStage::ActionHead),
        }
    }
}

/// The posterior sample `mu + exp(log_sigma_x2 / 2) · eps` (`[b, latent]` f32), as
/// `ACT.forward` draws it: [`crate::nn::lean::posterior_sample`]'s node (unclamped) where
/// `node` (on CubeCL two launches with its backward), else composed of tensor ops (flex; they
/// agree within f32 rounding, `tests::the_sample_node_equals_the_composed_sample`).
fn sample<B: LeanBackend>(post: &Posterior<B>, eps: Tensor<B, 2>, node: bool) -> Tensor<B, 2> {
    if node {
        let [b, l2] = post.params.dims();
        let z = crate::nn::lean::posterior_sample(post.params.clone().reshape([b, l2, 1, 1, 1]), eps.reshape([b, l2 / 2, 1, 1, 1]), false);
        return z.reshape([b, l2 / 2]);
    }
    post.mu() + (post.log_sigma_x2() / 2.0).exp() * eps
}

/// [`Act::loss`] with the KL term's weight where the config has the VAE (`kl_weight`). With the
/// KL term and where `node`, the loss is one node ([`crate::nn::lean::act_loss`]: on CubeCL two
/// launches forward and one backward), else composed of tensor ops (flex; they agree within f32
/// rounding, `tests::the_loss_node_equals_the_composed_loss`).
fn loss_with<B: LeanBackend>(out: &ActOutput<B>, action: Tensor<B, 3>, action_is_pad: Option<Tensor<B, 2, Bool>>, kl_weight: Option<f64>, node: bool) -> ActLoss<B> {
    if let (Some(params), Some(w), true) = (&out.posterior, kl_weight, node) {
        let pad = action_is_pad.map(|m| m.float());
        let (loss, l1_loss, kld_loss) = crate::nn::lean::act_loss(to_f32(action), out.actions.clone(), pad, params.clone(), w as f32);
        return ActLoss { loss, l1_loss, kld_loss: Some(kld_loss) };
    }
    let [b, c, _] = action.dims();
    let err = (to_f32(action) - out.actions.clone()).abs(); // [b, chunk, a]
    let err = match action_is_pad {
        Some(pad) => err * pad.bool_not().float().reshape([b, c, 1]),
        None => err,
    };
    // Every partial sum short (see vae3d::mean_all).
    let l1_loss = crate::nn::lean::mean_all(err);
    let kld_loss = match (out.mu(), out.log_sigma_x2(), kl_weight) {
        (Some(mu), Some(ls), Some(_)) => {
            let kld = (ls.clone().exp() + mu.clone().square() - ls.clone() - 1.0) * 0.5; // [b, latent]
            Some(kld.sum_dim(1).mean_dim(0).reshape([1]))
        }
        _ => None,
    };
    let loss = match (&kld_loss, kl_weight) {
        (Some(k), Some(w)) => l1_loss.clone() + k.clone() * w,
        _ => l1_loss.clone(),
    };
    ActLoss { loss, l1_loss, kld_loss }
}

/// The backbone maps and posterior of a state before the encoder input (none yet at `Start`).
fn into_backbone<B: LeanBackend>(state: ActState<B>) -> (Vec<Tensor<B, 4>>, Option<Posterior<B>>) {
    match state {
        ActState::Backbone { features, posterior } => (features, posterior),
        _ => (Vec::new(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    type Tb = Flex;
    type A = burn::backend::Autodiff<Tb>;

    fn values<const D: usize>(t: Tensor<Tb, D>) -> Vec<f32> {
        t.into_data().convert::<f32>().to_vec().unwrap()
    }

    /// Values uniform in `[shift − scale/2, shift + scale/2)`, seeded, made on the host.
    fn host_random<const D: usize>(dims: [usize; D], seed: u64, shift: f32, scale: f32) -> Tensor<Tb, D> {
        let values = vramlab_testkit::uniform_values(dims.iter().product(), seed, shift - scale / 2.0, scale);
        Tensor::from_data(TensorData::new(values, dims), &Default::default())
    }

    /// The loss node ([`crate::nn::lean::act_loss`], here with its composed inner ops, as
    /// `VRAMLAB_COMPOSED_KERNELS=1` or a backend without the kernels runs it) against the
    /// model's composed loss on autodiff: the loss, its two terms, and the gradients of the
    /// prediction and of the posterior's parameters (through the `mu` / `log_sigma_x2` slices),
    /// with and without padding, some predictions equal to the action.
    #[test]
    fn the_loss_node_equals_the_composed_loss() {
        let (b, c, a, l) = (3, 7, 5, 4);
        let action: Tensor<Tb, 3> = host_random([b, c, a], 1, 0.0, 2.0);
        let pred0 = host_random([b, c, a], 2, 0.1, 2.0).slice_assign([0..1, 0..2, 0..a], action.clone().narrow(0, 0, 1).narrow(1, 0, 2));
        let params0: Tensor<Tb, 2> = host_random([b, 2 * l], 3, 0.0, 3.0);
        let pad_rows: Vec<bool> = (0..b * c).map(|k| k % 4 == 1).collect();
        let pad = Tensor::<A, 2, Bool>::from_data(TensorData::new(pad_rows, [b, c]), &Default::default());
        for (name, pad) in [("padded", Some(pad)), ("unpadded", None)] {
            let run = |node: bool| {
                let pred = Tensor::<A, 3>::from_inner(pred0.clone()).require_grad();
                let params = Tensor::<A, 2>::from_inner(params0.clone()).require_grad();
                let out = ActOutput { actions: pred.clone(), posterior: Some(params.clone()) };
                let l = loss_with(&out, Tensor::from_inner(action.clone()), pad.clone(), Some(10.0), node);
                let parts = [l.loss.clone(), l.l1_loss, l.kld_loss.expect("the KL term")].map(|t| t.into_scalar());
                let grads = l.loss.backward();
                (parts, values(pred.grad(&grads).expect("takes a gradient")), values(params.grad(&grads).expect("takes a gradient")))
            };
            let (composed, node) = (run(false), run(true));
            for (k, (x, y)) in node.0.iter().zip(composed.0).enumerate() {
                assert!((x - y).abs() <= 1e-5 * y.abs().max(1e-6), "{name}: part {k}: node {x} vs composed {y}");
            }
            for (what, x, y) in [("dpred", &node.1, &composed.1), ("dparams", &node.2, &composed.2)] {
                let e = vramlab_testkit::diff(what, x, y).rel;
                assert!(e <= 1e-6 && x.iter().any(|v| *v != 0.0), "{name}: {what}: relative error {e:e}");
            }
            assert!(node.1.iter().any(|v| *v == 0.0), "{name}: dpred 0 where the prediction is exact");
        }
    }

    /// The sample node ([`crate::nn::lean::posterior_sample`] unclamped, its composed inner ops)
    /// against the model's composed sample on autodiff: the sample and the parameters' gradient,
    /// log-variances beyond the 4D-Radar VAE's clamp (which ACT does not have).
    #[test]
    fn the_sample_node_equals_the_composed_sample() {
        let (b, l) = (3, 4);
        let mut p = values(host_random([b, 2 * l], 4, 0.0, 3.0));
        (p[l], p[l + 1]) = (-40.0, 25.0);
        let params0 = Tensor::<Tb, 2>::from_data(TensorData::new(p, [b, 2 * l]), &Default::default());
        let eps: Tensor<A, 2> = Tensor::from_inner(host_random([b, l], 5, 0.0, 3.0));
        let w: Tensor<A, 2> = Tensor::from_inner(host_random([b, l], 6, 0.5, 2.0));
        let run = |node: bool| {
            let params = Tensor::<A, 2>::from_inner(params0.clone()).require_grad();
            let z = sample(&Posterior { params: params.clone() }, eps.clone(), node);
            let zv = values(z.clone().inner());
            let grads = (z * w.clone()).sum().backward();
            (zv, values(params.grad(&grads).expect("takes a gradient")))
        };
        let (composed, node) = (run(false), run(true));
        for (what, x, y) in [("z", &node.0, &composed.0), ("dparams", &node.1, &composed.1)] {
            let e = vramlab_testkit::diff(what, x, y).rel;
            assert!(e <= 1e-6, "{what}: relative error {e:e}");
        }
        assert!(node.1[l] != 0.0 && node.1[l + 1] != 0.0, "no clamp: the gradient passes beyond the VAE's bounds");
    }
}
