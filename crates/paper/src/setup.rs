//! The choices of a training set-up that a description and a claim's assumptions both name:
//! element types ([`DType`]), activation precision, optimizer, checkpointing, sharding.
//!
//! A leaf: [`crate::config`] (the description) and [`crate::claim`] (its claims) take these
//! from here.

use serde::{Deserialize, Serialize};

/// Element types of weights, gradients, optimizer state and activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    #[serde(alias = "fp32", alias = "float32")]
    F32,
    #[serde(alias = "bfloat16")]
    Bf16,
    #[serde(alias = "fp16", alias = "float16")]
    F16,
    /// 8-bit states or weights (e.g. bitsandbytes' 8-bit Adam, int8 / fp8 weights).
    #[serde(alias = "int8", alias = "fp8")]
    U8,
    /// Index tensors (max-pool indices, token ids).
    #[serde(alias = "i64")]
    Int64,
}

impl DType {
    pub fn bytes(self) -> f64 {
        match self {
            DType::F32 => 4.0,
            DType::Bf16 | DType::F16 => 2.0,
            DType::U8 => 1.0,
            DType::Int64 => 8.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::U8 => "8-bit",
            DType::Int64 => "int64",
        }
    }
}

/// How activations are stored: one dtype everywhere, or PyTorch autocast (matmul inputs in
/// half precision, norm inputs / residual stream and softmax outputs in f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActPrecision {
    #[serde(alias = "fp32")]
    F32,
    #[serde(alias = "bfloat16")]
    Bf16,
    #[serde(alias = "fp16")]
    F16,
    AutocastBf16,
    AutocastF16,
}

impl ActPrecision {
    /// Bytes of a tensor saved as a matmul / conv input or activation-function input.
    pub fn compute_bytes(self) -> f64 {
        if self == ActPrecision::F32 { 4.0 } else { 2.0 }
    }
    /// Bytes of a norm input (the residual stream).
    pub fn residual_bytes(self) -> f64 {
        if self.is_autocast() || self == ActPrecision::F32 {
            4.0
        } else {
            2.0
        }
    }
    /// Bytes of a saved softmax output.
    pub fn softmax_bytes(self) -> f64 {
        self.residual_bytes()
    }
    pub fn is_autocast(self) -> bool {
        matches!(self, ActPrecision::AutocastBf16 | ActPrecision::AutocastF16)
    }
    pub fn name(self) -> &'static str {
        match self {
            ActPrecision::F32 => "f32",
            ActPrecision::Bf16 => "bf16",
            ActPrecision::F16 => "f16",
            ActPrecision::AutocastBf16 => "autocast-bf16",
            ActPrecision::AutocastF16 => "autocast-f16",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Optimizer {
    Adamw,
    Adam,
    Sgd,
    SgdMomentum,
    /// Factored second moment, no first moment: O(rows + cols) per matrix, ~0 per parameter.
    Adafactor,
    /// Inference / nothing trained.
    None,
}

impl Optimizer {
    /// State tensors the optimizer keeps per trainable parameter.
    pub fn states_per_param(self) -> f64 {
        match self {
            Optimizer::Adamw | Optimizer::Adam => 2.0,
            Optimizer::SgdMomentum => 1.0,
            Optimizer::Sgd | Optimizer::Adafactor | Optimizer::None => 0.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Checkpointing {
    /// Every saved activation is kept until backward.
    None,
    /// Full per-layer recomputation of transformer layers: each layer keeps only its input;
    /// backward recomputes one layer at a time.
    Full,
}

/// How a model is split over `gpus` data-parallel ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharding {
    /// One GPU, nothing sharded.
    Single,
    /// DDP: full replica per GPU, plus DDP's gradient buckets.
    Ddp,
    /// ZeRO-1: optimizer states (and fp32 master weights) sharded.
    Zero1,
    /// ZeRO-2: + gradients sharded.
    Zero2,
    /// ZeRO-3 / FSDP full-shard: + parameters sharded, plus the gathered layers' working set.
    #[serde(alias = "fsdp")]
    Zero3,
    /// Every static term divided by the GPU count, nothing else (the seed reports' arithmetic).
    Naive,
}

impl Sharding {
    pub fn label(self) -> &'static str {
        match self {
            Sharding::Single => "1 GPU",
            Sharding::Ddp => "DDP",
            Sharding::Zero1 => "ZeRO-1",
            Sharding::Zero2 => "ZeRO-2",
            Sharding::Zero3 => "ZeRO-3 / FSDP",
            Sharding::Naive => "static ÷ N",
        }
    }
}
