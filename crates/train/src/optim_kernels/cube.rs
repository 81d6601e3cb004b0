//! The optimizer's per-parameter passes as `#[cube]` kernels on CubeCL backends (wgpu, cuda;
//! with Burn's fusion through `super::fusion`): the squared gradient norm (one launch per gradient, into per-unit
//! partial sums that one reduction reads at the end of the pass) and the Adam(W) update (one
//! launch per parameter instead of the tensor version's ~14 elementwise ones). Same f32
//! arithmetic, in the same order, as [`adam_update_tensors`] (a GPU compiler may still
//! contract a multiply-add, so the two agree to rounding, not bit for bit; tested on lavapipe in
//! `cube_tests`); the norm sums in another order than Burn's reduction (f32 rounding). f32
//! only; other dtypes, and `VRAMLAB_COMPOSED_KERNELS=1`, take the tensor versions.
//!
//! The update writes `p`, `m` and `v` in place (outputs aliasing the inputs) when their buffers
//! are ours alone (`CubeTensor::can_mut`, the test Burn's own in-place elementwise ops use:
//! no other tensor holds the memory handle), and into new buffers otherwise, so a shared input
//! is never written. On the first step, `m` takes the gradient's buffer when that is ours alone.

use burn::tensor::{DType, Shape, Tensor as BurnTensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;

use super::{AdamUpdate, Decay, OptimKernels, SqAcc, adam_update_tensors, sq_sum_tensors};

/// `VRAMLAB_COMPOSED_KERNELS=1`: the tensor-op update instead of the kernel (read once per
/// process; the same switch the models' lean nodes read).
pub(super) fn composed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("VRAMLAB_COMPOSED_KERNELS").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// One unit per element. `first`: no moments yet (`m`, `v` are not read); `scale`: multiply
/// the gradient by `coef`; `l2` / `decoupled`: the weight decay kind. Each output may alias an
/// input (the launch decides): every unit reads its element of each input before writing it.
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
    let mut mi = gi;
    let mut vi = gi;
    if !first {
        mi = m[i];
        vi = v[i];
    }
    if scale {
        gi *= coef;
    }
    if l2 {
        gi += pi * wd;
    }
    if decoupled {
        pi *= keep;
    }
    if first {
        mi = gi * nb1;
        vi = gi * gi * nb2;
    } else {
        mi = mi * b1 + gi * nb1;
        vi = vi * b2 + gi * gi * nb2;
    }
    let denom = vi.sqrt() / sbc2 + eps;
    p_out[i] = pi - mi / denom * step;
    m_out[i] = mi;
    v_out[i] = vi;
}

/// Units per cube of the update ([`adam_update_f32`]): one size for every parameter.
const ADAM_CUBE: u32 = 256;
/// Units of the squared-norm kernel: each owns one slot of the partial sums.
const SQ_CUBE: u32 = 256;
const SQ_CUBES: u32 = 64;
/// Slots of the partial sums: one per unit launched at most.
pub(super) const SQ_SLOTS: usize = (SQ_CUBE * SQ_CUBES) as usize;
/// Elements a unit sums at least before another cube is launched.
const SQ_PER_UNIT: usize = 16;

/// `acc[unit] += Σ g[i]²` over the unit's elements `unit, unit + stride, …` (`stride`: the units
/// launched). Launches run in order on one stream, and within one each unit owns its slot.
#[cube(launch)]
fn sq_sum_kernel(g: &Tensor<f32>, acc: &mut Tensor<f32>, n: u32, stride: u32) {
    let unit = ABSOLUTE_POS;
    let mut i = unit;
    let mut s = 0.0f32;
    while i < n as usize {
        let x = g[i];
        s += x * x;
        i += stride as usize;
    }
    acc[unit] += s;
}

fn prim<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(t: BurnTensor<CubeBackend<R, F, I, BT>, 1>) -> CubeTensor<R> {
    burn_cubecl::kernel::into_contiguous(t.into_primitive().tensor())
}

fn tensor<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(t: CubeTensor<R>) -> BurnTensor<CubeBackend<R, F, I, BT>, 1> {
    BurnTensor::from_primitive(TensorPrimitive::Float(t))
}

/// Which of the last update's outputs (p, m, v) of a parameter of `n` elements were written in
/// an input's buffer, by `n` (tests run in parallel on distinct sizes; under fusion the update
/// runs on the fusion server's thread, after the test's next read).
#[cfg(test)]
pub(super) static IN_PLACE: std::sync::Mutex<std::collections::BTreeMap<usize, [bool; 3]>> = std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Whether the kernel may write `t`'s buffer: no other tensor holds it.
fn ours<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    t.can_mut() && t.is_contiguous()
}

