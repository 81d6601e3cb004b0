//! Host-side training data for the robot policies (ACT, Diffusion Policy): samples from a
//! LeRobot dataset (or random inputs of the right shapes) assembled into plain `Vec<f32>`
//! batches, built by loader workers ahead of the trainer.
//!
//! Batch `k` (the run's `k`-th micro-batch, `k = (step − 1) · grad_accum_steps + micro`) is
//! a pure function of `(seed, k)`: frames come from a seeded per-epoch shuffle, augmentations
//! from `step_rng(seed, k, …)`. Workers can therefore build batches in any order, and a resumed
//! run sees exactly the batches of an uninterrupted one.

use std::path::Path;
use std::sync::Arc;

use rand::Rng;
use vramlab_lerobot::transforms::{self, ImageTransformsConfig};
use vramlab_lerobot::{DeltaIndices, EpochSampler, FeatureKind, LeRobotDataset, LoaderConfig, Normalizer, Prefetcher, SampleOptions};
use vramlab_train::step_rng;

use crate::config::{DataFeatures, DatasetType, RunConfig};
use crate::error::{Result, WorkloadError};

/// What one sample holds, per policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Observation steps (`None`: the current frame only, without a step axis, as ACT).
    pub obs_steps: Option<usize>,
    /// Actions per sample (ACT: `chunk_size`; Diffusion: `horizon`).
    pub actions: usize,
}

/// A batch on the host: `b` samples, row-major.
#[derive(Clone, Debug)]
pub struct HostBatch {
    pub batch_size: usize,
    /// `b × [obs] × state_dim` (empty without state).
    pub state: Vec<f32>,
    /// Per camera `b × [obs] × C × H × W`, normalised.
    pub images: Vec<Vec<f32>>,
    /// `b × actions × action_dim`, normalised.
    pub action: Vec<f32>,
    pub action_is_pad: Vec<bool>,
}

impl HostBatch {
    /// Charge this batch's buffers to the calling thread (the trainer takes it over from the
    /// loader: see [`vramlab_probe::adopt`]).
    pub fn adopt(&self) {
        vramlab_probe::adopt(&self.state);
        self.images.iter().for_each(vramlab_probe::adopt);
        vramlab_probe::adopt(&self.images);
        vramlab_probe::adopt(&self.action);
        vramlab_probe::adopt(&self.action_is_pad);
    }
}

/// Loader and preprocessing settings from the run config.
#[derive(Clone, Debug)]
pub struct DataOptions {
    pub seed: u64,
    pub batch_size: usize,
    /// Resize camera frames to `[H, W]` before augmentation.
    pub image_size: Option<[usize; 2]>,
    pub image_transforms: ImageTransformsConfig,
    pub shuffle: bool,
    pub drop_n_last_frames: usize,
    /// Episode indices to train on (`None`: all).
    pub episodes: Option<Vec<usize>>,
    pub loader: LoaderConfig,
}

/// Training samples from a LeRobot dataset (v2.1 / v3.0).
pub struct LeRobotPolicyData {
    pub ds: LeRobotDataset,
    opts: SampleOptions,
    norm: Normalizer,
    stats: vramlab_lerobot::Stats,
    sampler: EpochSampler,
    window: Window,
    features: DataFeatures,
    /// Stored frame size per camera (before resize).
    raw_hw: Vec<[usize; 2]>,
    data: DataOptions,
}

