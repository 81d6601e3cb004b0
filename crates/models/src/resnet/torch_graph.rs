//! torchvision's ResNet-18 trunk as PyTorch runs it, on [`TorchGraph`] (see
//! [`crate::graph::torch`]): for the ACT and Diffusion PyTorch-target builders.

use crate::graph::torch::{T, TorchGraph};

/// A feature map `[n, c, h, w]`.
#[derive(Clone, Copy, Debug)]
pub struct Map {
    pub t: T,
    pub n: usize,
    pub c: usize,
    pub hw: [usize; 2],
}

/// torchvision's ResNet-18 through `layer4` on `x`: conv → norm → `ReLU(inplace=True)`,
/// max-pool, BasicBlocks with `out += identity` in place. `group_norm`: Diffusion Policy's
/// GroupNorm(C/16) (trainable) in place of `FrozenBatchNorm2d`.
pub fn resnet18(tg: &mut TorchGraph, x: Map, trainable: bool, group_norm: bool, prefix: &str) -> Map {
    let conv = |tg: &mut TorchGraph, x: Map, cout: usize, k: usize, stride: usize| {
        let pad = k / 2;
        let hw = [0, 1].map(|a| (x.hw[a] + 2 * pad - k) / stride + 1);
        let w = tg.param(cout * x.c * k * k, trainable);
        let t = tg.conv(x.t, x.n, x.c, cout, k * k, hw[0] * hw[1], w, None);
        Map { t, n: x.n, c: cout, hw }
    };
    let norm = |tg: &mut TorchGraph, x: Map| {
        let t = if group_norm {
            let affine = (tg.param(x.c, trainable), tg.param(x.c, trainable));
            tg.norm(x.t, x.n * (x.c / 16), Some(affine))
        } else {
            tg.frozen_bn(x.t, x.c)
        };
        Map { t, ..x }
    };
    tg.module(format!("{prefix}stem"));
    let mut h = conv(tg, x, 64, 7, 2);
    h = norm(tg, h);
    h.t = tg.relu_(h.t);
    let hw = [0, 1].map(|a| (h.hw[a] + 2 - 3) / 2 + 1);
    let t = tg.max_pool(h.t, h.n * h.c * hw[0] * hw[1]);
    h = Map { t, hw, ..h };
    for (layer, cout) in [64usize, 128, 256, 512].into_iter().enumerate() {
        tg.module(format!("{prefix}layer{}", layer + 1));
        for block in 0..2 {
            let stride = if layer > 0 && block == 0 { 2 } else { 1 };
            let x = h;
            let mut o = conv(tg, x, cout, 3, stride);
            o = norm(tg, o);
            o.t = tg.relu_(o.t);
            o = conv(tg, o, cout, 3, 1);
            o = norm(tg, o);
            let skip = if stride != 1 || x.c != cout {
                let s = conv(tg, x, cout, 1, stride);
                norm(tg, s)
            } else {
                x
            };
            o.t = tg.add_(o.t, skip.t);
            o.t = tg.relu_(o.t);
            h = o;
        }
    }
    h
}

