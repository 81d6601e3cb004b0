//! Convolutions on CubeCL with a short search instead of Burn's full one.
//!
//! Burn's convolution autotunes every new shape: the forward tries 8 kernels, the weight gradient 7
//! (`burn-cubecl` `kernel/conv/{forward,backward_weight}/tune.rs`), and each one that runs is compiled
//! first (NVRTC on CUDA, about 0.47 s a kernel on the H100). Its weight gradient's fallback is a
//! convolution with batch and channels swapped, which Burn autotunes again as a forward.
//!
//! Here ([`forward`], [`weight_backward`]):
//! - on a device without matrix units (lavapipe, most CPUs' Vulkan), nothing is searched. 1-D
//!   and 2-D convolutions (ACT's and Diffusion's ResNet-18, Diffusion's UNet) are matmuls over
//!   im2col columns ([`super::columns`]): on lavapipe 1.2–5.6× faster than Burn's
//!   direct kernel on most of those shapes. 3-D ones (the VAE), where both channel counts are
//!   multiples of 4, are [`super::forward_tiles`] (forward, and so the stride-1 input gradients;
//!   1.9–2.3× faster than Burn's direct kernel on lavapipe on 3×3×3 shapes of 16–64 channels) and
//!   [`super::weight_grad`]'s tile sums (weight gradients; 3.0–7.8× faster than Burn's); the
//!   others take Burn's direct convolution, which won every key of 3×3 or larger among Burn's
//!   candidates there, and for the weight gradient the swapped convolution Burn's fallback runs.
//!   `VRAMLAB_DIRECT_CONV=1` (read once per process) turns the columns and the tiles off:
//!   Burn's direct kernels, for comparisons;
//! - on a device with them, a search over the kernels that won on the H100: forward
//!   [`FORWARD`] (4 of Burn's 8), weight gradient [`WEIGHT_GRAD`] (3 of 7, then the swapped
//!   convolution only if none of them can be set up). Read off the H100 run's autotune results
//!   (`benches/results/gpu_vs_pytorch/nvidia-h100-80gb-hbm3/autotune_seed`): summed over each row's
//!   keys, the best of these took 1.01× (VAE forward, 46 keys), 1.05× (ACT 480×640 forward, 12)
//!   and 1.00× (VAE weight gradient, 17) the best of all Burn's candidates. For 3-D convolutions
//!   with channels in fours (the VAE's) the lavapipe kernels are candidates too: [`FORWARD_TILES`]
//!   ([`super::forward_tiles`]) and [`WEIGHT_GRAD_TILES`] ([`super::weight_grad`], each tile's sum
//!   split among up to 64 units). In that H100 run the VAE's weight gradients were its slowest
//!   convolutions: the best GEMM took 0.41–1.19 ms on each 8×32×32 shape (summed over the 17 keys
//!   4.3 ms, against 2.5 ms for its 30 forward keys, the swapped ones left out); a GEMM over 16,384 positions
//!   into a 27·C×C gradient has few output tiles to spread. Whether the tiles do better there is
//!   for the search to time, one compile per dtype each.
//!
//! `--conv_autotune=full` ([`set_full_search`]) restores Burn's own search; builds without Burn's
//! `autotune` feature run the direct kernels as Burn would.

use burn::tensor::Shape;
use burn::tensor::ops::ConvOptions;
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::conv::{ConvStrategy, conv_forward_nhwc, conv_weight_backward as burn_weight_backward};
use burn_cubecl::ops::{permute_nchw_to_nhwc, permute_nchw_to_nhwc_shape, permute_nhwc_to_nchw};
use burn_cubecl::tensor::CubeTensor;
use cubek::convolution::{AcceleratedTileKind, ConvAlgorithm};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the convolutions take Burn's own autotune search (`--conv_autotune=full`).
pub fn full_search() -> bool {
    FULL_SEARCH.load(Ordering::Relaxed)
}

static FULL_SEARCH: AtomicBool = AtomicBool::new(false);

/// Whether a device without matrix units takes [`super::columns`], [`super::forward_tiles`] and
/// [`super::weight_grad`] where they handle the convolution (false with `VRAMLAB_DIRECT_CONV=1`: Burn's direct kernels,
/// as before).
fn columns_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !super::env_switch("VRAMLAB_DIRECT_CONV"))
}

