//! Diffusion Policy's `DiffusionModel`, natively in Burn.
//!
//! Reference: huggingface/lerobot v0.4.4 `src/lerobot/policies/diffusion/modeling_diffusion.py` —
//! `DiffusionModel` (`_prepare_global_conditioning`, `conditional_sample`, `generate_actions`,
//! `compute_loss`), `DiffusionRgbEncoder`, `DiffusionConditionalUnet1d`.
//!
//! Field names are lerobot's attribute names, so parameter names are the policy's state-dict
//! keys without its `diffusion.` prefix — except the backbone, which lerobot keeps as
//! `nn.Sequential(*resnet.children()[:-2])` (`backbone.0.weight`, `backbone.4.0.conv1.weight`)
//! and vramlab as [`ResNet`] with torchvision names; [`super::load`] maps between the two.
//!
//! # Layout and precision
//! Inputs follow lerobot's model-level batch (already normalised): `state` `[b, s, state]`,
//! one `[b, s, 3, h, w]` tensor per camera, `env_state` `[b, s, env]`, with `s = n_obs_steps`.
//! Convolutions and Linears run in the forward's [`Precision`]; GroupNorm, Mish, the spatial
//! softmax, the global conditioning, the UNet output, the scheduler and the loss are f32.
//!
//! # Randomness
//! All of it is the caller's, so runs are reproducible and recomputation (checkpointing) is
//! exact: the training noise and timesteps ([`Diffusion::compute_loss`]), the random-crop offsets
//! ([`DiffusionCtx::crop_offsets`]; eval or none given → center crop), the initial sample and
//! DDPM's per-step noise ([`Diffusion::conditional_sample`]).
//!
//! # Stages
//! [`Diffusion`] implements [`Staged`] for the training forward: [`Diffusion::compute_loss`]
//! is the fold over this plan ([`DiffusionInput`]: the batch and `compute_loss`'s randomness);
//! block checkpointing runs the same stages. [`ConditionalUnet1d::forward`] (sampling) is the
//! fold over the UNet's own stages, which the plan embeds.
//!
//! | stage ([`DiffusionStage`]) | computes | state after ([`DiffusionState`]) |
//! |---|---|---|
//! | `Backbone(s)` (cameras only) | the [`ResNet`] stage `s` of every RGB encoder (the stem reads [`Diffusion::encoder_input`]: cameras stacked, cropped) | `Encoders`: maps `[n_e, c, h, w]` |
//! | `Conditioning` | heads (SpatialSoftmax, `out`, ReLU), global conditioning, `add_noise`, the FiLM input (step encoder, concat) and its Mish | `Unet`: `x` `[b, a, horizon]`, `mish_cond` `[b, cond_dim]` f32 |
//! | `Unet(Down(i, j))` | residual block `j` of down level `i` (`j = 1`: keep the skip, downsample) | `Unet`: `x` `[b, d_i, t_i]`, skips |
//! | `Unet(Mid(j))` | middle block `j` | `Unet` |
//! | `Unet(Up(i, j))` | `j = 0`: concatenate the skip, block 0; `j = 1`: block 1, upsample | `Unet` |
//! | `Unet(Out)` | `final_conv`, `b d t -> b t d` | `Unet`: `x` = prediction `[b, horizon, a]` f32 |
//!
//! The exit is [`Diffusion::loss_from_prediction`]. The FiLM input and the skips travel in the
//! state (the first depends on parameters, so it carries its gradient back).
//!
//! One file on purpose: the model and its stage plan, read against the table above (its layers
//! are in `layers.rs`); ~690 lines of model, its unit tests at the bottom.

use burn::module::Module;
use burn::nn::PaddingConfig1d;
use burn::nn::conv::{Conv1d, Conv1dConfig, ConvTranspose1d, ConvTranspose1dConfig};
use burn::prelude::*;
use crate::nn::LeanBackend;
use burn::tensor::TensorData;
use burn::tensor::activation::relu;

use super::config::{DiffusionConfig, PolicyFeatures, PredictionType};
use super::layers::{ConditionalResidualBlock1d, Conv1dBlock, SpatialSoftmax, mish, resize_bilinear_antialias, sinusoidal_step_embedding};
use super::scheduler::NoiseScheduler;
use crate::nn::{Linear, Precision, cast, conv_transpose1d_p, conv1d_p, to_f32};
use crate::resnet::{OUT_CHANNELS, ResNet, ResNetStage, count_params_and_buffers, set_trainable};
use crate::stages::Staged;

/// Struct name of [`SpatialSoftmax`] as Burn's visitors report it.
pub const SPATIAL_SOFTMAX_CONTAINER: &str = "Struct:SpatialSoftmax";

/// The buffer rule of [`Diffusion`]: `SpatialSoftmax.pos_grid` (`register_buffer`).
pub fn is_diffusion_buffer(container: &str, field: &str) -> bool {
    container == SPATIAL_SOFTMAX_CONTAINER && field == "pos_grid"
}

