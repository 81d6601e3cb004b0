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
//! The values are those of the composed ops in the same order: the bias added in the input's
//! dtype, as Burn's add; the scale and mask applied to the f32 scores, then the softmax of
//! [`super::softmax`] (three passes per row, one cube per row); the dropout's flags are the
//! dropout kernel's for the output's (contiguous) element index, its kept values `y · scale`.
//! PyTorch scales `q` before the product instead; where the scale is a power of two (ACT's
//! head size 64) the two agree exactly.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::dropout::{dropped, hash_args};
use super::softmax::cube_max;
use super::{BLOCK, contiguous, cube_row, cube_sum, elem_cubes, empty, row_cubes};

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

/// Score `i` of a row starting at `base`: `x · scale`, plus the mask's entry where `masked`.
#[cube]
fn score(x: &Tensor<f32>, mask: &Tensor<f32>, base: usize, mask_base: usize, i: usize, scale: f32, #[comptime] masked: bool) -> f32 {
    let mut v = x[base + i] * scale;
    if comptime![masked] {
        v += mask[mask_base + i];
    }
    v
}

/// One cube per row of `x` `[rows, len]`: `y = softmax(scale · x + mask[row / mask_every])`
/// (the mask read only where `masked`), and with `drop` `yd` its dropout (element `i` of the
/// tensor dropped as the dropout kernel drops it, else `y · keep`; `yd` not written without).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn softmax_kernel(
    x: &Tensor<f32>,
    mask: &Tensor<f32>,
    y: &mut Tensor<f32>,
    yd: &mut Tensor<f32>,
    rows: u32,
    len: u32,
    scale: f32,
    mask_every: u32,
    base_hi: u32,
    base_lo: u32,
    t_hi: u32,
    t_lo: u32,
    keep: f32,
    #[comptime] masked: bool,
    #[comptime] drop: bool,
) {
    let row = cube_row();
    if row >= rows as usize {
        terminate!();
    }
    let len = len as usize;
    let base = row * len;
    let mask_base = (row / mask_every as usize) * len;
    let u = UNIT_POS_X as usize;
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let mut m = f32::min_value();
    let mut i = u;
    while i < len {
        m = max(m, score(x, mask, base, mask_base, i, scale, masked));
        i += BLOCK;
    }
    let m = cube_max(m, &mut shared);
    let mut s = 0.0f32;
    let mut j = u;
    while j < len {
        s += (score(x, mask, base, mask_base, j, scale, masked) - m).exp();
        j += BLOCK;
    }
    let inv = 1.0f32 / cube_sum(s, &mut shared);
    let mut k = u;
    while k < len {
        let v = (score(x, mask, base, mask_base, k, scale, masked) - m).exp() * inv;
        y[base + k] = v;
        if comptime![drop] {
            yd[base + k] = drop_at(v, base + k, base_hi, base_lo, t_hi, t_lo, keep);
        }
        k += BLOCK;
    }
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
    let x = contiguous(x);
    let dims = x.meta.shape().to_vec();
    let (rows, len) = (dims.iter().product::<usize>() / dims[3], dims[3]);
    let mask_every = dims[1] * dims[2];
    let y = empty(&x, dims.clone(), DType::F32);
    // Without a dropout `yd` is not written: a one-float stand-in (two writable bindings of one
    // buffer are not allowed on wgpu); without a mask `x` stands in for it (read-only).
    let yd = match dropout {
        Some(_) => empty(&x, dims, DType::F32),
        None => empty(&x, vec![1], DType::F32),
    };
    let masked = mask.is_some();
    let mask = mask.map_or_else(|| x.clone(), contiguous);
    let ([base_hi, base_lo, t_hi, t_lo], keep) = drop_args(dropout);
    let (count, dim) = row_cubes(rows);
    let client = x.client.clone();
    softmax_kernel::launch::<R>(
        &client,
        count,
        dim,
        x.into_tensor_arg(),
        mask.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        yd.clone().into_tensor_arg(),
        rows as u32,
        len as u32,
        scale,
        mask_every as u32,
        base_hi,
        base_lo,
        t_hi,
        t_lo,
        keep,
        masked,
        dropout.is_some(),
    );
    if dropout.is_some() { (y, yd) } else { (y.clone(), y) }
}

