//! Direct 3-D convolution on flex (f32 or bf16, stride 1, undilated, ungrouped): `conv3d` (the
//! forward) and `conv3d_weight_backward`, without im2col.
//!
//! Flex runs a 3-D convolution as im2col tiles and a GEMM: for each 512-position tile it
//! writes `[cin·k³, 512]` columns (27× the input for a 3³ kernel) and multiplies them by a
//! `[cout, cin·k³]` weight. At the VAE's widths (4–32 channels) that GEMM has 4–32 rows, so
//! the column traffic and the narrow-matrix GEMM dominate: about half of a VAE CPU step.
//!
//! Here the input is copied once, zero-padded (each row padded to whole vectors), and each
//! output row is accumulated in registers: a tile of 4 output channels × 16 (or 8)
//! consecutive positions, over every input channel and kernel tap — one vector load of the
//! shifted input row and 4 broadcast weights per tap, 4 × 2 fused multiply-adds. The weight
//! gradient is the same sum read the other way: for one input channel and kernel row
//! (`kd`, `kh`), 4 output channels × 3 taps of `kw` accumulate `dy · x` over every output
//! row of the batch in 12 vector registers, reduced once at the end.
//!
//! The instruction level ([`Isa`], detected at run time, capped by `VRAMLAB_SIMD`) picks the
//! tile: AVX2 + FMA as above; AVX-512 (32 vector registers of 16 lanes) 8 output channels (where
//! `co` is a multiple of 8, else 4) × 32 (or 16) positions, the last vector of a row masked when the row is not whole vectors of 16,
//! and weight-gradient tiles of 8 output channels × 3 taps; rows of 8 positions (16 for bf16's
//! weight gradient) are packed several to a vector, so no lane idles past a row's end; scalar:
//! the AVX2 loops on plain arrays. Sums run in a different order than the GEMM's: results equal flex's to f32 rounding
//! (the tests compare every level the machine has with Burn's convolution).
//!
//! The stride-1 input gradient is this forward too (`nn::lean`: the output gradient convolved
//! with the flipped, in/out-swapped kernel). bf16 tensors are read and written in bf16 and
//! summed in f32 (the padded input and packed weight are f32 copies), as flex's own bf16
//! convolution sums in f32; at [`Isa::Avx512Bf16`] [`bf16dot`] sums them in f32 too, from bf16
//! copies, two products per lane and instruction (`vdpbf16ps`). Strided, dilated and grouped
//! convolutions go to flex's own kernels (`None` here).

use burn::tensor::DType;
use burn::tensor::ops::ConvOptions;
use burn_flex::FlexTensor;
use rayon::prelude::*;

use super::{Isa, Num, f32_slice, typed, typed_data};

type T = FlexTensor;

mod avx2;
mod avx512;
mod bf16dot;

/// Output channels per register tile (scalar, AVX2; AVX-512 takes [`CO_WIDE`] where `co` is a
/// multiple of 8).
const CO: usize = 4;
/// Output channels per AVX-512 register tile.
const CO_WIDE: usize = 8;
/// f32 lanes of one AVX2 vector; rows are padded to whole vectors of 8 (AVX-512 masks the
/// upper half of a row's last 16-lane vector where needed).
const LANES: usize = 8;
/// Positions of the widest forward tile (AVX-512: 2 vectors of 16).
const MAX_STEP: usize = 32;
/// Kernel taps along the width accumulated per weight-gradient tile.
const TAPS: usize = 3;

/// Shapes of one convolution and its padded input.
#[derive(Clone, Copy, Debug)]
struct Geo {
    n: usize,
    ci: usize,
    co: usize,
    /// Output channels per tile: [`CO`], or [`CO_WIDE`] at AVX-512 when `co` is a multiple of it.
    cob: usize,
    input: [usize; 3],
    kernel: [usize; 3],
    pad: [usize; 3],
    out: [usize; 3],
    /// Output width rounded up to whole vectors.
    wv: usize,
    /// Padded input depth, height and row length (`wv + kw − 1`: every tap of every vector
    /// of an output row reads inside the row).
    dp: usize,
    hp: usize,
    wp: usize,
}

impl Geo {
    fn new(xs: &[usize], ws: &[usize], pad: [usize; 3], isa: Isa) -> Option<Self> {
        if xs.len() != 5 || ws.len() != 5 || ws[1] != xs[1] || xs[0] == 0 || xs[1] == 0 || ws[0] == 0 {
            return None;
        }
        let input = [xs[2], xs[3], xs[4]];
        let kernel = [ws[2], ws[3], ws[4]];
        let mut out = [0; 3];
        for a in 0..3 {
            if kernel[a] == 0 {
                return None;
            }
            out[a] = (input[a] + 2 * pad[a]).checked_sub(kernel[a] - 1).filter(|&o| o > 0)?;
        }
        let wv = out[2].div_ceil(LANES) * LANES;
        // 8-channel tiles only where `co` is whole tiles of 8 (then the packed weight and the
        // padded output gradient are the sizes the 4-channel tiles use: peaks do not change).
        let cob = if isa >= Isa::Avx512 && ws[0].is_multiple_of(CO_WIDE) { CO_WIDE } else { CO };
        Some(Self { n: xs[0], ci: xs[1], co: ws[0], cob, input, kernel, pad, out, wv, dp: input[0] + 2 * pad[0], hp: input[1] + 2 * pad[1], wp: wv + kernel[2] - 1 })
    }

