//! Writing LeRobot v3.0 datasets: parquet tables (the `parquet` crate's low-level column
//! writer, Arrow-compatible schemas as HF `datasets` writes them), PNG-in-parquet camera
//! frames, `meta/info.json`, `meta/stats.json`, episodes and tasks.
//!
//! Cameras are stored as `image` features (PNG bytes in a `{bytes, path}` struct column), not
//! AV1 video: there is no pure-Rust AV1 encoder fast enough to be worth its build time here.
//! Every file is written to a temporary name and renamed, and the dataset directory itself is
//! assembled next to its final place and renamed last, so a killed run leaves no half dataset.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::basic::{LogicalType, Repetition, Type as Physical};
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DataType, DoubleType, FloatType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::{SerializedFileWriter, SerializedRowGroupWriter};
use parquet::schema::types::Type;
use serde_json::{Value, json};

use crate::error::DatasetError;

/// One parquet column: every row present (no nulls except the image `path`).
pub enum Column {
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    /// `rows × width` values as `list<float>` per row.
    F32List { width: usize, values: Vec<f32> },
    /// `list<double>` per row.
    F64List { width: usize, values: Vec<f64> },
    StrList(Vec<Vec<String>>),
    /// PNG/JPEG bytes as HF's `Image` struct `{bytes: binary, path: string}` (path null).
    Image(Vec<Vec<u8>>),
}

impl Column {
    fn rows(&self) -> usize {
        match self {
            Column::I64(v) => v.len(),
            Column::F32(v) => v.len(),
            Column::F64(v) => v.len(),
            Column::Bool(v) => v.len(),
            Column::Str(v) => v.len(),
            Column::F32List { width, values } => values.len() / (*width).max(1),
            Column::F64List { width, values } => values.len() / (*width).max(1),
            Column::StrList(v) => v.len(),
            Column::Image(v) => v.len(),
        }
    }

    fn schema(&self, name: &str) -> parquet::errors::Result<Type> {
        let prim = |n: &str, t: Physical, logical: Option<LogicalType>, rep: Repetition| {
            Type::primitive_type_builder(n, t).with_repetition(rep).with_logical_type(logical).build()
        };
        let list = |t: Physical, logical: Option<LogicalType>| -> parquet::errors::Result<Type> {
            let element = prim("element", t, logical, Repetition::OPTIONAL)?;
            let inner = Type::group_type_builder("list").with_repetition(Repetition::REPEATED).with_fields(vec![Arc::new(element)]).build()?;
            Type::group_type_builder(name)
                .with_repetition(Repetition::OPTIONAL)
                .with_logical_type(Some(LogicalType::List))
                .with_fields(vec![Arc::new(inner)])
                .build()
        };
        let opt = Repetition::OPTIONAL;
        match self {
            Column::I64(_) => prim(name, Physical::INT64, None, opt),
            Column::F32(_) => prim(name, Physical::FLOAT, None, opt),
            Column::F64(_) => prim(name, Physical::DOUBLE, None, opt),
            Column::Bool(_) => prim(name, Physical::BOOLEAN, None, opt),
            Column::Str(_) => prim(name, Physical::BYTE_ARRAY, Some(LogicalType::String), opt),
            Column::F32List { .. } => list(Physical::FLOAT, None),
            Column::F64List { .. } => list(Physical::DOUBLE, None),
            Column::StrList(_) => list(Physical::BYTE_ARRAY, Some(LogicalType::String)),
            Column::Image(_) => Type::group_type_builder(name)
                .with_repetition(opt)
                .with_fields(vec![
                    Arc::new(prim("bytes", Physical::BYTE_ARRAY, None, opt)?),
                    Arc::new(prim("path", Physical::BYTE_ARRAY, Some(LogicalType::String), opt)?),
                ])
                .build(),
        }
    }
}

/// Levels of a `list` column: each row's first element at repetition 0, the others at 1;
/// every element defined (3), empty lists at definition 1.
fn list_levels(lens: impl Iterator<Item = usize>) -> (Vec<i16>, Vec<i16>) {
    let (mut def, mut rep) = (Vec::new(), Vec::new());
    for n in lens {
        if n == 0 {
            def.push(1);
            rep.push(0);
        }
        for i in 0..n {
            def.push(3);
            rep.push(if i == 0 { 0 } else { 1 });
        }
    }
    (def, rep)
}