/// One cube per row of the softmax's output `y` `[rows, len]`: `dx = scale · y · (g − Σ g · y)`
/// with `g` the output gradient `dy`, dropped where the forward dropped (with `drop`: element
/// `i` of the tensor 0 where the dropout kernel drops it, else `dy · keep`), as the dropout's
/// backward, the softmax's and the scale's launches would, in the same order.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn softmax_backward_kernel(
    y: &Tensor<f32>,
    dy: &Tensor<f32>,
    dx: &mut Tensor<f32>,
    rows: u32,
    len: u32,
    scale: f32,
    base_hi: u32,
    base_lo: u32,
    t_hi: u32,
    t_lo: u32,
    keep: f32,
    #[comptime] drop: bool,
) {
    let row = cube_row();
    if row >= rows as usize {
        terminate!();
    }
    let len = len as usize;
    let base = row * len;
    let u = UNIT_POS_X as usize;
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let mut s = 0.0f32;
    let mut i = u;
    while i < len {
        s += grad(dy, base + i, base_hi, base_lo, t_hi, t_lo, keep, drop) * y[base + i];
        i += BLOCK;
    }
    let dot = cube_sum(s, &mut shared);
    let mut k = u;
    while k < len {
        dx[base + k] = y[base + k] * (grad(dy, base + k, base_hi, base_lo, t_hi, t_lo, keep, drop) - dot) * scale;
        k += BLOCK;
    }
}

/// `dy[i]`, dropped as the dropout kernel drops element `i` where `drop`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn grad(dy: &Tensor<f32>, i: usize, base_hi: u32, base_lo: u32, t_hi: u32, t_lo: u32, keep: f32, #[comptime] drop: bool) -> f32 {
    let mut g = dy[i];
    if comptime![drop] {
        g = drop_at(g, i, base_hi, base_lo, t_hi, t_lo, keep);
    }
    g
}

/// Element `i` of value `v` after the dropout: 0 where the dropout kernel drops element `i`,
/// else `v · keep` (the forward's weights and the backward's gradient alike).
#[cube]
fn drop_at(v: f32, i: usize, base_hi: u32, base_lo: u32, t_hi: u32, t_lo: u32, keep: f32) -> f32 {
    select(dropped(i as u32, base_hi, base_lo, t_hi, t_lo), 0.0f32, v * keep)
}

/// A launch's dropout scalars: the hash halves ([`hash_args`]) and the keep scale; zeros and 1
/// without a dropout (the kernels do not read them then).
fn drop_args(dropout: Option<(u64, u64, f32)>) -> ([u32; 4], f32) {
    let (base, threshold, keep) = dropout.unwrap_or((0, 0, 1.0));
    (hash_args(base, threshold), keep)
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
    // The flags follow the logical element index: both read in contiguous order.
    let (y, dy) = (contiguous(y), contiguous(dy));
    let dims = y.meta.shape().to_vec();
    let len = dims[dims.len() - 1];
    let rows = dims.iter().product::<usize>() / len;
    let dx = empty(&y, dims, DType::F32);
    let ([base_hi, base_lo, t_hi, t_lo], keep) = drop_args(dropout);
    let (count, dim) = row_cubes(rows);
    let client = y.client.clone();
    softmax_backward_kernel::launch::<R>(
        &client,
        count,
        dim,
        y.into_tensor_arg(),
        dy.into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        rows as u32,
        len as u32,
        scale,
        base_hi,
        base_lo,
        t_hi,
        t_lo,
        keep,
        dropout.is_some(),
    );
    dx
}
