//! vramlab-models: the workloads vramlab trains, written natively in Burn.
//!
//! Each model lives in its own folder (config, model, weight loading) and keeps the
//! reference implementation's field and parameter names, so reference checkpoints load by
//! name. Models know nothing about training: each describes its forward pass as a plan of
//! typed stages ([`stages::Staged`]: plan, enter, stage, exit) and its `forward` is the fold
//! over them, so inference, the parity tests and the trainer's block checkpointing run one
//! implementation. Each also exposes its loss and its policy facts (delta indices,
//! normalisation mapping, optimizer preset) on its config.
//!
//! Shared by the models: [`nn`] (PyTorch-layout layers, mixed precision; `nn/lean/` the
//! autodiff nodes over `nn/flex/` the CPU kernels they run), [`policy`] (config files,
//! checkpoints, lerobot's policy features and facts), [`resnet`] (the vision trunk and its
//! ResNet-18 graph), [`graph`] (the shape-only op graph of a training step, which each model's
//! `graph.rs` builds and the estimator replays for its peak memory). No model imports another:
//! `act`, `diffusion` and `vae3d` each use only these.
//!
//! The robot policies' lerobot `select_action` runners live beside their models:
//! `act/runner.rs` (action queue, temporal ensembling) and `diffusion/runner.rs` (observation
//! and action queues).

pub mod graph;
pub mod nn;
pub mod policy;
pub mod resnet;
/// Weight I/O by name (re-exported so models can say `crate::weights`).
pub use vramlab_store as weights;
/// The stage-chain traits the models implement (re-exported for callers).
pub use vramlab_stages as stages;

pub mod act;
pub mod diffusion;
pub mod vae3d;
