//! Multi-head attention from the packed in-projection to the merged heads (everything of
//! `nn.MultiheadAttention` but `out_proj`) as one autodiff node.
//!
//! Composed of Burn ops, each of the three projections slices `in_proj_weight` `[3d, d]` and
//! `in_proj_bias` `[3d]`, and Burn's backward of a slice is a zero fill of the whole tensor plus
//! a slice assign, the three slices' gradients then added: 16 kernel launches per attention
//! module on a GPU for two small gradients. The node's backward writes each as one
//! concatenation of its three parts ([`LeanBackend::lean_cat3`]: one launch on CubeCL). It keeps
//! as many bytes as the composed ops kept (the projections' inputs in the compute dtype, `q`
//! (unscaled, where PyTorch's autograd keeps it scaled), `k`, `v` and the softmax output) but
//! not the dropped-out attention weights nor a dropout mask: the backward redraws the flags (the
//! same hash, so the same elements).
//!
//! A self-attention whose query input is its key input ([`AttnArgs::shared_qk`], ACT's) projects
//! both with one product and forms that input's gradient with one, from `[dq | dk]`
//! ([`LeanBackend::lean_cat_heads`]: one launch on CubeCL).
//!
//! The forward is the composed one ([`attention_forward`], what inner backends run), so the
//! values are those of the ops it replaced, op for op. On CubeCL it is fewer launches
//! ([`LeanBackend::lean_attention_fuses`]): each projection's bias and head split in one, the
//! scale, mask, softmax and dropout in one; there the scale goes on the scores, not on `q`.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::{DType, FloatDType, TensorMetadata};

use super::{LeanBackend, Prim, matmul, p, register_parents, t};
use crate::nn::dropout::apply_drop;
use crate::nn::linear::linear_rows;
use crate::nn::{cast, to_f32};

/// What the attention node needs besides its tensors: the head count, the compute dtype of the
/// projections and products (softmax in f32), the dropout on the attention weights as
/// `(hash base, threshold, keep scale)` (`crate::nn::DropoutCtx::base_threshold`), and whether
/// the query and key inputs are one tensor (`shared_qk`: self-attention with the positions added
/// to both, as ACT's layers).
#[derive(Clone, Copy, Debug)]
pub struct AttnArgs {
    pub heads: usize,
    pub dtype: FloatDType,
    pub dropout: Option<(u64, u64, f64)>,
    /// The query input is the key input. Then `q` and `k` come from one product with the first
    /// `2d` rows of `in_proj_weight` (contiguous), and the backward forms the input's gradient
    /// with one product (`[dq | dk] · w[0:2d]`) instead of two and their sum: PyTorch's
    /// `_in_projection_packed` projects them apart (its packed path needs `k is v` too), the
    /// values are the same dot products.
    pub shared_qk: bool,
}

/// What the forward hands the backward: the three inputs in the compute dtype (what the
/// projections read; the inputs themselves in f32; with `shared_qk` the first twice, one
/// tensor), the unscaled `q` `[b, h, l, hd]`, `k` and `v` `[b, h, s, hd]` (compute dtype; with
/// `shared_qk` `q` and `k` are views of one projection), the softmax output `[b, h, l, s]` (f32).
struct Saved<B: Backend> {
    xs: [Tensor<B, 3>; 3],
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    attn: Tensor<B, 4>,
}

/// PyTorch's `multi_head_attention_forward` up to the merged heads: project (rows of `w` and
/// `b`: q, k, v), split heads, `softmax((q / √hd) kᵀ + mask)` in f32, dropout on the weights,
/// `· v`, merge heads. `mask_bias`: `[b, s]`, 0 or −∞ per key. Returns `[b, l, d]` in the
/// compute dtype. With `a.shared_qk` the caller passes one tensor as `q_in` and `k_in`.
pub(crate) fn attention_forward<B: LeanBackend>(q_in: Tensor<B, 3>, k_in: Tensor<B, 3>, v_in: Tensor<B, 3>, w: Tensor<B, 2>, b: Tensor<B, 1>, mask_bias: Option<Tensor<B, 2>>, a: AttnArgs) -> Tensor<B, 3> {
    forward(q_in, k_in, v_in, w, b, mask_bias, a).0
}

