//! Normalisations, activations and convolutions with hand-written backwards that keep only
//! what PyTorch's autograd keeps (and make no larger temporaries than it does).
//!
//! Built from Burn's primitive ops, autodiff keeps every op's inputs: a LayerNorm / GroupNorm
//! written as `(x − mean) / sqrt(var + eps) · weight + bias` keeps the centred input *and* the
//! normalised one (2 activation maps), and `silu(x) = x · sigmoid(x)` keeps `x` and
//! `sigmoid(x)` (2 maps). PyTorch's `native_group_norm` / `native_layer_norm` keep the input
//! plus per-group mean and 1/std, and its SiLU and Mish keep their input. [`LeanBackend`] gives
//! each of these one autodiff node on `Autodiff<B, C>` with that state (1 map, in the input's
//! dtype) and the analytic backward:
//!
//! - normalisation, over the `m` elements of a group (row, for LayerNorm), with
//!   `x̂ = (x − μ)·r`, `r = 1/sqrt(var + eps)` and `g` the output gradient times `weight`:
//!   `dx = r · (g − mean(g) − x̂ · mean(g · x̂))`, `dweight = Σ dy · x̂`, `dbias = Σ dy`;
//! - SiLU: `dx = dy · s · (1 + x·(1 − s))`, `s = sigmoid(x)`;
//! - Mish: `dx = dy · (tanh(sp) + x · (1 − tanh²(sp)) · sigmoid(x))`, `sp = softplus(x)`.
//!
//! GroupNorm can fuse a following SiLU ([`NormAct::Silu`], the 3D-VAE's `norm → silu`): the
//! node then keeps only the norm's input and recomputes the pre-activation in the backward.
//! ReLU keeps its output instead of its input ([`LeanBackend::lean_relu`]); 2-D and 3-D
//! convolutions keep what Burn's keep but compute the weight gradient over bounded batch chunks
//! and a stride-1 input gradient as a forward convolution ([`LeanBackend::lean_conv2d`],
//! [`flipped_padding`]). Inner (non-autodiff) backends run the same forward, composed of Burn
//! ops. Each backward is tested against plain autodiff of the composed forward, or Burn's own
//! node (`tests` below).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::activation::sigmoid;
use burn::tensor::ops::{ConvOptions, ModuleOps};
use burn::tensor::{DType, TensorData, TensorMetadata, TensorPrimitive};

use super::{to_dtype, to_f32};

/// Float primitive of backend `B`.
pub type Prim<B> = <B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;

/// An activation fused into a normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormAct {
    None,
    Silu,
}

/// A Burn backend with vramlab's lean normalisations and activations. Implemented for the
/// inner backends vramlab builds (forward only, composed of Burn ops) and for `Autodiff` of
/// any of them (one node each, hand-written backward).
pub trait LeanBackend: Backend {
    /// GroupNorm (+ optional fused activation) of `x: [batch, channels, …]` (rank ≥ 3, any float
    /// dtype), computed in f32, returned in `x`'s dtype. `weight`, `bias`: f32 `[channels]`.
    fn lean_group_norm(x: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, groups: usize, eps: f64, act: NormAct) -> Prim<Self>;
    /// LayerNorm of the last axis of `x: [..., d]`, computed and returned in f32.
    fn lean_layer_norm(x: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, eps: f64) -> Prim<Self>;
    /// SiLU, computed in f32, returned in `x`'s dtype.
    fn lean_silu(x: Prim<Self>) -> Prim<Self>;
    /// Mish, computed in f32, returned in `x`'s dtype.
    fn lean_mish(x: Prim<Self>) -> Prim<Self>;
    /// ReLU that keeps its *output* for the backward (`dx = dy` where the output is > 0).
    /// Burn's ReLU keeps its input; the output is what the next op (a convolution, a pool)
    /// keeps anyway, so this node adds nothing of its own, as torchvision's in-place ReLU.
    fn lean_relu(x: Prim<Self>) -> Prim<Self>;
    /// Softmax along `dim` that keeps only its *output* for the backward, as PyTorch's
    /// (`dx = y · (dy − Σ_dim dy · y)`). Burn composes softmax from `exp(x − max) / Σ`, whose
    /// `exp` keeps its input and whose division keeps the `exp`: two input-sized tensors (an
    /// attention map each, per attention layer).
    fn lean_softmax(x: Prim<Self>, dim: usize) -> Prim<Self>;
    /// `conv2d` whose weight gradient is summed over batch chunks of at most
    /// [`CONV_WORKSPACE_BYTES`] of input plus output gradient (see [`conv_chunks`]).
    fn lean_conv2d(x: Prim<Self>, weight: Prim<Self>, bias: Option<Prim<Self>>, options: ConvOptions<2>) -> Prim<Self>;
    /// `conv3d`, weight gradient as [`LeanBackend::lean_conv2d`]'s.
    fn lean_conv3d(x: Prim<Self>, weight: Prim<Self>, bias: Option<Prim<Self>>, options: ConvOptions<3>) -> Prim<Self>;
    /// 1-D convolution (on flex one GEMM over the whole batch, `nn::flex_kernels`).
    fn lean_conv1d(x: Prim<Self>, weight: Prim<Self>, bias: Option<Prim<Self>>, options: ConvOptions<1>) -> Prim<Self>;
    /// The input gradient of [`LeanBackend::lean_conv1d`] (a backend's own kernel; unused on autodiff).
    fn lean_conv1d_x_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<1>) -> Prim<Self>;
    /// The weight gradient of [`LeanBackend::lean_conv1d`] (a backend's own kernel; unused on autodiff).
    fn lean_conv1d_weight_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<1>) -> Prim<Self>;
    /// `x · scale + shift` per channel of `x: [batch, channels, …]`, `scale`/`shift`: `[channels]`
    /// in `x`'s dtype. On autodiff the node keeps only `scale` when `scale` and `shift` are
    /// constants (frozen batch norm); otherwise it is the composed ops. flex: one pass over `x`
    /// (its broadcast multiply and add walk `x` through a generic strided iterator).
    fn lean_channel_affine(x: Prim<Self>, scale: Prim<Self>, shift: Option<Prim<Self>>) -> Prim<Self>;
    /// `w: [cout, cin, k…]` → `[cin, cout, k…]` flipped along every kernel axis (the kernel of a
    /// convolution's input gradient, [`flipped_padding`]); contiguous on flex.
    fn lean_flipped_weight(w: Prim<Self>) -> Prim<Self>;
    /// [`LeanBackend::lean_group_norm`]'s forward with the per-group mean and 1/std (f32
    /// `[n, g, 1, 1]`) its backward keeps.
    fn lean_group_norm_stats(x: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, groups: usize, eps: f64, act: NormAct) -> (Prim<Self>, Prim<Self>, Prim<Self>);
    /// [`LeanBackend::lean_group_norm`]'s backward: `(dx, dweight, dbias)`, `dx` in `x`'s dims
    /// and dtype.
    #[allow(clippy::too_many_arguments)]
    fn lean_group_norm_backward(x: Prim<Self>, mean: Prim<Self>, rstd: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, dy: Prim<Self>, groups: usize, act: NormAct) -> (Prim<Self>, Prim<Self>, Prim<Self>);
    /// The weight gradient of `conv2d` (Burn's, or on flex GEMMs over im2col columns of at
    /// most [`CONV_WORKSPACE_BYTES`]).
    fn lean_conv2d_weight_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<2>) -> Prim<Self>;
    /// The weight gradient of `conv3d`, as [`LeanBackend::lean_conv2d_weight_backward`].
    fn lean_conv3d_weight_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<3>) -> Prim<Self>;
    /// Linear interpolation of `x` along `dim` by an integer factor (PyTorch's, align_corners
    /// false: [`linear_source_indices`]). On autodiff the node keeps nothing (its backward is
    /// linear); flex: one pass per output row, the backward adds each output row into its two
    /// source rows.
    fn lean_upsample_linear(x: Prim<Self>, dim: usize, scale: usize) -> Prim<Self>;
    /// The backward of [`LeanBackend::lean_upsample_linear`]: `dy` back to `n_in` along `dim`.
    fn lean_upsample_linear_backward(dy: Prim<Self>, dim: usize, scale: usize) -> Prim<Self>;
    /// The batch-chunk bound of a convolution's weight gradient on this backend, or `None` for
    /// the whole batch at once. flex: [`CONV_WORKSPACE_BYTES`] (its swapped-dims convolution
    /// copies input and output gradient contiguous). wgpu/cuda: `None` (the whole batch, as
    /// Burn does; chunks would add kernel launches; neither choice is measured on a GPU).
    fn conv_workspace_bytes() -> Option<usize>;
}

/// The bound on the batch chunk a convolution's weight gradient is computed on: input plus
/// output gradient bytes. Burn computes a weight gradient as a convolution of the input and the
/// output gradient with batch and channels swapped, so it copies both (the swap is not
/// contiguous) and unfolds the input: on the whole batch that is two activation-sized copies
/// at once (225 MiB for ACT's stem output gradient at batch 48, 240×320). Chunking the batch
/// bounds the copies, as cuDNN bounds its workspace; the chunks' gradients are summed (same
/// values up to f32 summation order).
pub const CONV_WORKSPACE_BYTES: usize = 32 << 20;

/// flex's weight gradient (`nn::flex_kernels::conv_weight_backward`): the im2col columns of one
/// GEMM take at most the input plus output gradient's bytes (what Burn's swapped-dims
/// convolution copies), within 4 MiB ..= [`CONV_WORKSPACE_BYTES`]. Fewer, larger GEMMs run
/// faster; the bound keeps the backward's transient no larger than Burn's.
#[cfg(feature = "flex")]
fn im2col_block(x: &Prim<burn::backend::Flex>, dy: &Prim<burn::backend::Flex>) -> usize {
    let bytes = (x.shape().num_elements() + dy.shape().num_elements()) * 4;
    bytes.clamp(4 << 20, CONV_WORKSPACE_BYTES)
}

