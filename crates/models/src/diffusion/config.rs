//! Configuration of Diffusion Policy, read from and written to lerobot's `config.json`.
//!
//! Reference: huggingface/lerobot v0.4.4
//! `src/lerobot/policies/diffusion/configuration_diffusion.py` (`DiffusionConfig`: field names,
//! defaults, `__post_init__` / `validate_features` checks) and `src/lerobot/configs/policies.py`
//! (`PreTrainedConfig`: the features and the generic keys).
//!
//! # JSON
//! The layout of [`crate::policy::LerobotPolicyConfig`]: `"type"` must be `"diffusion"` when
//! present; lerobot's generic keys ([`crate::policy::PRETRAINED_CONFIG_KEYS`] and
//! [`LEROBOT_GENERIC_KEYS`]) are accepted and kept verbatim in
//! [`DiffusionConfig::lerobot_extra`] (written back on save); any other unknown key is an error
//! naming it; `noise_scheduler_type`, `beta_schedule` and `prediction_type` are typed
//! ([`SchedulerKind`], [`BetaSchedule`], [`PredictionType`]: lerobot's names), so a bad one is
//! an error of reading that names the field; `input_features` keeps the file's order (camera order = feature order of the
//! global conditioning). `pretrained_backbone_weights` must be `null` with `use_group_norm`
//! (lerobot raises too); `compile_model` / `compile_mode` (`torch.compile`, speed only) have no
//! effect.
//!
//! # Defaults
//! Every default is lerobot 0.4.4's `DiffusionConfig()` — note that **`crop_shape` defaults to
//! `None` in 0.4.4** (older lerobot used `(84, 84)`); [`DiffusionConfig::pusht`] builds the
//! classic PushT setup (state 2, action 2, one 96×96 camera, crop 84×84).
//!
//! # Resize and crop
//! As lerobot 0.4.4's `DiffusionRgbEncoder`: each camera is resized to `resize_shape`
//! (torchvision `Resize`: bilinear, antialiased) when it is set, then cropped. With
//! `resize_shape` the crop is *derived* (`__post_init__`): `resize_shape × crop_ratio`
//! (truncated) when `crop_ratio < 1`, no crop at `crop_ratio = 1`; lerobot overwrites
//! `crop_shape` with it, vramlab accepts a `crop_shape` only when it equals the derived one
//! (anything else would be silently dropped) — see [`DiffusionConfig::effective_crop_shape`].
//!
//! vramlab's own field `freeze_backbone` is written only when `true`.
//!
//! # Policy facts
//! [`DiffusionConfig::delta_indices`] (the sample window), `normalization_mapping` and
//! [`DiffusionConfig::optimizer_preset`] (`get_optimizer_preset` + `get_scheduler_preset`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::policy::{ACTION, FeatureType, Features, InvalidField, OBS_ENV_STATE, OBS_STATE, PolicyFeature, PolicyFeatures};
use crate::policy::{
    DeltaIndices, LEROBOT_GRAD_CLIP_NORM, NormalizationMapping, NormalizationMode, OptimizerKind, OptimizerPreset, LrSchedulerKind,
    LrSchedulerPreset, lerobot_names, lerobot_policy_config, validate_features,
};
use crate::resnet::{OUT_CHANNELS, ResNetConfig, ResNetNorm};

/// Diffusion's keys of a lerobot `config.json` that vramlab accepts without modelling them
/// (kept verbatim in [`DiffusionConfig::lerobot_extra`]), besides `PreTrainedConfig`'s:
/// torchvision pretrained weights (must be null: the GroupNorm trunk cannot take them) and the
/// `torch.compile` switches (speed only).
pub const LEROBOT_GENERIC_KEYS: [&str; 3] = ["pretrained_backbone_weights", "compile_model", "compile_mode"];

/// Generic keys written as `null` when absent (lerobot's defaults; read back as absent).
const NULL_WRITTEN_KEYS: [&str; 1] = ["pretrained_backbone_weights"];

fn is_false(b: &bool) -> bool {
    !*b
}

/// `noise_scheduler_type`: diffusers' `DDPMScheduler` or `DDIMScheduler`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SchedulerKind {
    #[serde(rename = "DDPM")]
    Ddpm,
    #[serde(rename = "DDIM")]
    Ddim,
}

/// `beta_schedule`: diffusers' schedules that lerobot configs use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BetaSchedule {
    #[serde(rename = "linear")]
    Linear,
    #[serde(rename = "scaled_linear")]
    ScaledLinear,
    /// `betas_for_alpha_bar(T, "cosine")`, `max_beta = 0.999`.
    #[serde(rename = "squaredcos_cap_v2")]
    SquaredcosCapV2,
}

