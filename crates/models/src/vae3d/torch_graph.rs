//! The 4D-Radar 3D-VAE's training forward as its PyTorch reference runs it, on
//! [`TorchGraph`] (see [`crate::graph::torch`]): `GroupNorm32` (f32, cast back to the input's
//! dtype) → SiLU → Conv3d residual blocks, each a `torch.utils.checkpoint` region when
//! `use_checkpoint`, strided-conv downsampling, trilinear upsampling, the reparameterisation
//! and the weighted reconstruction + KL loss in f32.

use super::config::{Vae3dConfig, level_stride};
use crate::graph::torch::{T, TorchGraph, TorchOpts};
use crate::nn::group_count;

struct B<'a> {
    tg: TorchGraph,
    b: usize,
    cfg: &'a Vae3dConfig,
    ckpt: bool,
}

#[derive(Clone, Copy)]
struct Vol {
    t: T,
    c: usize,
    dhw: [usize; 3],
}

impl B<'_> {
    fn conv(&mut self, x: Vol, cout: usize, k: usize, stride: [usize; 3]) -> Vol {
        let dhw = [0, 1, 2].map(|a| x.dhw[a].div_ceil(stride[a]));
        let n: usize = dhw.iter().product();
        let w = self.tg.param(cout * x.c * k * k * k, true);
        let bias = self.tg.param(cout, true);
        let t = self.tg.conv(x.t, self.b, x.c, cout, k * k * k, n, w, Some(bias));
        Vol { t, c: cout, dhw }
    }

    /// `GroupNorm32(x.float()).type(x.dtype)`, then SiLU when `silu`.
    fn norm(&mut self, x: Vol, silu: bool) -> Vol {
        let affine = (self.tg.param(x.c, true), self.tg.param(x.c, true));
        let xf = self.tg.upper(x.t);
        let y = self.tg.norm(xf, self.b * group_count(x.c, 32), Some(affine));
        let y = if x.t.width != y.width { self.tg.copy(&[y], y.elems, x.t.width) } else { y };
        let y = if silu { self.tg.act_keep_input(y) } else { y };
        Vol { t: y, ..x }
    }

    fn res(&mut self, x: Vol, cout: usize) -> Vol {
        if self.ckpt {
            self.tg.checkpoint_begin();
        }
        let h = self.norm(x, true);
        let h = self.conv(h, cout, 3, [1; 3]);
        let h = self.norm(h, true);
        let h = self.conv(h, cout, 3, [1; 3]);
        let skip = if x.c != cout { self.conv(x, cout, 1, [1; 3]) } else { x };
        let t = self.tg.add(skip.t, h.t);
        if self.ckpt {
            self.tg.checkpoint_end();
        }
        Vol { t, ..h }
    }

    fn attn(&mut self, x: Vol) -> Vol {
        // F.scaled_dot_product_attention (memory-efficient kernel on CUDA): keeps q, k, v,
        // the output and the per-row log-sum-exp.
        let n: usize = x.dhw.iter().product();
        let h = self.norm(x, false);
        let qkv = self.conv(h, 3 * x.c, 1, [1; 3]);
        let lse = self.tg.op(&[], &[], self.b * self.cfg.num_heads * n, 4, (0, 0));
        let out = self.tg.op(&[qkv.t, lse], &[qkv.t, lse], self.b * x.c * n, qkv.t.width, (0, 0));
        let out = Vol { t: out, ..x };
        let p = self.conv(out, x.c, 1, [1; 3]);
        Vol { t: self.tg.add(x.t, p.t), ..x }
    }
}

