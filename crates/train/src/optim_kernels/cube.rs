//! The optimizer's per-parameter passes as `#[cube]` kernels on CubeCL backends (wgpu, cuda;
//! with Burn's fusion through `super::fusion`): the squared gradient norm (one launch per group
//! of [`GROUP`] gradients, into per-unit partial sums that one reduction reads at the end of the
//! pass) and the Adam(W) update (one launch per group of parameters with the same
//! hyper-parameters, instead of the tensor version's ~14 element-wise launches per parameter).
//! Same f32 arithmetic, in the same order, as [`adam_update_tensors`] (a GPU compiler may still
//! contract a multiply-add, so the two agree to rounding, not bit for bit; tested on lavapipe in
//! `cube_tests`); the norm sums in another order than Burn's reduction (f32 rounding). f32
//! only; other dtypes, and `VRAMLAB_COMPOSED_KERNELS=1`, take the tensor versions.
//!
//! The update writes `p`, `m` and `v` in place (outputs aliasing the inputs) when their buffers
//! are ours alone (`CubeTensor::can_mut`, the test Burn's own in-place elementwise ops use:
//! no other tensor holds the memory handle), and into new buffers otherwise, so a shared input
//! is never written. On the first step, `m` takes the gradient's buffer when that is ours alone.
//! In-place updates are held back ([`OptimKernels::adam_update_later`]) and launched a group at
//! a time; an update that must write new buffers runs at once, alone ([`adam_update_f32`]).

use burn::tensor::{DType, Shape, Tensor as BurnTensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;

use super::{AdamUpdate, Decay, OptimKernels, SqAcc, adam_update_tensors, sq_sum_tensors};

/// `VRAMLAB_COMPOSED_KERNELS=1`: the tensor-op update instead of the kernel (read once per
/// process; the same switch the models' lean nodes read).
pub(super) fn composed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| env_choice("VRAMLAB_COMPOSED_KERNELS").unwrap_or(false))
}

/// What the environment variable `name` asks for: `None` where it is unset or empty, else on
/// unless it is `0` (read as `vramlab_models::nn::cube` reads its switches: the models do not
/// depend on this crate, nor it on them).
fn env_choice(name: &str) -> Option<bool> {
    std::env::var(name).ok().filter(|v| !v.is_empty()).map(|v| v != "0")
}

/// Units per cube of the update ([`adam_many_kernel`]): one size for every launch (the cube size
/// is part of a kernel's compiled identity; `CubeDim::new` sizes cubes by the element count,
/// which compiled the update once per size class).
const ADAM_CUBE: u32 = 256;
/// Units of the squared-norm kernel: each owns one slot of the partial sums.
const SQ_CUBE: u32 = 256;
const SQ_CUBES: u32 = 64;
/// Slots of the partial sums: one per unit launched at most.
pub(super) const SQ_SLOTS: usize = (SQ_CUBE * SQ_CUBES) as usize;
/// Elements a unit sums at least before another cube is launched.
const SQ_PER_UNIT: usize = 16;

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

/// The floats per load and store of the last update of a parameter of `n` elements, by `n`
/// ([`vector_size`]; keyed as [`IN_PLACE`]).
#[cfg(test)]
pub(super) static VECTOR: std::sync::Mutex<std::collections::BTreeMap<usize, usize>> = std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Whether `t`'s elements fill its buffer without a gap in some order of its dims: contiguous,
/// or a permutation of a contiguous buffer (on CubeCL a convolution's weight gradient is the
/// channels-last buffer its kernel wrote, seen as `[out, in, k…]`; a linear layer's is a
/// transposed matmul output).
fn dense<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    let (shape, strides) = (t.meta.shape(), t.meta.strides());
    let mut dims: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] != 1).collect();
    dims.sort_by_key(|&d| strides[d]);
    let mut expected = 1;
    for d in dims {
        if strides[d] != expected {
            return false;
        }
        expected *= shape[d];
    }
    true
}

/// `t`'s buffer seen as one dimension (`t` [`dense`]): its elements in memory order.
fn flat<R: CubeRuntime>(mut t: CubeTensor<R>) -> CubeTensor<R> {
    let n = t.meta.num_elements();
    t.meta = Box::new(cubecl::zspace::metadata::Metadata::new([n], [1]));
    t
}