/// `DiffusionRgbEncoder`: (resize and crop, done by [`Diffusion::encoder_input`]) → ResNet trunk →
/// SpatialSoftmax → `out` Linear → ReLU ([`RgbEncoder::head`]).
#[derive(Module, Debug)]
pub struct RgbEncoder<B: Backend> {
    pub backbone: ResNet<B>,
    pub pool: SpatialSoftmax<B>,
    pub out: Linear<B>,
}

impl<B: LeanBackend> RgbEncoder<B> {
    /// SpatialSoftmax, `out`, ReLU on the backbone's feature map.
    ///
    /// # Shapes
    /// - features: `[n, 512, h', w']` → `[n, 2K]` f32
    pub fn head(&self, features: Tensor<B, 4>, p: Precision) -> Tensor<B, 2> {
        let keypoints = self.pool.forward(features, p);
        to_f32(relu(self.out.forward(keypoints, p)))
    }

}

/// `rgb_encoder`: one shared encoder, or an `nn.ModuleList` of one per camera
/// (`use_separate_rgb_encoder_per_camera`; names `rgb_encoder.<i>.…`).
// Module trees are built once and walked by reference: boxing variants would only add
// indirection (and change nothing Burn saves).
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum RgbEncoders<B: Backend> {
    Shared(RgbEncoder<B>),
    PerCamera(Vec<RgbEncoder<B>>),
}

/// An entry of a UNet level's `nn.ModuleList([resnet, resnet2, down/upsample])`; the
/// `nn.Identity` of the last down level is left off.
#[derive(Module, Debug)]
pub enum UnetLayer<B: Backend> {
    Res(ConditionalResidualBlock1d<B>),
    /// `Conv1d(d, d, 3, stride 2, padding 1)`.
    Down(Conv1d<B>),
    /// `ConvTranspose1d(d, d, 4, stride 2, padding 1)`.
    Up(ConvTranspose1d<B>),
}

/// An entry of `final_conv = nn.Sequential(DiffusionConv1dBlock, Conv1d 1×1)`.
// Module trees are built once and walked by reference: boxing variants would only add
// indirection (and change nothing Burn saves).
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum FinalConvLayer<B: Backend> {
    Block(Conv1dBlock<B>),
    Conv(Conv1d<B>),
}

/// `DiffusionConditionalUnet1d`.
#[derive(Module, Debug)]
pub struct ConditionalUnet1d<B: Backend> {
    /// `Sequential(SinusoidalPosEmb, Linear(E, 4E), Mish, Linear(4E, E))`: `[None, Some, None, Some]`.
    pub diffusion_step_encoder: Vec<Option<Linear<B>>>,
    pub down_modules: Vec<Vec<UnetLayer<B>>>,
    pub mid_modules: Vec<ConditionalResidualBlock1d<B>>,
    pub up_modules: Vec<Vec<UnetLayer<B>>>,
    pub final_conv: Vec<FinalConvLayer<B>>,
    pub diffusion_step_embed_dim: usize,
}

fn res_of<B: LeanBackend>(layers: &[UnetLayer<B>], j: usize) -> &ConditionalResidualBlock1d<B> {
    match layers.get(j) {
        Some(UnetLayer::Res(r)) => r,
        _ => panic!("UNet level: entry {j} is not a residual block"),
    }
}

impl<B: LeanBackend> ConditionalUnet1d<B> {
    pub fn new(cfg: &DiffusionConfig, device: &B::Device) -> Self {
        let (a, e, k, g, film) =
            (cfg.action_dim(), cfg.diffusion_step_embed_dim, cfg.kernel_size, cfg.n_groups, cfg.use_film_scale_modulation);
        let cond = cfg.cond_dim();
        let res = |i, o| UnetLayer::Res(ConditionalResidualBlock1d::new(i, o, cond, k, g, film, device));
        let dims = &cfg.down_dims;
        let in_out: Vec<(usize, usize)> = std::iter::once((a, dims[0])).chain(dims.windows(2).map(|w| (w[0], w[1]))).collect();
        let down_modules = in_out
            .iter()
            .enumerate()
            .map(|(ind, &(i, o))| {
                let mut level = vec![res(i, o), res(o, o)];
                if ind + 1 < in_out.len() {
                    let conv = Conv1dConfig::new(o, o, 3).with_stride(2).with_padding(PaddingConfig1d::Explicit(1, 1)).init(device);
                    level.push(UnetLayer::Down(conv));
                }
                level
            })
            .collect();
        let last = *dims.last().expect("down_dims is not empty");
        let mid_modules = (0..2).map(|_| ConditionalResidualBlock1d::new(last, last, cond, k, g, film, device)).collect();
        // lerobot's `is_last` test never holds for the decoder: every up level upsamples.
        let up_modules = in_out[1..]
            .iter()
            .rev()
            .map(|&(o, i)| {
                let up = ConvTranspose1dConfig::new([o, o], 4).with_stride(2).with_padding(1).init(device);
                vec![res(2 * i, o), res(o, o), UnetLayer::Up(up)]
            })
            .collect();
        // lerobot builds final_conv's block with DiffusionConv1dBlock's default n_groups = 8.
        let final_conv = vec![
            FinalConvLayer::Block(Conv1dBlock::new(dims[0], dims[0], k, 8, device)),
            FinalConvLayer::Conv(Conv1dConfig::new(dims[0], a, 1).init(device)),
        ];
        Self {
            diffusion_step_encoder: vec![None, Some(Linear::new(e, 4 * e, device)), None, Some(Linear::new(4 * e, e, device))],
            down_modules,
            mid_modules,
            up_modules,
            final_conv,
            diffusion_step_embed_dim: e,
        }
    }

