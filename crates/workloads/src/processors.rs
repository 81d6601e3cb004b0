//! lerobot 0.4.4's policy processors in a checkpoint's `pretrained_model/`: the JSON pipelines
//! `policy_preprocessor.json` (rename → to-batch → device → normalise) and
//! `policy_postprocessor.json` (unnormalise → device), each with its normaliser state
//! (`<name>_step_<i>_<registry name>.safetensors`: `<feature>.mean|std|min|max|count` as
//! float32, one entry per dataset statistic). Written so that lerobot's
//! `PolicyProcessorPipeline.from_pretrained` loads them, read back by `vramlab predict` to
//! take raw observations and return actions in the dataset's units. The state files are read
//! with [`vramlab_lerobot::normalize::add_state_dict`] (here and by `bench-inference`, through
//! [`read_stats_into`]).

use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use serde_json::{Value, json};
use vramlab_lerobot::normalize::{EPS_F64, FeatureSpec, NormMap, NormMode, add_state_dict, parse_feature_type};
use vramlab_lerobot::info::PolicyFeatureType;
use vramlab_lerobot::{Normalizer, Stats};

use crate::{Result, WorkloadError};

pub const PREPROCESSOR: &str = "policy_preprocessor.json";
pub const POSTPROCESSOR: &str = "policy_postprocessor.json";
/// The normaliser is step 3 of the preprocessor, the unnormaliser step 0 of the postprocessor.
pub const PREPROCESSOR_STATE: &str = "policy_preprocessor_step_3_normalizer_processor.safetensors";
pub const POSTPROCESSOR_STATE: &str = "policy_postprocessor_step_0_unnormalizer_processor.safetensors";

/// The processor files for a policy whose `config.json` is `config` (its `input_features`,
/// `output_features`, `normalization_mapping` and `device`), normalising with `stats` (final:
/// ImageNet's for cameras where the run used them). `(file name, bytes)`.
pub fn files(config: &Value, stats: &Stats) -> Result<Vec<(String, Vec<u8>)>> {
    let inputs = config.get("input_features").cloned().unwrap_or_else(|| json!({}));
    let outputs = config.get("output_features").cloned().unwrap_or_else(|| json!({}));
    let norm_map = config.get("normalization_mapping").cloned().unwrap_or_else(|| json!({}));
    let device = config.get("device").cloned().unwrap_or_else(|| json!("cpu"));
    let mut all = inputs.as_object().cloned().unwrap_or_default();
    all.extend(outputs.as_object().cloned().unwrap_or_default());
    let pre = json!({
        "name": "policy_preprocessor",
        "steps": [
            {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}},
            {"registry_name": "device_processor", "config": {"device": device, "float_dtype": null}},
            {"registry_name": "normalizer_processor", "config": {"eps": EPS_F64, "features": all, "norm_map": norm_map}, "state_file": PREPROCESSOR_STATE},
        ]
    });
    let post = json!({
        "name": "policy_postprocessor",
        "steps": [
            {"registry_name": "unnormalizer_processor", "config": {"eps": EPS_F64, "features": outputs, "norm_map": norm_map}, "state_file": POSTPROCESSOR_STATE},
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": null}},
        ]
    });
    let state = state_bytes(stats)?;
    let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("JSON values serialise").into_bytes();
    Ok(vec![
        (PREPROCESSOR.into(), pretty(&pre)),
        (PREPROCESSOR_STATE.into(), state.clone()),
        (POSTPROCESSOR.into(), pretty(&post)),
        (POSTPROCESSOR_STATE.into(), state),
    ])
}

/// The normaliser state: every statistic of every feature, float32, in the stats' shapes.
fn state_bytes(stats: &Stats) -> Result<Vec<u8>> {
    let mut tensors = Vec::new();
    for (key, s) in stats {
        let shape = if s.shape.is_empty() { vec![s.mean.len()] } else { s.shape.clone() };
        let t = |v: &[f64]| {
            let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            let shape = if v.len() == shape.iter().product::<usize>() { shape.clone() } else { vec![v.len()] };
            TensorData::new(v, shape)
        };
        for (name, v) in [("max", &s.max), ("mean", &s.mean), ("min", &s.min), ("std", &s.std)] {
            if !v.is_empty() {
                tensors.push((format!("{key}.{name}"), t(v)));
            }
        }
        if let Some(c) = s.count {
            tensors.push((format!("{key}.count"), TensorData::new(vec![c as f32], [1])));
        }
    }
    Ok(vramlab_store::safetensors_bytes(&tensors, Path::new(PREPROCESSOR_STATE))?)
}

