//! Flex's 1-D convolution as one GEMM over the whole batch: `conv1d` (forward),
//! `conv1d_weight_backward`, `conv1d_x_backward` (col2im), and `handles` (which cases).
//!
//! Flex runs a convolution as one GEMM per sample: `[cout, cin·k] × [cin·k, length]`. For
//! Diffusion Policy's UNet (up to 2048 channels, lengths 16 → 4) that re-reads a weight of up
//! to 84 MB for every sample to multiply it with 4–16 columns, and the GEMM's narrow-matrix
//! kernels run far below peak. Here the batch is folded into the columns (`[cin·k, batch·length]`,
//! a few MB at these sizes), so each weight is read once per convolution; the three products
//! (forward, weight gradient, input gradient) are single GEMMs, the input gradient scattered
//! back from columns (col2im). f32 only, ungrouped; other cases go to Burn's convolution.

use burn::backend::Flex;
use burn::tensor::DType;
use burn::tensor::ops::{ConvOptions, FloatTensorOps};
use rayon::prelude::*;

use super::{T, f32_data, matmul, tensor};

/// Whether the GEMM path handles this convolution.
pub fn handles(x: &T, w: &T, o: &ConvOptions<1>) -> bool {
    o.groups == 1 && x.dtype() == DType::F32 && w.dtype() == DType::F32
}

/// Geometry of one 1-D convolution.
#[derive(Clone, Copy)]
struct Geo {
    batch: usize,
    cin: usize,
    cout: usize,
    len: usize,
    k: usize,
    out_len: usize,
    stride: usize,
    pad: usize,
    dil: usize,
}

impl Geo {
    fn new(x: &T, w: &T, o: &ConvOptions<1>) -> Self {
        let (xs, ws) = (x.layout().shape(), w.layout().shape());
        let (batch, cin, len) = (xs[0], xs[1], xs[2]);
        let (cout, k) = (ws[0], ws[2]);
        let (stride, pad, dil) = (o.stride[0], o.padding[0], o.dilation[0]);
        let out_len = (len + 2 * pad - dil * (k - 1) - 1) / stride + 1;
        Self { batch, cin, cout, len, k, out_len, stride, pad, dil }
    }

    /// Input position of output position `l`, kernel tap `kk` (None: in the padding).
    #[inline]
    fn pos(&self, l: usize, kk: usize) -> Option<usize> {
        (l * self.stride + kk * self.dil).checked_sub(self.pad).filter(|&p| p < self.len)
    }

    fn cols(&self) -> usize {
        self.batch * self.out_len
    }
}

/// `[cin·k, batch·out_len]` columns of `x: [batch, cin, len]`.
fn im2col(x: &[f32], g: Geo) -> Vec<f32> {
    let n = g.cols();
    let mut cols = vec![0f32; g.cin * g.k * n];
    cols.par_chunks_mut(n).enumerate().for_each(|(row, out)| {
        let (ci, kk) = (row / g.k, row % g.k);
        for b in 0..g.batch {
            let src = &x[(b * g.cin + ci) * g.len..][..g.len];
            let dst = &mut out[b * g.out_len..][..g.out_len];
            for (l, d) in dst.iter_mut().enumerate() {
                if let Some(p) = g.pos(l, kk) {
                    *d = src[p];
                }
            }
        }
    });
    cols
}

/// `[batch, c, l]` → `[c, batch·l]`.
fn channels_first(y: &[f32], batch: usize, c: usize, l: usize) -> Vec<f32> {
    let mut out = vec![0f32; y.len()];
    out.par_chunks_mut(batch * l).enumerate().for_each(|(ch, row)| {
        for b in 0..batch {
            row[b * l..][..l].copy_from_slice(&y[(b * c + ch) * l..][..l]);
        }
    });
    out
}

/// `w: [cout, cin, k]` as `[cout, cin·k]` (a view when contiguous).
fn weight_matrix(w: T, g: Geo) -> T {
    w.reshape([g.cout, g.cin * g.k].into())
}

/// The forward convolution.
pub fn conv1d(x: T, w: T, bias: Option<T>, o: &ConvOptions<1>) -> T {
    let g = Geo::new(&x, &w, o);
    let cols = im2col(&f32_data(&x), g);
    let r = matmul(weight_matrix(w, g), tensor(cols, vec![g.cin * g.k, g.cols()]));
    let r = f32_data(&r);
    let bias = bias.map(|b| f32_data(&b).into_owned());
    // [cout, batch·out_len] → [batch, cout, out_len], plus the bias.
    let mut y = vec![0f32; g.batch * g.cout * g.out_len];
    y.par_chunks_mut(g.out_len).enumerate().for_each(|(i, row)| {
        let (b, co) = (i / g.cout, i % g.cout);
        row.copy_from_slice(&r[co * g.cols() + b * g.out_len..][..g.out_len]);
        if let Some(bias) = &bias {
            row.iter_mut().for_each(|v| *v += bias[co]);
        }
    });
    tensor(y, vec![g.batch, g.cout, g.out_len])
}

/// `∂L/∂w = dy₂ · colsᵀ` with `dy₂: [cout, batch·out_len]`.
pub fn conv1d_weight_backward(x: T, w: T, dy: T, o: &ConvOptions<1>) -> T {
    let g = Geo::new(&x, &w, o);
    let cols = tensor(im2col(&f32_data(&x), g), vec![g.cin * g.k, g.cols()]);
    let dy2 = tensor(channels_first(&f32_data(&dy), g.batch, g.cout, g.out_len), vec![g.cout, g.cols()]);
    matmul(dy2, Flex::float_swap_dims(cols, 0, 1)).reshape([g.cout, g.cin, g.k].into())
}

/// `∂L/∂x`: the columns' gradient `w₂ᵀ · dy₂`, scattered back to the input positions.
pub fn conv1d_x_backward(x: T, w: T, dy: T, o: &ConvOptions<1>) -> T {
    let g = Geo::new(&x, &w, o);
    let dy2 = tensor(channels_first(&f32_data(&dy), g.batch, g.cout, g.out_len), vec![g.cout, g.cols()]);
    let dcols = matmul(Flex::float_swap_dims(weight_matrix(w, g), 0, 1), dy2);
    let dcols = f32_data(&dcols);
    // Per input channel: its k rows of columns add into dx[:, ci, :] (written as [cin, batch, len]).
    let mut dxt = vec![0f32; g.cin * g.batch * g.len];
    dxt.par_chunks_mut(g.batch * g.len).enumerate().for_each(|(ci, out)| {
        for kk in 0..g.k {
            let row = &dcols[(ci * g.k + kk) * g.cols()..][..g.cols()];
            for b in 0..g.batch {
                let dst = &mut out[b * g.len..][..g.len];
                for l in 0..g.out_len {
                    if let Some(p) = g.pos(l, kk) {
                        dst[p] += row[b * g.out_len + l];
                    }
                }
            }
        }
    });
    // [cin, batch, len] → [batch, cin, len].
    let mut dx = vec![0f32; dxt.len()];
    dx.par_chunks_mut(g.len).enumerate().for_each(|(i, row)| {
        let (b, ci) = (i / g.cin, i % g.cin);
        row.copy_from_slice(&dxt[(ci * g.batch + b) * g.len..][..g.len]);
    });
    tensor(dx, vec![g.batch, g.cin, g.len])
}
