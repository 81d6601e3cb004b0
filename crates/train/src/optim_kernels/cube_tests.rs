//! The `#[cube]` Adam(W) update on wgpu (CI: Mesa lavapipe) against the tensor-op update on the
//! same device: several steps, each path carrying its own parameter and moments, every decay
//! kind, with and without gradient scaling, sizes ragged against the kernel's cubes; in place
//! when the buffers are the update's alone, never writing a shared one. f32 within 1e-6 relative
//! (largest difference over the largest magnitude). The squared gradient norm's kernel against
//! the tensor ops' sum, within 1e-5 relative. With `--features wgpu,fusion` the same tests run the
//! kernels as custom operations of Burn's fusion stream (`fusion.rs`), where "shared" means
//! another fusion tensor, or the tensor a reshape came from, holds the buffer.
//!
//! `CARGO_TARGET_DIR=target/wgpu cargo test --release -p vramlab-train --features wgpu[,fusion] --lib cube_tests`

use burn::prelude::*;
use burn::tensor::TensorData;

use super::cube::{IN_PLACE, VECTOR};

/// Which outputs of the last update of an `n`-element parameter were written in place (read
/// after the outputs: under fusion the update runs when the stream is read).
fn in_place(n: usize) -> [bool; 3] {
    IN_PLACE.lock().unwrap().get(&n).copied().expect("an update of this size ran through the kernel")
}

/// Floats per load and store of the last update of an `n`-element parameter (read as
/// [`in_place`]).
fn vector(n: usize) -> usize {
    VECTOR.lock().unwrap().get(&n).copied().expect("an update of this size ran through the kernel")
}

/// Floats per load and store of a flat `n`-element update: 4 for a multiple of 4 from 2¹⁶ up.
fn flat_vector(n: usize) -> usize {
    if n % 4 == 0 && n >= 1 << 16 { 4 } else { 1 }
}
use super::{AdamUpdate, Decay, OptimKernels, SqAcc, adam_update_tensors, sq_sum_tensors};
#[cfg(not(feature = "fusion"))]
use super::cube::group_sizes;

// wgpu where it is built (CI: lavapipe), else CUDA (the GPU bench's test binary).
#[cfg(feature = "wgpu")]
type W = burn::backend::Wgpu;
#[cfg(not(feature = "wgpu"))]
type W = burn::backend::Cuda;

/// Deterministic values in about [−1, 1) (no device generator: tests run in parallel).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn tensor<const D: usize>(v: &[f32], dims: [usize; D]) -> Tensor<W, D> {
    Tensor::from_data(TensorData::new(v.to_vec(), dims), &Default::default())
}

fn vals<const D: usize>(t: Tensor<W, D>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

fn rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    let scale = b.iter().map(|y| y.abs()).fold(f32::MIN_POSITIVE, f32::max);
    diff / scale
}

fn close(name: &str, a: &[f32], b: &[f32]) {
    let e = rel(a, b);
    assert!(e <= 1e-6, "{name}: relative error {e:e} > 1e-6");
}

