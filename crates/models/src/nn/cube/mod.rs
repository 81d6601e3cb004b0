//! GPU kernels for the lean autodiff nodes (`nn::lean`) on CubeCL backends (wgpu, cuda, with or
//! without Burn's fusion): `#[cube]` sources compiled to WGSL/SPIR-V or CUDA from one source,
//! launched on `CubeTensor`s. They replace the composed Burn ops (`lean::burn_kernels`: a dozen or more
//! small kernels per op) with a few launches each:
//!
//! - [`group_norm`]: GroupNorm (+ fused SiLU, Mish or ReLU) forward (stats, apply) and backward (per-channel
//!   reduction, per-group/per-channel finish, apply);
//! - [`layer_norm`]: LayerNorm forward (one launch) and backward (rows, then columns);
//! - [`softmax`]: softmax along the last axis, forward and backward from the output (one
//!   launch each);
//! - [`attention`]: an attention's projection bias and head split, and its scaled, masked
//!   softmax with the dropout after it, one launch each;
//! - [`channel_sum`]: the sum over every axis but one (the bias gradients of the convolution
//!   and linear nodes), one launch and one compilation for every shape;
//! - [`dropout`]: dropout with the host's masks computed on the device, forward and backward
//!   one launch each, nothing uploaded or stored; in the same launch a transformer's residual add
//!   after it or its FFN's ReLU before it, and the linear layer's bias before either;
//! - [`relu`]: ReLU forward and backward, one launch each, in the input's dense layout;
//! - [`affine`]: the frozen batch norm's `(scale, shift)` from its buffers and its per-channel
//!   `x · scale + shift` (forward and backward), one launch each, in the input's dense layout;
//! - [`act`]: SiLU and Mish forward and backward, one launch each, in the input's dense layout;
//! - [`cat`]: three equal parts stacked along the first axis (the attention node's packed
//!   parameter gradients), and a self-attention's `[dq | dk]` from the two gradients' heads, one
//!   launch each;
//! - [`film`]: Diffusion's FiLM (`x · scale + bias` per batch and channel from the conditioning's
//!   `[b, 2c]` embedding), one launch forward and two backward, in the input's dense layout;
//! - [`upsample`]: linear upsampling along one axis (the VAE decoder's trilinear upsampling),
//!   forward and backward one launch each, in the input's dense layout;
//! - [`act_loss`]: ACT's loss (the L1 term plus the KL term), two launches forward and one
//!   backward;
//! - [`voxel_loss`]: the 4D-Radar VAE's loss (the reference's sparse-voxel reconstruction
//!   loss plus the KL term), two launches forward and one backward;
//! - [`weight`]: a convolution weight flipped for the input gradient, written channels last
//!   (as the convolution reads it) in one launch;
//! - [`conv`]: Burn's convolutions (forward, weight gradient) with a short search over the
//!   kernels that win on a GPU instead of Burn's full one, none on a device without matrix units,
//!   where 1-D and 2-D convolutions are [`columns`]: im2col blocks and the fixed matmul, 3-D
//!   ones [`forward_tiles`] (a register tile per unit) and 3-D weight gradients [`weight_grad`]
//!   (one tile reduction per group of units);
//! - [`matmul`]: Burn's matmul with one fixed kernel instead of its autotuned search
//!   ([`matmul_autotune`]).
//!
//! Compute is f32; inputs and outputs are in the input's dtype (f32, f16 or bf16 where the
//! device has it; f32 and f16 tested on lavapipe), statistics and per-channel parameters in
//! f32, exactly what the composed ops take and return. Here: what the families share (the cube-wide sum, launch helpers, the
//! backend ↔ `CubeTensor` bridge [`CubeLaunch`], and [`composed`], the switch back to the
//! composed ops). [`CubeLaunch`] runs a kernel on a backend's float primitives: on Burn's
//! `CubeBackend` at once, on `Fusion<CubeBackend>` (`fusion`) as a custom operation of the
//! fusion stream, which ends the fused block before it and runs the kernel on the stream's
//! handles when the stream gets there.