/// See [`full_search`]; set once per process, before the first convolution.
pub fn set_full_search(on: bool) {
    FULL_SEARCH.store(on, Ordering::Relaxed);
}

/// The forward's candidates on a device with matrix units, besides Burn's direct kernel (Burn's
/// names: `simple_async_mma`, `simple_sync_mma`, `simple_tma_mma`).
pub const FORWARD: [(&str, ConvAlgorithm, AcceleratedTileKind); 3] = [
    ("simple_async_mma", ConvAlgorithm::SimpleAsyncStrided, AcceleratedTileKind::Mma),
    ("simple_sync_mma", ConvAlgorithm::SimpleSyncStrided, AcceleratedTileKind::Mma),
    ("simple_tma_mma", ConvAlgorithm::SimpleAsyncTma, AcceleratedTileKind::Mma),
];

/// The weight gradient's candidates on a device with matrix units (Burn's names), before the
/// swapped-convolution fallback.
pub const WEIGHT_GRAD: [(&str, ConvAlgorithm, AcceleratedTileKind); 3] = [
    ("simple_async_mma", ConvAlgorithm::SimpleAsyncStrided, AcceleratedTileKind::Mma),
    ("simple_tma_cmma", ConvAlgorithm::SimpleAsyncTma, AcceleratedTileKind::Cmma),
    ("simple_tma_mma", ConvAlgorithm::SimpleAsyncTma, AcceleratedTileKind::Mma),
];

/// The search's name for [`super::forward_tiles`], a forward candidate beside [`FORWARD`] where it
/// handles the convolution (3-D, channels in fours: the VAE's).
pub const FORWARD_TILES: &str = "forward_tiles";

/// The search's name for [`super::weight_grad`]'s tile sums (split for a GPU's launch size), a
/// weight-gradient candidate beside [`WEIGHT_GRAD`] where it handles the convolution.
pub const WEIGHT_GRAD_TILES: &str = "weight_grad_tiles";

/// Whether the device has the matrix units CubeCL's implicit-GEMM convolutions need.
fn matrix_units<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    #[cfg(test)]
    if SEARCH_ANYWAY.get() {
        return true;
    }
    let f = &t.client.properties().features.matmul;
    !f.cmma.is_empty() || !f.mma.is_empty()
}

#[cfg(test)]
thread_local! {
    /// Tests: search as on a device with matrix units (on lavapipe the GEMM candidates then fail
    /// at setup and the search falls back on the direct and swapped kernels).
    pub(crate) static SEARCH_ANYWAY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The convolution of NCHW (or N-dimensional) `x` with `w`, as Burn's `conv{N}d` returns it
/// (NCHW dims, channels-last strides).
pub fn forward<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, w: CubeTensor<R>, b: Option<CubeTensor<R>>, o: ConvOptions<N>) -> CubeTensor<R> {
    let (x, w) = (permute_nchw_to_nhwc(x), permute_nchw_to_nhwc(w));
    permute_nhwc_to_nchw(forward_nhwc(x, w, b, o))
}

/// The weight gradient of [`forward`] for NCHW `x` and output gradient `dy`, as Burn's
/// `conv{N}d_weight_backward` returns it.
pub fn weight_backward<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, dy: CubeTensor<R>, weight_shape: Shape, o: ConvOptions<N>) -> CubeTensor<R> {
    weight_grads(x, dy, weight_shape, o, false).0
}

/// [`weight_backward`] and the bias's gradient (`dy` summed over all but its channel axis,
/// `[cout]`). On a device without matrix units, where the tile sums take the weight gradient
/// ([`super::weight_grad`]), the bias's comes from the same launch; elsewhere from its own
/// ([`super::channel_sum`]).
pub fn weight_bias_backward<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, dy: CubeTensor<R>, weight_shape: Shape, o: ConvOptions<N>) -> (CubeTensor<R>, CubeTensor<R>) {
    let (dw, db) = weight_grads(x, dy.clone(), weight_shape, o, true);
    (dw, db.unwrap_or_else(|| super::channel_sum::channel_sum(dy, 1)))
}

