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
//! recomputation over the model's stage plan (each op carries its stage), and Burn's
//! balanced checkpointing (saved outputs of memory-bound ops are recomputed from the nearest
//! compute-bound ancestors). Parameters, optimizer state and data live outside the graph and
//! are added by the caller (the workload's estimate).

use serde::Serialize;

use crate::nn::Precision;

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
    /// Whether Burn counts the op compute-bound (conv, matmul): balanced checkpointing keeps
    /// its output instead of recomputing it.
    compute_bound: bool,
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
}

impl Graph {
    pub fn new() -> Self {
        Self::default()
    }

    /// Name the module the next ops belong to (rows of the report).
    pub fn module(&mut self, name: impl Into<String>) {
        self.module = name.into();
    }

    /// Start stage `i` of the model's plan; `state` is what block recomputation keeps as its
    /// input (detached, no gradient graph).
    pub fn stage(&mut self, i: usize, state: &[Buf]) {
        self.stage = i;
        self.boundaries.push((i, state.to_vec()));
    }

    pub fn bytes(&self, b: Buf) -> u64 {
        self.bufs[b.0].bytes
    }

    /// (all parameter bytes, trainable parameter bytes), f32, from the weights the graph used.
    pub fn param_bytes(&self) -> (u64, u64) {
        let all = self.bufs.iter().filter(|b| b.param).map(|b| b.bytes).sum();
        let trainable = self.bufs.iter().filter(|b| b.param && b.requires_grad).map(|b| b.bytes).sum();
        (all, trainable)
    }

    /// The largest trainable parameter tensor (f32 bytes).
    pub fn largest_trainable_param_bytes(&self) -> u64 {
        self.bufs.iter().filter(|b| b.param && b.requires_grad).map(|b| b.bytes).max().unwrap_or(0)
    }

    fn push(&mut self, bytes: u64, requires_grad: bool, producer: Option<usize>, param: bool) -> Buf {
        self.bufs.push(BufInfo { bytes, requires_grad, producer, param });
        Buf(self.bufs.len() - 1)
    }

    /// A data tensor (no gradient) of `elems` elements of `width` bytes.
    pub fn input(&mut self, elems: usize, width: u64) -> Buf {
        self.push(elems as u64 * width, false, None, false)
    }

    /// A parameter of `elems` f32 elements as the op sees it in precision `p`: the f32 master
    /// itself, or its in-graph cast (a new tensor, saved by the op using it).
    pub fn weight(&mut self, elems: usize, trainable: bool, p: Precision) -> Buf {
        self.weight_cast(elems, trainable, p, false)
    }

    /// [`Self::weight`]; `strided_grad`: the consuming op hands the cast's output gradient
    /// back as a strided view (conv and linear weights; not biases).
    fn weight_cast(&mut self, elems: usize, trainable: bool, p: Precision, strided_grad: bool) -> Buf {
        let w = self.push(elems as u64 * 4, trainable, None, true);
        if p == Precision::F32 {
            return w;
        }
        let width = dtype_bytes(p);
        let out = self.op("cast", &[w], &[], elems as u64 * width, false, 0, 0, 0);
        let op = self.ops.last_mut().expect("just pushed");
        if op.tracked {
            op.param_cast = Some(ParamCast { f32_bytes: elems as u64 * 4, width, strided_grad });
        }
        out
    }

    /// A generic op: `saves` ⊆ inputs are kept for the backward when the op is recorded.
    #[allow(clippy::too_many_arguments)]
    pub fn op(&mut self, _kind: &str, inputs: &[Buf], saves: &[Buf], out_bytes: u64, compute_bound: bool, fwd_ws: u64, bwd_ws: u64, param_grad: u64) -> Buf {
        let tracked = inputs.iter().any(|b| self.bufs[b.0].requires_grad);
        let idx = self.ops.len();
        let out = self.push(out_bytes, tracked, Some(idx), false);
        self.ops.push(Op {
            module: self.module.clone(),
            stage: self.stage,
            inputs: inputs.to_vec(),
            saves: if tracked { saves.to_vec() } else { Vec::new() },
            out,
            compute_bound,
            fwd_workspace: fwd_ws,
            bwd_workspace: if tracked { bwd_ws } else { 0 },
            param_grad: if tracked { param_grad } else { 0 },
            tracked,
            param_cast: None,
        });
        out
    }

    fn rg(&self, b: Buf) -> bool {
        self.bufs[b.0].requires_grad
    }

    /// Element-wise op with no saved state (add, sub, scalar ops, cast, reshape copies).
    pub fn elementwise(&mut self, inputs: &[Buf], out_bytes: u64) -> Buf {
        self.op("elementwise", inputs, &[], out_bytes, false, 0, 0, 0)
    }

    /// `a * b` (broadcasting): each side is saved when the other needs a gradient.
    pub fn mul(&mut self, a: Buf, b: Buf, out_bytes: u64) -> Buf {
        let mut saves = Vec::new();
        if self.rg(b) {
            saves.push(a);
        }
        if self.rg(a) {
            saves.push(b);
        }
        self.op("mul", &[a, b], &saves, out_bytes, false, 0, 0, 0)
    }

