//! The per-element and per-row nodes: SiLU and Mish (keep their input, as PyTorch's), ReLU
//! and softmax (keep their output), the per-channel affine (frozen batch norm: keeps only the
//! scale; with the ReLU after it, and a residual add between them, the output and the scale),
//! FiLM (keeps its input and the `[b, 2c]` embedding, as the composed multiply), linear
//! upsampling along one axis and a bias added along the last axis (keep nothing).
//!
//! - SiLU: `dx = dy · s · (1 + x·(1 − s))`, `s = sigmoid(x)`;
//! - Mish: `dx = dy · (tanh(sp) + x · (1 − tanh²(sp)) · sigmoid(x))`, `sp = softplus(x)`;
//! - ReLU: `dx = dy` where the output is > 0 ([`LeanBackend::lean_relu`]);
//! - softmax: `dx = y · (dy − Σ_dim dy · y)`.
//!
//! Also here: the composed forwards and SiLU/Mish backwards (Burn ops) that flex runs and the
//! CubeCL backends fall back on (`VRAMLAB_COMPOSED_KERNELS=1`); on CubeCL SiLU and Mish are
//! `nn::cube::act`'s kernels, one launch each way.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::activation::sigmoid;
use burn::tensor::{TensorData, TensorMetadata};

use super::{LeanBackend, Prim, burn_kernels, dims_of, linear_source_indices, p, t, unview, view};
use crate::nn::{to_dtype, to_f32};

fn softplus<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    // Overflow-free: max(x, 0) + log1p(exp(−|x|)).
    burn::tensor::activation::relu(x.clone()) + x.abs().neg().exp().log1p()
}

pub(super) fn forward_silu<B: Backend>(x: Prim<B>) -> Prim<B> {
    let dims = dims_of::<B>(&x);
    let dtype = x.dtype();
    let x = to_f32(view::<B, 1>(x, [dims.iter().product()]));
    unview(to_dtype(x.clone() * sigmoid(x), dtype), &dims)
}

pub(super) fn forward_mish<B: Backend>(x: Prim<B>) -> Prim<B> {
    let dims = dims_of::<B>(&x);
    let dtype = x.dtype();
    let x = to_f32(view::<B, 1>(x, [dims.iter().product()]));
    unview(to_dtype(mish_of(x), dtype), &dims)
}

/// `z · tanh(softplus(z))` (also GroupNorm's composed Mish).
pub(super) fn mish_of<B: Backend, const D: usize>(z: Tensor<B, D>) -> Tensor<B, D> {
    z.clone() * softplus(z).tanh()
}

/// `dL/dz · mish'(z)`.
pub(super) fn mish_grad<B: Backend, const D: usize>(z: Tensor<B, D>, dy: Tensor<B, D>) -> Tensor<B, D> {
    let th = softplus(z.clone()).tanh();
    dy * (th.clone() + z.clone() * (th.square().neg() + 1.0) * sigmoid(z))
}

/// `dL/dz · silu'(z)`.
pub(super) fn silu_grad<B: Backend, const D: usize>(z: Tensor<B, D>, dy: Tensor<B, D>) -> Tensor<B, D> {
    let s = sigmoid(z.clone());
    dy * s.clone() * (z * (s.neg() + 1.0) + 1.0)
}

#[derive(Debug)]
struct ActBackward;

#[derive(Clone, Copy, Debug)]
enum Act {
    Silu,
    Mish,
}

/// The composed backward of SiLU (`mish` false) or Mish from the input `x`: in f32, returned in
/// `x`'s dtype.
pub(super) fn act_backward_composed<B: Backend>(x: Prim<B>, dy: Prim<B>, mish: bool) -> Prim<B> {
    let dims = dims_of::<B>(&x);
    let n = dims.iter().product::<usize>();
    let dtype = x.dtype();
    let x = to_f32(view::<B, 1>(x, [n]));
    let dy = to_f32(view::<B, 1>(dy, [n]));
    let dx = if mish {
        mish_grad(x, dy)
    } else {
        silu_grad(x, dy)
    };
    unview(to_dtype(dx, dtype), &dims)
}

impl<B: LeanBackend> Backward<B, 1> for ActBackward {
    type State = (Prim<B>, Act);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, act) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let [node_x] = ops.parents;
        let Some(node) = node_x else { return };
        let dx = match act {
            Act::Silu => B::lean_silu_backward(x, dy),
            Act::Mish => B::lean_mish_backward(x, dy),
        };
        grads.register::<B>(node.id, dx);
    }
}

/// [`LeanBackend::lean_silu`] on `Autodiff<B, C>`: one node keeping the input.
pub(super) fn silu_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>) -> Prim<Autodiff<B, C>> {
    match ActBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let y = B::lean_silu(x.primitive.clone());
            prep.finish((x.primitive, Act::Silu), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::lean_silu(x.primitive)),
    }
}

/// [`LeanBackend::lean_mish`] on `Autodiff<B, C>`: one node keeping the input.
pub(super) fn mish_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>) -> Prim<Autodiff<B, C>> {
    match ActBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let y = B::lean_mish(x.primitive.clone());
            prep.finish((x.primitive, Act::Mish), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::lean_mish(x.primitive)),
    }
}

#[derive(Debug)]
struct ReluBackward;

impl<B: LeanBackend> Backward<B, 1> for ReluBackward {
    type State = Prim<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::lean_relu_backward(ops.state, dy));
        }
    }
}

/// [`LeanBackend::lean_relu`] on `Autodiff<B, C>`: one node keeping the output.
pub(super) fn relu_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>) -> Prim<Autodiff<B, C>> {
    match ReluBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let y = B::lean_relu(x.primitive);
            prep.finish(y.clone(), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::lean_relu(x.primitive)),
    }
}

/// Softmax's backward from its output: `dx = y · (dy − Σ_dim dy · y)`.
#[derive(Debug)]
struct SoftmaxBackward;