/// The weight gradient, and where `bias` asks and its path sums it in the same launch, the bias's
/// (else `None`).
fn weight_grads<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, dy: CubeTensor<R>, weight_shape: Shape, o: ConvOptions<N>, bias: bool) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    if full_search() || o.groups != 1 {
        let strategy = if full_search() { ConvStrategy::default() } else { ConvStrategy::Direct };
        return (burn_weight_backward::<R, N>(x, dy, weight_shape, o, strategy).expect("Burn's convolution weight gradient"), None);
    }
    let (x, dy) = (permute_nchw_to_nhwc(x), permute_nchw_to_nhwc(dy));
    let shape = permute_nchw_to_nhwc_shape(weight_shape);
    let (dw, db) = weight_backward_nhwc(x, dy, shape, o, bias);
    (permute_nhwc_to_nchw(dw), db)
}

fn forward_nhwc<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, w: CubeTensor<R>, b: Option<CubeTensor<R>>, o: ConvOptions<N>) -> CubeTensor<R> {
    if full_search() {
        return conv_forward_nhwc::<R, N>(x, w, b, o, ConvStrategy::default()).expect("Burn's convolution");
    }
    if !matrix_units(&x) && columns_on() && super::columns::handles(&x, w.meta.shape(), &o) {
        if let Some(y) = super::columns::forward(x.clone(), w.clone(), b.clone(), &o) {
            return y;
        }
    }
    if !matrix_units(&x) && columns_on() && super::forward_tiles::handles(&x, w.meta.shape(), &o) {
        return super::forward_tiles::forward(x, w, b, &o);
    }
    if !cfg!(feature = "autotune") || o.groups != 1 || !matrix_units(&x) {
        return conv_forward_nhwc::<R, N>(x, w, b, o, ConvStrategy::Direct).expect("Burn's direct convolution");
    }
    #[cfg(feature = "autotune")]
    return tuned::forward(x, w, b, o);
    #[cfg(not(feature = "autotune"))]
    unreachable!()
}

/// The weight gradient (NHWC) and, where `bias` asks and the tile sums take the gradient, the
/// bias's from the same launch.
fn weight_backward_nhwc<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, dy: CubeTensor<R>, shape: Shape, o: ConvOptions<N>, bias: bool) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    if !matrix_units(&x) {
        if columns_on() && super::columns::handles(&x, &shape, &o) {
            if let Some(dw) = super::columns::weight_backward(x.clone(), dy.clone(), &shape, &o) {
                return (dw, None);
            }
        }
        if columns_on() && super::weight_grad::handles(&x, &shape, &o) {
            return super::weight_grad::weight_bias_backward(x, dy, &shape, &o, super::weight_grad::CPU_LAUNCH_UNITS, bias);
        }
        return (swapped_weight_backward(x, dy, shape, o), None);
    }
    #[cfg(feature = "autotune")]
    return (tuned::weight_backward(x, dy, shape, o), None);
    #[cfg(not(feature = "autotune"))]
    (swapped_weight_backward(x, dy, shape, o), None)
}

/// The weight gradient (NHWC, `groups == 1`) as a forward convolution over batch and channels
/// swapped (`x` as batch-of-channels input, `dy` as the weight, stride and dilation exchanged),
/// then cut to the kernel's size: what Burn's fallback computes, but whose inner convolution is
/// [`forward_nhwc`] (no second full search).
fn swapped_weight_backward<R: CubeRuntime, const N: usize>(mut x: CubeTensor<R>, mut dy: CubeTensor<R>, shape: Shape, o: ConvOptions<N>) -> CubeTensor<R> {
    let c = N + 1;
    x.meta.swap(0, c);
    dy.meta.swap(0, c);
    let mut g = forward_nhwc(x, dy, None, ConvOptions::new(o.dilation, o.padding, o.stride, 1));
    g.meta.swap(0, c);
    if g.meta.shape().to_vec() != shape.to_vec() {
        let ranges: Vec<_> = shape.iter().map(|&s| 0..s).collect();
        g = burn_cubecl::kernel::slice(g, &ranges);
    }
    g
}

/// The short searches (CubeCL's tuner: results cached in the autotune cache like Burn's, under
/// this module's name).
#[cfg(feature = "autotune")]
mod tuned {
    use super::*;
    use burn_cubecl::CubeTuneId;
    use cubecl::tune::{AutotuneKey, LocalTuner, TuneGroup, Tunable, TunableSet, anchor, local_tuner};
    use burn::tensor::DType;
    use cubek::convolution::{ConvolutionArgs, ConvolutionInputs, Strategy, launch_ref};
    use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
    use cubek::std::InputBinding;
    use serde::{Deserialize, Serialize};

