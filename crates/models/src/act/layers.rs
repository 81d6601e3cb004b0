//! PyTorch-layout layers for ACT: `nn.Linear`, `nn.LayerNorm`, `nn.Embedding`,
//! `nn.MultiheadAttention`, and deterministic dropout.
//!
//! Parameter names and layouts are PyTorch's (`weight` `[out, in]`, `in_proj_weight`
//! `[3·D, D]`, …) so lerobot state dicts load with no remap. Every layer takes a
//! [`Precision`]: matmuls run in it (inputs and f32 master weights cast in-graph); LayerNorm and
//! softmax run in f32, as under torch autocast.

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::activation::{gelu, relu, softmax};
use burn::tensor::module::linear;
use burn::tensor::{DType, Distribution, TensorData};

use crate::nn::{Precision, cast, to_f32};

/// `nn.LayerNorm`'s default epsilon.
pub const LAYER_NORM_EPS: f64 = 1e-5;

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

    /// `y = x Wᵀ + b` in precision `p`.
    ///
    /// # Shapes
    /// - x: `[..., in]` → `[..., out]` (compute dtype)
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, p: Precision) -> Tensor<B, D> {
        let dt = p.dtype();
        linear(cast(x, dt), cast(self.weight.val(), dt).transpose(), self.bias.as_ref().map(|b| cast(b.val(), dt)))
    }
}

/// `U(−a, a)` with `a = √(6 / (fan_in + fan_out))`.
pub fn xavier_uniform<B: Backend, const D: usize>(shape: [usize; D], fan_in: usize, fan_out: usize, device: &B::Device) -> Tensor<B, D> {
    let a = (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
    Tensor::random(shape, Distribution::Uniform(-a, a), device)
}

/// `nn.LayerNorm(d)` with PyTorch names (`weight`, `bias`); computed and returned in f32.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub bias: Param<Tensor<B, 1>>,
    pub eps: f64,
}

impl<B: Backend> LayerNorm<B> {
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
        let x = to_f32(x);
        let mean = x.clone().mean_dim(D - 1);
        let centered = x - mean;
        let var = centered.clone().square().mean_dim(D - 1);
        let normed = centered / (var + self.eps).sqrt();
        let d = self.weight.dims()[0];
        let mut shape = [1usize; D];
        shape[D - 1] = d;
        normed * self.weight.val().reshape(shape) + self.bias.val().reshape(shape)
    }
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
    pub fn apply<B: Backend, const D: usize>(self, x: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Activation::Relu => relu(x),
            Activation::Gelu => gelu(x),
        }
    }
}

/// Deterministic dropout masks, generated on the host from a seed.
///
/// A mask element is a pure function of `(seed, site, element index)` (a SplitMix64 hash):
/// no RNG state advances, so recomputing a stage for gradient checkpointing reproduces the
/// forward's masks exactly, in any order. Each dropout call site in the model has a fixed
/// `site` number (block, layer, position in the layer, see [`DropoutCtx::site`]); the trainer
/// changes `seed` every step (and micro-batch). Kept elements are scaled by `1 / (1 − rate)`,
/// as `nn.Dropout` in training mode.
///
/// The masks are *not* PyTorch's (different RNG): only their distribution matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropoutCtx {
    pub seed: u64,
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl DropoutCtx {
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// The site number of dropout `slot` in layer `layer` of block `block`
    /// (blocks: 0 VAE encoder, 1 encoder, 2 decoder).
    pub fn site(block: u64, layer: usize, slot: u64) -> u64 {
        (block << 40) | ((layer as u64) << 8) | slot
    }

    /// Keep-mask values (`0` or `1/(1−rate)`) for `n` elements of `site`.
    pub fn mask_values(&self, site: u64, n: usize, rate: f64) -> Vec<f32> {
        let keep_scale = (1.0 / (1.0 - rate)) as f32;
        // Keep when a uniform u in [0, 1) is >= rate, as Bernoulli(1 - rate).
        let threshold = (rate * (1u64 << 53) as f64) as u64;
        let base = splitmix64(self.seed ^ splitmix64(site));
        (0..n as u64)
            .map(|i| if (splitmix64(base.wrapping_add(i)) >> 11) >= threshold { keep_scale } else { 0.0 })
            .collect()
    }

    /// `nn.Dropout(rate)` in training mode at `site`: `x · mask` (mask in x's dtype).
    pub fn apply<B: Backend, const D: usize>(&self, x: Tensor<B, D>, site: u64, rate: f64) -> Tensor<B, D> {
        if rate <= 0.0 {
            return x;
        }
        let dims = x.dims();
        let n = dims.iter().product();
        let mask = Tensor::<B, D>::from_data(TensorData::new(self.mask_values(site, n, rate), dims), &x.device());
        let mask = match x.dtype() {
            DType::F32 => mask,
            other => mask.cast(other),
        };
        x * mask
    }
}

