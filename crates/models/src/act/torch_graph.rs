//! ACT's training forward as lerobot 0.4.4 runs it in PyTorch, on [`TorchGraph`] (see
//! [`crate::graph::torch`]): `ACT.forward` with the VAE encoder, one ResNet-18 pass per camera
//! (cameras may differ in size), `nn.MultiheadAttention` with `need_weights=True` (explicit
//! scores, softmax, dropout on the probabilities), post-norm layers, L1 + KL loss. Layout is
//! sequence-first `[s, b, d]`, as lerobot's.

use super::config::{ActConfig, PolicyFeatures};
use crate::graph::torch::{T, TorchGraph, TorchOpts};
use crate::resnet::torch_graph::{Map, resnet18};

struct Tx<'a> {
    tg: &'a mut TorchGraph,
    cfg: &'a ActConfig,
    b: usize,
}

impl Tx<'_> {
    fn lin(&mut self, x: T, rows: usize, din: usize, dout: usize) -> T {
        let w = self.tg.param(din * dout, true);
        let b = self.tg.param(dout, true);
        self.tg.linear(x, rows, dout, w, Some(b))
    }

    fn ln(&mut self, x: T, rows: usize) -> T {
        let d = self.cfg.dim_model;
        let affine = (self.tg.param(d, true), self.tg.param(d, true));
        self.tg.norm(x, rows, Some(affine))
    }

    /// `F.multi_head_attention_forward` in training with `need_weights=True`: `l` queries over
    /// `s` keys; q, k, v from three slices of `in_proj_weight` (q is k, v differs).
    fn mha(&mut self, q_in: T, k_in: T, v_in: T, l: usize, s: usize) -> T {
        let (b, d, h, p) = (self.b, self.cfg.dim_model, self.cfg.n_heads, self.cfg.dropout);
        let q = self.lin(q_in, l * b, d, d);
        let k = self.lin(k_in, s * b, d, d);
        let v = self.lin(v_in, s * b, d, d);
        let qs = self.tg.copy(&[q], l * b * d, q.width); // q * head_dim^-0.5
        let scores = self.tg.matmul(qs, k, b * h * l * s);
        let attn = self.tg.softmax(scores);
        let attn = self.tg.dropout(attn, p);
        let out = self.tg.matmul(attn, v, b * h * l * (d / h));
        // The averaged weights are returned and dropped by lerobot (`[0]`).
        let _ = self.tg.copy(&[attn], b * l * s, attn.width);
        let out = self.tg.copy(&[out], l * b * d, out.width); // transpose(0, 1).contiguous()
        self.lin(out, l * b, d, d)
    }

    fn ffn(&mut self, x: T, rows: usize) -> T {
        let (d, f, p) = (self.cfg.dim_model, self.cfg.dim_feedforward, self.cfg.dropout);
        let h = self.lin(x, rows, d, f);
        let h = self.tg.relu(h); // lerobot's default activation; GELU would keep its input (same bytes)
        let h = self.tg.dropout(h, p);
        self.lin(h, rows, f, d)
    }

    fn residual(&mut self, skip: T, y: T, rows: usize) -> T {
        let y = self.tg.dropout(y, self.cfg.dropout);
        let x = self.tg.add(skip, y);
        self.ln(x, rows)
    }

    /// Post-norm encoder layer on `[s, b, d]` with positions `pos` (added to q and k).
    fn encoder_layer(&mut self, x: T, pos: T, s: usize) -> T {
        let rows = s * self.b;
        let qk = self.tg.add(x, pos);
        let a = self.mha(qk, qk, x, s, s);
        let x = self.residual(x, a, rows);
        let f = self.ffn(x, rows);
        self.residual(x, f, rows)
    }

    fn decoder_layer(&mut self, x: T, qpos: T, memory: T, mpos: T, l: usize, s: usize) -> T {
        let rows = l * self.b;
        let q = self.tg.add(x, qpos);
        let a = self.mha(q, q, x, l, l);
        let x = self.residual(x, a, rows);
        let q = self.tg.add(x, qpos);
        let k = self.tg.add(memory, mpos);
        let a = self.mha(q, k, memory, l, s);
        let x = self.residual(x, a, rows);
        let f = self.ffn(x, rows);
        self.residual(x, f, rows)
    }
}

