//! Episodes, tasks and statistics for v2.x (jsonl) and v3.0 (parquet) layouts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{read_file, DatasetError};
use crate::info::{format_template, Info, Version};
use crate::table::Table;

/// Where one camera's frames of an episode live.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeVideo {
    /// Path relative to the dataset root.
    pub file: PathBuf,
    /// Start of the episode inside the mp4 (0 for v2.x, one file per episode).
    pub from_timestamp: f64,
    /// End of the episode inside the mp4 (None when unknown, v2.x).
    pub to_timestamp: Option<f64>,
}

/// One episode.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    pub episode_index: usize,
    pub length: usize,
    pub tasks: Vec<String>,
    /// Global frame range `[dataset_from_index, dataset_to_index)`.
    pub dataset_from_index: usize,
    pub dataset_to_index: usize,
    /// Data parquet file (relative to the root).
    pub data_file: PathBuf,
    pub videos: BTreeMap<String, EpisodeVideo>,
}

/// Per-feature statistics (flattened, with their shape, e.g. `[3,1,1]` for cameras).
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureStats {
    pub shape: Vec<usize>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub min: Vec<f64>,
    pub max: Vec<f64>,
    /// Number of frames the stats were computed on, when recorded.
    pub count: Option<f64>,
}

/// Statistics of all features, by key.
pub type Stats = BTreeMap<String, FeatureStats>;

fn flatten_json(v: &Value, out: &mut Vec<f64>, shape: &mut Vec<usize>, depth: usize) -> Result<(), String> {
    if depth > 8 {
        return Err("nested too deeply".into());
    }
    match v {
        Value::Number(n) => {
            out.push(n.as_f64().ok_or("bad number")?);
            Ok(())
        }
        Value::Array(a) => {
            if shape.len() == depth {
                shape.push(a.len());
            } else if shape.get(depth) != Some(&a.len()) {
                return Err("ragged nested list".into());
            }
            for x in a {
                flatten_json(x, out, shape, depth + 1)?;
            }
            Ok(())
        }
        _ => Err(format!("expected numbers, got {v}")),
    }
}

fn parse_stat_array(v: &Value) -> Result<(Vec<f64>, Vec<usize>), String> {
    let mut out = Vec::new();
    let mut shape = Vec::new();
    flatten_json(v, &mut out, &mut shape, 0)?;
    Ok((out, shape))
}

/// Parse `{feature: {mean, std, min, max, count?}}` (stats.json or one episodes_stats entry).
pub(crate) fn parse_stats(v: &Value, path: &Path) -> Result<Stats, DatasetError> {
    let obj = v.as_object().ok_or_else(|| DatasetError::meta(path, "stats are not a JSON object"))?;
    let mut stats = Stats::new();
    for (key, fv) in obj {
        let Some(fo) = fv.as_object() else { continue };
        let get = |name: &str| -> Result<Option<(Vec<f64>, Vec<usize>)>, DatasetError> {
            match fo.get(name) {
                None => Ok(None),
                Some(x) => parse_stat_array(x)
                    .map(Some)
                    .map_err(|m| DatasetError::meta(path, format!("stats of `{key}`.{name}: {m}"))),
            }
        };
        let (Some((mean, shape)), Some((std, s2)), Some((min, s3)), Some((max, s4))) =
            (get("mean")?, get("std")?, get("min")?, get("max")?)
        else {
            // Non-numeric features (e.g. strings) have no usable stats.
            continue;
        };
        if s2 != shape || s3 != shape || s4 != shape {
            return Err(DatasetError::meta(path, format!("stats of `{key}`: mean/std/min/max shapes differ")));
        }
        let count = get("count")?.and_then(|(c, _)| c.first().copied());
        stats.insert(key.clone(), FeatureStats { shape, mean, std, min, max, count });
    }
    Ok(stats)
}

