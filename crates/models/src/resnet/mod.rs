//! The torchvision ResNet trunk (`resnet18` / `resnet34`, BasicBlock) natively in Burn,
//! returning the `layer4` feature map (no average pool, no `fc`).
//!
//! Reference: torchvision `models/resnet.py` (`ResNet`, `BasicBlock`, `_make_layer`) and
//! `ops/misc.py` (`FrozenBatchNorm2d`), as lerobot uses them: ACT builds
//! `resnet18(replace_stride_with_dilation=[False, False, dilation], norm_layer=FrozenBatchNorm2d)`
//! and takes `layer4` through `IntermediateLayerGetter`; Diffusion Policy swaps every BatchNorm
//! for `GroupNorm(C // 16, C)`.
//!
//! Field names are torchvision's, so a trunk's weights load by name: `conv1.weight`,
//! `bn1.running_mean`, `layer2.0.downsample.0.weight`, `layer2.0.downsample.1.bias`, … The
//! normalisation is the enum [`Norm2d`] (variant names are not part of parameter names) and a
//! block's `downsample` `nn.Sequential(conv, norm)` is a `Vec` of [`DownsampleLayer`], so the
//! keys are `downsample.0.*` / `downsample.1.*` as in PyTorch. (Diffusion Policy keeps the trunk
//! in an `nn.Sequential` whose keys are `0.weight`, `4.0.conv1.weight`, …:
//! [`torchvision_key_from_sequential`] maps those.)
//!
//! # Parameters and buffers
//! torchvision's `FrozenBatchNorm2d` registers `weight`, `bias`, `running_mean` and
//! `running_var` as *buffers*: they are in the state dict but not in `parameters()`. vramlab
//! stores them as `Param`s (so they load and save by name) with `require_grad = false` (so a
//! trainer gives them no gradient), and counts them apart: [`ResNet::num_parameters`] is
//! PyTorch's `sum(p.numel() for p in parameters())` (11,166,912 for the resnet18 trunk with
//! frozen BN: convolutions only), [`ResNet::num_buffer_elements`] the rest (9,600 = 4 × 2,400
//! channels), and Burn's `Module::num_params` their sum. With GroupNorm the norms' `weight` and
//! `bias` are ordinary trainable parameters (11,176,512 for resnet18).
//!
//! # Mixed precision
//! Convolutions run in the forward's [`Precision`] through [`conv2d_p`] (input and f32 weights
//! cast in-graph); normalisations compute in f32 and return the input's dtype, like
//! [`crate::nn::GroupNorm`]. The feature map comes back in the compute dtype.
//!
//! # Stages
//! [`ResNet::stages`]: the stem (conv1, bn1, ReLU, max-pool), then `layer1` .. `layer4`;
//! [`ResNet::forward`] is the fold of [`ResNet::stage`] over them, and the models that embed
//! the trunk put the same stages in their own stage plans (block checkpointing).
//!
//! [`graph`]: the same ResNet-18 trunk as a shape-only op graph, for the memory estimate.

pub mod graph;
pub mod torch_graph;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Initializer, PaddingConfig2d};
use burn::prelude::*;
use crate::nn::LeanBackend;
use crate::nn::lean::relu;
use burn::tensor::DType;
use burn::tensor::module::max_pool2d;
use serde::{Deserialize, Serialize};

use crate::nn::{GroupNorm, NormAct, Precision, cast, conv2d_p, to_dtype, to_f32};

/// torchvision `FrozenBatchNorm2d`'s default epsilon (also `nn.GroupNorm`'s).
pub const NORM_EPS: f64 = 1e-5;
/// Channels of the `layer4` feature map of resnet18 / resnet34 (`fc.in_features`).
pub const OUT_CHANNELS: usize = 512;
/// Struct name of [`FrozenBatchNorm2d`] as Burn's module visitors report it (container of its
/// tensors): every tensor directly inside is a buffer.
pub const FROZEN_BN_CONTAINER: &str = "Struct:FrozenBatchNorm2d";

/// Which normalisation the trunk uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResNetNorm {
    /// torchvision `FrozenBatchNorm2d` (ACT): fixed affine from running statistics; all four
    /// tensors are buffers (no gradient).
    #[default]
    FrozenBatchNorm,
    /// `nn.GroupNorm(C // 16, C)` (Diffusion Policy's `use_group_norm`): trainable affine.
    GroupNorm,
}