/// `prediction_type`: what the UNet predicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PredictionType {
    /// The noise `ε` (lerobot's default).
    #[serde(rename = "epsilon")]
    Epsilon,
    /// The clean sample `x₀`.
    #[serde(rename = "sample")]
    Sample,
}

lerobot_names! {
    SchedulerKind { Ddpm => "DDPM", Ddim => "DDIM" }
    BetaSchedule { Linear => "linear", ScaledLinear => "scaled_linear", SquaredcosCapV2 => "squaredcos_cap_v2" }
    PredictionType { Epsilon => "epsilon", Sample => "sample" }
}

/// lerobot's `DiffusionConfig` (+ the features of `PreTrainedConfig`) and vramlab's
/// `freeze_backbone`. Defaults are lerobot 0.4.4's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self", default, deny_unknown_fields)]
pub struct DiffusionConfig {
    /// Observation steps fed to the policy (current + past).
    pub n_obs_steps: usize,
    /// Inputs, in file order: `observation.state` (STATE `[state_dim]`, required), cameras
    /// (VISUAL `[3, h, w]`, all the same shape), an environment state (ENV `[env_dim]`).
    #[serde(skip)]
    pub input_features: Features,
    /// Outputs: `action` (ACTION `[action_dim]`).
    #[serde(skip)]
    pub output_features: Features,
    /// How the data pipeline normalises each feature type (lerobot: cameras MEAN_STD, state
    /// and action MIN_MAX).
    pub normalization_mapping: NormalizationMapping,
    /// Actions generated per sample (counted from the first observation step).
    pub horizon: usize,
    /// Actions executed per prediction.
    pub n_action_steps: usize,
    /// Dataset sampling detail (frames not sampled at the end of an episode); data-side only.
    pub drop_n_last_frames: usize,
    /// `"resnet18"` or `"resnet34"` (the BasicBlock ResNets).
    pub vision_backbone: String,
    /// Resize every camera to `(h, w)` before the crop (torchvision `Resize`, bilinear with
    /// antialiasing); `None`: no resize.
    pub resize_shape: Option<[usize; 2]>,
    /// With `resize_shape`: the crop is `resize_shape × crop_ratio` (`< 1`) or none (`= 1`).
    /// In `(0, 1]`; no effect without `resize_shape`.
    pub crop_ratio: f64,
    /// `(h, w)` crop (center at eval, random in training); `None`: no crop. With
    /// `resize_shape` it is derived ([`DiffusionConfig::effective_crop_shape`]).
    pub crop_shape: Option<[usize; 2]>,
    pub crop_is_random: bool,
    /// Must be true: BatchNorm2d's batch statistics are not implemented (see `validate`).
    pub use_group_norm: bool,
    pub spatial_softmax_num_keypoints: usize,
    pub use_separate_rgb_encoder_per_camera: bool,
    /// UNet widths per level; the horizon must be a multiple of `2^len`.
    pub down_dims: Vec<usize>,
    pub kernel_size: usize,
    pub n_groups: usize,
    pub diffusion_step_embed_dim: usize,
    pub use_film_scale_modulation: bool,
    /// `"DDPM"` or `"DDIM"`.
    pub noise_scheduler_type: SchedulerKind,
    pub num_train_timesteps: usize,
    /// `"squaredcos_cap_v2"`, `"linear"` or `"scaled_linear"`.
    pub beta_schedule: BetaSchedule,
    pub beta_start: f64,
    pub beta_end: f64,
    /// `"epsilon"` or `"sample"`.
    pub prediction_type: PredictionType,
    pub clip_sample: bool,
    pub clip_sample_range: f64,
    /// `None`: `num_train_timesteps`.
    pub num_inference_steps: Option<usize>,
    pub do_mask_loss_for_padding: bool,
    pub optimizer_lr: f64,
    pub optimizer_betas: [f64; 2],
    pub optimizer_eps: f64,
    pub optimizer_weight_decay: f64,
    pub scheduler_name: String,
    pub scheduler_warmup_steps: usize,
    /// vramlab: keep the vision backbone(s) frozen (written only when true).
    #[serde(skip_serializing_if = "is_false")]
    pub freeze_backbone: bool,
    /// The lerobot generic keys read from a `config.json`, verbatim (written back on save).
    #[serde(skip)]
    pub lerobot_extra: BTreeMap<String, serde_json::Value>,
}

