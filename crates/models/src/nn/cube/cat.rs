//! Three equal parts stacked along the first axis in one launch: the attention node's packed
//! `in_proj_weight` and `in_proj_bias` gradients (`lean::attention`: the q, k and v rows).
//! Burn's `cat` writes each part into a new tensor with a slice assignment of its own: three
//! launches each, six an attention module (ACT b8 has ten).
//!
//! Each part `[rows, cols]` is read through its own strides (a matmul's gradient may come back
//! transposed); the result is contiguous `[3·rows, cols]` in the parts' dtype, the values copied
//! as they are.

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