    /// `a / b`: saves both operands (the rhs gradient reads both).
    pub fn div(&mut self, a: Buf, b: Buf, out_bytes: u64) -> Buf {
        self.op("div", &[a, b], &[a, b], out_bytes, false, 0, 0, 0)
    }

    /// Unary op whose backward reads its input (exp, sigmoid, relu, sqrt, square, tanh, log).
    pub fn unary_saving(&mut self, x: Buf, out_bytes: u64) -> Buf {
        self.op("unary", &[x], &[x], out_bytes, false, 0, 0, 0)
    }

    /// A reduction to a small tensor (mean/sum over axes): saves nothing; compute-bound.
    pub fn reduce(&mut self, x: Buf, out_bytes: u64) -> Buf {
        self.op("reduce", &[x], &[], out_bytes, true, 0, 0, 0)
    }

    /// `to_f32` / `to_dtype` / `cast`: a new tensor unless the width is unchanged.
    /// burn-autodiff marks `cast` compute-bound: balanced checkpointing keeps its output.
    pub fn cast(&mut self, x: Buf, from: u64, to: u64) -> Buf {
        if from == to { x } else { self.op("cast", &[x], &[], self.bytes(x) / from * to, true, 0, 0, 0) }
    }

    /// [`crate::nn::lean`]'s SiLU of `x` (elements of `width` bytes): one compute-bound node
    /// that keeps only `x`. Workspaces: the f32 copy and `sigmoid(x)` forward; the backward's
    /// f32 temporaries (`sigmoid`, `1 − s`, the product), plus f32 copies of `x` and the
    /// output gradient when `width` < 4.
    pub fn silu(&mut self, x: Buf, width: u64) -> Buf {
        let n = self.bytes(x);
        let n32 = n / width * 4;
        let casts = if width == 4 { 0 } else { n32 };
        self.op("silu", &[x], &[x], n, true, n32 + casts, 3 * n32 + 2 * casts, 0)
    }

    /// [`crate::nn::lean`]'s Mish: one node keeping `x`; softplus and tanh temporaries (3 f32
    /// maps forward, 4 backward), plus f32 copies when `width` < 4.
    pub fn mish(&mut self, x: Buf, width: u64) -> Buf {
        let n = self.bytes(x);
        let n32 = n / width * 4;
        let casts = if width == 4 { 0 } else { n32 };
        self.op("mish", &[x], &[x], n, true, 3 * n32 + casts, 4 * n32 + 2 * casts, 0)
    }

    /// [`crate::nn::lean`]'s GroupNorm / LayerNorm (`silu`: with the fused SiLU): one node
    /// that keeps its input (in its `width`) and the per-group mean and 1/std (`stat_bytes`
    /// each); output in the input's width. Workspaces: forward, the f32 view, the centred and
    /// scaled maps (2 f32 maps, plus the copy when `width` < 4); backward, `x̂`, the gradient
    /// times the weight, its product with `x̂` and `dx` (4 f32 maps; 5 with the SiLU's
    /// pre-activation), plus f32 copies of `x` and the output gradient when `width` < 4.
    pub fn norm(&mut self, x: Buf, width: u64, affine: Option<(Buf, Buf)>, stat_bytes: u64, silu: bool) -> Buf {
        let n = self.bytes(x);
        let n32 = n / width * 4;
        let casts = if width == 4 { 0 } else { n32 };
        // The statistics come out of the forward untracked (no gradient of their own).
        let stats = self.op("norm statistics", &[], &[], 2 * stat_bytes, true, 0, 0, 0);
        let mut inputs = vec![x, stats];
        let mut param_grad = 0;
        if let Some((w, b)) = affine {
            inputs.extend([w, b]);
            param_grad = self.bytes(w) + self.bytes(b);
        }
        let bwd = (if silu { 5 } else { 4 }) * n32 + 2 * casts;
        self.op("norm", &inputs, &[x, stats], n, true, 2 * n32 + casts, bwd, param_grad)
    }

    /// GroupNorm (+ SiLU) as flex's kernels run it (`nn::flex_kernels::group_norm`, f32 or bf16):
    /// the node keeps the input and the statistics; forward and backward write their outputs
    /// directly (no intermediates).
    pub fn group_norm(&mut self, x: Buf, affine: (Buf, Buf), stat_bytes: u64) -> Buf {
        let n = self.bytes(x);
        let stats = self.op("norm statistics", &[], &[], 2 * stat_bytes, true, 0, 0, 0);
        let (w, b) = affine;
        let param_grad = self.bytes(w) + self.bytes(b);
        self.op("norm", &[x, stats, w, b], &[x, stats], n, true, 0, 0, param_grad)
    }

    /// `nn::lean::softmax`: one node keeping only its output (PyTorch's rule); its backward's
    /// `dy · y` is a temporary of the input's size.
    pub fn softmax(&mut self, x: Buf) -> Buf {
        let n = self.bytes(x);
        let y = self.op("softmax", &[x], &[], n, true, 0, n, 0);
        let op = self.ops.last_mut().expect("just pushed");
        if op.tracked {
            op.saves.push(y);
        }
        y
    }

    /// `a @ b` (batched): saves both; no workspace on flex beyond the output.
    pub fn matmul(&mut self, a: Buf, b: Buf, out_bytes: u64) -> Buf {
        self.op("matmul", &[a, b], &[a, b], out_bytes, true, 0, self.bytes(a) + self.bytes(b), 0)
    }

