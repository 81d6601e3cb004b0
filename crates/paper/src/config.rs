//! The TOML description of a model and its training set-up (see the crate docs for the format).
//!
//! Plain data with serde: every table rejects unknown keys, so a typo is an error that names
//! the key; [`PaperConfig::validate`] checks the values and names the field.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Error;
pub use crate::claim::{Assume, Claim, Quantity, Unit};
pub use crate::setup::{ActPrecision, Checkpointing, DType, Optimizer, Sharding};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mlp {
    /// `down(act(up(x)))` (GELU / ReLU).
    Standard,
    /// `down(silu(gate(x)) * up(x))` (SwiGLU, LLaMA).
    Gated,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    /// LayerNorm: weight and bias.
    Layer,
    /// RMSNorm: weight only.
    Rms,
}

/// Linear layers LoRA can target.
/// `qkv` is a fused Q/K/V projection (timm ViTs): one adapter of `rank·(h + h + 2·kv)`, not
/// three; `up` / `down` are the two linears of a standard MLP too. The names are those
/// [`crate::transformer::layer_linears`] gives a layer's linears.
pub const LORA_TARGETS: [&str; 12] = [
    "q", "k", "v", "o", "qkv", "gate", "up", "down", "cross_q", "cross_k", "cross_v", "cross_o",
];

/// LoRA adapters on named linear layers of a transformer component.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lora {
    pub rank: u64,
    /// Transformers: any of `q k v o`, `qkv` (fused), `gate up down` (MLP; `up`/`down` are the
    /// two linears of a standard MLP), `cross_q cross_k cross_v cross_o`, or `all-linear`
    /// (all but the fused `qkv`). Blocks: every `linear` entry gets an adapter (`all-linear`).
    pub targets: Vec<String>,
}

/// A transformer stack given by its dimensions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerDims {
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    /// Key/value heads (grouped-query attention); default = `heads`.
    pub kv_heads: Option<u64>,
    /// MLP width.
    pub intermediate: u64,
    #[serde(default = "default_mlp")]
    pub mlp: Mlp,
    #[serde(default = "default_norm")]
    pub norm: Norm,
    /// Biases on the attention and MLP linears.
    #[serde(default)]
    pub bias: bool,
    /// Token embedding (and LM head unless tied) of this many rows; 0 = none.
    #[serde(default)]
    pub vocab: u64,
    #[serde(default)]
    pub tied_embeddings: bool,
    /// Whether the forward computes logits over the whole sequence for a loss (vocab > 0).
    #[serde(default)]
    pub logits: bool,
    /// A final norm after the last layer.
    #[serde(default)]
    pub final_norm: bool,
    /// Learned position embeddings of this many rows; 0 = none (RoPE, or counted elsewhere).
    #[serde(default)]
    pub positions: u64,
    /// Tokens per sample, before `extra_tokens` and `image_tokens_of`.
    #[serde(default)]
    pub sequence: u64,
    /// Added to `sequence` (e.g. ACT's latent and state tokens).
    #[serde(default)]
    pub extra_tokens: u64,
    /// Add the feature-map tokens of the named `resnet` component (one per output pixel).
    pub image_tokens_of: Option<String>,
    /// Each layer also cross-attends to a memory of this many tokens (a decoder).
    pub cross_attention_tokens: Option<u64>,
    /// Or to the sequence of the named transformer component.
    pub cross_attention_to: Option<String>,
}

fn default_mlp() -> Mlp {
    Mlp::Standard
}
fn default_norm() -> Norm {
    Norm::Layer
}

/// A torchvision-layout ResNet with basic blocks (18 / 34), as the vision backbone of ACT.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResnetDims {
    /// 18 or 34.
    pub depth: u64,
    /// Each camera's `[channels, height, width]`; one shared backbone runs on all of them.
    pub images: Vec<[u64; 3]>,
    /// FrozenBatchNorm2d (lerobot ACT, DETR): BN statistics and affine are buffers, not
    /// parameters, and save nothing for backward.
    #[serde(default)]
    pub frozen_bn: bool,
    /// Drop the final fc (lerobot keeps layer4's feature map).
    #[serde(default = "yes")]
    pub no_fc: bool,
}

