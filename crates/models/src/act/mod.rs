//! ACT (Action Chunking Transformer) as in huggingface/lerobot v0.4.4
//! (`src/lerobot/policies/act/`), natively in Burn.
//!
//! - [`config`]: [`ActConfig`] — lerobot's `ACTConfig` field names and defaults, features,
//!   validation, lerobot `config.json` I/O, closed-form parameter counts, policy facts (delta
//!   indices, normalisation mapping, optimizer preset).
//! - [`layers`]: the transformer encoder / decoder layers ([`ActEncoderLayer`],
//!   [`ActDecoderLayer`], with their [`LayerCtx`]) and the sine position embeddings.
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
pub mod torch_graph;
pub mod layers;
pub mod load;
pub mod model;
pub mod runner;

pub use config::{ActConfig, ActConfigError, BackboneWeights, FeatureType, Features, InvalidField, PolicyFeature, PolicyFeatures};
pub use load::{ActLoadError, load_pretrained, load_weights, model_key, save_pretrained, save_weights};
pub use layers::{ActDecoder, ActDecoderLayer, ActEncoder, ActEncoderLayer, LayerCtx, sinusoidal_pos_embedding_1d, sinusoidal_pos_embedding_2d};
pub use model::{Act, ActBatch, ActCtx, ActInput, ActLoss, ActOutput, ActStage, ActState, Posterior, is_act_buffer};
pub use runner::{ActPolicyRunner, TemporalEnsembler};
