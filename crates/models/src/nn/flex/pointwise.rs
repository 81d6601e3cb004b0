//! Flex kernels of the per-element and per-row ops: `channel_affine` (frozen batch norm's
//! `x · scale + shift` per channel), `flipped_weight` (the kernel of a convolution's input
//! gradient) and `upsample_linear` (PyTorch's linear upsampling and its backward).
//!
//! The channel affine: flex's broadcast multiply and add of `x: [n, c, h, w]` by `[1, c, 1, 1]`
//! walk `x` element by element through a generic strided iterator (6–8 % of an ACT CPU step in
//! the forward alone); here each `(sample, channel)` plane is one vectorized loop, compiled for
//! the process's instruction level ([`Isa`]; a multiply then an add, never fused, so every
//! level gives the same bits).

use burn::tensor::DType;
use rayon::prelude::*;

use super::{Isa, Num, T, f32_data, tensor, typed};
use crate::nn::linear_source_indices;

/// `x · scale + shift` per channel (f32, `x` contiguous), or `None` for the other cases.
pub fn channel_affine(x: &T, scale: &T, shift: Option<&T>) -> Option<T> {
    channel_affine_with(x, scale, shift, super::isa::level())
}

/// [`channel_affine`] compiled for `isa` (which the CPU must support).
fn channel_affine_with(x: &T, scale: &T, shift: Option<&T>, isa: Isa) -> Option<T> {
    assert!(isa.supported(), "the caller picks a level the CPU has");
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
            affine_plane(isa, out, inp, scale[i % c], shift.as_ref().map(|b| b[i % c]));
        });
    }
    Some(tensor(y, dims))
}

/// `out = inp · s (+ b)`, compiled for `isa` (supported: the caller checked).
fn affine_plane(isa: Isa, out: &mut [f32], inp: &[f32], s: f32, b: Option<f32>) {
    #[inline(always)]
    fn body(out: &mut [f32], inp: &[f32], s: f32, b: Option<f32>) {
        match b {
            Some(b) => out.iter_mut().zip(inp).for_each(|(o, &v)| *o = v * s + b),
            None => out.iter_mut().zip(inp).for_each(|(o, &v)| *o = v * s),
        }
    }
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 | Isa::Avx512Bf16 => {
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
            unsafe fn wide(out: &mut [f32], inp: &[f32], s: f32, b: Option<f32>) {
                body(out, inp, s, b)
            }
            // SAFETY: the caller checked that the CPU has AVX-512.
            return unsafe { wide(out, inp, s, b) };
        }
        Isa::Avx2 => {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn wide(out: &mut [f32], inp: &[f32], s: f32, b: Option<f32>) {
                body(out, inp, s, b)
            }
            // SAFETY: the caller checked that the CPU has AVX2 and FMA.
            return unsafe { wide(out, inp, s, b) };
        }
        Isa::Scalar => {}
    }
    body(out, inp, s, b)
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

/// PyTorch's linear upsampling along `dim` by `scale` of contiguous f32 `x` (`backward`:
/// `x` is the output gradient, summed back into the source rows). `None`: not f32/contiguous.
pub fn upsample_linear(x: &T, dim: usize, scale: usize, backward: bool) -> Option<T> {
    match x.dtype() {
        DType::F32 => upsample_linear_typed::<f32>(x, dim, scale, backward),
        DType::BF16 => upsample_linear_typed::<half::bf16>(x, dim, scale, backward),
        _ => None,
    }
}

