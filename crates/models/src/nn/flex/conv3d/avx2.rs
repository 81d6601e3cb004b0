//! The direct 3-D convolution's AVX2 + FMA tiles ([`super::forward_tile`] and
//! [`super::weight_tile`] at [`super::Isa::Avx2`]): 8-lane vectors, 4 output channels.

#[cfg(target_arch = "x86_64")]
use super::{CO, CO_WIDE, Geo, LANES, TAPS};

/// [`super::forward_tile`] on AVX2: `CO × NV` accumulators.
///
/// # Safety
/// AVX2 and FMA available; `row` readable up to the last tap of the last lane, `w` holds
/// `ci·k³·CO` values, `tile` writable for `CO·NV·8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn forward_tile<const NV: usize>(row: *const f32, strides: [usize; 3], ci: usize, k: [usize; 3], w: *const f32, tile: *mut f32) {
    use std::arch::x86_64::*;
    let [cs, ps, rs] = strides;
    let mut acc = [[_mm256_setzero_ps(); NV]; CO];
    let mut wp = w;
    // SAFETY: the caller's bounds.
    unsafe {
        for c in 0..ci {
            for a in 0..k[0] {
                for b in 0..k[1] {
                    let r = row.add(c * cs + a * ps + b * rs);
                    for e in 0..k[2] {
                        let mut xv = [_mm256_setzero_ps(); NV];
                        for (j, v) in xv.iter_mut().enumerate() {
                            *v = _mm256_loadu_ps(r.add(e + j * LANES));
                        }
                        for (l, acc) in acc.iter_mut().enumerate() {
                            let wv = _mm256_broadcast_ss(&*wp.add(l));
                            for j in 0..NV {
                                acc[j] = _mm256_fmadd_ps(wv, xv[j], acc[j]);
                            }
                        }
                        wp = wp.add(CO);
                    }
                }
            }
        }
        for (l, acc) in acc.iter().enumerate() {
            for (j, &v) in acc.iter().enumerate() {
                _mm256_storeu_ps(tile.add((l * NV + j) * LANES), v);
            }
        }
    }
}

/// [`super::weight_tile`] on AVX2: `CO × TAPS` accumulators over every output row.
///
/// # Safety
/// AVX2 and FMA available; `x` and `dy` readable as [`super::weight_tile`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn weight_tile<const K: usize>(x: *const f32, dy: *const f32, g: &Geo) -> [f32; CO_WIDE * TAPS] {
    use std::arch::x86_64::*;
    debug_assert_eq!(g.cob, CO);
    let [od, oh, _] = g.out;
    let (xn, dyn_, dyc) = g.dy_strides();
    let mut acc = [[_mm256_setzero_ps(); K]; CO];
    // SAFETY: the caller's bounds.
    unsafe {
        for n in 0..g.n {
            for z in 0..od {
                for y in 0..oh {
                    let xr = x.add(n * xn + (z * g.hp + y) * g.wp);
                    let dr = dy.add(n * dyn_ + (z * oh + y) * g.wv);
                    for v in (0..g.wv).step_by(LANES) {
                        let mut xv = [_mm256_setzero_ps(); K];
                        for (e, xv) in xv.iter_mut().enumerate() {
                            *xv = _mm256_loadu_ps(xr.add(v + e));
                        }
                        for (l, acc) in acc.iter_mut().enumerate() {
                            let d = _mm256_loadu_ps(dr.add(l * dyc + v));
                            for e in 0..K {
                                acc[e] = _mm256_fmadd_ps(d, xv[e], acc[e]);
                            }
                        }
                    }
                }
            }
        }
        let mut out = [0f32; CO_WIDE * TAPS];
        let mut lanes = [0f32; LANES];
        for (l, acc) in acc.iter().enumerate() {
            for (e, &v) in acc.iter().enumerate() {
                _mm256_storeu_ps(lanes.as_mut_ptr(), v);
                out[l * TAPS + e] = lanes.iter().sum();
            }
        }
        out
    }
}
