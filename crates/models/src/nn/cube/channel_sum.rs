//! The sum of a tensor over every axis but one, per index of that axis: a bias's gradient (per
//! output channel of a convolution, per output feature of a linear layer). `x` is read as
//! `[outer, c, inner]` (contiguous); one cube per channel sums its `outer · inner` elements in
//! f32 and writes the total in `x`'s dtype; a channels-last `[n, c, s…]` is read in place as
//! `[n·S, c, 1]`. The same kernel takes the mean of a whole tensor
//! (the losses' means) in two launches.
//!
//! Burn computes it as two reductions (`sum_dim` over `inner`, then over `outer`), each an
//! autotuned kernel whose tuning key and compiled variant depend on the shape: every distinct
//! layer shape costs its own autotune search and compilations (on CUDA one NVRTC compilation
//! per candidate) at a cold start. This kernel takes the shape at run time: one compilation
//! per dtype, no search.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{BLOCK, channel_layout, contiguous, cube_row, cube_sum, empty, row_cubes};

/// Cube `c` (of `channels`): `out[c] = scale · Σ_o Σ_i x[(o · channels + c) · inner + i]`,
/// accumulated in f32, written in `out`'s dtype.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn channel_sum_kernel<F: Float, G: Float>(x: &Tensor<F>, out: &mut Tensor<G>, outer: u32, channels: u32, inner: u32, scale: f32, #[define(F, G)] _dtypes: [StorageType; 2]) {
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
        out[c] = G::cast_from(t * scale);
    }
}

/// The contiguous `x` read as `[outer, channels, inner]` (its own dims ignored), summed per
/// channel and scaled: `[channels]` in `dtype`.
fn sum_rows<R: CubeRuntime>(x: CubeTensor<R>, (outer, channels, inner): (usize, usize, usize), scale: f32, dtype: DType) -> CubeTensor<R> {
    let out = empty(&x, vec![channels], dtype);
    let client = x.client.clone();
    let dtypes: [StorageType; 2] = [x.dtype.into(), dtype.into()];
    let (count, dim) = row_cubes(channels);
    channel_sum_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), out.clone().into_tensor_arg(), outer as u32, channels as u32, inner as u32, scale, dtypes);
    out
}

/// `x` summed over every axis but `axis`: `[x.dims[axis]]`, in `x`'s dtype (accumulated in f32).
/// A channels-last `[n, c, s…]` (a convolution's output gradient as Burn's convolutions return
/// it on CubeCL, [`ChannelLayout`](super::ChannelLayout)) is read as it lies, `[n·S, c, 1]`,
/// instead of being copied.
pub fn channel_sum<R: CubeRuntime>(x: CubeTensor<R>, axis: usize) -> CubeTensor<R> {
    let dims = x.meta.shape().to_vec();
    let dtype = x.dtype;
    if axis == 1 && dims.len() > 2 {
        let (x, layout) = channel_layout(x);
        let (c, s) = (dims[1], dims[2..].iter().product::<usize>());
        let rows = if layout.is_last() { (dims[0] * s, c, 1) } else { (dims[0], c, s) };
        return sum_rows(x, rows, 1.0, dtype);
    }
    sum_rows(contiguous(x), crate::nn::around_axis(&dims, axis), 1.0, dtype)
}

/// The mean of all of `x`: `[1]` in `x`'s dtype. Two launches: one cube per row of the last two
/// axes (f32 partial sums), then one cube over the rows, so every partial sum stays short (as
/// the axis-by-axis mean the CPU takes, `burn_kernels::mean_all`) with no shape-keyed kernel.
pub fn mean_all<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    let x = contiguous(x);
    let dims = x.meta.shape().to_vec();
    let n = dims.iter().product::<usize>().max(1);
    let inner = dims[dims.len().saturating_sub(2)..].iter().product::<usize>().max(1);
    let rows = n / inner;
    let dtype = x.dtype;
    let partial = sum_rows(x, (1, rows, inner), 1.0, DType::F32);
    sum_rows(partial, (1, 1, rows), 1.0 / n as f32, dtype)
}
