//! Glue between models (which know nothing of training) and the trainer (which knows nothing
//! of models): one adapter per model family implements `TrainModel`.

pub mod act;
pub mod diffusion;
pub mod vae3d;

use anyhow::{Result, bail};
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
