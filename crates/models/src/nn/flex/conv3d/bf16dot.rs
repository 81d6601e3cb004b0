//! The direct 3-D convolution of bf16 tensors at [`Isa::Avx512Bf16`]: AVX512-BF16's
//! `vdpbf16ps` multiplies pairs of bf16 and adds both products to an f32 lane, so the sums
//! stay f32 (as at the other levels) while each instruction does two multiply-adds per lane
//! and the operands are read as bf16 (half the bytes of the f32 copies the other levels make).
//!
//! The pairs run along a reduction axis:
//! - forward (and, through it, the stride-1 input gradient): pairs of input channels. The
//!   padded input is `[n, ⌈ci/2⌉, dp, hp, wp]` of 32-bit words, each holding channel `2c` (low
//!   half) and `2c + 1` (high half, zero past `ci`); the packed weight holds the same pairs,
//!   `[co_block, ⌈ci/2⌉, kd, kh, kw, cob]`. The tile is [`super::avx512`]'s forward tile with
//!   one broadcast word (two weights) per output channel and tap, over half as many channels.
//! - weight gradient: pairs of consecutive output positions. `dy` and the padded input stay in
//!   their own layout (bf16, rows of whole 8-position vectors), so one 32-element load is 16
//!   pairs of positions; each tile accumulates `dy · x` over 32 positions per instruction.
//!
//! Products of two bf16 are exact in f32; the sums differ from the other levels' only in f32
//! rounding and order (`vdpbf16ps` also treats subnormal inputs as zero and rounds to nearest
//! even regardless of MXCSR). The output is rounded to bf16 as at the other levels.

use std::borrow::Cow;

use half::bf16;

use super::{CO, CO_WIDE, Geo, Isa, MAX_STEP, T, TAPS, bias_f32, dy_whole, output_rows, padded, padded_rows, typed_data, weight_from_tiles};

/// A bf16 tensor's elements as their bit patterns (borrowed when the layout is row-major).
fn bits(t: &T) -> Cow<'_, [u16]> {
    match typed_data::<bf16>(t) {
        Cow::Borrowed(s) => Cow::Borrowed(bytemuck::cast_slice(s)),
        Cow::Owned(v) => Cow::Owned(v.into_iter().map(bf16::to_bits).collect()),
    }
}

/// Number of channel pairs.
fn pairs(g: &Geo) -> usize {
    g.ci.div_ceil(2)
}

/// The bf16 forward (see the module docs); `g` from [`super::handles`] at [`Isa::Avx512Bf16`].
pub(super) fn conv3d(x: &T, w: &T, bias: Option<&T>, g: &Geo) -> T {
    let g = *g;
    let xp = paired_input(&bits(x), &g);
    let wk = paired_weight(&bits(w), &g);
    let bias = bias_f32::<bf16>(bias);
    let wlen = pairs(&g) * g.kvol() * g.cob;
    output_rows::<bf16>(&g, bias.as_deref(), Isa::Avx512Bf16, |n, cb, z, yy, x0, step, tile| {
        let row = &xp[(n * pairs(&g) * g.dp + z) * g.hp * g.wp + yy * g.wp + x0..];
        forward_tile(step, row, &g, &wk[cb * wlen..][..wlen], tile);
    })
}

/// `x: [n, ci, d, h, w]` (bf16 bits) zero-padded to `[n, ⌈ci/2⌉, dp, hp, wp]` words of two
/// channels, `2c` in the low half.
fn paired_input(x: &[u16], g: &Geo) -> Vec<u32> {
    use rayon::prelude::*;
    let [d, h, w] = g.input;
    let (cp, vol) = (pairs(g), d * h * w);
    let len = g.n * cp * g.plane();
    let mut xp: Vec<u32> = Vec::with_capacity(len);
    xp.spare_capacity_mut()[..len].par_chunks_mut(g.plane()).enumerate().for_each(|(np, dst)| {
        dst.iter_mut().for_each(|v| {
            v.write(0);
        });
        let (n, c) = (np / cp, 2 * (np % cp));
        let lo = &x[(n * g.ci + c) * vol..][..vol];
        let hi = (c + 1 < g.ci).then(|| &x[(n * g.ci + c + 1) * vol..][..vol]);
        for z in 0..d {
            for y in 0..h {
                let o = ((z + g.pad[0]) * g.hp + y + g.pad[1]) * g.wp + g.pad[2];
                let s = (z * h + y) * w;
                let dst = &mut dst[o..o + w];
                match hi {
                    Some(hi) => dst.iter_mut().zip(&lo[s..s + w]).zip(&hi[s..s + w]).for_each(|((v, &l), &h)| {
                        v.write(l as u32 | (h as u32) << 16);
                    }),
                    None => dst.iter_mut().zip(&lo[s..s + w]).for_each(|(v, &l)| {
                        v.write(l as u32);
                    }),
                }
            }
        }
    });
    // SAFETY: every plane, hence every element of the first `len`, was written above.
    unsafe { xp.set_len(len) };
    xp
}

