//! Camera-frame preprocessing: resize and lerobot's `image_transforms` augmentations.
//!
//! Frames are `[T, 3, H, W]` f32 in `[0, 1]` (as [`crate::LeRobotDataset::sample`] gives them).
//! The augmentations follow lerobot 0.4.4's `ImageTransformsConfig` defaults: a random subset
//! of `max_num_transforms` among brightness (0.8–1.2), contrast (0.8–1.2), saturation
//! (0.5–1.5), hue (±0.05), sharpness (0.5–1.5) and affine (±5°, ±5 % translation), drawn by
//! weight without replacement, applied in list order (or random order), with one set of
//! parameters for all `T` frames of a sample — torchvision's `ColorJitter` /
//! `adjust_sharpness` / `RandomAffine` formulas on float images.

use rand::Rng;
use serde::{Deserialize, Serialize};

/// lerobot's `ImageTransformsConfig` (with its default transform list).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImageTransformsConfig {
    pub enable: bool,
    pub max_num_transforms: usize,
    pub random_order: bool,
    /// Sampling weight per transform (0 disables it): brightness, contrast, saturation, hue,
    /// sharpness, affine.
    pub weights: [f64; 6],
}

impl Default for ImageTransformsConfig {
    fn default() -> Self {
        Self { enable: false, max_num_transforms: 3, random_order: false, weights: [1.0; 6] }
    }
}

/// The six transforms, in lerobot's order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Transform {
    Brightness(f32),
    Contrast(f32),
    Saturation(f32),
    Hue(f32),
    Sharpness(f32),
    /// Rotation in degrees, translation in pixels (x, y).
    Affine(f32, i64, i64),
}

impl ImageTransformsConfig {
    /// Draw the transforms (and their parameters) for one sample.
    pub fn draw(&self, rng: &mut impl Rng, h: usize, w: usize) -> Vec<Transform> {
        if !self.enable {
            return Vec::new();
        }
        let mut avail: Vec<usize> = (0..6).filter(|&i| self.weights[i] > 0.0).collect();
        let n = self.max_num_transforms.min(avail.len());
        let mut chosen = Vec::with_capacity(n);
        for _ in 0..n {
            // Multinomial without replacement: draw by weight among the remaining ones.
            let total: f64 = avail.iter().map(|&i| self.weights[i]).sum();
            let mut u = rng.random::<f64>() * total;
            let mut pick = avail.len() - 1;
            for (j, &i) in avail.iter().enumerate() {
                if u < self.weights[i] {
                    pick = j;
                    break;
                }
                u -= self.weights[i];
            }
            chosen.push(avail.remove(pick));
        }
        if !self.random_order {
            chosen.sort_unstable();
        }
        let mut u = |a: f32, b: f32| a + (b - a) * rng.random::<f32>();
        chosen
            .into_iter()
            .map(|i| match i {
                0 => Transform::Brightness(u(0.8, 1.2)),
                1 => Transform::Contrast(u(0.8, 1.2)),
                2 => Transform::Saturation(u(0.5, 1.5)),
                3 => Transform::Hue(u(-0.05, 0.05)),
                4 => Transform::Sharpness(u(0.5, 1.5)),
                _ => {
                    let angle = u(-5.0, 5.0);
                    let tx = (u(-0.05, 0.05) * w as f32).round() as i64;
                    let ty = (u(-0.05, 0.05) * h as f32).round() as i64;
                    Transform::Affine(angle, tx, ty)
                }
            })
            .collect()
    }
}

fn gray(r: f32, g: f32, b: f32) -> f32 {
    0.2989 * r + 0.587 * g + 0.114 * b
}

fn blend(a: f32, b: f32, ratio: f32) -> f32 {
    (ratio * a + (1.0 - ratio) * b).clamp(0.0, 1.0)
}

/// Apply `tfs` in order to each `[3, h, w]` frame of `data` (`frames × 3 × h × w`).
pub fn apply(tfs: &[Transform], data: &mut [f32], h: usize, w: usize) {
    if tfs.is_empty() {
        return;
    }
    for frame in data.chunks_exact_mut(3 * h * w) {
        for t in tfs {
            apply_one(*t, frame, h, w);
        }
    }
}

fn apply_one(t: Transform, f: &mut [f32], h: usize, w: usize) {
    let plane = h * w;
    match t {
        Transform::Brightness(k) => f.iter_mut().for_each(|v| *v = (*v * k).clamp(0.0, 1.0)),
        Transform::Contrast(k) => {
            let mean = (0..plane).map(|i| gray(f[i], f[plane + i], f[2 * plane + i])).sum::<f32>() / plane as f32;
            f.iter_mut().for_each(|v| *v = blend(*v, mean, k));
        }
        Transform::Saturation(k) => {
            for i in 0..plane {
                let g = gray(f[i], f[plane + i], f[2 * plane + i]);
                for c in 0..3 {
                    f[c * plane + i] = blend(f[c * plane + i], g, k);
                }
            }
        }
        Transform::Hue(dh) => {
            for i in 0..plane {
                let (hh, s, v) = rgb_to_hsv(f[i], f[plane + i], f[2 * plane + i]);
                let (r, g, b) = hsv_to_rgb((hh + dh).rem_euclid(1.0), s, v);
                (f[i], f[plane + i], f[2 * plane + i]) = (r, g, b);
            }
        }
        Transform::Sharpness(k) => {
            // torchvision: blend with a 3×3 smoothed copy ([1 1 1; 1 5 1; 1 1 1] / 13); the
            // border pixels keep their value in the smoothed copy.
            if h < 3 || w < 3 {
                return;
            }
            for c in 0..3 {
                let src = f[c * plane..(c + 1) * plane].to_vec();
                for y in 1..h - 1 {
                    for x in 1..w - 1 {
                        let mut s = 4.0 * src[y * w + x];
                        for dy in 0..3 {
                            for dx in 0..3 {
                                s += src[(y + dy - 1) * w + x + dx - 1];
                            }
                        }
                        let smooth = s / 13.0;
                        f[c * plane + y * w + x] = blend(src[y * w + x], smooth, k);
                    }
                }
            }
        }
        Transform::Affine(deg, tx, ty) => {
            // Inverse map about the image centre, nearest neighbour, fill 0 (torchvision's defaults).
            let (sin, cos) = (-deg.to_radians()).sin_cos();
            let (cx, cy) = ((w as f32 - 1.0) * 0.5, (h as f32 - 1.0) * 0.5);
            for c in 0..3 {
                let src = f[c * plane..(c + 1) * plane].to_vec();
                for y in 0..h {
                    for x in 0..w {
                        let (dx, dy) = (x as f32 - cx - tx as f32, y as f32 - cy - ty as f32);
                        let sx = (cos * dx - sin * dy + cx).round();
                        let sy = (sin * dx + cos * dy + cy).round();
                        let inside = sx >= 0.0 && sy >= 0.0 && (sx as usize) < w && (sy as usize) < h;
                        f[c * plane + y * w + x] = if inside { src[sy as usize * w + sx as usize] } else { 0.0 };
                    }
                }
            }
        }
    }
}

