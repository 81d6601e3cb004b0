//! Normalisation from dataset statistics, as lerobot 0.4.4's `NormalizerProcessorStep`
//! (float32 arithmetic, eps = 1e-8):
//! - MEAN_STD: `(x - mean) / (std + eps)`
//! - MIN_MAX:  `2 * (x - min) / d - 1` with `d = max - min`, replaced by `eps` where `d == 0`
//! - IDENTITY: unchanged.
//!
//! The one home of lerobot's normalisation constants ([`EPS`], [`IMAGENET_MEAN`] /
//! [`IMAGENET_STD`]) and of reading a processor's statistics back ([`add_state_dict`]: a
//! normaliser state dict into [`Stats`]).

use std::collections::BTreeMap;

use crate::error::DatasetError;
use crate::info::{Info, PolicyFeatureType};
use crate::meta::{FeatureStats, Stats};

/// lerobot's normaliser epsilon as its processor configs write it (`"eps": 1e-08`, a Python
/// float).
pub const EPS_F64: f64 = 1e-8;

/// lerobot's normaliser epsilon, in the float32 arithmetic it normalises with: `std + eps`,
/// and in place of a zero `max − min`.
pub const EPS: f32 = EPS_F64 as f32;

/// ImageNet channel statistics (lerobot `IMAGENET_STATS`), used for cameras when
/// `use_imagenet_stats` is on (lerobot's default for training).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Add a lerobot normaliser state dict to `stats`: the `<feature>.<stat>` tensors (`mean`,
/// `std`, `min`, `max`, `count`; others ignored) of a processor's
/// `…_normalizer_processor.safetensors`, each as `(name, shape, float32 values)`. A tensor
/// replaces an earlier one of the same name (several files read in order); the feature's
/// shape is its `mean`'s.
pub fn add_state_dict(stats: &mut Stats, tensors: impl IntoIterator<Item = (String, Vec<usize>, Vec<f32>)>) {
    for (name, shape, values) in tensors {
        let Some((key, stat)) = name.rsplit_once('.') else { continue };
        let values: Vec<f64> = values.into_iter().map(f64::from).collect();
        let s = stats.entry(key.to_string()).or_insert_with(|| FeatureStats { shape: Vec::new(), mean: Vec::new(), std: Vec::new(), min: Vec::new(), max: Vec::new(), count: None });
        match stat {
            "mean" => (s.mean, s.shape) = (values, shape),
            "std" => s.std = values,
            "min" => s.min = values,
            "max" => s.max = values,
            "count" => s.count = values.first().copied(),
            _ => {}
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormMode {
    Identity,
    MeanStd,
    MinMax,
}

impl NormMode {
    /// lerobot's `NormalizationMode` value (`"IDENTITY"`, `"MEAN_STD"`, `"MIN_MAX"`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "IDENTITY" => Some(NormMode::Identity),
            "MEAN_STD" => Some(NormMode::MeanStd),
            "MIN_MAX" => Some(NormMode::MinMax),
            _ => None,
        }
    }
}

/// Norm mode per policy feature type (lerobot's `normalization_mapping`, keyed by lerobot's
/// feature-type names: `"VISUAL"`, `"STATE"`, …). A policy config states it.
pub type NormMap = BTreeMap<&'static str, NormMode>;

fn type_name(t: PolicyFeatureType) -> &'static str {
    match t {
        PolicyFeatureType::Visual => "VISUAL",
        PolicyFeatureType::State => "STATE",
        PolicyFeatureType::Env => "ENV",
        PolicyFeatureType::Action => "ACTION",
        PolicyFeatureType::Reward => "REWARD",
    }
}

/// lerobot's name of a feature type (`"VISUAL"`, `"STATE"`, …), as in `normalization_mapping`
/// and in a policy config's features.
pub fn feature_type_name(t: PolicyFeatureType) -> &'static str {
    type_name(t)
}

/// The feature type a lerobot name stands for.
pub fn parse_feature_type(name: &str) -> Option<PolicyFeatureType> {
    [PolicyFeatureType::Visual, PolicyFeatureType::State, PolicyFeatureType::Env, PolicyFeatureType::Action, PolicyFeatureType::Reward]
        .into_iter()
        .find(|&t| type_name(t) == name)
}

/// One feature to normalise: its key, type, element count and (cameras) channel count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureSpec {
    pub key: String,
    pub kind: PolicyFeatureType,
    pub numel: usize,
    pub channels: Option<usize>,
}

