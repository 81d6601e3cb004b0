//! The normalisation nodes: GroupNorm (+ an optional fused SiLU) and LayerNorm, each one
//! autodiff node that keeps the input plus the per-group (per-row) mean and 1/std, as
//! PyTorch's `native_group_norm` / `native_layer_norm`, with the analytic backward over the `m`
//! elements of a group (row, for LayerNorm), `x̂ = (x − μ)·r`, `r = 1/sqrt(var + eps)` and `g`
//! the output gradient times `weight`:
//! `dx = r · (g − mean(g) − x̂ · mean(g · x̂))`, `dweight = Σ dy · x̂`, `dbias = Σ dy`.
//!
//! GroupNorm can fuse a following SiLU ([`NormAct::Silu`], the 3D-VAE's `norm → silu`), Mish
//! (Diffusion's `Conv1dBlock`) or ReLU (Diffusion's ResNet-18): the node then keeps only the
//! norm's input and recomputes the pre-activation in the backward. Mish and ReLU are fused
//! where [`LeanBackend::lean_group_norm_fuses`] says so ([`group_norm`]).
//!
//! A ResNet block's end with GroupNorm, `relu(norm(x) + r)`, is one node where
//! [`LeanBackend::lean_group_norm_add_relu_fuses`] says so ([`group_norm_add_relu`]): it keeps the
//! norm's input and statistics and its output `y` (the norm's node and the ReLU's keep the same),
//! and its backward runs the norm's with `g = dy where y > 0`, which is also `r`'s gradient.
//! Also here: the composed forwards and backward (Burn ops) the inner backends run.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::activation::sigmoid;
use burn::tensor::TensorMetadata;

use super::pointwise::{mish_grad, mish_of, silu_grad};
use super::{LeanBackend, NormAct, Prim, dims_of, p, register_parents, t, unview, view};
use crate::nn::{to_dtype, to_f32};

/// The two views of `[n, c, s…]` GroupNorm works in, both free reshapes of the contiguous
/// input: statistics over `[n, groups, c/groups · s/last, last]` (the last axis reduced first,
/// then the rest: one flat reduction over a whole group, up to millions of elements,
/// accumulates ~1e-5 relative f32 error on some backends (flex), which GroupNorm amplifies on
/// sparse inputs), and the per-channel affine over `[n, c, s]` (3-D broadcasts take flex's
/// fast paths; 5-D ones with a `[1, g, c/g, 1, 1]` weight went through its strided iterator).
#[derive(Clone, Copy)]
struct GroupViews {
    stats: [usize; 4],
    channels: [usize; 3],
}

fn group_views(dims: &[usize], groups: usize) -> GroupViews {
    let (n, c) = (dims[0], dims[1]);
    let last = dims[dims.len() - 1].max(1);
    let spatial: usize = dims[2..].iter().product();
    GroupViews { stats: [n, groups, c / groups * spatial / last, last], channels: [n, c, spatial] }
}

fn group_mean<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    x.mean_dim(3).mean_dim(2)
}

/// Per-group mean and `1/sqrt(var + eps)` (`[n, g, 1, 1]`) of an f32 statistics view.
fn group_stats<B: Backend>(x: &Tensor<B, 4>, eps: f64) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let mean = group_mean(x.clone());
    let var = group_mean((x.clone() - mean.clone()).square());
    (mean, (var + eps).sqrt().recip())
}

/// A per-channel `[c]` parameter as `[1, c, 1]`.
fn channel_view<B: Backend>(w: Prim<B>) -> Tensor<B, 3> {
    let w = t::<B, 1>(w);
    let c = w.dims()[0];
    w.reshape([1, c, 1])
}

