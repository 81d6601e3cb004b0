//! Deterministic dropout (`nn.Dropout` in training mode, with masks from a seed).

use burn::prelude::*;
use burn::tensor::TensorPrimitive;

use super::lean::LeanBackend;

pub(crate) mod host;
use host::{flags, host_dropout, splitmix64};

/// Deterministic dropout masks, generated on the host from a seed.
///
/// A mask element is a pure function of `(seed, site, element index)` (a SplitMix64 hash):
/// no RNG state advances, so recomputing a stage for gradient checkpointing reproduces the
/// forward's masks exactly, in any order. Each dropout call site in the model has a fixed
/// `site` number (block, layer, position in the layer, see [`DropoutCtx::site`]); the trainer
/// changes `seed` every step (and micro-batch). Kept elements are scaled by `1 / (1 − rate)`,
/// as `nn.Dropout` in training mode.
///
/// The masks are *not* PyTorch's (different RNG): only their distribution matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropoutCtx {
    pub seed: u64,
}

impl DropoutCtx {
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// The site number of dropout `slot` in layer `layer` of block `block`
    /// (blocks: 0 VAE encoder, 1 encoder, 2 decoder).
    pub fn site(block: u64, layer: usize, slot: u64) -> u64 {
        (block << 40) | ((layer as u64) << 8) | slot
    }

    /// The hash base of `site` and the threshold of `rate`: element `i` is dropped when
    /// `splitmix64(base + i) >> 11 < threshold` (a uniform u in [0, 1) below `rate`).
    pub fn base_threshold(&self, site: u64, rate: f64) -> (u64, u64) {
        (splitmix64(self.seed ^ splitmix64(site)), (rate * (1u64 << 53) as f64) as u64)
    }

    /// Which of `n` elements of `site` are dropped (`true`: set to 0).
    pub fn drop_flags(&self, site: u64, n: usize, rate: f64) -> Vec<bool> {
        // Keep when a uniform u in [0, 1) is >= rate, as Bernoulli(1 - rate).
        let (base, threshold) = self.base_threshold(site, rate);
        flags(base, threshold, n)
    }

    /// Keep-mask values (`0` or `1/(1−rate)`) for `n` elements of `site`.
    pub fn mask_values(&self, site: u64, n: usize, rate: f64) -> Vec<f32> {
        let keep_scale = (1.0 / (1.0 - rate)) as f32;
        self.drop_flags(site, n, rate).into_iter().map(|drop| if drop { 0.0 } else { keep_scale }).collect()
    }

    /// `nn.Dropout(rate)` in training mode at `site`: dropped elements set to 0, the rest scaled
    /// by `1/(1−rate)`. On CubeCL backends one kernel computes the masks on the device and the
    /// backward recomputes them: nothing is uploaded or kept
    /// ([`LeanBackend::lean_dropout`]). Elsewhere the masks are drawn on the host and the mask is
    /// a bool tensor (1 byte per element on flex), which is all the backward keeps
    /// (`mask_fill`'s state), as PyTorch keeps a 1-byte mask; the scaling keeps nothing. Both
    /// give the values of `x · mask_values` (`x · s` for kept elements, 0 otherwise).
    pub fn apply<B: LeanBackend, const D: usize>(&self, x: Tensor<B, D>, site: u64, rate: f64) -> Tensor<B, D> {
        if rate <= 0.0 {
            return x;
        }
        let (base, threshold) = self.base_threshold(site, rate);
        apply_drop(x, base, threshold, 1.0 / (1.0 - rate))
    }
}

/// [`DropoutCtx::apply`] from a site's hash base and threshold and the keep scale: on the
/// device where the backend has the kernel, else with the host's flags. A backward applies it
/// to the gradient with the same arguments (the same elements dropped, the same scale).
pub(crate) fn apply_drop<B: LeanBackend, const D: usize>(x: Tensor<B, D>, base: u64, threshold: u64, scale: f64) -> Tensor<B, D> {
    if drops_on_device::<B>(x.shape().num_elements()) {
        return Tensor::from_primitive(TensorPrimitive::Float(B::lean_dropout(x.into_primitive().tensor(), base, threshold, scale)));
    }
    host_dropout(x, base, threshold, scale)
}

/// Whether the dropout of `n` elements runs on the device ([`LeanBackend::lean_dropout`]'s kernel
/// indexes them with 32 bits); otherwise the host draws the flags.
fn drops_on_device<B: LeanBackend>(n: usize) -> bool {
    B::lean_dropout_on_device() && n <= u32::MAX as usize
}

/// Dropout at `site` when a context is given and the rate is positive; identity otherwise.
pub fn dropout<B: LeanBackend, const D: usize>(x: Tensor<B, D>, ctx: Option<&DropoutCtx>, site: u64, rate: f64) -> Tensor<B, D> {
    match ctx {
        Some(c) if rate > 0.0 => c.apply(x, site, rate),
        _ => x,
    }
}