/// `stats` with every camera's mean/std replaced by ImageNet's, shape `[3, 1, 1]` (lerobot's
/// `use_imagenet_stats`, applied when the dataset is opened, so checkpoints store these).
pub fn with_imagenet_stats(info: &Info, stats: &Stats) -> Stats {
    let mut out = stats.clone();
    for key in info.features.keys() {
        if info.policy_feature_type(key) != Some(PolicyFeatureType::Visual) {
            continue;
        }
        let mut s = stats.get(key).cloned().unwrap_or(FeatureStats {
            shape: vec![3, 1, 1],
            mean: vec![0.0; 3],
            std: vec![1.0; 3],
            min: vec![0.0; 3],
            max: vec![1.0; 3],
            count: None,
        });
        s.shape = vec![3, 1, 1];
        s.mean = IMAGENET_MEAN.iter().map(|&x| x as f64).collect();
        s.std = IMAGENET_STD.iter().map(|&x| x as f64).collect();
        if s.min.len() != 3 {
            s.min = vec![0.0; 3];
            s.max = vec![1.0; 3];
        }
        out.insert(key.clone(), s);
    }
    out
}

#[derive(Debug, Clone)]
struct KeyNorm {
    mode: NormMode,
    /// MEAN_STD: (mean, std); MIN_MAX: (min, max), one value per stats element.
    p: Vec<f32>,
    q: Vec<f32>,
    shape: Vec<usize>,
}

/// Per-key normaliser built from dataset stats.
#[derive(Debug, Clone, Default)]
pub struct Normalizer {
    keys: BTreeMap<String, KeyNorm>,
}

impl Normalizer {
    /// Build from stats and a per-feature-type mapping. With `imagenet_for_cameras`, camera
    /// mean/std are replaced by ImageNet stats (as lerobot's `use_imagenet_stats`).
    pub fn new(info: &Info, stats: &Stats, map: &NormMap, imagenet_for_cameras: bool) -> Result<Self, DatasetError> {
        let owned;
        let stats = if imagenet_for_cameras {
            owned = with_imagenet_stats(info, stats);
            &owned
        } else {
            stats
        };
        let features = info.features.iter().filter_map(|(key, f)| {
            let kind = info.policy_feature_type(key)?;
            Some(FeatureSpec { key: key.clone(), kind, numel: f.numel(), channels: f.chw().map(|c| c.0) })
        });
        Self::from_features(features, stats, map)
    }

    /// Build for the given features (a policy's `input_features` / `output_features`, say)
    /// from stats already final (ImageNet substitution done), as lerobot's processors do.
    pub fn from_features(features: impl IntoIterator<Item = FeatureSpec>, stats: &Stats, map: &NormMap) -> Result<Self, DatasetError> {
        let mut keys = BTreeMap::new();
        for FeatureSpec { key, kind: t, numel, channels } in features {
            let mode = map.get(type_name(t)).copied().unwrap_or(NormMode::Identity);
            if mode == NormMode::Identity {
                continue;
            }
            // lerobot skips keys without stats (identity).
            let Some(fs) = stats.get(&key) else { continue };
            let f32v = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
            let (p, q) = match mode {
                NormMode::MeanStd => (f32v(&fs.mean), f32v(&fs.std)),
                NormMode::MinMax => (f32v(&fs.min), f32v(&fs.max)),
                NormMode::Identity => unreachable!(),
            };
            if t != PolicyFeatureType::Visual && p.len() != numel {
                return Err(DatasetError::arg(format!(
                    "stats of `{key}` have {} values but the feature has {numel}",
                    p.len()
                )));
            }
            if t == PolicyFeatureType::Visual && Some(p.len()) != channels && p.len() != numel {
                return Err(DatasetError::arg(format!(
                    "stats of camera `{key}` have {} values: expected one per channel",
                    p.len()
                )));
            }
            keys.insert(key, KeyNorm { mode, p, q, shape: fs.shape.clone() });
        }
        Ok(Normalizer { keys })
    }

    /// Mode used for `key` (Identity when not normalised).
    pub fn mode(&self, key: &str) -> NormMode {
        self.keys.get(key).map(|k| k.mode).unwrap_or(NormMode::Identity)
    }

    /// Normalise `data` in place: one or more items of a vector feature back to back
    /// (e.g. `[T, 26]` flattened), stats broadcast over the leading dimension. Cameras with
    /// per-channel `[C,1,1]` stats go through [`Normalizer::normalize_image`].
    pub fn normalize(&self, key: &str, data: &mut [f32]) -> Result<(), DatasetError> {
        self.apply(key, data, false)
    }

