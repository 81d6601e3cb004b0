//! Flex's 2-D convolution forward as GEMMs that write the output in place: `conv2d`.
//!
//! Flex runs a 2-D convolution as a 3-D one: it copies the whole input to channels-last on one
//! thread, builds `[positions, cin·kh·kw]` columns per 512-position tile, multiplies each tile
//! with the weight into a new buffer, and scatters
//! that buffer into the output channel by channel. ACT's ResNet-18 runs every 3×3 convolution
//! (forward, and the stride-1 input gradient, a forward convolution) that way. Here:
//!
//! - each task (sample, block of output rows) builds its `[cin·kh·kw, positions]` columns
//!   straight from the channels-first input (row copies; at most [`BLOCK_FLOATS`] floats,
//!   reused by the task's thread), and the GEMM writes `[cout, positions]` into the output at
//!   its place (row stride = the output plane), bias added there; a 1×1 stride-1 unpadded
//!   convolution reads the input itself as the columns; the weight stays `[cout, cin·kh·kw]`;
//! - the output is written once by the tasks (no zeroing pass).
//!
//! f32, ungrouped; other cases return `None` (Burn's convolution).

use burn::tensor::DType;
use burn::tensor::ops::ConvOptions;
use rayon::prelude::*;

use super::{T, f32_data, tensor};

/// The most floats of im2col columns one task builds (1 MiB: one task's columns stay in the
/// L2 cache of the core that multiplies them; a block is at least one output row).
const BLOCK_FLOATS: usize = 1 << 18;

/// Geometry of one 2-D convolution.
#[derive(Clone, Copy, Debug)]
struct Geo {
    n: usize,
    ci: usize,
    h: usize,
    w: usize,
    co: usize,
    kh: usize,
    kw: usize,
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    oh: usize,
    ow: usize,
}

impl Geo {
    /// Columns per position (`cin·kh·kw`).
    fn k(&self) -> usize {
        self.ci * self.kh * self.kw
    }
    /// Whether the input itself is the column matrix (1×1, stride 1, no padding).
    fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.stride == [1, 1] && self.pad == [0, 0]
    }
    /// Output rows per task.
    fn rows_per_block(&self, block: usize) -> usize {
        if self.pointwise() { (block / (self.ci * self.ow).max(1)).clamp(1, self.oh) } else { (block / (self.k() * self.ow).max(1)).clamp(1, self.oh) }
    }
}

/// The geometry when this kernel handles the convolution.
fn handles(x: &T, w: &T, bias: Option<&T>, o: &ConvOptions<2>) -> Option<Geo> {
    let (xs, ws) = (x.layout().shape(), w.layout().shape());
    if o.groups != 1 || x.dtype() != DType::F32 || w.dtype() != DType::F32 || bias.is_some_and(|b| b.dtype() != DType::F32) || xs.num_dims() != 4 || ws.num_dims() != 4 || xs[1] != ws[1] {
        return None;
    }
    let out = |i: usize, k: usize| (xs[2 + i] + 2 * o.padding[i]).checked_sub(o.dilation[i] * (k - 1) + 1).map(|v| v / o.stride[i] + 1);
    let g = Geo { n: xs[0], ci: xs[1], h: xs[2], w: xs[3], co: ws[0], kh: ws[2], kw: ws[3], stride: o.stride, pad: o.padding, dil: o.dilation, oh: out(0, ws[2])?, ow: out(1, ws[3])? };
    (g.n > 0 && g.co > 0 && g.k() > 0 && g.oh > 0 && g.ow > 0 && g.stride.iter().all(|&s| s > 0) && g.dil.iter().all(|&d| d > 0)).then_some(g)
}