/// `x + bias` along the last axis ([`crate::nn::lean::bias_add`], the linear layer's own bias
/// node) where there is a bias.
fn add_bias<B: LeanBackend, const D: usize>(x: Tensor<B, D>, bias: Option<Tensor<B, 1>>) -> Tensor<B, D> {
    match bias {
        Some(b) => super::lean::bias_add(x, b),
        None => x,
    }
}

/// Whether `bias` can join a fused node over `x`: along its last axis, in its dtype.
fn bias_joins<B: Backend, const D: usize>(x: &Tensor<B, D>, bias: Option<&Tensor<B, 1>>) -> bool {
    bias.is_none_or(|b| b.dims()[0] == x.dims()[D - 1] && b.dtype() == x.dtype())
}

fn prim<B: Backend, const D: usize>(x: Tensor<B, D>) -> crate::nn::lean::Prim<B> {
    x.into_primitive().tensor()
}

/// `residual + to_f32(dropout(x + bias))` (a transformer's residual add after its dropout, and
/// the bias of the linear layer before it, [`crate::nn::Linear::forward_parts`]; the residual f32,
/// `x` of its shape in any dtype, the bias in `x`'s): one node and, on CubeCL, one launch where
/// the backend fuses it ([`LeanBackend::lean_dropout_add_fuses`]: `x` in f32 too), else the bias
/// node, the dropout, the cast and the add. The same values either way.
pub fn residual_dropout<B: LeanBackend, const D: usize>(residual: Tensor<B, D>, x: Tensor<B, D>, bias: Option<Tensor<B, 1>>, ctx: Option<&DropoutCtx>, site: u64, rate: f64) -> Tensor<B, D> {
    match ctx {
        Some(c) if rate > 0.0 && drops_on_device::<B>(x.shape().num_elements()) && B::lean_dropout_add_fuses(x.dtype(), residual.dtype()) && x.dims() == residual.dims() && bias_joins(&x, bias.as_ref()) => {
            let (base, threshold) = c.base_threshold(site, rate);
            let y = B::lean_dropout_add(prim(x), prim(residual), bias.map(prim), base, threshold, 1.0 / (1.0 - rate));
            Tensor::from_primitive(TensorPrimitive::Float(y))
        }
        _ => residual + super::to_f32(dropout(add_bias(x, bias), ctx, site, rate)),
    }
}

