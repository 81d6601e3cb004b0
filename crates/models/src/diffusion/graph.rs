//! Diffusion Policy's training forward as a shape-only [`Graph`] (see [`crate::graph`]):
//! the RGB encoder (crop, ResNet-18 with GroupNorm, SpatialSoftmax, Linear, ReLU) on every
//! observation frame, the conditioning, the conditional 1-D UNet and the noise MSE, with the
//! stage boundaries of the model's plan (backbone stages, conditioning, each UNet block).

use super::config::{DiffusionConfig, PolicyFeatures};
use crate::graph::{Buf, Graph, Map2d, dtype_bytes};
use crate::resnet::graph::resnet18;
use crate::nn::Precision;

struct Unet<'a> {
    g: &'a mut Graph,
    b: usize,
    p: Precision,
    w: u64,
    k: usize,
    groups: usize,
    cond_dim: usize,
    film_scale: bool,
}

impl Unet<'_> {
    fn conv(&mut self, x: Buf, cin: usize, cout: usize, k: usize, lin: usize, lout: usize) -> Buf {
        self.g.conv(x, self.b, cin, cout, k, lin, lout, true, true, self.p)
    }

    fn block(&mut self, x: Buf, cin: usize, cout: usize, len: usize) -> Buf {
        let h = self.conv(x, cin, cout, self.k, len, len);
        let affine = (self.g.weight(cout, true, Precision::F32), self.g.weight(cout, true, Precision::F32));
        let h = self.g.group_norm(h, affine, (self.b * self.groups * 4) as u64);
        // Two nodes, as flex runs them. On CubeCL they are one (`NormAct::Mish`), which keeps
        // the norm's input and statistics but not the Mish's input: the graph is high there by
        // one `[b, cout, len]` map a block.
        self.g.mish(h, self.w)
    }

    /// `mish_cond`: the FiLM input's Mish, run once for every block (`ConditionalUnet1d::enter`).
    fn res(&mut self, x: Buf, mish_cond: Buf, cin: usize, cout: usize, len: usize) -> Buf {
        let out = self.block(x, cin, cout, len);
        let cc = if self.film_scale { 2 * cout } else { cout };
        let mc = self.g.cast(mish_cond, 4, self.w);
        let emb = self.g.linear(mc, self.b, self.cond_dim, cc, true, true, self.p);
        let n = self.g.bytes(out);
        // FiLM as flex runs it: the composed multiply (keeping `out` and the scale) and add. On
        // CubeCL it is one node (`nn::lean::film`, the linear layer's bias added inside)
        // keeping `out`, `emb` (without the bias) and the bias, without `s`.
        let out = if self.film_scale {
            let scale = self.g.elementwise(&[emb], (self.b * cout) as u64 * self.w);
            let bias = self.g.elementwise(&[emb], (self.b * cout) as u64 * self.w);
            let s = self.g.mul(scale, out, n);
            self.g.elementwise(&[s, bias], n)
        } else {
            self.g.elementwise(&[out, emb], n)
        };
        let out = self.block(out, cout, cout, len);
        let residual = if cin != cout { self.conv(x, cin, cout, 1, len, len) } else { x };
        self.g.elementwise(&[out, residual], n)
    }
}