/// Batch ranges for a weight gradient over `batch` samples of `per_sample` bytes (input plus
/// output gradient): as few chunks as keep each at most [`CONV_WORKSPACE_BYTES`], at least one
/// sample each.
pub fn conv_chunks(batch: usize, per_sample: usize) -> Vec<std::ops::Range<usize>> {
    conv_chunks_within(batch, per_sample, CONV_WORKSPACE_BYTES)
}

fn conv_chunks_within(batch: usize, per_sample: usize, bound: usize) -> Vec<std::ops::Range<usize>> {
    let per_chunk = (bound / per_sample.max(1)).clamp(1, batch.max(1));
    let n = batch.div_ceil(per_chunk);
    // Even chunks (n of them) rather than full ones and a remainder.
    let size = batch.div_ceil(n.max(1));
    (0..n).map(|i| i * size..((i + 1) * size).min(batch)).filter(|r| !r.is_empty()).collect()
}

/// The inner kernels from Burn's ops (wgpu, cuda, and flex's fallbacks).
mod burn_kernels {
    use super::*;
    pub fn flipped_weight<B: Backend>(w: Prim<B>) -> Prim<B> {
        super::flipped_weight::<B>(w)
    }
    pub fn upsample_linear<B: Backend>(x: Prim<B>, dim: usize, scale: usize) -> Prim<B> {
        super::upsample_linear_composed::<B>(x, dim, scale)
    }
    pub fn upsample_linear_backward<B: Backend>(dy: Prim<B>, dim: usize, scale: usize) -> Prim<B> {
        super::upsample_linear_backward_composed::<B>(dy, dim, scale)
    }
    pub fn group_norm<B: Backend>(x: Prim<B>, w: Prim<B>, b: Prim<B>, groups: usize, eps: f64, act: NormAct) -> (Prim<B>, Prim<B>, Prim<B>) {
        forward_group_norm::<B>(x, w, b, groups, eps, act)
    }
    #[allow(clippy::too_many_arguments)]
    pub fn group_norm_backward<B: Backend>(x: Prim<B>, mean: Prim<B>, rstd: Prim<B>, w: Prim<B>, b: Prim<B>, dy: Prim<B>, groups: usize, act: NormAct) -> (Prim<B>, Prim<B>, Prim<B>) {
        super::group_norm_backward_composed::<B>(x, mean, rstd, w, b, dy, groups, act)
    }
    pub fn weight_backward_2d<B: Backend>(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: ConvOptions<2>) -> Prim<B> {
        B::conv2d_weight_backward(x, w, dy, o)
    }
    pub fn weight_backward_3d<B: Backend>(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: ConvOptions<3>) -> Prim<B> {
        B::conv3d_weight_backward(x, w, dy, o)
    }
    pub fn conv3d<B: Backend>(x: Prim<B>, w: Prim<B>, b: Option<Prim<B>>, o: ConvOptions<3>) -> Prim<B> {
        B::conv3d(x, w, b, o)
    }
    pub fn channel_affine<B: Backend>(x: Prim<B>, scale: Prim<B>, shift: Option<Prim<B>>) -> Prim<B> {
        let dims = dims_of::<B>(&x);
        let mut bshape = vec![1; dims.len()];
        bshape[1] = dims[1];
        let bc = |v: Prim<B>| B::float_reshape(v, Shape::from(bshape.clone()));
        let y = B::float_mul(x, bc(scale));
        match shift {
            Some(b) => B::float_add(y, bc(b)),
            None => y,
        }
    }
    pub fn forward<B: Backend>(x: Prim<B>, w: Prim<B>, b: Option<Prim<B>>, o: ConvOptions<1>) -> Prim<B> {
        B::conv1d(x, w, b, o)
    }
    pub fn x_backward<B: Backend>(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: ConvOptions<1>) -> Prim<B> {
        B::conv1d_x_backward(x, w, dy, o)
    }
    pub fn weight_backward<B: Backend>(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: ConvOptions<1>) -> Prim<B> {
        B::conv1d_weight_backward(x, w, dy, o)
    }
}

/// Flex: the kernels of `nn::flex_kernels` where they apply, else Burn's.
#[cfg(feature = "flex")]
#[allow(clippy::extra_unused_type_parameters)] // `<B>` mirrors `burn_kernels`' so the macro calls both alike
mod flex_kernels {
    use super::super::flex_kernels as fc;
    use super::*;
    type F = burn::backend::Flex;
    pub fn flipped_weight<B>(w: Prim<F>) -> Prim<F> {
        fc::flipped_weight(&w).unwrap_or_else(|| burn_kernels::flipped_weight::<F>(w))
    }
    pub fn upsample_linear<B>(x: Prim<F>, dim: usize, scale: usize) -> Prim<F> {
        fc::upsample_linear(&x, dim, scale, false).unwrap_or_else(|| burn_kernels::upsample_linear::<F>(x, dim, scale))
    }
    pub fn upsample_linear_backward<B>(dy: Prim<F>, dim: usize, scale: usize) -> Prim<F> {
        fc::upsample_linear(&dy, dim, scale, true).unwrap_or_else(|| burn_kernels::upsample_linear_backward::<F>(dy, dim, scale))
    }
    pub fn group_norm<B>(x: Prim<F>, w: Prim<F>, b: Prim<F>, groups: usize, eps: f64, act: NormAct) -> (Prim<F>, Prim<F>, Prim<F>) {
        fc::group_norm(&x, &w, &b, groups, eps, act == NormAct::Silu).unwrap_or_else(|| burn_kernels::group_norm::<F>(x, w, b, groups, eps, act))
    }
    #[allow(clippy::too_many_arguments)]
    pub fn group_norm_backward<B>(x: Prim<F>, mean: Prim<F>, rstd: Prim<F>, w: Prim<F>, b: Prim<F>, dy: Prim<F>, groups: usize, act: NormAct) -> (Prim<F>, Prim<F>, Prim<F>) {
        fc::group_norm_backward(&x, &mean, &rstd, &w, &b, &dy, groups, act == NormAct::Silu).unwrap_or_else(|| burn_kernels::group_norm_backward::<F>(x, mean, rstd, w, b, dy, groups, act))
    }
    pub fn weight_backward_2d<B>(x: Prim<F>, w: Prim<F>, dy: Prim<F>, o: ConvOptions<2>) -> Prim<F> {
        match (o.groups == 1).then(|| fc::conv_weight_backward(&x, &w, &dy, &o.stride, &o.padding, &o.dilation, im2col_block(&x, &dy))).flatten() {
            Some(dw) => dw,
            None => burn_kernels::weight_backward_2d::<F>(x, w, dy, o),
        }
    }
    pub fn conv3d<B>(x: Prim<F>, w: Prim<F>, b: Option<Prim<F>>, o: ConvOptions<3>) -> Prim<F> {
        match super::super::flex_conv3d::conv3d(&x, &w, b.as_ref(), &o) {
            Some(y) => y,
            None => burn_kernels::conv3d::<F>(x, w, b, o),
        }
    }
    pub fn weight_backward_3d<B>(x: Prim<F>, w: Prim<F>, dy: Prim<F>, o: ConvOptions<3>) -> Prim<F> {
        if let Some(dw) = super::super::flex_conv3d::conv3d_weight_backward(&x, &w, &dy, &o) {
            return dw;
        }
        match (o.groups == 1).then(|| fc::conv_weight_backward(&x, &w, &dy, &o.stride, &o.padding, &o.dilation, im2col_block(&x, &dy))).flatten() {
            Some(dw) => dw,
            None => burn_kernels::weight_backward_3d::<F>(x, w, dy, o),
        }
    }
    pub fn channel_affine<B>(x: Prim<F>, scale: Prim<F>, shift: Option<Prim<F>>) -> Prim<F> {
        match fc::channel_affine(&x, &scale, shift.as_ref()) {
            Some(y) => y,
            None => burn_kernels::channel_affine::<F>(x, scale, shift),
        }
    }
    pub fn forward<B>(x: Prim<F>, w: Prim<F>, b: Option<Prim<F>>, o: ConvOptions<1>) -> Prim<F> {
        if fc::handles(&x, &w, &o) { fc::conv1d(x, w, b, &o) } else { burn_kernels::forward::<F>(x, w, b, o) }
    }
    pub fn x_backward<B>(x: Prim<F>, w: Prim<F>, dy: Prim<F>, o: ConvOptions<1>) -> Prim<F> {
        if fc::handles(&x, &w, &o) { fc::conv1d_x_backward(x, w, dy, &o) } else { burn_kernels::x_backward::<F>(x, w, dy, o) }
    }
    pub fn weight_backward<B>(x: Prim<F>, w: Prim<F>, dy: Prim<F>, o: ConvOptions<1>) -> Prim<F> {
        if fc::handles(&x, &w, &o) { fc::conv1d_weight_backward(x, w, dy, &o) } else { burn_kernels::weight_backward::<F>(x, w, dy, o) }
    }
}

