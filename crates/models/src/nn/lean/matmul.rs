//! Matrix products through [`LeanBackend::lean_matmul`]: the linear layers' (`linear_rows`) and
//! the attention products (`nn::lean::attention`, the VAE's mid-block attention).
//!
//! Why a node of its own: on CubeCL backends Burn's `float_matmul` is autotuned per shape and
//! layout, and each search compiles and times every candidate kernel of its group (20 of 29 for
//! most of ACT's keys on an H100: 493 candidates for the 17 keys of ACT's forward alone, about
//! 0.47 s of NVRTC each, most of the 321 s that step 1 had not finished in). The backends'
//! `lean_matmul` runs one fixed kernel instead unless `--matmul_autotune=true`
//! ([`crate::nn::cube::matmul_autotune`]); on autodiff its backward runs `lean_matmul` too, so
//! the gradients' products skip the search as well. The node keeps what Burn's keeps (each
//! operand only where the other takes a gradient, retrieved through the checkpointer, so
//! gradient checkpointing treats it as Burn's node).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::NodeId;
use burn::prelude::*;

use super::{LeanBackend, Prim, p, t};

#[derive(Debug)]
struct MatmulBackward;

impl<B: LeanBackend> Backward<B, 2> for MatmulBackward {
    /// The operands' checkpointed ids (`lhs` where `rhs` takes a gradient and vice versa), and
    /// whether each operand is a transposed view ([`LeanBackend::lean_transposed`]: its
    /// gradient is then computed transposed, in the operand's layout).
    type State = (Option<NodeId>, Option<NodeId>, [bool; 2]);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let (lhs, rhs, [lhs_t, rhs_t]) = ops.state;
        let lhs: Option<Prim<B>> = lhs.map(|id| checkpointer.retrieve_node_output(id));
        let rhs: Option<Prim<B>> = rhs.map(|id| checkpointer.retrieve_node_output(id));
        let dy = grads.consume::<B>(&ops.node);
        let tr = B::float_transpose;
        let [lhs_node, rhs_node] = ops.parents;
        if let (Some(node), Some(rhs)) = (lhs_node, rhs) {
            // dlhs = dy·rhsᵀ, or (rhs·dyᵀ)ᵀ: the same sums, written transposed.
            let g = if lhs_t { tr(B::lean_matmul(rhs, tr(dy.clone()))) } else { B::lean_matmul(dy.clone(), tr(rhs)) };
            grads.register::<B>(node.id, g);
        }
        if let (Some(node), Some(lhs)) = (rhs_node, lhs) {
            // drhs = lhsᵀ·dy, or (dyᵀ·lhs)ᵀ.
            let g = if rhs_t { tr(B::lean_matmul(tr(dy), lhs)) } else { B::lean_matmul(tr(lhs), dy) };
            grads.register::<B>(node.id, g);
        }
    }
}

/// [`LeanBackend::lean_matmul`] on `Autodiff<B, C>`.
pub(super) fn matmul_node<B: LeanBackend, C: CheckpointStrategy>(lhs: Prim<Autodiff<B, C>>, rhs: Prim<Autodiff<B, C>>) -> Prim<Autodiff<B, C>> {
    let (lhs_tracked, rhs_tracked) = (lhs.is_tracked(), rhs.is_tracked());
    match MatmulBackward.prepare::<C>([lhs.node.clone(), rhs.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(mut prep) => {
            let lhs_state = rhs_tracked.then(|| prep.checkpoint(&lhs));
            let rhs_state = lhs_tracked.then(|| prep.checkpoint(&rhs));
            let layouts = [lhs_tracked && B::lean_transposed(&lhs.primitive), rhs_tracked && B::lean_transposed(&rhs.primitive)];
            prep.finish((lhs_state, rhs_state, layouts), B::lean_matmul(lhs.primitive, rhs.primitive))
        }
        OpsKind::UnTracked(prep) => prep.finish(B::lean_matmul(lhs.primitive, rhs.primitive)),
    }
}

/// `a @ b` over the last two axes. Through [`LeanBackend::lean_matmul`] where the leading
/// (batch) axes are equal; a broadcast over them takes Burn's matmul (none of the models'
/// products broadcasts).
pub fn matmul<B: LeanBackend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    let (da, db) = (a.dims(), b.dims());
    if da[..D - 2] != db[..D - 2] {
        return a.matmul(b);
    }
    t(B::lean_matmul(p(a), p(b)))
}

