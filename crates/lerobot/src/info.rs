//! `meta/info.json`: version, fps, features, path templates.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::error::DatasetError;

/// Dataset layout version (from `codebase_version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// v2.0 / v2.1: one parquet (and one mp4 per camera) per episode, jsonl metadata.
    V2,
    /// v3.0: episodes concatenated into chunked files, parquet metadata.
    V3,
}

/// What a feature holds, derived from its `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureKind {
    /// Camera stored as mp4 video (`dtype: "video"`).
    Video,
    /// Camera stored in parquet as struct{bytes, path} (`dtype: "image"`).
    Image,
    /// Numbers (float32/float64/int*/bool): read as `f32`.
    Numeric,
    /// Text (`dtype: "string"`).
    String,
}

/// Feature type as lerobot's policies see it (`FeatureType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyFeatureType {
    Visual,
    State,
    Env,
    Action,
    Reward,
}

/// One entry of `info.json` `features`.
#[derive(Debug, Clone, PartialEq)]
pub struct Feature {
    pub dtype: String,
    pub shape: Vec<usize>,
    /// `names` as written (list, dict, or null).
    pub names: Option<Value>,
    /// Extra `info` (video codec, pix_fmt...), if any.
    pub info: Option<Value>,
}

impl Feature {
    pub fn kind(&self) -> FeatureKind {
        match self.dtype.as_str() {
            "video" => FeatureKind::Video,
            "image" => FeatureKind::Image,
            "string" => FeatureKind::String,
            _ => FeatureKind::Numeric,
        }
    }
    /// Number of scalars per frame (product of `shape`).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Camera shape as (channels, height, width), from the HWC `shape` (or CHW when
    /// `names` says so, as some older datasets do).
    pub fn chw(&self) -> Option<(usize, usize, usize)> {
        if self.shape.len() != 3 {
            return None;
        }
        let chw_names = self
            .names
            .as_ref()
            .and_then(|n| n.as_array())
            .and_then(|a| a.first())
            .and_then(|v| v.as_str())
            .map(|s| s.starts_with("channel"))
            .unwrap_or(false);
        let s = &self.shape;
        Some(if chw_names { (s[0], s[1], s[2]) } else { (s[2], s[0], s[1]) })
    }
}

/// Parsed `meta/info.json`.
#[derive(Debug, Clone)]
pub struct Info {
    pub codebase_version: String,
    pub version: Version,
    pub robot_type: Option<String>,
    pub fps: f64,
    pub total_episodes: usize,
    pub total_frames: usize,
    pub total_tasks: usize,
    pub chunks_size: usize,
    pub data_path: String,
    pub video_path: Option<String>,
    pub features: BTreeMap<String, Feature>,
    /// The whole JSON document, for fields this type does not model.
    pub raw: Value,
}

fn get_usize(obj: &serde_json::Map<String, Value>, key: &str, path: &Path) -> Result<usize, DatasetError> {
    let v = obj.get(key).ok_or_else(|| DatasetError::meta(path, format!("missing field `{key}`")))?;
    v.as_u64()
        .map(|x| x as usize)
        .ok_or_else(|| DatasetError::meta(path, format!("field `{key}` must be a non-negative integer, got {v}")))
}

