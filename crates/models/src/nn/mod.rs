//! Building blocks shared by the models, PyTorch layout and mixed-precision aware:
//! [`Linear`], [`Embedding`], [`LayerNorm`], [`GroupNorm`], [`MultiheadAttention`],
//! deterministic dropout ([`DropoutCtx`]), convolutions in a precision ([`conv2d_p`], …),
//! [`Precision`] and the casts.
//!
//! Burn has no autocast. vramlab's mixed precision keeps parameters (master weights) in f32
//! and casts *both* the activation and the weight to the compute dtype inside the graph
//! (`Tensor::cast` is differentiable, so gradients come back to the f32 parameters in f32).
//! Normalisations, softmax and loss reductions run in f32, as torch autocast does.
//!
//! Two kernel layers sit under these blocks. [`lean`]: the autodiff nodes, each keeping only
//! what PyTorch's autograd keeps, implemented once for `Autodiff<B, C>` and dispatched per inner
//! backend ([`LeanBackend`]). `flex` (feature `flex`): the CPU kernels on burn-flex tensors that
//! lean's Flex backend calls where they apply; they import no autodiff code. What both layers
//! use lives here ([`linear_source_indices`], [`DIRECT_CONV3D_MAX_REDUCTION`]). `cube` (features
//! `wgpu`/`cuda`, with or without `fusion`): the GPU kernels (`#[cube]`, CubeCL) lean's CubeCL
//! backends call, on Burn's `CubeTensor`s (under fusion as custom ops of the fusion stream).

use burn::prelude::*;
use burn::tensor::{DType, FloatDType};
use serde::{Deserialize, Serialize};

mod attention;
mod conv;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube;
mod dropout;
#[cfg(feature = "flex")]
mod flex;
pub mod lean;
mod linear;
mod norm;

pub use attention::{KeyPaddingMask, MultiheadAttention};
pub use conv::{conv_transpose1d_p, conv1d_p, conv2d_p, conv3d_p};
pub use dropout::{DropoutCtx, dropout, relu_dropout, residual_dropout};
pub use linear::{Activation, Embedding, Linear, xavier_uniform};
pub use lean::{LeanBackend, NormAct, mish, silu};
pub use norm::{GroupNorm, LAYER_NORM_EPS, LayerNorm, group_count};

/// The vector instructions flex's CPU kernels run at in this process, for run summaries:
/// `avx512bf16`, `avx512`, `avx2` or `scalar` (detected once; capped by `VRAMLAB_SIMD=avx512bf16|avx512|avx2|scalar`,
/// or `VRAMLAB_NO_SIMD` = scalar), with the cap and the CPU's own level when a cap applies, and
/// the GEMM under flex: AVX-512 kernels compiled in (feature `gemm-avx512`, the default; gemm
/// picks them at run time where the CPU has AVX-512, `VRAMLAB_SIMD` does not cap it) or AVX2 only.
#[cfg(feature = "flex")]
pub fn flex_isa() -> String {
    let gemm = if cfg!(feature = "gemm-avx512") { "GEMM up to AVX-512 (gemm's own run-time choice)" } else { "GEMM up to AVX2 (built without gemm-avx512)" };
    format!("{}; {gemm}", flex::isa::describe())
}

/// The longest reduction (`cin · k³`) flex's direct 3-D convolution takes (`nn::flex::conv3d`;
/// e.g. 64 channels × 3³); past it flex's GEMM wins. The estimator models the same split.
pub const DIRECT_CONV3D_MAX_REDUCTION: usize = 1728;

/// `dims` read as `[outer, dims[axis], inner]`: the products of the axes before `axis`, its
/// size, the product of those after (a per-channel reduction's view, `lean::LeanBackend::lean_channel_sum`).
pub(crate) fn around_axis(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (dims[..axis].iter().product(), dims[axis], dims[axis + 1..].iter().product())
}

/// Source neighbours and weights of PyTorch's linear upsampling along one axis, as its
/// `area_pixel_compute_source_index` computes them with `align_corners=False` and an
/// explicit `scale_factor` (the scale used is `1/scale_factor`):
/// `src = max((dst + 0.5) / scale − 0.5, 0)`, `i0 = ⌊src⌋`, `i1 = min(i0 + 1, n − 1)`,
/// `λ = src − i0`; output = `(1 − λ)·x[i0] + λ·x[i1]`.
pub fn linear_source_indices(n_in: usize, scale: usize) -> (Vec<i64>, Vec<i64>, Vec<f32>) {
    let inv = 1.0f32 / scale as f32;
    let n_out = n_in * scale;
    let (mut i0s, mut i1s, mut lambdas) = (Vec::with_capacity(n_out), Vec::with_capacity(n_out), Vec::with_capacity(n_out));
    for dst in 0..n_out {
        let src = (inv * (dst as f32 + 0.5) - 0.5).max(0.0);
        let i0 = (src as usize).min(n_in - 1);
        let i1 = (i0 + 1).min(n_in - 1);
        i0s.push(i0 as i64);
        i1s.push(i1 as i64);
        lambdas.push(src - i0 as f32);
    }
    (i0s, i1s, lambdas)
}

/// Compute precision of a forward pass. Parameters always stay f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    Bf16,
    F16,
}

impl Precision {
    pub fn dtype(self) -> FloatDType {
        match self {
            Precision::F32 => FloatDType::F32,
            Precision::Bf16 => FloatDType::BF16,
            Precision::F16 => FloatDType::F16,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" | "no" => Some(Precision::F32),
            "bf16" | "bfloat16" => Some(Precision::Bf16),
            "f16" | "fp16" | "float16" | "half" => Some(Precision::F16),
            _ => None,
        }
    }
}

fn same_dtype(a: DType, b: FloatDType) -> bool {
    DType::from(b) == a
}

/// Cast to `dtype` unless the tensor already has it (a cast is a copy in Burn).
pub fn cast<B: Backend, const D: usize>(x: Tensor<B, D>, dtype: FloatDType) -> Tensor<B, D> {
    if same_dtype(x.dtype(), dtype) { x } else { x.cast(dtype) }
}

/// Cast to f32 (for normalisations, softmax and losses).
pub fn to_f32<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    cast(x, FloatDType::F32)
}

/// `y` (computed in f32) back in `dtype`, the input's dtype of an op that computes in f32.
pub fn to_dtype<B: Backend, const D: usize>(y: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    match dtype {
        DType::F32 => y,
        other => y.cast(other),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use burn::prelude::*;

    pub fn vals<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
        t.into_data().convert::<f32>().to_vec().unwrap()
    }
}
