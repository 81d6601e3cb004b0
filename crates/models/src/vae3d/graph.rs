//! The 3D-VAE's training forward as a shape-only [`Graph`] (see [`crate::graph`]): the same
//! layers, stage boundaries and dtypes as [`super::model`], with nothing allocated.

use super::config::{Vae3dConfig, Vae3dLossKind, level_stride};
use crate::graph::{Buf, Graph, dtype_bytes};
use crate::nn::{Precision, group_count};

/// A volume flowing through the graph: `[batch, c, d, h, w]` in the compute dtype.
#[derive(Clone, Copy)]
struct Vol {
    buf: Buf,
    c: usize,
    dhw: [usize; 3],
}

impl Vol {
    fn n(&self) -> usize {
        self.dhw.iter().product()
    }
}

struct Builder<'a> {
    g: Graph,
    b: usize,
    p: Precision,
    w: u64,
    cfg: &'a Vae3dConfig,
}

impl Builder<'_> {
    fn conv(&mut self, x: Vol, cout: usize, k: usize, stride: [usize; 3]) -> Vol {
        let dhw = [0, 1, 2].map(|a| x.dhw[a].div_ceil(stride[a]));
        let buf = self.g.conv3d(x.buf, self.b, x.c, cout, k, x.dhw, stride, true, true, self.p);
        Vol { buf, c: cout, dhw }
    }

    /// GroupNorm, with or without the fused SiLU: flex's kernel keeps the same either way.
    fn norm_with(&mut self, x: Vol) -> Vol {
        let groups = group_count(x.c, 32);
        let affine = (self.g.weight(x.c, true, Precision::F32), self.g.weight(x.c, true, Precision::F32));
        let buf = self.g.group_norm(x.buf, affine, (self.b * groups * 4) as u64);
        Vol { buf, ..x }
    }

    fn norm(&mut self, x: Vol) -> Vol {
        self.norm_with(x)
    }

    /// GroupNorm with the fused SiLU (the model's `forward_act(h, NormAct::Silu)`).
    fn norm_silu(&mut self, x: Vol) -> Vol {
        self.norm_with(x)
    }

    fn add(&mut self, a: Vol, b: Vol) -> Vol {
        Vol { buf: self.g.elementwise(&[a.buf, b.buf], self.g.bytes(b.buf)), ..b }
    }

    fn res(&mut self, x: Vol, cout: usize) -> Vol {
        let h = self.norm_silu(x);
        let h = self.conv(h, cout, 3, [1; 3]);
        let h = self.norm_silu(h);
        let h = self.conv(h, cout, 3, [1; 3]);
        let skip = if x.c != cout { self.conv(x, cout, 1, [1; 3]) } else { x };
        self.add(skip, h)
    }

    fn attn(&mut self, x: Vol) -> Vol {
        let (b, c, n, heads) = (self.b, x.c, x.n(), self.cfg.num_heads);
        let h = self.norm(x);
        let qkv = self.conv(h, 3 * c, 1, [1; 3]);
        let part = (b * c * n) as u64 * self.w;
        let q = self.g.elementwise(&[qkv.buf], part);
        let k = self.g.elementwise(&[qkv.buf], part);
        let v = self.g.elementwise(&[qkv.buf], part);
        let scores = self.g.matmul(q, k, (b * heads * n * n) as u64 * self.w);
        let s32 = self.g.cast(scores, self.w, 4);
        let scaled = self.g.elementwise(&[s32], (b * heads * n * n * 4) as u64);
        let attn = self.g.softmax(scaled);
        let attn = self.g.cast(attn, 4, self.w);
        let out = self.g.matmul(v, attn, part);
        let out = Vol { buf: out, c, dhw: x.dhw };
        let proj = self.conv(out, c, 1, [1; 3]);
        self.add(x, proj)
    }

    fn layers(&mut self, mut h: Vol, blocks: usize, out: usize, attn: bool, resample: Option<[usize; 3]>, up: bool) -> Vol {
        for _ in 0..blocks {
            h = self.res(h, out);
        }
        if attn {
            h = self.attn(h);
        }
        if let Some(s) = resample {
            if up {
                for (axis, &f) in s.iter().enumerate() {
                    if f != 1 {
                        let mut dhw = h.dhw;
                        dhw[axis] *= f;
                        let bytes = (self.b * h.c * dhw.iter().product::<usize>()) as u64 * self.w;
                        // `nn::upsample_linear`: one output per axis, nothing kept for the
                        // backward (linear in its input), no workspace on flex.
                        h = Vol { buf: self.g.opaque(&[h.buf], bytes), c: h.c, dhw };
                    }
                }
                h = self.conv(h, h.c, 3, [1; 3]);
            } else {
                h = self.conv(h, h.c, 3, s);
            }
        }
        h
    }
}

