//! What vramlab does with lerobot 0.4.4's run-level flags and files: the generic
//! `PreTrainedConfig` keys of a policy (`--policy.device`, `--policy.use_amp`, …;
//! [`apply_policy_keys`]) and lerobot's `train_config.json` given as `--config_path`
//! ([`train_config_tree`]). Each key either has its lerobot effect, is harmless and said so,
//! or is an error that names what to use instead.
//!
//! Reference: huggingface/lerobot v0.4.4 `configs/policies.py` (`PreTrainedConfig`),
//! `configs/train.py` (`TrainPipelineConfig`), `configs/default.py` (`DatasetConfig`,
//! `WandBConfig`, `EvalConfig`), `scripts/lerobot_train.py`.
//!
//! # `PreTrainedConfig` keys
//! Read from the policy fields as the user wrote them (flags, TOML, `train_config.json`); a
//! `--policy.path` checkpoint's own `config.json` does not ask for a device or AMP.
//!
//! | key | lerobot 0.4.4 | vramlab |
//! |---|---|---|
//! | `device` | torch device; an unavailable one falls back to the best available, with a warning | the backend: `cpu` → flex, `cuda` / `cuda:N` → cuda (GPU `N`), `wgpu` → wgpu; `mps` / `xpu` → error (use `wgpu`); a backend not compiled in, or one that contradicts `--backend` / `--device`, → error naming both |
//! | `use_amp` | `lerobot-train` builds its `Accelerator` without `mixed_precision`, so training precision comes from `accelerate launch --mixed_precision`; eval/record wrap the policy in `torch.autocast` | `true` → `precision=bf16` (weights stay f32), with a note; with an explicit `--precision=f32` → error |
//! | `pretrained_path` | set by lerobot from `--policy.path` | error: use `--policy.path=DIR` |
//! | `use_peft` | LoRA adapters (PEFT) | `true` → error (full fine-tuning only) |
//! | `input_features`, `output_features` | from the dataset (`make_policy`), a non-empty `input_features` kept as given | from the dataset always; a non-empty value → error (shapes without a dataset: the shorthands with `dataset.type=random`) |
//! | `push_to_hub` | upload the final checkpoint | `true` → a note: vramlab does not upload |
//! | `repo_id`, `private`, `tags`, `license` | Hub upload metadata | kept in `config.json`, no effect |
//!
//! # `train_config.json`
//! lerobot writes its whole `TrainPipelineConfig` next to every checkpoint's
//! `pretrained_model/`. Mapped onto vramlab's config tree (then typed and validated as a TOML
//! file would be; flags still apply on top):
//!
//! | lerobot key | vramlab |
//! |---|---|
//! | `dataset.repo_id`, `root`, `revision`, `episodes` | same fields (`dataset.type = lerobot` when `repo_id` or `root` is set) |
//! | `dataset.image_transforms` | `enable`, `max_num_transforms`, `random_order`; each `tfs.<name>.weight` → `weights` (a transform left out: 0); non-default `tfs` types/ranges → error |
//! | `dataset.use_imagenet_stats` | `true` (what vramlab does); `false` → error |
//! | `dataset.streaming` | `false`; `true` → error |
//! | `dataset.video_backend` | ignored (vramlab decodes AV1 itself) |
//! | `policy` | `policy.*`; its `input_features` / `output_features` dropped, noted (vramlab takes them from the dataset) |
//! | `output_dir`, `job_name`, `resume`, `seed`, `num_workers`, `batch_size`, `steps`, `log_freq`, `save_freq` | same fields (`seed: null` → vramlab's 1000, noted) |
//! | `use_policy_training_preset` | `true`: `optimizer` / `scheduler` ignored (lerobot replaces them with the policy's preset too); `false`: they map to `optimizer.*` / `scheduler.*` (Adam/AdamW; diffusers `cosine` / `constant` / `constant_with_warmup`; no scheduler → constant), anything else → error |
//! | `env`, `eval`, `eval_freq` | ignored, noted when `env` is set (vramlab has no simulation evaluation) |
//! | `wandb` | ignored, noted when enabled (metrics go to `metrics.jsonl`) |
//! | `save_checkpoint` | `save_checkpoint` |
//! | `tolerance_s` | ignored, noted when not lerobot's default |
//! | `peft`, `use_rabc`, `rename_map` | `null` / `false` / `{}`; otherwise → error |
//! | `rabc_*`, `checkpoint_path` | ignored (only used with `use_rabc`; lerobot-internal) |
//!
//! Any other key is an error (lerobot rejects unknown keys too). The `train_config.json` that
//! vramlab writes into its own checkpoints reads back the same way.