/// A gradient as the update reads it: when [`dense`], the same view with its dims [`merged`]
/// (a contiguous one is flat; another order the kernel reads through its strides, [`strided`]);
/// copied contiguous otherwise. The permuted gradients of convolutions and linear layers were a
/// copy each (VAE ultra: 32 a step).
fn grad_layout<R: CubeRuntime>(g: CubeTensor<R>) -> CubeTensor<R> {
    if dense(&g) {
        merged(g)
    } else {
        flat(burn_cubecl::kernel::into_contiguous(g))
    }
}

/// `t` with its size-1 dims dropped and each run of dims that lie in memory one inside the
/// other merged into one (`stride[d] == stride[d + 1] · size[d + 1]`): the same elements in the
/// same row-major order, with fewer dims for [`strided`] to divide by. A convolution's weight
/// gradient on CubeCL (`[out, in, k…]` on a buffer written `[in, k…, out]`) becomes a transposed
/// `[out, in · k]`: two divisions per element instead of eight. In lavapipe's timed profile of
/// the VAE the update fell from 0.317 to 0.083 s a step; the untimed optimizer phase (~0.07 s)
/// did not measurably change.
pub(super) fn merged<R: CubeRuntime>(mut t: CubeTensor<R>) -> CubeTensor<R> {
    let (mut shape, mut strides): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for (&size, &stride) in t.meta.shape().iter().zip(t.meta.strides().iter()) {
        if size == 1 {
            continue;
        }
        match (shape.last_mut(), strides.last_mut()) {
            (Some(last), Some(last_stride)) if *last_stride == stride * size => {
                *last *= size;
                *last_stride = stride;
            }
            _ => {
                shape.push(size);
                strides.push(stride);
            }
        }
    }
    if shape.is_empty() {
        (shape, strides) = (vec![1], vec![1]);
    }
    t.meta = Box::new(cubecl::zspace::metadata::Metadata::new(shape, strides));
    t
}

/// Where element `i` (row-major over `t`'s shape) lies in `t`'s buffer: `i` itself for a flat
/// tensor.
#[cube]
fn strided<N: Size>(t: &Tensor<Vector<f32, N>>, i: usize) -> usize {
    let rank = t.rank();
    let mut rem = i;
    let mut offset = 0;
    for j in 0..rank {
        let d = rank - 1 - j;
        let size = t.shape(d);
        offset += (rem % size) * t.stride(d);
        rem /= size;
    }
    offset
}

/// Whether the kernel may write `t`'s buffer: no other tensor holds it.
fn ours<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    t.can_mut() && t.is_contiguous()
}

/// Whether the kernels take this update: f32 throughout, 1 to `u32::MAX` elements, and
/// `VRAMLAB_COMPOSED_KERNELS` unset (otherwise the tensor version runs).
pub(super) fn kernel_takes<B: burn::tensor::backend::Backend, const D: usize>(p: &BurnTensor<B, D>, g: &BurnTensor<B, D>, moments: &Option<(BurnTensor<B, 1>, BurnTensor<B, 1>)>) -> bool {
    let n = p.shape().num_elements();
    let f32s = p.dtype() == DType::F32 && g.dtype() == DType::F32 && moments.as_ref().is_none_or(|(m, v)| m.dtype() == DType::F32 && v.dtype() == DType::F32);
    f32s && n > 0 && n <= u32::MAX as usize && !composed()
}

/// Elements of a parameter below which its update reads and writes one float at a time: the
/// 4-wide variant is one more kernel to compile (NVRTC on CUDA), not worth it for a small update.
const VECTOR_MIN: usize = 1 << 16;

