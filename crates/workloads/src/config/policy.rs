//! `policy.*` typed while the config loads: `policy.type` picks the model, the other fields are
//! the model config's own (reference / lerobot names), plus vramlab's feature shorthands for
//! runs without a dataset (`state_dim`, `action_dim`, `camera_shape`, `num_cameras`).
//!
//! A typo (`--policy.chunk_sise`) is therefore an error of config loading, before anything is
//! generated or built. The raw fields are kept so `run_config.json` shows what the user wrote.
//!
//! Here too: the features a policy takes ([`DataFeatures`], from a dataset or the shorthands)
//! and their one resolution for ACT and Diffusion ([`FeatureConfig`], `resolve` /
//! `resolve_for`), so that validation needs nothing above the config.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};
use vramlab_models::act::config::BACKBONE_WEIGHTS_HOWTO;
use vramlab_models::act::{ActConfig, BackboneWeights};
use vramlab_models::diffusion::DiffusionConfig;
use vramlab_models::policy::{InvalidField, PolicyFeatures};
use vramlab_models::vae3d::Vae3dConfig;

use crate::error::{Result, WorkloadError};
use crate::layout;

/// vramlab's shorthand for a policy's features when no dataset defines them (lerobot takes
/// them from the dataset). Absent fields take the policy's defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureFlags {
    #[serde(default)]
    pub state_dim: Option<usize>,
    #[serde(default)]
    pub action_dim: Option<usize>,
    /// `C,H,W` of every camera.
    #[serde(default)]
    pub camera_shape: Option<[usize; 3]>,
    /// ACT only: number of cameras.
    #[serde(default)]
    pub num_cameras: Option<usize>,
}

impl FeatureFlags {
    const KEYS: [&'static str; 4] = ["state_dim", "action_dim", "camera_shape", "num_cameras"];

    /// The first flag that is set, if any.
    pub fn first_set(&self) -> Option<&'static str> {
        let set = [self.state_dim.is_some(), self.action_dim.is_some(), self.camera_shape.is_some(), self.num_cameras.is_some()];
        Self::KEYS.iter().zip(set).find(|(_, s)| *s).map(|(k, _)| *k)
    }
}

/// The 3D-VAE: `policy.preset` (or the reference defaults) with the other fields applied.
#[derive(Clone, Debug)]
pub struct Vae3dPolicy {
    pub config: Vae3dConfig,
}

/// ACT: lerobot's fields (features come from the dataset, or from the shorthands).
#[derive(Clone, Debug)]
pub struct ActPolicy {
    pub config: ActConfig,
    pub features: FeatureFlags,
    /// `policy.path`: the `pretrained_model/` whose config and weights the run starts from.
    pub pretrained: Option<PathBuf>,
}

/// Diffusion Policy: lerobot's fields (features from the dataset, or the shorthands).
#[derive(Clone, Debug)]
pub struct DiffusionPolicy {
    pub config: DiffusionConfig,
    pub features: FeatureFlags,
    /// `policy.path`: the `pretrained_model/` whose config and weights the run starts from.
    pub pretrained: Option<PathBuf>,
}

/// The typed `policy` section.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "Map<String, Value>")]
pub struct PolicyConfig {
    pub kind: Workload,
    /// The fields as written (for `run_config.json`).
    raw: Map<String, Value>,
}

/// The model family of a run, with its typed config: the one enum every command matches on.
#[derive(Clone, Debug)]
pub enum Workload {
    Vae3d(Vae3dPolicy),
    Act(ActPolicy),
    Diffusion(DiffusionPolicy),
}