/// Write `columns` (all with the same number of rows) as one parquet file, atomically.
pub fn write_parquet(path: &Path, columns: &[(&str, Column)]) -> Result<(), DatasetError> {
    write_parquet_with_metadata(path, columns, Vec::new())
}

/// [`write_parquet`] with file key/value metadata (e.g. pandas' index description).
pub fn write_parquet_with_metadata(path: &Path, columns: &[(&str, Column)], metadata: Vec<(String, String)>) -> Result<(), DatasetError> {
    let rows = columns.first().map_or(0, |c| c.1.rows());
    if let Some((name, _)) = columns.iter().find(|c| c.1.rows() != rows) {
        return Err(DatasetError::arg(format!("{}: column `{name}` has a different number of rows", path.display())));
    }
    let e = |m: parquet::errors::ParquetError| DatasetError::parquet(path, format!("writing: {m}"));
    let fields = columns.iter().map(|(n, c)| c.schema(n).map(Arc::new)).collect::<Result<Vec<_>, _>>().map_err(e)?;
    let schema = Arc::new(Type::group_type_builder("schema").with_fields(fields).build().map_err(e)?);
    let tmp = tmp_path(path);
    let file = File::create(&tmp).map_err(|x| DatasetError::io(&tmp, x))?;
    let kv = metadata.into_iter().map(|(k, v)| parquet::file::metadata::KeyValue::new(k, v)).collect::<Vec<_>>();
    let props = Arc::new(WriterProperties::builder().set_created_by("vramlab".into()).set_key_value_metadata((!kv.is_empty()).then_some(kv)).build());
    let mut w = SerializedFileWriter::new(file, schema, props).map_err(e)?;
    let mut rg = w.next_row_group().map_err(e)?;
    for (_, col) in columns {
        let ones = |n: usize| vec![1i16; n];
        match col {
            Column::I64(v) => put::<Int64Type>(&mut rg, v, &ones(v.len()), None),
            Column::F32(v) => put::<FloatType>(&mut rg, v, &ones(v.len()), None),
            Column::F64(v) => put::<DoubleType>(&mut rg, v, &ones(v.len()), None),
            Column::Bool(v) => put::<BoolType>(&mut rg, v, &ones(v.len()), None),
            Column::Str(v) => {
                let vals: Vec<ByteArray> = v.iter().map(|s| ByteArray::from(s.as_str())).collect();
                put::<ByteArrayType>(&mut rg, &vals, &ones(v.len()), None)
            }
            Column::F32List { width, values } => {
                let (def, rep) = list_levels((0..rows).map(|_| *width));
                put::<FloatType>(&mut rg, values, &def, Some(&rep))
            }
            Column::F64List { width, values } => {
                let (def, rep) = list_levels((0..rows).map(|_| *width));
                put::<DoubleType>(&mut rg, values, &def, Some(&rep))
            }
            Column::StrList(v) => {
                let (def, rep) = list_levels(v.iter().map(Vec::len));
                let vals: Vec<ByteArray> = v.iter().flatten().map(|s| ByteArray::from(s.as_str())).collect();
                put::<ByteArrayType>(&mut rg, &vals, &def, Some(&rep))
            }
            Column::Image(v) => {
                let vals: Vec<ByteArray> = v.iter().map(|b| ByteArray::from(b.clone())).collect();
                put::<ByteArrayType>(&mut rg, &vals, &vec![2i16; v.len()], None)
                    // `path`: null in every row (struct defined, field not).
                    .and_then(|_| put::<ByteArrayType>(&mut rg, &[], &ones(v.len()), None))
            }
        }
        .map_err(e)?;
    }
    rg.close().map_err(e)?;
    w.close().map_err(e)?;
    std::fs::rename(&tmp, path).map_err(|x| DatasetError::io(path, x))
}

