//! FiLM, Diffusion Policy's conditioning in each residual block of its UNet
//! (`DiffusionConditionalResidualBlock1d` with `use_film_scale_modulation`): `y = x · scale +
//! bias`, `x: [b, c, t]`, `(scale, bias)` the two halves of the conditioning's `embed: [b, 2c]`,
//! broadcast along `t`. Composed, that is a broadcast multiply and an add forward, and
//! backward the two products, two reductions, and for each half of `embed` a zero fill and a
//! slice assignment, added together: two launches forward and nine backward (on lavapipe, Diffusion
//! b8: 1,408 → 1,312 launches a step). Here one launch forward and two backward:
//!
//! - [`film`]: `y = x · e[b, ch] + e[b, c + ch]` over `x`'s buffer as it is laid out (any dense
//!   layout: a convolution's channels-last output is neither copied nor returned in another
//!   layout), the batch and channel of an element read off `x`'s strides; in place when `x`'s
//!   buffer is its alone. Without the bias it is the input gradient (`dx = dy · scale`);
//! - [`embed_grad`]: `de[b, ch] = Σ_t dy · x` and `de[b, c + ch] = Σ_t dy`, one unit per
//!   `(b, ch)` summing its `t` elements in order, in f32, written straight into the `[b, 2c]`
//!   gradient; `x` and `dy` are read through their own strides, any layout.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{contiguous, dense_or_copy, elem_cubes, elem_launch, elem_out, empty};

/// `y[i] = x[i] · e[n, ch] (+ e[n, c + ch])` with `n = (i / batch) % batches` and `ch = (i /
/// channel) % channels` for the buffer index `i` of a dense `x` (`batch`, `channel`: its strides
/// along those axes); `e` contiguous `[batches, 2·channels]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn film_kernel<F: Float>(x: &Tensor<F>, e: &Tensor<F>, y: &mut Tensor<F>, n: u32, batch: u32, batches: u32, channel: u32, channels: u32, #[comptime] with_bias: bool, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    let channels = channels as usize;
    let row = (i / batch as usize) % batches as usize * 2 * channels + (i / channel as usize) % channels;
    let mut v = f32::cast_from(x[i]) * f32::cast_from(e[row]);
    if comptime![with_bias] {
        v += f32::cast_from(e[row + channels]);
    }
    y[i] = F::cast_from(v);
}

/// Unit `r = n · channels + ch`: `de[n, ch] = Σ_t dy[n, ch, t] · x[n, ch, t]` and `de[n, channels
/// + ch] = Σ_t dy[n, ch, t]`, in f32, over `t` in order; `x` and `dy` read through their strides
/// along batch, channel and time (`x_*`, `d_*`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn embed_grad_kernel<F: Float>(x: &Tensor<F>, dy: &Tensor<F>, de: &mut Tensor<F>, batches: u32, channels: u32, len: u32, x_n: u32, x_c: u32, x_t: u32, d_n: u32, d_c: u32, d_t: u32, #[define(F)] _dtype: StorageType) {
    let r = ABSOLUTE_POS;
    let channels = channels as usize;
    if r >= batches as usize * channels {
        terminate!();
    }
    let (n, ch) = (r / channels, r % channels);
    let xb = n * x_n as usize + ch * x_c as usize;
    let db = n * d_n as usize + ch * d_c as usize;
    let (xt, dt) = (x_t as usize, d_t as usize);
    let mut prod = 0.0f32;
    let mut sum = 0.0f32;
    for t in 0..len as usize {
        let g = f32::cast_from(dy[db + t * dt]);
        prod += g * f32::cast_from(x[xb + t * xt]);
        sum += g;
    }
    let out = n * 2 * channels + ch;
    de[out] = F::cast_from(prod);
    de[out + channels] = F::cast_from(sum);
}

/// Whether [`film`] and [`embed_grad`] take `x` (`[b, c, t]`, at most `u32::MAX` elements) and
/// `embed` (`[b, 2c]`) of one dtype.
pub fn handles(x_dims: &[usize], embed_dims: &[usize], x_dtype: DType, embed_dtype: DType) -> bool {
    let n: usize = x_dims.iter().product();
    x_dims.len() == 3 && n > 0 && n <= u32::MAX as usize && embed_dims == [x_dims[0], 2 * x_dims[1]] && x_dtype == embed_dtype
}

/// `x · embed[:, :c, None] + embed[:, c:, None]` (`with_bias`), or without the bias `x ·
/// embed[:, :c, None]` (the input gradient, `x` standing for `dy`), in `x`'s dense layout and
/// dtype; in place when `x`'s buffer is its alone.
pub fn film<R: CubeRuntime>(x: CubeTensor<R>, embed: CubeTensor<R>, with_bias: bool) -> CubeTensor<R> {
    let x = dense_or_copy(x);
    let (batches, channels) = (x.meta.shape()[0], x.meta.shape()[1]);
    let (batch, channel) = (x.meta.strides()[0], x.meta.strides()[1]);
    let embed = contiguous(embed);
    let (client, count, dim, n, dtype) = elem_launch(&x);
    let (y, y_arg) = elem_out(&x, 0);
    film_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), embed.into_tensor_arg(), y_arg, n, batch.max(1) as u32, batches as u32, channel.max(1) as u32, channels as u32, with_bias, dtype);
    y
}

/// The gradient of `embed` (`[b, 2c]`, contiguous, in `dy`'s dtype) from `x` and `dy` (`[b, c,
/// t]`, any layouts).
pub fn embed_grad<R: CubeRuntime>(x: CubeTensor<R>, dy: CubeTensor<R>) -> CubeTensor<R> {
    let [batches, channels, len] = [0, 1, 2].map(|d| dy.meta.shape()[d]);
    let de = empty(&dy, vec![batches, 2 * channels], dy.dtype);
    let s = |t: &CubeTensor<R>| -> [u32; 3] { [0, 1, 2].map(|d| t.meta.strides()[d] as u32) };
    let ([x_n, x_c, x_t], [d_n, d_c, d_t]) = (s(&x), s(&dy));
    let client = dy.client.clone();
    let (count, dim) = elem_cubes(&client, batches * channels);
    let dtype: StorageType = dy.dtype.into();
    embed_grad_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), dy.into_tensor_arg(), de.clone().into_tensor_arg(), batches as u32, channels as u32, len as u32, x_n, x_c, x_t, d_n, d_c, d_t, dtype);
    de
}
