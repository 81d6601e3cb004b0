//! `LeRobotDataset`: open a v2.x / v3.0 dataset, read frames and training samples.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::delta::{query_indices, DeltaIndices};
use crate::error::{read_file, DatasetError};
use crate::image::decode_image;
use crate::info::{Feature, FeatureKind, Info, Version};
use crate::meta::{load_meta, Episode, Stats};
use crate::table::Table;
use crate::video::{RgbImage, VideoReader};

/// lerobot's default timestamp tolerance (seconds).
pub const DEFAULT_TOLERANCE_S: f64 = 1e-4;

const BOOKKEEPING: [&str; 5] = ["timestamp", "frame_index", "episode_index", "index", "task_index"];
const MAX_OPEN_VIDEOS: usize = 16;
const MAX_CACHED_IMAGE_COLUMNS: usize = 4;

/// One row of the tabular data.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// Global frame index (row in the concatenated dataset).
    pub index: usize,
    pub episode_index: usize,
    pub frame_index: usize,
    pub timestamp: f32,
    pub task_index: i64,
    pub task: String,
    /// Every numeric feature except the bookkeeping columns, flattened (`shape` from info).
    pub values: HashMap<String, Vec<f32>>,
}

/// A dense f32 array.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// A training sample as lerobot's `__getitem__` returns it.
#[derive(Debug, Clone)]
pub struct Sample {
    pub index: usize,
    pub episode_index: usize,
    pub frame_index: usize,
    pub timestamp: f32,
    pub task: String,
    /// Features: vectors `[N]` (or `[T, N]` with deltas), cameras `[3, H, W]` (or `[T, 3, H, W]`)
    /// as f32 in [0, 1].
    pub values: BTreeMap<String, Array>,
    /// `{key}_is_pad` masks for keys with delta indices (keyed by feature key).
    pub pads: BTreeMap<String, Vec<bool>>,
}

/// What [`LeRobotDataset::sample`] returns.
#[derive(Debug, Clone, Default)]
pub struct SampleOptions {
    /// Frame offsets per key (see [`crate::delta`]); keys without entry give the current frame.
    pub delta_indices: DeltaIndices,
    /// Decode cameras (videos / embedded images). Default true via [`SampleOptions::new`].
    pub cameras: bool,
    /// Restrict to these feature keys (None: all numeric features and cameras).
    pub keys: Option<Vec<String>>,
}

impl SampleOptions {
    pub fn new(delta_indices: DeltaIndices) -> Self {
        SampleOptions { delta_indices, cameras: true, keys: None }
    }
}

#[derive(Debug)]
struct DataFile {
    path: PathBuf,
    start: usize,
    len: usize,
}

type ImageColumn = Arc<Vec<(Option<Vec<u8>>, Option<String>)>>;

#[derive(Default)]
struct Caches {
    videos: VecDeque<(PathBuf, VideoReader)>,
    images: VecDeque<((usize, String), ImageColumn)>,
}

/// A LeRobot dataset opened from a local directory.
pub struct LeRobotDataset {
    root: PathBuf,
    info: Info,
    episodes: Vec<Episode>,
    tasks: BTreeMap<i64, String>,
    stats: Option<Stats>,
    num_frames: usize,
    /// Numeric features (incl. bookkeeping ones) as f32 rows of `numel` values.
    numeric: BTreeMap<String, (usize, Vec<f32>)>,
    timestamp: Vec<f32>,
    frame_index: Vec<i64>,
    episode_of_row: Vec<u32>,
    task_index: Vec<i64>,
    files: Vec<DataFile>,
    tolerance_s: f64,
    caches: Mutex<Caches>,
}

impl std::fmt::Debug for LeRobotDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeRobotDataset")
            .field("root", &self.root)
            .field("version", &self.info.codebase_version)
            .field("episodes", &self.episodes.len())
            .field("frames", &self.num_frames)
            .finish()
    }
}

