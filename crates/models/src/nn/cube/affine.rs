//! The frozen batch norm's two ops (ResNet-18's `FrozenBatchNorm2d`, ACT's backbone), one launch
//! each instead of eight composed ones per norm: on CubeCL the composed forward computed
//! `scale = weight · (running_var + eps).sqrt().recip()` and `shift = bias − running_mean ·
//! scale` as six launches over `[c]` vectors (add, sqrt, recip, two multiplies, a subtraction),
//! then `x · scale + shift` as two more over the map: 160 launches a step for ACT's 20 norms.
//!
//! - [`scale_shift`]: both `[c]` vectors from the four buffers, one unit per channel, in the
//!   composed ops' order (`1 / sqrt(var + eps)`, then the products), so f32 values agree with
//!   them to rounding;
//! - [`channel_affine`]: `y = x · scale[c] (+ shift[c])` over `x`'s buffer as it is laid out
//!   (any dense layout: a convolution's channels-last output is neither copied nor returned in
//!   another layout), the channel of an element read off `x`'s channel stride; in place when
//!   `x`'s buffer is its alone. Also the node's backward (`dx = dy · scale`, no shift).
//! - [`affine_relu`]: `max(x · scale + shift (+ r), 0)`, the norm and the ReLU after it (and
//!   ResNet's residual add between them) in one launch instead of two (three), and
//!   [`affine_relu_backward`]: `g = dy where y > 0`, `dx = g · scale` (and `g` itself, the
//!   residual's gradient) in one launch instead of two. f32 values are those of the separate
//!   kernels: the same operations in the same order.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{contiguous, dense_or_copy, elem_cubes, elem_launch, elem_out, empty, new_like, one_dense_layout};

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn scale_shift_kernel<F: Float>(w: &Tensor<F>, b: &Tensor<F>, mean: &Tensor<F>, var: &Tensor<F>, scale: &mut Tensor<F>, shift: &mut Tensor<F>, c: u32, eps: f32, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= c as usize {
        terminate!();
    }
    let s = F::cast_from(f32::cast_from(w[i]) * (1.0f32 / (f32::cast_from(var[i]) + eps).sqrt()));
    scale[i] = s;
    shift[i] = F::cast_from(f32::cast_from(b[i]) - f32::cast_from(mean[i]) * f32::cast_from(s));
}

/// `y[i] = x[i] · scale[ch] (+ shift[ch])`, `ch = (i / channel) % channels` for the buffer index
/// `i` of a dense tensor whose channel axis has stride `channel`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn affine_kernel<F: Float>(x: &Tensor<F>, scale: &Tensor<F>, shift: &Tensor<F>, y: &mut Tensor<F>, n: u32, channel: u32, channels: u32, #[comptime] with_shift: bool, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    let ch = (i / channel as usize) % channels as usize;
    let mut v = f32::cast_from(x[i]) * f32::cast_from(scale[ch]);
    if comptime![with_shift] {
        v += f32::cast_from(shift[ch]);
    }
    y[i] = F::cast_from(v);
}

/// Whether [`scale_shift`] takes these buffers: four `[c]` vectors of one dtype.
pub fn scale_shift_handles(dims: &[&[usize]], dtypes: &[DType]) -> bool {
    dims.iter().all(|d| d.len() == 1 && d[0] == dims[0][0] && d[0] > 0) && dtypes.iter().all(|&t| t == dtypes[0])
}

/// `(scale, shift)`, contiguous `[c]` in the buffers' dtype.
pub fn scale_shift<R: CubeRuntime>(w: CubeTensor<R>, b: CubeTensor<R>, mean: CubeTensor<R>, var: CubeTensor<R>, eps: f64) -> (CubeTensor<R>, CubeTensor<R>) {
    let [w, b, mean, var] = [w, b, mean, var].map(contiguous);
    let c = w.meta.shape()[0];
    let scale = empty(&w, vec![c], w.dtype);
    let shift = empty(&w, vec![c], w.dtype);
    let client = w.client.clone();
    let (count, dim) = elem_cubes(&client, c);
    let dtype: StorageType = w.dtype.into();
    scale_shift_kernel::launch::<R>(&client, count, dim, w.into_tensor_arg(), b.into_tensor_arg(), mean.into_tensor_arg(), var.into_tensor_arg(), scale.clone().into_tensor_arg(), shift.clone().into_tensor_arg(), c as u32, eps as f32, dtype);
    (scale, shift)
}

/// Whether [`channel_affine`] takes `x` (`[n, c, …]`, rank ≥ 2, at most `u32::MAX` elements) with
/// `[c]` parameters of its dtype.
pub fn affine_handles(x_dims: &[usize], x_dtype: DType, params: &[(&[usize], DType)]) -> bool {
    let n: usize = x_dims.iter().product();
    x_dims.len() >= 2 && n > 0 && n <= u32::MAX as usize && params.iter().all(|(d, t)| d.len() == 1 && d[0] == x_dims[1] && *t == x_dtype)
}

/// `x · scale + shift` per channel (`shift` optional), in `x`'s dense layout and dtype.
pub fn channel_affine<R: CubeRuntime>(x: CubeTensor<R>, scale: CubeTensor<R>, shift: Option<CubeTensor<R>>) -> CubeTensor<R> {
    let x = dense_or_copy(x);
    let (channels, channel) = (x.meta.shape()[1], x.meta.strides()[1]);
    let scale = contiguous(scale);
    let with_shift = shift.is_some();
    // Without a shift the kernel never reads its `shift` argument: `scale` stands in for it.
    let shift = shift.map(contiguous).unwrap_or_else(|| scale.clone());
    let (client, count, dim, n, dtype) = elem_launch(&x);
    let (y, y_arg) = elem_out(&x, 0);
    affine_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), scale.into_tensor_arg(), shift.into_tensor_arg(), y_arg, n, channel.max(1) as u32, channels as u32, with_shift, dtype);
    y
}