impl<B: LeanBackend> Backward<B, 1> for SoftmaxBackward {
    type State = (Prim<B>, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (y, dim) = ops.state;
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::lean_softmax_backward(y, dy, dim));
        }
    }
}

/// [`LeanBackend::lean_softmax_backward`] composed of Burn ops.
pub(super) fn softmax_backward_composed<B: Backend>(y: Prim<B>, dy: Prim<B>, dim: usize) -> Prim<B> {
    let dot = B::float_sum_dim(B::float_mul(dy.clone(), y.clone()), dim);
    B::float_mul(y, B::float_sub(dy, dot))
}

/// [`LeanBackend::lean_softmax`] on `Autodiff<B, C>`: one node keeping the output.
pub(super) fn softmax_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, dim: usize) -> Prim<Autodiff<B, C>> {
    match SoftmaxBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let y = B::lean_softmax(x.primitive, dim);
            prep.finish((y.clone(), dim), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::lean_softmax(x.primitive, dim)),
    }
}

/// `y = x · scale + shift` with constant `scale`, `shift`: `dx = dy · scale`.
#[derive(Debug)]
struct AffineBackward;

impl<B: LeanBackend> Backward<B, 1> for AffineBackward {
    type State = Prim<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::lean_channel_affine(dy, ops.state, None));
        }
    }
}

/// [`LeanBackend::lean_channel_affine`] on `Autodiff<B, C>`: with constant `scale` and `shift`
/// one node keeping the scale ([`AffineBackward`]), otherwise the composed ops.
pub(super) fn channel_affine_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, scale: Prim<Autodiff<B, C>>, shift: Option<Prim<Autodiff<B, C>>>) -> Prim<Autodiff<B, C>> {
    let constant = scale.node.requirement.is_none() && shift.as_ref().is_none_or(|b| b.node.requirement.is_none());
    if !constant {
        return burn_kernels::channel_affine::<Autodiff<B, C>>(x, scale, shift);
    }
    match AffineBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let y = B::lean_channel_affine(x.primitive, scale.primitive.clone(), shift.map(|b| b.primitive));
            prep.finish(scale.primitive, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::lean_channel_affine(x.primitive, scale.primitive, shift.map(|b| b.primitive))),
    }
}

/// `y = max(x · scale + shift, 0)` with constant `scale`, `shift`: `dx = (dy where y > 0) ·
/// scale`. Keeps the output and `scale`, as the affine's and the ReLU's nodes together.
#[derive(Debug)]
struct AffineReluBackward;

impl<B: LeanBackend> Backward<B, 1> for AffineReluBackward {
    type State = (Prim<B>, Prim<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (y, scale) = ops.state;
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::lean_channel_affine_relu_backward(y, scale, dy, false).0);
        }
    }
}

/// `y = max(x · scale + shift + r, 0)`: `g = dy where y > 0`, `dx = g · scale`, `dr = g`.
#[derive(Debug)]
struct AffineAddReluBackward;

impl<B: LeanBackend> Backward<B, 2> for AffineAddReluBackward {
    type State = (Prim<B>, Prim<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (y, scale) = ops.state;
        let [node_x, node_r] = ops.parents;
        match (node_x, node_r) {
            (Some(nx), Some(nr)) => {
                let (dx, g) = B::lean_channel_affine_relu_backward(y, scale, dy, true);
                grads.register::<B>(nx.id, dx);
                grads.register::<B>(nr.id, g.expect("asked for"));
            }
            (Some(nx), None) => grads.register::<B>(nx.id, B::lean_channel_affine_relu_backward(y, scale, dy, false).0),
            (None, Some(nr)) => grads.register::<B>(nr.id, B::lean_relu_backward(y, dy)),
            (None, None) => {}
        }
    }
}

/// [`LeanBackend::lean_channel_affine_relu`] on `Autodiff<B, C>`: with constant `scale` and
/// `shift` one node keeping the output and the scale ([`AffineReluBackward`],
/// [`AffineAddReluBackward`]), otherwise the composed ops.
pub(super) fn channel_affine_relu_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, scale: Prim<Autodiff<B, C>>, shift: Prim<Autodiff<B, C>>, residual: Option<Prim<Autodiff<B, C>>>) -> Prim<Autodiff<B, C>> {
    if !(scale.node.requirement.is_none() && shift.node.requirement.is_none()) {
        return burn_kernels::channel_affine_relu::<Autodiff<B, C>>(x, scale, shift, residual);
    }
    match residual {
        None => affine_relu_finish::<B, C, _, 1>(AffineReluBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful(), x.primitive, scale.primitive, shift.primitive, None),
        Some(r) => affine_relu_finish::<B, C, _, 2>(AffineAddReluBackward.prepare::<C>([x.node.clone(), r.node.clone()]).compute_bound().stateful(), x.primitive, scale.primitive, shift.primitive, Some(r.primitive)),
    }
}

/// The forward of [`channel_affine_relu_node`] for either node, keeping `(output, scale)` where
/// it is tracked.
fn affine_relu_finish<B: LeanBackend, C: CheckpointStrategy, BO: Backward<B, N, State = (Prim<B>, Prim<B>)>, const N: usize>(kind: OpsKind<BO, B, (Prim<B>, Prim<B>), C, N>, x: Prim<B>, scale: Prim<B>, shift: Prim<B>, residual: Option<Prim<B>>) -> Prim<Autodiff<B, C>> {
    match kind {
        OpsKind::Tracked(prep) => {
            let y = B::lean_channel_affine_relu(x, scale.clone(), shift, residual);
            prep.finish((y.clone(), scale), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::lean_channel_affine_relu(x, scale, shift, residual)),
    }
}

/// FiLM, `y = x · scale + shift` with `(scale, shift)` the halves of `embed (+ bias)`, parents
/// `[x, embed]` or `[x, embed, bias]`: `dx = dy · scale`, `dembed = [Σ_t dy · x, Σ_t dy]`,
/// `dbias = Σ_b dembed`. Keeps `embed` and the bias (for `dx`) and `x` only where `embed` or the
/// bias takes a gradient: what Burn's multiply node keeps of the composed ops.
#[derive(Debug)]
struct FilmBackward<const N: usize>;

impl<B: LeanBackend, const N: usize> Backward<B, N> for FilmBackward<N> {
    type State = (Option<Prim<B>>, Prim<B>, Option<Prim<B>>);

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (x, embed, bias) = ops.state;
        let ids = ops.parents.map(|n| n.map(|n| n.id));
        let (node_x, node_e, node_b) = (ids[0], ids[1], ids.get(2).copied().flatten());
        // `x` is kept only where the embedding or the bias takes a gradient (`film_node`).
        if let Some(x) = x {
            let (de, db) = B::lean_film_embed_backward(x, dy.clone(), node_b.is_some());
            if let Some(id) = node_e {
                grads.register::<B>(id, de);
            }
            if let (Some(id), Some(db)) = (node_b, db) {
                grads.register::<B>(id, db);
            }
        }
        if let Some(id) = node_x {
            grads.register::<B>(id, B::lean_film_x_backward(embed, bias, dy));
        }
    }
}