    /// A linear layer `x @ Wᵀ + b` on `rows` rows of `in` (`nn::linear_rows` flattens any
    /// leading axes) → `[rows, out]`, params cast to precision `p`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(&mut self, x: Buf, rows: usize, din: usize, dout: usize, bias: bool, trainable: bool, p: Precision) -> Buf {
        let w = self.weight_cast(din * dout, trainable, p, true);
        let wd = dtype_bytes(p);
        let out = (rows * dout) as u64 * wd;
        // In f32 the op's backward produces the parameters' f32 gradients; in half precision
        // it produces the gradients of their casts (activation-side buffers, compute dtype),
        // which the casts' deferred backward turns into the f32 gradients.
        let pg = if trainable && p == Precision::F32 { ((din + bias as usize) * dout) as u64 * 4 } else { 0 };
        // `nn::linear_rows` flattens the input to rows, so the weight gradient is one matmul
        // (not one per leading index, as burn's `linear` on a 3-D input): the transposed
        // input's copy and the gradient.
        let bwd = self.bytes(x) + (din * dout) as u64 * wd;
        let y = self.op("linear", &[x, w], &[x, w], out, true, 0, bwd, pg);
        if bias {
            let b = self.weight(dout, trainable, p);
            self.elementwise(&[y, b], out)
        } else {
            y
        }
    }

    /// An N-d convolution (im2col + GEMM on flex). `in_spatial`/`out_spatial`: products of the
    /// spatial sizes; `k`: kernel volume.
    #[allow(clippy::too_many_arguments)]
    pub fn conv(&mut self, x: Buf, batch: usize, cin: usize, cout: usize, k: usize, in_spatial: usize, out_spatial: usize, bias: bool, trainable: bool, p: Precision) -> Buf {
        let w = self.weight_cast(cout * cin * k, trainable, p, true);
        let wd = dtype_bytes(p);
        let out = (batch * cout * out_spatial) as u64 * wd;
        let x_bytes = (batch * cin * in_spatial) as u64 * wd;
        // f32: the f32 parameter gradients; half precision: those of the casts (see `linear`).
        let pg = if trainable && p == Precision::F32 { ((cin * k + bias as usize) * cout) as u64 * 4 } else { 0 };
        // flex runs half-precision convolutions through f32: the input, weight and output
        // (and, backward, the output gradient) are converted to f32 copies around an f32
        // convolution, whose workspaces are f32 too.
        let half = wd != 4;
        let (x32, out32, w32) = ((batch * cin * in_spatial * 4) as u64, out / wd * 4, (cout * cin * k * 4) as u64);
        let conv_copies = if half { x32 + w32 + out32 } else { 0 };
        // Forward: an NHWC copy of the input and the flattened weight (the im2col itself is
        // tiled); a 1×1 convolution is a GEMM on the input as it is.
        let fwd = conv_copies + if k == 1 { 0 } else { x32 + w32 };
        // Input gradient (strided): flex's transposed convolution reuses one column buffer
        // `[cin·k, out_spatial]` across the batch. Weight gradient (first, `nn::lean`): per
        // batch chunk (`conv_chunks`), a convolution of the input by the output gradient,
        // which copies both (NHWC input, flattened "kernel"), gives an f32 result, then the
        // permuted result is copied back in the compute dtype; with several chunks the
        // running sum is one more weight-sized buffer.
        // Stride 1 (`nn::lean`): the input gradient is a forward convolution of the output
        // gradient (its NHWC copy, the flipped weight and its flattened copy); strided: flex's
        // transposed convolution and its column buffer.
        let stride1 = out_spatial >= in_spatial;
        let cols = (cin * k * out_spatial * 4) as u64;
        // No input gradient for an input that needs none (the first layer's).
        let bwd_x = match self.rg(x) {
            false => 0,
            true => (if stride1 && k > 1 { out32 + 2 * w32 } else { cols }) + if half { out32 + w32 + x32 } else { 0 },
        };
        // Weight gradient on flex (`nn::flex_kernels::conv_weight_backward`): per batch chunk
        // (`conv_chunks`), GEMMs over f32 im2col blocks of at most the chunk's input + output
        // gradient bytes (4–32 MiB), each with its output-gradient columns and a weight-sized
        // result; with several blocks the running sum is one more; half precision converts
        // the f32 result back.
        let chunks = crate::nn::lean::conv_chunks(batch, ((x_bytes + out) / batch.max(1) as u64) as usize);
        let largest = chunks.iter().map(|r| r.len()).max().unwrap_or(batch) as u64;
        let per_col = (cin * k * 4) as u64;
        let chunk_cols = largest * out_spatial as u64;
        let bound = ((x32 + out32) * largest / batch.max(1) as u64).clamp(4 << 20, crate::nn::lean::CONV_WORKSPACE_BYTES as u64);
        let block_cols = (bound / per_col.max(1)).clamp(1, chunk_cols.max(1));
        let blocks = chunk_cols.div_ceil(block_cols) * chunks.len() as u64;
        let bwd_w = block_cols * per_col + block_cols * (cout * 4) as u64 + w32 + if blocks > 1 { w32 } else { 0 } + if half { w32 / 2 } else { 0 };
        let bwd = bwd_x.max(bwd_w);
        let inputs: Vec<Buf> = if bias { vec![x, w, self.weight(cout, trainable, p)] } else { vec![x, w] };
        self.op("conv", &inputs, &[x, w], out, true, fwd, bwd, pg)
    }

    /// A 3-D convolution with a cubic kernel of side `k`, "same" padding `k / 2`, on `[batch,
    /// cin, in_dhw]`. Stride 1 with `cin·k³ ≤ 1728` in f32 or bf16 runs flex's direct kernels
    /// (`nn::flex_conv3d`), whose workspaces are modelled here; anything else is [`Graph::conv`].
    #[allow(clippy::too_many_arguments)]
    pub fn conv3d(&mut self, x: Buf, batch: usize, cin: usize, cout: usize, k: usize, in_dhw: [usize; 3], stride: [usize; 3], bias: bool, trainable: bool, p: Precision) -> Buf {
        let kv = k * k * k;
        let out_dhw = [0, 1, 2].map(|a| in_dhw[a].div_ceil(stride[a]));
        let (in_n, out_n) = (in_dhw.iter().product::<usize>(), out_dhw.iter().product::<usize>());
        let direct = |c: usize| stride == [1; 3] && c * kv <= crate::nn::DIRECT_CONV3D_MAX_REDUCTION && matches!(p, Precision::F32 | Precision::Bf16);
        if !direct(cin) {
            return self.conv(x, batch, cin, cout, kv, in_n, out_n, bias, trainable, p);
        }
        let w = self.weight_cast(cout * cin * kv, trainable, p, true);
        let wd = dtype_bytes(p);
        let half = wd != 4;
        let out = (batch * cout * out_n) as u64 * wd;
        let pg = if trainable && !half { ((cin * kv + bias as usize) * cout) as u64 * 4 } else { 0 };
        let pad = k / 2;
        let [d, h, wid] = in_dhw;
        // The f32 copies the kernels make: the input zero-padded (rows of whole 8-lane vectors
        // plus the kernel's reach), the weight packed in blocks of 4 output channels.
        let padded = |n: usize, c: usize| (n * c * (d + 2 * pad) * (h + 2 * pad) * (wid.div_ceil(8) * 8 + k - 1) * 4) as u64;
        let packed = |co: usize, ci: usize| (co.div_ceil(4) * 4 * ci * kv * 4) as u64;
        let fwd = padded(batch, cin) + packed(cout, cin);
        // Weight gradient, per batch chunk (`conv_chunks`): the padded input, the output
        // gradient as f32 rows of whole vectors (borrowed when it already is), one 4×3 tile
        // sum per task, the f32 gradient (and its bf16 copy); several chunks add a running sum.
        let w32 = (cout * cin * kv * 4) as u64;
        let x_bytes = (batch * cin * in_n) as u64 * wd;
        let chunks = crate::nn::lean::conv_chunks(batch, ((x_bytes + out) / batch.max(1) as u64) as usize);
        let m = chunks.iter().map(|r| r.len()).max().unwrap_or(batch);
        let dy_copy = if !half && wid.is_multiple_of(8) && cout.is_multiple_of(4) { 0 } else { (m * cout.div_ceil(4) * 4 * out_n / wid * wid.div_ceil(8) * 8 * 4) as u64 };
        let sums = (cout.div_ceil(4) * cin * k * k * k.div_ceil(3) * 4 * 3 * 4) as u64;
        let bwd_w = padded(m, cin) + dy_copy + sums + w32 + if half { w32 / 2 } else { 0 } + if chunks.len() > 1 { w32 } else { 0 };
        // Input gradient: the output gradient convolved with the flipped kernel (its copy in
        // the compute dtype), by the direct kernels when they take it, else flex's GEMM path
        // (`Graph::conv`'s model); none for an input that needs no gradient (the first layer's).
        let flipped = (cout * cin * kv) as u64 * wd;
        let bwd_x = match (self.rg(x), direct(cout)) {
            (false, _) => 0,
            (true, true) => flipped + padded(batch, cout) + packed(cin, cout),
            (true, false) => flipped + (batch * cout * out_n * 4) as u64 + w32 + if half { (batch * cout * out_n * 4 + batch * cin * in_n * 4) as u64 + w32 } else { 0 },
        };
        let bwd = bwd_w.max(bwd_x);
        let inputs: Vec<Buf> = if bias { vec![x, w, self.weight(cout, trainable, p)] } else { vec![x, w] };
        self.op("conv", &inputs, &[x, w], out, true, fwd, bwd, pg)
    }

    /// Mean squared error reduced to a scalar (loss in f32).
    pub fn mse(&mut self, pred: Buf, target: Buf) -> Buf {
        let n = self.bytes(pred);
        let d = self.elementwise(&[pred, target], n);
        let sq = self.unary_saving(d, n);
        self.reduce(sq, 4)
    }

    /// Per-module stored bytes (plain autodiff) and largest workspace, in forward order.
    pub fn module_rows(&self) -> Vec<ModuleRow> {
        let mut rows: Vec<ModuleRow> = Vec::new();
        let mut counted = vec![false; self.bufs.len()];
        for op in &self.ops {
            let mut stored = 0;
            for s in &op.saves {
                let b = &self.bufs[s.0];
                if !b.param && !counted[s.0] {
                    counted[s.0] = true;
                    stored += b.bytes;
                }
            }
            let ws = op.fwd_workspace.max(op.bwd_workspace);
            match rows.last_mut() {
                Some(r) if r.module == op.module => {
                    r.stored_bytes += stored;
                    r.workspace_bytes = r.workspace_bytes.max(ws);
                }
                _ => rows.push(ModuleRow { module: op.module.clone(), stored_bytes: stored, workspace_bytes: ws }),
            }
        }
        rows
    }

    /// Replay the graph under `mode`.
    pub fn simulate(&self, mode: CheckpointMode) -> ActivationPeaks {
        match mode {
            CheckpointMode::Off => self.replay(&self.saved_sets(false)),
            CheckpointMode::Balanced => {
                let (kept, recomputed): (Vec<Vec<Buf>>, Vec<u64>) = self.saved_and_recomputed(true).into_iter().unzip();
                let mut peaks = empty_peaks();
                self.replay_range_with(&kept, &recomputed, 0..self.ops.len(), 0, 0, 0, &mut peaks);
                peaks
            }
            CheckpointMode::Blocks => self.replay_blocks(),
        }
    }

    /// For each op, the buffers its backward needs kept: its saves, or (balanced) the
    /// compute-bound ancestors a memory-bound save is recomputed from.
    fn saved_sets(&self, balanced: bool) -> Vec<Vec<Buf>> {
        self.saved_and_recomputed(balanced).into_iter().map(|(kept, _)| kept).collect()
    }

    /// Per op: the buffers kept for its backward, and the bytes its backward recomputes
    /// first (balanced checkpointing: the memory-bound chain back to kept tensors).
    fn saved_and_recomputed(&self, balanced: bool) -> Vec<(Vec<Buf>, u64)> {
        self.ops
            .iter()
            .map(|op| {
                if !balanced {
                    return (op.saves.clone(), 0);
                }
                let (mut out, mut recomputed) = (Vec::new(), 0u64);
                let mut stack: Vec<Buf> = op.saves.clone();
                let mut seen = Vec::new();
                while let Some(b) = stack.pop() {
                    if seen.contains(&b.0) || seen.len() > 64 {
                        continue;
                    }
                    seen.push(b.0);
                    let info = &self.bufs[b.0];
                    match info.producer {
                        Some(p) if !self.ops[p].compute_bound && self.ops[p].tracked => {
                            recomputed += info.bytes;
                            stack.extend(self.ops[p].inputs.iter().copied());
                        }
                        _ => out.push(b),
                    }
                }
                (out, recomputed)
            })
            .collect()
    }

    /// Plain replay of ops `range` (forward, then backward in reverse), with `base` bytes
    /// held throughout, `upstream` the gradient flowing into the range's output. Buffers made
    /// outside the range (data, parameters, an earlier stage's output) are the caller's.
    #[allow(clippy::too_many_arguments)]
    fn replay_range(&self, saved: &[Vec<Buf>], range: std::ops::Range<usize>, base: u64, upstream: u64, grads_before: u64, peaks: &mut ActivationPeaks) {
        self.replay_range_with(saved, &vec![0; self.ops.len()], range, base, upstream, grads_before, peaks)
    }

    /// [`Self::replay_range`] with `recomputed[i]` bytes rebuilt before op i's backward.
    #[allow(clippy::too_many_arguments)]
    fn replay_range_with(&self, saved: &[Vec<Buf>], recomputed: &[u64], range: std::ops::Range<usize>, base: u64, upstream: u64, grads_before: u64, peaks: &mut ActivationPeaks) {
        let nb = self.bufs.len();
        let inside = |b: Buf| !self.bufs[b.0].param && self.bufs[b.0].producer.is_some_and(|p| range.contains(&p));
        let mut last_use = vec![None::<usize>; nb];
        for i in range.clone() {
            for b in &self.ops[i].inputs {
                last_use[b.0] = Some(i);
            }
        }
        // The earliest op whose backward reads the buffer: it is freed after that backward.
        let mut keep_until = vec![None::<usize>; nb];
        for i in range.clone() {
            for b in &saved[i] {
                if inside(*b) {
                    keep_until[b.0] = Some(keep_until[b.0].map_or(i, |k: usize| k.min(i)));
                }
            }
        }
        let last_op = range.end.saturating_sub(1);
        let mut live = vec![false; nb];
        let mut live_bytes = 0u64;
        let (mut fwd_peak, mut fwd_module) = (0u64, String::new());
        for i in range.clone() {
            let op = &self.ops[i];
            let out = self.bufs[op.out.0].bytes;
            let here = base + live_bytes + out + op.fwd_workspace;
            if here > fwd_peak {
                (fwd_peak, fwd_module) = (here, op.module.clone());
            }
            let kept = keep_until[op.out.0].is_some() || last_use[op.out.0].is_some() || i == last_op;
            if kept {
                live[op.out.0] = true;
                live_bytes += out;
            }
            for b in &op.inputs {
                if inside(*b) && live[b.0] && last_use[b.0] == Some(i) && keep_until[b.0].is_none() {
                    live[b.0] = false;
                    live_bytes -= self.bufs[b.0].bytes;
                }
            }
        }
        if fwd_peak > peaks.forward_peak {
            (peaks.forward_peak, peaks.forward_peak_module) = (fwd_peak, fwd_module);
        }
        peaks.forward_end = base + live_bytes;
        peaks.stored = live_bytes;
        // Backward, last op first: each op's output gradient is consumed, its inputs'
        // gradients appear (or are summed into existing ones), its parameter gradients stay.
        let mut grad = vec![0u64; nb];
        let mut grad_bytes = upstream;
        grad[self.ops[last_op].out.0] = upstream;
        let mut pgrads = grads_before;
        for i in range.clone().rev() {
            let op = &self.ops[i];
            if !op.tracked || op.param_cast.is_some() {
                continue;
            }
            let needs = |b: &Buf| self.bufs[b.0].requires_grad && !self.bufs[b.0].param;
            let new_grads: u64 = op.inputs.iter().filter(|b| needs(b)).map(|b| self.bufs[b.0].bytes).sum();
            let here = base + live_bytes + grad_bytes + new_grads + op.bwd_workspace + recomputed[i] + pgrads + op.param_grad;
            if here > peaks.backward_peak {
                peaks.backward_peak = here;
                peaks.grads_at_backward_peak = pgrads + op.param_grad;
                peaks.backward_peak_module = op.module.clone();
            }
            pgrads += op.param_grad;
            for b in op.inputs.iter().filter(|b| needs(b)) {
                if grad[b.0] == 0 {
                    grad[b.0] = self.bufs[b.0].bytes.max(1);
                    grad_bytes += self.bufs[b.0].bytes;
                }
            }
            grad_bytes -= grad[op.out.0].min(grad_bytes);
            grad[op.out.0] = 0;
            for b in &saved[i] {
                if keep_until[b.0] == Some(i) && live[b.0] {
                    live[b.0] = false;
                    live_bytes -= self.bufs[b.0].bytes;
                }
            }
        }
        // Burn's tape runs the backward steps by depth (a node's depth is one more than its
        // deepest parent's), deepest first. A parameter's in-graph cast has depth 1 (the
        // parameter is a depth-0 leaf), so every such cast runs last, after the whole network's
        // backward: until then each parameter's gradient is held as the gradient of its cast,
        // in the compute dtype (already in `grad_bytes`). The casts then run one by one in
        // the order the tape was built (Burn's depth-first traversal from the loss, see
        // `burn_visit_order`); flex's cast copies a strided gradient contiguous, converts
        // through an f64 buffer and allocates the f32 result, then frees the compute-dtype
        // gradient.
        let mut pending: u64 = range.clone().filter_map(|i| self.ops[i].param_cast.map(|c| c.f32_bytes / 4 * c.width)).sum();
        for i in self.burn_visit_order(range.clone()).into_iter().filter(|&i| self.ops[i].param_cast.is_some()) {
            let (op, c) = (&self.ops[i], self.ops[i].param_cast.expect("filtered"));
            let elems = c.f32_bytes / 4;
            let copy = if c.strided_grad { elems * c.width } else { 0 };
            let here = base + live_bytes + grad_bytes + recomputed[i] + pgrads + copy + 8 * elems + c.f32_bytes;
            if here > peaks.backward_peak {
                peaks.backward_peak = here;
                peaks.grads_at_backward_peak = pgrads + pending + c.f32_bytes;
                peaks.backward_peak_module = op.module.clone();
            }
            let g = elems * c.width;
            grad_bytes -= g.min(grad_bytes);
            pending -= g.min(pending);
            pgrads += c.f32_bytes;
        }
    }

    /// The order in which Burn's autodiff visits the tracked ops of `range` when it builds the
    /// tape (`BreadthFirstSearch::traverse`, burn-autodiff 0.21): from the range's last op, a
    /// stack of parent ids (the op's inputs that require a gradient, in argument order), the
    /// last pushed popped first, each op visited once. Steps of equal depth run in this order.
    fn burn_visit_order(&self, range: std::ops::Range<usize>) -> Vec<usize> {
        let Some(root) = range.clone().next_back() else { return Vec::new() };
        let mut visited = vec![false; self.ops.len()];
        let parents = |i: usize| self.ops[i].inputs.iter().copied().filter(|b| self.bufs[b.0].requires_grad).collect::<Vec<Buf>>();
        let mut order = vec![root];
        visited[root] = true;
        let mut stack = parents(root);
        while let Some(b) = stack.pop() {
            let Some(p) = self.bufs[b.0].producer else { continue };
            if !range.contains(&p) || !self.ops[p].tracked || visited[p] {
                continue;
            }
            visited[p] = true;
            stack.extend(parents(p).into_iter().filter(|q| self.bufs[q.0].producer.is_none_or(|o| !visited[o])));
            order.push(p);
        }
        // Ops the traversal does not reach from the root (none in a connected graph) last.
        order.extend(range.filter(|&i| self.ops[i].tracked && !visited[i]));
        order
    }

    fn replay(&self, saved: &[Vec<Buf>]) -> ActivationPeaks {
        let mut peaks = empty_peaks();
        self.replay_range(saved, 0..self.ops.len(), 0, 0, 0, &mut peaks);
        peaks
    }

    /// Block recomputation: a graph-free forward keeping stage inputs, then per stage in
    /// reverse a recorded forward of that stage and its backward.
    fn replay_blocks(&self) -> ActivationPeaks {
        let saved = self.saved_sets(false);
        let none: Vec<Vec<Buf>> = vec![Vec::new(); self.ops.len()];
        let mut stages: Vec<usize> = self.ops.iter().map(|o| o.stage).collect();
        stages.dedup();
        let range_of = |s: usize| {
            let start = self.ops.iter().position(|o| o.stage == s).unwrap_or(0);
            let end = self.ops.iter().rposition(|o| o.stage == s).map_or(0, |e| e + 1);
            start..end
        };
        let inputs_of = |s: usize| -> Vec<usize> { self.boundaries.iter().filter(|(i, _)| *i == s).flat_map(|(_, b)| b.iter()).filter(|b| !self.bufs[b.0].param && self.bufs[b.0].producer.is_some()).map(|b| b.0).collect() };
        let boundary = |s: usize| -> u64 { inputs_of(s).iter().map(|&b| self.bufs[b].bytes).sum() };
        // kept[k]: stage inputs held while stage k runs (inputs of stages 1..=k). A tensor
        // carried through several states (the encoder memory, the conditioning) shares its
        // storage: counted once.
        let kept: Vec<u64> = (0..stages.len())
            .map(|k| {
                let mut ids: Vec<usize> = stages[1..=k.min(stages.len() - 1)].iter().take(k).flat_map(|&t| inputs_of(t)).collect();
                ids.sort_unstable();
                ids.dedup();
                ids.iter().map(|&b| self.bufs[b].bytes).sum()
            })
            .collect();
        let mut peaks = empty_peaks();
        for (k, &s) in stages.iter().enumerate() {
            let mut sub = empty_peaks();
            self.replay_range(&none, range_of(s), kept[k], 0, 0, &mut sub);
            if sub.forward_peak > peaks.forward_peak {
                (peaks.forward_peak, peaks.forward_peak_module) = (sub.forward_peak, sub.forward_peak_module);
            }
        }
        let total_kept = kept.last().copied().unwrap_or(0) + stages.last().map_or(0, |_| 0);
        (peaks.forward_end, peaks.stored) = (total_kept, total_kept);
        let mut pgrads = 0u64;
        for (k, &s) in stages.iter().enumerate().rev() {
            let upstream = stages.get(k + 1).map_or(0, |&t| boundary(t));
            let mut sub = empty_peaks();
            self.replay_range(&saved, range_of(s), kept[k], upstream, pgrads, &mut sub);
            let recompute_peak = sub.forward_peak + upstream + pgrads;
            let (top, module, grads) = if sub.backward_peak >= recompute_peak {
                (sub.backward_peak, sub.backward_peak_module, sub.grads_at_backward_peak)
            } else {
                (recompute_peak, sub.forward_peak_module, pgrads)
            };
            if top > peaks.backward_peak {
                (peaks.backward_peak, peaks.backward_peak_module, peaks.grads_at_backward_peak) = (top, module, grads);
            }
            pgrads += self.ops[range_of(s)].iter().map(|o| o.param_grad).sum::<u64>();
        }
        peaks
    }
}

