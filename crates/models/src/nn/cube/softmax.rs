//! Softmax along the last axis on CubeCL, one cube per row and one launch each way: the
//! forward in three passes over the row (max, `Σ exp(x − max)`, the quotient), the backward
//! from the kept output, `dx = y · (dy − Σ dy · y)` (two passes). f32 compute, values in the
//! input's dtype. Other axes: the caller runs the composed ops.

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{BLOCK, contiguous, cube_row, cube_sum, empty, row_cubes};

/// The maximum of every unit's `v` over the cube, in every unit (as [`super::cube_sum`]).
#[cube]
pub(super) fn cube_max(v: f32, shared: &mut SharedMemory<f32>) -> f32 {
    let u = UNIT_POS_X as usize;
    shared[u] = v;
    sync_cube();
    max_step(shared, u, 128usize);
    max_step(shared, u, 64usize);
    max_step(shared, u, 32usize);
    max_step(shared, u, 16usize);
    max_step(shared, u, 8usize);
    max_step(shared, u, 4usize);
    max_step(shared, u, 2usize);
    max_step(shared, u, 1usize);
    let total = shared[0];
    sync_cube();
    total
}

#[cube]
fn max_step(shared: &mut SharedMemory<f32>, u: usize, #[comptime] stride: usize) {
    if u < stride {
        shared[u] = max(shared[u], shared[u + stride]);
    }
    sync_cube();
}

#[cube(launch)]
fn forward_kernel<F: Float>(x: &Tensor<F>, y: &mut Tensor<F>, rows: u32, len: u32, #[define(F)] _dtype: StorageType) {
    let row = cube_row();
    if row >= rows as usize {
        terminate!();
    }
    let len = len as usize;
    let base = row * len;
    let u = UNIT_POS_X as usize;
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let mut m = f32::min_value();
    let mut i = u;
    while i < len {
        m = max(m, f32::cast_from(x[base + i]));
        i += BLOCK;
    }
    let m = cube_max(m, &mut shared);
    let mut s = 0.0f32;
    let mut j = u;
    while j < len {
        s += (f32::cast_from(x[base + j]) - m).exp();
        j += BLOCK;
    }
    let inv = 1.0f32 / cube_sum(s, &mut shared);
    let mut k = u;
    while k < len {
        y[base + k] = F::cast_from((f32::cast_from(x[base + k]) - m).exp() * inv);
        k += BLOCK;
    }
}

#[cube(launch)]
fn backward_kernel<F: Float, G: Float>(y: &Tensor<F>, dy: &Tensor<G>, dx: &mut Tensor<F>, rows: u32, len: u32, #[define(F, G)] _dtypes: [StorageType; 2]) {
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
        s += f32::cast_from(dy[base + i]) * f32::cast_from(y[base + i]);
        i += BLOCK;
    }
    let dot = cube_sum(s, &mut shared);
    let mut k = u;
    while k < len {
        let yk = f32::cast_from(y[base + k]);
        dx[base + k] = F::cast_from(yk * (f32::cast_from(dy[base + k]) - dot));
        k += BLOCK;
    }
}

/// `(rows, len)` of `x` for a softmax along its last axis.
fn rows_of<R: CubeRuntime>(x: &CubeTensor<R>) -> (usize, usize) {
    let dims = x.meta.shape().to_vec();
    let len = dims[dims.len() - 1].max(1);
    (dims.iter().product::<usize>() / len, len)
}

/// Softmax of `x` along its last axis, in `x`'s dims and dtype.
pub fn forward<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    let x = contiguous(x);
    let (rows, len) = rows_of(&x);
    let y = empty(&x, x.meta.shape().to_vec(), x.dtype);
    let (count, dim) = row_cubes(rows);
    let dtype: StorageType = x.dtype.into();
    forward_kernel::launch::<R>(&x.client.clone(), count, dim, x.into_tensor_arg(), y.clone().into_tensor_arg(), rows as u32, len as u32, dtype);
    y
}

/// The input gradient from the output `y` and its gradient `dy` (last axis), in `y`'s dtype.
pub fn backward<R: CubeRuntime>(y: CubeTensor<R>, dy: CubeTensor<R>) -> CubeTensor<R> {
    let (y, dy) = (contiguous(y), contiguous(dy));
    let (rows, len) = rows_of(&y);
    let dx = empty(&y, y.meta.shape().to_vec(), y.dtype);
    let (count, dim) = row_cubes(rows);
    let dtypes: [StorageType; 2] = [y.dtype.into(), dy.dtype.into()];
    backward_kernel::launch::<R>(&y.client.clone(), count, dim, y.into_tensor_arg(), dy.into_tensor_arg(), dx.clone().into_tensor_arg(), rows as u32, len as u32, dtypes);
    dx
}
