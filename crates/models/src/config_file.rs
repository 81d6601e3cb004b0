//! What every model config and checkpoint shares: a validation error that names the field,
//! reading a `config.json` with errors that name the file, lerobot's policy-config layout, and
//! the checkpoint directory (file names, error, writing the config).

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::{DeserializeOwned, Error as _, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserializer, Serializer};

use crate::act::config::Features;

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

/// lerobot's policy `config.json` layout around a policy's own fields: `type`, `n_obs_steps`,
/// `input_features` / `output_features` (order kept), `PreTrainedConfig`'s generic keys (kept
/// verbatim, written back on save), then the policy's fields. One implementation for every
/// lerobot policy config; each config says what differs.
pub trait LerobotPolicyConfig: Sized {
    /// The `type` value (`"act"`, `"diffusion"`).
    const TYPE: &'static str;
    /// How serde names the expected value in errors (`"a lerobot ACT config object"`).
    const EXPECTING: &'static str;
    /// Keys accepted without being modelled (kept in `lerobot_extra`).
    const GENERIC_KEYS: &'static [&'static str];
    /// Generic keys written as `null` when absent (read back as absent).
    const NULL_WRITTEN_KEYS: &'static [&'static str];

    /// The policy's own fields (the `serde(remote = "Self")` derive; unknown keys are errors).
    fn from_fields(fields: serde_json::Value) -> Result<Self, serde_json::Error>;
    fn to_fields(&self) -> Result<serde_json::Value, serde_json::Error>;
    fn n_obs_steps(&self) -> usize;
    fn features(&self) -> (&Features, &Features);
    fn lerobot_extra(&self) -> &BTreeMap<String, serde_json::Value>;
    fn set_envelope(&mut self, inputs: Features, outputs: Features, extra: BTreeMap<String, serde_json::Value>);
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
                    key if T::GENERIC_KEYS.contains(&key) => {
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

/// File names inside a checkpoint (`pretrained_model/`) directory, for every model.
pub const CONFIG_FILE: &str = "config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// Policy-level keys of pre-0.4 lerobot checkpoints that are skipped on load.
pub const NORMALIZATION_PREFIXES: [&str; 3] = ["normalize_inputs.", "normalize_targets.", "unnormalize_outputs."];

/// A checkpoint directory could not be read or written; each variant names the file (and the
/// field or weight key where there is one).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Config(#[from] ConfigFileError),
    #[error(transparent)]
    Weights(#[from] crate::weights::WeightError),
    #[error("{path}: cannot write: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Create `dir` and write `dir/config.json` (`text` plus a final newline).
pub fn write_config_file(dir: &Path, text: &str) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|source| CheckpointError::Write { path: dir.to_path_buf(), source })?;
    let path = dir.join(CONFIG_FILE);
    std::fs::write(&path, format!("{text}\n")).map_err(|source| CheckpointError::Write { path, source })
}
