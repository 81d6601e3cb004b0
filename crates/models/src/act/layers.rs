//! ACT's transformer layers and position embeddings.
//!
//! Reference: huggingface/lerobot v0.4.4 `src/lerobot/policies/act/modeling_act.py` —
//! `ACTEncoder`, `ACTEncoderLayer`, `ACTDecoder`, `ACTDecoderLayer`,
//! `create_sinusoidal_pos_embedding` and `ACTSinusoidalPositionEmbedding2d`. Field names are
//! lerobot's, so parameter names are the state-dict keys. [`super::model::Act`] assembles them
//! (with [`LayerCtx`] telling each layer the precision and its dropout sites).

use burn::module::Module;
use burn::prelude::*;

use super::config::ActConfig;
use crate::nn::{Activation, DropoutCtx, KeyPaddingMask, LayerNorm, LeanBackend, Linear, MultiheadAttention, Precision, dropout, relu_dropout, residual_dropout, to_f32};

/// Dropout block numbers of [`DropoutCtx::site`].
pub(super) const BLOCK_VAE: u64 = 0;
pub(super) const BLOCK_ENCODER: u64 = 1;
pub(super) const BLOCK_DECODER: u64 = 2;

/// What one transformer layer needs to know about the pass.
#[derive(Clone, Copy, Debug)]
pub struct LayerCtx<'a> {
    pub precision: Precision,
    /// Dropout masks (training only); `None` → no dropout.
    pub dropout: Option<&'a DropoutCtx>,
    pub rate: f64,
    /// Dropout block (0 VAE encoder, 1 encoder, 2 decoder) and layer index: with the slot, the
    /// mask's site.
    pub block: u64,
    pub layer: usize,
}

impl LayerCtx<'_> {
    fn drop<B: LeanBackend, const D: usize>(&self, x: Tensor<B, D>, slot: u64) -> Tensor<B, D> {
        dropout(x, self.dropout, DropoutCtx::site(self.block, self.layer, slot), self.rate)
    }

    /// `self.drop(activation(x + bias), slot)`, the FFN's (`x`, `bias`: its first linear layer's
    /// [`Linear::forward_parts`]); with ReLU one node where the backend fuses it
    /// ([`relu_dropout`]).
    fn act_drop<B: LeanBackend>(&self, activation: Activation, (x, bias): (Tensor<B, 3>, Option<Tensor<B, 1>>), slot: u64) -> Tensor<B, 3> {
        match activation {
            Activation::Relu => relu_dropout(x, bias, self.dropout, DropoutCtx::site(self.block, self.layer, slot), self.rate),
            Activation::Gelu => self.drop(activation.apply(add_bias(x, bias)), slot),
        }
    }

    /// `skip + to_f32(self.drop(x + bias, slot))` (`x`, `bias`: the sublayer's output before its
    /// last bias add, `forward_parts`), one node where the backend fuses it ([`residual_dropout`]).
    fn drop_add<B: LeanBackend>(&self, skip: Tensor<B, 3>, (x, bias): (Tensor<B, 3>, Option<Tensor<B, 1>>), slot: u64) -> Tensor<B, 3> {
        residual_dropout(skip, x, bias, self.dropout, DropoutCtx::site(self.block, self.layer, slot), self.rate)
    }

    fn attn_drop(&self, slot: u64) -> Option<(&DropoutCtx, u64, f64)> {
        self.dropout.filter(|_| self.rate > 0.0).map(|d| (d, DropoutCtx::site(self.block, self.layer, slot), self.rate))
    }
}

fn add_bias<B: LeanBackend>(x: Tensor<B, 3>, bias: Option<Tensor<B, 1>>) -> Tensor<B, 3> {
    match bias {
        Some(b) => crate::nn::lean::bias_add(x, b),
        None => x,
    }
}

fn add_pos<B: LeanBackend>(x: Tensor<B, 3>, pos: Option<&Tensor<B, 3>>) -> Tensor<B, 3> {
    match pos {
        Some(p) => x + p.clone(),
        None => x,
    }
}

/// `ACTEncoderLayer`: DETR-style layer, positions added to queries and keys only.
#[derive(Module, Debug)]
pub struct ActEncoderLayer<B: Backend> {
    pub self_attn: MultiheadAttention<B>,
    pub linear1: Linear<B>,
    pub linear2: Linear<B>,
    pub norm1: LayerNorm<B>,
    pub norm2: LayerNorm<B>,
    pub activation: Activation,
    pub pre_norm: bool,
}

impl<B: LeanBackend> ActEncoderLayer<B> {
    pub fn new(cfg: &ActConfig, device: &B::Device) -> Self {
        let (d, ff) = (cfg.dim_model, cfg.dim_feedforward);
        let mut self_attn = MultiheadAttention::new(d, cfg.n_heads, device);
        self_attn.out_proj = self_attn.out_proj.xavier();
        Self {
            self_attn,
            linear1: Linear::new(d, ff, device).xavier(),
            linear2: Linear::new(ff, d, device).xavier(),
            norm1: LayerNorm::new(d, device),
            norm2: LayerNorm::new(d, device),
            activation: cfg.activation(),
            pre_norm: cfg.pre_norm,
        }
    }

