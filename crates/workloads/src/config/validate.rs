//! Checking a loaded run config before any data is generated or any model is built: ranges,
//! toggles that do not fit together, the dataset type against the policy, the policy's own
//! fields ([`PolicyConfig::validate`]), the VAE's grid ([`grid_mismatch`]) and the files the
//! run will read (a `dataset.repo_id` is found or downloaded here).

use std::path::PathBuf;

use vramlab_lerobot::hub::{HubEnv, HubRequest};
use vramlab_models::vae3d::Vae3dConfig;

use super::policy::{PolicyConfig, Workload};
use super::types::{DatasetConfig, DatasetType, RunConfig};
use crate::backend::BackendKind;
use crate::error::WorkloadError;

/// The most loader worker threads a run may ask for (`--num_workers`): far more than any
/// machine's cores, few enough that the OS always starts them.
pub const MAX_WORKERS: usize = 256;

/// The most batches in flight per loader worker (`--prefetch_factor`).
pub const MAX_PREFETCH: usize = 64;

impl RunConfig {
    /// The dataset type of this run (`lerobot` with a `repo_id`, else the policy's built-in data
    /// when not given).
    pub fn dataset_type(&self) -> Result<DatasetType, WorkloadError> {
        let vae = self.policy()?.is_vae3d();
        let built_in = if vae { DatasetType::Voxels } else { DatasetType::Sim };
        let t = match (self.dataset.kind, &self.dataset.repo_id) {
            (Some(t), Some(id)) if t != DatasetType::Lerobot => {
                return Err(WorkloadError::invalid("dataset.repo_id", format!("`{id}` is a LeRobot dataset on the hub; it cannot be used with dataset.type={}", t.name())));
            }
            (Some(t), _) => t,
            (None, Some(_)) => DatasetType::Lerobot,
            (None, None) => built_in,
        };
        let ok = if vae { matches!(t, DatasetType::Voxels | DatasetType::Npz) } else { matches!(t, DatasetType::Sim | DatasetType::Lerobot | DatasetType::Random) };
        if !ok && self.dataset.repo_id.is_some() {
            return Err(WorkloadError::invalid("dataset.repo_id", format!("LeRobot datasets train robot policies, not policy.type={}", self.policy()?.name())));
        }
        if !ok {
            let valid = if vae { "voxels (built-in scenes), npz (with dataset.root)" } else { "sim (built-in push demonstrations), lerobot (with dataset.root), random" };
            return Err(WorkloadError::invalid("dataset.type", format!("`{}` does not fit policy.type={}; valid: {valid}", t.name(), self.policy()?.name())));
        }
        Ok(t)
    }

    /// Everything that can be checked before data is generated or a model is built: ranges,
    /// toggles that do not fit together, and the files the run will read (a `dataset.repo_id`
    /// is found or downloaded here, with the process's Hugging Face environment).
    pub fn validate(&self) -> Result<(), WorkloadError> {
        self.validate_with(&HubEnv::from_process())
    }

    /// `output_dir`, when given, names a directory (existing or not): not empty, not a file.
    pub fn validate_output_dir(&self) -> Result<(), WorkloadError> {
        if let Some(out) = &self.output_dir {
            if out.as_os_str().is_empty() {
                return Err(WorkloadError::invalid("output_dir", "is empty: name the run's directory (or leave the flag out for runs/<name>-<time>)".into()));
            }
            if out.exists() && !out.is_dir() {
                return Err(WorkloadError::invalid("output_dir", format!("{} is a file, not a directory", out.display())));
            }
        }
        Ok(())
    }