/// A 2-D feature map `[n, c, h, w]` in the graph.
#[derive(Clone, Copy, Debug)]
pub struct Map2d {
    pub buf: Buf,
    pub n: usize,
    pub c: usize,
    pub hw: [usize; 2],
}

/// torchvision's ResNet-18 trunk (through `layer4`), as [`crate::resnet`] runs it: norms in
/// f32 returned in the compute dtype, ReLU saving its input, max-pool keeping its indices.
/// `group_norm`: Diffusion Policy's GroupNorm(C/16) (trainable) instead of the frozen
/// batch norm. Stage boundaries (stem, layer1..4) start at `first_stage`. Returns the map
/// and the bytes of frozen buffers (batch-norm statistics) that are not graph weights.
pub fn resnet18(g: &mut Graph, x: Map2d, p: Precision, trainable: bool, group_norm: bool, first_stage: usize, prefix: &str) -> (Map2d, u64) {
    let w = dtype_bytes(p);
    let mut frozen = 0u64;
    let conv = |g: &mut Graph, x: Map2d, cout: usize, k: usize, stride: usize| {
        let pad = k / 2;
        let hw = [0, 1].map(|a| (x.hw[a] + 2 * pad - k) / stride + 1);
        let buf = g.conv(x.buf, x.n, x.c, cout, k * k, x.hw[0] * x.hw[1], hw[0] * hw[1], false, trainable, p);
        Map2d { buf, n: x.n, c: cout, hw }
    };
    let mut norm = |g: &mut Graph, x: Map2d| {
        let elems = x.n * x.c * x.hw[0] * x.hw[1];
        let buf = if group_norm {
            let affine = (g.weight(x.c, trainable, Precision::F32), g.weight(x.c, trainable, Precision::F32));
            g.group_norm(x.buf, affine, (x.n * (x.c / 16) * 4) as u64)
        } else {
            // FrozenBatchNorm2d: weight, bias, running mean and var (none trainable).
            frozen += 4 * 4 * x.c as u64;
            let scale = g.input(x.c, 4);
            let xf = g.cast(x.buf, w, 4);
            let y = g.mul(xf, scale, (elems * 4) as u64);
            let y = g.elementwise(&[y], (elems * 4) as u64);
            g.cast(y, 4, w)
        };
        Map2d { buf, ..x }
    };
    // `nn::lean::relu` keeps its output, which the next convolution or pool keeps anyway.
    let relu = |g: &mut Graph, x: Map2d| Map2d { buf: g.elementwise(&[x.buf], g.bytes(x.buf)), ..x };
    g.stage(first_stage, &[x.buf]);
    g.module(format!("{prefix}stem"));
    let xc = g.cast(x.buf, 4, w);
    let mut h = conv(g, Map2d { buf: xc, ..x }, 64, 7, 2);
    h = norm(g, h);
    h = relu(g, h);
    let hw = [0, 1].map(|a| (h.hw[a] + 2 - 3) / 2 + 1);
    let out = (h.n * h.c * hw[0] * hw[1]) as u64;
    let pooled = g.op("max_pool", &[h.buf], &[h.buf], out * w, false, out * 8, out * 8, 0);
    h = Map2d { buf: pooled, hw, ..h };
    for (layer, cout) in [64usize, 128, 256, 512].into_iter().enumerate() {
        g.stage(first_stage + 1 + layer, &[h.buf]);
        g.module(format!("{prefix}layer{}", layer + 1));
        for block in 0..2 {
            let stride = if layer > 0 && block == 0 { 2 } else { 1 };
            let x = h;
            let mut o = conv(g, x, cout, 3, stride);
            o = norm(g, o);
            o = relu(g, o);
            o = conv(g, o, cout, 3, 1);
            o = norm(g, o);
            let skip = if stride != 1 || x.c != cout {
                let s = conv(g, x, cout, 1, stride);
                norm(g, s)
            } else {
                x
            };
            let sum = g.elementwise(&[o.buf, skip.buf], g.bytes(o.buf));
            h = relu(g, Map2d { buf: sum, ..o });
        }
    }
    (h, frozen)
}