/// [`LeanBackend::lean_film`] on `Autodiff<B, C>` as one node ([`FilmBackward`]).
pub(super) fn film_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, embed: Prim<Autodiff<B, C>>, bias: Option<Prim<Autodiff<B, C>>>) -> Prim<Autodiff<B, C>> {
    let grads_from_x = !embed.node.requirement.is_none() || bias.as_ref().is_some_and(|b| !b.node.requirement.is_none());
    match bias {
        None => match FilmBackward::<2>.prepare::<C>([x.node.clone(), embed.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::lean_film(x.primitive.clone(), embed.primitive.clone(), None);
                prep.finish((grads_from_x.then_some(x.primitive), embed.primitive, None), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::lean_film(x.primitive, embed.primitive, None)),
        },
        Some(b) => match FilmBackward::<3>.prepare::<C>([x.node.clone(), embed.node.clone(), b.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::lean_film(x.primitive.clone(), embed.primitive.clone(), Some(b.primitive.clone()));
                prep.finish((grads_from_x.then_some(x.primitive), embed.primitive, Some(b.primitive)), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::lean_film(x.primitive, embed.primitive, Some(b.primitive))),
        },
    }
}

/// Linear upsampling: the backward needs only the axis and factor.
#[derive(Debug)]
struct UpsampleBackward;

impl<B: LeanBackend> Backward<B, 1> for UpsampleBackward {
    type State = (usize, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (dim, scale) = ops.state;
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::lean_upsample_linear_backward(dy, dim, scale));
        }
    }
}

/// [`LeanBackend::lean_upsample_linear`] on `Autodiff<B, C>`: one node keeping nothing.
pub(super) fn upsample_linear_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, dim: usize, scale: usize) -> Prim<Autodiff<B, C>> {
    match UpsampleBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((dim, scale), B::lean_upsample_linear(x.primitive, dim, scale)),
        OpsKind::UnTracked(prep) => prep.finish(B::lean_upsample_linear(x.primitive, dim, scale)),
    }
}

/// `y = x + bias` along the last axis: `dx = dy`, `dbias = Σ dy` over every axis but the last.
#[derive(Debug)]
struct BiasAddBackward;

impl<B: LeanBackend> Backward<B, 2> for BiasAddBackward {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let [node_x, node_b] = ops.parents;
        if let Some(node) = node_b {
            let last = dy.shape().num_dims() - 1;
            grads.register::<B>(node.id, B::lean_channel_sum(dy.clone(), last));
        }
        if let Some(node) = node_x {
            grads.register::<B>(node.id, dy);
        }
    }
}

/// [`LeanBackend::lean_bias_add`] on `Autodiff<B, C>`: one node keeping nothing.
pub(super) fn bias_add_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, bias: Prim<Autodiff<B, C>>) -> Prim<Autodiff<B, C>> {
    match BiasAddBackward.prepare::<C>([x.node.clone(), bias.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((), B::lean_bias_add(x.primitive, bias.primitive)),
        OpsKind::UnTracked(prep) => prep.finish(B::lean_bias_add(x.primitive, bias.primitive)),
    }
}

/// `y = mean(x)`: `dx = dy / n` everywhere (`dy` broadcast over a tensor of ones, in `x`'s
/// shape and `dy`'s dtype, as Burn's `mean_dim` backward writes its gradient).
#[derive(Debug)]
struct MeanAllBackward;

impl<B: LeanBackend> Backward<B, 1> for MeanAllBackward {
    type State = Shape;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            let shape = ops.state;
            let n = shape.num_elements().max(1);
            let dtype = dy.dtype();
            let g = B::float_mul_scalar(B::float_reshape(dy, Shape::from(vec![1; shape.num_dims()])), (1.0 / n as f64).into());
            let ones = B::float_ones(shape, &B::float_device(&g), dtype.into());
            grads.register::<B>(node.id, B::float_mul(ones, g));
        }
    }
}

/// [`LeanBackend::lean_mean_all`] on `Autodiff<B, C>`: one node keeping the shape.
pub(super) fn mean_all_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>) -> Prim<Autodiff<B, C>> {
    match MeanAllBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let shape = x.primitive.shape();
            prep.finish(shape, B::lean_mean_all(x.primitive))
        }
        OpsKind::UnTracked(prep) => prep.finish(B::lean_mean_all(x.primitive)),
    }
}

/// Dropout with fixed flags: `dx` is the same dropout of `dy` (the flags recomputed).
#[derive(Debug)]
struct DropoutBackward;

impl<B: LeanBackend> Backward<B, 1> for DropoutBackward {
    type State = (u64, u64, f64);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            let (base, threshold, scale) = ops.state;
            grads.register::<B>(node.id, B::lean_dropout(dy, base, threshold, scale));
        }
    }
}