/// The graph of one training micro-batch of `batch` volumes of `grid = [d, h, w]`.
pub fn training_graph(cfg: &Vae3dConfig, batch: usize, grid: [usize; 3], p: Precision) -> Graph {
    let mut bld = Builder { g: Graph::new(), b: batch, p, w: dtype_bytes(p), cfg };
    let base = cfg.base_channels;
    let x = bld.g.input(batch * cfg.in_channels * grid.iter().product::<usize>(), 4);
    let xc = bld.g.cast(x, 4, bld.w);
    let mut h = Vol { buf: xc, c: cfg.in_channels, dhw: grid };
    let mut stage = 0;
    let levels = cfg.encoder_channel_mult.len();
    let mut ch = base;
    for i in 0..levels {
        bld.g.half_state(h.buf, bld.w);
        bld.g.stage(stage, &[h.buf]);
        stage += 1;
        bld.g.module(format!("encoder.down_blocks.{i}"));
        if i == 0 {
            h = bld.conv(h, base, 3, [1; 3]);
        }
        let out = base * cfg.encoder_channel_mult[i];
        let resample = (i + 1 < levels).then(|| level_stride(i));
        h = bld.layers(h, cfg.num_res_blocks, out, cfg.use_attention && i == levels - 1, resample, false);
        ch = out;
    }
    bld.g.half_state(h.buf, bld.w);
    bld.g.stage(stage, &[h.buf]);
    stage += 1;
    bld.g.module("encoder.mid_block+head");
    h = bld.res(h, ch);
    if cfg.use_attention {
        h = bld.attn(h);
    }
    h = bld.res(h, ch);
    h = bld.norm_silu(h);
    h = bld.conv(h, 2 * cfg.latent_dim, 3, [1; 3]);
    let moments = bld.g.cast(h.buf, bld.w, 4);
    let lat = Vol { buf: moments, c: 2 * cfg.latent_dim, dhw: h.dhw };

    bld.g.stage(stage, &[lat.buf]);
    stage += 1;
    bld.g.module("latent");
    // flex's composed split, clamp and sample; on CubeCL one node keeping the moments and `eps`
    // (`nn::lean::posterior_sample`), so the graph is high there by what these keep.
    let half = (batch * cfg.latent_dim * lat.n() * 4) as u64;
    let mean = bld.g.elementwise(&[lat.buf], half);
    let logvar = bld.g.elementwise(&[lat.buf], half);
    let logvar = bld.g.unary_saving(logvar, half); // clamp keeps its input for the mask
    let lv = bld.g.elementwise(&[logvar], half);
    let std = bld.g.unary_saving(lv, half);
    let eps = bld.g.input(batch * cfg.latent_dim * lat.n(), 4);
    let noise = bld.g.mul(std, eps, half);
    let z = bld.g.elementwise(&[mean, noise], half);
    let zc = bld.g.cast(z, 4, bld.w);
    let z = Vol { buf: zc, c: cfg.latent_dim, dhw: lat.dhw };
    let z = bld.conv(z, cfg.latent_dim, 1, [1; 3]);
    let z = bld.conv(z, cfg.latent_dim, 1, [1; 3]);
    let mut ch = cfg.decoder_in_channels();
    h = bld.conv(z, ch, 3, [1; 3]);

    bld.g.half_state(h.buf, bld.w);

    bld.g.stage(stage, &[h.buf, lat.buf]);
    stage += 1;
    bld.g.module("decoder.mid_block");
    h = bld.res(h, ch);
    if cfg.use_attention {
        h = bld.attn(h);
    }
    h = bld.res(h, ch);
    let levels = cfg.decoder_channel_mult.len();
    for j in 0..levels {
        bld.g.half_state(h.buf, bld.w);
        bld.g.stage(stage, &[h.buf, lat.buf]);
        stage += 1;
        bld.g.module(format!("decoder.up_blocks.{j}"));
        let out = base * cfg.decoder_channel_mult[j];
        let resample = (j + 1 < levels).then(|| level_stride(j));
        h = bld.layers(h, cfg.num_res_blocks + 1, out, cfg.use_attention && j == 0, resample, true);
        ch = out;
    }
    let _ = ch;
    bld.g.half_state(h.buf, bld.w);
    bld.g.stage(stage, &[h.buf, lat.buf]);
    bld.g.module("decoder.head+loss");
    h = bld.norm_silu(h);
    h = bld.conv(h, cfg.out_channels, 3, [1; 3]);
    let recon = bld.g.cast(h.buf, bld.w, 4);
    loss(&mut bld.g, cfg, x, recon, mean, logvar, batch * grid.iter().product::<usize>(), half);
    bld.g
}