    /// What the kernels' choice depends on: Burn's convolution key (sizes rounded up to powers of
    /// two, how far the channels vectorise), plus which pass.
    #[derive(Hash, Eq, PartialEq, Debug, Clone, Serialize, Deserialize)]
    pub struct ConvKey {
        weight_grad: bool,
        kernel: Vec<usize>,
        stride: Vec<usize>,
        padding: Vec<usize>,
        dilation: Vec<usize>,
        in_channels: usize,
        out_channels: usize,
        spatial: Vec<usize>,
        batch: usize,
        bias: bool,
        dtype: DType,
        in_align: u8,
        out_align: u8,
    }

    impl std::fmt::Display for ConvKey {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            std::fmt::Debug::fmt(self, f)
        }
    }

    impl AutotuneKey for ConvKey {}

    fn key<R: CubeRuntime, const N: usize>(weight_grad: bool, x: &CubeTensor<R>, kernel: &[usize], out_channels: usize, bias: bool, o: &ConvOptions<N>) -> ConvKey {
        let s = x.meta.shape();
        let in_channels = s[N + 1];
        let align = |c: usize| c.trailing_zeros().min(4) as u8;
        ConvKey {
            weight_grad,
            kernel: kernel.to_vec(),
            stride: o.stride.to_vec(),
            padding: o.padding.to_vec(),
            dilation: o.dilation.to_vec(),
            in_channels: anchor(in_channels, None, None, None),
            out_channels: anchor(out_channels, None, None, None),
            spatial: s[1..=N].iter().map(|&d| anchor(d, None, None, None)).collect(),
            batch: anchor(s[0], None, None, None),
            bias,
            dtype: x.dtype,
            in_align: align(in_channels),
            out_align: align(out_channels),
        }
    }

    type FwdIn<R, const N: usize> = (CubeTensor<R>, CubeTensor<R>, Option<CubeTensor<R>>, ConvOptions<N>);
    type WgradIn<R, const N: usize> = (CubeTensor<R>, CubeTensor<R>, Shape, ConvOptions<N>);

    pub fn forward<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, w: CubeTensor<R>, b: Option<CubeTensor<R>>, o: ConvOptions<N>) -> CubeTensor<R> {
        static TUNER: LocalTuner<ConvKey, CubeTuneId> = local_tuner!("forward");
        let tunables = TUNER.init(|| {
            let mut set = TunableSet::<ConvKey, FwdIn<R, N>, CubeTensor<R>>::new_cloning_inputs(|(x, w, b, o): &FwdIn<R, N>| {
                let ws = w.meta.shape();
                key(false, x, &ws[1..=N], ws[0], b.is_some(), o)
            })
            .with(Tunable::new("conv_direct", |(x, w, b, o): FwdIn<R, N>| conv_forward_nhwc::<R, N>(x, w, b, o, ConvStrategy::Direct).map_err(|e| format!("{e:?}"))));
            for (name, algorithm, tile) in FORWARD {
                set = set.with(Tunable::new(name, move |(x, w, b, o): FwdIn<R, N>| gemm(algorithm, tile, Gemm::Forward { x, w, b }, &o)));
            }
            set.with(Tunable::new(FORWARD_TILES, |(x, w, b, o): FwdIn<R, N>| {
                if !super::super::forward_tiles::handles(&x, w.meta.shape(), &o) {
                    return Err(format!("{FORWARD_TILES}: not a 3-D convolution with channels in fours"));
                }
                Ok(super::super::forward_tiles::forward(x, w, b, &o))
            }))
        });
        let (client, device) = (x.client.clone(), x.device.clone());
        TUNER.execute(&CubeTuneId::new(&client, &device), &client, tunables, (x, w, b, o))
    }

    pub fn weight_backward<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, dy: CubeTensor<R>, shape: Shape, o: ConvOptions<N>) -> CubeTensor<R> {
        static TUNER: LocalTuner<ConvKey, CubeTuneId> = local_tuner!("weight_backward");
        let tunables = TUNER.init(|| {
            // The GEMMs and the tile sums first; the swapped convolution only where none of them
            // can be set up.
            let gemms = TuneGroup::new("gemm_or_tiles", |_: &ConvKey| 1);
            let fallback = TuneGroup::new("swapped", |_: &ConvKey| 0);
            let mut set = TunableSet::<ConvKey, WgradIn<R, N>, CubeTensor<R>>::new_cloning_inputs(|(x, dy, shape, o): &WgradIn<R, N>| {
                let ks: Vec<usize> = shape.iter().copied().collect();
                key(true, x, &ks[1..=N], dy.meta.shape()[N + 1], false, o)
            });
            for (name, algorithm, tile) in WEIGHT_GRAD {
                set = set.with(Tunable::new(name, move |(x, dy, shape, o): WgradIn<R, N>| gemm(algorithm, tile, Gemm::WeightGrad { x, dy, shape }, &o)).group(&gemms, |_| 0));
            }
            set = set.with(
                Tunable::new(WEIGHT_GRAD_TILES, |(x, dy, shape, o): WgradIn<R, N>| {
                    if !super::super::weight_grad::handles(&x, &shape, &o) {
                        return Err(format!("{WEIGHT_GRAD_TILES}: not a 3-D convolution with channels in fours"));
                    }
                    Ok(super::super::weight_grad::weight_backward(x, dy, &shape, &o, super::super::weight_grad::GPU_LAUNCH_UNITS))
                })
                .group(&gemms, |_| 0),
            );
            set.with(Tunable::new("swapped_direct", |(x, dy, shape, o): WgradIn<R, N>| Ok::<_, String>(swapped_weight_backward(x, dy, shape, o))).group(&fallback, |_| 0))
        });
        let (client, device) = (x.client.clone(), x.device.clone());
        TUNER.execute(&CubeTuneId::new(&client, &device), &client, tunables, (x, dy, shape, o))
    }

    /// One implicit-GEMM convolution kernel of CubeCL's (`cubek::convolution`) on NHWC tensors: the
    /// forward (`bias` optional) or the weight gradient.
    fn gemm<R: CubeRuntime, const N: usize>(algorithm: ConvAlgorithm, tile_kind: AcceleratedTileKind, op: Gemm<R>, o: &ConvOptions<N>) -> Result<CubeTensor<R>, String> {
        if o.groups != 1 {
            return Err(format!("groups {}", o.groups));
        }
        let strategy = Strategy::Inferred { algorithm, tile_kind };
        let args = ConvolutionArgs { stride: o.stride, padding: o.padding, dilation: o.dilation };
        let binding = |t: CubeTensor<R>| {
            let dtype = t.dtype;
            InputBinding::new(t.binding(), dtype.into())
        };
        let elems = |lhs: DType, rhs: DType, out: DType| MatmulElems::from_globals(&MatmulGlobalElems { lhs: lhs.into(), rhs: rhs.into(), out: out.into() });
        match op {
            Gemm::Forward { x, w, b } => {
                let (xs, ws) = (x.meta.shape(), w.meta.shape());
                let mut dims = vec![xs[0]];
                dims.extend(burn::tensor::ops::conv::calculate_conv_output_sizes(&ws[1..=N], &o.stride, &o.padding, &o.dilation, &xs[1..=N]));
                dims.push(ws[0]);
                let out = super::super::empty(&x, dims, x.dtype);
                let (client, dtypes) = (x.client.clone(), elems(x.dtype, w.dtype, x.dtype));
                let inputs = ConvolutionInputs::Forward { input: binding(x), weight: binding(w), bias: b.map(binding), out: out.clone().binding() };
                launch_ref::<R, N>(&strategy, &client, inputs, args, dtypes).map_err(|e| format!("{e:?}"))?;
                Ok(out)
            }
            Gemm::WeightGrad { x, dy, shape } => {
                let out = super::super::empty(&x, shape.to_vec(), x.dtype);
                let (client, dtypes) = (x.client.clone(), elems(x.dtype, dy.dtype, x.dtype));
                let inputs = ConvolutionInputs::BackwardWeight { input: binding(x), out_grad: binding(dy), weight_grad: out.clone().binding() };
                launch_ref::<R, N>(&strategy, &client, inputs, args, dtypes).map_err(|e| format!("{e:?}"))?;
                Ok(out)
            }
        }
    }

    enum Gemm<R: CubeRuntime> {
        Forward { x: CubeTensor<R>, w: CubeTensor<R>, b: Option<CubeTensor<R>> },
        WeightGrad { x: CubeTensor<R>, dy: CubeTensor<R>, shape: Shape },
    }
}