    fn plane(&self) -> usize {
        self.dp * self.hp * self.wp
    }

    fn co_blocks(&self) -> usize {
        self.co.div_ceil(self.cob)
    }

    fn kvol(&self) -> usize {
        self.kernel.iter().product()
    }

    /// The weight gradient's strides, in elements: one sample of the padded input, one sample
    /// of the padded output gradient `[n, co_blocks·cob, od, oh, wv]`, one channel of the latter.
    fn dy_strides(&self) -> (usize, usize, usize) {
        let dyc = self.out[0] * self.out[1] * self.wv;
        (self.ci * self.plane(), self.co_blocks() * self.cob * dyc, dyc)
    }

    /// Offset in one channel of the padded input of output row `q` (`q` counts rows over the
    /// output's depth and height: depth `q / oh`, height `q % oh`).
    fn row_offset(&self, q: usize) -> usize {
        ((q / self.out[1]) * self.hp + q % self.out[1]) * self.wp
    }
}

/// Whether the direct kernels take this convolution: f32 or bf16 (input and weight alike),
/// stride 1, dilation 1, one group, and narrow enough (`cin·k³ ≤ 1728`, e.g. 64 channels ×
/// 3³) that the register tile beats flex's GEMM, which wins once the reduction is long.
fn handles(x: &T, w: &T, o: &ConvOptions<3>, isa: Isa) -> Option<Geo> {
    let ok = matches!(x.dtype(), DType::F32 | DType::BF16) && w.dtype() == x.dtype() && o.groups == 1 && o.stride == [1; 3] && o.dilation == [1; 3];
    if !ok {
        return None;
    }
    let g = Geo::new(x.layout().shape(), w.layout().shape(), o.padding, isa)?;
    (g.ci * g.kvol() <= crate::nn::DIRECT_CONV3D_MAX_REDUCTION).then_some(g)
}

/// `x: [n, ci, d, h, w]` zero-padded to `[n, ci, dp, hp, wp]` (front padding `pad`) as f32.
fn padded_input<E: Num>(x: &[E], g: &Geo) -> Vec<f32> {
    padded(x, g, 0.0, |v| v.f())
}

/// `x: [n, ci, d, h, w]` zero-padded to `[n, ci, dp, hp, wp]` (front padding `pad`), each
/// element converted by `f`.
fn padded<S: Copy + Sync, D: Copy + Send + Sync>(x: &[S], g: &Geo, zero: D, f: impl Fn(S) -> D + Sync) -> Vec<D> {
    let [d, h, w] = g.input;
    let len = g.n * g.ci * g.plane();
    // Written plane by plane on all threads (zeros, then the rows): no single-threaded
    // zeroing of the whole buffer by the allocator first.
    let mut xp: Vec<D> = Vec::with_capacity(len);
    xp.spare_capacity_mut()[..len].par_chunks_mut(g.plane()).enumerate().for_each(|(nc, dst)| {
        dst.iter_mut().for_each(|v| {
            v.write(zero);
        });
        let src = &x[nc * d * h * w..][..d * h * w];
        for z in 0..d {
            for y in 0..h {
                let o = ((z + g.pad[0]) * g.hp + y + g.pad[1]) * g.wp + g.pad[2];
                dst[o..o + w].iter_mut().zip(&src[(z * h + y) * w..][..w]).for_each(|(v, &s)| {
                    v.write(f(s));
                });
            }
        }
    });
    // SAFETY: every plane, hence every element of the first `len`, was written above.
    unsafe { xp.set_len(len) };
    xp
}

/// `w: [co, ci, kd, kh, kw]` as `[co_block, ci, kd, kh, kw, cob]` (zeros past `co`).
fn packed_weight<E: Num>(w: &[E], g: &Geo) -> Vec<f32> {
    let (kv, cob) = (g.kvol(), g.cob);
    let mut out = vec![0f32; g.co_blocks() * g.ci * kv * cob];
    for co in 0..g.co {
        let (b, lane) = (co / cob, co % cob);
        for c in 0..g.ci {
            for k in 0..kv {
                out[((b * g.ci + c) * kv + k) * cob + lane] = w[(co * g.ci + c) * kv + k].f();
            }
        }
    }
    out
}