macro_rules! inner_lean_backend {
    ($ty:ty, $workspace:expr, $kernels:ident) => {
        impl LeanBackend for $ty {
            fn lean_channel_affine(x: Prim<Self>, scale: Prim<Self>, shift: Option<Prim<Self>>) -> Prim<Self> {
                $kernels::channel_affine::<Self>(x, scale, shift)
            }
            fn lean_flipped_weight(w: Prim<Self>) -> Prim<Self> {
                $kernels::flipped_weight::<Self>(w)
            }
            fn lean_upsample_linear(x: Prim<Self>, dim: usize, scale: usize) -> Prim<Self> {
                $kernels::upsample_linear::<Self>(x, dim, scale)
            }
            fn lean_upsample_linear_backward(dy: Prim<Self>, dim: usize, scale: usize) -> Prim<Self> {
                $kernels::upsample_linear_backward::<Self>(dy, dim, scale)
            }
            fn lean_group_norm_stats(x: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, groups: usize, eps: f64, act: NormAct) -> (Prim<Self>, Prim<Self>, Prim<Self>) {
                $kernels::group_norm::<Self>(x, weight, bias, groups, eps, act)
            }
            fn lean_group_norm_backward(x: Prim<Self>, mean: Prim<Self>, rstd: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, dy: Prim<Self>, groups: usize, act: NormAct) -> (Prim<Self>, Prim<Self>, Prim<Self>) {
                $kernels::group_norm_backward::<Self>(x, mean, rstd, weight, bias, dy, groups, act)
            }
            fn lean_conv2d_weight_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<2>) -> Prim<Self> {
                $kernels::weight_backward_2d::<Self>(x, weight, dy, options)
            }
            fn lean_conv3d_weight_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<3>) -> Prim<Self> {
                $kernels::weight_backward_3d::<Self>(x, weight, dy, options)
            }
            fn lean_conv1d(x: Prim<Self>, weight: Prim<Self>, bias: Option<Prim<Self>>, options: ConvOptions<1>) -> Prim<Self> {
                $kernels::forward::<Self>(x, weight, bias, options)
            }
            fn lean_conv1d_x_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<1>) -> Prim<Self> {
                $kernels::x_backward::<Self>(x, weight, dy, options)
            }
            fn lean_conv1d_weight_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<1>) -> Prim<Self> {
                $kernels::weight_backward::<Self>(x, weight, dy, options)
            }
            fn conv_workspace_bytes() -> Option<usize> {
                $workspace
            }
            fn lean_group_norm(x: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, groups: usize, eps: f64, act: NormAct) -> Prim<Self> {
                Self::lean_group_norm_stats(x, weight, bias, groups, eps, act).0
            }
            fn lean_layer_norm(x: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, eps: f64) -> Prim<Self> {
                forward_layer_norm::<Self>(x, weight, bias, eps).0
            }
            fn lean_silu(x: Prim<Self>) -> Prim<Self> {
                forward_silu::<Self>(x)
            }
            fn lean_mish(x: Prim<Self>) -> Prim<Self> {
                forward_mish::<Self>(x)
            }
            fn lean_relu(x: Prim<Self>) -> Prim<Self> {
                <Self as burn::tensor::ops::ActivationOps<Self>>::relu(x)
            }
            fn lean_softmax(x: Prim<Self>, dim: usize) -> Prim<Self> {
                <Self as burn::tensor::ops::ActivationOps<Self>>::softmax(x, dim)
            }
            fn lean_conv2d(x: Prim<Self>, weight: Prim<Self>, bias: Option<Prim<Self>>, options: ConvOptions<2>) -> Prim<Self> {
                <Self as ModuleOps<Self>>::conv2d(x, weight, bias, options)
            }
            fn lean_conv3d(x: Prim<Self>, weight: Prim<Self>, bias: Option<Prim<Self>>, options: ConvOptions<3>) -> Prim<Self> {
                $kernels::conv3d::<Self>(x, weight, bias, options)
            }
        }
    };
}

#[cfg(feature = "flex")]
inner_lean_backend!(burn::backend::Flex, Some(CONV_WORKSPACE_BYTES), flex_kernels);
#[cfg(feature = "wgpu")]
inner_lean_backend!(burn::backend::Wgpu, None, burn_kernels);
#[cfg(feature = "cuda")]
inner_lean_backend!(burn::backend::Cuda, None, burn_kernels);

fn t<B: Backend, const D: usize>(p: Prim<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

fn p<B: Backend, const D: usize>(x: Tensor<B, D>) -> Prim<B> {
    x.into_primitive().tensor()
}

/// `x` (any rank) viewed as a rank-`D` tensor of `shape`.
fn view<B: Backend, const D: usize>(x: Prim<B>, shape: [usize; D]) -> Tensor<B, D> {
    t(B::float_reshape(x, Shape::from(shape)))
}

fn dims_of<B: Backend>(x: &Prim<B>) -> Vec<usize> {
    x.shape().to_vec()
}

/// A tensor of any rank back to `dims` (the caller's rank).
fn unview<B: Backend, const D: usize>(x: Tensor<B, D>, dims: &[usize]) -> Prim<B> {
    B::float_reshape(p(x), Shape::from(dims.to_vec()))
}

/// The two views of `[n, c, s…]` GroupNorm works in, both free reshapes of the contiguous
/// input: statistics over `[n, groups, c/groups · s/last, last]` (the last axis reduced first,
/// then the rest: one flat reduction over a whole group, up to millions of elements,
/// accumulates ~1e-5 relative f32 error on some backends (flex), which GroupNorm amplifies on
/// sparse inputs), and the per-channel affine over `[n, c, s]` (3-D broadcasts take flex's
/// fast paths; 5-D ones with a `[1, g, c/g, 1, 1]` weight went through its strided iterator).
#[derive(Clone, Copy)]
struct GroupViews {
    stats: [usize; 4],
    channels: [usize; 3],
}

fn group_views(dims: &[usize], groups: usize) -> GroupViews {
    let (n, c) = (dims[0], dims[1]);
    let last = dims[dims.len() - 1].max(1);
    let spatial: usize = dims[2..].iter().product();
    GroupViews { stats: [n, groups, c / groups * spatial / last, last], channels: [n, c, spatial] }
}

fn group_mean<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    x.mean_dim(3).mean_dim(2)
}

/// Per-group mean and `1/sqrt(var + eps)` (`[n, g, 1, 1]`) of an f32 statistics view.
fn group_stats<B: Backend>(x: &Tensor<B, 4>, eps: f64) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let mean = group_mean(x.clone());
    let var = group_mean((x.clone() - mean.clone()).square());
    (mean, (var + eps).sqrt().recip())
}

/// A per-channel `[c]` parameter as `[1, c, 1]`.
fn channel_view<B: Backend>(w: Prim<B>) -> Tensor<B, 3> {
    let w = t::<B, 1>(w);
    let c = w.dims()[0];
    w.reshape([1, c, 1])
}

/// Forward of [`LeanBackend::lean_group_norm`]; also returns the per-group mean and 1/std
/// (f32 `[n, g, 1, 1]`) that the backward keeps.
fn forward_group_norm<B: Backend>(x: Prim<B>, weight: Prim<B>, bias: Prim<B>, groups: usize, eps: f64, act: NormAct) -> (Prim<B>, Prim<B>, Prim<B>) {
    let dims = dims_of::<B>(&x);
    let dtype = x.dtype();
    let v = group_views(&dims, groups);
    let xg = to_f32(view::<B, 4>(x, v.stats));
    let (mean, rstd) = group_stats(&xg, eps);
    let xhat = ((xg - mean.clone()) * rstd.clone()).reshape(v.channels);
    let z = xhat * channel_view::<B>(weight) + channel_view::<B>(bias);
    let y = match act {
        NormAct::None => z,
        NormAct::Silu => z.clone() * sigmoid(z),
    };
    (unview(to_dtype(y, dtype), &dims), p(mean), p(rstd))
}

fn forward_layer_norm<B: Backend>(x: Prim<B>, weight: Prim<B>, bias: Prim<B>, eps: f64) -> (Prim<B>, Prim<B>, Prim<B>) {
    let dims = dims_of::<B>(&x);
    let d = dims[dims.len() - 1];
    let x = to_f32(view::<B, 2>(x, [dims.iter().product::<usize>() / d, d]));
    let mean = x.clone().mean_dim(1);
    let xc = x - mean.clone();
    let rstd = (xc.clone().square().mean_dim(1) + eps).sqrt().recip();
    let y = xc * rstd.clone() * t::<B, 1>(weight).reshape([1, d]) + t::<B, 1>(bias).reshape([1, d]);
    (unview(y, &dims), p(mean), p(rstd))
}

fn softplus<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    // Overflow-free: max(x, 0) + log1p(exp(−|x|)).
    burn::tensor::activation::relu(x.clone()) + x.abs().neg().exp().log1p()
}

fn forward_silu<B: Backend>(x: Prim<B>) -> Prim<B> {
    let dims = dims_of::<B>(&x);
    let dtype = x.dtype();
    let x = to_f32(view::<B, 1>(x, [dims.iter().product()]));
    unview(to_dtype(x.clone() * sigmoid(x), dtype), &dims)
}

fn forward_mish<B: Backend>(x: Prim<B>) -> Prim<B> {
    let dims = dims_of::<B>(&x);
    let dtype = x.dtype();
    let x = to_f32(view::<B, 1>(x, [dims.iter().product()]));
    unview(to_dtype(x.clone() * softplus(x).tanh(), dtype), &dims)
}

/// `dL/dz · silu'(z)`.
fn silu_grad<B: Backend, const D: usize>(z: Tensor<B, D>, dy: Tensor<B, D>) -> Tensor<B, D> {
    let s = sigmoid(z.clone());
    dy * s.clone() * (z * (s.neg() + 1.0) + 1.0)
}

/// GroupNorm's backward from `x̂` and `g` (the gradient at the affine's output) in the channel
/// view: `dx` (f32, channel view), `dweight`, `dbias` (`[c]`).
fn group_norm_backward<B: Backend>(xhat: Tensor<B, 3>, rstd: Tensor<B, 4>, g: Tensor<B, 3>, weight: Tensor<B, 3>, v: GroupViews) -> (Tensor<B, 3>, Tensor<B, 1>, Tensor<B, 1>) {
    let c = v.channels[1];
    let dweight = (g.clone() * xhat.clone()).sum_dim(2).sum_dim(0).reshape([c]);
    let dbias = g.clone().sum_dim(2).sum_dim(0).reshape([c]);
    let gh = (g * weight).reshape(v.stats);
    let xhat = xhat.reshape(v.stats);
    let m1 = group_mean(gh.clone());
    let m2 = group_mean(gh.clone() * xhat.clone());
    let dx = (gh - m1 - xhat * m2) * rstd;
    (dx.reshape(v.channels), dweight, dbias)
}

