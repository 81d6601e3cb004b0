//! Flex's GroupNorm (+ fused SiLU) kernels, f32 or bf16 input computed in f32: `group_norm`
//! (forward, with the per-group mean and 1/std) and `group_norm_backward`. One task per
//! contiguous `(sample, group)` block; blocks (f32 or bf16 alike) run vectorisable loops with a
//! polynomial `exp` (`exp_fast`) and lane sums (`sum_lanes`), compiled for the instruction level
//! the process runs at ([`Isa`]: AVX-512 with 16-lane sums, AVX2 + FMA with 8-lane sums, or the
//! baseline). The bf16 backward, whose `dx` cannot hold the f32 gradient through SiLU between
//! its two passes, keeps that gradient in an f32 scratch of the block.

use burn::tensor::DType;
use rayon::prelude::*;

use super::{Isa, Num, T, f32_data, f32_slice, tensor, typed};

fn f32_slice_mut<E: Num>(s: &mut [E]) -> Option<&mut [f32]> {
    (E::dtype() == DType::F32).then(|| bytemuck::cast_slice_mut(s))
}

/// `exp(x)` without a libm call, so that loops over it vectorise: `2ⁿ · e^r` with
/// `n = round(x·log₂e)`, `r = x − n·ln 2` (in two parts) and Cephes' degree-6 polynomial for
/// `e^r` (relative error about 2e-7); `x` clamped to [−87, 88] (normal results).
#[inline(always)]
fn exp_fast(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    // Round to nearest by the 1.5·2²³ trick (no `round` call; exact for |v| < 2²²).
    let n = (x * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_2e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[inline(always)]
fn sigmoid_fast(z: f32) -> f32 {
    1.0 / (1.0 + exp_fast(-z))
}

/// Elements summed per f32 partial sum (`L` lanes) before it is added to an f64 total.
const SUM_CHUNK: usize = 256;

/// `Σ f(v)` over `xs` in f64 totals of `L`-lane f32 partial sums (vectorisable; `L` = the
/// vector's lanes: 8 for AVX2, 16 for AVX-512).
#[inline(always)]
fn sum_lanes<const L: usize, E: Num>(xs: &[E], f: impl Fn(f32) -> f32) -> f64 {
    sum_pairs::<L, E, E>(xs, xs, |v, _| f(v))
}

/// `Σ f(x, y)` over `xs` and `ys` (same length) as [`sum_lanes`] sums.
#[inline(always)]
fn sum_pairs<const L: usize, A: Num, B: Num>(xs: &[A], ys: &[B], f: impl Fn(f32, f32) -> f32) -> f64 {
    let mut total = 0f64;
    for (xc, yc) in xs.chunks(SUM_CHUNK).zip(ys.chunks(SUM_CHUNK)) {
        let mut acc = [0f32; L];
        let (mut xi, mut yi) = (xc.chunks_exact(L), yc.chunks_exact(L));
        for (x, y) in (&mut xi).zip(&mut yi) {
            for l in 0..L {
                acc[l] += f(x[l].f(), y[l].f());
            }
        }
        let tail: f32 = xi.remainder().iter().zip(yi.remainder()).map(|(&x, &y)| f(x.f(), y.f())).sum();
        total += acc.iter().map(|&a| a as f64).sum::<f64>() + tail as f64;
    }
    total
}

/// One `(sample, group)` block of the GroupNorm (+ SiLU) forward, f32 or bf16 computed in f32:
/// `(mean, rstd)`. `w`, `b`: the group's channels. Compiled for `isa` (which the CPU must support).
#[allow(clippy::too_many_arguments)]
fn gn_forward_block<E: Num>(isa: Isa, inp: &[E], out: &mut [E], spatial: usize, eps: f64, w: &[f32], b: &[f32], silu: bool) -> (f32, f32) {
    assert!(isa.supported(), "the caller picks a level the CPU has");
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 | Isa::Avx512Bf16 => {
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn wide<E: Num>(inp: &[E], out: &mut [E], spatial: usize, eps: f64, w: &[f32], b: &[f32], silu: bool) -> (f32, f32) {
                gn_forward_body::<16, E>(inp, out, spatial, eps, w, b, silu)
            }
            // SAFETY: AVX-512 and FMA are supported (asserted above).
            return unsafe { wide(inp, out, spatial, eps, w, b, silu) };
        }
        Isa::Avx2 => {
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn wide<E: Num>(inp: &[E], out: &mut [E], spatial: usize, eps: f64, w: &[f32], b: &[f32], silu: bool) -> (f32, f32) {
                gn_forward_body::<8, E>(inp, out, spatial, eps, w, b, silu)
            }
            // SAFETY: AVX2 and FMA are supported (asserted above).
            return unsafe { wide(inp, out, spatial, eps, w, b, silu) };
        }
        Isa::Scalar => {}
    }
    gn_forward_body::<8, E>(inp, out, spatial, eps, w, b, silu)
}

#[inline(always)]
fn gn_forward_body<const L: usize, E: Num>(inp: &[E], out: &mut [E], spatial: usize, eps: f64, w: &[f32], b: &[f32], silu: bool) -> (f32, f32) {
    let len = inp.len() as f64;
    let m = sum_lanes::<L, E>(inp, |v| v) / len;
    let mf = m as f32;
    // Two passes (mean, then squared deviations): no cancellation.
    let var = sum_lanes::<L, E>(inp, |v| (v - mf) * (v - mf)) / len - (m - mf as f64).powi(2);
    let rstd = (1.0 / (var.max(0.0) + eps).sqrt()) as f32;
    for (j, (o, src)) in out.chunks_mut(spatial).zip(inp.chunks(spatial)).enumerate() {
        let (a, sh) = (rstd * w[j], b[j] - mf * rstd * w[j]);
        if silu {
            o.iter_mut().zip(src).for_each(|(o, &v)| {
                let z = v.f() * a + sh;
                *o = E::of(z * sigmoid_fast(z));
            });
        } else {
            o.iter_mut().zip(src).for_each(|(o, &v)| *o = E::of(v.f() * a + sh));
        }
    }
    (mf, rstd)
}

/// One `(sample, group)` block of the f32 GroupNorm (+ SiLU) backward: the gradient at the
/// affine's output (through SiLU) is written into `dx` while its per-channel sums are taken
/// (`part[j] = (Σ g·x̂, Σ g)`), then turned into `dx` in place.
#[allow(clippy::too_many_arguments)]
fn gn_backward_block<E: Num>(isa: Isa, xin: &[E], dyin: &[E], dx: &mut [E], part: &mut [(f64, f64)], spatial: usize, mu: f32, rs: f32, w: &[f32], b: &[f32], silu: bool) {
    assert!(isa.supported(), "the caller picks a level the CPU has");
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 | Isa::Avx512Bf16 => {
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn wide<E: Num>(xin: &[E], dyin: &[E], dx: &mut [E], part: &mut [(f64, f64)], spatial: usize, mu: f32, rs: f32, w: &[f32], b: &[f32], silu: bool) {
                gn_backward_any::<16, E>(xin, dyin, dx, part, spatial, mu, rs, w, b, silu)
            }
            // SAFETY: AVX-512 and FMA are supported (asserted above).
            return unsafe { wide(xin, dyin, dx, part, spatial, mu, rs, w, b, silu) };
        }
        Isa::Avx2 => {
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn wide<E: Num>(xin: &[E], dyin: &[E], dx: &mut [E], part: &mut [(f64, f64)], spatial: usize, mu: f32, rs: f32, w: &[f32], b: &[f32], silu: bool) {
                gn_backward_any::<8, E>(xin, dyin, dx, part, spatial, mu, rs, w, b, silu)
            }
            // SAFETY: AVX2 and FMA are supported (asserted above).
            return unsafe { wide(xin, dyin, dx, part, spatial, mu, rs, w, b, silu) };
        }
        Isa::Scalar => {}
    }
    gn_backward_any::<8, E>(xin, dyin, dx, part, spatial, mu, rs, w, b, silu)
}