/// A raw pointer shared by tasks that write disjoint elements.
struct Out<E>(*mut E);
impl<E> Clone for Out<E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for Out<E> {}
impl<E> Out<E> {
    /// The element at `i` (a method, so closures capture the whole `Out`, which is `Send`).
    fn at(self, i: usize) -> *mut E {
        self.0.wrapping_add(i)
    }
}
unsafe impl<E> Send for Out<E> {}
unsafe impl<E> Sync for Out<E> {}

/// The direct convolution (see the module docs), or `None` where flex's own applies.
pub fn conv3d(x: &T, w: &T, bias: Option<&T>, o: &ConvOptions<3>) -> Option<T> {
    conv3d_with(x, w, bias, o, super::isa::level())
}

/// [`conv3d`] with the tiles of `isa` (which the CPU must support).
fn conv3d_with(x: &T, w: &T, bias: Option<&T>, o: &ConvOptions<3>, isa: Isa) -> Option<T> {
    let g = handles(x, w, o, isa)?;
    if bias.is_some_and(|b| b.dtype() != x.dtype()) {
        return None;
    }
    match x.dtype() {
        DType::F32 => Some(conv3d_typed::<f32>(x, w, bias, &g, isa)),
        _ if isa == Isa::Avx512Bf16 => Some(bf16dot::conv3d(x, w, bias, &g)),
        _ => Some(conv3d_typed::<half::bf16>(x, w, bias, &g, isa)),
    }
}

fn conv3d_typed<E: Num>(x: &T, w: &T, bias: Option<&T>, g: &Geo, isa: Isa) -> T {
    let g = *g;
    let xp = padded_input(&typed_data::<E>(x), &g);
    let wk = packed_weight(&typed_data::<E>(w), &g);
    let bias = bias_f32::<E>(bias);
    let wlen = g.ci * g.kvol() * g.cob;
    output_rows::<E>(&g, bias.as_deref(), isa, |n, cb, z, yy, x0, step, tile| {
        let row = &xp[(n * g.ci * g.dp + z) * g.hp * g.wp + yy * g.wp + x0..];
        forward_tile(isa, step, row, &g, &wk[cb * wlen..][..wlen], tile);
    })
}

/// The bias as f32.
fn bias_f32<E: Num>(bias: Option<&T>) -> Option<Vec<f32>> {
    bias.map(|b| typed_data::<E>(b).iter().map(|v| v.f()).collect())
}

/// The forward's output `[n, co, od, oh, ow]` as `E`, plus `bias`: one task per (sample,
/// channel block, output depth row), each output row in tiles of up to [`MAX_STEP`] positions
/// that `tile(n, cb, z, y, x0, step, sums)` sums (`sums[l·step + i]` for channel `l` of the
/// block, position `x0 + i`). At AVX-512, rows of 8 positions (`wv == 8`) go up to 4 to a tile
/// (`x0 = 0`, `step = 8·rows`; row `y + k` at `sums[l·step + 8k + i]`), so that no lane idles
/// past a row's end; the tile functions tell this case by `wv == 8 && step > 8`.
fn output_rows<E: Num>(g: &Geo, bias: Option<&[f32]>, isa: Isa, tile: impl Fn(usize, usize, usize, usize, usize, usize, &mut [f32; CO_WIDE * MAX_STEP]) + Sync) -> T {
    let g = *g;
    let [od, oh, ow] = g.out;
    let out_plane = od * oh * ow;
    // Every element is written once by the tasks below (rows `z` of a block of channels,
    // positions `0..ow` of each row), so the buffer is not zeroed first.
    let len = g.n * g.co * out_plane;
    let mut y: Vec<E> = Vec::with_capacity(len);
    let yp = Out(y.spare_capacity_mut().as_mut_ptr().cast::<E>());
    let tasks = g.n * g.co_blocks() * od;
    (0..tasks).into_par_iter().for_each(|t| {
        let (n, rest) = (t / (g.co_blocks() * od), t % (g.co_blocks() * od));
        let (cb, z) = (rest / od, rest % od);
        let cob = g.cob;
        let lanes = (g.co - cb * cob).min(cob);
        let mut sums = [0f32; CO_WIDE * MAX_STEP];
        // Writes rows `yy..yy + rows` of the tile (`step / rows` positions each, from `x0`).
        let write = |yy: usize, rows: usize, x0: usize, step: usize, sums: &[f32; CO_WIDE * MAX_STEP]| {
            let per = step / rows;
            let valid = (ow - x0.min(ow)).min(per);
            for l in 0..lanes {
                let co = cb * cob + l;
                let b = bias.map_or(0.0, |b| b[co]);
                for k in 0..rows {
                    let dst = ((n * g.co + co) * od + z) * oh * ow + (yy + k) * ow + x0;
                    // Converted in a loop of fixed length (it vectorises), then copied.
                    let mut row = [E::zeroed(); MAX_STEP];
                    row.iter_mut().zip(&sums[l * step + k * per..][..MAX_STEP - k * per]).for_each(|(o, &v)| *o = E::of(v + b));
                    // SAFETY: task (n, cb, z) alone writes rows z of channels cb·CO.. of
                    // sample n; dst + valid ≤ len (the capacity) by the shapes.
                    unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), yp.at(dst), valid) };
                }
            }
        };
        if matches!(isa, Isa::Avx512 | Isa::Avx512Bf16) && g.wv == LANES {
            // Rows of 8 positions: up to 4 rows per tile, 2 per 16-lane vector.
            let mut yy = 0;
            while yy < oh {
                let rows = (oh - yy).min(MAX_STEP / LANES);
                tile(n, cb, z, yy, 0, rows * LANES, &mut sums);
                write(yy, rows, 0, rows * LANES, &sums);
                yy += rows;
            }
            return;
        }
        for yy in 0..oh {
            let mut x0 = 0;
            while x0 < g.wv {
                // Positions of this tile: 2 vectors where the row has them, else 1 (AVX-512:
                // up to 32 in 2 vectors of 16, a row's last vector masked to 8 lanes when
                // the row is an odd number of 8-lane vectors).
                let left = g.wv - x0;
                let step = match isa {
                    Isa::Avx512 | Isa::Avx512Bf16 => left.min(MAX_STEP),
                    _ if left >= 2 * LANES => 2 * LANES,
                    _ => LANES,
                };
                tile(n, cb, z, yy, x0, step, &mut sums);
                write(yy, 1, x0, step, &sums);
                x0 += step;
            }
        }
    });
    // SAFETY: tasks (n, channel block, z) cover every (n, co, z); each writes rows 0..oh,
    // positions 0..ow (the last tile's `valid` stops at ow).
    unsafe { y.set_len(len) };
    typed(y, vec![g.n, g.co, od, oh, ow])
}

