//! Parameter counts and saved activations of a transformer stack from its dimensions.
//!
//! # Activation formula
//! Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
//! (§4.1), generalised: per layer, for `s` tokens, batch `b`, hidden `h`, `a` heads, MLP width
//! `f`, the tensors autograd keeps for backward are listed one by one ([`layer_items`]), each
//! with the dtype it has under the run's precision. With fp16 everywhere, dropout, `f = 4h`,
//! no GQA, the list sums to their `sbh(34 + 5as/h)` bytes (the unit test checks it):
//!
//! | tensor | elements | fp16 bytes | autocast bytes |
//! |---|---|---:|---:|
//! | norm input (×2: attention, MLP) | sbh | 2 | 4 |
//! | QKV linear input, MLP up input | sbh | 2 | 2 |
//! | Q, K (for QKᵀ), V (for PV) | sbh each | 2 | 2 |
//! | softmax output | a·s²·b | 2 | 4 |
//! | attention-dropout mask / output | a·s²·b | 1 / 2 | 1 / 2 |
//! | out-projection input | sbh | 2 | 2 |
//! | activation-function input, down input | s·b·f each | 2 | 2 |
//! | dropout masks (attention out, MLP out) | sbh each | 1 | 1 |
//!
//! Variants: gated MLP (SwiGLU) keeps gate, up, silu(gate), product: `4·sbf`; grouped-query
//! attention keeps K, V at `kv_heads/heads` of that size; fused (flash) attention keeps no
//! `a·s²·b` tensor, only the f32 log-sum-exp `a·s·b`; under autocast a bf16 copy of the
//! probabilities feeds PV when there is no dropout; a decoder's cross-attention adds its norm,
//! Q, K and V over the memory, probabilities `a·s·m·b`, and out-projection input.
//! Full checkpointing keeps each layer's input (`sbh`, residual dtype) and recomputes one layer
//! at a time in backward, so one layer's full list is live on top.
//! Not counted: biases' and norms' tiny per-row statistics, the positional-embedding adds that
//! some models (ACT, DETR) apply to Q and K per layer, allocator fragmentation.

use serde::Serialize;

use crate::config::{ActPrecision, Lora, Mlp, Norm, TransformerDims};

/// One layer's linears as `(name, in, out)`.
pub fn layer_linears(t: &TransformerDims, cross: bool) -> Vec<(&'static str, u64, u64)> {
    let h = t.hidden;
    let kv = kv_width(t);
    let mut v = vec![("q", h, h), ("k", h, kv), ("v", h, kv), ("o", h, h)];
    if cross {
        v.extend([
            ("cross_q", h, h),
            ("cross_k", h, kv),
            ("cross_v", h, kv),
            ("cross_o", h, h),
        ]);
    }
    if t.mlp == Mlp::Gated {
        v.push(("gate", h, t.intermediate));
    }
    v.extend([("up", h, t.intermediate), ("down", t.intermediate, h)]);
    v
}

fn kv_width(t: &TransformerDims) -> u64 {
    t.hidden / t.heads * t.kv_heads.unwrap_or(t.heads)
}

fn norm_params(t: &TransformerDims) -> u64 {
    match t.norm {
        Norm::Layer => 2 * t.hidden,
        Norm::Rms => t.hidden,
    }
}

/// Parameters of one layer (linears, their biases, the norms).
pub fn layer_params(t: &TransformerDims, cross: bool) -> u64 {
    let linears = layer_linears(t, cross);
    let weights: u64 = linears.iter().map(|(_, i, o)| i * o).sum();
    let biases: u64 = if t.bias {
        linears.iter().map(|(_, _, o)| o).sum()
    } else {
        0
    };
    let norms = if cross { 3 } else { 2 };
    weights + biases + norms * norm_params(t)
}

/// Parameters outside the layers: embedding, LM head, final norm, learned positions.
pub fn embedding_params(t: &TransformerDims) -> u64 {
    let emb = t.vocab * t.hidden;
    let head = if t.tied_embeddings { 0 } else { emb };
    let final_norm = if t.final_norm { norm_params(t) } else { 0 };
    emb + head + final_norm + t.positions * t.hidden
}