impl Default for DiffusionConfig {
    /// lerobot 0.4.4's `DiffusionConfig()`, with no features.
    fn default() -> Self {
        Self {
            n_obs_steps: 2,
            input_features: Features::default(),
            output_features: Features::default(),
            normalization_mapping: [
                (FeatureType::Visual, NormalizationMode::MeanStd),
                (FeatureType::State, NormalizationMode::MinMax),
                (FeatureType::Action, NormalizationMode::MinMax),
            ]
            .into(),
            horizon: 16,
            n_action_steps: 8,
            drop_n_last_frames: 7,
            vision_backbone: "resnet18".into(),
            resize_shape: None,
            crop_ratio: 1.0,
            crop_shape: None,
            crop_is_random: true,
            use_group_norm: true,
            spatial_softmax_num_keypoints: 32,
            use_separate_rgb_encoder_per_camera: false,
            down_dims: vec![512, 1024, 2048],
            kernel_size: 5,
            n_groups: 8,
            diffusion_step_embed_dim: 128,
            use_film_scale_modulation: true,
            noise_scheduler_type: SchedulerKind::Ddpm,
            num_train_timesteps: 100,
            beta_schedule: BetaSchedule::SquaredcosCapV2,
            beta_start: 1e-4,
            beta_end: 0.02,
            prediction_type: PredictionType::Epsilon,
            clip_sample: true,
            clip_sample_range: 1.0,
            num_inference_steps: None,
            do_mask_loss_for_padding: false,
            optimizer_lr: 1e-4,
            optimizer_betas: [0.95, 0.999],
            optimizer_eps: 1e-8,
            optimizer_weight_decay: 1e-6,
            scheduler_name: "cosine".into(),
            scheduler_warmup_steps: 500,
            freeze_backbone: false,
            lerobot_extra: BTreeMap::new(),
        }
    }
}

lerobot_policy_config!(DiffusionConfig {
    type: "diffusion",
    expecting: "a lerobot diffusion config object",
    generic_keys: LEROBOT_GENERIC_KEYS,
    null_written_keys: NULL_WRITTEN_KEYS,
});

/// Reading this config from a `config.json` (shared by every model config).
pub type DiffusionConfigError = crate::policy::ConfigFileError;

/// Python's `round` (half to even) of `n / 2`: torchvision `CenterCrop`'s offset.
fn half_round_even(n: usize) -> usize {
    let k = n / 2;
    if n % 2 == 1 && k % 2 == 1 { k + 1 } else { k }
}

impl DiffusionConfig {
    /// lerobot's PushT setup: `observation.state` 2, `observation.image` 3×96×96, `action` 2,
    /// crop 84×84; every other field at its default.
    pub fn pusht() -> Self {
        Self { crop_shape: Some([84, 84]), ..Self::default() }
            .with_robot_state(2)
            .with_camera("observation.image", [3, 96, 96])
            .with_action(2)
    }

    /// `robot_state_feature`'s size (0 when missing; `validate` rejects that).
    pub fn state_dim(&self) -> usize {
        self.robot_state_dim().unwrap_or(0)
    }

    /// lerobot's `observation_delta_indices` (`range(1 − n_obs_steps, 1)`),
    /// `action_delta_indices` (`range(1 − n_obs_steps, 1 − n_obs_steps + horizon)`) and
    /// `reward_delta_indices` (`None`).
    pub fn delta_indices(&self) -> DeltaIndices {
        let first = 1 - self.n_obs_steps as i64;
        DeltaIndices {
            observation: Some((first..1).collect()),
            action: Some((first..first + self.horizon as i64).collect()),
            reward: None,
        }
    }

    /// lerobot's `DiffusionConfig.get_optimizer_preset()`: `AdamConfig(lr, betas, eps,
    /// weight_decay)` from the `optimizer_*` fields (`grad_clip_norm = 10`, `AdamConfig`'s
    /// default), and `get_scheduler_preset()`: `DiffuserSchedulerConfig(name=scheduler_name,
    /// num_warmup_steps=scheduler_warmup_steps)`. One parameter group (`get_optim_params`).
    pub fn optimizer_preset(&self) -> OptimizerPreset {
        let (kind, warmup) = match self.scheduler_name.as_str() {
            "cosine" => (LrSchedulerKind::Cosine, self.scheduler_warmup_steps),
            // diffusers' `constant` ignores the warmup; `validate` admits only these three.
            "constant" => (LrSchedulerKind::Constant, 0),
            _ => (LrSchedulerKind::Constant, self.scheduler_warmup_steps),
        };
        OptimizerPreset {
            kind: OptimizerKind::Adam,
            lr: self.optimizer_lr,
            betas: (self.optimizer_betas[0], self.optimizer_betas[1]),
            eps: self.optimizer_eps,
            weight_decay: self.optimizer_weight_decay,
            grad_clip_norm: Some(LEROBOT_GRAD_CLIP_NORM),
            scheduler: Some(LrSchedulerPreset { kind, warmup_steps: warmup as u64 }),
            backbone: None,
        }
    }

