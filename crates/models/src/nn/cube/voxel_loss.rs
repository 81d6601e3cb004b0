//! The 4D-Radar VAE's training loss ([`crate::nn::lean::voxel_loss`]): the reference's
//! sparse-voxel reconstruction loss plus the posterior's KL term, in two launches forward and
//! one backward. Composed of Burn ops it is 89 launches forward and backward, and the KL term's
//! backward 14 more (VAE ultra b2 on lavapipe, `benches/results/kernels/wgpu/launch_trims.md`).
//!
//! - [`stats`]: [`voxel_loss_partials_kernel`] sums, per cube, the six totals the loss is made
//!   of (the weighted squared error, the occupancy weights, the false positives, the two
//!   occupancy masses, the KL summand) over the voxels and the latent elements;
//!   [`voxel_loss_finish_kernel`] (one cube) adds the cubes' partial sums and writes the `[8]`
//!   statistics (`stat` in `nn::lean::voxel_loss`): the loss, its two terms, and the
//!   coefficients of the backward;
//! - [`backward`]: one unit per element of the reconstruction and of the latent: `drecon`,
//!   `dmean` and `dlogvar` from those coefficients and the loss's gradient, read on the device.
//!
//! Everything is f32 (the model computes its loss in f32). `x` and `recon` are read contiguous
//! (`[n, c, d, h, w]`); `mean` and `logvar` (`[n, l, d', h', w']`) through their batch stride,
//! so `mean`, a slice of the encoder's moments, is not copied.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{BLOCK, contiguous, cube_sum, elem_cubes, empty};
use crate::nn::lean::{VoxelLossArgs, voxel_loss_stat as stat};

/// The totals one cube of [`voxel_loss_partials_kernel`] writes, in this order: `Σ (r −
/// x)²·w·cw`, `Σ w`, `Σ relu(r₀ − x₀)²·[x₀ ≤ 0]`, `Σ relu(r₀)`, `Σ relu(x₀)`, `Σ (lv + 1 − m² −
/// exp(lv))`.
const SUMS: usize = 6;
/// [`voxel_loss_partials_kernel`]'s cubes at most (units loop over larger inputs);
/// [`voxel_loss_finish_kernel`]'s one cube reads `SUMS` values of each.
const PARTIAL_CUBES: usize = 256;

/// Unit `u` of `cubes · BLOCK`: the six sums over voxels `u, u + stride, …` (each voxel's
/// `channels` elements; `x` and `r` contiguous `[n, channels, spatial]`) and latent elements `u,
/// u + stride, …` (`mean` and `logvar` read as `[n, lat_inner]` rows `m_batch` / `l_batch`
/// apart); each cube's totals into `partial[cube · SUMS + k]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn voxel_loss_partials_kernel(
    x: &Tensor<f32>,
    r: &Tensor<f32>,
    cw: &Tensor<f32>,
    mean: &Tensor<f32>,
    logvar: &Tensor<f32>,
    partial: &mut Tensor<f32>,
    voxels: u32,
    spatial: u32,
    channels: u32,
    latent: u32,
    lat_inner: u32,
    m_batch: u32,
    l_batch: u32,
    w_occupied: f32,
    w_empty: f32,
    #[comptime] weighted: bool,
    #[comptime] fp: bool,
    #[comptime] mass: bool,
) {
    let stride = CUBE_COUNT * BLOCK;
    let (spatial, channels) = (spatial as usize, channels as usize);
    let mut s_sq = 0.0f32;
    let mut s_w = 0.0f32;
    let mut s_fp = 0.0f32;
    let mut s_rp = 0.0f32;
    let mut s_xp = 0.0f32;
    let mut s_kl = 0.0f32;
    let mut i = ABSOLUTE_POS;
    while i < voxels as usize {
        let n = i / spatial;
        let base = n * channels * spatial + (i - n * spatial);
        let xp = x[base];
        let rp = r[base];
        let w = spatial_weight(xp, w_occupied, w_empty);
        s_w += w;
        for c in 0..channels {
            let d = r[base + c * spatial] - x[base + c * spatial];
            let mut v = d * d * w;
            if comptime![weighted] {
                v *= cw[c];
            }
            s_sq += v;
        }
        if comptime![fp] {
            let u = max(rp - xp, 0.0f32);
            s_fp += select(xp <= 0.0f32, u * u, 0.0f32);
        }
        if comptime![mass] {
            s_rp += max(rp, 0.0f32);
            s_xp += max(xp, 0.0f32);
        }
        i += stride;
    }
    let mut j = ABSOLUTE_POS;
    while j < latent as usize {
        let (m, lv) = latent_at(mean, logvar, j, lat_inner, m_batch, l_batch);
        s_kl += lv + 1.0f32 - m * m - lv.exp();
        j += stride;
    }
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let t_sq = cube_sum(s_sq, &mut shared);
    let t_w = cube_sum(s_w, &mut shared);
    let t_fp = cube_sum(s_fp, &mut shared);
    let t_rp = cube_sum(s_rp, &mut shared);
    let t_xp = cube_sum(s_xp, &mut shared);
    let t_kl = cube_sum(s_kl, &mut shared);
    if UNIT_POS_X == 0 {
        let o = CUBE_POS * SUMS;
        partial[o] = t_sq;
        partial[o + 1] = t_w;
        partial[o + 2] = t_fp;
        partial[o + 3] = t_rp;
        partial[o + 4] = t_xp;
        partial[o + 5] = t_kl;
    }
}