impl Info {
    /// Parse info.json text; `path` is only used in error messages.
    pub fn parse(text: &[u8], path: &Path) -> Result<Info, DatasetError> {
        let raw: Value =
            serde_json::from_slice(text).map_err(|e| DatasetError::meta(path, format!("not valid JSON: {e}")))?;
        let obj = raw.as_object().ok_or_else(|| DatasetError::meta(path, "top level is not a JSON object"))?;
        let codebase_version = obj
            .get("codebase_version")
            .and_then(|v| v.as_str())
            .ok_or_else(|| DatasetError::meta(path, "missing string field `codebase_version`"))?
            .to_string();
        let version = match codebase_version.as_str() {
            "v2.0" | "v2.1" => Version::V2,
            "v3.0" => Version::V3,
            other => {
                return Err(DatasetError::unsupported(
                    path,
                    format!("codebase_version {other:?} (supported: v2.0, v2.1, v3.0)"),
                ));
            }
        };
        let fps = obj
            .get("fps")
            .and_then(|v| v.as_f64())
            .ok_or_else(|| DatasetError::meta(path, "missing numeric field `fps`"))?;
        if !(fps.is_finite() && fps > 0.0 && fps < 1e6) {
            return Err(DatasetError::meta(path, format!("`fps` must be positive, got {fps}")));
        }
        let total_episodes = get_usize(obj, "total_episodes", path)?;
        let total_frames = get_usize(obj, "total_frames", path)?;
        let total_tasks = obj.get("total_tasks").and_then(|v| v.as_u64()).unwrap_or(0) as usize;
        let chunks_size = get_usize(obj, "chunks_size", path)?;
        if chunks_size == 0 {
            return Err(DatasetError::meta(path, "`chunks_size` must be > 0"));
        }
        let data_path = obj
            .get("data_path")
            .and_then(|v| v.as_str())
            .ok_or_else(|| DatasetError::meta(path, "missing string field `data_path`"))?
            .to_string();
        let video_path = obj.get("video_path").and_then(|v| v.as_str()).map(str::to_string);
        let robot_type = obj.get("robot_type").and_then(|v| v.as_str()).map(str::to_string);
        let feats = obj
            .get("features")
            .and_then(|v| v.as_object())
            .ok_or_else(|| DatasetError::meta(path, "missing object field `features`"))?;
        let mut features = BTreeMap::new();
        for (key, f) in feats {
            let fo = f
                .as_object()
                .ok_or_else(|| DatasetError::meta(path, format!("feature `{key}` is not an object")))?;
            let dtype = fo
                .get("dtype")
                .and_then(|v| v.as_str())
                .ok_or_else(|| DatasetError::meta(path, format!("feature `{key}` has no string `dtype`")))?
                .to_string();
            let shape_v = fo
                .get("shape")
                .and_then(|v| v.as_array())
                .ok_or_else(|| DatasetError::meta(path, format!("feature `{key}` has no `shape` list")))?;
            let mut shape = Vec::with_capacity(shape_v.len());
            for d in shape_v {
                let d = d
                    .as_u64()
                    .filter(|&d| d <= (1 << 24))
                    .ok_or_else(|| DatasetError::meta(path, format!("feature `{key}`: bad shape entry {d}")))?;
                shape.push(d as usize);
            }
            if shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_none_or(|n| n > (1 << 28)) {
                return Err(DatasetError::meta(path, format!("feature `{key}`: shape {shape:?} is too large")));
            }
            let feat = Feature {
                dtype,
                shape,
                names: fo.get("names").filter(|v| !v.is_null()).cloned(),
                info: fo.get("info").cloned(),
            };
            if matches!(feat.kind(), FeatureKind::Video | FeatureKind::Image) && feat.chw().is_none() {
                return Err(DatasetError::meta(
                    path,
                    format!("camera feature `{key}` must have a 3-d shape, got {:?}", feat.shape),
                ));
            }
            features.insert(key.clone(), feat);
        }
        let info = Info {
            codebase_version,
            version,
            robot_type,
            fps,
            total_episodes,
            total_frames,
            total_tasks,
            chunks_size,
            data_path,
            video_path,
            features,
            raw,
        };
        if info.video_keys().next().is_some() && info.video_path.is_none() {
            return Err(DatasetError::meta(path, "dataset has video features but no `video_path`"));
        }
        // Validate the templates once so later formatting errors are impossible to miss.
        let probe: &[(&str, Value)] = &[
            ("episode_chunk", 0.into()),
            ("episode_index", 0.into()),
            ("chunk_index", 0.into()),
            ("file_index", 0.into()),
            ("video_key", "k".into()),
        ];
        format_template(&info.data_path, probe).map_err(|m| DatasetError::meta(path, format!("data_path: {m}")))?;
        if let Some(vp) = &info.video_path {
            format_template(vp, probe).map_err(|m| DatasetError::meta(path, format!("video_path: {m}")))?;
        }
        Ok(info)
    }