impl Serialize for PolicyConfig {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

/// A model config from plain fields, its serde errors prefixed with the policy.
fn fields_into<T: serde::de::DeserializeOwned>(policy: &str, fields: Map<String, Value>) -> std::result::Result<T, String> {
    serde_json::from_value(Value::Object(fields)).map_err(|e| format!("policy ({policy}): {e}"))
}

/// Split the shorthands out of `fields` (those that `allowed` lists).
fn take_features(policy: &str, fields: &mut Map<String, Value>, allowed: &[&str]) -> std::result::Result<FeatureFlags, String> {
    let mut flags = Map::new();
    for k in allowed {
        if let Some(v) = fields.remove(*k) {
            flags.insert(k.to_string(), v);
        }
    }
    serde_json::from_value(Value::Object(flags)).map_err(|e| format!("policy ({policy}) feature shorthand: {e}"))
}

/// lerobot's `--policy.path=DIR`: take DIR's `config.json` (DIR is a `pretrained_model/` or a
/// checkpoint step directory holding one) as the policy's fields, the other `policy.*` fields
/// on top; returns the directory whose weights the run loads before its first step.
fn pretrained_config(fields: &mut Map<String, Value>) -> std::result::Result<Option<PathBuf>, String> {
    let dir = match fields.remove("path") {
        None => return Ok(None),
        Some(Value::String(p)) => layout::pretrained_dir(Path::new(&p)),
        Some(other) => return Err(format!("policy.path: expected a directory, found {other}")),
    };
    let path = dir.join(layout::CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("policy.path: {}: {e}", path.display()))?;
    let Ok(Value::Object(mut base)) = serde_json::from_str::<Value>(&text) else {
        return Err(format!("policy.path: {}: not a JSON object", path.display()));
    };
    if let (Some(given), Some(saved)) = (fields.get("type"), base.get("type"))
        && given != saved
    {
        return Err(format!("policy.type={given} but policy.path holds a {saved} policy ({})", path.display()));
    }
    base.extend(std::mem::take(fields));
    *fields = base;
    Ok(Some(dir))
}

impl TryFrom<Map<String, Value>> for PolicyConfig {
    type Error = String;

    fn try_from(raw: Map<String, Value>) -> std::result::Result<Self, String> {
        let mut fields = raw.clone();
        let pretrained = pretrained_config(&mut fields)?;
        let kind = match fields.remove("type") {
            Some(Value::String(t)) => t,
            Some(other) => return Err(format!("policy.type: expected a string, found {other}")),
            None => return Err(format!("policy.type is required (--policy.type=…); valid: {}", Self::names())),
        };
        let kind = match kind.as_str() {
            "vae3d" if pretrained.is_some() => return Err("policy.path: fine-tuning from a pretrained_model/ is for act and diffusion".into()),
            "vae3d" => {
                let base = match fields.remove("preset") {
                    Some(Value::String(name)) => Vae3dConfig::preset(&name)
                        .ok_or_else(|| format!("policy.preset={name}: unknown preset; valid: {}", Vae3dConfig::preset_names().join(", ")))?,
                    Some(other) => return Err(format!("policy.preset: expected a string, found {other}")),
                    None => Vae3dConfig::default(),
                };
                let Ok(Value::Object(mut merged)) = serde_json::to_value(&base) else { return Err("vae3d config is not an object".into()) };
                merged.extend(fields);
                Workload::Vae3d(Vae3dPolicy { config: fields_into("vae3d", merged)? })
            }
            "act" => {
                let features = take_features("act", &mut fields, &FeatureFlags::KEYS)?;
                Workload::Act(ActPolicy { config: fields_into("act", fields)?, features, pretrained })
            }
            "diffusion" => {
                let features = take_features("diffusion", &mut fields, &FeatureFlags::KEYS[..3])?;
                Workload::Diffusion(DiffusionPolicy { config: fields_into("diffusion", fields)?, features, pretrained })
            }
            other => return Err(format!("policy.type={other}: unknown; valid: {}", Self::names())),
        };
        Ok(Self { kind, raw })
    }
}

impl PolicyConfig {
    /// The valid `policy.type`s, for messages: `vae3d, act, diffusion`.
    pub fn names() -> String {
        layout::MODEL_TYPES.join(", ")
    }

    /// `policy.type`.
    pub fn name(&self) -> &'static str {
        match &self.kind {
            Workload::Vae3d(_) => "vae3d",
            Workload::Act(_) => "act",
            Workload::Diffusion(_) => "diffusion",
        }
    }

    pub fn is_vae3d(&self) -> bool {
        matches!(self.kind, Workload::Vae3d(_))
    }

