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
//!
//! The conditioning's linear layer (`cond_encoder.1`) can leave its bias to these kernels: `e`
//! is then its product without the bias, `b` (`[2c]`) the bias, and the kernels read `e[b, ch] +
//! b[ch]` (rounded to the dtype, as the bias add would have written it). That saves the bias
//! add's launch forward and, with one unit per channel summing over the batch too, its
//! gradient's reduction backward (`db = Σ_b de`): 2 of Diffusion's launches a block.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{contiguous, dense_or_copy, elem_cubes, elem_launch, elem_out, empty};

/// `y[i] = x[i] · e[n, ch] (+ e[n, c + ch])` with `n = (i / batch) % batches` and `ch = (i /
/// channel) % channels` for the buffer index `i` of a dense `x` (`batch`, `channel`: its strides
/// along those axes); `e` contiguous `[batches, 2·channels]`, plus `b` (`[2·channels]`, the
/// linear layer's bias) where `with_bias`, the sums rounded to `F`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn film_kernel<F: Float>(x: &Tensor<F>, e: &Tensor<F>, b: &Tensor<F>, y: &mut Tensor<F>, n: u32, batch: u32, batches: u32, channel: u32, channels: u32, #[comptime] with_shift: bool, #[comptime] with_bias: bool, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    let channels = channels as usize;
    let ch = (i / channel as usize) % channels;
    let row = (i / batch as usize) % batches as usize * 2 * channels + ch;
    let v = f32::cast_from(x[i]) * embed_at(e, b, row, ch, with_bias);
    if comptime![with_shift] {
        y[i] = F::cast_from(v + embed_at(e, b, row + channels, ch + channels, with_bias));
    } else {
        y[i] = F::cast_from(v);
    }
}

/// `e[at]` (+ `b[ch]`, rounded to `F` as the bias add writes it) in f32.
#[cube]
fn embed_at<F: Float>(e: &Tensor<F>, b: &Tensor<F>, at: usize, ch: usize, #[comptime] with_bias: bool) -> f32 {
    let mut v = f32::cast_from(e[at]);
    if comptime![with_bias] {
        v = f32::cast_from(F::cast_from(v + f32::cast_from(b[ch])));
    }
    v
}

/// Unit `r = n · channels + ch`: `de[n, ch] = Σ_t dy[n, ch, t] · x[n, ch, t]` and `de[n, channels
/// + ch] = Σ_t dy[n, ch, t]`, in f32, over `t` in order; `x` and `dy` read through their strides
/// along batch, channel and time (`x_*`, `d_*`). With `bias_grad`, unit `r = ch` does every `n`
/// in turn and writes the bias's gradient, `db[ch] = Σ_n de[n, ch]` and `db[channels + ch] =
/// Σ_n de[n, channels + ch]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn embed_grad_kernel<F: Float>(
    x: &Tensor<F>,
    dy: &Tensor<F>,
    de: &mut Tensor<F>,
    db: &mut Tensor<F>,
    batches: u32,
    channels: u32,
    len: u32,
    x_n: u32,
    x_c: u32,
    x_t: u32,
    d_n: u32,
    d_c: u32,
    d_t: u32,
    #[comptime] bias_grad: bool,
    #[define(F)] _dtype: StorageType,
) {
    let r = ABSOLUTE_POS;
    let channels = channels as usize;
    let mut units = batches as usize * channels;
    if comptime![bias_grad] {
        units = channels;
    }
    if r >= units {
        terminate!();
    }
    let ch = r % channels;
    let mut n = r / channels;
    let mut n_end = n + 1;
    if comptime![bias_grad] {
        n_end = batches as usize;
    }
    let (xt, dt) = (x_t as usize, d_t as usize);
    let mut b_prod = 0.0f32;
    let mut b_sum = 0.0f32;
    while n < n_end {
        let xb = n * x_n as usize + ch * x_c as usize;
        let db0 = n * d_n as usize + ch * d_c as usize;
        let mut prod = 0.0f32;
        let mut sum = 0.0f32;
        for t in 0..len as usize {
            let g = f32::cast_from(dy[db0 + t * dt]);
            prod += g * f32::cast_from(x[xb + t * xt]);
            sum += g;
        }
        let out = n * 2 * channels + ch;
        de[out] = F::cast_from(prod);
        de[out + channels] = F::cast_from(sum);
        b_prod += prod;
        b_sum += sum;
        n += 1;
    }
    if comptime![bias_grad] {
        db[ch] = F::cast_from(b_prod);
        db[ch + channels] = F::cast_from(b_sum);
    }
}

