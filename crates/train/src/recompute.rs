//! Gradient checkpointing.
//!
//! Two real mechanisms, selected with `--gradient_checkpointing`:
//! - `blocks`: explicit block recomputation (Chen et al. 2016), done here in the trainer on
//!   the model's stage plan ([`vramlab_stages::Staged`], the same stages its forward folds
//!   over). The forward runs every stage without a graph, keeping only stage inputs (typed
//!   states); the backward walks the stages in reverse, re-running each with autodiff from its
//!   saved input and back-propagating `Σ sum(output · grad_output)` over the state's tensors.
//!   Parameter gradients are the same sums of the same products as in the plain run. The
//!   trainer never looks inside a state: it detaches / tracks every tensor of it and keeps
//!   their gradients rank-erased ([`vramlab_stages::StateGrads`]).
//! - `balanced`: Burn's `Autodiff<B, BalancedCheckpointing>` backend (chosen by the CLI). It
//!   recomputes only operations Burn marks memory-bound (element-wise ops, activations); conv and
//!   matmul outputs stay stored.

use burn::module::{ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use vramlab_stages::{self as stages, StateGrads, Staged};
pub use vramlab_stages::CheckpointMode;

use crate::model::{LossParts, TrainModel};

/// Hooks the trainer gives the staged pass so it can measure the forward and backward phases.
pub trait PhaseHooks {
    fn forward_done(&mut self);
}

/// Initialise every lazily created parameter of `module` now, in visit order. Burn creates some
/// parameters lazily (on first use), and each clone of an uninitialised parameter draws its own
/// values: a model must be materialised before it is cloned, or the clone (block
/// checkpointing's graph-free forward) would compute with other weights. The trainer does this
/// once before training, whatever the mode, so every mode starts from the same weights.
pub fn materialize<B: Backend, M: Module<B>>(module: &M) {
    struct Touch;
    impl<B: Backend> ModuleVisitor<B> for Touch {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = param.val();
        }
    }
    module.visit(&mut Touch);
}

/// One micro-batch with block recomputation: returns the loss parts (values detached) and the
/// parameter gradients of `loss * loss_scale`.
pub fn staged_forward_backward<B, M>(model: &M, batch: &M::Batch, loss_scale: f32, hooks: &mut dyn PhaseHooks) -> (LossParts<B>, GradientsParams)
where
    B: AutodiffBackend,
    M: TrainModel<B>,
{
    let forward_scope = crate::memory_timeline::scope("forward");
    let staged = model.model();
    let input = model.input(batch);
    let plan = staged.plan(&input);
    let n = plan.len();
    // Forward without a graph: parameters are cut from autodiff, only stage inputs are kept.
    materialize::<B, M>(model);
    let frozen = model.clone().no_grad();
    let mut saved = Vec::with_capacity(n);
    let mut state = stages::detach(staged.enter(&input));
    for &s in plan.iter().take(n.saturating_sub(1)) {
        let _s = crate::memory_timeline::stage_scope("forward", &s);
        let next = stages::detach(frozen.model().stage(s, state.clone(), &input));
        saved.push(std::mem::replace(&mut state, next));
    }
    drop(frozen);
    drop(forward_scope);
    hooks.forward_done();
    let _backward = crate::memory_timeline::scope("backward");

    // Last stage, exit and the loss, with a graph.
    let mut acc = GradientsAccumulator::<M>::new();
    let last_in = if n > 1 { stages::leaves(state) } else { state };
    let out = match plan.last() {
        Some(&s) => staged.stage(s, last_in.clone(), &input),
        None => last_in.clone(),
    };
    let parts = model.loss(staged.exit(out, &input), batch);
    let scaled = if loss_scale == 1.0 { parts.loss.clone() } else { parts.loss.clone() * loss_scale };
    let mut grads = scaled.backward();
    let mut upstream = if n > 1 { StateGrads::of(&last_in, &grads) } else { StateGrads::default() };
    acc.accumulate(model, GradientsParams::from_module(&mut grads, model));
    drop((grads, last_in));
    let parts = LossParts { loss: parts.loss.detach(), parts: parts.parts.into_iter().map(|(k, v)| (k, v.detach())).collect() };

    // Earlier stages in reverse: recompute with a graph, push the upstream gradient through.
    for (i, &s) in plan.iter().enumerate().take(n.saturating_sub(1)).rev() {
        let saved_in = saved.pop().expect("one saved state per stage but the last");
        let _s = crate::memory_timeline::stage_scope("backward", &s);
        let need_input_grad = i > 0;
        let stage_in = if need_input_grad { stages::leaves(saved_in) } else { saved_in };
        let out = staged.stage(s, stage_in.clone(), &input);
        let Some(surrogate) = std::mem::take(&mut upstream).dot(&out) else {
            // A stage that outputs no tensor passes no gradient back.
            upstream = StateGrads::zeros(&stage_in);
            continue;
        };
        let mut grads = surrogate.backward();
        if need_input_grad {
            upstream = StateGrads::of(&stage_in, &grads);
        }
        acc.accumulate(model, GradientsParams::from_module(&mut grads, model));
    }
    (parts, acc.grads())
}

