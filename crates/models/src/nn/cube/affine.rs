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

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{contiguous, dense_or_copy, elem_cubes, elem_launch, elem_out, empty};

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