/// Forward of [`LeanBackend::lean_group_norm`]; also returns the per-group mean and 1/std
/// (f32 `[n, g, 1, 1]`) that the backward keeps.
pub(super) fn forward_group_norm<B: Backend>(x: Prim<B>, weight: Prim<B>, bias: Prim<B>, groups: usize, eps: f64, act: NormAct) -> (Prim<B>, Prim<B>, Prim<B>) {
    let dims = dims_of::<B>(&x);
    let dtype = x.dtype();
    let v = group_views(&dims, groups);
    let xg = to_f32(view::<B, 4>(x, v.stats));
    let (mean, rstd) = group_stats(&xg, eps);
    let xhat = ((xg - mean.clone()) * rstd.clone()).reshape(v.channels);
    let z = xhat * channel_view::<B>(weight) + channel_view::<B>(bias);
    let y = match act {
        NormAct::None => z,
        NormAct::Silu => z.clone() * sigmoid(z),
        NormAct::Mish => mish_of(z),
        NormAct::Relu => burn::tensor::activation::relu(z),
    };
    (unview(to_dtype(y, dtype), &dims), p(mean), p(rstd))
}

pub(super) fn forward_layer_norm<B: Backend>(x: Prim<B>, weight: Prim<B>, bias: Prim<B>, eps: f64) -> (Prim<B>, Prim<B>, Prim<B>) {
    let dims = dims_of::<B>(&x);
    let d = dims[dims.len() - 1];
    let x = to_f32(view::<B, 2>(x, [dims.iter().product::<usize>() / d, d]));
    let mean = x.clone().mean_dim(1);
    let xc = x - mean.clone();
    let rstd = (xc.clone().square().mean_dim(1) + eps).sqrt().recip();
    let y = xc * rstd.clone() * t::<B, 1>(weight).reshape([1, d]) + t::<B, 1>(bias).reshape([1, d]);
    (unview(y, &dims), p(mean), p(rstd))
}

/// GroupNorm's backward from `x̂` and `g` (the gradient at the affine's output) in the channel
/// view: `dx` (f32, channel view), `dweight`, `dbias` (`[c]`).
fn group_norm_backward<B: Backend>(xhat: Tensor<B, 3>, rstd: Tensor<B, 4>, g: Tensor<B, 3>, weight: Tensor<B, 3>, v: GroupViews) -> (Tensor<B, 3>, Tensor<B, 1>, Tensor<B, 1>) {
    let c = v.channels[1];
    let dweight = (g.clone() * xhat.clone()).sum_dim(2).sum_dim(0).reshape([c]);
    let dbias = g.clone().sum_dim(2).sum_dim(0).reshape([c]);
    let gh = (g * weight).reshape(v.stats);
    let xhat = xhat.reshape(v.stats);
    let m1 = group_mean(gh.clone());
    let m2 = group_mean(gh.clone() * xhat.clone());
    let dx = (gh - m1 - xhat * m2) * rstd;
    (dx.reshape(v.channels), dweight, dbias)
}

#[derive(Debug)]
struct GroupNormBackward;

#[derive(Clone, Debug)]
struct GroupNormState<B: Backend> {
    x: Prim<B>,
    mean: Prim<B>,
    rstd: Prim<B>,
    weight: Prim<B>,
    bias: Prim<B>,
    groups: usize,
    act: NormAct,
}

impl<B: LeanBackend> Backward<B, 3> for GroupNormBackward {
    type State = GroupNormState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let GroupNormState { x, mean, rstd, weight, bias, groups, act } = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let (dx, dweight, dbias) = B::lean_group_norm_backward(x, mean, rstd, weight, bias, dy, groups, act);
        register_parents::<B, 3>(grads, ops.parents.map(|n| n.map(|n| n.id)), [dx, dweight, dbias]);
    }
}

