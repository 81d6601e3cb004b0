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
//! - lerobot's generic keys ([`LEROBOT_GENERIC_KEYS`]: `device`, `use_amp`, `push_to_hub`,
//!   `normalization_mapping`, `pretrained_backbone_weights`, …) are accepted and kept verbatim
//!   in [`ActConfig::lerobot_extra`] (written back on save) but do not affect the model;
//! - any other unknown key is an error naming it;
//! - `input_features` keeps the file's key order: with several cameras that order is the
//!   order of their tokens (lerobot iterates `config.image_features` in insertion order).
//!
//! vramlab's own field `freeze_backbone` is written only when `true` (lerobot rejects unknown
//! keys, so a default vramlab config stays loadable by lerobot).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

pub use crate::config_file::InvalidField;

use serde::de::{self, Error as _, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config_file::{LerobotPolicyConfig, deserialize_lerobot, serialize_lerobot};

use super::layers::Activation;
use crate::resnet::{OUT_CHANNELS, ResNetConfig, ResNetNorm};

/// lerobot's `OBS_STATE`: the only STATE feature ACT uses.
pub const OBS_STATE: &str = "observation.state";
/// lerobot's `ACTION`: the output feature ACT predicts.
pub const ACTION: &str = "action";

/// Keys of a lerobot policy `config.json` that vramlab accepts and ignores (kept verbatim in
/// [`ActConfig::lerobot_extra`]): `PreTrainedConfig`'s generic fields plus ACT's
/// `normalization_mapping` (data normalisation is the data pipeline's business) and
/// `pretrained_backbone_weights` (torchvision ImageNet weights; a checkpoint carries the
/// backbone's weights itself).
pub const LEROBOT_GENERIC_KEYS: [&str; 11] = [
    "device",
    "use_amp",
    "use_peft",
    "push_to_hub",
    "repo_id",
    "private",
    "tags",
    "license",
    "pretrained_path",
    "normalization_mapping",
    "pretrained_backbone_weights",
];

/// Generic keys written as `null` when absent: with `pretrained_backbone_weights` null, lerobot
/// does not fetch ImageNet weights the checkpoint overwrites anyway.
const NULL_WRITTEN_KEYS: [&str; 1] = ["pretrained_backbone_weights"];

/// lerobot's `FeatureType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum FeatureType {
    State,
    Visual,
    Env,
    Action,
    Reward,
    Language,
}

/// lerobot's `PolicyFeature`: `{"type": "STATE", "shape": [6]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFeature {
    #[serde(rename = "type")]
    pub kind: FeatureType,
    pub shape: Vec<usize>,
}

/// An ordered `{name: PolicyFeature}` map (JSON object order is kept both ways).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Features(pub Vec<(String, PolicyFeature)>);


impl Features {
    pub fn get(&self, name: &str) -> Option<&PolicyFeature> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, f)| f)
    }

    /// Insert or replace (keeping the position of an existing key).
    pub fn insert(&mut self, name: &str, feature: PolicyFeature) {
        match self.0.iter_mut().find(|(k, _)| k == name) {
            Some((_, f)) => *f = feature,
            None => self.0.push((name.to_string(), feature)),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &PolicyFeature)> {
        self.0.iter().map(|(k, f)| (k.as_str(), f))
    }
}