/// lerobot's `aggregate_stats`: weighted mean, pooled variance, global min/max.
pub fn aggregate_stats(list: &[Stats]) -> Stats {
    let mut keys: Vec<&String> = list.iter().flat_map(|s| s.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = Stats::new();
    for key in keys {
        let fs: Vec<&FeatureStats> = list.iter().filter_map(|s| s.get(key)).collect();
        let first = fs[0];
        let n = first.mean.len();
        if fs.iter().any(|f| f.mean.len() != n) {
            continue;
        }
        let counts: Vec<f64> = fs.iter().map(|f| f.count.unwrap_or(1.0)).collect();
        let total: f64 = counts.iter().sum();
        let mut mean = vec![0.0; n];
        for (f, c) in fs.iter().zip(&counts) {
            for (m, fm) in mean.iter_mut().zip(&f.mean) {
                *m += fm * c;
            }
        }
        mean.iter_mut().for_each(|m| *m /= total);
        let mut var = vec![0.0; n];
        for (f, c) in fs.iter().zip(&counts) {
            for i in 0..n {
                let d = f.mean[i] - mean[i];
                var[i] += (f.std[i] * f.std[i] + d * d) * c;
            }
        }
        let std = var.iter().map(|v| (v / total).sqrt()).collect();
        let min = (0..n).map(|i| fs.iter().map(|f| f.min[i]).fold(f64::INFINITY, f64::min)).collect();
        let max = (0..n).map(|i| fs.iter().map(|f| f.max[i]).fold(f64::NEG_INFINITY, f64::max)).collect();
        out.insert(
            key.clone(),
            FeatureStats { shape: first.shape.clone(), mean, std, min, max, count: Some(total) },
        );
    }
    out
}

fn read_json(path: &Path) -> Result<Value, DatasetError> {
    let bytes = read_file(path)?;
    serde_json::from_slice(&bytes).map_err(|e| DatasetError::meta(path, format!("not valid JSON: {e}")))
}

fn read_jsonl(path: &Path) -> Result<Vec<Value>, DatasetError> {
    let bytes = read_file(path)?;
    let text = std::str::from_utf8(&bytes).map_err(|_| DatasetError::meta(path, "not valid UTF-8"))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(line)
                .map_err(|e| DatasetError::meta(path, format!("line {}: not valid JSON: {e}", i + 1)))?,
        );
    }
    Ok(out)
}

fn field_u64(v: &Value, key: &str, path: &Path, line: usize) -> Result<u64, DatasetError> {
    v.get(key)
        .and_then(|x| x.as_u64())
        .ok_or_else(|| DatasetError::meta(path, format!("line {line}: missing non-negative integer `{key}`")))
}

/// Everything under `meta/` besides info.json.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    pub episodes: Vec<Episode>,
    pub tasks: BTreeMap<i64, String>,
    pub stats: Option<Stats>,
}

fn video_file(info: &Info, key: &str, vars: &[(&str, Value)], meta_path: &Path) -> Result<PathBuf, DatasetError> {
    let tpl = info.video_path.as_deref().unwrap_or_default();
    let mut v: Vec<(&str, Value)> = vars.to_vec();
    v.push(("video_key", key.into()));
    format_template(tpl, &v).map(PathBuf::from).map_err(|m| DatasetError::meta(meta_path, m))
}

pub(crate) fn load_meta(root: &Path, info: &Info) -> Result<Meta, DatasetError> {
    match info.version {
        Version::V2 => load_v2(root, info),
        Version::V3 => load_v3(root, info),
    }
}