    /// The vision trunk (GroupNorm), or `None` without cameras.
    pub fn backbone_config(&self) -> Option<ResNetConfig> {
        if self.image_features().is_empty() {
            return None;
        }
        ResNetConfig::from_name(&self.vision_backbone, ResNetNorm::GroupNorm)
    }

    /// RGB encoders built: 0 without cameras, one per camera with
    /// `use_separate_rgb_encoder_per_camera`, else 1.
    pub fn num_rgb_encoders(&self) -> usize {
        match self.num_cameras() {
            0 => 0,
            n if self.use_separate_rgb_encoder_per_camera => n,
            _ => 1,
        }
    }

    /// The crop the RGB encoder applies: lerobot's `__post_init__` derives it from
    /// `resize_shape × crop_ratio` (truncated; none at `crop_ratio = 1`) when `resize_shape` is
    /// set; otherwise `crop_shape`.
    pub fn effective_crop_shape(&self) -> Option<[usize; 2]> {
        match self.resize_shape {
            // Python's `int(h * ratio)`: truncation of the f64 product.
            Some([h, w]) if self.crop_ratio < 1.0 => Some([(h as f64 * self.crop_ratio) as usize, (w as f64 * self.crop_ratio) as usize]),
            Some(_) => None,
            None => self.crop_shape,
        }
    }

    /// `[h, w]` of the images entering the crop: `resize_shape`, else the camera's.
    pub fn encoder_image_size(&self) -> Option<[usize; 2]> {
        let (_, [_, h, w]) = *self.image_features().first()?;
        Some(self.resize_shape.unwrap_or([h, w]))
    }

    /// `[h, w]` of the images the backbone sees (the crop, else the resized or camera shape).
    pub fn backbone_input_size(&self) -> Option<[usize; 2]> {
        let size = self.encoder_image_size()?;
        Some(self.effective_crop_shape().unwrap_or(size))
    }

    /// `[h', w']` of the backbone's feature map (the SpatialSoftmax grid).
    pub fn feature_map_size(&self) -> Option<[usize; 2]> {
        let [h, w] = self.backbone_input_size()?;
        Some(self.backbone_config()?.feature_size(h, w))
    }

    /// torchvision `CenterCrop`'s `[top, left]` for the configured crop (`None`: no crop).
    pub fn center_crop_offset(&self) -> Option<[usize; 2]> {
        let crop = self.effective_crop_shape()?;
        let [h, w] = self.encoder_image_size()?;
        Some([half_round_even(h - crop[0]), half_round_even(w - crop[1])])
    }

    /// The largest `[top, left]` of a random crop (torchvision `RandomCrop` draws each uniformly
    /// in `0..=max`); `None` without a crop. The trainer draws the offsets and passes them in
    /// [`super::DiffusionCtx::crop_offsets`].
    pub fn random_crop_max_offset(&self) -> Option<[usize; 2]> {
        let crop = self.effective_crop_shape()?;
        let [h, w] = self.encoder_image_size()?;
        Some([h - crop[0], w - crop[1]])
    }

    /// Features per observation step: state, `2·K` per camera, env state.
    pub fn obs_feature_dim(&self) -> usize {
        self.state_dim() + self.num_cameras() * 2 * self.spatial_softmax_num_keypoints + self.env_state_dim().unwrap_or(0)
    }

    /// `global_cond_dim · n_obs_steps`: the UNet's global conditioning width.
    pub fn global_cond_dim(&self) -> usize {
        self.obs_feature_dim() * self.n_obs_steps
    }

    /// FiLM conditioning width: step embedding + global conditioning.
    pub fn cond_dim(&self) -> usize {
        self.diffusion_step_embed_dim + self.global_cond_dim()
    }

    /// Reverse diffusion steps at inference (`num_inference_steps` or `num_train_timesteps`).
    pub fn inference_steps(&self) -> usize {
        self.num_inference_steps.unwrap_or(self.num_train_timesteps)
    }

