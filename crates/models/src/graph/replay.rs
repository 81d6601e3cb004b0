//! Replaying a [`Graph`]: plain autodiff, block recomputation over the stage plan and Burn's
//! balanced checkpointing ([`Graph::simulate`]), op by op, forward then backward, tracking
//! live tensors, saved tensors, gradients and workspaces; and the per-module rows of what
//! autodiff keeps ([`Graph::module_rows`]).

use super::{ActivationPeaks, Buf, CheckpointMode, Graph, ModuleRow};

impl Graph {
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

    /// What plain autodiff holds at the end of the forward, per stage of the model's plan, in
    /// stage order: the saved tensors (and the forward's final output) the ops of each stage
    /// produced, each counted once. Their sum is [`ActivationPeaks::stored`] of
    /// `simulate(CheckpointMode::Off)`; data, parameters and the tensors a builder declares with
    /// [`Graph::input`] (the caller's) are not counted. The drift tests compare these with the
    /// bytes each stage of the real forward still holds when the backward begins.
    pub fn stored_by_stage(&self) -> Vec<(usize, u64)> {
        let mut held = vec![false; self.bufs.len()];
        for op in self.ops.iter().filter(|o| o.tracked) {
            for b in &op.saves {
                held[b.0] = true;
            }
        }
        if let Some(last) = self.ops.last() {
            held[last.out.0] = true;
        }
        let mut rows: Vec<(usize, u64)> = Vec::new();
        for op in &self.ops {
            if rows.last().is_none_or(|r| r.0 != op.stage) {
                rows.push((op.stage, 0));
            }
        }
        for (i, b) in self.bufs.iter().enumerate() {
            let Some(p) = b.producer.filter(|_| held[i] && !b.param) else { continue };
            if let Some(r) = rows.iter_mut().find(|r| r.0 == self.ops[p].stage) {
                r.1 += b.bytes;
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
                self.replay_range_full(&kept, &recomputed, &self.balanced_backups(), 0..self.ops.len(), 0, 0, 0, &mut peaks);
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
                // vramlab's lean ops hold their saves in their own state: never recomputed.
                if op.direct {
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
                        Some(p) if self.recomputable(p) => {
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

    /// Whether balanced checkpointing recomputes op `p`'s output instead of keeping it: a
    /// recorded memory-bound op all of whose inputs are tracked (burn-autodiff 0.21's
    /// `BalancedCheckpointing::checkpoint_parents` makes an op with an untracked input
    /// compute-bound).
    fn recomputable(&self, p: usize) -> bool {
        let op = &self.ops[p];
        !op.compute_bound && op.tracked && op.inputs.iter().all(|b| self.bufs[b.0].requires_grad)
    }

    /// Balanced checkpointing's backups, per buffer: every recomputable op registers its
    /// inputs with the checkpointer (`checkpoint_parents`, `ActionType::Backup`), and a
    /// compute-bound input is registered as a clone of the tensor itself. The checkpointer is
    /// built (and the backups no backward needs are dropped) only when the backward starts, so
    /// each such input stays allocated to the end of the forward, whether a backward reads it
    /// or not.
    fn balanced_backups(&self) -> Vec<bool> {
        let mut held = vec![false; self.bufs.len()];
        for (i, op) in self.ops.iter().enumerate() {
            if !self.recomputable(i) {
                continue;
            }
            for b in &op.inputs {
                let info = &self.bufs[b.0];
                if !info.param && info.producer.is_some_and(|q| !self.recomputable(q)) {
                    held[b.0] = true;
                }
            }
        }
        held
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
        self.replay_range_full(saved, recomputed, &[], range, base, upstream, grads_before, peaks)
    }

    /// [`Self::replay_range_with`] with `backup[b]`: buffer b is held from its op to the end
    /// of the forward (balanced checkpointing's backups, see [`Self::balanced_backups`]).
    #[allow(clippy::too_many_arguments)]
    fn replay_range_full(&self, saved: &[Vec<Buf>], recomputed: &[u64], backup: &[bool], range: std::ops::Range<usize>, base: u64, upstream: u64, grads_before: u64, peaks: &mut ActivationPeaks) {
        let nb = self.bufs.len();
        let backup = |b: Buf| backup.get(b.0).copied().unwrap_or(false);
        let inside = |b: Buf| !self.bufs[b.0].param && self.bufs[b.0].producer.is_some_and(|p| range.contains(&p));
        let mut last_use = vec![None::<usize>; nb];
        for i in range.clone() {
            for b in &self.ops[i].inputs {
                last_use[b.0] = Some(i);
            }
        }
        // The backward's order (Burn's tape: deepest first, see `backward_order`) and each
        // op's place in it.
        let order = self.backward_order(range.clone());
        let mut place = vec![usize::MAX; self.ops.len()];
        for (k, &i) in order.iter().enumerate() {
            place[i] = k;
        }
        // The last op whose backward reads the buffer: it is freed after that backward.
        let mut keep_until = vec![None::<usize>; nb];
        for i in range.clone() {
            for b in &saved[i] {
                if inside(*b) {
                    keep_until[b.0] = Some(keep_until[b.0].map_or(i, |k: usize| if place[i] == usize::MAX || (place[k] != usize::MAX && place[k] >= place[i]) { k } else { i }));
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
            let kept = keep_until[op.out.0].is_some() || last_use[op.out.0].is_some() || i == last_op || backup(op.out);
            if kept {
                live[op.out.0] = true;
                live_bytes += out;
            }
            for b in &op.inputs {
                if inside(*b) && live[b.0] && last_use[b.0] == Some(i) && keep_until[b.0].is_none() && !backup(*b) {
                    live[b.0] = false;
                    live_bytes -= self.bufs[b.0].bytes;
                }
            }
        }
        if fwd_peak > peaks.forward_peak {
            (peaks.forward_peak, peaks.forward_peak_module) = (fwd_peak, fwd_module);
        }
        peaks.forward_end = base + live_bytes;
        // The backward starts by building the checkpointer: backups no backward reads go.
        for (b, l) in live.iter_mut().enumerate() {
            if *l && backup(Buf(b)) && keep_until[b].is_none() && b != self.ops[last_op].out.0 {
                *l = false;
                live_bytes -= self.bufs[b].bytes;
            }
        }
        peaks.stored = live_bytes;
        // Backward, last op first: each op's output gradient is consumed, its inputs'
        // gradients appear (or are summed into existing ones), its parameter gradients stay.
        let mut grad = vec![0u64; nb];
        let mut grad_bytes = upstream;
        grad[self.ops[last_op].out.0] = upstream;
        let mut pgrads = grads_before;
        let mut has_grad = vec![false; nb];
        for &i in &order {
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
            // A parameter used by several ops (a backbone run per camera) gets one gradient: the
            // later ones are summed into it (a transient, counted above).
            if self.fresh_param_grad(op, &mut has_grad) {
                pgrads += op.param_grad;
            }
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
            if self.fresh_param_grad(op, &mut has_grad) {
                pgrads += c.f32_bytes;
            }
        }
    }

    /// Whether `op`'s backward makes a parameter gradient that does not exist yet (marking its
    /// trainable parameter inputs in `has_grad`): false when every one already has one.
    fn fresh_param_grad(&self, op: &super::Op, has_grad: &mut [bool]) -> bool {
        let mut fresh = false;
        let mut any = false;
        for b in op.inputs.iter().filter(|b| self.bufs[b.0].param && self.bufs[b.0].requires_grad) {
            any = true;
            fresh |= !has_grad[b.0];
            has_grad[b.0] = true;
        }
        fresh || !any
    }

    /// The order in which Burn runs the backward steps of the tracked ops of `range`: by depth
    /// (`Node::order`, one more than the deepest input's; data and parameters are 0), deepest
    /// first, steps of equal depth in the tape's visit order ([`Self::burn_visit_order`]).
    /// Independent branches thus interleave by depth: ACT's short VAE-encoder branch runs its
    /// backward before the deep backbone's, not after it as the reversed program order would.
    fn backward_order(&self, range: std::ops::Range<usize>) -> Vec<usize> {
        let mut depth = vec![0usize; self.ops.len()];
        for i in range.clone() {
            depth[i] = 1 + self.ops[i].inputs.iter().filter_map(|b| self.bufs[b.0].producer).filter(|p| range.contains(p)).map(|p| depth[p]).max().unwrap_or(0);
        }
        let mut order = self.burn_visit_order(range);
        // A stable sort keeps the visit order among equal depths.
        order.sort_by_key(|&i| std::cmp::Reverse(depth[i]));
        order
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
        let mut has_grad = vec![false; self.bufs.len()];
        for (k, &s) in stages.iter().enumerate().rev() {
            let upstream = stages.get(k + 1).map_or(0, |&t| boundary(t));
            let mut sub = empty_peaks();
            self.replay_range(&saved, range_of(s), kept[k], upstream, pgrads, &mut sub);
            let recompute_peak = sub.forward_peak + upstream + pgrads;
            // The trainer back-propagates `Σ sum(f32(t) · f32(grad_t))` over the stage's output
            // tensors (`StateGrads::dot`): each half-precision output and its gradient are cast
            // to f32 (flex's cast: an f64 buffer, then the f32 result), the product overwrites
            // the output's f32 copy, and the f32 gradient stays saved by the product. The
            // peak is the last cast: the recomputed stage (`forward_end`), the gradients not
            // yet cast, every f32 gradient copy, and the f64 buffer and f32 copy of the largest
            // output. (The backward of the sum gives the same bytes back: an f32 gradient, an
            // f64 buffer and the gradient in the compute dtype.)
            let half: Vec<(u64, u64)> = stages.get(k + 1).map_or(Vec::new(), |&t| {
                let inputs = inputs_of(t);
                self.half_states.iter().filter(|(b, _)| inputs.contains(&b.0) && range_of(s).contains(&self.bufs[b.0].producer.unwrap_or(usize::MAX))).map(|&(b, w)| (self.bufs[b.0].bytes, w)).collect()
            });
            let surrogate_peak = match half.iter().map(|&(n, w)| n / w).max() {
                Some(largest) => sub.forward_end + pgrads + upstream - half.iter().map(|h| h.0).sum::<u64>().min(upstream) + half.iter().map(|&(n, w)| n / w * 4).sum::<u64>() + 12 * largest,
                None => 0,
            };
            let recompute_peak = recompute_peak.max(surrogate_peak);
            let (top, module, grads) = if sub.backward_peak >= recompute_peak {
                (sub.backward_peak, sub.backward_peak_module, sub.grads_at_backward_peak)
            } else {
                (recompute_peak, sub.forward_peak_module, pgrads)
            };
            if top > peaks.backward_peak {
                (peaks.backward_peak, peaks.backward_peak_module, peaks.grads_at_backward_peak) = (top, module, grads);
            }
            // The stage's f32 parameter gradients join the trainer's accumulator: those its ops
            // produce directly (f32), and in half precision those its weights' casts produce.
            pgrads += self.ops[range_of(s)].iter().filter(|o| o.tracked).filter(|o| self.fresh_param_grad(o, &mut has_grad)).map(|o| o.param_grad + o.param_cast.map_or(0, |c| c.f32_bytes)).sum::<u64>();
        }
        peaks
    }
}

fn empty_peaks() -> ActivationPeaks {
    ActivationPeaks { forward_peak: 0, forward_end: 0, backward_peak: 0, stored: 0, grads_at_backward_peak: 0, backward_peak_module: String::new(), forward_peak_module: String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::Precision;

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
    fn balanced_holds_compute_bound_inputs_of_memory_bound_ops_until_the_backward() {
        // Two 1×1 convolutions of a data input (4000 B outputs, no workspace) summed, then a
        // reduction. Plain autodiff keeps neither conv output (the convs keep only their data
        // input, the add nothing): the forward ends holding the loss scalar. Balanced
        // checkpointing registers both as backups of the (recomputable) add, held to the end
        // of the forward and dropped when the backward starts.
        let mut g = Graph::new();
        let x = g.input(1000, 4);
        let y = g.conv(x, 1, 10, 10, 1, 100, 100, false, true, Precision::F32);
        let z = g.conv(x, 1, 10, 10, 1, 100, 100, false, true, Precision::F32);
        let s = g.elementwise(&[y, z], 4000);
        let _ = g.reduce(s, 4);
        let plain = g.simulate(CheckpointMode::Off);
        let balanced = g.simulate(CheckpointMode::Balanced);
        assert_eq!(plain.forward_end, 4);
        assert_eq!(balanced.forward_end, 4000 + 4000 + 4);
        assert_eq!(balanced.stored, 4);
        assert_eq!(balanced.forward_peak, plain.forward_peak + 4);
    }

    #[test]
    fn backward_runs_deepest_first() {
        // A deep branch (conv, two SiLUs) built before a shallow one (a linear); Burn's tape
        // runs the SiLUs (depths 3, 2) before the depth-1 steps, the linear's included,
        // although the linear comes later in the program.
        let mut g = Graph::new();
        let a = g.input(1000, 4);
        let c = g.conv(a, 1, 10, 10, 1, 100, 100, false, true, Precision::F32);
        let s1 = g.silu(c, 4);
        let s2 = g.silu(s1, 4);
        let b = g.input(1000, 4);
        let l = g.linear(b, 100, 10, 10, false, true, Precision::F32);
        let sum = g.elementwise(&[s2, l], 4000);
        let _ = g.reduce(sum, 4);
        assert_eq!(g.backward_order(0..g.ops.len()), vec![5, 4, 2, 1, 3, 0]);
    }

    #[test]
    fn shared_parameters_count_once() {
        // The same convolution applied to two inputs (a backbone run per camera).
        let mut g = Graph::new();
        let (a, b) = (g.input(1000, 4), g.input(1000, 4));
        g.record_params();
        let y = g.conv(a, 1, 10, 10, 1, 100, 100, false, true, Precision::F32);
        g.reuse_params();
        let z = g.conv(b, 1, 10, 10, 1, 100, 100, false, true, Precision::F32);
        g.end_params();
        let s = g.elementwise(&[y, z], 4000);
        let _ = g.reduce(s, 4);
        assert_eq!(g.param_bytes(), (400, 400));
        // One 400 B gradient at the end of the backward, not two.
        let mut seen = vec![false; g.bufs.len()];
        let fresh: Vec<bool> = [1, 0].iter().map(|&i| g.fresh_param_grad(&g.ops[i].clone(), &mut seen)).collect();
        assert_eq!(fresh, vec![true, false]);
    }

    #[test]
    fn blocks_cast_half_precision_stage_outputs_for_the_surrogate() {
        // Two stages in bf16; the first's output declared half precision: the trainer's
        // `Σ sum(f32(t) · f32(grad))` casts it (and its gradient) to f32 through f64 buffers,
        // which raises the backward's peak.
        let build = |declare: bool| {
            let mut g = Graph::new();
            let x = g.input(100_000, 2);
            g.stage(0, &[x]);
            let y = g.conv(x, 1, 10, 10, 1, 10_000, 10_000, false, true, Precision::Bf16);
            if declare {
                g.half_state(y, 2);
            }
            g.stage(1, &[y]);
            let _ = g.reduce(y, 4);
            g.simulate(CheckpointMode::Blocks).backward_peak
        };
        // 100 000 elements: the f32 gradient and output copies (4 B each) and the f64 buffer
        // (8 B), on top of the recomputed output: at least 1.6 MB, which nothing else reaches.
        let (with, without) = (build(true), build(false));
        assert!(without < 1_600_000 && with >= 1_600_000, "{with} vs {without}");
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
        // Per stage: each conv keeps its input (x is data: not counted) and each SiLU its
        // input; stage 1 also holds the loss scalar.
        assert_eq!(g.stored_by_stage(), vec![(0, 4000 + 4000), (1, 4000 + 4)]);
        assert_eq!(g.stored_by_stage().iter().map(|r| r.1).sum::<u64>(), plain.stored);
    }
}
