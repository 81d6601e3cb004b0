//! ACT (Action Chunking Transformer) as in huggingface/lerobot v0.4.4
//! (`src/lerobot/policies/act/`), natively in Burn.
//!
//! - [`config`]: [`ActConfig`] — lerobot's `ACTConfig` field names and defaults, features,
//!   validation, lerobot `config.json` I/O, closed-form parameter counts.
//! - [`model`]: [`Act`] — the `ACT` module with lerobot's parameter names, mixed precision,
//!   deterministic dropout, the loss, and the stage pieces a trainer can checkpoint.
//! - [`layers`]: PyTorch-layout `Linear`, `LayerNorm`, `Embedding`, `MultiheadAttention`,
//!   [`DropoutCtx`].
//! - [`runner`]: [`ActPolicyRunner`] — `select_action` with the action queue or
//!   [`TemporalEnsembler`].
//! - [`load`]: [`load_pretrained`] / [`save_pretrained`] — lerobot `pretrained_model/` dirs.
//!
//! The vision backbone is [`crate::resnet::ResNet`] with FrozenBatchNorm2d.

pub mod config;
pub mod layers;
pub mod load;
pub mod model;
pub mod runner;

pub use config::{ActConfig, ActConfigError, FeatureType, Features, InvalidField, PolicyFeature};
pub use layers::{Activation, DropoutCtx, Embedding, LayerNorm, Linear, MultiheadAttention};
pub use load::{ActLoadError, load_pretrained, load_weights, model_key, save_pretrained, save_weights};
pub use model::{
    Act, ActBatch, ActCtx, ActDecoder, ActDecoderLayer, ActEncoder, ActEncoderLayer, ActLoss, ActOutput, LayerCtx,
    is_act_buffer, sinusoidal_pos_embedding_1d, sinusoidal_pos_embedding_2d,
};
pub use runner::{ActPolicyRunner, TemporalEnsembler};