    pub fn num_levels(&self) -> usize {
        self.down_modules.len()
    }

    /// `diffusion_step_encoder(timesteps)`: sinusoidal embedding, Linear, Mish, Linear.
    ///
    /// # Shapes
    /// - timesteps: `b` entries → `[b, E]` f32
    fn step_embedding(&self, timesteps: &[usize], p: Precision, device: &B::Device) -> Tensor<B, 2> {
        let e = self.diffusion_step_embed_dim;
        let emb = Tensor::<B, 2>::from_data(TensorData::new(sinusoidal_step_embedding(timesteps, e), [timesteps.len(), e]), device);
        let mut linears = self.diffusion_step_encoder.iter().flatten();
        let (l1, l2) = (linears.next().expect("step encoder Linear 1"), linears.next().expect("step encoder Linear 3"));
        to_f32(l2.forward(mish(l1.forward(emb, p)), p))
    }

    /// The UNet's first state: `x` as `b d t` and the Mish of the FiLM input
    /// `cat([step embedding, global_cond], -1)`.
    ///
    /// Every residual block's `cond_encoder` starts with `nn.Mish` on that same tensor, so the
    /// Mish runs once here and each block takes its output
    /// ([`ConditionalResidualBlock1d::forward`]): the values PyTorch computes per block, one node
    /// instead of one per block (2 × 11 fewer launches a step with the default 12 blocks; in f32
    /// one `[b, cond_dim]` map kept for the Linears' backward instead of 12). The FiLM Linears still cast it to the
    /// compute dtype each, so in bf16 their input gradients are summed in f32, as under autocast.
    ///
    /// # Shapes
    /// - x: `[b, horizon, action_dim]`; timesteps: `b` entries; global_cond: `[b, global_cond_dim]`
    /// - state: `x` `[b, action_dim, horizon]`, `mish_cond` `[b, E + global_cond_dim]` f32
    pub fn enter(&self, x: Tensor<B, 3>, timesteps: &[usize], global_cond: Tensor<B, 2>, p: Precision) -> UnetState<B> {
        assert_eq!(timesteps.len(), x.dims()[0], "one timestep per batch element");
        let t = self.step_embedding(timesteps, p, &global_cond.device());
        let cond = Tensor::cat(vec![t, to_f32(global_cond)], 1);
        UnetState { x: x.swap_dims(1, 2), mish_cond: mish(cond), skips: Vec::new() }
    }

    /// The stages: per down level its two residual blocks, the middle blocks, per up level its
    /// two residual blocks, the output convolution.
    pub fn stages(&self) -> Vec<UnetStage> {
        let down = (0..self.down_modules.len()).flat_map(|i| [UnetStage::Down(i, 0), UnetStage::Down(i, 1)]);
        let mid = (0..self.mid_modules.len()).map(UnetStage::Mid);
        let up = (0..self.up_modules.len()).flat_map(|i| [UnetStage::Up(i, 0), UnetStage::Up(i, 1)]);
        down.chain(mid).chain(up).chain([UnetStage::Out]).collect()
    }

    /// Run stage `s` (see [`UnetStage`]).
    pub fn stage(&self, s: UnetStage, state: UnetState<B>, p: Precision) -> UnetState<B> {
        let UnetState { x, mish_cond, mut skips } = state;
        let x = match s {
            UnetStage::Down(i, j) => {
                let x = res_of(&self.down_modules[i], j).forward(x, mish_cond.clone(), p);
                if j == 0 {
                    x
                } else {
                    // lerobot keeps every level's output but its up levels pop only the last
                    // ones (L − 1 of L): the first level's is never read, so it is not kept.
                    if i + self.up_modules.len() >= self.down_modules.len() {
                        skips.push(x.clone());
                    }
                    match self.down_modules[i].get(2) {
                        Some(UnetLayer::Down(conv)) => conv1d_p(conv, x, p),
                        _ => x, // the last level's nn.Identity
                    }
                }
            }
            UnetStage::Mid(j) => self.mid_modules[j].forward(x, mish_cond.clone(), p),
            UnetStage::Up(i, 0) => {
                let skip = skips.pop().expect("one skip per up level");
                let x = Tensor::cat(vec![cast(x, p.dtype()), cast(skip, p.dtype())], 1); // cat((x, skip), dim=1)
                res_of(&self.up_modules[i], 0).forward(x, mish_cond.clone(), p)
            }
            UnetStage::Up(i, j) => {
                let x = res_of(&self.up_modules[i], j).forward(x, mish_cond.clone(), p);
                match self.up_modules[i].get(2) {
                    Some(UnetLayer::Up(conv)) => conv_transpose1d_p(conv, x, p),
                    _ => x,
                }
            }
            UnetStage::Out => {
                let y = self.final_conv.iter().fold(x, |h, layer| match layer {
                    FinalConvLayer::Block(b) => b.forward(h, p),
                    FinalConvLayer::Conv(c) => conv1d_p(c, h, p),
                });
                to_f32(y).swap_dims(1, 2) // b d t -> b t d
            }
        };
        UnetState { x, mish_cond, skips }
    }

