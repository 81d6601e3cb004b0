//! ACT's training forward as a shape-only [`Graph`] (see [`crate::graph`]): VAE encoder,
//! ResNet-18 backbone, transformer encoder and decoder, action head and loss, with the stage
//! boundaries of [`super::model::ActStage`]. The residual stream is f32 (LayerNorm outputs);
//! projections run in the compute dtype; attention scores and softmax in f32; dropout keeps
//! its 1-byte mask.

use super::config::{ActConfig, PolicyFeatures};
use crate::graph::{Buf, Graph, Map2d, dtype_bytes};
use crate::resnet::graph::resnet18;
use crate::nn::Precision;

struct Tx<'a> {
    g: &'a mut Graph,
    cfg: &'a ActConfig,
    b: usize,
    p: Precision,
    w: u64,
}

impl Tx<'_> {
    fn dropout(&mut self, x: Buf) -> Buf {
        if self.cfg.dropout <= 0.0 {
            return x;
        }
        // x is f32 at every dropout site. The drop mask is a 1-byte bool tensor made on the
        // host; `mask_fill` keeps it for the backward, the scaling keeps nothing. (flex: on
        // wgpu/cuda one kernel draws the mask on the device and nothing is kept, so there the
        // estimate is above the run by the masks still alive at the peak.)
        let n = self.g.bytes(x);
        let mask = self.g.input((n / 4) as usize, 1);
        let y = self.g.op("mask_fill", &[x, mask], &[mask], n, true, 0, 0, 0);
        self.g.elementwise(&[y], n)
    }

    /// A linear layer on `rows` rows of `din`.
    fn linear(&mut self, x: Buf, rows: usize, din: usize, dout: usize) -> Buf {
        let xc = self.g.cast(x, 4, self.w);
        let y = self.g.linear(xc, rows, din, dout, true, true, self.p);
        self.g.cast(y, self.w, 4)
    }

    fn layer_norm(&mut self, x: Buf, rows: usize) -> Buf {
        let d = self.cfg.dim_model;
        let affine = (self.g.weight(d, true, Precision::F32), self.g.weight(d, true, Precision::F32));
        self.g.norm(x, 4, Some(affine), (rows * 4) as u64, false)
    }

    /// `nn.MultiheadAttention` with `l` queries over `s` keys (rows are `b·l`).
    fn attention(&mut self, q_in: Buf, k_in: Buf, v_in: Buf, l: usize, s: usize) -> Buf {
        let (b, d, h, w) = (self.b, self.cfg.dim_model, self.cfg.n_heads, self.w);
        // in_proj weight/bias are one [3d, d] parameter narrowed three ways.
        let q = self.linear_part(q_in, b * l, d);
        let k = self.linear_part(k_in, b * s, d);
        let v = self.linear_part(v_in, b * s, d);
        let qh = self.g.elementwise(&[q], (b * l * d) as u64 * w); // heads + scale
        let kh = self.g.elementwise(&[k], (b * s * d) as u64 * w);
        let vh = self.g.elementwise(&[v], (b * s * d) as u64 * w);
        let scores = self.g.matmul(qh, kh, (b * h * l * s) as u64 * w);
        let scores = self.g.cast(scores, w, 4);
        let attn = self.g.softmax(scores);
        // One autodiff node from the projections to here (`nn::lean::attention`): the weights
        // after dropout are transient (the backward redraws the flags; no mask is kept), and the
        // product keeps only `v`.
        let n = self.g.bytes(attn);
        let dropped = if self.cfg.dropout > 0.0 { self.g.opaque(&[attn], n) } else { attn };
        let dropped = self.g.cast(dropped, 4, w);
        let bwd_ws = n + self.g.bytes(dropped) + self.g.bytes(vh);
        let out = self.g.op("matmul", &[dropped, vh], &[vh], (b * h * l * d / h) as u64 * w, true, 0, bwd_ws, 0);
        let out = self.g.elementwise(&[out], (b * l * d) as u64 * w); // swap + reshape copy
        let out = self.g.linear(out, b * l, d, d, true, true, self.p);
        self.g.cast(out, w, 4)
    }

    fn linear_part(&mut self, x: Buf, rows: usize, d: usize) -> Buf {
        let xc = self.g.cast(x, 4, self.w);
        self.g.linear(xc, rows, d, d, true, true, self.p)
    }

    fn ffn(&mut self, x: Buf, rows: usize) -> Buf {
        let (d, f) = (self.cfg.dim_model, self.cfg.dim_feedforward);
        let h = self.linear(x, rows, d, f);
        let h = self.g.unary_saving(h, self.g.bytes(h)); // gelu keeps its input, the lean relu its output: the same bytes
        let h = self.dropout(h);
        self.linear(h, rows, f, d)
    }

    /// Post-norm encoder layer (lerobot's default `pre_norm=False`) on `[b, s, d]`.
    fn encoder_layer(&mut self, x: Buf, pos: Option<Buf>, s: usize) -> Buf {
        let n = self.g.bytes(x);
        let qk = match pos {
            Some(p) => self.g.elementwise(&[x, p], n),
            None => x,
        };
        let a = self.attention(qk, qk, x, s, s);
        let a = self.dropout(a);
        let x = self.g.elementwise(&[x, a], n);
        let x = self.layer_norm(x, self.b * s);
        let f = self.ffn(x, self.b * s);
        let f = self.dropout(f);
        let x = self.g.elementwise(&[x, f], n);
        self.layer_norm(x, self.b * s)
    }

    fn decoder_layer(&mut self, x: Buf, qpos: Buf, memory: Buf, mpos: Buf, l: usize, s: usize) -> Buf {
        let n = self.g.bytes(x);
        let q = self.g.elementwise(&[x, qpos], n);
        let a = self.attention(q, q, x, l, l);
        let a = self.dropout(a);
        let x = self.g.elementwise(&[x, a], n);
        let x = self.layer_norm(x, self.b * l);
        let q = self.g.elementwise(&[x, qpos], n);
        let k = self.g.elementwise(&[memory, mpos], self.g.bytes(memory));
        let a = self.attention(q, k, memory, l, s);
        let a = self.dropout(a);
        let x = self.g.elementwise(&[x, a], n);
        let x = self.layer_norm(x, self.b * l);
        let f = self.ffn(x, self.b * l);
        let f = self.dropout(f);
        let x = self.g.elementwise(&[x, f], n);
        self.layer_norm(x, self.b * l)
    }
}