/// Dropout at `site` when a context is given and the rate is positive; identity otherwise.
pub fn dropout<B: Backend, const D: usize>(x: Tensor<B, D>, ctx: Option<&DropoutCtx>, site: u64, rate: f64) -> Tensor<B, D> {
    match ctx {
        Some(c) if rate > 0.0 => c.apply(x, site, rate),
        _ => x,
    }
}

/// `nn.MultiheadAttention(d, heads)` (batch_first = False in PyTorch; here tensors are
/// batch-first `[batch, seq, d]`, which changes nothing numerically). Names: `in_proj_weight`
/// `[3d, d]` (rows: q, k, v), `in_proj_bias` `[3d]`, `out_proj.weight` `[d, d]`,
/// `out_proj.bias` `[d]`.
#[derive(Module, Debug)]
pub struct MultiheadAttention<B: Backend> {
    pub in_proj_weight: Param<Tensor<B, 2>>,
    pub in_proj_bias: Param<Tensor<B, 1>>,
    pub out_proj: Linear<B>,
    pub num_heads: usize,
}

impl<B: Backend> MultiheadAttention<B> {
    /// PyTorch's initialisation: `in_proj_weight` Xavier-uniform, biases 0, `out_proj.weight`
    /// Linear default (lerobot then re-initialises it Xavier-uniform).
    pub fn new(d: usize, num_heads: usize, device: &B::Device) -> Self {
        assert!(num_heads > 0 && d.is_multiple_of(num_heads), "MultiheadAttention: {num_heads} heads do not divide {d}");
        let mut out_proj = Linear::new(d, d, device);
        out_proj.bias = Some(Param::from_tensor(Tensor::zeros([d], device)));
        Self {
            in_proj_weight: Param::from_tensor(xavier_uniform([3 * d, d], d, 3 * d, device)),
            in_proj_bias: Param::from_tensor(Tensor::zeros([3 * d], device)),
            out_proj,
            num_heads,
        }
    }

    fn project(&self, x: Tensor<B, 3>, i: usize, p: Precision) -> Tensor<B, 3> {
        let d = self.in_proj_weight.dims()[1];
        let dt = p.dtype();
        let w = self.in_proj_weight.val().narrow(0, i * d, d); // [d, d]
        let b = self.in_proj_bias.val().narrow(0, i * d, d); // [d]
        linear(cast(x, dt), cast(w, dt).transpose(), Some(cast(b, dt)))
    }