    /// `DiffusionConditionalUnet1d.forward(x, timestep, global_cond)`: [`Self::enter`], then
    /// the fold over [`Self::stages`].
    ///
    /// # Shapes
    /// - x: `[b, horizon, action_dim]`; timesteps: `b` entries; global_cond: `[b, global_cond_dim]`
    /// - returns `[b, horizon, action_dim]` f32
    pub fn forward(&self, x: Tensor<B, 3>, timesteps: &[usize], global_cond: Tensor<B, 2>, p: Precision) -> Tensor<B, 3> {
        let state = self.enter(x, timesteps, global_cond, p);
        self.stages().into_iter().fold(state, |state, s| self.stage(s, state, p)).x
    }
}

/// A stage of [`ConditionalUnet1d`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnetStage {
    /// Residual block `j` (0 or 1) of down level `i`; block 1 also stores the skip and
    /// downsamples (not on the last level).
    Down(usize, usize),
    /// Middle residual block `j`.
    Mid(usize),
    /// Residual block `j` of up level `i`; block 0 first concatenates the level's skip, block 1
    /// then upsamples (length × 2).
    Up(usize, usize),
    /// `final_conv`, then `b d t -> b t d`: the prediction `[b, horizon, action_dim]` f32.
    Out,
}

/// What flows between the UNet's stages: the activation `[b, d, t]` (the prediction
/// `[b, horizon, action_dim]` after `Out`), the Mish of the FiLM input `[b, cond_dim]` f32
/// (every block's `cond_encoder.1` Linear input, see [`ConditionalUnet1d::enter`]; it depends on
/// parameters, so it travels with its gradient) and the skips not yet consumed.
#[derive(Clone, Debug)]
pub struct UnetState<B: Backend> {
    pub x: Tensor<B, 3>,
    pub mish_cond: Tensor<B, 2>,
    pub skips: Vec<Tensor<B, 3>>,
}
vramlab_stages::tensor_bundle!(struct UnetState { x, mish_cond, skips });

/// How the forward runs: precision, training mode (random crop) and the crop offsets.
#[derive(Clone, Debug, PartialEq)]
pub struct DiffusionCtx {
    pub precision: Precision,
    /// lerobot's `self.training`: random crop (with `crop_is_random`) at [`Self::crop_offsets`].
    pub training: bool,
    /// `[top, left]` per RGB encoder (one for the shared encoder), each drawn uniformly in
    /// `0..=DiffusionConfig::random_crop_max_offset()`. Used in training with
    /// `crop_is_random`; `None` → center crop.
    pub crop_offsets: Option<Vec<[usize; 2]>>,
}

impl DiffusionCtx {
    pub fn eval(precision: Precision) -> Self {
        Self { precision, training: false, crop_offsets: None }
    }

    pub fn train(precision: Precision) -> Self {
        Self { precision, training: true, crop_offsets: None }
    }

    pub fn with_crop_offsets(mut self, offsets: Vec<[usize; 2]>) -> Self {
        self.crop_offsets = Some(offsets);
        self
    }
}

/// Model-level inputs (already normalised), `s = n_obs_steps`.
#[derive(Clone, Debug)]
pub struct DiffusionBatch<B: Backend> {
    /// `observation.state` `[b, s, state_dim]`.
    pub state: Tensor<B, 3>,
    /// One `[b, s, 3, h, w]` per camera, in [`DiffusionConfig::image_features`] order.
    pub images: Vec<Tensor<B, 5>>,
    /// The ENV input `[b, s, env_dim]` (required when the config has one).
    pub env_state: Option<Tensor<B, 3>>,
    /// Target actions `[b, horizon, action_dim]` (training).
    pub action: Option<Tensor<B, 3>>,
    /// `[b, horizon]`, `true` = padding (used with `do_mask_loss_for_padding`).
    pub action_is_pad: Option<Tensor<B, 2, Bool>>,
}

