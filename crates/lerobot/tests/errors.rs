//! Bad input gives a `DatasetError` naming the file and the problem, never a panic.
mod common;

use std::fs;

use common::synth;
use vramlab_lerobot::{DatasetError, LeRobotDataset, VideoReader};

fn open_err(root: &std::path::Path) -> DatasetError {
    LeRobotDataset::open(root).expect_err("open should fail")
}

#[test]
fn missing_dataset_and_files() {
    let root = vramlab_testkit::temp_dir("lerobot-missing");
    let e = open_err(&root.join("nope"));
    assert!(matches!(e, DatasetError::Io { .. }), "{e}");
    assert!(e.to_string().contains("info.json"), "{e}");

    synth::make_v3(&root);
    fs::remove_file(root.join("data/chunk-000/file-001.parquet")).unwrap();
    let e = open_err(&root);
    assert!(matches!(e, DatasetError::Io { .. }));
    assert!(e.path().unwrap().ends_with("data/chunk-000/file-001.parquet"), "{e}");
}

#[test]
fn bad_info_json() {
    let root = vramlab_testkit::temp_dir("lerobot-info");
    synth::make_v3(&root);
    let info_path = root.join("meta/info.json");
    let orig = fs::read_to_string(&info_path).unwrap();
    let cases: &[(&str, &str)] = &[
        (r#""codebase_version": "v3.0""#, r#""codebase_version": "v1.6""#),
        (r#""fps": 10"#, r#""fps": -3"#),
        (r#""chunks_size": 1000"#, r#""chunks_size": "many""#),
        (r#""data_path": "data/chunk-{chunk_index:03d}"#, r#""data_path": "data/chunk-{bogus:03d}"#),
    ];
    let expect = ["unsupported", "fps", "chunks_size", "bogus"];
    for ((from, to), want) in cases.iter().zip(expect) {
        assert!(orig.contains(from), "fixture lacks {from}");
        fs::write(&info_path, orig.replace(from, to)).unwrap();
        let e = open_err(&root);
        let msg = e.to_string();
        assert!(msg.contains("info.json") && msg.contains(want), "{msg}");
    }
    fs::write(&info_path, &orig[..orig.len() / 2]).unwrap();
    let e = open_err(&root);
    assert!(matches!(e, DatasetError::Metadata { .. }) && e.to_string().contains("not valid JSON"), "{e}");
    // Feature declared in info.json but absent from the parquet files.
    fs::write(&info_path, orig.replace(r#""action""#, r#""action.missing""#)).unwrap();
    let e = open_err(&root);
    assert!(e.to_string().contains("file-000.parquet") && e.to_string().contains("missing column `action.missing`"), "{e}");
    // Wrong width.
    let mut v: serde_json::Value = serde_json::from_str(&orig).unwrap();
    v["features"]["observation.state"]["shape"] = serde_json::json!([4]);
    fs::write(&info_path, serde_json::to_string(&v).unwrap()).unwrap();
    let e = open_err(&root);
    assert!(e.to_string().contains("observation.state") && e.to_string().contains("expected 4"), "{e}");
}

#[test]
fn wrong_schema_and_truncated_parquet() {
    let root = vramlab_testkit::temp_dir("lerobot-schema");
    synth::make_v3(&root);
    // Replace file-001 with one whose `action` is a string column.
    synth::write_parquet(
        &root.join("data/chunk-000/file-001.parquet"),
        &[("action", synth::Col::Str(vec!["x".into(); 4]))],
    );
    let e = open_err(&root);
    let msg = e.to_string();
    assert!(matches!(e, DatasetError::Parquet { .. }), "{msg}");
    assert!(msg.contains("file-001.parquet") && msg.contains("action"), "{msg}");

    synth::make_v3(&root);
    let p = root.join("data/chunk-000/file-000.parquet");
    let bytes = fs::read(&p).unwrap();
    for cut in [0, 3, 100, bytes.len() / 2, bytes.len() - 9, bytes.len() - 1] {
        fs::write(&p, &bytes[..cut]).unwrap();
        let e = open_err(&root);
        assert!(matches!(e, DatasetError::Parquet { .. }), "cut {cut}: {e}");
        assert!(e.to_string().contains("file-000.parquet"), "{e}");
    }
    fs::write(&p, &bytes).unwrap();
    // Episode metadata inconsistent with the data.
    synth::write_parquet(
        &root.join("meta/episodes/chunk-000/file-000.parquet"),
        &[
            ("episode_index", synth::Col::I64(vec![0])),
            ("length", synth::Col::I64(vec![5])),
            ("data/chunk_index", synth::Col::I64(vec![0])),
            ("data/file_index", synth::Col::I64(vec![0])),
            ("dataset_from_index", synth::Col::I64(vec![0])),
            ("dataset_to_index", synth::Col::I64(vec![6])),
        ],
    );
    let e = open_err(&root);
    assert!(e.to_string().contains("episodes") && e.to_string().contains("length"), "{e}");
}

#[test]
fn truncated_and_bogus_mp4() {
    let Some(src) = common::shared_dataset("pusht_v30") else { return };
    let dir = vramlab_testkit::temp_dir("lerobot-mp4");
    let mp4 = fs::read(src.join("videos/observation.image/chunk-000/file-000.mp4")).unwrap();
    let p = dir.join("v.mp4");
    // The moov box is at the end: cutting anywhere loses it or part of it.
    for cut in [0, 7, 100, mp4.len() / 2, mp4.len() - 500, mp4.len() - 1] {
        fs::write(&p, &mp4[..cut]).unwrap();
        let e = VideoReader::open(&p).expect_err("truncated mp4 must fail");
        assert!(matches!(e, DatasetError::Video { .. }), "{e}");
        assert!(e.to_string().contains("v.mp4"), "{e}");
    }
    fs::write(&p, b"this is not a video").unwrap();
    assert!(VideoReader::open(&p).unwrap_err().to_string().contains("no `moov` box"));
    // Missing file.
    let e = VideoReader::open(&dir.join("absent.mp4")).unwrap_err();
    assert!(matches!(e, DatasetError::Io { .. }) && e.to_string().contains("absent.mp4"));
    // Samples pointing past the end: zero the mdat payload region is fine, but shrink the file
    // by cutting mdat (keep moov): offsets now exceed the file.
    let moov_at = mp4.len() - 1912;
    let mut short = mp4[..40].to_vec();
    short.extend_from_slice(&mp4[moov_at..]);
    fs::write(&p, &short).unwrap();
    let e = VideoReader::open(&p).unwrap_err();
    assert!(e.to_string().contains("beyond the end of the file"), "{e}");
}

#[test]
fn timestamp_not_found_in_dataset() {
    let Some(src) = common::shared_dataset("pusht_v30") else { return };
    let root = vramlab_testkit::temp_dir("lerobot-ts");
    common::copy_dir(&src, &root);
    // Shift the timestamps in info? No: shift the episode's video start so every query misses.
    let ds = LeRobotDataset::open(&root).unwrap();
    let ep = ds.episode(0).unwrap();
    let vid = &ep.videos["observation.image"];
    let mut r = VideoReader::open(&root.join(&vid.file)).unwrap();
    let e = r.frame_at(vid.from_timestamp + 0.05, ds.tolerance_s()).unwrap_err();
    match &e {
        DatasetError::TimestampNotFound { path, timestamp, tolerance_s, .. } => {
            assert!(path.ends_with("file-000.mp4"));
            assert_eq!((*timestamp, *tolerance_s), (0.05, 1e-4));
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("no frame within"));
    // Out-of-range requests are argument errors.
    assert!(matches!(ds.frame(161), Err(DatasetError::InvalidArgument(_))));
    assert!(matches!(ds.camera_frame("action", 0), Err(DatasetError::InvalidArgument(_))));
}
