//! Concatenations in one launch each, for the attention node's backward (`lean::attention`):
//!
//! - [`cat3`]: three equal parts stacked along the first axis, the packed `in_proj_weight` and
//!   `in_proj_bias` gradients (the q, k and v rows). Burn's `cat` writes each part into a new
//!   tensor with a slice assignment of its own: three launches each, six an attention module
//!   (ACT b8 has ten).
//! - [`cat_heads`]: the query's and key's gradients `[n, h, l, hd]` side by side per row,
//!   `[n·l, 2·h·hd]`, the gradient of a self-attention's one query-and-key product (two slice
//!   assignments with Burn's `cat`; ACT has nine self-attentions).
//!
//! Each part is read through its own strides (a matmul's gradient may come back transposed);
//! the result is contiguous in the parts' dtype, the values copied as they are.

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{elem_cubes, empty};

/// Unit `i` of `y` `[3·rows, cols]`: row `r = i / cols` of part `r / rows`.
#[cube(launch)]
fn cat3_kernel<F: Float>(a: &Tensor<F>, b: &Tensor<F>, c: &Tensor<F>, y: &mut Tensor<F>, rows: u32, cols: u32, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= y.len() {
        terminate!();
    }
    let (rows, cols) = (rows as usize, cols as usize);
    let (r, col) = (i / cols, i % cols);
    let (part, row) = (r / rows, r % rows);
    if part == 0 {
        y[i] = a[row * a.stride(0) + col * a.stride(1)];
    } else if part == 1 {
        y[i] = b[row * b.stride(0) + col * b.stride(1)];
    } else {
        y[i] = c[row * c.stride(0) + col * c.stride(1)];
    }
}

/// Whether [`cat3`] takes these parts: rank 2, one shape and dtype, at most `u32::MAX`
/// elements in all.
pub fn handles(dims: [&[usize]; 3], dtypes: [burn::tensor::DType; 3]) -> bool {
    let n: usize = dims[0].iter().product::<usize>() * 3;
    dims.iter().all(|d| d.len() == 2 && *d == dims[0]) && dtypes.iter().all(|&t| t == dtypes[0]) && n > 0 && n <= u32::MAX as usize
}

/// `cat([a, b, c], 0)` of three `[rows, cols]` parts ([`handles`]): contiguous `[3·rows, cols]`.
pub fn cat3<R: CubeRuntime>(a: CubeTensor<R>, b: CubeTensor<R>, c: CubeTensor<R>) -> CubeTensor<R> {
    let (rows, cols) = (a.meta.shape()[0], a.meta.shape()[1]);
    let y = empty(&a, vec![3 * rows, cols], a.dtype);
    let client = a.client.clone();
    let (count, dim) = elem_cubes(&client, 3 * rows * cols);
    let dtype: StorageType = a.dtype.into();
    cat3_kernel::launch::<R>(&client, count, dim, a.into_tensor_arg(), b.into_tensor_arg(), c.into_tensor_arg(), y.clone().into_tensor_arg(), rows as u32, cols as u32, dtype);
    y
}

/// Unit `i` of `y` `[n·l, 2·h·hd]`: row `(batch, row)`, column `part·d + head·hd + e` (`d =
/// h·hd`), element `(batch, head, row, e)` of `a` (part 0) or `b` (part 1), each read through its
/// own strides.
#[cube(launch)]
fn cat_heads_kernel<F: Float>(a: &Tensor<F>, b: &Tensor<F>, y: &mut Tensor<F>, l: u32, heads: u32, hd: u32, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= y.len() {
        terminate!();
    }
    let (l, heads, hd) = (l as usize, heads as usize, hd as usize);
    let d = heads * hd;
    let (r, col) = (i / (2 * d), i % (2 * d));
    let (batch, row) = (r / l, r % l);
    let (part, c) = (col / d, col % d);
    let (head, e) = (c / hd, c % hd);
    if part == 0 {
        y[i] = a[batch * a.stride(0) + head * a.stride(1) + row * a.stride(2) + e * a.stride(3)];
    } else {
        y[i] = b[batch * b.stride(0) + head * b.stride(1) + row * b.stride(2) + e * b.stride(3)];
    }
}

/// Whether [`cat_heads`] takes these parts: rank 4, one shape and dtype, at most `u32::MAX`
/// elements in all.
pub fn cat_heads_handles(dims: [&[usize]; 2], dtypes: [burn::tensor::DType; 2]) -> bool {
    let n: usize = dims[0].iter().product::<usize>() * 2;
    dims[0].len() == 4 && dims[0] == dims[1] && dtypes[0] == dtypes[1] && n > 0 && n <= u32::MAX as usize
}

/// The heads of `a` and `b` `[n, h, l, hd]` (any strides; [`cat_heads_handles`]) side by side per
/// row: contiguous `[n·l, 2·h·hd]`, what `cat([a.swap(1, 2), b.swap(1, 2)], 2)` reshaped to
/// `[n·l, 2·h·hd]` holds, in one launch (Burn's `cat`: a slice assignment a part, and the
/// reshape's copy where the result is not contiguous). The attention node's `[dq | dk]`, the
/// gradient of a self-attention's one query-and-key product.
pub fn cat_heads<R: CubeRuntime>(a: CubeTensor<R>, b: CubeTensor<R>) -> CubeTensor<R> {
    let [n, heads, l, hd] = [0, 1, 2, 3].map(|k| a.meta.shape()[k]);
    let y = empty(&a, vec![n * l, 2 * heads * hd], a.dtype);
    let client = a.client.clone();
    let (count, dim) = elem_cubes(&client, 2 * n * heads * l * hd);
    let dtype: StorageType = a.dtype.into();
    cat_heads_kernel::launch::<R>(&client, count, dim, a.into_tensor_arg(), b.into_tensor_arg(), y.clone().into_tensor_arg(), l as u32, heads as u32, hd as u32, dtype);
    y
}