use std::path::Path;

use serde_json::{Map, Value, json};
use vramlab_models::nn::Precision;

use super::tree::set_dotted;
use super::types::RunConfig;
use crate::backend::{self, BackendKind};
use crate::error::{Result, WorkloadError};

/// lerobot's `policy.device` → vramlab's backend and, for `cuda:N`, the GPU index.
fn backend_of_device(device: &str) -> std::result::Result<(BackendKind, Option<usize>), String> {
    Ok(match device {
        "cpu" | "flex" => (BackendKind::Flex, None),
        "cuda" => (BackendKind::Cuda, None),
        "wgpu" => (BackendKind::Wgpu, None),
        "mps" => return Err("PyTorch's Metal device has no vramlab backend; use policy.device=wgpu (Metal through wgpu) or cpu".into()),
        "xpu" => return Err("PyTorch's Intel GPU device has no vramlab backend; use policy.device=wgpu (Vulkan through wgpu) or cpu".into()),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => (BackendKind::Cuda, Some(i)),
            _ => return Err("unknown device; valid: cpu, cuda, cuda:N, wgpu".into()),
        },
    })
}

/// Act on the policy's generic lerobot keys (table above): set the run's backend, GPU and
/// precision from `device` / `use_amp`, reject what vramlab cannot do, and return the notes
/// to print at start (`note: …`, or `WARNING: …` for the ACT backbone's missing ImageNet
/// weights, [`super::PolicyConfig::notes`]). `tree` is the config tree the run was typed from: a top-level `backend` /
/// `device` / `precision` in it was given explicitly.
pub fn apply_policy_keys(cfg: &mut RunConfig, tree: &Map<String, Value>) -> Result<Vec<String>> {
    let Some(policy) = cfg.policy.clone() else { return Ok(Vec::new()) };
    let raw = policy.raw();
    let mut notes = Vec::new();
    match raw.get("device") {
        None | Some(Value::Null) => {}
        Some(Value::String(device)) => {
            let (kind, index) = backend_of_device(device).map_err(|why| WorkloadError::invalid("policy.device", format!("{device}: {why}")))?;
            if tree.contains_key("backend") && cfg.backend != kind {
                return Err(WorkloadError::invalid(
                    "policy.device",
                    format!("{device} selects the {kind} backend but backend={} is also given; drop one of them", cfg.backend),
                ));
            }
            if !backend::compiled().contains(&kind.to_string().as_str()) {
                return Err(WorkloadError::invalid(
                    "policy.device",
                    format!(
                        "{device} selects the {kind} backend, which is not compiled into this binary (compiled: {}); rebuild with `--features {kind}`, or pass --policy.device=cpu",
                        backend::compiled().join(", ")
                    ),
                ));
            }
            if let Some(i) = index {
                if tree.contains_key("device") && cfg.device != i {
                    return Err(WorkloadError::invalid("policy.device", format!("{device} selects GPU {i} but device={} is also given; drop one of them", cfg.device)));
                }
                cfg.device = i;
            }
            cfg.backend = kind;
        }
        Some(other) => return Err(WorkloadError::invalid("policy.device", format!("expected a device name (cpu, cuda, cuda:N, wgpu), found {other}"))),
    }
    match raw.get("use_amp") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) if tree.contains_key("precision") => {
            if cfg.precision == Precision::F32 {
                return Err(WorkloadError::invalid("policy.use_amp", "true asks for mixed precision but precision=f32 is also given; drop one of them (or use --precision=bf16|f16)".into()));
            }
        }
        Some(Value::Bool(true)) => {
            cfg.precision = Precision::Bf16;
            notes.push(
                "note: policy.use_amp=true: training in bf16 (--precision=bf16; weights and optimizer state stay f32). lerobot 0.4.4's lerobot-train \
                 leaves mixed precision to `accelerate launch --mixed_precision`; --precision=f16 is its fp16 (with loss scaling)"
                    .into(),
            );
        }
        Some(other) => return Err(WorkloadError::invalid("policy.use_amp", format!("expected true or false, found {other}"))),
    }
    for key in ["input_features", "output_features"] {
        if raw.get(key).and_then(Value::as_object).is_some_and(|m| !m.is_empty()) {
            return Err(WorkloadError::invalid(
                &format!("policy.{key}"),
                "vramlab takes the features from the dataset (its state, every camera in the dataset's order, its action); for other \
                 shapes use dataset.type=random with policy.state_dim / action_dim / camera_shape / num_cameras"
                    .into(),
            ));
        }
    }
    if raw.get("pretrained_path").is_some_and(|v| !v.is_null()) {
        return Err(WorkloadError::invalid(
            "policy.pretrained_path",
            "use --policy.path=DIR (a pretrained_model/ or checkpoint directory) to start from pretrained weights; pretrained_path is where lerobot records it".into(),
        ));
    }
    if raw.get("use_peft") == Some(&Value::Bool(true)) {
        return Err(WorkloadError::invalid("policy.use_peft", "PEFT (LoRA adapters) is not implemented by vramlab; drop it for full fine-tuning (--policy.path)".into()));
    }
    if raw.get("push_to_hub") == Some(&Value::Bool(true)) {
        notes.push("note: policy.push_to_hub=true: vramlab does not upload to the Hugging Face Hub; upload a checkpoint yourself (`huggingface-cli upload REPO_ID DIR`)".into());
    }
    Ok(notes)
}

