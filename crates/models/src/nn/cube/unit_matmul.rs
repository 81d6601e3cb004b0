//! The fixed matmul of the lean nodes and the im2col columns: cubek's matmul with `Strategy::Auto`
//! (Burn's `MatmulStrategy::Cube`). On a CPU's Vulkan (lavapipe; `VRAMLAB_WIDE_UNIT_MATMUL` turns
//! it off with `0`, or on elsewhere: `wide_on`), for f32, cubek's unit routine (`SimpleUnit`:
//! operands staged in shared memory, each unit a register-tiled block of the output) with larger
//! blocks per unit than cubek picks.
//!
//! Why: on lavapipe (a CPU running a cube's units as SIMD lanes) the kernel ran faster the more
//! multiply-adds a unit does per value it loads (my reading of the probe below, not a profile). cubek's own
//! choice (`infer_blueprint_unit`, max tile size) gives each unit 4 × 2 tiles of 4 × 4 (16 × 8
//! outputs) in cubes of 64 units. Here a unit owns up to 8 × 4 tiles (32 × 16 outputs: 48 values
//! loaded per 512 multiply-adds per k) in cubes of 16 units: ACT's three largest products ran 1.4–1.9×
//! faster in a probe on a 2-core Xeon VM, and ACT b8's steady step was 21 % shorter in three interleaved
//! rounds (`benches/results/kernels/wgpu/unit_matmul.md`). On a GPU those blocks would not fit in
//! registers; devices with matrix units never take this path.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::matmul::{MatmulStrategy, init_matmul_output, matmul};
use burn_cubecl::tensor::CubeTensor;
use cubecl::features::Features;

use super::cpu_vulkan;
use cubek::matmul::components::stage::PartitionBuffering;
use cubek::matmul::components::tile::TileMatmulKind;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems, MatmulProblem, MatmulSetupError, TilingBlueprint, TilingScheme};
use cubek::matmul::launch::Strategy;
use cubek::matmul::routines::BlueprintStrategy;
use cubek::std::cube_count::{CubeCountStrategy, GlobalOrder, HypercubeBlueprint, SmAllocation};
use cubek::std::{InputBinding, PartitionSize, StageSize, TileSize};

/// Units of a cube along m and (at least) n: 16 in all, or one plane where planes are wider.
const STAGE_M: u32 = 4;
const STAGE_UNITS: u32 = 16;
/// A tile is 4 × 4 × 4: f32 operands load 4 wide.
const TILE: u32 = 4;

/// `lhs @ rhs` (equal or broadcast leading axes) into `out` (or a new tensor of `dtype`): with
/// [`matmul_wide`] on a CPU's Vulkan (or where `VRAMLAB_WIDE_UNIT_MATMUL` asks for it: `wide_on`)
/// and where it applies, else with `MatmulStrategy::Cube` (cubek's `Strategy::Auto`).
pub fn matmul_into<R: CubeRuntime>(lhs: CubeTensor<R>, rhs: CubeTensor<R>, out: Option<CubeTensor<R>>, dtype: DType) -> Result<CubeTensor<R>, MatmulSetupError> {
    if !wide_on(&lhs.client.properties().features) {
        return matmul(lhs, rhs, out, MatmulStrategy::Cube, dtype);
    }
    matmul_wide(lhs, rhs, out, dtype)
}

/// The wide blocks for f32 on a device without matrix units; anything else, and any product
/// whose forced blueprint cubek refuses, with `MatmulStrategy::Cube`.
pub fn matmul_wide<R: CubeRuntime>(lhs: CubeTensor<R>, rhs: CubeTensor<R>, out: Option<CubeTensor<R>>, dtype: DType) -> Result<CubeTensor<R>, MatmulSetupError> {
    let unit_only = lhs.client.properties().features.matmul.cmma.is_empty();
    let plain_f32 = [lhs.dtype, rhs.dtype, dtype].iter().all(|d| *d == DType::F32) && lhs.qparams.is_none() && rhs.qparams.is_none();
    if !(unit_only && plain_f32) {
        return matmul(lhs, rhs, out, MatmulStrategy::Cube, dtype);
    }
    let out = out.unwrap_or_else(|| init_matmul_output(&lhs, &rhs, dtype));
    match launch_wide(&lhs, &rhs, &out) {
        Ok(()) => {
            #[cfg(test)]
            RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(out)
        }
        Err(_) => matmul(lhs, rhs, Some(out), MatmulStrategy::Cube, dtype),
    }
}