    /// [`Self::validate`] with the given Hugging Face environment (cache, offline, endpoint).
    pub fn validate_with(&self, hub: &HubEnv) -> Result<(), WorkloadError> {
        let policy = self.policy()?;
        self.validate_output_dir()?;
        for (name, v) in [("steps", self.steps), ("batch_size", self.batch_size), ("grad_accum_steps", self.grad_accum_steps)] {
            if v == 0 {
                return Err(WorkloadError::invalid(name, "must be at least 1".into()));
            }
        }
        if self.prefetch_factor == 0 {
            return Err(WorkloadError::invalid("prefetch_factor", "must be at least 1".into()));
        }
        if let Some(s) = self.memory_timeline.iter().find(|&&s| s == 0 || s > self.steps) {
            return Err(WorkloadError::invalid("memory_timeline", format!("step {s} is not a step of this run (1..={})", self.steps)));
        }
        if !self.memory_timeline.is_empty() && self.backend != BackendKind::Flex {
            return Err(WorkloadError::invalid("memory_timeline", format!("records the CPU heap's allocations: needs --backend=flex, not {}", self.backend)));
        }
        let o = &self.optimizer;
        for (name, v) in [("optimizer.lr", o.lr), ("optimizer.lr_backbone", o.lr_backbone), ("optimizer.eps", o.eps)] {
            if v.is_some_and(|x| !(x > 0.0 && x.is_finite())) {
                return Err(WorkloadError::invalid(name, format!("must be a positive number, found {}", v.unwrap_or_default())));
            }
        }
        for (name, v) in [("optimizer.weight_decay", o.weight_decay), ("optimizer.grad_clip_norm", o.grad_clip_norm)] {
            if v.is_some_and(|x| !(x >= 0.0 && x.is_finite())) {
                return Err(WorkloadError::invalid(name, format!("must be ≥ 0, found {}", v.unwrap_or_default())));
            }
        }
        if let Some(b) = o.betas
            && !b.iter().all(|x| (0.0..1.0).contains(x))
        {
            return Err(WorkloadError::invalid("optimizer.betas", format!("each must be in [0, 1), found {b:?}")));
        }
        if o.lr_backbone.is_some() && !policy.has_backbone() {
            return Err(WorkloadError::invalid("optimizer.lr_backbone", "this policy has no vision backbone".into()));
        }
        if self.num_workers > MAX_WORKERS {
            return Err(WorkloadError::invalid("num_workers", format!("{} loader threads: at most {MAX_WORKERS} (this machine runs {} threads at once)", self.num_workers, std::thread::available_parallelism().map_or(1, |n| n.get()))));
        }
        if self.prefetch_factor > MAX_PREFETCH {
            return Err(WorkloadError::invalid("prefetch_factor", format!("{} batches in flight per worker: at most {MAX_PREFETCH}", self.prefetch_factor)));
        }
        let dataset = self.dataset_type()?;
        self.check_ignored_data_flags(dataset)?;
        policy.validate(dataset)?;
        if let Workload::Vae3d(v) = &policy.kind
            && let Some(why) = grid_mismatch(&v.config, self.dataset.grid)
        {
            return Err(WorkloadError::invalid("dataset.grid", why));
        }
        self.validate_dataset_files(dataset, hub)
    }

    /// The LeRobot dataset of a `dataset.type=lerobot` run: `dataset.root`, or with `repo_id` its
    /// local copy (found or downloaded with the process's environment unless `validate` already
    /// resolved it).
    pub fn lerobot_root(&self) -> Result<PathBuf, WorkloadError> {
        match self.dataset.resolved_root.get() {
            Some(root) => Ok(root.clone()),
            None => self.resolve_lerobot_root(&HubEnv::from_process()),
        }
    }

    /// [`Self::lerobot_root`] with the given Hugging Face environment; remembered for later calls.
    pub fn resolve_lerobot_root(&self, hub: &HubEnv) -> Result<PathBuf, WorkloadError> {
        if let Some(root) = self.dataset.resolved_root.get() {
            return Ok(root.clone());
        }
        let d = &self.dataset;
        let root = match &d.repo_id {
            None => d.root.clone().ok_or_else(|| WorkloadError::invalid("dataset.root", "required for dataset.type=lerobot (or give dataset.repo_id)".into()))?,
            Some(repo_id) => {
                let req = HubRequest { repo_id, revision: d.revision.as_deref(), root: d.root.as_deref() };
                vramlab_lerobot::hub::resolve(&req, hub).map_err(|e| WorkloadError::invalid("dataset.repo_id", e.to_string()))?.root
            }
        };
        Ok(self.dataset.resolved_root.get_or_init(|| root).clone())
    }

    /// A `dataset.*` field that the chosen data source does not read, set to something other
    /// than its default, is an error naming the field and the source (it would be silently
    /// ignored). The policies' feature shorthands are checked by [`PolicyConfig::validate`].
    fn check_ignored_data_flags(&self, dataset: DatasetType) -> Result<(), WorkloadError> {
        use DatasetType::*;
        let (d, default) = (&self.dataset, DatasetConfig::default());
        let json = |v: &vramlab_lerobot::transforms::ImageTransformsConfig| serde_json::to_value(v).unwrap_or_default();
        // (field, set to something other than its default, the sources that read it)
        let fields: [(&str, bool, &[DatasetType]); 9] = [
            ("dataset.root", d.root.is_some(), &[Npz, Lerobot, Sim]),
            ("dataset.grid", d.grid != default.grid, &[Voxels, Npz]),
            ("dataset.num_scenes", d.num_scenes != default.num_scenes, &[Voxels, Random]),
            ("dataset.num_static_boxes", d.num_static_boxes != default.num_static_boxes, &[Voxels]),
            ("dataset.num_movers", d.num_movers != default.num_movers, &[Voxels]),
            ("dataset.num_episodes", d.num_episodes != default.num_episodes, &[Sim]),
            ("dataset.image_size", d.image_size.is_some(), &[Lerobot, Sim]),
            ("dataset.image_transforms", json(&d.image_transforms) != json(&default.image_transforms), &[Lerobot, Sim]),
            ("dataset.shuffle", d.shuffle != default.shuffle, &[Lerobot, Sim]),
        ];
        match fields.into_iter().find(|(_, set, read_by)| *set && !read_by.contains(&dataset)) {
            Some((field, _, read_by)) => {
                let names: Vec<&str> = read_by.iter().map(|t| t.name()).collect();
                Err(WorkloadError::invalid(
                    field,
                    format!("dataset.type={} does not use it (it would be ignored); it is read with dataset.type={}: drop the flag or change dataset.type", dataset.name(), names.join(" or ")),
                ))
            }
            None => Ok(()),
        }
    }