/// [`LeanBackend::lean_group_norm`] on `Autodiff<B, C>`: one node keeping the input and the
/// per-group mean and 1/std ([`GroupNormBackward`]).
pub(super) fn group_norm_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, weight: Prim<Autodiff<B, C>>, bias: Prim<Autodiff<B, C>>, groups: usize, eps: f64, act: NormAct) -> Prim<Autodiff<B, C>> {
    match GroupNormBackward.prepare::<C>([x.node.clone(), weight.node.clone(), bias.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (y, mean, rstd) = B::lean_group_norm_stats(x.primitive.clone(), weight.primitive.clone(), bias.primitive.clone(), groups, eps, act);
            let state = GroupNormState { x: x.primitive, mean, rstd, weight: weight.primitive, bias: bias.primitive, groups, act };
            prep.finish(state, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::lean_group_norm(x.primitive, weight.primitive, bias.primitive, groups, eps, act)),
    }
}

#[derive(Debug)]
struct GroupNormAddReluBackward;

#[derive(Clone, Debug)]
struct GroupNormAddReluState<B: Backend> {
    x: Prim<B>,
    mean: Prim<B>,
    rstd: Prim<B>,
    weight: Prim<B>,
    bias: Prim<B>,
    y: Prim<B>,
    groups: usize,
}

impl<B: LeanBackend> Backward<B, 4> for GroupNormAddReluBackward {
    type State = GroupNormAddReluState<B>;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let GroupNormAddReluState { x, mean, rstd, weight, bias, y, groups } = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let (dx, dweight, dbias, dr) = B::lean_group_norm_add_relu_backward(x, mean, rstd, weight, bias, y, dy, groups);
        register_parents::<B, 4>(grads, ops.parents.map(|n| n.map(|n| n.id)), [dx, dweight, dbias, dr]);
    }
}

/// [`LeanBackend::lean_group_norm_add_relu`] on `Autodiff<B, C>`: one node keeping the norm's
/// input, its per-group mean and 1/std and the output ([`GroupNormAddReluBackward`]).
pub(super) fn group_norm_add_relu_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, weight: Prim<Autodiff<B, C>>, bias: Prim<Autodiff<B, C>>, residual: Prim<Autodiff<B, C>>, groups: usize, eps: f64) -> Prim<Autodiff<B, C>> {
    match GroupNormAddReluBackward.prepare::<C>([x.node.clone(), weight.node.clone(), bias.node.clone(), residual.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (y, mean, rstd) = B::lean_group_norm_add_relu_stats(x.primitive.clone(), weight.primitive.clone(), bias.primitive.clone(), residual.primitive, groups, eps);
            let state = GroupNormAddReluState { x: x.primitive, mean, rstd, weight: weight.primitive, bias: bias.primitive, y: y.clone(), groups };
            prep.finish(state, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::lean_group_norm_add_relu(x.primitive, weight.primitive, bias.primitive, residual.primitive, groups, eps)),
    }
}

/// [`LeanBackend::lean_group_norm_backward`] composed of Burn ops (any backend, any dtype).
#[allow(clippy::too_many_arguments)]
pub(super) fn group_norm_backward_composed<B: Backend>(x: Prim<B>, mean: Prim<B>, rstd: Prim<B>, weight: Prim<B>, bias: Prim<B>, dy: Prim<B>, groups: usize, act: NormAct) -> (Prim<B>, Prim<B>, Prim<B>) {
    let dims = dims_of::<B>(&x);
    let dtype = x.dtype();
    let v = group_views(&dims, groups);
    let rstd = t::<B, 4>(rstd);
    let xhat = ((to_f32(view::<B, 4>(x, v.stats)) - t::<B, 4>(mean)) * rstd.clone()).reshape(v.channels);
    let weight = channel_view::<B>(weight);
    let dy = to_f32(view::<B, 3>(dy, v.channels));
    let z = || xhat.clone() * weight.clone() + channel_view::<B>(bias.clone());
    let g = match act {
        NormAct::None => dy,
        NormAct::Silu => silu_grad(z(), dy),
        NormAct::Mish => mish_grad(z(), dy),
        // `dy` where `z > 0`, as the ReLU node's "where the output is > 0".
        NormAct::Relu => dy.mask_fill(z().lower_equal_elem(0.0), 0.0),
    };
    let (dx, dweight, dbias) = group_norm_backward(xhat, rstd, g, weight, v);
    (unview(to_dtype(dx, dtype), &dims), p(dweight), p(dbias))
}

#[derive(Debug)]
struct LayerNormBackward;

#[derive(Clone, Debug)]
struct LayerNormState<B: Backend> {
    x: Prim<B>,
    mean: Prim<B>,
    rstd: Prim<B>,
    weight: Prim<B>,
}

impl<B: LeanBackend> Backward<B, 3> for LayerNormBackward {
    type State = LayerNormState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let LayerNormState { x, mean, rstd, weight } = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let (dx, dweight, dbias) = B::lean_layer_norm_backward(x, mean, rstd, weight, dy);
        register_parents::<B, 3>(grads, ops.parents.map(|n| n.map(|n| n.id)), [dx, dweight, dbias]);
    }
}