    /// Check the config as lerobot does (`__post_init__`, `validate_features`, the model's own
    /// asserts) and what vramlab implements; the error names the field.
    pub fn validate(&self) -> Result<(), InvalidField> {
        let bad = |field, msg: String| Err(InvalidField { field, msg });
        for (field, v) in [
            ("n_obs_steps", self.n_obs_steps),
            ("horizon", self.horizon),
            ("n_action_steps", self.n_action_steps),
            ("spatial_softmax_num_keypoints", self.spatial_softmax_num_keypoints),
            ("n_groups", self.n_groups),
            ("num_train_timesteps", self.num_train_timesteps),
        ] {
            if v == 0 {
                return bad(field, "must be > 0".into());
            }
        }
        if self.n_action_steps + self.n_obs_steps > self.horizon + 1 {
            return bad(
                "n_action_steps",
                format!(
                    "must be <= horizon - n_obs_steps + 1 = {} (lerobot's select_action), got {}",
                    (self.horizon + 1).saturating_sub(self.n_obs_steps),
                    self.n_action_steps
                ),
            );
        }
        if ResNetConfig::from_name(&self.vision_backbone, ResNetNorm::GroupNorm).is_none() {
            return bad("vision_backbone", format!("only \"resnet18\" and \"resnet34\" are supported, got {:?}", self.vision_backbone));
        }
        if !self.use_group_norm {
            return bad("use_group_norm", "must be true: vramlab implements the GroupNorm backbone only (BatchNorm2d training statistics are not implemented)".into());
        }
        if self.lerobot_extra.get("pretrained_backbone_weights").is_some_and(|v| !v.is_null()) {
            return bad("pretrained_backbone_weights", "must be null with use_group_norm (lerobot: \"You can't replace BatchNorm in a pretrained model\")".into());
        }
        if let Some(r) = self.resize_shape
            && r.contains(&0)
        {
            return bad("resize_shape", format!("must be a pair of positive integers, got {r:?}"));
        }
        if !(self.crop_ratio > 0.0 && self.crop_ratio <= 1.0) {
            return bad("crop_ratio", format!("must be in (0, 1], got {}", self.crop_ratio));
        }
        if let (Some(resize), Some(crop)) = (self.resize_shape, self.crop_shape)
            && self.effective_crop_shape() != Some(crop)
        {
            return bad(
                "crop_shape",
                format!(
                    "{crop:?} would be ignored: with resize_shape {resize:?} lerobot derives the crop from crop_ratio ({} → {:?}); drop crop_shape and set crop_ratio",
                    self.crop_ratio,
                    self.effective_crop_shape()
                ),
            );
        }
        if let Some(c) = self.effective_crop_shape()
            && c.contains(&0)
        {
            return bad("crop_shape", format!("must have positive dimensions, got {c:?}"));
        }
        if self.down_dims.is_empty() || self.down_dims.contains(&0) {
            return bad("down_dims", format!("must be a non-empty list of positive widths, got {:?}", self.down_dims));
        }
        if let Some(d) = self.down_dims.iter().find(|d| *d % self.n_groups != 0) {
            return bad("n_groups", format!("{} groups do not divide the UNet width {d}", self.n_groups));
        }
        let factor = 1usize.checked_shl(self.down_dims.len() as u32).unwrap_or(0);
        if factor == 0 || !self.horizon.is_multiple_of(factor) {
            return bad("horizon", format!("must be a multiple of 2^len(down_dims) = {factor}, got {}", self.horizon));
        }
        if self.kernel_size.is_multiple_of(2) {
            return bad("kernel_size", format!("must be odd (padding kernel_size // 2 keeps the length), got {}", self.kernel_size));
        }
        if self.diffusion_step_embed_dim < 4 || !self.diffusion_step_embed_dim.is_multiple_of(2) {
            return bad("diffusion_step_embed_dim", format!("must be even and >= 4 (sinusoidal embedding), got {}", self.diffusion_step_embed_dim));
        }
        for (field, v) in [("beta_start", self.beta_start), ("beta_end", self.beta_end)] {
            if !(v.is_finite() && v > 0.0 && v < 1.0) {
                return bad(field, format!("must be in (0, 1), got {v}"));
            }
        }
        if !(self.clip_sample_range.is_finite() && self.clip_sample_range > 0.0) {
            return bad("clip_sample_range", format!("must be finite and > 0, got {}", self.clip_sample_range));
        }
        if let Some(n) = self.num_inference_steps
            && (n == 0 || n > self.num_train_timesteps)
        {
            return bad("num_inference_steps", format!("must be in 1..=num_train_timesteps ({}), got {n}", self.num_train_timesteps));
        }
        for (field, v) in [
            ("optimizer_lr", self.optimizer_lr),
            ("optimizer_eps", self.optimizer_eps),
            ("optimizer_weight_decay", self.optimizer_weight_decay),
        ] {
            if !v.is_finite() || v < 0.0 {
                return bad(field, format!("must be finite and >= 0, got {v}"));
            }
        }
        if self.optimizer_betas.iter().any(|b| !(0.0..1.0).contains(b)) {
            return bad("optimizer_betas", format!("must be in [0, 1), got {:?}", self.optimizer_betas));
        }
        if !matches!(self.scheduler_name.as_str(), "cosine" | "constant" | "constant_with_warmup") {
            let why = if matches!(self.scheduler_name.as_str(), "linear" | "cosine_with_restarts" | "polynomial" | "piecewise_constant") {
                "is a diffusers schedule vramlab does not implement"
            } else {
                "is not a diffusers `get_scheduler` name"
            };
            return bad(
                "scheduler_name",
                format!("{:?} {why}; vramlab implements \"cosine\", \"constant\" and \"constant_with_warmup\"", self.scheduler_name),
            );
        }
        // Features (validate_features and the model's needs).
        validate_features(&self.input_features, &self.output_features)?;
        if self.state_dim() == 0 {
            return bad("input_features", "needs `observation.state` (STATE): Diffusion Policy always conditions on it".into());
        }
        let cams = self.image_features();
        if cams.is_empty() && self.env_state_dim().is_none() {
            return bad("input_features", "needs at least one camera (VISUAL) or an environment state (ENV)".into());
        }
        if let Some((first, shape)) = cams.first()
            && let Some((k, s)) = cams.iter().find(|(_, s)| s != shape)
        {
            return bad("input_features", format!("`{k}` has shape {s:?} but `{first}` has {shape:?}: all cameras must match"));
        }
        // lerobot checks the fit only without a resize (the derived crop always fits).
        if let (None, Some(crop), Some((k, [_, h, w]))) = (self.resize_shape, self.crop_shape, cams.first())
            && (crop[0] == 0 || crop[1] == 0 || crop[0] > *h || crop[1] > *w)
        {
            return bad("crop_shape", format!("{crop:?} must be positive and fit within `{k}` ({h}×{w})"));
        }
        Ok(())
    }