use burn::prelude::*;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;

pub mod act;
pub mod act_loss;
pub mod affine;
pub mod attention;
pub mod cat;
pub mod channel_sum;
pub mod columns;
pub mod conv;
pub mod dropout;
pub mod film;
pub mod forward_tiles;
#[cfg(feature = "fusion")]
mod fusion;
pub mod group_norm;
pub mod layer_norm;
pub mod relu;
pub mod softmax;
pub mod unit_matmul;
pub mod upsample;
pub mod voxel_loss;
pub mod weight;
pub mod weight_grad;

/// Units per cube of the reducing kernels (one cube per group / channel / row).
pub(crate) const BLOCK: usize = 256; // `cube_sum` and `cube_max` halve it eight times

/// Float primitive of backend `B`.
pub type Float<B> = <B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;

/// The dims and dtype of a kernel's output, declared before the launch: Burn's fusion creates an
/// operation's output tensors when the operation is registered, before it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct OutSpec {
    pub dims: Vec<usize>,
    pub dtype: DType,
}

impl OutSpec {
    pub fn new(dims: Vec<usize>, dtype: DType) -> Self {
        Self { dims, dtype }
    }
    pub fn f32(dims: Vec<usize>) -> Self {
        Self { dims, dtype: DType::F32 }
    }
    /// Panics when `t` is not what was declared: a kernel and its declaration disagree (a bug
    /// here, not a user error), which under fusion would hand later operations wrong metadata.
    fn check<R: CubeRuntime>(&self, name: &str, t: &CubeTensor<R>) {
        let dims = t.meta.shape().to_vec();
        assert!(dims == self.dims && t.dtype == self.dtype, "{name}: the kernel returned {dims:?} {:?}, declared {:?} {:?}", t.dtype, self.dims, self.dtype);
    }
}

/// A backend the `#[cube]` kernels run on: Burn's `CubeBackend` (its float primitive is a
/// `CubeTensor`, the kernel runs at once) and `Fusion<CubeBackend>` (`fusion`: a custom operation
/// of the fusion stream).
pub trait CubeLaunch: Backend {
    type Runtime: CubeRuntime;
    /// Runs `kernel` on the `CubeTensor`s of `inputs`; its results, whose dims and dtypes
    /// `outputs` declares, come back as this backend's primitives. `name` identifies the
    /// operation in the fusion stream (with its inputs' and outputs' metadata; the scalars the
    /// kernel captures are not part of it).
    fn cube_op<const I: usize, const O: usize>(name: &'static str, inputs: [Float<Self>; I], outputs: [OutSpec; O], kernel: impl Fn([CubeTensor<Self::Runtime>; I]) -> [CubeTensor<Self::Runtime>; O] + Send + Sync + 'static) -> [Float<Self>; O];
    /// `t`'s strides where they are known when the operation is registered: on `CubeBackend`;
    /// not under fusion, whose stream lays tensors out when it runs them.
    fn strides(t: &Float<Self>) -> Option<Vec<usize>>;
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> CubeLaunch for CubeBackend<R, F, I, BT> {
    type Runtime = R;
    fn cube_op<const NI: usize, const O: usize>(name: &'static str, inputs: [CubeTensor<R>; NI], outputs: [OutSpec; O], kernel: impl Fn([CubeTensor<R>; NI]) -> [CubeTensor<R>; O] + Send + Sync + 'static) -> [CubeTensor<R>; O] {
        let out = kernel(inputs);
        for (t, spec) in out.iter().zip(&outputs) {
            spec.check(name, t);
        }
        out
    }
    fn strides(t: &CubeTensor<R>) -> Option<Vec<usize>> {
        Some(t.meta.strides().to_vec())
    }
}

/// `VRAMLAB_COMPOSED_KERNELS=1`: the lean nodes run the composed Burn ops on CubeCL backends
/// instead of these kernels, and on wgpu a strided conv3d's input gradient Burn's transposed
/// convolution except where that is wrong (`LeanBackend::spread_strided_x_backward`) (read once
/// per process; for comparisons and as a way around a driver that miscompiles a kernel).
pub fn composed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| env_switch("VRAMLAB_COMPOSED_KERNELS"))
}

