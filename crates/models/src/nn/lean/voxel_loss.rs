//! The 4D-Radar VAE's posterior and training loss as nodes reading the encoder's moments
//! (`[n, 2·latent, d', h', w']` f32: the mean, then the logvar before `VAE3D.encode`'s clamp to
//! [`LOGVAR_MIN`]..=[`LOGVAR_MAX`]):
//!
//! - [`posterior_sample`]: `z = mean + exp(½·logvar)·eps` (ACT's posterior takes it too, its
//!   parameters `[b, 2·l]` seen as `[b, 2·l, 1, 1, 1]`, without the clamp);
//! - [`voxel_loss()`]: the reference's sparse-voxel reconstruction loss
//!   (`compute_loss(reduction="mean")`: the squared error weighted by occupancy and channel over
//!   the mean occupancy weight, a false-positive term and an occupancy-mass term, each where its
//!   weight is > 0) plus `kl_weight` times the posterior's KL term (`Vae3d::compute_loss`).
//!
//! Composed of Burn ops the loss, the KL term and their backwards are about a hundred small
//! launches a step, and the moments' split, clamp and sampling with their backwards 35 more (VAE
//! ultra b2 on lavapipe: 89 for the loss, 14 for the KL's backward;
//! `benches/results/kernels/wgpu/launch_trims.md`). On CubeCL the loss runs
//! `nn::cube::voxel_loss`: two launches forward (per-cube partial sums, then one cube for the
//! statistics) and one backward; the sample one launch each way. Each backward writes the whole
//! gradient of the moments (the clamp's mask applied), so the split is neither run nor undone.
//! The loss keeps `x`, `recon`, the moments (what the composed ops keep, or less: they keep the
//! differences and weights too) and its 8 f32 statistics ([`stat`]), whose coefficients make the
//! backward one pass; the sample keeps the moments and `eps`. `x` and `eps` (data) take no
//! gradient.
//!
//! flex keeps the model's composed ops ([`LeanBackend::lean_loss_nodes`]): its measured peaks and
//! estimate graph are theirs. The inner backends' composed forms here ([`stats_composed`],
//! [`backward_composed`], [`sample_composed`], [`sample_backward_composed`]) are what the kernels
//! are tested against; with them, the nodes on flex are tested against autodiff of the model's
//! composed ops.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use super::{LeanBackend, Prim, p, register_parents, t};

/// Where the statistics of [`LeanBackend::lean_voxel_loss`] hold what (`[8]` f32; the
/// backward reads the coefficients).
pub mod stat {
    /// `recon + kl_weight · kl`.
    pub const LOSS: usize = 0;
    /// The reconstruction term.
    pub const RECON: usize = 1;
    /// The KL term, `−½ · mean(logvar + 1 − mean² − exp(logvar))`.
    pub const KL: usize = 2;
    /// `1 / (n_all · denom)`: the weighted squared error's gradient per `2·(r − x)·w·cw`.
    pub const SQ_COEF: usize = 3;
    /// `fp_weight / n_voxels` (0 without the term).
    pub const FP_COEF: usize = 4;
    /// `mass_weight · sign(mean(relu(r₀)) − mean(relu(x₀))) / n_voxels` (0 without the term).
    pub const MASS_COEF: usize = 5;
    /// `−½ · kl_weight / n_latent`.
    pub const KL_COEF: usize = 6;
    /// `max(mean(w), 1e-6) · cw_scale`, the squared error's divisor (read by neither pass).
    pub const DENOM: usize = 7;
    /// How many there are.
    pub const LEN: usize = 8;
}

/// The loss's weights as f32 scalars, as the composed ops take them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VoxelLossArgs {
    /// The spatial weight of an occupied voxel (`x[:, 0] > 0`) and of an empty one.
    pub w_occupied: f32,
    pub w_empty: f32,
    /// `max(mean(channel_weights), 1e-6)`, or 1 without channel weights.
    pub cw_scale: f32,
    /// The false-positive and occupancy-mass terms' weights (a term counts where > 0), the KL's.
    pub fp_weight: f32,
    pub mass_weight: f32,
    pub kl_weight: f32,
}

impl VoxelLossArgs {
    /// From the config's weights. The composed ops compute the spatial weight as `occupied ·
    /// (occupied_weight − empty_weight) + empty_weight` in f32 with both scalars rounded to f32,
    /// which is what `w_occupied` is.
    pub fn new(occupied_weight: f64, empty_weight: f64, channel_weights: Option<&[f32]>, fp_weight: f64, mass_weight: f64, kl_weight: f64) -> Self {
        let w_empty = empty_weight as f32;
        let cw_scale = channel_weights.map_or(1.0, |cw| (cw.iter().sum::<f32>() / cw.len() as f32).max(1e-6));
        Self {
            w_occupied: (occupied_weight - empty_weight) as f32 + w_empty,
            w_empty,
            cw_scale,
            fp_weight: if fp_weight > 0.0 { fp_weight as f32 } else { 0.0 },
            mass_weight: if mass_weight > 0.0 { mass_weight as f32 } else { 0.0 },
            kl_weight: kl_weight as f32,
        }
    }
}