/// All parameters of the stack.
pub fn params(t: &TransformerDims, cross: bool) -> u64 {
    t.layers * layer_params(t, cross) + embedding_params(t)
}

/// Whether `lora` targets the linear `name`.
fn targets(lora: &Lora, name: &str) -> bool {
    lora.targets.iter().any(|t| t == name || t == "all-linear")
}

/// LoRA parameters: `rank · (in + out)` per targeted linear per layer.
pub fn lora_params(t: &TransformerDims, cross: bool, lora: &Lora) -> u64 {
    let mut per_layer: u64 = layer_linears(t, cross)
        .iter()
        .filter(|(n, _, _)| targets(lora, n))
        .map(|(_, i, o)| lora.rank * (i + o))
        .sum();
    if lora.targets.iter().any(|t| t == "qkv") {
        per_layer += lora.rank * (2 * t.hidden + 2 * kv_width(t));
    }
    t.layers * per_layer
}

/// One kind of tensor a layer saves.
#[derive(Clone, Debug, Serialize)]
pub struct Item {
    pub name: &'static str,
    /// Elements per layer for the whole micro-batch.
    pub elements: f64,
    pub bytes_per_element: f64,
}

impl Item {
    pub fn bytes(&self) -> f64 {
        self.elements * self.bytes_per_element
    }
}

/// Shapes and switches of one layer's activation list.
#[derive(Clone, Copy, Debug)]
pub struct LayerShape {
    /// Tokens per sample.
    pub s: f64,
    pub b: f64,
    /// Cross-attention memory tokens, if the layer is a decoder layer.
    pub memory: Option<f64>,
    pub precision: ActPrecision,
    pub flash: bool,
    pub dropout: bool,
}

/// The tensors one layer saves for backward (see the module docs).
pub fn layer_items(t: &TransformerDims, sh: LayerShape) -> Vec<Item> {
    let (s, b) = (sh.s, sh.b);
    let (h, a, f) = (t.hidden as f64, t.heads as f64, t.intermediate as f64);
    let kv = kv_width(t) as f64;
    let p = sh.precision.compute_bytes();
    let r = sh.precision.residual_bytes();
    let sm = sh.precision.softmax_bytes();
    let it = |name, elements, bytes_per_element| Item {
        name,
        elements,
        bytes_per_element,
    };
    let mut v = Vec::new();

    let attention = |v: &mut Vec<Item>, prefix: &'static [&'static str; 8], sq: f64, skv: f64| {
        v.push(it(prefix[0], s * b * h, r));
        v.push(it(prefix[1], s * b * h, p));
        if !prefix[2].is_empty() {
            v.push(it(prefix[2], skv * b * h, p)); // the memory, cast for the K/V linears
        }
        v.push(it(prefix[3], sq * b * h + skv * b * kv, p)); // Q and K
        v.push(it(prefix[4], skv * b * kv, p)); // V
        if sh.flash {
            v.push(it(prefix[5], a * sq * b, 4.0)); // log-sum-exp per row
        } else {
            v.push(it(prefix[5], a * sq * skv * b, sm));
            if sh.dropout {
                v.push(it(prefix[6], a * sq * skv * b, 1.0));
            }
            if sh.dropout || sh.precision.is_autocast() {
                // The tensor PV multiplies: dropout's output, or autocast's half copy.
                v.push(it(prefix[7], a * sq * skv * b, p));
            }
        }
        v.push(it("attention out-projection input", sq * b * h, p));
        if sh.dropout {
            v.push(it("attention output dropout mask", sq * b * h, 1.0));
        }
    };
    attention(
        &mut v,
        &[
            "self-attn norm input",
            "QKV linear input",
            "",
            "Q, K",
            "V",
            "softmax output (a·s²·b) / flash log-sum-exp",
            "attention-dropout mask",
            "attention probabilities for PV (dropout output or half copy)",
        ],
        s,
        s,
    );
    if let Some(m) = sh.memory {
        attention(
            &mut v,
            &[
                "cross-attn norm input",
                "cross-attn Q linear input",
                "cross-attn memory (K/V linear input)",
                "cross-attn Q, K",
                "cross-attn V",
                "cross-attn softmax output (a·s·m·b) / flash log-sum-exp",
                "cross-attn dropout mask",
                "cross-attn probabilities for PV",
            ],
            s,
            m,
        );
    }
    v.push(it("MLP norm input", s * b * h, r));
    v.push(it("MLP up linear input", s * b * h, p));
    match t.mlp {
        Mlp::Standard => {
            v.push(it("activation-function input", s * b * f, p));
            v.push(it("down linear input", s * b * f, p));
        }
        Mlp::Gated => {
            v.push(it("gate and up outputs", 2.0 * s * b * f, p));
            v.push(it("silu(gate), down linear input", 2.0 * s * b * f, p));
        }
    }
    if sh.dropout {
        v.push(it("MLP output dropout mask", s * b * h, 1.0));
    }
    v
}