/// One forward tile: `tile[l·step + i] = Σ_{c, a, b, e} w[l, c, a, b, e] · row(c, a, b)[i + e]`
/// for the `g.cob` channels `l` of the block. `row` starts at the tile's first position in the
/// padded input of channel 0, depth row `z`, height row `y`; `step` positions (a multiple of 8:
/// 8 or 16 below AVX-512, up to 32 there).
fn forward_tile(isa: Isa, step: usize, row: &[f32], g: &Geo, w: &[f32], tile: &mut [f32; CO_WIDE * MAX_STEP]) {
    let (cs, ps, rs) = (g.plane(), g.hp * g.wp, g.wp);
    // Highest element read: channel ci−1, tap (kd−1, kh−1, kw−1), last lane (AVX-512's masked
    // lanes are not read).
    // Rows of 8 packed into one tile (see `output_rows`): `rows` rows `rs` apart.
    let rows = if g.wv == LANES && step > LANES { step / LANES } else { 1 };
    let span = if rows > 1 { (rows - 1) * rs + LANES } else { step };
    let last = (g.ci - 1) * cs + (g.kernel[0] - 1) * ps + (g.kernel[1] - 1) * rs + g.kernel[2] - 1 + span - 1;
    assert!(last < row.len() && w.len() == g.ci * g.kvol() * g.cob && step.is_multiple_of(LANES) && step <= MAX_STEP);
    assert!(isa.supported(), "the caller picks a level the CPU has");
    #[cfg(target_arch = "x86_64")]
    {
        let (r, wp, t, st) = (row.as_ptr(), w.as_ptr(), tile.as_mut_ptr(), [cs, ps, rs]);
        if rows > 1 {
            assert!(matches!(isa, Isa::Avx512 | Isa::Avx512Bf16), "rows are packed at AVX-512 only");
            // SAFETY: AVX-512 F/VL and FMA are supported (asserted); every read is within `row`
            // (`last` above) and `w`; `tile` holds cob·step values.
            unsafe {
                match (g.cob, rows > 2) {
                    (CO_WIDE, true) => avx512::forward_tile_rows::<CO_WIDE, 2>(r, st, g.ci, g.kernel, wp, t, rows),
                    (CO_WIDE, false) => avx512::forward_tile_rows::<CO_WIDE, 1>(r, st, g.ci, g.kernel, wp, t, rows),
                    (_, true) => avx512::forward_tile_rows::<CO, 2>(r, st, g.ci, g.kernel, wp, t, rows),
                    (_, false) => avx512::forward_tile_rows::<CO, 1>(r, st, g.ci, g.kernel, wp, t, rows),
                }
            }
            return;
        }
        match isa {
            Isa::Avx512 | Isa::Avx512Bf16 => {
                // The last vector's lanes: all 16, or the lower 8 (a row end).
                let mask: u16 = if step.is_multiple_of(16) { 0xFFFF } else { 0x00FF };
                // SAFETY: AVX-512 F/VL and FMA are supported (asserted); every read is within
                // `row` and `w` (checked above); `tile` holds cob·step values.
                unsafe {
                    match (g.cob, step > 16) {
                        (CO_WIDE, true) => avx512::forward_tile::<CO_WIDE, 2>(r, st, g.ci, g.kernel, wp, t, mask),
                        (CO_WIDE, false) => avx512::forward_tile::<CO_WIDE, 1>(r, st, g.ci, g.kernel, wp, t, mask),
                        (_, true) => avx512::forward_tile::<CO, 2>(r, st, g.ci, g.kernel, wp, t, mask),
                        (_, false) => avx512::forward_tile::<CO, 1>(r, st, g.ci, g.kernel, wp, t, mask),
                    }
                }
                return;
            }
            Isa::Avx2 => {
                // SAFETY: AVX2 and FMA are supported (asserted); every read is within `row` and `w`.
                unsafe {
                    match step {
                        16 => avx2::forward_tile::<2>(r, st, g.ci, g.kernel, wp, t),
                        _ => avx2::forward_tile::<1>(r, st, g.ci, g.kernel, wp, t),
                    }
                }
                return;
            }
            Isa::Scalar => {}
        }
    }
    let n = step;
    let cob = g.cob;
    let mut acc = [[0f32; MAX_STEP]; CO_WIDE];
    let mut wi = 0;
    for c in 0..g.ci {
        for a in 0..g.kernel[0] {
            for b in 0..g.kernel[1] {
                let r = &row[c * cs + a * ps + b * rs..];
                for e in 0..g.kernel[2] {
                    let xs = &r[e..e + n];
                    for (l, acc) in acc[..cob].iter_mut().enumerate() {
                        let wv = w[wi + l];
                        acc[..n].iter_mut().zip(xs).for_each(|(s, &x)| *s += wv * x);
                    }
                    wi += cob;
                }
            }
        }
    }
    for (l, acc) in acc[..cob].iter().enumerate() {
        tile[l * n..][..n].copy_from_slice(&acc[..n]);
    }
}