fn yes() -> bool {
    true
}

/// Linear layers given by their shapes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Linear {
    pub name: Option<String>,
    #[serde(rename = "in")]
    pub input: u64,
    pub out: u64,
    #[serde(default = "one")]
    pub count: u64,
    #[serde(default = "yes")]
    pub bias: bool,
}

fn one() -> u64 {
    1
}

/// A tensor the forward saves for backward (or a transient buffer), by shape per sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Activation {
    pub name: String,
    /// Shape of one sample's tensor (the batch dimension is added).
    pub shape: Vec<u64>,
    /// How many tensors of that shape.
    #[serde(default = "one")]
    pub count: u64,
    /// Default: the run's activation dtype (f32 or half).
    pub dtype: Option<DType>,
    /// Freed before the next entry is allocated (e.g. attention scores before softmax).
    #[serde(default)]
    pub transient: bool,
}

/// What a component is, from which of its tables is present.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ComponentKind {
    /// A `transformer` table.
    Transformer,
    /// A `resnet` table.
    Resnet,
    /// Neither: parameters given explicitly (`params`, `linear`) and activations by shape.
    Blocks,
}

/// One part of the model, in forward order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Component {
    pub name: String,
    /// Its own parameters are not trained (LoRA adapters on it still are).
    #[serde(default)]
    pub frozen: bool,
    pub lora: Option<Lora>,
    pub transformer: Option<TransformerDims>,
    pub resnet: Option<ResnetDims>,
    /// Explicit parameter count (blocks), added to `linear`.
    #[serde(default)]
    pub params: f64,
    #[serde(default)]
    pub linear: Vec<Linear>,
    /// Saved activations by shape (blocks; added for the other kinds).
    #[serde(default)]
    pub activation: Vec<Activation>,
    /// Parameter units FSDP / ZeRO-3 gathers at once for a `blocks` component (default 1).
    pub shard_units: Option<u64>,
}

impl Component {
    pub fn kind(&self) -> ComponentKind {
        match (&self.transformer, &self.resnet) {
            (Some(_), _) => ComponentKind::Transformer,
            (None, Some(_)) => ComponentKind::Resnet,
            (None, None) => ComponentKind::Blocks,
        }
    }
}

/// A whole description: the `[paper]` table of a TOML file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaperConfig {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Memory of the GPU the report targets (GiB), for the fit column and the OOM walk.
    pub gpu_memory_gib: Option<f64>,
    pub gpu_name: Option<String>,
    /// Data-parallel GPUs for the sharding table.
    #[serde(default = "one")]
    pub gpus: u64,
    /// Micro-batch per GPU.
    #[serde(default = "one")]
    pub batch: u64,
    pub weights: DType,
    /// Gradient dtype of trainable parameters (default: `weights`).
    pub grads: Option<DType>,
    pub optimizer: Optimizer,
    /// Optimizer-state dtype (default f32).
    pub optimizer_state: Option<DType>,
    /// An f32 master copy of every trainable parameter (mixed-precision training).
    #[serde(default)]
    pub master_weights: bool,
    pub activations: ActPrecision,
    #[serde(default = "no_ckpt")]
    pub checkpointing: Checkpointing,
    /// Fused attention (FlashAttention / SDPA): no `heads·s²` tensors are saved.
    #[serde(default)]
    pub flash_attention: bool,
    /// Dropout on attention probabilities, attention output and MLP output (masks saved).
    #[serde(default)]
    pub dropout: bool,
    /// DDP's gradient buckets are a second copy of the gradients unless
    /// `gradient_as_bucket_view=True`.
    #[serde(default)]
    pub ddp_bucket_view: bool,
    /// Units FSDP / ZeRO-3 keeps gathered at once (the current one + prefetch).
    #[serde(default = "two")]
    pub gathered_units: u64,
    #[serde(rename = "component")]
    pub components: Vec<Component>,
    #[serde(default, rename = "claim")]
    pub claims: Vec<Claim>,
    /// Free-text assumptions of this scenario, printed with the computed ones.
    #[serde(default)]
    pub notes: Vec<String>,
}