/// The graph of one training micro-batch; also the batch's bytes and the frozen buffer bytes.
pub fn training_graph(cfg: &ActConfig, batch: usize, p: Precision) -> (Graph, u64, u64) {
    let mut g = Graph::new();
    let (b, d, chunk) = (batch, cfg.dim_model, cfg.chunk_size);
    let w = dtype_bytes(p);
    let state_dim = cfg.robot_state_dim().unwrap_or(0);
    let action_dim = cfg.action_dim();
    let cams = cfg.image_features();
    let image_elems: usize = cams.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    let batch_bytes = (b * (state_dim + chunk * action_dim + image_elems) * 4 + b * chunk) as u64;
    let state = g.input(b * state_dim, 4);
    let actions = g.input(b * chunk * action_dim, 4);
    let mut stage = 0;
    let mut tx = Tx { g: &mut g, cfg, b, p, w };
    let mut posterior = None;
    if cfg.use_vae {
        tx.g.stage(stage, &[]);
        stage += 1;
        tx.g.module("vae_encoder.input");
        let s = 2 + chunk;
        let cls = tx.g.weight(d, true, Precision::F32);
        let cls = tx.g.elementwise(&[cls], (b * d * 4) as u64);
        let st = if state_dim > 0 { Some(tx.linear(state, b, state_dim, d)) } else { None };
        let act = tx.linear(actions, b * chunk, action_dim, d);
        let mut parts = vec![cls, act];
        parts.extend(st);
        let mut x = tx.g.opaque(&parts, (b * s * d * 4) as u64); // cat
        let pos = tx.g.input(s * d, 4);
        for i in 0..cfg.n_vae_encoder_layers {
            tx.g.stage(stage, &[x]);
            stage += 1;
            tx.g.module(format!("vae_encoder.layers.{i}"));
            x = tx.encoder_layer(x, Some(pos), s);
        }
        tx.g.stage(stage, &[x]);
        stage += 1;
        tx.g.module("vae_encoder.posterior");
        let cls_out = tx.g.elementwise(&[x], (b * d * 4) as u64);
        let lat = tx.linear(cls_out, b, d, 2 * cfg.latent_dim);
        posterior = Some(lat);
    }
    // Backbone over all cameras at once; frozen backbone on data keeps nothing.
    let mut frozen = 0;
    let mut maps = Vec::new();
    let trainable_backbone = !cfg.freeze_backbone;
    // The model runs the backbone on each camera in turn (stage by stage), casting its
    // weights anew each time: one trunk per camera, on the same parameters.
    if !cams.is_empty() {
        let xs: Vec<Map2d> = cams.iter().map(|(_, shape)| Map2d { buf: tx.g.input(b * shape.iter().product::<usize>(), 4), n: b, c: shape[0], hw: [shape[1], shape[2]] }).collect();
        let (m, fz) = resnet18(tx.g, &xs, p, trainable_backbone, false, stage, "backbone.");
        frozen += fz;
        maps = m;
    }
    if !cams.is_empty() {
        stage += 5;
    }
    for m in &maps {
        tx.g.half_state(m.buf, w);
    }
    tx.g.stage(stage, &maps.iter().map(|m| m.buf).chain(posterior).collect::<Vec<_>>());
    stage += 1;
    tx.g.module("encoder.input");
    let mut tokens = 1 + usize::from(state_dim > 0);
    let mut parts = Vec::new();
    if let Some(lat) = posterior {
        let half = (b * cfg.latent_dim * 4) as u64;
        let mu = tx.g.elementwise(&[lat], half);
        let ls = tx.g.elementwise(&[lat], half);
        let sd = tx.g.unary_saving(ls, half);
        let eps = tx.g.input(b * cfg.latent_dim, 4);
        let z = tx.g.mul(sd, eps, half);
        let z = tx.g.elementwise(&[mu, z], half);
        parts.push(tx.linear(z, b, cfg.latent_dim, d));
    }
    if state_dim > 0 {
        parts.push(tx.linear(state, b, state_dim, d));
    }
    // One input projection for every camera (its weight cast per camera).
    for (k, m) in maps.iter().enumerate() {
        if k == 0 { tx.g.record_params() } else { tx.g.reuse_params() }
        let hw = m.hw[0] * m.hw[1];
        let proj = tx.g.conv(m.buf, m.n, m.c, d, 1, hw, hw, true, true, p);
        parts.push(tx.g.cast(proj, w, 4));
        tokens += m.n / b * hw;
    }
    tx.g.end_params();
    let mut x = tx.g.opaque(&parts, (b * tokens * d * 4) as u64); // cat
    let pos_w = tx.g.weight(2 * d, true, Precision::F32);
    let pos = tx.g.elementwise(&[pos_w], (tokens * d * 4) as u64);
    for i in 0..cfg.n_encoder_layers {
        tx.g.stage(stage, &[x, pos]);
        stage += 1;
        tx.g.module(format!("encoder.layers.{i}"));
        x = tx.encoder_layer(x, Some(pos), tokens);
    }
    tx.g.stage(stage, &[x, pos]);
    stage += 1;
    tx.g.module("decoder.input");
    let memory = x;
    let qpos_w = tx.g.weight(chunk * d, true, Precision::F32);
    let qpos = tx.g.elementwise(&[qpos_w], (b * chunk * d * 4) as u64);
    let mut q = tx.g.input(b * chunk * d, 4);
    for i in 0..cfg.n_decoder_layers {
        tx.g.stage(stage, &[q, memory, pos]);
        stage += 1;
        tx.g.module(format!("decoder.layers.{i}"));
        q = tx.decoder_layer(q, qpos, memory, pos, chunk, tokens);
    }
    tx.g.stage(stage, &[q]);
    tx.g.module("action_head+loss");
    let q = tx.layer_norm(q, b * chunk);
    let out = tx.linear(q, b * chunk, d, action_dim);
    let n = (b * chunk * action_dim * 4) as u64;
    let diff = tx.g.elementwise(&[actions, out], n);
    let err = tx.g.unary_saving(diff, n);
    let pad = tx.g.input(b * chunk * action_dim, 4);
    let err = tx.g.mul(err, pad, n);
    let mut loss = tx.g.reduce(err, 4);
    if let Some(lat) = posterior {
        let half = (b * cfg.latent_dim * 4) as u64;
        let mu = tx.g.elementwise(&[lat], half);
        let ls = tx.g.elementwise(&[lat], half);
        let sq = tx.g.unary_saving(mu, half);
        let e = tx.g.unary_saving(ls, half);
        let t = tx.g.elementwise(&[ls, sq, e], half);
        let kl = tx.g.reduce(t, 4);
        loss = tx.g.elementwise(&[loss, kl], 4);
    }
    let _ = loss;
    (g, batch_bytes, frozen)
}
