//! From a [`PaperConfig`] to byte counts: parameters, gradients, optimizer state, master
//! weights, saved activations, and what each GPU holds under each sharding strategy.

use serde::Serialize;

use crate::config::{Checkpointing, Component, ComponentKind, DType, PaperConfig, Sharding};
use crate::{resnet, transformer};

/// One component's parameters and activations.
#[derive(Clone, Debug, Serialize)]
pub struct ComponentEstimate {
    pub name: String,
    pub kind: ComponentKind,
    pub frozen: bool,
    /// Parameters of the base model (without LoRA).
    pub params: f64,
    pub lora_params: f64,
    pub trainable: f64,
    /// Whether backward runs through it (something at or before it is trained).
    pub saves_activations: bool,
    /// Tokens per sample (transformers).
    pub tokens: Option<u64>,
    /// Bytes kept for backward over the whole forward.
    pub stored_bytes: f64,
    /// Bytes live on top of everything stored while this component runs (checkpoint
    /// recomputation, a no-grad forward's working set, transient buffers).
    pub working_bytes: f64,
    /// Largest parameter unit FSDP / ZeRO-3 gathers (params, trainable params).
    pub largest_unit: (f64, f64),
    /// Itemised stored bytes: (what, bytes).
    pub items: Vec<(String, f64)>,
    /// Allocations in forward order for the OOM walk: (what, bytes, transient).
    #[serde(skip)]
    pub walk: Vec<(String, f64, bool)>,
}

/// Bytes of the static terms for a parameter count `params` of which `trainable` are trained.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Static {
    pub params: f64,
    pub trainable: f64,
    pub weights: f64,
    pub grads: f64,
    pub optimizer: f64,
    pub master: f64,
}

impl Static {
    pub fn total(&self) -> f64 {
        self.weights + self.grads + self.optimizer + self.master
    }
}

/// Everything computed for one set-up.
#[derive(Clone, Debug, Serialize)]
pub struct Estimate {
    pub components: Vec<ComponentEstimate>,
    pub statics: Static,
    pub stored_activations: f64,
    /// The largest working set (they do not coexist).
    pub working: f64,
    /// Gathered unit for ZeRO-3 / FSDP: (params, trainable).
    pub largest_unit: (f64, f64),
}

impl Estimate {
    pub fn activations(&self) -> f64 {
        self.stored_activations + self.working
    }
}

/// What one GPU holds under a strategy.
#[derive(Clone, Debug, Serialize)]
pub struct PerGpu {
    pub strategy: Sharding,
    pub gpus: u64,
    pub weights: f64,
    pub grads: f64,
    pub optimizer: f64,
    pub master: f64,
    /// DDP buckets or ZeRO-3 / FSDP gathered units.
    pub extra: f64,
    pub activations: f64,
    pub total: f64,
}

/// The static terms of `cfg` for the given counts.
pub fn statics(cfg: &PaperConfig, params: f64, trainable: f64, include_grads: bool) -> Static {
    let master = if cfg.master_weights && cfg.weights != DType::F32 {
        4.0
    } else {
        0.0
    };
    Static {
        params,
        trainable,
        weights: params * cfg.weights.bytes(),
        grads: if include_grads {
            trainable * cfg.grads().bytes()
        } else {
            0.0
        },
        optimizer: trainable * cfg.optimizer.states_per_param() * cfg.optimizer_state().bytes(),
        master: trainable * master,
    }
}

fn tokens(cfg: &PaperConfig, c: &Component) -> u64 {
    let Some(t) = &c.transformer else { return 0 };
    let img = t
        .image_tokens_of
        .as_deref()
        .and_then(|n| cfg.component(n))
        .and_then(|o| o.resnet.as_ref())
        .map_or(0, resnet::feature_tokens);
    t.sequence + t.extra_tokens + img
}

fn memory_tokens(cfg: &PaperConfig, c: &Component) -> Option<u64> {
    let t = c.transformer.as_ref()?;
    t.cross_attention_tokens.or_else(|| {
        t.cross_attention_to
            .as_deref()
            .and_then(|n| cfg.component(n))
            .map(|o| tokens(cfg, o))
    })
}