/// lerobot's default image transforms (`ImageTransformsConfig.tfs`), in vramlab's `weights`
/// order: name, transform type, kwargs.
fn default_transforms() -> [(&'static str, &'static str, Value); 6] {
    [
        ("brightness", "ColorJitter", json!({"brightness": [0.8, 1.2]})),
        ("contrast", "ColorJitter", json!({"contrast": [0.8, 1.2]})),
        ("saturation", "ColorJitter", json!({"saturation": [0.5, 1.5]})),
        ("hue", "ColorJitter", json!({"hue": [-0.05, 0.05]})),
        ("sharpness", "SharpnessJitter", json!({"sharpness": [0.5, 1.5]})),
        ("affine", "RandomAffine", json!({"degrees": [-5.0, 5.0], "translate": [0.05, 0.05]})),
    ]
}

/// Numbers compare as f64 (`5` and `5.0` are the same range).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y)),
        (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w))),
        _ => a == b,
    }
}

/// The mapping of one `train_config.json`: the tree, the ignored keys worth a note, and errors
/// naming the key.
struct Mapping<'a> {
    path: &'a Path,
    tree: Map<String, Value>,
    ignored: Vec<String>,
}

impl Mapping<'_> {
    fn err(&self, key: &str, msg: impl std::fmt::Display) -> WorkloadError {
        WorkloadError::ConfigFile { path: self.path.to_path_buf(), msg: format!("{key}: {msg}") }
    }

    fn set(&mut self, key: &str, value: Value) -> Result<()> {
        set_dotted(&mut self.tree, key, value)
    }

    fn dataset(&mut self, d: &Map<String, Value>) -> Result<()> {
        // lerobot always names a dataset; vramlab's own train_config.json of a run on built-in
        // or random data names none, and that run's data stays the policy's default.
        if ["repo_id", "root"].iter().any(|k| d.get(*k).is_some_and(|v| !v.is_null())) {
            self.set("dataset.type", json!("lerobot"))?;
        }
        for (k, v) in d {
            let key = format!("dataset.{k}");
            match (k.as_str(), v) {
                (_, Value::Null) | ("video_backend", _) | ("use_imagenet_stats", Value::Bool(true)) | ("streaming", Value::Bool(false)) => {}
                ("repo_id" | "root" | "revision" | "episodes", _) => self.set(&key, v.clone())?,
                ("image_transforms", Value::Object(t)) => self.image_transforms(t)?,
                ("use_imagenet_stats", _) => return Err(self.err(&key, "vramlab normalises cameras with ImageNet stats (lerobot's default, true)")),
                ("streaming", _) => return Err(self.err(&key, "streaming is not implemented: vramlab reads the dataset from disk (drop it)")),
                _ => return Err(self.err(&key, format!("unexpected {v} (not a lerobot 0.4.4 DatasetConfig field of this type)"))),
            }
        }
        Ok(())
    }

    fn image_transforms(&mut self, t: &Map<String, Value>) -> Result<()> {
        let enable = t.get("enable").and_then(Value::as_bool).unwrap_or(false);
        self.set("dataset.image_transforms.enable", json!(enable))?;
        // `weights`: vramlab's own train_config.json writes its transform weights directly.
        for k in ["max_num_transforms", "random_order", "weights"] {
            if let Some(v) = t.get(k) {
                self.set(&format!("dataset.image_transforms.{k}"), v.clone())?;
            }
        }
        if let Some(k) = t.keys().find(|k| !["enable", "max_num_transforms", "random_order", "tfs", "weights"].contains(&k.as_str())) {
            return Err(self.err(&format!("dataset.image_transforms.{k}"), "unknown key"));
        }
        let Some(tfs) = t.get("tfs").filter(|_| enable) else { return Ok(()) };
        let tfs = tfs.as_object().ok_or_else(|| self.err("dataset.image_transforms.tfs", "expected an object of transforms"))?;
        let defaults = default_transforms();
        if let Some(name) = tfs.keys().find(|n| !defaults.iter().any(|(d, _, _)| d == n)) {
            let valid: Vec<&str> = defaults.iter().map(|(n, _, _)| *n).collect();
            return Err(self.err(&format!("dataset.image_transforms.tfs.{name}"), format!("vramlab implements lerobot's default transforms only: {}", valid.join(", "))));
        }
        // A transform left out of `tfs` is never drawn: weight 0.
        let mut weights = Vec::new();
        for (name, kind, kwargs) in &defaults {
            let Some(tf) = tfs.get(*name) else {
                weights.push(json!(0.0));
                continue;
            };
            let key = format!("dataset.image_transforms.tfs.{name}");
            if tf.get("type").and_then(Value::as_str) != Some(kind) || !tf.get("kwargs").is_some_and(|k| same_json(k, kwargs)) {
                return Err(self.err(&key, format!("vramlab implements lerobot's default {name} only (type {kind}, kwargs {kwargs}); found {tf}")));
            }
            weights.push(tf.get("weight").cloned().unwrap_or(json!(1.0)));
        }
        self.set("dataset.image_transforms.weights", Value::Array(weights))
    }

    fn optimizer(&mut self, o: &Map<String, Value>) -> Result<()> {
        for (k, v) in o {
            let key = format!("optimizer.{k}");
            match k.as_str() {
                "type" if matches!(v.as_str(), Some("adam" | "adamw")) => self.set(&key, v.clone())?,
                "type" => return Err(self.err(&key, format!("{v}: vramlab implements adam and adamw"))),
                "lr" | "betas" | "eps" | "weight_decay" | "grad_clip_norm" => self.set(&key, v.clone())?,
                _ => return Err(self.err(&key, "not an AdamConfig / AdamWConfig field")),
            }
        }
        Ok(())
    }

    fn scheduler(&mut self, s: Option<&Map<String, Value>>) -> Result<()> {
        // No scheduler: lerobot keeps the optimizer's learning rate.
        let Some(s) = s else {
            self.set("scheduler.type", json!("constant"))?;
            return self.set("scheduler.warmup_steps", json!(0));
        };
        let kind = s.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "diffuser" {
            return Err(self.err("scheduler.type", format!("{kind:?}: vramlab implements lerobot's \"diffuser\" schedules (cosine, constant, constant_with_warmup)")));
        }
        let warmup = s.get("num_warmup_steps").cloned().unwrap_or(json!(0));
        let (name, warmup) = match s.get("name").and_then(Value::as_str) {
            Some("cosine") => ("cosine", warmup),
            // diffusers' `constant` has no warmup.
            Some("constant") => ("constant", json!(0)),
            Some("constant_with_warmup") => ("constant", warmup),
            other => return Err(self.err("scheduler.name", format!("{other:?}: vramlab implements cosine, constant and constant_with_warmup"))),
        };
        if let Some(k) = s.keys().find(|k| !["type", "name", "num_warmup_steps"].contains(&k.as_str())) {
            return Err(self.err(&format!("scheduler.{k}"), "not a DiffuserSchedulerConfig field"));
        }
        self.set("scheduler.type", json!(name))?;
        self.set("scheduler.warmup_steps", warmup)
    }
}

