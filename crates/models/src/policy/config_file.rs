//! Config files: a validation error that names the field, reading a `config.json` with errors
//! that name the file, and lerobot's policy-config layout (the envelope around a policy's own
//! fields).

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::{DeserializeOwned, Error as _, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserializer, Serializer};

use super::Features;

/// A config value that cannot build a model: the field and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("field `{field}`: {msg}")]
pub struct InvalidField {
    pub field: &'static str,
    pub msg: String,
}

/// Reading a `config.json` failed: the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("{path}: cannot read: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// Malformed JSON, a wrong type, or an unknown key (serde's message names the field).
    #[error("{path}: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{path}: {source}")]
    Invalid { path: PathBuf, source: InvalidField },
}

/// Read `path` as JSON into `T`, then validate it.
pub fn read_config<T: DeserializeOwned>(path: &Path, validate: impl Fn(&T) -> Result<(), InvalidField>) -> Result<T, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Io { path: path.to_path_buf(), source })?;
    let cfg: T = serde_json::from_str(&text).map_err(|source| ConfigFileError::Json { path: path.to_path_buf(), source })?;
    validate(&cfg).map_err(|source| ConfigFileError::Invalid { path: path.to_path_buf(), source })?;
    Ok(cfg)
}

/// `PreTrainedConfig`'s generic keys: accepted in every lerobot policy `config.json` without
/// being modelled (kept verbatim in the config's `lerobot_extra`, written back on save).
pub const PRETRAINED_CONFIG_KEYS: [&str; 9] =
    ["device", "use_amp", "use_peft", "push_to_hub", "repo_id", "private", "tags", "license", "pretrained_path"];

/// lerobot's policy `config.json` layout around a policy's own fields: `type`, `n_obs_steps`,
/// `input_features` / `output_features` (order kept), the generic keys
/// ([`PRETRAINED_CONFIG_KEYS`] and the policy's [`LerobotPolicyConfig::GENERIC_KEYS`], kept
/// verbatim, written back on save), then the policy's fields. One implementation for every
/// lerobot policy config; each config says what differs.
pub trait LerobotPolicyConfig: Sized {
    /// The `type` value (`"act"`, `"diffusion"`).
    const TYPE: &'static str;
    /// How serde names the expected value in errors (`"a lerobot ACT config object"`).
    const EXPECTING: &'static str;
    /// The policy's own keys accepted without being modelled (kept in `lerobot_extra`), besides
    /// [`PRETRAINED_CONFIG_KEYS`].
    const GENERIC_KEYS: &'static [&'static str];
    /// Generic keys written as `null` when absent (read back as absent).
    const NULL_WRITTEN_KEYS: &'static [&'static str];

    /// The policy's own fields (the `serde(remote = "Self")` derive; unknown keys are errors, a
    /// bad value's error names its field).
    fn from_fields(fields: serde_json::Value) -> Result<Self, serde_json::Error>;
    fn to_fields(&self) -> Result<serde_json::Value, serde_json::Error>;
    fn n_obs_steps(&self) -> usize;
    fn features(&self) -> (&Features, &Features);
    fn lerobot_extra(&self) -> &BTreeMap<String, serde_json::Value>;
    fn set_envelope(&mut self, inputs: Features, outputs: Features, extra: BTreeMap<String, serde_json::Value>);
}

/// A policy field's serde error prefixed with the field it is in (`field \`beta_schedule\`:
/// unknown variant \`sigmoid\`, expected one of …`), as the envelope's errors are; an error of
/// the object itself (an unknown key, which serde names) is kept as it is.
pub(crate) fn name_the_field(path: serde_path_to_error::Path, e: serde_json::Error) -> serde_json::Error {
    let path = path.to_string();
    if path == "." { e } else { serde_json::Error::custom(format!("field `{path}`: {e}")) }
}

/// `Deserialize` for a [`LerobotPolicyConfig`]: streams the map (so feature order is kept).
pub fn deserialize_lerobot<'de, T: LerobotPolicyConfig, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
    struct V<T>(PhantomData<T>);
    impl<'de, T: LerobotPolicyConfig> Visitor<'de> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(T::EXPECTING)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<T, A::Error> {
            let mut rest = serde_json::Map::new();
            let mut extra = BTreeMap::new();
            let (mut inputs, mut outputs) = (None, None);
            while let Some(k) = m.next_key::<String>()? {
                match k.as_str() {
                    "input_features" => {
                        inputs = Some(m.next_value::<Features>().map_err(|e| A::Error::custom(format!("field `input_features`: {e}")))?)
                    }
                    "output_features" => {
                        outputs = Some(m.next_value::<Features>().map_err(|e| A::Error::custom(format!("field `output_features`: {e}")))?)
                    }
                    "type" => {
                        let t: serde_json::Value = m.next_value()?;
                        if t.as_str() != Some(T::TYPE) {
                            return Err(A::Error::custom(format!("field `type`: expected \"{}\", found {t}", T::TYPE)));
                        }
                    }
                    key if PRETRAINED_CONFIG_KEYS.contains(&key) || T::GENERIC_KEYS.contains(&key) => {
                        let v = m.next_value::<serde_json::Value>()?;
                        // `null` is what vramlab writes for these when there is no entry.
                        if !(v.is_null() && T::NULL_WRITTEN_KEYS.contains(&key)) {
                            extra.insert(k, v);
                        }
                    }
                    _ => {
                        let v = m.next_value::<serde_json::Value>()?;
                        rest.insert(k, v);
                    }
                }
            }
            let mut cfg = T::from_fields(serde_json::Value::Object(rest)).map_err(A::Error::custom)?;
            cfg.set_envelope(inputs.unwrap_or_default(), outputs.unwrap_or_default(), extra);
            Ok(cfg)
        }
    }
    d.deserialize_map(V(PhantomData))
}

