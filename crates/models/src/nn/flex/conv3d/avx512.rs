//! The direct 3-D convolution's AVX-512 tiles ([`super::forward_tile`] and
//! [`super::weight_tile`] at [`super::Isa::Avx512`]): 16-lane vectors, 4 or 8 output channels,
//! the last vector of a row masked to its lower 8 lanes where the row ends there (masked lanes
//! are neither read nor written).

#[cfg(target_arch = "x86_64")]
use super::{Geo, TAPS};

/// [`super::forward_tile`] on AVX-512: `C × NV` accumulators of 16 positions; `mask` the
/// lanes of the last vector.
///
/// # Safety
/// AVX-512 F/VL and FMA available; `row` readable up to the last tap of the last unmasked
/// lane, `w` holds `ci·k³·C` values, `tile` writable for `C` rows of the tile's positions.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn forward_tile<const C: usize, const NV: usize>(row: *const f32, strides: [usize; 3], ci: usize, k: [usize; 3], w: *const f32, tile: *mut f32, mask: u16) {
    use std::arch::x86_64::*;
    let [cs, ps, rs] = strides;
    let mut acc = [[_mm512_setzero_ps(); NV]; C];
    let mut wp = w;
    // SAFETY: the caller's bounds.
    unsafe {
        for c in 0..ci {
            for a in 0..k[0] {
                for b in 0..k[1] {
                    let r = row.add(c * cs + a * ps + b * rs);
                    for e in 0..k[2] {
                        let mut xv = [_mm512_setzero_ps(); NV];
                        for (j, v) in xv.iter_mut().enumerate() {
                            *v = if j + 1 < NV { _mm512_loadu_ps(r.add(e + j * 16)) } else { _mm512_maskz_loadu_ps(mask, r.add(e + j * 16)) };
                        }
                        for (l, acc) in acc.iter_mut().enumerate() {
                            let wv = _mm512_set1_ps(*wp.add(l));
                            for j in 0..NV {
                                acc[j] = _mm512_fmadd_ps(wv, xv[j], acc[j]);
                            }
                        }
                        wp = wp.add(C);
                    }
                }
            }
        }
        // Tile rows are `step` long: 16·(NV−1) + 16 or + 8.
        let step = 16 * (NV - 1) + mask.count_ones() as usize;
        for (l, acc) in acc.iter().enumerate() {
            for (j, &v) in acc.iter().enumerate() {
                let m = if j + 1 < NV { 0xFFFF } else { mask };
                _mm512_mask_storeu_ps(tile.add(l * step + j * 16), m, v);
            }
        }
    }
}

/// [`super::weight_tile`] on AVX-512: `C × K` accumulators over every output row, each row
/// in vectors of 16 positions and, where it is an odd number of 8-lane vectors, a last
/// vector masked to 8.
///
/// # Safety
/// AVX-512 F/VL and FMA available; `g.cob == C`; `x` and `dy` readable as
/// [`super::weight_tile`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub unsafe fn weight_tile<const C: usize, const K: usize>(x: *const f32, dy: *const f32, g: &Geo) -> [f32; super::CO_WIDE * TAPS] {
    use std::arch::x86_64::*;
    debug_assert_eq!(g.cob, C);
    let [od, oh, _] = g.out;
    let (xn, dyn_, dyc) = g.dy_strides();
    let (whole, tail) = (g.wv / 16 * 16, !g.wv.is_multiple_of(16));
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
                        let mut xv = [_mm512_setzero_ps(); K];
                        for (e, xv) in xv.iter_mut().enumerate() {
                            *xv = _mm512_loadu_ps(xr.add(v + e));
                        }
                        for (l, acc) in acc.iter_mut().enumerate() {
                            let d = _mm512_loadu_ps(dr.add(l * dyc + v));
                            for e in 0..K {
                                acc[e] = _mm512_fmadd_ps(d, xv[e], acc[e]);
                            }
                        }
                        v += 16;
                    }
                    if tail {
                        let mut xv = [_mm512_setzero_ps(); K];
                        for (e, xv) in xv.iter_mut().enumerate() {
                            *xv = _mm512_maskz_loadu_ps(0x00FF, xr.add(whole + e));
                        }
                        for (l, acc) in acc.iter_mut().enumerate() {
                            let d = _mm512_maskz_loadu_ps(0x00FF, dr.add(l * dyc + whole));
                            for e in 0..K {
                                acc[e] = _mm512_fmadd_ps(d, xv[e], acc[e]);
                            }
                        }
                    }
                }
            }
        }
        weight_sums(&acc)
    }
}