/// [`gn_backward_body`] for f32; for bf16 (whose `dx` cannot hold the f32 intermediate) the
/// gradient through SiLU goes to an f32 scratch of the block (freed at the end of the block;
/// two blocks live on two threads, e.g. 2 × 64 KiB for the VAE ultra at 8×32×32), so SiLU's
/// sigmoid is computed once per element, as in f32.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gn_backward_any<const L: usize, E: Num>(xin: &[E], dyin: &[E], dx: &mut [E], part: &mut [(f64, f64)], spatial: usize, mu: f32, rs: f32, w: &[f32], b: &[f32], silu: bool) {
    if let (Some(xf), Some(dyf)) = (f32_slice(xin), f32_slice(dyin))
        && let Some(dxf) = f32_slice_mut(dx)
    {
        return gn_backward_body::<L>(xf, dyf, dxf, part, spatial, mu, rs, w, b, silu);
    }
    let mut g = vec![0f32; xin.len()];
    let (mut s1, mut s2) = (0f64, 0f64);
    for (j, ((xr, dr), gr)) in xin.chunks(spatial).zip(dyin.chunks(spatial)).zip(g.chunks_mut(spatial)).enumerate() {
        let (wc, bc) = (w[j], b[j]);
        if silu {
            gr.iter_mut().zip(xr.iter().zip(dr)).for_each(|(g, (&v, &d))| {
                let (v, d) = (v.f(), d.f());
                let z = (v - mu) * rs * wc + bc;
                let s = sigmoid_fast(z);
                *g = d * s * (z * (1.0 - s) + 1.0);
            });
        } else {
            gr.iter_mut().zip(dr).for_each(|(g, &d)| *g = d.f());
        }
        let gs = sum_lanes::<L, f32>(gr, |g| g);
        let gx = sum_pairs::<L, f32, E>(gr, xr, |g, x| g * ((x - mu) * rs));
        part[j] = (gx, gs);
        s1 += gs * wc as f64;
        s2 += gx * wc as f64;
    }
    let block = xin.len() as f64;
    let (m1, m2) = ((s1 / block) as f32, (s2 / block) as f32);
    for (j, ((o, xr), gr)) in dx.chunks_mut(spatial).zip(xin.chunks(spatial)).zip(g.chunks(spatial)).enumerate() {
        let wc = w[j];
        o.iter_mut().zip(xr.iter().zip(gr)).for_each(|(o, (&v, &g))| *o = E::of((g * wc - m1 - (v.f() - mu) * rs * m2) * rs));
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gn_backward_body<const L: usize>(xin: &[f32], dyin: &[f32], dx: &mut [f32], part: &mut [(f64, f64)], spatial: usize, mu: f32, rs: f32, w: &[f32], b: &[f32], silu: bool) {
    let (mut s1, mut s2) = (0f64, 0f64);
    for (j, ((xr, dr), gr)) in xin.chunks(spatial).zip(dyin.chunks(spatial)).zip(dx.chunks_mut(spatial)).enumerate() {
        let (wc, bc) = (w[j], b[j]);
        if silu {
            gr.iter_mut().zip(xr.iter().zip(dr)).for_each(|(g, (&v, &d))| {
                let z = (v - mu) * rs * wc + bc;
                let s = sigmoid_fast(z);
                *g = d * s * (z * (1.0 - s) + 1.0);
            });
        } else {
            gr.copy_from_slice(dr);
        }
        let gs = sum_lanes::<L, f32>(gr, |g| g);
        // Σ g·x̂, from the stored g.
        let gx = sum_pairs::<L, f32, f32>(gr, xr, |g, x| g * ((x - mu) * rs));
        part[j] = (gx, gs);
        s1 += gs * wc as f64;
        s2 += gx * wc as f64;
    }
    let block = xin.len() as f64;
    let (m1, m2) = ((s1 / block) as f32, (s2 / block) as f32);
    for (j, (gr, xr)) in dx.chunks_mut(spatial).zip(xin.chunks(spatial)).enumerate() {
        let wc = w[j];
        gr.iter_mut().zip(xr).for_each(|(g, &v)| *g = (*g * wc - m1 - (v - mu) * rs * m2) * rs);
    }
}

/// GroupNorm (+ SiLU) forward of contiguous `x: [n, c, …]` (f32 or bf16, computed in f32;
/// weight and bias f32): `(y, mean, rstd)`, `y` in `x`'s dtype, the statistics f32
/// `[n, groups, 1, 1]`. Each `(sample, group)` block is contiguous in `x`, so one task reads it
/// twice (statistics, then the normalized output); flex's composed version walks broadcast
/// views element by element and, in bf16, makes f32 copies of the whole input. `None`: another
/// dtype or layout.
pub fn group_norm(x: &T, weight: &T, bias: &T, groups: usize, eps: f64, silu: bool) -> Option<(T, T, T)> {
    group_norm_with(x, weight, bias, groups, eps, silu, super::isa::level())
}

/// [`group_norm`] compiled for `isa` (which the CPU must support).
fn group_norm_with(x: &T, weight: &T, bias: &T, groups: usize, eps: f64, silu: bool, isa: Isa) -> Option<(T, T, T)> {
    if weight.dtype() != DType::F32 || bias.dtype() != DType::F32 {
        return None;
    }
    match x.dtype() {
        DType::F32 => group_norm_typed::<f32>(x, weight, bias, groups, eps, silu, isa),
        DType::BF16 => group_norm_typed::<half::bf16>(x, weight, bias, groups, eps, silu, isa),
        _ => None,
    }
}

fn group_norm_typed<E: Num>(x: &T, weight: &T, bias: &T, groups: usize, eps: f64, silu: bool, isa: Isa) -> Option<(T, T, T)> {
    let xs = x.as_slice::<E>()?;
    let dims: Vec<usize> = x.layout().shape().iter().copied().collect();
    let (n, c) = (dims[0], dims[1]);
    let spatial: usize = dims[2..].iter().product();
    if groups == 0 || c % groups != 0 || n * spatial == 0 {
        return None;
    }
    let (w, b) = (f32_data(weight), f32_data(bias));
    let cg = c / groups;
    let block = cg * spatial;
    let mut y = vec![E::of(0.0); xs.len()];
    let mut stats = vec![(0f32, 0f32); n * groups];
    y.par_chunks_mut(block).zip(xs.par_chunks(block)).zip(stats.par_iter_mut()).enumerate().for_each(|(i, ((out, inp), st))| {
        let ch0 = (i % groups) * cg;
        *st = gn_forward_block(isa, inp, out, spatial, eps, &w[ch0..ch0 + cg], &b[ch0..ch0 + cg], silu);
    });
    let (mean, rstd): (Vec<f32>, Vec<f32>) = stats.into_iter().unzip();
    Some((typed(y, dims), tensor(mean, vec![n, groups, 1, 1]), tensor(rstd, vec![n, groups, 1, 1])))
}

/// GroupNorm (+ SiLU) backward from the forward's input and statistics: `(dx, dweight, dbias)`,
/// `dx` in `x`'s dtype, per `(sample, group)` block one pass for the block sums and one for `dx`.
#[allow(clippy::too_many_arguments)]
pub fn group_norm_backward(x: &T, mean: &T, rstd: &T, weight: &T, bias: &T, dy: &T, groups: usize, silu: bool) -> Option<(T, T, T)> {
    group_norm_backward_with(x, mean, rstd, weight, bias, dy, groups, silu, super::isa::level())
}

/// [`group_norm_backward`] compiled for `isa` (which the CPU must support).
#[allow(clippy::too_many_arguments)]
fn group_norm_backward_with(x: &T, mean: &T, rstd: &T, weight: &T, bias: &T, dy: &T, groups: usize, silu: bool, isa: Isa) -> Option<(T, T, T)> {
    if ![mean, rstd, weight, bias].iter().all(|t| t.dtype() == DType::F32) || dy.dtype() != x.dtype() {
        return None;
    }
    match x.dtype() {
        DType::F32 => group_norm_backward_typed::<f32>(x, mean, rstd, weight, bias, dy, groups, silu, isa),
        DType::BF16 => group_norm_backward_typed::<half::bf16>(x, mean, rstd, weight, bias, dy, groups, silu, isa),
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)]
fn group_norm_backward_typed<E: Num>(x: &T, mean: &T, rstd: &T, weight: &T, bias: &T, dy: &T, groups: usize, silu: bool, isa: Isa) -> Option<(T, T, T)> {
    let xs = x.as_slice::<E>()?;
    let dims: Vec<usize> = x.layout().shape().iter().copied().collect();
    let (n, c) = (dims[0], dims[1]);
    let spatial: usize = dims[2..].iter().product();
    if groups == 0 || c % groups != 0 || n * spatial == 0 {
        return None;
    }
    let dys: std::borrow::Cow<'_, [E]> = match dy.as_slice::<E>() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(dy.to_contiguous().storage::<E>().to_vec()),
    };
    let (mean, rstd, w, b) = (f32_data(mean), f32_data(rstd), f32_data(weight), f32_data(bias));
    let cg = c / groups;
    let block = cg * spatial;
    let mut dx = vec![E::of(0.0); xs.len()];
    // Per block: the per-channel sums of g·x̂ and g (for dweight, dbias).
    let mut partial = vec![(0f64, 0f64); n * c];
    dx.par_chunks_mut(block).zip(xs.par_chunks(block)).zip(dys.par_chunks(block)).zip(partial.par_chunks_mut(cg)).enumerate().for_each(|(i, (((dxo, xin), dyin), part))| {
        let ch0 = (i % groups) * cg;
        gn_backward_block(isa, xin, dyin, dxo, part, spatial, mean[i], rstd[i], &w[ch0..ch0 + cg], &b[ch0..ch0 + cg], silu);
    });
    let mut dw = vec![0f64; c];
    let mut db = vec![0f64; c];
    for (i, &(gx, gs)) in partial.iter().enumerate() {
        dw[i % c] += gx;
        db[i % c] += gs;
    }
    let f = |v: Vec<f64>| tensor(v.into_iter().map(|v| v as f32).collect(), vec![c]);
    Some((typed(dx, dims), f(dw), f(db)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GroupNorm (+ SiLU) forward and backward in f64, straight from the definitions:
    /// `(y, mean, rstd, dx, dweight, dbias)` of `x: [n, c, spatial]`.
    #[allow(clippy::type_complexity)]
    fn reference(x: &[f32], dy: &[f32], w: &[f32], b: &[f32], n: usize, groups: usize, eps: f64, silu: bool) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
        let c = w.len();
        let (cg, spatial) = (c / groups, x.len() / (n * c));
        let block = cg * spatial;
        let (mut y, mut dx) = (vec![0f32; x.len()], vec![0f32; x.len()]);
        let (mut means, mut rstds, mut dw, mut db) = (vec![], vec![], vec![0f64; c], vec![0f64; c]);
        for (i, (xb, dyb)) in x.chunks(block).zip(dy.chunks(block)).enumerate() {
            let m = xb.iter().map(|&v| v as f64).sum::<f64>() / block as f64;
            let var = xb.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / block as f64;
            let rs = 1.0 / (var + eps).sqrt();
            means.push(m as f32);
            rstds.push(rs as f32);
            // g: the gradient at the affine's output; its block means times the weight.
            let mut g = vec![0f64; block];
            let (mut m1, mut m2) = (0f64, 0f64);
            for k in 0..block {
                let ch = (i % groups) * cg + k / spatial;
                let xh = (xb[k] as f64 - m) * rs;
                let z = xh * w[ch] as f64 + b[ch] as f64;
                let s = 1.0 / (1.0 + (-z).exp());
                y[i * block + k] = if silu { z * s } else { z } as f32;
                g[k] = dyb[k] as f64 * if silu { s * (z * (1.0 - s) + 1.0) } else { 1.0 };
                dw[ch] += g[k] * xh;
                db[ch] += g[k];
                m1 += g[k] * w[ch] as f64 / block as f64;
                m2 += g[k] * w[ch] as f64 * xh / block as f64;
            }
            for k in 0..block {
                let ch = (i % groups) * cg + k / spatial;
                let xh = (xb[k] as f64 - m) * rs;
                dx[i * block + k] = ((g[k] * w[ch] as f64 - m1 - xh * m2) * rs) as f32;
            }
        }
        let f = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect();
        (y, means, rstds, dx, f(dw), f(db))
    }

    fn vals(t: &T) -> Vec<f32> {
        f32_data(t).to_vec()
    }

    /// The f32 kernels at every level the CPU has (the others say they skip) against the f64
    /// definitions: blocks whose length is not whole vectors (8 or 16), with and without SiLU.
    #[test]
    fn group_norm_at_every_level_equals_the_definition() {
        let (n, c, spatial, groups) = (2, 8, 3 * 5 * 7, 4);
        let x: Vec<f32> = (0..n * c * spatial).map(|i| ((i * 7919) % 1009) as f32 * 0.004 - 1.5 + (i % 3) as f32).collect();
        let dy: Vec<f32> = (0..n * c * spatial).map(|i| ((i * 104_729) % 1013) as f32 * 0.002 - 1.0).collect();
        let w: Vec<f32> = (0..c).map(|i| 0.5 + 0.1 * i as f32).collect();
        let b: Vec<f32> = (0..c).map(|i| 0.2 - 0.05 * i as f32).collect();
        let shape = vec![n, c, 3, 5, 7];
        let (xt, dyt, wt, bt) = (tensor(x.clone(), shape.clone()), tensor(dy.clone(), shape), tensor(w.clone(), vec![c]), tensor(b.clone(), vec![c]));
        for isa in vramlab_simd::testable_levels("group_norm_at_every_level_equals_the_definition") {
            for silu in [true, false] {
                let what = format!("{}, silu {silu}", isa.name());
                let (ry, rm, rr, rdx, rdw, rdb) = reference(&x, &dy, &w, &b, n, groups, 1e-5, silu);
                let (y, mean, rstd) = group_norm_with(&xt, &wt, &bt, groups, 1e-5, silu, isa).expect("f32 handled");
                vramlab_testkit::assert_close(&format!("{what}: y"), &vals(&y), &ry, 1e-5);
                vramlab_testkit::assert_close(&format!("{what}: mean"), &vals(&mean), &rm, 1e-5);
                vramlab_testkit::assert_close(&format!("{what}: rstd"), &vals(&rstd), &rr, 1e-5);
                let (dx, dw, db) = group_norm_backward_with(&xt, &mean, &rstd, &wt, &bt, &dyt, groups, silu, isa).expect("f32 handled");
                vramlab_testkit::assert_close(&format!("{what}: dx"), &vals(&dx), &rdx, 1e-4);
                vramlab_testkit::assert_close(&format!("{what}: dweight"), &vals(&dw), &rdw, 1e-5);
                vramlab_testkit::assert_close(&format!("{what}: dbias"), &vals(&db), &rdb, 1e-5);
            }
        }
    }

    /// The bf16 kernels at every level the CPU has against the f64 definitions on the same
    /// (bf16-rounded) values: `y` and `dx` each element within its bf16 rounding (2⁻⁸ relative,
    /// plus 1e-4 of the largest for the f32 sums' rounding), the statistics and the f32 weight
    /// and bias gradients to 1e-5.
    #[test]
    fn bf16_group_norm_at_every_level_equals_the_definition() {
        let (n, c, spatial, groups) = (2, 8, 3 * 5 * 7, 4);
        let round = |v: f32| half::bf16::from_f32(v).to_f32();
        let x: Vec<f32> = (0..n * c * spatial).map(|i| round(((i * 7919) % 1009) as f32 * 0.004 - 1.5 + (i % 3) as f32)).collect();
        let dy: Vec<f32> = (0..n * c * spatial).map(|i| round(((i * 104_729) % 1013) as f32 * 0.002 - 1.0)).collect();
        let w: Vec<f32> = (0..c).map(|i| 0.5 + 0.1 * i as f32).collect();
        let b: Vec<f32> = (0..c).map(|i| 0.2 - 0.05 * i as f32).collect();
        let shape = vec![n, c, 3, 5, 7];
        let h = |v: &[f32]| typed(v.iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>(), shape.clone());
        let (xt, dyt, wt, bt) = (h(&x), h(&dy), tensor(w.clone(), vec![c]), tensor(b.clone(), vec![c]));
        let back = |t: &T| -> Vec<f32> { t.as_slice::<half::bf16>().expect("bf16, contiguous").iter().map(|v| v.to_f32()).collect() };
        let within = |what: &str, got: &[f32], want: &[f32]| {
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (g, r)) in got.iter().zip(want).enumerate() {
                assert!((g - r).abs() <= r.abs() * 2f32.powi(-8) + 1e-4 * scale, "{what}: element {i}: {g} vs {r}");
            }
        };
        for isa in Isa::ALL.into_iter().filter(|l| l.supported()) {
            for silu in [true, false] {
                let what = format!("bf16, {}, silu {silu}", isa.name());
                let (ry, rm, rr, rdx, rdw, rdb) = reference(&x, &dy, &w, &b, n, groups, 1e-5, silu);
                let (y, mean, rstd) = group_norm_with(&xt, &wt, &bt, groups, 1e-5, silu, isa).expect("bf16 handled");
                within(&format!("{what}: y"), &back(&y), &ry);
                vramlab_testkit::assert_close(&format!("{what}: mean"), &vals(&mean), &rm, 1e-5);
                vramlab_testkit::assert_close(&format!("{what}: rstd"), &vals(&rstd), &rr, 1e-5);
                let (dx, dw, db) = group_norm_backward_with(&xt, &mean, &rstd, &wt, &bt, &dyt, groups, silu, isa).expect("bf16 handled");
                within(&format!("{what}: dx"), &back(&dx), &rdx);
                vramlab_testkit::assert_close(&format!("{what}: dweight"), &vals(&dw), &rdw, 1e-5);
                vramlab_testkit::assert_close(&format!("{what}: dbias"), &vals(&db), &rdb, 1e-5);
            }
        }
    }

    /// The polynomial `exp` against libm's over the range the sigmoid uses (and past the clamp):
    /// relative error ≤ 1e-6, and the sums the GroupNorm kernels take against f64 sums.
    #[test]
    fn exp_fast_and_lane_sums_match_the_reference() {
        let mut worst = 0f32;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let (a, b) = (super::exp_fast(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
        }
        assert!(worst <= 1e-6, "exp_fast worst relative error {worst:e}");
        assert!(super::exp_fast(-200.0) > 0.0 && super::exp_fast(200.0).is_finite(), "clamped, not 0 or inf");
        assert!((super::sigmoid_fast(-200.0) - 0.0).abs() < 1e-30 && super::sigmoid_fast(200.0) == 1.0);
        let xs: Vec<f32> = (0..10_007).map(|i| ((i * 7919) % 1000) as f32 * 0.001 - 0.3).collect();
        let exact: f64 = xs.iter().map(|&v| v as f64 * v as f64).sum();
        for lanes in [super::sum_lanes::<8, f32>(&xs, |v| v * v), super::sum_lanes::<16, f32>(&xs, |v| v * v)] {
            assert!(((lanes - exact) / exact).abs() < 1e-6, "{lanes} vs {exact}");
        }
    }
}