impl LeRobotPolicyData {
    /// Open `root` for a policy with `window`, `delta_indices` (from the policy config) and the
    /// policy's normalisation map.
    pub fn open(
        root: &Path,
        window: Window,
        delta: impl FnOnce(&vramlab_lerobot::Info) -> DeltaIndices,
        norm_map: &vramlab_lerobot::normalize::NormMap,
        data: DataOptions,
    ) -> Result<Self> {
        let ds = LeRobotDataset::open(root)?;
        let (features, raw_hw) = features_of(ds.features(), data.image_size, root)?;
        let stats = ds.stats().ok_or_else(|| WorkloadError::file(root, "no stats (meta/stats.json or episodes_stats.jsonl)".into()))?;
        // lerobot's `use_imagenet_stats`: what the normaliser uses is what checkpoints store.
        let stats = vramlab_lerobot::normalize::with_imagenet_stats(ds.info(), stats);
        let norm = Normalizer::new(ds.info(), &stats, norm_map, false)?;
        let opts = SampleOptions::new(delta(ds.info()));
        if let Some(wanted) = &data.episodes {
            let missing: Vec<usize> = wanted.iter().copied().filter(|&i| !ds.episodes().iter().any(|e| e.episode_index == i)).collect();
            if !missing.is_empty() {
                return Err(WorkloadError::invalid(
                    "dataset.episodes",
                    format!("{}: no episode {missing:?} (the dataset has {} episodes)", root.display(), ds.num_episodes()),
                ));
            }
        }
        let selected = |i: usize| data.episodes.as_ref().is_none_or(|w| w.contains(&i));
        let episodes: Vec<(usize, usize)> =
            ds.episodes().iter().filter(|e| selected(e.episode_index)).map(|e| (e.dataset_from_index, e.dataset_to_index)).collect();
        let sampler = EpochSampler::new(episodes, data.drop_n_last_frames, data.seed, data.shuffle);
        if sampler.is_empty() {
            return Err(WorkloadError::file(root, format!("no frame to sample (episodes shorter than drop_n_last_frames = {})", data.drop_n_last_frames)));
        }
        Ok(Self { ds, opts, norm, stats, sampler, window, features, raw_hw, data })
    }

    pub fn features(&self) -> &DataFeatures {
        &self.features
    }

    /// The statistics batches are normalised with (ImageNet's for cameras), as checkpoints
    /// store them for the policy's processors.
    pub fn stats(&self) -> &vramlab_lerobot::Stats {
        &self.stats
    }

    /// Micro-batches per epoch (sampleable frames / batch size, rounded up).
    pub fn batches_per_epoch(&self) -> u64 {
        self.sampler.len().div_ceil(self.data.batch_size.max(1)) as u64
    }

    /// Batch `k` of the run.
    pub fn host_batch(&self, k: u64) -> Result<HostBatch> {
        let b = self.data.batch_size;
        let f = &self.features;
        let h = self.window.actions;
        let mut out = HostBatch { batch_size: b, state: Vec::new(), images: vec![Vec::new(); f.cameras.len()], action: Vec::new(), action_is_pad: Vec::new() };
        let mut rng = step_rng(self.data.seed ^ 0xDA7A, k, 0);
        for i in 0..b {
            let index = self.sampler.index(k * b as u64 + i as u64);
            let mut s = self.ds.sample(index, &self.opts)?;
            // Take each array out of the sample (no copies on the loader's hot path).
            let mut take = |key: &str| s.values.remove(key).map(|x| x.data).ok_or_else(|| WorkloadError::file(self.ds.root(), format!("frame {index}: no `{key}`")));
            if f.state_dim.is_some() {
                let mut v = take("observation.state")?;
                self.norm.normalize("observation.state", &mut v)?;
                out.state.extend(v);
            }
            let mut act = take("action")?;
            self.norm.normalize("action", &mut act)?;
            out.action.extend(act);
            out.action_is_pad.extend(s.pads.remove("action").unwrap_or_else(|| vec![false; h]));
            for (ci, (key, [_, oh, ow])) in f.cameras.iter().enumerate() {
                let [rh, rw] = self.raw_hw[ci];
                let raw = take(key)?;
                let mut img = if [rh, rw] == [*oh, *ow] { raw } else { transforms::resize_bilinear(&raw, rh, rw, *oh, *ow) };
                let tfs = self.data.image_transforms.draw(&mut rng, *oh, *ow);
                transforms::apply(&tfs, &mut img, *oh, *ow);
                self.norm.normalize_image(key, &mut img, oh * ow)?;
                out.images[ci].extend(img);
            }
        }
        Ok(out)
    }
}

/// Random normalised inputs of the configured shapes, a fixed set of `num_samples` samples
/// (deterministic per index, so the model can fit them and the loss falls). For memory and
/// speed measurement, where only shapes matter.
pub struct RandomPolicyData {
    pub num_samples: u64,
    pub seed: u64,
    pub batch_size: usize,
    pub window: Window,
    pub features: DataFeatures,
}