fn forward<B: LeanBackend>(q_in: Tensor<B, 3>, k_in: Tensor<B, 3>, v_in: Tensor<B, 3>, w: Tensor<B, 2>, b: Tensor<B, 1>, mask_bias: Option<Tensor<B, 2>>, a: AttnArgs) -> (Tensor<B, 3>, Saved<B>) {
    let [n, l, d] = q_in.dims();
    let s = k_in.dims()[1];
    let h = a.heads;
    let hd = d / h;
    let dt = a.dtype;
    let xs = if a.shared_qk {
        let x = cast(q_in, dt);
        [x.clone(), x, cast(v_in, dt)]
    } else {
        [q_in, k_in, v_in].map(|x| cast(x, dt))
    };
    if B::lean_attention_fuses() {
        return forward_fused(xs, w, b, mask_bias, a);
    }
    // Rows `i·d ..` of the packed weight and bias (`parts` of them).
    let project = |x: Tensor<B, 3>, i: usize, parts: usize| {
        let wi = w.clone().narrow(0, i * d, parts * d); // [parts·d, d]
        let bi = b.clone().narrow(0, i * d, parts * d);
        linear_rows(x, cast(wi, dt).transpose(), Some(cast(bi, dt)))
    };
    let heads = |x: Tensor<B, 3>, rows: usize| x.reshape([n, rows, h, hd]).swap_dims(1, 2); // [n, h, rows, hd]
    let (q, k) = if a.shared_qk {
        let qk = project(xs[0].clone(), 0, 2).reshape([n, l, 2 * h, hd]).swap_dims(1, 2); // [n, 2h, l, hd]
        (qk.clone().narrow(1, 0, h), qk.narrow(1, h, h))
    } else {
        (heads(project(xs[0].clone(), 0, 1), l), heads(project(xs[1].clone(), 1, 1), s))
    };
    let v = heads(project(xs[2].clone(), 2, 1), s);
    // PyTorch scales q before the product (q_scaled = q * hd^-1/2).
    let q_scaled = q.clone() * (hd as f64).powf(-0.5);
    let scores = to_f32(matmul(q_scaled, k.clone().swap_dims(2, 3))); // [n, h, l, s]
    let scores = match mask_bias {
        Some(bias) => scores + bias.reshape([n, 1, 1, s]),
        None => scores,
    };
    let attn = super::softmax(scores, 3); // f32; keeps only its output
    let dropped = match a.dropout {
        Some((base, threshold, scale)) => apply_drop(attn.clone(), base, threshold, scale),
        None => attn.clone(),
    };
    let out = matmul(cast(dropped, dt), v.clone()); // [n, h, l, hd]
    (out.swap_dims(1, 2).reshape([n, l, d]), Saved { xs, q, k, v, attn })
}