/// Write the next leaf column of `rg`.
fn put<T: DataType>(
    rg: &mut SerializedRowGroupWriter<'_, File>,
    values: &[T::T],
    def: &[i16],
    rep: Option<&[i16]>,
) -> parquet::errors::Result<()> {
    let mut c = rg.next_column()?.ok_or_else(|| parquet::errors::ParquetError::General("more columns than the schema".into()))?;
    c.typed::<T>().write_batch(values, Some(def), rep)?;
    c.close()
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Write `bytes` to `path` atomically.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), DatasetError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|x| DatasetError::io(dir, x))?;
    }
    let tmp = tmp_path(path);
    std::fs::write(&tmp, bytes).map_err(|x| DatasetError::io(&tmp, x))?;
    std::fs::rename(&tmp, path).map_err(|x| DatasetError::io(path, x))
}

/// PNG-encode an RGB8 image with the `png` crate (the `image` crate would only wrap it: see
/// the [`crate::image`] module doc for why it is not used).
pub fn encode_png(width: usize, height: usize, rgb: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, width as u32, height as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.set_compression(png::Compression::Fast);
        let mut w = enc.write_header().expect("PNG header to memory");
        w.write_image_data(rgb).expect("PNG data to memory");
    }
    out
}

/// One recorded episode: per-frame vectors and RGB frames.
pub struct EpisodeData {
    pub task: String,
    /// `frames × state_dim`.
    pub state: Vec<f32>,
    /// `frames × action_dim`.
    pub action: Vec<f32>,
    pub reward: Vec<f32>,
    pub done: Vec<bool>,
    pub success: Vec<bool>,
    /// One RGB8 `height × width × 3` frame per step.
    pub frames: Vec<Vec<u8>>,
}

/// The layout of the dataset a [`write_dataset`] call produces.
pub struct DatasetSpec {
    pub fps: f64,
    pub robot_type: String,
    pub state_dim: usize,
    pub action_dim: usize,
    pub state_names: Vec<String>,
    pub action_names: Vec<String>,
    pub camera_key: String,
    pub height: usize,
    pub width: usize,
}

/// (min, max, mean, std) per element over `rows` of `width`.
fn stats(values: &[f32], width: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let rows = values.len() / width.max(1);
    let mut out = (vec![f64::INFINITY; width], vec![f64::NEG_INFINITY; width], vec![0.0; width], vec![0.0; width]);
    for r in values.chunks_exact(width) {
        for (j, &v) in r.iter().enumerate() {
            let v = v as f64;
            out.0[j] = out.0[j].min(v);
            out.1[j] = out.1[j].max(v);
            out.2[j] += v;
        }
    }
    out.2.iter_mut().for_each(|m| *m /= rows.max(1) as f64);
    for r in values.chunks_exact(width) {
        for (j, &v) in r.iter().enumerate() {
            out.3[j] += (v as f64 - out.2[j]).powi(2);
        }
    }
    out.3.iter_mut().for_each(|s| *s = (*s / rows.max(1) as f64).sqrt());
    out
}

fn stats_json(values: &[f32], width: usize) -> Value {
    let (min, max, mean, std) = stats(values, width);
    json!({"min": min, "max": max, "mean": mean, "std": std, "count": [values.len() / width.max(1)]})
}

/// Every frame of every episode as columns, with per-channel pixel statistics.
#[derive(Default)]
struct Columns {
    tasks: Vec<String>,
    state: Vec<f32>,
    action: Vec<f32>,
    reward: Vec<f32>,
    done: Vec<bool>,
    success: Vec<bool>,
    ts: Vec<f32>,
    frame_index: Vec<i64>,
    episode_index: Vec<i64>,
    index: Vec<i64>,
    task_index: Vec<i64>,
    /// PNG bytes per frame.
    images: Vec<Vec<u8>>,
    pixels: PixelStats,
    /// (episode, task, length, from, to) per episode.
    episodes: Vec<(i64, String, i64, i64, i64)>,
}

/// Running per-channel statistics of pixels in `[0, 1]`.
struct PixelStats {
    sum: [f64; 3],
    sq: [f64; 3],
    min: [f64; 3],
    max: [f64; 3],
}

impl Default for PixelStats {
    fn default() -> Self {
        Self { sum: [0.0; 3], sq: [0.0; 3], min: [1.0; 3], max: [0.0; 3] }
    }
}

impl PixelStats {
    fn add(&mut self, rgb: &[u8]) {
        for px in rgb.chunks_exact(3) {
            for (c, &byte) in px.iter().enumerate() {
                let v = byte as f64 / 255.0;
                self.sum[c] += v;
                self.sq[c] += v * v;
                self.min[c] = self.min[c].min(v);
                self.max[c] = self.max[c].max(v);
            }
        }
    }

