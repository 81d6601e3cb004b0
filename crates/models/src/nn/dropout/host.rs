//! Dropout's flags drawn on the host (flex, and any backend without a device kernel):
//! `splitmix64` of a site's hash base plus the element index, against the rate's threshold
//! (`super::DropoutCtx::base_threshold`), uploaded as a bool mask.

use burn::prelude::*;
use burn::tensor::TensorData;

pub(super) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The drop flags of `n` elements from a site's hash base and a rate's threshold
/// ([`super::DropoutCtx::base_threshold`]).
pub(super) fn flags(base: u64, threshold: u64, n: usize) -> Vec<bool> {
    (0..n as u64).map(|i| (splitmix64(base.wrapping_add(i)) >> 11) < threshold).collect()
}

/// Dropout with the flags drawn on the host, uploaded as a bool mask (`mask_fill`, then the
/// scaling): see [`super::DropoutCtx::apply`].
pub(crate) fn host_dropout<B: Backend, const D: usize>(x: Tensor<B, D>, base: u64, threshold: u64, scale: f64) -> Tensor<B, D> {
    let dims = x.dims();
    let n = dims.iter().product();
    let drop = Tensor::<B, D, Bool>::from_data(TensorData::new(flags(base, threshold, n), dims), &x.device());
    x.mask_fill(drop, 0.0).mul_scalar(scale)
}
