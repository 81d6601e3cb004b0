//! The 4D-Radar VAE's training loss ([`crate::nn::lean::voxel_loss`]): the reference's
//! sparse-voxel reconstruction loss plus the posterior's KL term, in two launches forward and
//! one backward. Composed of Burn ops it is 89 launches forward and backward, and the KL term's
//! backward 14 more (VAE ultra b2 on lavapipe, `benches/results/kernels/wgpu/launch_trims.md`).
//! And its posterior sample ([`crate::nn::lean::posterior_sample`]) in one launch each way,
//! where the moments' split, clamp and sampling composed are 35 launches with their backwards.
//!
//! - [`stats`]: [`voxel_loss_partials_kernel`] sums, per cube, the six totals the loss is made
//!   of (the weighted squared error, the occupancy weights, the false positives, the two
//!   occupancy masses, the KL summand) over the voxels and the latent elements;
//!   [`voxel_loss_finish_kernel`] (one cube) adds the cubes' partial sums and writes the `[8]`
//!   statistics (`stat` in `nn::lean::voxel_loss`): the loss, its two terms, and the
//!   coefficients of the backward; and the loss and its two terms each as its own `[1]`;
//! - [`backward`]: one unit per element of the reconstruction and of the latent: `drecon`, and
//!   `dmoments`' mean and logvar halves, from those coefficients and the loss's gradient, read
//!   on the device;
//! - [`sample`], [`sample_backward`]: one unit per latent element: `z = mean + exp(½·lv)·eps`;
//!   `dmoments = [dz, dz·eps·½·exp(½·lv)]`. ACT's posterior (`[b, 2·l]` seen as `[b, 2·l, 1, 1,
//!   1]`) takes them too, its logvar unclamped.
//!
//! Everything is f32 (the model computes its loss in f32). `x` and `recon` are read contiguous
//! (`[n, c, d, h, w]`); the moments (`[n, 2·l, d', h', w']`: the mean, then the logvar, clamped
//! here to `LOGVAR_MIN..=LOGVAR_MAX` and its gradient masked where the clamp holds it), `eps`,
//! `z` and their gradients in either [`ChannelLayout`] (channels last is what the encoder's
//! last convolution returns), so none is copied. The moments' gradients and the sample are
//! written in the moments' layout, both halves of the moments by the same launch.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{BLOCK, ChannelLayout, channel_layout, contiguous, cube_sum, elem_cubes, empty, empty_in, partial_total};
use crate::nn::lean::{LOGVAR_MAX, LOGVAR_MIN, VoxelLossArgs, voxel_loss_stat as stat};

/// The totals one cube of [`voxel_loss_partials_kernel`] writes, in this order: `Σ (r −
/// x)²·w·cw`, `Σ w`, `Σ relu(r₀ − x₀)²·[x₀ ≤ 0]`, `Σ relu(r₀)`, `Σ relu(x₀)`, `Σ (lv + 1 − m² −
/// exp(lv))`.
const SUMS: usize = 6;
/// [`voxel_loss_partials_kernel`]'s cubes at most (units loop over larger inputs);
/// [`voxel_loss_finish_kernel`]'s one cube reads `SUMS` values of each.
const PARTIAL_CUBES: usize = 256;