/// Four steps of both updates on a `[rows, cols]` parameter, from no moments.
fn kernel_update_matches(rows: usize, cols: usize, decay: Decay, coef: f64) {
    let n = rows * cols;
    let (b1, b2) = (0.9f64, 0.999f64);
    let mut p_k = values(n, 1 + n as u64);
    let mut p_t = p_k.clone();
    let mut mom_k: Option<(Vec<f32>, Vec<f32>)> = None;
    let mut mom_t: Option<(Vec<f32>, Vec<f32>)> = None;
    for t in 1..=4 {
        let g = values(n, 100 * t as u64 + n as u64);
        let lr = 1e-2;
        let decay = match decay {
            Decay::Decoupled(wd) => Decay::Decoupled(1.0 - lr * wd),
            d => d,
        };
        let h = AdamUpdate { b1, b2, eps: 1e-8, lr, bc1: 1.0 - b1.powi(t), bc2: 1.0 - b2.powi(t), coef, decay };
        let at = format!("[{rows}, {cols}] {decay:?} coef {coef} step {t}");
        let moments = |m: &Option<(Vec<f32>, Vec<f32>)>| m.as_ref().map(|(m, v)| (tensor(m, [n]), tensor(v, [n])));
        let (pk, mk, vk) = <W as OptimKernels>::adam_update::<2>(tensor(&p_k, [rows, cols]), tensor(&g, [rows, cols]), moments(&mom_k), &h);
        let (pt, mt, vt) = adam_update_tensors::<W>(tensor(&p_t, [n]), tensor(&g, [n]), moments(&mom_t), &h);
        assert_eq!(pk.dims(), [rows, cols], "{at}: shape");
        (p_k, p_t) = (vals(pk), vals(pt));
        // Every buffer here is the update's alone: p in place, m in the gradient's buffer on the
        // first step and in its own later, v in its own after the first step.
        assert_eq!(in_place(n), [true, true, t > 1], "{at}: written in place (p, m, v)");
        assert_eq!(vector(n), flat_vector(n), "{at}: floats per load");
        let (mk, vk, mt, vt) = (vals(mk), vals(vk), vals(mt), vals(vt));
        close(&format!("p {at}"), &p_k, &p_t);
        close(&format!("m {at}"), &mk, &mt);
        close(&format!("v {at}"), &vk, &vt);
        assert_ne!(p_k, values(n, 1 + n as u64), "{at}: the parameter moved");
        (mom_k, mom_t) = (Some((mk, vk)), Some((mt, vt)));
    }
}

#[test]
fn cube_adam_update_matches_the_tensor_update() {
    // 1 element, fewer than a cube, a cube and a ragged tail, several cubes and a tail; 4-wide
    // loads (a multiple of 4 elements, at least 2¹⁶) over more than one pass of the units.
    for (rows, cols) in [(1, 1), (3, 37), (5, 67), (129, 1031), (256, 260), (1100, 1024)] {
        for decay in [Decay::None, Decay::L2(0.01), Decay::Decoupled(0.05)] {
            for coef in [1.0, 0.37] {
                kernel_update_matches(rows, cols, decay, coef);
            }
        }
    }
}

/// A gradient in a transposed layout (as autodiff hands some back) updates as its contiguous copy,
/// one float at a time even where a flat one would take 4-wide loads (without fusion: the
/// kernel reads it through its strides).
#[test]
fn cube_adam_update_reads_a_transposed_gradient() {
    let (rows, cols) = (256, 264);
    let n = rows * cols;
    let gv = values(n, 7);
    let g = tensor(&gv, [cols, rows]).transpose();
    let dense = vals(g.clone());
    let h = AdamUpdate { b1: 0.9, b2: 0.999, eps: 1e-8, lr: 1e-3, bc1: 0.1, bc2: 0.001, coef: 0.5, decay: Decay::Decoupled(0.99) };
    let p = values(n, 8);
    let (pk, _, vk) = <W as OptimKernels>::adam_update::<2>(tensor(&p, [rows, cols]), g, None, &h);
    let (pt, _, vt) = adam_update_tensors::<W>(tensor(&p, [n]), tensor(&dense, [n]), None, &h);
    close("p", &vals(pk), &vals(pt));
    close("v", &vals(vk), &vals(vt));
    // Under fusion the update takes `g.reshape([n])`, which the stream makes contiguous.
    assert_eq!(vector(n), if cfg!(feature = "fusion") { 4 } else { 1 }, "floats per load of a strided gradient");
}