/// Register a normalisation's gradients with whichever of its parents (input, weight, bias:
/// their node ids, `None` when untracked) needs one; `dx` goes back to the input's `dims` and
/// `dtype`.
#[allow(clippy::too_many_arguments)]
fn register_norm_grads<B: Backend, const D: usize>(grads: &mut Gradients, parents: [Option<NodeId>; 3], dx: Tensor<B, D>, dims: &[usize], dtype: DType, dweight: Tensor<B, 1>, dbias: Tensor<B, 1>) {
    let [id_x, id_w, id_b] = parents;
    if let Some(id) = id_x {
        grads.register::<B>(id, unview(to_dtype(dx, dtype), dims));
    }
    if let Some(id) = id_w {
        grads.register::<B>(id, p(dweight));
    }
    if let Some(id) = id_b {
        grads.register::<B>(id, p(dbias));
    }
}

#[derive(Debug)]
struct GroupNormBackward;

#[derive(Clone, Debug)]
struct GroupNormState<B: Backend> {
    x: Prim<B>,
    mean: Prim<B>,
    rstd: Prim<B>,
    weight: Prim<B>,
    bias: Prim<B>,
    groups: usize,
    act: NormAct,
}

impl<B: LeanBackend> Backward<B, 3> for GroupNormBackward {
    type State = GroupNormState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let GroupNormState { x, mean, rstd, weight, bias, groups, act } = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let (dx, dweight, dbias) = B::lean_group_norm_backward(x, mean, rstd, weight, bias, dy, groups, act);
        let [id_x, id_w, id_b] = ops.parents.map(|n| n.map(|n| n.id));
        for (id, g) in [(id_x, dx), (id_w, dweight), (id_b, dbias)] {
            if let Some(id) = id {
                grads.register::<B>(id, g);
            }
        }
    }
}

/// [`LeanBackend::lean_group_norm_backward`] composed of Burn ops (any backend, any dtype).
#[allow(clippy::too_many_arguments)]
fn group_norm_backward_composed<B: Backend>(x: Prim<B>, mean: Prim<B>, rstd: Prim<B>, weight: Prim<B>, bias: Prim<B>, dy: Prim<B>, groups: usize, act: NormAct) -> (Prim<B>, Prim<B>, Prim<B>) {
    let dims = dims_of::<B>(&x);
    let dtype = x.dtype();
    let v = group_views(&dims, groups);
    let rstd = t::<B, 4>(rstd);
    let xhat = ((to_f32(view::<B, 4>(x, v.stats)) - t::<B, 4>(mean)) * rstd.clone()).reshape(v.channels);
    let weight = channel_view::<B>(weight);
    let dy = to_f32(view::<B, 3>(dy, v.channels));
    let g = match act {
        NormAct::None => dy,
        NormAct::Silu => {
            let z = xhat.clone() * weight.clone() + channel_view::<B>(bias);
            silu_grad(z, dy)
        }
    };
    let (dx, dweight, dbias) = group_norm_backward(xhat, rstd, g, weight, v);
    (unview(to_dtype(dx, dtype), &dims), p(dweight), p(dbias))
}

#[derive(Debug)]
struct LayerNormBackward;

#[derive(Clone, Debug)]
struct LayerNormState<B: Backend> {
    x: Prim<B>,
    mean: Prim<B>,
    rstd: Prim<B>,
    weight: Prim<B>,
}

impl<B: Backend> Backward<B, 3> for LayerNormBackward {
    type State = LayerNormState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let LayerNormState { x, mean, rstd, weight } = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let dims = dims_of::<B>(&x);
        let dtype = x.dtype();
        let d = dims[dims.len() - 1];
        let rows = dims.iter().product::<usize>() / d;
        let x = to_f32(view::<B, 2>(x, [rows, d]));
        let rstd = t::<B, 2>(rstd);
        let xhat = (x - t::<B, 2>(mean)) * rstd.clone();
        let dy = to_f32(view::<B, 2>(dy, [rows, d]));
        let w = t::<B, 1>(weight).reshape([1, d]);
        let dweight = (dy.clone() * xhat.clone()).sum_dim(0).reshape([d]);
        let dbias = dy.clone().sum_dim(0).reshape([d]);
        let gh = dy * w;
        let m1 = gh.clone().mean_dim(1);
        let m2 = (gh.clone() * xhat.clone()).mean_dim(1);
        let dx = (gh - m1 - xhat * m2) * rstd;
        register_norm_grads::<B, 2>(grads, ops.parents.map(|n| n.map(|n| n.id)), dx, &dims, dtype, dweight, dbias);
    }
}

#[derive(Debug)]
struct ActBackward;

#[derive(Clone, Copy, Debug)]
enum Act {
    Silu,
    Mish,
}

impl<B: Backend> Backward<B, 1> for ActBackward {
    type State = (Prim<B>, Act);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, act) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let [node_x] = ops.parents;
        let Some(node) = node_x else { return };
        let dims = dims_of::<B>(&x);
        let n = dims.iter().product::<usize>();
        let dtype = x.dtype();
        let x = to_f32(view::<B, 1>(x, [n]));
        let dy = to_f32(view::<B, 1>(dy, [n]));
        let dx = match act {
            Act::Silu => silu_grad(x, dy),
            Act::Mish => {
                let th = softplus(x.clone()).tanh();
                let d = th.clone() + x.clone() * (th.square().neg() + 1.0) * sigmoid(x);
                dy * d
            }
        };
        grads.register::<B>(node.id, unview(to_dtype(dx, dtype), &dims));
    }
}

impl<B: LeanBackend, C: CheckpointStrategy> LeanBackend for Autodiff<B, C> {
    fn lean_group_norm(x: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, groups: usize, eps: f64, act: NormAct) -> Prim<Self> {
        match GroupNormBackward.prepare::<C>([x.node.clone(), weight.node.clone(), bias.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (y, mean, rstd) = B::lean_group_norm_stats(x.primitive.clone(), weight.primitive.clone(), bias.primitive.clone(), groups, eps, act);
                let state = GroupNormState { x: x.primitive, mean, rstd, weight: weight.primitive, bias: bias.primitive, groups, act };
                prep.finish(state, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::lean_group_norm(x.primitive, weight.primitive, bias.primitive, groups, eps, act)),
        }
    }

    fn lean_layer_norm(x: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, eps: f64) -> Prim<Self> {
        match LayerNormBackward.prepare::<C>([x.node.clone(), weight.node.clone(), bias.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (y, mean, rstd) = forward_layer_norm::<B>(x.primitive.clone(), weight.primitive.clone(), bias.primitive.clone(), eps);
                prep.finish(LayerNormState { x: x.primitive, mean, rstd, weight: weight.primitive }, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::lean_layer_norm(x.primitive, weight.primitive, bias.primitive, eps)),
        }
    }

    fn lean_silu(x: Prim<Self>) -> Prim<Self> {
        match ActBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = forward_silu::<B>(x.primitive.clone());
                prep.finish((x.primitive, Act::Silu), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::lean_silu(x.primitive)),
        }
    }

    fn lean_mish(x: Prim<Self>) -> Prim<Self> {
        match ActBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = forward_mish::<B>(x.primitive.clone());
                prep.finish((x.primitive, Act::Mish), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::lean_mish(x.primitive)),
        }
    }

    fn lean_relu(x: Prim<Self>) -> Prim<Self> {
        match ReluBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::relu(x.primitive);
                prep.finish(y.clone(), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::relu(x.primitive)),
        }
    }

    fn lean_softmax(x: Prim<Self>, dim: usize) -> Prim<Self> {
        match SoftmaxBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::lean_softmax(x.primitive, dim);
                prep.finish((y.clone(), dim), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::lean_softmax(x.primitive, dim)),
        }
    }

    fn lean_flipped_weight(w: Prim<Self>) -> Prim<Self> {
        <Self as AutodiffBackend>::from_inner(B::lean_flipped_weight(w.primitive))
    }
    fn lean_upsample_linear(x: Prim<Self>, dim: usize, scale: usize) -> Prim<Self> {
        match UpsampleBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((dim, scale), B::lean_upsample_linear(x.primitive, dim, scale)),
            OpsKind::UnTracked(prep) => prep.finish(B::lean_upsample_linear(x.primitive, dim, scale)),
        }
    }
    fn lean_upsample_linear_backward(dy: Prim<Self>, dim: usize, scale: usize) -> Prim<Self> {
        <Self as AutodiffBackend>::from_inner(B::lean_upsample_linear_backward(dy.primitive, dim, scale))
    }
    fn lean_group_norm_stats(x: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, groups: usize, eps: f64, act: NormAct) -> (Prim<Self>, Prim<Self>, Prim<Self>) {
        let (y, m, r) = B::lean_group_norm_stats(x.primitive, weight.primitive, bias.primitive, groups, eps, act);
        let f = <Self as AutodiffBackend>::from_inner;
        (f(y), f(m), f(r))
    }
    fn lean_group_norm_backward(x: Prim<Self>, mean: Prim<Self>, rstd: Prim<Self>, weight: Prim<Self>, bias: Prim<Self>, dy: Prim<Self>, groups: usize, act: NormAct) -> (Prim<Self>, Prim<Self>, Prim<Self>) {
        let (dx, dw, db) = B::lean_group_norm_backward(x.primitive, mean.primitive, rstd.primitive, weight.primitive, bias.primitive, dy.primitive, groups, act);
        let f = <Self as AutodiffBackend>::from_inner;
        (f(dx), f(dw), f(db))
    }
    fn lean_conv2d_weight_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<2>) -> Prim<Self> {
        <Self as AutodiffBackend>::from_inner(B::lean_conv2d_weight_backward(x.primitive, weight.primitive, dy.primitive, options))
    }
    fn lean_conv3d_weight_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<3>) -> Prim<Self> {
        <Self as AutodiffBackend>::from_inner(B::lean_conv3d_weight_backward(x.primitive, weight.primitive, dy.primitive, options))
    }

    fn lean_channel_affine(x: Prim<Self>, scale: Prim<Self>, shift: Option<Prim<Self>>) -> Prim<Self> {
        let constant = scale.node.requirement.is_none() && shift.as_ref().is_none_or(|b| b.node.requirement.is_none());
        if !constant {
            return burn_kernels::channel_affine::<Self>(x, scale, shift);
        }
        match AffineBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::lean_channel_affine(x.primitive, scale.primitive.clone(), shift.map(|b| b.primitive));
                prep.finish(scale.primitive, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::lean_channel_affine(x.primitive, scale.primitive, shift.map(|b| b.primitive))),
        }
    }

    fn lean_conv2d(x: Prim<Self>, weight: Prim<Self>, bias: Option<Prim<Self>>, options: ConvOptions<2>) -> Prim<Self> {
        conv_node::<B, C, _>(x, weight, bias, options, |x, w, b, o| B::lean_conv2d(x, w, b, o))
    }

    fn conv_workspace_bytes() -> Option<usize> {
        B::conv_workspace_bytes()
    }

    fn lean_conv3d(x: Prim<Self>, weight: Prim<Self>, bias: Option<Prim<Self>>, options: ConvOptions<3>) -> Prim<Self> {
        conv_node::<B, C, _>(x, weight, bias, options, |x, w, b, o| B::lean_conv3d(x, w, b, o))
    }

    fn lean_conv1d(x: Prim<Self>, weight: Prim<Self>, bias: Option<Prim<Self>>, options: ConvOptions<1>) -> Prim<Self> {
        conv_node::<B, C, _>(x, weight, bias, options, |x, w, b, o| B::lean_conv1d(x, w, b, o))
    }
    // Plain kernels on the inner tensors: the gradient of a gradient is not tracked.
    fn lean_conv1d_x_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<1>) -> Prim<Self> {
        <Self as AutodiffBackend>::from_inner(B::lean_conv1d_x_backward(x.primitive, weight.primitive, dy.primitive, options))
    }
    fn lean_conv1d_weight_backward(x: Prim<Self>, weight: Prim<Self>, dy: Prim<Self>, options: ConvOptions<1>) -> Prim<Self> {
        <Self as AutodiffBackend>::from_inner(B::lean_conv1d_weight_backward(x.primitive, weight.primitive, dy.primitive, options))
    }
}