/// torchvision `FrozenBatchNorm2d`: `y = x · scale + shift` with
/// `scale = weight · (running_var + eps)^-½`, `shift = bias − running_mean · scale`
/// (torchvision's own formula, so f32 results match it closely). All four tensors are
/// buffers: `require_grad = false`.
#[derive(Module, Debug)]
pub struct FrozenBatchNorm2d<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub bias: Param<Tensor<B, 1>>,
    pub running_mean: Param<Tensor<B, 1>>,
    pub running_var: Param<Tensor<B, 1>>,
    pub eps: f64,
}

fn buffer<B: LeanBackend>(t: Tensor<B, 1>) -> Param<Tensor<B, 1>> {
    Param::from_tensor(t).set_require_grad(false)
}

impl<B: LeanBackend> FrozenBatchNorm2d<B> {
    /// torchvision's initial state: weight 1, bias 0, running mean 0, running var 1.
    pub fn new(channels: usize, device: &B::Device) -> Self {
        Self {
            weight: buffer(Tensor::ones([channels], device)),
            bias: buffer(Tensor::zeros([channels], device)),
            running_mean: buffer(Tensor::zeros([channels], device)),
            running_var: buffer(Tensor::ones([channels], device)),
            eps: NORM_EPS,
        }
    }

    /// Computed in f32, returned in the input's dtype.
    ///
    /// # Shapes
    /// - x: `[batch, channels, h, w]` → same
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let in_dtype = x.dtype();
        let (scale, shift) = self.scale_shift();
        let y = crate::nn::lean::channel_affine(to_f32(x), scale, Some(shift));
        to_dtype(y, in_dtype)
    }

    /// `(scale, shift)`, `[c]` each, from the four buffers.
    fn scale_shift(&self) -> (Tensor<B, 1>, Tensor<B, 1>) {
        crate::nn::lean::frozen_scale_shift(self.weight.val(), self.bias.val(), self.running_mean.val(), self.running_var.val(), self.eps)
    }

    /// Whether [`FrozenBatchNorm2d::forward_relu`] of an `x` in `dtype` (and a residual in
    /// `residual`) is one node: where the backend fuses it, and with a residual only in f32.
    fn fuses_relu(dtype: DType, residual: Option<DType>) -> bool {
        B::lean_affine_relu_fuses() && residual.is_none_or(|r| dtype == DType::F32 && r == DType::F32)
    }

    /// `relu(self.forward(x) (+ residual))`, the residual in `x`'s dtype. Where the backend
    /// fuses it ([`LeanBackend::lean_affine_relu_fuses`]), one node; the ReLU runs before the
    /// cast back to `x`'s dtype (the same values: rounding keeps the sign), and a residual joins
    /// only in f32 (elsewhere the add and the ReLU follow the norm's node, as without fusion).
    ///
    /// # Shapes
    /// - x, residual: `[batch, channels, h, w]` → same
    pub fn forward_relu(&self, x: Tensor<B, 4>, residual: Option<Tensor<B, 4>>) -> Tensor<B, 4> {
        let in_dtype = x.dtype();
        if !Self::fuses_relu(in_dtype, residual.as_ref().map(|r| r.dtype())) {
            let y = self.forward(x);
            return relu(match residual {
                Some(r) => y + r,
                None => y,
            });
        }
        let (scale, shift) = self.scale_shift();
        let y = crate::nn::lean::channel_affine_relu(to_f32(x), scale, shift, residual);
        to_dtype(y, in_dtype)
    }
}

/// A norm layer of the trunk (the variant name is not part of parameter names).
// Module trees are built once and walked by reference: boxing variants would only add
// indirection (and change nothing Burn saves).
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Norm2d<B: Backend> {
    Frozen(FrozenBatchNorm2d<B>),
    Group(GroupNorm<B>),
}

impl<B: LeanBackend> Norm2d<B> {
    pub fn new(kind: ResNetNorm, channels: usize, device: &B::Device) -> Self {
        match kind {
            ResNetNorm::FrozenBatchNorm => Norm2d::Frozen(FrozenBatchNorm2d::new(channels, device)),
            ResNetNorm::GroupNorm => Norm2d::Group(GroupNorm::new(channels / 16, channels, NORM_EPS, device)),
        }
    }