/// Shared inputs (another tensor holds each buffer) are not written: the update goes to new
/// buffers, the other holders keep their values, and the result is the tensor update's. Then
/// only the parameter shared: the moments are still updated in place.
#[test]
fn cube_adam_update_leaves_shared_inputs_alone() {
    let (rows, cols) = (19, 83);
    let n = rows * cols;
    let (pv, gv, mv, vv) = (values(n, 41), values(n, 42), values(n, 43), values(n, 44).iter().map(|x| x.abs()).collect::<Vec<_>>());
    let h = AdamUpdate { b1: 0.9, b2: 0.999, eps: 1e-8, lr: 1e-2, bc1: 1.0 - 0.9f64.powi(2), bc2: 1.0 - 0.999f64.powi(2), coef: 0.6, decay: Decay::Decoupled(0.999) };
    let (pt, mt, vt) = adam_update_tensors::<W>(tensor(&pv, [n]), tensor(&gv, [n]), Some((tensor(&mv, [n]), tensor(&vv, [n]))), &h);
    let (pt, mt, vt) = (vals(pt), vals(mt), vals(vt));
    // Everything shared.
    let (p, g, m, v) = (tensor(&pv, [rows, cols]), tensor(&gv, [rows, cols]), tensor(&mv, [n]), tensor(&vv, [n]));
    let (pk, mk, vk) = <W as OptimKernels>::adam_update::<2>(p.clone(), g.clone(), Some((m.clone(), v.clone())), &h);
    close("p", &vals(pk), &pt);
    assert_eq!(in_place(n), [false, false, false], "shared buffers are not written in place");
    close("m", &vals(mk), &mt);
    close("v", &vals(vk), &vt);
    assert_eq!(vals(p), pv, "the shared parameter kept its values");
    assert_eq!(vals(g), gv, "the shared gradient kept its values");
    assert_eq!(vals(m), mv, "the shared first moment kept its values");
    assert_eq!(vals(v), vv, "the shared second moment kept its values");
    // Only the parameter shared.
    let p = tensor(&pv, [rows, cols]);
    let (pk, mk, vk) = <W as OptimKernels>::adam_update::<2>(p.clone(), tensor(&gv, [rows, cols]), Some((tensor(&mv, [n]), tensor(&vv, [n]))), &h);
    close("p", &vals(pk), &pt);
    assert_eq!(in_place(n), [false, true, true], "owned moments in place, the shared parameter not");
    close("m", &vals(mk), &mt);
    close("v", &vals(vk), &vt);
    assert_eq!(vals(p), pv, "the shared parameter kept its values");
    // First step with a shared gradient: m does not take its buffer.
    let g = tensor(&gv, [rows, cols]);
    let (pk, mk, vk) = <W as OptimKernels>::adam_update::<2>(tensor(&pv, [rows, cols]), g.clone(), None, &h);
    let (pt, mt, vt) = adam_update_tensors::<W>(tensor(&pv, [n]), tensor(&gv, [n]), None, &h);
    close("p", &vals(pk), &vals(pt));
    assert_eq!(in_place(n), [true, false, false], "the shared gradient's buffer is not reused for m");
    close("m", &vals(mk), &vals(mt));
    close("v", &vals(vk), &vals(vt));
    assert_eq!(vals(g), gv, "the shared gradient kept its values");
}