/// One convolution node on `Autodiff<B, C>`: keeps the input and the weight (as Burn's own
/// convolution does); the backward is [`ConvBackward`]'s.
fn conv_node<B: LeanBackend, C: CheckpointStrategy, O: ConvRank<B>>(
    x: Prim<Autodiff<B, C>>,
    weight: Prim<Autodiff<B, C>>,
    bias: Option<Prim<Autodiff<B, C>>>,
    options: O,
    forward: impl Fn(Prim<B>, Prim<B>, Option<Prim<B>>, O) -> Prim<B>,
) -> Prim<Autodiff<B, C>> {
    // Without a bias the third parent slot repeats the weight's node (no new tensor or node
    // per call); the backward registers a bias gradient only when the state says there is one.
    let has_bias = bias.is_some();
    let bias_node = bias.as_ref().map_or_else(|| weight.node.clone(), |b| b.node.clone());
    let prep = ConvBackward::<O>(std::marker::PhantomData).prepare::<C>([x.node.clone(), weight.node.clone(), bias_node]).compute_bound().stateful();
    let bias_inner = bias.map(|b| b.primitive);
    match prep {
        OpsKind::Tracked(prep) => {
            let y = forward(x.primitive.clone(), weight.primitive.clone(), bias_inner, options.clone());
            prep.finish(ConvState { x: x.primitive, weight: weight.primitive, options, has_bias, chunk_bytes: B::conv_workspace_bytes() }, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, weight.primitive, bias_inner, options)),
    }
}

/// A convolution's rank: the backend calls for 1-D, 2-D and 3-D.
trait ConvRank<B: Backend>: Clone + Send + std::fmt::Debug + 'static {
    fn x_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B>;
    fn weight_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B>;
}

impl<B: LeanBackend> ConvRank<B> for ConvOptions<1> {
    fn x_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        B::lean_conv1d_x_backward(x, w, dy, o)
    }
    fn weight_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        B::lean_conv1d_weight_backward(x, w, dy, o)
    }
}

impl<B: LeanBackend> ConvRank<B> for ConvOptions<2> {
    fn x_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        match flipped_padding(&w.shape().to_vec()[2..], &o.stride, &o.padding, &o.dilation, o.groups) {
            Some(pad) => B::conv2d(dy, B::lean_flipped_weight(w), None, ConvOptions::new([1, 1], [pad[0], pad[1]], o.dilation, 1)),
            None => B::conv2d_x_backward(x, w, dy, o),
        }
    }
    fn weight_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        B::lean_conv2d_weight_backward(x, w, dy, o)
    }
}

impl<B: LeanBackend> ConvRank<B> for ConvOptions<3> {
    fn x_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        match flipped_padding(&w.shape().to_vec()[2..], &o.stride, &o.padding, &o.dilation, o.groups) {
            Some(pad) => B::lean_conv3d(dy, B::lean_flipped_weight(w), None, ConvOptions::new([1, 1, 1], [pad[0], pad[1], pad[2]], o.dilation, 1)),
            None => B::conv3d_x_backward(x, w, dy, o),
        }
    }
    fn weight_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        B::lean_conv3d_weight_backward(x, w, dy, o)
    }
}

/// The input gradient of a stride-1, ungrouped convolution is the *forward* convolution of
/// the output gradient with the flipped, in/out-swapped kernel and padding `d·(k−1) − p`
/// (exactly the input's size). Burn computes it as a transposed convolution, which on flex
/// unfolds into one `[cin·k, output positions]` column buffer per sample (905 MiB for a
/// 16-channel 3×3×3 convolution on a 32×128×128 grid) and loops over the batch on one
/// thread; the forward convolution is tiled and parallel. `None`: use Burn's (strided,
/// grouped, or padding beyond the kernel's reach).
fn flipped_padding(kernel: &[usize], stride: &[usize], padding: &[usize], dilation: &[usize], groups: usize) -> Option<Vec<usize>> {
    if groups != 1 || stride.iter().any(|&s| s != 1) {
        return None;
    }
    kernel.iter().zip(padding).zip(dilation).map(|((&k, &p), &d)| (d * (k - 1)).checked_sub(p)).collect()
}

/// `w: [cout, cin, k…]` → `[cin, cout, k…]` flipped along every kernel axis.
fn flipped_weight<B: Backend>(w: Prim<B>) -> Prim<B> {
    let rank = w.shape().num_dims();
    let axes: Vec<usize> = (2..rank).collect();
    B::float_flip(B::float_swap_dims(w, 0, 1), &axes)
}

#[derive(Debug)]
struct ConvBackward<O>(std::marker::PhantomData<O>);

#[derive(Clone, Debug)]
struct ConvState<B: Backend, O> {
    x: Prim<B>,
    weight: Prim<B>,
    options: O,
    /// Whether the third parent is a bias (else it repeats the weight).
    has_bias: bool,
    /// [`LeanBackend::conv_workspace_bytes`] of the inner backend.
    chunk_bytes: Option<usize>,
}

/// Rows `range` of dimension 0.
fn batch_slice<B: Backend>(x: &Prim<B>, range: std::ops::Range<usize>) -> Prim<B> {
    let dims = x.shape().to_vec();
    let mut slices: Vec<burn::tensor::Slice> = dims.iter().map(|&d| burn::tensor::Slice::from(0..d)).collect();
    slices[0] = burn::tensor::Slice::from(range);
    B::float_slice(x.clone(), &slices)
}

impl<B: Backend, O: ConvRank<B>> Backward<B, 3> for ConvBackward<O> {
    type State = ConvState<B, O>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let ConvState { x, weight, options, has_bias, chunk_bytes } = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let [node_x, node_w, node_b] = ops.parents;
        if let Some(node) = node_b.filter(|_| has_bias) {
            // Sum over every axis but the channels.
            let dims = dy.shape().to_vec();
            let g = t::<B, 3>(B::float_reshape(dy.clone(), Shape::from(vec![dims[0], dims[1], dims[2..].iter().product()])));
            grads.register::<B>(node.id, p(g.sum_dim(2).sum_dim(0).reshape([dims[1]])));
        }
        if let Some(node) = node_w {
            let batch = x.shape()[0];
            let per_sample = (x.shape().num_elements() / batch.max(1)) * x.dtype().size() + (dy.shape().num_elements() / batch.max(1)) * dy.dtype().size();
            let mut dw: Option<Prim<B>> = None;
            // No bound: one chunk, the whole batch.
            for r in conv_chunks_within(batch, per_sample, chunk_bytes.unwrap_or(usize::MAX)) {
                let (xs, gs) = if r.len() == batch { (x.clone(), dy.clone()) } else { (batch_slice::<B>(&x, r.clone()), batch_slice::<B>(&dy, r)) };
                let part = O::weight_backward(xs, weight.clone(), gs, options.clone());
                dw = Some(match dw {
                    None => part,
                    Some(acc) => B::float_add(acc, part),
                });
            }
            grads.register::<B>(node.id, dw.expect("batch ≥ 1"));
        }
        if let Some(node) = node_x {
            grads.register::<B>(node.id, O::x_backward(x, weight, dy, options));
        }
    }
}

/// `y = x · scale + shift` with constant `scale`, `shift`: `dx = dy · scale`.
#[derive(Debug)]
struct AffineBackward;

impl<B: LeanBackend> Backward<B, 1> for AffineBackward {
    type State = Prim<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::lean_channel_affine(dy, ops.state, None));
        }
    }
}

/// Linear upsampling: the backward needs only the axis and factor.
#[derive(Debug)]
struct UpsampleBackward;

impl<B: LeanBackend> Backward<B, 1> for UpsampleBackward {
    type State = (usize, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (dim, scale) = ops.state;
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::lean_upsample_linear_backward(dy, dim, scale));
        }
    }
}