/// `Serialize` for a [`LerobotPolicyConfig`] in lerobot's key order.
pub fn serialize_lerobot<T: LerobotPolicyConfig, S: Serializer>(cfg: &T, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::Error as _;
    let fields = match cfg.to_fields().map_err(S::Error::custom)? {
        serde_json::Value::Object(m) => m,
        _ => return Err(S::Error::custom(format!("the {} config did not serialize to an object", T::TYPE))),
    };
    let (inputs, outputs) = cfg.features();
    let extra = cfg.lerobot_extra();
    let mut map = s.serialize_map(None)?;
    map.serialize_entry("type", T::TYPE)?;
    map.serialize_entry("n_obs_steps", &cfg.n_obs_steps())?;
    map.serialize_entry("input_features", inputs)?;
    map.serialize_entry("output_features", outputs)?;
    for (k, v) in extra {
        map.serialize_entry(k, v)?;
    }
    for key in T::NULL_WRITTEN_KEYS {
        if !extra.contains_key(*key) {
            map.serialize_entry(key, &serde_json::Value::Null)?;
        }
    }
    for (k, v) in fields.iter().filter(|(k, _)| k.as_str() != "n_obs_steps") {
        map.serialize_entry(k, v)?;
    }
    map.end()
}

/// Implement [`LerobotPolicyConfig`], [`PolicyFeatures`](crate::policy::PolicyFeatures),
/// lerobot-layout `Deserialize` / `Serialize` and
/// `from_json_str` / `from_json_file` / `to_json_string` for a policy config that derives
/// serde's traits with `#[serde(remote = "Self")]` (its own fields), has the fields
/// `n_obs_steps`, `input_features`, `output_features` (`#[serde(skip)]`) and `lerobot_extra`
/// (`#[serde(skip)]`), and a `validate(&self) -> Result<(), InvalidField>`.
macro_rules! lerobot_policy_config {
    ($ty:ident { type: $type:literal, expecting: $expecting:literal, generic_keys: $generic:expr, null_written_keys: $null:expr $(,)? }) => {
        impl $crate::policy::LerobotPolicyConfig for $ty {
            const TYPE: &'static str = $type;
            const EXPECTING: &'static str = $expecting;
            const GENERIC_KEYS: &'static [&'static str] = &$generic;
            const NULL_WRITTEN_KEYS: &'static [&'static str] = &$null;

            fn from_fields(fields: serde_json::Value) -> Result<Self, serde_json::Error> {
                let mut track = serde_path_to_error::Track::new();
                let fields = $ty::deserialize(serde_path_to_error::Deserializer::new(fields, &mut track));
                fields.map_err(|e| $crate::policy::name_the_field(track.path(), e))
            }
            fn to_fields(&self) -> Result<serde_json::Value, serde_json::Error> {
                $ty::serialize(self, serde_json::value::Serializer)
            }
            fn n_obs_steps(&self) -> usize {
                self.n_obs_steps
            }
            fn features(&self) -> (&$crate::policy::Features, &$crate::policy::Features) {
                (&self.input_features, &self.output_features)
            }
            fn lerobot_extra(&self) -> &std::collections::BTreeMap<String, serde_json::Value> {
                &self.lerobot_extra
            }
            fn set_envelope(
                &mut self,
                inputs: $crate::policy::Features,
                outputs: $crate::policy::Features,
                extra: std::collections::BTreeMap<String, serde_json::Value>,
            ) {
                self.input_features = inputs;
                self.output_features = outputs;
                self.lerobot_extra = extra;
            }
        }

        impl $crate::policy::PolicyFeatures for $ty {
            fn input_features(&self) -> &$crate::policy::Features {
                &self.input_features
            }
            fn output_features(&self) -> &$crate::policy::Features {
                &self.output_features
            }
            fn features_mut(&mut self) -> (&mut $crate::policy::Features, &mut $crate::policy::Features) {
                (&mut self.input_features, &mut self.output_features)
            }
        }

        /// lerobot's layout (see [`LerobotPolicyConfig`](crate::policy::LerobotPolicyConfig)).
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $crate::policy::deserialize_lerobot(d)
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                $crate::policy::serialize_lerobot(self, s)
            }
        }

        impl $ty {
            /// Parse lerobot `config.json` text and validate it.
            pub fn from_json_str(text: &str) -> Result<Self, serde_json::Error> {
                let cfg: Self = serde_json::from_str(text)?;
                cfg.validate().map_err(<serde_json::Error as serde::de::Error>::custom)?;
                Ok(cfg)
            }

            /// Read and validate a lerobot `config.json`.
            pub fn from_json_file(path: &std::path::Path) -> Result<Self, $crate::policy::ConfigFileError> {
                $crate::policy::read_config(path, Self::validate)
            }

            /// lerobot-format JSON text (pretty, feature order kept).
            pub fn to_json_string(&self) -> String {
                serde_json::to_string_pretty(self).expect("a policy config always serializes")
            }
        }
    };
}
pub(crate) use lerobot_policy_config;

/// `name()` (lerobot's name of each value, the one serde reads and writes) and `Display` for
/// the typed enums of a policy config (`SchedulerKind { Ddpm => "DDPM", … }`).
macro_rules! lerobot_names {
    ($($ty:ident { $($v:ident => $name:literal),+ $(,)? })+) => {$(
        impl $ty {
            /// lerobot's name (as in `config.json`).
            pub fn name(self) -> &'static str {
                match self { $($ty::$v => $name),+ }
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    )+};
}
pub(crate) use lerobot_names;
