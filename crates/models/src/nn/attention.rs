//! `nn.MultiheadAttention` with PyTorch's parameter names and arithmetic.

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;

use super::lean::AttnArgs;
use super::{DropoutCtx, Linear, Precision, xavier_uniform};

/// A key padding mask (PyTorch's `key_padding_mask` `[batch, keys]`, `true` hides a key) as the
/// attention adds it to its scores: f32, 0 where a key is seen, −∞ where it is hidden (PyTorch
/// converts it so in every call, `_canonical_mask`). Built once, it serves every attention that
/// shares it (ACT's VAE encoder: one per forward for its 4 layers).
#[derive(Clone, Debug)]
pub struct KeyPaddingMask<B: Backend> {
    bias: Tensor<B, 2>,
}

impl<B: Backend> KeyPaddingMask<B> {
    /// From the boolean mask `[batch, keys]` (`true` = hidden).
    pub fn new(mask: Tensor<B, 2, Bool>) -> Self {
        let bias = Tensor::<B, 2>::zeros(mask.dims(), &mask.device()).mask_fill(mask, f32::NEG_INFINITY);
        Self { bias }
    }

    /// `[batch, keys]`.
    pub fn dims(&self) -> [usize; 2] {
        self.bias.dims()
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

impl<B: super::lean::LeanBackend> MultiheadAttention<B> {
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

    /// PyTorch's `multi_head_attention_forward` (the `need_weights` path): project, split heads,
    /// `softmax((q / √hd) kᵀ + mask)` in f32, (dropout on the weights), `· v`, merge heads
    /// (all that one lean node: [`LeanBackend::lean_attention`](super::lean::LeanBackend::lean_attention)),
    /// `out_proj`. `key_padding_mask` ([`KeyPaddingMask`]) hides keys (added as −∞).
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
        key_padding_mask: Option<&KeyPaddingMask<B>>,
        attn_dropout: Option<(&DropoutCtx, u64, f64)>,
        p: Precision,
    ) -> Tensor<B, 3> {
        match self.forward_parts(query, key, value, key_padding_mask, attn_dropout, p) {
            (y, Some(b)) => super::lean::bias_add(y, b),
            (y, None) => y,
        }
    }

    /// [`MultiheadAttention::forward`] without `out_proj`'s bias add, and that bias in the compute
    /// dtype ([`super::Linear::forward_parts`]), for an op after it that adds the bias itself.
    pub fn forward_parts(
        &self,
        query: Tensor<B, 3>,
        key: Tensor<B, 3>,
        value: Tensor<B, 3>,
        key_padding_mask: Option<&KeyPaddingMask<B>>,
        attn_dropout: Option<(&DropoutCtx, u64, f64)>,
        p: Precision,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 1>>) {
        self.parts([query, key, value], false, key_padding_mask, attn_dropout, p)
    }

    /// [`MultiheadAttention::forward_parts`] of a self-attention whose query and key are one
    /// tensor, `qk` (ACT's `self_attn(q, k, value=x)` with `q = k = x + pos`): the same values,
    /// with `q` and `k` projected by one product and the input's gradient formed by one
    /// (`AttnArgs::shared_qk`).
    ///
    /// # Shapes
    /// - qk, value: `[batch, s, d]`; key_padding_mask: `[batch, s]`
    /// - returns `[batch, s, d]` (compute dtype)
    pub fn self_attention_parts(
        &self,
        qk: Tensor<B, 3>,
        value: Tensor<B, 3>,
        key_padding_mask: Option<&KeyPaddingMask<B>>,
        attn_dropout: Option<(&DropoutCtx, u64, f64)>,
        p: Precision,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 1>>) {
        self.parts([qk.clone(), qk, value], true, key_padding_mask, attn_dropout, p)
    }

    fn parts(
        &self,
        [query, key, value]: [Tensor<B, 3>; 3],
        shared_qk: bool,
        key_padding_mask: Option<&KeyPaddingMask<B>>,
        attn_dropout: Option<(&DropoutCtx, u64, f64)>,
        p: Precision,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 1>>) {
        let b = query.dims()[0];
        let s = key.dims()[1];
        let mask_bias = key_padding_mask.map(|mask| {
            assert_eq!(mask.dims(), [b, s], "key_padding_mask must be [batch, keys]");
            mask.bias.clone()
        });
        let dropout = attn_dropout.filter(|&(_, _, rate)| rate > 0.0).map(|(ctx, site, rate)| {
            let (base, threshold) = ctx.base_threshold(site, rate);
            (base, threshold, 1.0 / (1.0 - rate))
        });
        let args = AttnArgs { heads: self.num_heads, dtype: p.dtype(), dropout, shared_qk };
        let inputs = [query, key, value].map(|x| x.into_primitive().tensor());
        let (w, bias) = (self.in_proj_weight.val().into_primitive().tensor(), self.in_proj_bias.val().into_primitive().tensor());
        let out = B::lean_attention(inputs, w, bias, mask_bias.map(|m| m.into_primitive().tensor()), args);
        self.out_proj.forward_parts(Tensor::from_primitive(TensorPrimitive::Float(out)), p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::{Distribution, TensorData};

    type Tb = Flex;

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
        let y = super::super::tests::vals(mha.forward(x.clone(), x.clone(), x.clone(), Some(&KeyPaddingMask::new(mask)), None, Precision::F32));
        let xv = super::super::tests::vals(x);
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

}