    /// Dropout slots: 0 attention weights, 1 `dropout1`, 2 `dropout` (FFN), 3 `dropout2`.
    ///
    /// # Shapes
    /// - x: `[b, s, d]` (any dtype; the stream is f32); pos: `[1 or b, s, d]`; mask: `[b, s]`
    /// - returns `[b, s, d]` f32
    pub fn forward(&self, x: Tensor<B, 3>, pos: Option<&Tensor<B, 3>>, key_padding_mask: Option<&KeyPaddingMask<B>>, lc: &LayerCtx) -> Tensor<B, 3> {
        let p = lc.precision;
        let x = to_f32(x);
        let skip = x.clone();
        let x = if self.pre_norm { self.norm1.forward(x) } else { x };
        let qk = add_pos(x.clone(), pos);
        let x = self.self_attn.self_attention_parts(qk, x, key_padding_mask, lc.attn_drop(0), p);
        let x = lc.drop_add(skip, x, 1);
        let (skip, x) = if self.pre_norm {
            (x.clone(), self.norm2.forward(x))
        } else {
            let x = self.norm1.forward(x);
            (x.clone(), x)
        };
        let h = lc.act_drop(self.activation, self.linear1.forward_parts(x, p), 2);
        let x = lc.drop_add(skip, self.linear2.forward_parts(h, p), 3);
        if self.pre_norm { x } else { self.norm2.forward(x) }
    }
}

/// `ACTEncoder`: the layers, then a LayerNorm only with `pre_norm` (else `nn.Identity`).
#[derive(Module, Debug)]
pub struct ActEncoder<B: Backend> {
    pub layers: Vec<ActEncoderLayer<B>>,
    pub norm: Option<LayerNorm<B>>,
}

impl<B: LeanBackend> ActEncoder<B> {
    pub fn new(cfg: &ActConfig, num_layers: usize, device: &B::Device) -> Self {
        Self {
            layers: (0..num_layers).map(|_| ActEncoderLayer::new(cfg, device)).collect(),
            norm: cfg.pre_norm.then(|| LayerNorm::new(cfg.dim_model, device)),
        }
    }

    /// The final LayerNorm (`pre_norm`), else the identity.
    pub(super) fn final_norm(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match &self.norm {
            Some(n) => n.forward(x),
            None => x,
        }
    }
}

/// `ACTDecoderLayer`: self-attention over the queries, cross-attention to the encoder, FFN.
#[derive(Module, Debug)]
pub struct ActDecoderLayer<B: Backend> {
    pub self_attn: MultiheadAttention<B>,
    pub multihead_attn: MultiheadAttention<B>,
    pub linear1: Linear<B>,
    pub linear2: Linear<B>,
    pub norm1: LayerNorm<B>,
    pub norm2: LayerNorm<B>,
    pub norm3: LayerNorm<B>,
    pub activation: Activation,
    pub pre_norm: bool,
}

impl<B: LeanBackend> ActDecoderLayer<B> {
    pub fn new(cfg: &ActConfig, device: &B::Device) -> Self {
        let (d, ff) = (cfg.dim_model, cfg.dim_feedforward);
        let mut self_attn = MultiheadAttention::new(d, cfg.n_heads, device);
        self_attn.out_proj = self_attn.out_proj.xavier();
        let mut multihead_attn = MultiheadAttention::new(d, cfg.n_heads, device);
        multihead_attn.out_proj = multihead_attn.out_proj.xavier();
        Self {
            self_attn,
            multihead_attn,
            linear1: Linear::new(d, ff, device).xavier(),
            linear2: Linear::new(ff, d, device).xavier(),
            norm1: LayerNorm::new(d, device),
            norm2: LayerNorm::new(d, device),
            norm3: LayerNorm::new(d, device),
            activation: cfg.activation(),
            pre_norm: cfg.pre_norm,
        }
    }

    /// Dropout slots: 0 self-attention weights, 1 `dropout1`, 2 cross-attention weights,
    /// 3 `dropout2`, 4 `dropout` (FFN), 5 `dropout3`.
    ///
    /// # Shapes
    /// - x: `[b, chunk, d]`; encoder_out: `[b, s, d]`; decoder_pos: `[1, chunk, d]`;
    ///   encoder_pos: `[1 or b, s, d]` → `[b, chunk, d]` f32
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        encoder_out: Tensor<B, 3>,
        decoder_pos: Option<&Tensor<B, 3>>,
        encoder_pos: Option<&Tensor<B, 3>>,
        lc: &LayerCtx,
    ) -> Tensor<B, 3> {
        let p = lc.precision;
        let x = to_f32(x);
        let encoder_out = to_f32(encoder_out);
        let skip = x.clone();
        let x = if self.pre_norm { self.norm1.forward(x) } else { x };
        let qk = add_pos(x.clone(), decoder_pos);
        let x = self.self_attn.self_attention_parts(qk, x, None, lc.attn_drop(0), p);
        let x = lc.drop_add(skip, x, 1);
        let (skip, x) = if self.pre_norm {
            (x.clone(), self.norm2.forward(x))
        } else {
            let x = self.norm1.forward(x);
            (x.clone(), x)
        };
        let x = self.multihead_attn.forward_parts(
            add_pos(x, decoder_pos),
            add_pos(encoder_out.clone(), encoder_pos),
            encoder_out,
            None,
            lc.attn_drop(2),
            p,
        );
        let x = lc.drop_add(skip, x, 3);
        let (skip, x) = if self.pre_norm {
            (x.clone(), self.norm3.forward(x))
        } else {
            let x = self.norm2.forward(x);
            (x.clone(), x)
        };
        let h = lc.act_drop(self.activation, self.linear1.forward_parts(x, p), 4);
        let x = lc.drop_add(skip, self.linear2.forward_parts(h, p), 5);
        if self.pre_norm { x } else { self.norm3.forward(x) }
    }
}