/// Inputs reached through a view of a buffer the caller still holds (a reshape of it; under
/// fusion a reshape is an operation of its own whose output shares the buffer) are shared too:
/// the held tensors keep their values over two steps, and the results are the tensor update's.
#[test]
fn cube_adam_update_leaves_viewed_buffers_alone() {
    let (rows, cols) = (23, 61);
    let n = rows * cols;
    let (pv, gv, mv, vv) = (values(n, 81), values(n, 82), values(n, 83), values(n, 84).iter().map(|x| x.abs()).collect::<Vec<_>>());
    let h = AdamUpdate { b1: 0.9, b2: 0.999, eps: 1e-8, lr: 1e-2, bc1: 1.0 - 0.9f64.powi(2), bc2: 1.0 - 0.999f64.powi(2), coef: 1.0, decay: Decay::L2(0.01) };
    // The parameter held flat, updated as [rows, cols]; the moments held as [rows, cols], passed flat.
    let (p_flat, g, m2, v2) = (tensor(&pv, [n]), tensor(&gv, [rows, cols]), tensor(&mv, [rows, cols]), tensor(&vv, [rows, cols]));
    let mut moments = Some((m2.clone().reshape([n]), v2.clone().reshape([n])));
    let mut p = p_flat.clone().reshape([rows, cols]);
    let (mut pt, mut mom_t) = (tensor(&pv, [n]), Some((tensor(&mv, [n]), tensor(&vv, [n]))));
    for step in 1..=2 {
        let (pk, mk, vk) = <W as OptimKernels>::adam_update::<2>(p, g.clone(), moments, &h);
        let (pn, mn, vn) = adam_update_tensors::<W>(pt, tensor(&gv, [n]), mom_t, &h);
        close(&format!("p step {step}"), &vals(pk.clone()), &vals(pn.clone()));
        close(&format!("m step {step}"), &vals(mk.clone()), &vals(mn.clone()));
        close(&format!("v step {step}"), &vals(vk.clone()), &vals(vn.clone()));
        assert_eq!(vals(p_flat.clone()), pv, "step {step}: the held parameter kept its values");
        assert_eq!(vals(m2.clone()), mv, "step {step}: the held first moment kept its values");
        assert_eq!(vals(v2.clone()), vv, "step {step}: the held second moment kept its values");
        assert_eq!(vals(g.clone()), gv, "step {step}: the held gradient kept its values");
        (p, moments, pt, mom_t) = (pk, Some((mk, vk)), pn, Some((mn, vn)));
    }
}

fn rel_close(name: &str, a: f64, b: f64, tol: f64) {
    let e = (a - b).abs() / b.abs();
    assert!(e <= tol, "{name}: {a} vs {b}, relative error {e:e} > {tol:e}");
}

/// The kernel's `Σ g²` over a step's gradients (sizes below one unit's share, ragged, and past
/// the capped cube count so units loop; one transposed) equals the tensor ops' sum to f32
/// rounding, and hands every gradient back with its values.
#[test]
fn cube_grad_sq_sum_matches_the_tensor_ops() {
    let shapes: [(usize, usize); 6] = [(1, 1), (3, 37), (5, 67), (129, 1031), (70, 33), (613, 1009)];
    let mut kernel = SqAcc::<W>::default();
    let mut ops = SqAcc::<W>::default();
    let mut expect = 0f64;
    for (k, &(rows, cols)) in shapes.iter().enumerate() {
        let v = values(rows * cols, 60 + k as u64);
        expect += v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
        // The fifth one arrives transposed, as autodiff hands some gradients back.
        let g = if k == 4 { tensor(&v, [cols, rows]).transpose() } else { tensor(&v, [rows, cols]) };
        let want = vals(g.clone());
        let back = <W as OptimKernels>::grad_sq_sum(g.clone(), &mut kernel);
        assert_eq!(vals(back), want, "[{rows}, {cols}] handed back");
        let _ = sq_sum_tensors(g, &mut ops);
    }
    // Held back for one grouped launch (without fusion) or summed one by one (fusion).
    assert!(kernel.device.is_none() && (kernel.partials.is_some() || kernel.pending.len() == shapes.len()), "the f32 gradients went through the kernel");
    let (k, t) = (<W as OptimKernels>::sq_total(kernel), <W as OptimKernels>::sq_total(ops));
    rel_close("kernel vs tensor ops", k, t, 1e-5);
    rel_close("kernel vs f64", k, expect, 1e-5);
}