/// How many floats the update of `p` loads and stores at once: 4 where every buffer is flat,
/// a multiple of 4 long, starts 16-byte aligned, and `p` has at least [`VECTOR_MIN`] elements;
/// else 1. On lavapipe that halved ACT's update (section 5 of
/// `benches/results/kernels/wgpu/act_lavapipe_profile.md`); on a GPU it makes 16-byte loads.
fn vector_size<R: CubeRuntime>(p: &CubeTensor<R>, g: &CubeTensor<R>, moments: Option<&(CubeTensor<R>, CubeTensor<R>)>) -> usize {
    let n = p.meta.num_elements();
    let ready = |t: &CubeTensor<R>| t.meta.num_dims() == 1 && t.handle.offset_start.unwrap_or(0) % 16 == 0;
    let all = ready(p) && ready(g) && moments.is_none_or(|(m, v)| ready(m) && ready(v));
    if all && n % 4 == 0 && n >= VECTOR_MIN { 4 } else { 1 }
}

/// The update of the flattened, f32 `p`, `g` and moments, ready to launch: in place where the
/// buffers are ours alone (see the module docs), into new buffers otherwise.
fn prepare<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    p: BurnTensor<CubeBackend<R, F, I, BT>, 1>,
    g: CubeTensor<R>,
    moments: Option<(BurnTensor<CubeBackend<R, F, I, BT>, 1>, BurnTensor<CubeBackend<R, F, I, BT>, 1>)>,
    h: &AdamUpdate,
) -> Held<R> {
    let n = p.shape().num_elements();
    let (p, g) = (prim(p), grad_layout(g));
    let moments = moments.map(|(m, v)| (prim(m), prim(v)));
    // Decided before any clone below (a clone holds the handle too).
    let p_ours = ours(&p);
    let g_ours = moments.is_none() && ours(&g);
    let (m_ours, v_ours) = moments.as_ref().map_or((false, false), |(m, v)| (ours(m), ours(v)));
    #[cfg(test)]
    IN_PLACE.lock().unwrap().insert(n, [p_ours, g_ours || m_ours, v_ours]);
    let new = || burn_cubecl::ops::numeric::empty_device_dtype::<R>(p.client.clone(), p.device.clone(), Shape::from(vec![n]), DType::F32);
    let fresh = [!p_ours, !(g_ours || m_ours), !v_ours].map(|f| f.then(new));
    let vector = vector_size(&p, &g, moments.as_ref());
    #[cfg(test)]
    VECTOR.lock().unwrap().insert(n, vector);
    Held { p, g, mv: moments, fresh, h: *h, vector }
}

/// [`prepare`]d and launched at once, alone: one launch. `g`: any layout, `p`'s shape.
pub(super) fn adam_update_f32<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    p: BurnTensor<CubeBackend<R, F, I, BT>, 1>,
    g: CubeTensor<R>,
    moments: Option<(BurnTensor<CubeBackend<R, F, I, BT>, 1>, BurnTensor<CubeBackend<R, F, I, BT>, 1>)>,
    h: &AdamUpdate,
) -> (BurnTensor<CubeBackend<R, F, I, BT>, 1>, BurnTensor<CubeBackend<R, F, I, BT>, 1>, BurnTensor<CubeBackend<R, F, I, BT>, 1>) {
    let held = prepare(p, g, moments, h);
    let [p_out, m_out, v_out] = held.outputs();
    adam_group(vec![held]);
    (tensor(p_out), tensor(m_out), tensor(v_out))
}

/// Parameters (or gradients) one launch of [`adam_many_kernel`] / [`sq_sum_many_kernel`] takes
/// at most: a step launches one update and one sum per group instead of one per tensor (the
/// VAE's 132 parameter tensors: 19 + 17 launches instead of 264 on lavapipe). The group's size is
/// comptime (its tensors are a `Sequence`), so a model compiles one variant for full groups and
/// one for its last. Each tensor of a launch is a binding: see [`group_sizes`].
const GROUP: usize = 8;
/// Cubes of a grouped update at most: units loop over larger tensors.
const GROUP_CUBES: usize = 1024;

/// How many parameters one update launch and how many gradients one sum launch can take on this
/// device: every tensor is a storage binding, and a device has a limit per kernel (lavapipe:
/// 32, of which CubeCL keeps one for wgpu and one holds the launch's metadata). An update binds
/// four tensors per parameter (`p`, `g`, `m`, `v`; its outputs alias them), a first step's three
/// (`p`, `g` and the new `v`); a sum one per gradient and the partial sums. Below two, nothing is
/// grouped.
pub(super) fn group_sizes<R: CubeRuntime>(client: &ComputeClient<R>) -> (usize, usize) {
    let free = (client.properties().hardware.max_bindings as usize).saturating_sub(1);
    (GROUP.min(free / 4), GROUP.min(free.saturating_sub(1)))
}

