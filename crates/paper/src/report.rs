//! The report: static totals, activations, per-GPU totals under each sharding strategy, the
//! claims of the seed reports next to their reproduction and this crate's estimate, and the
//! assumptions behind every number.

use std::fmt::Write as _;

use serde::Serialize;

use crate::config::{
    Assume, Checkpointing, Claim, Optimizer, PaperConfig, Quantity, Sharding, Unit,
};
use crate::estimate::{ComponentEstimate, PerGpu, Static, estimate, oom_walk, per_gpu, statics};

const GIB: f64 = (1u64 << 30) as f64;

/// The strategies of the per-GPU table, in order.
pub const STRATEGIES: [Sharding; 5] = [
    Sharding::Single,
    Sharding::Ddp,
    Sharding::Zero1,
    Sharding::Zero2,
    Sharding::Zero3,
];

/// A claim next to its reproduction and this crate's estimate, in the claim's unit.
#[derive(Clone, Debug, Serialize)]
pub struct ClaimCheck {
    pub label: String,
    pub quantity: Quantity,
    pub unit: Unit,
    pub claimed: f64,
    pub claimed_high: Option<f64>,
    /// The quantity computed under the claim's own assumptions.
    pub reproduced: f64,
    /// The same quantity computed from the full description.
    pub estimate: f64,
    pub measured: Option<f64>,
    pub source: Option<String>,
    /// The claim's assumptions, in words.
    pub reproduced_with: Vec<String>,
}

/// Where the forward first fails to allocate on the configured GPU.
#[derive(Clone, Debug, Serialize)]
pub struct Oom {
    pub at: String,
    pub live_bytes: f64,
    pub request_bytes: f64,
}

/// Everything [`crate::report()`] computes; [`Report::markdown`] prints it.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub name: String,
    pub description: String,
    pub gpu_name: Option<String>,
    pub gpu_memory_gib: Option<f64>,
    pub gpus: u64,
    pub batch: u64,
    pub components: Vec<ComponentEstimate>,
    pub statics: Static,
    pub static_bytes: f64,
    pub stored_activation_bytes: f64,
    /// Largest working set on top of the stored activations (recomputation, transients).
    pub working_bytes: f64,
    pub activation_bytes: f64,
    /// Static + activations on one GPU.
    pub total_bytes: f64,
    pub per_gpu: Vec<PerGpu>,
    pub oom: Option<Oom>,
    pub claims: Vec<ClaimCheck>,
    pub assumptions: Vec<String>,
    /// Print GB next to GiB (a claim used GB).
    pub show_gb: bool,
}

/// One quantity of `cfg`; with `reproduce`, under all of `a`'s assumptions, else only under
/// its scenario (GPU count, batch).
fn quantity(cfg: &PaperConfig, claim: &Claim, reproduce: bool) -> f64 {
    let a = &claim.assume;
    let c = if reproduce {
        cfg.with_assumptions(a)
    } else {
        cfg.with_assumptions(&Assume {
            gpus: a.gpus,
            batch: a.batch,
            ..Assume::default()
        })
    };
    let e = estimate(&c);
    let (grads, acts) = if reproduce {
        (
            a.include_grads.unwrap_or(true),
            a.include_activations.unwrap_or(true),
        )
    } else {
        (true, true)
    };
    let (p, t) = match reproduce {
        true => (
            a.total_params.unwrap_or(e.statics.params),
            a.trainable_params.unwrap_or(e.statics.trainable),
        ),
        false => (e.statics.params, e.statics.trainable),
    };
    let st = statics(&c, p, t, grads);
    let act = if acts { e.activations() } else { 0.0 };
    let bytes = match claim.quantity {
        Quantity::Static => st.total(),
        Quantity::Activations => act,
        Quantity::Total => st.total() + act,
        Quantity::PerGpu => {
            let mut s = claim.sharding.unwrap_or(Sharding::Zero3);
            if !reproduce && s == Sharding::Naive {
                s = Sharding::Zero3;
            }
            per_gpu(&c, &st, e.largest_unit, act, s, c.gpus).total
        }
        Quantity::OomAllocated => {
            let gpu = c.gpu_memory_gib.unwrap_or(f64::INFINITY) * GIB;
            oom_walk(&e, gpu).map_or(f64::NAN, |(_, live, _)| live)
        }
    };
    bytes / claim.unit.bytes()
}