impl RandomPolicyData {
    pub fn host_batch(&self, k: u64) -> HostBatch {
        let mut rng = step_rng(self.seed, k, 0xB47C);
        let f = &self.features;
        let obs = self.window.obs_steps.unwrap_or(1);
        let (h, a) = (self.window.actions, f.action_dim);
        let b = self.batch_size;
        let mut out = HostBatch { batch_size: b, state: Vec::new(), images: vec![Vec::new(); f.cameras.len()], action: Vec::new(), action_is_pad: vec![false; b * h] };
        for _ in 0..b {
            let index = rng.random_range(0..self.num_samples.max(1));
            let mut s = step_rng(self.seed ^ 0xAC7, index, 0);
            out.state.extend(crate::normal_vec(&mut s, obs * f.state_dim.unwrap_or(0)));
            for (ci, (_, shape)) in f.cameras.iter().enumerate() {
                out.images[ci].extend(crate::normal_vec(&mut s, obs * shape.iter().product::<usize>()));
            }
            // Smooth action trajectories: a random walk, so the chunk has structure to learn.
            let steps = crate::normal_vec(&mut s, h * a);
            let mut prev = vec![0f32; a];
            for t in 0..h {
                for j in 0..a {
                    prev[j] += 0.1 * steps[t * a + j];
                    out.action.push(prev[j]);
                }
            }
        }
        out
    }
}

/// Where a policy's batches come from.
pub enum PolicySource {
    Random(RandomPolicyData),
    LeRobot(Box<LeRobotPolicyData>),
}

impl PolicySource {
    /// The statistics the batches are normalised with (none for random inputs).
    pub fn stats(&self) -> vramlab_lerobot::Stats {
        match self {
            PolicySource::Random(_) => vramlab_lerobot::Stats::new(),
            PolicySource::LeRobot(d) => d.stats().clone(),
        }
    }

    pub fn host_batch(&self, k: u64) -> Result<HostBatch> {
        match self {
            PolicySource::Random(r) => Ok(r.host_batch(k)),
            PolicySource::LeRobot(d) => d.host_batch(k),
        }
    }

    pub fn describe(&self) -> String {
        let cams = |f: &DataFeatures| f.cameras.iter().map(|(k, s)| format!("{k} {s:?}")).collect::<Vec<_>>().join(", ");
        match self {
            PolicySource::Random(r) => format!(
                "random normalised inputs ({} fixed samples; shapes only matter for memory): cameras [{}]",
                r.num_samples,
                cams(&r.features)
            ),
            PolicySource::LeRobot(d) => format!(
                "LeRobot {:?} dataset {} ({} episodes, {} frames, {} fps): cameras [{}]; workers {}, prefetch {}, persistent {}, augment {}",
                d.ds.version(),
                d.ds.root().display(),
                match &d.data.episodes {
                    Some(e) => format!("episodes {e:?} of {}", d.ds.num_episodes()),
                    None => d.ds.num_episodes().to_string(),
                },
                d.ds.num_frames(),
                d.ds.fps(),
                cams(&d.features),
                d.data.loader.num_workers,
                d.data.loader.prefetch_factor,
                d.data.loader.persistent_workers,
                d.data.image_transforms.enable
            ),
        }
    }
}

/// The source behind the prefetching loader: `get(step, micro)` for the trainer.
pub struct PolicyLoader {
    prefetch: Prefetcher<HostBatch, WorkloadError>,
    grad_accum_steps: u64,
}

impl PolicyLoader {
    pub fn new(source: Arc<PolicySource>, mut cfg: LoaderConfig, grad_accum_steps: u64) -> Self {
        match &*source {
            PolicySource::LeRobot(d) => cfg.batches_per_epoch = d.batches_per_epoch(),
            // Random inputs are cheap: no worker threads.
            PolicySource::Random(_) => cfg.num_workers = 0,
        }
        // Building a batch (decoding, resizing, normalising) is the loader's memory, on a worker
        // or, with `num_workers = 0`, on the training thread; the finished batch becomes the
        // model's when `get` hands it over.
        let make = Arc::new(move |k| {
            let _loader = vramlab_probe::charge_to(vramlab_probe::Account::Loader);
            source.host_batch(k)
        });
        Self { prefetch: Prefetcher::new(cfg, make), grad_accum_steps: grad_accum_steps.max(1) }
    }

    /// The micro-batch `micro` of optimizer step `step` (1-based).
    pub fn get(&mut self, step: u64, micro: u64) -> Result<HostBatch> {
        let batch = self.prefetch.get(step.saturating_sub(1) * self.grad_accum_steps + micro)?;
        batch.adopt();
        Ok(batch)
    }
}

/// The loader settings of a run (`--num_workers`, `--prefetch_factor`, `--persistent_workers`).
pub fn loader_config(cfg: &RunConfig) -> LoaderConfig {
    LoaderConfig { num_workers: cfg.num_workers, prefetch_factor: cfg.prefetch_factor, persistent_workers: cfg.persistent_workers, batches_per_epoch: 0 }
}

