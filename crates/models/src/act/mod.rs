//! ACT (Action Chunking Transformer) as in huggingface/lerobot v0.4.4
//! (`src/lerobot/policies/act/`), natively in Burn.
//!
//! - [`config`]: [`ActConfig`] — lerobot's `ACTConfig` field names and defaults, features,
//!   validation, lerobot `config.json` I/O, closed-form parameter counts, policy facts (delta
//!   indices, normalisation mapping, optimizer preset).
//! - [`model`]: [`Act`] — the `ACT` module with lerobot's parameter names, mixed precision,
//!   deterministic dropout, the loss; its forward is a fold over typed stages ([`ActStage`]).
//! - [`runner`]: [`ActPolicyRunner`] — `select_action` with the action queue or
//!   [`TemporalEnsembler`].
//! - [`load`]: [`load_pretrained`] / [`save_pretrained`] — lerobot `pretrained_model/` dirs.
//!
//! The layers are [`crate::nn`]'s (PyTorch layout), the vision backbone is
//! [`crate::resnet::ResNet`] with FrozenBatchNorm2d.

pub mod config;
pub mod graph;
pub mod load;
pub mod model;
pub mod runner;

pub use config::{ActConfig, ActConfigError, BackboneWeights, FeatureType, Features, InvalidField, PolicyFeature};
pub use load::{ActLoadError, load_pretrained, load_weights, model_key, save_pretrained, save_weights};
pub use model::{
    Act, ActBatch, ActCtx, ActDecoder, ActDecoderLayer, ActEncoder, ActEncoderLayer, ActInput, ActLoss, ActOutput, ActStage,
    ActState, LayerCtx, Posterior, is_act_buffer, sinusoidal_pos_embedding_1d, sinusoidal_pos_embedding_2d,
};
pub use runner::{ActPolicyRunner, TemporalEnsembler};