/// One cube: the `cubes` rows of `partial` added, then the statistics ([`stat`]'s order): the
/// loss, the reconstruction and KL terms, `1 / (n_all · denom)`, the false-positive term's and
/// the mass term's coefficients, the KL's, and `denom` (the weights' mean, at least 1e-6, times
/// `cw_scale`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn voxel_loss_finish_kernel(
    partial: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    cubes: u32,
    n_all: f32,
    n_voxels: f32,
    n_latent: f32,
    cw_scale: f32,
    fp_weight: f32,
    mass_weight: f32,
    kl_weight: f32,
    #[comptime] fp: bool,
    #[comptime] mass: bool,
) {
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let t_sq = total_of(partial, 0usize, cubes, &mut shared);
    let t_w = total_of(partial, 1usize, cubes, &mut shared);
    let t_fp = total_of(partial, 2usize, cubes, &mut shared);
    let t_rp = total_of(partial, 3usize, cubes, &mut shared);
    let t_xp = total_of(partial, 4usize, cubes, &mut shared);
    let t_kl = total_of(partial, 5usize, cubes, &mut shared);
    if UNIT_POS_X == 0 {
        let denom = max(t_w / n_voxels, 1.0e-6f32) * cw_scale;
        let mut recon = t_sq / n_all / denom;
        let mut fp_coef = 0.0f32;
        let mut mass_coef = 0.0f32;
        if comptime![fp] {
            recon += t_fp / n_voxels * fp_weight;
            fp_coef = fp_weight / n_voxels;
        }
        if comptime![mass] {
            let d = t_rp / n_voxels - t_xp / n_voxels;
            recon += d.abs() * mass_weight;
            let sign = select(d > 0.0f32, 1.0f32, select(d < 0.0f32, -1.0f32, 0.0f32));
            mass_coef = mass_weight * sign / n_voxels;
        }
        let kl = t_kl / n_latent * -0.5f32;
        stats[stat::LOSS] = recon + kl * kl_weight;
        stats[stat::RECON] = recon;
        stats[stat::KL] = kl;
        stats[stat::SQ_COEF] = 1.0f32 / n_all / denom;
        stats[stat::FP_COEF] = fp_coef;
        stats[stat::MASS_COEF] = mass_coef;
        stats[stat::KL_COEF] = kl_weight * -0.5f32 / n_latent;
        stats[stat::DENOM] = denom;
    }
}

/// The reference's spatial weight of a voxel whose occupancy channel holds `x0`.
#[cube]
fn spatial_weight(x0: f32, w_occupied: f32, w_empty: f32) -> f32 {
    select(x0 > 0.0f32, w_occupied, w_empty)
}

/// `(mean, logvar)` at latent element `j`: rows of `lat_inner` elements, `m_batch` and
/// `l_batch` apart.
#[cube]
fn latent_at(mean: &Tensor<f32>, logvar: &Tensor<f32>, j: usize, lat_inner: u32, m_batch: u32, l_batch: u32) -> (f32, f32) {
    let row = j / lat_inner as usize;
    let k = j - row * lat_inner as usize;
    (mean[row * m_batch as usize + k], logvar[row * l_batch as usize + k])
}

/// Total `k` of [`voxel_loss_partials_kernel`]'s `cubes` rows, in every unit of the cube.
#[cube]
fn total_of(partial: &Tensor<f32>, #[comptime] k: usize, cubes: u32, shared: &mut SharedMemory<f32>) -> f32 {
    let mut s = 0.0f32;
    let mut c = UNIT_POS_X as usize;
    while c < cubes as usize {
        s += partial[c * SUMS + k];
        c += BLOCK;
    }
    cube_sum(s, shared)
}

