//! Builds small synthetic LeRobot v3.0 datasets on disk (with the `parquet` crate's writer),
//! including parquet-embedded PNG/JPEG cameras, multiple episodes and multiple data files.
#![allow(dead_code)]

use std::fs;
use std::path::Path;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, FloatType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

// A 16x8 JPEG of colour ~(50, 101, 202), made with ffmpeg (`color=c=0x3366CC`).
include!("jpeg_const.rs");

pub enum Col {
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    /// list<float>: one Vec per row.
    ListF32(Vec<Vec<f32>>),
    /// list<string>: one Vec per row.
    ListStr(Vec<Vec<String>>),
    Str(Vec<String>),
    /// struct{bytes, path}.
    Image(Vec<Vec<u8>>),
}

fn schema_field(name: &str, c: &Col) -> String {
    match c {
        Col::I64(_) => format!("required int64 {name};"),
        Col::F32(_) => format!("required float {name};"),
        Col::F64(_) => format!("required double {name};"),
        Col::ListF32(_) => format!("optional group {name} (LIST) {{ repeated group list {{ optional float element; }} }}"),
        Col::ListStr(_) => {
            format!("optional group {name} (LIST) {{ repeated group list {{ optional binary element (STRING); }} }}")
        }
        Col::Str(_) => format!("optional binary {name} (STRING);"),
        Col::Image(_) => format!("optional group {name} {{ optional binary bytes; optional binary path (STRING); }}"),
    }
}

/// Write one parquet file (one row group, snappy) with the given columns.
pub fn write_parquet(path: &Path, cols: &[(&str, Col)]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let fields: Vec<String> = cols.iter().map(|(n, c)| schema_field(n, c)).collect();
    let msg = format!("message schema {{ {} }}", fields.join(" "));
    let schema = Arc::new(parse_message_type(&msg).expect("schema"));
    let props = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).build());
    let file = fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(file, schema, props).unwrap();
    let mut rg = w.next_row_group().unwrap();
    // Leaf columns in schema order; images have two leaves.
    let mut leaves: Vec<(&Col, usize)> = Vec::new();
    for (_, c) in cols {
        leaves.push((c, 0));
        if matches!(c, Col::Image(_)) {
            leaves.push((c, 1));
        }
    }
    let mut li = 0;
    while let Some(mut cw) = rg.next_column().unwrap() {
        let (c, sub) = leaves[li];
        li += 1;
        match c {
            Col::I64(v) => {
                cw.typed::<Int64Type>().write_batch(v, None, None).unwrap();
            }
            Col::F32(v) => {
                cw.typed::<FloatType>().write_batch(v, None, None).unwrap();
            }
            Col::F64(v) => {
                cw.typed::<DoubleType>().write_batch(v, None, None).unwrap();
            }
            Col::ListF32(rows) => {
                let (mut vals, mut def, mut rep) = (Vec::new(), Vec::new(), Vec::new());
                for r in rows {
                    if r.is_empty() {
                        def.push(1);
                        rep.push(0);
                    }
                    for (i, x) in r.iter().enumerate() {
                        vals.push(*x);
                        def.push(3);
                        rep.push(if i == 0 { 0 } else { 1 });
                    }
                }
                cw.typed::<FloatType>().write_batch(&vals, Some(&def), Some(&rep)).unwrap();
            }
            Col::ListStr(rows) => {
                let (mut vals, mut def, mut rep) = (Vec::new(), Vec::new(), Vec::new());
                for r in rows {
                    if r.is_empty() {
                        def.push(1);
                        rep.push(0);
                    }
                    for (i, x) in r.iter().enumerate() {
                        vals.push(ByteArray::from(x.as_str()));
                        def.push(3);
                        rep.push(if i == 0 { 0 } else { 1 });
                    }
                }
                cw.typed::<ByteArrayType>().write_batch(&vals, Some(&def), Some(&rep)).unwrap();
            }
            Col::Str(v) => {
                let vals: Vec<ByteArray> = v.iter().map(|s| ByteArray::from(s.as_str())).collect();
                let def = vec![1i16; v.len()];
                cw.typed::<ByteArrayType>().write_batch(&vals, Some(&def), None).unwrap();
            }
            Col::Image(v) => {
                if sub == 0 {
                    let vals: Vec<ByteArray> = v.iter().map(|b| ByteArray::from(b.clone())).collect();
                    let def = vec![2i16; v.len()];
                    cw.typed::<ByteArrayType>().write_batch(&vals, Some(&def), None).unwrap();
                } else {
                    // path = null
                    let def = vec![1i16; v.len()];
                    cw.typed::<ByteArrayType>().write_batch(&[], Some(&def), None).unwrap();
                }
            }
        }
        cw.close().unwrap();
    }
    rg.close().unwrap();
    w.close().unwrap();
}

/// RGB8 PNG of size w x h whose pixels encode (row index, x, y).
pub fn png_for_row(row: usize, w: usize, h: usize) -> Vec<u8> {
    let mut data = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            data.extend_from_slice(&[(row * 10 % 256) as u8, (x * 20) as u8, (y * 30) as u8]);
        }
    }
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, w as u32, h as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().unwrap();
        wr.write_image_data(&data).unwrap();
    }
    out
}

pub fn state_of(row: usize) -> Vec<f32> {
    vec![row as f32, row as f32 * 0.5, -(row as f32)]
}
pub fn action_of(row: usize) -> Vec<f32> {
    vec![100.0 + row as f32, 200.0 - row as f32]
}