/// [`forward`] where the backend fuses ([`LeanBackend::lean_attention_fuses`], CubeCL): each
/// projection's product without its bias, then the bias and the split into contiguous heads in
/// one launch ([`LeanBackend::lean_attention_heads`]: the products read them without a copy);
/// `q` kept unscaled and the scale, the mask, the softmax and its dropout in one launch
/// ([`LeanBackend::lean_attention_softmax`]). The same saved tensors as [`forward`] (`q`, `k`,
/// `v` contiguous instead of views of the projections); `scale · (q kᵀ)` where PyTorch takes
/// `(scale · q) kᵀ`, equal where the scale is a power of two (head size 64: ACT's).
fn forward_fused<B: LeanBackend>(xs: [Tensor<B, 3>; 3], w: Tensor<B, 2>, b: Tensor<B, 1>, mask_bias: Option<Tensor<B, 2>>, a: AttnArgs) -> (Tensor<B, 3>, Saved<B>) {
    let [n, l, d] = xs[0].dims();
    let h = a.heads;
    let hd = d / h;
    let dt = a.dtype;
    // Rows `i·d ..` of the packed weight and bias (`parts` of them): `[parts·n, h, rows, hd]`.
    let project = |x: Tensor<B, 3>, i: usize, parts: usize| -> Tensor<B, 4> {
        let rows = x.dims()[1];
        let wi = cast(w.clone().narrow(0, i * d, parts * d), dt);
        let bi = cast(b.clone().narrow(0, i * d, parts * d), dt);
        let y = linear_rows(x.reshape([n * rows, d]), wi.transpose(), None);
        t(B::lean_attention_heads(p(y), p(bi), n, h, parts))
    };
    let (q, k) = if a.shared_qk {
        let qk = project(xs[0].clone(), 0, 2);
        (qk.clone().narrow(0, 0, n), qk.narrow(0, n, n))
    } else {
        (project(xs[0].clone(), 0, 1), project(xs[1].clone(), 1, 1))
    };
    let v = project(xs[2].clone(), 2, 1);
    let scores = to_f32(matmul(q.clone(), k.clone().swap_dims(2, 3))); // [n, h, l, s]
    let (attn, dropped) = B::lean_attention_softmax(p(scores), mask_bias.map(p), (hd as f64).powf(-0.5), a.dropout);
    let out = matmul(cast(t::<B, 4>(dropped), dt), v.clone()); // [n, h, l, hd]
    (out.swap_dims(1, 2).reshape([n, l, d]), Saved { xs, q, k, v, attn: t(attn) })
}

/// `y` in `dtype` (a cast only where it differs).
fn like<B: Backend, const D: usize>(y: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if y.dtype() == dtype { y } else { y.cast(FloatDType::from(dtype)) }
}

/// The node: parents the inputs (query, key and value: `N = 5`; with [`AttnArgs::shared_qk`]
/// the shared input and the value: `N = 4`), the packed weight and the packed bias.
#[derive(Debug)]
struct AttentionBackward<const N: usize>;

#[derive(Clone, Debug)]
struct AttentionState<B: Backend> {
    /// The inputs in the compute dtype, and their own dtypes (their gradients').
    inputs: [Prim<B>; 3],
    input_dtypes: [DType; 3],
    w: Prim<B>,
    bias_dtype: DType,
    q: Prim<B>,
    k: Prim<B>,
    v: Prim<B>,
    attn: Prim<B>,
    args: AttnArgs,
}

impl<B: LeanBackend, const N: usize> Backward<B, N> for AttentionBackward<N> {
    type State = AttentionState<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (dx, dw, db) = attention_backward::<B>(ops.state, t(dy));
        // `N − 2` inputs: `attention_node` picks `N` from `shared_qk`, as `attention_backward`
        // reads it.
        let mut all = dx.into_iter().chain([dw, db]);
        let parent_grads: [Prim<B>; N] = std::array::from_fn(|_| all.next().expect("a gradient per parent"));
        register_parents::<B, N>(grads, ops.parents.map(|n| n.map(|n| n.id)), parent_grads);
    }
}

