//! Building blocks shared by the models: mixed-precision aware ops.
//!
//! Burn has no autocast. vramlab's mixed precision keeps parameters (master weights) in f32
//! and casts *both* the activation and the weight to the compute dtype inside the graph
//! (`Tensor::cast` is differentiable, so gradients come back to the f32 parameters in f32).
//! Normalisations, softmax and loss reductions run in f32, as torch autocast does.

use burn::module::{Module, Param};
use burn::nn::conv::Conv3d;
use burn::nn::PaddingConfig3d;
use burn::prelude::*;
use burn::tensor::module::conv3d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, FloatDType};
use serde::{Deserialize, Serialize};

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

/// `conv` applied in precision `p`: input, weight and bias are cast in-graph.
pub fn conv3d_p<B: Backend>(conv: &Conv3d<B>, x: Tensor<B, 5>, p: Precision) -> Tensor<B, 5> {
    let dt = p.dtype();
    let padding = match &conv.padding {
        PaddingConfig3d::Explicit(d, h, w) => [*d, *h, *w],
        PaddingConfig3d::Valid => [0, 0, 0],
        other => panic!("conv3d_p: unsupported padding {other:?} (models build explicit padding)"),
    };
    conv3d(
        cast(x, dt),
        cast(conv.weight.val(), dt),
        conv.bias.as_ref().map(|b| cast(b.val(), dt)),
        ConvOptions::new(conv.stride, padding, conv.dilation, conv.groups),
    )
}

/// GroupNorm with PyTorch's parameter names (`weight`, `bias`), computed in f32 and returned
/// in the input's dtype (like the reference's `GroupNorm32`, which runs `x.float()`).
#[derive(Module, Debug)]
pub struct GroupNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub bias: Param<Tensor<B, 1>>,
    pub num_groups: usize,
    pub eps: f64,
}

impl<B: Backend> GroupNorm<B> {
    pub fn new(num_groups: usize, channels: usize, eps: f64, device: &B::Device) -> Self {
        assert!(
            num_groups > 0 && channels.is_multiple_of(num_groups),
            "GroupNorm: {channels} channels not divisible into {num_groups} groups"
        );
        Self {
            weight: Param::from_tensor(Tensor::ones([channels], device)),
            bias: Param::from_tensor(Tensor::zeros([channels], device)),
            num_groups,
            eps,
        }
    }

    /// # Shapes
    /// - x: `[batch, channels, ...]` (any rank D >= 3)
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let in_dtype = x.dtype();
        let dims = x.dims();
        let (b, c) = (dims[0], dims[1]);
        // Statistics reduce the last axis first, then the rest: one flat reduction over a
        // whole group (thousands to millions of elements) accumulates ~1e-5 relative f32
        // error on some backends (Flex), which GroupNorm amplifies on sparse inputs.
        let last = dims[D - 1];
        let x = to_f32(x).reshape([b, self.num_groups, c / self.num_groups * dims[2..].iter().product::<usize>() / last, last]);
        let mean = x.clone().mean_dim(3).mean_dim(2); // [b, g, 1, 1]
        let centered = x - mean;
        let var = centered.clone().square().mean_dim(3).mean_dim(2);
        let normed = centered / (var + self.eps).sqrt();
        let normed = normed.reshape(dims);
        let mut affine_shape = [1usize; D];
        affine_shape[1] = c;
        let y = normed * self.weight.val().reshape(affine_shape) + self.bias.val().reshape(affine_shape);
        match in_dtype {
            DType::F32 => y,
            other => y.cast(other),
        }
    }
}

/// Number of groups the reference's `normalization()` asks for: `min(32, channels)`.
/// PyTorch raises when that does not divide `channels` (e.g. 48 channels, the reference's own
/// `lightweight` config). vramlab's documented rule: use the largest divisor of `channels`
/// that is <= min(32, channels) (48 -> 24). Parameter counts are unaffected (2·C either way).
pub fn group_count(channels: usize, max_groups: usize) -> usize {
    let g = max_groups.min(channels).max(1);
    (1..=g).rev().find(|d| channels.is_multiple_of(*d)).unwrap_or(1)
}