/// Unit `u` of `cubes · BLOCK`: the six sums over voxels `u, u + stride, …` (each voxel's
/// `channels` elements; `x` and `r` contiguous `[n, channels, spatial]`) and latent elements `u,
/// u + stride, …` (read from `moments` in its layout, see [`moments_at`]); each cube's totals
/// into `partial[cube · SUMS + k]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn voxel_loss_partials_kernel(
    x: &Tensor<f32>,
    r: &Tensor<f32>,
    cw: &Tensor<f32>,
    moments: &Tensor<f32>,
    partial: &mut Tensor<f32>,
    voxels: u32,
    spatial: u32,
    channels: u32,
    latent: u32,
    lat_ch: u32,
    lat_spatial: u32,
    m_ch: u32,
    m_sp: u32,
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
        let (at_m, at_l) = moments_at(j, lat_ch, lat_spatial, m_ch, m_sp);
        let lv = clamp_logvar(moments[at_l]);
        let m = moments[at_m];
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
/// `cw_scale`); and the loss and its two terms again, each its own `[1]` tensor (a slice of the
/// statistics would be a copy on CubeCL: Burn's slice is a view only at aligned offsets).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn voxel_loss_finish_kernel(
    partial: &Tensor<f32>,
    stats: &mut Tensor<f32>,
    loss: &mut Tensor<f32>,
    recon_loss: &mut Tensor<f32>,
    kl_loss: &mut Tensor<f32>,
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
    let t_sq = partial_total(partial, 0usize, SUMS, cubes, &mut shared);
    let t_w = partial_total(partial, 1usize, SUMS, cubes, &mut shared);
    let t_fp = partial_total(partial, 2usize, SUMS, cubes, &mut shared);
    let t_rp = partial_total(partial, 3usize, SUMS, cubes, &mut shared);
    let t_xp = partial_total(partial, 4usize, SUMS, cubes, &mut shared);
    let t_kl = partial_total(partial, 5usize, SUMS, cubes, &mut shared);
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
        let total = recon + kl * kl_weight;
        stats[stat::LOSS] = total;
        stats[stat::RECON] = recon;
        stats[stat::KL] = kl;
        loss[0] = total;
        recon_loss[0] = recon;
        kl_loss[0] = kl;
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

/// Latent element `j` (channels first, `[n, lat_ch, lat_spatial]`) as `(n, c, s)`.
#[cube]
fn latent_coords(j: usize, lat_ch: u32, lat_spatial: u32) -> (usize, usize, usize) {
    let s_n = lat_spatial as usize;
    let plane = lat_ch as usize * s_n;
    let n = j / plane;
    let c = (j - n * plane) / s_n;
    (n, c, j - n * plane - c * s_n)
}

/// Where latent element `j` (`[n, lat_ch, lat_spatial]`) lies in a dense tensor of its dims
/// laid out with channel stride `ch` and spatial stride `sp` ([`ChannelLayout`]).
#[cube]
fn latent_at(j: usize, lat_ch: u32, lat_spatial: u32, ch: u32, sp: u32) -> usize {
    let (n, c, s) = latent_coords(j, lat_ch, lat_spatial);
    n * lat_ch as usize * lat_spatial as usize + c * ch as usize + s * sp as usize
}

/// Where latent element `j`'s mean and logvar lie in the moments (`[n, 2·lat_ch, lat_spatial]`,
/// dense, channel stride `ch`, spatial stride `sp`).
#[cube]
fn moments_at(j: usize, lat_ch: u32, lat_spatial: u32, ch: u32, sp: u32) -> (usize, usize) {
    let (n, c, s) = latent_coords(j, lat_ch, lat_spatial);
    let at = n * 2 * lat_ch as usize * lat_spatial as usize + c * ch as usize + s * sp as usize;
    (at, at + lat_ch as usize * ch as usize)
}

/// The logvar as `VAE3D.encode` clamps it.
#[cube]
fn clamp_logvar(raw: f32) -> f32 {
    max(min(raw, LOGVAR_MAX), LOGVAR_MIN)
}

/// Whether the clamp passes the logvar's gradient (PyTorch's and Burn's clamp pass it at the
/// bounds).
#[cube]
fn clamp_passes(raw: f32) -> bool {
    raw >= LOGVAR_MIN && raw <= LOGVAR_MAX
}

/// Unit `i`: `drecon[i]` (for `i < elems`, `[n, channels, spatial]` contiguous) and the
/// moments' gradient at latent element `i`'s mean and logvar (for `i < latent`; read and
/// written in the moments' layout, as in [`voxel_loss_partials_kernel`]), each times the loss's
/// gradient `g[0]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn voxel_loss_backward_kernel(
    x: &Tensor<f32>,
    r: &Tensor<f32>,
    cw: &Tensor<f32>,
    moments: &Tensor<f32>,
    stats: &Tensor<f32>,
    g: &Tensor<f32>,
    dr: &mut Tensor<f32>,
    dmoments: &mut Tensor<f32>,
    elems: u32,
    spatial: u32,
    channels: u32,
    latent: u32,
    lat_ch: u32,
    lat_spatial: u32,
    m_ch: u32,
    m_sp: u32,
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
        let (at_m, at_l) = moments_at(i, lat_ch, lat_spatial, m_ch, m_sp);
        let raw = moments[at_l];
        let kc = stats[stat::KL_COEF] * gs;
        dmoments[at_m] = moments[at_m] * -2.0f32 * kc;
        dmoments[at_l] = select(clamp_passes(raw), (1.0f32 - clamp_logvar(raw).exp()) * kc, 0.0f32);
    }
}