fn no_ckpt() -> Checkpointing {
    Checkpointing::None
}
fn two() -> u64 {
    2
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    paper: PaperConfig,
}

/// True when `text` is TOML with a top-level `[paper]` table (a description for this crate,
/// not a vramlab training config).
pub fn is_paper_config(text: &str) -> bool {
    toml::from_str::<toml::Table>(text)
        .is_ok_and(|t| t.get("paper").is_some_and(toml::Value::is_table))
}

impl PaperConfig {
    /// Parse and validate; `origin` names the file in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, Error> {
        let file: File = toml::from_str(text).map_err(|e| Error::Parse {
            file: origin.into(),
            msg: e.to_string(),
        })?;
        let cfg = file.paper;
        cfg.validate().map_err(|(field, msg)| Error::Invalid {
            file: origin.into(),
            field,
            msg,
        })?;
        Ok(cfg)
    }

    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
            file: path.display().to_string(),
            source: e,
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    pub fn grads(&self) -> DType {
        self.grads.unwrap_or(self.weights)
    }

    pub fn optimizer_state(&self) -> DType {
        self.optimizer_state.unwrap_or(DType::F32)
    }

    pub fn component(&self, name: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.name == name)
    }

    /// Check the values; the error is `(field path, message)`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |field: String, msg: &str| Err((field, msg.to_string()));
        if self.gpus == 0 {
            return bad("paper.gpus".into(), "must be >= 1");
        }
        if self.batch == 0 {
            return bad("paper.batch".into(), "must be >= 1");
        }
        if self.gathered_units == 0 {
            return bad("paper.gathered_units".into(), "must be >= 1");
        }
        if self.components.is_empty() {
            return bad(
                "paper.component".into(),
                "at least one [[paper.component]] is needed",
            );
        }
        for (i, c) in self.components.iter().enumerate() {
            let f = |k: &str| format!("paper.component[{i}] ({}).{k}", c.name);
            if self.components.iter().filter(|o| o.name == c.name).count() > 1 {
                return bad(f("name"), "component names must be unique");
            }
            if !(c.params.is_finite() && c.params >= 0.0) {
                return bad(f("params"), "must be a finite count >= 0");
            }
            if c.transformer.is_some() && c.resnet.is_some() {
                return bad(
                    f("resnet"),
                    "a component has a `transformer` or a `resnet` table, not both",
                );
            }
            if let Some(t) = &c.transformer {
                if t.hidden == 0 || t.heads == 0 || t.hidden % t.heads != 0 {
                    return bad(f("heads"), "hidden must be a non-zero multiple of heads");
                }
                let kv = t.kv_heads.unwrap_or(t.heads);
                if kv == 0 || t.heads % kv != 0 {
                    return bad(f("kv_heads"), "must divide heads");
                }
                if t.sequence + t.extra_tokens == 0 && t.image_tokens_of.is_none() {
                    return bad(f("sequence"), "tokens per sample must be > 0");
                }
                if let Some(src) = &t.image_tokens_of
                    && self.component(src).is_none_or(|o| o.resnet.is_none())
                {
                    return bad(f("image_tokens_of"), "must name a resnet component");
                }
                if let Some(src) = &t.cross_attention_to
                    && self
                        .component(src)
                        .is_none_or(|o| o.transformer.is_none() || o.name == c.name)
                {
                    return bad(
                        f("cross_attention_to"),
                        "must name another transformer component",
                    );
                }
                if let Some(l) = &c.lora {
                    if l.rank == 0 {
                        return bad(f("lora.rank"), "must be > 0");
                    }
                    for t in &l.targets {
                        if !LORA_TARGETS.contains(&t.as_str())
                            && t != "all-linear"
                        {
                            return bad(
                                f("lora.targets"),
                                &format!(
                                    "unknown target `{t}` (known: {}, all-linear)",
                                    LORA_TARGETS.join(" ")
                                ),
                            );
                        }
                    }
                }
            }
            if let Some(r) = &c.resnet {
                if r.depth != 18 && r.depth != 34 {
                    return bad(f("resnet.depth"), "only 18 and 34 (basic blocks)");
                }
                if r.images.is_empty() || r.images.iter().any(|s| s.contains(&0)) {
                    return bad(
                        f("resnet.images"),
                        "list each camera's [channels, height, width], all > 0",
                    );
                }
            }
            if c.kind() == ComponentKind::Resnet && c.lora.is_some() {
                return bad(
                    f("lora"),
                    "LoRA is computed for transformer and blocks components",
                );
            }
            if c.kind() == ComponentKind::Blocks
                && let Some(l) = &c.lora
                && (l.rank == 0 || l.targets != ["all-linear"])
            {
                return bad(
                    f("lora"),
                    "on blocks, LoRA adapts every `linear` entry: targets = [\"all-linear\"], rank > 0",
                );
            }
            for (j, a) in c.activation.iter().enumerate() {
                if a.shape.is_empty() || a.shape.contains(&0) || a.count == 0 {
                    return bad(
                        f(&format!("activation[{j}] ({})", a.name)),
                        "shape entries and count must be > 0",
                    );
                }
            }
            if c.shard_units == Some(0) {
                return bad(f("shard_units"), "must be >= 1");
            }
        }
        for (i, cl) in self.claims.iter().enumerate() {
            let f = |k: &str| format!("paper.claim[{i}] ({}).{k}", cl.label);
            if !cl.value.is_finite() || cl.value < 0.0 {
                return bad(f("value"), "must be finite and >= 0");
            }
            if cl.assume.gpus == Some(0) || cl.assume.batch == Some(0) {
                return bad(f("assume"), "gpus and batch must be >= 1");
            }
            if let Some(names) = &cl.assume.only_components
                && let Some(n) = names.iter().find(|n| self.component(n).is_none())
            {
                return bad(
                    f("assume.only_components"),
                    &format!("no component named `{n}`"),
                );
            }
            if cl.quantity == Quantity::OomAllocated && self.gpu_memory_gib.is_none() {
                return bad(f("quantity"), "oom-allocated needs paper.gpu_memory_gib");
            }
        }
        Ok(())
    }
}

impl PaperConfig {
    /// This description with a claim's assumptions applied.
    pub fn with_assumptions(&self, a: &Assume) -> PaperConfig {
        let mut c = self.clone();
        if let Some(v) = a.weights {
            c.weights = v;
        }
        if let Some(v) = a.grads {
            c.grads = Some(v);
        }
        if let Some(v) = a.optimizer {
            c.optimizer = v;
        }
        if let Some(v) = a.optimizer_state {
            c.optimizer_state = Some(v);
        }
        if let Some(v) = a.master_weights {
            c.master_weights = v;
        }
        if let Some(v) = a.activations {
            c.activations = v;
        }
        if let Some(v) = a.checkpointing {
            c.checkpointing = v;
        }
        if let Some(v) = a.batch {
            c.batch = v;
        }
        if let Some(v) = a.gpus {
            c.gpus = v;
        }
        if let Some(names) = &a.only_components {
            c.components.retain(|x| names.contains(&x.name));
        }
        if let Some(pats) = &a.leave_out {
            for comp in &mut c.components {
                comp.activation
                    .retain(|x| !pats.iter().any(|p| x.name.contains(p.as_str())));
            }
        }
        c
    }
}
