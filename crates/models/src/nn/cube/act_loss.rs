//! ACT's training loss ([`crate::nn::lean::act_loss`]): lerobot's `ACTPolicy.forward` with the
//! VAE objective, `l1_loss + kl_weight · kld_loss`, in two launches forward and one backward.
//! Composed of Burn ops it is 17 launches forward; with the posterior sample's 4, their
//! backwards and the parameters' split undone, 53 a step (ACT on lavapipe,
//! `benches/results/kernels/wgpu/launch_trims.md`, 2026-12-07 fifth session).
//!
//! - [`forward`]: [`act_loss_partials_kernel`] sums, per cube, `|action − pred|` where the
//!   action is not padding, and the KL summand `exp(lv) + μ² − lv − 1` of the posterior;
//!   [`act_loss_finish_kernel`] (one cube) adds the cubes' partial sums and writes the loss and
//!   its two terms, each its own `[1]` tensor (a slice of one `[3]` would be a copy on CubeCL:
//!   Burn's slice is a view only at aligned offsets);
//! - [`backward`]: one unit per element of the prediction and of the posterior's parameters:
//!   `dpred = −sign(action − pred) · keep · g / n`, `dμ = g · kl_weight · μ / b`,
//!   `dlv = g · kl_weight · ½(exp(lv) − 1) / b`, with the loss's gradient `g` read on the device.
//!
//! Everything is f32 (the model computes its loss in f32), read and written contiguous:
//! `action` and `pred` `[b, chunk, a]`, the padding `[b, chunk]` as 1 where padded, the
//! posterior's parameters `[b, 2·l]` (`[μ | log σ²]`, `vae_encoder_latent_output_proj`'s output).

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{BLOCK, contiguous, cube_sum, elem_cubes, empty, partial_total};

/// The totals one cube of [`act_loss_partials_kernel`] writes: `Σ |action − pred| · keep`,
/// `Σ (exp(lv) + μ² − lv − 1)`.
const SUMS: usize = 2;
/// [`act_loss_partials_kernel`]'s cubes at most (units loop over larger inputs).
const PARTIAL_CUBES: usize = 256;

/// `1 − pad` of row `row` (1 without padding).
#[cube]
fn keep_of(pad: &Tensor<f32>, row: usize, #[comptime] padded: bool) -> f32 {
    let mut k = 1.0f32;
    if comptime![padded] {
        k = 1.0f32 - pad[row];
    }
    k
}

/// Unit `u` of `cubes · BLOCK`: the sums over elements `u, u + stride, …` of `action` and
/// `pred` (`elems` of them, rows of `per_row`) and over the posterior's latent elements `u, u +
/// stride, …` (`latent = b · l`, rows of `lat`: `params[row · 2·lat + k]` the mean,
/// `params[row · 2·lat + lat + k]` the log-variance); each cube's totals into
/// `partial[cube · SUMS + k]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn act_loss_partials_kernel(
    action: &Tensor<f32>,
    pred: &Tensor<f32>,
    pad: &Tensor<f32>,
    params: &Tensor<f32>,
    partial: &mut Tensor<f32>,
    elems: u32,
    per_row: u32,
    latent: u32,
    lat: u32,
    #[comptime] padded: bool,
) {
    let stride = CUBE_COUNT * BLOCK;
    let mut s_l1 = 0.0f32;
    let mut s_kl = 0.0f32;
    let mut i = ABSOLUTE_POS;
    while i < elems as usize {
        s_l1 += (action[i] - pred[i]).abs() * keep_of(pad, i / per_row as usize, padded);
        i += stride;
    }
    let lat = lat as usize;
    let mut j = ABSOLUTE_POS;
    while j < latent as usize {
        let row = j / lat;
        let at = j + row * lat;
        let (mu, lv) = (params[at], params[at + lat]);
        s_kl += lv.exp() + mu * mu - lv - 1.0f32;
        j += stride;
    }
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let t_l1 = cube_sum(s_l1, &mut shared);
    let t_kl = cube_sum(s_kl, &mut shared);
    if UNIT_POS_X == 0 {
        partial[CUBE_POS * SUMS] = t_l1;
        partial[CUBE_POS * SUMS + 1] = t_kl;
    }
}