/// A checkpoint's processors, read back: raw observations in, actions in the dataset's units out.
pub struct Processors {
    /// The preprocessor's normaliser (inputs and `action`).
    pub normalize: Normalizer,
    /// The postprocessor's unnormaliser (outputs).
    pub unnormalize: Normalizer,
    /// Input keys that are cameras (normalised per channel).
    pub cameras: Vec<String>,
}

/// Read `dir`'s processors; `None` when the checkpoint has none (the parity fixtures, older
/// vramlab checkpoints): inputs are then taken as already normalised.
pub fn read(dir: &Path) -> Result<Option<Processors>> {
    if !dir.join(PREPROCESSOR).exists() {
        return Ok(None);
    }
    let (normalize, cameras) = read_step(dir, PREPROCESSOR, "normalizer_processor")?;
    let (unnormalize, _) = read_step(dir, POSTPROCESSOR, "unnormalizer_processor")?;
    Ok(Some(Processors { normalize, unnormalize, cameras }))
}

/// The (un)normaliser step of a pipeline file, with its state, as a [`Normalizer`].
fn read_step(dir: &Path, file: &str, registry_name: &str) -> Result<(Normalizer, Vec<String>)> {
    let path = dir.join(file);
    let bad = |msg: String| WorkloadError::file(&path, msg);
    let text = std::fs::read_to_string(&path).map_err(|source| WorkloadError::Io { path: path.clone(), source })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let steps = v["steps"].as_array().ok_or_else(|| bad("no `steps` list".into()))?;
    let step = steps
        .iter()
        .find(|s| s["registry_name"] == registry_name)
        .ok_or_else(|| bad(format!("no `{registry_name}` step")))?;
    let cfg = &step["config"];
    let mut map = NormMap::new();
    for (t, mode) in cfg["norm_map"].as_object().into_iter().flatten() {
        let t = parse_feature_type(t).ok_or_else(|| bad(format!("norm_map: unknown feature type `{t}`")))?;
        let mode = mode.as_str().and_then(NormMode::parse).ok_or_else(|| bad(format!("norm_map: unknown mode {mode}")))?;
        map.insert(vramlab_lerobot::normalize::feature_type_name(t), mode);
    }
    let mut specs = Vec::new();
    let mut cameras = Vec::new();
    for (key, f) in cfg["features"].as_object().into_iter().flatten() {
        let kind = f["type"].as_str().and_then(parse_feature_type).ok_or_else(|| bad(format!("features.{key}.type: unknown {}", f["type"])))?;
        let shape: Vec<usize> = serde_json::from_value(f["shape"].clone()).map_err(|e| bad(format!("features.{key}.shape: {e}")))?;
        if kind == PolicyFeatureType::Visual {
            cameras.push(key.clone());
        }
        let channels = (kind == PolicyFeatureType::Visual).then(|| shape.first().copied()).flatten();
        specs.push(FeatureSpec { key: key.clone(), kind, numel: shape.iter().product(), channels });
    }
    let stats = match step["state_file"].as_str() {
        Some(name) => {
            let mut stats = Stats::new();
            read_stats_into(&dir.join(name), &mut stats)?;
            stats
        }
        None => Stats::new(),
    };
    let norm = Normalizer::from_features(specs, &stats, &map).map_err(|e| bad(e.to_string()))?;
    Ok((norm, cameras))
}

/// The normaliser state files of `dir`, sorted: lerobot's
/// `policy_preprocessor_step_<i>_normalizer_processor.safetensors` and
/// `policy_postprocessor_step_<i>_unnormalizer_processor.safetensors`.
pub fn stats_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|source| WorkloadError::Io { path: dir.to_path_buf(), source })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with("_normalizer_processor.safetensors") || name.ends_with("_unnormalizer_processor.safetensors")
        })
        .collect();
    files.sort();
    Ok(files)
}

/// A normaliser state file's `<feature>.<stat>` tensors into `stats`
/// ([`vramlab_lerobot::normalize::add_state_dict`]: a tensor replaces an earlier one).
pub fn read_stats_into(path: &Path, stats: &mut Stats) -> Result<()> {
    let tensors = vramlab_store::read_safetensors(path)?.into_iter().map(|(name, data)| {
        let shape = data.shape.to_vec();
        (name, shape, data.convert::<f32>().to_vec::<f32>().unwrap_or_default())
    });
    add_state_dict(stats, tensors);
    Ok(())
}