/// The Adam(W) update of a group of parameters with one set of hyper-parameters: unit `u`
/// updates elements `u, u + stride, …` of each in turn (`stride`: the units launched; an
/// element: `N` floats, [`vector_size`]).
/// `first`: no moments yet (`ms` and `vs` are empty and not read); `scale`: multiply the
/// gradient by `coef`; `l2` / `decoupled`: the weight decay kind. Each output is a new buffer or
/// aliases an input (the launch decides: on the first step `m_out` may be the gradient's buffer);
/// every unit reads its element of each input before writing it.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn adam_many_kernel<N: Size>(
    ps: &Sequence<Tensor<Vector<f32, N>>>,
    gs: &Sequence<Tensor<Vector<f32, N>>>,
    ms: &Sequence<Tensor<Vector<f32, N>>>,
    vs: &Sequence<Tensor<Vector<f32, N>>>,
    p_out: &mut Sequence<Tensor<Vector<f32, N>>>,
    m_out: &mut Sequence<Tensor<Vector<f32, N>>>,
    v_out: &mut Sequence<Tensor<Vector<f32, N>>>,
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
    stride: u32,
    #[comptime] first: bool,
    #[comptime] scale: bool,
    #[comptime] l2: bool,
    #[comptime] decoupled: bool,
) {
    #[unroll]
    for k in 0..ps.len() {
        let p = ps.index(k);
        let g = gs.index(k);
        let po = p_out.index_mut(k);
        let mo = m_out.index_mut(k);
        let vo = v_out.index_mut(k);
        let n = p.len();
        let mut i = ABSOLUTE_POS;
        while i < n {
            let mut pi = p[i];
            // A flat gradient is read at `i`; a dense permuted one (vector size 1 only: see
            // `vector_size`) through its strides.
            let mut gidx = i;
            if g.rank() > 1 {
                gidx = strided(g, i);
            }
            let mut gi = g[gidx];
            let mut mi = gi;
            let mut vi = gi;
            if !first {
                mi = ms.index(k)[i];
                vi = vs.index(k)[i];
            }
            if scale {
                gi *= Vector::new(coef);
            }
            if l2 {
                gi += pi * Vector::new(wd);
            }
            if decoupled {
                pi *= Vector::new(keep);
            }
            if first {
                mi = gi * Vector::new(nb1);
                vi = gi * gi * Vector::new(nb2);
            } else {
                mi = mi * Vector::new(b1) + gi * Vector::new(nb1);
                vi = vi * Vector::new(b2) + gi * gi * Vector::new(nb2);
            }
            let denom = vi.sqrt() / Vector::new(sbc2) + Vector::new(eps);
            po[i] = pi - mi / denom * Vector::new(step);
            mo[i] = mi;
            vo[i] = vi;
            i += stride as usize;
        }
    }
}

/// `acc[unit] += Σ_k Σ g_k[i]²` over the unit's elements `unit, unit + stride, …` of each gradient
/// of a group (`stride`: the units launched). Launches run in order on one stream, and within
/// one each unit owns its slot.
#[cube(launch)]
fn sq_sum_many_kernel(gs: &Sequence<Tensor<f32>>, acc: &mut Tensor<f32>, stride: u32) {
    let unit = ABSOLUTE_POS;
    let mut s = 0.0f32;
    #[unroll]
    for k in 0..gs.len() {
        let g = gs.index(k);
        let n = g.len();
        let mut i = unit;
        while i < n {
            let x = g[i];
            s += x * x;
            i += stride as usize;
        }
    }
    acc[unit] += s;
}

