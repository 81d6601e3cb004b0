//! `vramlab estimate`: the peak memory of a training step predicted from shapes alone.
//!
//! Each model describes its training forward as a shape-only graph
//! (`vramlab_models::<model>::graph::training_graph`, rules in
//! [`vramlab_models::graph`]), which its workload module's `estimate` returns as [`Shapes`]
//! (`crate::workload::estimate` dispatches); this module adds what the trainer holds around it
//! and says when the peak happens ([`estimate_from`]):
//! - parameters: f32 master weights (frozen ones included), exact from the graph's weights;
//! - gradients: one f32 tensor per trainable parameter, complete after the backward;
//! - optimizer state: AdamW's two f32 moments per trainable parameter (present from the end
//!   of step 1, so the steady-state figures — steps 2.. — include them);
//! - the batch and a runtime baseline (flex's buffers retained after the first step);
//! - per phase: forward = static + the graph's forward peak; backward = static + the graph's
//!   backward peak (saved tensors not yet freed, activation gradients, parameter gradients so
//!   far, the op's workspace); optimizer = static + all gradients + the update's temporaries;
//! - accumulation: from the second micro-batch on, the accumulated gradients are live
//!   through the forward and backward.

use serde::Serialize;
use vramlab_models::graph::{ActivationPeaks, Graph, ModuleRow};
use vramlab_models::nn::Precision;
use vramlab_bytes::human;

use crate::config::{DataFeatures, RunConfig};

/// Bytes the flex runtime keeps allocated from the second step on, whatever the model
/// (thread-pool and kernel scratch, autodiff bookkeeping): measured once, 3.4 MiB, on the
/// VAE and ACT alike. An assumption of the estimate, listed in its report.
pub const RUNTIME_BASELINE_BYTES: u64 = 3_565_000;

/// The estimate of one config.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryEstimate {
    pub model: String,
    pub settings: Vec<(String, String)>,
    pub param_bytes: u64,
    pub trainable_param_bytes: u64,
    pub grad_bytes: u64,
    pub optimizer_state_bytes: u64,
    pub batch_bytes: u64,
    pub runtime_baseline_bytes: u64,
    /// Stored activations at the end of the forward (saved tensors; stage inputs under
    /// block recomputation).
    pub stored_activation_bytes: u64,
    /// Largest transient on top of the stored activations (forward or backward workspace,
    /// activation gradients).
    pub transient_bytes: u64,
    pub peak_forward_bytes: u64,
    pub peak_backward_bytes: u64,
    pub peak_optimizer_bytes: u64,
    /// The step's peak (steady state: steps after the first), its phase and module.
    pub peak_step_bytes: u64,
    pub peak_phase: String,
    pub peak_module: String,
    pub modules: Vec<ModuleRow>,
    pub assumptions: Vec<String>,
}

pub struct Shapes {
    pub model: String,
    pub graph: Graph,
    pub batch_bytes: u64,
    /// Non-trainable parameters and buffers (f32) not seen in the graph's weights.
    pub extra_frozen_bytes: u64,
    /// The config's exact parameter count, where the model's config computes it.
    pub num_params: Option<u64>,
    pub notes: Vec<String>,
}

/// Where a policy's features came from, for the estimate's assumptions.
pub fn features_note(data: &Option<DataFeatures>) -> String {
    match data {
        Some(f) => format!("features from the dataset's meta/info.json: state {:?}, action {}, cameras {:?}", f.state_dim, f.action_dim, f.cameras),
        None => "features from policy.state_dim/action_dim/camera_shape/num_cameras (--dataset.type=random)".into(),
    }
}

