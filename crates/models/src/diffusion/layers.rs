//! The building blocks of Diffusion Policy's UNet and RGB encoder, with lerobot's parameter
//! names.
//!
//! Reference: huggingface/lerobot v0.4.4 `src/lerobot/policies/diffusion/modeling_diffusion.py`
//! — `DiffusionConv1dBlock`, `DiffusionConditionalResidualBlock1d`,
//! `DiffusionSinusoidalPosEmb`, `SpatialSoftmax` — and the RGB encoder's
//! `torchvision.transforms.Resize` ([`resize_bilinear_antialias`]).
//!
//! `nn.Sequential`s become `Vec`s so their indices are the names: an entry without tensors
//! (`nn.Mish`, `DiffusionSinusoidalPosEmb`) is a `None` in a `Vec<Option<_>>` or is left off the
//! end of a `Vec` of an enum (variant names are not part of names). Convolutions run in the
//! forward's [`Precision`]; GroupNorm, Mish, softmax and the keypoint expectation in f32.

use burn::module::{Module, Param};
use burn::nn::PaddingConfig1d;
use burn::nn::conv::{Conv1d, Conv1dConfig, Conv2d};
use burn::prelude::*;
use crate::nn::LeanBackend;
use burn::tensor::TensorData;


use crate::nn::{GroupNorm, Linear, NormAct, Precision, cast, conv1d_p, conv2d_p, to_f32};

/// `nn.GroupNorm`'s default epsilon.
pub const GROUP_NORM_EPS: f64 = 1e-5;

/// `nn.Mish`: `x · tanh(softplus(x))`, computed in f32 (as PyTorch's kernel does for reduced
/// precision inputs) with the overflow-free `softplus(x) = max(x, 0) + log1p(exp(−|x|))`;
/// returned in the input's dtype; one autodiff node that keeps only its input.
pub use crate::nn::mish;

/// `DiffusionSinusoidalPosEmb(dim)` of integer timesteps, computed on the host with torch's
/// f32 operations: `f_i = exp(i · −ln(10000)/(dim/2 − 1))`, `[sin(t·f), cos(t·f)]`
/// (concatenated, not interleaved). Returns `timesteps.len() × dim` values, row-major.
pub fn sinusoidal_step_embedding(timesteps: &[usize], dim: usize) -> Vec<f32> {
    let half = dim / 2;
    let scale = -((10000f64).ln() / (half as f64 - 1.0)) as f32;
    let freqs: Vec<f32> = (0..half).map(|i| (i as f32 * scale).exp()).collect();
    let mut out = Vec::with_capacity(timesteps.len() * 2 * half);
    for &t in timesteps {
        let args: Vec<f32> = freqs.iter().map(|f| t as f32 * f).collect();
        out.extend(args.iter().map(|a| a.sin()));
        out.extend(args.iter().map(|a| a.cos()));
    }
    out
}

/// One entry of `DiffusionConv1dBlock.block = nn.Sequential(Conv1d, GroupNorm, Mish)`.
#[derive(Module, Debug)]
pub enum Conv1dBlockLayer<B: Backend> {
    Conv(Conv1d<B>),
    Norm(GroupNorm<B>),
}

/// `DiffusionConv1dBlock`: Conv1d (padding `k // 2`) → GroupNorm → Mish. Names
/// `block.0.weight` / `block.0.bias` (conv), `block.1.weight` / `block.1.bias` (norm).
#[derive(Module, Debug)]
pub struct Conv1dBlock<B: Backend> {
    pub block: Vec<Conv1dBlockLayer<B>>,
}

impl<B: LeanBackend> Conv1dBlock<B> {
    /// PyTorch initialisation (Conv1d default, GroupNorm 1 / 0).
    pub fn new(cin: usize, cout: usize, kernel: usize, n_groups: usize, device: &B::Device) -> Self {
        let pad = kernel / 2;
        let conv = Conv1dConfig::new(cin, cout, kernel).with_padding(PaddingConfig1d::Explicit(pad, pad)).init(device);
        Self { block: vec![Conv1dBlockLayer::Conv(conv), Conv1dBlockLayer::Norm(GroupNorm::new(n_groups, cout, GROUP_NORM_EPS, device))] }
    }

    /// The norm and the Mish (`block.2`, no parameters) are one node where the backend fuses
    /// them ([`NormAct::Mish`]).
    ///
    /// # Shapes
    /// - x: `[b, in, t]` → `[b, out, t]` (compute dtype)
    pub fn forward(&self, x: Tensor<B, 3>, p: Precision) -> Tensor<B, 3> {
        self.block.iter().fold(x, |h, layer| match layer {
            Conv1dBlockLayer::Conv(c) => conv1d_p(c, h, p),
            Conv1dBlockLayer::Norm(n) => n.forward_act(h, NormAct::Mish),
        })
    }
}