/// Parameter gradients by module path, in the model's visit order, as f32 values.
pub type NamedGradients = Vec<(String, Vec<f32>)>;

/// The loss and every parameter gradient (by module path, in visit order; parameters without a
/// gradient are left out) of one micro-batch under `mode`: `Off`, the plain forward and
/// backward; `Blocks`, [`staged_forward_backward`]. (`Balanced` is a backend,
/// `Autodiff<_, BalancedCheckpointing>`: on it, pass `Off`.) For checking that the modes agree.
pub fn named_gradients<B, M>(model: &M, batch: &M::Batch, mode: CheckpointMode) -> (f32, NamedGradients)
where
    B: AutodiffBackend,
    M: TrainModel<B>,
{
    struct Collect<'a> {
        grads: &'a GradientsParams,
        path: vramlab_store::PathStack,
        out: NamedGradients,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_> {
        fn enter_module(&mut self, name: &str, container: &str) {
            self.path.enter(name, container);
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                let values = g.into_data().convert::<f32>().to_vec::<f32>().unwrap_or_default();
                self.out.push((self.path.current(), values));
            }
        }
    }
    let (loss, grads) = match mode {
        CheckpointMode::Blocks => staged_forward_backward(model, batch, 1.0, &mut NoPhases),
        CheckpointMode::Off | CheckpointMode::Balanced => {
            let parts = model.forward_loss(batch);
            let mut g = parts.loss.backward();
            (parts, GradientsParams::from_module(&mut g, model))
        }
    };
    let mut c = Collect { grads: &grads, path: Default::default(), out: Vec::new() };
    model.visit(&mut c);
    (loss.loss.into_scalar().elem(), c.out)
}

/// Check that `other` (another checkpointing mode) computed what `plain` did, both from
/// [`named_gradients`]: the same parameters, the loss within 1e-6 and every gradient within
/// `rel_tol · max |plain gradient|`. `Ok`: the measured `max |Δgrad| / max |grad|`.
pub fn compare_gradients(plain: &(f32, NamedGradients), other: &(f32, NamedGradients), rel_tol: f32) -> Result<f32, String> {
    let ((l0, a), (l1, b)) = (plain, other);
    let names = |g: &[(String, Vec<f32>)]| g.iter().map(|(n, v)| (n.clone(), v.len())).collect::<Vec<_>>();
    if names(a) != names(b) {
        return Err("the two runs give gradients to different parameters".into());
    }
    if (l0 - l1).abs() > 1e-6 * l0.abs() {
        return Err(format!("loss {l1} vs {l0}"));
    }
    let pairs = a.iter().zip(b).flat_map(|((_, x), (_, y))| x.iter().zip(y));
    let (worst, scale) = pairs.fold((0f32, 0f32), |(w, s), (x, y)| (w.max((x - y).abs()), s.max(x.abs())));
    if worst > rel_tol * scale {
        return Err(format!("max |Δgrad| {worst:e} vs max |grad| {scale:e}"));
    }
    Ok(worst / scale.max(f32::MIN_POSITIVE))
}

/// One fixed gradient computation a checkpointing check repeats: a model (built from the same
/// weights on inner backend `I`) and a batch, on `Autodiff<I, C>` for any checkpoint strategy
/// `C` (the backend is named, not any `AutodiffBackend`, so models may ask for backend
/// extensions Burn's `Autodiff` implements).
pub trait GradientProbe<I: Backend> {
    /// [`named_gradients`] of the probe's model and batch on `Autodiff<I, C>` under `mode`.
    fn gradients<C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy>(&self, mode: CheckpointMode) -> (f32, NamedGradients);
}

/// Check that every checkpointing mode computes the plain run's loss and gradients
/// ([`compare_gradients`] within `rel_tol`): block recomputation on `Autodiff<I>`, and Burn's
/// `Autodiff<I, BalancedCheckpointing>`. `Ok`: the plain gradients and each mode's measured
/// relative gap.
pub fn check_checkpointing_modes<I: Backend, P: GradientProbe<I>>(probe: &P, rel_tol: f32) -> Result<(NamedGradients, [(CheckpointMode, f32); 2]), String> {
    use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
    let plain = probe.gradients::<NoCheckpointing>(CheckpointMode::Off);
    let blocks = probe.gradients::<NoCheckpointing>(CheckpointMode::Blocks);
    let balanced = probe.gradients::<BalancedCheckpointing>(CheckpointMode::Off);
    let gap = |mode: CheckpointMode, other| compare_gradients(&plain, other, rel_tol).map(|g| (mode, g)).map_err(|e| format!("{mode}: {e}"));
    let gaps = [gap(CheckpointMode::Blocks, &blocks)?, gap(CheckpointMode::Balanced, &balanced)?];
    Ok((plain.1, gaps))
}

struct NoPhases;
impl PhaseHooks for NoPhases {
    fn forward_done(&mut self) {}
}