/// [`upsample_linear`] in `E`, computed in f32; bf16's backward sums each source row's
/// contributions in an f32 row before rounding it once.
fn upsample_linear_typed<E: Num>(x: &T, dim: usize, scale: usize, backward: bool) -> Option<T> {
    let xs = x.as_slice::<E>()?;
    let dims: Vec<usize> = x.layout().shape().iter().copied().collect();
    let (outer, inner) = (dims[..dim].iter().product::<usize>(), dims[dim + 1..].iter().product::<usize>());
    let n_in = if backward { dims[dim] / scale } else { dims[dim] };
    let (i0, i1, lambda) = linear_source_indices(n_in, scale);
    let n_out = lambda.len();
    let (rows_in, rows_out) = if backward { (n_out, n_in) } else { (n_in, n_out) };
    let mut out = vec![E::of(0.0); outer * rows_out * inner];
    if inner > 0 && rows_out > 0 {
        out.par_chunks_mut(rows_out * inner).zip(xs.par_chunks(rows_in * inner)).for_each(|(o, src)| {
            if backward {
                // Output row r receives the input rows j with i0[j] = r or i1[j] = r, which
                // are consecutive in j (the indices do not decrease): one f32 row per output row.
                let mut acc = vec![0f32; inner];
                let mut j0 = 0;
                for (r, dst) in o.chunks_mut(inner).enumerate() {
                    acc.iter_mut().for_each(|a| *a = 0.0);
                    while j0 < n_out && (i0[j0] as usize) < r && (i1[j0] as usize) < r {
                        j0 += 1;
                    }
                    let mut j = j0;
                    while j < n_out && ((i0[j] as usize) <= r || (i1[j] as usize) <= r) {
                        let (a, b, l) = (i0[j] as usize, i1[j] as usize, lambda[j]);
                        let w = if a == r { 1.0 - l } else { 0.0 } + if b == r { l } else { 0.0 };
                        if w != 0.0 {
                            acc.iter_mut().zip(&src[j * inner..][..inner]).for_each(|(d, g)| *d += g.f() * w);
                        }
                        j += 1;
                    }
                    dst.iter_mut().zip(&acc).for_each(|(d, &v)| *d = E::of(v));
                }
            } else {
                for j in 0..n_out {
                    let (a, b, l) = (i0[j] as usize, i1[j] as usize, lambda[j]);
                    let (w0, w1) = (1.0 - l, l);
                    let (lo, hi) = (&src[a * inner..][..inner], &src[b * inner..][..inner]);
                    o[j * inner..][..inner].iter_mut().zip(lo.iter().zip(hi)).for_each(|(d, (p, q))| *d = E::of(p.f() * w0 + q.f() * w1));
                }
            }
        });
    }
    let mut shape = dims;
    shape[dim] = rows_out;
    Some(typed(out, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The channel affine at every level the CPU has (the others say they skip) against the
    /// plain per-element formula: the same bits (a multiply and an add at every level), planes
    /// of lengths that are not whole vectors.
    #[test]
    fn channel_affine_at_every_level_equals_the_formula() {
        let (n, c, h, w) = (2, 3, 5, 7);
        let xs: Vec<f32> = (0..n * c * h * w).map(|i| ((i * 7919) % 997) as f32 * 0.01 - 4.0).collect();
        let (scale, shift) = (vec![0.5f32, -1.25, 3.0], vec![0.1f32, 0.2, -0.3]);
        let x = tensor(xs.clone(), vec![n, c, h, w]);
        let (st, bt) = (tensor(scale.clone(), vec![c]), tensor(shift.clone(), vec![c]));
        for isa in vramlab_simd::testable_levels("channel_affine_at_every_level_equals_the_formula") {
            for with_shift in [true, false] {
                let y = channel_affine_with(&x, &st, with_shift.then_some(&bt), isa).expect("f32, contiguous");
                let got = y.as_slice::<f32>().expect("contiguous").to_vec();
                for (i, (&g, &v)) in got.iter().zip(&xs).enumerate() {
                    let ch = (i / (h * w)) % c;
                    let want = if with_shift { v * scale[ch] + shift[ch] } else { v * scale[ch] };
                    assert_eq!(g.to_bits(), want.to_bits(), "{}: element {i}, shift {with_shift}", isa.name());
                }
            }
        }
    }
}
