//! Diffusion Policy's training forward as lerobot 0.4.4 runs it in PyTorch, on [`TorchGraph`]
//! (see [`crate::graph::torch`]): the stacked camera images, random crop (a view), ResNet-18
//! with GroupNorm, SpatialSoftmax, the timestep MLP, the conditional 1-D UNet (Conv1d →
//! GroupNorm → Mish blocks, FiLM) and the noise MSE.

use super::config::{DiffusionConfig, PolicyFeatures};
use crate::graph::torch::{T, TorchGraph, TorchOpts};
use crate::resnet::torch_graph::{Map, resnet18};

struct Unet<'a> {
    tg: &'a mut TorchGraph,
    b: usize,
    k: usize,
    groups: usize,
    cond_dim: usize,
    film: bool,
}

impl Unet<'_> {
    fn conv(&mut self, x: T, cin: usize, cout: usize, k: usize, lout: usize) -> T {
        let w = self.tg.param(cout * cin * k, true);
        let bias = self.tg.param(cout, true);
        self.tg.conv(x, self.b, cin, cout, k, lout, w, Some(bias))
    }

    /// Conv1d → GroupNorm → Mish.
    fn block(&mut self, x: T, cin: usize, cout: usize, len: usize) -> T {
        let h = self.conv(x, cin, cout, self.k, len);
        let affine = (self.tg.param(cout, true), self.tg.param(cout, true));
        let h = self.tg.norm(h, self.b * self.groups, Some(affine));
        self.tg.act_keep_input(h)
    }

    fn res(&mut self, x: T, cond: T, cin: usize, cout: usize, len: usize) -> T {
        let out = self.block(x, cin, cout, len);
        let m = self.tg.act_keep_input(cond);
        let cc = if self.film { 2 * cout } else { cout };
        let w = self.tg.param(self.cond_dim * cc, true);
        let bias = self.tg.param(cc, true);
        let emb = self.tg.linear(m, self.b, cc, w, Some(bias));
        let out = if self.film {
            let s = self.tg.mul(emb, out);
            self.tg.add(s, emb)
        } else {
            self.tg.add(out, emb)
        };
        let out = self.block(out, cout, cout, len);
        let residual = if cin != cout { self.conv(x, cin, cout, 1, len) } else { x };
        self.tg.add(out, residual)
    }
}

/// PyTorch's training graph of `cfg` at `batch` (see [`TorchOpts`]). Returns the graph and the batch's bytes.
pub fn torch_training_graph(cfg: &DiffusionConfig, batch: usize, o: &TorchOpts) -> (TorchGraph, u64) {
    let mut tg = TorchGraph::new(o.amp);
    tg.mask_width = if o.cuda { 1 } else { 4 };
    let b = batch;
    let (obs, horizon, a) = (cfg.n_obs_steps, cfg.horizon, cfg.action_dim());
    let cams = cfg.image_features();
    let image_elems: usize = cams.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    let batch_bytes = (b * obs * (cfg.state_dim() + image_elems) * 4 + b * horizon * a * 4 + b * horizon) as u64;
    let mut cond_parts = vec![tg.input(b * obs * cfg.state_dim(), 4)];
    let trainable = !cfg.freeze_backbone;
    if let Some((_, shape)) = cams.first() {
        tg.module("rgb_encoder");
        let n = b * obs * cams.len();
        // torch.stack of the cameras: a copy of the images; the random crop is a view of it,
        // whose storage the first convolution keeps (measured on CPU).
        let raw = tg.input(n * shape.iter().product::<usize>(), 4);
        let stacked = tg.copy(&[raw], raw.elems, 4);
        let [ch, cw] = cfg.backbone_input_size().unwrap_or([shape[1], shape[2]]);
        let x = Map { t: stacked, n, c: shape[0], hw: [ch, cw] };
        let m = resnet18(&mut tg, x, trainable, cfg.use_group_norm, "rgb_encoder.backbone.");
        let kp = cfg.spatial_softmax_num_keypoints;
        let hw = m.hw[0] * m.hw[1];
        let (w, bias) = (tg.param(kp * m.c, true), tg.param(kp, true));
        let f = tg.conv(m.t, n, m.c, kp, 1, hw, w, Some(bias));
        let att = tg.softmax(f);
        let grid = tg.input(hw * 2, 4);
        let xy = tg.matmul(att, grid, n * kp * 2);
        let (w, bias) = (tg.param(4 * kp * kp, true), tg.param(2 * kp, true));
        let o = tg.linear(xy, n, 2 * kp, w, Some(bias));
        cond_parts.push(tg.relu(o));
    }
    tg.module("unet");
    let width = cond_parts.iter().map(|t| t.width).max().unwrap_or(4);
    let global = tg.copy(&cond_parts, b * cfg.global_cond_dim(), width);
    let e = cfg.diffusion_step_embed_dim;
    let t = tg.input(b * e, 4);
    let (w1, b1) = (tg.param(e * 4 * e, true), tg.param(4 * e, true));
    let t1 = tg.linear(t, b, 4 * e, w1, Some(b1));
    let t1 = tg.act_keep_input(t1);
    let (w2, b2) = (tg.param(4 * e * e, true), tg.param(e, true));
    let t2 = tg.linear(t1, b, e, w2, Some(b2));
    let cond = tg.copy(&[t2, global], b * cfg.cond_dim(), t2.width.max(global.width));
    let noisy = tg.input(b * horizon * a, 4);
    let mut u = Unet { tg: &mut tg, b, k: cfg.kernel_size, groups: cfg.n_groups, cond_dim: cfg.cond_dim(), film: cfg.use_film_scale_modulation };
    let dims = &cfg.down_dims;
    let (mut len, mut cin, mut x) = (horizon, a, noisy);
    let mut skips = Vec::new();
    for (i, &cout) in dims.iter().enumerate() {
        x = u.res(x, cond, cin, cout, len);
        x = u.res(x, cond, cout, cout, len);
        skips.push(x);
        if i + 1 < dims.len() {
            len = len.div_ceil(2);
            x = u.conv(x, cout, cout, 3, len);
        }
        cin = cout;
    }
    let mid = *dims.last().unwrap_or(&a);
    for _ in 0..2 {
        x = u.res(x, cond, mid, mid, len);
    }
    let mut ch = mid;
    for lvl in (1..dims.len()).rev() {
        let (din, dout) = (dims[lvl - 1], dims[lvl]);
        let skip = skips[lvl];
        let w = x.width.max(skip.width);
        x = u.tg.copy(&[x, skip], x.elems + skip.elems, w);
        x = u.res(x, cond, ch + dout, din, len);
        x = u.res(x, cond, din, din, len);
        ch = din;
        len *= 2;
        x = u.conv(x, ch, ch, 4, len);
    }
    let first = dims[0];
    x = u.block(x, ch, first, len);
    x = u.conv(x, first, a, 1, len);
    // F.mse_loss(reduction="none") keeps both operands; then the mean.
    let target = tg.input(b * horizon * a, 4);
    let sq = tg.op(&[x, target], &[x, target], b * horizon * a, 4, (0, 0));
    let _ = tg.copy(&[sq], 1, 4);
    (tg, batch_bytes)
}