/// f32, rank 5, every count within `u32`.
fn f32_rank5((d, t): (&[usize], DType)) -> bool {
    d.len() == 5 && t == DType::F32 && d.iter().product::<usize>() <= u32::MAX as usize
}

/// Whether `moments` is `[n, 2·l, …]` with `l > 0`.
fn moments_shape(moments: &[usize]) -> bool {
    moments.get(1).is_some_and(|c| *c > 0 && c % 2 == 0)
}

/// Whether [`stats`] and [`backward`] take these operands: `x` and `recon` f32 `[n, c, d, h, w]`
/// alike, the moments f32 `[n, 2·l, …]` (rank 5), channel weights (if any) f32 `[c]`, every
/// count within `u32`.
pub fn handles(x: (&[usize], DType), recon: (&[usize], DType), moments: (&[usize], DType), cw: Option<(&[usize], DType)>) -> bool {
    let c = x.0.get(1).copied().unwrap_or(0);
    [x, recon, moments].into_iter().all(f32_rank5)
        && x.0 == recon.0
        && moments_shape(moments.0)
        && x.0[0] == moments.0[0]
        && c > 0
        && x.0.iter().product::<usize>() > 0
        && cw.is_none_or(|(d, t)| d == [c] && t == DType::F32)
}

/// Whether [`sample`] and [`sample_backward`] take these operands: the moments f32
/// `[n, 2·l, …]` (rank 5) and `eps` f32 `[n, l, …]` alike.
pub fn sample_handles(moments: (&[usize], DType), eps: (&[usize], DType)) -> bool {
    let half = |m: &[usize]| -> Vec<usize> { m.iter().enumerate().map(|(k, d)| if k == 1 { d / 2 } else { *d }).collect() };
    f32_rank5(moments) && f32_rank5(eps) && moments_shape(moments.0) && eps.0 == half(moments.0).as_slice()
}

/// What both launches read: the contiguous `x` and `recon`, the moments ([`Latent`]), and the
/// counts.
struct Operands<R: CubeRuntime> {
    x: CubeTensor<R>,
    r: CubeTensor<R>,
    moments: Latent<R>,
    /// Voxels (`n · spatial`), spatial positions, channels.
    voxels: usize,
    spatial: usize,
    channels: usize,
}

/// The moments in a dense layout (as they are when in a [`ChannelLayout`], else copied), and
/// the latent's counts.
struct Latent<R: CubeRuntime> {
    moments: CubeTensor<R>,
    layout: ChannelLayout,
    /// Latent elements (`n · l · S`), channels (`l`, half the moments'), spatial positions.
    latent: usize,
    channels: usize,
    spatial: usize,
}

fn latent<R: CubeRuntime>(moments: CubeTensor<R>) -> Latent<R> {
    let dims = moments.meta.shape().to_vec();
    let (moments, layout) = channel_layout(moments);
    let (channels, spatial) = (dims[1] / 2, dims[2..].iter().product::<usize>());
    Latent { moments, layout, latent: dims[0] * channels * spatial, channels, spatial }
}

impl<R: CubeRuntime> Latent<R> {
    /// The layout of an `l`-channel tensor like the moments' (the sample, the noise).
    fn half_layout(&self) -> ChannelLayout {
        if self.layout.is_last() { ChannelLayout { channel: 1, spatial: self.channels } } else { ChannelLayout { channel: self.spatial, spatial: 1 } }
    }
}

/// `t` (`[n, l, …]`) in one of the two [`ChannelLayout`]s and its strides as kernel scalars.
fn strided<R: CubeRuntime>(t: CubeTensor<R>) -> (CubeTensor<R>, u32, u32) {
    let (t, layout) = channel_layout(t);
    (t, layout.channel as u32, layout.spatial as u32)
}