/// Whether `a`'s and `b`'s shapes multiply without a broadcast (for the backends' kernels).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(super) fn same_batch<B: Backend>(a: &Prim<B>, b: &Prim<B>) -> bool {
    use burn::tensor::TensorMetadata;
    let (sa, sb) = (a.shape(), b.shape());
    let r = sa.num_dims();
    r == sb.num_dims() && r >= 2 && sa[..r - 2] == sb[..r - 2] && sa[r - 1] == sb[r - 2]
}

#[cfg(test)]
pub(super) mod tests {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    use burn::prelude::*;
    use burn::tensor::FloatDType;
    use burn::tensor::backend::AutodiffBackend;

    use super::super::tests::{A, all_close, random, vals};
    use super::super::LeanBackend;
    use super::matmul;

    /// The node against Burn's matmul on autodiff: the product and the gradients of
    /// `sum(out · r)` for both operands, within `tol`. `transposed_rhs`: `b` is a transposed
    /// view (as a linear layer's weight); `shared`: `a` and `b` are one tensor (`a @ aᵀ`), whose
    /// two gradients autodiff adds; `frozen_rhs`: `b` takes no gradient (the node keeps no `a`).
    pub(crate) fn matmul_node_matches<B: AutodiffBackend + LeanBackend, const D: usize>(da: [usize; D], db: [usize; D], transposed_rhs: bool, shared: bool, frozen_rhs: bool, dtype: FloatDType, tol: f32) {
        let a0: Tensor<B, D> = random(da, 41).cast(dtype);
        let b0: Tensor<B, D> = if transposed_rhs {
            let mut dt = db;
            dt.swap(D - 2, D - 1);
            random::<B, D>(dt, 42).cast(dtype)
        } else {
            random(db, 42).cast(dtype)
        };
        let mut dout = da;
        dout[D - 1] = db[D - 1];
        let r: Tensor<B, D> = random(dout, 43);
        let run = |lean: bool| {
            let a = a0.clone().require_grad();
            let b = if frozen_rhs { b0.clone() } else { b0.clone().require_grad() };
            let bt = if transposed_rhs { b.clone().swap_dims(D - 2, D - 1) } else { b.clone() };
            let bt = if shared { a.clone().swap_dims(D - 2, D - 1) } else { bt };
            let out = if lean { matmul(a.clone(), bt) } else { a.clone().matmul(bt) };
            let out = out.cast(FloatDType::F32);
            let values = vals(out.clone());
            let g = (out * r.clone()).sum().backward();
            let mut all = vec![("output", values), ("da", vals(a.grad(&g).unwrap().cast(FloatDType::F32)))];
            if !frozen_rhs && !shared {
                all.push(("db", vals(b.grad(&g).unwrap().cast(FloatDType::F32))));
            }
            all
        };
        let (lean, plain) = (run(true), run(false));
        let at = format!("{da:?} @ {db:?} transposed {transposed_rhs} shared {shared} frozen {frozen_rhs} {dtype:?}");
        all_close(&at, lean, plain, tol);
    }

    #[test]
    fn matmul_node_gradients_equal_burns() {
        matmul_node_matches::<A, 2>([6, 5], [5, 7], false, false, false, FloatDType::F32, 1e-6);
        matmul_node_matches::<A, 2>([9, 4], [4, 3], true, false, false, FloatDType::F32, 1e-6);
        matmul_node_matches::<A, 2>([9, 4], [4, 3], true, false, true, FloatDType::F32, 1e-6);
        matmul_node_matches::<A, 4>([2, 3, 5, 4], [2, 3, 4, 6], false, false, false, FloatDType::F32, 1e-6);
        matmul_node_matches::<A, 4>([2, 3, 5, 4], [2, 3, 4, 5], false, true, false, FloatDType::F32, 1e-6);
        matmul_node_matches::<Autodiff<burn::backend::Flex, BalancedCheckpointing>, 3>([2, 5, 4], [2, 4, 3], true, false, false, FloatDType::F32, 1e-6);
        matmul_node_matches::<A, 3>([2, 5, 8], [2, 8, 3], false, false, false, FloatDType::BF16, 1e-2);
    }

    #[test]
    fn a_broadcast_takes_burns_matmul() {
        let a: Tensor<A, 3> = random([2, 3, 4], 1);
        let b: Tensor<A, 3> = random([1, 4, 5], 2);
        let (x, y) = (vals(matmul(a.clone(), b.clone())), vals(a.matmul(b)));
        assert_eq!(x, y);
    }
}