fn load_v2(root: &Path, info: &Info) -> Result<Meta, DatasetError> {
    let ep_path = root.join("meta/episodes.jsonl");
    let lines = read_jsonl(&ep_path)?;
    let mut eps: Vec<(usize, usize, Vec<String>)> = Vec::new();
    for (i, v) in lines.iter().enumerate() {
        let idx = field_u64(v, "episode_index", &ep_path, i + 1)? as usize;
        let len = field_u64(v, "length", &ep_path, i + 1)? as usize;
        let tasks = v
            .get("tasks")
            .and_then(|t| t.as_array())
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        eps.push((idx, len, tasks));
    }
    eps.sort_by_key(|e| e.0);
    for (i, e) in eps.iter().enumerate() {
        if e.0 != i {
            return Err(DatasetError::meta(
                &ep_path,
                format!("episode indices must be 0..{} without gaps or duplicates (found {} at position {i})", eps.len(), e.0),
            ));
        }
    }
    let mut episodes = Vec::with_capacity(eps.len());
    let mut start = 0usize;
    let video_keys: Vec<String> = info.video_keys().map(str::to_string).collect();
    for (idx, len, tasks) in eps {
        let chunk = idx / info.chunks_size;
        let vars: [(&str, Value); 2] = [("episode_chunk", chunk.into()), ("episode_index", idx.into())];
        let data_file = format_template(&info.data_path, &vars).map_err(|m| DatasetError::meta(&ep_path, m))?;
        let mut videos = BTreeMap::new();
        for key in &video_keys {
            let file = video_file(info, key, &vars, &ep_path)?;
            videos.insert(key.clone(), EpisodeVideo { file, from_timestamp: 0.0, to_timestamp: None });
        }
        let end = start.checked_add(len).ok_or_else(|| DatasetError::meta(&ep_path, "episode lengths overflow"))?;
        episodes.push(Episode {
            episode_index: idx,
            length: len,
            tasks,
            dataset_from_index: start,
            dataset_to_index: end,
            data_file: PathBuf::from(data_file),
            videos,
        });
        start = end;
    }

    let tasks_path = root.join("meta/tasks.jsonl");
    let mut tasks = BTreeMap::new();
    for (i, v) in read_jsonl(&tasks_path)?.iter().enumerate() {
        let ti = field_u64(v, "task_index", &tasks_path, i + 1)? as i64;
        let t = v
            .get("task")
            .and_then(|t| t.as_str())
            .ok_or_else(|| DatasetError::meta(&tasks_path, format!("line {}: missing string `task`", i + 1)))?;
        tasks.insert(ti, t.to_string());
    }

    // v2.1: per-episode stats aggregated; v2.0 (or fallback): stats.json.
    let eps_stats = root.join("meta/episodes_stats.jsonl");
    let stats_json = root.join("meta/stats.json");
    let stats = if eps_stats.exists() {
        let mut list = Vec::new();
        for (i, v) in read_jsonl(&eps_stats)?.iter().enumerate() {
            let s = v
                .get("stats")
                .ok_or_else(|| DatasetError::meta(&eps_stats, format!("line {}: missing `stats`", i + 1)))?;
            list.push(parse_stats(s, &eps_stats)?);
        }
        if list.is_empty() { None } else { Some(aggregate_stats(&list)) }
    } else if stats_json.exists() {
        Some(parse_stats(&read_json(&stats_json)?, &stats_json)?)
    } else {
        None
    };
    Ok(Meta { episodes, tasks, stats })
}

