//! The policy side of one bench call, as lerobot 0.4.4's robot loop does it: preprocess the raw
//! observation (uint8 HWC → float CHW in [0, 1], to the device, normalise), `select_action`,
//! then unnormalise the action and bring it back to the host.
//!
//! `select_action` is lerobot's, beside each model (`act/runner.rs`, `diffusion/runner.rs` in
//! the models crate); each robot policy's workload module wraps its runner in a
//! [`SelectAction`] for the timed loop. The normalisation constants and the statistics reader
//! are [`vramlab_lerobot::normalize`]'s.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn::tensor::TensorData;
use vramlab_lerobot::normalize::{EPS, IMAGENET_MEAN, IMAGENET_STD};
use vramlab_models::nn::Precision;
use vramlab_models::policy::{FeatureType, NormalizationMapping, NormalizationMode};

use super::robot::{Frame, Observation};
use crate::{Result, WorkloadError};

/// The features a policy reads and writes, in the model's order.
#[derive(Clone, Debug)]
pub struct PolicyIo {
    pub cameras: Vec<(String, [usize; 3])>,
    pub state: Option<(String, usize)>,
    pub env_state: Option<(String, usize)>,
    pub action_dim: usize,
    pub mapping: NormalizationMapping,
}

/// lerobot's normaliser statistics of a `pretrained_model/` dir: the state dicts of its
/// `policy_preprocessor_step_<i>_normalizer_processor.safetensors` and
/// `policy_postprocessor_step_<i>_unnormalizer_processor.safetensors` (`<feature>.<stat>`).
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub files: Vec<PathBuf>,
    values: vramlab_lerobot::Stats,
}

impl Stats {
    /// The stats files in `dir` (none is not an error: vramlab checkpoints hold no stats), read
    /// in order (a later file's tensor replaces an earlier one of the same name).
    pub fn read(dir: &Path) -> Result<Self> {
        let files = crate::processors::stats_files(dir)?;
        let mut values = vramlab_lerobot::Stats::new();
        for f in &files {
            crate::processors::read_stats_into(f, &mut values)?;
        }
        Ok(Self { files, values })
    }

    /// One line for the report: where the statistics came from; `neutral`: the normalised
    /// features that had none.
    pub fn note(&self, neutral: &[String]) -> String {
        let fallback = "normalised with neutral stats (ImageNet mean/std for cameras, mean 0 / std 1 otherwise): the \
                        same device operations as with dataset stats, so the latency is that of a real pipeline";
        if self.files.is_empty() {
            return format!("no normaliser stats in the checkpoint: every feature {fallback}");
        }
        let names: Vec<String> = self.files.iter().filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
        let mut note = format!("normaliser stats from {}", names.join(", "));
        if !neutral.is_empty() {
            note += &format!("; without stats there ({}), {fallback}", neutral.join(", "));
        }
        note
    }

    /// `key.<a>` and `key.<b>` as `n` values each (per channel for cameras); `None` when the
    /// feature has no stats (lerobot's normaliser then passes it through), an error when only
    /// one of them is there or a size is wrong.
    fn pair(&self, key: &str, [a, b]: [&str; 2], n: usize) -> Result<Option<(Vec<f32>, Vec<f32>)>> {
        let err = |msg: String| WorkloadError::file(self.files.first().cloned().unwrap_or_default(), msg);
        let get = |stat: &str| -> Result<Option<Vec<f32>>> {
            let Some(s) = self.values.get(key) else { return Ok(None) };
            let v = match stat {
                "mean" => &s.mean,
                "std" => &s.std,
                "min" => &s.min,
                _ => &s.max,
            };
            if v.is_empty() {
                return Ok(None);
            }
            if v.len() != n {
                return Err(err(format!("`{key}.{stat}` has {} values, expected {n}", v.len())));
            }
            Ok(Some(v.iter().map(|&x| x as f32).collect()))
        };
        match (get(a)?, get(b)?) {
            (Some(p), Some(q)) => Ok(Some((p, q))),
            (None, None) => Ok(None),
            _ => Err(err(format!("`{key}` has only one of `{a}` / `{b}` (its normalization_mapping mode needs both)"))),
        }
    }
}

/// `x · scale + shift` on the device, broadcast over the batch (and pixels).
struct Affine<B: Backend, const D: usize> {
    scale: Tensor<B, D>,
    shift: Tensor<B, D>,
}

impl<B: Backend, const D: usize> Affine<B, D> {
    fn new((scale, shift): (Vec<f32>, Vec<f32>), shape: [usize; D], device: &B::Device) -> Self {
        let t = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, shape), device);
        Self { scale: t(scale), shift: t(shift) }
    }

    fn apply(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        x * self.scale.clone() + self.shift.clone()
    }
}