/// [`weight_tile`] for rows of 8 positions (`g.wv == 8`): two rows per 16-lane vector, so no
/// lane idles at a row's end. `dy`'s rows are consecutive (row stride 8): one load covers two;
/// the input's rows are `wp` apart (each carries the taps' halo), so each input vector is put
/// together from two row pieces. A last single row is masked.
///
/// # Safety
/// As [`weight_tile`]; `g.wv == 8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub unsafe fn weight_tile_rows<const C: usize, const K: usize>(x: *const f32, dy: *const f32, g: &Geo) -> [f32; super::CO_WIDE * TAPS] {
    use std::arch::x86_64::*;
    debug_assert!(g.cob == C && g.wv == 8);
    let [od, oh, _] = g.out;
    let rows = od * oh;
    let (xn, dyn_, dyc) = g.dy_strides();
    let mut acc = [[_mm512_setzero_ps(); K]; C];
    // SAFETY: the caller's bounds (every piece read lies in a row the one-row tile reads).
    unsafe {
        for n in 0..g.n {
            let (xs, ds) = (x.add(n * xn), dy.add(n * dyn_));
            let mut r = 0;
            while r < rows {
                let two = r + 1 < rows;
                let (a0, a1) = (g.row_offset(r), if two { g.row_offset(r + 1) } else { 0 });
                let mut xv = [_mm512_setzero_ps(); K];
                for (e, xv) in xv.iter_mut().enumerate() {
                    let lo = _mm256_loadu_ps(xs.add(a0 + e));
                    let hi = if two { _mm256_loadu_ps(xs.add(a1 + e)) } else { _mm256_setzero_ps() };
                    *xv = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi)));
                }
                let mask: u16 = if two { 0xFFFF } else { 0x00FF };
                for (l, acc) in acc.iter_mut().enumerate() {
                    let d = _mm512_maskz_loadu_ps(mask, ds.add(l * dyc + r * 8));
                    for e in 0..K {
                        acc[e] = _mm512_fmadd_ps(d, xv[e], acc[e]);
                    }
                }
                r += 2;
            }
        }
        weight_sums(&acc)
    }
}

/// [`forward_tile`] for rows of 8 positions: `rows` (2–4) consecutive output rows, `rs` apart
/// in the padded input, two per 16-lane vector (`NV` = ⌈rows / 2⌉ vectors); row `k` of channel
/// `l` goes to `tile[l·8·rows + 8k ..][..8]`.
///
/// # Safety
/// AVX-512 F/VL and FMA available; `row` readable up to the last tap of row `rows − 1`'s 8th
/// position, `w` holds `ci·k³·C` values, `tile` writable for `C` rows of `8·rows` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn forward_tile_rows<const C: usize, const NV: usize>(row: *const f32, strides: [usize; 3], ci: usize, k: [usize; 3], w: *const f32, tile: *mut f32, rows: usize) {
    use std::arch::x86_64::*;
    debug_assert!(rows > 2 * (NV - 1) && rows <= 2 * NV);
    let [cs, ps, rs] = strides;
    let mut acc = [[_mm512_setzero_ps(); NV]; C];
    let mut wp = w;
    // SAFETY: the caller's bounds.
    unsafe {
        for c in 0..ci {
            for a in 0..k[0] {
                for b in 0..k[1] {
                    let r = row.add(c * cs + a * ps + b * rs);
                    for e in 0..k[2] {
                        let mut xv = [_mm512_setzero_ps(); NV];
                        for (j, v) in xv.iter_mut().enumerate() {
                            let lo = _mm256_loadu_ps(r.add(2 * j * rs + e));
                            let hi = if 2 * j + 1 < rows { _mm256_loadu_ps(r.add((2 * j + 1) * rs + e)) } else { _mm256_setzero_ps() };
                            *v = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi)));
                        }
                        for (l, acc) in acc.iter_mut().enumerate() {
                            let wv = _mm512_set1_ps(*wp.add(l));
                            for j in 0..NV {
                                acc[j] = _mm512_fmadd_ps(wv, xv[j], acc[j]);
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

/// The end of a weight-gradient tile: each of the `C × K` accumulators' lanes summed, channel
/// `l`'s tap `e` at `l·TAPS + e`.
///
/// # Safety
/// AVX-512 F available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn weight_sums<const C: usize, const K: usize>(acc: &[[std::arch::x86_64::__m512; K]; C]) -> [f32; super::CO_WIDE * TAPS] {
    use std::arch::x86_64::*;
    let mut out = [0f32; super::CO_WIDE * TAPS];
    for (l, acc) in acc.iter().enumerate() {
        for (e, &v) in acc.iter().enumerate() {
            out[l * TAPS + e] = _mm512_reduce_add_ps(v);
        }
    }
    out
}