impl LeRobotDataset {
    /// Open a dataset directory (containing `meta/info.json`). Reads all metadata and the
    /// tabular (non-camera) data into memory; cameras are decoded on demand.
    pub fn open(root: impl AsRef<Path>) -> Result<Self, DatasetError> {
        let root = root.as_ref().to_path_buf();
        let info_path = root.join("meta/info.json");
        let info = Info::parse(&read_file(&info_path)?, &info_path)?;
        let meta = load_meta(&root, &info)?;

        // Which data files, in which order (v3: sorted unique files; v2: one per episode).
        let mut paths: Vec<PathBuf> = meta.episodes.iter().map(|e| e.data_file.clone()).collect();
        if info.version == Version::V3 {
            paths.sort();
            paths.dedup();
        }
        let numeric_keys: Vec<(String, usize)> = info
            .features
            .iter()
            .filter(|(_, f)| f.kind() == FeatureKind::Numeric)
            .map(|(k, f)| (k.clone(), f.numel()))
            .collect();
        for req in BOOKKEEPING {
            match info.features.get(req) {
                None => {
                    return Err(DatasetError::meta(&info_path, format!("feature `{req}` is missing from `features`")));
                }
                Some(f) if f.kind() != FeatureKind::Numeric || f.numel() != 1 => {
                    return Err(DatasetError::meta(
                        &info_path,
                        format!("feature `{req}` must be a numeric scalar, got dtype {} shape {:?}", f.dtype, f.shape),
                    ));
                }
                Some(_) => {}
            }
        }
        let mut numeric: BTreeMap<String, (usize, Vec<f32>)> =
            numeric_keys.iter().map(|(k, n)| (k.clone(), (*n, Vec::new()))).collect();
        let mut frame_index = Vec::new();
        let mut episode_col = Vec::new();
        let mut task_index = Vec::new();
        let mut files = Vec::with_capacity(paths.len());
        let mut start = 0usize;
        let want = |c: &str| info.features.get(c).is_some_and(|f| f.kind() == FeatureKind::Numeric);
        for rel in &paths {
            let p = root.join(rel);
            let t = Table::read(&p, &want)?;
            for (k, n) in &numeric_keys {
                let v = t.f32_rows(k, *n)?;
                numeric.get_mut(k).expect("key").1.extend_from_slice(&v);
            }
            frame_index.extend(t.i64_col("frame_index")?);
            episode_col.extend(t.i64_col("episode_index")?);
            task_index.extend(t.i64_col("task_index")?);
            files.push(DataFile { path: p, start, len: t.num_rows });
            start += t.num_rows;
        }
        let num_frames = start;
        let timestamp = numeric.get("timestamp").map(|(_, v)| v.clone()).unwrap_or_default();

        // Consistency between episodes metadata and rows.
        let ep_path = match info.version {
            Version::V2 => root.join("meta/episodes.jsonl"),
            Version::V3 => root.join("meta/episodes"),
        };
        let mut episode_of_row = vec![u32::MAX; num_frames];
        for ep in &meta.episodes {
            let (s, e) = (ep.dataset_from_index, ep.dataset_to_index);
            if e > num_frames {
                return Err(DatasetError::meta(
                    &ep_path,
                    format!("episode {} ends at frame {e} but the data has {num_frames} frames", ep.episode_index),
                ));
            }
            let file = root.join(&ep.data_file);
            let df = files.iter().find(|f| f.path == file).expect("file loaded");
            if s < df.start || e > df.start + df.len {
                return Err(DatasetError::parquet(
                    &df.path,
                    format!(
                        "episode {} (frames {s}..{e}) is not inside this file (frames {}..{})",
                        ep.episode_index,
                        df.start,
                        df.start + df.len
                    ),
                ));
            }
            for r in s..e {
                if episode_col[r] != ep.episode_index as i64 {
                    return Err(DatasetError::parquet(
                        &df.path,
                        format!("row {} has episode_index {} but belongs to episode {}", r - df.start, episode_col[r], ep.episode_index),
                    ));
                }
                episode_of_row[r] = ep.episode_index as u32;
            }
        }
        if let Some(r) = episode_of_row.iter().position(|&e| e == u32::MAX) {
            return Err(DatasetError::meta(&ep_path, format!("frame {r} belongs to no episode")));
        }

        Ok(LeRobotDataset {
            root,
            info,
            episodes: meta.episodes,
            tasks: meta.tasks,
            stats: meta.stats,
            num_frames,
            numeric,
            timestamp,
            frame_index,
            episode_of_row,
            task_index,
            files,
            tolerance_s: DEFAULT_TOLERANCE_S,
            caches: Mutex::new(Caches::default()),
        })
    }