    /// Parameters of one RGB encoder: trunk + SpatialSoftmax 1×1 conv + `out` Linear.
    pub fn rgb_encoder_num_params(&self) -> usize {
        let Some(bb) = self.backbone_config() else { return 0 };
        let k = self.spatial_softmax_num_keypoints;
        bb.num_parameters() + (OUT_CHANNELS * k + k) + (2 * k * 2 * k + 2 * k)
    }

    /// Parameters of `ConditionalUnet1d`, in closed form.
    pub fn unet_num_params(&self) -> usize {
        let (a, e, k) = (self.action_dim(), self.diffusion_step_embed_dim, self.kernel_size);
        let cond = self.cond_dim();
        let film = if self.use_film_scale_modulation { 2 } else { 1 };
        let conv_block = |i: usize, o: usize| i * o * k + o + 2 * o; // Conv1d + GroupNorm
        let res = |i: usize, o: usize| {
            conv_block(i, o) + (cond * film * o + film * o) + conv_block(o, o) + if i != o { i * o + o } else { 0 }
        };
        let mut n = (e * 4 * e + 4 * e) + (4 * e * e + e); // diffusion_step_encoder
        let dims = &self.down_dims;
        let in_out: Vec<(usize, usize)> = std::iter::once((a, dims[0])).chain(dims.windows(2).map(|w| (w[0], w[1]))).collect();
        for (ind, &(i, o)) in in_out.iter().enumerate() {
            n += res(i, o) + res(o, o);
            if ind + 1 < in_out.len() {
                n += o * o * 3 + o; // Downsample1d
            }
        }
        let last = *dims.last().unwrap_or(&0);
        n += 2 * res(last, last);
        for &(o, i) in in_out[1..].iter().rev() {
            n += res(2 * i, o) + res(o, o) + (o * o * 4 + o); // + Upsample1d (ConvTranspose1d)
        }
        n + conv_block(dims[0], dims[0]) + (dims[0] * a + a)
    }

    /// PyTorch's `sum(p.numel() for p in policy.parameters())` in closed form (the
    /// SpatialSoftmax `pos_grid` is a buffer and not counted; a frozen backbone is).
    pub fn num_params(&self) -> usize {
        self.num_rgb_encoders() * self.rgb_encoder_num_params() + self.unet_num_params()
    }

