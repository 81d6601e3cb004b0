//! Flex's weight gradient of an ungrouped convolution of any rank (`conv_weight_backward`,
//! f32 or bf16): GEMMs over im2col columns of bounded blocks of output positions, in place of
//! Burn's swapped-dims convolution (`nn::lean` sizes the blocks).

use burn::backend::Flex;
use burn::tensor::DType;
use burn::tensor::ops::FloatTensorOps;
use rayon::prelude::*;

use super::{Num, T, matmul, tensor, typed_data};

/// Geometry of an N-D convolution's weight gradient.
struct GeoNd {
    batch: usize,
    cin: usize,
    cout: usize,
    input: Vec<usize>,
    kernel: Vec<usize>,
    out: Vec<usize>,
    stride: Vec<usize>,
    pad: Vec<usize>,
    dil: Vec<usize>,
}

impl GeoNd {
    fn kernel_len(&self) -> usize {
        self.kernel.iter().product()
    }
    fn positions(&self) -> usize {
        self.out.iter().product()
    }
    fn input_len(&self) -> usize {
        self.input.iter().product()
    }
}

/// Columns `[cin·Πk, c1 − c0]` of `x: [batch, cin, in…]` (contiguous): column `c` is output
/// position `c mod Πout` of sample `c / Πout`, for `c` in `c0..c1`.
fn im2col_nd<E: Num>(x: &[E], g: &GeoNd, c0: usize, c1: usize) -> Vec<f32> {
    let (kl, pos, il, d) = (g.kernel_len(), g.positions(), g.input_len(), g.out.len());
    let n = c1 - c0;
    let mut cols = vec![0f32; g.cin * kl * n];
    let last = d - 1;
    let (olast, slast, dlast, plast, ilast) = (g.out[last], g.stride[last], g.dil[last], g.pad[last], g.input[last]);
    cols.par_chunks_mut(n).enumerate().for_each(|(row, out)| {
        let (ci, mut kidx) = (row / kl, row % kl);
        // Kernel offsets of this row (row-major over the kernel axes).
        let mut k = vec![0usize; d];
        for a in (0..d).rev() {
            k[a] = kidx % g.kernel[a];
            kidx /= g.kernel[a];
        }
        let mut o = vec![0usize; d];
        // Segments of the column range that stay on one line of the last output axis.
        let mut c = c0;
        while c < c1 {
            let (b, p) = (c / pos, c % pos);
            let (line, ol0) = (p / olast, p % olast);
            let ol1 = olast.min(ol0 + (c1 - c));
            let dst = &mut out[c - c0..][..ol1 - ol0];
            c += ol1 - ol0;
            let mut rest = line;
            for a in (0..last).rev() {
                o[a] = rest % g.out[a];
                rest /= g.out[a];
            }
            // Input offset of the line's outer coordinates, or None in the padding.
            let mut base = Some(0usize);
            for a in 0..last {
                base = base.and_then(|acc| {
                    let i = (o[a] * g.stride[a] + k[a] * g.dil[a]).checked_sub(g.pad[a]).filter(|&i| i < g.input[a])?;
                    Some((acc + i) * g.input[a + 1])
                });
            }
            let Some(base) = base else { continue };
            let src = &x[(b * g.cin + ci) * il + base..][..ilast];
            // Output positions ol with 0 ≤ ol·s + off < ilast, off = k·d − p: copied, no
            // per-element bounds checks (contiguous for stride 1).
            let off = (k[last] * dlast) as isize - plast as isize;
            let lo = if off >= 0 { 0 } else { ((-off) as usize).div_ceil(slast) };
            let hi = if (ilast as isize) > off { ((ilast as isize - off - 1) as usize) / slast + 1 } else { 0 };
            let (lo, hi) = (lo.max(ol0), hi.min(ol1));
            if lo < hi {
                let first = (lo as isize * slast as isize + off) as usize;
                let seg = &mut dst[lo - ol0..hi - ol0];
                if slast == 1 {
                    let len = seg.len();
                    seg.iter_mut().zip(&src[first..first + len]).for_each(|(v, &s)| *v = s.f());
                } else {
                    seg.iter_mut().zip(src[first..].iter().step_by(slast)).for_each(|(v, &s)| *v = s.f());
                }
            }
        }
    });
    cols
}