/// Parameters of a component apart from LoRA, and its largest shard unit's size.
fn own_params(cfg: &PaperConfig, c: &Component) -> (f64, f64) {
    let linear: f64 = c
        .linear
        .iter()
        .map(|l| (l.count * (l.input * l.out + if l.bias { l.out } else { 0 })) as f64)
        .sum();
    let extra = c.params + linear;
    match (&c.transformer, &c.resnet) {
        (Some(t), _) => {
            let cross = memory_tokens(cfg, c).is_some();
            let layer = transformer::layer_params(t, cross) as f64;
            let unit = layer.max((t.vocab * t.hidden) as f64);
            (
                transformer::params(t, cross) as f64 + extra,
                unit.max(extra),
            )
        }
        (None, Some(r)) => {
            let n = resnet::params(r) as f64 + extra;
            (n, n)
        }
        (None, None) => (extra, extra / c.shard_units.unwrap_or(1) as f64),
    }
}

fn component(cfg: &PaperConfig, c: &Component, grad_flows: bool) -> ComponentEstimate {
    let b = cfg.batch as f64;
    let prec = cfg.activations;
    let (params, unit) = own_params(cfg, c);
    let memory = memory_tokens(cfg, c);
    let lora = match (&c.transformer, &c.lora) {
        (Some(t), Some(l)) => transformer::lora_params(t, memory.is_some(), l) as f64,
        (None, Some(l)) => c
            .linear
            .iter()
            .map(|x| (l.rank * x.count * (x.input + x.out)) as f64)
            .sum(),
        _ => 0.0,
    };
    let trainable = if c.frozen { 0.0 } else { params } + lora;
    let saves = grad_flows || trainable > 0.0;
    let mut items: Vec<(String, f64)> = Vec::new();
    let mut walk: Vec<(String, f64, bool)> = Vec::new();
    let mut working = 0.0f64;
    let seq = tokens(cfg, c);

    if let Some(t) = &c.transformer {
        let sh = transformer::LayerShape {
            s: seq as f64,
            b,
            memory: memory.map(|m| m as f64),
            precision: prec,
            flash: cfg.flash_attention,
            dropout: cfg.dropout,
        };
        let layer = transformer::layer_items(t, sh);
        let layer_bytes: f64 = layer.iter().map(transformer::Item::bytes).sum();
        let l = t.layers as f64;
        if !saves {
            working = layer_bytes;
        } else if cfg.checkpointing == Checkpointing::Full {
            let input = seq as f64 * b * t.hidden as f64 * prec.residual_bytes();
            items.push((
                format!("{} layer inputs (checkpointed)", t.layers),
                l * input,
            ));
            for i in 0..t.layers {
                walk.push((format!("layer {i} input"), input, false));
            }
            working = layer_bytes;
        } else {
            for it in &layer {
                items.push((format!("{} × {}", t.layers, it.name), l * it.bytes()));
            }
            for i in 0..t.layers {
                walk.push((format!("layer {i}"), layer_bytes, false));
            }
        }
        if t.vocab > 0 && t.logits && saves {
            let sb = seq as f64 * b;
            items.push((
                "final norm input".into(),
                sb * t.hidden as f64 * prec.residual_bytes(),
            ));
            // Logits upcast to f32 for the loss, and the log-softmax the loss keeps.
            let logits = 2.0 * sb * t.vocab as f64 * 4.0;
            items.push(("logits and log-softmax (f32)".into(), logits));
            walk.push(("logits".into(), logits, false));
        }
    }
    if let Some(r) = &c.resnet {
        let acts: Vec<resnet::ImageActs> = r
            .images
            .iter()
            .map(|&img| resnet::image_acts(r, img))
            .collect();
        let idx: f64 = acts.iter().map(|a| a.indices).sum::<f64>() * b * 8.0;
        let bytes: f64 = acts.iter().map(|a| a.bytes(prec, r.frozen_bn)).sum::<f64>() * b;
        if saves {
            items.push((
                format!(
                    "ResNet-{} feature maps ({} cameras)",
                    r.depth,
                    r.images.len()
                ),
                bytes - idx,
            ));
            items.push(("max-pool indices (int64)".into(), idx));
            walk.push((format!("ResNet-{}", r.depth), bytes, false));
        } else {
            // No-grad forward: the two largest maps (stem output, before and after ReLU).
            let stem: f64 = r
                .images
                .iter()
                .map(|&[_, h, w]| (64 * h.div_ceil(2) * w.div_ceil(2)) as f64)
                .sum();
            working = working.max(2.0 * b * stem * prec.compute_bytes());
        }
    }
    let mut transient_max = 0.0f64;
    for a in &c.activation {
        let el: f64 = a.shape.iter().map(|&d| d as f64).product::<f64>() * a.count as f64 * b;
        let bpe = a.dtype.map_or(prec.compute_bytes(), DType::bytes);
        let bytes = el * bpe;
        walk.push((a.name.clone(), bytes, a.transient));
        if a.transient || !saves {
            transient_max = transient_max.max(bytes);
        } else {
            items.push((a.name.clone(), bytes));
        }
    }
    working = working.max(transient_max);
    let stored = items.iter().map(|(_, v)| v).sum::<f64>() + 0.0; // +0.0: an empty f64 sum is -0.0
    // FSDP / ZeRO-3 unit: a layer carries its share of the LoRA adapters.
    let lora_per_unit = c
        .transformer
        .as_ref()
        .filter(|t| t.layers > 0)
        .map_or(0.0, |t| lora / t.layers as f64);
    let unit_trainable = if c.frozen { 0.0 } else { unit } + lora_per_unit;
    ComponentEstimate {
        name: c.name.clone(),
        kind: c.kind(),
        frozen: c.frozen,
        params,
        lora_params: lora,
        trainable,
        saves_activations: saves,
        tokens: c.transformer.as_ref().map(|_| seq),
        stored_bytes: stored,
        working_bytes: working,
        largest_unit: (unit + lora_per_unit, unit_trainable),
        items,
        walk,
    }
}