/// [`LeanBackend::lean_dropout`] on `Autodiff<B, C>`: one node keeping the hash base, the
/// threshold and the scale.
pub(super) fn dropout_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, base: u64, threshold: u64, scale: f64) -> Prim<Autodiff<B, C>> {
    match DropoutBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((base, threshold, scale), B::lean_dropout(x.primitive, base, threshold, scale)),
        OpsKind::UnTracked(prep) => prep.finish(B::lean_dropout(x.primitive, base, threshold, scale)),
    }
}

/// Hands `g`, the gradient of `x + bias`, to `x` and its sum over every axis but the last to the
/// bias (each where tracked; a node without a bias passes `None`), as the bias node does.
fn register_x_and_bias<B: LeanBackend>(grads: &mut Gradients, x: Option<NodeId>, bias: Option<NodeId>, g: Prim<B>) {
    if let Some(id) = bias {
        let last = g.shape().num_dims() - 1;
        grads.register::<B>(id, B::lean_channel_sum(g.clone(), last));
    }
    if let Some(id) = x {
        grads.register::<B>(id, g);
    }
}

/// `residual + dropout(x (+ bias))`, parents `[x, residual]` or `[x, residual, bias]`: `dx` the
/// dropout of `dy` (the flags recomputed), `dbias` its sum over every axis but the last,
/// `dresidual = dy`.
#[derive(Debug)]
struct DropoutAddBackward<const N: usize>;

impl<B: LeanBackend, const N: usize> Backward<B, N> for DropoutAddBackward<N> {
    type State = (u64, u64, f64);

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (base, threshold, scale) = ops.state;
        let ids = ops.parents.map(|n| n.map(|n| n.id));
        let (x, r, bias) = (ids[0], ids[1], ids.get(2).copied().flatten());
        if x.is_some() || bias.is_some() {
            register_x_and_bias::<B>(grads, x, bias, B::lean_dropout(dy.clone(), base, threshold, scale));
        }
        if let Some(id) = r {
            grads.register::<B>(id, dy);
        }
    }
}

/// [`LeanBackend::lean_dropout_add`] on `Autodiff<B, C>`: one node keeping the hash base, the
/// threshold and the scale.
pub(super) fn dropout_add_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, residual: Prim<Autodiff<B, C>>, bias: Option<Prim<Autodiff<B, C>>>, base: u64, threshold: u64, scale: f64) -> Prim<Autodiff<B, C>> {
    let state = (base, threshold, scale);
    let forward = |x: Prim<B>, r: Prim<B>, b: Option<Prim<B>>| B::lean_dropout_add(x, r, b, base, threshold, scale);
    match bias {
        None => match DropoutAddBackward::<2>.prepare::<C>([x.node.clone(), residual.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(state, forward(x.primitive, residual.primitive, None)),
            OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, residual.primitive, None)),
        },
        Some(b) => match DropoutAddBackward::<3>.prepare::<C>([x.node.clone(), residual.node.clone(), b.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(state, forward(x.primitive, residual.primitive, Some(b.primitive))),
            OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, residual.primitive, Some(b.primitive))),
        },
    }
}

/// `dropout(relu(x (+ bias)))` from its output, parents `[x]` or `[x, bias]`: `dx = dy · scale`
/// where `y > 0` (the element kept and its input positive), else 0, no flags redrawn; `dbias` its
/// sum over every axis but the last.
#[derive(Debug)]
struct ReluDropoutBackward<const N: usize>;

impl<B: LeanBackend, const N: usize> Backward<B, N> for ReluDropoutBackward<N> {
    type State = (Prim<B>, f64);

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let ids = ops.parents.map(|n| n.map(|n| n.id));
        let (x, bias) = (ids[0], ids.get(1).copied().flatten());
        if x.is_some() || bias.is_some() {
            let (y, scale) = ops.state;
            register_x_and_bias::<B>(grads, x, bias, B::lean_relu_dropout_backward(y, dy, scale));
        }
    }
}

/// [`LeanBackend::lean_relu_dropout`] on `Autodiff<B, C>`: one node keeping its output (what the
/// next linear layer keeps as its input) and the scale.
pub(super) fn relu_dropout_node<B: LeanBackend, C: CheckpointStrategy>(x: Prim<Autodiff<B, C>>, bias: Option<Prim<Autodiff<B, C>>>, base: u64, threshold: u64, scale: f64) -> Prim<Autodiff<B, C>> {
    let forward = |x: Prim<B>, b: Option<Prim<B>>| B::lean_relu_dropout(x, b, base, threshold, scale);
    match bias {
        None => match ReluDropoutBackward::<1>.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = forward(x.primitive, None);
                prep.finish((y.clone(), scale), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, None)),
        },
        Some(b) => match ReluDropoutBackward::<2>.prepare::<C>([x.node.clone(), b.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = forward(x.primitive, Some(b.primitive));
                prep.finish((y.clone(), scale), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, Some(b.primitive))),
        },
    }
}

/// [`LeanBackend::lean_upsample_linear`] of Burn ops: two `select`s weighted and added.
pub(super) fn upsample_linear_composed<B: Backend>(x: Prim<B>, dim: usize, scale: usize) -> Prim<B> {
    let dims = dims_of::<B>(&x);
    let x: Tensor<B, 5> = view(x, pad5(&dims));
    let dim = dim + 5 - dims.len();
    let (i0, i1, lambda) = linear_source_indices(x.dims()[dim], scale);
    let n_out = lambda.len();
    let device = x.device();
    let index = |v: Vec<i64>| Tensor::<B, 1, Int>::from_data(TensorData::new(v, [n_out]), &device);
    // Weights broadcast along every axis but `dim`, in x's dtype (0.25 / 0.75 etc. are exact
    // in bf16 and f16 for the factor 2 the VAE uses).
    let mut wshape = [1usize; 5];
    wshape[dim] = n_out;
    let weight = |w: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(w, [n_out]), &device).reshape(wshape).cast(x.dtype());
    let w0 = weight(lambda.iter().map(|l| 1.0 - l).collect());
    let w1 = weight(lambda);
    let lo = x.clone().select(dim, index(i0));
    let hi = x.select(dim, index(i1));
    let mut out = dims.clone();
    out[dim + dims.len() - 5] = n_out;
    unview(lo * w0 + hi * w1, &out)
}