/// Unit `i`: `drecon[i]` (for `i < elems`, `[n, channels, spatial]` contiguous) and `dmean`,
/// `dlogvar` at latent element `i` (for `i < latent`; written contiguous, read as in
/// [`voxel_loss_partials_kernel`]), each times the loss's gradient `g[0]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn voxel_loss_backward_kernel(
    x: &Tensor<f32>,
    r: &Tensor<f32>,
    cw: &Tensor<f32>,
    mean: &Tensor<f32>,
    logvar: &Tensor<f32>,
    stats: &Tensor<f32>,
    g: &Tensor<f32>,
    dr: &mut Tensor<f32>,
    dm: &mut Tensor<f32>,
    dl: &mut Tensor<f32>,
    elems: u32,
    spatial: u32,
    channels: u32,
    latent: u32,
    lat_inner: u32,
    m_batch: u32,
    l_batch: u32,
    w_occupied: f32,
    w_empty: f32,
    #[comptime] weighted: bool,
    #[comptime] fp: bool,
    #[comptime] mass: bool,
) {
    let i = ABSOLUTE_POS;
    let gs = g[0];
    if i < elems as usize {
        let (spatial, channels) = (spatial as usize, channels as usize);
        let plane = channels * spatial;
        let n = i / plane;
        let c = (i - n * plane) / spatial;
        let x0 = x[i - c * spatial];
        let w = spatial_weight(x0, w_occupied, w_empty);
        let ri = r[i];
        let mut v = (ri - x[i]) * 2.0f32 * w;
        if comptime![weighted] {
            v *= cw[c];
        }
        v *= stats[stat::SQ_COEF];
        if c == 0 {
            if comptime![fp] {
                let u = max(ri - x0, 0.0f32);
                v += select(x0 <= 0.0f32, u * 2.0f32 * stats[stat::FP_COEF], 0.0f32);
            }
            if comptime![mass] {
                v += select(ri > 0.0f32, stats[stat::MASS_COEF], 0.0f32);
            }
        }
        dr[i] = v * gs;
    }
    if i < latent as usize {
        let (m, lv) = latent_at(mean, logvar, i, lat_inner, m_batch, l_batch);
        let kc = stats[stat::KL_COEF] * gs;
        dm[i] = m * -2.0f32 * kc;
        dl[i] = (1.0f32 - lv.exp()) * kc;
    }
}

/// Whether [`stats`] and [`backward`] take these operands: `x` and `recon` f32 `[n, c, d, h, w]`
/// alike, `mean` and `logvar` f32 `[n, l, …]` alike (rank 5), channel weights (if any) f32
/// `[c]`, every count within `u32`.
pub fn handles(x: (&[usize], DType), recon: (&[usize], DType), mean: (&[usize], DType), logvar: (&[usize], DType), cw: Option<(&[usize], DType)>) -> bool {
    let f32_rank5 = |(d, t): (&[usize], DType)| d.len() == 5 && t == DType::F32 && d.iter().product::<usize>() <= u32::MAX as usize;
    let c = x.0.get(1).copied().unwrap_or(0);
    [x, recon, mean, logvar].into_iter().all(f32_rank5)
        && x.0 == recon.0
        && mean.0 == logvar.0
        && x.0[0] == mean.0[0]
        && c > 0
        && x.0.iter().product::<usize>() > 0
        && cw.is_none_or(|(d, t)| d == [c] && t == DType::F32)
}

/// `t` (`[n, …]`, rank 5) read as rows of its last four axes: `(t, row stride)`, copied
/// contiguous first unless those axes are contiguous within each row.
fn rows<R: CubeRuntime>(t: CubeTensor<R>) -> (CubeTensor<R>, usize) {
    let dims = t.meta.shape().to_vec();
    let strides = t.meta.strides().to_vec();
    let mut expect = 1;
    let mut inner_dense = true;
    for d in (1..dims.len()).rev() {
        if dims[d] > 1 && strides[d] != expect {
            inner_dense = false;
        }
        expect *= dims[d];
    }
    if inner_dense {
        let batch = if dims[0] > 1 { strides[0] } else { expect };
        (t, batch)
    } else {
        (contiguous(t), expect)
    }
}

/// What both launches read: the contiguous `x` and `recon`, `mean` and `logvar` as rows and
/// their strides, and the counts.
struct Operands<R: CubeRuntime> {
    x: CubeTensor<R>,
    r: CubeTensor<R>,
    mean: CubeTensor<R>,
    logvar: CubeTensor<R>,
    m_batch: u32,
    l_batch: u32,
    /// Voxels (`n · spatial`), spatial positions, channels; latent elements and per row.
    voxels: usize,
    spatial: usize,
    channels: usize,
    latent: usize,
    lat_inner: usize,
}

fn operands<R: CubeRuntime>(x: CubeTensor<R>, recon: CubeTensor<R>, mean: CubeTensor<R>, logvar: CubeTensor<R>) -> Operands<R> {
    let dims = x.meta.shape().to_vec();
    let ldims = mean.meta.shape().to_vec();
    let (mean, m_batch) = rows(mean);
    let (logvar, l_batch) = rows(logvar);
    let spatial = dims[2..].iter().product::<usize>();
    let lat_inner = ldims[1..].iter().product::<usize>();
    Operands {
        x: contiguous(x),
        r: contiguous(recon),
        mean,
        logvar,
        m_batch: m_batch as u32,
        l_batch: l_batch as u32,
        voxels: dims[0] * spatial,
        spatial,
        channels: dims[1],
        latent: ldims[0] * lat_inner,
        lat_inner,
    }
}