/// The reconstruction and KL terms in f32 (`Vae3d::compute_loss`), as flex runs them: composed
/// tensor ops. On CubeCL the reference loss is one node (`nn::lean::voxel_loss`) keeping only
/// `x`, `recon`, the moments (which the graph holds anyway) and 32 bytes of statistics: the
/// graph is high there by the differences, squares and weights it keeps below.
#[allow(clippy::too_many_arguments)]
fn loss(g: &mut Graph, cfg: &Vae3dConfig, x: Buf, recon: Buf, mean: Buf, logvar: Buf, voxels: usize, half: u64) {
    let full = g.bytes(recon);
    let one = (voxels * 4) as u64;
    let rl = match cfg.loss {
        Vae3dLossKind::Mse => g.mse(recon, x),
        Vae3dLossKind::Reference => {
            let occ_pred = g.elementwise(&[recon], one);
            let weight = g.input(voxels, 4);
            let d = g.elementwise(&[recon, x], full);
            let sq = g.unary_saving(d, full);
            let mut diff = g.mul(sq, weight, full);
            if cfg.channel_weights.is_some() {
                let cw = g.input(cfg.in_channels, 4);
                diff = g.mul(diff, cw, full);
            }
            let mut l = g.reduce(diff, 4);
            if cfg.false_positive_weight > 0.0 {
                let d = g.elementwise(&[occ_pred], one);
                let r = g.unary_saving(d, one);
                let s = g.unary_saving(r, one);
                let empty = g.input(voxels, 4);
                let fp = g.mul(s, empty, one);
                let fp = g.reduce(fp, 4);
                l = g.elementwise(&[l, fp], 4);
            }
            if cfg.occupancy_mass_weight > 0.0 {
                let r = g.unary_saving(occ_pred, one);
                let m = g.reduce(r, 4);
                l = g.elementwise(&[l, m], 4);
            }
            l
        }
    };
    let sq = g.unary_saving(mean, half);
    let e = g.unary_saving(logvar, half);
    let t = g.elementwise(&[logvar, sq, e], half);
    let kl = g.reduce(t, 4);
    g.elementwise(&[rl, kl], 4);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::CheckpointMode;

    #[test]
    fn stored_bytes_grow_with_batch_and_shrink_with_blocks() {
        let cfg = Vae3dConfig::preset("ultra_lightweight").expect("preset");
        let one = training_graph(&cfg, 1, [8, 32, 32], Precision::F32).simulate(CheckpointMode::Off);
        let two = training_graph(&cfg, 2, [8, 32, 32], Precision::F32).simulate(CheckpointMode::Off);
        assert!(two.stored > one.stored * 19 / 10 && two.stored <= one.stored * 2 + 64);
        let blocks = training_graph(&cfg, 1, [8, 32, 32], Precision::F32).simulate(CheckpointMode::Blocks);
        assert!(blocks.stored < one.stored / 4);
        let half = training_graph(&cfg, 1, [8, 32, 32], Precision::Bf16).simulate(CheckpointMode::Off);
        assert!(half.stored < one.stored);
    }
}