fn empty_peaks() -> ActivationPeaks {
    ActivationPeaks { forward_peak: 0, forward_end: 0, backward_peak: 0, stored: 0, grads_at_backward_peak: 0, backward_peak_module: String::new(), forward_peak_module: String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_inputs_keep_nothing() {
        let mut g = Graph::new();
        let x = g.input(1000, 4);
        let y = g.conv(x, 1, 10, 10, 9, 100, 100, true, false, Precision::F32);
        let s = g.silu(y, 4);
        let _ = g.reduce(s, 4);
        assert_eq!(g.simulate(CheckpointMode::Off).stored, 4, "only the loss scalar");
    }

    #[test]
    fn silu_after_conv_keeps_only_its_input() {
        let mut g = Graph::new();
        let x = g.input(1000, 4);
        let y = g.conv(x, 1, 10, 10, 1, 100, 100, false, true, Precision::F32); // 4000 B
        let s = g.silu(y, 4);
        let _ = g.reduce(s, 4);
        // By hand: x is the caller's (data); the lean SiLU keeps y (4000 B) and the loss
        // scalar (4 B) stays. Forward peak at the SiLU: y, its output and sigmoid(y).
        let p = g.simulate(CheckpointMode::Off);
        assert_eq!(p.stored, 4000 + 4);
        assert_eq!(p.forward_peak, 3 * 4000);
        // Backward peak at the SiLU: y, the scalar, grad(s), the new grad(y) and three f32
        // temporaries: 4004 + 4000 + 4000 + 12 000.
        assert_eq!(p.backward_peak, 24_004);
        assert_eq!(p.backward_peak_module, "");
    }

    #[test]
    fn half_precision_parameter_casts_run_last() {
        // A bf16 linear (100×100 weight, no bias) on a data input, then a reduce. By hand:
        // the weight's cast (20 000 B) is saved by the matmul; the linear's backward makes the
        // cast's bf16 gradient (20 000 B) with its workspace (x + 1 weight-sized: 20 200 B):
        // 4 + 200 + 20 000 + 20 000 + 20 200 = 60 404. The cast's backward (depth 1) runs
        // after it, once the saved weight copy is freed: the bf16 gradient, its contiguous
        // copy (20 000), the f64 buffer (80 000) and the f32 gradient (40 000) with the loss
        // scalar: 160 004.
        let mut g = Graph::new();
        let x = g.input(100, 2);
        let y = g.linear(x, 1, 100, 100, false, true, Precision::Bf16);
        let _ = g.reduce(y, 4);
        let p = g.simulate(CheckpointMode::Off);
        assert_eq!(p.backward_peak, 160_004);
        assert_eq!(p.grads_at_backward_peak, 60_000);
    }

    #[test]
    fn blocks_keep_only_stage_inputs_forward() {
        let mut g = Graph::new();
        let x = g.input(1000, 4);
        g.stage(0, &[x]);
        let y = g.conv(x, 1, 10, 10, 1, 100, 100, false, true, Precision::F32);
        let y = g.silu(y, 4);
        g.stage(1, &[y]);
        let z = g.conv(y, 1, 10, 10, 1, 100, 100, false, true, Precision::F32);
        let z = g.silu(z, 4);
        let _ = g.reduce(z, 4);
        let plain = g.simulate(CheckpointMode::Off);
        let blocks = g.simulate(CheckpointMode::Blocks);
        assert_eq!(blocks.stored, 4000);
        assert!(blocks.stored < plain.stored);
    }
}