/// `w: [co, ci, kd, kh, kw]` (bf16 bits) as `[co_block, ⌈ci/2⌉, kd, kh, kw, cob]` words of two
/// input channels (zeros past `co` and `ci`).
fn paired_weight(w: &[u16], g: &Geo) -> Vec<u32> {
    let (kv, cob, cp) = (g.kvol(), g.cob, pairs(g));
    let mut out = vec![0u32; g.co_blocks() * cp * kv * cob];
    for co in 0..g.co {
        let (b, lane) = (co / cob, co % cob);
        for c in 0..g.ci {
            for k in 0..kv {
                out[((b * cp + c / 2) * kv + k) * cob + lane] |= (w[(co * g.ci + c) * kv + k] as u32) << (16 * (c % 2));
            }
        }
    }
    out
}

/// [`super::forward_tile`] on channel pairs: `row` starts at the tile's first position in the
/// paired input of pair 0 (depth row `z`, height row `y`), `w` is the block's paired weight.
fn forward_tile(step: usize, row: &[u32], g: &Geo, w: &[u32], tile: &mut [f32; CO_WIDE * MAX_STEP]) {
    let cp = pairs(g);
    let (cs, ps, rs) = (g.plane(), g.hp * g.wp, g.wp);
    // Rows of 8 packed into one tile (see `super::output_rows`): `rows` rows `rs` apart.
    let rows = if g.wv == 8 && step > 8 { step / 8 } else { 1 };
    let span = if rows > 1 { (rows - 1) * rs + 8 } else { step };
    let last = (cp - 1) * cs + (g.kernel[0] - 1) * ps + (g.kernel[1] - 1) * rs + g.kernel[2] - 1 + span - 1;
    assert!(last < row.len() && w.len() == cp * g.kvol() * g.cob && step.is_multiple_of(8) && step <= MAX_STEP);
    assert!(Isa::Avx512Bf16.supported(), "the caller checks the CPU has AVX512-BF16");
    #[cfg(target_arch = "x86_64")]
    {
        let (r, wp, t, st) = (row.as_ptr(), w.as_ptr(), tile.as_mut_ptr(), [cs, ps, rs]);
        if rows > 1 {
            // SAFETY: as below; every read is within `row` (`last` above).
            unsafe {
                match (g.cob, rows > 2) {
                    (CO_WIDE, true) => forward_kernel_rows::<CO_WIDE, 2>(r, st, cp, g.kernel, wp, t, rows),
                    (CO_WIDE, false) => forward_kernel_rows::<CO_WIDE, 1>(r, st, cp, g.kernel, wp, t, rows),
                    (_, true) => forward_kernel_rows::<CO, 2>(r, st, cp, g.kernel, wp, t, rows),
                    (_, false) => forward_kernel_rows::<CO, 1>(r, st, cp, g.kernel, wp, t, rows),
                }
            }
            return;
        }
        let mask: u16 = if step.is_multiple_of(16) { 0xFFFF } else { 0x00FF };
        // SAFETY: AVX-512 F/BW/VL and BF16 are supported (asserted); every read is within
        // `row` and `w` (checked above; masked lanes are not read); `tile` holds cob·step values.
        unsafe {
            match (g.cob, step > 16) {
                (CO_WIDE, true) => forward_kernel::<CO_WIDE, 2>(r, st, cp, g.kernel, wp, t, mask),
                (CO_WIDE, false) => forward_kernel::<CO_WIDE, 1>(r, st, cp, g.kernel, wp, t, mask),
                (_, true) => forward_kernel::<CO, 2>(r, st, cp, g.kernel, wp, t, mask),
                (_, false) => forward_kernel::<CO, 1>(r, st, cp, g.kernel, wp, t, mask),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("AVX512-BF16 is x86-64 only (asserted above)");
}

/// The bf16 weight gradient (see the module docs); `g` from [`super::handles`] at
/// [`Isa::Avx512Bf16`].
pub(super) fn weight_backward(x: &T, dy: &T, g: &Geo) -> T {
    let g = *g;
    let xp = padded(&bits(x), &g, 0u16, |v| v);
    let dyb = bits(dy);
    let dyp = match dyb {
        Cow::Borrowed(s) if dy_whole(&g) => Cow::Borrowed(s),
        _ => Cow::Owned(padded_rows(&dyb, &g, 0u16, |v| v)),
    };
    let [od, oh, _] = g.out;
    let cob = g.cob;
    weight_from_tiles::<bf16>(&g, |cb, c, a, b, e0, taps| weight_tile(taps, &xp[(c * g.dp + a) * g.hp * g.wp + b * g.wp + e0..], &dyp[cb * cob * od * oh * g.wv..], &g))
}

/// [`super::weight_tile`] on bf16 bits, pairs of positions per lane.
fn weight_tile(taps: usize, x: &[u16], dy: &[u16], g: &Geo) -> [f32; CO_WIDE * TAPS] {
    let [od, oh, _] = g.out;
    let cob = g.cob;
    let (xn, dyn_, dyc) = g.dy_strides();
    let last_x = (g.n - 1) * xn + ((od - 1) * g.hp + oh - 1) * g.wp + g.wv - 1 + taps - 1;
    let last_dy = (g.n - 1) * dyn_ + (cob - 1) * dyc + od * oh * g.wv - 1;
    assert!(last_x < x.len() && last_dy < dy.len() && (1..=TAPS).contains(&taps));
    assert!(Isa::Avx512Bf16.supported(), "the caller checks the CPU has AVX512-BF16");
    #[cfg(target_arch = "x86_64")]
    {
        let (xp, dp) = (x.as_ptr(), dy.as_ptr());
        // SAFETY: AVX-512 F/BW/VL and BF16 are supported (asserted); every read is within `x`
        // and `dy` (checked above; masked lanes are not read).
        unsafe {
            // Rows of 16 or 8 positions: 2 or 4 rows per 32-position vector.
            match (g.wv, cob, taps) {
                (16, CO_WIDE, 3) => return weight_kernel_rows::<CO_WIDE, 3, 2>(xp, dp, g),
                (16, CO_WIDE, 2) => return weight_kernel_rows::<CO_WIDE, 2, 2>(xp, dp, g),
                (16, CO_WIDE, _) => return weight_kernel_rows::<CO_WIDE, 1, 2>(xp, dp, g),
                (16, _, 3) => return weight_kernel_rows::<CO, 3, 2>(xp, dp, g),
                (16, _, 2) => return weight_kernel_rows::<CO, 2, 2>(xp, dp, g),
                (16, _, _) => return weight_kernel_rows::<CO, 1, 2>(xp, dp, g),
                (8, CO_WIDE, 3) => return weight_kernel_rows::<CO_WIDE, 3, 4>(xp, dp, g),
                (8, CO_WIDE, 2) => return weight_kernel_rows::<CO_WIDE, 2, 4>(xp, dp, g),
                (8, CO_WIDE, _) => return weight_kernel_rows::<CO_WIDE, 1, 4>(xp, dp, g),
                (8, _, 3) => return weight_kernel_rows::<CO, 3, 4>(xp, dp, g),
                (8, _, 2) => return weight_kernel_rows::<CO, 2, 4>(xp, dp, g),
                (8, _, _) => return weight_kernel_rows::<CO, 1, 4>(xp, dp, g),
                _ => {}
            }
            match (cob, taps) {
                (CO_WIDE, 3) => weight_kernel::<CO_WIDE, 3>(xp, dp, g),
                (CO_WIDE, 2) => weight_kernel::<CO_WIDE, 2>(xp, dp, g),
                (CO_WIDE, _) => weight_kernel::<CO_WIDE, 1>(xp, dp, g),
                (_, 3) => weight_kernel::<CO, 3>(xp, dp, g),
                (_, 2) => weight_kernel::<CO, 2>(xp, dp, g),
                _ => weight_kernel::<CO, 1>(xp, dp, g),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("AVX512-BF16 is x86-64 only (asserted above)");
}

/// 32 bf16 as the pairs `vdpbf16ps` takes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn bh(v: std::arch::x86_64::__m512i) -> std::arch::x86_64::__m512bh {
    // SAFETY: both are 64-byte vectors of plain bits.
    unsafe { std::mem::transmute(v) }
}

/// The forward tile: `C × NV` f32 accumulators of 16 positions, each `vdpbf16ps` adding one
/// channel pair's products at one tap; `mask` the lanes of the last vector.
///
/// # Safety
/// AVX-512 F/BW/VL and BF16 available; `row` readable up to the last tap of the last unmasked
/// lane of pair `cp − 1`, `w` holds `cp·k³·C` words, `tile` writable for `C` rows of the tile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn forward_kernel<const C: usize, const NV: usize>(row: *const u32, strides: [usize; 3], cp: usize, k: [usize; 3], w: *const u32, tile: *mut f32, mask: u16) {
    use std::arch::x86_64::*;
    let [cs, ps, rs] = strides;
    let mut acc = [[_mm512_setzero_ps(); NV]; C];
    let mut wp = w;
    // SAFETY: the caller's bounds.
    unsafe {
        for c in 0..cp {
            for a in 0..k[0] {
                for b in 0..k[1] {
                    let r = row.add(c * cs + a * ps + b * rs);
                    for e in 0..k[2] {
                        let mut xv = [_mm512_setzero_si512(); NV];
                        for (j, v) in xv.iter_mut().enumerate() {
                            let p = r.add(e + j * 16);
                            *v = if j + 1 < NV { _mm512_loadu_si512(p.cast()) } else { _mm512_maskz_loadu_epi32(mask, p.cast()) };
                        }
                        for (l, acc) in acc.iter_mut().enumerate() {
                            let wv = bh(_mm512_set1_epi32(*wp.add(l) as i32));
                            for j in 0..NV {
                                acc[j] = _mm512_dpbf16_ps(acc[j], bh(xv[j]), wv);
                            }
                        }
                        wp = wp.add(C);
                    }
                }
            }
        }
        let step = 16 * (NV - 1) + mask.count_ones() as usize;
        for (l, acc) in acc.iter().enumerate() {
            for (j, &v) in acc.iter().enumerate() {
                let m = if j + 1 < NV { 0xFFFF } else { mask };
                _mm512_mask_storeu_ps(tile.add(l * step + j * 16), m, v);
            }
        }
    }
}

/// The weight-gradient tile: `C × K` f32 accumulators over every output row, each row in
/// vectors of 32 positions (16 pairs) and a last one masked to the row's remaining 8, 16 or 24.
///
/// # Safety
/// AVX-512 F/BW/VL and BF16 available; `g.cob == C`; `x` and `dy` readable as
/// [`weight_tile`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn weight_kernel<const C: usize, const K: usize>(x: *const u16, dy: *const u16, g: &Geo) -> [f32; CO_WIDE * TAPS] {
    use std::arch::x86_64::*;
    debug_assert_eq!(g.cob, C);
    let [od, oh, _] = g.out;
    let (xn, dyn_, dyc) = g.dy_strides();
    let whole = g.wv / 32 * 32;
    let tail: u32 = ((1u64 << (g.wv - whole)) - 1) as u32;
    let mut acc = [[_mm512_setzero_ps(); K]; C];
    // SAFETY: the caller's bounds.
    unsafe {
        for n in 0..g.n {
            for z in 0..od {
                for y in 0..oh {
                    let xr = x.add(n * xn + (z * g.hp + y) * g.wp);
                    let dr = dy.add(n * dyn_ + (z * oh + y) * g.wv);
                    let mut v = 0;
                    while v < whole {
                        let mut xv = [_mm512_setzero_si512(); K];
                        for (e, xv) in xv.iter_mut().enumerate() {
                            *xv = _mm512_loadu_si512(xr.add(v + e).cast());
                        }
                        for (l, acc) in acc.iter_mut().enumerate() {
                            let d = bh(_mm512_loadu_si512(dr.add(l * dyc + v).cast()));
                            for e in 0..K {
                                acc[e] = _mm512_dpbf16_ps(acc[e], d, bh(xv[e]));
                            }
                        }
                        v += 32;
                    }
                    if tail != 0 {
                        let mut xv = [_mm512_setzero_si512(); K];
                        for (e, xv) in xv.iter_mut().enumerate() {
                            *xv = _mm512_maskz_loadu_epi16(tail, xr.add(whole + e).cast());
                        }
                        for (l, acc) in acc.iter_mut().enumerate() {
                            let d = bh(_mm512_maskz_loadu_epi16(tail, dr.add(l * dyc + whole).cast()));
                            for e in 0..K {
                                acc[e] = _mm512_dpbf16_ps(acc[e], d, bh(xv[e]));
                            }
                        }
                    }
                }
            }
        }
        super::avx512::weight_sums(&acc)
    }
}

/// [`weight_kernel`] for rows of `32 / R` positions (`g.wv` 16 or 8), `R` rows per vector, so
/// no lane idles at a row's end: `dy`'s rows are consecutive (row stride `wv`), one load covers
/// `R` of them; the input's rows are `wp` apart (each carries the taps' halo), so each vector of
/// the input is put together from `R` row pieces. A last group of fewer than `R` rows is masked.
///
/// # Safety
/// As [`weight_kernel`]; `g.wv == 32 / R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2")]
unsafe fn weight_kernel_rows<const C: usize, const K: usize, const R: usize>(x: *const u16, dy: *const u16, g: &Geo) -> [f32; CO_WIDE * TAPS] {
    use std::arch::x86_64::*;
    debug_assert!(g.cob == C && g.wv * R == 32);
    let [od, oh, _] = g.out;
    let rows = od * oh;
    let (xn, dyn_, dyc) = g.dy_strides();
    let mut acc = [[_mm512_setzero_ps(); K]; C];
    // SAFETY: the caller's bounds (every piece read lies in a row the scalar path reads).
    unsafe {
        for n in 0..g.n {
            let (xs, ds) = (x.add(n * xn), dy.add(n * dyn_));
            let mut r = 0;
            while r < rows {
                let cnt = (rows - r).min(R);
                let mut at = [0usize; R];
                for (j, at) in at.iter_mut().enumerate() {
                    *at = if j < cnt { g.row_offset(r + j) } else { usize::MAX };
                }
                let mut xv = [_mm512_setzero_si512(); K];
                for (e, xv) in xv.iter_mut().enumerate() {
                    *xv = if R == 2 {
                        let lo = _mm256_loadu_si256(xs.add(at[0] + e).cast());
                        let hi = if cnt > 1 { _mm256_loadu_si256(xs.add(at[1] + e).cast()) } else { _mm256_setzero_si256() };
                        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                    } else {
                        let q = |j: usize| if j < cnt { _mm_loadu_si128(xs.add(at[j] + e).cast()) } else { _mm_setzero_si128() };
                        let lo = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q(0)), q(1));
                        let hi = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q(2)), q(3));
                        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                    };
                }
                let mask: u32 = if cnt == R { u32::MAX } else { ((1u64 << (cnt * g.wv)) - 1) as u32 };
                for (l, acc) in acc.iter_mut().enumerate() {
                    let d = bh(_mm512_maskz_loadu_epi16(mask, ds.add(l * dyc + r * g.wv).cast()));
                    for e in 0..K {
                        acc[e] = _mm512_dpbf16_ps(acc[e], d, bh(xv[e]));
                    }
                }
                r += R;
            }
        }
        super::avx512::weight_sums(&acc)
    }
}