/// [`LeanBackend::lean_layer_norm_backward`] composed of Burn ops (any backend, any dtype).
pub(super) fn layer_norm_backward_composed<B: Backend>(x: Prim<B>, mean: Prim<B>, rstd: Prim<B>, weight: Prim<B>, dy: Prim<B>) -> (Prim<B>, Prim<B>, Prim<B>) {
    let dims = dims_of::<B>(&x);
    let dtype = x.dtype();
    let d = dims[dims.len() - 1];
    let rows = dims.iter().product::<usize>() / d;
    let x = to_f32(view::<B, 2>(x, [rows, d]));
    let rstd = t::<B, 2>(rstd);
    let xhat = (x - t::<B, 2>(mean)) * rstd.clone();
    let dy = to_f32(view::<B, 2>(dy, [rows, d]));
    let w = t::<B, 1>(weight).reshape([1, d]);
    let dweight = (dy.clone() * xhat.clone()).sum_dim(0).reshape([d]);
    let dbias = dy.clone().sum_dim(0).reshape([d]);
    let gh = dy * w;
    let m1 = gh.clone().mean_dim(1);
    let m2 = (gh.clone() * xhat.clone()).mean_dim(1);
    let dx = (gh - m1 - xhat * m2) * rstd;
    (unview(to_dtype(dx, dtype), &dims), p(dweight), p(dbias))
}