/// Sums the f32, contiguous gradients `gs` (at most [`group_sizes`]' second) into `acc`'s partial sums
/// (allocated and zeroed on the first launch of a step): one launch.
pub(super) fn sq_sum_group<R: CubeRuntime>(gs: Vec<CubeTensor<R>>, acc: &mut Option<CubeTensor<R>>) {
    let Some(first) = gs.first() else { return };
    let (client, device) = (first.client.clone(), first.device.clone());
    let acc = acc.get_or_insert_with(|| burn_cubecl::ops::numeric::zeros_client::<R>(client.clone(), device, Shape::from(vec![SQ_SLOTS]), DType::F32));
    let n = gs.iter().map(|g| g.meta.num_elements()).max().unwrap_or(1);
    let cubes = n.div_ceil(SQ_CUBE as usize * SQ_PER_UNIT).clamp(1, SQ_CUBES as usize) as u32;
    let args: SequenceArg<R, Tensor<f32>> = gs.into_iter().map(|g| g.into_tensor_arg()).collect();
    sq_sum_many_kernel::launch::<R>(&client, CubeCount::new_1d(cubes), CubeDim::new_1d(SQ_CUBE), args, acc.clone().into_tensor_arg(), cubes * SQ_CUBE);
}

/// One parameter's update in a launch of [`adam_many_kernel`]: its inputs (flat, f32,
/// contiguous), its hyper-parameters and, per output (`p`, `m`, `v`), the new buffer it is
/// written in, or `None` to write it in its input's (`m` on the first step in `g`'s).
pub struct Held<R: CubeRuntime> {
    p: CubeTensor<R>,
    g: CubeTensor<R>,
    /// `None` on the first step.
    mv: Option<(CubeTensor<R>, CubeTensor<R>)>,
    fresh: [Option<CubeTensor<R>>; 3],
    h: AdamUpdate,
    /// Elements per load and store ([`vector_size`]).
    vector: usize,
}

impl<R: CubeRuntime> Held<R> {
    /// Whether it writes everything in place (but a first step's new `v`): such updates can
    /// share a launch.
    fn in_place(&self) -> bool {
        let [p, m, v] = &self.fresh;
        p.is_none() && m.is_none() && (v.is_none() || self.mv.is_none())
    }

    /// The buffers the update writes (`p`, `m`, `v`).
    fn outputs(&self) -> [CubeTensor<R>; 3] {
        let [p, m, v] = &self.fresh;
        [
            p.clone().unwrap_or_else(|| self.p.clone()),
            m.clone().unwrap_or_else(|| self.mv.as_ref().map_or_else(|| self.g.clone(), |(m, _)| m.clone())),
            v.clone().unwrap_or_else(|| self.mv.as_ref().map(|(_, v)| v.clone()).expect("a first step's update writes a new v")),
        ]
    }
}

/// Updates held back by [`OptimKernels::adam_update_later`] on CubeCL: launched a group at a
/// time, as soon as one fills, and the rest at [`OptimKernels::adam_flush`].
pub struct Later<R: CubeRuntime> {
    /// The open groups, each of updates with one launch key ([`same_launch`]), in the order they
    /// came. With [`by_key`] false there is at most one, and a change of key launches it.
    held: Vec<Vec<Held<R>>>,
}

impl<R: CubeRuntime> Default for Later<R> {
    fn default() -> Self {
        Self { held: Vec::new() }
    }
}

/// Whether held-back updates keep one open group per launch key (`true`) or one open group that
/// a change of key launches (`false`): as `VRAMLAB_ADAM_GROUP_BY_KEY` says where it is set (`0`
/// no, anything else yes), else yes on a device with matrix units or plane operations (a GPU)
/// and no on a CPU's Vulkan (lavapipe).
///
/// Where a model's 4-wide weights and 1-wide biases alternate ([`vector_size`]), one open group
/// launches once per parameter or two: ACT 85 update launches a step, 23 by key (Diffusion 55
/// and 31). On lavapipe the update by key took 0.70 s a step against 0.57 s, cause unknown
/// (`benches/results/kernels/wgpu/launch_trims.md`, 2026-12-07, second session). On a GPU the
/// 62 launches saved on ACT are about 0.3–0.9 ms a step at 5–15 µs a launch (an estimate): not
/// timed on one yet.
fn by_key<R: CubeRuntime>(client: &ComputeClient<R>) -> bool {
    #[cfg(test)]
    if let Some(asked) = BY_KEY_FOR_TESTS.get() {
        return asked;
    }
    static ASKED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let asked = *ASKED.get_or_init(|| env_choice("VRAMLAB_ADAM_GROUP_BY_KEY"));
    asked.unwrap_or_else(|| {
        let f = &client.properties().features;
        !f.matmul.cmma.is_empty() || f.plane.contains(cubecl::features::Plane::Ops)
    })
}