/// `(scale, shift)` of one feature's normalisation (`inverse`: unnormalisation), from the
/// stats or, where the feature has none, neutral values (ImageNet's for cameras), then pushed
/// to `neutral`; `None` for IDENTITY.
fn affine(key: &str, kind: FeatureType, n: usize, mapping: &NormalizationMapping, stats: &Stats, inverse: bool, neutral: &mut Vec<String>) -> Result<Option<(Vec<f32>, Vec<f32>)>> {
    let mode = mapping.get(&kind).copied().unwrap_or(NormalizationMode::Identity);
    let (names, fallback) = match mode {
        NormalizationMode::Identity => return Ok(None),
        NormalizationMode::MeanStd if kind == FeatureType::Visual && n == 3 => (["mean", "std"], (IMAGENET_MEAN.to_vec(), IMAGENET_STD.to_vec())),
        NormalizationMode::MeanStd => (["mean", "std"], (vec![0.0; n], vec![1.0; n])),
        NormalizationMode::MinMax => (["min", "max"], (vec![-1.0; n], vec![1.0; n])),
    };
    let (p, q) = match stats.pair(key, names, n)? {
        Some(pq) => pq,
        None => {
            neutral.push(key.to_string());
            fallback
        }
    };
    let pairs = p.iter().zip(&q);
    Ok(Some(match (mode, inverse) {
        // (x − mean) / (std + eps); inverse x · std + mean.
        (NormalizationMode::MeanStd, false) => pairs.map(|(m, s)| (1.0 / (s + EPS), -m / (s + EPS))).unzip(),
        (NormalizationMode::MeanStd, true) => (q.clone(), p.clone()),
        // 2 (x − min) / d − 1 with d = max − min (eps where 0); inverse (y + 1) d / 2 + min.
        (_, false) => pairs.map(|(lo, hi)| if hi - lo == 0.0 { EPS } else { hi - lo }).zip(&p).map(|(d, lo)| (2.0 / d, -2.0 * lo / d - 1.0)).unzip(),
        (_, true) => pairs.map(|(lo, hi)| if hi - lo == 0.0 { EPS } else { hi - lo }).zip(&p).map(|(d, lo)| (d / 2.0, lo + d / 2.0)).unzip(),
    }))
}

/// The pre- and post-processing around `select_action`, with its constants on the device.
pub struct Processor<B: Backend> {
    cameras: Vec<Option<Affine<B, 4>>>,
    state: Option<Affine<B, 2>>,
    env_state: Option<Affine<B, 2>>,
    action: Option<Affine<B, 2>>,
    device: B::Device,
    /// Normalised features without stats in the checkpoint (neutral values used).
    pub neutral: Vec<String>,
}

/// A preprocessed observation on the device (batch of 1).
#[derive(Clone, Debug)]
pub struct DeviceObs<B: Backend> {
    /// `[1, 3, h, w]` per camera.
    pub images: Vec<Tensor<B, 4>>,
    /// `[1, state_dim]`
    pub state: Option<Tensor<B, 2>>,
    /// `[1, env_dim]`
    pub env_state: Option<Tensor<B, 2>>,
}

impl<B: Backend> Processor<B> {
    pub fn new(io: &PolicyIo, stats: &Stats, device: &B::Device) -> Result<Self> {
        let (m, mut neutral) = (&io.mapping, Vec::new());
        let mut cameras = Vec::new();
        for (k, [c, _, _]) in &io.cameras {
            cameras.push(affine(k, FeatureType::Visual, *c, m, stats, false, &mut neutral)?.map(|a| Affine::new(a, [1, *c, 1, 1], device)));
        }
        let mut vector = |f: &Option<(String, usize)>, kind| -> Result<Option<Affine<B, 2>>> {
            let Some((k, d)) = f else { return Ok(None) };
            Ok(affine(k, kind, *d, m, stats, false, &mut neutral)?.map(|a| Affine::new(a, [1, *d], device)))
        };
        let (state, env_state) = (vector(&io.state, FeatureType::State)?, vector(&io.env_state, FeatureType::Env)?);
        let a = io.action_dim;
        let action = affine(vramlab_models::policy::ACTION, FeatureType::Action, a, m, stats, true, &mut neutral)?.map(|p| Affine::new(p, [1, a], device));
        Ok(Self { cameras, state, env_state, action, device: device.clone(), neutral })
    }

    /// lerobot's `prepare_observation_for_inference` + the normaliser step: frames to float
    /// CHW in [0, 1] on the host, then to the device and normalised there.
    pub fn observation(&self, obs: &Observation) -> DeviceObs<B> {
        let images = obs
            .frames
            .iter()
            .zip(&self.cameras)
            .map(|(f, norm)| {
                let x = Tensor::<B, 4>::from_data(TensorData::new(chw(f), [1, 3, f.height, f.width]), &self.device); // [1, 3, h, w]
                norm.as_ref().map_or(x.clone(), |n| n.apply(x))
            })
            .collect();
        let vector = |v: &Option<Vec<f32>>, norm: &Option<Affine<B, 2>>| {
            v.as_ref().map(|v| {
                let x = Tensor::<B, 2>::from_data(TensorData::new(v.clone(), [1, v.len()]), &self.device); // [1, d]
                norm.as_ref().map_or(x.clone(), |n| n.apply(x))
            })
        };
        DeviceObs { images, state: vector(&obs.state, &self.state), env_state: vector(&obs.env_state, &self.env_state) }
    }

