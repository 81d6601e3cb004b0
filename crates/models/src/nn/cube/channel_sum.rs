//! The sum of a tensor over every axis but one, per index of that axis: a bias's gradient (per
//! output channel of a convolution, per output feature of a linear layer). `x` is read as
//! `[outer, c, inner]` (contiguous); one cube per channel sums its `outer · inner` elements in
//! f32 and writes the total in `x`'s dtype.
//!
//! Burn computes it as two reductions (`sum_dim` over `inner`, then over `outer`), each an
//! autotuned kernel whose tuning key and compiled variant depend on the shape: every distinct
//! layer shape costs its own autotune search and compilations (on CUDA one NVRTC compilation
//! per candidate) at a cold start. This kernel takes the shape at run time: one compilation
//! per dtype, no search.

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{BLOCK, contiguous, cube_row, cube_sum, empty, row_cubes};

/// Cube `c` (of `channels`): `out[c] = Σ_o Σ_i x[(o · channels + c) · inner + i]`.
#[cube(launch)]
fn channel_sum_kernel<F: Float>(x: &Tensor<F>, out: &mut Tensor<F>, outer: u32, channels: u32, inner: u32, #[define(F)] _dtype: StorageType) {
    let c = cube_row();
    if c >= channels as usize {
        terminate!();
    }
    let (channels, inner) = (channels as usize, inner as usize);
    let total = outer as usize * inner;
    let mut s = 0.0f32;
    let mut k = UNIT_POS_X as usize;
    while k < total {
        let o = k / inner;
        s += f32::cast_from(x[(o * channels + c) * inner + (k - o * inner)]);
        k += BLOCK;
    }
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let t = cube_sum(s, &mut shared);
    if UNIT_POS_X == 0 {
        out[c] = F::cast_from(t);
    }
}

/// `x` summed over every axis but `axis`: `[x.dims[axis]]`, in `x`'s dtype (accumulated in f32).
pub fn channel_sum<R: CubeRuntime>(x: CubeTensor<R>, axis: usize) -> CubeTensor<R> {
    let x = contiguous(x);
    let dims = x.meta.shape().to_vec();
    let (outer, c, inner) = (dims[..axis].iter().product::<usize>(), dims[axis], dims[axis + 1..].iter().product::<usize>());
    let out = empty(&x, vec![c], x.dtype);
    let client = x.client.clone();
    let dtype: StorageType = x.dtype.into();
    let (count, dim) = row_cubes(c);
    channel_sum_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), out.clone().into_tensor_arg(), outer as u32, c as u32, inner as u32, dtype);
    out
}