fn operands<R: CubeRuntime>(x: CubeTensor<R>, recon: CubeTensor<R>, moments: CubeTensor<R>) -> Operands<R> {
    let dims = x.meta.shape().to_vec();
    let spatial = dims[2..].iter().product::<usize>();
    Operands { x: contiguous(x), r: contiguous(recon), moments: latent(moments), voxels: dims[0] * spatial, spatial, channels: dims[1] }
}

/// `[loss, recon_loss, kl_loss, statistics]` (`[1]`, `[1]`, `[1]`, `[8]`, f32; see
/// [`voxel_loss_finish_kernel`]) of the reconstruction `recon` of `x` and the posterior in
/// `moments`, with the channel weights `cw` (`[c]`) if given.
pub fn stats<R: CubeRuntime>(x: CubeTensor<R>, recon: CubeTensor<R>, moments: CubeTensor<R>, cw: Option<CubeTensor<R>>, s: VoxelLossArgs) -> [CubeTensor<R>; 4] {
    let o = operands(x, recon, moments);
    let l = o.moments;
    let client = o.x.client.clone();
    let n_all = (o.voxels * o.channels) as f32;
    let (n_voxels, n_latent) = (o.voxels as f32, l.latent as f32);
    let cubes = o.voxels.max(l.latent).div_ceil(BLOCK).clamp(1, PARTIAL_CUBES);
    let partial = empty(&o.x, vec![cubes * SUMS], DType::F32);
    let stats = empty(&o.x, vec![stat::LEN], DType::F32);
    let terms = [(); 3].map(|_| empty(&o.x, vec![1], DType::F32));
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
        l.moments.into_tensor_arg(),
        partial.clone().into_tensor_arg(),
        o.voxels as u32,
        o.spatial as u32,
        o.channels as u32,
        l.latent as u32,
        l.channels as u32,
        l.spatial as u32,
        l.layout.channel as u32,
        l.layout.spatial as u32,
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
        terms[0].clone().into_tensor_arg(),
        terms[1].clone().into_tensor_arg(),
        terms[2].clone().into_tensor_arg(),
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
    let [loss, recon_loss, kl_loss] = terms;
    [loss, recon_loss, kl_loss, stats]
}

/// The loss's gradients `[drecon, dmoments]` (f32, in `recon`'s and `moments`' dims; `drecon`
/// contiguous, `dmoments` in the moments' layout) for the loss gradient `dloss` (`[1]`) from
/// [`stats`]' statistics.
pub fn backward<R: CubeRuntime>(x: CubeTensor<R>, recon: CubeTensor<R>, moments: CubeTensor<R>, cw: Option<CubeTensor<R>>, stats: CubeTensor<R>, dloss: CubeTensor<R>, s: VoxelLossArgs) -> [CubeTensor<R>; 2] {
    let (rdims, mdims) = (recon.meta.shape().to_vec(), moments.meta.shape().to_vec());
    let o = operands(x, recon, moments);
    let l = o.moments;
    let client = o.x.client.clone();
    let elems = o.voxels * o.channels;
    let dr = empty(&o.x, rdims, DType::F32);
    let dmoments = empty_in(&o.x, mdims, DType::F32, l.layout);
    let weighted = cw.is_some();
    let cw = cw.map(contiguous).unwrap_or_else(|| o.x.clone());
    let (count, dim) = elem_cubes(&client, elems.max(l.latent));
    voxel_loss_backward_kernel::launch::<R>(
        &client,
        count,
        dim,
        o.x.into_tensor_arg(),
        o.r.into_tensor_arg(),
        cw.into_tensor_arg(),
        l.moments.into_tensor_arg(),
        contiguous(stats).into_tensor_arg(),
        contiguous(dloss).into_tensor_arg(),
        dr.clone().into_tensor_arg(),
        dmoments.clone().into_tensor_arg(),
        elems as u32,
        o.spatial as u32,
        o.channels as u32,
        l.latent as u32,
        l.channels as u32,
        l.spatial as u32,
        l.layout.channel as u32,
        l.layout.spatial as u32,
        s.w_occupied,
        s.w_empty,
        weighted,
        s.fp_weight > 0.0,
        s.mass_weight > 0.0,
    );
    [dr, dmoments]
}

