//! PyTorch eager's training step on the op-graph vocabulary ([`Graph`]): a builder whose ops
//! follow PyTorch's autograd save rules and `torch.autocast(bfloat16)`'s casts
//! ([`TorchGraph`]), and a replay that turns the graph into the stream of tensor allocations
//! and frees the CUDA caching allocator sees ([`TorchGraph::replay`]), with
//! `torch.utils.checkpoint` segments recomputed in the backward.
//!
//! Save rules (PyTorch 2.x `derivatives.yaml`, measured on CPU with `saved_tensors_hooks` by
//! `benches/torch/baseline.py saved`): convolution and `addmm`/`bmm` keep both operands (under
//! autocast: their bf16 copies); `relu` keeps its result (in place: the input's storage);
//! `silu`/`mish`/`gelu` keep their input; `native_group_norm`/`native_layer_norm` keep their
//! input (f32 under autocast: a copy of a bf16 input) and the per-group mean and 1/std;
//! `softmax` keeps its result (f32 under autocast); `native_dropout` keeps its 1-byte mask;
//! `max_pool2d` keeps its input and int64 indices; `mul` keeps each operand the other needs;
//! `add`, views and copies keep nothing. Autocast casts a parameter once per forward (the cast
//! is cached until the autocast region ends; the copies stay alive as long as an op keeps
//! them, i.e. through the backward), an activation at every use.
//!
//! The replay's events are tensors, not allocator blocks: rounding, segments and caching
//! belong to the allocator model that consumes them (`vramlab_workloads::torch_target`). Each
//! cuDNN convolution call is marked ([`Ev::Conv`]: forward, backward-data, backward-filter,
//! with its geometry) where PyTorch makes it, so that the consumer can place what happens
//! there: `cudnn.benchmark`'s search and its `emptyCache()` on a geometry's first call, the
//! chosen algorithm's workspace on every call.

use std::ops::Range;

use super::{Buf, Graph};

/// A tensor of the PyTorch graph: its buffer, element count and element width.
#[derive(Clone, Copy, Debug)]
pub struct T {
    pub buf: Buf,
    pub elems: usize,
    pub width: u64,
}

/// An allocator event of the replay: tensor `id` allocated with `bytes`, or freed; or a cuDNN
/// convolution call (its output, `grad_input` or `grad_weight` already allocated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ev {
    Alloc { id: u64, bytes: u64 },
    Free { id: u64 },
    Conv { geom: ConvGeom, pass: ConvPass },
}

/// A convolution's geometry: what PyTorch's cuDNN plan cache keys on (sizes, element type;
/// stride and padding are implied here by the spatial sizes and the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeom {
    pub n: usize,
    pub cin: usize,
    pub cout: usize,
    /// Kernel volume (k, k², k³).
    pub k: usize,
    /// Input and output spatial volumes.
    pub in_sp: usize,
    pub out_sp: usize,
    /// Bytes per element of the convolution's operands (2 under autocast).
    pub width: u64,
}

/// Which cuDNN operation of a convolution runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConvPass {
    Forward,
    BackwardData,
    BackwardFilter,
}

/// The replay of one training forward + backward.
#[derive(Clone, Debug, Default)]
pub struct TorchReplay {
    pub events: Vec<Ev>,
    /// Index of the first backward event.
    pub forward_events: usize,
    /// Bytes autograd holds at the end of the forward (saved tensors and the loss), parameters
    /// and data excluded.
    pub stored: u64,
    /// Every tensor autograd saves (counted once per buffer), data inputs included, parameters
    /// excluded: what `saved_tensors_hooks` sees (`baseline.py saved`).
    pub saved_all: u64,
    /// Ids of the parameter gradients the backward allocates (kept until `zero_grad`).
    pub param_grads: Vec<u64>,
    /// Highest live bytes during the forward / the backward (replay's own tensors only).
    pub forward_peak: u64,
    pub backward_peak: u64,
}

/// How the graph is built: autocast, device, checkpointing.
pub struct TorchOpts {
    /// Under `torch.autocast(bfloat16)` (lerobot's `use_amp`).
    pub amp: bool,
    /// CUDA (dropout keeps a 1-byte mask) or CPU (`dropout` keeps its f32 noise tensor).
    pub cuda: bool,
    /// `torch.utils.checkpoint` where the model has it (the VAE's `use_checkpoint`).
    pub checkpoint: bool,
}