/// The clamp `VAE3D.encode` puts on the posterior's logvar.
pub const LOGVAR_MIN: f32 = -30.0;
pub const LOGVAR_MAX: f32 = 20.0;

/// `(loss, recon_loss, kl_loss)`, each `[1]` f32, of the reconstruction `recon` of `x`
/// (`[n, c, d, h, w]` f32) and the posterior in `moments` (`[n, 2·l, d', h', w']` f32, the
/// logvar unclamped), with the channel weights `cw` (`[c]`) if given:
/// [`LeanBackend::lean_voxel_loss`]. Only `loss` takes a gradient; `x` must not need one.
pub fn voxel_loss<B: LeanBackend>(x: Tensor<B, 5>, recon: Tensor<B, 5>, moments: Tensor<B, 5>, cw: Option<Tensor<B, 1>>, args: &VoxelLossArgs) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>) {
    debug_assert!(!x.is_require_grad(), "voxel_loss: x takes no gradient");
    let [loss, recon_loss, kl_loss, _] = B::lean_voxel_loss(p(x), p(recon), p(moments), cw.map(p), args);
    (t(loss), t(recon_loss), t(kl_loss))
}

/// The posterior sample `mean + exp(½·logvar)·eps` (`[n, l, d', h', w']` f32) of `moments`
/// (`[n, 2·l, d', h', w']` f32), the logvar clamped to [`LOGVAR_MIN`]..=[`LOGVAR_MAX`] first
/// where `clamp` (the 4D-Radar VAE's; ACT's is not): [`LeanBackend::lean_posterior_sample`].
/// `eps` (f32, the sample's dims) must not need a gradient.
pub fn posterior_sample<B: LeanBackend>(moments: Tensor<B, 5>, eps: Tensor<B, 5>, clamp: bool) -> Tensor<B, 5> {
    debug_assert!(!eps.is_require_grad(), "posterior_sample: eps takes no gradient");
    t(B::lean_posterior_sample(p(moments), p(eps), clamp))
}

/// `(mean, clamped logvar, [logvar within the clamp] as 0/1)` of `moments`, each
/// `[n, l, d', h', w']`.
fn split<B: Backend>(moments: Prim<B>) -> (Tensor<B, 5>, Tensor<B, 5>, Tensor<B, 5>) {
    let m: Tensor<B, 5> = t(moments);
    let l = m.dims()[1] / 2;
    let raw = m.clone().narrow(1, l, l);
    let lv = raw.clone().clamp(LOGVAR_MIN, LOGVAR_MAX);
    let kept = lv.clone().equal(raw).float();
    (m.narrow(1, 0, l), lv, kept)
}

/// `(mean, logvar)` of `moments`, the logvar clamped where `clamp`, and the clamp's 0/1 mask
/// where `clamp`.
fn split_maybe_clamped<B: Backend>(moments: Prim<B>, clamp: bool) -> (Tensor<B, 5>, Tensor<B, 5>, Option<Tensor<B, 5>>) {
    if clamp {
        let (m, lv, kept) = split(moments);
        return (m, lv, Some(kept));
    }
    let m: Tensor<B, 5> = t(moments);
    let l = m.dims()[1] / 2;
    (m.clone().narrow(1, 0, l), m.narrow(1, l, l), None)
}

/// The spatial weight `[n, 1, …]` of `x`'s voxels: `w_occupied` where `x[:, 0] > 0`, else
/// `w_empty`.
fn spatial_weight<B: Backend>(x: &Tensor<B, 5>, a: &VoxelLossArgs) -> Tensor<B, 5> {
    let x0 = x.clone().narrow(1, 0, 1);
    Tensor::full(x0.shape(), a.w_empty, &x0.device()).mask_fill(x0.greater_elem(0.0), a.w_occupied)
}

/// [`LeanBackend::lean_voxel_loss`] composed of Burn ops: `[loss, recon_loss, kl_loss,
/// statistics]`, the first three slices of the statistics (see [`stat`]).
pub(super) fn forward_composed<B: Backend>(x: Prim<B>, recon: Prim<B>, moments: Prim<B>, cw: Option<Prim<B>>, a: &VoxelLossArgs) -> [Prim<B>; 4] {
    let stats: Tensor<B, 1> = t(stats_composed::<B>(x, recon, moments, cw, a));
    let at = |i: usize| p(stats.clone().narrow(0, i, 1));
    [at(stat::LOSS), at(stat::RECON), at(stat::KL), p(stats)]
}

