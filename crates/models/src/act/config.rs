//! Configuration of ACT, read from and written to lerobot's `config.json`.
//!
//! Reference: huggingface/lerobot v0.4.4 `src/lerobot/policies/act/configuration_act.py`
//! (`ACTConfig`: field names, defaults, `__post_init__` / `validate_features` checks) and
//! `src/lerobot/configs/policies.py` (`PreTrainedConfig`: `input_features`,
//! `output_features`, the generic keys, and how `robot_state_feature`, `env_state_feature`,
//! `image_features` and `action_feature` are picked).
//!
//! # JSON
//! A lerobot `config.json` deserializes into [`ActConfig`] unchanged:
//! - `"type"` must be `"act"` when present;
//! - lerobot's generic keys ([`crate::policy::PRETRAINED_CONFIG_KEYS`]: `device`, `use_amp`,
//!   `push_to_hub`, …) are accepted and kept verbatim in [`ActConfig::lerobot_extra`] (written
//!   back on save) but do not affect the model (the run config acts on `device` / `use_amp`);
//! - `normalization_mapping` is read (the data pipeline normalises with it), default lerobot's;
//! - any other unknown key is an error naming it; `feedforward_activation` is typed
//!   ([`Activation`], lerobot's names `"relu"` / `"gelu"`), so a bad one fails here too;
//! - `input_features` keeps the file's key order: with several cameras that order is the
//!   order of their tokens (lerobot iterates `config.image_features` in insertion order).
//!
//! vramlab's own field `freeze_backbone` is written only when `true` (lerobot rejects unknown
//! keys, so a default vramlab config stays loadable by lerobot).
//!
//! # Backbone weights
//! `pretrained_backbone_weights` keeps lerobot's default, torchvision's
//! `"ResNet18_Weights.IMAGENET1K_V1"`. vramlab cannot fetch torchvision weights (a pickle
//! behind a download); [`ActConfig::backbone_weights`] tells the trainer what to do: a local
//! `.safetensors` file of a torchvision ResNet state dict is loaded into the backbone
//! ([`crate::resnet::load_torchvision_weights`]), a torchvision name means random init (the
//! trainer warns), `null` means random init. Building a model ([`ActConfig::init`]) and
//! loading a checkpoint never read the file: a checkpoint carries the backbone itself.
//!
//! # Policy facts
//! What lerobot's `ACTConfig` tells the rest of the pipeline is here too:
//! [`ActConfig::delta_indices`] (the sample window), `normalization_mapping`, and
//! [`ActConfig::optimizer_preset`] (`get_optimizer_preset` + `get_optim_params`).

use std::collections::BTreeMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

pub use crate::policy::{ACTION, FeatureType, Features, InvalidField, OBS_STATE, PolicyFeature, PolicyFeatures};
use crate::nn::Activation;
use crate::policy::{
    DeltaIndices, LEROBOT_GRAD_CLIP_NORM, NormalizationMapping, NormalizationMode, OptimizerKind, OptimizerPreset,
    ParamGroupPreset, TORCH_ADAM_BETAS, TORCH_ADAM_EPS, lerobot_policy_config, validate_features,
};
use crate::resnet::{OUT_CHANNELS, ResNetConfig, ResNetNorm};

/// ACT's keys of a lerobot `config.json` that vramlab accepts without modelling them, besides
/// `PreTrainedConfig`'s: none (every `ACTConfig` field is modelled).
pub const LEROBOT_GENERIC_KEYS: [&str; 0] = [];

/// Generic keys written as `null` when absent: none.
const NULL_WRITTEN_KEYS: [&str; 0] = [];

/// lerobot's default `pretrained_backbone_weights`: torchvision's ImageNet ResNet18 weights.
pub const IMAGENET_RESNET18: &str = "ResNet18_Weights.IMAGENET1K_V1";

/// How to produce a backbone weights file vramlab reads (torchvision names, safetensors).
pub const BACKBONE_WEIGHTS_HOWTO: &str = "python -c \"import torchvision, safetensors.torch as st; \
st.save_file(torchvision.models.resnet18(weights='IMAGENET1K_V1').state_dict(), 'resnet18_imagenet.safetensors')\"";

