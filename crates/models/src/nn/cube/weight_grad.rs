//! Convolution weight gradients as one reduction per cube, for devices without matrix units,
//! where Burn's only weight gradient is its fallback: a direct convolution with batch and
//! channels swapped ([`super::conv`]'s `swapped_weight_backward`). That convolution vectorises
//! over the batch (2 on the VAE) and reads one weight vector per output channel, about five
//! loads for every eight multiply-adds; on lavapipe, where a lane's load costs about the same
//! whatever its width, that is what its time goes to.
//!
//! Here one cube of [`UNITS`] units owns one tile of the gradient, `dw[co..co + 4, κ, ci..ci + 4]`
//! (one kernel position `κ`, four output and four input channels): each unit sums
//! `dy[p, co..co + 4] ⊗ x[p + κ, ci..ci + 4]` over its share of the output positions `p` (one
//! 4-wide load of each per 16 multiply-adds), the cube adds its units' sums in shared memory and
//! writes the tile. The output positions are walked row by row (batch, depth, height), each row's
//! bounds checked once; the width's range inside the input is the same for every row of a tile.
//! Sums are f32 whatever the dtype. With a bias, `cout/4` more cubes of the same launch sum
//! `dy[p, co..co + 4]` over every output position: the bias's gradient, which otherwise takes a
//! launch of its own ([`super::channel_sum`]). Taken ([`handles`]) for 3-D convolutions whose channel counts
//! are multiples of four; one compiled kernel per dtype serves every shape. On a device with
//! matrix units it is one of [`super::conv`]'s search candidates instead, with each tile's sum
//! split among more units ([`GPU_LAUNCH_UNITS`]).

use burn::tensor::ops::ConvOptions;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::columns::{Geometry, Window, fits_u32, rank5, tileable_3d};
use super::{contiguous, cube_row, empty};

/// How many weight gradients this path has run (tests: that a case took it).
#[cfg(test)]
pub(crate) static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Units per cube: one tile's output positions are shared among them.
pub const UNITS: usize = 64;

/// Channels per tile along each of the input and output channels (the vectors' width).
const LANES: usize = 4;

type V4 = Vector<f32, Const<4>>;