/// A step whose gradients take both paths (the kernel's partial sums and the tensor ops'
/// one-element sum, as a non-f32 gradient would) adds both, once each.
#[test]
fn cube_grad_sq_sum_adds_the_kernel_and_tensor_op_parts() {
    let (a, b) = (values(4099, 71), values(517, 72));
    let sq = |v: &[f32]| v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
    let mut acc = SqAcc::<W>::default();
    let _ = <W as OptimKernels>::grad_sq_sum(tensor(&a, [4099]), &mut acc);
    let _ = sq_sum_tensors(tensor(&b, [11, 47]), &mut acc);
    let _ = <W as OptimKernels>::grad_sq_sum(tensor(&b, [47, 11]), &mut acc);
    assert!(acc.device.is_some() && (acc.partials.is_some() || acc.pending.len() == 2));
    rel_close("mixed", <W as OptimKernels>::sq_total(acc), sq(&a) + 2.0 * sq(&b), 1e-5);
}

/// More gradients than a launch takes (full groups and a partial one, ragged sizes, some past
/// the capped cube count): the grouped sums equal the tensor ops' to f32 rounding.
#[test]
fn cube_grad_sq_sum_over_several_groups() {
    let shapes: Vec<(usize, usize)> = (0..19).map(|k| (1 + 7 * k, 3 + 131 * (k % 5) + k)).collect();
    let mut kernel = SqAcc::<W>::default();
    let mut expect = 0f64;
    for (k, &(rows, cols)) in shapes.iter().enumerate() {
        let v = values(rows * cols, 300 + k as u64);
        expect += v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
        let _ = <W as OptimKernels>::grad_sq_sum(tensor(&v, [rows, cols]), &mut kernel);
    }
    #[cfg(not(feature = "fusion"))]
    {
        let group = group_sizes(&tensor(&[0.0], [1]).into_primitive().tensor().client).1;
        assert_eq!(kernel.pending.len(), shapes.len() % group, "full groups of {group} are launched as they fill");
    }
    rel_close("grouped kernel vs f64", <W as OptimKernels>::sq_total(kernel), expect, 1e-5);
}

/// Thirteen parameters (full groups and partial ones; ragged sizes, one past the capped cube
/// count; two taking 4-wide loads, another launch key), one at another learning rate (so
/// groups also split on their hyper-parameters), four steps through `adam_update_later` and
/// `adam_flush`: each equals the tensor update, in place. Sizes are this test's own (`IN_PLACE`
/// is keyed by size). One open group cut at every change of key launches 6 times a step; one per
/// key 4 times (the 1-wide, 1e-2 group of ten fills once).
#[test]
fn cube_adam_updates_held_back_match_the_tensor_update() {
    held_back_updates_match(false, 6);
}

#[test]
fn cube_adam_updates_held_back_by_key_match_the_tensor_update() {
    held_back_updates_match(true, 4);
}

