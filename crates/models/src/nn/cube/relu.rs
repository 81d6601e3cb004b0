//! ReLU forward and backward, one launch each, over the buffers as they are laid out: a
//! convolution's output on CubeCL is a channels-last buffer seen as `[n, c, h, w]`, and the
//! element-wise kernels here read and write memory order, so such a tensor is neither copied
//! nor returned in another layout. Burn's ReLU is two launches each way (a comparison, then a
//! masked fill). `x ≤ 0 → 0` (so NaN passes, as Burn's and PyTorch's); the backward
//! `y ≤ 0 → 0, else dy` (Burn's `relu_backward`).
//!
//! [`relu_dropout_backward`]: the backward of `dropout(relu(x))` ([`super::dropout::relu_dropout`])
//! from its output, the same kernel with the dropout's scale: `y ≤ 0 → 0, else dy · scale` (the
//! output is > 0 exactly where the element was kept and its input positive), the values of the
//! dropout's backward, then the ReLU's. The plain backward passes scale 1 (`dy · 1 = dy`).

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{dense_or_copy, elem_launch, elem_out, one_dense_layout};

#[cube(launch)]
fn relu_kernel<F: Float>(x: &Tensor<F>, y: &mut Tensor<F>, n: u32, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    let v = x[i];
    y[i] = select(v <= F::new(0.0), F::new(0.0), v);
}

#[cube(launch)]
fn relu_backward_kernel<F: Float>(y: &Tensor<F>, dy: &Tensor<F>, dx: &mut Tensor<F>, scale: f32, n: u32, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    dx[i] = select(y[i] <= F::new(0.0), F::new(0.0), dy[i] * F::cast_from(scale));
}

/// `max(x, 0)` in `x`'s layout (dense), in place when `x`'s buffer is its alone. At most
/// `u32::MAX` elements.
pub fn relu<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    let x = dense_or_copy(x);
    let (client, count, dim, n, dtype) = elem_launch(&x);
    let (y, y_arg) = elem_out(&x, 0);
    relu_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), y_arg, n, dtype);
    y
}

/// The ReLU backward from its output `y`: `dy` where `y > 0`, in `dy`'s layout. `y` and `dy`
/// in one dense layout are read as they are (the usual case: the gradient of a convolution's
/// input comes back in the layout the forward's output had); otherwise both are made contiguous
/// first. In place in `dy`'s buffer when it is its alone.
pub fn relu_backward<R: CubeRuntime>(y: CubeTensor<R>, dy: CubeTensor<R>) -> CubeTensor<R> {
    scaled_backward(y, dy, 1.0)
}

/// The backward of `dropout(relu(x))` from its output `y`: `dy · scale` where `y > 0`, else 0,
/// laid out and in place as [`relu_backward`].
pub fn relu_dropout_backward<R: CubeRuntime>(y: CubeTensor<R>, dy: CubeTensor<R>, scale: f32) -> CubeTensor<R> {
    scaled_backward(y, dy, scale)
}

fn scaled_backward<R: CubeRuntime>(y: CubeTensor<R>, dy: CubeTensor<R>, scale: f32) -> CubeTensor<R> {
    let (y, dy) = one_dense_layout(y, dy);
    let (client, count, dim, n, dtype) = elem_launch(&dy);
    let (dx, dx_arg) = elem_out(&dy, 1);
    relu_backward_kernel::launch::<R>(&client, count, dim, y.into_tensor_arg(), dy.into_tensor_arg(), dx_arg, scale, n, dtype);
    dx
}
