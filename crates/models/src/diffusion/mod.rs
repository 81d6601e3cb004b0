//! Diffusion Policy as in huggingface/lerobot v0.4.4 (`src/lerobot/policies/diffusion/`:
//! `configuration_diffusion.py`, `modeling_diffusion.py`), natively in Burn, with diffusers'
//! `DDPMScheduler` / `DDIMScheduler` (as lerobot configures them) re-implemented.
//!
//! - [`config`]: [`DiffusionConfig`] — lerobot's field names and defaults, features,
//!   validation, `config.json` I/O, closed-form parameter counts, policy facts (delta indices,
//!   normalisation mapping, optimizer preset).
//! - [`layers`]: `DiffusionConv1dBlock`, `DiffusionConditionalResidualBlock1d` (FiLM),
//!   `SpatialSoftmax`, Mish, the sinusoidal step embedding.
//! - [`model`]: [`Diffusion`] — `DiffusionModel` (RGB encoder(s) on
//!   [`crate::resnet::ResNet`] with GroupNorm, the conditional 1-D UNet, conditioning, sampling,
//!   the loss); `compute_loss` is a fold over typed stages ([`DiffusionStage`]).
//! - [`scheduler`]: [`NoiseScheduler`] — DDPM / DDIM steps and `add_noise`.
//! - [`runner`]: [`DiffusionPolicyRunner`] — `select_action` with its observation and action
//!   queues.
//! - [`load`]: [`load_pretrained`] / [`save_pretrained`] — lerobot `pretrained_model/` dirs.

pub mod config;
pub mod graph;
pub mod torch_graph;
pub mod layers;
pub mod load;
pub mod model;
pub mod runner;
pub mod scheduler;

pub use config::{BetaSchedule, DiffusionConfig, DiffusionConfigError, PolicyFeatures, PredictionType, SchedulerKind};
pub use layers::{
    ConditionalResidualBlock1d, Conv1dBlock, SpatialSoftmax, antialias_bilinear_weights, mish, resize_bilinear_antialias, sinusoidal_step_embedding,
    spatial_softmax_pos_grid,
};
pub use load::{DiffusionLoadError, file_key, load_pretrained, load_weights, model_key, save_pretrained, save_weights};
pub use model::{
    ConditionalUnet1d, Diffusion, DiffusionBatch, DiffusionCtx, DiffusionInput, DiffusionStage, DiffusionState, RgbEncoder,
    RgbEncoders, UnetStage, UnetState, crop, is_diffusion_buffer,
};
pub use runner::{DiffusionObs, DiffusionPolicyRunner};
pub use scheduler::NoiseScheduler;