/// lerobot's `DiffusionModel`.
#[derive(Module, Debug)]
pub struct Diffusion<B: Backend> {
    pub rgb_encoder: Option<RgbEncoders<B>>,
    pub unet: ConditionalUnet1d<B>,
    /// The config the model was built from (not a parameter).
    pub config: DiffusionConfig,
    /// The noise scheduler with its inference timesteps set (not a parameter).
    pub noise_scheduler: NoiseScheduler,
}

impl DiffusionConfig {
    /// One `DiffusionRgbEncoder` (PyTorch / torchvision initialisation; frozen backbone with
    /// `freeze_backbone`).
    fn init_rgb_encoder<B: LeanBackend>(&self, device: &B::Device) -> RgbEncoder<B> {
        let bb = self.backbone_config().expect("a camera");
        let [h, w] = self.feature_map_size().expect("a camera");
        let k = self.spatial_softmax_num_keypoints;
        let backbone = bb.init(device);
        RgbEncoder {
            backbone: if self.freeze_backbone { backbone.frozen() } else { backbone },
            pool: SpatialSoftmax::new(OUT_CHANNELS, h, w, k, device),
            out: Linear::new(2 * k, 2 * k, device),
        }
    }

    /// Build the model with PyTorch's default initialisation (torchvision's for the trunk; no
    /// ImageNet weights). Panics on an invalid config; call [`DiffusionConfig::validate`] for an
    /// error instead.
    pub fn init<B: LeanBackend>(&self, device: &B::Device) -> Diffusion<B> {
        if let Err(e) = self.validate() {
            panic!("invalid DiffusionConfig: {e}");
        }
        let rgb_encoder = match self.num_rgb_encoders() {
            0 => None,
            n if self.use_separate_rgb_encoder_per_camera => {
                Some(RgbEncoders::PerCamera((0..n).map(|_| self.init_rgb_encoder(device)).collect()))
            }
            _ => Some(RgbEncoders::Shared(self.init_rgb_encoder(device))),
        };
        Diffusion { rgb_encoder, unet: ConditionalUnet1d::new(self, device), config: self.clone(), noise_scheduler: NoiseScheduler::from_config(self) }
    }
}

/// `[n, c, H, W]` → `[n, c, h, w]` at `[top, left]`.
pub fn crop<B: LeanBackend>(images: Tensor<B, 4>, [h, w]: [usize; 2], [top, left]: [usize; 2]) -> Tensor<B, 4> {
    let [n, c, hh, ww] = images.dims();
    assert!(top + h <= hh && left + w <= ww, "crop {h}×{w} at ({top}, {left}) does not fit {hh}×{ww}");
    images.slice([0..n, 0..c, top..top + h, left..left + w])
}

impl<B: LeanBackend> Diffusion<B> {
    /// The RGB encoders (`0` without cameras).
    pub fn num_rgb_encoders(&self) -> usize {
        match &self.rgb_encoder {
            None => 0,
            Some(RgbEncoders::Shared(_)) => 1,
            Some(RgbEncoders::PerCamera(v)) => v.len(),
        }
    }

    /// RGB encoder `e`.
    pub fn rgb_encoder(&self, e: usize) -> &RgbEncoder<B> {
        match &self.rgb_encoder {
            Some(RgbEncoders::Shared(enc)) if e == 0 => enc,
            Some(RgbEncoders::PerCamera(v)) => &v[e],
            _ => panic!("no RGB encoder {e}"),
        }
    }

    /// Module paths of the backbones (`rgb_encoder.backbone` or `rgb_encoder.<i>.backbone`).
    pub fn backbone_paths(&self) -> Vec<String> {
        match &self.rgb_encoder {
            None => vec![],
            Some(RgbEncoders::Shared(_)) => vec!["rgb_encoder.backbone".into()],
            Some(RgbEncoders::PerCamera(v)) => (0..v.len()).map(|i| format!("rgb_encoder.{i}.backbone")).collect(),
        }
    }

    /// The crop `[top, left]` of encoder `e` under `ctx` (`None`: no crop configured).
    pub fn crop_offset(&self, e: usize, ctx: &DiffusionCtx) -> Option<[usize; 2]> {
        let center = self.config.center_crop_offset()?;
        match &ctx.crop_offsets {
            Some(offsets) if ctx.training && self.config.crop_is_random => {
                assert_eq!(offsets.len(), self.num_rgb_encoders(), "DiffusionCtx.crop_offsets: one [top, left] per RGB encoder");
                Some(offsets[e])
            }
            _ => Some(center),
        }
    }