    /// Elements of buffers in the state dict: each encoder's `pool.pos_grid` `[h'·w', 2]`.
    pub fn num_buffer_elements(&self) -> usize {
        self.feature_map_size().map_or(0, |[h, w]| self.num_rgb_encoders() * h * w * 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_facts_are_lerobots() {
        let c = DiffusionConfig::pusht();
        let d = c.delta_indices();
        assert_eq!(d.observation, Some(vec![-1, 0]));
        assert_eq!(d.action, Some((-1..15).collect()));
        assert_eq!(d.reward, None);
        assert_eq!(c.normalization_mapping.get(&FeatureType::State), Some(&NormalizationMode::MinMax));
        assert_eq!(c.normalization_mapping.get(&FeatureType::Visual), Some(&NormalizationMode::MeanStd));
        let p = c.optimizer_preset();
        assert_eq!((p.kind, p.lr, p.betas, p.eps, p.weight_decay), (OptimizerKind::Adam, 1e-4, (0.95, 0.999), 1e-8, 1e-6));
        assert_eq!(p.grad_clip_norm, Some(10.0));
        assert_eq!(p.scheduler, Some(LrSchedulerPreset { kind: LrSchedulerKind::Cosine, warmup_steps: 500 }));
        assert!(p.backbone.is_none());
        let constant = DiffusionConfig { scheduler_name: "constant".into(), ..c.clone() };
        assert_eq!(constant.optimizer_preset().scheduler, Some(LrSchedulerPreset { kind: LrSchedulerKind::Constant, warmup_steps: 0 }));
        let bad = DiffusionConfig { scheduler_name: "polynomial".into(), ..c };
        assert_eq!(bad.validate().unwrap_err().field, "scheduler_name");
    }

    #[test]
    fn typed_values_use_lerobots_names() {
        let pairs = [SchedulerKind::Ddpm, SchedulerKind::Ddim].map(|k| (serde_json::to_value(k).unwrap(), k.name())).into_iter()
            .chain([BetaSchedule::Linear, BetaSchedule::ScaledLinear, BetaSchedule::SquaredcosCapV2].map(|b| (serde_json::to_value(b).unwrap(), b.name())))
            .chain([PredictionType::Epsilon, PredictionType::Sample].map(|p| (serde_json::to_value(p).unwrap(), p.name())));
        pairs.for_each(|(json, name)| assert_eq!(json, name));
    }

    #[test]
    fn pusht_counts_match_lerobot() {
        let c = DiffusionConfig::pusht();
        c.validate().unwrap();
        assert_eq!(c.rgb_encoder_num_params(), 11_197_088);
        assert_eq!(c.unet_num_params(), 251_511_938);
        assert_eq!(c.num_params(), 262_709_026);
        assert_eq!(c.feature_map_size(), Some([3, 3]));
        assert_eq!(c.num_buffer_elements(), 18);
        assert_eq!(c.global_cond_dim(), 132);
        assert_eq!(c.center_crop_offset(), Some([6, 6]));
        assert_eq!(c.random_crop_max_offset(), Some([12, 12]));
    }

    /// lerobot's `__post_init__`: with `resize_shape` the crop is `int(resize × crop_ratio)`, or
    /// none at `crop_ratio = 1` (a crop larger than the camera is then fine).
    #[test]
    fn resize_derives_the_crop_as_lerobot() {
        let base = DiffusionConfig { crop_shape: None, ..DiffusionConfig::pusht() };
        let c = DiffusionConfig { resize_shape: Some([120, 100]), crop_ratio: 0.95, ..base.clone() };
        c.validate().unwrap();
        assert_eq!(c.effective_crop_shape(), Some([114, 95]));
        assert_eq!(c.encoder_image_size(), Some([120, 100]));
        assert_eq!(c.backbone_input_size(), Some([114, 95]));
        assert_eq!(c.center_crop_offset(), Some([half_round_even(6), half_round_even(5)]));
        assert_eq!(c.random_crop_max_offset(), Some([6, 5]));
        // The crop lerobot writes back into config.json is accepted.
        DiffusionConfig { crop_shape: Some([114, 95]), ..c.clone() }.validate().unwrap();
        let full = DiffusionConfig { resize_shape: Some([128, 128]), ..base.clone() };
        full.validate().unwrap();
        assert_eq!((full.effective_crop_shape(), full.backbone_input_size(), full.center_crop_offset()), (None, Some([128, 128]), None));
        // Without a resize, crop_ratio has no effect.
        let ratio_only = DiffusionConfig { crop_ratio: 0.5, ..DiffusionConfig::pusht() };
        assert_eq!(ratio_only.effective_crop_shape(), Some([84, 84]));
        let json = DiffusionConfig::from_json_str(&c.to_json_string()).unwrap();
        assert_eq!((json.resize_shape, json.crop_ratio), (Some([120, 100]), 0.95));
    }

    #[test]
    fn center_crop_rounds_half_to_even() {
        assert_eq!(half_round_even(12), 6);
        assert_eq!(half_round_even(5), 2); // round(2.5) = 2
        assert_eq!(half_round_even(7), 4); // round(3.5) = 4
        assert_eq!(half_round_even(1), 0);
    }

    #[test]
    fn json_round_trip_keeps_extras_and_order() {
        let text = r#"{"type":"diffusion","n_obs_steps":2,"input_features":{"observation.state":{"type":"STATE","shape":[4]},
            "observation.images.b":{"type":"VISUAL","shape":[3,64,64]},"observation.images.a":{"type":"VISUAL","shape":[3,64,64]}},
            "output_features":{"action":{"type":"ACTION","shape":[4]}},"device":"cuda","resize_shape":null,"crop_ratio":1.0,
            "compile_model":false,"compile_mode":"reduce-overhead","crop_shape":[56,56],"down_dims":[32,64],"num_inference_steps":null,
            "noise_scheduler_type":"DDIM","optimizer_betas":[0.9,0.99]}"#;
        let c = DiffusionConfig::from_json_str(text).unwrap();
        assert_eq!(c.noise_scheduler_type, SchedulerKind::Ddim);
        assert_eq!(c.crop_shape, Some([56, 56]));
        assert_eq!(c.down_dims, [32, 64]);
        assert_eq!(c.optimizer_betas, [0.9, 0.99]);
        let cams: Vec<_> = c.image_features().into_iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(cams, ["observation.images.b", "observation.images.a"]);
        assert_eq!(c.lerobot_extra["compile_mode"], "reduce-overhead");
        let out = c.to_json_string();
        assert!(out.contains("\"pretrained_backbone_weights\": null"), "{out}");
        assert!(!out.contains("freeze_backbone"), "{out}");
        assert_eq!(DiffusionConfig::from_json_str(&out).unwrap(), c);
        let frozen = DiffusionConfig { freeze_backbone: true, ..c };
        assert!(DiffusionConfig::from_json_str(&frozen.to_json_string()).unwrap().freeze_backbone);
    }