/// PyTorch's training graph of `cfg` at `batch` volumes of `grid` (autocast bf16 when `amp`;
/// `use_checkpoint` per residual block when `ckpt`). Returns the graph and the batch's bytes.
pub fn torch_training_graph(cfg: &Vae3dConfig, batch: usize, grid: [usize; 3], o: &TorchOpts) -> (TorchGraph, u64) {
    let voxels = batch * grid.iter().product::<usize>();
    let mut b = B { tg: TorchGraph::new(o.amp), b: batch, cfg, ckpt: o.checkpoint };
    let x = b.tg.input(voxels * cfg.in_channels, 4);
    let base = cfg.base_channels;
    b.tg.module("encoder");
    let mut h = b.conv(Vol { t: x, c: cfg.in_channels, dhw: grid }, base, 3, [1; 3]);
    let levels = cfg.encoder_channel_mult.len();
    for i in 0..levels {
        let out = base * cfg.encoder_channel_mult[i];
        for _ in 0..cfg.num_res_blocks {
            h = b.res(h, out);
        }
        if cfg.use_attention && i + 1 == levels {
            h = b.attn(h);
        }
        if i + 1 < levels {
            h = b.conv(h, h.c, 3, level_stride(i));
        }
    }
    let ch = h.c;
    h = b.res(h, ch);
    if cfg.use_attention {
        h = b.attn(h);
    }
    h = b.res(h, ch);
    h = b.norm(h, true);
    h = b.conv(h, 2 * cfg.latent_dim, 3, [1; 3]);
    b.tg.module("latent");
    let lat_n: usize = h.dhw.iter().product();
    let half = batch * cfg.latent_dim * lat_n;
    let moments = if h.t.width == 4 { h.t } else { b.tg.copy(&[h.t], h.t.elems, 4) };
    let logvar = b.tg.op(&[moments], &[moments], half, 4, (0, 0)); // clamp keeps its input
    let lv2 = b.tg.copy(&[logvar], half, 4);
    let std = b.tg.op(&[lv2], &[], half, 4, (0, 0));
    b.tg.keep_result(std); // exp keeps its result
    let eps = b.tg.input(half, 4);
    let noise = b.tg.mul(std, eps);
    let z = b.tg.add(moments, noise);
    let z = Vol { t: z, c: cfg.latent_dim, dhw: h.dhw };
    let z = b.conv(z, cfg.latent_dim, 1, [1; 3]);
    let z = b.conv(z, cfg.latent_dim, 1, [1; 3]);
    b.tg.module("decoder");
    let mut h = b.conv(z, base * cfg.decoder_channel_mult[0], 3, [1; 3]);
    let ch = h.c;
    h = b.res(h, ch);
    if cfg.use_attention {
        h = b.attn(h);
    }
    h = b.res(h, ch);
    let levels = cfg.decoder_channel_mult.len();
    for j in 0..levels {
        let out = base * cfg.decoder_channel_mult[j];
        for _ in 0..cfg.num_res_blocks + 1 {
            h = b.res(h, out);
        }
        if cfg.use_attention && j == 0 {
            h = b.attn(h);
        }
        if j + 1 < levels {
            let s = level_stride(j);
            let dhw = [0, 1, 2].map(|a| h.dhw[a] * s[a]);
            let up = b.tg.copy(&[h.t], batch * h.c * dhw.iter().product::<usize>(), h.t.width);
            h = Vol { t: up, dhw, ..h };
            h = b.conv(h, h.c, 3, [1; 3]);
        }
    }
    h = b.norm(h, true);
    h = b.conv(h, cfg.out_channels, 3, [1; 3]);
    b.tg.module("loss");
    let recon = if h.t.width == 4 { h.t } else { b.tg.copy(&[h.t], h.t.elems, 4) };
    // (recon - x).square() * spatial [* channel weights]: square keeps the difference, the
    // products keep the other (constant) operand.
    let full = recon.elems;
    let d = b.tg.copy(&[recon, x], full, 4);
    let sq = b.tg.act_keep_input(d);
    let spatial = b.tg.input(voxels, 4);
    let mut diff = b.tg.mul(sq, spatial);
    if cfg.channel_weights.is_some() {
        let cw = b.tg.input(cfg.in_channels, 4);
        diff = b.tg.mul(diff, cw);
    }
    let mut loss = b.tg.copy(&[diff], 1, 4);
    if cfg.false_positive_weight > 0.0 || cfg.occupancy_mass_weight > 0.0 {
        let occ = b.tg.copy(&[recon], voxels, 4); // recon[:, :1] (a view: modelled as its own)
        if cfg.false_positive_weight > 0.0 {
            let r = b.tg.copy(&[occ, x], voxels, 4);
            let r = b.tg.relu(r);
            let s = b.tg.act_keep_input(r);
            let empty = b.tg.input(voxels, 4);
            let fp = b.tg.mul(s, empty);
            let fp = b.tg.copy(&[fp], 1, 4);
            loss = b.tg.add(loss, fp);
        }
        if cfg.occupancy_mass_weight > 0.0 {
            let r = b.tg.relu(occ);
            let m = b.tg.copy(&[r], 1, 4);
            loss = b.tg.add(loss, m);
        }
    }
    let m2 = b.tg.act_keep_input(moments);
    let e = b.tg.op(&[logvar], &[], half, 4, (0, 0));
    b.tg.keep_result(e);
    let kl = b.tg.copy(&[m2, e, logvar], 1, 4);
    let _ = b.tg.add(loss, kl);
    (b.tg, (voxels * cfg.in_channels * 4 + half * 4) as u64)
}
