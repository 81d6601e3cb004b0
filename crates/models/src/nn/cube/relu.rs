//! ReLU's backward on CubeCL from the kept output, `dx = dy` where `y > 0`, else 0: one launch
//! (Burn's `relu_backward` is two: a `y ≤ 0` comparison into a bool tensor, then a masked fill).
//! Any float dtypes; `dx` in `dy`'s.

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{contiguous, elem_cubes, empty};

#[cube(launch)]
fn backward_kernel<F: Float, G: Float>(y: &Tensor<F>, dy: &Tensor<G>, dx: &mut Tensor<G>, n: u32, #[define(F, G)] _dtypes: [StorageType; 2]) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    dx[i] = select(f32::cast_from(y[i]) > 0.0f32, dy[i], G::cast_from(0.0f32));
}

/// The input gradient of a ReLU from its output `y` and output gradient `dy` (same shape).
pub fn backward<R: CubeRuntime>(y: CubeTensor<R>, dy: CubeTensor<R>) -> CubeTensor<R> {
    let (y, dy) = (contiguous(y), contiguous(dy));
    let n = dy.meta.shape().num_elements();
    let dx = empty(&dy, dy.meta.shape().to_vec(), dy.dtype);
    let (count, dim) = elem_cubes(&dy.client, n);
    let dtypes: [StorageType; 2] = [y.dtype.into(), dy.dtype.into()];
    backward_kernel::launch::<R>(&dy.client.clone(), count, dim, y.into_tensor_arg(), dy.into_tensor_arg(), dx.clone().into_tensor_arg(), n as u32, dtypes);
    dx
}
