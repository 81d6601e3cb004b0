//! Glue between models (which know nothing of training) and the trainer (which knows nothing
//! of models): one adapter per model family implements `TrainModel`.

pub mod act;
pub mod diffusion;
pub mod policy_data;
pub mod vae3d;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, anyhow, bail};
use burn::prelude::*;
use serde_json::Value;

use crate::config::RunConfig;

/// The model families vramlab knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyType {
    Vae3d,
    Act,
    Diffusion,
}

impl PolicyType {
    pub const NAMES: &'static str = "vae3d, act, diffusion";

    pub fn from_config(cfg: &RunConfig) -> Result<Self> {
        match cfg.policy.get("type") {
            Some(Value::String(s)) => Self::parse(s),
            Some(other) => bail!("policy.type: expected a string, found {other}"),
            None => bail!("policy.type is required (--policy.type=…); valid: {}", Self::NAMES),
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "vae3d" => Ok(Self::Vae3d),
            "act" => Ok(Self::Act),
            "diffusion" => Ok(Self::Diffusion),
            other => bail!("policy.type={other}: unknown; valid: {}", Self::NAMES),
        }
    }
}

/// Box–Muller standard normals from a seeded RNG (host side, so runs are reproducible on every
/// backend and across resumes).
pub fn normal_vec(rng: &mut impl rand::Rng, n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
        let u2: f64 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        out.push((r * t.cos()) as f32);
        out.push((r * t.sin()) as f32);
    }
    out.truncate(n);
    out
}

/// Input tensor `name` of rank `D` from a safetensors file read by `vramlab predict`.
pub fn input_tensor<B: Backend, const D: usize>(
    map: &BTreeMap<String, TensorData>,
    file: &Path,
    name: &str,
    device: &B::Device,
) -> Result<Tensor<B, D>> {
    let data = map.get(name).ok_or_else(|| {
        anyhow!("{}: tensor `{name}` is missing (present: {})", file.display(), map.keys().cloned().collect::<Vec<_>>().join(", "))
    })?;
    if data.shape.len() != D {
        bail!("{}: tensor `{name}` has shape {:?}; expected rank {D}", file.display(), data.shape);
    }
    Ok(Tensor::from_data(data.clone().convert::<f32>(), device))
}

/// `policy.<key>` as `C,H,W` (or `default` when absent).
pub fn camera_shape(feat: &BTreeMap<String, Value>, key: &str, default: [usize; 3]) -> Result<[usize; 3]> {
    match feat.get(key) {
        None => Ok(default),
        Some(v) => serde_json::from_value::<Vec<usize>>(v.clone())
            .ok()
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| anyhow!("policy.{key}: expected C,H,W, found {v}")),
    }
}

/// `policy.<key>` as a non-negative integer (or `default` when absent).
pub fn feature_uint(feat: &BTreeMap<String, Value>, key: &str, default: usize) -> Result<usize> {
    feat.get(key).map_or(Ok(default), |v| v.as_u64().map(|x| x as usize).ok_or_else(|| anyhow!("policy.{key}: expected a non-negative integer, found {v}")))
}

/// Split `policy.*` into the model config's own fields and vramlab's feature shorthands
/// (`feature_keys`, used when no dataset defines the features); `type` goes to neither.
pub fn split_policy(
    policy: &serde_json::Map<String, Value>,
    feature_keys: &[&str],
) -> (serde_json::Map<String, Value>, BTreeMap<String, Value>) {
    let mut fields = serde_json::Map::new();
    let mut feat = BTreeMap::new();
    for (k, v) in policy {
        if k == "type" {
            continue;
        }
        if feature_keys.contains(&k.as_str()) {
            feat.insert(k.clone(), v.clone());
        } else {
            fields.insert(k.clone(), v.clone());
        }
    }
    (fields, feat)
}