/// Estimate a description as written.
pub fn estimate(cfg: &PaperConfig) -> Estimate {
    let mut grad_flows = false;
    let mut components = Vec::new();
    for c in &cfg.components {
        let e = component(cfg, c, grad_flows);
        grad_flows |= e.trainable > 0.0;
        components.push(e);
    }
    let params = components.iter().map(|c| c.params + c.lora_params).sum();
    let trainable = components.iter().map(|c| c.trainable).sum();
    let largest_unit = components
        .iter()
        .map(|c| c.largest_unit)
        .fold((0.0, 0.0), |a, u| if u.0 > a.0 { u } else { a });
    Estimate {
        statics: statics(cfg, params, trainable, true),
        stored_activations: components.iter().map(|c| c.stored_bytes).sum(),
        working: components
            .iter()
            .map(|c| c.working_bytes)
            .fold(0.0, f64::max),
        largest_unit,
        components,
    }
}

/// What one GPU holds under `strategy` with `gpus` ranks; `activations` are per GPU.
pub fn per_gpu(
    cfg: &PaperConfig,
    s: &Static,
    largest_unit: (f64, f64),
    activations: f64,
    strategy: Sharding,
    gpus: u64,
) -> PerGpu {
    let n = gpus as f64;
    let (mut w, mut g, mut o, mut m, mut extra) = (s.weights, s.grads, s.optimizer, s.master, 0.0);
    match strategy {
        Sharding::Single => {}
        Sharding::Ddp => {
            if !cfg.ddp_bucket_view {
                extra = s.grads;
            }
        }
        Sharding::Zero1 => {
            o /= n;
            m /= n;
        }
        Sharding::Zero2 => {
            g /= n;
            o /= n;
            m /= n;
        }
        Sharding::Zero3 | Sharding::Naive => {
            w /= n;
            g /= n;
            o /= n;
            m /= n;
            if strategy == Sharding::Zero3 && gpus > 1 {
                // Gathered full units (current + prefetched) and one unit's unsharded grads.
                let grad_bytes = if s.grads > 0.0 {
                    cfg.grads().bytes()
                } else {
                    0.0
                };
                extra = cfg.gathered_units as f64 * largest_unit.0 * cfg.weights.bytes()
                    + largest_unit.1 * grad_bytes;
            }
        }
    }
    PerGpu {
        strategy,
        gpus,
        weights: w,
        grads: g,
        optimizer: o,
        master: m,
        extra,
        activations,
        total: w + g + o + m + extra + activations,
    }
}

/// The first allocation of the forward that does not fit in `gpu_bytes`: (what, live bytes
/// before it, its size). Live at the forward's start: weights, optimizer state, master
/// weights (gradients were freed by `zero_grad(set_to_none=True)`).
pub fn oom_walk(e: &Estimate, gpu_bytes: f64) -> Option<(String, f64, f64)> {
    let mut live = e.statics.weights + e.statics.optimizer + e.statics.master;
    if live > gpu_bytes {
        return Some((
            "before the forward (weights, optimizer state, master weights)".into(),
            0.0,
            live,
        ));
    }
    let mut pending_transient = 0.0;
    for c in &e.components {
        for (what, bytes, transient) in &c.walk {
            if live + bytes > gpu_bytes {
                return Some((format!("{}: {what}", c.name), live, *bytes));
            }
            live += bytes - pending_transient;
            pending_transient = if *transient { *bytes } else { 0.0 };
        }
    }
    None
}