/// Builder of a PyTorch training forward.
#[derive(Clone, Debug)]
pub struct TorchGraph {
    pub g: Graph,
    /// Under `torch.autocast(bfloat16)`.
    pub amp: bool,
    /// Whether any op runs on cuBLAS (linear, matmul): PyTorch then creates its workspaces.
    pub uses_blas: bool,
    /// Bytes per element of a dropout mask (1 on CUDA, 4 on CPU).
    pub mask_width: u64,
    /// `torch.utils.checkpoint` regions (op index ranges).
    segments: Vec<Range<usize>>,
    open: Option<usize>,
    /// Autocast's weight cache: parameter buffer → its bf16 copy.
    cache: Vec<(Buf, T)>,
    /// Parameters handed out since the last [`TorchGraph::share_params`], and those to hand
    /// out again (a module applied several times: shared weights).
    made: Vec<T>,
    reuse: Option<(Vec<T>, usize)>,
    /// The convolutions: (op index, geometry).
    convs: Vec<(usize, ConvGeom)>,
}

impl TorchGraph {
    pub fn new(amp: bool) -> Self {
        Self { g: Graph::new(), amp, uses_blas: false, mask_width: 1, segments: Vec::new(), open: None, cache: Vec::new(), made: Vec::new(), reuse: None, convs: Vec::new() }
    }

    pub fn module(&mut self, name: impl Into<String>) {
        self.g.module(name);
    }

    /// Data (no gradient).
    pub fn input(&mut self, elems: usize, width: u64) -> T {
        T { buf: self.g.input(elems, width), elems, width }
    }

    /// An f32 parameter.
    pub fn param(&mut self, elems: usize, trainable: bool) -> T {
        if let Some((list, i)) = &mut self.reuse
            && let Some(t) = list.get(*i).copied().filter(|t| t.elems == elems)
        {
            *i += 1;
            self.made.push(t);
            return t;
        }
        self.g.bufs.push(super::BufInfo { bytes: elems as u64 * 4, requires_grad: trainable, producer: None, param: true });
        let t = T { buf: Buf(self.g.bufs.len() - 1), elems, width: 4 };
        self.made.push(t);
        t
    }

    /// From now on, hand out `again`'s parameters in order (`None`: new ones); returns the
    /// parameters handed out since the previous call (to share them with a later pass).
    pub fn share_params(&mut self, again: Option<Vec<T>>) -> Vec<T> {
        self.reuse = again.map(|l| (l, 0));
        std::mem::take(&mut self.made)
    }

    /// A new tensor from `inputs`, keeping `saves` for the backward when it is recorded.
    pub fn op(&mut self, inputs: &[T], saves: &[T], elems: usize, width: u64, ws: (u64, u64)) -> T {
        let ins: Vec<Buf> = inputs.iter().map(|t| t.buf).collect();
        let sv: Vec<Buf> = saves.iter().map(|t| t.buf).collect();
        let buf = self.g.op("torch", &ins, &sv, elems as u64 * width, false, ws.0, ws.1, 0);
        T { buf, elems, width }
    }

    /// Also keep the last op's own output (ops whose backward reads their result).
    pub fn keep_result(&mut self, y: T) {
        self.save_output(y);
    }

    fn save_output(&mut self, y: T) {
        if let Some(op) = self.g.ops.last_mut().filter(|o| o.tracked) {
            op.saves.push(y.buf);
        }
    }

    fn rg(&self, t: T) -> bool {
        self.g.bufs[t.buf.0].requires_grad
    }

    /// Compute width of matmul/conv outputs.
    pub fn cw(&self) -> u64 {
        if self.amp { 2 } else { 4 }
    }

    /// What a matmul/conv sees of an activation: under autocast a bf16 copy (every use).
    pub fn lower(&mut self, x: T) -> T {
        if self.amp && x.width == 4 { self.op(&[x], &[], x.elems, 2, (0, 0)) } else { x }
    }