/// `y[i] = max(x[i] · scale[ch] + shift[ch] (+ r[i]), 0)` ([`affine_kernel`]'s indexing; `r` in
/// `x`'s layout). `v ≤ 0 → 0`, so NaN passes, as [`super::relu`]'s.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn affine_relu_kernel<F: Float>(x: &Tensor<F>, scale: &Tensor<F>, shift: &Tensor<F>, r: &Tensor<F>, y: &mut Tensor<F>, n: u32, channel: u32, channels: u32, #[comptime] with_residual: bool, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    let ch = (i / channel as usize) % channels as usize;
    let mut v = f32::cast_from(x[i]) * f32::cast_from(scale[ch]);
    v += f32::cast_from(shift[ch]);
    if comptime![with_residual] {
        v += f32::cast_from(r[i]);
    }
    y[i] = F::cast_from(select(v <= 0.0f32, 0.0f32, v));
}

/// `g = dy where y > 0, else 0`; `dx[i] = g · scale[ch]`, and `g[i]` itself when `with_g`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn affine_relu_backward_kernel<F: Float>(y: &Tensor<F>, dy: &Tensor<F>, scale: &Tensor<F>, dx: &mut Tensor<F>, g: &mut Tensor<F>, n: u32, channel: u32, channels: u32, #[comptime] with_g: bool, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    let ch = (i / channel as usize) % channels as usize;
    let gv = select(y[i] <= F::new(0.0), F::new(0.0), dy[i]);
    dx[i] = F::cast_from(f32::cast_from(gv) * f32::cast_from(scale[ch]));
    if comptime![with_g] {
        g[i] = gv;
    }
}

/// Whether [`affine_relu`] takes `x` with `[c]` parameters and the residual `r` (each in `x`'s
/// dims and dtype): [`affine_handles`] for the parameters, and `r` like `x`.
pub fn affine_relu_handles(x_dims: &[usize], x_dtype: DType, params: &[(&[usize], DType)], residual: Option<(&[usize], DType)>) -> bool {
    affine_handles(x_dims, x_dtype, params) && residual.is_none_or(|(d, t)| d == x_dims && t == x_dtype)
}

/// `max(x · scale + shift (+ r), 0)` per channel, in `x`'s dense layout (`r` read in it too: both
/// are made contiguous where their layouts differ) and dtype; in place when `x`'s buffer is its
/// alone.
pub fn affine_relu<R: CubeRuntime>(x: CubeTensor<R>, scale: CubeTensor<R>, shift: CubeTensor<R>, r: Option<CubeTensor<R>>) -> CubeTensor<R> {
    let (x, r) = match r {
        Some(r) => {
            let (x, r) = one_dense_layout(x, r);
            (x, Some(r))
        }
        None => (dense_or_copy(x), None),
    };
    let (channels, channel) = (x.meta.shape()[1], x.meta.strides()[1]);
    let (scale, shift) = (contiguous(scale), contiguous(shift));
    let with_residual = r.is_some();
    // Without a residual the kernel never reads its `r` argument: `shift` stands in for it.
    let r = r.unwrap_or_else(|| shift.clone());
    let (client, count, dim, n, dtype) = elem_launch(&x);
    let (y, y_arg) = elem_out(&x, 0);
    affine_relu_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), scale.into_tensor_arg(), shift.into_tensor_arg(), r.into_tensor_arg(), y_arg, n, channel.max(1) as u32, channels as u32, with_residual, dtype);
    y
}

/// [`affine_relu`]'s backward from its output `y`: `(dx, g)` with `g = dy where y > 0` (the
/// residual's gradient, only when `with_g`) and `dx = g · scale`, in `dy`'s layout (`y` and `dy`
/// in one dense layout are read as they are, else both made contiguous first). `g` is written in
/// `dy`'s buffer when it is its alone (else `dx` is, without `g`).
pub fn affine_relu_backward<R: CubeRuntime>(y: CubeTensor<R>, scale: CubeTensor<R>, dy: CubeTensor<R>, with_g: bool) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    let (y, dy) = one_dense_layout(y, dy);
    let (channels, channel) = (dy.meta.shape()[1], dy.meta.strides()[1]);
    let scale = contiguous(scale);
    let (client, count, dim, n, dtype) = elem_launch(&dy);
    let (dx, dx_arg, g, g_arg) = if with_g {
        let dx = new_like(&dy);
        let (g, g_arg) = elem_out(&dy, 1);
        (dx.clone(), dx.into_tensor_arg(), Some(g), g_arg)
    } else {
        let (dx, dx_arg) = elem_out(&dy, 1);
        // Without `g` the kernel never writes its `g` argument: one element stands in for it (not
        // an input's buffer: a writable binding may not alias a read one).
        (dx, dx_arg, None, empty(&dy, vec![1], dy.dtype).into_tensor_arg())
    };
    affine_relu_backward_kernel::launch::<R>(&client, count, dim, y.into_tensor_arg(), dy.into_tensor_arg(), scale.into_tensor_arg(), dx_arg, g_arg, n, channel.max(1) as u32, channels as u32, with_g, dtype);
    (dx, g)
}