/// `DiffusionConditionalResidualBlock1d`: `conv1`, FiLM from `cond_encoder = Sequential(Mish,
/// Linear)` (scale and bias with `use_film_scale_modulation`, else bias only), `conv2`, plus the
/// input through `residual_conv` (a 1×1 Conv1d when the width changes, else identity).
#[derive(Module, Debug)]
pub struct ConditionalResidualBlock1d<B: Backend> {
    pub conv1: Conv1dBlock<B>,
    /// `[None (Mish), Some(Linear(cond_dim, out·(2 or 1)))]`.
    pub cond_encoder: Vec<Option<Linear<B>>>,
    pub conv2: Conv1dBlock<B>,
    pub residual_conv: Option<Conv1d<B>>,
    pub out_channels: usize,
    pub use_film_scale_modulation: bool,
}

impl<B: LeanBackend> ConditionalResidualBlock1d<B> {
    pub fn new(cin: usize, cout: usize, cond_dim: usize, kernel: usize, n_groups: usize, film_scale: bool, device: &B::Device) -> Self {
        let cond_channels = if film_scale { 2 * cout } else { cout };
        Self {
            conv1: Conv1dBlock::new(cin, cout, kernel, n_groups, device),
            cond_encoder: vec![None, Some(Linear::new(cond_dim, cond_channels, device))],
            conv2: Conv1dBlock::new(cout, cout, kernel, n_groups, device),
            residual_conv: (cin != cout).then(|| Conv1dConfig::new(cin, cout, 1).init(device)),
            out_channels: cout,
            use_film_scale_modulation: film_scale,
        }
    }

    fn cond_linear(&self) -> &Linear<B> {
        self.cond_encoder.iter().flatten().next().expect("cond_encoder holds its Linear")
    }

    /// `mish_cond` is the FiLM input after `cond_encoder.0` (`nn.Mish`): the same tensor for
    /// every block of a UNet, which applies the Mish once (`ConditionalUnet1d::enter`).
    ///
    /// # Shapes
    /// - x: `[b, in, t]` (any dtype); mish_cond: `[b, cond_dim]` → `[b, out, t]` (compute dtype)
    pub fn forward(&self, x: Tensor<B, 3>, mish_cond: Tensor<B, 2>, p: Precision) -> Tensor<B, 3> {
        let out = self.conv1.forward(x.clone(), p);
        let out = if self.use_film_scale_modulation {
            // scale · out + bias, the halves of `embed` broadcast along t: one node on CubeCL,
            // which adds the linear layer's bias too; flex adds it by its own node first.
            let (embed, bias) = self.cond_linear().forward_parts(mish_cond, p); // [b, 2c], [2c]
            crate::nn::lean::film(out, embed, bias)
        } else {
            out + self.cond_linear().forward(mish_cond, p).unsqueeze_dim::<3>(2) // [b, c, 1]
        };
        let out = self.conv2.forward(out, p);
        let residual = match &self.residual_conv {
            Some(conv) => conv1d_p(conv, x, p),
            None => cast(x, p.dtype()),
        };
        out + residual
    }
}

/// numpy's `linspace(-1, 1, n)` (f64: `start + i·step`, last element exactly `stop`).
fn np_linspace_pm1(n: usize) -> Vec<f64> {
    if n == 1 {
        return vec![-1.0];
    }
    let step = 2.0 / (n - 1) as f64;
    let mut v: Vec<f64> = (0..n).map(|i| i as f64 * step - 1.0).collect();
    v[n - 1] = 1.0;
    v
}

/// lerobot's `SpatialSoftmax.pos_grid` for an `h × w` map: `[h·w, 2]` rows `(x_j, y_i)` in
/// row-major `(i, j)` order (`np.meshgrid(linspace(-1, 1, w), linspace(-1, 1, h))`), f32.
pub fn spatial_softmax_pos_grid(h: usize, w: usize) -> Vec<f32> {
    let (xs, ys) = (np_linspace_pm1(w), np_linspace_pm1(h));
    let mut out = Vec::with_capacity(h * w * 2);
    for y in &ys {
        for x in &xs {
            out.push(*x as f32);
            out.push(*y as f32);
        }
    }
    out
}

