//! Dropout on the device: `x` with the elements [`crate::nn::dropout::DropoutCtx`]'s hash drops
//! set to 0 and the others scaled, in one launch. The flags are the host's (`splitmix64` of the
//! site's base plus the element index, compared with the rate's threshold), computed here in
//! 32-bit halves (WGSL has no 64-bit integers), so every backend draws the same masks; nothing
//! is uploaded and no mask is stored (the backward runs the same kernel on the gradient).
//!
//! [`dropout_add`]: `r + dropout(x)`, a transformer's residual add after its dropout (ACT's 19 a
//! forward), in the same launch; in place in `x`'s buffer when it is `x`'s alone. f32 values are
//! those of the two kernels: the same product, then the same add.
//!
//! [`relu_dropout`]: `dropout(relu(x))`, a transformer FFN's activation and its dropout (ACT's 9 a
//! forward), in the same launch, in place as [`dropout_add`]. Its backward needs no flags: the
//! output is > 0 exactly where an element was kept and positive
//! ([`super::relu::relu_dropout_backward`]).
//!
//! Both take the bias of the linear layer before them (`x + bias` along the last axis, the bias
//! in `x`'s dtype) into the same launch: the sum is Burn's add's, in `x`'s dtype.

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{contiguous, elem_cubes, elem_out, empty};

/// `(hi, lo) · (ch, cl)` modulo 2⁶⁴, high half (the low half is `lo · cl`, wrapping).
#[cube]
fn mul_hi64(hi: u32, lo: u32, ch: u32, cl: u32) -> u32 {
    lo.mul_hi(cl) + lo * ch + hi * cl
}

/// Whether element `i` is dropped: `splitmix64(base + i) < t` in (high, low) 32-bit halves
/// (see [`dropout_kernel`]). Shared with the softmax kernels (`super::softmax`), whose dropout
/// option drops their output's elements as this kernel would.
#[cube]
pub(super) fn dropped(i: u32, base_hi: u32, base_lo: u32, t_hi: u32, t_lo: u32) -> bool {
    // z = base + i, then splitmix64(z).
    let mut lo = base_lo + i;
    let mut hi = base_hi + select(lo < base_lo, 1u32, 0u32);
    let l0 = lo + 0x7F4A_7C15u32;
    hi = hi + 0x9E37_79B9u32 + select(l0 < lo, 1u32, 0u32);
    lo = l0;
    // z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    lo ^= (lo >> 30u32) | (hi << 2u32);
    hi ^= hi >> 30u32;
    let h = mul_hi64(hi, lo, 0xBF58_476Du32, 0x1CE4_E5B9u32);
    lo *= 0x1CE4_E5B9u32;
    hi = h;
    // z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    lo ^= (lo >> 27u32) | (hi << 5u32);
    hi ^= hi >> 27u32;
    let h = mul_hi64(hi, lo, 0x94D0_49BBu32, 0x1331_11EBu32);
    lo *= 0x1331_11EBu32;
    hi = h;
    // z ^= z >> 31
    lo ^= (lo >> 31u32) | (hi << 1u32);
    hi ^= hi >> 31u32;
    hi < t_hi || (hi == t_hi && lo < t_lo)
}

/// Keeps (scaled) or drops element `i`; see the module docs. `base`: the site's hash base,
/// `t`: the rate's threshold shifted into the hash's top 53 bits (`threshold << 11`), both as
/// (high, low) 32-bit halves.
/// With `with_residual`, `y = r + dropout(x)` (else `r` is not read); with `relu_first`,
/// `dropout(relu(x))` (`x ≤ 0 → 0`, NaN passing, as [`super::relu`]'s kernel); with `with_bias`,
/// `x + b[i mod d]` first (else `b` is not read).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn dropout_kernel<F: Float>(
    x: &Tensor<F>,
    r: &Tensor<F>,
    b: &Tensor<F>,
    y: &mut Tensor<F>,
    base_hi: u32,
    base_lo: u32,
    t_hi: u32,
    t_lo: u32,
    scale: f32,
    n: u32,
    d: u32,
    #[comptime] with_residual: bool,
    #[comptime] with_bias: bool,
    #[comptime] relu_first: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    let dropped = dropped(i as u32, base_hi, base_lo, t_hi, t_lo);
    let mut v = F::new(0.0);
    if !dropped {
        let mut xv = x[i];
        if comptime![with_bias] {
            xv += b[i % d as usize];
        }
        if comptime![relu_first] {
            xv = select(xv <= F::new(0.0), F::new(0.0), xv);
        }
        v = xv * F::cast_from(scale);
    }
    if comptime![with_residual] {
        v = r[i] + v;
    }
    y[i] = v;
}