fn assume_words(cl: &Claim) -> Vec<String> {
    let a = &cl.assume;
    let mut v = Vec::new();
    let mut push = |k: &str, val: Option<String>| {
        if let Some(val) = val {
            v.push(format!("{k} = {val}"));
        }
    };
    push("weights", a.weights.map(|d| d.name().into()));
    push("grads", a.grads.map(|d| d.name().into()));
    push(
        "optimizer",
        a.optimizer.map(|o| format!("{o:?}").to_lowercase()),
    );
    push(
        "optimizer state",
        a.optimizer_state.map(|d| d.name().into()),
    );
    push(
        "fp32 master weights",
        a.master_weights.map(|b| b.to_string()),
    );
    push("activations", a.activations.map(|p| p.name().into()));
    push(
        "checkpointing",
        a.checkpointing.map(|c| format!("{c:?}").to_lowercase()),
    );
    push("batch", a.batch.map(|b| b.to_string()));
    push("GPUs", a.gpus.map(|g| g.to_string()));
    push("gradients counted", a.include_grads.map(|b| b.to_string()));
    push(
        "activations counted",
        a.include_activations.map(|b| b.to_string()),
    );
    push(
        "parameters",
        a.total_params.map(|p| format!("{:.3} B", p / 1e9)),
    );
    push(
        "trainable",
        a.trainable_params.map(|p| format!("{:.3} B", p / 1e9)),
    );
    push("only", a.only_components.as_ref().map(|n| n.join(", ")));
    push("left out", a.leave_out.as_ref().map(|n| n.join(", ")));
    if cl.quantity == Quantity::PerGpu {
        v.push(format!(
            "sharding = {}",
            cl.sharding.unwrap_or(Sharding::Zero3).label()
        ));
    }
    v
}

fn assumptions(cfg: &PaperConfig) -> Vec<String> {
    let mut v = vec![
        format!("weights of all parameters in {}; gradients of trainable parameters in {}", cfg.weights.name(), cfg.grads().name()),
        match cfg.optimizer {
            Optimizer::Adam | Optimizer::Adamw => format!(
                "{}: 2 states (exp_avg, exp_avg_sq) per trainable parameter in {}",
                if cfg.optimizer == Optimizer::Adam { "Adam" } else { "AdamW" },
                cfg.optimizer_state().name()
            ),
            Optimizer::SgdMomentum => format!("SGD with momentum: 1 state per trainable parameter in {}", cfg.optimizer_state().name()),
            Optimizer::Sgd => "plain SGD: no optimizer state".into(),
            Optimizer::Adafactor => "Adafactor without momentum: factored second moment, O(rows + cols) per matrix, counted as 0".into(),
            Optimizer::None => "no optimizer (nothing trained)".into(),
        },
        if cfg.master_weights {
            "an fp32 master copy of every trainable parameter (mixed precision)".into()
        } else {
            "no fp32 master weights: the optimizer updates the stored weights in their own dtype".into()
        },
        format!(
            "activations {}{}, batch {} per GPU, {}, {}",
            cfg.activations.name(),
            if cfg.activations.is_autocast() { " (autocast: matmul/conv inputs half, norm inputs and softmax outputs f32)" } else { "" },
            cfg.batch,
            if cfg.flash_attention { "fused (flash) attention: no heads·s² tensors" } else { "eager attention: the heads·s² softmax output is saved" },
            if cfg.dropout { "dropout on (1-byte masks saved)" } else { "no dropout" },
        ),
        "transformer layers: Korthikanti et al. 2022 (sbh(34 + 5as/h) bytes at fp16 with dropout, f = 4h), generalised per tensor (crate::transformer)".into(),
        match cfg.checkpointing {
            Checkpointing::None => "no activation checkpointing".into(),
            Checkpointing::Full => "full per-layer checkpointing: each transformer layer keeps its input; one layer is recomputed at a time in backward".into(),
        },
        "a component nothing at or before it trains runs without saving activations (its working set is one layer)".into(),
        "peak = static + stored activations + the largest working set (checkpoint recomputation, transient buffers)".into(),
        if cfg.gpus == 1 {
            "one GPU (set `gpus` for the DDP / ZeRO / FSDP table)".to_string()
        } else { format!(
            "data parallel over {} GPUs: activations are per GPU (each its own micro-batch), never sharded; DDP {}; ZeRO-1 shards optimizer state and master weights; ZeRO-2 also gradients; ZeRO-3 / FSDP also parameters and holds {} gathered units (current + prefetch) of the largest unit plus that unit's unsharded gradients",
            cfg.gpus,
            if cfg.ddp_bucket_view { "with gradient_as_bucket_view (no extra copy)" } else { "keeps a second copy of the gradients in its buckets (gradient_as_bucket_view=False, the default)" },
            cfg.gathered_units,
        ) },
        "not counted: CUDA context and library workspaces (cuBLAS, cuDNN, NCCL; ~0.5–1 GiB), the input batch, allocator fragmentation and reserve, backward's transient gradient buffers".into(),
    ];
    if let Some(r) = cfg.components.iter().find_map(|c| c.resnet.as_ref()) {
        v.push(format!(
            "ResNet-{} (torchvision layout): saves the input image, every ReLU / max-pool output and the int64 pool indices{}",
            r.depth,
            match (r.frozen_bn, cfg.activations.is_autocast()) {
                (true, true) => "; FrozenBatchNorm's f32 buffers promote its bf16 input, so under autocast the maps are f32 and each conv saves its own bf16 copy of what it reads",
                (true, false) => "; FrozenBatchNorm saves nothing",
                (false, _) => ", and each BatchNorm's input",
            }
        ));
    }
    v.extend(cfg.notes.iter().cloned());
    v
}