/// lerobot's `SpatialSoftmax(input_shape, num_kp)`: a 1×1 conv to `num_kp` keypoint maps, a
/// softmax over each map's `h·w` positions (f32), and the expected `(x, y)` under it.
#[derive(Module, Debug)]
pub struct SpatialSoftmax<B: Backend> {
    /// `Conv2d(512, num_kp, 1)`.
    pub nets: Conv2d<B>,
    /// Buffer `[h·w, 2]` (`require_grad = false`; in the state dict, not in `parameters()`).
    pub pos_grid: Param<Tensor<B, 2>>,
}

impl<B: LeanBackend> SpatialSoftmax<B> {
    pub fn new(in_channels: usize, h: usize, w: usize, num_kp: usize, device: &B::Device) -> Self {
        let nets = burn::nn::conv::Conv2dConfig::new([in_channels, num_kp], [1, 1]).init(device);
        let grid = Tensor::<B, 2>::from_data(TensorData::new(spatial_softmax_pos_grid(h, w), [h * w, 2]), device);
        Self { nets, pos_grid: Param::from_tensor(grid).set_require_grad(false) }
    }

    /// # Shapes
    /// - features: `[n, c, h, w]` → keypoints flattened `[n, 2·num_kp]` as `(x₀, y₀, x₁, …)`, f32
    pub fn forward(&self, features: Tensor<B, 4>, p: Precision) -> Tensor<B, 2> {
        let f = conv2d_p(&self.nets, features, p);
        let [n, k, h, w] = f.dims();
        assert_eq!(self.pos_grid.dims()[0], h * w, "SpatialSoftmax: feature map {h}×{w} does not match pos_grid");
        let attention = crate::nn::lean::softmax(to_f32(f).reshape([n * k, h * w]), 1);
        crate::nn::lean::matmul(attention, self.pos_grid.val()).reshape([n, k * 2])
    }
}

/// One axis of PyTorch's antialiased bilinear resize (`_upsample_bilinear2d_aa`, what
/// torchvision `Resize` runs on tensors: `interpolate(mode="bilinear", align_corners=False,
/// antialias=True)`) as an `[output, input]` weight matrix, row-major. Each output pixel is a
/// normalised triangle filter around `scale · (i + 0.5)`, widened by `scale` when shrinking
/// (that is the antialiasing); when enlarging it is plain half-pixel bilinear.
pub fn antialias_bilinear_weights(input: usize, output: usize) -> Vec<f32> {
    let scale = input as f64 / output as f64;
    let (support, inv_scale) = if scale >= 1.0 { (scale, 1.0 / scale) } else { (1.0, 1.0) };
    let mut w = vec![0f32; output * input];
    for i in 0..output {
        let center = scale * (i as f64 + 0.5);
        // C++ `int64_t(center ± support + 0.5)`: truncation (then clamped to the input).
        let lo = ((center - support + 0.5) as i64).max(0) as usize;
        let hi = ((center + support + 0.5) as i64).clamp(0, input as i64) as usize;
        let taps: Vec<f64> = (lo..hi).map(|j| (1.0 - ((j as f64 - center + 0.5) * inv_scale).abs()).max(0.0)).collect();
        let total: f64 = taps.iter().sum();
        for (j, t) in (lo..hi).zip(taps) {
            w[i * input + j] = if total > 0.0 { (t / total) as f32 } else { 0.0 };
        }
    }
    w
}

