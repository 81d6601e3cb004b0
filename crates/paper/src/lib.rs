//! Training memory on paper, for models this machine cannot run: a generic transformer / VLA
//! description (vision tower, LLM, action head, arbitrary blocks), LoRA, frozen parts, the
//! dtypes of weights / gradients / optimizer state, fp32 master weights, the optimizer,
//! activation checkpointing, and DDP / ZeRO-1 / ZeRO-2 / ZeRO-3 (FSDP) over N GPUs.
//!
//! ```no_run
//! let cfg = vramlab_paper::PaperConfig::from_file("configs/estimate/openvla_oft_7b_lora.toml")?;
//! println!("{}", vramlab_paper::report(&cfg).markdown());
//! # Ok::<(), vramlab_paper::Error>(())
//! ```
//!
//! # Format
//! A TOML file whose top-level table is `[paper]` ([`is_paper_config`] looks for it).
//! Every table rejects unknown keys; errors name the file and the field. A commented example
//! of every key is below and in `configs/estimate/example.toml`; the seed scenarios and what they
//! show are in `configs/estimate/README.md`.
//!
//! ```toml
//! [paper]
//! name = "LLaMA-2-7B, LoRA r16"
//! gpu_name = "A100 80GB"          # optional, with gpu_memory_gib: fit column, OOM walk
//! gpu_memory_gib = 79.15
//! gpus = 4                        # data-parallel ranks of the per-GPU table (default 1)
//! batch = 1                       # micro-batch per GPU (default 1)
//! weights = "bf16"                # f32 | bf16 | f16 | u8 (int8/fp8) — every parameter
//! grads = "bf16"                  # default: weights — trainable parameters only
//! optimizer = "adamw"             # adamw | adam | sgd | sgd-momentum | adafactor | none
//! optimizer_state = "f32"         # default f32
//! master_weights = false          # fp32 copy of trainable parameters
//! activations = "autocast-bf16"   # f32 | bf16 | f16 | autocast-bf16 | autocast-f16
//! checkpointing = "none"          # none | full (per transformer layer)
//! flash_attention = true          # no heads·s² tensors saved
//! dropout = false                 # dropout masks saved
//! ddp_bucket_view = false         # DDP gradient_as_bucket_view (else buckets copy grads)
//! gathered_units = 2              # ZeRO-3 / FSDP units live at once (current + prefetch)
//! notes = ["free-text assumptions, printed with the computed ones"]
//!
//! [[paper.component]]             # in forward order
//! name = "llm"
//! frozen = true                   # its own weights are not trained (LoRA still is)
//! lora = { rank = 16, targets = ["q", "v"] }   # q k v o gate up down cross_* | all-linear
//! [paper.component.transformer]   # a transformer stack by its dims
//! layers = 32
//! hidden = 4096
//! heads = 32
//! kv_heads = 32                   # default: heads (GQA when fewer)
//! intermediate = 11008
//! mlp = "gated"                   # standard (GELU/ReLU) | gated (SwiGLU)
//! norm = "rms"                    # layer | rms
//! bias = false
//! vocab = 32000                   # embedding rows (+ LM head unless tied_embeddings)
//! logits = true                   # the loss takes f32 logits over the sequence
//! final_norm = true
//! positions = 0                   # learned position-embedding rows
//! sequence = 2048                 # tokens per sample, plus:
//! extra_tokens = 0                #   a fixed number of extra tokens
//! # image_tokens_of = "backbone"  #   one per stride-32 pixel of a resnet component
//! # cross_attention_tokens = 900  # decoder layers: cross-attention memory length
//! # cross_attention_to = "encoder"#   or another transformer component's sequence
//!
//! [[paper.component]]
//! name = "backbone"
//! [paper.component.resnet]        # torchvision layout, basic blocks
//! depth = 18
//! images = [[3, 480, 640]]        # per camera, shared backbone
//! frozen_bn = true
//!
//! [[paper.component]]             # neither table: explicit blocks
//! name = "head"
//! params = 1.5e6                  # explicit count, plus linear layers:
//! linear = [{ in = 4096, out = 1024, count = 2, bias = true }]
//! shard_units = 1                 # FSDP units this component splits into
//! [[paper.component.activation]]  # saved tensors, per-sample shape (batch is added)
//! name = "conv outputs"
//! shape = [64, 32, 128, 128]
//! count = 3
//! dtype = "f32"                   # default: the run's compute dtype
//! transient = false               # freed after the next allocation (e.g. scores)
//!
//! [[paper.claim]]                 # a number a report states, and how it was computed
//! label = "static"
//! quantity = "static"             # static | activations | total | per-gpu | oom-allocated
//! value = 23.57                   # (value_high = … for a range)
//! unit = "GiB"                    # GiB | GB
//! sharding = "zero3"              # per-gpu: single | ddp | zero1 | zero2 | zero3 (fsdp) | naive
//! measured = 6.5                  # optional measurement, same unit
//! source = "seed report"
//! [paper.claim.assume]            # the report's own assumptions (reproduction only)
//! include_activations = false
//! include_grads = true
//! total_params = 8.39e9
//! trainable_params = 0.853e9      # also: weights grads optimizer optimizer_state
//!                                 # master_weights activations checkpointing batch gpus
//! ```
//!
//! # What is computed
//! - Parameters: transformer layers from their dims (attention incl. GQA and cross-attention,
//!   standard or gated MLP, norms, biases), embeddings / LM head, ResNet-18/34, linears; LoRA
//!   `rank·(in + out)` per targeted linear. Trainable = non-frozen parameters + LoRA.
//! - Static: weights (all) + gradients, optimizer state and master weights (trainable).
//! - Activations: per transformer layer the tensors of Korthikanti et al. 2022 (see
//!   [`transformer`]), ResNet feature maps ([`resnet`]), explicit shapes.
//! - Per GPU: single, DDP, ZeRO-1, ZeRO-2, ZeRO-3 / FSDP ([`estimate::per_gpu`]).
//! - Claims: each reproduced under its own assumptions and re-estimated from the full description.

//!
//! # Modules
//! From the leaves up: [`setup`] (dtypes, optimizer, checkpointing, sharding) → [`claim`] (a
//! report's numbers and assumptions) → [`config`] (the TOML description, validated) →
//! [`transformer`] and [`resnet`] (parameters and saved activations from dimensions) →
//! [`estimate`] (statics, activations, per-GPU totals, the OOM walk) → [`report`]. The entry
//! points the CLI calls are re-exported here: [`PaperConfig`], [`is_paper_config`], [`report()`],
//! [`Report`].

pub mod claim;
pub mod config;
pub mod estimate;
pub mod report;
pub mod resnet;
pub mod setup;
pub mod transformer;

pub use config::{PaperConfig, is_paper_config};
pub use report::{Report, report};

/// Reading a description.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: {msg}")]
    Parse { file: String, msg: String },
    #[error("{file}: field `{field}`: {msg}")]
    Invalid {
        file: String,
        field: String,
        msg: String,
    },
}