impl Serialize for Features {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, f) in &self.0 {
            map.serialize_entry(k, f)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Features {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Features;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of feature name to {\"type\", \"shape\"}, or null")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Features, E> {
                Ok(Features::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Features, E> {
                Ok(Features::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Features, A::Error> {
                let mut out = Features::default();
                while let Some(k) = m.next_key::<String>()? {
                    let f: PolicyFeature = m.next_value().map_err(|e| A::Error::custom(format!("feature `{k}`: {e}")))?;
                    out.insert(&k, f);
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
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
    /// Actions predicted per forward.
    pub chunk_size: usize,
    /// Actions executed per prediction (the [`super::ActPolicyRunner`] queue length).
    pub n_action_steps: usize,
    /// `"resnet18"` (or `"resnet34"`, the other BasicBlock ResNet).
    pub vision_backbone: String,
    /// Must be false: torchvision's BasicBlock cannot dilate (see [`ActConfig::validate`]).
    #[serde(deserialize_with = "bool_or_int")]
    pub replace_final_stride_with_dilation: bool,
    /// Pre-norm transformer layers (and a final LayerNorm on both encoders).
    pub pre_norm: bool,
    pub dim_model: usize,
    pub n_heads: usize,
    pub dim_feedforward: usize,
    /// `"relu"` or `"gelu"`.
    pub feedforward_activation: String,
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
            chunk_size: 100,
            n_action_steps: 100,
            vision_backbone: "resnet18".into(),
            replace_final_stride_with_dilation: false,
            pre_norm: false,
            dim_model: 512,
            n_heads: 8,
            dim_feedforward: 3200,
            feedforward_activation: "relu".into(),
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

impl LerobotPolicyConfig for ActConfig {
    const TYPE: &'static str = "act";
    const EXPECTING: &'static str = "a lerobot ACT config object";
    const GENERIC_KEYS: &'static [&'static str] = &LEROBOT_GENERIC_KEYS;
    const NULL_WRITTEN_KEYS: &'static [&'static str] = &NULL_WRITTEN_KEYS;

    fn from_fields(fields: serde_json::Value) -> Result<Self, serde_json::Error> {
        ActConfig::deserialize(fields)
    }
    fn to_fields(&self) -> Result<serde_json::Value, serde_json::Error> {
        ActConfig::serialize(self, serde_json::value::Serializer)
    }
    fn n_obs_steps(&self) -> usize {
        self.n_obs_steps
    }
    fn features(&self) -> (&Features, &Features) {
        (&self.input_features, &self.output_features)
    }
    fn lerobot_extra(&self) -> &BTreeMap<String, serde_json::Value> {
        &self.lerobot_extra
    }
    fn set_envelope(&mut self, inputs: Features, outputs: Features, extra: BTreeMap<String, serde_json::Value>) {
        self.input_features = inputs;
        self.output_features = outputs;
        self.lerobot_extra = extra;
    }
}

/// lerobot's layout (see [`LerobotPolicyConfig`]).
impl<'de> Deserialize<'de> for ActConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_lerobot(d)
    }
}

impl Serialize for ActConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_lerobot(self, s)
    }
}

/// Reading this config from a `config.json` (shared by every model config).
pub type ActConfigError = crate::config_file::ConfigFileError;

impl ActConfig {
    /// Add (or replace) `observation.state` with `dim` entries.
    pub fn with_robot_state(mut self, dim: usize) -> Self {
        self.input_features.insert(OBS_STATE, PolicyFeature { kind: FeatureType::State, shape: vec![dim] });
        self
    }

    /// Add (or replace) an environment-state input (`observation.environment_state`).
    pub fn with_env_state(mut self, dim: usize) -> Self {
        self.input_features.insert("observation.environment_state", PolicyFeature { kind: FeatureType::Env, shape: vec![dim] });
        self
    }

    /// Add (or replace) a camera `key` with shape `[3, h, w]` (token order = insertion order).
    pub fn with_camera(mut self, key: &str, shape: [usize; 3]) -> Self {
        self.input_features.insert(key, PolicyFeature { kind: FeatureType::Visual, shape: shape.to_vec() });
        self
    }

    /// Set the `action` output to `dim` entries.
    pub fn with_action(mut self, dim: usize) -> Self {
        self.output_features.insert(ACTION, PolicyFeature { kind: FeatureType::Action, shape: vec![dim] });
        self
    }

    /// `robot_state_feature`: the STATE input named `observation.state`.
    pub fn robot_state_dim(&self) -> Option<usize> {
        self.input_features.get(OBS_STATE).filter(|f| f.kind == FeatureType::State).and_then(|f| f.shape.first().copied())
    }

    /// `env_state_feature`: the first ENV input (key and size).
    pub fn env_state(&self) -> Option<(&str, usize)> {
        self.input_features.iter().find(|(_, f)| f.kind == FeatureType::Env).and_then(|(k, f)| f.shape.first().map(|d| (k, *d)))
    }

    pub fn env_state_dim(&self) -> Option<usize> {
        self.env_state().map(|(_, d)| d)
    }

    /// `image_features`: the VISUAL inputs in file order, as `(key, [c, h, w])`.
    pub fn image_features(&self) -> Vec<(&str, [usize; 3])> {
        self.input_features
            .iter()
            .filter(|(_, f)| f.kind == FeatureType::Visual)
            .map(|(k, f)| (k, [0, 1, 2].map(|i| f.shape.get(i).copied().unwrap_or(0))))
            .collect()
    }

    /// `action_feature`'s size (0 when missing; [`ActConfig::validate`] rejects that).
    pub fn action_dim(&self) -> usize {
        self.output_features.get(ACTION).filter(|f| f.kind == FeatureType::Action).and_then(|f| f.shape.first().copied()).unwrap_or(0)
    }

    /// The FFN activation (`relu` when the name is unknown; `validate` rejects that).
    pub fn activation(&self) -> Activation {
        match self.feedforward_activation.as_str() {
            "gelu" => Activation::Gelu,
            _ => Activation::Relu,
        }
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
        if !self.dim_model.is_multiple_of(self.n_heads) {
            return bad("n_heads", format!("{} heads do not divide dim_model {}", self.n_heads, self.dim_model));
        }
        if !matches!(self.feedforward_activation.as_str(), "relu" | "gelu") {
            let why = if self.feedforward_activation == "glu" {
                "\"glu\" halves the width, which lerobot's linear2 (dim_feedforward inputs) cannot take".to_string()
            } else {
                format!("must be \"relu\" or \"gelu\", got {:?}", self.feedforward_activation)
            };
            return bad("feedforward_activation", why);
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
        // Features.
        for (k, f) in self.input_features.iter() {
            match f.kind {
                FeatureType::Visual
                    if (f.shape.len() != 3 || f.shape[0] != 3 || f.shape[1] == 0 || f.shape[2] == 0) => {
                        return bad("input_features", format!("camera `{k}` must have shape [3, h, w], got {:?}", f.shape));
                    }
                FeatureType::State | FeatureType::Env
                    if (f.shape.len() != 1 || f.shape[0] == 0) => {
                        return bad("input_features", format!("`{k}` must have shape [n] with n > 0, got {:?}", f.shape));
                    }
                _ => {}
            }
        }
        if self.image_features().is_empty() && self.env_state_dim().is_none() {
            return bad("input_features", "needs at least one camera (VISUAL) or an environment state (ENV)".into());
        }
        if !self.image_features().is_empty() && !self.dim_model.is_multiple_of(4) {
            return bad("dim_model", format!("must be a multiple of 4 with cameras (2-D sine position embedding), got {}", self.dim_model));
        }
        match self.output_features.get(ACTION) {
            Some(f) if f.kind == FeatureType::Action && f.shape.len() == 1 && f.shape[0] > 0 => {}
            Some(f) => return bad("output_features", format!("`action` must be ACTION with shape [n], got {:?} {:?}", f.kind, f.shape)),
            None => return bad("output_features", "needs an `action` feature".into()),
        }
        Ok(())
    }

    /// Parse lerobot `config.json` text and validate it.
    pub fn from_json_str(text: &str) -> Result<Self, serde_json::Error> {
        let cfg: Self = serde_json::from_str(text)?;
        cfg.validate().map_err(serde_json::Error::custom)?;
        Ok(cfg)
    }

    /// Read and validate a lerobot `config.json`.
    pub fn from_json_file(path: &Path) -> Result<Self, ActConfigError> {
        crate::config_file::read_config(path, Self::validate)
    }

    /// lerobot-format JSON text (pretty, feature order kept).
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(self).expect("ActConfig always serializes")
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
        assert!(out.contains("\"pretrained_backbone_weights\": null"), "{out}");
        let back = ActConfig::from_json_str(&out).unwrap();
        assert_eq!(back, c);

        let frozen = ActConfig { freeze_backbone: true, ..c };
        let back = ActConfig::from_json_str(&frozen.to_json_string()).unwrap();
        assert!(back.freeze_backbone);
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

        let field = |c: ActConfig| c.validate().unwrap_err().field;
        assert_eq!(field(ActConfig { n_action_steps: 101, ..base.clone() }), "n_action_steps");
        assert_eq!(field(ActConfig { temporal_ensemble_coeff: Some(0.01), ..base.clone() }), "n_action_steps");
        assert_eq!(field(ActConfig { n_heads: 7, ..base.clone() }), "n_heads");
        assert_eq!(field(ActConfig { vision_backbone: "resnet50".into(), ..base.clone() }), "vision_backbone");
        assert_eq!(field(ActConfig { feedforward_activation: "glu".into(), ..base.clone() }), "feedforward_activation");
        assert_eq!(field(ActConfig { dropout: 1.0, ..base.clone() }), "dropout");
        assert_eq!(field(ActConfig { n_obs_steps: 2, ..base.clone() }), "n_obs_steps");
        assert_eq!(field(ActConfig { replace_final_stride_with_dilation: true, ..base.clone() }), "replace_final_stride_with_dilation");
        assert_eq!(field(ActConfig { dim_model: 510, n_heads: 2, ..base.clone() }), "dim_model");
        assert_eq!(field(ActConfig::default().with_robot_state(2).with_action(2)), "input_features");
        assert_eq!(field(ActConfig::default().with_env_state(2)), "output_features");
        assert_eq!(field(base.clone().with_camera("observation.images.depth", [1, 8, 8])), "input_features");
        // Env-state only is valid (no backbone).
        let env = ActConfig::default().with_env_state(4).with_action(2);
        env.validate().unwrap();
        assert!(env.backbone_config().is_none());
    }
}
