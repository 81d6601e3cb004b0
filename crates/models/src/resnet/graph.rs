//! torchvision's ResNet-18 trunk as a shape-only [`Graph`] (see [`crate::graph`]): the same
//! layers, norms and dtypes as [`super::ResNet`] runs them, for the ACT and Diffusion graph
//! builders.

use crate::graph::{Graph, Map2d, dtype_bytes};
use crate::nn::Precision;

/// torchvision's ResNet-18 trunk (through `layer4`), as [`crate::resnet`] runs it: norms in
/// f32 returned in the compute dtype, ReLU saving its input, max-pool keeping its indices.
/// `group_norm`: Diffusion Policy's GroupNorm(C/16) (trainable) instead of the frozen
/// batch norm. `xs`: one input per camera the model runs the trunk on in turn, stage by stage
/// (ACT), each with its own weight casts, all on the same parameters. Stage boundaries (stem,
/// layer1..4) start at `first_stage`. Returns the maps and the bytes of frozen buffers
/// (batch-norm statistics) that are not graph weights.
pub fn resnet18(g: &mut Graph, xs: &[Map2d], p: Precision, trainable: bool, group_norm: bool, first_stage: usize, prefix: &str) -> (Vec<Map2d>, u64) {
    let w = dtype_bytes(p);
    let mut frozen = 0u64;
    let conv = |g: &mut Graph, x: Map2d, cout: usize, k: usize, stride: usize| {
        let pad = k / 2;
        let hw = [0, 1].map(|a| (x.hw[a] + 2 * pad - k) / stride + 1);
        let buf = g.conv(x.buf, x.n, x.c, cout, k * k, x.hw[0] * x.hw[1], hw[0] * hw[1], false, trainable, p);
        Map2d { buf, n: x.n, c: cout, hw }
    };
    let norm = |g: &mut Graph, x: Map2d, frozen: &mut u64| {
        let elems = x.n * x.c * x.hw[0] * x.hw[1];
        let buf = if group_norm {
            let affine = (g.weight(x.c, trainable, Precision::F32), g.weight(x.c, trainable, Precision::F32));
            g.group_norm(x.buf, affine, (x.n * (x.c / 16) * 4) as u64)
        } else {
            // FrozenBatchNorm2d: weight, bias, running mean and var (none trainable).
            *frozen += 4 * 4 * x.c as u64;
            // `nn::lean::channel_affine` with a constant scale and shift: one node keeping
            // only the scale (a data-sized constant here), on the f32 view.
            let xf = g.cast(x.buf, w, 4);
            let y = g.opaque(&[xf], (elems * 4) as u64);
            g.cast(y, 4, w)
        };
        Map2d { buf, ..x }
    };
    // `nn::lean::relu` keeps its output, which the next convolution or pool keeps anyway.
    let relu = |g: &mut Graph, x: Map2d| Map2d { buf: g.opaque(&[x.buf], g.bytes(x.buf)), ..x };
    // Per stage, each camera in turn; the first records the stage's parameters, the others
    // reuse them (frozen buffers counted once).
    let each = |g: &mut Graph, k: usize| if k == 0 { g.record_params() } else { g.reuse_params() };
    g.stage(first_stage, &xs.iter().map(|x| x.buf).collect::<Vec<_>>());
    g.module(format!("{prefix}stem"));
    let mut hs = Vec::with_capacity(xs.len());
    for (k, x) in xs.iter().enumerate() {
        each(g, k);
        let mut fz = 0;
        let xc = g.cast(x.buf, 4, w);
        let mut h = conv(g, Map2d { buf: xc, ..*x }, 64, 7, 2);
        h = norm(g, h, &mut fz);
        h = relu(g, h);
        let hw = [0, 1].map(|a| (h.hw[a] + 2 - 3) / 2 + 1);
        let out = (h.n * h.c * hw[0] * hw[1]) as u64;
        // Burn's `max_pool2d_with_indices` keeps its input (checkpointed) and the argmax
        // indices (i64 on flex, one per output element) for the backward.
        let indices = g.op("max_pool indices", &[], &[], out * 8, true, 0, 0, 0);
        let pooled = g.op("max_pool", &[h.buf, indices], &[h.buf, indices], out * w, true, 0, out * 8, 0);
        hs.push(Map2d { buf: pooled, hw, ..h });
        frozen += if k == 0 { fz } else { 0 };
    }
    g.end_params();
    for (layer, cout) in [64usize, 128, 256, 512].into_iter().enumerate() {
        for h in &hs {
            g.half_state(h.buf, w);
        }
        g.stage(first_stage + 1 + layer, &hs.iter().map(|h| h.buf).collect::<Vec<_>>());
        g.module(format!("{prefix}layer{}", layer + 1));
        for (k, h) in hs.iter_mut().enumerate() {
            each(g, k);
            let mut fz = 0;
            for block in 0..2 {
                let stride = if layer > 0 && block == 0 { 2 } else { 1 };
                let x = *h;
                let mut o = conv(g, x, cout, 3, stride);
                o = norm(g, o, &mut fz);
                o = relu(g, o);
                o = conv(g, o, cout, 3, 1);
                o = norm(g, o, &mut fz);
                let skip = if stride != 1 || x.c != cout {
                    let s = conv(g, x, cout, 1, stride);
                    norm(g, s, &mut fz)
                } else {
                    x
                };
                let sum = g.elementwise(&[o.buf, skip.buf], g.bytes(o.buf));
                *h = relu(g, Map2d { buf: sum, ..o });
            }
            frozen += if k == 0 { fz } else { 0 };
        }
        g.end_params();
    }
    (hs, frozen)
}
