//! Normalisations with PyTorch's parameter names (`weight`, `bias`), computed in f32.

use burn::module::{Module, Param};
use burn::prelude::*;

use super::lean::{self, LeanBackend, NormAct};
#[cfg(test)]
use super::{to_dtype, to_f32};

/// `nn.LayerNorm`'s default epsilon.
pub const LAYER_NORM_EPS: f64 = 1e-5;

/// `nn.LayerNorm(d)` with PyTorch names (`weight`, `bias`); computed and returned in f32.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub bias: Param<Tensor<B, 1>>,
    pub eps: f64,
}

impl<B: LeanBackend> LayerNorm<B> {
    pub fn new(d: usize, device: &B::Device) -> Self {
        Self {
            weight: Param::from_tensor(Tensor::ones([d], device)),
            bias: Param::from_tensor(Tensor::zeros([d], device)),
            eps: LAYER_NORM_EPS,
        }
    }

    /// Normalise the last axis (biased variance), in f32.
    ///
    /// # Shapes
    /// - x: `[..., d]` → `[..., d]` (f32)
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        lean::layer_norm(x, self.weight.val(), self.bias.val(), self.eps)
    }
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

impl<B: LeanBackend> GroupNorm<B> {
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
        self.forward_act(x, NormAct::None)
    }

    /// GroupNorm followed by `act`, one autodiff node (see [`lean`]).
    pub fn forward_act<const D: usize>(&self, x: Tensor<B, D>, act: NormAct) -> Tensor<B, D> {
        lean::group_norm(x, self.weight.val(), self.bias.val(), self.num_groups, self.eps, act)
    }

    /// `relu(self.forward(x) + residual)` (a ResNet block's end), `residual` in `x`'s dims and
    /// dtype: one node where [`GroupNorm::fuses_add_relu`], else the norm's node, the add and the
    /// ReLU's node.
    pub fn forward_add_relu<const D: usize>(&self, x: Tensor<B, D>, residual: Tensor<B, D>) -> Tensor<B, D> {
        lean::group_norm_add_relu(x, self.weight.val(), self.bias.val(), residual, self.num_groups, self.eps)
    }

    /// Whether [`GroupNorm::forward_add_relu`] of an `x` (and a residual) in `dtype` is one node
    /// ([`LeanBackend::lean_group_norm_add_relu_fuses`], f32 only).
    pub fn fuses_add_relu(dtype: burn::tensor::DType) -> bool {
        lean::group_norm_add_relu_fuses::<B>(dtype, dtype)
    }
}

/// The normalisations composed of Burn ops (what autodiff of primitive ops keeps); the
/// reference for the hand-written backwards' gradient-equality tests.
#[cfg(test)]
pub(crate) mod composed {
    use super::*;

    pub fn layer_norm<B: Backend, const D: usize>(ln: &LayerNorm<B>, x: Tensor<B, D>) -> Tensor<B, D> {
        let x = to_f32(x);
        let mean = x.clone().mean_dim(D - 1);
        let centered = x - mean;
        let var = centered.clone().square().mean_dim(D - 1);
        let normed = centered / (var + ln.eps).sqrt();
        let d = ln.weight.dims()[0];
        let mut shape = [1usize; D];
        shape[D - 1] = d;
        normed * ln.weight.val().reshape(shape) + ln.bias.val().reshape(shape)
    }

    pub fn group_norm<B: Backend, const D: usize>(gn: &GroupNorm<B>, x: Tensor<B, D>) -> Tensor<B, D> {
        let in_dtype = x.dtype();
        let dims = x.dims();
        let (b, c) = (dims[0], dims[1]);
        // Statistics reduce the last axis first, then the rest: one flat reduction over a
        // whole group (thousands to millions of elements) accumulates ~1e-5 relative f32
        // error on some backends (Flex), which GroupNorm amplifies on sparse inputs.
        let last = dims[D - 1];
        let x = to_f32(x).reshape([b, gn.num_groups, c / gn.num_groups * dims[2..].iter().product::<usize>() / last, last]);
        let mean = x.clone().mean_dim(3).mean_dim(2); // [b, g, 1, 1]
        let centered = x - mean;
        let var = centered.clone().square().mean_dim(3).mean_dim(2);
        let normed = centered / (var + gn.eps).sqrt();
        let normed = normed.reshape(dims);
        let mut affine_shape = [1usize; D];
        affine_shape[1] = c;
        let y = normed * gn.weight.val().reshape(affine_shape) + gn.bias.val().reshape(affine_shape);
        to_dtype(y, in_dtype)
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    type Tb = Flex;

    #[test]
    fn layer_norm_normalises_last_axis() {
        let dev = Default::default();
        let ln = LayerNorm::<Tb>::new(4, &dev);
        let y = super::super::tests::vals(ln.forward(Tensor::<Tb, 2>::from_floats([[1.0, 2.0, 3.0, 4.0]], &dev)));
        // mean 2.5, var 1.25
        let s = (1.25f64 + 1e-5).sqrt();
        for (a, x) in y.iter().zip([1.0, 2.0, 3.0, 4.0]) {
            assert!((*a as f64 - (x - 2.5) / s).abs() < 1e-6);
        }
    }

}