    /// # Shapes
    /// - x: `[batch, channels, h, w]` → same (input dtype)
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        match self {
            Norm2d::Frozen(n) => n.forward(x),
            Norm2d::Group(n) => n.forward(x),
        }
    }

    /// `relu(self.forward(x))`; GroupNorm's is one node where the backend fuses it
    /// ([`NormAct::Relu`]).
    pub fn forward_relu(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        match self {
            Norm2d::Frozen(n) => n.forward_relu(x, None),
            Norm2d::Group(n) => n.forward_act(x, NormAct::Relu),
        }
    }

    /// Whether `relu(self.forward(x) + residual)` (a block's end, the residual in `x`'s dtype)
    /// is one node for this `x` ([`Norm2d::forward_add_relu`]): the frozen batch norm's
    /// ([`FrozenBatchNorm2d::forward_relu`]) or GroupNorm's ([`GroupNorm::forward_add_relu`])
    /// where the backend fuses it.
    pub fn fuses_add_relu(&self, x: &Tensor<B, 4>) -> bool {
        match self {
            Norm2d::Frozen(_) => FrozenBatchNorm2d::<B>::fuses_relu(x.dtype(), Some(x.dtype())),
            Norm2d::Group(_) => GroupNorm::<B>::fuses_add_relu(x.dtype()),
        }
    }

    /// `relu(self.forward(x) + residual)`, one node where [`Norm2d::fuses_add_relu`].
    pub fn forward_add_relu(&self, x: Tensor<B, 4>, residual: Tensor<B, 4>) -> Tensor<B, 4> {
        match self {
            Norm2d::Frozen(n) => n.forward_relu(x, Some(residual)),
            Norm2d::Group(n) => n.forward_add_relu(x, residual),
        }
    }
}

/// One entry of a block's `downsample = nn.Sequential(conv1x1, norm)`.
#[derive(Module, Debug)]
pub enum DownsampleLayer<B: Backend> {
    Conv(Conv2d<B>),
    Norm(Norm2d<B>),
}

/// torchvision `BasicBlock` (expansion 1).
#[derive(Module, Debug)]
pub struct BasicBlock<B: Backend> {
    pub conv1: Conv2d<B>,
    pub bn1: Norm2d<B>,
    pub conv2: Conv2d<B>,
    pub bn2: Norm2d<B>,
    /// `[conv1x1(stride), norm]` when the block changes width or stride, else empty.
    pub downsample: Vec<DownsampleLayer<B>>,
}

/// torchvision's convolutions: no bias, Kaiming-normal (fan_out, ReLU gain) initialisation.
fn conv<B: LeanBackend>(cin: usize, cout: usize, kernel: usize, stride: usize, dilation: usize, device: &B::Device) -> Conv2d<B> {
    // conv3x3: padding = dilation; conv1x1: 0; conv1 (7x7): 3.
    let pad = dilation * (kernel - 1) / 2;
    Conv2dConfig::new([cin, cout], [kernel, kernel])
        .with_stride([stride, stride])
        .with_dilation([dilation, dilation])
        .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
        .with_bias(false)
        .with_initializer(Initializer::KaimingNormal { gain: 2f64.sqrt(), fan_out_only: true })
        .init(device)
}

impl<B: LeanBackend> BasicBlock<B> {
    /// `dilation` applies to both 3×3 convolutions (torchvision's BasicBlock itself rejects
    /// dilation > 1, see [`ResNetConfig::replace_final_stride_with_dilation`]).
    pub fn new(cin: usize, cout: usize, stride: usize, dilation: usize, norm: ResNetNorm, device: &B::Device) -> Self {
        let downsample = if stride != 1 || cin != cout {
            vec![DownsampleLayer::Conv(conv(cin, cout, 1, stride, 1, device)), DownsampleLayer::Norm(Norm2d::new(norm, cout, device))]
        } else {
            Vec::new()
        };
        Self {
            conv1: conv(cin, cout, 3, stride, dilation, device),
            bn1: Norm2d::new(norm, cout, device),
            conv2: conv(cout, cout, 3, 1, dilation, device),
            bn2: Norm2d::new(norm, cout, device),
            downsample,
        }
    }

    /// # Shapes
    /// - x: `[batch, in, h, w]` → `[batch, out, h/stride, w/stride]` (compute dtype)
    pub fn forward(&self, x: Tensor<B, 4>, p: Precision) -> Tensor<B, 4> {
        let out = self.bn1.forward_relu(conv2d_p(&self.conv1, x.clone(), p));
        let out = conv2d_p(&self.conv2, out, p);
        let shortcut = |x: Tensor<B, 4>| {
            let identity = self.downsample.iter().fold(x, |h, layer| match layer {
                DownsampleLayer::Conv(c) => conv2d_p(c, h, p),
                DownsampleLayer::Norm(n) => n.forward(h),
            });
            cast(identity, p.dtype())
        };
        if self.bn2.fuses_add_relu(&out) {
            let identity = shortcut(x);
            self.bn2.forward_add_relu(out, identity)
        } else {
            // torchvision's order: `bn2`, then the downsampling shortcut.
            let out = self.bn2.forward(out);
            relu(out + shortcut(x))
        }
    }
}