/// lerobot's `train_config.json` (text of `path`) as vramlab's config tree, plus the notes to
/// print (keys ignored because they have no vramlab effect). See the table above.
pub fn train_config_tree(text: &str, path: &Path) -> Result<(Map<String, Value>, Vec<String>)> {
    let mut m = Mapping { path, tree: Map::new(), ignored: Vec::new() };
    let root: Value = serde_json::from_str(text).map_err(|e| m.err("train_config.json", e))?;
    let root = root.as_object().ok_or_else(|| m.err("train_config.json", "expected an object (lerobot's TrainPipelineConfig)"))?;
    let env_set = root.get("env").is_some_and(|v| !v.is_null());
    let preset = root.get("use_policy_training_preset").and_then(Value::as_bool).unwrap_or(true);
    let mut notes = Vec::new();
    for (k, v) in root {
        match (k.as_str(), v) {
            ("dataset", Value::Object(d)) => m.dataset(d)?,
            ("policy", Value::Object(p)) => {
                if p.get("input_features").and_then(Value::as_object).is_some_and(|f| !f.is_empty()) {
                    m.ignored.push("policy.input_features / output_features (taken from the dataset: its state, every camera, its action)".into());
                }
                let fields: Map<String, Value> = p.iter().filter(|(k, _)| !["input_features", "output_features"].contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
                m.tree.insert("policy".into(), Value::Object(fields));
            }
            ("seed", Value::Null) => notes.push("note: train_config.json: seed=null (lerobot: unseeded); vramlab always seeds, with 1000".into()),
            ("output_dir" | "job_name" | "policy", Value::Null) => {}
            ("output_dir" | "job_name" | "resume" | "seed" | "num_workers" | "batch_size" | "steps" | "log_freq" | "save_freq" | "save_checkpoint", _) => {
                m.tree.insert(k.clone(), v.clone());
            }
            ("use_policy_training_preset", Value::Bool(_)) => {}
            ("optimizer", Value::Object(o)) if !preset => m.optimizer(o)?,
            ("scheduler", Value::Object(s)) if !preset => m.scheduler(Some(s))?,
            ("scheduler", Value::Null) if !preset => m.scheduler(None)?,
            ("optimizer", Value::Null) if !preset => return Err(m.err(k, "required when use_policy_training_preset is false (lerobot raises too)")),
            // lerobot replaces both with the policy's preset; vramlab uses the preset the same way.
            ("optimizer" | "scheduler", _) => {}
            ("env" | "eval" | "eval_freq", _) => {
                if env_set && k == "env" {
                    m.ignored.push("env, eval, eval_freq (vramlab has no simulation evaluation)".into());
                }
            }
            ("wandb", w) => {
                if w.get("enable") == Some(&Value::Bool(true)) {
                    m.ignored.push("wandb (metrics go to metrics.jsonl)".into());
                }
            }
            ("tolerance_s", t) if t.as_f64() != Some(1e-4) => m.ignored.push(format!("tolerance_s={t} (vramlab indexes frames, it does not match timestamps)")),
            ("tolerance_s", _) => {}
            ("peft" | "use_rabc", Value::Null | Value::Bool(false)) => {}
            ("peft", _) => return Err(m.err(k, "PEFT (LoRA adapters) is not implemented by vramlab; set it to null")),
            ("use_rabc", _) => return Err(m.err(k, "reward-aligned behaviour cloning is not implemented by vramlab; set it to false")),
            ("rename_map", Value::Object(r)) if r.is_empty() => {}
            ("rename_map", _) => return Err(m.err(k, "vramlab reads the dataset's own feature keys; rename them in the dataset instead")),
            ("rabc_progress_path" | "rabc_kappa" | "rabc_epsilon" | "rabc_head_mode" | "checkpoint_path", _) => {}
            _ => return Err(m.err(k, format!("unexpected {v} (not a lerobot 0.4.4 TrainPipelineConfig field of this type)"))),
        }
    }
    if !m.ignored.is_empty() {
        notes.push(format!("note: {}: ignored (no effect on a vramlab run): {}", path.display(), m.ignored.join("; ")));
    }
    Ok((m.tree, notes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Workload;

    fn ov(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn load(pairs: &[(&str, &str)]) -> Result<RunConfig> {
        crate::config::load(None, &ov(pairs))
    }

    #[test]
    fn policy_device_picks_the_backend() {
        let c = load(&[("policy.type", "act"), ("policy.device", "cpu")]).unwrap();
        assert_eq!(c.backend, BackendKind::Flex);
        let c = load(&[("policy.type", "diffusion"), ("policy.device", "cpu"), ("backend", "flex")]).unwrap();
        assert_eq!(c.backend, BackendKind::Flex);
        let err = |pairs: &[(&str, &str)]| load(pairs).unwrap_err().to_string();
        let e = err(&[("policy.type", "act"), ("policy.device", "mps")]);
        assert!(e.contains("policy.device") && e.contains("wgpu"), "{e}");
        let e = err(&[("policy.type", "act"), ("policy.device", "tpu")]);
        assert!(e.contains("policy.device") && e.contains("cuda:N"), "{e}");
        let e = err(&[("policy.type", "act"), ("policy.device", "cpu"), ("backend", "cuda")]);
        assert!(e.contains("policy.device") && e.contains("backend=cuda"), "{e}");
        match load(&[("policy.type", "act"), ("policy.device", "cuda:1")]) {
            Ok(c) => assert_eq!((c.backend, c.device), (BackendKind::Cuda, 1)),
            Err(e) => assert!(!cfg!(feature = "cuda") && e.to_string().contains("not compiled") && e.to_string().contains("--features cuda"), "{e}"),
        }
    }

    #[test]
    fn use_amp_means_bf16_and_conflicts_with_f32() {
        let c = load(&[("policy.type", "act"), ("policy.use_amp", "true")]).unwrap();
        assert_eq!(c.precision, Precision::Bf16);
        assert!(c.notes.iter().any(|n| n.contains("use_amp=true") && n.contains("bf16")), "{:?}", c.notes);
        let c = load(&[("policy.type", "act"), ("policy.use_amp", "true"), ("precision", "f16")]).unwrap();
        assert_eq!(c.precision, Precision::F16);
        let c = load(&[("policy.type", "act"), ("policy.use_amp", "false")]).unwrap();
        assert_eq!(c.precision, Precision::F32);
        let e = load(&[("policy.type", "act"), ("policy.use_amp", "true"), ("precision", "f32")]).unwrap_err().to_string();
        assert!(e.contains("policy.use_amp") && e.contains("precision=f32"), "{e}");
    }

    #[test]
    fn unsupported_generic_keys_say_what_to_use() {
        let e = load(&[("policy.type", "diffusion"), ("policy.pretrained_path", "outputs/x/pretrained_model")]).unwrap_err().to_string();
        assert!(e.contains("policy.pretrained_path") && e.contains("--policy.path"), "{e}");
        let e = load(&[("policy.type", "act"), ("policy.use_peft", "true")]).unwrap_err().to_string();
        assert!(e.contains("policy.use_peft"), "{e}");
        let c = load(&[("policy.type", "act"), ("policy.push_to_hub", "true"), ("policy.repo_id", "me/act")]).unwrap();
        assert!(c.notes.iter().any(|n| n.contains("push_to_hub")), "{:?}", c.notes);
        assert!(!load(&[("policy.type", "act"), ("policy.push_to_hub", "false")]).unwrap().notes.iter().any(|n| n.contains("push_to_hub")));
        let dir = vramlab_testkit::temp_dir("lerobot-config");
        let toml = dir.path().join("features.toml");
        std::fs::write(&toml, "[policy]\ntype = \"act\"\n[policy.input_features.\"observation.state\"]\ntype = \"STATE\"\nshape = [2]\n").unwrap();
        let e = crate::config::load(Some(&toml), &[]).unwrap_err().to_string();
        assert!(e.contains("policy.input_features") && e.contains("dataset"), "{e}");
    }

    #[test]
    fn imagenet_backbone_weights_warn_at_start() {
        // A training note (printed by the commands that train, not by estimate or info).
        let c = load(&[("policy.type", "act")]).unwrap();
        assert!(c.notes.is_empty(), "{:?}", c.notes);
        let notes = c.training_notes();
        assert!(notes.iter().any(|n| n.starts_with("WARNING") && n.contains("ResNet18_Weights.IMAGENET1K_V1") && n.contains("safetensors")), "{notes:?}");
        let c = load(&[("policy.type", "act"), ("policy.pretrained_backbone_weights", "null")]).unwrap();
        assert!(c.notes.is_empty() && c.training_notes().is_empty(), "{:?}", c.notes);
        // A missing file is an error naming the field and the path, before anything runs.
        let c = load(&[("policy.type", "act"), ("policy.pretrained_backbone_weights", "/nonexistent/r18.safetensors")]).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("policy.pretrained_backbone_weights") && e.contains("/nonexistent/r18.safetensors"), "{e}");
    }

    /// A `train_config.json` as lerobot 0.4.4 writes it (`draccus.dump` of `TrainPipelineConfig`
    /// for `lerobot-train --policy.type=diffusion --dataset.repo_id=lerobot/pusht`, trimmed of
    /// the policy's features and default transforms).
    fn lerobot_train_config(root: &Path) -> Value {
        json!({
            "dataset": {"repo_id": "lerobot/pusht", "root": root, "episodes": [0, 1], "image_transforms": {"enable": true, "max_num_transforms": 2,
                "random_order": false, "tfs": {"brightness": {"weight": 2.0, "type": "ColorJitter", "kwargs": {"brightness": [0.8, 1.2]}},
                "affine": {"weight": 1.0, "type": "RandomAffine", "kwargs": {"degrees": [-5.0, 5.0], "translate": [0.05, 0.05]}}}},
                "revision": null, "use_imagenet_stats": true, "video_backend": "torchcodec", "streaming": false},
            "env": null,
            "policy": {"type": "diffusion", "n_obs_steps": 2, "input_features": {"observation.state": {"type": "STATE", "shape": [2]}},
                "output_features": {"action": {"type": "ACTION", "shape": [2]}}, "device": "cpu", "use_amp": false, "use_peft": false,
                "push_to_hub": false, "repo_id": null, "private": null, "tags": null, "license": null, "pretrained_path": null, "horizon": 16,
                "n_action_steps": 8, "drop_n_last_frames": 7, "vision_backbone": "resnet18", "resize_shape": null, "crop_ratio": 1.0,
                "crop_shape": [84, 84], "crop_is_random": true, "pretrained_backbone_weights": null, "use_group_norm": true,
                "down_dims": [64, 128, 256], "compile_model": false, "compile_mode": "reduce-overhead", "scheduler_name": "cosine",
                "scheduler_warmup_steps": 500},
            "output_dir": "outputs/train/pusht", "job_name": "pusht_diffusion", "resume": false, "seed": 7, "num_workers": 4,
            "batch_size": 64, "steps": 200000, "eval_freq": 25000, "log_freq": 200, "tolerance_s": 0.0001, "save_checkpoint": true,
            "save_freq": 25000, "use_policy_training_preset": true,
            "optimizer": {"type": "adam", "lr": 0.0001, "weight_decay": 1e-06, "grad_clip_norm": 10.0, "betas": [0.95, 0.999], "eps": 1e-08},
            "scheduler": {"type": "diffuser", "num_warmup_steps": 500, "name": "cosine"},
            "eval": {"n_episodes": 50, "batch_size": 50, "use_async_envs": false},
            "wandb": {"enable": true, "disable_artifact": false, "project": "lerobot", "entity": null, "notes": null, "run_id": null, "mode": null},
            "peft": null, "use_rabc": false, "rabc_progress_path": null, "rabc_kappa": 0.01, "rabc_epsilon": 1e-06, "rabc_head_mode": "sparse",
            "rename_map": {}, "checkpoint_path": null
        })
    }

    fn write(dir: &Path, v: &Value) -> std::path::PathBuf {
        let p = dir.join("train_config.json");
        std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
        p
    }

    #[test]
    fn lerobot_train_config_json_maps_onto_the_run_config() {
        let dir = vramlab_testkit::temp_dir("lerobot-config");
        let path = write(dir.path(), &lerobot_train_config(Path::new("/data/pusht")));
        let c = crate::config::load(Some(&path), &ov(&[("steps", "10")])).unwrap();
        assert_eq!((c.batch_size, c.steps, c.seed, c.num_workers, c.log_freq, c.save_freq), (64, 10, 7, 4, 200, 25000));
        assert_eq!((c.job_name.as_deref(), c.output_dir.as_deref()), (Some("pusht_diffusion"), Some(Path::new("outputs/train/pusht"))));
        assert_eq!(c.dataset_type().unwrap(), crate::DatasetType::Lerobot);
        assert_eq!((c.dataset.root.as_deref(), c.dataset.episodes.as_deref()), (Some(Path::new("/data/pusht")), Some(&[0, 1][..])));
        assert_eq!(c.dataset.repo_id.as_deref(), Some("lerobot/pusht"));
        let t = &c.dataset.image_transforms;
        assert_eq!((t.enable, t.max_num_transforms, t.weights), (true, 2, [2.0, 0.0, 0.0, 0.0, 0.0, 1.0]));
        let Workload::Diffusion(d) = &c.policy().unwrap().kind else { panic!("a diffusion policy") };
        assert_eq!((d.config.crop_shape, d.config.down_dims.as_slice()), (Some([84, 84]), &[64, 128, 256][..]));
        assert!(d.config.input_features.image_features().is_empty(), "features come from the dataset");
        // The preset (use_policy_training_preset) drives the optimizer, as in lerobot.
        assert_eq!((c.optimizer.lr, c.scheduler.kind), (None, None));
        assert!(c.notes.iter().any(|n| n.contains("ignored") && n.contains("wandb")), "{:?}", c.notes);
    }

    #[test]
    fn train_config_without_preset_maps_optimizer_and_scheduler() {
        let mut v = lerobot_train_config(Path::new("/data/pusht"));
        v["use_policy_training_preset"] = json!(false);
        v["scheduler"] = json!({"type": "diffuser", "num_warmup_steps": 100, "name": "constant_with_warmup"});
        v["optimizer"]["lr"] = json!(3e-4);
        let (tree, _) = train_config_tree(&v.to_string(), Path::new("t.json")).unwrap();
        assert_eq!(tree["optimizer"]["lr"], json!(3e-4));
        assert_eq!(tree["optimizer"]["type"], json!("adam"));
        assert_eq!((&tree["scheduler"]["type"], &tree["scheduler"]["warmup_steps"]), (&json!("constant"), &json!(100)));
        v["scheduler"] = Value::Null;
        // As vramlab writes it for a run on built-in data: no dataset named, its own `weights`.
        v["dataset"] = json!({"repo_id": null, "root": null, "image_transforms": {"enable": false, "weights": [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]}});
        let (tree, _) = train_config_tree(&v.to_string(), Path::new("t.json")).unwrap();
        assert_eq!((&tree["scheduler"]["type"], &tree["scheduler"]["warmup_steps"]), (&json!("constant"), &json!(0)));
        assert_eq!(tree["dataset"].get("type"), None, "the policy's built-in data");
        assert_eq!(tree["dataset"]["image_transforms"]["weights"], json!([1.0, 1.0, 1.0, 1.0, 1.0, 0.0]));
    }

    #[test]
    fn train_config_keys_that_would_change_training_are_errors() {
        let check = |edit: &dyn Fn(&mut Value), want: &str| {
            let mut v = lerobot_train_config(Path::new("/data/pusht"));
            edit(&mut v);
            let e = train_config_tree(&v.to_string(), Path::new("t.json")).unwrap_err().to_string();
            assert!(e.contains("t.json") && e.contains(want), "{want}: {e}");
        };
        check(&|v| v["dataset"]["use_imagenet_stats"] = json!(false), "dataset.use_imagenet_stats");
        check(&|v| v["dataset"]["streaming"] = json!(true), "dataset.streaming");
        check(&|v| v["dataset"]["image_transforms"]["tfs"]["brightness"]["kwargs"]["brightness"] = json!([0.5, 1.5]), "tfs.brightness");
        check(&|v| v["use_rabc"] = json!(true), "use_rabc");
        check(&|v| v["rename_map"] = json!({"observation.images.top": "observation.image"}), "rename_map");
        check(&|v| v["peft"] = json!({"method_type": "LORA"}), "peft");
        check(&|v| v["stepz"] = json!(3), "stepz");
        check(
            &|v| {
                v["use_policy_training_preset"] = json!(false);
                v["scheduler"] = json!({"type": "cosine_decay_with_warmup", "num_warmup_steps": 10});
            },
            "scheduler.type",
        );
        check(
            &|v| {
                v["use_policy_training_preset"] = json!(false);
                v["optimizer"]["type"] = json!("sgd");
            },
            "optimizer.type",
        );
    }
}