fn rgb_to_hsv(r: f32, g: f32, b: f32) -> (f32, f32, f32) {
    let max = r.max(g).max(b);
    let min = r.min(g).min(b);
    let d = max - min;
    let s = if max > 0.0 { d / max } else { 0.0 };
    let h = if d == 0.0 {
        0.0
    } else if max == r {
        ((g - b) / d).rem_euclid(6.0) / 6.0
    } else if max == g {
        ((b - r) / d + 2.0) / 6.0
    } else {
        ((r - g) / d + 4.0) / 6.0
    };
    (h, s, max)
}

fn hsv_to_rgb(h: f32, s: f32, v: f32) -> (f32, f32, f32) {
    let i = (h * 6.0).floor();
    let f = h * 6.0 - i;
    let (p, q, t) = (v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f)));
    match (i as i64).rem_euclid(6) {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    }
}

/// Bilinear resize of `planes × h × w` (any number of frames × channels) to `oh × ow`
/// (half-pixel centres, as `F.interpolate(mode="bilinear", align_corners=False)`, no
/// antialiasing).
pub fn resize_bilinear(data: &[f32], h: usize, w: usize, oh: usize, ow: usize) -> Vec<f32> {
    if (h, w) == (oh, ow) {
        return data.to_vec();
    }
    let planes = data.len() / (h * w);
    let coord = |o: usize, n_out: usize, n_in: usize| {
        let s = ((o as f32 + 0.5) * n_in as f32 / n_out as f32 - 0.5).max(0.0);
        let i0 = (s.floor() as usize).min(n_in - 1);
        let i1 = (i0 + 1).min(n_in - 1);
        (i0, i1, s - i0 as f32)
    };
    let xs: Vec<_> = (0..ow).map(|x| coord(x, ow, w)).collect();
    let mut out = Vec::with_capacity(planes * oh * ow);
    for p in 0..planes {
        let src = &data[p * h * w..(p + 1) * h * w];
        for y in 0..oh {
            let (y0, y1, fy) = coord(y, oh, h);
            for &(x0, x1, fx) in &xs {
                let top = src[y0 * w + x0] * (1.0 - fx) + src[y0 * w + x1] * fx;
                let bot = src[y1 * w + x0] * (1.0 - fx) + src[y1 * w + x1] * fx;
                out.push(top * (1.0 - fy) + bot * fy);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn draws_subset_in_order() {
        let cfg = ImageTransformsConfig { enable: true, ..Default::default() };
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..20 {
            let t = cfg.draw(&mut rng, 8, 8);
            assert_eq!(t.len(), 3);
        }
        assert!(ImageTransformsConfig::default().draw(&mut rng, 8, 8).is_empty());
        let only_hue = ImageTransformsConfig { enable: true, weights: [0.0, 0.0, 0.0, 1.0, 0.0, 0.0], ..Default::default() };
        assert!(matches!(only_hue.draw(&mut rng, 8, 8)[..], [Transform::Hue(_)]));
    }

    #[test]
    fn transforms_behave() {
        let (h, w) = (4, 5);
        let img: Vec<f32> = (0..3 * h * w).map(|i| (i % 7) as f32 / 7.0).collect();
        let mut a = img.clone();
        apply(&[Transform::Brightness(1.0), Transform::Saturation(1.0), Transform::Contrast(1.0), Transform::Sharpness(1.0), Transform::Affine(0.0, 0, 0), Transform::Hue(0.0)], &mut a, h, w);
        for (x, y) in a.iter().zip(&img) {
            assert!((x - y).abs() < 1e-5, "identity parameters change nothing");
        }
        let mut b = img.clone();
        apply(&[Transform::Saturation(0.0)], &mut b, h, w);
        let plane = h * w;
        assert!((b[3] - b[plane + 3]).abs() < 1e-6, "saturation 0 is grey");
        let mut c = img.clone();
        apply(&[Transform::Affine(0.0, 1, 0)], &mut c, h, w);
        assert_eq!(c[1], img[0]);
        assert_eq!(c[0], 0.0);
        let r = resize_bilinear(&img, h, w, 8, 10);
        assert_eq!(r.len(), 3 * 80);
        let same = resize_bilinear(&[1.0; 12], 2, 2, 3, 3);
        assert!(same.iter().all(|v| (v - 1.0).abs() < 1e-6));
    }
}