    /// What an f32-listed op (norms, softmax) sees: under autocast an f32 copy of a bf16 input.
    pub fn upper(&mut self, x: T) -> T {
        if self.amp && x.width == 2 { self.op(&[x], &[], x.elems, 4, (0, 0)) } else { x }
    }

    /// A parameter as a matmul/conv sees it: under autocast its cached bf16 copy.
    pub fn weight(&mut self, w: T) -> T {
        if !self.amp {
            return w;
        }
        if let Some((_, c)) = self.cache.iter().find(|(b, _)| *b == w.buf) {
            return *c;
        }
        let c = self.op(&[w], &[], w.elems, 2, (0, 0));
        self.cache.push((w.buf, c));
        c
    }

    /// Convolution (any dimension, run by cuDNN): `x` `[n, cin, in_sp]` → `[n, cout, out_sp]`,
    /// kernel volume `k`; keeps both operands.
    #[allow(clippy::too_many_arguments)]
    pub fn conv(&mut self, x: T, n: usize, cin: usize, cout: usize, k: usize, out_sp: usize, w: T, b: Option<T>) -> T {
        let xc = self.lower(x);
        let wc = self.weight(w);
        let mut ins = vec![xc, wc];
        if let Some(b) = b {
            ins.push(self.weight(b));
        }
        let out = self.op(&ins, &[xc, wc], n * cout * out_sp, self.cw(), (0, 0));
        let geom = ConvGeom { n, cin, cout, k, in_sp: x.elems / (n * cin).max(1), out_sp, width: self.cw() };
        self.convs.push((self.g.ops.len() - 1, geom));
        out
    }

    /// `F.linear` on `rows` rows: keeps the input and the weight.
    pub fn linear(&mut self, x: T, rows: usize, dout: usize, w: T, b: Option<T>) -> T {
        self.uses_blas = true;
        let xc = self.lower(x);
        let wc = self.weight(w);
        let mut ins = vec![xc, wc];
        if let Some(b) = b {
            ins.push(self.weight(b));
        }
        self.op(&ins, &[xc, wc], rows * dout, self.cw(), (0, 0))
    }

    /// `bmm`/`matmul`: keeps both operands (each only when the other needs a gradient).
    pub fn matmul(&mut self, a: T, b: T, out_elems: usize) -> T {
        self.uses_blas = true;
        let (ac, bc) = (self.lower(a), self.lower(b));
        let mut saves = Vec::new();
        if self.rg(bc) {
            saves.push(ac);
        }
        if self.rg(ac) {
            saves.push(bc);
        }
        self.op(&[ac, bc], &saves, out_elems, self.cw(), (0, 0))
    }

    /// `relu(x, inplace=True)`: no new tensor; keeps `x`'s storage (its result).
    pub fn relu_(&mut self, x: T) -> T {
        let _ = self.g.op("relu_", &[x.buf], &[x.buf], 0, false, 0, 0, 0);
        x
    }

    /// `relu(x)`: keeps its result.
    pub fn relu(&mut self, x: T) -> T {
        let y = self.op(&[x], &[], x.elems, x.width, (0, 0));
        self.save_output(y);
        y
    }

    /// SiLU / Mish / GELU: keep their input.
    pub fn act_keep_input(&mut self, x: T) -> T {
        self.op(&[x], &[x], x.elems, x.width, (0, 0))
    }

    /// `native_group_norm` / `native_layer_norm` over `stat_rows` groups (f32 under autocast):
    /// keeps its (f32) input and the mean and 1/std.
    pub fn norm(&mut self, x: T, stat_rows: usize, affine: Option<(T, T)>) -> T {
        let xf = self.upper(x);
        let stats = self.op(&[], &[], 2 * stat_rows, 4, (0, 0));
        let mut ins = vec![xf, stats];
        if let Some((w, b)) = affine {
            ins.extend([w, b]);
        }
        self.op(&ins, &[xf, stats], x.elems, xf.width, (0, 0))
    }

    /// torchvision's `FrozenBatchNorm2d`: `x * scale + bias` with f32 buffers (the product keeps
    /// only the `[C]` scale); f32 result under autocast (type promotion).
    pub fn frozen_bn(&mut self, x: T, c: usize) -> T {
        let scale = self.op(&[], &[], c, 4, (0, 0));
        let w = x.width.max(4);
        let y = self.op(&[x, scale], &[scale], x.elems, w, (0, 0));
        self.op(&[y], &[], x.elems, w, (0, 0))
    }