/// Architecture of a trunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResNetConfig {
    /// BasicBlocks per stage: `[2, 2, 2, 2]` (resnet18) or `[3, 4, 6, 3]` (resnet34).
    pub blocks: [usize; 4],
    pub norm: ResNetNorm,
    /// torchvision's `replace_stride_with_dilation=[False, False, True]`: `layer4` keeps stride 1
    /// (its downsample is a stride-1 1×1 conv) and its later blocks use dilation 2, so the
    /// feature map is 1/16 of the input instead of 1/32. **torchvision raises
    /// `NotImplementedError("Dilation > 1 not supported in BasicBlock")` for this on resnet18/34**;
    /// vramlab implements the natural extension (both 3×3 convs of the dilated blocks get
    /// dilation 2 and padding 2, as Bottleneck's 3×3 does), so no reference weights exist for it.
    pub replace_final_stride_with_dilation: bool,
}

impl ResNetConfig {
    pub fn resnet18(norm: ResNetNorm) -> Self {
        Self { blocks: [2, 2, 2, 2], norm, replace_final_stride_with_dilation: false }
    }

    pub fn resnet34(norm: ResNetNorm) -> Self {
        Self { blocks: [3, 4, 6, 3], norm, replace_final_stride_with_dilation: false }
    }

    /// `"resnet18"` or `"resnet34"` (the BasicBlock variants); `None` otherwise.
    pub fn from_name(name: &str, norm: ResNetNorm) -> Option<Self> {
        match name {
            "resnet18" => Some(Self::resnet18(norm)),
            "resnet34" => Some(Self::resnet34(norm)),
            _ => None,
        }
    }

    pub fn with_dilation(mut self, replace_final_stride_with_dilation: bool) -> Self {
        self.replace_final_stride_with_dilation = replace_final_stride_with_dilation;
        self
    }

    /// Width of stage `i` (0-based): 64, 128, 256, 512.
    pub fn stage_channels(i: usize) -> usize {
        64 << i
    }

    /// `(stride, dilation)` of stage `i`'s first block, and the dilation of its other blocks.
    fn stage_geometry(&self, i: usize) -> (usize, usize, usize) {
        match i {
            0 => (1, 1, 1),
            3 if self.replace_final_stride_with_dilation => (1, 1, 2),
            _ => (2, 1, 1),
        }
    }

    pub fn init<B: LeanBackend>(&self, device: &B::Device) -> ResNet<B> {
        let mut cin = 64;
        let mut stages: Vec<Vec<BasicBlock<B>>> = (0..4)
            .map(|i| {
                let cout = Self::stage_channels(i);
                let (stride, first_dilation, dilation) = self.stage_geometry(i);
                
                (0..self.blocks[i])
                    .map(|j| {
                        let block = if j == 0 {
                            BasicBlock::new(cin, cout, stride, first_dilation, self.norm, device)
                        } else {
                            BasicBlock::new(cout, cout, 1, dilation, self.norm, device)
                        };
                        cin = cout;
                        block
                    })
                    .collect()
            })
            .collect();
        let layer4 = stages.pop().unwrap_or_default();
        let layer3 = stages.pop().unwrap_or_default();
        let layer2 = stages.pop().unwrap_or_default();
        let layer1 = stages.pop().unwrap_or_default();
        ResNet {
            conv1: conv(3, 64, 7, 2, 1, device),
            bn1: Norm2d::new(self.norm, 64, device),
            layer1,
            layer2,
            layer3,
            layer4,
        }
    }

    /// PyTorch's `sum(p.numel() for p in parameters())` of the trunk (no `fc`): convolutions,
    /// plus the norms' affine with GroupNorm (FrozenBatchNorm2d's tensors are buffers).
    pub fn num_parameters(&self) -> usize {
        let (convs, norm_channels) = self.conv_and_norm_sizes();
        match self.norm {
            ResNetNorm::FrozenBatchNorm => convs,
            ResNetNorm::GroupNorm => convs + 2 * norm_channels,
        }
    }

    /// Elements of buffers (in the state dict, not in `parameters()`): FrozenBatchNorm2d's
    /// weight, bias, running_mean, running_var; none with GroupNorm.
    pub fn num_buffer_elements(&self) -> usize {
        match self.norm {
            ResNetNorm::FrozenBatchNorm => 4 * self.conv_and_norm_sizes().1,
            ResNetNorm::GroupNorm => 0,
        }
    }