/// `conv2d(x, w, bias)` for `x: [n, cin, h, w]`, `w: [cout, cin, kh, kw]`; `None` where this
/// kernel does not apply (grouped, not f32).
pub fn conv2d(x: &T, w: &T, bias: Option<&T>, o: &ConvOptions<2>) -> Option<T> {
    let g = handles(x, w, bias, o)?;
    let x = f32_data(x);
    // `[co, k]` row-major: the GEMM packs it per call, which measured faster than handing it
    // a transposed (column-major, unpacked) copy for 128+ output channels.
    let w = f32_data(w);
    let bias = bias.map(|b| f32_data(b).into_owned());
    let plane = g.oh * g.ow;
    let len = g.n * g.co * plane;
    let rows = g.rows_per_block(BLOCK_FLOATS);
    let blocks = g.oh.div_ceil(rows);
    let mut y: Vec<f32> = Vec::with_capacity(len);
    let yp = Out(y.spare_capacity_mut().as_mut_ptr().cast::<f32>());
    (0..g.n * blocks).into_par_iter().for_each_init(Vec::new, |cols: &mut Vec<f32>, t| {
        let (b, r0) = (t / blocks, (t % blocks) * rows);
        let r1 = (r0 + rows).min(g.oh);
        let npos = (r1 - r0) * g.ow;
        let xb = &x[b * g.ci * g.h * g.w..][..g.ci * g.h * g.w];
        let (rhs, rhs_rs) = if g.pointwise() {
            (&xb[r0 * g.ow..], (g.h * g.w) as isize)
        } else {
            cols.resize(g.k() * npos, 0.0);
            im2col_rows(xb, &g, r0, r1, cols);
            (&cols[..], npos as isize)
        };
        let dst = yp.at(b * g.co * plane + r0 * g.ow);
        // SAFETY: `dst` addresses rows r0..r1 of every channel of sample b (row stride
        // `plane`), which this task alone writes, all within `len` (the capacity). The weight
        // is `[co, k]` (row stride k), the columns `[k, npos]` (row stride rhs_rs), both
        // covering the extents read.
        unsafe {
            gemm::gemm(g.co, npos, g.k(), dst, 1, plane as isize, false, w.as_ptr(), 1, g.k() as isize, rhs.as_ptr(), 1, rhs_rs, 0.0f32, 1.0f32, false, false, false, gemm::Parallelism::None);
        }
        if let Some(bias) = &bias {
            for (c, &bv) in bias.iter().enumerate() {
                // SAFETY: as above; the GEMM initialised these npos elements.
                let row = unsafe { std::slice::from_raw_parts_mut(dst.add(c * plane), npos) };
                row.iter_mut().for_each(|v| *v += bv);
            }
        }
    });
    // SAFETY: the tasks (sample, row block) cover rows 0..oh of every sample, and each GEMM
    // wrote every channel's positions of its rows (alpha 0, no read of the destination).
    unsafe { y.set_len(len) };
    Some(tensor(y, vec![g.n, g.co, g.oh, g.ow]))
}

/// The columns of output rows `r0..r1` of one sample `x: [ci, h, w]`: `cols[(c·kh + i)·kw + j,
/// p]` = the input under tap `(i, j)` of output position `p` (zero in the padding); every
/// element of `cols[..k·npos]` is written.
fn im2col_rows(x: &[f32], g: &Geo, r0: usize, r1: usize, cols: &mut [f32]) {
    let npos = (r1 - r0) * g.ow;
    let [sh, sw] = g.stride;
    let [ph, pw] = g.pad;
    let [dh, dw] = g.dil;
    for (kr, col) in cols.chunks_mut(npos).take(g.k()).enumerate() {
        let (c, i, j) = (kr / (g.kh * g.kw), kr / g.kw % g.kh, kr % g.kw);
        let plane = &x[c * g.h * g.w..][..g.h * g.w];
        // Output columns whose input column `ox·sw + j·dw − pw` lies in 0..w.
        let off = j * dw;
        let lo = pw.saturating_sub(off).div_ceil(sw).min(g.ow);
        let hi = if g.w + pw > off { ((g.w + pw - off - 1) / sw + 1).min(g.ow) } else { 0 }.max(lo);
        for (r, dst) in col.chunks_mut(g.ow).enumerate() {
            let iy = ((r0 + r) * sh + i * dh).checked_sub(ph).filter(|&v| v < g.h);
            let Some(iy) = iy else {
                dst.fill(0.0);
                continue;
            };
            let src = &plane[iy * g.w..][..g.w];
            dst[..lo].fill(0.0);
            dst[hi..].fill(0.0);
            let x0 = lo * sw + off - pw;
            if sw == 1 {
                dst[lo..hi].copy_from_slice(&src[x0..x0 + hi - lo]);
            } else {
                dst[lo..hi].iter_mut().enumerate().for_each(|(q, v)| *v = src[x0 + q * sw]);
            }
        }
    }
}