/// One cube: the `cubes` rows of `partial` added, then `l1 = Σ₀ / n_elems`, `kld = ½·Σ₁ /
/// batch` and `loss = l1 + kl_weight · kld`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn act_loss_finish_kernel(partial: &Tensor<f32>, loss: &mut Tensor<f32>, l1: &mut Tensor<f32>, kld: &mut Tensor<f32>, cubes: u32, n_elems: f32, batch: f32, kl_weight: f32) {
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let t_l1 = partial_total(partial, 0usize, SUMS, cubes, &mut shared);
    let t_kl = partial_total(partial, 1usize, SUMS, cubes, &mut shared);
    if UNIT_POS_X == 0 {
        let a = t_l1 / n_elems;
        let k = t_kl * 0.5f32 / batch;
        l1[0] = a;
        kld[0] = k;
        loss[0] = a + k * kl_weight;
    }
}

/// Unit `i`: `dpred[i]` (for `i < elems`) and the posterior parameters' gradient at `i` (for
/// `i < 2·latent`), each times the loss's gradient `g[0]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn act_loss_backward_kernel(
    action: &Tensor<f32>,
    pred: &Tensor<f32>,
    pad: &Tensor<f32>,
    params: &Tensor<f32>,
    g: &Tensor<f32>,
    dpred: &mut Tensor<f32>,
    dparams: &mut Tensor<f32>,
    elems: u32,
    per_row: u32,
    latent: u32,
    lat: u32,
    n_elems: f32,
    batch: f32,
    kl_weight: f32,
    #[comptime] padded: bool,
) {
    let i = ABSOLUTE_POS;
    let gs = g[0];
    if i < elems as usize {
        let e = action[i] - pred[i];
        let sign = select(e > 0.0f32, 1.0f32, select(e < 0.0f32, -1.0f32, 0.0f32));
        dpred[i] = -(gs / n_elems * keep_of(pad, i / per_row as usize, padded) * sign);
    }
    if i < 2 * latent as usize {
        let lat = lat as usize;
        let kc = gs * kl_weight / batch;
        let k = i % (2 * lat);
        let v = params[i];
        dparams[i] = select(k < lat, v * kc, (v.exp() - 1.0f32) * 0.5f32 * kc);
    }
}

/// f32, rank `rank`, every count within `u32`.
fn f32_of_rank((d, t): (&[usize], DType), rank: usize) -> bool {
    d.len() == rank && t == DType::F32 && d.iter().product::<usize>() <= u32::MAX as usize
}

/// Whether [`forward`] and [`backward`] take these operands: `action` and `pred` f32
/// `[b, chunk, a]` alike and not empty, the padding (if any) f32 `[b, chunk]`, the posterior's
/// parameters f32 `[b, 2·l]` with `l > 0`, every count within `u32`.
pub fn handles(action: (&[usize], DType), pred: (&[usize], DType), pad: Option<(&[usize], DType)>, params: (&[usize], DType)) -> bool {
    f32_of_rank(action, 3)
        && action.0 == pred.0
        && pred.1 == DType::F32
        && action.0.iter().product::<usize>() > 0
        && f32_of_rank(params, 2)
        && params.0[0] == action.0[0]
        && params.0[1] > 0
        && params.0[1] % 2 == 0
        && pad.is_none_or(|(d, t)| d == &action.0[..2] && t == DType::F32)
}

/// What both passes read, contiguous, and the counts.
struct Operands<R: CubeRuntime> {
    action: CubeTensor<R>,
    pred: CubeTensor<R>,
    /// The padding, or `pred` as a placeholder the kernels do not read.
    pad: CubeTensor<R>,
    padded: bool,
    params: CubeTensor<R>,
    /// Elements of `pred`, its last axis, the batch, the latent size `l`.
    elems: usize,
    per_row: usize,
    batch: usize,
    lat: usize,
}

