//! ACT's training loss with its VAE objective as one node: lerobot's `ACTPolicy.forward`,
//! `l1_loss + kl_weight · kld_loss`, where
//!
//! - `l1_loss = mean(|action − actions_hat| · ~action_is_pad)` over every element (the padded
//!   ones count in the mean, as lerobot's `.mean()` of the masked errors);
//! - `kld_loss = mean_b Σ_latent −½(1 + log σ² − μ² − σ²)` of the posterior's parameters
//!   `[μ | log σ²]` (`[b, 2·l]`, `vae_encoder_latent_output_proj`'s output, whole: the node
//!   writes both halves' gradients, so the split is neither run nor undone).
//!
//! Composed of Burn ops the loss is 17 launches forward; with the sample's 4, their backwards and
//! the parameters' split undone, 53 a step (ACT on lavapipe,
//! `benches/results/kernels/wgpu/launch_trims.md`). On CubeCL it runs
//! `nn::cube::act_loss`: two launches forward (per-cube partial sums, then one cube writing the
//! loss and its two terms) and one backward. The node keeps the action, the prediction, the
//! padding and the posterior's parameters: PyTorch's `l1_loss` keeps both its inputs, and the
//! KL term's ops keep the parameters. The action and the padding (data) take no gradient.
//!
//! flex keeps the model's composed ops ([`LeanBackend::lean_loss_nodes`]): its measured peaks
//! and ACT's estimate graph are theirs. [`forward_composed`] and [`backward_composed`] are what
//! the kernels are tested against; with them, the node on flex is tested against autodiff of
//! the model's composed ops.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use super::{LeanBackend, Prim, p, register_parents, t};

/// `(loss, l1_loss, kld_loss)`, each `[1]` f32, of the prediction `pred` of `action` (both
/// `[b, chunk, a]` f32), the padding `pad` (`[b, chunk]` f32, 1 where the action is padding)
/// if any, and the posterior's parameters `params` (`[b, 2·l]` f32, `[μ | log σ²]`):
/// [`LeanBackend::lean_act_loss`]. Only `loss` takes a gradient; `action` and `pad` must not
/// need one.
pub fn act_loss<B: LeanBackend>(action: Tensor<B, 3>, pred: Tensor<B, 3>, pad: Option<Tensor<B, 2>>, params: Tensor<B, 2>, kl_weight: f32) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>) {
    debug_assert!(!action.is_require_grad() && pad.as_ref().is_none_or(|m| !m.is_require_grad()), "act_loss: the action and its padding take no gradient");
    let [loss, l1, kld] = B::lean_act_loss(p(action), p(pred), pad.map(p), p(params), kl_weight);
    (t(loss), t(l1), t(kld))
}

/// `(μ, log σ²)` of `params`, each `[b, l]`.
fn halves<B: Backend>(params: Prim<B>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let m: Tensor<B, 2> = t(params);
    let l = m.dims()[1] / 2;
    (m.clone().narrow(1, 0, l), m.narrow(1, l, l))
}

/// `1 − pad` as `[b, chunk, 1]`.
fn keep<B: Backend>(pad: Prim<B>) -> Tensor<B, 3> {
    (t::<B, 2>(pad).neg() + 1.0).unsqueeze_dim::<3>(2)
}

/// [`LeanBackend::lean_act_loss`] composed of Burn ops: `[loss, l1_loss, kld_loss]`.
pub(super) fn forward_composed<B: Backend>(action: Prim<B>, pred: Prim<B>, pad: Option<Prim<B>>, params: Prim<B>, kl_weight: f32) -> [Prim<B>; 3] {
    let err = (t::<B, 3>(action) - t::<B, 3>(pred)).abs();
    let err = match pad {
        Some(pad) => err * keep(pad),
        None => err,
    };
    let l1 = err.mean();
    let (mu, ls) = halves(params);
    let kld = ((ls.clone().exp() + mu.square() - ls - 1.0) * 0.5).sum_dim(1).mean();
    [p(l1.clone() + kld.clone() * kl_weight), p(l1), p(kld)]
}

/// [`LeanBackend::lean_act_loss_backward`] composed of Burn ops: `[dpred, dparams]`.
pub(super) fn backward_composed<B: Backend>(action: Prim<B>, pred: Prim<B>, pad: Option<Prim<B>>, params: Prim<B>, dloss: Prim<B>, kl_weight: f32) -> [Prim<B>; 2] {
    let pred: Tensor<B, 3> = t(pred);
    let n = pred.shape().num_elements() as f32;
    let g = t::<B, 1>(dloss);
    let sign = (t::<B, 3>(action) - pred).sign();
    let dpred = sign.neg() * g.clone().reshape([1, 1, 1]) / n;
    let dpred = match pad {
        Some(pad) => dpred * keep(pad),
        None => dpred,
    };
    let (mu, ls) = halves(params);
    let kc = g.reshape([1, 1]) * (kl_weight / mu.dims()[0] as f32);
    let dparams = Tensor::cat(vec![mu * kc.clone(), (ls.exp() - 1.0) * 0.5 * kc], 1);
    [p(dpred), p(dparams)]
}

/// The loss node: gradients for the prediction and the posterior's parameters from the kept
/// inputs.
#[derive(Debug)]
struct ActLossBackward {
    kl_weight: f32,
}

impl<B: LeanBackend> Backward<B, 2> for ActLossBackward {
    /// The action, the prediction, the padding, the posterior's parameters.
    type State = (Prim<B>, Prim<B>, Option<Prim<B>>, Prim<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dloss = grads.consume::<B>(&ops.node);
        let (action, pred, pad, params) = ops.state;
        let d = B::lean_act_loss_backward(action, pred, pad, params, dloss, self.kl_weight);
        register_parents::<B, 2>(grads, ops.parents.map(|n| n.map(|n| n.id)), d);
    }
}

/// [`LeanBackend::lean_act_loss`] on `Autodiff<B, C>`: the loss as one node
/// ([`ActLossBackward`]), its two terms untracked.
pub(super) fn act_loss_node<B: LeanBackend, C: CheckpointStrategy>(
    action: Prim<Autodiff<B, C>>,
    pred: Prim<Autodiff<B, C>>,
    pad: Option<Prim<Autodiff<B, C>>>,
    params: Prim<Autodiff<B, C>>,
    kl_weight: f32,
) -> [Prim<Autodiff<B, C>>; 3] {
    let parents = [pred.node.clone(), params.node.clone()];
    let (action, pred, pad, params) = (action.primitive, pred.primitive, pad.map(|m| m.primitive), params.primitive);
    let [loss, l1, kld] = B::lean_act_loss(action.clone(), pred.clone(), pad.clone(), params.clone(), kl_weight);
    let untracked = <Autodiff<B, C> as AutodiffBackend>::from_inner;
    let loss = match (ActLossBackward { kl_weight }).prepare::<C>(parents).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((action, pred, pad, params), loss),
        OpsKind::UnTracked(prep) => prep.finish(loss),
    };
    [loss, untracked(l1), untracked(kld)]
}