/// `torchvision.transforms.Resize((h, w))` on a float image batch (bilinear, antialiased), as
/// two matrix products with [`antialias_bilinear_weights`] (separable, as PyTorch computes it;
/// ≤ 1e-5 from torch). Runs in f32.
///
/// # Shapes
/// - images: `[n, c, H, W]` → `[n, c, h, w]`
pub fn resize_bilinear_antialias<B: LeanBackend>(images: Tensor<B, 4>, [h, w]: [usize; 2]) -> Tensor<B, 4> {
    let [n, c, hh, ww] = images.dims();
    if [hh, ww] == [h, w] {
        return images;
    }
    let device = images.device();
    let matrix = |input, output| Tensor::<B, 2>::from_data(TensorData::new(antialias_bilinear_weights(input, output), [output, input]), &device);
    let x = crate::nn::lean::matmul(to_f32(images).reshape([n * c * hh, ww]), matrix(ww, w).transpose()); // [n·c·H, w]
    let x = x.reshape([n * c, hh, w]).swap_dims(1, 2).reshape([n * c * w, hh]); // [n·c·w, H]
    let x = crate::nn::lean::matmul(x, matrix(hh, h).transpose()); // [n·c·w, h]
    x.reshape([n, c, w, h]).swap_dims(2, 3) // [n, c, h, w]
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    type Tb = Flex;

    #[test]
    fn mish_matches_formula_and_is_finite_for_large_inputs() {
        let dev = Default::default();
        let x = Tensor::<Tb, 1>::from_floats([-100.0, -2.0, 0.0, 0.5, 3.0, 100.0], &dev);
        let y: Vec<f32> = mish(x).into_data().to_vec().unwrap();
        for (v, x) in y.iter().zip([-100.0f64, -2.0, 0.0, 0.5, 3.0, 100.0]) {
            let e = x * (1.0 + x.exp()).ln().tanh();
            assert!((*v as f64 - e).abs() < 1e-6, "mish({x}) = {v}, expected {e}");
        }
    }

    #[test]
    fn step_embedding_layout() {
        let e = sinusoidal_step_embedding(&[0, 3], 8);
        assert_eq!(&e[..8], &[0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
        // t = 3, i = 1: f = 10000^(-1/3)
        let f = 10000f64.powf(-1.0 / 3.0);
        assert!((e[8 + 1] as f64 - (3.0 * f).sin()).abs() < 1e-6);
        assert!((e[8 + 4 + 1] as f64 - (3.0 * f).cos()).abs() < 1e-6);
    }

    /// torchvision's `Resize` on tensors (antialiased bilinear), shrinking and enlarging. The
    /// expected values come from torch 2 / torchvision 0.25:
    /// `python -c "import torch, torchvision as tv; x = torch.arange(35.).reshape(1,1,5,7).sin(); print(tv.transforms.Resize((3,4))(x).flatten().tolist())"`
    /// and the same with `torch.arange(6.).reshape(1,1,2,3).cos()` resized to `(3, 5)`.
    #[test]
    fn resize_matches_torchvision() {
        let dev = Default::default();
        let check = |input: Vec<f32>, [h0, w0]: [usize; 2], size: [usize; 2], expected: &[f32]| {
            let x = Tensor::<Tb, 4>::from_data(TensorData::new(input, [1, 1, h0, w0]), &dev);
            let y = resize_bilinear_antialias(x, size);
            assert_eq!(y.dims(), [1, 1, size[0], size[1]]);
            let y: Vec<f32> = y.into_data().to_vec().unwrap();
            for (i, (a, e)) in y.iter().zip(expected).enumerate() {
                assert!((a - e).abs() <= 1e-5, "{size:?} [{i}]: {a} vs torchvision {e}");
            }
        };
        let shrink = [
            0.5684335, 0.5003017, -0.6460201, -0.3637054, 0.698137, -0.2572507, -0.5608515, 0.451262, 0.06060479, -0.7320908, 0.1406793, 0.7703034,
        ];
        check((0..35).map(|i| (i as f32).sin()).collect(), [5, 7], [3, 4], &shrink);
        let enlarge = [
            1.0, 0.8161209, 0.5403023, -0.03356731, -0.4161468, 0.00500375, -0.01966599, -0.05667064, -0.06241366, -0.06624232, -0.9899925, -0.8554529, -0.6536436, -0.09125999, 0.2836622,
        ];
        check((0..6).map(|i| (i as f32).cos()).collect(), [2, 3], [3, 5], &enlarge);
        // Each output row of the weights sums to 1; the same size is the identity.
        let w = antialias_bilinear_weights(96, 84);
        assert!(w.chunks(96).all(|r| (r.iter().sum::<f32>() - 1.0).abs() < 1e-6));
        assert_eq!(antialias_bilinear_weights(3, 3), [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn pos_grid_is_x_then_y_row_major() {
        let g = spatial_softmax_pos_grid(2, 3);
        assert_eq!(g, [-1.0, -1.0, 0.0, -1.0, 1.0, -1.0, -1.0, 1.0, 0.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn conv_block_and_residual_block_shapes() {
        let dev = Default::default();
        let x = Tensor::<Tb, 3>::ones([2, 4, 8], &dev);
        let blk = Conv1dBlock::<Tb>::new(4, 16, 5, 8, &dev);
        assert_eq!(blk.forward(x.clone(), Precision::F32).dims(), [2, 16, 8]);
        let res = ConditionalResidualBlock1d::<Tb>::new(4, 16, 10, 5, 8, true, &dev);
        let cond = Tensor::<Tb, 2>::ones([2, 10], &dev);
        assert_eq!(res.forward(x, cond, Precision::Bf16).dims(), [2, 16, 8]);
    }
}