/// One cube per tile `t` of `tiles` (`t = (κ · cin/4 + ci/4) · cout/4 + co/4`): the gradient
/// `dw[co + j, κ, ci + i] = Σ_p x[n, o·s + κ·dil − pad, ci + i] · dy[n, o, co + j]` over the output
/// positions `p = (n, o)` whose input position lies inside `x` (zero padding). `x` is
/// `[n, d, h, w, cin]`, `dy` `[n, o_d, o_h, o_w, cout]`, `dw` `[cout, k_d, k_h, k_w, cin]`, all
/// contiguous, both channel counts multiples of 4. Tiles `tiles..tiles + bias_tiles` (`bias_tiles`:
/// 0, or `cout/4` with a bias) write `db[co..co + 4] = Σ_p dy[n, o, co..co + 4]` over every output
/// position instead (`co = 4·(t − tiles)`); `db` is not written otherwise.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn weight_grad_kernel<F: Float>(
    x: &Tensor<Vector<F, Const<4>>>,
    dy: &Tensor<Vector<F, Const<4>>>,
    dw: &mut Tensor<F>,
    db: &mut Tensor<F>,
    tiles: u32,
    bias_tiles: u32,
    tile_units: u32,
    win: Window,
    #[define(F)] _dtype: StorageType,
) {
    let u = UNIT_POS_X as usize;
    let tu = tile_units as usize;
    let t_all = cube_row() * (UNITS / tu) + u / tu;
    let lu = u % tu;
    let base = u - lu;
    let active = t_all < (tiles + bias_tiles) as usize;
    // A bias tile sums `dy` alone, over every output position: as the weight tile of a 1×1×1
    // kernel without padding would, without reading `x`.
    let bias_tile = t_all >= tiles as usize;
    let mut t = t_all;
    if bias_tile {
        t = t_all - tiles as usize;
    }
    let (cin, cout) = (x.shape(4), dy.shape(4));
    let (in_d, in_h, in_w) = (x.shape(1), x.shape(2), x.shape(3));
    let (out_d, out_h, out_w) = (dy.shape(1), dy.shape(2), dy.shape(3));
    let (k_d, k_h, k_w) = (win.k_d as usize, win.k_h as usize, win.k_w as usize);
    let (s_d, s_h, s_w) = (win.s_d as usize, win.s_h as usize, win.s_w as usize);
    let (p_d, p_h, p_w) = (win.p_d as usize, win.p_h as usize, win.p_w as usize);
    let (d_d, d_h, d_w) = (win.d_d as usize, win.d_h as usize, win.d_w as usize);
    let co_tiles = cout / 4usize;
    let ci_tiles = cin / 4usize;
    // A bias tile's `t < cout/4`: its `ci` and `κ` are 0, unused.
    let co = (t % co_tiles) * 4usize;
    let ci = ((t / co_tiles) % ci_tiles) * 4usize;
    let kk = t / (co_tiles * ci_tiles);
    let kw = kk % k_w;
    let kh = (kk / k_w) % k_h;
    let kd = kk / (k_w * k_h);
    let (off_d, off_h, off_w) = (kd * d_d, kh * d_h, kw * d_w);
    // Output columns `ow` whose padded input column `ow·s + off_w` lies in `[p_w, p_w + in_w)`.
    let mut lo = 0usize;
    if off_w < p_w {
        lo = (p_w - off_w).div_ceil(s_w);
    }
    let mut hi = 0usize;
    if off_w < p_w + in_w {
        hi = (p_w + in_w - off_w).div_ceil(s_w);
    }
    if hi > out_w {
        hi = out_w;
    }
    let (xs0, xs1, xs2, xs3) = (x.stride(0), x.stride(1), x.stride(2), x.stride(3));
    let mut a0 = V4::new(0.0);
    let mut a1 = V4::new(0.0);
    let mut a2 = V4::new(0.0);
    let mut a3 = V4::new(0.0);
    let mut rows = dy.shape(0) * out_d * out_h;
    if !active {
        rows = 0;
    }
    let mut r = lu;
    if bias_tile {
        while r < rows {
            let dy_row = r * out_w * cout + co;
            for ow in 0..out_w {
                a0 += V4::cast_from(dy[(dy_row + ow * cout) / 4usize]);
            }
            r += tu;
        }
    } else {
        while r < rows {
            let oh = r % out_h;
            let od = (r / out_h) % out_d;
            let n = r / (out_h * out_d);
            let zd = od * s_d + off_d;
            let zh = oh * s_h + off_h;
            if zd >= p_d && zh >= p_h {
                let (id, ih) = (zd - p_d, zh - p_h);
                if id < in_d && ih < in_h {
                    let x_row = n * xs0 + id * xs1 + ih * xs2 + ci;
                    let dy_row = r * out_w * cout + co;
                    for ow in lo..hi {
                        let xv = x[(x_row + (ow * s_w + off_w - p_w) * xs3) / 4usize];
                        let g = V4::cast_from(dy[(dy_row + ow * cout) / 4usize]);
                        a0 += V4::new(f32::cast_from(xv[0])) * g;
                        a1 += V4::new(f32::cast_from(xv[1])) * g;
                        a2 += V4::new(f32::cast_from(xv[2])) * g;
                        a3 += V4::new(f32::cast_from(xv[3])) * g;
                    }
                }
            }
            r += tu;
        }
    }
    let mut shared = SharedMemory::<V4>::new(LANES * UNITS);
    shared[u] = a0;
    shared[UNITS + u] = a1;
    shared[2 * UNITS + u] = a2;
    shared[3 * UNITS + u] = a3;
    sync_cube();
    let mut stride = tu / 2;
    while stride > 0 {
        if lu < stride {
            #[unroll]
            for i in 0..LANES {
                let a = i * UNITS + u;
                shared[a] = shared[a] + shared[a + stride];
            }
        }
        sync_cube();
        stride /= 2;
    }
    if active && lu == 0 {
        if bias_tile {
            let v = shared[base];
            #[unroll]
            for j in 0..LANES {
                db[co + j] = F::cast_from(v[j]);
            }
        } else {
            let kv = k_d * k_h * k_w;
            #[unroll]
            for i in 0..LANES {
                let v = shared[i * UNITS + base];
                #[unroll]
                for j in 0..LANES {
                    dw[((co + j) * kv + kk) * cin + ci + i] = F::cast_from(v[j]);
                }
            }
        }
    }
}

