//! Linear upsampling along one axis by an integer factor (PyTorch's `interpolate(mode="linear" /
//! "trilinear", align_corners=False)`, one axis at a time: `lean::upsample_linear`), forward and
//! backward one launch each, in the input's dense layout. Composed, each axis is two gathers, two
//! broadcast multiplies and an add forward, and a zero fill, two multiplies and two scatter-adds
//! backward, with the index and weight tables uploaded every call.
//!
//! Any dense tensor is `[outer, n, inner]` in its buffer along axis `dim`, with `inner` the axis's
//! stride: a convolution's channels-last output upsampled along a spatial axis as well as a
//! contiguous one. The result is laid out in the input's order of axes, so the convolution after
//! it finds it channels last again. Source positions as PyTorch computes them (`nn::
//! linear_source_indices`): `src = max((j + ½)/scale − ½, 0)`, `i0 = ⌊src⌋`, `i1 = min(i0 + 1,
//! n − 1)`, `λ = src − i0`. Compute is f32; values in the input's dtype.

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{contiguous, dense, elem_cubes, empty};

/// Output position `j`'s source position along the axis (before flooring), as PyTorch's
/// `area_pixel_compute_source_index` with `align_corners=False`.
#[cube]
fn source(j: usize, inv: f32) -> f32 {
    max(inv * (f32::cast_from(j) + 0.5) - 0.5, 0.0)
}

/// One unit per output element (`[outer, n_in·scale, inner]` in the buffer).
#[cube(launch)]
fn forward_kernel<F: Float>(x: &Tensor<F>, y: &mut Tensor<F>, n_in: u32, scale: u32, inner: u32, inv: f32, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= y.len() {
        terminate!();
    }
    let (n_in, inner) = (n_in as usize, inner as usize);
    let n_out = n_in * scale as usize;
    let k = i % inner;
    let j = (i / inner) % n_out;
    let o = i / (inner * n_out);
    let src = source(j, inv);
    let i0 = min(u32::cast_from(src) as usize, n_in - 1);
    let i1 = min(i0 + 1, n_in - 1);
    let l = src - f32::cast_from(i0);
    let base = o * n_in * inner + k;
    let v = f32::cast_from(x[base + i0 * inner]) * (1.0 - l) + f32::cast_from(x[base + i1 * inner]) * l;
    y[i] = F::cast_from(v);
}

/// One unit per input-gradient element (`[outer, n_in, inner]` in the buffer): the sum, in f32
/// and in output order, of the output rows `j` that read row `r` (`i0 = r`: weight `1 − λ`;
/// `i1 = r`: `λ`; both at the clamped last row). They lie in `[(r − 1)·scale, (r + 2)·scale)`.
#[cube(launch)]
fn backward_kernel<F: Float>(dy: &Tensor<F>, dx: &mut Tensor<F>, n_in: u32, scale: u32, inner: u32, inv: f32, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= dx.len() {
        terminate!();
    }
    let (n_in, scale, inner) = (n_in as usize, scale as usize, inner as usize);
    let n_out = n_in * scale;
    let k = i % inner;
    let r = (i / inner) % n_in;
    let o = i / (inner * n_in);
    let base = o * n_out * inner + k;
    let mut acc = 0.0f32;
    let mut j = (max(r, 1) - 1) * scale;
    let end = min((r + 2) * scale, n_out);
    while j < end {
        let src = source(j, inv);
        let i0 = min(u32::cast_from(src) as usize, n_in - 1);
        let i1 = min(i0 + 1, n_in - 1);
        let l = src - f32::cast_from(i0);
        let mut w = 0.0f32;
        if i0 == r {
            w += 1.0 - l;
        }
        if i1 == r {
            w += l;
        }
        // Rows with weight 0 are skipped, not multiplied: an infinite gradient there stays out.
        if w != 0.0 {
            acc += w * f32::cast_from(dy[base + j * inner]);
        }
        j += 1;
    }
    dx[i] = F::cast_from(acc);
}

/// Whether [`forward`] / [`backward`] take `x` (`n` elements): at most `u32::MAX` elements, as
/// the kernels index in `u32`.
pub fn handles(n: usize) -> bool {
    n > 0 && n <= u32::MAX as usize
}

/// `x` (dense, axis `dim` longer than 1), or a contiguous copy; with its length `n` and stride
/// `inner` along `dim` (the buffer is `[outer, n, inner]`).
fn along<R: CubeRuntime>(x: CubeTensor<R>, dim: usize) -> (CubeTensor<R>, usize, usize) {
    let x = if dense(&x) && x.meta.shape()[dim] > 1 { x } else { contiguous(x) };
    let (n, inner) = (x.meta.shape()[dim], x.meta.strides()[dim]);
    (x, n, inner)
}

/// A new tensor of `dims` laid out as `like` (its axes in `like`'s order of strides), so that
/// axis `dim`, resized, keeps `like`'s stride.
fn new_in_order<R: CubeRuntime>(like: &CubeTensor<R>, dims: Vec<usize>) -> CubeTensor<R> {
    let strides = like.meta.strides();
    let mut order: Vec<usize> = (0..dims.len()).collect();
    order.sort_by_key(|&d| std::cmp::Reverse(strides[d])); // stable: ties keep axis order
    let stored: Vec<usize> = order.iter().map(|&d| dims[d]).collect();
    let mut axes = vec![0; dims.len()];
    for (pos, &d) in order.iter().enumerate() {
        axes[d] = pos;
    }
    burn_cubecl::ops::permute(empty(like, stored, like.dtype), &axes)
}

fn launch<R: CubeRuntime>(x: CubeTensor<R>, dim: usize, scale: usize, backward: bool) -> CubeTensor<R> {
    let (x, n, inner) = along(x, dim);
    let n_in = if backward { n / scale } else { n };
    let mut dims = x.meta.shape().to_vec();
    dims[dim] = if backward { n_in } else { n * scale };
    let out = new_in_order(&x, dims);
    debug_assert_eq!(out.meta.strides()[dim], inner, "upsample: the result's layout along the axis");
    let client = x.client.clone();
    let dtype: StorageType = x.dtype.into();
    let (count, cube_dim) = elem_cubes(&client, out.meta.num_elements());
    let (n_in, scale, inner, inv) = (n_in as u32, scale as u32, inner as u32, 1.0f32 / scale as f32);
    let (x, y) = (x.into_tensor_arg(), out.clone().into_tensor_arg());
    if backward {
        backward_kernel::launch::<R>(&client, count, cube_dim, x, y, n_in, scale, inner, inv, dtype);
    } else {
        forward_kernel::launch::<R>(&client, count, cube_dim, x, y, n_in, scale, inner, inv, dtype);
    }
    out
}

/// `x` upsampled `scale` times along `dim`, in `x`'s layout (dense) or contiguous.
pub fn forward<R: CubeRuntime>(x: CubeTensor<R>, dim: usize, scale: usize) -> CubeTensor<R> {
    launch(x, dim, scale, false)
}

/// The input gradient of [`forward`] from the output gradient `dy` (axis `dim` of length
/// `n·scale`), in `dy`'s layout (dense) or contiguous.
pub fn backward<R: CubeRuntime>(dy: CubeTensor<R>, dim: usize, scale: usize) -> CubeTensor<R> {
    launch(dy, dim, scale, true)
}