/// Bytes one layer saves.
pub fn layer_bytes(t: &TransformerDims, sh: LayerShape) -> f64 {
    layer_items(t, sh).iter().map(Item::bytes).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Mlp, Norm};

    pub(crate) fn llama2_7b() -> TransformerDims {
        TransformerDims {
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: None,
            intermediate: 11008,
            mlp: Mlp::Gated,
            norm: Norm::Rms,
            bias: false,
            vocab: 32000,
            tied_embeddings: false,
            logits: true,
            final_norm: true,
            positions: 0,
            sequence: 4096,
            extra_tokens: 0,
            image_tokens_of: None,
            cross_attention_tokens: None,
            cross_attention_to: None,
        }
    }

    #[test]
    fn llama2_7b_has_6_74_b_parameters() {
        let n = params(&llama2_7b(), false) as f64;
        // Meta's count: 6,738,415,616.
        assert!((n / 6.738_415_616e9 - 1.0).abs() < 0.005, "{n}");
        assert_eq!(n as u64, 6_738_415_616);
    }

    #[test]
    fn lora_r32_all_linear_on_llama2_7b() {
        let lora = Lora {
            rank: 32,
            targets: ["q", "k", "v", "o", "gate", "up", "down"]
                .map(String::from)
                .to_vec(),
        };
        // PEFT prints 79,953,920 trainable parameters for r = 32 on all seven projections
        // (r = 8: 19,988,480; r = 16 on q, v only: 8,388,608).
        assert_eq!(lora_params(&llama2_7b(), false, &lora), 79_953_920);
        // A fused qkv (timm) takes one adapter of r·(h + 3h), not three of r·2h.
        let fused = Lora {
            rank: 32,
            targets: vec!["qkv".into()],
        };
        assert_eq!(
            lora_params(&llama2_7b(), false, &fused),
            32 * 32 * (4096 + 3 * 4096)
        );
        let qv = Lora {
            rank: 16,
            targets: vec!["q".into(), "v".into()],
        };
        assert_eq!(lora_params(&llama2_7b(), false, &qv), 8_388_608);
    }

    #[test]
    fn reduces_to_korthikanti_34_plus_5as_over_h() {
        // GPT-like layer: f = 4h, fp16, dropout, no flash.
        let t = TransformerDims {
            mlp: Mlp::Standard,
            norm: Norm::Layer,
            intermediate: 4 * 4096,
            ..llama2_7b()
        };
        let (s, b) = (2048.0, 4.0);
        let sh = LayerShape {
            s,
            b,
            memory: None,
            precision: ActPrecision::F16,
            flash: false,
            dropout: true,
        };
        let (h, a) = (4096.0, 32.0);
        let expected = s * b * h * (34.0 + 5.0 * a * s / h);
        let got = layer_bytes(&t, sh);
        assert!((got / expected - 1.0).abs() < 1e-12, "{got} vs {expected}");
        // Flash attention removes the 5as/h term and adds a 4-byte log-sum-exp per row.
        let flash = layer_bytes(&t, LayerShape { flash: true, ..sh });
        assert!(
            (flash - (s * b * h * 34.0 + 4.0 * a * s * b)).abs() < 1.0,
            "{flash}"
        );
    }
}