/// Whether the environment variable `name` turns a switch on: set, not empty, not `0`.
pub(crate) fn env_switch(name: &str) -> bool {
    env_choice(name).unwrap_or(false)
}

/// What the environment variable `name` asks for: `None` where it is unset or empty, else on
/// unless it is `0`.
pub(crate) fn env_choice(name: &str) -> Option<bool> {
    std::env::var(name).ok().filter(|v| !v.is_empty()).map(|v| v != "0")
}

/// Neither matrix units nor plane operations: how CubeCL's wgpu runtime describes a CPU's Vulkan
/// (lavapipe; it leaves plane operations off on an adapter of type `Cpu`). Kernels choose by it
/// where a CPU and a GPU weigh a launch against the work of the units differently
/// ([`unit_matmul`], [`group_norm`]).
pub(crate) fn cpu_vulkan(features: &cubecl::features::Features) -> bool {
    features.matmul.cmma.is_empty() && !features.plane.contains(cubecl::features::Plane::Ops)
}

/// Whether the lean matmul ([`matmul`]) takes Burn's autotuned `float_matmul` (true) or
/// CubeCL's fixed kernel (false, the default). Set once per process, before the first matmul
/// ([`set_matmul_autotune`], from `--matmul_autotune`).
pub fn matmul_autotune() -> bool {
    MATMUL_AUTOTUNE.load(std::sync::atomic::Ordering::Relaxed)
}

