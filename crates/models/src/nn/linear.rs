//! PyTorch-layout `nn.Linear` and `nn.Embedding`, Xavier initialisation, FFN activations.
//!
//! Parameter names and layouts are PyTorch's (`weight` `[out, in]`), so state dicts load with
//! no remap. Matmuls run in the forward's [`Precision`] (input and f32 master weights cast
//! in-graph).

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::gelu;

use super::lean::LeanBackend;
use super::{Precision, cast};

/// `nn.Linear` with PyTorch's layout: `weight` `[out, in]`, `bias` `[out]`.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    pub weight: Param<Tensor<B, 2>>,
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> Linear<B> {
    /// PyTorch's default initialisation: weight and bias uniform in `±1/√in`.
    pub fn new(d_in: usize, d_out: usize, device: &B::Device) -> Self {
        let bound = 1.0 / (d_in.max(1) as f64).sqrt();
        Self {
            weight: Param::from_tensor(Tensor::random([d_out, d_in], Distribution::Uniform(-bound, bound), device)),
            bias: Some(Param::from_tensor(Tensor::random([d_out], Distribution::Uniform(-bound, bound), device))),
        }
    }

    /// `nn.init.xavier_uniform_` on the weight (what lerobot's `ACT._reset_parameters` does to
    /// every >1-D tensor of the transformer encoder / decoder); the bias keeps its default.
    pub fn xavier(mut self) -> Self {
        let [out, inp] = self.weight.dims();
        self.weight = Param::from_tensor(xavier_uniform([out, inp], inp, out, &self.weight.device()));
        self
    }
}

impl<B: LeanBackend> Linear<B> {
    /// `y = x Wᵀ + b` in precision `p`.
    ///
    /// # Shapes
    /// - x: `[..., in]` → `[..., out]` (compute dtype)
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, p: Precision) -> Tensor<B, D> {
        let dt = p.dtype();
        linear_rows(cast(x, dt), cast(self.weight.val(), dt).transpose(), self.bias.as_ref().map(|b| cast(b.val(), dt)))
    }

    /// [`Linear::forward`] without the bias add, and the bias in the compute dtype: for an op after
    /// the layer that adds the bias in its own node ([`crate::nn::residual_dropout`],
    /// [`crate::nn::relu_dropout`]; the same values as the bias node's add).
    pub fn forward_parts<const D: usize>(&self, x: Tensor<B, D>, p: Precision) -> (Tensor<B, D>, Option<Tensor<B, 1>>) {
        let dt = p.dtype();
        (linear_rows(cast(x, dt), cast(self.weight.val(), dt).transpose(), None), self.bias.as_ref().map(|b| cast(b.val(), dt)))
    }
}

/// `x @ weight + bias` on `x` flattened to rows `[n, in]`, back to `[..., out]`.
///
/// On a rank-3 input Burn's `linear` is a batched matmul against the broadcast weight, and its
/// weight gradient multiplies `xᵀ @ grad` per leading index before summing: one weight-sized
/// gradient per sample (300 MiB for ACT's 512 × 3200 FFN weight at batch 48). On rows the
/// weight gradient is one matmul, as PyTorch's `addmm`. The product is
/// [`lean::matmul`](super::lean::matmul) (on CubeCL one fixed kernel, not an autotune search
/// per layer shape). The bias is added by its own node
/// ([`lean::bias_add`](super::lean::bias_add)), whose gradient is one kernel for every layer
/// shape on CubeCL backends; Burn's linear adds it the same way (a matmul, then an add).
pub fn linear_rows<B: LeanBackend, const D: usize>(x: Tensor<B, D>, weight: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Tensor<B, D> {
    let mut dims = x.dims();
    let din = dims[D - 1];
    let rows = x.shape().num_elements() / din.max(1);
    let y = super::lean::matmul(x.reshape([rows, din]), weight);
    dims[D - 1] = y.dims()[1];
    let y = y.reshape(dims);
    match bias {
        Some(b) => super::lean::bias_add(y, b),
        None => y,
    }
}

/// `U(−a, a)` with `a = √(6 / (fan_in + fan_out))`.
pub fn xavier_uniform<B: Backend, const D: usize>(shape: [usize; D], fan_in: usize, fan_out: usize, device: &B::Device) -> Tensor<B, D> {
    let a = (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
    Tensor::random(shape, Distribution::Uniform(-a, a), device)
}

/// `nn.Embedding(n, d)`: only its `weight` `[n, d]` is used (ACT reads whole tables).
#[derive(Module, Debug)]
pub struct Embedding<B: Backend> {
    pub weight: Param<Tensor<B, 2>>,
}

impl<B: Backend> Embedding<B> {
    /// PyTorch's default initialisation: `N(0, 1)`.
    pub fn new(n: usize, d: usize, device: &B::Device) -> Self {
        Self { weight: Param::from_tensor(Tensor::random([n, d], Distribution::Normal(0.0, 1.0), device)) }
    }
}

/// The transformer FFN activation (`feedforward_activation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Relu,
    /// Exact (erf) GELU, as `F.gelu`.
    Gelu,
}

impl Activation {
    /// ReLU is the lean node (`nn::lean::relu`: keeps its output where Burn's keeps its input, the
    /// same bytes; one `#[cube]` launch each way on CubeCL instead of Burn's two).
    pub fn apply<B: LeanBackend, const D: usize>(self, x: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Activation::Relu => super::lean::relu(x),
            Activation::Gelu => gelu(x),
        }
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    type Tb = Flex;

    #[test]
    fn linear_uses_pytorch_layout() {
        let dev = Default::default();
        let lin = Linear::<Tb> {
            weight: Param::from_tensor(Tensor::from_floats([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], &dev)),
            bias: Some(Param::from_tensor(Tensor::from_floats([0.5, 0.0, -1.0], &dev))),
        };
        let y = lin.forward(Tensor::<Tb, 2>::from_floats([[1.0, 1.0]], &dev), Precision::F32);
        assert_eq!(super::super::tests::vals(y), [3.5, 7.0, 10.0]);
        let y3 = lin.forward(Tensor::<Tb, 3>::from_floats([[[1.0, 0.0]], [[0.0, 1.0]]], &dev), Precision::F32);
        assert_eq!(y3.dims(), [2, 1, 3]);
        assert_eq!(super::super::tests::vals(y3), [1.5, 3.0, 4.0, 2.5, 4.0, 5.0]);
    }

}