    /// PyTorch's `multi_head_attention_forward` (the `need_weights` path): project, split heads,
    /// `softmax((q / √hd) kᵀ + mask)` in f32, (dropout on the weights), `· v`, merge heads,
    /// `out_proj`. `key_padding_mask[b, s] = true` hides key `s` (added as −∞).
    /// `attn_dropout`: dropout context and site for the attention weights.
    ///
    /// # Shapes
    /// - query: `[batch, l, d]`, key: `[batch, s, d]`, value: `[batch, s, d]`
    /// - key_padding_mask: `[batch, s]`
    /// - returns `[batch, l, d]` (compute dtype)
    pub fn forward(
        &self,
        query: Tensor<B, 3>,
        key: Tensor<B, 3>,
        value: Tensor<B, 3>,
        key_padding_mask: Option<&Tensor<B, 2, Bool>>,
        attn_dropout: Option<(&DropoutCtx, u64, f64)>,
        p: Precision,
    ) -> Tensor<B, 3> {
        let [b, l, d] = query.dims();
        let s = key.dims()[1];
        let h = self.num_heads;
        let hd = d / h;
        let heads = |t: Tensor<B, 3>, n: usize| t.reshape([b, n, h, hd]).swap_dims(1, 2); // [b, h, n, hd]
        let q = heads(self.project(query, 0, p), l);
        let k = heads(self.project(key, 1, p), s);
        let v = heads(self.project(value, 2, p), s);
        // PyTorch scales q before the product (q_scaled = q * hd^-1/2).
        let q = q * (hd as f64).powf(-0.5);
        let scores = to_f32(q.matmul(k.swap_dims(2, 3))); // [b, h, l, s]
        let scores = match key_padding_mask {
            Some(mask) => {
                assert_eq!(mask.dims(), [b, s], "key_padding_mask must be [batch, keys]");
                let bias = Tensor::<B, 2>::zeros([b, s], &scores.device()).mask_fill(mask.clone(), f32::NEG_INFINITY);
                scores + bias.reshape([b, 1, 1, s])
            }
            None => scores,
        };
        let attn = softmax(scores, 3); // [b, h, l, s], f32
        let attn = match attn_dropout {
            Some((ctx, site, rate)) => ctx.apply(attn, site, rate),
            None => attn,
        };
        let out = cast(attn, p.dtype()).matmul(v); // [b, h, l, hd]
        let out = out.swap_dims(1, 2).reshape([b, l, d]);
        self.out_proj.forward(out, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    type Tb = Flex;

    fn vals<const D: usize>(t: Tensor<Tb, D>) -> Vec<f32> {
        t.into_data().convert::<f32>().to_vec().unwrap()
    }

    #[test]
    fn linear_uses_pytorch_layout() {
        let dev = Default::default();
        let lin = Linear::<Tb> {
            weight: Param::from_tensor(Tensor::from_floats([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], &dev)),
            bias: Some(Param::from_tensor(Tensor::from_floats([0.5, 0.0, -1.0], &dev))),
        };
        let y = lin.forward(Tensor::<Tb, 2>::from_floats([[1.0, 1.0]], &dev), Precision::F32);
        assert_eq!(vals(y), [3.5, 7.0, 10.0]);
        let y3 = lin.forward(Tensor::<Tb, 3>::from_floats([[[1.0, 0.0]], [[0.0, 1.0]]], &dev), Precision::F32);
        assert_eq!(y3.dims(), [2, 1, 3]);
        assert_eq!(vals(y3), [1.5, 3.0, 4.0, 2.5, 4.0, 5.0]);
    }

    #[test]
    fn layer_norm_normalises_last_axis() {
        let dev = Default::default();
        let ln = LayerNorm::<Tb>::new(4, &dev);
        let y = vals(ln.forward(Tensor::<Tb, 2>::from_floats([[1.0, 2.0, 3.0, 4.0]], &dev)));
        // mean 2.5, var 1.25
        let s = (1.25f64 + 1e-5).sqrt();
        for (a, x) in y.iter().zip([1.0, 2.0, 3.0, 4.0]) {
            assert!((*a as f64 - (x - 2.5) / s).abs() < 1e-6);
        }
    }

    #[test]
    fn attention_masks_padded_keys_and_matches_single_head_formula() {
        let dev = Default::default();
        let d = 4;
        let mut mha = MultiheadAttention::<Tb>::new(d, 2, &dev);
        // Identity projections: q = k = v = x.
        let eye = Tensor::<Tb, 2>::eye(d, &dev);
        mha.in_proj_weight = Param::from_tensor(Tensor::cat(vec![eye.clone(), eye.clone(), eye.clone()], 0));
        mha.out_proj.weight = Param::from_tensor(eye);
        let x = Tensor::<Tb, 3>::random([1, 3, d], Distribution::Normal(0.0, 1.0), &dev);
        let mask = Tensor::<Tb, 2, Bool>::from_data(TensorData::new(vec![false, false, true], [1, 3]), &dev);
        let y = vals(mha.forward(x.clone(), x.clone(), x.clone(), Some(&mask), None, Precision::F32));
        let xv = vals(x);
        // Head h uses channels 2h..2h+2; key 2 is hidden.
        for l in 0..3 {
            for h in 0..2 {
                let dot = |a: usize, b: usize| (0..2).map(|c| xv[a * d + 2 * h + c] * xv[b * d + 2 * h + c]).sum::<f32>() / 2f32.sqrt();
                let w: Vec<f32> = (0..2).map(|s| dot(l, s).exp()).collect();
                let z: f32 = w.iter().sum();
                for c in 0..2 {
                    let expect = (0..2).map(|s| w[s] / z * xv[s * d + 2 * h + c]).sum::<f32>();
                    let got = y[l * d + 2 * h + c];
                    assert!((got - expect).abs() < 1e-5, "l{l} h{h} c{c}: {got} vs {expect}");
                }
            }
        }
    }

    #[test]
    fn dropout_is_deterministic_per_site_and_scaled() {
        let ctx = DropoutCtx::new(7);
        let a = ctx.mask_values(DropoutCtx::site(1, 0, 2), 10_000, 0.25);
        let b = ctx.mask_values(DropoutCtx::site(1, 0, 2), 10_000, 0.25);
        let c = ctx.mask_values(DropoutCtx::site(1, 1, 2), 10_000, 0.25);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let kept = a.iter().filter(|v| **v > 0.0).count() as f64 / a.len() as f64;
        assert!((kept - 0.75).abs() < 0.02, "kept fraction {kept}");
        assert!(a.iter().all(|v| *v == 0.0 || (*v - 4.0 / 3.0).abs() < 1e-6));
        assert_ne!(DropoutCtx::new(8).mask_values(DropoutCtx::site(1, 0, 2), 100, 0.25), a[..100].to_vec());
    }
}
