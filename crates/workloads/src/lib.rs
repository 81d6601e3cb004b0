//! vramlab-workloads: what vramlab trains, as a library. The CLI (`crates/cli`) is a thin shell
//! over it: raw args → [`config::load`] → [`RunConfig::validate`] → [`train`], [`info`],
//! [`predict`] or [`sweep`].
//!
//! Models (`vramlab-models`) know nothing about training; the trainer (`vramlab-train`) knows
//! nothing about which model it trains. This crate joins them: for each model family a module
//! with the typed policy config's resolution, the training adapter (`<model>/train.rs`, a
//! `TrainModel`), its data, its info rows and `predict`. [`Workload`] is the one place that
//! matches on the policy: each command goes through one `match`.
//!
//! **Adding a model:** the model itself goes in `crates/models/src/<name>/` (config, model with
//! its stage plan, weight loading). Here: a `<name>/` module (config resolution, `train.rs`
//! adapter, `predict`), a [`Workload`] variant with its arm in each method of `workload.rs`,
//! and its `policy.type` in [`policy::PolicyConfig`].

pub mod act;
pub mod backend;
pub mod config;
pub mod diffusion;
pub mod fit;
mod error;
pub mod estimate;
pub mod inference;
pub mod inputs;
pub mod lerobot_compat;
pub mod policy;
pub mod policy_data;
pub mod probe_check;
pub mod processors;
pub mod sim;
pub mod sweep;
pub mod training;
pub mod vae3d;
mod workload;

pub use backend::{BackendInfo, BackendKind};
pub use config::{DatasetType, RunConfig};
pub use error::{Result, WorkloadError};
pub use policy::{PolicyConfig, Workload};
pub use training::{RunEnd, RunStart, TrainObserver};
pub use workload::{InfoReport, PredictRequest, info, predict, train};

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


/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_separators() {
        assert_eq!(super::thousands(694788), "694,788");
        assert_eq!(super::thousands(40847092), "40,847,092");
        assert_eq!(super::thousands(12), "12");
    }
}