    /// The fields as the user wrote them (flags, config file), before any `policy.path` config.
    pub fn raw(&self) -> &Map<String, Value> {
        &self.raw
    }

    /// Whether the policy trains a vision backbone with its own learning rate.
    pub fn has_backbone(&self) -> bool {
        matches!(&self.kind, Workload::Act(a) if a.features.num_cameras != Some(0))
    }

    /// What to print before the run starts about the policy's own fields: the ACT backbone's
    /// ImageNet weights, which vramlab cannot download (a `WARNING: …`).
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if let Workload::Act(a) = &self.kind
            && a.pretrained.is_none()
            && a.features.num_cameras != Some(0)
            && let BackboneWeights::Torchvision(name) = a.config.backbone_weights()
        {
            notes.push(format!(
                "WARNING: policy.pretrained_backbone_weights={name}: torchvision's ImageNet weights are not available to vramlab, so the ResNet \
             backbone starts from random init (lerobot starts from ImageNet). Pass a local torchvision state dict instead, \
             --policy.pretrained_backbone_weights=FILE.safetensors, made with: {BACKBONE_WEIGHTS_HOWTO}; or set it to null to silence this"
            ));
        }
        notes
    }
}

/// Features of a dataset, as the policies need them.
#[derive(Clone, Debug)]
pub struct DataFeatures {
    pub state_dim: Option<usize>,
    pub action_dim: usize,
    /// (key, [C, H, W]) per camera, in the dataset's order (after `image_size`).
    pub cameras: Vec<(String, [usize; 3])>,
}

/// A model config that takes its features from the data (lerobot's `input_features` /
/// `output_features`, set through the models' [`PolicyFeatures`] builders): ACT's and
/// Diffusion's, resolved by one function.
pub trait FeatureConfig: PolicyFeatures + Clone {
    fn check(&self) -> std::result::Result<(), InvalidField>;
}

impl FeatureConfig for ActConfig {
    fn check(&self) -> std::result::Result<(), InvalidField> {
        self.validate()
    }
}

impl FeatureConfig for DiffusionConfig {
    fn check(&self) -> std::result::Result<(), InvalidField> {
        self.validate()
    }
}

/// A config value the model refuses, named as the flag that sets it.
fn invalid(e: InvalidField) -> WorkloadError {
    WorkloadError::invalid(&format!("policy.{}", e.field), e.msg)
}

/// `config` with the features `f` (the state where there is one, each camera, the action),
/// validated.
fn resolve_with<C: FeatureConfig>(config: &C, f: &DataFeatures) -> Result<C> {
    let mut cfg = config.clone();
    if let Some(d) = f.state_dim {
        cfg = cfg.with_robot_state(d);
    }
    for (k, s) in &f.cameras {
        cfg = cfg.with_camera(k, *s);
    }
    cfg = cfg.with_action(f.action_dim);
    cfg.check().map_err(invalid)?;
    Ok(cfg)
}

/// `config` with the shorthand features (`shorthand` gives the policy's defaults for the
/// flags left out); a `policy.path` config without shorthands brings its own features.
fn resolve_shorthand<C: FeatureConfig>(config: &C, pretrained: &Option<PathBuf>, flags: &FeatureFlags, shorthand: impl FnOnce(&FeatureFlags) -> DataFeatures) -> Result<C> {
    if pretrained.is_some() && flags.first_set().is_none() {
        config.check().map_err(invalid)?;
        return Ok(config.clone());
    }
    resolve_with(config, &shorthand(flags))
}

impl ActPolicy {
    /// `pretrained_backbone_weights` naming a local file: it must exist (unless `policy.path`
    /// brings the whole model, backbone included).
    pub fn check_backbone_weights(&self) -> Result<()> {
        match self.config.backbone_weights() {
            BackboneWeights::File(path) if self.pretrained.is_none() && !path.is_file() => Err(WorkloadError::invalid(
                "policy.pretrained_backbone_weights",
                format!("{}: no such file (expected a torchvision ResNet state dict as safetensors, made with: {BACKBONE_WEIGHTS_HOWTO})", path.display()),
            )),
            _ => Ok(()),
        }
    }