fn held_back_updates_match(by_key: bool, launches: usize) {
    super::cube::BY_KEY_FOR_TESTS.set(Some(by_key));
    super::cube::ADAM_LAUNCHES.set(0);
    // Fusion holds nothing back (its `Later` is `()`): the launches are not counted there.
    #[cfg(feature = "fusion")]
    let _ = launches;
    let shapes = [(1, 2), (3, 41), (5, 71), (521, 1033), (272, 256), (2, 3), (7, 13), (64, 65), (1, 301), (17, 23), (31, 70), (4, 5), (300, 232)];
    let (b1, b2) = (0.9f64, 0.999f64);
    let n = |j: usize| shapes[j].0 * shapes[j].1;
    let mut p_k: Vec<Vec<f32>> = (0..shapes.len()).map(|j| values(n(j), 500 + j as u64)).collect();
    let mut p_t = p_k.clone();
    let mut mom_k: Vec<Option<(Vec<f32>, Vec<f32>)>> = vec![None; shapes.len()];
    let mut mom_t = mom_k.clone();
    let moments = |m: &Option<(Vec<f32>, Vec<f32>)>, n: usize| m.as_ref().map(|(m, v)| (tensor(m, [n]), tensor(v, [n])));
    for t in 1..=4 {
        let mut later = <W as OptimKernels>::Later::default();
        let mut outs = Vec::new();
        let mut expected = Vec::new();
        for (j, &(rows, cols)) in shapes.iter().enumerate() {
            let lr = if j == 10 { 3e-3 } else { 1e-2 };
            let h = AdamUpdate { b1, b2, eps: 1e-8, lr, bc1: 1.0 - b1.powi(t), bc2: 1.0 - b2.powi(t), coef: 0.37, decay: Decay::Decoupled(1.0 - lr * 0.05) };
            let g = values(n(j), 1000 * t as u64 + j as u64);
            outs.push(<W as OptimKernels>::adam_update_later::<2>(tensor(&p_k[j], [rows, cols]), tensor(&g, [rows, cols]), moments(&mom_k[j], n(j)), &h, &mut later));
            expected.push(adam_update_tensors::<W>(tensor(&p_t[j], [n(j)]), tensor(&g, [n(j)]), moments(&mom_t[j], n(j)), &h));
        }
        <W as OptimKernels>::adam_flush(later);
        #[cfg(not(feature = "fusion"))]
        assert_eq!(super::cube::ADAM_LAUNCHES.replace(0), launches, "step {t}: update launches, by key {by_key}");
        for (j, ((pk, mk, vk), (pt, mt, vt))) in outs.into_iter().zip(expected).enumerate() {
            let at = format!("parameter {j} {:?} step {t}", shapes[j]);
            assert_eq!(pk.dims(), [shapes[j].0, shapes[j].1], "{at}: shape");
            (p_k[j], p_t[j]) = (vals(pk), vals(pt));
            assert_eq!(in_place(n(j)), [true, true, t > 1], "{at}: written in place (p, m, v)");
            assert_eq!(vector(n(j)), flat_vector(n(j)), "{at}: floats per load");
            let (mk, vk, mt, vt) = (vals(mk), vals(vk), vals(mt), vals(vt));
            close(&format!("p {at}"), &p_k[j], &p_t[j]);
            close(&format!("m {at}"), &mk, &mt);
            close(&format!("v {at}"), &vk, &vt);
            (mom_k[j], mom_t[j]) = (Some((mk, vk)), Some((mt, vt)));
        }
    }
}

/// Among held-back updates, one whose parameter another tensor shares runs at once into new
/// buffers (the shared tensor keeps its values); the others are still held and written in place.
#[test]
fn cube_adam_update_held_back_leaves_a_shared_parameter_alone() {
    let shapes = [(3, 43), (9, 17), (5, 29)];
    let h = AdamUpdate { b1: 0.9, b2: 0.999, eps: 1e-8, lr: 1e-2, bc1: 1.0 - 0.9f64.powi(2), bc2: 1.0 - 0.999f64.powi(2), coef: 1.0, decay: Decay::L2(0.01) };
    let mut later = <W as OptimKernels>::Later::default();
    let mut outs = Vec::new();
    let mut expected = Vec::new();
    let mut shared = None;
    for (j, &(rows, cols)) in shapes.iter().enumerate() {
        let n = rows * cols;
        let (pv, gv, mv, vv) = (values(n, 700 + j as u64), values(n, 710 + j as u64), values(n, 720 + j as u64), values(n, 730 + j as u64).iter().map(|x| x.abs()).collect::<Vec<_>>());
        let p = tensor(&pv, [rows, cols]);
        if j == 1 {
            shared = Some((p.clone(), pv.clone()));
        }
        outs.push(<W as OptimKernels>::adam_update_later::<2>(p, tensor(&gv, [rows, cols]), Some((tensor(&mv, [n]), tensor(&vv, [n]))), &h, &mut later));
        expected.push(adam_update_tensors::<W>(tensor(&pv, [n]), tensor(&gv, [n]), Some((tensor(&mv, [n]), tensor(&vv, [n]))), &h));
    }
    <W as OptimKernels>::adam_flush(later);
    for (j, ((pk, mk, vk), (pt, mt, vt))) in outs.into_iter().zip(expected).enumerate() {
        let n = shapes[j].0 * shapes[j].1;
        close(&format!("p {j}"), &vals(pk), &vals(pt));
        close(&format!("m {j}"), &vals(mk), &vals(mt));
        close(&format!("v {j}"), &vals(vk), &vals(vt));
        assert_eq!(in_place(n), if j == 1 { [false, true, true] } else { [true, true, true] }, "parameter {j}: written in place (p, m, v)");
    }
    let (p, pv) = shared.expect("the second parameter is shared");
    assert_eq!(vals(p), pv, "the shared parameter kept its values");
}