/// The data options of a run for a policy that drops `drop_n_last_frames` per episode.
fn data_options(cfg: &RunConfig, drop_n_last_frames: usize) -> DataOptions {
    DataOptions {
        seed: cfg.seed,
        batch_size: cfg.batch_size as usize,
        image_size: cfg.dataset.image_size,
        image_transforms: cfg.dataset.image_transforms.clone(),
        shuffle: cfg.dataset.shuffle,
        drop_n_last_frames,
        episodes: cfg.dataset.episodes.clone(),
        loader: loader_config(cfg),
    }
}

/// What a policy asks of its data (all from its config): the sample window, delta indices,
/// normalisation, and the frames to drop at each episode's end.
pub struct PolicyDataSpec {
    pub window: Window,
    pub delta: vramlab_models::policy::DeltaIndices,
    pub norm_map: vramlab_lerobot::normalize::NormMap,
    pub drop_n_last_frames: usize,
}

/// A policy config's `normalization_mapping` as the dataset normaliser's map.
pub fn norm_map(m: &vramlab_models::policy::NormalizationMapping) -> Result<vramlab_lerobot::normalize::NormMap> {
    m.iter()
        .map(|(t, mode)| {
            vramlab_lerobot::normalize::NormMode::parse(mode.name())
                .map(|n| (t.name(), n))
                .ok_or_else(|| WorkloadError::invalid("policy.normalization_mapping", format!("{}: mode {} is not supported by the dataset normaliser", t.name(), mode.name())))
        })
        .collect()
}

/// The policy features of a dataset's `meta/info.json` features, cameras resized to
/// `image_size` when given; also each camera's stored `[H, W]`.
fn features_of(feats: &std::collections::BTreeMap<String, vramlab_lerobot::Feature>, image_size: Option<[usize; 2]>, root: &Path) -> Result<(DataFeatures, Vec<[usize; 2]>)> {
    let vec_dim = |k: &str| feats.get(k).and_then(|f| f.shape.first().copied());
    let action_dim = vec_dim("action").ok_or_else(|| WorkloadError::file(root.join("meta/info.json"), "no `action` feature".into()))?;
    let mut cameras = Vec::new();
    let mut raw_hw = Vec::new();
    for (k, f) in feats {
        if matches!(f.kind(), FeatureKind::Video | FeatureKind::Image) {
            // info.json stores cameras as [H, W, C].
            let [h, w, c]: [usize; 3] = f
                .shape
                .as_slice()
                .try_into()
                .map_err(|_| WorkloadError::file(root.join("meta/info.json"), format!("camera `{k}` has shape {:?}, expected [H, W, C]", f.shape)))?;
            let [oh, ow] = image_size.unwrap_or([h, w]);
            cameras.push((k.clone(), [c, oh, ow]));
            raw_hw.push([h, w]);
        }
    }
    Ok((DataFeatures { state_dim: vec_dim("observation.state"), action_dim, cameras }, raw_hw))
}

/// The features a run's policy gets from its data, from `meta/info.json` alone (no frame is
/// read, nothing is generated): a LeRobot dataset's, or the built-in demonstrations' (their
/// recorded copy, else what the simulator records: state 2, action 2, one 96×96 camera);
/// `None` for `random` data (features from the policy flags).
pub fn dataset_features(cfg: &RunConfig) -> Result<Option<DataFeatures>> {
    let root = match cfg.dataset_type()? {
        DatasetType::Random => return Ok(None),
        DatasetType::Lerobot => cfg.lerobot_root()?,
        DatasetType::Sim => {
            let root = cfg.dataset.root.clone().unwrap_or_else(|| crate::sim::default_root(cfg.dataset.num_episodes));
            if !root.join("meta/info.json").exists() {
                let spec = vramlab_data::push::dataset_spec(crate::sim::IMAGE_SIZE);
                let [h, w] = cfg.dataset.image_size.unwrap_or([spec.height, spec.width]);
                let cameras = vec![(spec.camera_key, [3, h, w])];
                return Ok(Some(DataFeatures { state_dim: Some(spec.state_dim), action_dim: spec.action_dim, cameras }));
            }
            root
        }
        other => return Err(WorkloadError::invalid("dataset.type", format!("`{}` is not robot-policy data", other.name()))),
    };
    let path = root.join("meta/info.json");
    let text = std::fs::read(&path).map_err(|source| WorkloadError::Io { path: path.clone(), source })?;
    let info = vramlab_lerobot::Info::parse(&text, &path)?;
    Ok(Some(features_of(&info.features, cfg.dataset.image_size, &root)?.0))
}

