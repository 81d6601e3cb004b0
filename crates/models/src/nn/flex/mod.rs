//! CPU kernels on burn-flex tensors: what `nn::lean`'s inner Flex backend runs where a kernel
//! applies (each returns `None`, or says it does not handle a case, and lean falls back to
//! Burn's op). Kernels import no autodiff code.
//!
//! - [`conv1d`]: `conv1d`, `conv1d_x_backward`, `conv1d_weight_backward` (one GEMM over the
//!   whole batch) and `handles`;
//! - [`conv2d`]: `conv2d`, the 2-D forward as GEMMs writing the output in place;
//! - [`conv3d`]: the direct 3-D convolution, `conv3d` and `conv3d_weight_backward`;
//! - [`conv_weight`]: `conv_weight_backward`, any rank's weight gradient as bounded GEMMs;
//! - [`group_norm`]: `group_norm` and `group_norm_backward` (+ fused SiLU);
//! - [`pointwise`]: `channel_affine`, `flipped_weight`, `upsample_linear`;
//! - [`isa`] (the `vramlab-simd` crate, shared with the optimizer's CPU kernels): the
//!   vector-instruction level the kernels run at (scalar, AVX2, AVX-512, AVX-512 + BF16 dot
//!   products: detected, capped by `VRAMLAB_SIMD`); each kernel takes it as an argument, so
//!   tests run every level.
//!
//! Shared here: the element trait [`Num`] (f32, bf16), the tensor <-> slice helpers
//! ([`typed_data`], [`typed`], [`f32_data`], [`tensor`], [`f32_slice`]) and [`matmul`].

use burn::backend::Flex;
use burn::tensor::DType;
use burn::tensor::ops::FloatTensorOps;
use burn_flex::FlexTensor;

pub(super) mod conv1d;
pub(super) mod conv2d;
pub(super) mod conv3d;
pub(super) mod conv_weight;
pub(super) mod group_norm;
pub(super) use vramlab_simd as isa;
pub(super) mod pointwise;

use isa::Isa;

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

fn matmul(a: T, b: T) -> T {
    Flex::float_matmul(a, b)
}

/// An element type the GroupNorm kernels read and write (computing in f32).
trait Num: Copy + Send + Sync + bytemuck::Pod + burn::tensor::Element {
    fn f(self) -> f32;
    fn of(v: f32) -> Self;
}

impl Num for f32 {
    #[inline(always)]
    fn f(self) -> f32 {
        self
    }
    #[inline(always)]
    fn of(v: f32) -> Self {
        v
    }
}

impl Num for half::bf16 {
    #[inline(always)]
    fn f(self) -> f32 {
        self.to_f32()
    }
    /// `half::bf16::from_f32`'s rounding (to nearest, ties to even; a NaN stays a quiet NaN),
    /// written without branches so that loops over it vectorise.
    #[inline(always)]
    fn of(v: f32) -> Self {
        let b = v.to_bits();
        let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
        half::bf16::from_bits(if v.is_nan() { (b >> 16) as u16 | 0x40 } else { rounded })
    }
}

/// The elements in row-major order as `E` (borrowed when the layout already is).
fn typed_data<E: Num>(t: &T) -> std::borrow::Cow<'_, [E]> {
    match t.as_slice::<E>() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(t.to_contiguous().storage::<E>().to_vec()),
    }
}

fn typed<E: Num>(data: Vec<E>, shape: Vec<usize>) -> T {
    T::from_data(burn::tensor::TensorData::new(data, shape))
}

/// `E`'s slice as f32 when `E` is f32.
fn f32_slice<E: Num>(s: &[E]) -> Option<&[f32]> {
    (E::dtype() == DType::F32).then(|| bytemuck::cast_slice(s))
}

/// A test tensor of `shape` with values in [-1, 1] spread by a multiplicative hash of the index
/// and `seed` (no RNG state: the same values in every test and thread).
#[cfg(test)]
fn hashed_tensor(shape: &[usize], seed: u64) -> T {
    let len = shape.iter().product::<usize>() as u64;
    let v = (0..len).map(|i| ((i.wrapping_add(seed * 7919).wrapping_mul(2654435761) >> 7) % 2001) as f32 / 1000.0 - 1.0).collect();
    T::from_data(burn::tensor::TensorData::new::<f32, _>(v, shape.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::Num;

    /// The branch-free bf16 rounding equals `half`'s on a spread of bit patterns: every sign,
    /// exponent (zeros, subnormals, infinities, NaNs) and the mantissas around each rounding tie.
    #[test]
    fn bf16_rounding_equals_half() {
        let mut checked = 0;
        for hi in 0..=0xFFFFu32 {
            for lo in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC000] {
                let v = f32::from_bits(hi << 16 | lo);
                let (a, b) = (<half::bf16 as Num>::of(v).to_bits(), half::bf16::from_f32(v).to_bits());
                assert_eq!(a, b, "{v:e} ({:#010x})", v.to_bits());
                checked += 1;
            }
        }
        assert_eq!(checked, 8 << 16);
    }
}