fn list_parquet_files(dir: &Path) -> Result<Vec<PathBuf>, DatasetError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).map_err(|e| DatasetError::io(&d, e))?;
        for ent in rd {
            let ent = ent.map_err(|e| DatasetError::io(&d, e))?;
            let p = ent.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "parquet") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn load_v3(root: &Path, info: &Info) -> Result<Meta, DatasetError> {
    let ep_dir = root.join("meta/episodes");
    let files = list_parquet_files(&ep_dir)?;
    if files.is_empty() {
        return Err(DatasetError::meta(&ep_dir, "no episode parquet files found"));
    }
    let video_keys: Vec<String> = info.video_keys().map(str::to_string).collect();
    let mut episodes = Vec::new();
    for f in &files {
        let want = |c: &str| {
            matches!(c, "episode_index" | "tasks" | "length" | "dataset_from_index" | "dataset_to_index")
                || c.starts_with("data/")
                || (c.starts_with("videos/") && !c.contains("stats"))
        };
        let t = Table::read(f, &want)?;
        let idx = t.i64_col("episode_index")?;
        let len = t.i64_col("length")?;
        let from = t.i64_col("dataset_from_index")?;
        let to = t.i64_col("dataset_to_index")?;
        let dchunk = t.i64_col("data/chunk_index")?;
        let dfile = t.i64_col("data/file_index")?;
        let tasks = if t.has_column("tasks") { t.string_lists("tasks")? } else { vec![Vec::new(); t.num_rows] };
        let mut vids = Vec::new();
        for key in &video_keys {
            let c = t.i64_col(&format!("videos/{key}/chunk_index"))?;
            let fi = t.i64_col(&format!("videos/{key}/file_index"))?;
            let ft = t.f64_col(&format!("videos/{key}/from_timestamp"))?;
            let tt = t.f64_col(&format!("videos/{key}/to_timestamp"))?;
            vids.push((key.clone(), c, fi, ft, tt));
        }
        let bad = |what: &str, r: usize| DatasetError::meta(f, format!("row {r}: invalid `{what}`"));
        for r in 0..t.num_rows {
            let u = |v: i64, what: &str| usize::try_from(v).map_err(|_| bad(what, r));
            let (from_i, to_i) = (u(from[r], "dataset_from_index")?, u(to[r], "dataset_to_index")?);
            if to_i < from_i || to_i - from_i != u(len[r], "length")? {
                return Err(DatasetError::meta(
                    f,
                    format!("row {r}: dataset_to_index - dataset_from_index ({to_i} - {from_i}) != length {}", len[r]),
                ));
            }
            let vars: [(&str, Value); 2] = [("chunk_index", dchunk[r].into()), ("file_index", dfile[r].into())];
            let data_file = format_template(&info.data_path, &vars).map_err(|m| DatasetError::meta(f, m))?;
            let mut videos = BTreeMap::new();
            for (key, c, fi, ft, tt) in &vids {
                let vars: [(&str, Value); 2] = [("chunk_index", c[r].into()), ("file_index", fi[r].into())];
                let file = video_file(info, key, &vars, f)?;
                if !ft[r].is_finite() || ft[r] < 0.0 {
                    return Err(bad(&format!("videos/{key}/from_timestamp"), r));
                }
                videos.insert(key.clone(), EpisodeVideo { file, from_timestamp: ft[r], to_timestamp: Some(tt[r]) });
            }
            episodes.push(Episode {
                episode_index: u(idx[r], "episode_index")?,
                length: to_i - from_i,
                tasks: tasks[r].clone(),
                dataset_from_index: from_i,
                dataset_to_index: to_i,
                data_file: PathBuf::from(data_file),
                videos,
            });
        }
    }
    episodes.sort_by_key(|e| e.episode_index);
    for (i, e) in episodes.iter().enumerate() {
        if e.episode_index != i {
            return Err(DatasetError::meta(
                &ep_dir,
                format!("episode indices must be 0..{} without gaps or duplicates (found {})", episodes.len(), e.episode_index),
            ));
        }
    }

    let tasks_path = root.join("meta/tasks.parquet");
    let t = Table::read(&tasks_path, &|_| true)?;
    let ti = t.i64_col("task_index")?;
    let name_col = ["task", "__index_level_0__"]
        .into_iter()
        .find(|c| t.has_column(c))
        .map(str::to_string)
        .or_else(|| t.column_names().into_iter().find(|c| c != "task_index" && t.string_lists(c).is_ok()))
        .ok_or_else(|| DatasetError::parquet(&tasks_path, "no task string column (`task` or pandas index)"))?;
    let names = t.string_lists(&name_col)?;
    let mut tasks = BTreeMap::new();
    for (i, n) in ti.iter().zip(names) {
        let s = n.into_iter().next().ok_or_else(|| DatasetError::parquet(&tasks_path, format!("task {i} has no text")))?;
        tasks.insert(*i, s);
    }

    let stats_path = root.join("meta/stats.json");
    let stats = if stats_path.exists() { Some(parse_stats(&read_json(&stats_path)?, &stats_path)?) } else { None };
    Ok(Meta { episodes, tasks, stats })
}
