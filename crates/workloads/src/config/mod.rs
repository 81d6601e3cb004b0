//! Run configuration, parsed once and up front: a TOML file (or lerobot's `train_config.json`)
//! plus lerobot-style dotted overrides, typed into [`RunConfig`] and checked by
//! [`RunConfig::validate`] before any data is generated or any model is built.
//!
//! `--policy.chunk_size=50 --batch_size=24` are applied to the file's tree before it is typed,
//! so a flag and a file line are the same thing. Every switch is a serde enum and `policy` is
//! the typed per-policy config ([`PolicyConfig`]). Unknown names are errors that list the
//! valid ones.
//!
//! | file | holds |
//! |---|---|
//! | [`types`] | [`RunConfig`] and its sections, the switches' serde helpers |
//! | [`policy`] | the typed `policy` section: [`Workload`] (the model family), feature shorthands, their resolution |
//! | [`tree`] | the untyped tree: flag values parsed as meant, dotted keys set |
//! | [`lerobot`] | lerobot's `train_config.json` and generic policy keys mapped onto the tree |
//! | [`load`](mod@load) | file + resume + overrides → [`RunConfig`] |
//! | [`validate`](mod@validate) | ranges, toggles, dataset type, policy fields, grid, files |
//!
//! The module reaches nothing above it in the crate: only the error, the backend names and the
//! checkpoint layout.

pub mod lerobot;
pub mod load;
pub mod policy;
pub mod tree;
pub mod types;
pub mod validate;

pub use load::{load, load_tree};
pub use policy::{ActPolicy, DataFeatures, DiffusionPolicy, FeatureConfig, FeatureFlags, PolicyConfig, Vae3dPolicy, Workload};
pub use tree::{parse_value, set_dotted};
pub use types::{DatasetConfig, DatasetType, OptimizerConfig, RunConfig, SchedulerConfig};
pub use validate::grid_mismatch;