    /// lerobot's image stats: `[3, 1, 1]` per statistic.
    fn json(&self, count: usize) -> serde_json::Value {
        let chan = |v: [f64; 3]| json!([[[v[0]]], [[v[1]]], [[v[2]]]]);
        let n = count.max(1) as f64;
        let mean = self.sum.map(|s| s / n);
        let std = [0, 1, 2].map(|c| (self.sq[c] / n - mean[c] * mean[c]).max(0.0).sqrt());
        json!({"min": chan(self.min), "max": chan(self.max), "mean": chan(mean), "std": chan(std)})
    }
}

impl Columns {
    /// Check each episode against `spec` and append its frames.
    fn gather(spec: &DatasetSpec, episodes: &[EpisodeData]) -> Result<Self, DatasetError> {
        let (sd, ad) = (spec.state_dim, spec.action_dim);
        let mut c = Self::default();
        for (e, ep) in episodes.iter().enumerate() {
            let n = ep.frames.len();
            if ep.state.len() != n * sd || ep.action.len() != n * ad || ep.reward.len() != n || ep.done.len() != n || ep.success.len() != n {
                return Err(DatasetError::arg(format!("episode {e}: per-frame arrays disagree with {n} frames")));
            }
            let ti = match c.tasks.iter().position(|t| *t == ep.task) {
                Some(i) => i,
                None => {
                    c.tasks.push(ep.task.clone());
                    c.tasks.len() - 1
                }
            };
            let from = c.index.len();
            for (f, img) in ep.frames.iter().enumerate() {
                if img.len() != spec.height * spec.width * 3 {
                    return Err(DatasetError::arg(format!("episode {e} frame {f}: {} bytes, expected {}×{}×3", img.len(), spec.height, spec.width)));
                }
                c.pixels.add(img);
                c.images.push(encode_png(spec.width, spec.height, img));
                c.ts.push(f as f32 / spec.fps as f32);
                c.frame_index.push(f as i64);
                c.episode_index.push(e as i64);
                c.index.push(c.index.len() as i64);
                c.task_index.push(ti as i64);
            }
            c.state.extend_from_slice(&ep.state);
            c.action.extend_from_slice(&ep.action);
            c.reward.extend_from_slice(&ep.reward);
            c.done.extend_from_slice(&ep.done);
            c.success.extend_from_slice(&ep.success);
            c.episodes.push((e as i64, ep.task.clone(), n as i64, from as i64, c.index.len() as i64));
        }
        Ok(c)
    }
}

/// The marker file in a `<root>.partial` staging directory that vramlab made: only such a
/// directory is ever removed (a stale one, left by a killed run). It also holds the writing
/// process's advisory lock and pid: a second writer of the same dataset refuses at once.
pub const STAGING_MARKER: &str = ".vramlab-partial";

/// `<root>.partial`, made and locked by this process: where [`Staging::write`] assembles the
/// dataset before renaming it to `root`.
#[derive(Debug)]
pub struct Staging {
    root: PathBuf,
    dir: PathBuf,
    _lock: File,
}

impl Staging {
    /// Check that `root` does not exist and claim `<root>.partial` (before any costly work).
    /// A `<root>.partial` without vramlab's marker is refused, naming it; one whose marker
    /// another live process holds is refused, naming its pid; one left by a killed run is
    /// replaced.
    pub fn open(root: &Path) -> Result<Staging, DatasetError> {
        if root.exists() {
            return Err(DatasetError::arg(format!("{}: already exists; refusing to overwrite", root.display())));
        }
        let mut dir = root.as_os_str().to_os_string();
        dir.push(".partial");
        let dir = PathBuf::from(dir);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let marker = dir.join(STAGING_MARKER);
                if !marker.is_file() {
                    return Err(DatasetError::arg(format!(
                        "{}: exists and was not made by vramlab (no {STAGING_MARKER} inside); move it away or choose another path",
                        dir.display()
                    )));
                }
                drop(lock_marker(&marker, &dir)?);
                // Left by a killed run of ours: start over.
                std::fs::remove_dir_all(&dir).map_err(|x| DatasetError::io(&dir, x))?;
                std::fs::create_dir(&dir).map_err(|x| DatasetError::io(&dir, x))?;
            }
            Err(e) => return Err(DatasetError::io(&dir, e)),
        }
        let lock = lock_marker(&dir.join(STAGING_MARKER), &dir)?;
        Ok(Staging { root: root.to_path_buf(), dir, _lock: lock })
    }

    /// Write `episodes` into the staging directory and rename it to the dataset's root.
    pub fn write(self, spec: &DatasetSpec, episodes: &[EpisodeData]) -> Result<(), DatasetError> {
        write_staged(&self.dir, spec, episodes)?;
        let marker = self.dir.join(STAGING_MARKER);
        std::fs::remove_file(&marker).map_err(|x| DatasetError::io(&marker, x))?;
        std::fs::rename(&self.dir, &self.root).map_err(|x| DatasetError::io(&self.root, x))
    }
}