/// [`LeanBackend::lean_layer_norm`] on `Autodiff<B, C>`: one node keeping the input and the
/// per-row mean and 1/std ([`LayerNormBackward`]).
pub(super) fn layer_norm_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, weight: Prim<Autodiff<B, C>>, bias: Prim<Autodiff<B, C>>, eps: f64) -> Prim<Autodiff<B, C>> {
    match LayerNormBackward.prepare::<C>([x.node.clone(), weight.node.clone(), bias.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (y, mean, rstd) = B::lean_layer_norm_stats(x.primitive.clone(), weight.primitive.clone(), bias.primitive.clone(), eps);
            prep.finish(LayerNormState { x: x.primitive, mean, rstd, weight: weight.primitive }, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::lean_layer_norm(x.primitive, weight.primitive, bias.primitive, eps)),
    }
}

/// GroupNorm then `act`: one node where [`LeanBackend::lean_group_norm_fuses`] says so, else
/// the norm's node and then the activation's ([`super::mish`], [`super::relu`]).
pub(crate) fn group_norm<B: LeanBackend, const D: usize>(x: Tensor<B, D>, weight: Tensor<B, 1>, bias: Tensor<B, 1>, groups: usize, eps: f64, act: NormAct) -> Tensor<B, D> {
    if B::lean_group_norm_fuses(act) {
        return t(B::lean_group_norm(p(x), p(weight), p(bias), groups, eps, act));
    }
    let y = t(B::lean_group_norm(p(x), p(weight), p(bias), groups, eps, NormAct::None));
    match act {
        NormAct::None => y,
        NormAct::Silu => super::silu(y),
        NormAct::Mish => super::mish(y),
        NormAct::Relu => super::relu(y),
    }
}

/// `relu(GroupNorm(x) + residual)`: one node where [`LeanBackend::lean_group_norm_add_relu_fuses`]
/// says so and `x` and `residual` are f32 of one shape, else the norm's node, the add and the
/// ReLU's node (the same values in f32: the same operations in the same order).
pub(crate) fn group_norm_add_relu<B: LeanBackend, const D: usize>(x: Tensor<B, D>, weight: Tensor<B, 1>, bias: Tensor<B, 1>, residual: Tensor<B, D>, groups: usize, eps: f64) -> Tensor<B, D> {
    if group_norm_add_relu_fuses::<B>(x.dtype(), residual.dtype()) && x.dims() == residual.dims() {
        return t(B::lean_group_norm_add_relu(p(x), p(weight), p(bias), p(residual), groups, eps));
    }
    let y = t::<B, D>(B::lean_group_norm(p(x), p(weight), p(bias), groups, eps, NormAct::None));
    super::relu(y + residual)
}

/// Whether [`group_norm_add_relu`] of an `x` in `dtype` and a residual in `residual` is one node.
pub(crate) fn group_norm_add_relu_fuses<B: LeanBackend>(dtype: burn::tensor::DType, residual: burn::tensor::DType) -> bool {
    B::lean_group_norm_add_relu_fuses() && dtype == burn::tensor::DType::F32 && residual == dtype
}

pub(crate) fn layer_norm<B: LeanBackend, const D: usize>(x: Tensor<B, D>, weight: Tensor<B, 1>, bias: Tensor<B, 1>, eps: f64) -> Tensor<B, D> {
    t(B::lean_layer_norm(p(x), p(weight), p(bias), eps))
}

/// `relu(GroupNorm(x) + r)` on `Autodiff<B>` through [`group_norm_add_relu_node`] (`node`) or
/// autodiff of the composed ops: the output and the gradients of `sum(y · w)` with respect to
/// `x`, the norm's weight and bias and `r`, for `x: dims` in `groups` groups from `seed`
/// (`layout` applied to the inner `x` and `r` first, so a test can store them channels last).
/// About half the outputs are ReLU zeros.
#[cfg(test)]
pub(super) fn group_norm_add_relu_grads<B: LeanBackend>(dims: [usize; 4], groups: usize, seed: u64, node: bool, layout: impl Fn(Prim<B>) -> Prim<B>) -> Vec<(&'static str, Vec<f32>)> {
    use super::tests::{random, vals};
    use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
    type AD<B> = Autodiff<B>;
    let c = dims[1];
    let x = Tensor::<AD<B>, 4>::from_inner(t(layout(p(random::<B, 4>(dims, seed) * 2.0)))).require_grad();
    let r = Tensor::<AD<B>, 4>::from_inner(t(layout(p(random::<B, 4>(dims, seed + 1) - 0.3)))).require_grad();
    let w = Tensor::<AD<B>, 1>::from_inner(random::<B, 1>([c], seed + 2) * 0.5 + 1.0).require_grad();
    let b = Tensor::<AD<B>, 1>::from_inner(random::<B, 1>([c], seed + 3) * 0.5).require_grad();
    let y: Tensor<AD<B>, 4> = if node {
        t(group_norm_add_relu_node::<B, NoCheckpointing>(p(x.clone()), p(w.clone()), p(b.clone()), p(r.clone()), groups, 1e-5))
    } else {
        let (y, _, _) = super::burn_kernels::group_norm_add_relu::<AD<B>>(p(x.clone()), p(w.clone()), p(b.clone()), p(r.clone()), groups, 1e-5);
        t(y)
    };
    let out = vals(y.clone());
    let g = (y * random::<AD<B>, 4>(dims, seed + 4)).sum().backward();
    let grad = |v: Option<Tensor<B, 4>>, name: &str| vals(v.unwrap_or_else(|| panic!("{name} takes a gradient")));
    vec![
        ("output", out),
        ("dx", grad(x.grad(&g), "x")),
        ("dweight", vals(w.grad(&g).expect("the weight takes a gradient"))),
        ("dbias", vals(b.grad(&g).expect("the bias takes a gradient"))),
        ("dresidual", grad(r.grad(&g), "the residual")),
    ]
}

#[cfg(test)]
mod tests {
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    use burn::backend::{Autodiff, Flex};
    use burn::module::Param;
    use burn::prelude::*;
    use burn::tensor::activation::silu as burn_silu;

    use super::super::tests::{A, check, random, rel, vals};
    use super::NormAct;
    use crate::nn::norm::composed;
    use crate::nn::{GroupNorm, LayerNorm};

    fn gn<B: Backend>(w: Tensor<B, 1>, b: Tensor<B, 1>, groups: usize) -> GroupNorm<B> {
        GroupNorm { weight: Param::from_tensor(w), bias: Param::from_tensor(b), num_groups: groups, eps: 1e-5 }
    }

    fn lean_gn<B: super::LeanBackend, const D: usize>(groups: usize, act: NormAct) -> impl Fn(Tensor<B, D>, Tensor<B, 1>, Tensor<B, 1>) -> Tensor<B, D> {
        move |x, w, b| gn(w, b, groups).forward_act(x, act)
    }

    fn plain_gn<B: Backend, const D: usize>(groups: usize, act: NormAct) -> impl Fn(Tensor<B, D>, Tensor<B, 1>, Tensor<B, 1>) -> Tensor<B, D> {
        move |x, w, b| {
            let y = composed::group_norm(&gn(w, b, groups), x);
            match act {
                NormAct::None => y,
                NormAct::Silu => burn_silu(y),
                NormAct::Mish => burn::tensor::activation::mish(y),
                NormAct::Relu => burn::tensor::activation::relu(y),
            }
        }
    }

    /// GroupNorm and `act` as one node, whatever `lean_group_norm_fuses` says.
    fn fused_gn<const D: usize>(groups: usize, act: NormAct) -> impl Fn(Tensor<A, D>, Tensor<A, 1>, Tensor<A, 1>) -> Tensor<A, D> {
        use super::super::{LeanBackend, p, t};
        move |x, w, b| t(A::lean_group_norm(p(x), p(w), p(b), groups, 1e-5, act))
    }

    #[test]
    fn group_norm_backward_equals_autodiff_of_the_composed_forward() {
        type Balanced = Autodiff<Flex, BalancedCheckpointing>;
        for act in [NormAct::None, NormAct::Silu] {
            check::<A, 5>([2, 8, 3, 4, 5], 8, lean_gn(4, act), plain_gn(4, act), 1e-5);
            check::<A, 4>([3, 16, 6, 7], 16, lean_gn(4, act), plain_gn(4, act), 1e-5);
            check::<A, 3>([2, 12, 9], 12, lean_gn(3, act), plain_gn(3, act), 1e-5);
            check::<Balanced, 4>([2, 8, 5, 5], 8, lean_gn(2, act), plain_gn(2, act), 1e-5);
        }
    }

    /// GroupNorm → Mish / ReLU as one node (CubeCL's; on flex its composed forward and
    /// backward) against autodiff of the composed forward. flex's models run the two nodes:
    /// `forward_act` equals the norm followed by the activation's node, bit for bit.
    #[test]
    fn fused_mish_and_relu_nodes_equal_autodiff_of_the_composed_forward() {
        use super::super::LeanBackend;
        for act in [NormAct::Mish, NormAct::Relu] {
            check::<A, 3>([2, 12, 9], 12, fused_gn(3, act), plain_gn(3, act), 1e-5);
            check::<A, 4>([3, 16, 6, 7], 16, fused_gn(4, act), plain_gn(4, act), 1e-5);
            assert!(!A::lean_group_norm_fuses(act) && !Flex::lean_group_norm_fuses(act), "{act:?}: flex runs two nodes");
            let (x, w, b): (Tensor<A, 3>, Tensor<A, 1>, Tensor<A, 1>) = (random([2, 12, 9], 7), random([12], 8) + 1.0, random([12], 9));
            let two = gn(w.clone(), b.clone(), 3).forward(x.clone());
            let two = if act == NormAct::Mish { super::super::mish(two) } else { super::super::relu(two) };
            assert_eq!(vals(lean_gn::<A, 3>(3, act)(x, w, b)), vals(two), "{act:?}");
        }
        assert!(A::lean_group_norm_fuses(NormAct::Silu));
    }

    /// GroupNorm + residual + ReLU as one node (CubeCL's; on flex its composed forward and
    /// backward) against autodiff of the composed ops: output and the gradients of `x`, the
    /// weight, the bias and the residual. flex's models run the separate nodes.
    #[test]
    fn group_norm_add_relu_node_equals_autodiff_of_the_composed_ops() {
        use super::super::LeanBackend;
        use super::super::tests::all_close;
        for (dims, groups) in [([2, 32, 5, 7], 2), ([3, 16, 6, 6], 1), ([1, 12, 3, 11], 3)] {
            let lean = super::group_norm_add_relu_grads::<Flex>(dims, groups, 60, true, |x| x);
            let plain = super::group_norm_add_relu_grads::<Flex>(dims, groups, 60, false, |x| x);
            let zeros = lean[0].1.iter().filter(|v| **v == 0.0).count();
            assert!(zeros > 0 && zeros < lean[0].1.len(), "{dims:?}: the ReLU cuts some outputs and not all ({zeros})");
            all_close(&format!("{dims:?} groups {groups}"), lean, plain, 1e-5);
        }
        assert!(!A::lean_group_norm_add_relu_fuses() && !Flex::lean_group_norm_add_relu_fuses(), "flex runs the separate nodes");
        assert!(!super::group_norm_add_relu_fuses::<A>(burn::tensor::DType::F32, burn::tensor::DType::F32));
    }

    #[test]
    fn layer_norm_backward_equals_autodiff_of_the_composed_forward() {
        let ln = |w, b| LayerNorm { weight: Param::from_tensor(w), bias: Param::from_tensor(b), eps: 1e-5 };
        check::<A, 3>([3, 7, 16], 16, move |x, w, b| ln(w, b).forward(x), move |x, w, b| composed::layer_norm(&ln(w, b), x), 1e-5);
        check::<A, 2>([5, 64], 64, move |x, w, b| ln(w, b).forward(x), move |x, w, b| composed::layer_norm(&ln(w, b), x), 1e-5);
    }

    #[test]
    fn lean_ops_keep_reduced_precision_inputs_in_their_dtype() {
        use burn::tensor::{DType, FloatDType};
        let x: Tensor<A, 4> = random([2, 8, 4, 4], 5).cast(FloatDType::BF16).require_grad();
        let g = gn::<A>(Tensor::ones([8], &Default::default()), Tensor::zeros([8], &Default::default()), 4);
        let y = g.forward_act(x.clone(), NormAct::Silu);
        assert_eq!(y.dtype(), DType::BF16);
        let grads = y.cast(FloatDType::F32).sum().backward();
        assert_eq!(x.grad(&grads).unwrap().dtype(), DType::BF16);
        let ln = LayerNorm::<A>::new(4, &Default::default());
        assert_eq!(ln.forward(x.clone()).dtype(), DType::F32, "LayerNorm returns f32");
        assert_eq!(super::super::mish(x).dtype(), DType::BF16);
    }

    /// GroupNorm + SiLU on bf16 input (flex's bf16 kernel) against the f32 composed ops on the
    /// same values: output and input gradient within bf16 rounding.
    #[test]
    fn bf16_group_norm_matches_f32_within_rounding() {
        use burn::tensor::FloatDType;
        let x16: Tensor<A, 4> = random([2, 8, 5, 6], 21).cast(FloatDType::BF16);
        let x32 = x16.clone().cast(FloatDType::F32);
        let (w, b): (Tensor<A, 1>, Tensor<A, 1>) = (random([8], 22) * 0.5 + 1.0, random([8], 23) * 0.5);
        let r: Tensor<A, 4> = random([2, 8, 5, 6], 24);
        let run = |x: Tensor<A, 4>, lean: bool| {
            let x = x.require_grad();
            let y = if lean { lean_gn::<A, 4>(4, NormAct::Silu)(x.clone(), w.clone(), b.clone()) } else { plain_gn::<A, 4>(4, NormAct::Silu)(x.clone(), w.clone(), b.clone()) };
            let y = y.cast(FloatDType::F32);
            let out = vals(y.clone());
            let g = (y * r.clone()).sum().backward();
            (out, vals(x.grad(&g).unwrap().cast(FloatDType::F32)))
        };
        let ((lo, lx), (po, px)) = (run(x16, true), run(x32, false));
        assert!(rel(&lo, &po) <= 1e-2, "output {}", rel(&lo, &po));
        assert!(rel(&lx, &px) <= 2e-2, "dx {}", rel(&lx, &px));
    }
}
