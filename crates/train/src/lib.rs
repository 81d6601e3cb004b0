//! vramlab-train: a model-agnostic, memory-instrumented trainer.
//!
//! The trainer sees a model only through [`TrainModel`] (the model's forward as a chain of
//! typed stages, [`vramlab_stages::Staged`], the forward's input for a batch, and a loss) and
//! memory only through [`vramlab_probe::MemoryProbe`]. Its modules, from the loop down:
//! - [`trainer`]: the loop (steps, gradient accumulation, global-norm clipping, f16 loss
//!   scaling, measurement per phase, exact resume); [`error`]: what it fails with.
//! - [`recompute`]: block gradient checkpointing over the stage plan ([`CheckpointMode`]).
//! - [`memory_timeline`]: `--memory_timeline` snapshots of chosen steps.
//! - [`checkpoint`]: the run's checkpoint directories (lerobot's layout) and their verification.
//! - [`optim`] with its kernels ([`optim_kernels`]), and [`schedule`] (learning rates).
//! - [`metrics`] (per-step records, the summary) and [`plots`] (the run's SVGs); [`model`]:
//!   the [`TrainModel`] trait.

pub mod checkpoint;
pub mod error;
pub mod recompute;
pub mod memory_timeline;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod optim_kernels;
pub mod plots;
pub mod schedule;
pub mod trainer;

pub use recompute::CheckpointMode;
pub use metrics::{KernelStep, StepRecord};
pub use model::{LossParts, ModelInput, ModelOutput, TrainModel};
pub use optim::{OptimConfig, OptimError, OptimKind, Optimizer, ParamGroup};
pub use optim_kernels::OptimKernels;
/// The stage-chain traits a [`TrainModel`]'s model implements (re-exported for adapters).
pub use vramlab_stages::{self as stages, Staged, TensorBundle};
pub use schedule::{LrSchedule, ScheduleKind};
pub use error::{BoxError, TrainError};
pub use trainer::{TrainConfig, TrainOutcome, Trainer};

/// Per-step deterministic seeding: the same (seed, step, stream) always gives the same RNG,
/// so a resumed run draws exactly the numbers an uninterrupted one would.
pub fn step_rng(seed: u64, step: u64, stream: u64) -> rand::rngs::StdRng {
    use rand::SeedableRng;
    // SplitMix64 finalizer over the three words.
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    rand::rngs::StdRng::seed_from_u64(z)
}
