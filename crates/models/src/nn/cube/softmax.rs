//! Softmax along the last axis on CubeCL, one cube per row and one launch each way: the
//! forward in three passes over the row (max, `Σ exp(x − max)`, the quotient), the backward
//! from the kept output, `dx = y · (dy − Σ dy · y)` (two passes). f32 compute, values in the
//! input's dtype. Other axes: the caller runs the composed ops.
//!
//! The same two kernels serve the attention's softmax ([`super::attention`]), with options the
//! plain softmax leaves at their identities: a scale on the input (on the gradient, backward),
//! a mask added to each row, and the dropout of the output (of the output's gradient, backward),
//! its flags the dropout kernel's for the output's element index. The plain softmax is the
//! scale 1 (exact), no mask, no dropout.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::dropout::{dropped, hash_args};
use super::{BLOCK, contiguous, cube_max, cube_row, cube_sum, empty, row_cubes};

/// Element `i` of a row starting at `base`: `x · scale`, plus the mask's entry where `masked`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn score<F: Float>(x: &Tensor<F>, mask: &Tensor<f32>, base: usize, mask_base: usize, i: usize, scale: f32, #[comptime] masked: bool) -> f32 {
    let mut v = f32::cast_from(x[base + i]) * scale;
    if comptime![masked] {
        v += mask[mask_base + i];
    }
    v
}

/// Element `i` of value `v` after the dropout: 0 where the dropout kernel drops element `i`,
/// else `v · keep` (the forward's output and the backward's gradient alike).
#[cube]
fn drop_at(v: f32, i: usize, base_hi: u32, base_lo: u32, t_hi: u32, t_lo: u32, keep: f32) -> f32 {
    select(dropped(i as u32, base_hi, base_lo, t_hi, t_lo), 0.0f32, v * keep)
}

/// One cube per row of `x` `[rows, len]`: `y = softmax(scale · x + mask[row / mask_every])`
/// (the mask read only where `masked`), and with `drop` `yd` its dropout (element `i` of the
/// tensor dropped as the dropout kernel drops it, else `y · keep`; `yd` not written without).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel<F: Float>(
    x: &Tensor<F>,
    mask: &Tensor<f32>,
    y: &mut Tensor<F>,
    yd: &mut Tensor<F>,
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
    #[define(F)] _dtype: StorageType,
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
        y[base + k] = F::cast_from(v);
        if comptime![drop] {
            yd[base + k] = F::cast_from(drop_at(v, base + k, base_hi, base_lo, t_hi, t_lo, keep));
        }
        k += BLOCK;
    }
}

/// One cube per row of the softmax's output `y` `[rows, len]`: `dx = y · (g − Σ g · y) · scale`
/// with `g` the output gradient `dy`, dropped where the forward dropped (with `drop`: element
/// `i` of the tensor 0 where the dropout kernel drops it, else `dy · keep`), as the dropout's
/// backward, the softmax's and the scale's launches would, in the same order.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn backward_kernel<F: Float, G: Float>(
    y: &Tensor<F>,
    dy: &Tensor<G>,
    dx: &mut Tensor<F>,
    rows: u32,
    len: u32,
    scale: f32,
    base_hi: u32,
    base_lo: u32,
    t_hi: u32,
    t_lo: u32,
    keep: f32,
    #[comptime] drop: bool,
    #[define(F, G)] _dtypes: [StorageType; 2],
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
        s += grad(dy, base + i, base_hi, base_lo, t_hi, t_lo, keep, drop) * f32::cast_from(y[base + i]);
        i += BLOCK;
    }
    let dot = cube_sum(s, &mut shared);
    let mut k = u;
    while k < len {
        let yk = f32::cast_from(y[base + k]);
        dx[base + k] = F::cast_from(yk * (grad(dy, base + k, base_hi, base_lo, t_hi, t_lo, keep, drop) - dot) * scale);
        k += BLOCK;
    }
}

/// `dy[i]` in f32, dropped as the dropout kernel drops element `i` where `drop`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn grad<G: Float>(dy: &Tensor<G>, i: usize, base_hi: u32, base_lo: u32, t_hi: u32, t_lo: u32, keep: f32, #[comptime] drop: bool) -> f32 {
    let mut g = f32::cast_from(dy[i]);
    if comptime![drop] {
        g = drop_at(g, i, base_hi, base_lo, t_hi, t_lo, keep);
    }
    g
}