/// Unit `i < latent`, at latent element `i`: forward, the sample `mean + exp(½·lv)·eps` into
/// `out` (latent-shaped, strides `o_ch`, `o_sp`); `backward`, the moments' gradient into `out`
/// (the moments' layout) from `dz` (strides `o_ch`, `o_sp`): `dz` at the mean,
/// `dz·eps·½·exp(½·lv)` at the logvar. `clamp`: `lv` is the logvar clamped (the 4D-Radar VAE's),
/// and its gradient 0 where the clamp holds it; else the logvar as it is (ACT's).
/// `moments` and `eps` dense, each with its channel and spatial strides.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn posterior_sample_kernel(
    moments: &Tensor<f32>,
    eps: &Tensor<f32>,
    dz: &Tensor<f32>,
    out: &mut Tensor<f32>,
    latent: u32,
    lat_ch: u32,
    lat_spatial: u32,
    m_ch: u32,
    m_sp: u32,
    e_ch: u32,
    e_sp: u32,
    o_ch: u32,
    o_sp: u32,
    #[comptime] backward: bool,
    #[comptime] clamp: bool,
) {
    let i = ABSOLUTE_POS;
    if i < latent as usize {
        let (at_m, at_l) = moments_at(i, lat_ch, lat_spatial, m_ch, m_sp);
        let raw = moments[at_l];
        let e = eps[latent_at(i, lat_ch, lat_spatial, e_ch, e_sp)];
        let mut lv = raw;
        if comptime![clamp] {
            lv = clamp_logvar(raw);
        }
        let std = (lv * 0.5f32).exp();
        let at_o = latent_at(i, lat_ch, lat_spatial, o_ch, o_sp);
        if comptime![backward] {
            let g = dz[at_o];
            out[at_m] = g;
            let mut dl = g * e * std * 0.5f32;
            if comptime![clamp] {
                dl = select(clamp_passes(raw), dl, 0.0f32);
            }
            out[at_l] = dl;
        } else {
            out[at_o] = moments[at_m] + std * e;
        }
    }
}

/// [`posterior_sample_kernel`] over the moments `l`, forward (`dz` none: the sample, in the
/// moments' layout) or backward (the moments' gradient, in their layout).
fn launch_sample<R: CubeRuntime>(l: Latent<R>, eps: CubeTensor<R>, dz: Option<CubeTensor<R>>, clamp: bool) -> CubeTensor<R> {
    let (eps, e_ch, e_sp) = strided(eps);
    let backward = dz.is_some();
    let (out, dz, o_ch, o_sp) = match dz {
        Some(dz) => {
            let mdims = l.moments.meta.shape().to_vec();
            let (dz, g_ch, g_sp) = strided(dz);
            (empty_in(&eps, mdims, DType::F32, l.layout), dz, g_ch, g_sp)
        }
        None => {
            let zl = l.half_layout();
            (empty_in(&eps, eps.meta.shape().to_vec(), DType::F32, zl), eps.clone(), zl.channel as u32, zl.spatial as u32)
        }
    };
    let client = eps.client.clone();
    let (count, dim) = elem_cubes(&client, l.latent);
    posterior_sample_kernel::launch::<R>(
        &client,
        count,
        dim,
        l.moments.into_tensor_arg(),
        eps.into_tensor_arg(),
        dz.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        l.latent as u32,
        l.channels as u32,
        l.spatial as u32,
        l.layout.channel as u32,
        l.layout.spatial as u32,
        e_ch,
        e_sp,
        o_ch,
        o_sp,
        backward,
        clamp,
    );
    out
}

/// The posterior sample (f32, `eps`' dims, in the moments' layout) of `moments` with the noise
/// `eps`, the logvar clamped where `clamp`.
pub fn sample<R: CubeRuntime>(moments: CubeTensor<R>, eps: CubeTensor<R>, clamp: bool) -> CubeTensor<R> {
    launch_sample(latent(moments), eps, None, clamp)
}

/// [`sample`]'s backward for the sample's gradient `dz`: `dmoments` (f32, `moments`' dims, in
/// their layout).
pub fn sample_backward<R: CubeRuntime>(moments: CubeTensor<R>, eps: CubeTensor<R>, dz: CubeTensor<R>, clamp: bool) -> CubeTensor<R> {
    launch_sample(latent(moments), eps, Some(dz), clamp)
}