    /// Encoder `e`'s input batch: shared encoder — all cameras stacked as lerobot's
    /// `(b s n) c h w`; per-camera encoders — camera `e` as `(b s) c h w`; then resized
    /// (`resize_shape`) and cropped, in `DiffusionRgbEncoder.forward`'s order.
    pub fn encoder_input(&self, e: usize, images: &[Tensor<B, 5>], ctx: &DiffusionCtx) -> Tensor<B, 4> {
        assert_eq!(images.len(), self.config.num_cameras(), "DiffusionBatch.images: one tensor per camera");
        let [b, s, c, h, w] = images[0].dims();
        let x = match &self.rgb_encoder {
            Some(RgbEncoders::Shared(_)) => {
                let n = images.len();
                Tensor::stack::<6>(images.to_vec(), 2).reshape([b * s * n, c, h, w])
            }
            _ => images[e].clone().reshape([b * s, c, h, w]),
        };
        let x = match self.config.resize_shape {
            Some(size) => resize_bilinear_antialias(x, size),
            None => x,
        };
        match (self.config.effective_crop_shape(), self.crop_offset(e, ctx)) {
            (Some(shape), Some(offset)) => crop(x, shape, offset),
            _ => x,
        }
    }

    /// `_prepare_global_conditioning` from the backbone maps (`[n_e, 512, h', w']`, one per RGB
    /// encoder, in encoder order): each encoder's head ([`RgbEncoder::head`]), the features per
    /// observation step (camera-major), then `cat([state, image features, env], -1)` per step,
    /// flattened.
    ///
    /// # Shapes
    /// - batch.state `[b, s, state]`, batch.env_state `[b, s, env]`
    /// - returns `[b, s·(state + n·2K + env)]` f32
    fn global_conditioning(&self, maps: Vec<Tensor<B, 4>>, batch: &DiffusionBatch<B>, p: Precision) -> Tensor<B, 2> {
        let [b, s, _] = batch.state.dims();
        assert_eq!(s, self.config.n_obs_steps, "state must have n_obs_steps = {} steps", self.config.n_obs_steps);
        let mut parts = vec![to_f32(batch.state.clone())];
        for (e, map) in maps.into_iter().enumerate() {
            let f = self.rgb_encoder(e).head(map, p); // [n_e, 2K]
            let d = f.dims()[0] / (b * s) * f.dims()[1];
            parts.push(f.reshape([b, s, d]));
        }
        if self.config.env_state_dim().is_some() {
            parts.push(to_f32(batch.env_state.clone().expect("DiffusionBatch.env_state is required: the config has an ENV input")));
        }
        let cond = Tensor::cat(parts, 2);
        let d = cond.dims()[2];
        cond.reshape([b, s * d])
    }

    /// `_prepare_global_conditioning(batch)`: every RGB encoder's backbone and head, state and
    /// environment state.
    pub fn prepare_global_conditioning(&self, batch: &DiffusionBatch<B>, ctx: &DiffusionCtx) -> Tensor<B, 2> {
        let maps = (0..self.num_rgb_encoders())
            .map(|e| self.rgb_encoder(e).backbone.forward(self.encoder_input(e, &batch.images, ctx), ctx.precision))
            .collect();
        self.global_conditioning(maps, batch, ctx.precision)
    }

    /// `conditional_sample`: the reverse process from `initial_noise` over the scheduler's
    /// timesteps. `step_noise(k)` gives DDPM's variance noise for the `k`-th step (`None` for
    /// DDIM, which draws none).
    ///
    /// # Shapes
    /// - global_cond: `[b, global_cond_dim]`; initial_noise: `[b, horizon, action_dim]` → same, f32
    pub fn conditional_sample(
        &self,
        global_cond: Tensor<B, 2>,
        initial_noise: Tensor<B, 3>,
        mut step_noise: impl FnMut(usize) -> Option<Tensor<B, 3>>,
        p: Precision,
    ) -> Tensor<B, 3> {
        let b = initial_noise.dims()[0];
        let mut sample = to_f32(initial_noise);
        for (k, &t) in self.noise_scheduler.timesteps.iter().enumerate() {
            let out = self.unet.forward(sample.clone(), &vec![t; b], global_cond.clone(), p);
            sample = self.noise_scheduler.step(out, t, sample, step_noise(k));
        }
        sample
    }

    /// `generate_actions`: conditioning, sampling, and the `n_action_steps` actions from the
    /// current step (`[n_obs_steps − 1, n_obs_steps − 1 + n_action_steps)`).
    ///
    /// # Shapes
    /// - returns `[b, n_action_steps, action_dim]` f32
    pub fn generate_actions(
        &self,
        batch: &DiffusionBatch<B>,
        initial_noise: Tensor<B, 3>,
        step_noise: impl FnMut(usize) -> Option<Tensor<B, 3>>,
        ctx: &DiffusionCtx,
    ) -> Tensor<B, 3> {
        let cond = self.prepare_global_conditioning(batch, ctx);
        let actions = self.conditional_sample(cond, initial_noise, step_noise, ctx.precision);
        actions.narrow(1, self.config.n_obs_steps - 1, self.config.n_action_steps)
    }

