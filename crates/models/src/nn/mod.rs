//! Building blocks shared by the models, PyTorch layout and mixed-precision aware:
//! [`Linear`], [`Embedding`], [`LayerNorm`], [`GroupNorm`], [`MultiheadAttention`],
//! deterministic dropout ([`DropoutCtx`]), convolutions in a precision ([`conv2d_p`], …),
//! [`Precision`] and the casts.
//!
//! Burn has no autocast. vramlab's mixed precision keeps parameters (master weights) in f32
//! and casts *both* the activation and the weight to the compute dtype inside the graph
//! (`Tensor::cast` is differentiable, so gradients come back to the f32 parameters in f32).
//! Normalisations, softmax and loss reductions run in f32, as torch autocast does.

use burn::prelude::*;
use burn::tensor::{DType, FloatDType};
use serde::{Deserialize, Serialize};

mod attention;
mod conv;
mod dropout;
#[cfg(feature = "flex")]
mod flex_kernels;
#[cfg(feature = "flex")]
mod flex_conv3d;
pub mod lean;
mod linear;
mod norm;

pub use attention::MultiheadAttention;
pub use conv::{conv_transpose1d_p, conv1d_p, conv2d_p, conv3d_p};
pub use dropout::{DropoutCtx, dropout};
pub use linear::{Activation, Embedding, Linear, xavier_uniform};
pub use lean::{LeanBackend, NormAct, mish, silu};
pub use norm::{GroupNorm, LAYER_NORM_EPS, LayerNorm, group_count};

/// The longest reduction (`cin · k³`) flex's direct 3-D convolution takes (`flex_conv3d`; e.g.
/// 64 channels × 3³); past it flex's GEMM wins. The estimator models the same split.
pub const DIRECT_CONV3D_MAX_REDUCTION: usize = 1728;

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
