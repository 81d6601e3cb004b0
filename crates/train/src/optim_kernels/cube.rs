//! The Adam(W) update as one `#[cube]` kernel on CubeCL backends (wgpu, cuda; Burn's fusion
//! off): one launch per parameter tensor instead of the tensor version's ~14 elementwise ones.
//! Same f32 arithmetic, in the same order, as [`adam_update_tensors`] (a GPU compiler may still
//! contract a multiply-add, so the two agree to rounding, not bit for bit; tested on lavapipe in
//! `cube_tests`). f32 parameters, gradients and moments only; other dtypes, and
//! `VRAMLAB_COMPOSED_KERNELS=1`, take the tensor version. The outputs are new buffers (three
//! per update, fewer than the tensor version's temporaries), so shared inputs are never written.

use burn::tensor::{DType, Shape, Tensor as BurnTensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;

use super::{AdamUpdate, Decay, OptimKernels, adam_update_tensors};

/// `VRAMLAB_COMPOSED_KERNELS=1`: the tensor-op update instead of the kernel (read once per
/// process; the same switch the models' lean nodes read).
fn composed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("VRAMLAB_COMPOSED_KERNELS").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// One unit per element. `first`: no moments yet (`m`, `v` are not read); `scale`: multiply
/// the gradient by `coef`; `l2` / `decoupled`: the weight decay kind.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn adam_kernel(
    p: &Tensor<f32>,
    g: &Tensor<f32>,
    m: &Tensor<f32>,
    v: &Tensor<f32>,
    p_out: &mut Tensor<f32>,
    m_out: &mut Tensor<f32>,
    v_out: &mut Tensor<f32>,
    coef: f32,
    wd: f32,
    keep: f32,
    b1: f32,
    nb1: f32,
    b2: f32,
    nb2: f32,
    sbc2: f32,
    eps: f32,
    step: f32,
    n: u32,
    #[comptime] first: bool,
    #[comptime] scale: bool,
    #[comptime] l2: bool,
    #[comptime] decoupled: bool,
) {
    let i = ABSOLUTE_POS;
    if i >= n as usize {
        terminate!();
    }
    let mut pi = p[i];
    let mut gi = g[i];
    if scale {
        gi *= coef;
    }
    if l2 {
        gi += pi * wd;
    }
    if decoupled {
        pi *= keep;
    }
    let mut mi = gi * nb1;
    let mut vi = gi * gi * nb2;
    if !first {
        mi = m[i] * b1 + mi;
        vi = v[i] * b2 + vi;
    }
    let denom = vi.sqrt() / sbc2 + eps;
    p_out[i] = pi - mi / denom * step;
    m_out[i] = mi;
    v_out[i] = vi;
}

fn prim<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(t: BurnTensor<CubeBackend<R, F, I, BT>, 1>) -> CubeTensor<R> {
    burn_cubecl::kernel::into_contiguous(t.into_primitive().tensor())
}

fn tensor<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(t: CubeTensor<R>) -> BurnTensor<CubeBackend<R, F, I, BT>, 1> {
    BurnTensor::from_primitive(TensorPrimitive::Float(t))
}

/// The update of the flattened, f32 `p`, `g` and moments: one launch, three new buffers.
pub(super) fn adam_update_f32<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    p: BurnTensor<CubeBackend<R, F, I, BT>, 1>,
    g: BurnTensor<CubeBackend<R, F, I, BT>, 1>,
    moments: Option<(BurnTensor<CubeBackend<R, F, I, BT>, 1>, BurnTensor<CubeBackend<R, F, I, BT>, 1>)>,
    h: &AdamUpdate,
) -> (BurnTensor<CubeBackend<R, F, I, BT>, 1>, BurnTensor<CubeBackend<R, F, I, BT>, 1>, BurnTensor<CubeBackend<R, F, I, BT>, 1>) {
    let n = p.shape().num_elements();
    let (p, g) = (prim(p), prim(g));
    let first = moments.is_none();
    // On the first step the kernel reads no moments: `g` stands in for them.
    let (m, v) = match moments {
        Some((m, v)) => (prim(m), prim(v)),
        None => (g.clone(), g.clone()),
    };
    let out = || burn_cubecl::ops::numeric::empty_device_dtype::<R>(p.client.clone(), p.device.clone(), Shape::from(vec![n]), DType::F32);
    let (p_out, m_out, v_out) = (out(), out(), out());
    // The scalars as the tensor version's scalar ops see them: converted to f32 first.
    let f = |x: f64| x as f32;
    let (wd, keep) = match h.decay {
        Decay::L2(wd) => (f(wd), 1.0),
        Decay::Decoupled(keep) => (0.0, f(keep)),
        Decay::None => (0.0, 1.0),
    };
    let client = p.client.clone();
    let dim = CubeDim::new(&client, n.max(1));
    let count = cubecl::calculate_cube_count_elemwise(&client, n.max(1), dim);
    adam_kernel::launch::<R>(
        &client,
        count,
        dim,
        p.into_tensor_arg(),
        g.into_tensor_arg(),
        m.into_tensor_arg(),
        v.into_tensor_arg(),
        p_out.clone().into_tensor_arg(),
        m_out.clone().into_tensor_arg(),
        v_out.clone().into_tensor_arg(),
        f(h.coef),
        wd,
        keep,
        f(h.b1),
        f(1.0 - h.b1),
        f(h.b2),
        f(1.0 - h.b2),
        f(h.bc2.sqrt()),
        f(h.eps),
        f(h.lr / h.bc1),
        n as u32,
        first,
        h.coef != 1.0,
        matches!(h.decay, Decay::L2(_)),
        matches!(h.decay, Decay::Decoupled(_)),
    );
    (tensor(p_out), tensor(m_out), tensor(v_out))
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> OptimKernels for CubeBackend<R, F, I, BT> {
    fn adam_update<const D: usize>(p: BurnTensor<Self, D>, g: BurnTensor<Self, D>, moments: Option<(BurnTensor<Self, 1>, BurnTensor<Self, 1>)>, h: &AdamUpdate) -> (BurnTensor<Self, D>, BurnTensor<Self, 1>, BurnTensor<Self, 1>) {
        let shape = p.shape();
        let n = shape.num_elements();
        let f32s = p.dtype() == DType::F32 && g.dtype() == DType::F32 && moments.as_ref().is_none_or(|(m, v)| m.dtype() == DType::F32 && v.dtype() == DType::F32);
        let (p, g) = (p.reshape([n]), g.reshape([n]));
        let (p, m, v) = if f32s && n > 0 && n <= u32::MAX as usize && !composed() { adam_update_f32(p, g, moments, h) } else { adam_update_tensors(p, g, moments, h) };
        (p.reshape(shape), m, v)
    }
}