/// The update of the flattened, f32 `p`, `g` and moments: one launch, in place where the
/// buffers are ours alone (see the module docs), new buffers otherwise.
pub(super) fn adam_update_f32<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    p: BurnTensor<CubeBackend<R, F, I, BT>, 1>,
    g: BurnTensor<CubeBackend<R, F, I, BT>, 1>,
    moments: Option<(BurnTensor<CubeBackend<R, F, I, BT>, 1>, BurnTensor<CubeBackend<R, F, I, BT>, 1>)>,
    h: &AdamUpdate,
) -> (BurnTensor<CubeBackend<R, F, I, BT>, 1>, BurnTensor<CubeBackend<R, F, I, BT>, 1>, BurnTensor<CubeBackend<R, F, I, BT>, 1>) {
    let n = p.shape().num_elements();
    let (p, g) = (prim(p), prim(g));
    let first = moments.is_none();
    let moments = moments.map(|(m, v)| (prim(m), prim(v)));
    // Decided before any clone below (a clone holds the handle too).
    let p_ours = ours(&p);
    let g_ours = first && ours(&g);
    let (m_ours, v_ours) = moments.as_ref().map_or((false, false), |(m, v)| (ours(m), ours(v)));
    let new = || burn_cubecl::ops::numeric::empty_device_dtype::<R>(p.client.clone(), p.device.clone(), Shape::from(vec![n]), DType::F32);
    // Inputs 0..4 are p, g, m, v; an output aliasing input k is written in k's buffer. On the
    // first step the kernel reads no moments: `g` stands in for them.
    let (m, v) = match moments {
        Some(mv) => mv,
        None => (g.clone(), g.clone()),
    };
    let (p_out, p_arg) = if p_ours { (p.clone(), p.as_tensor_alias(0)) } else { let t = new(); (t.clone(), t.into_tensor_arg()) };
    let (m_out, m_arg) = if first && g_ours {
        (g.clone(), g.as_tensor_alias(1))
    } else if m_ours {
        (m.clone(), m.as_tensor_alias(2))
    } else {
        let t = new();
        (t.clone(), t.into_tensor_arg())
    };
    let (v_out, v_arg) = if v_ours { (v.clone(), v.as_tensor_alias(3)) } else { let t = new(); (t.clone(), t.into_tensor_arg()) };
    #[cfg(test)]
    IN_PLACE.lock().unwrap().insert(n, [p_ours, g_ours || m_ours, v_ours]);
    // The scalars as the tensor version's scalar ops see them: converted to f32 first.
    let f = |x: f64| x as f32;
    let (wd, keep) = match h.decay {
        Decay::L2(wd) => (f(wd), 1.0),
        Decay::Decoupled(keep) => (0.0, f(keep)),
        Decay::None => (0.0, 1.0),
    };
    let client = p.client.clone();
    // One cube size for every parameter: the cube size is part of the kernel's compiled
    // identity, and `CubeDim::new` sizes cubes by the element count (four compilations of this
    // kernel in one VAE step, one per size class).
    let dim = CubeDim::new_1d(ADAM_CUBE);
    let count = cubecl::calculate_cube_count_elemwise(&client, n.max(1), dim);
    adam_kernel::launch::<R>(
        &client,
        count,
        dim,
        p.into_tensor_arg(),
        g.into_tensor_arg(),
        m.into_tensor_arg(),
        v.into_tensor_arg(),
        p_arg,
        m_arg,
        v_arg,
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

/// Adds the f32, contiguous `g`'s `Σ g²` into `acc`'s partial sums (allocated and zeroed on the
/// first gradient of a step): one launch.
pub(super) fn sq_sum_f32<R: CubeRuntime>(g: &CubeTensor<R>, acc: &mut Option<CubeTensor<R>>) {
    let n = g.meta.num_elements();
    let acc = acc.get_or_insert_with(|| burn_cubecl::ops::numeric::zeros_client::<R>(g.client.clone(), g.device.clone(), Shape::from(vec![SQ_SLOTS]), DType::F32));
    let cubes = n.div_ceil(SQ_CUBE as usize * SQ_PER_UNIT).clamp(1, SQ_CUBES as usize) as u32;
    sq_sum_kernel::launch::<R>(&g.client, CubeCount::new_1d(cubes), CubeDim::new_1d(SQ_CUBE), g.clone().into_tensor_arg(), acc.clone().into_tensor_arg(), n as u32, cubes * SQ_CUBE);
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> OptimKernels for CubeBackend<R, F, I, BT> {
    fn grad_sq_sum<const D: usize>(g: BurnTensor<Self, D>, acc: &mut SqAcc<Self>) -> BurnTensor<Self, D> {
        let n = g.shape().num_elements();
        if g.dtype() != DType::F32 || n == 0 || n > u32::MAX as usize || composed() {
            return sq_sum_tensors(g, acc);
        }
        // Contiguous for the kernel, and handed back so for the update.
        let g = burn_cubecl::kernel::into_contiguous(g.into_primitive().tensor());
        let mut partials = acc.partials.take().map(|a| a.into_primitive().tensor());
        sq_sum_f32(&g, &mut partials);
        acc.partials = partials.map(tensor);
        BurnTensor::from_primitive(TensorPrimitive::Float(g))
    }

    fn adam_update<const D: usize>(p: BurnTensor<Self, D>, g: BurnTensor<Self, D>, moments: Option<(BurnTensor<Self, 1>, BurnTensor<Self, 1>)>, h: &AdamUpdate) -> (BurnTensor<Self, D>, BurnTensor<Self, 1>, BurnTensor<Self, 1>) {
        let shape = p.shape();
        let n = shape.num_elements();
        let f32s = p.dtype() == DType::F32 && g.dtype() == DType::F32 && moments.as_ref().is_none_or(|(m, v)| m.dtype() == DType::F32 && v.dtype() == DType::F32);
        let (p, g) = (p.reshape([n]), g.reshape([n]));
        let (p, m, v) = if f32s && n > 0 && n <= u32::MAX as usize && !composed() { adam_update_f32(p, g, moments, h) } else { adam_update_tensors(p, g, moments, h) };
        (p.reshape(shape), m, v)
    }
}