/// Compute the report for a description.
pub fn report(cfg: &PaperConfig) -> Report {
    let e = estimate(cfg);
    let act = e.activations();
    let strategies: &[Sharding] = if cfg.gpus > 1 {
        &STRATEGIES
    } else {
        &STRATEGIES[..1]
    };
    let per = strategies
        .iter()
        .map(|&s| {
            per_gpu(
                cfg,
                &e.statics,
                e.largest_unit,
                act,
                s,
                if s == Sharding::Single { 1 } else { cfg.gpus },
            )
        })
        .collect();
    let oom = cfg.gpu_memory_gib.and_then(|g| oom_walk(&e, g * GIB)).map(
        |(at, live_bytes, request_bytes)| Oom {
            at,
            live_bytes,
            request_bytes,
        },
    );
    let claims = cfg
        .claims
        .iter()
        .map(|cl| ClaimCheck {
            label: cl.label.clone(),
            quantity: cl.quantity,
            unit: cl.unit,
            claimed: cl.value,
            claimed_high: cl.value_high,
            reproduced: quantity(cfg, cl, true),
            estimate: quantity(cfg, cl, false),
            measured: cl.measured,
            source: cl.source.clone(),
            reproduced_with: assume_words(cl),
        })
        .collect();
    Report {
        name: cfg.name.clone(),
        description: cfg.description.clone(),
        gpu_name: cfg.gpu_name.clone(),
        gpu_memory_gib: cfg.gpu_memory_gib,
        gpus: cfg.gpus,
        batch: cfg.batch,
        static_bytes: e.statics.total(),
        stored_activation_bytes: e.stored_activations,
        working_bytes: e.working,
        activation_bytes: act,
        total_bytes: e.statics.total() + act,
        statics: e.statics,
        per_gpu: per,
        oom,
        claims,
        assumptions: assumptions(cfg),
        show_gb: cfg.claims.iter().any(|c| c.unit == Unit::Gb),
        components: e.components,
    }
}