/// The backward of [`upsample_linear_composed`]: each output row added into its two sources.
pub(super) fn upsample_linear_backward_composed<B: Backend>(dy: Prim<B>, dim: usize, scale: usize) -> Prim<B> {
    use burn::tensor::IndexingUpdateOp;
    let dims = dims_of::<B>(&dy);
    let dy: Tensor<B, 5> = view(dy, pad5(&dims));
    let dim = dim + 5 - dims.len();
    let n_in = dy.dims()[dim] / scale;
    let (i0, i1, lambda) = linear_source_indices(n_in, scale);
    let n_out = lambda.len();
    let device = dy.device();
    let index = |v: Vec<i64>| Tensor::<B, 1, Int>::from_data(TensorData::new(v, [n_out]), &device);
    let mut wshape = [1usize; 5];
    wshape[dim] = n_out;
    let dt = dy.dtype();
    let weight = |w: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(w, [n_out]), &device).reshape(wshape).cast(dt);
    let mut zeros = dy.dims();
    zeros[dim] = n_in;
    let dx = Tensor::<B, 5>::zeros(zeros, &device).cast(dt);
    let dx = dx.select_assign(dim, index(i0), dy.clone() * weight(lambda.iter().map(|l| 1.0 - l).collect()), IndexingUpdateOp::Add);
    let dx = dx.select_assign(dim, index(i1), dy * weight(lambda), IndexingUpdateOp::Add);
    let mut out = dims.clone();
    out[dim + dims.len() - 5] = n_in;
    unview(dx, &out)
}

/// Dims padded with leading 1s to rank 5.
fn pad5(dims: &[usize]) -> [usize; 5] {
    let mut out = [1usize; 5];
    out[5 - dims.len()..].copy_from_slice(dims);
    out
}

/// [`LeanBackend::lean_upsample_linear`] on tensors (rank ≤ 5).
pub fn upsample_linear<B: LeanBackend, const D: usize>(x: Tensor<B, D>, dim: usize, scale: usize) -> Tensor<B, D> {
    t(B::lean_upsample_linear(p(x), dim, scale))
}

/// [`LeanBackend::lean_softmax`] on a tensor.
pub fn softmax<B: LeanBackend, const D: usize>(x: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    t(B::lean_softmax(p(x), dim))
}

/// [`LeanBackend::lean_mean_all`] on tensors: the mean of every element, `[1]`.
pub fn mean_all<B: LeanBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, 1> {
    t(B::lean_mean_all(p(x)))
}

/// [`LeanBackend::lean_bias_add`] on tensors: `x + bias` along the last axis.
pub fn bias_add<B: LeanBackend, const D: usize>(x: Tensor<B, D>, bias: Tensor<B, 1>) -> Tensor<B, D> {
    t(B::lean_bias_add(p(x), p(bias)))
}

/// [`LeanBackend::lean_channel_affine`] on tensors.
pub fn channel_affine<B: LeanBackend, const D: usize>(x: Tensor<B, D>, scale: Tensor<B, 1>, shift: Option<Tensor<B, 1>>) -> Tensor<B, D> {
    t(B::lean_channel_affine(p(x), p(scale), shift.map(p)))
}

/// [`LeanBackend::lean_channel_affine_relu`] on tensors: `max(x · scale + shift (+ residual), 0)`.
pub fn channel_affine_relu<B: LeanBackend, const D: usize>(x: Tensor<B, D>, scale: Tensor<B, 1>, shift: Tensor<B, 1>, residual: Option<Tensor<B, D>>) -> Tensor<B, D> {
    t(B::lean_channel_affine_relu(p(x), p(scale), p(shift), residual.map(p)))
}

/// [`LeanBackend::lean_film`] on tensors: `x · e[:, :c, None] + e[:, c:, None]` for `x: [b, c,
/// t]`, `e = embed + bias`, `embed: [b, 2c]` and the bias `[2c]` of the linear layer that made
/// `embed` ([`crate::nn::Linear::forward_parts`]), where it has one. Where FiLM is one node
/// (CubeCL) the bias joins it; else it is added by its own node first, as the layer would.
pub fn film<B: LeanBackend>(x: Tensor<B, 3>, embed: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Tensor<B, 3> {
    t(B::lean_film(p(x), p(embed), bias.map(p)))
}

/// [`LeanBackend::lean_frozen_scale_shift`] on tensors: `(scale, shift)`.
pub fn frozen_scale_shift<B: LeanBackend>(weight: Tensor<B, 1>, bias: Tensor<B, 1>, mean: Tensor<B, 1>, var: Tensor<B, 1>, eps: f64) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let (scale, shift) = B::lean_frozen_scale_shift(p(weight), p(bias), p(mean), p(var), eps);
    (t(scale), t(shift))
}

/// [`LeanBackend::lean_relu`] on a tensor.
pub fn relu<B: LeanBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    t(B::lean_relu(p(x)))
}

/// [`LeanBackend::lean_silu`] on a tensor.
pub fn silu<B: LeanBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    t(B::lean_silu(p(x)))
}

/// [`LeanBackend::lean_mish`] on a tensor.
pub fn mish<B: LeanBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    t(B::lean_mish(p(x)))
}

