//! SiLU and Mish forward and backward, one launch each, computed in f32 from the input in any
//! float dtype, over the buffers as they are laid out (as [`super::relu`]). The composed ops
//! they replace (`lean::pointwise`: Burn's ReLU, abs, neg, exp, log1p, add, tanh, mul, sigmoid
//! …, and a contiguous copy of a convolution's channels-last output to flatten it) took about
//! 32 launches for one Mish forward and backward: Diffusion b8's 38 Mish sites went from 2,585
//! launches a step to 1,448 on lavapipe (`benches/results/kernels/wgpu/act_kernels.md`).
//!
//! - SiLU: `y = x · σ(x)`, `dx = dy · σ(x) · (1 + x·(1 − σ(x)))`;
//! - Mish: `y = x · tanh(sp)`, `sp = softplus(x) = max(x, 0) + log1p(exp(−|x|))`,
//!   `dx = dy · (tanh(sp) + x · (1 − tanh²(sp)) · σ(x))`.
//!
//! `tanh` takes `min(sp, 20)`: tanh(20) rounds to 1 in f32, and some `tanh`s return NaN for
//! large arguments.

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{dense_or_copy, elem_launch, elem_out, one_dense_layout};

/// Which activation a kernel computes (a comptime switch: one compiled kernel each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Silu,
    Mish,
}

impl Act {
    fn mish(self) -> bool {
        self == Act::Mish
    }
}

#[cube]
fn sigmoid(x: f32) -> f32 {
    1.0f32 / (1.0f32 + (-x).exp())
}

/// `tanh(softplus(x))`.
#[cube]
fn tanh_softplus(x: f32) -> f32 {
    let sp = x.max(0.0f32) + (-x.abs()).exp().log1p();
    sp.min(20.0f32).tanh()
}

/// `mish(x) = x · tanh(softplus(x))` (also GroupNorm's fused Mish, [`super::group_norm`]).
#[cube]
pub(super) fn apply_mish(x: f32) -> f32 {
    x * tanh_softplus(x)
}

/// `mish'(x) = tanh(sp) + x · (1 − tanh²(sp)) · σ(x)`.
#[cube]
pub(super) fn mish_slope(x: f32) -> f32 {
    let th = tanh_softplus(x);
    th + x * (1.0f32 - th * th) * sigmoid(x)
}

#[cube(launch)]
fn act_kernel<F: Float>(x: &Tensor<F>, y: &mut Tensor<F>, n: u32, #[comptime] mish: bool, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    let v = f32::cast_from(x[i]);
    let out = if comptime![mish] { apply_mish(v) } else { v * sigmoid(v) };
    y[i] = F::cast_from(out);
}

#[cube(launch)]
fn act_backward_kernel<F: Float>(x: &Tensor<F>, dy: &Tensor<F>, dx: &mut Tensor<F>, n: u32, #[comptime] mish: bool, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    let v = f32::cast_from(x[i]);
    let d = if comptime![mish] {
        mish_slope(v)
    } else {
        let s = sigmoid(v);
        s * (v * (1.0f32 - s) + 1.0f32)
    };
    dx[i] = F::cast_from(f32::cast_from(dy[i]) * d);
}

/// `act(x)` in `x`'s dtype and dense layout, in place when `x`'s buffer is its alone (not when
/// an autodiff node keeps `x`). At most `u32::MAX` elements.
pub fn forward<R: CubeRuntime>(x: CubeTensor<R>, act: Act) -> CubeTensor<R> {
    let x = dense_or_copy(x);
    let (client, count, dim, n, dtype) = elem_launch(&x);
    let (y, y_arg) = elem_out(&x, 0);
    act_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), y_arg, n, act.mish(), dtype);
    y
}

/// `dL/dx` from the input `x` and `dy` (one dtype), in `dy`'s layout: both read as they are when
/// they share one dense layout, else both made contiguous first. In place in `dy`'s buffer when
/// it is its alone.
pub fn backward<R: CubeRuntime>(x: CubeTensor<R>, dy: CubeTensor<R>, act: Act) -> CubeTensor<R> {
    let (x, dy) = one_dense_layout(x, dy);
    let (client, count, dim, n, dtype) = elem_launch(&dy);
    let (dx, dx_arg) = elem_out(&dy, 1);
    act_backward_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), dy.into_tensor_arg(), dx_arg, n, act.mish(), dtype);
    dx
}