    /// (conv weight elements, total norm channels).
    fn conv_and_norm_sizes(&self) -> (usize, usize) {
        let mut convs = 64 * 3 * 49;
        let mut norms = 64;
        let mut cin = 64;
        for i in 0..4 {
            let cout = Self::stage_channels(i);
            for j in 0..self.blocks[i] {
                let (stride, ..) = self.stage_geometry(i);
                let (bin, bstride) = if j == 0 { (cin, stride) } else { (cout, 1) };
                convs += cout * bin * 9 + cout * cout * 9;
                norms += 2 * cout;
                if bstride != 1 || bin != cout {
                    convs += cout * bin;
                    norms += cout;
                }
            }
            cin = cout;
        }
        (convs, norms)
    }

    /// Spatial size `[h, w]` of the `layer4` map for an `[.., h, w]` input.
    pub fn feature_size(&self, h: usize, w: usize) -> [usize; 2] {
        let down = |n: usize| (n - 1) / 2 + 1; // k3/s2/p1 conv or pool; also k7/s2/p3
        let stages = if self.replace_final_stride_with_dilation { 2 } else { 3 };
        let mut s = [down(down(h)), down(down(w))];
        for _ in 0..stages {
            s = [down(s[0]), down(s[1])];
        }
        s
    }
}

/// The trunk: conv1, bn1, ReLU, max-pool, layer1..layer4.
#[derive(Module, Debug)]
pub struct ResNet<B: Backend> {
    pub conv1: Conv2d<B>,
    pub bn1: Norm2d<B>,
    pub layer1: Vec<BasicBlock<B>>,
    pub layer2: Vec<BasicBlock<B>>,
    pub layer3: Vec<BasicBlock<B>>,
    pub layer4: Vec<BasicBlock<B>>,
}

/// A stage of the trunk: the stem, or stage `i` (0-based: `Layer(0)` runs `layer1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResNetStage {
    Stem,
    Layer(usize),
}

impl<B: LeanBackend> ResNet<B> {
    /// The stages: the stem, then `layer1` .. `layer4`. [`ResNet::forward`] is their fold.
    pub fn stages(&self) -> Vec<ResNetStage> {
        std::iter::once(ResNetStage::Stem).chain((0..self.layers().len()).map(ResNetStage::Layer)).collect()
    }

    /// Run stage `s`.
    ///
    /// # Shapes
    /// - `Stem`: `[batch, 3, h, w]` → `[batch, 64, ⌈h/4⌉, ⌈w/4⌉]`
    /// - `Layer(i)`: `[batch, c_i, h, w]` → `[batch, 64·2^i, h/s, w/s]` (`s` = 1 for `i = 0`,
    ///   else 2; 1 for a dilated `layer4`)
    pub fn stage(&self, s: ResNetStage, x: Tensor<B, 4>, p: Precision) -> Tensor<B, 4> {
        match s {
            ResNetStage::Stem => self.stem(x, p),
            ResNetStage::Layer(i) => self.layer(i, x, p),
        }
    }

    /// conv1 (7×7, stride 2), bn1, ReLU, max-pool (3×3, stride 2, padding 1).
    ///
    /// # Shapes
    /// - x: `[batch, 3, h, w]` → `[batch, 64, ⌈h/4⌉, ⌈w/4⌉]` (compute dtype)
    fn stem(&self, x: Tensor<B, 4>, p: Precision) -> Tensor<B, 4> {
        let h = self.bn1.forward_relu(conv2d_p(&self.conv1, x, p));
        max_pool2d(h, [3, 3], [2, 2], [1, 1], [1, 1], false)
    }

    /// The blocks of `layer1` .. `layer4`.
    pub fn layers(&self) -> [&[BasicBlock<B>]; 4] {
        [&self.layer1, &self.layer2, &self.layer3, &self.layer4]
    }

    /// Blocks of stage `i` (0-based: `0` is `layer1`).
    pub fn blocks(&self, i: usize) -> &[BasicBlock<B>] {
        self.layers().get(i).copied().unwrap_or_else(|| panic!("ResNet: stage {i} out of range (layer1..layer4)"))
    }

    fn layer(&self, i: usize, x: Tensor<B, 4>, p: Precision) -> Tensor<B, 4> {
        self.blocks(i).iter().fold(x, |h, block| block.forward(h, p))
    }

    /// The fold over [`ResNet::stages`]: the `layer4` feature map.
    ///
    /// # Shapes
    /// - x: `[batch, 3, h, w]` → `[batch, 512, h', w']`, see [`ResNetConfig::feature_size`]
    pub fn forward(&self, x: Tensor<B, 4>, p: Precision) -> Tensor<B, 4> {
        self.stages().into_iter().fold(x, |h, s| self.stage(s, h, p))
    }