    /// `a + b` (broadcast to `a`'s shape): a new tensor, nothing kept.
    pub fn add(&mut self, a: T, b: T) -> T {
        self.op(&[a, b], &[], a.elems.max(b.elems), a.width.max(b.width), (0, 0))
    }

    /// `a += b`: in place, nothing kept.
    pub fn add_(&mut self, a: T, b: T) -> T {
        let _ = self.g.op("add_", &[a.buf, b.buf], &[], 0, false, 0, 0, 0);
        a
    }

    /// `a * b` (tensors): keeps each operand the other's gradient needs.
    pub fn mul(&mut self, a: T, b: T) -> T {
        let mut saves = Vec::new();
        if self.rg(b) {
            saves.push(a);
        }
        if self.rg(a) {
            saves.push(b);
        }
        self.op(&[a, b], &saves, a.elems.max(b.elems), a.width.max(b.width), (0, 0))
    }

    /// A copy / reshape-copy / scalar op of `elems` elements: nothing kept.
    pub fn copy(&mut self, inputs: &[T], elems: usize, width: u64) -> T {
        self.op(inputs, &[], elems, width, (0, 0))
    }

    /// Softmax (f32 under autocast): keeps its result.
    pub fn softmax(&mut self, x: T) -> T {
        let xf = self.upper(x);
        let y = self.op(&[xf], &[], x.elems, xf.width, (0, 0));
        self.save_output(y);
        y
    }

    /// `native_dropout(p > 0)`: keeps its 1-byte mask; the result is a new tensor.
    pub fn dropout(&mut self, x: T, p: f64) -> T {
        if p <= 0.0 {
            return x;
        }
        let mask = self.input(x.elems, self.mask_width);
        let y = self.op(&[x, mask], &[mask], x.elems, x.width, (0, 0));
        // The mask is made by the op itself: it counts as the op's, not as data.
        self.g.bufs[mask.buf.0].producer = self.g.bufs[y.buf.0].producer;
        y
    }

    /// `max_pool2d`: keeps its input and the int64 indices of its `out_elems` outputs.
    pub fn max_pool(&mut self, x: T, out_elems: usize) -> T {
        let idx = self.input(out_elems, 8);
        let y = self.op(&[x, idx], &[x, idx], out_elems, x.width, (0, 0));
        self.g.bufs[idx.buf.0].producer = self.g.bufs[y.buf.0].producer;
        y
    }

    /// Start a `torch.utils.checkpoint` region.
    pub fn checkpoint_begin(&mut self) {
        self.open = Some(self.g.ops.len());
    }

    pub fn checkpoint_end(&mut self) {
        if let Some(s) = self.open.take() {
            self.segments.push(s..self.g.ops.len());
        }
    }

