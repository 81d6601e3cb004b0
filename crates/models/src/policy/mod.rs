//! What the models share about configs and checkpoints, and lerobot's policy-level facts.
//!
//! - [`features`](Features): lerobot's `PolicyFeature` / `input_features` / `output_features`,
//!   the accessors and builders every config shares ([`PolicyFeatures`]), the shared feature
//!   checks, and the data facts a policy config states: delta indices and
//!   the normalisation mapping.
//! - config files: [`InvalidField`] (a validation error that names the field), reading a
//!   `config.json` ([`read_config`], [`ConfigFileError`]) and lerobot's policy-config layout
//!   ([`LerobotPolicyConfig`], [`deserialize_lerobot`], [`serialize_lerobot`]).
//! - checkpoints: file names, [`CheckpointError`], [`write_config_file`], lerobot's
//!   normalisation-buffer prefixes.
//! - [`OptimizerPreset`]: lerobot's `get_optimizer_preset()` as plain data.
//!
//! Each model's config implements the policy facts as methods (`ActConfig::delta_indices`,
//! `DiffusionConfig::optimizer_preset`, …); the data pipeline and the trainer read them there.

mod checkpoint;
mod config_file;
mod features;
mod preset;

pub(crate) use config_file::{lerobot_names, lerobot_policy_config, name_the_field};
pub use checkpoint::{CONFIG_FILE, CheckpointError, NORMALIZATION_PREFIXES, WEIGHTS_FILE, write_config_file};
pub use config_file::{
    ConfigFileError, InvalidField, LerobotPolicyConfig, PRETRAINED_CONFIG_KEYS, deserialize_lerobot, read_config, serialize_lerobot,
};
pub use features::{
    ACTION, DeltaIndices, FeatureType, Features, NormalizationMapping, NormalizationMode, OBS_ENV_STATE, OBS_STATE, PolicyFeature,
    PolicyFeatures, validate_features,
};
pub use preset::{
    LEROBOT_GRAD_CLIP_NORM, OptimizerKind, OptimizerPreset, ParamGroupPreset, LrSchedulerKind, LrSchedulerPreset, TORCH_ADAM_BETAS,
    TORCH_ADAM_EPS,
};