/// Gradients dense in another order than contiguous, as CubeCL hands back a convolution's
/// weight gradient (`[out, in, kh, kw]` seen on a channels-last `[out, kh, kw, in]` buffer) and
/// a linear layer's (transposed), go through the norm and the grouped update as they are, not
/// copied: the sum, and three steps of each parameter beside a contiguous one, equal the tensor
/// ops on contiguous copies. Sizes are this test's own (`IN_PLACE` is keyed by size).
#[test]
fn cube_update_reads_permuted_gradients_in_place() {
    let conv = [13, 7, 3, 5]; // [out, in, kh, kw]
    let dims: [[usize; 4]; 3] = [conv, [1, 1, 67, 29], [1, 1, 9, 311]];
    let n = |j: usize| dims[j].iter().product::<usize>();
    let (b1, b2) = (0.9f64, 0.999f64);
    let mut p_k: Vec<Vec<f32>> = (0..3).map(|j| values(n(j), 700 + j as u64)).collect();
    let mut p_t = p_k.clone();
    let mut mom_k: Vec<Option<(Vec<f32>, Vec<f32>)>> = vec![None; 3];
    let mut mom_t = mom_k.clone();
    let moments = |m: &Option<(Vec<f32>, Vec<f32>)>, n: usize| m.as_ref().map(|(m, v)| (tensor(m, [n]), tensor(v, [n])));
    for t in 1..=3 {
        let stored: Vec<Vec<f32>> = (0..3).map(|j| values(n(j), 800 + 10 * t as u64 + j as u64)).collect();
        // 0: channels last; 1: transposed (a [29, 67] buffer); 2: contiguous.
        let grads: Vec<Tensor<W, 4>> = vec![
            tensor(&stored[0], [conv[0], conv[2], conv[3], conv[1]]).permute([0, 3, 1, 2]),
            tensor(&stored[1], [1, 1, 29, 67]).swap_dims(2, 3),
            tensor(&stored[2], dims[2]),
        ];
        // As the optimizer does: the norm of every gradient first, then the updates.
        let mut kernel = SqAcc::<W>::default();
        let mut expect_sq = 0f64;
        let mut handed = Vec::new();
        for (j, g) in grads.into_iter().enumerate() {
            let dense = vals(g.clone());
            expect_sq += dense.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
            // With fusion the stream decides layouts (and the gradient comes back contiguous).
            #[cfg(not(feature = "fusion"))]
            let strides = g.clone().into_primitive().tensor().meta.strides().to_vec();
            #[cfg(feature = "fusion")]
            let _ = j;
            let g = <W as OptimKernels>::grad_sq_sum(g, &mut kernel);
            #[cfg(not(feature = "fusion"))]
            assert_eq!(g.clone().into_primitive().tensor().meta.strides().to_vec(), strides, "gradient {j} handed back in its own layout");
            handed.push((g, dense));
        }
        rel_close(&format!("norm, step {t}"), <W as OptimKernels>::sq_total(kernel), expect_sq, 1e-5);
        let mut later = <W as OptimKernels>::Later::default();
        let (mut outs, mut expected) = (Vec::new(), Vec::new());
        for (j, (g, dense)) in handed.into_iter().enumerate() {
            let h = AdamUpdate { b1, b2, eps: 1e-8, lr: 1e-2, bc1: 1.0 - b1.powi(t), bc2: 1.0 - b2.powi(t), coef: 0.5, decay: Decay::Decoupled(0.999) };
            outs.push(<W as OptimKernels>::adam_update_later::<4>(tensor(&p_k[j], dims[j]), g, moments(&mom_k[j], n(j)), &h, &mut later));
            expected.push(adam_update_tensors::<W>(tensor(&p_t[j], [n(j)]), tensor(&dense, [n(j)]), moments(&mom_t[j], n(j)), &h));
        }
        <W as OptimKernels>::adam_flush(later);
        for (j, ((pk, mk, vk), (pt, mt, vt))) in outs.into_iter().zip(expected).enumerate() {
            let at = format!("parameter {j} {:?} step {t}", dims[j]);
            assert_eq!(pk.dims(), dims[j], "{at}: shape");
            (p_k[j], p_t[j]) = (vals(pk), vals(pt));
            // On a first step m takes a contiguous gradient's buffer; a permuted one's is not in
            // p's order. (With fusion the norm pass hands every gradient back contiguous.)
            assert_eq!(in_place(n(j)), [true, t > 1 || j == 2 || cfg!(feature = "fusion"), t > 1], "{at}: written in place (p, m, v)");
            let (mk, vk, mt, vt) = (vals(mk), vals(vk), vals(mt), vals(vt));
            close(&format!("p {at}"), &p_k[j], &p_t[j]);
            close(&format!("m {at}"), &mk, &mt);
            close(&format!("v {at}"), &vk, &vt);
            (mom_k[j], mom_t[j]) = (Some((mk, vk)), Some((mt, vt)));
        }
    }
}