/// Whether the wide blocks run: as `VRAMLAB_WIDE_UNIT_MATMUL` says where it is set (`0` off,
/// anything else on), else on a device with neither matrix units nor plane operations, which is
/// how CubeCL's wgpu runtime describes a CPU's Vulkan (lavapipe; it leaves plane operations off on
/// an adapter of type `Cpu`). There they make the steady step faster and the first step slower:
/// each variant is a large unrolled kernel that lavapipe compiles on first use. ACT b8 on a 2-core
/// Xeon VM: steady step −21 % against cubek's own blocks (three interleaved rounds), cold step 1 80 → 288 s without
/// Mesa's shader cache (`benches/results/kernels/wgpu/unit_matmul.md`). A GPU without matrix
/// units but with plane operations keeps cubek's blocks: 512 accumulators a unit would not fit
/// in its registers.
fn wide_on(features: &Features) -> bool {
    static ASKED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let asked = *ASKED.get_or_init(|| super::env_choice("VRAMLAB_WIDE_UNIT_MATMUL"));
    asked.unwrap_or_else(|| cpu_vulkan(features))
}

/// Wide-block launches (tests assert the path was taken).
#[cfg(test)]
pub(crate) static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Tiles per unit along m: 8 (a 128-row cube) from 256 rows on, 4 from 64, else 2.
fn partition_m(m: usize) -> u32 {
    match m {
        256.. => 8,
        64.. => 4,
        _ => 2,
    }
}

/// Tiles per unit along n: 4 from 64 columns on, else 2. With [`partition_m`] at most 8 × 4
/// tiles (512 accumulators) per unit: 8 × 8 ran faster still in one probe, but lavapipe took
/// 55–200 s to compile each such kernel (8 × 4 × 2: 3.4 s).
fn partition_n(n: usize) -> u32 {
    if n >= 64 { 4 } else { 2 }
}

fn launch_wide<R: CubeRuntime>(lhs: &CubeTensor<R>, rhs: &CubeTensor<R>, out: &CubeTensor<R>) -> Result<(), MatmulSetupError> {
    let client = &out.client;
    let f32 = DType::F32.into();
    let lhs = InputBinding::new(lhs.clone().binding(), f32);
    let rhs = InputBinding::new(rhs.clone().binding(), f32);
    let out = out.clone().binding();
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems { lhs: f32, rhs: f32, out: f32 });
    let address = lhs.required_address_type().max(rhs.required_address_type()).max(out.required_address_type(dtypes.acc_global.size()));
    let problem = MatmulProblem::from_shapes_and_strides(lhs.shape().clone(), rhs.shape().clone(), out.shape.clone(), lhs.data().strides.clone(), rhs.data().strides.clone(), out.strides.clone(), dtypes.as_global_elems(), address, None, None)?;
    let hardware = &client.properties().hardware;
    let plane_dim = match hardware.plane_size_min {
        0 => 32,
        d => d,
    };
    let units = STAGE_UNITS.max(plane_dim);
    let k_tiles = if problem.k >= 8 { 2 } else { 1 };
    let scheme = TilingScheme::builder()
        .with_tile_size(TileSize::new(TILE, TILE, TILE))
        .with_partition_size(PartitionSize::new(partition_m(problem.m), partition_n(problem.n), k_tiles))
        .with_stage_size(StageSize::new(STAGE_M, units / STAGE_M, 1))
        .build()
        .expect("a complete tiling scheme");
    // The cube order and count as cubek's unit selector sets them.
    let count = match hardware.num_streaming_multiprocessors {
        Some(num_sms) => CubeCountStrategy::Sm { num_sms, sm_usage: SmAllocation::Exact, cubes_first: false },
        None => CubeCountStrategy::Flattened,
    };
    let hypercube = HypercubeBlueprint::builder().global_order(GlobalOrder::SwizzleRow(4)).cube_count_strategy(count).build();
    // One rhs tile per unit as cubek's unit selector has it (`PartitionBuffering::Single`; the
    // builder's default holds two), and every bound checked whatever the shape, so that shapes
    // that divide the stage and shapes that do not share one kernel (ACT b8 compiled 143 kernels
    // in step 1 instead of 147; its steady step did not move, nor its compile time).
    let mut blueprint = TilingBlueprint::builder(TileMatmulKind::Register, scheme, plane_dim, &problem).hypercube_blueprint(hypercube).partition_buffering(PartitionBuffering::Single).build();
    (blueprint.check_m_bounds, blueprint.check_n_bounds, blueprint.check_k_bounds) = (true, true, true);
    cubek::matmul::launch::launch_ref(&Strategy::SimpleUnit(BlueprintStrategy::Forced(blueprint)), client, lhs, rhs, out, &mut dtypes)
}
