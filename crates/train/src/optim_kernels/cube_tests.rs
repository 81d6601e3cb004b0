//! The `#[cube]` Adam(W) update on wgpu (CI: Mesa lavapipe) against the tensor-op update on the
//! same device: several steps, each path carrying its own parameter and moments, every decay
//! kind, with and without gradient scaling, sizes ragged against the kernel's cubes. f32 within
//! 1e-6 relative (largest difference over the largest magnitude).
//!
//! `CARGO_TARGET_DIR=target/wgpu cargo test --release -p vramlab-train --features wgpu --lib cube_tests`

use burn::backend::Wgpu;
use burn::prelude::*;
use burn::tensor::TensorData;

use super::{AdamUpdate, Decay, OptimKernels, adam_update_tensors};

type W = Wgpu;

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
    // 1 element, fewer than a cube, a cube and a ragged tail, several cubes and a tail.
    for (rows, cols) in [(1, 1), (3, 37), (5, 67), (129, 1031)] {
        for decay in [Decay::None, Decay::L2(0.01), Decay::Decoupled(0.05)] {
            for coef in [1.0, 0.37] {
                kernel_update_matches(rows, cols, decay, coef);
            }
        }
    }
}

/// A gradient in a transposed layout (as autodiff hands some back) updates as its contiguous copy.
#[test]
fn cube_adam_update_reads_a_transposed_gradient() {
    let (rows, cols) = (33, 70);
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
}
