//! GPU kernels for the lean autodiff nodes (`nn::lean`) on CubeCL backends (wgpu, cuda; Burn's
//! fusion off): `#[cube]` sources compiled to WGSL/SPIR-V or CUDA from one source, launched on
//! `CubeTensor`s. They replace the composed Burn ops (`lean::burn_kernels`: a dozen or more
//! small kernels per op) with a few launches each:
//!
//! - [`group_norm`]: GroupNorm (+ fused SiLU) forward (stats, apply) and backward (per-channel
//!   reduction, per-group/per-channel finish, apply);
//! - [`layer_norm`]: LayerNorm forward (one launch) and backward (rows, then columns);
//! - [`softmax`]: softmax along the last axis, forward and backward from the output (one
//!   launch each).
//!
//! Compute is f32; inputs and outputs are in the input's dtype (f32, f16 or bf16 where the
//! device has it; f32 and f16 tested on lavapipe), statistics and per-channel parameters in
//! f32, exactly what the composed ops take and return. Here: what the families share (the cube-wide sum, launch helpers, the
//! backend ↔ `CubeTensor` bridge [`CubePrim`], and [`composed`], the switch back to the
//! composed ops).

use burn::prelude::*;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;

pub mod group_norm;
pub mod layer_norm;
pub mod softmax;

/// Units per cube of the reducing kernels (one cube per group / channel / row).
pub(crate) const BLOCK: usize = 256; // `cube_sum` and `softmax::cube_max` halve it eight times

/// A backend whose float primitive is a `CubeTensor` (Burn's `CubeBackend`, without fusion).
pub trait CubePrim: Backend {
    type Runtime: CubeRuntime;
    fn into_cube(x: <Self as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive) -> CubeTensor<Self::Runtime>;
    fn from_cube(x: CubeTensor<Self::Runtime>) -> <Self as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> CubePrim for CubeBackend<R, F, I, BT> {
    type Runtime = R;
    fn into_cube(x: CubeTensor<R>) -> CubeTensor<R> {
        x
    }
    fn from_cube(x: CubeTensor<R>) -> CubeTensor<R> {
        x
    }
}

/// `VRAMLAB_COMPOSED_KERNELS=1`: the lean nodes run the composed Burn ops on CubeCL backends
/// instead of these kernels (read once per process; for comparisons and as a way around a
/// driver that miscompiles a kernel).
pub fn composed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("VRAMLAB_COMPOSED_KERNELS").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// The sum of every unit's `v` over the cube ([`BLOCK`] units), in every unit. `shared` holds
/// [`BLOCK`] f32; all units must call it (it synchronises the cube).
#[cube]
pub(crate) fn cube_sum(v: f32, shared: &mut SharedMemory<f32>) -> f32 {
    let u = UNIT_POS_X as usize;
    shared[u] = v;
    sync_cube();
    sum_step(shared, u, 128usize);
    sum_step(shared, u, 64usize);
    sum_step(shared, u, 32usize);
    sum_step(shared, u, 16usize);
    sum_step(shared, u, 8usize);
    sum_step(shared, u, 4usize);
    sum_step(shared, u, 2usize);
    sum_step(shared, u, 1usize);
    let total = shared[0];
    sync_cube();
    total
}

/// One halving step of [`cube_sum`]'s tree ([`BLOCK`] = 256 = 2⁸ units, eight steps).
#[cube]
fn sum_step(shared: &mut SharedMemory<f32>, u: usize, #[comptime] stride: usize) {
    if u < stride {
        shared[u] = shared[u] + shared[u + stride];
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

/// One unit per element of `n` elements.
pub(crate) fn elem_cubes<R: CubeRuntime>(client: &ComputeClient<R>, n: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new(client, n.max(1));
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

/// `x` as f32 (a cast kernel only when it is not f32 already): per-channel parameters.
pub(crate) fn f32_of<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    contiguous(burn_cubecl::kernel::cast(x, DType::F32))
}