    #[test]
    fn unknown_and_invalid_fields_are_named() {
        let base = DiffusionConfig::pusht();
        let mut v: serde_json::Value = serde_json::from_str(&base.to_json_string()).unwrap();
        v["horizn"] = 3.into();
        let e = DiffusionConfig::from_json_str(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("horizn"), "{e}");
        let e = DiffusionConfig::from_json_str(r#"{"type":"act"}"#).unwrap_err().to_string();
        assert!(e.contains("type"), "{e}");

        let field = |c: DiffusionConfig| c.validate().unwrap_err().field;
        assert_eq!(field(DiffusionConfig { horizon: 12, ..base.clone() }), "horizon");
        assert_eq!(field(DiffusionConfig { n_action_steps: 16, ..base.clone() }), "n_action_steps");
        assert_eq!(field(DiffusionConfig { use_group_norm: false, ..base.clone() }), "use_group_norm");
        assert_eq!(field(DiffusionConfig { vision_backbone: "resnet50".into(), ..base.clone() }), "vision_backbone");
        // The scheduler, beta schedule and prediction type are typed: a bad name fails to load,
        // naming the field and the valid names.
        for (key, name, valid) in [("noise_scheduler_type", "PNDM", "DDIM"), ("prediction_type", "v_prediction", "sample"), ("beta_schedule", "sigmoid", "squaredcos_cap_v2")] {
            let mut v: serde_json::Value = serde_json::from_str(&base.to_json_string()).unwrap();
            v[key] = name.into();
            let e = DiffusionConfig::from_json_str(&v.to_string()).unwrap_err().to_string();
            assert!(e.contains(&format!("field `{key}`")) && e.contains(name) && e.contains(valid), "{e}");
        }
        assert_eq!(field(DiffusionConfig { num_inference_steps: Some(101), ..base.clone() }), "num_inference_steps");
        assert_eq!(field(DiffusionConfig { kernel_size: 4, ..base.clone() }), "kernel_size");
        assert_eq!(field(DiffusionConfig { n_groups: 7, ..base.clone() }), "n_groups");
        assert_eq!(field(DiffusionConfig { crop_shape: Some([100, 84]), ..base.clone() }), "crop_shape");
        assert_eq!(field(DiffusionConfig { diffusion_step_embed_dim: 7, ..base.clone() }), "diffusion_step_embed_dim");
        assert_eq!(field(DiffusionConfig { resize_shape: Some([0, 96]), ..base.clone() }), "resize_shape");
        assert_eq!(field(DiffusionConfig { crop_ratio: 0.0, ..base.clone() }), "crop_ratio");
        // With a resize the crop is derived: another explicit crop would be dropped.
        assert_eq!(field(DiffusionConfig { resize_shape: Some([120, 120]), crop_ratio: 0.9, ..base.clone() }), "crop_shape");
        assert_eq!(field(base.clone().with_camera("observation.images.wrist", [3, 64, 64])), "input_features");
        assert_eq!(field(DiffusionConfig::default().with_robot_state(2).with_action(2)), "input_features");
        assert_eq!(field(DiffusionConfig::default().with_env_state(2).with_action(2)), "input_features");
        assert_eq!(field(DiffusionConfig::default().with_robot_state(2).with_env_state(2)), "output_features");
        // State + env state, no camera: valid, no backbone.
        let env = DiffusionConfig::default().with_robot_state(2).with_env_state(4).with_action(2);
        env.validate().unwrap();
        assert!(env.backbone_config().is_none());
        assert_eq!(env.global_cond_dim(), 12);
    }
}