/// The loss's statistics composed of Burn ops (see [`stat`]).
fn stats_composed<B: Backend>(x: Prim<B>, recon: Prim<B>, moments: Prim<B>, cw: Option<Prim<B>>, a: &VoxelLossArgs) -> Prim<B> {
    let (x, r): (Tensor<B, 5>, Tensor<B, 5>) = (t(x), t(recon));
    let (m, lv, _) = split(moments);
    let c = x.dims()[1];
    let n_all = x.shape().num_elements() as f32;
    let n_voxels = n_all / c as f32;
    let n_latent = m.shape().num_elements() as f32;
    let w = spatial_weight(&x, a);
    let mut sq = (r.clone() - x.clone()).square() * w.clone();
    if let Some(cw) = cw {
        sq = sq * t::<B, 1>(cw).reshape([1, c, 1, 1, 1]);
    }
    let denom = w.mean().clamp_min(1e-6) * a.cw_scale;
    let mut recon_l = sq.mean() / denom.clone();
    let (x0, r0) = (x.narrow(1, 0, 1), r.narrow(1, 0, 1));
    let dev = x0.device();
    if a.fp_weight > 0.0 {
        let empty = x0.clone().lower_equal_elem(0.0).float();
        recon_l = recon_l + ((r0.clone() - x0.clone()).clamp_min(0.0).square() * empty).mean() * a.fp_weight;
    }
    let mut mass_coef = Tensor::<B, 1>::zeros([1], &dev);
    if a.mass_weight > 0.0 {
        let d = r0.clamp_min(0.0).mean() - x0.clamp_min(0.0).mean();
        recon_l = recon_l + d.clone().abs() * a.mass_weight;
        mass_coef = d.sign() * (a.mass_weight / n_voxels);
    }
    let kl = (lv.clone() + 1.0 - m.square() - lv.exp()).mean() * -0.5;
    let scalar = |v: f32| Tensor::<B, 1>::full([1], v, &dev);
    p(Tensor::cat(
        vec![
            recon_l.clone() + kl.clone() * a.kl_weight,
            recon_l,
            kl,
            (denom.clone() * n_all).recip(),
            scalar(a.fp_weight / n_voxels),
            mass_coef,
            scalar(a.kl_weight * -0.5 / n_latent),
            denom,
        ],
        0,
    ))
}

/// [`LeanBackend::lean_voxel_loss_backward`] composed of Burn ops: `[drecon, dmoments]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward_composed<B: Backend>(x: Prim<B>, recon: Prim<B>, moments: Prim<B>, cw: Option<Prim<B>>, stats: Prim<B>, dloss: Prim<B>, a: &VoxelLossArgs) -> [Prim<B>; 2] {
    let (x, r): (Tensor<B, 5>, Tensor<B, 5>) = (t(x), t(recon));
    let (m, lv, kept) = split(moments);
    let dims = r.dims();
    let c = dims[1];
    let s: Tensor<B, 1> = t(stats);
    let at = |i: usize| s.clone().narrow(0, i, 1).reshape([1, 1, 1, 1, 1]);
    let g = t::<B, 1>(dloss).reshape([1, 1, 1, 1, 1]);
    let w = spatial_weight(&x, a);
    let mut dr = (r.clone() - x.clone()) * 2.0 * w;
    if let Some(cw) = cw {
        dr = dr * t::<B, 1>(cw).reshape([1, c, 1, 1, 1]);
    }
    let mut dr = dr * at(stat::SQ_COEF);
    let (x0, r0) = (x.narrow(1, 0, 1), r.narrow(1, 0, 1));
    let mut d0 = Tensor::<B, 5>::zeros(x0.shape(), &x0.device());
    if a.fp_weight > 0.0 {
        let empty = x0.clone().lower_equal_elem(0.0).float();
        d0 = d0 + (r0.clone() - x0).clamp_min(0.0) * 2.0 * empty * at(stat::FP_COEF);
    }
    if a.mass_weight > 0.0 {
        d0 = d0 + r0.greater_elem(0.0).float() * at(stat::MASS_COEF);
    }
    let first = dr.clone().narrow(1, 0, 1) + d0;
    dr = dr.slice_assign([0..dims[0], 0..1, 0..dims[2], 0..dims[3], 0..dims[4]], first);
    let kc = at(stat::KL_COEF) * g.clone();
    let dm = m * -2.0 * kc.clone();
    let dl = (lv.exp().neg() + 1.0) * kc * kept;
    [p(dr * g), p(Tensor::cat(vec![dm, dl], 1))]
}

