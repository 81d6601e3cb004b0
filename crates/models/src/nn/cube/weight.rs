//! A convolution weight flipped for the stride-1 input gradient (`lean::conv`'s
//! `flipped_weight`: `[cout, cin, k…]` → `[cin, cout, k…]`, reversed along every kernel axis),
//! written in one launch straight into the layout Burn's CubeCL convolutions compute in: channels
//! last, `[cin, k…, cout]` in the buffer, the view `[cin, cout, k…]`
//! ([`ChannelLayout`](super::ChannelLayout)). Composed, the flip is one kernel and the
//! convolution's own permute to channels last copies its result again.

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{ChannelLayout, contiguous, elem_cubes, empty_in};

/// One unit per element of `out` (`[cin, K, cout]` in the buffer, `K` the kernel's positions):
/// `out[ci, κ, co] = w[co, ci, K − 1 − κ]` (reversing the flattened kernel position reverses
/// every kernel axis).
#[cube(launch)]
fn flipped_kernel<F: Float>(w: &Tensor<F>, out: &mut Tensor<F>, cin: u32, cout: u32, k: u32, #[define(F)] _dtype: StorageType) {
    let j = ABSOLUTE_POS;
    if j >= out.len() {
        terminate!();
    }
    let (cout, k) = (cout as usize, k as usize);
    let co = j % cout;
    let kk = (j / cout) % k;
    let ci = j / (cout * k);
    out[j] = w[(co * cin as usize + ci) * k + (k - 1 - kk)];
}

/// `w: [cout, cin, k…]` → `[cin, cout, k…]` flipped along every kernel axis, stored channels
/// last.
pub fn flipped<R: CubeRuntime>(w: CubeTensor<R>) -> CubeTensor<R> {
    let w = contiguous(w);
    let dims = w.meta.shape().to_vec();
    let (cout, cin, k) = (dims[0], dims[1], dims[2..].iter().product::<usize>());
    let mut out_dims = dims.clone();
    out_dims.swap(0, 1);
    let out = empty_in(&w, out_dims, w.dtype, ChannelLayout { channel: 1, spatial: cout });
    let client = w.client.clone();
    let dtype: StorageType = w.dtype.into();
    let (count, dim) = elem_cubes(&client, cin * cout * k);
    flipped_kernel::launch::<R>(&client, count, dim, w.into_tensor_arg(), out.clone().into_tensor_arg(), cin as u32, cout as u32, k as u32, dtype);
    out
}
