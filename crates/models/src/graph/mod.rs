//! Shape-only accounting of what a forward pass allocates and what Burn's autodiff keeps for
//! the backward: a model describes its training forward as a list of ops on symbolic buffers
//! ([`Graph`]); nothing is allocated.
//!
//! The rules follow burn-autodiff 0.21's backward implementations (`ops/tensor.rs`,
//! `ops/activation.rs`, `ops/module.rs`): an op *saves* the inputs its backward reads
//! (`mul`/`div`/`matmul`/`conv`: both operands when the other one is tracked; `exp`,
//! `sigmoid`, `relu`, `sqrt`, `square`: their input; `add`/`sub`/`mean`/`reshape`/`cast`:
//! nothing), saved tensors share storage with the forward's tensors, and an op none of whose
//! inputs requires a gradient is not recorded at all (a frozen backbone on data inputs keeps
//! nothing). Composite layers (GroupNorm, LayerNorm, SiLU, softmax) are written here as the
//! primitive ops the models compose them from.
//!
//! Half precision: the f32 master weights are cast in-graph; such a cast has depth 1 in
//! Burn's tape (which runs steps deepest first), so its backward — the parameter gradient
//! cast from the compute dtype to f32 — runs after the whole network's backward, and until
//! then each parameter gradient is held in the compute dtype.
//!
//! The graph is then replayed three ways ([`Graph::simulate`]): plain autodiff, block
//! recomputation over the model's stage plan (each op carries its stage; the trainer's f32
//! surrogate `Σ sum(t · grad_t)` per stage included), and Burn's balanced checkpointing
//! (saved outputs of memory-bound ops are recomputed from the nearest compute-bound
//! ancestors, and those ancestors are held as backups until the backward starts; vramlab's
//! lean ops keep their own state and are never recomputed). The backward runs in Burn's tape
//! order: by depth, deepest first. Parameters, optimizer state and data live outside the
//! graph and are added by the caller (`vramlab_workloads::estimate`).
//!
//! Files: this one holds the vocabulary (buffers, ops, the [`Graph`] they form, the replay's
//! result types); `build` the ops a model's graph builder calls ([`Graph::conv`],
//! [`Graph::linear`], [`Graph::norm`], …, with the flex workspaces each one allocates);
//! `replay` the three replays ([`Graph::simulate`]) and the per-module rows
//! ([`Graph::module_rows`]). The builders live beside their models: `act::graph`,
//! `diffusion::graph`, `vae3d::graph`, and the ResNet-18 trunk in `resnet::graph`.

use serde::Serialize;

use crate::nn::Precision;

mod build;
mod replay;
pub mod torch;

/// A symbolic tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buf(usize);

/// Element width of a dtype in bytes.
pub fn dtype_bytes(p: Precision) -> u64 {
    match p {
        Precision::F32 => 4,
        Precision::Bf16 | Precision::F16 => 2,
    }
}

#[derive(Clone, Debug)]
struct BufInfo {
    bytes: u64,
    requires_grad: bool,
    /// Op that produced it (None: data input or parameter).
    producer: Option<usize>,
    /// Parameters are counted by the caller, never here.
    param: bool,
}

#[derive(Clone, Debug)]
struct Op {
    module: String,
    stage: usize,
    inputs: Vec<Buf>,
    saves: Vec<Buf>,
    out: Buf,
    /// Whether Burn counts the op compute-bound (conv, matmul, cast, reductions, vramlab's
    /// lean ops; `cat` is "ambiguous", treated alike): balanced checkpointing keeps its output
    /// instead of recomputing it. A memory-bound op (add, mul, reshape, slice, exp, …) with an
    /// input that needs no gradient is compute-bound too (Burn's `checkpoint_parents` fails).
    compute_bound: bool,
    /// The op's backward state holds its saved tensors itself (vramlab's lean ops: conv, norms,
    /// SiLU, Mish, softmax, ReLU, affine, upsample), instead of Burn's checkpointer: balanced
    /// checkpointing never recomputes them.
    direct: bool,
    fwd_workspace: u64,
    bwd_workspace: u64,
    /// f32 bytes of the trainable parameters whose gradient this op's backward produces.
    param_grad: u64,
    tracked: bool,
    /// A tracked in-graph cast of a trainable parameter to the compute dtype: its backward
    /// (the gradient cast back to f32) is deferred to the end of the backward, see
    /// [`Graph::replay_range_with`].
    param_cast: Option<ParamCast>,
}

/// A trainable parameter's in-graph cast (f32 master → compute dtype).
#[derive(Clone, Copy, Debug)]
struct ParamCast {
    /// f32 bytes of the parameter (its gradient's final size).
    f32_bytes: u64,
    /// Compute-dtype element width.
    width: u64,
    /// Whether the compute-dtype gradient arrives as a strided view (a conv weight's
    /// `swap_dims`, a linear weight's transpose), which flex's cast first copies contiguous.
    strided_grad: bool,
}

/// How the training pass is run: the trainer's own mode, replayed.
pub use vramlab_stages::CheckpointMode;

/// One module's share of the stored activations.
#[derive(Clone, Debug, Serialize)]
pub struct ModuleRow {
    pub module: String,
    /// Bytes autodiff keeps for this module's backward (plain autodiff).
    pub stored_bytes: u64,
    /// Largest transient workspace of its ops (forward or backward).
    pub workspace_bytes: u64,
}

/// The replay's result: activation-side bytes, on top of whatever the caller holds.
#[derive(Clone, Debug, Serialize)]
pub struct ActivationPeaks {
    /// Highest bytes during the forward (saved tensors, live temporaries, workspace).
    pub forward_peak: u64,
    /// Bytes held at the end of the forward (what the backward starts from).
    pub forward_end: u64,
    /// Highest bytes during the backward, *including* the parameter gradients produced so far.
    pub backward_peak: u64,
    /// Stored bytes (saved tensors) at the end of the forward.
    pub stored: u64,
    /// Parameter-gradient bytes present at the backward's peak.
    pub grads_at_backward_peak: u64,
    /// Module whose backward op set the backward peak.
    pub backward_peak_module: String,
    pub forward_peak_module: String,
}

/// A training forward, op by op, on symbolic buffers.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    bufs: Vec<BufInfo>,
    ops: Vec<Op>,
    module: String,
    stage: usize,
    /// Input bytes of every stage boundary after the first (kept by block recomputation).
    boundaries: Vec<(usize, Vec<Buf>)>,
    /// Stage-state tensors in a half-precision dtype, with their element width
    /// ([`Graph::half_state`]): block recomputation's surrogate casts them to f32.
    half_states: Vec<(Buf, u64)>,
    /// Parameters being recorded ([`Graph::record_params`]) or handed out again
    /// ([`Graph::reuse_params`]): a module applied several times (ACT's backbone, once per
    /// camera) uses the same parameter tensors.
    recorded_params: Option<Vec<Buf>>,
    reused_params: Option<(Vec<Buf>, usize)>,
}

/// A 2-D feature map `[n, c, h, w]` in the graph.
#[derive(Clone, Copy, Debug)]
pub struct Map2d {
    pub buf: Buf,
    pub n: usize,
    pub c: usize,
    pub hw: [usize; 2],
}