/// FiLM on `Autodiff<B>` through [`film_node`] (`node`) or the composed ops (the bias through
/// its own node first, as the linear layer adds it), whichever: the output, `dx`, `dembed` and
/// (`bias`) `dbias` of `sum(film(x, embed, bias) · r)` for `x: dims` (`x_layout` applied to the
/// inner `x` first, so a test can store it channels last), `embed: [b, 2c]` and the bias `[2c]`,
/// drawn from `seed`.
#[cfg(test)]
pub(super) fn film_grads<B: LeanBackend>(dims: [usize; 3], seed: u64, node: bool, bias: bool, x_layout: impl Fn(Prim<B>) -> Prim<B>) -> Vec<(&'static str, Vec<f32>)> {
    use super::tests::{random, vals};
    let x0: Tensor<B, 3> = random(dims, seed);
    let e0: Tensor<B, 2> = random([dims[0], 2 * dims[1]], seed + 1);
    let r: Tensor<Autodiff<B>, 3> = random(dims, seed + 2);
    let b0: Tensor<B, 1> = random([2 * dims[1]], seed + 3);
    let x = Tensor::<Autodiff<B>, 3>::from_inner(t(x_layout(p(x0)))).require_grad();
    let e = Tensor::<Autodiff<B>, 2>::from_inner(e0).require_grad();
    let b = bias.then(|| Tensor::<Autodiff<B>, 1>::from_inner(b0).require_grad());
    let y: Tensor<Autodiff<B>, 3> = if node {
        t(film_node::<B, burn::backend::autodiff::checkpoint::strategy::NoCheckpointing>(p(x.clone()), p(e.clone()), b.clone().map(p)))
    } else {
        let e = match b.clone() {
            Some(b) => bias_add(e.clone(), b),
            None => e.clone(),
        };
        t(burn_kernels::film::<Autodiff<B>>(p(x.clone()), p(e), None))
    };
    let out = vals(y.clone());
    let g = (y * r).sum().backward();
    let mut got = vec![("output", out), ("dx", vals(x.grad(&g).expect("x takes a gradient"))), ("dembed", vals(e.grad(&g).expect("embed takes a gradient")))];
    if let Some(b) = b {
        got.push(("dbias", vals(b.grad(&g).expect("the bias takes a gradient"))));
    }
    got
}

/// The frozen batch norm + ReLU (+ residual) on `Autodiff<B>` through [`channel_affine_relu_node`]
/// (`node`) or the composed ops: the output, `dx` and (`residual`) `dr` of `sum(y · r)` for `x:
/// dims` (`x_layout` applied to the inner `x` and residual first, so a test can store them
/// channels last), constant `scale`, `shift`, from `seed`. On channel 0 every fifth element of
/// the pre-activation is exactly 0 (`x`, the residual and the shift are): the ReLU's boundary.
#[cfg(test)]
pub(super) fn affine_relu_grads<B: LeanBackend>(dims: [usize; 4], seed: u64, residual: bool, node: bool, x_layout: impl Fn(Prim<B>) -> Prim<B>) -> Vec<(&'static str, Vec<f32>)> {
    use super::tests::{random, vals};
    type AD<B> = Autodiff<B>;
    let c = dims[1];
    let x0: Tensor<B, 4> = random(dims, seed);
    let scale: Tensor<B, 1> = random([c], seed + 1);
    let shift: Tensor<B, 1> = random([c], seed + 2);
    // x and the residual 0 where (flat index) % 5 == 0, shift 0 on channel 0: the
    // pre-activation is 0 there.
    let n: usize = dims.iter().product();
    let zero = Tensor::<B, 1, Int>::arange(0..n as i64, &x0.device()).remainder_scalar(5).equal_elem(0).reshape(dims);
    let x0 = x0.mask_fill(zero.clone(), 0.0);
    let first = Tensor::<B, 1, Int>::arange(0..c as i64, &x0.device()).equal_elem(0);
    let shift = shift.mask_fill(first, 0.0);
    let r0: Tensor<B, 4> = random::<B, 4>(dims, seed + 3).mask_fill(zero, 0.0);
    let w: Tensor<AD<B>, 4> = random(dims, seed + 4);
    let x = Tensor::<AD<B>, 4>::from_inner(t(x_layout(p(x0)))).require_grad();
    let r = residual.then(|| Tensor::<AD<B>, 4>::from_inner(t(x_layout(p(r0)))).require_grad());
    let (s, b) = (Tensor::<AD<B>, 1>::from_inner(scale), Tensor::<AD<B>, 1>::from_inner(shift));
    let y: Tensor<AD<B>, 4> = if node {
        t(channel_affine_relu_node::<B, burn::backend::autodiff::checkpoint::strategy::NoCheckpointing>(p(x.clone()), p(s), p(b), r.clone().map(p)))
    } else {
        t(burn_kernels::channel_affine_relu::<AD<B>>(p(x.clone()), p(s), p(b), r.clone().map(p)))
    };
    let out = vals(y.clone());
    let g = (y * w).sum().backward();
    let mut v = vec![("output", out), ("dx", vals(x.grad(&g).expect("x takes a gradient")))];
    if let Some(r) = r {
        v.push(("dresidual", vals(r.grad(&g).expect("the residual takes a gradient"))));
    }
    v
}

#[cfg(test)]
mod tests {
    use burn::prelude::*;
    use burn::tensor::activation::silu as burn_silu;

    use super::super::tests::{A, check, random, rel, vals};

    #[test]
    fn activation_backwards_equal_autodiff_of_the_composed_forward() {
        // The affine parameters only scale and shift the input here, so the check also covers
        // them; `params` = last axis.
        let affine = |x: Tensor<A, 3>, w: Tensor<A, 1>, b: Tensor<A, 1>| x * w.reshape([1, 1, 6]) + b.reshape([1, 1, 6]);
        check::<A, 3>([4, 5, 6], 6, move |x, w, b| super::silu(affine(x, w, b)), move |x, w, b| burn_silu(affine(x, w, b)), 1e-5);
        let mish_plain = |x: Tensor<A, 3>| {
            let sp = burn::tensor::activation::relu(x.clone()) + x.clone().abs().neg().exp().log1p();
            x * sp.tanh()
        };
        check::<A, 3>([4, 5, 6], 6, move |x, w, b| super::mish(affine(x, w, b) * 3.0), move |x, w, b| mish_plain(affine(x, w, b) * 3.0), 1e-5);
        check::<A, 3>([4, 5, 6], 6, move |x, w, b| super::relu(affine(x, w, b)), move |x, w, b| burn::tensor::activation::relu(affine(x, w, b)), 0.0);
        // Softmax over the parameters' axis (last, then moved to the middle): a bias along
        // any other axis would get a zero gradient (each softmax row's gradient sums to 0).
        check::<A, 3>([4, 5, 6], 6, move |x, w, b| super::softmax(affine(x, w, b) * 2.0, 2), move |x, w, b| burn::tensor::activation::softmax(affine(x, w, b) * 2.0, 2), 1e-5);
        check::<A, 3>([4, 5, 6], 6, move |x, w, b| super::softmax(affine(x, w, b).swap_dims(1, 2) * 2.0, 1).swap_dims(1, 2), move |x, w, b| burn::tensor::activation::softmax(affine(x, w, b).swap_dims(1, 2) * 2.0, 1).swap_dims(1, 2), 1e-5);
    }