fn operands<R: CubeRuntime>(action: CubeTensor<R>, pred: CubeTensor<R>, pad: Option<CubeTensor<R>>, params: CubeTensor<R>) -> Operands<R> {
    let dims = pred.meta.shape().to_vec();
    let (pred, padded) = (contiguous(pred), pad.is_some());
    let pad = pad.map(contiguous).unwrap_or_else(|| pred.clone());
    let lat = params.meta.shape()[1] / 2;
    Operands { action: contiguous(action), pred, pad, padded, params: contiguous(params), elems: dims.iter().product(), per_row: dims[2], batch: dims[0], lat }
}

/// `[loss, l1_loss, kld_loss]`, each `[1]` f32, of the prediction `pred` of `action` (the
/// padded rows, where `pad` is 1, left out of the L1 sum but not of its count) and the
/// posterior's parameters `params`.
pub fn forward<R: CubeRuntime>(action: CubeTensor<R>, pred: CubeTensor<R>, pad: Option<CubeTensor<R>>, params: CubeTensor<R>, kl_weight: f32) -> [CubeTensor<R>; 3] {
    let o = operands(action, pred, pad, params);
    let client = o.pred.client.clone();
    let latent = o.batch * o.lat;
    let cubes = o.elems.max(latent).div_ceil(BLOCK).clamp(1, PARTIAL_CUBES);
    let partial = empty(&o.pred, vec![cubes * SUMS], DType::F32);
    let outs = [(); 3].map(|_| empty(&o.pred, vec![1], DType::F32));
    act_loss_partials_kernel::launch::<R>(
        &client,
        CubeCount::Static(cubes as u32, 1, 1),
        CubeDim::new_1d(BLOCK as u32),
        o.action.into_tensor_arg(),
        o.pred.into_tensor_arg(),
        o.pad.into_tensor_arg(),
        o.params.into_tensor_arg(),
        partial.clone().into_tensor_arg(),
        o.elems as u32,
        o.per_row as u32,
        latent as u32,
        o.lat as u32,
        o.padded,
    );
    let [loss, l1, kld] = outs.clone();
    act_loss_finish_kernel::launch::<R>(
        &client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(BLOCK as u32),
        partial.into_tensor_arg(),
        loss.into_tensor_arg(),
        l1.into_tensor_arg(),
        kld.into_tensor_arg(),
        cubes as u32,
        o.elems as f32,
        o.batch as f32,
        kl_weight,
    );
    outs
}

/// The loss's gradients `[dpred, dparams]` (f32, contiguous, in `pred`'s and `params`' dims)
/// for the loss gradient `dloss` (`[1]`).
pub fn backward<R: CubeRuntime>(action: CubeTensor<R>, pred: CubeTensor<R>, pad: Option<CubeTensor<R>>, params: CubeTensor<R>, dloss: CubeTensor<R>, kl_weight: f32) -> [CubeTensor<R>; 2] {
    let o = operands(action, pred, pad, params);
    let client = o.pred.client.clone();
    let latent = o.batch * o.lat;
    let dpred = empty(&o.pred, o.pred.meta.shape().to_vec(), DType::F32);
    let dparams = empty(&o.pred, vec![o.batch, 2 * o.lat], DType::F32);
    let (count, dim) = elem_cubes(&client, o.elems.max(2 * latent));
    act_loss_backward_kernel::launch::<R>(
        &client,
        count,
        dim,
        o.action.into_tensor_arg(),
        o.pred.into_tensor_arg(),
        o.pad.into_tensor_arg(),
        o.params.into_tensor_arg(),
        contiguous(dloss).into_tensor_arg(),
        dpred.clone().into_tensor_arg(),
        dparams.clone().into_tensor_arg(),
        o.elems as u32,
        o.per_row as u32,
        latent as u32,
        o.lat as u32,
        o.elems as f32,
        o.batch as f32,
        kl_weight,
        o.padded,
    );
    [dpred, dparams]
}