/// A launch's dropout scalars: the hash halves ([`hash_args`]) and the keep scale; zeros and 1
/// without a dropout (the kernels do not read them then).
fn drop_args(dropout: Option<(u64, u64, f32)>) -> ([u32; 4], f32) {
    let (base, threshold, keep) = dropout.unwrap_or((0, 0, 1.0));
    (hash_args(base, threshold), keep)
}

/// `(rows, len)` of `x` for a softmax along its last axis.
fn rows_of<R: CubeRuntime>(x: &CubeTensor<R>) -> (usize, usize) {
    let dims = x.meta.shape().to_vec();
    let len = dims[dims.len() - 1].max(1);
    (dims.iter().product::<usize>() / len, len)
}

/// Softmax of `x` along its last axis, in `x`'s dims and dtype.
pub fn forward<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    forward_with(x, None, 1.0, None).0
}

/// `(softmax(scale · x + mask), its dropout)` along the last axis of `x`, both contiguous in
/// `x`'s dims and dtype; without `dropout` the second is the first. `mask`: an f32 tensor of
/// rows of `x`'s length and how many of `x`'s rows each of its rows serves. `dropout`: `(hash
/// base, threshold, keep scale)`.
pub fn forward_with<R: CubeRuntime>(x: CubeTensor<R>, mask: Option<(CubeTensor<R>, usize)>, scale: f32, dropout: Option<(u64, u64, f32)>) -> (CubeTensor<R>, CubeTensor<R>) {
    let x = contiguous(x);
    let (rows, len) = rows_of(&x);
    let dims = x.meta.shape().to_vec();
    let y = empty(&x, dims.clone(), x.dtype);
    // Without a dropout `yd` is not written, without a mask `mask` is not read: one-element
    // stand-ins (two writable bindings of one buffer are not allowed on wgpu).
    let yd = empty(&x, if dropout.is_some() { dims } else { vec![1] }, x.dtype);
    let masked = mask.is_some();
    let (mask, mask_every) = match mask {
        Some((m, every)) => (contiguous(m), every.max(1)),
        None => (empty(&x, vec![1], DType::F32), 1),
    };
    let ([base_hi, base_lo, t_hi, t_lo], keep) = drop_args(dropout);
    let (count, dim) = row_cubes(rows);
    let client = x.client.clone();
    let dtype: StorageType = x.dtype.into();
    forward_kernel::launch::<R>(
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
        dtype,
    );
    if dropout.is_some() { (y, yd) } else { (y.clone(), y) }
}

/// The input gradient from the output `y` and its gradient `dy` (last axis), in `y`'s dtype.
pub fn backward<R: CubeRuntime>(y: CubeTensor<R>, dy: CubeTensor<R>) -> CubeTensor<R> {
    backward_with(y, dy, 1.0, None)
}

/// The gradient of [`forward_with`]'s input (without its mask, which takes none) from its kept
/// output `y` and the gradient `dy` of its dropout (or of itself, without `dropout`):
/// `y · (g − Σ g · y) · scale` along the last axis, `g` the dropout's backward of `dy`;
/// contiguous, in `y`'s dtype.
pub fn backward_with<R: CubeRuntime>(y: CubeTensor<R>, dy: CubeTensor<R>, scale: f32, dropout: Option<(u64, u64, f32)>) -> CubeTensor<R> {
    // The flags follow the logical element index: both read in contiguous order.
    let (y, dy) = (contiguous(y), contiguous(dy));
    let (rows, len) = rows_of(&y);
    let dx = empty(&y, y.meta.shape().to_vec(), y.dtype);
    let ([base_hi, base_lo, t_hi, t_lo], keep) = drop_args(dropout);
    let (count, dim) = row_cubes(rows);
    let client = y.client.clone();
    let dtypes: [StorageType; 2] = [y.dtype.into(), dy.dtype.into()];
    backward_kernel::launch::<R>(
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
        dtypes,
    );
    dx
}