    /// Inverse of [`Normalizer::normalize`].
    pub fn unnormalize(&self, key: &str, data: &mut [f32]) -> Result<(), DatasetError> {
        self.apply(key, data, true)
    }

    fn apply(&self, key: &str, data: &mut [f32], inverse: bool) -> Result<(), DatasetError> {
        let Some(k) = self.keys.get(key) else { return Ok(()) };
        let c = k.p.len();
        if c == 0 {
            return Ok(());
        }
        if k.shape.len() == 3 && k.shape[1] == 1 && k.shape[2] == 1 && c > 1 {
            return Err(DatasetError::arg(format!(
                "normalize `{key}`: per-channel camera stats, use `normalize_image`"
            )));
        }
        if !data.len().is_multiple_of(c) {
            return Err(DatasetError::arg(format!("normalize `{key}`: {} values not a multiple of {c}", data.len())));
        }
        for chunk in data.chunks_exact_mut(c) {
            for ((x, &p), &q) in chunk.iter_mut().zip(&k.p).zip(&k.q) {
                *x = norm_one(k.mode, inverse, *x, p, q);
            }
        }
        Ok(())
    }

    /// Normalise CHW camera data (any number of `[C, H, W]` images back to back, `plane`
    /// = H*W), with per-channel stats.
    pub fn normalize_image(&self, key: &str, data: &mut [f32], plane: usize) -> Result<(), DatasetError> {
        self.apply_image(key, data, plane, false)
    }

    /// Inverse of [`Normalizer::normalize_image`].
    pub fn unnormalize_image(&self, key: &str, data: &mut [f32], plane: usize) -> Result<(), DatasetError> {
        self.apply_image(key, data, plane, true)
    }

    fn apply_image(&self, key: &str, data: &mut [f32], plane: usize, inverse: bool) -> Result<(), DatasetError> {
        let Some(k) = self.keys.get(key) else { return Ok(()) };
        let c = k.p.len();
        if c == 0 || plane == 0 || !data.len().is_multiple_of(c * plane) {
            return Err(DatasetError::arg(format!(
                "normalize `{key}`: {} values is not a whole number of [{c}, {plane}] images",
                data.len()
            )));
        }
        for img in data.chunks_exact_mut(c * plane) {
            for (ch, pl) in img.chunks_exact_mut(plane).enumerate() {
                let (p, q) = (k.p[ch], k.q[ch]);
                pl.iter_mut().for_each(|x| *x = norm_one(k.mode, inverse, *x, p, q));
            }
        }
        Ok(())
    }
}

#[inline]
fn norm_one(mode: NormMode, inverse: bool, x: f32, p: f32, q: f32) -> f32 {
    match (mode, inverse) {
        (NormMode::MeanStd, false) => (x - p) / (q + EPS),
        (NormMode::MeanStd, true) => x * q + p,
        (NormMode::MinMax, _) => {
            let d = q - p;
            let d = if d == 0.0 { EPS } else { d };
            if inverse { (x + 1.0) / 2.0 * d + p } else { 2.0 * (x - p) / d - 1.0 }
        }
        (NormMode::Identity, _) => x,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eps_is_lerobots_in_both_widths() {
        assert_eq!(EPS, 1e-8f32);
        assert_eq!(serde_json::json!(EPS_F64).to_string(), "1e-8");
    }

    #[test]
    fn a_state_dict_reads_back_into_stats() {
        let t = |name: &str, v: &[f32]| (name.to_string(), vec![v.len()], v.to_vec());
        let mut stats = Stats::new();
        add_state_dict(&mut stats, [t("a.mean", &[1.0, 2.0]), t("a.std", &[0.5, 0.25]), t("a.count", &[7.0]), t("b.min", &[-1.0]), t("a.other", &[0.0]), t("unnamed", &[0.0])]);
        // A second file: a later tensor of the same name replaces the earlier one.
        add_state_dict(&mut stats, [t("a.std", &[1.0, 1.0]), t("b.max", &[3.0])]);
        assert_eq!(stats.len(), 2);
        let a = &stats["a"];
        assert_eq!((a.shape.as_slice(), a.mean.as_slice(), a.std.as_slice(), a.count), (&[2][..], &[1.0, 2.0][..], &[1.0, 1.0][..], Some(7.0)));
        let b = &stats["b"];
        assert_eq!((b.min.as_slice(), b.max.as_slice(), b.mean.is_empty()), (&[-1.0][..], &[3.0][..], true));
    }
}