/// The gradients of the inputs (query, key and value; with `shared_qk` the shared input's and
/// the value's) and of `in_proj_weight` and `in_proj_bias`, from the output's `dy` `[b, l, d]`.
fn attention_backward<B: LeanBackend>(st: AttentionState<B>, dy: Tensor<B, 3>) -> (Vec<Prim<B>>, Prim<B>, Prim<B>) {
    let AttentionState { inputs, input_dtypes, w, bias_dtype, q, k, v, attn, args } = st;
    let (q, k, v, attn) = (t::<B, 4>(q), t::<B, 4>(k), t::<B, 4>(v), t::<B, 4>(attn));
    let [n, h, l, hd] = q.dims();
    let s = k.dims()[2];
    let d = h * hd;
    let dt = args.dtype;
    let drop = |x: Tensor<B, 4>| match args.dropout {
        Some((base, threshold, scale)) => apply_drop(x, base, threshold, scale),
        None => x,
    };
    let dout = cast(dy, dt).reshape([n, l, h, hd]).swap_dims(1, 2); // [n, h, l, hd]
    // Both products read `dout`. On CubeCL a product copies a head view (rows `h·hd` apart)
    // before it reads it: there the copy is made once, for both.
    let dout = if B::lean_attention_fuses() { dout.reshape([n * h, l, hd]).reshape([n, h, l, hd]) } else { dout };
    // out = cast(dropout(attn)) · v
    let dv = matmul(cast(drop(attn.clone()), dt).swap_dims(2, 3), dout.clone()); // [n, h, s, hd]
    let dattn = to_f32(matmul(dout, v.swap_dims(2, 3))); // [n, h, l, s]
    // scores = f32((q · hd^-1/2) · kᵀ), `q` and `k` kept unscaled: the scale goes on the
    // scores' gradient once, for both (a power of two at ACT's head size 64, so exact).
    let scale = (hd as f64).powf(-0.5);
    let ds = if B::lean_attention_fuses() {
        // The dropout's backward, the softmax's and the scale in one launch.
        cast(t::<B, 4>(B::lean_attention_softmax_backward(p(attn), p(dattn), scale, args.dropout)), dt)
    } else {
        let dscores = t::<B, 4>(B::lean_softmax_backward(p(attn), p(drop(dattn)), 3));
        cast(dscores, dt) * scale
    };
    let dq = matmul(ds.clone(), k); // [n, h, l, hd]
    let dk = matmul(ds.swap_dims(2, 3), q); // [n, h, s, hd]
    let w = t::<B, 2>(w);
    let w_dtype = w.dtype();
    // y = x · cast(w[i·d ..])ᵀ + cast(b[i·d ..]) with `g` its gradient `[n·rows, parts·d]`:
    // the input's gradient, the weight rows' `[parts·d, d]` and the bias rows' `[parts·d]`.
    let linear_grads = |g: Tensor<B, 2>, i: usize, parts: usize, rows: usize| {
        let x = t::<B, 3>(inputs[i].clone()).reshape([n * rows, d]);
        let wi = cast(w.clone().narrow(0, i * d, parts * d), dt);
        let dw = like(matmul(g.clone().transpose(), x), w_dtype);
        let db = like(t::<B, 1>(B::lean_channel_sum(p(g.clone()), 1)), bias_dtype);
        (like(matmul(g, wi).reshape([n, rows, d]), input_dtypes[i]), dw, db)
    };
    let merge = |g: Tensor<B, 4>, rows: usize| g.swap_dims(1, 2).reshape([n * rows, d]);
    let (dv_in, dw_v, db_v) = linear_grads(merge(dv, s), 2, 1, s);
    let three = |parts: [Tensor<B, 2>; 3]| B::lean_cat3(parts.map(p));
    let (dx, dw, db) = if args.shared_qk {
        // [dq | dk] per row: [n·l, 2d], the gradient of the one product (one launch on CubeCL).
        let g = t::<B, 2>(B::lean_cat_heads([p(dq), p(dk)]));
        let (dqk_in, dw_qk, db_qk) = linear_grads(g, 0, 2, l);
        // The q and k rows as views (CubeCL slices at aligned offsets without a copy).
        let dw = three([dw_qk.clone().narrow(0, 0, d), dw_qk.narrow(0, d, d), dw_v]);
        let db = B::lean_cat3([db_qk.clone().narrow(0, 0, d), db_qk.narrow(0, d, d), db_v].map(p));
        (vec![p(dqk_in), p(dv_in)], dw, db)
    } else {
        let (dq_in, dw_q, db_q) = linear_grads(merge(dq, l), 0, 1, l);
        let (dk_in, dw_k, db_k) = linear_grads(merge(dk, s), 1, 1, s);
        let db = B::lean_cat3([db_q, db_k, db_v].map(p));
        (vec![p(dq_in), p(dk_in), p(dv_in)], three([dw_q, dw_k, dw_v]), db)
    };
    (dx, dw, db)
}