    /// The allocations and frees of one forward + backward, tensor by tensor; ids from
    /// `first_id` on. Data inputs and parameters are the caller's (never allocated here).
    pub fn replay(&self, first_id: u64) -> TorchReplay {
        let (g, nb, no) = (&self.g, self.g.bufs.len(), self.g.ops.len());
        let internal = |b: Buf| !g.bufs[b.0].param && g.bufs[b.0].producer.is_some() && g.bufs[b.0].bytes > 0;
        let seg_of = |i: usize| self.segments.iter().position(|s| s.contains(&i));
        let mut last_use = vec![None::<usize>; nb];
        for (i, op) in g.ops.iter().enumerate() {
            for b in &op.inputs {
                last_use[b.0] = Some(i);
            }
        }
        // Forward keeps: saves of ops outside regions; a region keeps its inputs from outside.
        let mut keep = vec![None::<usize>; nb];
        let mut seg_keep = vec![None::<usize>; nb];
        let mut saved_any = vec![false; nb];
        for (i, op) in g.ops.iter().enumerate() {
            for b in &op.saves {
                saved_any[b.0] = true;
                match seg_of(i) {
                    None => keep[b.0] = Some(keep[b.0].map_or(i, |k: usize| k.min(i))),
                    Some(_) => seg_keep[b.0] = Some(seg_keep[b.0].map_or(i, |k: usize| k.min(i))),
                }
            }
            if let Some(s) = seg_of(i).map(|s| self.segments[s].clone()) {
                for b in &op.inputs {
                    let from_outside = g.bufs[b.0].producer.is_none_or(|p| !s.contains(&p));
                    if from_outside && op.tracked {
                        keep[b.0] = Some(keep[b.0].map_or(s.start, |k: usize| k.min(s.start)));
                    }
                }
            }
        }
        let saved_all = (0..nb).filter(|&b| saved_any[b] && !g.bufs[b].param).map(|b| g.bufs[b].bytes).sum();
        let mut r = TorchReplay { saved_all, ..Default::default() };
        let mut conv_at = vec![None::<ConvGeom>; no];
        for &(i, geom) in &self.convs {
            conv_at[i] = Some(geom);
        }
        let mut next = first_id;
        let mut live = 0u64;
        let mut ids = vec![None::<u64>; nb];
        let mut alloc = |r: &mut TorchReplay, live: &mut u64, bytes: u64| -> u64 {
            let id = next;
            next += 1;
            r.events.push(Ev::Alloc { id, bytes });
            *live += bytes;
            id
        };
        let free = |r: &mut TorchReplay, live: &mut u64, id: u64, bytes: u64| {
            r.events.push(Ev::Free { id });
            *live -= bytes;
        };
        let mut peak = 0u64;
        // Forward.
        for i in 0..no {
            let op = &g.ops[i];
            let out = op.out;
            // Extra buffers the op makes itself (dropout masks, pool indices).
            let extras: Vec<Buf> = op.inputs.iter().copied().filter(|b| g.bufs[b.0].producer == Some(i) && *b != out && internal(*b)).collect();
            for b in extras.iter().copied().chain(std::iter::once(out).filter(|&o| internal(o))) {
                ids[b.0] = Some(alloc(&mut r, &mut live, g.bufs[b.0].bytes));
            }
            if let Some(geom) = conv_at[i] {
                r.events.push(Ev::Conv { geom, pass: ConvPass::Forward });
            }
            peak = peak.max(live);
            let mut dead: Vec<Buf> = op.inputs.iter().copied().filter(|b| last_use[b.0] == Some(i)).collect();
            if last_use[out.0].is_none() && i + 1 != no {
                dead.push(out);
            }
            for b in dead {
                if keep[b.0].is_none()
                    && let Some(id) = ids[b.0].take()
                {
                    free(&mut r, &mut live, id, g.bufs[b.0].bytes);
                }
            }
        }
        r.forward_peak = peak;
        r.forward_events = r.events.len();
        r.stored = live;
        // Backward.
        let mut grad = vec![None::<u64>; nb];
        let mut pgrad = vec![false; nb];
        let mut bpeak = 0u64;
        for i in (0..no).rev() {
            if let Some(s) = self.segments.iter().find(|s| s.end == i + 1).cloned() {
                // Recompute the region's forward, keeping what its ops save.
                for j in s.clone() {
                    let o = g.ops[j].out;
                    if internal(o) && ids[o.0].is_none() {
                        ids[o.0] = Some(alloc(&mut r, &mut live, g.bufs[o.0].bytes));
                    }
                    if let Some(geom) = conv_at[j] {
                        r.events.push(Ev::Conv { geom, pass: ConvPass::Forward });
                    }
                    bpeak = bpeak.max(live);
                    for b in g.ops[j].inputs.iter().copied().chain(std::iter::once(o)) {
                        let still_used = last_use[b.0].is_some_and(|u| u > j && u < s.end);
                        if internal(b) && seg_keep[b.0].is_none() && keep[b.0].is_none() && !still_used
                            && let Some(id) = ids[b.0].take()
                        {
                            free(&mut r, &mut live, id, g.bufs[b.0].bytes);
                        }
                    }
                }
            }
            let op = &g.ops[i];
            if op.tracked {
                let mut tmp = Vec::new();
                for (slot, b) in op.inputs.iter().enumerate() {
                    let info = &g.bufs[b.0];
                    if !info.requires_grad || info.bytes == 0 {
                        continue;
                    }
                    if info.param {
                        if !pgrad[b.0] {
                            pgrad[b.0] = true;
                            let id = alloc(&mut r, &mut live, info.bytes);
                            r.param_grads.push(id);
                        }
                    } else if grad[b.0].is_none() {
                        grad[b.0] = Some(alloc(&mut r, &mut live, info.bytes));
                    } else {
                        // Accumulation: the sum is a new tensor, then the old one goes.
                        tmp.push(alloc(&mut r, &mut live, info.bytes));
                    }
                    // cuDNN's backward: grad_input is made and computed, then grad_weight.
                    if let Some(geom) = conv_at[i].filter(|_| slot < 2) {
                        let pass = if slot == 0 { ConvPass::BackwardData } else { ConvPass::BackwardFilter };
                        r.events.push(Ev::Conv { geom, pass });
                    }
                }
                bpeak = bpeak.max(live);
                for id in tmp {
                    let bytes = r.events.iter().rev().find_map(|e| match e {
                        Ev::Alloc { id: j, bytes } if *j == id => Some(*bytes),
                        _ => None,
                    });
                    free(&mut r, &mut live, id, bytes.unwrap_or(0));
                }
                if let Some(id) = grad[op.out.0].take() {
                    free(&mut r, &mut live, id, g.bufs[op.out.0].bytes);
                }
            }
            // Saved tensors whose last reader was this op.
            let reads: Vec<Buf> = op.saves.iter().copied().chain(op.inputs.iter().copied()).chain(std::iter::once(op.out)).collect();
            for b in reads {
                let k = if seg_of(i).is_some() { seg_keep[b.0].into_iter().chain(keep[b.0]).min() } else { keep[b.0] };
                if k == Some(i)
                    && let Some(id) = ids[b.0].take()
                {
                    free(&mut r, &mut live, id, g.bufs[b.0].bytes);
                }
            }
        }
        // The loss and anything still held (the loss's own buffer) go with the step.
        for b in 0..nb {
            if let Some(id) = ids[b].take() {
                free(&mut r, &mut live, id, g.bufs[b].bytes);
            }
            if let Some(id) = grad[b].take() {
                free(&mut r, &mut live, id, g.bufs[b].bytes);
            }
        }
        r.backward_peak = bpeak;
        r
    }