/// `dy: [batch, cout, Πout]` columns `c0..c1` as `[cout, c1 − c0]`.
fn dy_columns<E: Num>(dy: &[E], cout: usize, pos: usize, c0: usize, c1: usize) -> Vec<f32> {
    let n = c1 - c0;
    let mut out = vec![0f32; cout * n];
    out.par_chunks_mut(n).enumerate().for_each(|(co, row)| {
        let mut c = c0;
        while c < c1 {
            let (b, p) = (c / pos, c % pos);
            let len = (pos - p).min(c1 - c);
            row[c - c0..][..len].iter_mut().zip(&dy[(b * cout + co) * pos + p..][..len]).for_each(|(o, &v)| *o = v.f());
            c += len;
        }
    });
    out
}

/// The weight gradient of an ungrouped f32 convolution of any rank, as GEMMs over blocks of
/// output columns (sample × position): `dw₂ += dy₂ · colsᵀ` with `cols: [cin·Πk, block]` of at
/// most `workspace` bytes (at least one column), as cuDNN bounds its workspace. Burn computes it
/// as a convolution with batch and channels swapped: both tensors are first copied in the
/// swapped layout element by element, and its GEMM is `[cout, n·Πout] × [n·Πout, Πk]` (9
/// columns for a 3×3 kernel) per input channel.
pub fn conv_weight_backward(x: &T, w: &T, dy: &T, stride: &[usize], pad: &[usize], dil: &[usize], workspace: usize) -> Option<T> {
    // bf16 (flex's half-precision convolutions): the columns and the GEMM are f32, converted
    // block by block instead of whole-tensor f32 copies; the gradient is returned in bf16.
    if x.dtype() != w.dtype() || x.dtype() != dy.dtype() {
        return None;
    }
    match x.dtype() {
        DType::F32 => conv_weight_backward_typed::<f32>(x, w, dy, stride, pad, dil, workspace),
        DType::BF16 => conv_weight_backward_typed::<half::bf16>(x, w, dy, stride, pad, dil, workspace).map(|dw| Flex::float_cast(dw, burn::tensor::FloatDType::BF16)),
        _ => None,
    }
}

fn conv_weight_backward_typed<E: Num>(x: &T, w: &T, dy: &T, stride: &[usize], pad: &[usize], dil: &[usize], workspace: usize) -> Option<T> {
    let (xs, ws, ys) = (x.layout().shape(), w.layout().shape(), dy.layout().shape());
    let g = GeoNd {
        batch: xs[0],
        cin: xs[1],
        cout: ws[0],
        input: xs[2..].to_vec(),
        kernel: ws[2..].to_vec(),
        out: ys[2..].to_vec(),
        stride: stride.to_vec(),
        pad: pad.to_vec(),
        dil: dil.to_vec(),
    };
    if ws[1] != g.cin || g.batch == 0 || g.positions() == 0 {
        return None;
    }
    let (xd, yd) = (typed_data::<E>(x), typed_data::<E>(dy));
    let (kl, pos) = (g.kernel_len(), g.positions());
    let total = g.batch * pos;
    let block = (workspace / (g.cin * kl * 4).max(1)).clamp(1, total);
    let mut dw: Option<T> = None;
    for c0 in (0..total).step_by(block) {
        let c1 = (c0 + block).min(total);
        let cols = tensor(im2col_nd(&xd, &g, c0, c1), vec![g.cin * kl, c1 - c0]);
        let dy2 = tensor(dy_columns(&yd, g.cout, pos, c0, c1), vec![g.cout, c1 - c0]);
        let part = matmul(dy2, Flex::float_swap_dims(cols, 0, 1));
        dw = Some(match dw {
            None => part,
            Some(acc) => Flex::float_add(acc, part),
        });
    }
    let mut shape = vec![g.cout, g.cin];
    shape.extend_from_slice(&g.kernel);
    dw.map(|d| d.reshape(shape.into()))
}