pub const EP_LENGTHS: [usize; 3] = [5, 7, 4];
pub const IMG_W: usize = 8;
pub const IMG_H: usize = 6;

/// Synthetic v3.0 dataset: 3 episodes (5, 7, 4 frames) at 10 fps; episodes 0+1 in
/// data file-000, episode 2 in file-001; `observation.state` [3] as list<float>, `action` [2],
/// camera `observation.images.png` (PNG, 8x6) and `observation.images.jpg` (JPEG, 16x8).
pub fn make_v3(root: &Path) {
    let total: usize = EP_LENGTHS.iter().sum();
    let mut starts = vec![0];
    for l in EP_LENGTHS {
        starts.push(starts.last().unwrap() + l);
    }
    let info = serde_json::json!({
        "codebase_version": "v3.0",
        "robot_type": "synthetic",
        "total_episodes": 3, "total_frames": total, "total_tasks": 2,
        "chunks_size": 1000, "fps": 10,
        "splits": {"train": "0:3"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": null,
        "features": {
            "observation.state": {"dtype": "float32", "shape": [3], "names": ["a", "b", "c"]},
            "action": {"dtype": "float32", "shape": [2], "names": null},
            "observation.images.png": {"dtype": "image", "shape": [IMG_H, IMG_W, 3], "names": ["height", "width", "channels"]},
            "observation.images.jpg": {"dtype": "image", "shape": [8, 16, 3], "names": ["height", "width", "channels"]},
            "timestamp": {"dtype": "float32", "shape": [1], "names": null},
            "frame_index": {"dtype": "int64", "shape": [1], "names": null},
            "episode_index": {"dtype": "int64", "shape": [1], "names": null},
            "index": {"dtype": "int64", "shape": [1], "names": null},
            "task_index": {"dtype": "int64", "shape": [1], "names": null}
        }
    });
    fs::create_dir_all(root.join("meta")).unwrap();
    fs::write(root.join("meta/info.json"), serde_json::to_vec_pretty(&info).unwrap()).unwrap();

    // Data files: rows [0, 12) and [12, 16).
    let file_rows = [(0usize, starts[2]), (starts[2], total)];
    for (fi, &(a, b)) in file_rows.iter().enumerate() {
        let rows: Vec<usize> = (a..b).collect();
        let ep_of = |r: usize| (0..3).find(|&e| r >= starts[e] && r < starts[e + 1]).unwrap();
        let cols = vec![
            ("observation.state", Col::ListF32(rows.iter().map(|&r| state_of(r)).collect())),
            ("action", Col::ListF32(rows.iter().map(|&r| action_of(r)).collect())),
            ("observation.images.png", Col::Image(rows.iter().map(|&r| png_for_row(r, IMG_W, IMG_H)).collect())),
            ("observation.images.jpg", Col::Image(rows.iter().map(|_| BLUE_JPEG_16X8.to_vec()).collect())),
            ("timestamp", Col::F32(rows.iter().map(|&r| (r - starts[ep_of(r)]) as f32 / 10.0).collect())),
            ("frame_index", Col::I64(rows.iter().map(|&r| (r - starts[ep_of(r)]) as i64).collect())),
            ("episode_index", Col::I64(rows.iter().map(|&r| ep_of(r) as i64).collect())),
            ("index", Col::I64(rows.iter().map(|&r| r as i64).collect())),
            ("task_index", Col::I64(rows.iter().map(|&r| (ep_of(r) % 2) as i64).collect())),
        ];
        write_parquet(&root.join(format!("data/chunk-000/file-{fi:03}.parquet")), &cols);
    }
    write_parquet(
        &root.join("meta/episodes/chunk-000/file-000.parquet"),
        &[
            ("episode_index", Col::I64(vec![0, 1, 2])),
            ("tasks", Col::ListStr(vec![vec!["even".into()], vec!["odd".into()], vec!["even".into()]])),
            ("length", Col::I64(EP_LENGTHS.iter().map(|&l| l as i64).collect())),
            ("data/chunk_index", Col::I64(vec![0, 0, 0])),
            ("data/file_index", Col::I64(vec![0, 0, 1])),
            ("dataset_from_index", Col::I64(starts[..3].iter().map(|&s| s as i64).collect())),
            ("dataset_to_index", Col::I64(starts[1..].iter().map(|&s| s as i64).collect())),
        ],
    );
    write_parquet(
        &root.join("meta/tasks.parquet"),
        &[("task_index", Col::I64(vec![0, 1])), ("__index_level_0__", Col::Str(vec!["even".into(), "odd".into()]))],
    );
    let stats = serde_json::json!({
        "observation.state": {"mean": [1.0, 2.0, 3.0], "std": [2.0, 2.0, 0.0], "min": [0.0, -1.0, 5.0], "max": [4.0, 1.0, 5.0], "count": [total]},
        "action": {"mean": [100.0, 200.0], "std": [1.0, 1.0], "min": [100.0, 185.0], "max": [115.0, 200.0], "count": [total]},
        "observation.images.png": {"mean": [[[0.5]], [[0.5]], [[0.5]]], "std": [[[0.25]], [[0.25]], [[0.25]]], "min": [[[0.0]], [[0.0]], [[0.0]]], "max": [[[1.0]], [[1.0]], [[1.0]]], "count": [total]}
    });
    fs::write(root.join("meta/stats.json"), serde_json::to_vec_pretty(&stats).unwrap()).unwrap();
}