/// The weight gradient of the direct convolution (stride 1): `dw[co, ci, a, b, e] = Σ dy[n,
/// co, z, y, x] · xpad[n, ci, z + a, y + b, x + e]`, or `None` where flex's applies.
pub fn conv3d_weight_backward(x: &T, w: &T, dy: &T, o: &ConvOptions<3>) -> Option<T> {
    conv3d_weight_backward_with(x, w, dy, o, super::isa::level())
}

/// [`conv3d_weight_backward`] with the tiles of `isa` (which the CPU must support).
fn conv3d_weight_backward_with(x: &T, w: &T, dy: &T, o: &ConvOptions<3>, isa: Isa) -> Option<T> {
    let g = handles(x, w, o, isa)?;
    if dy.dtype() != x.dtype() || dy.layout().shape()[..] != [g.n, g.co, g.out[0], g.out[1], g.out[2]] {
        return None;
    }
    match x.dtype() {
        DType::F32 => Some(weight_backward_typed::<f32>(x, dy, &g, isa)),
        _ if isa == Isa::Avx512Bf16 => Some(bf16dot::weight_backward(x, dy, &g)),
        _ => Some(weight_backward_typed::<half::bf16>(x, dy, &g, isa)),
    }
}

/// `dy` as f32 `[n, co_blocks·cob, od, oh, wv]`: rows of whole vectors, zeros past the output
/// width and past `co` (borrowed when `dy` is f32 and already so shaped).
fn padded_dy<'a, E: Num>(dy: &'a T, g: &Geo) -> std::borrow::Cow<'a, [f32]> {
    let dyd = typed_data::<E>(dy);
    if dy_whole(g)
        && let std::borrow::Cow::Borrowed(s) = dyd
        && let Some(f) = f32_slice(s)
    {
        return std::borrow::Cow::Borrowed(f);
    }
    std::borrow::Cow::Owned(padded_rows(&dyd, g, 0.0, |s| s.f()))
}

/// Whether `dy: [n, co, od, oh, ow]` already is `[n, co_blocks·cob, od, oh, wv]`.
fn dy_whole(g: &Geo) -> bool {
    g.wv == g.out[2] && g.co_blocks() * g.cob == g.co
}

/// `dy: [n, co, od, oh, ow]` as `[n, co_blocks·cob, od, oh, wv]`, each element converted by
/// `f`, `zero` past the output width and past `co`.
fn padded_rows<S: Copy + Sync, D: Copy + Send + Sync>(dyd: &[S], g: &Geo, zero: D, f: impl Fn(S) -> D + Sync) -> Vec<D> {
    let [od, oh, ow] = g.out;
    let cop = g.co_blocks() * g.cob;
    let mut v = vec![zero; g.n * cop * od * oh * g.wv];
    v.par_chunks_mut(od * oh * g.wv).enumerate().for_each(|(nc, dst)| {
        let (n, c) = (nc / cop, nc % cop);
        if c < g.co {
            for r in 0..od * oh {
                let src = &dyd[((n * g.co + c) * od * oh + r) * ow..][..ow];
                dst[r * g.wv..][..ow].iter_mut().zip(src).for_each(|(d, &s)| *d = f(s));
            }
        }
    });
    v
}