/// [`forward_kernel`] for rows of 8 positions: `rows` (2–4) consecutive output rows, `rs` apart
/// in the paired input, two per 16-lane vector (`NV` = ⌈rows / 2⌉ vectors); row `k` of channel
/// `l` goes to `tile[l·8·rows + 8k ..][..8]`.
///
/// # Safety
/// As [`forward_kernel`], with `row` readable up to the last tap of row `rows − 1`'s 8th position.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn forward_kernel_rows<const C: usize, const NV: usize>(row: *const u32, strides: [usize; 3], cp: usize, k: [usize; 3], w: *const u32, tile: *mut f32, rows: usize) {
    use std::arch::x86_64::*;
    debug_assert!(rows > 2 * (NV - 1) && rows <= 2 * NV);
    let [cs, ps, rs] = strides;
    let mut acc = [[_mm512_setzero_ps(); NV]; C];
    let mut wp = w;
    // SAFETY: the caller's bounds.
    unsafe {
        for c in 0..cp {
            for a in 0..k[0] {
                for b in 0..k[1] {
                    let r = row.add(c * cs + a * ps + b * rs);
                    for e in 0..k[2] {
                        let mut xv = [_mm512_setzero_si512(); NV];
                        for (j, v) in xv.iter_mut().enumerate() {
                            let lo = _mm256_loadu_si256(r.add(2 * j * rs + e).cast());
                            let hi = if 2 * j + 1 < rows { _mm256_loadu_si256(r.add((2 * j + 1) * rs + e).cast()) } else { _mm256_setzero_si256() };
                            *v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                        }
                        for (l, acc) in acc.iter_mut().enumerate() {
                            let wv = bh(_mm512_set1_epi32(*wp.add(l) as i32));
                            for j in 0..NV {
                                acc[j] = _mm512_dpbf16_ps(acc[j], bh(xv[j]), wv);
                            }
                        }
                        wp = wp.add(C);
                    }
                }
            }
        }
        let step = 8 * rows;
        for (l, acc) in acc.iter().enumerate() {
            for (j, &v) in acc.iter().enumerate() {
                let m = if 2 * j + 1 < rows { 0xFFFF } else { 0x00FF };
                _mm512_mask_storeu_ps(tile.add(l * step + j * 16), m, v);
            }
        }
    }
}