/// Predict the peak memory of `cfg`'s training step on flex from its model's shapes `s`.
pub fn estimate_from(cfg: &RunConfig, s: Shapes) -> MemoryEstimate {
    let (graph_params, graph_trainable) = s.graph.param_bytes();
    // The config's exact count where it has one (the graph's weights may split or merge a
    // parameter); frozen weights are the graph's non-trainable ones.
    let param_bytes = s.num_params.map_or(graph_params, |n| 4 * n);
    let trainable = param_bytes - (graph_params - graph_trainable);
    let param_bytes = param_bytes + s.extra_frozen_bytes;
    let grads = trainable;
    let optim = 2 * trainable;
    let accum = cfg.grad_accum_steps.max(1);
    let peaks: ActivationPeaks = s.graph.simulate(cfg.gradient_checkpointing);
    let base = param_bytes + optim + s.batch_bytes + RUNTIME_BASELINE_BYTES;
    // From the second micro-batch on the accumulated gradients stay live; the backward then
    // also sums each new gradient into them (one extra tensor at a time, the largest bounded).
    let held_grads = if accum > 1 { grads } else { 0 };
    let fwd = base + held_grads + peaks.forward_peak;
    let bwd = base + held_grads + peaks.backward_peak;
    // The update (flex, `vramlab_train::optim_kernels`): squared norms and AdamW in place, one
    // pass per parameter, no temporaries beyond per-thread chunk buffers.
    let opt = param_bytes + optim + grads + RUNTIME_BASELINE_BYTES;
    let (peak, phase, module) = [(fwd, "forward", peaks.forward_peak_module.clone()), (bwd, "backward", peaks.backward_peak_module.clone()), (opt, "optimizer", "AdamW update".to_string())]
        .into_iter()
        .max_by_key(|x| x.0)
        .unwrap_or((0, "forward", String::new()));
    let mut settings = vec![
        ("batch_size".to_string(), cfg.batch_size.to_string()),
        ("grad_accum_steps".to_string(), accum.to_string()),
        ("precision".to_string(), cfg.precision.name().to_string()),
        ("gradient_checkpointing".to_string(), cfg.gradient_checkpointing.to_string()),
    ];
    settings.push(("model".into(), s.model.clone()));
    let mut assumptions = vec![
        "flex (CPU) backend; Burn 0.21 autodiff save rules; saved tensors share storage with the forward's".to_string(),
        format!("runtime baseline {} (flex buffers kept from the second step on)", human(RUNTIME_BASELINE_BYTES)),
        "steady state: steps after the first (the optimizer state exists); step 1 peaks lower by the optimizer state".to_string(),
        "optimizer: AdamW, two f32 moments per trainable parameter; updated in place (no temporaries)".to_string(),
        "conv workspace on flex: forward NHWC input copy + flattened weight; weight gradient: f32 im2col blocks of at most the input + output gradient bytes (4–32 MiB) and their output-gradient columns; stride-1 input gradient: the flipped-kernel convolution's copies; none for an input that needs no gradient".to_string(),
        "3-D stride-1 convolutions with cin·k³ ≤ 1728 (f32, bf16) on flex's direct kernels: a zero-padded f32 input copy (rows of whole 8-lane vectors) + the weight packed by 4 output channels; weight gradient: the padded input, the output gradient as f32 vector rows when it is not already, per-tile sums".to_string(),
    ];
    if cfg.precision != Precision::F32 {
        assumptions.push("half precision: parameter gradients held in the compute dtype until the end of the backward (Burn runs the weights' depth-1 casts last), then cast to f32 one at a time (flex: contiguous copy, f64 buffer, f32 result)".to_string());
    }
    assumptions.extend(s.notes);
    MemoryEstimate {
        model: s.model,
        settings,
        param_bytes,
        trainable_param_bytes: trainable,
        grad_bytes: grads,
        optimizer_state_bytes: optim,
        batch_bytes: s.batch_bytes,
        runtime_baseline_bytes: RUNTIME_BASELINE_BYTES,
        stored_activation_bytes: peaks.stored,
        transient_bytes: peaks.backward_peak.saturating_sub(peaks.stored + peaks.grads_at_backward_peak).max(peaks.forward_peak.saturating_sub(peaks.stored)),
        peak_forward_bytes: fwd,
        peak_backward_bytes: bwd,
        peak_optimizer_bytes: opt,
        peak_step_bytes: peak,
        peak_phase: phase.to_string(),
        peak_module: module,
        modules: s.graph.module_rows(),
        assumptions,
    }
}