fn weight_backward_typed<E: Num>(x: &T, dy: &T, g: &Geo, isa: Isa) -> T {
    let g = *g;
    let xp = padded_input(&typed_data::<E>(x), &g);
    let [od, oh, _] = g.out;
    let dyp = padded_dy::<E>(dy, &g);
    let cob = g.cob;
    weight_from_tiles::<E>(&g, |cb, c, a, b, e0, taps| weight_tile(isa, taps, &xp[(c * g.dp + a) * g.hp * g.wp + b * g.wp + e0..], &dyp[cb * cob * od * oh * g.wv..], &g))
}

/// The weight gradient `[co, ci, kd, kh, kw]` as `E` from tiles: one task per (channel block
/// `cb`, input channel `c`, kernel depth `a`, height `b`, group of [`TAPS`] width taps from
/// `e0`), `tile(cb, c, a, b, e0, taps)` giving the sums at `l·TAPS + e`.
fn weight_from_tiles<E: Num>(g: &Geo, tile: impl Fn(usize, usize, usize, usize, usize, usize) -> [f32; CO_WIDE * TAPS] + Sync) -> T {
    let g = *g;
    let [kd, kh, kw] = g.kernel;
    let groups = kw.div_ceil(TAPS);
    // One task per (co block, ci, a, b, tap group).
    let tasks = g.co_blocks() * g.ci * kd * kh * groups;
    let task = |t: usize| {
        let (rest, q) = (t / groups, t % groups);
        let (rest, b) = (rest / kh, rest % kh);
        let (rest, a) = (rest / kd, rest % kd);
        (rest / g.ci, rest % g.ci, a, b, q)
    };
    let cob = g.cob;
    let sums: Vec<[f32; CO_WIDE * TAPS]> = (0..tasks)
        .into_par_iter()
        .map(|t| {
            let (cb, c, a, b, q) = task(t);
            let e0 = q * TAPS;
            tile(cb, c, a, b, e0, (kw - e0).min(TAPS))
        })
        .collect();
    let kv = g.kvol();
    let mut dw = vec![0f32; g.co * g.ci * kv];
    for (t, s) in sums.iter().enumerate() {
        let (cb, c, a, b, q) = task(t);
        for l in 0..(g.co - cb * cob).min(cob) {
            for k in 0..(kw - q * TAPS).min(TAPS) {
                dw[((cb * cob + l) * g.ci + c) * kv + (a * kh + b) * kw + q * TAPS + k] = s[l * TAPS + k];
            }
        }
    }
    typed(dw.into_iter().map(E::of).collect::<Vec<E>>(), vec![g.co, g.ci, kd, kh, kw])
}