#[cfg(test)]
thread_local! {
    /// Tests: the grouping [`by_key`] answers on this thread, whatever the device.
    pub(super) static BY_KEY_FOR_TESTS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    /// Tests: [`adam_group`]'s launches on this thread.
    pub(super) static ADAM_LAUNCHES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether two updates can share a launch: the same scalars and the same comptime flags.
fn same_launch<R: CubeRuntime>(a: &Held<R>, b: &Held<R>) -> bool {
    let key = |x: &Held<R>| {
        let h = &x.h;
        let decay = match h.decay {
            Decay::None => (0, 0.0),
            Decay::L2(w) => (1, w),
            Decay::Decoupled(k) => (2, k),
        };
        (x.mv.is_none(), x.vector, [h.b1, h.b2, h.eps, h.lr, h.bc1, h.bc2, h.coef, decay.1].map(f64::to_bits), decay.0)
    };
    key(a) == key(b)
}

/// Launches the updates of `group` (all with the same launch key, [`same_launch`]): one launch.
fn adam_group<R: CubeRuntime>(group: Vec<Held<R>>) {
    let Some(head) = group.first() else { return };
    #[cfg(test)]
    ADAM_LAUNCHES.set(ADAM_LAUNCHES.get() + 1);
    let (h, vector) = (head.h, head.vector);
    let first = head.mv.is_none();
    let client = head.p.client.clone();
    let k = group.len();
    let n = group.iter().map(|x| x.p.meta.num_elements()).max().unwrap_or(1) / vector;
    let dim = CubeDim::new_1d(ADAM_CUBE);
    let cubes = n.div_ceil(ADAM_CUBE as usize).clamp(1, GROUP_CUBES) as u32;
    let (mut ps, mut gs, mut ms, mut vs) = (SequenceArg::new(), SequenceArg::new(), SequenceArg::new(), SequenceArg::new());
    let (mut po, mut mo, mut vo) = (SequenceArg::new(), SequenceArg::new(), SequenceArg::new());
    // Inputs are numbered in the order registered: the i-th parameter is input i, its gradient
    // K + i, its moments 2K + i and 3K + i. An output is a new buffer or aliases its input.
    let out = |fresh: Option<CubeTensor<R>>, input: &CubeTensor<R>, pos: usize| fresh.map_or_else(|| input.as_tensor_alias(pos), |t| t.into_tensor_arg());
    for (i, x) in group.into_iter().enumerate() {
        let [fp, fm, fv] = x.fresh;
        po.push(out(fp, &x.p, i));
        ps.push(x.p.into_tensor_arg());
        match x.mv {
            Some((m, v)) => {
                mo.push(out(fm, &m, 2 * k + i));
                vo.push(out(fv, &v, 3 * k + i));
                ms.push(m.into_tensor_arg());
                vs.push(v.into_tensor_arg());
            }
            None => {
                // No moments: m is written in the gradient's buffer or a new one, v in a new one.
                mo.push(out(fm, &x.g, k + i));
                vo.push(fv.expect("a first step's update writes a new v").into_tensor_arg());
            }
        }
        gs.push(x.g.into_tensor_arg());
    }
    let f = |x: f64| x as f32;
    let (wd, keep) = match h.decay {
        Decay::L2(wd) => (f(wd), 1.0),
        Decay::Decoupled(keep) => (0.0, f(keep)),
        Decay::None => (0.0, 1.0),
    };
    adam_many_kernel::launch::<R>(
        &client,
        CubeCount::new_1d(cubes),
        dim,
        vector,
        ps,
        gs,
        ms,
        vs,
        po,
        mo,
        vo,
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
        cubes * ADAM_CUBE,
        first,
        h.coef != 1.0,
        matches!(h.decay, Decay::L2(_)),
        matches!(h.decay, Decay::Decoupled(_)),
    );
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> OptimKernels for CubeBackend<R, F, I, BT> {
    type Later = Later<R>;

    fn grad_sq_sum<const D: usize>(g: BurnTensor<Self, D>, acc: &mut SqAcc<Self>) -> BurnTensor<Self, D> {
        let n = g.shape().num_elements();
        if g.dtype() != DType::F32 || n == 0 || n > u32::MAX as usize || composed() {
            return sq_sum_tensors(g, acc);
        }
        // Summed in memory order (any order will do), so a gradient dense in another order than
        // contiguous is read as it is, not copied, and handed back so for the update
        // (`grad_layout`); summed with the next gradients, a group at a time.
        let g = g.into_primitive().tensor();
        let g = if dense(&g) { g } else { burn_cubecl::kernel::into_contiguous(g) };
        let group = group_sizes(&g.client).1;
        acc.pending.push(tensor(flat(g.clone())));
        let g = BurnTensor::<Self, D>::from_primitive(TensorPrimitive::Float(g));
        if acc.pending.len() >= group {
            sum_pending(acc);
        }
        g
    }

    fn sq_total(mut acc: SqAcc<Self>) -> f64 {
        sum_pending(&mut acc);
        super::sq_total_tensors(acc)
    }

    fn adam_update<const D: usize>(p: BurnTensor<Self, D>, g: BurnTensor<Self, D>, moments: Option<(BurnTensor<Self, 1>, BurnTensor<Self, 1>)>, h: &AdamUpdate) -> (BurnTensor<Self, D>, BurnTensor<Self, 1>, BurnTensor<Self, 1>) {
        let shape = p.shape();
        let n = shape.num_elements();
        if !kernel_takes(&p, &g, &moments) {
            let (p, m, v) = adam_update_tensors(p.reshape([n]), g.reshape([n]), moments, h);
            return (p.reshape(shape), m, v);
        }
        // The gradient keeps its layout (see `grad_layout`).
        let (p, m, v) = adam_update_f32(p.reshape([n]), g.into_primitive().tensor(), moments, h);
        (p.reshape(shape), m, v)
    }

    fn adam_update_later<const D: usize>(p: BurnTensor<Self, D>, g: BurnTensor<Self, D>, moments: Option<(BurnTensor<Self, 1>, BurnTensor<Self, 1>)>, h: &AdamUpdate, later: &mut Later<R>) -> (BurnTensor<Self, D>, BurnTensor<Self, 1>, BurnTensor<Self, 1>) {
        if !kernel_takes(&p, &g, &moments) {
            return Self::adam_update(p, g, moments, h);
        }
        let shape = p.shape();
        let n = shape.num_elements();
        let held = prepare(p.reshape([n]), g.into_primitive().tensor(), moments, h);
        let [p_out, m_out, v_out] = held.outputs();
        let output = (tensor::<R, F, I, BT>(p_out).reshape(shape), tensor(m_out), tensor(v_out));
        // Held back only when every buffer it writes is its own (see the module docs); otherwise
        // one launch now, into new buffers where shared.
        let group = group_sizes(&held.p.client).0;
        if !held.in_place() || group < 2 {
            adam_group(vec![held]);
            return output;
        }
        let open = later.held.iter().position(|g| same_launch(&g[0], &held));
        let at = match open {
            Some(at) => at,
            None => {
                if !by_key(&held.p.client) {
                    later.held.drain(..).for_each(adam_group);
                }
                later.held.push(Vec::with_capacity(group));
                later.held.len() - 1
            }
        };
        later.held[at].push(held);
        if later.held[at].len() >= group {
            adam_group(later.held.remove(at));
        }
        output
    }

    fn adam_flush(later: Later<R>) {
        later.held.into_iter().for_each(adam_group);
    }
}

/// Sums the gradients `acc` holds back into its partial sums (one launch).
fn sum_pending<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(acc: &mut SqAcc<CubeBackend<R, F, I, BT>>) {
    if acc.pending.is_empty() {
        return;
    }
    let gs = std::mem::take(&mut acc.pending).into_iter().map(|g| g.into_primitive().tensor()).collect();
    let mut partials = acc.partials.take().map(|a| a.into_primitive().tensor());
    sq_sum_group(gs, &mut partials);
    acc.partials = partials.map(tensor);
}
