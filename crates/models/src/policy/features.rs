//! lerobot's policy features (`PolicyFeature`, `input_features` / `output_features`), the
//! accessors every policy config shares ([`PolicyFeatures`]) and the facts a policy config
//! states about its data: which frames a sample holds (delta indices)
//! and how each feature type is normalised (`normalization_mapping`).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Error as _, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::InvalidField;

/// lerobot's `OBS_STATE`: the robot state.
pub const OBS_STATE: &str = "observation.state";
/// lerobot's `OBS_ENV_STATE`: the name vramlab gives an environment state (any ENV feature
/// is one, as lerobot's `env_state_feature`).
pub const OBS_ENV_STATE: &str = "observation.environment_state";
/// lerobot's `ACTION`: the output feature a policy predicts.
pub const ACTION: &str = "action";

/// lerobot's `FeatureType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum FeatureType {
    State,
    Visual,
    Env,
    Action,
    Reward,
    Language,
}

impl FeatureType {
    /// lerobot's name (`"STATE"`, `"VISUAL"`, …), as in `config.json` and `normalization_mapping`.
    pub fn name(self) -> &'static str {
        match self {
            FeatureType::State => "STATE",
            FeatureType::Visual => "VISUAL",
            FeatureType::Env => "ENV",
            FeatureType::Action => "ACTION",
            FeatureType::Reward => "REWARD",
            FeatureType::Language => "LANGUAGE",
        }
    }
}

/// lerobot's `PolicyFeature`: `{"type": "STATE", "shape": [6]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFeature {
    #[serde(rename = "type")]
    pub kind: FeatureType,
    pub shape: Vec<usize>,
}

impl PolicyFeature {
    /// A 1-D feature of `dim` entries (state, environment state, action).
    pub fn vector(kind: FeatureType, dim: usize) -> Self {
        Self { kind, shape: vec![dim] }
    }

    /// A camera `[c, h, w]`.
    pub fn camera(shape: [usize; 3]) -> Self {
        Self { kind: FeatureType::Visual, shape: shape.to_vec() }
    }
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

    /// The size of the 1-D feature `name` when it has type `kind` (`robot_state_feature` is
    /// `observation.state` as STATE, `action_feature` is `action` as ACTION).
    pub fn dim_of(&self, name: &str, kind: FeatureType) -> Option<usize> {
        self.get(name).filter(|f| f.kind == kind).and_then(|f| f.shape.first().copied())
    }

    /// `env_state_feature`: the first ENV entry (key and size).
    pub fn env_state(&self) -> Option<(&str, usize)> {
        self.iter().find(|(_, f)| f.kind == FeatureType::Env).and_then(|(k, f)| f.shape.first().map(|d| (k, *d)))
    }

