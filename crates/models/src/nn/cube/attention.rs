//! Launches of a multi-head attention (`nn::lean`'s attention node on CubeCL), each in place of
//! several:
//!
//! - [`heads`]: a projection's product `[n·rows, parts·d]` plus its bias, split into heads,
//!   written `[parts·n, h, rows, hd]` contiguous: the layout the products read without a copy.
//!   Composed, that is Burn's broadcast add, then a copy of each head view where a product
//!   reads it (`q` was scaled into a new tensor instead).
//! - [`softmax`]: `softmax(scale · x + mask)` along the last axis of the scores `[n, h, l, s]`
//!   (f32) with the key padding mask `[n, s]` (0 or −∞) broadcast over heads and queries, and
//!   the dropout of the result, in one launch with two outputs (the softmax, which the backward
//!   keeps, and its dropout, which the product with `v` reads). Composed: a scaling of `q`, the
//!   mask's add, the softmax and the dropout.
//! - [`softmax_backward`]: the scores' gradient from the kept softmax and the gradient of its
//!   dropout: the dropout's backward, the softmax's and the scale in one launch (composed:
//!   three).
//!
//! The two softmax launches are [`super::softmax`]'s kernels with their options (scale, mask,
//! dropout), which the plain softmax leaves off. The values are those of the composed ops in
//! the same order: the bias added in the input's dtype, as Burn's add; the scale and mask
//! applied to the f32 scores, then the softmax (three passes per row, one cube per row); the
//! dropout's flags are the dropout kernel's for the output's (contiguous) element index, its
//! kept values `y · scale`.
//! PyTorch scales `q` before the product instead; where the scale is a power of two (ACT's
//! head size 64) the two agree exactly.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{contiguous, elem_cubes, empty};

/// Output element `o` of `[parts·n, h, rows, hd]` (`(part, batch, head, row, e)`) is input
/// element `(batch·rows + row, part·d + head·hd + e)` of `x` `[n·rows, width]` plus the bias
/// at that column.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn heads_kernel<F: Float>(x: &Tensor<F>, b: &Tensor<F>, y: &mut Tensor<F>, total: u32, n: u32, heads: u32, rows: u32, hd: u32, width: u32, #[define(F)] _dtype: StorageType) {
    let o = ABSOLUTE_POS;
    if o >= total as usize {
        terminate!();
    }
    let (n, heads, rows, hd) = (n as usize, heads as usize, rows as usize, hd as usize);
    let e = o % hd;
    let t = o / hd;
    let row = t % rows;
    let t = t / rows;
    let head = t % heads;
    let t = t / heads;
    let batch = t % n;
    let part = t / n;
    let col = (part * heads + head) * hd + e;
    y[o] = x[(batch * rows + row) * width as usize + col] + b[col];
}

/// Whether [`heads`] takes `x` `[n·rows, width]` and `b` `[width]` (one dtype) split into
/// `parts` projections of `heads` heads: every count divides, at most `u32::MAX` elements.
pub fn heads_handles(x_dims: &[usize], x_dtype: DType, b_dims: &[usize], b_dtype: DType, n: usize, heads: usize, parts: usize) -> bool {
    let [rows, width] = x_dims else { return false };
    let fits = n > 0 && heads > 0 && parts > 0 && rows % n == 0 && width % (parts * heads) == 0;
    fits && *width > 0 && b_dims == [*width] && x_dtype == b_dtype && rows * width <= u32::MAX as usize
}

/// `x + b` split into heads ([`heads_handles`]): `[parts·n, heads, rows, hd]` contiguous, in
/// `x`'s dtype, `rows = x.rows / n`, `hd = width / (parts · heads)`.
pub fn heads<R: CubeRuntime>(x: CubeTensor<R>, b: CubeTensor<R>, n: usize, heads: usize, parts: usize) -> CubeTensor<R> {
    let (x, b) = (contiguous(x), contiguous(b));
    let [all_rows, width] = [x.meta.shape()[0], x.meta.shape()[1]];
    let (rows, hd) = (all_rows / n, width / (parts * heads));
    let y = empty(&x, vec![parts * n, heads, rows, hd], x.dtype);
    let total = all_rows * width;
    let client = x.client.clone();
    let (count, dim) = elem_cubes(&client, total);
    let dtype: StorageType = x.dtype.into();
    heads_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), b.into_tensor_arg(), y.clone().into_tensor_arg(), total as u32, n as u32, heads as u32, rows as u32, hd as u32, width as u32, dtype);
    y
}

/// Whether [`softmax`] takes the scores `x` (f32 `[n, h, l, s]`, at most `u32::MAX` elements)
/// and the mask (f32 `[n, s]`).
pub fn softmax_handles(x_dims: &[usize], x_dtype: DType, mask: Option<(&[usize], DType)>) -> bool {
    let [n, _, _, s] = x_dims else { return false };
    let total = x_dims.iter().product::<usize>();
    let mask_fits = mask.is_none_or(|(dims, dtype)| dims == [*n, *s] && dtype == DType::F32);
    x_dtype == DType::F32 && total > 0 && total <= u32::MAX as usize && mask_fits
}

/// `(softmax(scale · x + mask), its dropout)` along the last axis of `x` ([`softmax_handles`]),
/// both contiguous f32; without `dropout` the second is the first. `dropout`: `(hash base,
/// threshold, keep scale)`.
pub fn softmax<R: CubeRuntime>(x: CubeTensor<R>, mask: Option<CubeTensor<R>>, scale: f32, dropout: Option<(u64, u64, f32)>) -> (CubeTensor<R>, CubeTensor<R>) {
    // The mask's row `[s]` of batch item `i` serves the `h · l` score rows of that item.
    let dims = x.meta.shape().to_vec();
    super::softmax::forward_with(x, mask.map(|m| (m, dims[1] * dims[2])), scale, dropout)
}

/// Whether [`softmax_backward`] takes the softmax's output and its gradient: both f32, of one
/// shape, at most `u32::MAX` elements.
pub fn softmax_backward_handles(y_dims: &[usize], y_dtype: DType, dy_dims: &[usize], dy_dtype: DType) -> bool {
    let total = y_dims.iter().product::<usize>();
    y_dims == dy_dims && !y_dims.is_empty() && y_dtype == DType::F32 && dy_dtype == DType::F32 && total > 0 && total <= u32::MAX as usize
}

/// The gradient of [`softmax`]'s scores from its kept output `y` and the gradient `dy` of its
/// dropout (or of itself, without `dropout`): `scale · y · (g − Σ g · y)` along the last axis, `g`
/// the dropout's backward of `dy`; contiguous f32 ([`softmax_backward_handles`]).
pub fn softmax_backward<R: CubeRuntime>(y: CubeTensor<R>, dy: CubeTensor<R>, scale: f32, dropout: Option<(u64, u64, f32)>) -> CubeTensor<R> {
    super::softmax::backward_with(y, dy, scale, dropout)
}
