//! vramlab-models: the workloads vramlab trains, written natively in Burn.
//!
//! Each model lives in its own folder (config, model, weight loading) and keeps the
//! reference implementation's field and parameter names, so reference checkpoints load by
//! name. Models know nothing about training: they expose `forward`, a loss, and a view of
//! their forward pass as a chain of stages (used by the trainer for block checkpointing).

pub mod config_file;
pub mod nn;
/// Weight I/O by name (re-exported so models can say `crate::weights`).
pub use vramlab_store as weights;
pub mod vae3d;
pub mod act;
pub mod diffusion;
pub mod resnet;