/// [`LeanBackend::lean_attention`] on `Autodiff<B, C>`: one node over the three inputs, the
/// packed weight and the packed bias ([`AttentionBackward`]), or with `shared_qk` over the
/// shared input, the value input and the two (the query and key inputs must then be one
/// autodiff node). The mask bias takes no gradient.
pub(super) fn attention_node<B: LeanBackend, C: CheckpointStrategy>(
    inputs: [Prim<Autodiff<B, C>>; 3],
    w: Prim<Autodiff<B, C>>,
    b: Prim<Autodiff<B, C>>,
    mask_bias: Option<Prim<Autodiff<B, C>>>,
    args: AttnArgs,
) -> Prim<Autodiff<B, C>> {
    let [q_in, k_in, v_in] = inputs;
    // Two nodes are two tensors: then their projections apart (what `shared_qk` promised is
    // not so, and one product would read the query input twice).
    let args = AttnArgs { shared_qk: args.shared_qk && q_in.node.id == k_in.node.id, ..args };
    let mask = mask_bias.map(|m| t::<B, 2>(m.primitive));
    let bias_dtype = b.primitive.dtype();
    let input_dtypes = [q_in.primitive.dtype(), k_in.primitive.dtype(), v_in.primitive.dtype()];
    let (qn, vn, wn, bn) = (q_in.node.clone(), v_in.node.clone(), w.node.clone(), b.node.clone());
    let (qi, ki, vi, wi, bi) = (q_in.primitive, k_in.primitive, v_in.primitive, w.primitive, b.primitive);
    let tracked = |wi: Prim<B>, saved: Saved<B>| {
        let Saved { xs, q, k, v, attn } = saved;
        AttentionState { inputs: xs.map(p), input_dtypes, w: wi, bias_dtype, q: p(q), k: p(k), v: p(v), attn: p(attn), args }
    };
    if args.shared_qk {
        match AttentionBackward::<4>.prepare::<C>([qn, vn, wn, bn]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (out, saved) = forward::<B>(t(qi), t(ki), t(vi), t(wi.clone()), t(bi), mask, args);
                prep.finish(tracked(wi, saved), p(out))
            }
            OpsKind::UnTracked(prep) => prep.finish(p(attention_forward::<B>(t(qi), t(ki), t(vi), t(wi), t(bi), mask, args))),
        }
    } else {
        match AttentionBackward::<5>.prepare::<C>([qn, k_in.node.clone(), vn, wn, bn]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (out, saved) = forward::<B>(t(qi), t(ki), t(vi), t(wi.clone()), t(bi), mask, args);
                prep.finish(tracked(wi, saved), p(out))
            }
            OpsKind::UnTracked(prep) => prep.finish(p(attention_forward::<B>(t(qi), t(ki), t(vi), t(wi), t(bi), mask, args))),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    use burn::prelude::*;
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::{FloatDType, TensorData};

    use super::super::tests::{A, all_close, random, vals};
    use super::super::{LeanBackend, p, t};
    use super::{AttnArgs, attention_forward};
    use crate::nn::DropoutCtx;

    /// The node (`lean_attention` on autodiff) against autodiff of the composed forward: the
    /// output and the gradients of `sum(out · r)` for the three inputs, the packed weight and
    /// the packed bias, within `tol`. `self_attn`: the query and key inputs are one tensor (as
    /// in ACT's self-attention) and `shared_qk` is set; then both sides are also held against
    /// the composed forward with the three projections apart, whose two input gradients
    /// autodiff adds (what the one product replaces).
    pub(crate) fn attention_node_matches<B: AutodiffBackend + LeanBackend>(n: usize, l: usize, s: usize, heads: usize, self_attn: bool, masked: bool, dropout: bool, dtype: FloatDType, tol: f32) {
        let d = 4 * heads;
        let (q0, k0, v0): (Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 3>) = (random([n, l, d], 31), random([n, s, d], 32), random([n, s, d], 33));
        let w0: Tensor<B, 2> = random([3 * d, d], 34) * 0.3;
        let b0: Tensor<B, 1> = random([3 * d], 35) * 0.1;
        let r: Tensor<B, 3> = random([n, l, d], 36);
        // Key s−1 hidden in every row, key 0 too in the first.
        let mask = masked.then(|| {
            let hide: Vec<bool> = (0..n * s).map(|i| i % s == s - 1 || i == 0).collect();
            let hide = Tensor::<B, 2, Bool>::from_data(TensorData::new(hide, [n, s]), &Default::default());
            Tensor::<B, 2>::zeros([n, s], &Default::default()).mask_fill(hide, f32::NEG_INFINITY)
        });
        let drop = dropout.then(|| {
            let (base, threshold) = DropoutCtx::new(9).base_threshold(DropoutCtx::site(1, 0, 0), 0.2);
            (base, threshold, 1.0 / 0.8)
        });
        let args = AttnArgs { heads, dtype, dropout: drop, shared_qk: self_attn };
        let run = |lean: bool, args: AttnArgs| {
            let (q, k, v) = (q0.clone().require_grad(), k0.clone().require_grad(), v0.clone().require_grad());
            let (w, b) = (w0.clone().require_grad(), b0.clone().require_grad());
            let kin = if self_attn { q.clone() } else { k.clone() };
            let out: Tensor<B, 3> = if lean {
                t(B::lean_attention([p(q.clone()), p(kin), p(v.clone())], p(w.clone()), p(b.clone()), mask.clone().map(p), args))
            } else {
                attention_forward(q.clone(), kin, v.clone(), w.clone(), b.clone(), mask.clone(), args)
            };
            let out = out.cast(FloatDType::F32);
            let values = vals(out.clone());
            let g = (out * r.clone()).sum().backward();
            let grad = |x: Option<Tensor<B::InnerBackend, 3>>| x.map(|x| vals(x.cast(FloatDType::F32))).unwrap_or_default();
            let mut all = vec![("output", values), ("dq", grad(q.grad(&g))), ("dv", grad(v.grad(&g)))];
            if !self_attn {
                all.push(("dk", grad(k.grad(&g))));
            }
            all.push(("dweight", vals(w.grad(&g).unwrap().cast(FloatDType::F32))));
            all.push(("dbias", vals(b.grad(&g).unwrap().cast(FloatDType::F32))));
            all
        };
        let (lean, plain) = (run(true, args), run(false, args));
        let at = format!("n {n} l {l} s {s} heads {heads} self {self_attn} masked {masked} dropout {dropout} {dtype:?}");
        if self_attn {
            let apart = run(false, AttnArgs { shared_qk: false, ..args });
            all_close(&format!("{at}, the composed forward with the projections apart"), plain.clone(), apart.clone(), tol);
            all_close(&format!("{at}, the node against the projections apart"), lean.clone(), apart, tol);
        }
        all_close(&at, lean, plain, tol);
    }

    #[test]
    fn attention_node_gradients_equal_autodiff_of_the_composed_forward() {
        attention_node_matches::<A>(2, 6, 6, 2, true, false, false, FloatDType::F32, 1e-5);
        attention_node_matches::<A>(3, 5, 7, 4, false, true, true, FloatDType::F32, 1e-5);
        attention_node_matches::<A>(2, 9, 4, 1, false, false, true, FloatDType::F32, 1e-5);
        attention_node_matches::<Autodiff<burn::backend::Flex, BalancedCheckpointing>>(2, 5, 5, 2, true, true, true, FloatDType::F32, 1e-5);
        // bf16 projections and products: both sides round alike, not identically.
        attention_node_matches::<A>(2, 5, 7, 2, false, true, true, FloatDType::BF16, 3e-2);
        attention_node_matches::<A>(2, 5, 5, 2, true, true, true, FloatDType::BF16, 3e-2);
    }
}