    /// The loss from the UNet's prediction: `mse_loss(pred, target, reduction="none")`, masked
    /// by `~action_is_pad` with `do_mask_loss_for_padding`, then the mean over all elements.
    /// The target is the noise (`epsilon`) or the clean actions (`sample`).
    pub fn loss_from_prediction(
        &self,
        pred: Tensor<B, 3>,
        action: Tensor<B, 3>,
        noise: Tensor<B, 3>,
        action_is_pad: Option<Tensor<B, 2, Bool>>,
    ) -> Tensor<B, 1> {
        let [b, h, _] = action.dims();
        let target = match self.noise_scheduler.prediction_type {
            PredictionType::Epsilon => noise,
            PredictionType::Sample => action,
        };
        let err = (to_f32(pred) - to_f32(target)).square();
        let err = if self.config.do_mask_loss_for_padding {
            let pad = action_is_pad.expect("action_is_pad is required with do_mask_loss_for_padding");
            err * pad.bool_not().float().reshape([b, h, 1])
        } else {
            err
        };
        // Axis by axis keeps partial sums short (as the ACT loss).
        err.mean_dim(2).mean_dim(1).mean_dim(0).reshape([1])
    }

    /// lerobot's `compute_loss` with the caller's randomness: `noise` `[b, horizon, a]` and one
    /// timestep in `0..num_train_timesteps` per sample. The fold over [`Diffusion`]'s stages.
    pub fn compute_loss(&self, batch: &DiffusionBatch<B>, noise: Tensor<B, 3>, timesteps: &[usize], ctx: &DiffusionCtx) -> Tensor<B, 1> {
        self.run(&DiffusionInput { batch: batch.clone(), noise, timesteps: timesteps.to_vec(), ctx: ctx.clone() })
    }

    /// PyTorch's `sum(p.numel() for p in parameters())` (buffers excluded).
    pub fn num_parameters(&self) -> usize {
        count_params_and_buffers::<B, _>(self, is_diffusion_buffer).0
    }

    /// Elements of buffers (`pool.pos_grid`). Burn's `Module::num_params` counts both.
    pub fn num_buffer_elements(&self) -> usize {
        count_params_and_buffers::<B, _>(self, is_diffusion_buffer).1
    }

    /// The same model with the backbone(s) frozen (`require_grad = false`).
    pub fn with_frozen_backbone(mut self) -> Self {
        self.rgb_encoder = self.rgb_encoder.map(|r| match r {
            RgbEncoders::Shared(mut e) => {
                e.backbone = e.backbone.frozen();
                RgbEncoders::Shared(e)
            }
            RgbEncoders::PerCamera(v) => RgbEncoders::PerCamera(
                v.into_iter()
                    .map(|mut e| {
                        e.backbone = e.backbone.frozen();
                        e
                    })
                    .collect(),
            ),
        });
        self.config.freeze_backbone = true;
        self
    }

    /// Set every tensor's `require_grad` from the model's rules: `pos_grid` never, the
    /// backbones not when `config.freeze_backbone`, everything else yes. Call after
    /// `AutodiffModule::from_inner`.
    pub fn set_trainable(self) -> Self {
        let paths = if self.config.freeze_backbone { self.backbone_paths() } else { vec![] };
        let frozen: Vec<&str> = paths.iter().map(String::as_str).collect();
        set_trainable(self, is_diffusion_buffer, &frozen)
    }
}

/// What the training stages of [`Diffusion`] read: the batch (with actions) and the caller's
/// randomness (`compute_loss`'s arguments).
#[derive(Clone, Debug)]
pub struct DiffusionInput<B: Backend> {
    pub batch: DiffusionBatch<B>,
    /// `[b, horizon, action_dim]`
    pub noise: Tensor<B, 3>,
    /// One in `0..num_train_timesteps` per sample.
    pub timesteps: Vec<usize>,
    pub ctx: DiffusionCtx,
}

/// A stage of [`Diffusion`]'s training forward (`compute_loss`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiffusionStage {
    /// A backbone stage, on every RGB encoder (the stem reads the cropped images).
    Backbone(ResNetStage),
    /// Encoder heads, global conditioning, noising, the UNet's FiLM input.
    Conditioning,
    /// A UNet stage.
    Unet(UnetStage),
}

/// What flows between [`Diffusion`]'s stages.
#[derive(Clone, Debug)]
pub enum DiffusionState<B: Backend> {
    /// The backbone maps so far, one per RGB encoder (empty before the stem).
    Encoders { maps: Vec<Tensor<B, 4>> },
    /// The UNet's state.
    Unet { unet: UnetState<B> },
}
vramlab_stages::tensor_bundle!(enum DiffusionState { Encoders { maps }, Unet { unet } });

impl<B: LeanBackend> Staged<B> for Diffusion<B> {
    type Input = DiffusionInput<B>;
    type State = DiffusionState<B>;
    /// The loss `[1]` f32.
    type Output = Tensor<B, 1>;
    type Stage = DiffusionStage;

