//! CPU kernels on burn-flex tensors: what `nn::lean`'s inner Flex backend runs where a kernel
//! applies (each returns `None`, or says it does not handle a case, and lean falls back to
//! Burn's op). Kernels import no autodiff code.
//!
//! - [`conv1d`]: `conv1d`, `conv1d_x_backward`, `conv1d_weight_backward` (one GEMM over the
//!   whole batch) and `handles`;
//! - [`conv3d`]: the direct 3-D convolution, `conv3d` and `conv3d_weight_backward`;
//! - [`conv_weight`]: `conv_weight_backward`, any rank's weight gradient as bounded GEMMs;
//! - [`group_norm`]: `group_norm` and `group_norm_backward` (+ fused SiLU);
//! - [`pointwise`]: `channel_affine`, `flipped_weight`, `upsample_linear`;
//! - [`isa`]: the vector-instruction level the kernels run at (scalar, AVX2, AVX-512, AVX-512 +
//!   BF16 dot products: detected, capped by `VRAMLAB_SIMD`); each kernel takes it as an
//!   argument, so tests run every level.
//!
//! Shared here: the element trait [`Num`] (f32, bf16), the tensor <-> slice helpers
//! ([`typed_data`], [`typed`], [`f32_data`], [`tensor`], [`f32_slice`]) and [`matmul`].

use burn::backend::Flex;
use burn::tensor::DType;
use burn::tensor::ops::FloatTensorOps;
use burn_flex::FlexTensor;

pub(super) mod conv1d;
pub(super) mod conv3d;
pub(super) mod conv_weight;
pub(super) mod group_norm;
pub(super) mod isa;
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
    #[inline(always)]
    fn of(v: f32) -> Self {
        half::bf16::from_f32(v)
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