    fn validate_dataset_files(&self, dataset: DatasetType, hub: &HubEnv) -> Result<(), WorkloadError> {
        let root = self.dataset.root.as_deref();
        if self.dataset.revision.is_some() && self.dataset.repo_id.is_none() {
            return Err(WorkloadError::invalid("dataset.revision", "selects a version of dataset.repo_id, which is not given".into()));
        }
        match dataset {
            DatasetType::Lerobot if self.dataset.repo_id.is_some() => {
                self.resolve_lerobot_root(hub)?;
            }
            DatasetType::Npz | DatasetType::Lerobot => {
                let also = if dataset == DatasetType::Lerobot { " (or dataset.repo_id)" } else { "" };
                let root = root.ok_or_else(|| WorkloadError::invalid("dataset.root", format!("required for dataset.type={}{also}", dataset.name())))?;
                if !root.is_dir() {
                    return Err(WorkloadError::invalid("dataset.root", format!("{}: no such directory", root.display())));
                }
                let info = root.join("meta/info.json");
                if dataset == DatasetType::Lerobot && !info.is_file() {
                    return Err(WorkloadError::invalid("dataset.root", format!("{}: not a LeRobot dataset ({} is missing)", root.display(), info.display())));
                }
            }
            DatasetType::Sim | DatasetType::Voxels | DatasetType::Random => {}
        }
        match &self.dataset.episodes {
            Some(e) if e.is_empty() => return Err(WorkloadError::invalid("dataset.episodes", "an empty list selects no episode".into())),
            Some(_) if !matches!(dataset, DatasetType::Sim | DatasetType::Lerobot) => {
                return Err(WorkloadError::invalid("dataset.episodes", format!("selects episodes of a LeRobot dataset; dataset.type={} has none", dataset.name())));
            }
            Some(e) if dataset == DatasetType::Sim && e.iter().any(|&i| i >= self.dataset.num_episodes) => {
                return Err(WorkloadError::invalid(
                    "dataset.episodes",
                    format!("{e:?}: the built-in demonstrations have episodes 0..{} (dataset.num_episodes)", self.dataset.num_episodes),
                ));
            }
            _ => {}
        }
        if dataset == DatasetType::Sim && self.dataset.num_episodes == 0 {
            return Err(WorkloadError::invalid("dataset.num_episodes", "must be at least 1".into()));
        }
        if matches!(dataset, DatasetType::Voxels | DatasetType::Random) && self.dataset.num_scenes == 0 {
            return Err(WorkloadError::invalid("dataset.num_scenes", "must be at least 1".into()));
        }
        if self.dataset.grid.contains(&0) {
            return Err(WorkloadError::invalid("dataset.grid", format!("sizes must be at least 1, found {:?}", self.dataset.grid)));
        }
        Ok(())
    }
}

impl PolicyConfig {
    /// Ranges and the shorthands against the data source, with the shorthand features (the
    /// dataset's features are checked again once it is open).
    pub fn validate(&self, dataset: DatasetType) -> Result<(), WorkloadError> {
        let features = match &self.kind {
            Workload::Vae3d(v) => {
                return v.config.validate().map_err(|e| WorkloadError::invalid("policy", format!("(vae3d) {e}")));
            }
            Workload::Act(a) => {
                a.resolve()?;
                a.check_backbone_weights()?;
                &a.features
            }
            Workload::Diffusion(d) => {
                d.resolve()?;
                &d.features
            }
        };
        match features.first_set() {
            Some(k) if dataset != DatasetType::Random => Err(WorkloadError::invalid(
                &format!("policy.{k}"),
                format!("the dataset (dataset.type={}) defines the features; drop this flag or use dataset.type=random", dataset.name()),
            )),
            _ => Ok(()),
        }
    }
}