/// The output buffer, written by the tasks at disjoint places.
struct Out(*mut f32);
impl Clone for Out {
    fn clone(&self) -> Self {
        *self
    }
}
impl Copy for Out {}
// SAFETY: the tasks write disjoint elements (see `conv2d`).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}
impl Out {
    /// The element at `i` (a method, so closures capture the whole `Out`, which is `Send`).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::ops::ModuleOps;
    use burn::tensor::TensorData;

    use super::super::hashed_tensor as rand;

    /// Equal to flex's own convolution (≤ 1e-5 relative to the output's largest value) on
    /// strides, paddings (beyond the kernel too), dilations, 1×1 (pointwise and strided), uneven
    /// kernels, a bias, and blocks smaller than the output (rows split across tasks).
    #[test]
    fn conv2d_equals_flex() {
        let cases: &[([usize; 4], [usize; 4], [usize; 2], [usize; 2], [usize; 2], bool)] = &[
            ([2, 3, 11, 13], [5, 3, 3, 3], [1, 1], [1, 1], [1, 1], true),
            ([3, 4, 9, 7], [6, 4, 3, 3], [2, 2], [1, 1], [1, 1], false),
            ([2, 3, 16, 20], [8, 3, 7, 7], [2, 2], [3, 3], [1, 1], false),
            ([2, 5, 8, 10], [7, 5, 1, 1], [1, 1], [0, 0], [1, 1], true),
            ([2, 5, 9, 11], [7, 5, 1, 1], [2, 2], [0, 0], [1, 1], false),
            ([1, 2, 10, 12], [3, 2, 2, 3], [1, 2], [3, 4], [2, 1], true),
            ([2, 64, 40, 48], [9, 64, 3, 3], [1, 1], [1, 1], [1, 1], false),
            ([1, 3, 5, 5], [2, 3, 3, 3], [3, 3], [0, 0], [1, 1], false),
        ];
        for (i, &(xs, ws, stride, pad, dil, with_bias)) in cases.iter().enumerate() {
            let (x, w) = (rand(&xs, 2 * i as u64), rand(&ws, 2 * i as u64 + 1));
            let b = with_bias.then(|| rand(&[ws[0]], 99));
            let o = ConvOptions::new(stride, pad, dil, 1);
            let g = handles(&x, &w, b.as_ref(), &o).unwrap();
            if i == 6 {
                assert!(g.rows_per_block(BLOCK_FLOATS) < g.oh, "case {i} must split the output rows: {g:?}");
            }
            let got = conv2d(&x, &w, b.as_ref(), &o).unwrap();
            let want = Flex::conv2d(x, w, b, o);
            assert_eq!(got.layout().shape(), want.layout().shape(), "case {i}");
            let (got, want) = (f32_data(&got).into_owned(), f32_data(&want).into_owned());
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(worst <= 1e-5 * scale, "case {i} {g:?}: worst abs error {worst:e} (scale {scale})");
        }
    }

    #[test]
    fn grouped_or_bf16_convolutions_are_left_to_flex() {
        let (x, w) = (rand(&[1, 4, 6, 6], 1), rand(&[4, 2, 3, 3], 2));
        assert!(conv2d(&x, &w, None, &ConvOptions::new([1, 1], [1, 1], [1, 1], 2)).is_none());
        let xb = T::from_data(TensorData::new(vec![half::bf16::ONE; 36], vec![1, 1, 6, 6]));
        let wb = T::from_data(TensorData::new(vec![half::bf16::ONE; 9], vec![1, 1, 3, 3]));
        assert!(conv2d(&xb, &wb, None, &ConvOptions::new([1, 1], [1, 1], [1, 1], 1)).is_none());
    }
}