/// [`LeanBackend::lean_upsample_linear`] of Burn ops: two `select`s weighted and added.
fn upsample_linear_composed<B: Backend>(x: Prim<B>, dim: usize, scale: usize) -> Prim<B> {
    let dims = dims_of::<B>(&x);
    let x: Tensor<B, 5> = view(x, pad5(&dims));
    let dim = dim + 5 - dims.len();
    let (i0, i1, lambda) = linear_source_indices(x.dims()[dim], scale);
    let n_out = lambda.len();
    let device = x.device();
    let index = |v: Vec<i64>| Tensor::<B, 1, Int>::from_data(TensorData::new(v, [n_out]), &device);
    // Weights broadcast along every axis but `dim`, in x's dtype (0.25 / 0.75 etc. are exact
    // in bf16 and f16 for the factor 2 the VAE uses).
    let mut wshape = [1usize; 5];
    wshape[dim] = n_out;
    let weight = |w: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(w, [n_out]), &device).reshape(wshape).cast(x.dtype());
    let w0 = weight(lambda.iter().map(|l| 1.0 - l).collect());
    let w1 = weight(lambda);
    let lo = x.clone().select(dim, index(i0));
    let hi = x.select(dim, index(i1));
    let mut out = dims.clone();
    out[dim + dims.len() - 5] = n_out;
    unview(lo * w0 + hi * w1, &out)
}

/// The backward of [`upsample_linear_composed`]: each output row added into its two sources.
fn upsample_linear_backward_composed<B: Backend>(dy: Prim<B>, dim: usize, scale: usize) -> Prim<B> {
    use burn::tensor::IndexingUpdateOp;
    let dims = dims_of::<B>(&dy);
    let dy: Tensor<B, 5> = view(dy, pad5(&dims));
    let dim = dim + 5 - dims.len();
    let n_in = dy.dims()[dim] / scale;
    let (i0, i1, lambda) = linear_source_indices(n_in, scale);
    let n_out = lambda.len();
    let device = dy.device();
    let index = |v: Vec<i64>| Tensor::<B, 1, Int>::from_data(TensorData::new(v, [n_out]), &device);
    let mut wshape = [1usize; 5];
    wshape[dim] = n_out;
    let dt = dy.dtype();
    let weight = |w: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(w, [n_out]), &device).reshape(wshape).cast(dt);
    let mut zeros = dy.dims();
    zeros[dim] = n_in;
    let dx = Tensor::<B, 5>::zeros(zeros, &device).cast(dt);
    let dx = dx.select_assign(dim, index(i0), dy.clone() * weight(lambda.iter().map(|l| 1.0 - l).collect()), IndexingUpdateOp::Add);
    let dx = dx.select_assign(dim, index(i1), dy * weight(lambda), IndexingUpdateOp::Add);
    let mut out = dims.clone();
    out[dim + dims.len() - 5] = n_in;
    unview(dx, &out)
}

/// Dims padded with leading 1s to rank 5.
fn pad5(dims: &[usize]) -> [usize; 5] {
    let mut out = [1usize; 5];
    out[5 - dims.len()..].copy_from_slice(dims);
    out
}

/// Source neighbours and weights of PyTorch's linear upsampling along one axis, as its
/// `area_pixel_compute_source_index` computes them with `align_corners=False` and an
/// explicit `scale_factor` (the scale used is `1/scale_factor`):
/// `src = max((dst + 0.5) / scale − 0.5, 0)`, `i0 = ⌊src⌋`, `i1 = min(i0 + 1, n − 1)`,
/// `λ = src − i0`; output = `(1 − λ)·x[i0] + λ·x[i1]`.
pub fn linear_source_indices(n_in: usize, scale: usize) -> (Vec<i64>, Vec<i64>, Vec<f32>) {
    let inv = 1.0f32 / scale as f32;
    let n_out = n_in * scale;
    let (mut i0s, mut i1s, mut lambdas) = (Vec::with_capacity(n_out), Vec::with_capacity(n_out), Vec::with_capacity(n_out));
    for dst in 0..n_out {
        let src = (inv * (dst as f32 + 0.5) - 0.5).max(0.0);
        let i0 = (src as usize).min(n_in - 1);
        let i1 = (i0 + 1).min(n_in - 1);
        i0s.push(i0 as i64);
        i1s.push(i1 as i64);
        lambdas.push(src - i0 as f32);
    }
    (i0s, i1s, lambdas)
}


/// [`LeanBackend::lean_upsample_linear`] on tensors (rank ≤ 5).
pub fn upsample_linear<B: LeanBackend, const D: usize>(x: Tensor<B, D>, dim: usize, scale: usize) -> Tensor<B, D> {
    t(B::lean_upsample_linear(p(x), dim, scale))
}

#[derive(Debug)]
struct ReluBackward;

impl<B: Backend> Backward<B, 1> for ReluBackward {
    type State = Prim<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            grads.register::<B>(node.id, B::relu_backward(ops.state, dy));
        }
    }
}

/// Softmax's backward from its output: `dx = y · (dy − Σ_dim dy · y)`.
#[derive(Debug)]
struct SoftmaxBackward;

impl<B: Backend> Backward<B, 1> for SoftmaxBackward {
    type State = (Prim<B>, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (y, dim) = ops.state;
        if let [Some(node)] = ops.parents {
            let dot = B::float_sum_dim(B::float_mul(dy.clone(), y.clone()), dim);
            grads.register::<B>(node.id, B::float_mul(y, B::float_sub(dy, dot)));
        }
    }
}

/// [`LeanBackend::lean_softmax`] on a tensor.
pub fn softmax<B: LeanBackend, const D: usize>(x: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    t(B::lean_softmax(p(x), dim))
}

/// [`LeanBackend::lean_channel_affine`] on tensors.
pub fn channel_affine<B: LeanBackend, const D: usize>(x: Tensor<B, D>, scale: Tensor<B, 1>, shift: Option<Tensor<B, 1>>) -> Tensor<B, D> {
    t(B::lean_channel_affine(p(x), p(scale), shift.map(p)))
}

/// [`LeanBackend::lean_conv1d`] on tensors.
pub fn conv1d<B: LeanBackend>(x: Tensor<B, 3>, weight: Tensor<B, 3>, bias: Option<Tensor<B, 1>>, options: ConvOptions<1>) -> Tensor<B, 3> {
    t(B::lean_conv1d(p(x), p(weight), bias.map(p), options))
}

/// [`LeanBackend::lean_conv2d`] on tensors.
pub fn conv2d<B: LeanBackend>(x: Tensor<B, 4>, weight: Tensor<B, 4>, bias: Option<Tensor<B, 1>>, options: ConvOptions<2>) -> Tensor<B, 4> {
    t(B::lean_conv2d(p(x), p(weight), bias.map(p), options))
}

/// [`LeanBackend::lean_conv3d`] on tensors.
pub fn conv3d<B: LeanBackend>(x: Tensor<B, 5>, weight: Tensor<B, 5>, bias: Option<Tensor<B, 1>>, options: ConvOptions<3>) -> Tensor<B, 5> {
    t(B::lean_conv3d(p(x), p(weight), bias.map(p), options))
}

/// [`LeanBackend::lean_relu`] on a tensor.
pub fn relu<B: LeanBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    t(B::lean_relu(p(x)))
}

/// [`LeanBackend::lean_silu`] on a tensor.
pub fn silu<B: LeanBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    t(B::lean_silu(p(x)))
}

/// [`LeanBackend::lean_mish`] on a tensor.
pub fn mish<B: LeanBackend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    t(B::lean_mish(p(x)))
}

pub(crate) fn group_norm<B: LeanBackend, const D: usize>(x: Tensor<B, D>, weight: Tensor<B, 1>, bias: Tensor<B, 1>, groups: usize, eps: f64, act: NormAct) -> Tensor<B, D> {
    t(B::lean_group_norm(p(x), p(weight), p(bias), groups, eps, act))
}

pub(crate) fn layer_norm<B: LeanBackend, const D: usize>(x: Tensor<B, D>, weight: Tensor<B, 1>, bias: Tensor<B, 1>, eps: f64) -> Tensor<B, D> {
    t(B::lean_layer_norm(p(x), p(weight), p(bias), eps))
}

#[cfg(test)]
mod tests {
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    use burn::backend::{Autodiff, Flex};
    use burn::module::Param;
    use burn::prelude::*;
    use burn::tensor::Distribution;
    use burn::tensor::activation::silu as burn_silu;
    use burn::tensor::backend::AutodiffBackend;

    use super::NormAct;
    use crate::nn::norm::composed;
    use crate::nn::{GroupNorm, LayerNorm};

    type A = Autodiff<Flex>;

