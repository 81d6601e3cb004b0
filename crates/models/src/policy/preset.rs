//! A model's optimizer preset (lerobot's `get_optimizer_preset()` / `get_scheduler_preset()`),
//! as plain data: the trainer's optimizer is built from it where the run config is silent.

/// lerobot's optimizer configs (`AdamConfig`, `AdamWConfig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerKind {
    /// L2 penalty added to the gradient (`torch.optim.Adam(weight_decay=…)`).
    Adam,
    /// Decoupled weight decay (`torch.optim.AdamW`).
    AdamW,
}

/// Learning-rate schedules a preset can ask for (diffusers' `get_scheduler` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LrSchedulerKind {
    /// Linear warmup, then constant (`constant_with_warmup`; `constant` is this with no warmup).
    Constant,
    /// Linear warmup, then half a cosine down to 0 (`cosine`).
    Cosine,
}

/// lerobot's `DiffuserSchedulerConfig`: a schedule and its warmup steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LrSchedulerPreset {
    pub kind: LrSchedulerKind,
    pub warmup_steps: u64,
}

/// A parameter group with its own learning rate (lerobot's `get_optim_params`).
#[derive(Clone, Debug, PartialEq)]
pub struct ParamGroupPreset {
    /// Module path of the group **relative to the model** (`backbone` for ACT's
    /// `backbone.conv1.weight`, …): a training wrapper that holds the model in a field adds
    /// that field's name, see [`ParamGroupPreset::under`].
    pub prefix: String,
    pub lr: f64,
}

impl ParamGroupPreset {
    /// The same group seen from a wrapper that holds the model in field `field`
    /// (`backbone` → `act.backbone`).
    pub fn under(self, field: &str) -> Self {
        Self { prefix: format!("{field}.{}", self.prefix), ..self }
    }
}

/// What a model's reference trains it with.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerPreset {
    pub kind: OptimizerKind,
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (lerobot's `grad_clip_norm`); `None`: no clipping.
    pub grad_clip_norm: Option<f64>,
    /// `None`: constant learning rate, no warmup (lerobot: no scheduler preset).
    pub scheduler: Option<LrSchedulerPreset>,
    /// The vision backbone's group, when the preset gives it its own learning rate.
    pub backbone: Option<ParamGroupPreset>,
}

/// lerobot's `OptimizerConfig.grad_clip_norm` default (`AdamConfig`, `AdamWConfig`): what both
/// ACT and Diffusion Policy train with (neither config overrides it).
pub const LEROBOT_GRAD_CLIP_NORM: f64 = 10.0;
/// lerobot's `AdamConfig` / `AdamWConfig` betas default (ACT keeps it).
pub const TORCH_ADAM_BETAS: (f64, f64) = (0.9, 0.999);
/// lerobot's `AdamConfig` / `AdamWConfig` eps default (`torch.optim`'s 1e-8).
pub const TORCH_ADAM_EPS: f64 = 1e-8;