    /// f32 bytes of all parameters and of the trainable ones, and each trainable parameter's
    /// bytes (the optimizer's per-tensor state).
    pub fn params(&self) -> (u64, u64, Vec<u64>) {
        let all = self.g.bufs.iter().filter(|b| b.param).map(|b| b.bytes).sum();
        let tr: Vec<u64> = self.g.bufs.iter().filter(|b| b.param && b.requires_grad).map(|b| b.bytes).collect();
        (all, tr.iter().sum(), tr)
    }

    /// Per op, in order: its module, output bytes and the bytes of each tensor it keeps
    /// (parameters included): a readable dump of the graph.
    pub fn op_saves(&self) -> Vec<(String, u64, Vec<u64>)> {
        self.g.ops.iter().map(|o| (o.module.clone(), self.g.bufs[o.out.0].bytes, o.saves.iter().map(|b| self.g.bufs[b.0].bytes).collect())).collect()
    }

    /// Every parameter's bytes (the model's tensors, allocated one by one at `.to(device)`).
    pub fn param_sizes(&self) -> Vec<u64> {
        self.g.bufs.iter().filter(|b| b.param).map(|b| b.bytes).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(r: &TorchReplay) -> (u64, u64) {
        let (mut live, mut peak) = (0i64, 0i64);
        let mut sizes = std::collections::HashMap::new();
        for e in &r.events {
            match *e {
                Ev::Alloc { id, bytes } => {
                    sizes.insert(id, bytes);
                    live += bytes as i64;
                    peak = peak.max(live);
                }
                Ev::Free { id } => live -= sizes[&id] as i64,
                Ev::Conv { .. } => {}
            }
        }
        (live as u64, peak as u64)
    }

    #[test]
    fn relu_keeps_result_linear_keeps_input_and_all_is_freed() {
        let mut t = TorchGraph::new(false);
        let x = t.input(1000, 4);
        let w = t.param(100, true);
        let y = t.linear(x, 10, 10, w, None); // 100 elems: saves x (data)
        let z = t.relu(y); // saves its result (400 bytes)
        let w2 = t.param(100, true);
        let o = t.linear(z, 10, 10, w2, None);
        let _ = t.copy(&[o], 1, 4);
        let r = t.replay(0);
        // Stored: relu's result (also linear 2's input) + the loss scalar; y freed after relu.
        assert_eq!(r.stored, 400 + 4);
        assert_eq!(r.saved_all, 4000 + 400);
        let (end, peak) = bytes_of(&r);
        // Only the two parameter gradients survive the step.
        assert_eq!(end, 800);
        assert!(peak >= 800 + 400);
        assert_eq!(r.param_grads.len(), 2);
    }

    #[test]
    fn convolution_calls_are_marked_where_cudnn_runs_them() {
        let marks = |ckpt: bool| {
            let mut t = TorchGraph::new(false);
            let x = t.input(2 * 3 * 64, 4);
            let w1 = t.param(8 * 3 * 9, true);
            let h = t.conv(x, 2, 3, 8, 9, 16, w1, None);
            if ckpt {
                t.checkpoint_begin();
            }
            let w2 = t.param(8 * 8 * 9, true);
            let y = t.conv(h, 2, 8, 8, 9, 16, w2, None);
            let y = t.act_keep_input(y);
            if ckpt {
                t.checkpoint_end();
            }
            let _ = t.copy(&[y], 1, 4);
            let r = t.replay(0);
            let list: Vec<(usize, usize, ConvPass, bool)> = r.events.iter().enumerate().filter_map(|(k, e)| match e {
                Ev::Conv { geom, pass } => Some((geom.cin, geom.in_sp, *pass, k >= r.forward_events)),
                _ => None,
            }).collect();
            list
        };
        use ConvPass::*;
        // The image needs no gradient: the first convolution has no backward-data call.
        let plain = vec![(3, 64, Forward, false), (8, 16, Forward, false), (8, 16, BackwardData, true), (8, 16, BackwardFilter, true), (3, 64, BackwardFilter, true)];
        assert_eq!(marks(false), plain);
        // Checkpointed: the region's convolution runs forward again in the backward.
        let ck = vec![(3, 64, Forward, false), (8, 16, Forward, false), (8, 16, Forward, true), (8, 16, BackwardData, true), (8, 16, BackwardFilter, true), (3, 64, BackwardFilter, true)];
        assert_eq!(marks(true), ck);
    }

    #[test]
    fn autocast_caches_weight_copies_and_checkpoint_drops_saves() {
        let mut t = TorchGraph::new(true);
        let x = t.input(1000, 4);
        let w = t.param(1000, true);
        let a = t.linear(x, 1, 1000, w, None);
        let b = t.linear(a, 1, 1000, w, None);
        let _ = t.copy(&[b], 1, 4);
        // One bf16 copy of the weight (2000 bytes), x's bf16 copy (2000), a (bf16, 2000).
        let r = t.replay(0);
        assert_eq!(r.saved_all, 2000 + 2000 + 2000);
        let mut c = TorchGraph::new(false);
        let x = c.input(1000, 4);
        let w = c.param(1000, true);
        let y = c.linear(x, 1, 1000, w, None);
        c.checkpoint_begin();
        let h = c.act_keep_input(y);
        let h = c.act_keep_input(h);
        c.checkpoint_end();
        let _ = c.copy(&[h], 1, 4);
        let plain = {
            let mut p = TorchGraph::new(false);
            let x = p.input(1000, 4);
            let w = p.param(1000, true);
            let y = p.linear(x, 1, 1000, w, None);
            let h = p.act_keep_input(y);
            let h = p.act_keep_input(h);
            let _ = p.copy(&[h], 1, 4);
            p.replay(0)
        };
        let ck = c.replay(0);
        // The region keeps only its input y; the plain graph also keeps the first SiLU's output.
        assert_eq!(plain.stored, 4000 + 4000 + 4);
        assert_eq!(ck.stored, 4000 + 4);
        assert_eq!(bytes_of(&ck).0, 4000);
    }
}