impl MemoryEstimate {
    /// The report: totals by category, stored activations per module, the peak and its phase.
    pub fn markdown(&self) -> String {
        use std::fmt::Write as _;
        let mut s = md_title(&format!("vramlab estimate: {}", self.model), &self.settings);
        md_bytes_table(&mut s, "category", &[
            ("parameters (f32)", self.param_bytes),
            ("gradients (f32, trainable)", self.grad_bytes),
            ("optimizer state (AdamW)", self.optimizer_state_bytes),
            ("batch", self.batch_bytes),
            ("runtime baseline", self.runtime_baseline_bytes),
            ("stored activations", self.stored_activation_bytes),
            ("transient workspace (max)", self.transient_bytes),
        ]);
        md_human_table(&mut s, "phase | predicted peak", &[("forward", self.peak_forward_bytes), ("backward", self.peak_backward_bytes), ("optimizer", self.peak_optimizer_bytes)]);
        let _ = writeln!(s, "\n**Predicted peak: {} ({} bytes), in the {} phase ({}).**\n", human(self.peak_step_bytes), self.peak_step_bytes, self.peak_phase, self.peak_module);
        let _ = writeln!(s, "Stored activations per module (plain autodiff):\n\n| module | stored | largest workspace |\n|---|---:|---:|");
        for r in &self.modules {
            let _ = writeln!(s, "| {} | {} | {} |", r.module, human(r.stored_bytes), human(r.workspace_bytes));
        }
        md_list(&mut s, "Assumptions", &self.assumptions);
        s
    }
}

/// `# title` and the settings line that open both estimates' reports.
pub(crate) fn md_title(title: &str, settings: &[(String, String)]) -> String {
    let set: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("# {title}\n\nSettings: {}\n\n", set.join(", "))
}

/// A `| name | bytes | MiB |` table, one row per term.
pub(crate) fn md_bytes_table(s: &mut String, name: &str, rows: &[(&str, u64)]) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "| {name} | bytes | MiB |\n|---|---:|---:|");
    for (k, v) in rows {
        let _ = writeln!(s, "| {k} | {v} | {} |", human(*v));
    }
}

/// A two-column table (`header` is "name | value") of human-readable sizes, after a blank line.
pub(crate) fn md_human_table(s: &mut String, header: &str, rows: &[(&str, u64)]) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "\n| {header} |\n|---|---:|");
    for (k, v) in rows {
        let _ = writeln!(s, "| {k} | {} |", human(*v));
    }
}