/// Open the robot-policy data of a run: a LeRobot dataset (`lerobot`: `dataset.root` or the
/// `dataset.repo_id` copy that validation found or downloaded; or the built-in
/// demonstrations `sim`, generated on first use), whose features then define the policy's
/// inputs; `None` for `random` (features from the policy flags).
pub fn open_policy_data(cfg: &RunConfig, spec: &PolicyDataSpec) -> Result<Option<LeRobotPolicyData>> {
    let root = match cfg.dataset_type()? {
        DatasetType::Random => return Ok(None),
        DatasetType::Lerobot => cfg.lerobot_root()?,
        DatasetType::Sim => crate::sim::ensure_dataset(cfg.dataset.root.as_deref(), cfg.dataset.num_episodes)?,
        other => return Err(WorkloadError::invalid("dataset.type", format!("`{}` is not robot-policy data", other.name()))),
    };
    let d = &spec.delta;
    let delta = |info: &vramlab_lerobot::Info| vramlab_lerobot::delta::resolve_delta_indices(info, d.observation.as_deref(), d.action.as_deref(), d.reward.as_deref());
    let data = LeRobotPolicyData::open(&root, spec.window, delta, &spec.norm_map, data_options(cfg, spec.drop_n_last_frames))?;
    Ok(Some(data))
}

/// Random inputs with the policy's features (`dataset.type=random`).
pub fn random_source(cfg: &RunConfig, window: Window, features: DataFeatures) -> PolicySource {
    PolicySource::Random(RandomPolicyData { num_samples: cfg.dataset.num_scenes, seed: cfg.seed, batch_size: cfg.batch_size as usize, window, features })
}

/// The prefetching loader of a policy source.
pub fn policy_loader(cfg: &RunConfig, source: PolicySource) -> PolicyLoader {
    PolicyLoader::new(Arc::new(source), loader_config(cfg), cfg.grad_accum_steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(episodes: Option<Vec<usize>>) -> DataOptions {
        DataOptions {
            seed: 1,
            batch_size: 2,
            image_size: None,
            image_transforms: ImageTransformsConfig::default(),
            shuffle: true,
            drop_n_last_frames: 0,
            episodes,
            loader: LoaderConfig { num_workers: 0, prefetch_factor: 1, persistent_workers: true, batches_per_epoch: 0 },
        }
    }

    /// `--dataset.episodes` samples only the chosen episodes' frames; an index the dataset lacks
    /// is an error naming the field and the dataset.
    #[test]
    fn episodes_select_a_subset() {
        let tmp = vramlab_testkit::temp_dir("episodes");
        // `sim::generate` writes a new dataset directory.
        let root = tmp.join("dataset");
        crate::sim::generate(&root, 3, 32, &mut || {}).unwrap();
        let window = Window { obs_steps: None, actions: 4 };
        let actions: Vec<i64> = (0..4).collect();
        let delta = |info: &vramlab_lerobot::Info| vramlab_lerobot::resolve_delta_indices(info, None, Some(&actions), None);
        let norm: vramlab_lerobot::normalize::NormMap = [("STATE", vramlab_lerobot::NormMode::MeanStd), ("ACTION", vramlab_lerobot::NormMode::MeanStd)].into();
        let all = LeRobotPolicyData::open(&root, window, delta, &norm, options(None)).unwrap();
        let one = LeRobotPolicyData::open(&root, window, delta, &norm, options(Some(vec![1]))).unwrap();
        let ep1 = &all.ds.episodes()[1];
        assert_eq!(one.sampler.len(), ep1.length);
        assert!(all.sampler.len() > one.sampler.len());
        for p in 0..3 * one.sampler.len() as u64 {
            assert!((ep1.dataset_from_index..ep1.dataset_to_index).contains(&one.sampler.index(p)));
        }
        let err = LeRobotPolicyData::open(&root, window, delta, &norm, options(Some(vec![1, 7]))).err().expect("episode 7 does not exist").to_string();
        assert!(err.contains("dataset.episodes") && err.contains("[7]") && err.contains("3 episodes"), "{err}");
    }
}