/// Where the backbone's initial weights come from ([`ActConfig::backbone_weights`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackboneWeights<'a> {
    /// `null`: torchvision's random initialisation.
    Random,
    /// A local `.safetensors` file of a torchvision ResNet state dict.
    File(&'a std::path::Path),
    /// A torchvision weights name (`ResNet18_Weights.IMAGENET1K_V1`): not available to vramlab,
    /// so the backbone starts random.
    Torchvision(&'a str),
}

/// lerobot types `replace_final_stride_with_dilation` as `int` (default `False`): accept a
/// bool or an integer.
fn bool_or_int<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Bool(b) => Ok(b),
        serde_json::Value::Number(n) => n.as_i64().map(|v| v != 0).ok_or_else(|| D::Error::custom(format!("expected a bool or an integer, found {n}"))),
        other => Err(D::Error::custom(format!("expected a bool or an integer, found {other}"))),
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `feedforward_activation` by lerobot's names: `"relu"`, `"gelu"`. lerobot's third,
/// `"glu"`, is an error here: it halves the width, which lerobot's `linear2`
/// (`dim_feedforward` inputs) cannot take.
mod activation_name {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::nn::Activation;

    const NAMES: &[&str] = &["relu", "gelu"];

    pub fn serialize<S: Serializer>(a: &Activation, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match a {
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
        })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Activation, D::Error> {
        match String::deserialize(d)?.as_str() {
            "relu" => Ok(Activation::Relu),
            "gelu" => Ok(Activation::Gelu),
            "glu" => Err(D::Error::custom(
                "\"glu\" halves the width, which lerobot's linear2 (dim_feedforward inputs) cannot take; expected `relu` or `gelu`",
            )),
            other => Err(D::Error::unknown_variant(other, NAMES)),
        }
    }
}

/// lerobot's `ACTConfig` (+ the features of `PreTrainedConfig`) and vramlab's
/// `freeze_backbone`. Defaults are lerobot's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self", default, deny_unknown_fields)]
pub struct ActConfig {
    /// Observation steps; ACT supports only 1.
    pub n_obs_steps: usize,
    /// Inputs, in file order: `observation.state` (STATE, `[state_dim]`), cameras (VISUAL,
    /// `[3, h, w]`), an environment state (ENV, `[env_dim]`). Other entries are ignored, as in
    /// lerobot (only the STATE feature named `observation.state` is the robot state).
    #[serde(skip)]
    pub input_features: Features,
    /// Outputs: `action` (ACTION, `[action_dim]`).
    #[serde(skip)]
    pub output_features: Features,
    /// How the data pipeline normalises each feature type (lerobot: everything MEAN_STD).
    pub normalization_mapping: NormalizationMapping,
    /// Actions predicted per forward.
    pub chunk_size: usize,
    /// Actions executed per prediction (the [`super::ActPolicyRunner`] queue length).
    pub n_action_steps: usize,
    /// `"resnet18"` (or `"resnet34"`, the other BasicBlock ResNet).
    pub vision_backbone: String,
    /// The backbone's initial weights: a torchvision weights name (lerobot's default
    /// [`IMAGENET_RESNET18`]; not available to vramlab: random init, with a warning), a local
    /// `.safetensors` torchvision state dict (loaded), or `None` (random init).
    pub pretrained_backbone_weights: Option<String>,
    /// Must be false: torchvision's BasicBlock cannot dilate (see [`ActConfig::validate`]).
    #[serde(deserialize_with = "bool_or_int")]
    pub replace_final_stride_with_dilation: bool,
    /// Pre-norm transformer layers (and a final LayerNorm on both encoders).
    pub pre_norm: bool,
    pub dim_model: usize,
    pub n_heads: usize,
    pub dim_feedforward: usize,
    /// `"relu"` or `"gelu"` (lerobot's `"glu"` is rejected when the config is read).
    #[serde(with = "activation_name")]
    pub feedforward_activation: Activation,
    pub n_encoder_layers: usize,
    pub n_decoder_layers: usize,
    pub use_vae: bool,
    pub latent_dim: usize,
    pub n_vae_encoder_layers: usize,
    /// Temporal ensembling coefficient (`None`: off; requires `n_action_steps == 1`).
    pub temporal_ensemble_coeff: Option<f64>,
    pub dropout: f64,
    pub kl_weight: f64,
    pub optimizer_lr: f64,
    pub optimizer_weight_decay: f64,
    pub optimizer_lr_backbone: f64,
    /// vramlab: keep the vision backbone frozen (no gradients; written only when true).
    #[serde(skip_serializing_if = "is_false")]
    pub freeze_backbone: bool,
    /// The lerobot generic keys read from a `config.json`, verbatim (written back on save).
    #[serde(skip)]
    pub lerobot_extra: BTreeMap<String, serde_json::Value>,
}

impl Default for ActConfig {
    /// lerobot's `ACTConfig()` defaults, with no features (add them with the `with_*` methods).
    fn default() -> Self {
        Self {
            n_obs_steps: 1,
            input_features: Features::default(),
            output_features: Features::default(),
            normalization_mapping: [
                (FeatureType::Visual, NormalizationMode::MeanStd),
                (FeatureType::State, NormalizationMode::MeanStd),
                (FeatureType::Action, NormalizationMode::MeanStd),
            ]
            .into(),
            chunk_size: 100,
            n_action_steps: 100,
            vision_backbone: "resnet18".into(),
            pretrained_backbone_weights: Some(IMAGENET_RESNET18.into()),
            replace_final_stride_with_dilation: false,
            pre_norm: false,
            dim_model: 512,
            n_heads: 8,
            dim_feedforward: 3200,
            feedforward_activation: Activation::Relu,
            n_encoder_layers: 4,
            n_decoder_layers: 1,
            use_vae: true,
            latent_dim: 32,
            n_vae_encoder_layers: 4,
            temporal_ensemble_coeff: None,
            dropout: 0.1,
            kl_weight: 10.0,
            optimizer_lr: 1e-5,
            optimizer_weight_decay: 1e-4,
            optimizer_lr_backbone: 1e-5,
            freeze_backbone: false,
            lerobot_extra: BTreeMap::new(),
        }
    }
}

lerobot_policy_config!(ActConfig {
    type: "act",
    expecting: "a lerobot ACT config object",
    generic_keys: LEROBOT_GENERIC_KEYS,
    null_written_keys: NULL_WRITTEN_KEYS,
});

/// Reading this config from a `config.json` (shared by every model config).
pub type ActConfigError = crate::policy::ConfigFileError;

/// Whether `name` is a torchvision weights name for `backbone` as torchvision's `weights=`
/// takes it: `ResNet18_Weights.IMAGENET1K_V1`, or the bare `IMAGENET1K_V1` / `DEFAULT`.
fn is_torchvision_weights_name(name: &str, backbone: &str) -> bool {
    let enum_name = format!("{}_Weights", backbone.replacen("resnet", "ResNet", 1));
    let member = name.strip_prefix(&enum_name).and_then(|m| m.strip_prefix('.')).unwrap_or(name);
    !member.is_empty() && member.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

impl ActConfig {
    /// lerobot's `observation_delta_indices` (`None`: the current frame),
    /// `action_delta_indices` (`range(chunk_size)`) and `reward_delta_indices` (`None`).
    pub fn delta_indices(&self) -> DeltaIndices {
        DeltaIndices { observation: None, action: Some((0..self.chunk_size as i64).collect()), reward: None }
    }

    /// lerobot's `ACTConfig.get_optimizer_preset()`: `AdamWConfig(lr=optimizer_lr,
    /// weight_decay=optimizer_weight_decay)` (betas, eps and `grad_clip_norm = 10` are
    /// `AdamWConfig`'s defaults), no scheduler; `ACTPolicy.get_optim_params()` puts the backbone
    /// (`model.backbone.*`, here `backbone`) in a group at `optimizer_lr_backbone`.
    pub fn optimizer_preset(&self) -> OptimizerPreset {
        OptimizerPreset {
            kind: OptimizerKind::AdamW,
            lr: self.optimizer_lr,
            betas: TORCH_ADAM_BETAS,
            eps: TORCH_ADAM_EPS,
            weight_decay: self.optimizer_weight_decay,
            grad_clip_norm: Some(LEROBOT_GRAD_CLIP_NORM),
            scheduler: None,
            backbone: self.backbone_config().map(|_| ParamGroupPreset { prefix: "backbone".into(), lr: self.optimizer_lr_backbone }),
        }
    }

    /// Where the backbone's initial weights come from (`validate` rejects other values).
    pub fn backbone_weights(&self) -> BackboneWeights<'_> {
        match self.pretrained_backbone_weights.as_deref() {
            None => BackboneWeights::Random,
            Some(w) if w.ends_with(".safetensors") => BackboneWeights::File(std::path::Path::new(w)),
            Some(w) => BackboneWeights::Torchvision(w),
        }
    }

    /// The FFN activation.
    pub fn activation(&self) -> Activation {
        self.feedforward_activation
    }

    /// The vision trunk (FrozenBatchNorm2d, as lerobot), or `None` without cameras.
    pub fn backbone_config(&self) -> Option<ResNetConfig> {
        if self.image_features().is_empty() {
            return None;
        }
        ResNetConfig::from_name(&self.vision_backbone, ResNetNorm::FrozenBatchNorm)
            .map(|c| c.with_dilation(self.replace_final_stride_with_dilation))
    }

    /// Tokens of the VAE encoder: cls, (robot state), the action chunk.
    pub fn vae_seq_len(&self) -> usize {
        1 + usize::from(self.robot_state_dim().is_some()) + self.chunk_size
    }

    /// 1-D tokens of the transformer encoder: latent, (robot state), (env state).
    pub fn n_1d_tokens(&self) -> usize {
        1 + usize::from(self.robot_state_dim().is_some()) + usize::from(self.env_state_dim().is_some())
    }

    /// Tokens of the transformer encoder: the 1-D tokens plus `h'·w'` per camera.
    pub fn encoder_seq_len(&self) -> usize {
        let cams: usize = match self.backbone_config() {
            Some(bb) => self.image_features().iter().map(|(_, s)| bb.feature_size(s[1], s[2]).iter().product::<usize>()).sum(),
            None => 0,
        };
        self.n_1d_tokens() + cams
    }

    /// Check the config as lerobot does (`__post_init__`, `validate_features`) and what the
    /// model needs; the error names the field.
    pub fn validate(&self) -> Result<(), InvalidField> {
        let bad = |field, msg: String| Err(InvalidField { field, msg });
        if self.n_obs_steps != 1 {
            return bad("n_obs_steps", format!("multiple observation steps are not handled (lerobot), got {}", self.n_obs_steps));
        }
        for (field, v) in [
            ("chunk_size", self.chunk_size),
            ("dim_model", self.dim_model),
            ("n_heads", self.n_heads),
            ("dim_feedforward", self.dim_feedforward),
            ("latent_dim", self.latent_dim),
        ] {
            if v == 0 {
                return bad(field, "must be > 0".into());
            }
        }
        if self.n_action_steps == 0 || self.n_action_steps > self.chunk_size {
            return bad("n_action_steps", format!("must be in 1..=chunk_size ({}), got {}", self.chunk_size, self.n_action_steps));
        }
        if let Some(c) = self.temporal_ensemble_coeff {
            if !c.is_finite() {
                return bad("temporal_ensemble_coeff", format!("must be finite, got {c}"));
            }
            if self.n_action_steps > 1 {
                return bad("n_action_steps", format!("must be 1 with temporal ensembling, got {}", self.n_action_steps));
            }
        }
        if ResNetConfig::from_name(&self.vision_backbone, ResNetNorm::FrozenBatchNorm).is_none() {
            return bad("vision_backbone", format!("only \"resnet18\" and \"resnet34\" are supported, got {:?}", self.vision_backbone));
        }
        if self.replace_final_stride_with_dilation {
            return bad(
                "replace_final_stride_with_dilation",
                "torchvision's BasicBlock (resnet18/34) raises NotImplementedError for dilation, so lerobot cannot build this model \
                 (crate::resnet::ResNetConfig implements the dilated trunk outside ACT)"
                    .into(),
            );
        }
        if let BackboneWeights::Torchvision(name) = self.backbone_weights()
            && !is_torchvision_weights_name(name, &self.vision_backbone)
        {
            return bad(
                "pretrained_backbone_weights",
                format!(
                    "{name:?}: expected null, a local .safetensors file of a torchvision {} state dict (made with: {BACKBONE_WEIGHTS_HOWTO}) \
                     or a torchvision weights name such as \"{}\"",
                    self.vision_backbone,
                    IMAGENET_RESNET18.replace("ResNet18", &self.vision_backbone.replace("resnet", "ResNet"))
                ),
            );
        }
        if !self.dim_model.is_multiple_of(self.n_heads) {
            return bad("n_heads", format!("{} heads do not divide dim_model {}", self.n_heads, self.dim_model));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad("dropout", format!("must be in [0, 1), got {}", self.dropout));
        }
        for (field, v) in [
            ("kl_weight", self.kl_weight),
            ("optimizer_lr", self.optimizer_lr),
            ("optimizer_weight_decay", self.optimizer_weight_decay),
            ("optimizer_lr_backbone", self.optimizer_lr_backbone),
        ] {
            if !v.is_finite() || v < 0.0 {
                return bad(field, format!("must be finite and >= 0, got {v}"));
            }
        }
        validate_features(&self.input_features, &self.output_features)?;
        if self.image_features().is_empty() && self.env_state_dim().is_none() {
            return bad("input_features", "needs at least one camera (VISUAL) or an environment state (ENV)".into());
        }
        if !self.image_features().is_empty() && !self.dim_model.is_multiple_of(4) {
            return bad("dim_model", format!("must be a multiple of 4 with cameras (2-D sine position embedding), got {}", self.dim_model));
        }
        Ok(())
    }

    /// PyTorch's `sum(p.numel() for p in policy.parameters())`, in closed form: buffers
    /// (`vae_encoder_pos_enc`, the FrozenBatchNorm2d tensors) are not counted; a frozen
    /// backbone is (PyTorch counts `requires_grad=False` parameters).
    pub fn num_params(&self) -> usize {
        let d = self.dim_model;
        let ff = self.dim_feedforward;
        let lin = |i: usize, o: usize| i * o + o;
        let ln = 2 * d;
        let mha = 3 * d * d + 3 * d + lin(d, d);
        let ffn = lin(d, ff) + lin(ff, d);
        let enc_layer = mha + ffn + 2 * ln;
        let final_norm = if self.pre_norm { ln } else { 0 };
        let state = self.robot_state_dim();
        let a = self.action_dim();

        let mut n = 0;
        if self.use_vae {
            n += self.n_vae_encoder_layers * enc_layer + final_norm;
            n += d; // vae_encoder_cls_embed
            n += state.map_or(0, |s| lin(s, d));
            n += lin(a, d) + lin(d, 2 * self.latent_dim);
        }
        if let Some(bb) = self.backbone_config() {
            n += bb.num_parameters() + lin(OUT_CHANNELS, d); // + encoder_img_feat_input_proj (1x1 conv)
        }
        n += self.n_encoder_layers * enc_layer + final_norm;
        n += self.n_decoder_layers * (2 * mha + ffn + 3 * ln) + ln; // + decoder.norm
        n += state.map_or(0, |s| lin(s, d));
        n += self.env_state_dim().map_or(0, |e| lin(e, d));
        n += lin(self.latent_dim, d);
        n += self.n_1d_tokens() * d + self.chunk_size * d; // encoder_1d_feature_pos_embed, decoder_pos_embed
        n + lin(d, a)
    }

    /// Elements of buffers in the state dict: `vae_encoder_pos_enc` and the backbone's
    /// FrozenBatchNorm2d tensors.
    pub fn num_buffer_elements(&self) -> usize {
        let pos = if self.use_vae { self.vae_seq_len() * self.dim_model } else { 0 };
        pos + self.backbone_config().map_or(0, |bb| bb.num_buffer_elements())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aloha() -> ActConfig {
        ActConfig::default().with_robot_state(14).with_camera("observation.images.top", [3, 480, 640]).with_action(14)
    }

    #[test]
    fn default_counts_match_lerobot() {
        let c = aloha();
        c.validate().unwrap();
        assert_eq!(c.num_params(), 51_613_582);
        assert_eq!(ActConfig { use_vae: false, ..c.clone() }.num_params(), 34_232_142);
        assert_eq!(c.encoder_seq_len(), 2 + 15 * 20);
        assert_eq!(c.num_buffer_elements(), 102 * 512 + 19_200);
    }

    #[test]
    fn json_round_trip_keeps_feature_order_and_extras() {
        let text = r#"{"type":"act","input_features":{"observation.state":{"type":"STATE","shape":[6]},
            "observation.images.wrist":{"type":"VISUAL","shape":[3,64,64]},
            "observation.images.front":{"type":"VISUAL","shape":[3,96,128]}},
            "output_features":{"action":{"type":"ACTION","shape":[6]}},
            "device":"cuda","normalization_mapping":{"VISUAL":"MEAN_STD"},"chunk_size":20,"n_action_steps":5,
            "replace_final_stride_with_dilation":0,"temporal_ensemble_coeff":null}"#;
        let c = ActConfig::from_json_str(text).unwrap();
        assert_eq!(c.chunk_size, 20);
        let cams: Vec<_> = c.image_features().into_iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(cams, ["observation.images.wrist", "observation.images.front"], "file order, not sorted");
        assert_eq!(c.lerobot_extra["device"], "cuda");
        let out = c.to_json_string();
        let wrist = out.find("observation.images.wrist").unwrap();
        let front = out.find("observation.images.front").unwrap();
        assert!(wrist < front, "{out}");
        assert!(!out.contains("freeze_backbone"), "vramlab default not written: {out}");
        assert!(out.contains(&format!("\"pretrained_backbone_weights\": \"{IMAGENET_RESNET18}\"")), "lerobot's default: {out}");
        let back = ActConfig::from_json_str(&out).unwrap();
        assert_eq!(back, c);

        let frozen = ActConfig { freeze_backbone: true, ..c };
        let back = ActConfig::from_json_str(&frozen.to_json_string()).unwrap();
        assert!(back.freeze_backbone);
    }

    #[test]
    fn policy_facts_are_lerobots() {
        let c = ActConfig { chunk_size: 5, ..aloha() };
        assert_eq!(c.delta_indices(), DeltaIndices { observation: None, action: Some(vec![0, 1, 2, 3, 4]), reward: None });
        assert_eq!(c.normalization_mapping.get(&FeatureType::State), Some(&NormalizationMode::MeanStd));
        let p = c.optimizer_preset();
        assert_eq!((p.kind, p.lr, p.weight_decay, p.grad_clip_norm, p.scheduler), (OptimizerKind::AdamW, 1e-5, 1e-4, Some(10.0), None));
        let bb = p.backbone.expect("a camera: the backbone group");
        assert_eq!(bb.clone().under("act"), ParamGroupPreset { prefix: "act.backbone".into(), lr: 1e-5 });
        assert!(ActConfig::default().with_env_state(3).with_action(2).optimizer_preset().backbone.is_none());
        // normalization_mapping reads lerobot's JSON (and an unknown mode is an error).
        let c = ActConfig::from_json_str(r#"{"normalization_mapping":{"VISUAL":"IDENTITY","ACTION":"MIN_MAX"},
            "input_features":{"observation.environment_state":{"type":"ENV","shape":[2]}},
            "output_features":{"action":{"type":"ACTION","shape":[2]}}}"#)
        .unwrap();
        let m: Vec<_> = c.normalization_mapping.into_iter().collect();
        assert_eq!(m, [(FeatureType::Visual, NormalizationMode::Identity), (FeatureType::Action, NormalizationMode::MinMax)]);
        assert!(ActConfig::from_json_str(r#"{"normalization_mapping":{"STATE":"SOFTMAX"}}"#).is_err());
    }

    #[test]
    fn unknown_and_invalid_fields_are_named() {
        let base = aloha();
        let mut v: serde_json::Value = serde_json::from_str(&base.to_json_string()).unwrap();
        v["chunk_sise"] = 3.into();
        let e = ActConfig::from_json_str(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("chunk_sise"), "{e}");
        let e = ActConfig::from_json_str(r#"{"type":"diffusion"}"#).unwrap_err().to_string();
        assert!(e.contains("type"), "{e}");
        let e = ActConfig::from_json_str(r#"{"input_features":{"x":{"type":"STATE","shape":[2],"foo":1}}}"#).unwrap_err().to_string();
        assert!(e.contains("input_features") && e.contains("foo"), "{e}");

        // The activation is typed: a bad name fails to load, naming the field and the valid names.
        for (name, want) in [("glu", "halves the width"), ("tanh", "unknown variant `tanh`")] {
            let mut v: serde_json::Value = serde_json::from_str(&base.to_json_string()).unwrap();
            v["feedforward_activation"] = name.into();
            let e = ActConfig::from_json_str(&v.to_string()).unwrap_err().to_string();
            assert!(e.contains("field `feedforward_activation`") && e.contains(want) && e.contains("`relu` or `gelu`"), "{e}");
        }

        let field = |c: ActConfig| c.validate().unwrap_err().field;
        assert_eq!(field(ActConfig { n_action_steps: 101, ..base.clone() }), "n_action_steps");
        assert_eq!(field(ActConfig { temporal_ensemble_coeff: Some(0.01), ..base.clone() }), "n_action_steps");
        assert_eq!(field(ActConfig { n_heads: 7, ..base.clone() }), "n_heads");
        assert_eq!(field(ActConfig { vision_backbone: "resnet50".into(), ..base.clone() }), "vision_backbone");
        assert_eq!(field(ActConfig { dropout: 1.0, ..base.clone() }), "dropout");
        assert_eq!(field(ActConfig { n_obs_steps: 2, ..base.clone() }), "n_obs_steps");
        assert_eq!(field(ActConfig { replace_final_stride_with_dilation: true, ..base.clone() }), "replace_final_stride_with_dilation");
        assert_eq!(field(ActConfig { dim_model: 510, n_heads: 2, ..base.clone() }), "dim_model");
        let weights = |w: &str| ActConfig { pretrained_backbone_weights: Some(w.into()), ..base.clone() };
        assert_eq!(field(weights("ResNet34_Weights.IMAGENET1K_V1")), "pretrained_backbone_weights");
        assert_eq!(field(weights("weights/resnet18.pth")), "pretrained_backbone_weights");
        for ok in ["ResNet18_Weights.IMAGENET1K_V1", "IMAGENET1K_V1", "DEFAULT", "/tmp/r18.safetensors"] {
            weights(ok).validate().unwrap();
        }
        assert_eq!(weights("r.safetensors").backbone_weights(), BackboneWeights::File(std::path::Path::new("r.safetensors")));
        assert_eq!(ActConfig { pretrained_backbone_weights: None, ..base.clone() }.backbone_weights(), BackboneWeights::Random);
        assert_eq!(base.backbone_weights(), BackboneWeights::Torchvision(IMAGENET_RESNET18));
        assert_eq!(field(ActConfig::default().with_robot_state(2).with_action(2)), "input_features");
        assert_eq!(field(ActConfig::default().with_env_state(2)), "output_features");
        assert_eq!(field(base.clone().with_camera("observation.images.depth", [1, 8, 8])), "input_features");
        // Env-state only is valid (no backbone).
        let env = ActConfig::default().with_env_state(4).with_action(2);
        env.validate().unwrap();
        assert!(env.backbone_config().is_none());
    }
}
