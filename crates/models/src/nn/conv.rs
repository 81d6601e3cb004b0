//! Convolutions in a forward's [`Precision`]: input, weight and bias are cast in-graph, so
//! the f32 master weights get their gradients in f32. Burn's conv modules hold the weights;
//! these functions apply them (symmetric explicit padding or `Valid`). 2-D and 3-D run as
//! [`lean`] nodes (weight gradients over bounded batch chunks).

use burn::nn::conv::{Conv1d, Conv2d, Conv3d, ConvTranspose1d};
use burn::nn::{PaddingConfig1d, PaddingConfig2d, PaddingConfig3d};
use burn::prelude::*;
use burn::tensor::module::conv_transpose1d;
use burn::tensor::ops::{ConvOptions, ConvTransposeOptions};

use super::lean::{self, LeanBackend};
use super::{Precision, cast};

/// `conv` applied in precision `p` (input, weight, bias cast in-graph). Symmetric explicit
/// padding or `Valid`.
pub fn conv1d_p<B: LeanBackend>(conv: &Conv1d<B>, x: Tensor<B, 3>, p: Precision) -> Tensor<B, 3> {
    let dt = p.dtype();
    let pad = match &conv.padding {
        PaddingConfig1d::Explicit(l, r) if l == r => *l,
        PaddingConfig1d::Valid => 0,
        other => panic!("conv1d_p: unsupported padding {other:?} (models build symmetric explicit padding)"),
    };
    lean::conv1d(
        cast(x, dt),
        cast(conv.weight.val(), dt),
        conv.bias.as_ref().map(|b| cast(b.val(), dt)),
        ConvOptions::new([conv.stride], [pad], [conv.dilation], conv.groups),
    )
}

/// `conv` (PyTorch layout `[in, out/groups, k]`) applied in precision `p`.
pub fn conv_transpose1d_p<B: Backend>(conv: &ConvTranspose1d<B>, x: Tensor<B, 3>, p: Precision) -> Tensor<B, 3> {
    let dt = p.dtype();
    conv_transpose1d(
        cast(x, dt),
        cast(conv.weight.val(), dt),
        conv.bias.as_ref().map(|b| cast(b.val(), dt)),
        ConvTransposeOptions::new([conv.stride], [conv.padding], [conv.padding_out], [conv.dilation], conv.groups),
    )
}

/// `conv` applied in precision `p`: input, weight and bias are cast in-graph (the 2D twin of
/// [`conv3d_p`]). Supports symmetric explicit padding and `Valid`.
pub fn conv2d_p<B: LeanBackend>(conv: &Conv2d<B>, x: Tensor<B, 4>, p: Precision) -> Tensor<B, 4> {
    let dt = p.dtype();
    let padding = match &conv.padding {
        PaddingConfig2d::Explicit(top, left, bottom, right) if top == bottom && left == right => [*top, *left],
        PaddingConfig2d::Valid => [0, 0],
        other => panic!("conv2d_p: unsupported padding {other:?} (models build symmetric explicit padding)"),
    };
    lean::conv2d(
        cast(x, dt),
        cast(conv.weight.val(), dt),
        conv.bias.as_ref().map(|b| cast(b.val(), dt)),
        ConvOptions::new(conv.stride, padding, conv.dilation, conv.groups),
    )
}

/// `conv` applied in precision `p`: input, weight and bias are cast in-graph.
pub fn conv3d_p<B: LeanBackend>(conv: &Conv3d<B>, x: Tensor<B, 5>, p: Precision) -> Tensor<B, 5> {
    let dt = p.dtype();
    let padding = match &conv.padding {
        PaddingConfig3d::Explicit(d, h, w) => [*d, *h, *w],
        PaddingConfig3d::Valid => [0, 0, 0],
        other => panic!("conv3d_p: unsupported padding {other:?} (models build explicit padding)"),
    };
    lean::conv3d(
        cast(x, dt),
        cast(conv.weight.val(), dt),
        conv.bias.as_ref().map(|b| cast(b.val(), dt)),
        ConvOptions::new(conv.stride, padding, conv.dilation, conv.groups),
    )
}