/// `title:` and a bullet per item, after a blank line; nothing when there are no items.
pub(crate) fn md_list(s: &mut String, title: &str, items: &[String]) {
    use std::fmt::Write as _;
    if items.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n{title}:");
    for i in items {
        let _ = writeln!(s, "- {i}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::workload::{estimate, shapes};

    fn cfg(flags: &[&str]) -> RunConfig {
        let ov: Vec<(String, String)> = flags
            .iter()
            .map(|f| {
                let (k, v) = f.split_once('=').expect("key=value");
                (k.to_string(), v.to_string())
            })
            .collect();
        config::load(None, &ov).expect("config loads")
    }

    const VAE: &[&str] = &["policy.type=vae3d", "policy.preset=ultra_lightweight", "dataset.grid=8,32,32"];
    const ACT: &[&str] = &["policy.type=act", "dataset.type=random", "policy.camera_shape=3,96,96", "policy.chunk_size=20", "policy.n_action_steps=20"];
    const DIFFUSION: &[&str] = &["policy.type=diffusion", "dataset.type=random", "policy.down_dims=64,128,256", "policy.camera_shape=3,64,64", "policy.crop_shape=56,56"];

    fn with(base: &[&str], extra: &[&str]) -> RunConfig {
        cfg(&base.iter().chain(extra).copied().collect::<Vec<_>>())
    }

    #[test]
    fn graph_weights_are_exactly_the_models_parameters() {
        // The graph's weights must total the config's exact count: a layer missing from (or
        // added to) a model's graph shows here.
        for base in [VAE, ACT, DIFFUSION] {
            let s = shapes(&with(base, &[])).expect("shapes");
            let (all, trainable) = s.graph.param_bytes();
            let n = s.num_params.expect("exact count");
            assert_eq!(all, 4 * n, "{base:?}");
            assert_eq!(trainable, all, "{base:?}: nothing frozen");
        }
        let e = estimate(&with(VAE, &[])).expect("estimate");
        assert_eq!((e.param_bytes, e.grad_bytes, e.optimizer_state_bytes), (4 * 694_788, 4 * 694_788, 8 * 694_788));
    }

    #[test]
    fn frozen_backbone_has_no_gradients_or_moments() {
        for base in [ACT, DIFFUSION] {
            let free = estimate(&with(base, &[])).expect("estimate");
            let frozen = estimate(&with(base, &["policy.freeze_backbone=true"])).expect("estimate");
            assert_eq!(free.param_bytes, frozen.param_bytes);
            // ResNet-18's 11,166,912 convolution weights (+ GroupNorm affine on Diffusion).
            assert!(free.grad_bytes - frozen.grad_bytes >= 4 * 11_166_912, "{base:?}");
            assert_eq!(frozen.optimizer_state_bytes, 2 * frozen.grad_bytes);
            assert!(frozen.stored_activation_bytes < free.stored_activation_bytes);
        }
    }

    #[test]
    fn peaks_grow_with_batch_and_shrink_with_checkpointing() {
        for base in [VAE, ACT, DIFFUSION] {
            let at = |b: &str, extra: &[&str]| estimate(&with(base, &[&[b], extra].concat())).expect("estimate");
            let (b1, b2, b4) = (at("batch_size=1", &[]), at("batch_size=2", &[]), at("batch_size=4", &[]));
            // Non-decreasing: at small batches the peak may be the optimizer's, which the batch
            // does not change (ACT and Diffusion up to batch 4 here); growing beyond.
            assert!(b1.peak_step_bytes <= b2.peak_step_bytes && b2.peak_step_bytes <= b4.peak_step_bytes, "{base:?}");
            assert!(b4.peak_step_bytes < at("batch_size=32", &[]).peak_step_bytes, "{base:?}");
            assert!(b1.stored_activation_bytes < b2.stored_activation_bytes, "{base:?}");
            let blocks = at("batch_size=4", &["gradient_checkpointing=blocks"]);
            assert!(blocks.stored_activation_bytes < b4.stored_activation_bytes / 2, "{base:?}: {} vs {}", blocks.stored_activation_bytes, b4.stored_activation_bytes);
            // bf16 halves the activations but keeps a bf16 copy of every weight for the
            // backward (the in-graph casts): a win for the VAE's volumes, a loss for ACT's
            // 51M parameters at batch 4 (as measured: benches/results/estimate).
            let half = at("batch_size=4", &["precision=bf16"]);
            if base == VAE {
                assert!(half.stored_activation_bytes < b4.stored_activation_bytes);
            } else if base == ACT {
                assert!(half.stored_activation_bytes > b4.stored_activation_bytes);
            }
        }
    }

    #[test]
    fn accumulation_keeps_the_gradients_through_the_next_forward() {
        let one = estimate(&with(VAE, &["batch_size=1"])).expect("estimate");
        let two = estimate(&with(VAE, &["batch_size=1", "grad_accum_steps=2"])).expect("estimate");
        assert_eq!(two.peak_forward_bytes, one.peak_forward_bytes + one.grad_bytes);
    }
}