static MATMUL_AUTOTUNE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// See [`matmul_autotune`].
pub fn set_matmul_autotune(on: bool) {
    MATMUL_AUTOTUNE.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// `lhs @ rhs` (equal leading axes) with CubeCL's fixed matmul (`MatmulStrategy::Cube`: cubek's
/// `Strategy::Auto`, the simple cyclic tile-matmul kernel on the device's matrix units where it
/// has them, else the unit kernel; wider blocks per unit for f32 on a CPU's Vulkan: [`unit_matmul`]);
/// where that cannot be set up for these operands, Burn's default strategy (autotune in builds
/// with it).
///
/// Why: Burn's `float_matmul` autotunes every new shape and layout, compiling and timing each
/// candidate (on an H100, 20 of 29 for most of ACT's keys, about 0.47 s of NVRTC each). The
/// fixed kernel is one of those candidates: in the H100 run of 2026-11-27 it was within 1.0–2.2×
/// of each key's winner, 2.2 ms against the winners' 1.57 ms summed over the 17 keys of ACT
/// b8 480×640's forward (read off the committed autotune results: per-key table in
/// `benches/results/kernels/wgpu/fixed_matmul.md`).
///
/// On a device without cooperative-matrix instructions (lavapipe) the tile-matmul attempt fails
/// only after copying a highly permuted operand (an attention head view) contiguous, and the unit
/// kernel it falls back on copies it again; such an operand is copied here once instead (on ACT
/// b2 64×64 on lavapipe 80 copies a step fewer: as many as with Burn's autotuned matmul).
pub fn matmul<R: CubeRuntime>(lhs: CubeTensor<R>, rhs: CubeTensor<R>) -> CubeTensor<R> {
    use burn_cubecl::kernel::matmul::{MatmulStrategy, matmul};
    use cubecl::std::tensor::{MatrixBatchLayout, matrix_batch_layout};
    let unit_only = lhs.client.properties().features.matmul.cmma.is_empty();
    let relayout = |t: CubeTensor<R>| {
        if unit_only && matrix_batch_layout(t.meta.strides(), None) == MatrixBatchLayout::HighlyPermuted {
            burn_cubecl::kernel::into_contiguous(t)
        } else {
            t
        }
    };
    let (lhs, rhs) = (relayout(lhs), relayout(rhs));
    let dtype = lhs.dtype;
    match unit_matmul::matmul_into(lhs.clone(), rhs.clone(), None, dtype) {
        Ok(y) => y,
        Err(_) => matmul(lhs, rhs, None, MatmulStrategy::default(), dtype).expect("Burn's matmul"),
    }
}

/// The sum of every unit's `v` over the cube ([`BLOCK`] units), in every unit. `shared` holds
/// [`BLOCK`] f32; all units must call it (it synchronises the cube).
#[cube]
pub(crate) fn cube_sum(v: f32, shared: &mut SharedMemory<f32>) -> f32 {
    cube_fold(v, shared, false)
}

/// Column `k` of the `cubes` rows of `sums` values a partial-sums kernel wrote (`partial[c ·
/// sums + k]` for cube `c`), added, in every unit of the one cube that reads them.
#[cube]
pub(crate) fn partial_total(partial: &cubecl::prelude::Tensor<f32>, #[comptime] k: usize, #[comptime] sums: usize, cubes: u32, shared: &mut SharedMemory<f32>) -> f32 {
    let mut s = 0.0f32;
    let mut c = UNIT_POS_X as usize;
    while c < cubes as usize {
        s += partial[c * sums + k];
        c += BLOCK;
    }
    cube_sum(s, shared)
}

/// The maximum of every unit's `v` over the cube, in every unit (as [`cube_sum`]).
#[cube]
pub(crate) fn cube_max(v: f32, shared: &mut SharedMemory<f32>) -> f32 {
    cube_fold(v, shared, true)
}

/// [`cube_sum`] or, with `is_max`, [`cube_max`]: a tree over `shared`, halved eight times
/// ([`BLOCK`] = 256 = 2⁸ units).
#[cube]
fn cube_fold(v: f32, shared: &mut SharedMemory<f32>, #[comptime] is_max: bool) -> f32 {
    let u = UNIT_POS_X as usize;
    shared[u] = v;
    sync_cube();
    fold_step(shared, u, 128usize, is_max);
    fold_step(shared, u, 64usize, is_max);
    fold_step(shared, u, 32usize, is_max);
    fold_step(shared, u, 16usize, is_max);
    fold_step(shared, u, 8usize, is_max);
    fold_step(shared, u, 4usize, is_max);
    fold_step(shared, u, 2usize, is_max);
    fold_step(shared, u, 1usize, is_max);
    let total = shared[0];
    sync_cube();
    total
}

/// One halving step of [`cube_fold`]'s tree.
#[cube]
fn fold_step(shared: &mut SharedMemory<f32>, u: usize, #[comptime] stride: usize, #[comptime] is_max: bool) {
    if u < stride {
        if comptime![is_max] {
            shared[u] = max(shared[u], shared[u + stride]);
        } else {
            shared[u] = shared[u] + shared[u + stride];
        }
    }
    sync_cube();
}

/// The linear index of this cube in a [`row_cubes`] launch.
#[cube]
pub(crate) fn cube_row() -> usize {
    CUBE_POS
}

/// One cube of [`BLOCK`] units per row, `rows` cubes laid out in x then y (x at most 65535).
pub(crate) fn row_cubes(rows: usize) -> (CubeCount, CubeDim) {
    let x = rows.clamp(1, 65535);
    (CubeCount::Static(x as u32, rows.div_ceil(x) as u32, 1), CubeDim::new_1d(BLOCK as u32))
}

/// Units per cube of an element-wise launch: one size for every tensor, because the cube size
/// is part of a kernel's compiled identity (`CubeDim::new` sizes cubes by the element count,
/// which compiled the optimizer's update four times in one VAE step, once per size class).
pub(crate) const ELEM_CUBE: u32 = 256;

/// One unit per element of `n` elements, in cubes of [`ELEM_CUBE`] units.
pub(crate) fn elem_cubes<R: CubeRuntime>(client: &ComputeClient<R>, n: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new_1d(ELEM_CUBE);
    (cubecl::calculate_cube_count_elemwise(client, n.max(1), dim), dim)
}

/// An uninitialised contiguous tensor on `like`'s device.
pub(crate) fn empty<R: CubeRuntime>(like: &CubeTensor<R>, dims: Vec<usize>, dtype: DType) -> CubeTensor<R> {
    burn_cubecl::ops::numeric::empty_device_dtype::<R>(like.client.clone(), like.device.clone(), Shape::from(dims), dtype)
}

/// `x` contiguous, in `x`'s dtype.
pub(crate) fn contiguous<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    burn_cubecl::kernel::into_contiguous(x)
}

