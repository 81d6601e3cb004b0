//! Parameters and saved activations of a torchvision-layout ResNet with basic blocks.
//!
//! Layout: conv1 7×7/2 → BN → ReLU → max-pool 3×3/2 → four stages of basic blocks (64, 128,
//! 256, 512 channels; stages 2–4 start with stride 2 and a 1×1/2 conv + BN shortcut).
//!
//! Saved for backward, per image (`N_k` = output pixels at stride `k`, `⌈H/k⌉·⌈W/k⌉`):
//! the input image (conv1's input), each ReLU's output (which is also the next conv's input),
//! the max-pool's output and its int64 indices, and, with trainable BatchNorm, each BN's input
//! (a conv output). FrozenBatchNorm2d (`x·scale + shift` with buffers) saves nothing.
//! Per basic block: 2 ReLU outputs (+2 BN inputs, +1 for the shortcut's BN).
//!
//! Under autocast with FrozenBatchNorm2d, `x·scale + shift` multiplies the bf16 conv output
//! by f32 buffers, so type promotion makes every BN / ReLU / residual map f32, and each conv
//! saves its own bf16 copy of the f32 map it reads (autocast caches casts of weights only):
//! 4 + 2 bytes per element of a map a conv reads.

use crate::config::{ActPrecision, ResnetDims};

fn stages(depth: u64) -> [u64; 4] {
    if depth == 34 {
        [3, 4, 6, 3]
    } else {
        [2, 2, 2, 2]
    }
}

const WIDTHS: [u64; 4] = [64, 128, 256, 512];

/// Parameters (convs, BN affine unless frozen, fc unless dropped).
pub fn params(r: &ResnetDims) -> u64 {
    let in_ch = r.images.first().map_or(3, |i| i[0]);
    let bn = |c: u64| if r.frozen_bn { 0 } else { 2 * c };
    let mut n = in_ch * 64 * 49 + bn(64);
    let mut cin = 64;
    for (stage, &blocks) in stages(r.depth).iter().enumerate() {
        let c = WIDTHS[stage];
        for block in 0..blocks {
            n += cin * c * 9 + bn(c) + c * c * 9 + bn(c);
            if block == 0 && cin != c {
                n += cin * c + bn(c);
            }
            cin = c;
        }
    }
    if !r.no_fc {
        n += 512 * 1000 + 1000;
    }
    n
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// Elements one image keeps for backward, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ImageActs {
    /// The input image (conv1's input).
    pub image: f64,
    /// ReLU / max-pool outputs (and BN inputs with trainable BN).
    pub maps: f64,
    /// Maps a convolution reads, i.e. what autocast copies to half precision per conv when the
    /// maps are f32 (FrozenBatchNorm's f32 buffers promote its bf16 input to f32).
    pub conv_reads: f64,
    /// int64 max-pool indices.
    pub indices: f64,
}

impl ImageActs {
    /// Bytes under `precision` (see the module docs for the autocast + FrozenBN case).
    pub fn bytes(&self, precision: ActPrecision, frozen_bn: bool) -> f64 {
        let p = precision.compute_bytes();
        if precision.is_autocast() && frozen_bn {
            self.image * p + self.maps * 4.0 + self.conv_reads * p + self.indices * 8.0
        } else {
            (self.image + self.maps) * p + self.indices * 8.0
        }
    }
}

/// What one image keeps for backward.
pub fn image_acts(r: &ResnetDims, image: [u64; 3]) -> ImageActs {
    let [c, h, w] = image;
    let n = |k: u64| (ceil_div(h, k) * ceil_div(w, k)) as f64;
    let bn_saves = if r.frozen_bn { 0.0 } else { 1.0 };
    let mut a = ImageActs {
        image: (c * h * w) as f64,
        indices: 64.0 * n(4),
        ..ImageActs::default()
    };
    a.maps += 64.0 * n(2) * (1.0 + bn_saves); // stem ReLU output (+ BN input), max-pool input
    a.maps += 64.0 * n(4); // max-pool output
    a.conv_reads += 64.0 * n(4);
    let mut prev = 64.0 * n(4); // the current stage's input map
    for (stage, &blocks) in stages(r.depth).iter().enumerate() {
        let ch = WIDTHS[stage] as f64;
        let px = n(4 << stage);
        a.maps += blocks as f64 * ch * px * (2.0 + 2.0 * bn_saves);
        // Each block's conv2 reads its ReLU output; the next block (or the projection after
        // layer4) reads its output.
        a.conv_reads += blocks as f64 * 2.0 * ch * px;
        if stage > 0 {
            a.maps += ch * px * bn_saves; // shortcut BN input
            a.conv_reads += prev; // the shortcut conv reads the stage input again
        }
        prev = ch * px;
    }
    a
}

/// Tokens of layer4's feature map (stride 32) per sample, summed over the cameras.
pub fn feature_tokens(r: &ResnetDims) -> u64 {
    r.images
        .iter()
        .map(|&[_, h, w]| ceil_div(h, 32) * ceil_div(w, 32))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torchvision_resnet_counts() {
        let r = |depth, frozen_bn, no_fc| ResnetDims {
            depth,
            images: vec![[3, 224, 224]],
            frozen_bn,
            no_fc,
        };
        assert_eq!(params(&r(18, false, false)), 11_689_512);
        assert_eq!(params(&r(34, false, false)), 21_797_672);
        assert_eq!(params(&r(18, false, true)), 11_176_512);
        // lerobot ACT: FrozenBatchNorm2d's 9,600 affine values are buffers.
        assert_eq!(params(&r(18, true, true)), 11_166_912);
    }

    #[test]
    fn tokens_are_ceil_over_32() {
        let r = ResnetDims {
            depth: 18,
            images: vec![[3, 360, 640], [3, 480, 640], [3, 480, 640]],
            frozen_bn: true,
            no_fc: true,
        };
        assert_eq!(feature_tokens(&r), 12 * 20 + 2 * 15 * 20);
    }
}