    fn plan(&self, _input: &DiffusionInput<B>) -> Vec<DiffusionStage> {
        let backbone = self.rgb_encoder.as_ref().map_or(Vec::new(), |_| self.rgb_encoder(0).backbone.stages());
        let unet = self.unet.stages().into_iter().map(DiffusionStage::Unet);
        backbone.into_iter().map(DiffusionStage::Backbone).chain([DiffusionStage::Conditioning]).chain(unet).collect()
    }

    fn enter(&self, input: &DiffusionInput<B>) -> DiffusionState<B> {
        let action = input.batch.action.as_ref().expect("DiffusionBatch.action is required for the loss");
        assert_eq!(action.dims()[1], self.config.horizon, "action must have horizon = {} steps", self.config.horizon);
        DiffusionState::Encoders { maps: Vec::new() }
    }

    fn stage(&self, stage: DiffusionStage, state: DiffusionState<B>, input: &DiffusionInput<B>) -> DiffusionState<B> {
        let p = input.ctx.precision;
        match (stage, state) {
            (DiffusionStage::Backbone(s @ ResNetStage::Stem), DiffusionState::Encoders { .. }) => {
                let maps = (0..self.num_rgb_encoders())
                    .map(|e| self.rgb_encoder(e).backbone.stage(s, self.encoder_input(e, &input.batch.images, &input.ctx), p))
                    .collect();
                DiffusionState::Encoders { maps }
            }
            (DiffusionStage::Backbone(s), DiffusionState::Encoders { maps }) => {
                let maps = maps.into_iter().enumerate().map(|(e, m)| self.rgb_encoder(e).backbone.stage(s, m, p)).collect();
                DiffusionState::Encoders { maps }
            }
            (DiffusionStage::Conditioning, DiffusionState::Encoders { maps }) => {
                let global_cond = self.global_conditioning(maps, &input.batch, p);
                let action = input.batch.action.clone().expect("checked by enter");
                let noisy = self.noise_scheduler.add_noise(action, input.noise.clone(), &input.timesteps);
                DiffusionState::Unet { unet: self.unet.enter(noisy, &input.timesteps, global_cond, p) }
            }
            (DiffusionStage::Unet(s), DiffusionState::Unet { unet }) => DiffusionState::Unet { unet: self.unet.stage(s, unet, p) },
            (stage, _) => panic!("Diffusion: stage {stage:?} in the wrong state (stage plan bug)"),
        }
    }

    fn exit(&self, state: DiffusionState<B>, input: &DiffusionInput<B>) -> Tensor<B, 1> {
        let DiffusionState::Unet { unet } = state else { panic!("Diffusion: the plan ends in the UNet (stage plan bug)") };
        let action = input.batch.action.clone().expect("checked by enter");
        self.loss_from_prediction(unet.x, action, input.noise.clone(), input.batch.action_is_pad.clone())
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::Distribution;

    use super::*;

    /// `resize_shape` + `crop_ratio`: each camera is resized (torchvision `Resize`), then
    /// cropped to `int(resize × ratio)` — centred in eval, at the given offsets in training —
    /// and the SpatialSoftmax grid is sized for that crop.
    #[test]
    fn encoder_input_resizes_then_crops() {
        let dev = Default::default();
        let cfg = DiffusionConfig {
            resize_shape: Some([40, 48]),
            crop_ratio: 0.9,
            down_dims: vec![16, 32],
            diffusion_step_embed_dim: 8,
            spatial_softmax_num_keypoints: 4,
            horizon: 8,
            n_action_steps: 4,
            ..DiffusionConfig::default()
        }
        .with_robot_state(2)
        .with_camera("observation.image", [3, 30, 30])
        .with_action(2);
        cfg.validate().unwrap();
        let model = cfg.init::<Flex>(&dev);
        let images = vec![Tensor::<Flex, 5>::random([2, 2, 3, 30, 30], Distribution::Uniform(0.0, 1.0), &dev)];
        let resized = resize_bilinear_antialias(images[0].clone().reshape([4, 3, 30, 30]), [40, 48]);
        let eval = model.encoder_input(0, &images, &DiffusionCtx::eval(Precision::F32));
        assert_eq!(eval.dims(), [4, 3, 36, 43]);
        // CenterCrop offsets: round((40 − 36) / 2), round((48 − 43) / 2) = 2, 2 (half to even).
        assert_eq!(eval.into_data(), crop(resized.clone(), [36, 43], [2, 2]).into_data());
        let train = model.encoder_input(0, &images, &DiffusionCtx::train(Precision::F32).with_crop_offsets(vec![[4, 0]]));
        assert_eq!(train.into_data(), crop(resized, [36, 43], [4, 0]).into_data());
        let cond = model.prepare_global_conditioning(
            &DiffusionBatch { state: Tensor::zeros([2, 2, 2], &dev), images, env_state: None, action: None, action_is_pad: None },
            &DiffusionCtx::eval(Precision::F32),
        );
        assert_eq!(cond.dims(), [2, cfg.global_cond_dim()]);
    }
}
