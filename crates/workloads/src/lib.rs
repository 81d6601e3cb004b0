//! vramlab-workloads: what vramlab trains, as a library. The CLI (`crates/cli`) is a thin shell
//! over it: raw args → [`config::load`] → [`RunConfig::validate`] (the one set of checks that
//! `train`, `info`, `estimate`, `sweep` and `fit` each make) → [`train`], [`info`],
//! [`predict`], [`estimate()`](workload::estimate) or [`sweep`] / [`fit`].
//!
//! Models (`vramlab-models`) know nothing about training; the trainer (`vramlab-train`) knows
//! nothing about which model it trains. This crate joins them, in layers (each reaches only
//! those above it in this list):
//! - [`error`](WorkloadError), [`layout`] (checkpoint file names and paths), [`backend`],
//!   [`inputs`], [`processors`], [`sim`];
//! - [`config`]: the typed run config, its `policy` section ([`Workload`]: the model family),
//!   loading (TOML, lerobot's `train_config.json`, overrides) and validation;
//! - [`policy_data`], [`training`] (one run of any model), [`estimate`] (the peak around a
//!   model's graph), [`preflight`] (a run's estimate against the memory available, before
//!   anything is allocated), [`model_info`], [`inference`] (bench-inference's model-agnostic machinery:
//!   timing loop, synthetic robot, pre/post-processing, report);
//! - one module per model family, [`vae3d`], [`act`], [`diffusion`], each with the same entry
//!   points: `setup` (model, data, optimizer preset of a run; its `train.rs` adapter),
//!   `info`, `predict`, `estimate`, and for a robot policy `bench_inference`;
//! - `workload.rs`: [`train`], [`info`], [`predict`], [`estimate()`](workload::estimate),
//!   [`bench_inference`], which only dispatch to the model modules; and the commands built on
//!   them: [`sweep`], [`fit`] (trials in child processes, [`child_run`]), [`probe_check`].
//!
//! **Adding a model**, exactly these touch points (the compiler points at each `match` that
//! lacks the new arm):
//! 1. `crates/models/src/<name>/` (config, model with its stage plan, weight loading, its
//!    `graph::training_graph`) and its `pub mod` in the models crate's `lib.rs`;
//! 2. `crates/workloads/src/<name>/` with `setup`, `info`, `predict`, `estimate` (and its
//!    `train.rs` adapter), for a robot policy that `bench-inference` drives also
//!    `bench_inference` (its modes and an [`inference::policy::SelectAction`] over its
//!    runner), and its `pub mod` in this `lib.rs`;
//! 3. the enum arm: the [`Workload`] variant with its policy struct (`config/policy.rs`), its
//!    arm in `PolicyConfig::try_from` (fields → typed config) and [`PolicyConfig::name`], in
//!    [`PolicyConfig::validate`] (`config/validate.rs`), its `type` in
//!    [`layout::MODEL_TYPES`], and for a policy whose features come from the data, a
//!    [`config::FeatureConfig`] impl for its config (`config/policy.rs`);
//! 4. its arm in each dispatch of `workload.rs`: train, info, predict (by checkpoint `type`),
//!    the estimate's shapes, and for a robot policy bench-inference (by checkpoint `type`).

pub mod act;
pub mod backend;
pub mod child_run;
pub mod config;
pub mod diffusion;
mod error;
pub mod estimate;
pub mod fit;
pub mod inference;
pub mod inputs;
pub mod layout;
pub mod lock;
pub mod model_info;
pub mod policy_data;
pub mod preflight;
pub mod probe_check;
pub mod processors;
pub mod sim;
pub mod sweep;
pub mod torch_alloc;
pub mod torch_target;
pub mod training;
pub mod vae3d;
mod workload;

pub use backend::{BackendInfo, BackendKind};
pub use config::{DatasetType, PolicyConfig, RunConfig, Workload};
pub use error::{Result, WorkloadError};
pub use model_info::InfoReport;
pub use training::{RunEnd, RunStart, TrainObserver};
pub use workload::{PredictRequest, bench_inference, bench_inference_on, estimate, info, predict, train};

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