/// The loss's `[8]` f32 statistics (see [`voxel_loss_finish_kernel`]) of the reconstruction
/// `recon` of `x` and the posterior `(mean, logvar)`, with the channel weights `cw` (`[c]`) if
/// given.
pub fn stats<R: CubeRuntime>(x: CubeTensor<R>, recon: CubeTensor<R>, mean: CubeTensor<R>, logvar: CubeTensor<R>, cw: Option<CubeTensor<R>>, s: VoxelLossArgs) -> CubeTensor<R> {
    let o = operands(x, recon, mean, logvar);
    let client = o.x.client.clone();
    let n_all = (o.voxels * o.channels) as f32;
    let (n_voxels, n_latent) = (o.voxels as f32, o.latent as f32);
    let cubes = o.voxels.max(o.latent).div_ceil(BLOCK).clamp(1, PARTIAL_CUBES);
    let partial = empty(&o.x, vec![cubes * SUMS], DType::F32);
    let stats = empty(&o.x, vec![stat::LEN], DType::F32);
    let weighted = cw.is_some();
    let cw = cw.map(contiguous).unwrap_or_else(|| o.x.clone());
    let (fp, mass) = (s.fp_weight > 0.0, s.mass_weight > 0.0);
    voxel_loss_partials_kernel::launch::<R>(
        &client,
        CubeCount::Static(cubes as u32, 1, 1),
        CubeDim::new_1d(BLOCK as u32),
        o.x.into_tensor_arg(),
        o.r.into_tensor_arg(),
        cw.into_tensor_arg(),
        o.mean.into_tensor_arg(),
        o.logvar.into_tensor_arg(),
        partial.clone().into_tensor_arg(),
        o.voxels as u32,
        o.spatial as u32,
        o.channels as u32,
        o.latent as u32,
        o.lat_inner as u32,
        o.m_batch,
        o.l_batch,
        s.w_occupied,
        s.w_empty,
        weighted,
        fp,
        mass,
    );
    voxel_loss_finish_kernel::launch::<R>(
        &client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(BLOCK as u32),
        partial.into_tensor_arg(),
        stats.clone().into_tensor_arg(),
        cubes as u32,
        n_all,
        n_voxels,
        n_latent,
        s.cw_scale,
        s.fp_weight,
        s.mass_weight,
        s.kl_weight,
        fp,
        mass,
    );
    stats
}

/// The loss's gradients `(drecon, dmean, dlogvar)` (f32, contiguous, in `recon`'s and `mean`'s
/// dims) for the loss gradient `dloss` (`[1]`) from [`stats`]' statistics.
#[allow(clippy::too_many_arguments)]
pub fn backward<R: CubeRuntime>(x: CubeTensor<R>, recon: CubeTensor<R>, mean: CubeTensor<R>, logvar: CubeTensor<R>, cw: Option<CubeTensor<R>>, stats: CubeTensor<R>, dloss: CubeTensor<R>, s: VoxelLossArgs) -> [CubeTensor<R>; 3] {
    let (rdims, ldims) = (recon.meta.shape().to_vec(), mean.meta.shape().to_vec());
    let o = operands(x, recon, mean, logvar);
    let client = o.x.client.clone();
    let elems = o.voxels * o.channels;
    let dr = empty(&o.x, rdims, DType::F32);
    let dm = empty(&o.x, ldims.clone(), DType::F32);
    let dl = empty(&o.x, ldims, DType::F32);
    let weighted = cw.is_some();
    let cw = cw.map(contiguous).unwrap_or_else(|| o.x.clone());
    let (count, dim) = elem_cubes(&client, elems.max(o.latent));
    voxel_loss_backward_kernel::launch::<R>(
        &client,
        count,
        dim,
        o.x.into_tensor_arg(),
        o.r.into_tensor_arg(),
        cw.into_tensor_arg(),
        o.mean.into_tensor_arg(),
        o.logvar.into_tensor_arg(),
        contiguous(stats).into_tensor_arg(),
        contiguous(dloss).into_tensor_arg(),
        dr.clone().into_tensor_arg(),
        dm.clone().into_tensor_arg(),
        dl.clone().into_tensor_arg(),
        elems as u32,
        o.spatial as u32,
        o.channels as u32,
        o.latent as u32,
        o.lat_inner as u32,
        o.m_batch,
        o.l_batch,
        s.w_occupied,
        s.w_empty,
        weighted,
        s.fp_weight > 0.0,
        s.mass_weight > 0.0,
    );
    [dr, dm, dl]
}