/// Why a `(D, H, W)` grid cannot go through `cfg`'s VAE (a size its downsampling does not
/// divide), or `None` when it can.
pub fn grid_mismatch(cfg: &Vae3dConfig, grid: [usize; 3]) -> Option<String> {
    let axes = ["D", "H", "W"].into_iter().zip(grid.into_iter().zip(cfg.downsample_factor()));
    axes.into_iter()
        .find(|(_, (size, factor))| size % factor != 0)
        .map(|(axis, (size, factor))| format!("{axis}={size} is not divisible by the VAE's downsampling factor {factor} along {axis}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load;

    fn ov(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn validation_catches_ranges_toggles_and_missing_files() {
        let check = |pairs: &[(&str, &str)], want: &[&str]| {
            let err = load(None, &ov(pairs)).and_then(|c| c.validate()).unwrap_err().to_string();
            assert!(want.iter().all(|w| err.contains(w)), "{pairs:?}: {err}");
        };
        check(&[("policy.type", "act"), ("steps", "0")], &["steps", "at least 1"]);
        check(&[("policy.type", "vae3d"), ("optimizer.lr_backbone", "1e-5")], &["lr_backbone", "no vision backbone"]);
        check(&[("policy.type", "vae3d"), ("dataset.type", "sim")], &["dataset.type", "voxels"]);
        check(&[("policy.type", "act"), ("dataset.type", "voxels")], &["dataset.type", "sim"]);
        check(&[("policy.type", "act"), ("dataset.type", "lerobot")], &["dataset.root", "required"]);
        check(&[("policy.type", "act"), ("dataset.type", "lerobot"), ("dataset.root", "/nonexistent/ds")], &["/nonexistent/ds", "no such directory"]);
        check(&[("policy.type", "act"), ("policy.state_dim", "3")], &["policy.state_dim", "defines the features"]);
        check(&[("policy.type", "act"), ("policy.chunk_size", "0")], &["chunk_size"]);
        check(&[("steps", "3")], &["policy.type", "required"]);
        check(&[("policy.type", "act"), ("dataset.episodes", "[]")], &["dataset.episodes", "no episode"]);
        check(&[("policy.type", "vae3d"), ("dataset.episodes", "0,1")], &["dataset.episodes", "voxels"]);
        check(&[("policy.type", "act"), ("dataset.episodes", "3,20")], &["dataset.episodes", "0..20"]);
    }

    #[test]
    fn a_data_flag_the_source_ignores_names_the_flag_and_the_source() {
        let err = |pairs: &[(&str, &str)]| load(None, &ov(pairs)).and_then(|c| c.validate()).err().map(|e| e.to_string());
        for (pairs, field, source) in [
            (&[("policy.type", "act"), ("dataset.grid", "4,16,16")][..], "dataset.grid", "dataset.type=sim"),
            (&[("policy.type", "act"), ("dataset.num_scenes", "3")], "dataset.num_scenes", "dataset.type=sim"),
            (&[("policy.type", "act"), ("dataset.type", "random"), ("dataset.shuffle", "false")], "dataset.shuffle", "dataset.type=random"),
            (&[("policy.type", "vae3d"), ("dataset.num_episodes", "3")], "dataset.num_episodes", "dataset.type=voxels"),
            (&[("policy.type", "vae3d"), ("dataset.root", "/d")], "dataset.root", "dataset.type=voxels"),
            (&[("policy.type", "vae3d"), ("dataset.image_size", "8,8")], "dataset.image_size", "dataset.type=voxels"),
            (&[("policy.type", "act"), ("policy.camera_shape", "3,480,640")], "policy.camera_shape", "dataset.type=sim"),
        ] {
            let e = err(pairs).unwrap_or_else(|| panic!("{pairs:?} accepted"));
            assert!(e.starts_with(field) && e.contains(source), "{pairs:?}: {e}");
        }
        // Where the source reads them, and at their defaults: accepted.
        assert_eq!(err(&[("policy.type", "vae3d"), ("dataset.grid", "4,16,16"), ("dataset.num_scenes", "3"), ("dataset.num_movers", "1")]), None);
        assert_eq!(err(&[("policy.type", "act"), ("dataset.num_episodes", "3"), ("dataset.image_size", "64,64"), ("dataset.shuffle", "false")]), None);
        assert_eq!(err(&[("policy.type", "act"), ("dataset.type", "random"), ("dataset.num_scenes", "3"), ("policy.camera_shape", "3,96,96")]), None);
        assert_eq!(err(&[("policy.type", "act"), ("dataset.grid", "8,32,32")]), None);
        // Loader bounds.
        assert!(err(&[("policy.type", "vae3d"), ("num_workers", "257")]).is_some_and(|e| e.contains("num_workers") && e.contains("256")));
        assert_eq!(err(&[("policy.type", "vae3d"), ("num_workers", "256")]), None);
    }

    #[test]
    fn synthetic_means_each_policys_built_in_data() {
        let t = |p: &str| load(None, &ov(&[("policy.type", p), ("dataset.type", "synthetic")])).unwrap().dataset_type().unwrap();
        assert_eq!(t("vae3d"), DatasetType::Voxels);
        assert_eq!(t("act"), DatasetType::Sim);
    }
}