    /// The unnormaliser step and the copy to the host (which waits for the device).
    pub fn action(&self, a: Tensor<B, 2>) -> Result<Vec<f32>> {
        let a = self.action.as_ref().map_or(a.clone(), |n| n.apply(a));
        a.into_data().convert::<f32>().to_vec::<f32>().map_err(|e| WorkloadError::Backend(format!("reading the action back: {e:?}")))
    }
}

/// uint8 `[h, w, 3]` → f32 `[3, h, w]` in [0, 1].
fn chw(f: &Frame) -> Vec<f32> {
    let n = f.height * f.width;
    let mut out = vec![0f32; 3 * n];
    for (i, px) in f.rgb.chunks_exact(3).enumerate() {
        for (c, &v) in px.iter().enumerate() {
            out[c * n + i] = f32::from(v) / 255.0;
        }
    }
    out
}

/// A loaded policy with its `select_action` state, as the timed loop drives it.
pub trait SelectAction<B: Backend> {
    /// Call when the environment resets (empties the queues and the ensembler).
    fn reset(&mut self);

    /// `select_action` on a preprocessed observation: the action `[1, action_dim]` and
    /// whether the model ran.
    fn select_action(&mut self, obs: DeviceObs<B>, precision: Precision) -> (Tensor<B, 2>, bool);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(mode: NormalizationMode) -> NormalizationMapping {
        [(FeatureType::State, mode), (FeatureType::Action, mode)].into()
    }

    fn stats(pairs: &[(&str, Vec<f32>)]) -> Stats {
        let mut values = vramlab_lerobot::Stats::new();
        vramlab_lerobot::normalize::add_state_dict(&mut values, pairs.iter().map(|(k, v)| (k.to_string(), vec![v.len()], v.clone())));
        Stats { files: vec![PathBuf::from("stats.safetensors")], values }
    }

    #[test]
    fn affine_maps_match_lerobots_formulas_and_invert() {
        let s = stats(&[("k.mean", vec![1.0, -2.0]), ("k.std", vec![2.0, 0.5]), ("k.min", vec![0.0, 4.0]), ("k.max", vec![10.0, 4.0]), ("half.mean", vec![0.0])]);
        let mut neutral = Vec::new();
        for mode in [NormalizationMode::MeanStd, NormalizationMode::MinMax] {
            let (a, b) = affine("k", FeatureType::State, 2, &mapping(mode), &s, false, &mut neutral).unwrap().unwrap();
            let (ia, ib) = affine("k", FeatureType::State, 2, &mapping(mode), &s, true, &mut neutral).unwrap().unwrap();
            let x = [3.0f32, 7.0];
            let want = match mode {
                NormalizationMode::MeanStd => [(3.0 - 1.0) / 2.0, (7.0 + 2.0) / 0.5],
                _ => [2.0 * 3.0 / 10.0 - 1.0, 2.0 * (7.0 - 4.0) / EPS - 1.0],
            };
            for i in 0..2 {
                let y = x[i] * a[i] + b[i];
                assert!((y - want[i]).abs() <= 1e-5 * want[i].abs().max(1.0), "{mode:?} {i}: {y} vs {}", want[i]);
                if mode == NormalizationMode::MeanStd || i == 0 {
                    assert!((y * ia[i] + ib[i] - x[i]).abs() < 1e-5, "{mode:?} {i}: inverse");
                }
            }
        }
        assert!(neutral.is_empty());
        assert!(affine("k", FeatureType::State, 2, &mapping(NormalizationMode::Identity), &s, false, &mut neutral).unwrap().is_none());
        let half = affine("half", FeatureType::State, 1, &mapping(NormalizationMode::MeanStd), &s, false, &mut neutral).unwrap_err().to_string();
        assert!(half.contains("`half`") && half.contains("std"), "{half}");
        // A feature without stats: neutral values (ImageNet's for cameras), reported.
        let (a, b) = affine("other", FeatureType::State, 2, &mapping(NormalizationMode::MeanStd), &s, false, &mut neutral).unwrap().unwrap();
        assert_eq!((a, b), (vec![1.0 / (1.0 + EPS); 2], vec![0.0; 2]));
        let visual: NormalizationMapping = [(FeatureType::Visual, NormalizationMode::MeanStd)].into();
        let (a, b) = affine("cam", FeatureType::Visual, 3, &visual, &Stats::default(), false, &mut neutral).unwrap().unwrap();
        assert!((0.485 * a[0] + b[0]).abs() < 1e-6 && (a[2] - 1.0 / 0.225).abs() < 1e-4);
        assert_eq!(neutral, ["other", "cam"]);
    }
}