/// Where element `(n, c, s)` of an `[n, c, s…]` tensor lies in its buffer (`s` the flattened
/// spatial index, `S` spatial elements, `C` channels), for the two dense layouts the kernels
/// read and write: `n·C·S + c·channel + s·spatial`. Channels first (`[n, c, s…]` contiguous):
/// `channel = S`, `spatial = 1`. Channels last (`[n, s…, c]` contiguous, seen as `[n, c, s…]`):
/// `channel = 1`, `spatial = C`; what Burn's convolutions return on CubeCL (they compute
/// channels-last and permute the view back), and what a kernel given such a tensor returns, so
/// that the next convolution's own permute to channels-last finds its input contiguous instead
/// of copying it. Both are runtime scalars of the same compiled kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChannelLayout {
    pub channel: usize,
    pub spatial: usize,
}

impl ChannelLayout {
    /// Channels last, told apart from channels first only where both differ (`S > 1`, `C > 1`).
    pub fn is_last(self) -> bool {
        self.channel == 1 && self.spatial != 1
    }
}

/// Whether `strides` are those of `shape` laid out contiguously with its dims in `order`
/// (outermost first); dims of size 1 may have any stride.
pub(crate) fn dense_in_order(shape: &[usize], strides: &[usize], order: impl DoubleEndedIterator<Item = usize>) -> bool {
    let mut expected = 1;
    for d in order.rev() {
        if shape[d] != 1 && strides[d] != expected {
            return false;
        }
        expected *= shape[d];
    }
    true
}

/// Whether `t` fills its buffer without a gap in some order of its dims: contiguous, or a
/// permutation of a contiguous buffer (a convolution's channels-last output seen as `[n, c, s…]`).
pub(crate) fn dense<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    let (shape, strides) = (t.meta.shape(), t.meta.strides());
    let mut order: Vec<usize> = (0..shape.len()).collect();
    order.sort_by_key(|&d| std::cmp::Reverse(strides[d]));
    dense_in_order(shape, strides, order.into_iter())
}

/// `t` as it is when [`dense`], else a contiguous copy.
pub(crate) fn dense_or_copy<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    if dense(&t) { t } else { contiguous(t) }
}

/// `a` and `b` (one shape) in one dense layout, for an element-wise kernel that reads both at one
/// index: as they are when they share one, else both contiguous.
pub(crate) fn one_dense_layout<R: CubeRuntime>(a: CubeTensor<R>, b: CubeTensor<R>) -> (CubeTensor<R>, CubeTensor<R>) {
    let (a, b) = (dense_or_copy(a), dense_or_copy(b));
    if a.meta.strides() == b.meta.strides() { (a, b) } else { (contiguous(a), contiguous(b)) }
}

/// A new tensor in `like`'s layout (its shape and strides, a buffer of its size).
pub(crate) fn new_like<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    let mut out = empty(like, vec![like.meta.num_elements()], like.dtype);
    out.meta = like.meta.clone();
    out
}

