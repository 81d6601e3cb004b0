//! Building a [`Graph`]: the ops a model's graph builder calls, each with what Burn's autodiff
//! saves for its backward and the transient workspaces flex allocates around it (casts,
//! im2col columns, f32 copies of half-precision operands).

use super::{Buf, BufInfo, Graph, Op, ParamCast, dtype_bytes};
use crate::nn::Precision;

/// The batch chunks of flex's convolution weight gradient (`nn::lean::conv_chunks(batch,
/// per_sample)`) as (the largest chunk's length, the number of chunks), computed without
/// listing the chunks: the estimate's own memory and time do not grow with the batch.
fn chunk_shape(batch: usize, per_sample: usize) -> (usize, usize) {
    if batch == 0 {
        return (0, 0);
    }
    // `conv_chunks`: n even chunks of `size` (the last one shorter), empty ones dropped.
    let per_chunk = (crate::nn::lean::CONV_WORKSPACE_BYTES / per_sample.max(1)).clamp(1, batch);
    let n = batch.div_ceil(per_chunk);
    let size = batch.div_ceil(n);
    (size, batch.div_ceil(size).min(n))
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

    /// Declare that stage-state tensor `b` has elements of `width` bytes (a half-precision
    /// map or volume); f32 (the default) needs no declaration.
    pub fn half_state(&mut self, b: Buf, width: u64) {
        if width < 4 {
            self.half_states.push((b, width));
        }
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

    /// A parameter tensor of `bytes` (f32): a new one, or the next of the recorded ones while
    /// [`Self::reuse_params`] is on.
    fn param(&mut self, bytes: u64, trainable: bool) -> Buf {
        if let Some((list, k)) = &mut self.reused_params
            && let Some(&b) = list.get(*k)
        {
            *k += 1;
            return b;
        }
        let b = self.push(bytes, trainable, None, true);
        if let Some(r) = &mut self.recorded_params {
            r.push(b);
        }
        b
    }

    /// Record the parameters the next ops create (until [`Self::reuse_params`]).
    pub fn record_params(&mut self) {
        self.recorded_params = Some(Vec::new());
    }

    /// Hand out the recorded parameters again, in the order they were made, to ops that build
    /// the same module once more (until [`Self::end_params`]).
    pub fn reuse_params(&mut self) {
        let list = self.recorded_params.take().or_else(|| self.reused_params.take().map(|r| r.0)).unwrap_or_default();
        self.reused_params = Some((list, 0));
    }

    /// Back to new parameters.
    pub fn end_params(&mut self) {
        (self.recorded_params, self.reused_params) = (None, None);
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
        let w = self.param(elems as u64 * 4, trainable);
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
            direct: false,
            fwd_workspace: fwd_ws,
            bwd_workspace: if tracked { bwd_ws } else { 0 },
            param_grad: if tracked { param_grad } else { 0 },
            tracked,
            param_cast: None,
        });
        out
    }

    /// Mark the last op as one of vramlab's lean ops (its state holds its saves directly).
    fn direct(&mut self) {
        if let Some(op) = self.ops.last_mut() {
            op.direct = true;
        }
    }

    /// An op whose backward keeps nothing and that balanced checkpointing never recomputes:
    /// Burn's `cat` (ambiguous), vramlab's lean ReLU (its output, kept by the consumer anyway),
    /// channel affine (constant scale) and linear upsampling.
    pub fn opaque(&mut self, inputs: &[Buf], out_bytes: u64) -> Buf {
        let y = self.op("opaque", inputs, &[], out_bytes, true, 0, 0, 0);
        self.direct();
        y
    }

    fn rg(&self, b: Buf) -> bool {
        self.bufs[b.0].requires_grad
    }

    /// Memory-bound element-wise op with no saved state (add, sub, scalar ops, reshape,
    /// slice, swap_dims copies).
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
        let y = self.op("silu", &[x], &[x], n, true, n32 + casts, 3 * n32 + 2 * casts, 0);
        self.direct();
        y
    }

    /// [`crate::nn::lean`]'s Mish: one node keeping `x`; softplus and tanh temporaries (3 f32
    /// maps forward, 4 backward), plus f32 copies when `width` < 4.
    pub fn mish(&mut self, x: Buf, width: u64) -> Buf {
        let n = self.bytes(x);
        let n32 = n / width * 4;
        let casts = if width == 4 { 0 } else { n32 };
        let y = self.op("mish", &[x], &[x], n, true, 3 * n32 + casts, 4 * n32 + 2 * casts, 0);
        self.direct();
        y
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
        let y = self.op("norm", &inputs, &[x, stats], n, true, 2 * n32 + casts, bwd, param_grad);
        self.direct();
        y
    }

    /// GroupNorm (+ SiLU) as flex's kernels run it (`nn::flex_kernels::group_norm`, f32 or bf16):
    /// the node keeps the input and the statistics; forward and backward write their outputs
    /// directly (no intermediates).
    pub fn group_norm(&mut self, x: Buf, affine: (Buf, Buf), stat_bytes: u64) -> Buf {
        let n = self.bytes(x);
        let stats = self.op("norm statistics", &[], &[], 2 * stat_bytes, true, 0, 0, 0);
        let (w, b) = affine;
        let param_grad = self.bytes(w) + self.bytes(b);
        let y = self.op("norm", &[x, stats, w, b], &[x, stats], n, true, 0, 0, param_grad);
        self.direct();
        y
    }

    /// `nn::lean::softmax`: one node keeping only its output (PyTorch's rule); its backward's
    /// `dy · y` is a temporary of the input's size.
    pub fn softmax(&mut self, x: Buf) -> Buf {
        let n = self.bytes(x);
        let y = self.op("softmax", &[x], &[], n, true, 0, n, 0);
        let op = self.ops.last_mut().expect("just pushed");
        op.direct = true;
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
        let (largest, n_chunks) = chunk_shape(batch, ((x_bytes + out) / batch.max(1) as u64) as usize);
        let largest = largest as u64;
        let per_col = (cin * k * 4) as u64;
        let chunk_cols = largest * out_spatial as u64;
        let bound = ((x32 + out32) * largest / batch.max(1) as u64).clamp(4 << 20, crate::nn::lean::CONV_WORKSPACE_BYTES as u64);
        let block_cols = (bound / per_col.max(1)).clamp(1, chunk_cols.max(1));
        let blocks = chunk_cols.div_ceil(block_cols) * n_chunks as u64;
        let bwd_w = block_cols * per_col + block_cols * (cout * 4) as u64 + w32 + if blocks > 1 { w32 } else { 0 } + if half { w32 / 2 } else { 0 };
        let bwd = bwd_x.max(bwd_w);
        let inputs: Vec<Buf> = if bias { vec![x, w, self.weight(cout, trainable, p)] } else { vec![x, w] };
        let y = self.op("conv", &inputs, &[x, w], out, true, fwd, bwd, pg);
        self.direct();
        y
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
        let (m, n_chunks) = chunk_shape(batch, ((x_bytes + out) / batch.max(1) as u64) as usize);
        let dy_copy = if !half && wid.is_multiple_of(8) && cout.is_multiple_of(4) { 0 } else { (m * cout.div_ceil(4) * 4 * out_n / wid * wid.div_ceil(8) * 8 * 4) as u64 };
        let sums = (cout.div_ceil(4) * cin * k * k * k.div_ceil(3) * 4 * 3 * 4) as u64;
        let bwd_w = padded(m, cin) + dy_copy + sums + w32 + if half { w32 / 2 } else { 0 } + if n_chunks > 1 { w32 } else { 0 };
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
        let y = self.op("conv", &inputs, &[x, w], out, true, fwd, bwd, pg);
        self.direct();
        y
    }

    /// Mean squared error reduced to a scalar (loss in f32).
    pub fn mse(&mut self, pred: Buf, target: Buf) -> Buf {
        let n = self.bytes(pred);
        let d = self.elementwise(&[pred, target], n);
        let sq = self.unary_saving(d, n);
        self.reduce(sq, 4)
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_shape;

    #[test]
    fn chunk_shape_matches_the_listed_chunks() {
        for batch in [0, 1, 2, 3, 7, 8, 31, 64, 100, 257, 1000, 4099] {
            for per_sample in [0, 1, 1000, 1 << 20, 3 << 20, 5 << 20, 32 << 20, 33 << 20, 1 << 30] {
                let chunks = crate::nn::lean::conv_chunks(batch, per_sample);
                let listed = (chunks.iter().map(|r| r.len()).max().unwrap_or(batch), chunks.len());
                assert_eq!(chunk_shape(batch, per_sample), listed, "batch {batch}, {per_sample} B per sample");
            }
        }
        // A batch no list could hold: constant work.
        assert_eq!(chunk_shape(1_000_000_000_000, 1 << 20), (32, 31_250_000_000));
    }
}