/// `dropout(relu(x + bias))` (a transformer FFN's activation and its dropout, and the bias of the
/// linear layer before them, [`crate::nn::Linear::forward_parts`], in `x`'s dtype): one node and,
/// on CubeCL, one launch each way where the backend fuses it
/// ([`LeanBackend::lean_relu_dropout_fuses`]), else the bias node, the ReLU's node
/// ([`crate::nn::lean::relu`]) and [`dropout`]. The same values either way.
pub fn relu_dropout<B: LeanBackend, const D: usize>(x: Tensor<B, D>, bias: Option<Tensor<B, 1>>, ctx: Option<&DropoutCtx>, site: u64, rate: f64) -> Tensor<B, D> {
    match ctx {
        Some(c) if rate > 0.0 && drops_on_device::<B>(x.shape().num_elements()) && B::lean_relu_dropout_fuses() && bias_joins(&x, bias.as_ref()) => {
            let (base, threshold) = c.base_threshold(site, rate);
            Tensor::from_primitive(TensorPrimitive::Float(B::lean_relu_dropout(prim(x), bias.map(prim), base, threshold, 1.0 / (1.0 - rate))))
        }
        _ => dropout(super::lean::relu(add_bias(x, bias)), ctx, site, rate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    #[test]
    fn dropout_is_deterministic_per_site_and_scaled() {
        let ctx = DropoutCtx::new(7);
        let a = ctx.mask_values(DropoutCtx::site(1, 0, 2), 10_000, 0.25);
        let b = ctx.mask_values(DropoutCtx::site(1, 0, 2), 10_000, 0.25);
        let c = ctx.mask_values(DropoutCtx::site(1, 1, 2), 10_000, 0.25);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let kept = a.iter().filter(|v| **v > 0.0).count() as f64 / a.len() as f64;
        assert!((kept - 0.75).abs() < 0.02, "kept fraction {kept}");
        assert!(a.iter().all(|v| *v == 0.0 || (*v - 4.0 / 3.0).abs() < 1e-6));
        assert_ne!(DropoutCtx::new(8).mask_values(DropoutCtx::site(1, 0, 2), 100, 0.25), a[..100].to_vec());
    }

    type Ad = burn::backend::Autodiff<burn::backend::Flex>;

    /// `f(x)` and the gradient of `sum(f(x) · w)` with respect to `x`, from a fresh leaf `x0`.
    fn value_and_grad(x0: &Tensor<Ad, 3>, w: &Tensor<Ad, 3>, f: &dyn Fn(Tensor<Ad, 3>) -> Tensor<Ad, 3>) -> (TensorData, TensorData) {
        let x = x0.clone().detach().require_grad();
        let y = f(x.clone());
        let g = (y.clone() * w.clone()).sum().backward();
        (y.into_data(), x.grad(&g).unwrap().into_data())
    }

    /// The bool-mask dropout gives the same values and gradients as multiplying by the f32
    /// keep mask (what it replaced), and keeps only the 1-byte mask for the backward.
    #[test]
    fn bool_mask_dropout_equals_the_float_mask_product_with_its_gradient() {
        type B = Ad;
        let dev = Default::default();
        let ctx = DropoutCtx::new(11);
        let site = DropoutCtx::site(2, 3, 1);
        let (rate, dims) = (0.1, [4usize, 7, 33]);
        let x0 = Tensor::<B, 3>::random(dims, burn::tensor::Distribution::Normal(0.0, 1.0), &dev);
        let w = Tensor::<B, 3>::random(dims, burn::tensor::Distribution::Normal(0.0, 1.0), &dev);
        let run = |f: &dyn Fn(Tensor<B, 3>) -> Tensor<B, 3>| value_and_grad(&x0, &w, f);
        let (y_bool, g_bool) = run(&|x| ctx.apply(x, site, rate));
        let n = dims.iter().product();
        let (y_f32, g_f32) = run(&|x| x * Tensor::<B, 3>::from_data(TensorData::new(ctx.mask_values(site, n, rate), dims), &dev));
        y_bool.assert_approx_eq::<f32>(&y_f32, burn::tensor::Tolerance::relative(1e-6));
        g_bool.assert_approx_eq::<f32>(&g_f32, burn::tensor::Tolerance::relative(1e-6));
    }

    /// The dropout node (`LeanBackend::lean_dropout` on autodiff, keeping only the hash base,
    /// threshold and scale; its backward redraws the flags) gives the host path's values and
    /// input gradient exactly.
    #[test]
    fn dropout_node_recomputes_the_masks_in_its_backward() {
        use crate::nn::lean::LeanBackend;
        type B = Ad;
        let dev = Default::default();
        let ctx = DropoutCtx::new(5);
        let site = DropoutCtx::site(1, 2, 3);
        let dims = [3usize, 9, 41];
        let (base, threshold) = ctx.base_threshold(site, 0.2);
        let x0 = Tensor::<B, 3>::random(dims, burn::tensor::Distribution::Normal(0.0, 1.0), &dev);
        let w = Tensor::<B, 3>::random(dims, burn::tensor::Distribution::Normal(0.0, 1.0), &dev);
        let run = |f: &dyn Fn(Tensor<B, 3>) -> Tensor<B, 3>| value_and_grad(&x0, &w, f);
        let node = |x: Tensor<B, 3>| Tensor::from_primitive(TensorPrimitive::Float(B::lean_dropout(x.into_primitive().tensor(), base, threshold, 1.0 / 0.8)));
        let (y_node, g_node) = run(&node);
        let (y_host, g_host) = run(&|x| host_dropout(x, base, threshold, 1.0 / 0.8));
        assert_eq!(y_node, y_host);
        assert_eq!(g_node, g_host);
        assert!(!<B as LeanBackend>::lean_dropout_on_device(), "flex draws the masks on the host");
    }

    /// The FFN's ReLU-and-dropout node (`LeanBackend::lean_relu_dropout` on autodiff, keeping its
    /// output and the scale; the composed forward and backward on flex, as CubeCL's with
    /// `VRAMLAB_COMPOSED_KERNELS=1`) gives the values and input gradient of the ReLU's node, then
    /// the dropout's, exactly; flex's models keep the two nodes (`relu_dropout` does not fuse).
    #[test]
    fn relu_dropout_node_equals_the_relu_then_the_dropout() {
        use crate::nn::lean::LeanBackend;
        type B = Ad;
        let dev = Default::default();
        let ctx = DropoutCtx::new(13);
        let site = DropoutCtx::site(1, 0, 2);
        let (rate, dims) = (0.25, [2usize, 11, 37]);
        let (base, threshold) = ctx.base_threshold(site, rate);
        let x0 = Tensor::<B, 3>::random(dims, burn::tensor::Distribution::Normal(0.0, 1.0), &dev);
        let w = Tensor::<B, 3>::random(dims, burn::tensor::Distribution::Normal(0.0, 1.0), &dev);
        let run = |f: &dyn Fn(Tensor<B, 3>) -> Tensor<B, 3>| value_and_grad(&x0, &w, f);
        let node = |x: Tensor<B, 3>| Tensor::from_primitive(TensorPrimitive::Float(B::lean_relu_dropout(x.into_primitive().tensor(), None, base, threshold, 1.0 / (1.0 - rate))));
        let (y_node, g_node) = run(&node);
        let (y_two, g_two) = run(&|x| ctx.apply(crate::nn::lean::relu(x), site, rate));
        assert_eq!(y_node, y_two);
        assert_eq!(g_node, g_two);
        let ys = y_node.to_vec::<f32>().unwrap();
        assert!(ys.iter().any(|v| *v == 0.0) && ys.iter().any(|v| *v > 0.0));
        assert!(!<B as LeanBackend>::lean_relu_dropout_fuses(), "flex keeps the two nodes");
        let (y_model, g_model) = run(&|x| super::relu_dropout(x, None, Some(&ctx), site, rate));
        assert_eq!((y_model, g_model), (y_two, g_two));
    }
}