    /// Change the timestamp tolerance used to find video frames (default 1e-4 s).
    pub fn set_tolerance_s(&mut self, tolerance_s: f64) {
        self.tolerance_s = tolerance_s;
    }
    pub fn tolerance_s(&self) -> f64 {
        self.tolerance_s
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn info(&self) -> &Info {
        &self.info
    }
    pub fn version(&self) -> Version {
        self.info.version
    }
    pub fn num_episodes(&self) -> usize {
        self.episodes.len()
    }
    pub fn num_frames(&self) -> usize {
        self.num_frames
    }
    pub fn fps(&self) -> f64 {
        self.info.fps
    }
    pub fn features(&self) -> &BTreeMap<String, Feature> {
        &self.info.features
    }
    pub fn episodes(&self) -> &[Episode] {
        &self.episodes
    }
    pub fn tasks(&self) -> &BTreeMap<i64, String> {
        &self.tasks
    }
    /// Dataset statistics (v2.1: aggregated from episodes_stats.jsonl; else stats.json).
    pub fn stats(&self) -> Option<&Stats> {
        self.stats.as_ref()
    }
    pub fn video_keys(&self) -> Vec<String> {
        self.info.video_keys().map(str::to_string).collect()
    }
    pub fn camera_keys(&self) -> Vec<String> {
        self.info.camera_keys().map(str::to_string).collect()
    }

    /// Global frame range of an episode.
    pub fn episode_range(&self, ep: usize) -> Result<Range<usize>, DatasetError> {
        let e = self.episode(ep)?;
        Ok(e.dataset_from_index..e.dataset_to_index)
    }

    pub fn episode(&self, ep: usize) -> Result<&Episode, DatasetError> {
        self.episodes
            .get(ep)
            .ok_or_else(|| DatasetError::arg(format!("episode {ep} out of range ({} episodes)", self.episodes.len())))
    }

    fn check_index(&self, index: usize) -> Result<(), DatasetError> {
        if index >= self.num_frames {
            return Err(DatasetError::arg(format!("frame {index} out of range ({} frames)", self.num_frames)));
        }
        Ok(())
    }

    /// Whole column of a numeric feature: `(numel, data)` with `num_frames * numel` values.
    pub fn column(&self, key: &str) -> Option<(usize, &[f32])> {
        self.numeric.get(key).map(|(n, v)| (*n, v.as_slice()))
    }

    /// Values of numeric feature `key` at frame `index`.
    pub fn value(&self, key: &str, index: usize) -> Result<&[f32], DatasetError> {
        self.check_index(index)?;
        let (n, v) = self
            .numeric
            .get(key)
            .ok_or_else(|| DatasetError::arg(format!("no numeric feature `{key}`")))?;
        Ok(&v[index * n..(index + 1) * n])
    }

    fn task_of(&self, index: usize) -> String {
        self.tasks.get(&self.task_index[index]).cloned().unwrap_or_default()
    }

    /// One row of tabular data (no cameras).
    pub fn frame(&self, index: usize) -> Result<Frame, DatasetError> {
        self.check_index(index)?;
        let values = self
            .numeric
            .iter()
            .filter(|(k, _)| !BOOKKEEPING.contains(&k.as_str()))
            .map(|(k, (n, v))| (k.clone(), v[index * n..(index + 1) * n].to_vec()))
            .collect();
        Ok(Frame {
            index,
            episode_index: self.episode_of_row[index] as usize,
            frame_index: self.frame_index[index].max(0) as usize,
            timestamp: self.timestamp.get(index).copied().unwrap_or(0.0),
            task_index: self.task_index[index],
            task: self.task_of(index),
            values,
        })
    }

    /// A training sample with delta windows, pads and decoded cameras (lerobot `__getitem__`).
    pub fn sample(&self, index: usize, opts: &SampleOptions) -> Result<Sample, DatasetError> {
        self.check_index(index)?;
        let ep_idx = self.episode_of_row[index] as usize;
        let ep = &self.episodes[ep_idx];
        for k in opts.delta_indices.keys() {
            if !self.info.features.contains_key(k) {
                return Err(DatasetError::arg(format!("delta indices for unknown feature `{k}`")));
            }
        }
        let mut values = BTreeMap::new();
        let mut pads = BTreeMap::new();
        let selected = |k: &str| opts.keys.as_ref().is_none_or(|ks| ks.iter().any(|x| x == k));
        for (key, feat) in &self.info.features {
            if !selected(key) {
                continue;
            }
            let kind = feat.kind();
            let is_cam = matches!(kind, FeatureKind::Video | FeatureKind::Image);
            if (is_cam && !opts.cameras) || kind == FeatureKind::String {
                continue;
            }
            if kind == FeatureKind::Numeric && BOOKKEEPING.contains(&key.as_str()) && !opts.delta_indices.contains_key(key) {
                continue;
            }
            let (rows, delta) = match opts.delta_indices.get(key) {
                Some(d) => {
                    let (q, pad) = query_indices(index, ep.dataset_from_index, ep.dataset_to_index, d);
                    pads.insert(key.clone(), pad);
                    (q, true)
                }
                None => (vec![index], false),
            };
            let mut arr = match kind {
                FeatureKind::Numeric => {
                    let (n, v) = &self.numeric[key];
                    let mut data = Vec::with_capacity(rows.len() * n);
                    for &r in &rows {
                        data.extend_from_slice(&v[r * n..(r + 1) * n]);
                    }
                    Array { shape: feat.shape.clone(), data }
                }
                FeatureKind::Video => {
                    let vid = ep.videos.get(key).ok_or_else(|| {
                        DatasetError::arg(format!("episode {ep_idx} has no video for `{key}`"))
                    })?;
                    let ts: Vec<f64> =
                        rows.iter().map(|&r| vid.from_timestamp + self.timestamp[r] as f64).collect();
                    let path = self.root.join(&vid.file);
                    let imgs = self.decode_video(&path, &ts)?;
                    self.images_to_array(key, feat, &imgs)?
                }
                FeatureKind::Image => {
                    let imgs = rows.iter().map(|&r| self.decode_parquet_image(key, r)).collect::<Result<Vec<_>, _>>()?;
                    self.images_to_array(key, feat, &imgs)?
                }
                FeatureKind::String => unreachable!(),
            };
            if delta {
                if !is_cam {
                    arr.shape.insert(0, rows.len());
                }
            } else if is_cam {
                arr.shape.remove(0);
            }
            values.insert(key.clone(), arr);
        }
        Ok(Sample {
            index,
            episode_index: ep_idx,
            frame_index: self.frame_index[index].max(0) as usize,
            timestamp: self.timestamp.get(index).copied().unwrap_or(0.0),
            task: self.task_of(index),
            values,
            pads,
        })
    }

    /// `[T, 3, H, W]` f32 in [0,1] from RGB images, checking the size against info.json.
    fn images_to_array(&self, key: &str, feat: &Feature, imgs: &[Arc<RgbImage>]) -> Result<Array, DatasetError> {
        let (c, h, w) = feat.chw().expect("camera shape validated");
        let mut data = Vec::with_capacity(imgs.len() * c * h * w);
        for img in imgs {
            if img.width != w || img.height != h || c != 3 {
                return Err(DatasetError::arg(format!(
                    "camera `{key}`: decoded {}x{} RGB but info.json says {:?}",
                    img.width, img.height, feat.shape
                )));
            }
            data.extend(img.to_chw_f32());
        }
        Ok(Array { shape: vec![imgs.len(), c, h, w], data })
    }

    /// Decode the frames of `path` at the given (absolute, in-file) timestamps.
    pub fn decode_video(&self, path: &Path, ts: &[f64]) -> Result<Vec<Arc<RgbImage>>, DatasetError> {
        // Take a reader out of the cache and decode without holding the lock, so loader
        // workers decode in parallel (each on its own reader when they share a file).
        let cached = {
            let mut caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
            let pos = caches.videos.iter().position(|(p, _)| p == path);
            pos.and_then(|i| caches.videos.remove(i))
        };
        let mut entry = match cached {
            Some(e) => e,
            None => (path.to_path_buf(), VideoReader::open(path)?),
        };
        let r = entry.1.frames_at(ts, self.tolerance_s);
        let mut caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
        if caches.videos.len() >= MAX_OPEN_VIDEOS {
            caches.videos.pop_front();
        }
        caches.videos.push_back(entry);
        r
    }

    /// Camera frame `key` at frame `index` as RGB (video or embedded image).
    pub fn camera_frame(&self, key: &str, index: usize) -> Result<Arc<RgbImage>, DatasetError> {
        self.check_index(index)?;
        let feat = self.info.features.get(key).ok_or_else(|| DatasetError::arg(format!("no feature `{key}`")))?;
        match feat.kind() {
            FeatureKind::Video => {
                let ep = &self.episodes[self.episode_of_row[index] as usize];
                let vid = ep.videos.get(key).ok_or_else(|| DatasetError::arg(format!("no video for `{key}`")))?;
                let ts = vid.from_timestamp + self.timestamp[index] as f64;
                Ok(self.decode_video(&self.root.join(&vid.file), &[ts])?.remove(0))
            }
            FeatureKind::Image => self.decode_parquet_image(key, index),
            _ => Err(DatasetError::arg(format!("feature `{key}` is not a camera"))),
        }
    }

    fn decode_parquet_image(&self, key: &str, index: usize) -> Result<Arc<RgbImage>, DatasetError> {
        let fi = self.files.partition_point(|f| f.start + f.len <= index);
        let file = &self.files[fi];
        let col = {
            let caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
            let ck = (fi, key.to_string());
            if let Some(i) = caches.images.iter().position(|(k, _)| *k == ck) {
                caches.images[i].1.clone()
            } else {
                drop(caches);
                let t = Table::read(&file.path, &|c| c == key)?;
                let col = Arc::new(t.image_col(key)?);
                if col.len() != file.len {
                    return Err(DatasetError::parquet(&file.path, format!("image column `{key}` has {} rows", col.len())));
                }
                let mut caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
                if caches.images.len() >= MAX_CACHED_IMAGE_COLUMNS {
                    caches.images.pop_front();
                }
                caches.images.push_back((ck, col.clone()));
                col
            }
        };
        let row = index - file.start;
        match &col[row] {
            (Some(bytes), _) => Ok(Arc::new(decode_image(bytes, &file.path)?)),
            (None, Some(p)) => {
                let ip = self.root.join(p);
                Ok(Arc::new(decode_image(&read_file(&ip)?, &ip)?))
            }
            (None, None) => Err(DatasetError::parquet(&file.path, format!("row {row}: image `{key}` is null"))),
        }
    }
}