/// [`LeanBackend::lean_posterior_sample`] composed of Burn ops.
pub(super) fn sample_composed<B: Backend>(moments: Prim<B>, eps: Prim<B>, clamp: bool) -> Prim<B> {
    let (m, lv, _) = split_maybe_clamped(moments, clamp);
    p(m + (lv * 0.5).exp() * t::<B, 5>(eps))
}

/// [`LeanBackend::lean_posterior_sample_backward`] composed of Burn ops: `dmoments`.
pub(super) fn sample_backward_composed<B: Backend>(moments: Prim<B>, eps: Prim<B>, dz: Prim<B>, clamp: bool) -> Prim<B> {
    let (_, lv, kept) = split_maybe_clamped(moments, clamp);
    let dz: Tensor<B, 5> = t(dz);
    let dl = dz.clone() * t::<B, 5>(eps) * (lv * 0.5).exp() * 0.5;
    let dl = match kept {
        Some(kept) => dl * kept,
        None => dl,
    };
    p(Tensor::cat(vec![dz, dl], 1))
}

/// The loss node: gradients for `recon` and the moments from the kept inputs and statistics.
#[derive(Debug)]
struct VoxelLossBackward {
    args: VoxelLossArgs,
}

impl<B: LeanBackend> Backward<B, 2> for VoxelLossBackward {
    /// `x`, `recon`, the moments, the channel weights, the statistics.
    type State = (Prim<B>, Prim<B>, Prim<B>, Option<Prim<B>>, Prim<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dloss = grads.consume::<B>(&ops.node);
        let (x, recon, moments, cw, stats) = ops.state;
        let d = B::lean_voxel_loss_backward(x, recon, moments, cw, stats, dloss, &self.args);
        register_parents::<B, 2>(grads, ops.parents.map(|n| n.map(|n| n.id)), d);
    }
}

/// [`LeanBackend::lean_voxel_loss`] on `Autodiff<B, C>`: the loss as one node
/// ([`VoxelLossBackward`]), its two terms and the statistics untracked.
pub(super) fn voxel_loss_node<B: LeanBackend, C: CheckpointStrategy>(
    x: Prim<Autodiff<B, C>>,
    recon: Prim<Autodiff<B, C>>,
    moments: Prim<Autodiff<B, C>>,
    cw: Option<Prim<Autodiff<B, C>>>,
    args: &VoxelLossArgs,
) -> [Prim<Autodiff<B, C>>; 4] {
    let parents = [recon.node.clone(), moments.node.clone()];
    let (x, recon, moments, cw) = (x.primitive, recon.primitive, moments.primitive, cw.map(|w| w.primitive));
    let [loss, recon_loss, kl_loss, stats] = B::lean_voxel_loss(x.clone(), recon.clone(), moments.clone(), cw.clone(), args);
    let untracked = <Autodiff<B, C> as AutodiffBackend>::from_inner;
    let stats_out = untracked(stats.clone());
    let loss = match (VoxelLossBackward { args: *args }).prepare::<C>(parents).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((x, recon, moments, cw, stats), loss),
        OpsKind::UnTracked(prep) => prep.finish(loss),
    };
    [loss, untracked(recon_loss), untracked(kl_loss), stats_out]
}

/// The sample's node: the moments' gradient from the kept moments and noise.
#[derive(Debug)]
struct SampleBackward {
    clamp: bool,
}

impl<B: LeanBackend> Backward<B, 1> for SampleBackward {
    /// The moments, `eps`.
    type State = (Prim<B>, Prim<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dz = grads.consume::<B>(&ops.node);
        let (moments, eps) = ops.state;
        register_parents::<B, 1>(grads, ops.parents.map(|n| n.map(|n| n.id)), [B::lean_posterior_sample_backward(moments, eps, dz, self.clamp)]);
    }
}

/// [`LeanBackend::lean_posterior_sample`] on `Autodiff<B, C>`: one node ([`SampleBackward`]).
pub(super) fn sample_node<B: LeanBackend, C: CheckpointStrategy>(moments: Prim<Autodiff<B, C>>, eps: Prim<Autodiff<B, C>>, clamp: bool) -> Prim<Autodiff<B, C>> {
    let parents = [moments.node.clone()];
    let (moments, eps) = (moments.primitive, eps.primitive);
    let z = B::lean_posterior_sample(moments.clone(), eps.clone(), clamp);
    match (SampleBackward { clamp }).prepare::<C>(parents).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((moments, eps), z),
        OpsKind::UnTracked(prep) => prep.finish(z),
    }
}