    /// The same trunk with every tensor `require_grad = false` (a frozen backbone: the
    /// trainer computes no gradient for it; gradients still flow *through* it to the input).
    pub fn frozen(self) -> Self {
        self.no_grad()
    }

    /// PyTorch's `parameters()` count (buffers excluded), by visiting the module.
    pub fn num_parameters(&self) -> usize {
        count_params_and_buffers::<B, _>(self, is_frozen_bn_buffer).0
    }

    /// Elements of buffers (FrozenBatchNorm2d tensors).
    pub fn num_buffer_elements(&self) -> usize {
        count_params_and_buffers::<B, _>(self, is_frozen_bn_buffer).1
    }
}

/// The buffer rule of the trunk: every tensor directly inside a [`FrozenBatchNorm2d`].
pub fn is_frozen_bn_buffer(container: &str, _field: &str) -> bool {
    container == FROZEN_BN_CONTAINER
}

/// `(parameter elements, buffer elements)` of a module, where `is_buffer(container, field)`
/// says which tensors PyTorch registers as buffers (`container` is Burn's
/// `"Struct:<Name>"` of the struct holding the tensor, `field` its field name).
pub fn count_params_and_buffers<B: LeanBackend, M: Module<B>>(module: &M, is_buffer: impl Fn(&str, &str) -> bool) -> (usize, usize) {
    struct Count<F> {
        stack: Vec<(String, String)>,
        is_buffer: F,
        params: usize,
        buffers: usize,
    }
    impl<B: Backend, F: Fn(&str, &str) -> bool> ModuleVisitor<B> for Count<F> {
        fn enter_module(&mut self, name: &str, container: &str) {
            self.stack.push((name.to_string(), container.to_string()));
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.stack.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let n = param.shape().num_elements();
            let buffer = self.stack.last().is_some_and(|(field, container)| (self.is_buffer)(container, field));
            if buffer {
                self.buffers += n;
            } else {
                self.params += n;
            }
        }
    }
    let mut c = Count { stack: Vec::new(), is_buffer, params: 0, buffers: 0 };
    module.visit(&mut c);
    (c.params, c.buffers)
}

/// Set `require_grad` of every float tensor: `false` for buffers (`is_buffer(container, field)`)
/// and for tensors whose module path starts with one of `frozen_prefixes` (e.g. `"backbone"`),
/// `true` for the rest. Use after `AutodiffModule::from_inner` (which leaves everything
/// `require_grad = false`) or to freeze / unfreeze parts. Paths leave enum variants out, as
/// [`crate::weights`] names them.
pub fn set_trainable<B: LeanBackend, M: Module<B>>(module: M, is_buffer: impl Fn(&str, &str) -> bool, frozen_prefixes: &[&str]) -> M {
    struct Mark<'a, F> {
        path: crate::weights::PathStack,
        last: Vec<(String, String)>,
        is_buffer: F,
        frozen: &'a [&'a str],
    }
    impl<B: Backend, F: Fn(&str, &str) -> bool> ModuleMapper<B> for Mark<'_, F> {
        fn enter_module(&mut self, name: &str, container: &str) {
            self.path.enter(name, container);
            self.last.push((name.to_string(), container.to_string()));
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.exit();
            self.last.pop();
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let buffer = self.last.last().is_some_and(|(field, container)| (self.is_buffer)(container, field));
            let path = self.path.current();
            let frozen = self.frozen.iter().any(|p| path == *p || path.starts_with(&format!("{p}.")));
            let (id, tensor, mapper) = param.consume();
            let tensor = tensor.set_require_grad(!(buffer || frozen));
            Param::from_mapped_value(id, tensor, mapper)
        }
    }
    let mut m = Mark { path: Default::default(), last: Vec::new(), is_buffer, frozen: frozen_prefixes };
    module.map(&mut m)
}

/// A torchvision ResNet state-dict key the trunk does not hold: the classifier (`fc.*`, the
/// trunk stops at `layer4`) and BatchNorm's step counters (`*.num_batches_tracked`).
pub fn is_unused_torchvision_key(key: &str) -> bool {
    key.starts_with("fc.") || key.ends_with(".num_batches_tracked")
}