/// The graph of one training micro-batch; also the batch's bytes and the frozen buffer bytes.
pub fn training_graph(cfg: &DiffusionConfig, batch: usize, p: Precision) -> (Graph, u64, u64) {
    let mut g = Graph::new();
    let (b, w) = (batch, dtype_bytes(p));
    let (obs, horizon, a) = (cfg.n_obs_steps, cfg.horizon, cfg.action_dim());
    let cams = cfg.image_features();
    let image_elems: usize = cams.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    let batch_bytes = (b * obs * (cfg.state_dim() + image_elems) * 4 + 2 * b * horizon * a * 4 + b * horizon) as u64;
    let mut stage = 0;
    let mut frozen = 0;
    let mut feats = Vec::new();
    let trainable_backbone = !cfg.freeze_backbone;
    if let Some((_, shape)) = cams.first() {
        let n = b * obs * cams.len();
        // `Diffusion::encoder_input`: the cameras stacked (one camera: the batch's own
        // tensor), resized to `resize_shape` when set (a new tensor the crop's view keeps
        // alive), then cropped — a zero-copy view on flex, counted here at the crop's size
        // (over by at most the view's size); the backbone runs at the crop's size.
        let [rh, rw] = cfg.encoder_image_size().unwrap_or([shape[1], shape[2]]);
        let [ch, cw] = cfg.backbone_input_size().unwrap_or([rh, rw]);
        let img = g.input(n * shape.iter().product::<usize>(), 4);
        // The resize (`layers::resize_bilinear_antialias`): two matmuls, the first's output
        // `[n·c·H, w]` and its transposed copy around the second.
        let first = (n * shape[0] * shape[1] * rw * 4) as u64;
        let src = if cfg.resize_shape.is_some() { g.op("resize", &[img], &[], (n * shape[0] * rh * rw * 4) as u64, true, 2 * first, 0, 0) } else { img };
        let crop = g.op("crop", &[src], &[], (n * shape[0] * ch * cw * 4) as u64, false, 0, 0, 0);
        let x = Map2d { buf: crop, n, c: shape[0], hw: [ch, cw] };
        let (m, fz) = resnet18(&mut g, &[x], p, trainable_backbone, cfg.use_group_norm, stage, "rgb_encoder.backbone.");
        stage += 5;
        frozen += fz;
        feats.extend(m);
    }
    for m in &feats {
        g.half_state(m.buf, w);
    }
    g.stage(stage, &feats.iter().map(|m| m.buf).collect::<Vec<_>>());
    stage += 1;
    g.module("conditioning");
    let kp = cfg.spatial_softmax_num_keypoints;
    let mut cond_parts = vec![g.input(b * obs * cfg.state_dim(), 4)];
    for m in &feats {
        let hw = m.hw[0] * m.hw[1];
        let f = g.conv(m.buf, m.n, m.c, kp, 1, hw, hw, true, true, p);
        let f = g.cast(f, w, 4);
        let att = g.softmax(f);
        let grid = g.input(hw * 2, 4);
        let xy = g.matmul(att, grid, (m.n * kp * 2 * 4) as u64);
        let xyc = g.cast(xy, 4, w);
        let o = g.linear(xyc, m.n, 2 * kp, 2 * kp, true, true, p);
        let o = g.unary_saving(o, g.bytes(o));
        cond_parts.push(g.cast(o, w, 4));
    }
    let global = g.opaque(&cond_parts, (b * cfg.global_cond_dim() * 4) as u64); // cat
    let e = cfg.diffusion_step_embed_dim;
    let t = g.input(b * e, 4);
    let tc = g.cast(t, 4, w);
    let t1 = g.linear(tc, b, e, 4 * e, true, true, p);
    let t1 = g.mish(t1, w);
    let t2 = g.linear(t1, b, 4 * e, e, true, true, p);
    let t2 = g.cast(t2, w, 4);
    let cond = g.opaque(&[t2, global], (b * cfg.cond_dim() * 4) as u64); // cat
    // Every block's `cond_encoder.0` (Mish) on it, once (`ConditionalUnet1d::enter`); the
    // blocks and the stage boundaries take its output.
    let cond = g.mish(cond, 4);
    let noisy = g.input(b * horizon * a, 4);
    let mut x = g.cast(noisy, 4, w);
    let mut u = Unet { g: &mut g, b, p, w, k: cfg.kernel_size, groups: cfg.n_groups, cond_dim: cfg.cond_dim(), film_scale: cfg.use_film_scale_modulation };
    let dims = &cfg.down_dims;
    let mut len = horizon;
    let mut cin = a;
    let mut skips = Vec::new();
    for (i, &cout) in dims.iter().enumerate() {
        for j in 0..2 {
            u.g.half_state(x, w);
            u.g.stage(stage, &[x, cond]);
            stage += 1;
            u.g.module(format!("unet.down_modules.{i}.{j}"));
            x = u.res(x, cond, if j == 0 { cin } else { cout }, cout, len);
        }
        skips.push((x, cout, len));
        if i + 1 < dims.len() {
            let nl = len.div_ceil(2);
            x = u.conv(x, cout, cout, 3, len, nl);
            len = nl;
        }
        cin = cout;
    }
    let mid = *dims.last().unwrap_or(&a);
    for j in 0..2 {
        u.g.half_state(x, w);
        u.g.stage(stage, &[x, cond]);
        stage += 1;
        u.g.module(format!("unet.mid_modules.{j}"));
        x = u.res(x, cond, mid, mid, len);
    }
    // lerobot's up path: for (dim_in, dim_out) in reversed(in_out[1:]): cat the popped skip
    // (dim_out channels), two residual blocks to dim_in, then a ConvTranspose1d(k=4, s=2) —
    // every level upsamples there (its `is_last` test never holds); the first skip is unused.
    let mut ch = mid;
    for (i, lvl) in (1..dims.len()).rev().enumerate() {
        let (din, dout) = (dims[lvl - 1], dims[lvl]);
        let (skip, _, _) = skips[lvl];
        let cat = u.g.opaque(&[x, skip], u.g.bytes(x) + u.g.bytes(skip));
        x = cat;
        for j in 0..2 {
            u.g.half_state(x, w);
            u.g.stage(stage, &[x, cond]);
            stage += 1;
            u.g.module(format!("unet.up_modules.{i}.{j}"));
            let cin = if j == 0 { ch + dout } else { din };
            x = u.res(x, cond, cin, din, len);
        }
        ch = din;
        let nl = len * 2;
        x = u.g.conv(x, b, ch, ch, 4, len, nl, true, true, p);
        len = nl;
    }
    let _ = cin;
    u.g.half_state(x, w);
    u.g.stage(stage, &[x, cond]);
    u.g.module("unet.final_conv+loss");
    let first = dims[0];
    x = u.block(x, ch, first, len);
    x = u.conv(x, first, a, 1, len, len);
    let pred = u.g.cast(x, w, 4);
    let target = u.g.input(b * horizon * a, 4);
    u.g.mse(pred, target);
    (g, batch_bytes, frozen)
}