    /// Keys of mp4-backed cameras, sorted.
    pub fn video_keys(&self) -> impl Iterator<Item = &str> {
        self.features.iter().filter(|(_, f)| f.kind() == FeatureKind::Video).map(|(k, _)| k.as_str())
    }
    /// Keys of parquet-embedded image cameras, sorted.
    pub fn image_keys(&self) -> impl Iterator<Item = &str> {
        self.features.iter().filter(|(_, f)| f.kind() == FeatureKind::Image).map(|(k, _)| k.as_str())
    }
    /// Video and image cameras (lerobot's `camera_keys`).
    pub fn camera_keys(&self) -> impl Iterator<Item = &str> {
        self.features
            .iter()
            .filter(|(_, f)| matches!(f.kind(), FeatureKind::Video | FeatureKind::Image))
            .map(|(k, _)| k.as_str())
    }

    /// lerobot's `dataset_to_policy_features` classification (None for bookkeeping columns).
    pub fn policy_feature_type(&self, key: &str) -> Option<PolicyFeatureType> {
        let f = self.features.get(key)?;
        if matches!(f.kind(), FeatureKind::Video | FeatureKind::Image) {
            return Some(PolicyFeatureType::Visual);
        }
        if key == "observation.environment_state" {
            Some(PolicyFeatureType::Env)
        } else if key.starts_with("observation") {
            Some(PolicyFeatureType::State)
        } else if key == "action" {
            Some(PolicyFeatureType::Action)
        } else if key == "next.reward" {
            Some(PolicyFeatureType::Reward)
        } else {
            None
        }
    }
}

/// Format a Python `str.format`-style template with `{name}` and `{name:0Nd}` fields.
pub(crate) fn format_template(tpl: &str, vars: &[(&str, Value)]) -> Result<String, String> {
    let mut out = String::with_capacity(tpl.len() + 16);
    let mut rest = tpl;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| format!("unclosed `{{` in template {tpl:?}"))?;
        let field = &after[..close];
        let (name, spec) = match field.split_once(':') {
            Some((n, s)) => (n, Some(s)),
            None => (field, None),
        };
        let val = vars
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("unknown field `{name}` in template {tpl:?}"))?;
        match (val, spec) {
            (Value::String(s), None) => out.push_str(s),
            (Value::Number(n), None) => out.push_str(&n.to_string()),
            (Value::Number(n), Some(spec)) => {
                let width_s = spec.strip_suffix('d').ok_or_else(|| format!("unsupported format spec `{spec}`"))?;
                let zero = width_s.starts_with('0');
                let width: usize = if width_s.is_empty() {
                    0
                } else {
                    width_s.parse().map_err(|_| format!("unsupported format spec `{spec}`"))?
                };
                if width > 64 {
                    return Err(format!("format width too large in `{spec}`"));
                }
                let n = n.as_i64().ok_or_else(|| format!("field `{name}` is not an integer"))?;
                if zero {
                    out.push_str(&format!("{n:0width$}"));
                } else {
                    out.push_str(&format!("{n:width$}"));
                }
            }
            _ => return Err(format!("unsupported format spec in `{{{field}}}`")),
        }
        rest = &after[close + 1..];
    }
    if rest.contains('}') {
        return Err(format!("stray `}}` in template {tpl:?}"));
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn template() {
        let s = format_template(
            "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            &[("episode_chunk", 1.into()), ("episode_index", 42.into())],
        )
        .unwrap();
        assert_eq!(s, "data/chunk-001/episode_000042.parquet");
        let s = format_template("videos/{video_key}/x", &[("video_key", "observation.image".into())]).unwrap();
        assert_eq!(s, "videos/observation.image/x");
        assert!(format_template("{nope}", &[]).is_err());
        assert!(format_template("{a", &[]).is_err());
    }
}