    fn vals<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
        t.into_data().convert::<f32>().to_vec().unwrap()
    }

    /// max |a − b| / max |b|: the "≤ 1e-5 relative" for whole gradient tensors.
    fn rel(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
    }

    fn random<B: Backend, const D: usize>(dims: [usize; D], seed: u64) -> Tensor<B, D> {
        B::seed(&Default::default(), seed);
        Tensor::random(dims, Distribution::Normal(0.3, 1.5), &Default::default())
    }

    /// Gradients of `sum(f(x) · r)` w.r.t. x and the norm's weight and bias, for the lean and
    /// the composed forward; asserts each pair within `tol`.
    fn check<B: AutodiffBackend + super::LeanBackend, const D: usize>(
        dims: [usize; D],
        params: usize,
        lean: impl Fn(Tensor<B, D>, Tensor<B, 1>, Tensor<B, 1>) -> Tensor<B, D>,
        plain: impl Fn(Tensor<B, D>, Tensor<B, 1>, Tensor<B, 1>) -> Tensor<B, D>,
        tol: f32,
    ) {
        let x0: Tensor<B, D> = random(dims, 1);
        let w0: Tensor<B, 1> = random([params], 2) * 0.5 + 1.0;
        let b0: Tensor<B, 1> = random([params], 3) * 0.5;
        let r: Tensor<B, D> = random(dims, 4);
        let run = |f: &dyn Fn(Tensor<B, D>, Tensor<B, 1>, Tensor<B, 1>) -> Tensor<B, D>| {
            let (x, w, b) = (x0.clone().require_grad(), w0.clone().require_grad(), b0.clone().require_grad());
            let y = f(x.clone(), w.clone(), b.clone());
            let out = vals(y.clone());
            let g = (y * r.clone()).sum().backward();
            (out, vals(x.grad(&g).unwrap()), vals(w.grad(&g).unwrap()), vals(b.grad(&g).unwrap()))
        };
        let (lo, lx, lw, lb) = run(&lean);
        let (po, px, pw, pb) = run(&plain);
        for (name, a, b) in [("output", lo, po), ("dx", lx, px), ("dweight", lw, pw), ("dbias", lb, pb)] {
            let e = rel(&a, &b);
            assert!(e <= tol, "{name}: relative error {e:e} > {tol:e}");
        }
    }

    fn gn<B: Backend>(w: Tensor<B, 1>, b: Tensor<B, 1>, groups: usize) -> GroupNorm<B> {
        GroupNorm { weight: Param::from_tensor(w), bias: Param::from_tensor(b), num_groups: groups, eps: 1e-5 }
    }

    fn lean_gn<B: super::LeanBackend, const D: usize>(groups: usize, act: NormAct) -> impl Fn(Tensor<B, D>, Tensor<B, 1>, Tensor<B, 1>) -> Tensor<B, D> {
        move |x, w, b| gn(w, b, groups).forward_act(x, act)
    }

    fn plain_gn<B: Backend, const D: usize>(groups: usize, act: NormAct) -> impl Fn(Tensor<B, D>, Tensor<B, 1>, Tensor<B, 1>) -> Tensor<B, D> {
        move |x, w, b| {
            let y = composed::group_norm(&gn(w, b, groups), x);
            if act == NormAct::Silu { burn_silu(y) } else { y }
        }
    }

    #[test]
    fn group_norm_backward_equals_autodiff_of_the_composed_forward() {
        type Balanced = Autodiff<Flex, BalancedCheckpointing>;
        for act in [NormAct::None, NormAct::Silu] {
            check::<A, 5>([2, 8, 3, 4, 5], 8, lean_gn(4, act), plain_gn(4, act), 1e-5);
            check::<A, 4>([3, 16, 6, 7], 16, lean_gn(4, act), plain_gn(4, act), 1e-5);
            check::<A, 3>([2, 12, 9], 12, lean_gn(3, act), plain_gn(3, act), 1e-5);
            check::<Balanced, 4>([2, 8, 5, 5], 8, lean_gn(2, act), plain_gn(2, act), 1e-5);
        }
    }

    #[test]
    fn layer_norm_backward_equals_autodiff_of_the_composed_forward() {
        let ln = |w, b| LayerNorm { weight: Param::from_tensor(w), bias: Param::from_tensor(b), eps: 1e-5 };
        check::<A, 3>([3, 7, 16], 16, move |x, w, b| ln(w, b).forward(x), move |x, w, b| composed::layer_norm(&ln(w, b), x), 1e-5);
        check::<A, 2>([5, 64], 64, move |x, w, b| ln(w, b).forward(x), move |x, w, b| composed::layer_norm(&ln(w, b), x), 1e-5);
    }

    #[test]
    fn activation_backwards_equal_autodiff_of_the_composed_forward() {
        // The affine parameters only scale and shift the input here, so the check also covers
        // them; `params` = last axis.
        let affine = |x: Tensor<A, 3>, w: Tensor<A, 1>, b: Tensor<A, 1>| x * w.reshape([1, 1, 6]) + b.reshape([1, 1, 6]);
        check::<A, 3>([4, 5, 6], 6, move |x, w, b| super::silu(affine(x, w, b)), move |x, w, b| burn_silu(affine(x, w, b)), 1e-5);
        let mish_plain = |x: Tensor<A, 3>| {
            let sp = burn::tensor::activation::relu(x.clone()) + x.clone().abs().neg().exp().log1p();
            x * sp.tanh()
        };
        check::<A, 3>([4, 5, 6], 6, move |x, w, b| super::mish(affine(x, w, b) * 3.0), move |x, w, b| mish_plain(affine(x, w, b) * 3.0), 1e-5);
        check::<A, 3>([4, 5, 6], 6, move |x, w, b| super::relu(affine(x, w, b)), move |x, w, b| burn::tensor::activation::relu(affine(x, w, b)), 0.0);
        // Softmax over the parameters' axis (last, then moved to the middle): a bias along
        // any other axis would get a zero gradient (each softmax row's gradient sums to 0).
        check::<A, 3>([4, 5, 6], 6, move |x, w, b| super::softmax(affine(x, w, b) * 2.0, 2), move |x, w, b| burn::tensor::activation::softmax(affine(x, w, b) * 2.0, 2), 1e-5);
        check::<A, 3>([4, 5, 6], 6, move |x, w, b| super::softmax(affine(x, w, b).swap_dims(1, 2) * 2.0, 1).swap_dims(1, 2), move |x, w, b| burn::tensor::activation::softmax(affine(x, w, b).swap_dims(1, 2) * 2.0, 1).swap_dims(1, 2), 1e-5);
    }

    #[test]
    fn conv_chunks_cover_the_batch_within_the_bound() {
        let mib = 1 << 20;
        assert_eq!(super::conv_chunks(48, 4 * mib), vec![0..8, 8..16, 16..24, 24..32, 32..40, 40..48]);
        assert_eq!(super::conv_chunks(12, 4 * mib), vec![0..6, 6..12]);
        assert_eq!(super::conv_chunks(3, mib), vec![0..3]);
        assert_eq!(super::conv_chunks(2, 100 * mib), vec![0..1, 1..2], "at least one sample per chunk");
        assert_eq!(super::conv_chunks_within(48, 4 * mib, usize::MAX), vec![0..48], "no bound: the whole batch");
    }

    type ConvFn<'a, const D: usize> = dyn Fn(Tensor<A, D>, Tensor<A, D>, Option<Tensor<A, 1>>) -> Tensor<A, D> + 'a;

    /// Gradients of `sum(conv(x, w, b) · r)` for the lean node and Burn's convolution.
    fn check_conv<const D: usize>(x: [usize; D], w: [usize; D], bias: bool, lean: impl Fn(Tensor<A, D>, Tensor<A, D>, Option<Tensor<A, 1>>) -> Tensor<A, D>, plain: impl Fn(Tensor<A, D>, Tensor<A, D>, Option<Tensor<A, 1>>) -> Tensor<A, D>) {
        let x0: Tensor<A, D> = random(x, 11);
        let w0: Tensor<A, D> = random(w, 12) * 0.2;
        let b0: Tensor<A, 1> = random([w[0]], 13);
        // Drawn once for both runs: the RNG's seed is global, other tests reseed it.
        let r: Tensor<A, D> = random(plain(x0.clone(), w0.clone(), bias.then(|| b0.clone())).dims(), 14);
        let run = |f: &ConvFn<'_, D>| {
            let (x, w, b) = (x0.clone().require_grad(), w0.clone().require_grad(), b0.clone().require_grad());
            let y = f(x.clone(), w.clone(), bias.then(|| b.clone()));
            let r = r.clone();
            let out = vals(y.clone());
            let g = (y * r).sum().backward();
            let gb = if bias { vals(b.grad(&g).unwrap()) } else { Vec::new() };
            (out, vals(x.grad(&g).unwrap()), vals(w.grad(&g).unwrap()), gb)
        };
        let (lo, lx, lw, lb) = run(&lean);
        let (po, px, pw, pb) = run(&plain);
        for (name, a, b) in [("output", lo, po), ("dx", lx, px), ("dweight", lw, pw), ("dbias", lb, pb)] {
            if b.is_empty() {
                continue;
            }
            let e = rel(&a, &b);
            assert!(e <= 1e-5, "{name}: relative error {e:e}");
        }
    }

    #[test]
    fn conv_backward_equals_burns_including_chunked_weight_gradients() {
        use burn::tensor::module::{conv2d, conv3d};
        use burn::tensor::ops::ConvOptions;
        // Strided: Burn's input gradient; stride 1 (same, valid, dilated, 7×7): the flipped
        // forward convolution.
        let o2 = || ConvOptions::new([2, 1], [1, 1], [1, 1], 1);
        check_conv::<4>([3, 4, 9, 7], [5, 4, 3, 3], true, |x, w, b| super::conv2d(x, w, b, o2()), |x, w, b| conv2d(x, w, b, o2()));
        for (pad, dil, k) in [([1, 1], [1, 1], 3), ([0, 0], [1, 1], 3), ([2, 1], [2, 1], 3), ([3, 3], [1, 1], 7), ([1, 0], [1, 1], 3)] {
            let o = move || ConvOptions::new([1, 1], pad, dil, 1);
            check_conv::<4>([2, 3, 11, 10], [4, 3, k, k], true, move |x, w, b| super::conv2d(x, w, b, o()), move |x, w, b| conv2d(x, w, b, o()));
        }
        check_conv::<4>([3, 4, 9, 7], [5, 4, 3, 3], false, |x, w, b| super::conv2d(x, w, b, o2()), |x, w, b| conv2d(x, w, b, o2()));
        let o3 = || ConvOptions::new([1, 1, 1], [1, 1, 1], [1, 1, 1], 1);
        check_conv::<5>([2, 3, 4, 5, 6], [4, 3, 3, 3, 3], true, |x, w, b| super::conv3d(x, w, b, o3()), |x, w, b| conv3d(x, w, b, o3()));
        // 2 MiB of input and 2 MiB of output gradient per sample: two chunks of 6.
        assert_eq!(super::conv_chunks(12, 4 << 20).len(), 2);
        let o = || ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
        check_conv::<4>([12, 2, 512, 512], [2, 2, 3, 3], true, |x, w, b| super::conv2d(x, w, b, o()), |x, w, b| conv2d(x, w, b, o()));
    }

    /// Linear upsampling's node (flex kernels) against autodiff of the composed selects, on
    /// every axis of a 5-D tensor, factor 2 (the VAE's) and 3.
    #[test]
    fn upsample_linear_equals_the_composed_ops() {
        let x0: Tensor<A, 5> = random([2, 3, 4, 5, 6], 7);
        for (dim, scale) in [(2, 2), (3, 2), (4, 2), (4, 3), (1, 2)] {
            let mut out = x0.dims();
            out[dim] *= scale;
            let r: Tensor<A, 5> = random(out, 8);
            let run = |lean: bool| {
                let x = x0.clone().require_grad();
                let y = if lean { super::upsample_linear(x.clone(), dim, scale) } else { Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(super::upsample_linear_composed::<A>(x.clone().into_primitive().tensor(), dim, scale))) };
                let out = vals(y.clone());
                let g = (y * r.clone()).sum().backward();
                (out, vals(x.grad(&g).unwrap()))
            };
            let ((lo, lx), (po, px)) = (run(true), run(false));
            assert!(rel(&lo, &po) <= 1e-6 && rel(&lx, &px) <= 1e-5, "dim {dim} scale {scale}");
        }
    }

    /// The channel affine with constant scale and shift (frozen batch norm's node, which keeps
    /// only the scale) and with a trainable scale (the composed ops) against the composed ops.
    #[test]
    fn channel_affine_equals_the_composed_ops() {
        for trainable in [false, true] {
            let x0: Tensor<A, 4> = random([3, 5, 4, 6], 1);
            let (s0, b0): (Tensor<A, 1>, Tensor<A, 1>) = (random([5], 2), random([5], 3));
            let r: Tensor<A, 4> = random([3, 5, 4, 6], 4);
            let run = |lean: bool| {
                let x = x0.clone().require_grad();
                let (s, b) = if trainable { (s0.clone().require_grad(), b0.clone().require_grad()) } else { (s0.clone(), b0.clone()) };
                let y = if lean { super::channel_affine(x.clone(), s.clone(), Some(b.clone())) } else { x.clone() * s.clone().reshape([1, 5, 1, 1]) + b.clone().reshape([1, 5, 1, 1]) };
                let out = vals(y.clone());
                let g = (y * r.clone()).sum().backward();
                let gs = if trainable { vals(s.grad(&g).unwrap()) } else { Vec::new() };
                (out, vals(x.grad(&g).unwrap()), gs)
            };
            let (lo, lx, ls) = run(true);
            let (po, px, ps) = run(false);
            assert!(rel(&lo, &po) <= 1e-6 && rel(&lx, &px) <= 1e-6, "trainable {trainable}");
            if trainable {
                assert!(rel(&ls, &ps) <= 1e-5);
            }
        }
    }

    /// The 1-D convolution (on flex: one GEMM over the batch, col2im input gradient) against
    /// Burn's: same-padded k5 and k3 as Diffusion's UNet, strided k3 (its downsampling), 1×1,
    /// dilated, unpadded, without bias, and one whose batch chunks the weight gradient.
    #[test]
    fn conv1d_backward_equals_burns() {
        use burn::tensor::module::conv1d;
        use burn::tensor::ops::ConvOptions;
        for (x, w, stride, pad, dil, bias) in [
            ([3, 6, 16], [5, 6, 5], 1, 2, 1, true),
            ([2, 4, 8], [4, 4, 3], 1, 1, 1, true),
            ([3, 4, 9], [6, 4, 3], 2, 1, 1, true),
            ([2, 8, 4], [3, 8, 1], 1, 0, 1, true),
            ([2, 3, 11], [4, 3, 3], 1, 2, 2, false),
            ([2, 3, 10], [4, 3, 3], 1, 0, 1, true),
            ([3, 5, 7], [2, 5, 5], 3, 1, 1, false),
        ] {
            let o = move || ConvOptions::new([stride], [pad], [dil], 1);
            check_conv::<3>(x, w, bias, move |x, w, b| super::conv1d(x, w, b, o()), move |x, w, b| conv1d(x, w, b, o()));
        }
        // 2 MiB of input and output gradient per sample: chunks of the batch.
        let o = || ConvOptions::new([1], [2], [1], 1);
        check_conv::<3>([24, 4, 65536], [4, 4, 5], true, |x, w, b| super::conv1d(x, w, b, o()), |x, w, b| conv1d(x, w, b, o()));
    }

    #[test]
    fn lean_ops_keep_reduced_precision_inputs_in_their_dtype() {
        use burn::tensor::{DType, FloatDType};
        let x: Tensor<A, 4> = random([2, 8, 4, 4], 5).cast(FloatDType::BF16).require_grad();
        let g = gn::<A>(Tensor::ones([8], &Default::default()), Tensor::zeros([8], &Default::default()), 4);
        let y = g.forward_act(x.clone(), NormAct::Silu);
        assert_eq!(y.dtype(), DType::BF16);
        let grads = y.cast(FloatDType::F32).sum().backward();
        assert_eq!(x.grad(&grads).unwrap().dtype(), DType::BF16);
        let ln = LayerNorm::<A>::new(4, &Default::default());
        assert_eq!(ln.forward(x.clone()).dtype(), DType::F32, "LayerNorm returns f32");
        assert_eq!(super::mish(x).dtype(), DType::BF16);
    }

    /// GroupNorm + SiLU on bf16 input (flex's bf16 kernel) against the f32 composed ops on the
    /// same values: output and input gradient within bf16 rounding.
    #[test]
    fn bf16_group_norm_matches_f32_within_rounding() {
        use burn::tensor::FloatDType;
        let x16: Tensor<A, 4> = random([2, 8, 5, 6], 21).cast(FloatDType::BF16);
        let x32 = x16.clone().cast(FloatDType::F32);
        let (w, b): (Tensor<A, 1>, Tensor<A, 1>) = (random([8], 22) * 0.5 + 1.0, random([8], 23) * 0.5);
        let r: Tensor<A, 4> = random([2, 8, 5, 6], 24);
        let run = |x: Tensor<A, 4>, lean: bool| {
            let x = x.require_grad();
            let y = if lean { lean_gn::<A, 4>(4, NormAct::Silu)(x.clone(), w.clone(), b.clone()) } else { plain_gn::<A, 4>(4, NormAct::Silu)(x.clone(), w.clone(), b.clone()) };
            let y = y.cast(FloatDType::F32);
            let out = vals(y.clone());
            let g = (y * r.clone()).sum().backward();
            (out, vals(x.grad(&g).unwrap().cast(FloatDType::F32)))
        };
        let ((lo, lx), (po, px)) = (run(x16, true), run(x32, false));
        assert!(rel(&lo, &po) <= 1e-2, "output {}", rel(&lo, &po));
        assert!(rel(&lx, &px) <= 2e-2, "dx {}", rel(&lx, &px));
    }

    /// Linear upsampling of a bf16 tensor (flex's bf16 kernel) against the f32 composed ops on
    /// the same values: output and input gradient within bf16 rounding, dtypes kept.
    #[test]
    fn bf16_upsample_matches_f32_within_rounding() {
        use burn::tensor::FloatDType;
        let x16: Tensor<A, 5> = random([2, 3, 4, 5, 6], 41).cast(FloatDType::BF16);
        for (dim, scale) in [(2, 2), (4, 2), (3, 3)] {
            let mut out = x16.dims();
            out[dim] *= scale;
            let r: Tensor<A, 5> = random(out, 42);
            let run = |x: Tensor<A, 5>, lean: bool| {
                let x = x.require_grad();
                let y = if lean { super::upsample_linear(x.clone(), dim, scale) } else { Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(super::upsample_linear_composed::<A>(x.clone().into_primitive().tensor(), dim, scale))) };
                let dtype = y.dtype();
                let y = y.cast(FloatDType::F32);
                let out = vals(y.clone());
                let g = (y * r.clone()).sum().backward();
                (dtype, out, vals(x.grad(&g).unwrap().cast(FloatDType::F32)))
            };
            let ((dt, lo, lx), (_, po, px)) = (run(x16.clone(), true), run(x16.clone().cast(FloatDType::F32), false));
            assert_eq!(dt, burn::tensor::DType::BF16, "dim {dim}: bf16 in, bf16 out");
            assert!(rel(&lo, &po) <= 1e-2 && rel(&lx, &px) <= 1e-2, "dim {dim} scale {scale}: output {} dx {}", rel(&lo, &po), rel(&lx, &px));
        }
    }

    /// A bf16 conv3d's weight gradient (flex: f32 columns from bf16 blocks) against f32 Burn.
    #[test]
    fn bf16_conv_weight_gradient_matches_f32_within_rounding() {
        use burn::tensor::FloatDType;
        use burn::tensor::ops::ConvOptions;
        let o = || ConvOptions::new([1, 2, 1], [1, 1, 1], [1, 1, 1], 1);
        let x: Tensor<A, 5> = random([2, 3, 4, 6, 5], 31).cast(FloatDType::BF16);
        let w: Tensor<A, 5> = (random::<A, 5>([4, 3, 3, 3, 3], 32) * 0.2).cast(FloatDType::BF16);
        let r: Tensor<A, 5> = random([2, 4, 4, 3, 5], 33);
        let run = |x: Tensor<A, 5>, w: Tensor<A, 5>, lean: bool| {
            let w = w.require_grad();
            let y = if lean { super::conv3d(x, w.clone(), None, o()) } else { burn::tensor::module::conv3d(x, w.clone(), None, o()) };
            let g = (y.cast(FloatDType::F32) * r.clone()).sum().backward();
            vals(w.grad(&g).unwrap().cast(FloatDType::F32))
        };
        let lean = run(x.clone(), w.clone(), true);
        let plain = run(x.cast(FloatDType::F32), w.cast(FloatDType::F32), false);
        assert!(rel(&lean, &plain) <= 2e-2, "dweight {}", rel(&lean, &plain));
    }
}