/// Where an element-wise kernel writes a result in `like`'s layout: `like`'s own buffer (an alias
/// of the kernel's input `input_pos`) when the tensor is its alone, else a new one.
pub(crate) fn elem_out<R: CubeRuntime>(like: &CubeTensor<R>, input_pos: usize) -> (CubeTensor<R>, TensorArg<R>) {
    if like.can_mut() {
        (like.clone(), like.as_tensor_alias(input_pos))
    } else {
        let out = new_like(like);
        (out.clone(), out.into_tensor_arg())
    }
}

/// What an element-wise launch over `t` takes: its client, one unit per element ([`elem_cubes`]),
/// the element count and the dtype.
pub(crate) fn elem_launch<R: CubeRuntime>(t: &CubeTensor<R>) -> (ComputeClient<R>, CubeCount, CubeDim, u32, StorageType) {
    let n = t.meta.num_elements();
    let (count, dim) = elem_cubes(&t.client, n);
    (t.client.clone(), count, dim, n as u32, t.dtype.into())
}

/// `x` (`[n, c, s…]`, rank ≥ 2) in one of the two [`ChannelLayout`]s: as it is when it is in
/// one (channels first preferred when it is both), else copied to channels first.
pub(crate) fn channel_layout<R: CubeRuntime>(x: CubeTensor<R>) -> (CubeTensor<R>, ChannelLayout) {
    let (shape, strides) = (x.meta.shape().to_vec(), x.meta.strides().to_vec());
    let rank = shape.len();
    let (c, s) = (shape[1], shape[2..].iter().product::<usize>());
    if dense_in_order(&shape, &strides, 0..rank) {
        return (x, ChannelLayout { channel: s, spatial: 1 });
    }
    if rank > 2 && dense_in_order(&shape, &strides, std::iter::once(0).chain(2..rank).chain(std::iter::once(1))) {
        return (x, ChannelLayout { channel: 1, spatial: c });
    }
    (contiguous(x), ChannelLayout { channel: s, spatial: 1 })
}

/// The axes that view a channels-last buffer (`[n, s…, c]`) as `[n, c, s…]`.
fn from_channels_last(rank: usize) -> Vec<usize> {
    [0, rank - 1].into_iter().chain(1..rank - 1).collect()
}

/// An uninitialised `[n, c, s…]` tensor like `like`, in `layout` (see [`ChannelLayout`]).
pub(crate) fn empty_in<R: CubeRuntime>(like: &CubeTensor<R>, dims: Vec<usize>, dtype: DType, layout: ChannelLayout) -> CubeTensor<R> {
    if !layout.is_last() {
        return empty(like, dims, dtype);
    }
    let stored: Vec<usize> = std::iter::once(dims[0]).chain(dims[2..].iter().copied()).chain(std::iter::once(dims[1])).collect();
    burn_cubecl::ops::permute(empty(like, stored, dtype), &from_channels_last(dims.len()))
}

/// `t` (`[n, c, s…]`) in `layout` (see [`ChannelLayout`]): as it is when it is laid out so
/// already, else copied into it (a second operand read at another's buffer index).
pub(crate) fn into_layout<R: CubeRuntime>(t: CubeTensor<R>, layout: ChannelLayout) -> CubeTensor<R> {
    let (t, current) = channel_layout(t);
    if current == layout {
        return t;
    }
    if !layout.is_last() {
        return contiguous(t);
    }
    let rank = t.meta.shape().num_dims();
    let to_last: Vec<usize> = [0].into_iter().chain(2..rank).chain([1]).collect();
    burn_cubecl::ops::permute(contiguous(burn_cubecl::ops::permute(t, &to_last)), &from_channels_last(rank))
}

/// `x` as f32 (a cast kernel only when it is not f32 already): per-channel parameters.
pub(crate) fn f32_of<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    contiguous(burn_cubecl::kernel::cast(x, DType::F32))
}
