//! Flex kernels behind `nn::lean`: the per-channel affine (frozen batch norm), and 1-D
//! convolution as one GEMM over the whole batch.
//!
//! The channel affine: flex's broadcast multiply and add of `x: [n, c, h, w]` by `[1, c, 1, 1]`
//! walk `x` element by element through a generic strided iterator (6–8 % of an ACT CPU step in
//! the forward alone); here each `(sample, channel)` plane is one vectorized loop.
//!
//! The 1-D convolution:
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
use burn_flex::FlexTensor;
use rayon::prelude::*;

type T = FlexTensor;

/// The elements in row-major order (borrowed when the layout already is).
fn f32_data(t: &T) -> std::borrow::Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(t.to_contiguous().storage::<f32>().to_vec()),
    }
}

fn tensor(data: Vec<f32>, shape: Vec<usize>) -> T {
    T::from_data(burn::tensor::TensorData::new(data, shape))
}

/// `x · scale + shift` per channel (f32, `x` contiguous), or `None` for the other cases.
pub fn channel_affine(x: &T, scale: &T, shift: Option<&T>) -> Option<T> {
    let all_f32 = x.dtype() == DType::F32 && scale.dtype() == DType::F32 && shift.is_none_or(|b| b.dtype() == DType::F32);
    let xs = x.as_slice::<f32>().filter(|_| all_f32)?;
    let dims: Vec<usize> = x.layout().shape().iter().copied().collect();
    if dims.len() < 2 {
        return None;
    }
    let (c, plane) = (dims[1], dims[2..].iter().product::<usize>());
    let scale = f32_data(scale);
    let shift = shift.map(f32_data);
    let mut y = vec![0f32; xs.len()];
    if plane > 0 {
        y.par_chunks_mut(plane).zip(xs.par_chunks(plane)).enumerate().for_each(|(i, (out, inp))| {
            let s = scale[i % c];
            match &shift {
                Some(b) => {
                    let b = b[i % c];
                    out.iter_mut().zip(inp).for_each(|(o, &v)| *o = v * s + b);
                }
                None => out.iter_mut().zip(inp).for_each(|(o, &v)| *o = v * s),
            }
        });
    }
    Some(tensor(y, dims))
}

/// `w: [cout, cin, k…]` (f32) → contiguous `[cin, cout, k…]` with every kernel axis flipped:
/// flipping all kernel axes of a row-major kernel reverses its flattened order. Flex would copy
/// the permuted, negatively strided view element by element through its index iterator.
pub fn flipped_weight(w: &T) -> Option<T> {
    let ws = w.as_slice::<f32>().filter(|_| w.dtype() == DType::F32)?;
    let dims: Vec<usize> = w.layout().shape().iter().copied().collect();
    let (cout, cin, k) = (dims[0], dims[1], dims[2..].iter().product::<usize>());
    let mut out = vec![0f32; ws.len()];
    if k > 0 {
        out.par_chunks_mut(cout * k).enumerate().for_each(|(ci, block)| {
            for (co, dst) in block.chunks_mut(k).enumerate() {
                let src = &ws[(co * cin + ci) * k..][..k];
                dst.iter_mut().zip(src.iter().rev()).for_each(|(d, &s)| *d = s);
            }
        });
    }
    let mut shape = dims;
    shape.swap(0, 1);
    Some(tensor(out, shape))
}

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

fn matmul(a: T, b: T) -> T {
    Flex::float_matmul(a, b)
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