/// Dropout of `x` (any float dtype; at most `u32::MAX` elements): see the module docs.
pub fn dropout<R: CubeRuntime>(x: CubeTensor<R>, base: u64, threshold: u64, scale: f32) -> CubeTensor<R> {
    let x = contiguous(x);
    let y = empty(&x, x.meta.shape().to_vec(), x.dtype);
    // Without a residual or a bias the kernel reads neither: `x` stands in for them.
    let (r, y_arg) = (x.clone().into_tensor_arg(), y.clone().into_tensor_arg());
    launch(x, r, None, y_arg, base, threshold, scale, Variant::Dropout);
    y
}

/// Whether `bias` (dims and dtype) is one along the last axis of an `x` of `x_dims` in `x_dtype`.
fn bias_fits(x_dims: &[usize], x_dtype: burn::tensor::DType, bias: Option<(&[usize], burn::tensor::DType)>) -> bool {
    bias.is_none_or(|(dims, dtype)| dims.len() == 1 && x_dims.last() == Some(&dims[0]) && dims[0] > 0 && dtype == x_dtype)
}

/// Whether [`dropout_add`] takes `x`, `r` and the bias: `x` and `r` of one shape and dtype, at
/// most `u32::MAX` elements, the bias along `x`'s last axis in its dtype.
pub fn dropout_add_handles(x_dims: &[usize], x_dtype: burn::tensor::DType, r_dims: &[usize], r_dtype: burn::tensor::DType, bias: Option<(&[usize], burn::tensor::DType)>) -> bool {
    x_dims == r_dims && x_dtype == r_dtype && x_dims.iter().product::<usize>() <= u32::MAX as usize && bias_fits(x_dims, x_dtype, bias)
}

/// `r + dropout(x (+ bias))` ([`dropout_add_handles`]), contiguous; in `x`'s buffer when it is its
/// alone.
pub fn dropout_add<R: CubeRuntime>(x: CubeTensor<R>, r: CubeTensor<R>, bias: Option<CubeTensor<R>>, base: u64, threshold: u64, scale: f32) -> CubeTensor<R> {
    // The flags are drawn per logical element: both read in contiguous order.
    let (x, r) = (contiguous(x), contiguous(r));
    let (y, y_arg) = elem_out(&x, 0);
    launch(x, r.into_tensor_arg(), bias, y_arg, base, threshold, scale, Variant::AddResidual);
    y
}

/// Whether [`relu_dropout`] takes `x` and the bias: at most `u32::MAX` elements, the bias along
/// `x`'s last axis in its dtype.
pub fn relu_dropout_handles(x_dims: &[usize], x_dtype: burn::tensor::DType, bias: Option<(&[usize], burn::tensor::DType)>) -> bool {
    let n = x_dims.iter().product::<usize>();
    n > 0 && n <= u32::MAX as usize && bias_fits(x_dims, x_dtype, bias)
}

/// `dropout(relu(x (+ bias)))` ([`relu_dropout_handles`]), contiguous; in `x`'s buffer when it is
/// its alone.
pub fn relu_dropout<R: CubeRuntime>(x: CubeTensor<R>, bias: Option<CubeTensor<R>>, base: u64, threshold: u64, scale: f32) -> CubeTensor<R> {
    let x = contiguous(x);
    let (y, y_arg) = elem_out(&x, 0);
    // `r` is not read: `x` stands in for it.
    let r = x.clone().into_tensor_arg();
    launch(x, r, bias, y_arg, base, threshold, scale, Variant::ReluFirst);
    y
}

/// What the one kernel computes besides the dropout (each its own compiled kernel).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Dropout,
    AddResidual,
    ReluFirst,
}

#[allow(clippy::too_many_arguments)]
fn launch<R: CubeRuntime>(x: CubeTensor<R>, r: TensorArg<R>, bias: Option<CubeTensor<R>>, y: TensorArg<R>, base: u64, threshold: u64, scale: f32, variant: Variant) {
    let n = x.meta.num_elements();
    let with_bias = bias.is_some();
    let d = x.meta.shape().last().copied().unwrap_or(1).max(1);
    // Without a bias the kernel does not read `b`: `x` stands in for it.
    let b = match bias {
        Some(b) => contiguous(b).into_tensor_arg(),
        None => x.clone().into_tensor_arg(),
    };
    let [base_hi, base_lo, t_hi, t_lo] = hash_args(base, threshold);
    let client = x.client.clone();
    let dtype: StorageType = x.dtype.into();
    let (count, dim) = elem_cubes(&client, n);
    dropout_kernel::launch::<R>(&client, count, dim, x.into_tensor_arg(), r, b, y, base_hi, base_lo, t_hi, t_lo, scale, n as u32, d as u32, variant == Variant::AddResidual, with_bias, variant == Variant::ReluFirst, dtype);
}

/// A site's hash base and a rate's threshold as [`dropped`] takes them: `[base_hi, base_lo,
/// t_hi, t_lo]`, the threshold shifted into the hash's top 53 bits.
pub(super) fn hash_args(base: u64, threshold: u64) -> [u32; 4] {
    let t = threshold << 11;
    [(base >> 32) as u32, base as u32, (t >> 32) as u32, t as u32]
}