/// `ACTDecoder`: the layers, then `norm` (always a LayerNorm).
#[derive(Module, Debug)]
pub struct ActDecoder<B: Backend> {
    pub layers: Vec<ActDecoderLayer<B>>,
    pub norm: LayerNorm<B>,
}

/// lerobot's `create_sinusoidal_pos_embedding(n, d)` (computed in f64 as numpy, then f32):
/// `pe[pos, j] = sin / cos(pos / 10000^(2⌊j/2⌋/d))` (sin for even `j`, cos for odd `j`).
pub fn sinusoidal_pos_embedding_1d(num_positions: usize, dim: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(num_positions * dim);
    for pos in 0..num_positions {
        for j in 0..dim {
            let angle = pos as f64 / 10000f64.powf((2 * (j / 2)) as f64 / dim as f64);
            out.push(if j % 2 == 0 { angle.sin() } else { angle.cos() } as f32);
        }
    }
    out
}

/// lerobot's `ACTSinusoidalPositionEmbedding2d(dim_model // 2)` for an `h × w` map, as
/// `[h·w, dim_model]` rows in token order (`(h w)` flattening), computed in f32 with the
/// reference's operation order: positions `1..=n` normalised as `i / (n + 1e-6) · 2π`,
/// frequencies `10000^(2⌊c/2⌋ / half)`, channel `c` of each half `sin` (even `c`) or `cos`
/// (odd `c`) — interleaved — and the y half before the x half.
pub fn sinusoidal_pos_embedding_2d(h: usize, w: usize, dim_model: usize) -> Vec<f32> {
    let half = dim_model / 2;
    let two_pi = std::f64::consts::TAU as f32;
    let eps = 1e-6f32;
    let inv_freq: Vec<f32> = (0..half).map(|c| 10000f32.powf((2 * (c / 2)) as f32 / half as f32)).collect();
    let y_norm = |i: usize| (i + 1) as f32 / (h as f32 + eps) * two_pi;
    let x_norm = |j: usize| (j + 1) as f32 / (w as f32 + eps) * two_pi;
    let embed = |v: f32, c: usize| {
        let a = v / inv_freq[c];
        if c.is_multiple_of(2) { a.sin() } else { a.cos() }
    };
    let mut out = Vec::with_capacity(h * w * 2 * half);
    for i in 0..h {
        for j in 0..w {
            let (y, x) = (y_norm(i), x_norm(j));
            out.extend((0..half).map(|c| embed(y, c)));
            out.extend((0..half).map(|c| embed(x, c)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pos_1d_matches_reference_formula() {
        let t = sinusoidal_pos_embedding_1d(3, 4);
        // pos 2, j = 2, 3: angle = 2 / 10000^(2/4) = 0.02
        assert!((t[2 * 4 + 2] - 0.02f64.sin() as f32).abs() < 1e-7);
        assert!((t[2 * 4 + 3] - 0.02f64.cos() as f32).abs() < 1e-7);
        assert_eq!(t[0], 0.0);
        assert_eq!(t[1], 1.0);
    }

    #[test]
    fn pos_2d_layout_is_y_then_x_interleaved() {
        // dim_model 8 → half 4: channels [sin y/f0, cos y/f1, sin y/f2, cos y/f3, (same for x)],
        // f = 10000^(2⌊c/2⌋/4) = [1, 1, 100, 100].
        let (h, w) = (2, 3);
        let t = sinusoidal_pos_embedding_2d(h, w, 8);
        assert_eq!(t.len(), h * w * 8);
        let tau = std::f64::consts::TAU;
        let (i, j) = (1, 2);
        let y = 2.0 / (2.0 + 1e-6) * tau;
        let x = 3.0 / (3.0 + 1e-6) * tau;
        let expect = [y.sin(), y.cos(), (y / 100.0).sin(), (y / 100.0).cos(), x.sin(), x.cos(), (x / 100.0).sin(), (x / 100.0).cos()];
        let row = &t[(i * w + j) * 8..(i * w + j + 1) * 8];
        for (a, e) in row.iter().zip(expect) {
            assert!((*a as f64 - e).abs() < 1e-5, "{row:?} vs {expect:?}");
        }
    }
}
