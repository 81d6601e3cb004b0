//! AV1 decoding vs ffmpeg (`-pix_fmt rgb24`): PSNR ≥ 40 dB. Skips without ffmpeg or ../shared.
mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use vramlab_lerobot::{DatasetError, LeRobotDataset, VideoReader};

fn have_ffmpeg() -> bool {
    let ok = Command::new("ffmpeg").arg("-version").output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        eprintln!("SKIP: ffmpeg not on PATH; PSNR comparison against ffmpeg not run");
    }
    ok
}

/// The frames numbered `sorted` (ascending, distinct) as rgb24, from ffmpeg's `select` filter.
fn ffmpeg_frames(path: &Path, sorted: &[usize]) -> Vec<u8> {
    let expr: Vec<String> = sorted.iter().map(|i| format!("eq(n\\,{i})")).collect();
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(path)
        .args(["-vf", &format!("select={}", expr.join("+")), "-vsync", "0"])
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
        .output()
        .expect("run ffmpeg");
    assert!(out.status.success(), "ffmpeg failed: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

fn psnr(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mse: f64 = a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum::<f64>() / a.len() as f64;
    if mse == 0.0 { f64::INFINITY } else { 10.0 * (255.0f64 * 255.0 / mse).log10() }
}

/// Decode frames `idx` (in this order) and compare each with ffmpeg; returns min PSNR.
fn compare(path: &Path, idx: &[usize]) -> f64 {
    let mut sorted = idx.to_vec();
    sorted.sort();
    sorted.dedup();
    let n = sorted.len();
    let reference = ffmpeg_frames(path, &sorted);
    let mut r = VideoReader::open(path).unwrap();
    let (w, h) = (r.track().width as usize, r.track().height as usize);
    let fsz = w * h * 3;
    assert_eq!(reference.len(), n * fsz, "ffmpeg returned an unexpected amount of data");
    let mut min = f64::INFINITY;
    for &i in idx {
        let img = r.frame(i).unwrap();
        assert_eq!((img.width, img.height), (w, h));
        let k = sorted.binary_search(&i).unwrap();
        let p = psnr(&img.data, &reference[k * fsz..(k + 1) * fsz]);
        min = min.min(p);
    }
    min
}

#[test]
fn pusht_av1_matches_ffmpeg() {
    let Some(root) = common::shared_dataset("pusht_v30") else { return };
    if !have_ffmpeg() {
        return;
    }
    let path = root.join("videos/observation.image/chunk-000/file-000.mp4");
    // Sequential run, then out-of-order access (seek back to keyframes, resume forward).
    let slow = common::av1_probe_secs(&root) > 0.05;
    let idx: &[usize] = if slow {
        eprintln!("NOTE: {}; checking 3 frames only", common::SLOW_AV1_NOTE);
        &[0, 1, 3]
    } else {
        &[0, 1, 2, 3, 4, 5, 9, 3, 17, 16, 30, 160, 159, 158]
    };
    let t = Instant::now();
    let p = compare(&path, idx);
    println!("pusht 96x96: min PSNR over {} decodes = {p:.2} dB ({:?})", idx.len(), t.elapsed());
    assert!(p >= 40.0, "PSNR {p:.2} dB < 40 dB");
}

#[test]
fn g1_av1_matches_ffmpeg() {
    let Some(root) = common::shared_dataset("g1_v21_subset") else { return };
    if !have_ffmpeg() {
        return;
    }
    let path = root.join("videos/chunk-000/observation.images.cam_high/episode_000001.mp4");
    // A 640x480 frame costs ~15-25 s when rav1d is built with debug assertions, ~10 ms otherwise.
    if let Some(pusht) = common::shared_dataset("pusht_v30")
        && common::av1_probe_secs(&pusht) > 0.05 {
            eprintln!("SKIP: g1 640x480 PSNR check: {}", common::SLOW_AV1_NOTE);
            return;
        }
    let idx: &[usize] = &[0, 1, 2, 3, 7, 6, 40, 41, 342];
    let t = Instant::now();
    let p = compare(&path, idx);
    println!("g1 640x480: min PSNR over {} decodes = {p:.2} dB ({:?})", idx.len(), t.elapsed());
    assert!(p >= 40.0, "PSNR {p:.2} dB < 40 dB");
}

#[test]
fn timestamps_and_tolerance() {
    let Some(root) = common::shared_dataset("pusht_v30") else { return };
    let ds = LeRobotDataset::open(&root).unwrap();
    let ep = ds.episode(0).unwrap();
    let vid = &ep.videos["observation.image"];
    let r = VideoReader::open(&root.join(&vid.file)).unwrap();
    assert_eq!(r.num_frames(), 161);
    let ts = r.timestamps();
    // Frame k is at k / fps.
    for (k, t) in ts.iter().enumerate() {
        assert!((t - k as f64 / 10.0).abs() < 1e-9, "frame {k} at {t}");
    }
    assert_eq!(r.frame_index_at(1.20004, 1e-4).unwrap(), 12);
    match r.frame_index_at(1.25, 1e-4) {
        Err(DatasetError::TimestampNotFound { timestamp, closest, .. }) => {
            assert_eq!(timestamp, 1.25);
            assert!((closest - 1.2).abs() < 1e-9 || (closest - 1.3).abs() < 1e-9);
        }
        other => panic!("expected TimestampNotFound, got {other:?}"),
    }
    let e = r.frame_index_at(99.0, 1e-4).unwrap_err();
    assert!(e.to_string().contains("file-000.mp4"), "{e}");
}

/// PSNR against ffmpeg's decode committed as PNG (`tests/fixtures/ffmpeg/`): runs without ffmpeg.
#[test]
fn decodes_match_committed_ffmpeg_frames() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ffmpeg");
    let cases: Vec<(&str, &str, usize, String)> = vec![
        ("pusht_v30", "videos/observation.image/chunk-000/file-000.mp4", 0, "pusht_frame0.png".into()),
        ("pusht_v30", "videos/observation.image/chunk-000/file-000.mp4", 17, "pusht_frame17.png".into()),
        ("pusht_v30", "videos/observation.image/chunk-000/file-000.mp4", 160, "pusht_frame160.png".into()),
        ("g1_v21_subset", "videos/chunk-000/observation.images.cam_high/episode_000001.mp4", 100, "g1_ep1_frame100.png".into()),
    ];
    for (ds, file, frame, png) in cases {
        let Some(root) = common::shared_dataset(ds) else { return };
        let path = root.join(file);
        let reference = vramlab_lerobot::image::decode_image(&std::fs::read(fixtures.join(&png)).unwrap(), &fixtures.join(&png)).unwrap();
        let mut r = VideoReader::open(&path).unwrap();
        let img = r.frame(frame).unwrap();
        assert_eq!((img.width, img.height), (reference.width, reference.height), "{png}");
        let p = psnr(&img.data, &reference.data);
        println!("{ds} frame {frame}: PSNR vs ffmpeg {p:.2} dB");
        assert!(p >= 40.0, "{png}: PSNR {p:.2} dB < 40 dB");
    }
}
