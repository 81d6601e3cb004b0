//! `policy.*` typed while the config loads: `policy.type` picks the model, the other fields are
//! the model config's own (reference / lerobot names), plus vramlab's feature shorthands for
//! runs without a dataset (`state_dim`, `action_dim`, `camera_shape`, `num_cameras`).
//!
//! A typo (`--policy.chunk_sise`) is therefore an error of config loading, before anything is
//! generated or built. The raw fields are kept so `run_config.json` shows what the user wrote.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};
use vramlab_models::act::ActConfig;
use vramlab_models::diffusion::DiffusionConfig;
use vramlab_models::vae3d::Vae3dConfig;

use crate::WorkloadError;
use crate::config::DatasetType;

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
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

/// A model config from plain fields, its serde errors prefixed with the policy.
fn fields_into<T: serde::de::DeserializeOwned>(policy: &str, fields: Map<String, Value>) -> Result<T, String> {
    serde_json::from_value(Value::Object(fields)).map_err(|e| format!("policy ({policy}): {e}"))
}

/// Split the shorthands out of `fields` (those that `allowed` lists).
fn take_features(policy: &str, fields: &mut Map<String, Value>, allowed: &[&str]) -> Result<FeatureFlags, String> {
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
fn pretrained_config(fields: &mut Map<String, Value>) -> Result<Option<PathBuf>, String> {
    let dir = match fields.remove("path") {
        None => return Ok(None),
        Some(Value::String(p)) => crate::workload::pretrained_dir(Path::new(&p)),
        Some(other) => return Err(format!("policy.path: expected a directory, found {other}")),
    };
    let path = dir.join("config.json");
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

    fn try_from(raw: Map<String, Value>) -> Result<Self, String> {
        let mut fields = raw.clone();
        let pretrained = pretrained_config(&mut fields)?;
        let kind = match fields.remove("type") {
            Some(Value::String(t)) => t,
            Some(other) => return Err(format!("policy.type: expected a string, found {other}")),
            None => return Err(format!("policy.type is required (--policy.type=…); valid: {}", Self::NAMES)),
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
            other => return Err(format!("policy.type={other}: unknown; valid: {}", Self::NAMES)),
        };
        Ok(Self { kind, raw })
    }
}

impl PolicyConfig {
    pub const NAMES: &'static str = "vae3d, act, diffusion";

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
        match &self.kind {
            Workload::Act(a) => a.features.num_cameras != Some(0),
            Workload::Vae3d(_) | Workload::Diffusion(_) => false,
        }
    }

    /// Ranges and the shorthands against the data source, with the shorthand features (the
    /// dataset's features are checked again once it is open).
    pub fn validate(&self, dataset: DatasetType) -> Result<(), WorkloadError> {
        let features = match &self.kind {
            Workload::Vae3d(v) => {
                return v.config.validate().map_err(|e| WorkloadError::invalid("policy", format!("(vae3d) {e}")));
            }
            Workload::Act(a) => {
                a.resolve()?;
                a.check_backbone_weights()?;
                &a.features
            }
            Workload::Diffusion(d) => {
                d.resolve()?;
                &d.features
            }
        };
        match features.first_set() {
            Some(k) if dataset != DatasetType::Random => Err(WorkloadError::invalid(
                &format!("policy.{k}"),
                format!("the dataset (dataset.type={}) defines the features; drop this flag or use dataset.type=random", dataset.name()),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramlab_models::policy::PolicyFeatures;

    fn parse(json: serde_json::Value) -> Result<PolicyConfig, String> {
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