    /// Linear upsampling's node (flex kernels) against autodiff of the composed selects, on
    /// every axis of a 5-D tensor, factor 2 (the VAE's) and 3.
    #[test]
    fn upsample_linear_equals_the_composed_ops() {
        let x0: Tensor<A, 5> = random([2, 3, 4, 5, 6], 7);
        for (dim, scale) in [(2, 2), (3, 2), (4, 2), (4, 3), (1, 2)] {
            let mut out = x0.dims();
            out[dim] *= scale;
            let r: Tensor<A, 5> = random(out, 8);
            let run = |lean: bool| {
                let x = x0.clone().require_grad();
                let y = if lean { super::upsample_linear(x.clone(), dim, scale) } else { Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(super::upsample_linear_composed::<A>(x.clone().into_primitive().tensor(), dim, scale))) };
                let out = vals(y.clone());
                let g = (y * r.clone()).sum().backward();
                (out, vals(x.grad(&g).unwrap()))
            };
            let ((lo, lx), (po, px)) = (run(true), run(false));
            assert!(rel(&lo, &po) <= 1e-6 && rel(&lx, &px) <= 1e-5, "dim {dim} scale {scale}");
        }
    }

    /// The bias node against Burn's broadcast add (output, dx, dbias), on rank 2 and 3, with
    /// the bias trainable or constant and with `x` constant; and `linear_rows` (matmul node
    /// + bias node) against Burn's `linear` with its bias.
    #[test]
    fn bias_add_equals_burns_broadcast_add() {
        fn case<const D: usize>(dims: [usize; D], x_tracked: bool, b_tracked: bool) {
            let d = dims[D - 1];
            let mut bshape = [1; D];
            bshape[D - 1] = d;
            let run = |lean: bool| {
                let (x0, b0, r): (Tensor<A, D>, Tensor<A, 1>, Tensor<A, D>) = (random(dims, 21), random([d], 22), random(dims, 23));
                let x = if x_tracked { x0.require_grad() } else { x0 };
                let b = if b_tracked { b0.require_grad() } else { b0 };
                let y = if lean { super::bias_add(x.clone(), b.clone()) } else { x.clone() + b.clone().reshape(bshape) };
                let out = vals(y.clone());
                let g = (y * r).sum().backward();
                (out, x.grad(&g).map(vals), b.grad(&g).map(vals))
            };
            let ((lo, lx, lb), (po, px, pb)) = (run(true), run(false));
            assert_eq!((lx.is_some(), lb.is_some()), (x_tracked, b_tracked), "{dims:?}");
            assert!(rel(&lo, &po) <= 1e-6, "{dims:?} output");
            for (name, a, b) in [("dx", lx, px), ("dbias", lb, pb)] {
                if let (Some(a), Some(b)) = (a, b) {
                    assert!(rel(&a, &b) <= 1e-6, "{dims:?} {name}");
                }
            }
        }
        case([7, 5], true, true);
        case([3, 4, 6], true, true);
        case([3, 4, 6], false, true);
        case([3, 4, 6], true, false);
        let x0: Tensor<A, 3> = random([2, 9, 6], 24);
        let (w0, b0): (Tensor<A, 2>, Tensor<A, 1>) = (random([6, 4], 25), random([4], 26));
        let r: Tensor<A, 3> = random([2, 9, 4], 27);
        let run = |ours: bool| {
            let (x, w, b) = (x0.clone().require_grad(), w0.clone().require_grad(), b0.clone().require_grad());
            let y = if ours { crate::nn::linear::linear_rows(x.clone(), w.clone(), Some(b.clone())) } else { burn::tensor::module::linear(x.clone(), w.clone(), Some(b.clone())) };
            let g = (y.clone() * r.clone()).sum().backward();
            [vals(y), vals(x.grad(&g).unwrap()), vals(w.grad(&g).unwrap()), vals(b.grad(&g).unwrap())]
        };
        for ((name, a), b) in ["output", "dx", "dweight", "dbias"].into_iter().zip(run(true)).zip(run(false)) {
            assert!(rel(&a, &b) <= 1e-5, "linear_rows {name}: {:e}", rel(&a, &b));
        }
    }

    /// The mean node against Burn's `mean_dim` chain: value and gradient, ranks 3 and 5.
    #[test]
    fn mean_all_equals_burns_mean() {
        fn case<const D: usize>(dims: [usize; D]) {
            let (x0, r): (Tensor<A, D>, Tensor<A, 1>) = (random(dims, 31), random([1], 32));
            let run = |lean: bool| {
                let x = x0.clone().require_grad();
                let m = if lean { super::mean_all(x.clone()) } else { x.clone().mean() };
                let g = (m.clone() * r.clone()).sum().backward();
                (vals(m), vals(x.grad(&g).unwrap()))
            };
            let ((lm, lx), (pm, px)) = (run(true), run(false));
            assert!(rel(&lm, &pm) <= 1e-5 && rel(&lx, &px) <= 1e-6, "{dims:?}: {lm:?} vs {pm:?}");
        }
        case([3, 4, 5]);
        case([2, 3, 4, 5, 6]);
    }

    /// The channel affine with constant scale and shift (frozen batch norm's node, which keeps
    /// only the scale) and with a trainable scale (the composed ops) against the composed ops.
    #[test]
    fn channel_affine_equals_the_composed_ops() {
        for trainable in [false, true] {
            let x0: Tensor<A, 4> = random([3, 5, 4, 6], 1);
            let (s0, b0): (Tensor<A, 1>, Tensor<A, 1>) = (random([5], 2), random([5], 3));
            let r: Tensor<A, 4> = random([3, 5, 4, 6], 4);
            let run = |lean: bool| {
                let x = x0.clone().require_grad();
                let (s, b) = if trainable { (s0.clone().require_grad(), b0.clone().require_grad()) } else { (s0.clone(), b0.clone()) };
                let y = if lean { super::channel_affine(x.clone(), s.clone(), Some(b.clone())) } else { x.clone() * s.clone().reshape([1, 5, 1, 1]) + b.clone().reshape([1, 5, 1, 1]) };
                let out = vals(y.clone());
                let g = (y * r.clone()).sum().backward();
                let gs = if trainable { vals(s.grad(&g).unwrap()) } else { Vec::new() };
                (out, vals(x.grad(&g).unwrap()), gs)
            };
            let (lo, lx, ls) = run(true);
            let (po, px, ps) = run(false);
            assert!(rel(&lo, &po) <= 1e-6 && rel(&lx, &px) <= 1e-6, "trainable {trainable}");
            if trainable {
                assert!(rel(&ls, &ps) <= 1e-5);
            }
        }
    }

    /// The FiLM node (what CubeCL backends take on autodiff; flex keeps the composed ops, which
    /// `lean_film` on `A` must equal exactly) against autodiff of the composed ops: output, `dx`,
    /// the `[b, 2c]` embedding's gradient and, with the linear layer's bias in the node, the
    /// bias's, on ragged shapes.
    #[test]
    fn film_node_equals_autodiff_of_the_composed_ops() {
        use super::super::tests::all_close;
        use burn::backend::Flex;
        for (i, dims) in [[3, 5, 7], [1, 4, 16], [2, 9, 1]].into_iter().enumerate() {
            let seed = 10 * i as u64;
            for bias in [false, true] {
                let plain = super::film_grads::<Flex>(dims, seed, false, bias, |x| x);
                all_close(&format!("node {dims:?} bias {bias}"), super::film_grads::<Flex>(dims, seed, true, bias, |x| x), plain, 1e-6);
            }
            // flex takes the composed ops, the very ones: the bias's node, the multiply, the add.
            let x: Tensor<A, 3> = random(dims, seed);
            let e: Tensor<A, 2> = random([dims[0], 2 * dims[1]], seed + 1);
            let bias: Tensor<A, 1> = random([2 * dims[1]], seed + 3);
            let halves = |e: Tensor<A, 2>| (e.clone().unsqueeze_dim::<3>(2).narrow(1, 0, dims[1]), e.unsqueeze_dim::<3>(2).narrow(1, dims[1], dims[1]));
            let (s, b) = halves(e.clone());
            assert_eq!(vals(super::film(x.clone(), e.clone(), None)), vals(s * x.clone() + b), "{dims:?}: flex's lean_film is the composed ops");
            let (s, b) = halves(super::bias_add(e.clone(), bias.clone()));
            assert_eq!(vals(super::film(x.clone(), e, Some(bias))), vals(s * x + b), "{dims:?}: with the bias, flex adds it by its node first");
        }
    }

    /// The frozen batch norm + ReLU node (what CubeCL backends take; flex keeps the separate
    /// nodes) on flex against autodiff of the composed affine, add and ReLU: output, `dx` and the
    /// residual's gradient, with and without the residual, zeros of the pre-activation included.
    #[test]
    fn affine_relu_node_equals_autodiff_of_the_composed_ops() {
        use super::super::tests::all_close;
        use burn::backend::Flex;
        for (i, dims) in [[2, 3, 5, 7], [1, 4, 1, 9]].into_iter().enumerate() {
            for residual in [false, true] {
                let seed = 10 * i as u64;
                let plain = super::affine_relu_grads::<Flex>(dims, seed, residual, false, |x| x);
                all_close(&format!("node {dims:?} residual {residual}"), super::affine_relu_grads::<Flex>(dims, seed, residual, true, |x| x), plain, 1e-6);
            }
        }
        assert!(!<A as super::LeanBackend>::lean_affine_relu_fuses(), "flex keeps the separate nodes");
    }

    /// Linear upsampling of a bf16 tensor (flex's bf16 kernel) against the f32 composed ops on
    /// the same values: output and input gradient within bf16 rounding, dtypes kept.
    #[test]
    fn bf16_upsample_matches_f32_within_rounding() {
        use burn::tensor::FloatDType;
        let x16: Tensor<A, 5> = random([2, 3, 4, 5, 6], 41).cast(FloatDType::BF16);
        for (dim, scale) in [(2, 2), (4, 2), (3, 3)] {
            let mut out = x16.dims();
            out[dim] *= scale;
            let r: Tensor<A, 5> = random(out, 42);
            let run = |x: Tensor<A, 5>, lean: bool| {
                let x = x.require_grad();
                let y = if lean { super::upsample_linear(x.clone(), dim, scale) } else { Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(super::upsample_linear_composed::<A>(x.clone().into_primitive().tensor(), dim, scale))) };
                let dtype = y.dtype();
                let y = y.cast(FloatDType::F32);
                let out = vals(y.clone());
                let g = (y * r.clone()).sum().backward();
                (dtype, out, vals(x.grad(&g).unwrap().cast(FloatDType::F32)))
            };
            let ((dt, lo, lx), (_, po, px)) = (run(x16.clone(), true), run(x16.clone().cast(FloatDType::F32), false));
            assert_eq!(dt, burn::tensor::DType::BF16, "dim {dim}: bf16 in, bf16 out");
            assert!(rel(&lo, &po) <= 1e-2 && rel(&lx, &px) <= 1e-2, "dim {dim} scale {scale}: output {} dx {}", rel(&lo, &po), rel(&lx, &px));
        }
    }
}