/// Load a torchvision ResNet state dict saved as safetensors (`resnet18(weights=…)
/// .state_dict()` through `safetensors.torch.save_file`) into the trunk: the names are
/// torchvision's, so they map unchanged; `fc.*` and `num_batches_tracked` are skipped
/// ([`is_unused_torchvision_key`]); any other missing, misshapen or extra key is an error
/// naming the file and the key. BatchNorm's `weight`/`bias`/`running_*` fill the
/// FrozenBatchNorm2d buffers (what torchvision's `FrozenBatchNorm2d` loads too);
/// `require_grad` flags are kept.
pub fn load_torchvision_weights<B: LeanBackend>(trunk: ResNet<B>, path: &std::path::Path) -> Result<ResNet<B>, crate::weights::WeightError> {
    crate::weights::load_safetensors(trunk, path, |k| (!is_unused_torchvision_key(k)).then(|| k.to_string()))
}

/// Map a key of a trunk kept as `nn.Sequential(*list(resnet.children())[:-2])` (Diffusion
/// Policy: `0.weight`, `1.running_mean`, `4.0.conv1.weight`, …) to torchvision's name
/// (`conv1.weight`, `bn1.running_mean`, `layer1.0.conv1.weight`). Children 2 (ReLU) and 3
/// (max-pool) have no tensors. Other keys are returned unchanged.
pub fn torchvision_key_from_sequential(key: &str) -> String {
    let (head, rest) = key.split_once('.').unwrap_or((key, ""));
    let name = match head {
        "0" => "conv1",
        "1" => "bn1",
        "4" => "layer1",
        "5" => "layer2",
        "6" => "layer3",
        "7" => "layer4",
        _ => return key.to_string(),
    };
    if rest.is_empty() { name.to_string() } else { format!("{name}.{rest}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::Distribution;
    use crate::weights::param_shapes;

    type Tb = Flex;

    #[test]
    fn resnet18_counts_match_torchvision() {
        let frozen = ResNetConfig::resnet18(ResNetNorm::FrozenBatchNorm);
        // torchvision resnet18: 11,689,512 parameters with fc (513,000): trunk 11,176,512,
        // of which 9,600 are BatchNorm affine (4,800 channels) — buffers when frozen.
        assert_eq!(frozen.num_parameters(), 11_166_912);
        assert_eq!(frozen.num_buffer_elements(), 4 * 4_800);
        let gn = ResNetConfig::resnet18(ResNetNorm::GroupNorm);
        assert_eq!(gn.num_parameters(), 11_176_512);
        assert_eq!(gn.num_buffer_elements(), 0);
        // torchvision resnet34: 21,797,672 with fc.
        assert_eq!(ResNetConfig::resnet34(ResNetNorm::GroupNorm).num_parameters(), 21_797_672 - 513_000);

        let dev = Default::default();
        let m = frozen.init::<Tb>(&dev);
        assert_eq!(m.num_parameters(), 11_166_912);
        assert_eq!(m.num_buffer_elements(), 19_200);
        assert_eq!(m.num_params(), 11_166_912 + 19_200);
        let g = gn.init::<Tb>(&dev);
        assert_eq!((g.num_parameters(), g.num_buffer_elements()), (11_176_512, 0));
    }

    #[test]
    fn names_are_torchvision_names() {
        let m = ResNetConfig::resnet18(ResNetNorm::FrozenBatchNorm).init::<Tb>(&Default::default());
        let names: Vec<String> = param_shapes::<Tb, _>(&m).into_iter().map(|(k, _)| k).collect();
        for k in [
            "conv1.weight",
            "bn1.running_var",
            "layer1.0.conv1.weight",
            "layer1.1.bn2.bias",
            "layer2.0.downsample.0.weight",
            "layer2.0.downsample.1.running_mean",
            "layer4.1.conv2.weight",
        ] {
            assert!(names.iter().any(|n| n == k), "missing {k}");
        }
        assert!(!names.iter().any(|n| n.starts_with("layer1.0.downsample")));
        // 20 convs (incl. 3 downsample convs) + 20 norms × 4 tensors.
        assert_eq!(names.len(), 20 + 20 * 4);
    }

    /// A torchvision state dict (random values under torchvision's names, plus `fc.*` and the
    /// int64 `num_batches_tracked` counters a real `resnet18().state_dict()` holds) loads into
    /// the frozen-BN trunk; a missing file names the path.
    #[test]
    fn torchvision_state_dict_loads_by_name() {
        let dev = Default::default();
        let source = ResNetConfig::resnet18(ResNetNorm::FrozenBatchNorm).init::<Tb>(&dev);
        let mut tensors: Vec<(String, Vec<u8>, Vec<usize>, safetensors::Dtype)> = crate::weights::named_tensors::<Tb, _>(&source)
            .into_iter()
            .map(|(k, d)| (k, d.as_bytes().to_vec(), d.shape.to_vec(), safetensors::Dtype::F32))
            .collect();
        tensors.push(("fc.weight".into(), vec![0; 1000 * 512 * 4], vec![1000, 512], safetensors::Dtype::F32));
        tensors.push(("fc.bias".into(), vec![0; 1000 * 4], vec![1000], safetensors::Dtype::F32));
        tensors.push(("bn1.num_batches_tracked".into(), 7i64.to_le_bytes().to_vec(), vec![], safetensors::Dtype::I64));
        let views: Vec<_> = tensors.iter().map(|(k, b, s, t)| (k.clone(), safetensors::tensor::TensorView::new(*t, s.clone(), b).unwrap())).collect();
        let dir = vramlab_testkit::temp_dir("resnet18-tv");
        let path = dir.join("resnet18.safetensors");
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();

        let target = ResNetConfig::resnet18(ResNetNorm::FrozenBatchNorm).init::<Tb>(&dev).frozen();
        let loaded = load_torchvision_weights(target, &path).unwrap();
        let get = |m: &ResNet<Tb>, key: &str| crate::weights::named_tensors::<Tb, _>(m).into_iter().find(|(k, _)| k == key).unwrap().1;
        for key in ["conv1.weight", "layer3.1.conv2.weight", "layer2.0.downsample.1.running_var"] {
            assert_eq!(get(&loaded, key), get(&source, key), "{key}");
        }
        assert!(!loaded.conv1.weight.is_require_grad(), "require_grad flags are kept");

        let missing = std::path::Path::new("/nonexistent/resnet18.safetensors");
        let err = load_torchvision_weights(ResNetConfig::resnet18(ResNetNorm::FrozenBatchNorm).init::<Tb>(&dev), missing).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/resnet18.safetensors"), "{err}");
    }

    #[test]
    fn sequential_keys_map_to_torchvision() {
        assert_eq!(torchvision_key_from_sequential("0.weight"), "conv1.weight");
        assert_eq!(torchvision_key_from_sequential("1.bias"), "bn1.bias");
        assert_eq!(torchvision_key_from_sequential("7.1.bn2.weight"), "layer4.1.bn2.weight");
        assert_eq!(torchvision_key_from_sequential("fc.weight"), "fc.weight");
    }

    #[test]
    fn stages_equal_forward_and_shapes() {
        let dev = Default::default();
        let cfg = ResNetConfig::resnet18(ResNetNorm::GroupNorm);
        let m = cfg.init::<Tb>(&dev);
        let x = Tensor::<Tb, 4>::random([1, 3, 40, 56], Distribution::Normal(0.0, 1.0), &dev);
        let y = m.forward(x.clone(), Precision::F32);
        assert_eq!(y.dims()[2..], cfg.feature_size(40, 56));
        assert_eq!(y.dims(), [1, 512, 2, 2]);
        let stages = m.stages();
        assert_eq!(stages, [ResNetStage::Stem, ResNetStage::Layer(0), ResNetStage::Layer(1), ResNetStage::Layer(2), ResNetStage::Layer(3)]);
        let h = m.stage(ResNetStage::Stem, x.clone(), Precision::F32);
        assert_eq!(h.dims(), [1, 64, 10, 14]);

        let dil = cfg.clone().with_dilation(true);
        let md = dil.init::<Tb>(&dev);
        assert_eq!(md.num_parameters(), cfg.num_parameters(), "dilation changes no shapes");
        let yd = md.forward(x, Precision::F32);
        assert_eq!(yd.dims()[2..], dil.feature_size(40, 56));
        assert_eq!(yd.dims(), [1, 512, 3, 4]);
    }

    #[test]
    fn frozen_bn_matches_formula() {
        let dev = Default::default();
        let mut bn = FrozenBatchNorm2d::<Tb>::new(2, &dev);
        bn.weight = buffer(Tensor::from_floats([2.0, 0.5], &dev));
        bn.bias = buffer(Tensor::from_floats([1.0, -1.0], &dev));
        bn.running_mean = buffer(Tensor::from_floats([0.5, 2.0], &dev));
        bn.running_var = buffer(Tensor::from_floats([4.0, 0.25], &dev));
        let x = Tensor::<Tb, 1>::from_floats([1.0, 3.0], &dev).reshape([1, 2, 1, 1]);
        let y: Vec<f32> = bn.forward(x).into_data().to_vec().unwrap();
        let expect = |x: f64, m: f64, v: f64, w: f64, b: f64| ((x - m) / (v + 1e-5).sqrt() * w + b) as f32;
        assert!((y[0] - expect(1.0, 0.5, 4.0, 2.0, 1.0)).abs() < 1e-6);
        assert!((y[1] - expect(3.0, 2.0, 0.25, 0.5, -1.0)).abs() < 1e-6);
    }
}