    /// `image_features`: the VISUAL entries in order, as `(key, [c, h, w])`.
    pub fn image_features(&self) -> Vec<(&str, [usize; 3])> {
        self.iter()
            .filter(|(_, f)| f.kind == FeatureType::Visual)
            .map(|(k, f)| (k, [0, 1, 2].map(|i| f.shape.get(i).copied().unwrap_or(0))))
            .collect()
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

/// lerobot's feature accessors on a policy config (`PreTrainedConfig.robot_state_feature`,
/// `env_state_feature`, `image_features`, `action_feature`) and the builders that add
/// features; one implementation for every policy config, which gives only its two feature maps
/// (the [`lerobot_policy_config`](crate::policy::LerobotPolicyConfig) macro does).
pub trait PolicyFeatures {
    /// `input_features` (file order).
    fn input_features(&self) -> &Features;
    /// `output_features`.
    fn output_features(&self) -> &Features;
    /// Both maps, to add features.
    fn features_mut(&mut self) -> (&mut Features, &mut Features);

    /// Add (or replace) `observation.state` with `dim` entries.
    fn with_robot_state(mut self, dim: usize) -> Self
    where
        Self: Sized,
    {
        self.features_mut().0.insert(OBS_STATE, PolicyFeature::vector(FeatureType::State, dim));
        self
    }

    /// Add (or replace) an environment-state input (`observation.environment_state`).
    fn with_env_state(mut self, dim: usize) -> Self
    where
        Self: Sized,
    {
        self.features_mut().0.insert(OBS_ENV_STATE, PolicyFeature::vector(FeatureType::Env, dim));
        self
    }

    /// Add (or replace) a camera `key` with shape `[3, h, w]` (token / feature order =
    /// insertion order).
    fn with_camera(mut self, key: &str, shape: [usize; 3]) -> Self
    where
        Self: Sized,
    {
        self.features_mut().0.insert(key, PolicyFeature::camera(shape));
        self
    }

    /// Set the `action` output to `dim` entries.
    fn with_action(mut self, dim: usize) -> Self
    where
        Self: Sized,
    {
        self.features_mut().1.insert(ACTION, PolicyFeature::vector(FeatureType::Action, dim));
        self
    }

    /// `robot_state_feature`: the STATE input named `observation.state`.
    fn robot_state_dim(&self) -> Option<usize> {
        self.input_features().dim_of(OBS_STATE, FeatureType::State)
    }

    /// `env_state_feature`: the first ENV input (key and size).
    fn env_state(&self) -> Option<(&str, usize)> {
        self.input_features().env_state()
    }

    fn env_state_dim(&self) -> Option<usize> {
        self.env_state().map(|(_, d)| d)
    }

    /// `image_features`: the VISUAL inputs in file order, as `(key, [c, h, w])`.
    fn image_features(&self) -> Vec<(&str, [usize; 3])> {
        self.input_features().image_features()
    }

    fn num_cameras(&self) -> usize {
        self.image_features().len()
    }

    /// `action_feature`'s size (0 when missing; the config's `validate` rejects that).
    fn action_dim(&self) -> usize {
        self.output_features().dim_of(ACTION, FeatureType::Action).unwrap_or(0)
    }
}

/// lerobot's `validate_features` checks shared by the policies: cameras `[3, h, w]`, states
/// `[n]`, an `action` output `[n]`; errors name `input_features` / `output_features`.
pub fn validate_features(inputs: &Features, outputs: &Features) -> Result<(), InvalidField> {
    let bad = |field, msg: String| Err(InvalidField { field, msg });
    for (k, f) in inputs.iter() {
        match f.kind {
            FeatureType::Visual if (f.shape.len() != 3 || f.shape[0] != 3 || f.shape[1] == 0 || f.shape[2] == 0) => {
                return bad("input_features", format!("camera `{k}` must have shape [3, h, w], got {:?}", f.shape));
            }
            FeatureType::State | FeatureType::Env if (f.shape.len() != 1 || f.shape[0] == 0) => {
                return bad("input_features", format!("`{k}` must have shape [n] with n > 0, got {:?}", f.shape));
            }
            _ => {}
        }
    }
    match outputs.get(ACTION) {
        Some(f) if f.kind == FeatureType::Action && f.shape.len() == 1 && f.shape[0] > 0 => Ok(()),
        Some(f) => bad("output_features", format!("`action` must be ACTION with shape [n], got {:?} {:?}", f.kind, f.shape)),
        None => bad("output_features", "needs an `action` feature".into()),
    }
}

/// lerobot's `NormalizationMode`: how a feature type is normalised from dataset statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NormalizationMode {
    /// `(x − mean) / (std + eps)`
    MeanStd,
    /// `2 (x − min) / (max − min) − 1`
    MinMax,
    /// Unchanged.
    Identity,
}

impl NormalizationMode {
    /// lerobot's name (`"MEAN_STD"`, `"MIN_MAX"`, `"IDENTITY"`).
    pub fn name(self) -> &'static str {
        match self {
            NormalizationMode::MeanStd => "MEAN_STD",
            NormalizationMode::MinMax => "MIN_MAX",
            NormalizationMode::Identity => "IDENTITY",
        }
    }
}

/// A policy config's `normalization_mapping`: the mode per feature type (a type not listed is
/// not normalised).
pub type NormalizationMapping = BTreeMap<FeatureType, NormalizationMode>;

/// A policy's `observation_delta_indices`, `action_delta_indices` and `reward_delta_indices`:
/// the frame offsets (relative to the current frame) a training sample holds for every
/// `observation.*` feature, for `action` and for `next.reward`; `None`: the current frame only
/// (observations) or not loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeltaIndices {
    pub observation: Option<Vec<i64>>,
    pub action: Option<Vec<i64>>,
    pub reward: Option<Vec<i64>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_json_names() {
        for t in [FeatureType::State, FeatureType::Visual, FeatureType::Env, FeatureType::Action, FeatureType::Reward, FeatureType::Language] {
            assert_eq!(serde_json::to_value(t).unwrap(), t.name());
        }
        for m in [NormalizationMode::MeanStd, NormalizationMode::MinMax, NormalizationMode::Identity] {
            assert_eq!(serde_json::to_value(m).unwrap(), m.name());
        }
    }
}