/// How many units a launch aims at on a device without matrix units ([`tile_units`]). On
/// lavapipe, over the VAE's weight gradients, splitting a tile's sum further than that made no
/// shape faster and the 64-channel ones up to 9× slower (the tree's steps and the idle units of
/// short sums).
pub const CPU_LAUNCH_UNITS: usize = 1 << 10;

/// How many units a launch aims at as a candidate of the search on a device with matrix units
/// ([`super::conv`]): a GPU runs tens of thousands of units at once (an H100: 132 multiprocessors
/// of up to 2,048 each), so every tile of the VAE's gradients up to 32 channels gets the full
/// [`UNITS`]. Not measured yet: the search times it against CubeCL's GEMMs on each shape.
pub const GPU_LAUNCH_UNITS: usize = 1 << 16;

/// Units per tile (a power of two up to [`UNITS`]): the fewest that give the launch `launch_units`
/// units (`tiles` tiles).
fn tile_units(tiles: usize, launch_units: usize) -> usize {
    launch_units.div_ceil(tiles.max(1)).next_power_of_two().min(UNITS)
}

#[cfg(test)]
thread_local! {
    /// Tests: the launch size every weight gradient of this path takes, whatever the caller asked
    /// (a GPU's split run on lavapipe).
    pub(crate) static LAUNCH_UNITS_FOR_TESTS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Whether this path takes a weight gradient: a 3-D, ungrouped convolution whose input and
/// output channel counts are multiples of 4, in a float dtype, every index within `u32`.
pub fn handles<R: CubeRuntime, const N: usize>(x: &CubeTensor<R>, w_shape: &[usize], o: &ConvOptions<N>) -> bool {
    tileable_3d(x, w_shape, o) && fits_u32(w_shape.iter().product())
}

/// The weight gradient of a convolution of channels-last `x` (`[n, s…, cin]`) given the
/// channels-last output gradient `dy` (`[n, o…, cout]`): a contiguous `[cout, k…, cin]` tensor
/// (`shape`), where [`handles`] said yes. Each tile's sum is split among enough units for the
/// launch to hold about `launch_units` ([`CPU_LAUNCH_UNITS`], [`GPU_LAUNCH_UNITS`]).
pub fn weight_backward<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, dy: CubeTensor<R>, shape: &[usize], o: &ConvOptions<N>, launch_units: usize) -> CubeTensor<R> {
    weight_bias_backward(x, dy, shape, o, launch_units, false).0
}

/// [`weight_backward`], and with `bias` also the bias's gradient (`[cout]`, `dy` summed over
/// every output position) from the same launch.
pub fn weight_bias_backward<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, dy: CubeTensor<R>, shape: &[usize], o: &ConvOptions<N>, launch_units: usize, bias: bool) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    #[cfg(test)]
    RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    #[cfg(test)]
    let launch_units = LAUNCH_UNITS_FOR_TESTS.get().unwrap_or(launch_units);
    let g = Geometry::new::<N>(x.meta.shape(), &shape[1..=N], o);
    let (cout, cin) = (shape[0], shape[N + 1]);
    let x = rank5(contiguous(x));
    let dy = rank5(contiguous(dy));
    let dw = empty(&x, shape.to_vec(), x.dtype);
    // Without a bias, an unwritten placeholder (wgpu binds no buffer twice as writable).
    let db = empty(&x, vec![if bias { cout } else { LANES }], x.dtype);
    let tiles = g.kernel_positions() * (cin / LANES) * (cout / LANES);
    let bias_tiles = if bias { cout / LANES } else { 0 };
    let tile_units = tile_units(tiles + bias_tiles, launch_units);
    let cubes = (tiles + bias_tiles).div_ceil(UNITS / tile_units);
    let x_count = cubes.clamp(1, 65535);
    let count = CubeCount::Static(x_count as u32, cubes.div_ceil(x_count) as u32, 1);
    let u = |v: usize| v as u32;
    let client = x.client.clone();
    let dtype: StorageType = x.dtype.into();
    weight_grad_kernel::launch::<R>(
        &client,
        count,
        CubeDim::new_1d(UNITS as u32),
        x.into_tensor_arg(),
        dy.into_tensor_arg(),
        dw.clone().into_tensor_arg(),
        db.clone().into_tensor_arg(),
        u(tiles),
        u(bias_tiles),
        u(tile_units),
        g.window(),
        dtype,
    );
    (dw, bias.then_some(db))
}