/// `Σ_{n, z, y, i} dy[n, l, z, y, i] · x(n, z, y)[i + e]` for the tile's `g.cob` output
/// channels `l` (at `l·TAPS + e` of the result) and `taps` taps `e`: `x` starts at the padded
/// input of sample 0 at the tile's channel, depth `a`, height `b`, width tap `e0`; `dy` at
/// sample 0, the block's first channel.
fn weight_tile(isa: Isa, taps: usize, x: &[f32], dy: &[f32], g: &Geo) -> [f32; CO_WIDE * TAPS] {
    let [od, oh, _] = g.out;
    let cob = g.cob;
    let (xn, dyn_, dyc) = g.dy_strides();
    let last_x = (g.n - 1) * xn + ((od - 1) * g.hp + oh - 1) * g.wp + g.wv - 1 + taps - 1;
    let last_dy = (g.n - 1) * dyn_ + (cob - 1) * dyc + od * oh * g.wv - 1;
    assert!(last_x < x.len() && last_dy < dy.len());
    assert!(isa.supported(), "the caller picks a level the CPU has");
    #[cfg(target_arch = "x86_64")]
    {
        let (xp, dp) = (x.as_ptr(), dy.as_ptr());
        match isa {
            // SAFETY: AVX-512 F/VL and FMA are supported (asserted); every read is within `x`
            // and `dy` (checked above; masked lanes are not read).
            Isa::Avx512 | Isa::Avx512Bf16 => unsafe {
                // Rows of 8 positions: two rows per 16-lane vector.
                if g.wv == 8 {
                    return match (cob, taps) {
                        (CO_WIDE, 3) => avx512::weight_tile_rows::<CO_WIDE, 3>(xp, dp, g),
                        (CO_WIDE, 2) => avx512::weight_tile_rows::<CO_WIDE, 2>(xp, dp, g),
                        (CO_WIDE, _) => avx512::weight_tile_rows::<CO_WIDE, 1>(xp, dp, g),
                        (_, 3) => avx512::weight_tile_rows::<CO, 3>(xp, dp, g),
                        (_, 2) => avx512::weight_tile_rows::<CO, 2>(xp, dp, g),
                        _ => avx512::weight_tile_rows::<CO, 1>(xp, dp, g),
                    };
                }
                return match (cob, taps) {
                    (CO_WIDE, 3) => avx512::weight_tile::<CO_WIDE, 3>(xp, dp, g),
                    (CO_WIDE, 2) => avx512::weight_tile::<CO_WIDE, 2>(xp, dp, g),
                    (CO_WIDE, _) => avx512::weight_tile::<CO_WIDE, 1>(xp, dp, g),
                    (_, 3) => avx512::weight_tile::<CO, 3>(xp, dp, g),
                    (_, 2) => avx512::weight_tile::<CO, 2>(xp, dp, g),
                    _ => avx512::weight_tile::<CO, 1>(xp, dp, g),
                };
            },
            // SAFETY: AVX2 and FMA are supported (asserted); every read is within `x` and `dy`.
            Isa::Avx2 => unsafe {
                return match taps {
                    3 => avx2::weight_tile::<3>(xp, dp, g),
                    2 => avx2::weight_tile::<2>(xp, dp, g),
                    _ => avx2::weight_tile::<1>(xp, dp, g),
                };
            },
            Isa::Scalar => {}
        }
    }
    let mut acc = [[0f32; LANES]; CO_WIDE * TAPS];
    for n in 0..g.n {
        for z in 0..od {
            for y in 0..oh {
                let xr = &x[n * xn + (z * g.hp + y) * g.wp..];
                let dr = n * dyn_ + (z * oh + y) * g.wv;
                for v in (0..g.wv).step_by(LANES) {
                    for l in 0..cob {
                        let d = &dy[dr + l * dyc + v..][..LANES];
                        for e in 0..taps {
                            let xs = &xr[v + e..][..LANES];
                            acc[l * TAPS + e].iter_mut().zip(d.iter().zip(xs)).for_each(|(s, (&d, &x))| *s += d * x);
                        }
                    }
                }
            }
        }
    }
    acc.map(|a| a.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::ops::ModuleOps;
    use burn::tensor::ops::FloatTensorOps;
    use burn::tensor::{FloatDType, Tensor, TensorPrimitive};

    type B = Flex;

    /// Uniform(-1, 1) values from `seed` alone, drawn on the host (an LCG): seeding the
    /// device's generator and drawing from it races with tests seeding it in parallel.
    fn rand(shape: [usize; 5], seed: u64) -> T {
        let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
        let values: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Tensor::<B, 5>::from_data(burn::tensor::TensorData::new(values, shape), &Default::default()).into_primitive().tensor()
    }

    fn vals(t: T) -> Vec<f32> {
        Tensor::<B, 5>::from_primitive(TensorPrimitive::Float(t)).into_data().to_vec().unwrap()
    }

    /// Forward and weight gradient against flex's own (im2col) convolution: kernel 3³ and
    /// 1³, uneven kernels, widths that are not whole vectors, output channels that are not
    /// whole tiles, padding beyond the kernel's reach, rows of 1–5 vectors of 8 (AVX-512's masked
    /// row ends, 24- and 32-position tiles); at every level the CPU has (the others say they skip).
    /// bf16 at `avx512bf16` runs the `vdpbf16ps` kernels: odd channel counts (a pair's zero
    /// half), weight-gradient rows ending in 8, 16 or 24 positions of a 32-position vector, and
    /// rows of 16 or 8 positions packed 2 or 4 to a vector, with a short last group.
    #[test]
    fn direct_conv3d_equals_flex() {
        let cases: [([usize; 5], [usize; 5], [usize; 3]); 11] = [
            ([2, 3, 4, 5, 6], [5, 3, 3, 3, 3], [1, 1, 1]),
            ([1, 16, 4, 8, 16], [16, 16, 3, 3, 3], [1, 1, 1]),
            ([2, 4, 3, 4, 19], [6, 4, 1, 1, 1], [0, 0, 0]),
            ([1, 2, 5, 6, 7], [3, 2, 2, 3, 5], [0, 1, 2]),
            ([1, 3, 2, 3, 9], [4, 3, 3, 3, 3], [2, 2, 2]),
            ([3, 5, 2, 2, 33], [9, 5, 1, 3, 3], [0, 1, 1]),
            ([2, 6, 3, 3, 22], [12, 6, 3, 3, 3], [1, 1, 1]),
            ([1, 8, 2, 5, 40], [8, 8, 1, 3, 3], [0, 1, 1]),
            // Rows of 16 and of 8 positions, an odd number of them (weight-gradient vectors
            // holding 2 or 4 rows, the last group short).
            ([2, 5, 3, 5, 14], [8, 5, 3, 3, 3], [1, 1, 1]),
            ([2, 4, 3, 3, 8], [4, 4, 3, 3, 3], [1, 1, 1]),
            // Forward tiles of 4 + 2 rows of 8 (8 output channels).
            ([1, 3, 2, 6, 5], [8, 3, 3, 3, 3], [1, 1, 1]),
        ];
        for isa in Isa::ALL.into_iter().filter(|l| !l.supported()) {
            eprintln!("direct_conv3d_equals_flex: skipping the {} tiles: this CPU has only {}", isa.name(), Isa::detected().name());
        }
        for (i, (xs, ws, pad)) in cases.into_iter().enumerate() {
            let (x, w, b) = (rand(xs, 3 * i as u64), rand(ws, 3 * i as u64 + 1), rand([1, 1, 1, 1, ws[0]], 3 * i as u64 + 2));
            let b = b.reshape(vec![ws[0]].into());
            let o = ConvOptions::new([1; 3], pad, [1; 3], 1);
            let reference = <B as ModuleOps<B>>::conv3d(x.clone(), w.clone(), Some(b.clone()), o.clone());
            let oshape: [usize; 5] = reference.layout().shape().to_vec().try_into().unwrap();
            let dy = rand(oshape, 100 + i as u64);
            let dw_ref = <B as ModuleOps<B>>::conv3d_weight_backward(x.clone(), w.clone(), dy.clone(), o.clone());
            let (y_ref, dw_ref) = (vals(reference), vals(dw_ref));
            for isa in Isa::ALL.into_iter().filter(|l| l.supported()) {
                let what = format!("case {i} {xs:?} * {ws:?} pad {pad:?}, {}", isa.name());
                let y = conv3d_with(&x, &w, Some(&b), &o, isa).expect("handled");
                vramlab_testkit::assert_close(&format!("{what}: forward"), &vals(y), &y_ref, 1e-5);
                let dw = conv3d_weight_backward_with(&x, &w, &dy, &o, isa).expect("handled");
                vramlab_testkit::assert_close(&format!("{what}: weight gradient"), &vals(dw), &dw_ref, 1e-5);
            }
            // bf16: read and written in bf16, summed in f32, so equal to the f32 convolution
            // of the bf16-rounded tensors up to the output's bf16 rounding (2⁻⁸ relative).
            let half = |t: &T| B::float_cast(t.clone(), FloatDType::BF16);
            let back = |t: T| B::float_cast(t, FloatDType::F32);
            let (xh, wh, bh, dyh) = (half(&x), half(&w), half(&b), half(&dy));
            let (xr, wr, br, dyr) = (back(xh.clone()), back(wh.clone()), back(bh.clone()), back(dyh.clone()));
            let y_ref = vals(<B as ModuleOps<B>>::conv3d(xr.clone(), wr.clone(), Some(br), o.clone()));
            let dw_ref = vals(<B as ModuleOps<B>>::conv3d_weight_backward(xr, wr, dyr, o.clone()));
            for isa in Isa::ALL.into_iter().filter(|l| l.supported()) {
                let y = conv3d_with(&xh, &wh, Some(&bh), &o, isa).expect("bf16 handled");
                let dw = conv3d_weight_backward_with(&xh, &wh, &dyh, &o, isa).expect("bf16 handled");
                assert!(y.dtype() == DType::BF16 && dw.dtype() == DType::BF16, "case {i}: bf16 in, bf16 out");
                within_bf16(&vals(back(y)), &y_ref, &format!("case {i}: bf16 forward, {}", isa.name()));
                within_bf16(&vals(back(dw)), &dw_ref, &format!("case {i}: bf16 weight gradient, {}", isa.name()));
            }
        }
    }

    fn within_bf16(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= y.abs() * 2f32.powi(-8) + 1e-6, "{what}: element {i}: {x} vs {y}");
        }
    }

    #[test]
    fn declines_what_flex_should_run() {
        let (x, w) = (rand([1, 2, 4, 4, 4], 1), rand([2, 2, 3, 3, 3], 2));
        assert!(handles(&x, &w, &ConvOptions::new([2, 1, 1], [1; 3], [1; 3], 1), Isa::Scalar).is_none(), "strided");
        assert!(handles(&x, &w, &ConvOptions::new([1; 3], [1; 3], [2, 1, 1], 1), Isa::Scalar).is_none(), "dilated");
        assert!(handles(&x, &w, &ConvOptions::new([1; 3], [0; 3], [1; 3], 1), Isa::Scalar).is_some());
        let wide = rand([2, 128, 3, 3, 3], 3);
        let xw = rand([1, 128, 3, 3, 3], 4);
        assert!(handles(&xw, &wide, &ConvOptions::new([1; 3], [1; 3], [1; 3], 1), Isa::Scalar).is_none(), "long reduction: flex's GEMM");
    }
}