/// Lock `marker` (created if missing) and write this process's pid into it; held by another
/// process: an error naming its pid.
fn lock_marker(marker: &Path, dir: &Path) -> Result<File, DatasetError> {
    use std::io::{Read, Seek, Write};
    let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(marker).map_err(|x| DatasetError::io(marker, x))?;
    match f.try_lock() {
        Ok(()) => {
            f.set_len(0).and_then(|()| f.write_all(format!("{}\n", std::process::id()).as_bytes())).map_err(|x| DatasetError::io(marker, x))?;
            Ok(f)
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            for _ in 0..20 {
                pid.clear();
                if f.rewind().is_ok() && f.read_to_string(&mut pid).is_ok() && !pid.trim().is_empty() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            let pid = if pid.trim().is_empty() { "pid unknown".to_string() } else { format!("pid {}", pid.trim()) };
            Err(DatasetError::arg(format!("{}: another vramlab process ({pid}) is writing this dataset; wait for it to finish", dir.display())))
        }
        Err(std::fs::TryLockError::Error(x)) => Err(DatasetError::io(marker, x)),
    }
}

/// Write `episodes` as a LeRobot v3.0 dataset at `root` (which must not exist): one data file,
/// one episodes file, tasks, info and stats (image stats per channel in `[0, 1]`, shaped
/// `[3, 1, 1]` as lerobot's). Everything is written under `<root>.partial` ([`Staging`]),
/// renamed last.
pub fn write_dataset(root: &Path, spec: &DatasetSpec, episodes: &[EpisodeData]) -> Result<(), DatasetError> {
    Staging::open(root)?.write(spec, episodes)
}

/// The dataset's files in `staging`.
fn write_staged(staging: &Path, spec: &DatasetSpec, episodes: &[EpisodeData]) -> Result<(), DatasetError> {
    let c = Columns::gather(spec, episodes)?;
    let (total, n_ep, n_tasks) = (c.index.len(), c.episodes.len(), c.tasks.len());
    let stats = json!({
        "observation.state": stats_json(&c.state, spec.state_dim),
        "action": stats_json(&c.action, spec.action_dim),
        "next.reward": stats_json(&c.reward, 1),
        "timestamp": stats_json(&c.ts, 1),
        spec.camera_key.clone(): with_count(c.pixels.json(total * spec.height * spec.width), total),
    });
    write_episodes(&staging, &c.episodes)?;
    write_tasks(&staging, &c.tasks)?;
    write_frames(&staging, spec, c)?;
    write_file(&staging.join("meta/stats.json"), serde_json::to_string_pretty(&stats).expect("json").as_bytes())?;
    write_file(&staging.join("meta/info.json"), serde_json::to_string_pretty(&info_json(spec, n_ep, total, n_tasks)).expect("json").as_bytes())
}

/// `stats` with lerobot's `count` added.
fn with_count(mut stats: serde_json::Value, count: usize) -> serde_json::Value {
    stats["count"] = json!([count]);
    stats
}

/// `data/chunk-000/file-000.parquet`: one row per frame.
fn write_frames(staging: &Path, spec: &DatasetSpec, c: Columns) -> Result<(), DatasetError> {
    let data_file = staging.join("data/chunk-000/file-000.parquet");
    std::fs::create_dir_all(data_file.parent().expect("has parent")).map_err(|x| DatasetError::io(staging, x))?;
    write_parquet(
        &data_file,
        &[
            (spec.camera_key.as_str(), Column::Image(c.images)),
            ("observation.state", Column::F32List { width: spec.state_dim, values: c.state }),
            ("action", Column::F32List { width: spec.action_dim, values: c.action }),
            ("next.reward", Column::F32(c.reward)),
            ("next.done", Column::Bool(c.done)),
            ("next.success", Column::Bool(c.success)),
            ("timestamp", Column::F32(c.ts)),
            ("frame_index", Column::I64(c.frame_index)),
            ("episode_index", Column::I64(c.episode_index)),
            ("index", Column::I64(c.index)),
            ("task_index", Column::I64(c.task_index)),
        ],
    )
}

/// `meta/episodes/chunk-000/file-000.parquet`: one row per episode.
fn write_episodes(staging: &Path, rows: &[(i64, String, i64, i64, i64)]) -> Result<(), DatasetError> {
    let ep_file = staging.join("meta/episodes/chunk-000/file-000.parquet");
    std::fs::create_dir_all(ep_file.parent().expect("has parent")).map_err(|x| DatasetError::io(staging, x))?;
    let n_ep = rows.len();
    write_parquet(
        &ep_file,
        &[
            ("episode_index", Column::I64(rows.iter().map(|r| r.0).collect())),
            ("tasks", Column::StrList(rows.iter().map(|r| vec![r.1.clone()]).collect())),
            ("length", Column::I64(rows.iter().map(|r| r.2).collect())),
            ("data/chunk_index", Column::I64(vec![0; n_ep])),
            ("data/file_index", Column::I64(vec![0; n_ep])),
            ("dataset_from_index", Column::I64(rows.iter().map(|r| r.3).collect())),
            ("dataset_to_index", Column::I64(rows.iter().map(|r| r.4).collect())),
            ("meta/episodes/chunk_index", Column::I64(vec![0; n_ep])),
            ("meta/episodes/file_index", Column::I64(vec![0; n_ep])),
        ],
    )
}

/// `meta/tasks.parquet`, with the pandas index metadata lerobot reads it by.
fn write_tasks(staging: &Path, tasks: &[String]) -> Result<(), DatasetError> {
    // lerobot reads tasks with pandas, the task string being the frame's index.
    let pandas = json!({
        "index_columns": ["__index_level_0__"],
        "column_indexes": [{"name": null, "field_name": null, "pandas_type": "unicode", "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": null},
            {"name": null, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object", "metadata": null}
        ],
        "creator": {"library": "vramlab", "version": env!("CARGO_PKG_VERSION")},
        "pandas_version": "2.2.0"
    });
    write_parquet_with_metadata(
        &staging.join("meta/tasks.parquet"),
        &[("task_index", Column::I64((0..tasks.len() as i64).collect())), ("__index_level_0__", Column::Str(tasks.to_vec()))],
        vec![("pandas".into(), pandas.to_string())],
    )
}

/// `meta/info.json` of a v3.0 dataset with one data file and images in parquet.
fn info_json(spec: &DatasetSpec, n_ep: usize, total: usize, n_tasks: usize) -> serde_json::Value {
    let scalar = |dtype: &str| json!({"dtype": dtype, "shape": [1], "names": null});
    json!({
        "codebase_version": "v3.0",
        "robot_type": spec.robot_type,
        "total_episodes": n_ep,
        "total_frames": total,
        "total_tasks": n_tasks,
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 500,
        "fps": spec.fps,
        "splits": {"train": format!("0:{n_ep}")},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": null,
        "features": {
            spec.camera_key.clone(): {"dtype": "image", "shape": [spec.height, spec.width, 3], "names": ["height", "width", "channel"]},
            "observation.state": {"dtype": "float32", "shape": [spec.state_dim], "names": spec.state_names},
            "action": {"dtype": "float32", "shape": [spec.action_dim], "names": spec.action_names},
            "next.reward": scalar("float32"),
            "next.done": scalar("bool"),
            "next.success": scalar("bool"),
            "timestamp": scalar("float32"),
            "frame_index": scalar("int64"),
            "episode_index": scalar("int64"),
            "index": scalar("int64"),
            "task_index": scalar("int64"),
        }
    })
}