/// PyTorch's training graph of `cfg` at `batch` (see [`TorchOpts`]). Returns the graph and the batch's bytes.
pub fn torch_training_graph(cfg: &ActConfig, batch: usize, o: &TorchOpts) -> (TorchGraph, u64) {
    let mut tg = TorchGraph::new(o.amp);
    tg.mask_width = if o.cuda { 1 } else { 4 };
    let (b, d, chunk) = (batch, cfg.dim_model, cfg.chunk_size);
    let state_dim = cfg.robot_state_dim().unwrap_or(0);
    let a = cfg.action_dim();
    let cams = cfg.image_features();
    let image_elems: usize = cams.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    let batch_bytes = (b * (state_dim + chunk * a + image_elems) * 4 + b * chunk) as u64;
    let state = tg.input(b * state_dim, 4);
    let actions = tg.input(b * chunk * a, 4);
    let mut tx = Tx { tg: &mut tg, cfg, b };
    let mut latent = None;
    if cfg.use_vae {
        tx.tg.module("vae_encoder");
        let s = 2 + chunk;
        let cls = tx.tg.param(d, true);
        let mut parts = vec![cls];
        if state_dim > 0 {
            parts.push(tx.lin(state, b, state_dim, d));
        }
        parts.push(tx.lin(actions, b * chunk, a, d));
        let w = parts.iter().map(|t| t.width).max().unwrap_or(4);
        let mut x = tx.tg.copy(&parts, s * b * d, w); // cat + permute
        let pos = tx.tg.input(s * d, 4);
        for _ in 0..cfg.n_vae_encoder_layers {
            x = tx.encoder_layer(x, pos, s);
        }
        let cls_out = tx.tg.copy(&[x], b * d, x.width);
        let params = tx.lin(cls_out, b, d, 2 * cfg.latent_dim);
        let half = b * cfg.latent_dim;
        let e = tx.tg.copy(&[params], half, params.width); // (log σ² / 2).exp()
        let e = tx.tg.act_keep_input(e);
        let noise = tx.tg.input(half, 4);
        let z = tx.tg.mul(e, noise);
        latent = Some((tx.tg.add(params, z), params));
    }
    let mut tokens = vec![];
    let mut n_tokens = 1 + usize::from(state_dim > 0);
    if let Some((z, _)) = latent {
        tokens.push(tx.lin(z, b, cfg.latent_dim, d));
    } else {
        tokens.push(tx.tg.input(b * d, 4));
    }
    if state_dim > 0 {
        tokens.push(tx.lin(state, b, state_dim, d));
    }
    // One backbone (shared weights) run per camera, as lerobot's loop does.
    let trainable = !cfg.freeze_backbone;
    let mut shared: Option<Vec<T>> = None;
    for (i, (_, shape)) in cams.iter().enumerate() {
        let img = tx.tg.input(b * shape.iter().product::<usize>(), 4);
        let x = Map { t: img, n: b, c: shape[0], hw: [shape[1], shape[2]] };
        // The backbone and the input projection are shared by the cameras: the first camera's
        // parameters are used again by the others.
        tx.tg.share_params(shared.clone());
        let m = resnet18(tx.tg, x, trainable, false, &format!("backbone[cam{i}]."));
        tx.tg.module("encoder_img_feat_input_proj");
        let hw = m.hw[0] * m.hw[1];
        let w = tx.tg.param(d * m.c, true);
        let bias = tx.tg.param(d, true);
        let proj = tx.tg.conv(m.t, b, m.c, d, 1, hw, w, Some(bias));
        let used = tx.tg.share_params(None);
        shared.get_or_insert(used);
        tokens.push(proj);
        n_tokens += hw;
    }
    tx.tg.module("encoder");
    // torch.stack of the token list (autocast promotes to f32).
    let mut x = tx.tg.copy(&tokens, n_tokens * b * d, 4);
    let pos_w = tx.tg.param(2 * d, true);
    let pos = tx.tg.copy(&[pos_w], n_tokens * d, 4);
    for _ in 0..cfg.n_encoder_layers {
        x = tx.encoder_layer(x, pos, n_tokens);
    }
    if cfg.pre_norm {
        x = tx.ln(x, n_tokens * b);
    }
    tx.tg.module("decoder");
    let memory = x;
    let qpos = tx.tg.param(chunk * d, true);
    let mut q = tx.tg.input(chunk * b * d, 4);
    for _ in 0..cfg.n_decoder_layers {
        q = tx.decoder_layer(q, qpos, memory, pos, chunk, n_tokens);
    }
    q = tx.ln(q, chunk * b);
    tx.tg.module("action_head+loss");
    let q = tx.tg.copy(&[q], chunk * b * d, q.width); // transpose(0, 1)
    let pred = tx.lin(q, chunk * b, d, a);
    let n = b * chunk * a;
    let l1 = tx.tg.op(&[pred, actions], &[pred, actions], n, 4, (0, 0)); // l1_loss(reduction="none") keeps both
    let pad = tx.tg.input(b * chunk, 1);
    let l1 = tx.tg.mul(l1, pad);
    let mut loss = tx.tg.copy(&[l1], 1, 4);
    if let Some((_, params)) = latent {
        let half = b * cfg.latent_dim;
        let mu2 = tx.tg.act_keep_input(params); // mu.pow(2)
        let e = tx.tg.act_keep_input(params); // log σ².exp()
        let kl = tx.tg.copy(&[mu2, e], half, 4);
        loss = tx.tg.add(loss, kl);
    }
    let _ = tx.tg.copy(&[loss], 1, 4);
    (tg, batch_bytes)
}