    /// The config with the shorthand features (for random data). Defaults: ALOHA-like, 14-dim
    /// state and action, one 480×640 camera.
    pub fn resolve(&self) -> Result<ActConfig> {
        resolve_shorthand(&self.config, &self.pretrained, &self.features, |f| {
            let state = f.state_dim.unwrap_or(14);
            let (cams, shape) = (f.num_cameras.unwrap_or(1), f.camera_shape.unwrap_or([3, 480, 640]));
            let key = |i| if cams == 1 { "observation.images.top".to_string() } else { format!("observation.images.cam{i}") };
            DataFeatures { state_dim: (state > 0).then_some(state), action_dim: f.action_dim.unwrap_or(14), cameras: (0..cams).map(|i| (key(i), shape)).collect() }
        })
    }

    /// The config with the features of a dataset (lerobot takes the features from the dataset).
    pub fn resolve_for(&self, f: &DataFeatures) -> Result<ActConfig> {
        resolve_with(&self.config, f)
    }
}

impl DiffusionPolicy {
    /// The config with the shorthand features (for random data). Defaults: PushT (state 2,
    /// action 2, one 96×96 camera).
    pub fn resolve(&self) -> Result<DiffusionConfig> {
        resolve_shorthand(&self.config, &self.pretrained, &self.features, |f| DataFeatures {
            state_dim: Some(f.state_dim.unwrap_or(2)),
            action_dim: f.action_dim.unwrap_or(2),
            cameras: vec![("observation.image".to_string(), f.camera_shape.unwrap_or([3, 96, 96]))],
        })
    }

    /// The config with the features of a dataset (lerobot takes the features from the dataset).
    pub fn resolve_for(&self, f: &DataFeatures) -> Result<DiffusionConfig> {
        if f.state_dim.is_none() {
            return Err(WorkloadError::invalid("dataset", "Diffusion Policy needs `observation.state`; the dataset has none".into()));
        }
        resolve_with(&self.config, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramlab_models::policy::PolicyFeatures;

    fn parse(json: serde_json::Value) -> std::result::Result<PolicyConfig, String> {
        let Value::Object(m) = json else { unreachable!() };
        PolicyConfig::try_from(m)
    }

    #[test]
    fn unknown_fields_and_presets_are_named() {
        let err = parse(serde_json::json!({"type": "vae3d", "preset": "ultra_lightweight", "base_chanels": 8})).unwrap_err();
        assert!(err.contains("base_chanels") && err.contains("base_channels"), "{err}");
        let err = parse(serde_json::json!({"type": "vae3d", "preset": "tiny"})).unwrap_err();
        assert!(err.contains("ultra_lightweight"), "{err}");
        let err = parse(serde_json::json!({"type": "diffusion", "num_cameras": 2})).unwrap_err();
        assert!(err.contains("num_cameras"), "{err}");
        let err = parse(serde_json::json!({"type": "act", "camera_shape": [3, 96]})).unwrap_err();
        assert!(err.contains("camera_shape") || err.contains("length 3"), "{err}");
    }

    #[test]
    fn presets_fields_and_shorthands_are_typed() {
        let p = parse(serde_json::json!({"type": "vae3d", "preset": "ultra_lightweight", "latent_dim": 2})).unwrap();
        let Workload::Vae3d(v) = &p.kind else { panic!() };
        assert_eq!(v.config.latent_dim, 2);
        let p = parse(serde_json::json!({"type": "act", "chunk_size": 10, "n_action_steps": 10, "state_dim": 3, "num_cameras": 2})).unwrap();
        let Workload::Act(a) = &p.kind else { panic!() };
        assert_eq!((a.config.chunk_size, a.features.state_dim, a.features.num_cameras), (10, Some(3), Some(2)));
        assert_eq!(a.resolve().unwrap().image_features().len(), 2);
        // run_config.json shows what was written.
        assert_eq!(serde_json::to_value(&p).unwrap(), serde_json::json!({"type": "act", "chunk_size": 10, "n_action_steps": 10, "state_dim": 3, "num_cameras": 2}));
    }
}