/// The gradient layouts the update reads through their strides, with their dims merged: a
/// conv3d weight gradient as the swapped convolution writes it (`[in, kd, kh, kw, out]`, seen as
/// `[out, in, kd, kh, kw]`) is a transposed `[out, in · k]`; a channels-last weight (`[out, kh,
/// kw, in]`) a `[out, in, k]`; a contiguous one is flat; size-1 dims go; and the merged view
/// holds the same elements in the same order.
#[cfg(not(feature = "fusion"))]
#[test]
fn merged_gradient_views_keep_the_element_order() {
    let meta = |t: &Tensor<W, 5>| {
        let c = t.clone().into_primitive().tensor();
        let m = super::cube::merged(c);
        (m.meta.shape().to_vec(), m.meta.strides().to_vec())
    };
    let (o, i, k) = (6, 5, [2, 3, 4]);
    let n = o * i * k.iter().product::<usize>();
    let v = values(n, 901);
    let swapped = tensor(&v, [i, k[0], k[1], k[2], o]).permute([4, 0, 1, 2, 3]);
    assert_eq!(meta(&swapped), (vec![o, i * 24], vec![1, o]));
    let last = tensor(&v, [o, k[0], k[1], k[2], i]).permute([0, 4, 1, 2, 3]);
    assert_eq!(meta(&last), (vec![o, i, 24], vec![24 * i, 1, i]));
    // A contiguous gradient is flat (what the update reads it as).
    assert_eq!(meta(&tensor(&v, [1, o, i, 4, 6])), (vec![n], vec![1]));
    let ones = tensor(&v, [1, o, 1, i * 24, 1]).swap_dims(1, 3);
    assert_eq!(meta(&ones), (vec![i * 24, o], vec![1, i * 24]));
    for t in [swapped, last, ones] {
        let dims = t.dims();
        let merged = super::cube::merged(t.clone().into_primitive().tensor());
        let mut flat = burn_cubecl::kernel::into_contiguous(merged);
        flat.meta = Box::new(cubecl::zspace::metadata::Metadata::new([n], [1]));
        let merged: Tensor<W, 1> = Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(flat));
        assert_eq!(vals(merged), vals(t.reshape([n])), "{dims:?}: the merged view's elements in order");
    }
}