/// Whether [`film`] and [`embed_grad`] take `x` (`[b, c, t]`, at most `u32::MAX` elements),
/// `embed` (`[b, 2c]`) and the bias if any (`[2c]`), of one dtype.
pub fn handles(x_dims: &[usize], embed_dims: &[usize], bias_dims: Option<&[usize]>, x_dtype: DType, embed_dtype: DType, bias_dtype: Option<DType>) -> bool {
    let n: usize = x_dims.iter().product();
    x_dims.len() == 3
        && n > 0
        && n <= u32::MAX as usize
        && embed_dims == [x_dims[0], 2 * x_dims[1]]
        && x_dtype == embed_dtype
        && bias_dims.is_none_or(|d| d == [2 * x_dims[1]])
        && bias_dtype.is_none_or(|t| t == x_dtype)
}

/// `x · (embed + bias)[:, :c, None] + (embed + bias)[:, c:, None]` (`with_shift`), or without
/// the shift `x · (embed + bias)[:, :c, None]` (the input gradient, `x` standing for `dy`), the
/// bias (`[2c]`) where given; in `x`'s dense layout and dtype; in place when `x`'s buffer is its
/// alone.
pub fn film<R: CubeRuntime>(x: CubeTensor<R>, embed: CubeTensor<R>, bias: Option<CubeTensor<R>>, with_shift: bool) -> CubeTensor<R> {
    let x = dense_or_copy(x);
    let (batches, channels) = (x.meta.shape()[0], x.meta.shape()[1]);
    let (batch, channel) = (x.meta.strides()[0], x.meta.strides()[1]);
    let embed = contiguous(embed);
    let with_bias = bias.is_some();
    // Without a bias the kernel does not read `b`: `embed` stands in for the binding.
    let bias = bias.map(contiguous).unwrap_or_else(|| embed.clone());
    let (client, count, dim, n, dtype) = elem_launch(&x);
    let (y, y_arg) = elem_out(&x, 0);
    film_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), embed.into_tensor_arg(), bias.into_tensor_arg(), y_arg, n, batch.max(1) as u32, batches as u32, channel.max(1) as u32, channels as u32, with_shift, with_bias, dtype);
    y
}

/// The gradient of `embed` (`[b, 2c]`, contiguous, in `dy`'s dtype) from `x` and `dy` (`[b, c,
/// t]`, any layouts), and with `bias_grad` the bias's (`[2c]`, its sum over the batch) in the
/// same launch.
pub fn embed_grad<R: CubeRuntime>(x: CubeTensor<R>, dy: CubeTensor<R>, bias_grad: bool) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    let [batches, channels, len] = [0, 1, 2].map(|d| dy.meta.shape()[d]);
    let de = empty(&dy, vec![batches, 2 * channels], dy.dtype);
    let db = bias_grad.then(|| empty(&dy, vec![2 * channels], dy.dtype));
    let s = |t: &CubeTensor<R>| -> [u32; 3] { [0, 1, 2].map(|d| t.meta.strides()[d] as u32) };
    let ([x_n, x_c, x_t], [d_n, d_c, d_t]) = (s(&x), s(&dy));
    let client = dy.client.clone();
    let (count, dim) = elem_cubes(&client, if bias_grad { channels } else { batches * channels });
    let dtype: StorageType = dy.dtype.into();
    // Without the bias's gradient the kernel writes no `db`: one element stands in for the
    // binding (not `de`: two writable bindings of one buffer are not allowed on wgpu).
    let db_arg = db.clone().unwrap_or_else(|| empty(&dy, vec![1], dy.dtype));
    embed_grad_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), dy.into_tensor_arg(), de.clone().into_tensor_arg(), db_arg.into_tensor_arg(), batches as u32, channels as u32, len as u32, x_n, x_c, x_t, d_n, d_c, d_t, bias_grad, dtype);
    (de, db)
}