impl Report {
    fn b(&self, bytes: f64) -> String {
        let bytes = bytes + 0.0; // no "-0.00" for an empty sum
        if self.show_gb {
            format!("{:.2} GiB ({:.1} GB)", bytes / GIB, bytes / 1e9)
        } else {
            format!("{:.2} GiB", bytes / GIB)
        }
    }

    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "# {}\n", self.name);
        if !self.description.is_empty() {
            let _ = writeln!(o, "{}\n", self.description.trim());
        }
        let _ = writeln!(o, "## Components\n");
        let _ = writeln!(
            o,
            "| component | kind | parameters | trainable | tokens | saves activations | stored activations |"
        );
        let _ = writeln!(o, "|---|---|---:|---:|---:|---|---:|");
        for c in &self.components {
            let lora = if c.lora_params > 0.0 {
                format!(" (LoRA {:.2} M)", c.lora_params / 1e6)
            } else {
                String::new()
            };
            let _ = writeln!(
                o,
                "| {}{} | {:?} | {:.2} M | {:.2} M{} | {} | {} | {} |",
                c.name,
                if c.frozen { " (frozen)" } else { "" },
                c.kind,
                c.params / 1e6,
                c.trainable / 1e6,
                lora,
                c.tokens.map_or("—".into(), |t| t.to_string()),
                if c.saves_activations {
                    "yes"
                } else {
                    "no (no grad)"
                },
                self.b(c.stored_bytes),
            );
        }
        let s = &self.statics;
        let _ = writeln!(o, "\n## Static memory (one GPU)\n");
        let _ = writeln!(o, "| term | bytes |\n|---|---:|");
        let _ = writeln!(
            o,
            "| parameters: {:.3} B, trainable {:.3} B | |",
            s.params / 1e9,
            s.trainable / 1e9
        );
        for (k, v) in [
            ("weights", s.weights),
            ("gradients", s.grads),
            ("optimizer state", s.optimizer),
            ("fp32 master weights", s.master),
        ] {
            let _ = writeln!(o, "| {k} | {} |", self.b(v));
        }
        let _ = writeln!(
            o,
            "| **static total** | **{}** |",
            self.b(self.static_bytes)
        );
        let _ = writeln!(o, "\n## Activations (batch {} per GPU)\n", self.batch);
        let _ = writeln!(o, "| term | bytes |\n|---|---:|");
        // Items of at least 2 % of the stored total, largest first; the rest in one row each.
        let cut = 0.02 * self.stored_activation_bytes;
        for c in &self.components {
            let mut items: Vec<&(String, f64)> = c.items.iter().collect();
            items.sort_by(|a, b| b.1.total_cmp(&a.1));
            let (big, small): (Vec<_>, Vec<_>) = items.into_iter().partition(|(_, v)| *v >= cut);
            for (what, v) in &big {
                let _ = writeln!(o, "| {}: {what} | {} |", c.name, self.b(*v));
            }
            if !small.is_empty() {
                let rest: f64 = small.iter().map(|(_, v)| v).sum();
                let _ = writeln!(
                    o,
                    "| {}: {} {} | {} |",
                    c.name,
                    small.len(),
                    if big.is_empty() {
                        "tensor kinds"
                    } else {
                        "other tensor kinds"
                    },
                    self.b(rest)
                );
            }
        }
        let _ = writeln!(
            o,
            "| stored for backward | {} |",
            self.b(self.stored_activation_bytes)
        );
        let _ = writeln!(
            o,
            "| largest working set on top | {} |",
            self.b(self.working_bytes)
        );
        let _ = writeln!(
            o,
            "| **activations** | **{}** |",
            self.b(self.activation_bytes)
        );
        let _ = writeln!(o, "\n**Total on one GPU: {}**", self.b(self.total_bytes));
        if let (Some(g), Some(n)) = (self.gpu_memory_gib, &self.gpu_name) {
            let _ = writeln!(
                o,
                "({n}: {g:.2} GiB usable, {})",
                if self.total_bytes <= g * GIB {
                    "fits"
                } else {
                    "does not fit"
                }
            );
        }
        if let Some(oom) = &self.oom {
            if oom.live_bytes == 0.0 {
                let _ = writeln!(
                    o,
                    "\nWeights, optimizer state and master weights alone ({}) do not fit: nothing runs.",
                    self.b(oom.request_bytes)
                );
            } else {
                let _ = writeln!(
                    o,
                    "\nThe forward first fails at **{}**: {} live, asks for {} more.",
                    oom.at,
                    self.b(oom.live_bytes),
                    self.b(oom.request_bytes)
                );
            }
        }
        let _ = writeln!(
            o,
            "\n## Per GPU ({} GPU{})\n",
            self.gpus,
            if self.gpus == 1 { "" } else { "s" }
        );
        let _ = writeln!(
            o,
            "| strategy | weights | grads | optimizer | master | buckets / gathered | activations | **total** | fits |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---|");
        for p in &self.per_gpu {
            let fits = self
                .gpu_memory_gib
                .map_or("—", |g| if p.total <= g * GIB { "yes" } else { "no" });
            let _ = writeln!(
                o,
                "| {} ×{} | {} | {} | {} | {} | {} | {} | **{}** | {fits} |",
                p.strategy.label(),
                p.gpus,
                self.b(p.weights),
                self.b(p.grads),
                self.b(p.optimizer),
                self.b(p.master),
                self.b(p.extra),
                self.b(p.activations),
                self.b(p.total)
            );
        }
        if !self.claims.is_empty() {
            let _ = writeln!(o, "\n## The report's numbers\n");
            let _ = writeln!(
                o,
                "| claim | claimed | reproduced under its assumptions | claimed − reproduced | this estimate | measured | its assumptions |"
            );
            let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---|");
            for c in &self.claims {
                let u = c.unit.name();
                let claimed = match c.claimed_high {
                    Some(h) => format!("{:.2}–{:.2} {u}", c.claimed, h),
                    None => format!("{:.2} {u}", c.claimed),
                };
                let _ = writeln!(
                    o,
                    "| {}{} | {claimed} | {:.2} {u} | {:+.2} {u} | {:.2} {u} | {} | {} |",
                    c.label,
                    c.source
                        .as_ref()
                        .map_or(String::new(), |s| format!(" ({s})")),
                    c.reproduced,
                    // Rounded so that an exact reproduction prints +0.00, not -0.00.
                    ((c.claimed - c.reproduced) * 100.0).round() / 100.0 + 0.0,
                    c.estimate,
                    c.measured.map_or("—".into(), |m| format!("{m:.2} {u}")),
                    c.reproduced_with.join("; "),
                );
            }
        }
        let _ = writeln!(o, "\n## Assumptions\n");
        for a in &self.assumptions {
            let _ = writeln!(o, "- {a}");
        }
        o
    }
}
