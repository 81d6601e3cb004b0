//! Metadata, tabular data, delta windows, pads, stats and normalisation on the shared
//! datasets (skipped when ../shared is absent) and on a synthetic v3.0 dataset.
mod common;

use std::collections::BTreeMap;

use common::synth;
use vramlab_lerobot::delta::{delta_timestamps_to_indices, query_indices};
use vramlab_lerobot::normalize::{IMAGENET_MEAN, IMAGENET_STD};
use common::{act_delta_indices, act_norm_map, diffusion_delta_indices, diffusion_norm_map};
use vramlab_lerobot::*;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn g1_v21_metadata_and_rows() {
    let Some(root) = common::shared_dataset("g1_v21_subset") else { return };
    let ds = LeRobotDataset::open(&root).unwrap();
    assert_eq!(ds.version(), Version::V2);
    assert_eq!(ds.info().codebase_version, "v2.1");
    assert_eq!(ds.num_episodes(), 4);
    assert_eq!(ds.num_frames(), 1461);
    assert_eq!(ds.fps(), 30.0);
    assert_eq!(ds.info().chunks_size, 1000);
    assert_eq!(ds.features()["observation.state"].shape, vec![26]);
    assert_eq!(ds.features()["observation.images.cam_high"].kind(), FeatureKind::Video);
    assert_eq!(ds.features()["observation.images.cam_high"].chw(), Some((3, 480, 640)));
    assert_eq!(ds.video_keys(), vec!["observation.images.cam_high".to_string()]);
    let ranges: Vec<_> = (0..4).map(|e| ds.episode_range(e).unwrap()).collect();
    assert_eq!(ranges, vec![0..393, 393..736, 736..1093, 1093..1461]);
    assert!(ds.episode_range(4).is_err());
    assert_eq!(ds.tasks()[&0], "Pick up the yellow bottle on the table.");
    let ep2 = ds.episode(2).unwrap();
    assert_eq!(
        ep2.videos["observation.images.cam_high"].file.to_str().unwrap(),
        "videos/chunk-000/observation.images.cam_high/episode_000002.mp4"
    );
    assert_eq!(ep2.data_file.to_str().unwrap(), "data/chunk-000/episode_000002.parquet");

    // Values checked against pyarrow.
    let f = ds.frame(1).unwrap();
    assert_eq!((f.episode_index, f.frame_index, f.index), (0, 1, 1));
    assert_eq!(f.timestamp, 0.033333335);
    assert_eq!(f.task, "Pick up the yellow bottle on the table.");
    assert_eq!(f.values["observation.state"][0], -0.586_100_5);
    assert_eq!(f.values["action"][25], 0.332_244_93);
    assert_eq!(f.values.len(), 2);
    let f = ds.frame(736 + 10).unwrap();
    assert_eq!((f.episode_index, f.frame_index), (2, 10));
    assert_eq!(f.values["action"][3], 1.079_637_6);
    assert_eq!(f.values["observation.state"][25], 0.22);
    assert_eq!(f.timestamp, 0.333_333_34);
    // `index` column equals the row position.
    let (_, idx) = ds.column("index").unwrap();
    assert!(idx.iter().enumerate().all(|(i, &x)| x == i as f32));
    assert!(ds.frame(1461).is_err());

    // v2.1 stats aggregated like lerobot's aggregate_stats (reference computed with numpy).
    let st = ds.stats().unwrap();
    let a = &st["action"];
    for (got, want) in a.mean.iter().zip([-0.68168267, 0.42984487, -0.40450858]) {
        assert!(close(*got, want, 1e-7), "{got} vs {want}");
    }
    for (got, want) in a.std.iter().zip([0.08394043, 0.02504611, 0.02965163]) {
        assert!(close(*got, want, 1e-6), "{got} vs {want}");
    }
    assert!(close(a.min[0], -0.75516599, 1e-7) && close(a.max[1], 0.47461256, 1e-7));
    assert_eq!(a.count, Some(1461.0));
    let c = &st["observation.images.cam_high"];
    assert_eq!(c.shape, vec![3, 1, 1]);
    for (got, want) in c.mean.iter().zip([0.44928139, 0.46129647, 0.45990441]) {
        assert!(close(*got, want, 1e-7));
    }
    for (got, want) in c.std.iter().zip([0.16277895, 0.17007466, 0.19794818]) {
        assert!(close(*got, want, 1e-6));
    }
}

#[test]
fn pusht_v30_metadata_and_rows() {
    let Some(root) = common::shared_dataset("pusht_v30") else { return };
    let ds = LeRobotDataset::open(&root).unwrap();
    assert_eq!(ds.version(), Version::V3);
    assert_eq!((ds.num_episodes(), ds.num_frames(), ds.fps()), (1, 161, 10.0));
    assert_eq!(ds.episode_range(0).unwrap(), 0..161);
    let ep = ds.episode(0).unwrap();
    assert_eq!(ep.tasks, vec!["pusht".to_string()]);
    let v = &ep.videos["observation.image"];
    assert_eq!(v.file.to_str().unwrap(), "videos/observation.image/chunk-000/file-000.mp4");
    assert_eq!((v.from_timestamp, v.to_timestamp), (0.0, Some(16.1)));
    assert_eq!(ds.tasks()[&0], "pusht");
    let f = ds.frame(160).unwrap();
    assert_eq!(f.task, "pusht");
    assert_eq!(f.values["observation.state"], vec![158.330_17, 360.748_2]);
    assert_eq!(f.values["action"], vec![164.0, 355.0]);
    assert_eq!(f.values["next.reward"], vec![0.372_692_3]);
    assert_eq!(f.values["next.done"], vec![1.0]);
    assert_eq!(f.values["next.success"], vec![0.0]);
    assert_eq!((f.frame_index, f.timestamp), (160, 16.0));
    let st = ds.stats().unwrap();
    assert_eq!(st["observation.state"].mean, vec![209.93535201742043, 284.3281340984084]);
    assert_eq!(st["action"].std, vec![88.3848513547365, 96.69656940383213]);
    assert_eq!(st["observation.image"].shape, vec![3, 1, 1]);
    assert_eq!(st["observation.image"].min[0], 0.14901960784313725);
}

#[test]
fn act_delta_windows_and_pads_g1() {
    let Some(root) = common::shared_dataset("g1_v21_subset") else { return };
    let ds = LeRobotDataset::open(&root).unwrap();
    let deltas = act_delta_indices(ds.info(), 100);
    assert_eq!(deltas.keys().collect::<Vec<_>>(), vec!["action"]);
    let mut opts = SampleOptions::new(deltas);
    opts.cameras = false;
    // 30 frames before the end of episode 0: 70 padded steps repeating the last action.
    let s = ds.sample(392 - 29, &opts).unwrap();
    let a = &s.values["action"];
    assert_eq!(a.shape, vec![100, 26]);
    let pad = &s.pads["action"];
    assert_eq!(pad.iter().filter(|&&p| p).count(), 70);
    assert!(pad[..30].iter().all(|&p| !p) && pad[30..].iter().all(|&p| p));
    let last = ds.value("action", 392).unwrap();
    assert_eq!(&a.data[29 * 26..30 * 26], last);
    assert_eq!(&a.data[99 * 26..], last);
    assert_eq!(&a.data[..26], ds.value("action", 363).unwrap());
    // Current-frame state without deltas.
    assert_eq!(s.values["observation.state"].shape, vec![26]);
    assert_eq!(s.values["observation.state"].data, ds.value("observation.state", 363).unwrap());
    // First frame of episode 1: nothing padded, never crosses into episode 0.
    let s = ds.sample(393, &opts).unwrap();
    assert!(s.pads["action"].iter().all(|&p| !p));
    assert_eq!(s.episode_index, 1);
}

#[test]
fn diffusion_windows_pusht_with_video() {
    let Some(root) = common::shared_dataset("pusht_v30") else { return };
    let ds = LeRobotDataset::open(&root).unwrap();
    let deltas = diffusion_delta_indices(ds.info(), 2, 16);
    assert_eq!(deltas["observation.state"], vec![-1, 0]);
    assert_eq!(deltas["observation.image"], vec![-1, 0]);
    assert_eq!(deltas["action"], (-1..15).collect::<Vec<i64>>());
    // Same as lerobot's delta_timestamps route.
    let mut dt = BTreeMap::new();
    dt.insert("action".to_string(), (-1..15).map(|i| i as f64 / 10.0).collect::<Vec<_>>());
    assert_eq!(delta_timestamps_to_indices(&dt, 10.0, 1e-4).unwrap()["action"], deltas["action"]);

    let opts = SampleOptions::new(deltas);
    let s = ds.sample(0, &opts).unwrap();
    assert_eq!(s.pads["observation.state"], vec![true, false]);
    assert_eq!(s.pads["observation.image"], vec![true, false]);
    assert!(s.pads["action"][0]);
    assert!(s.pads["action"][1..].iter().all(|&p| !p));
    assert_eq!(s.values["observation.state"].shape, vec![2, 2]);
    assert_eq!(s.values["observation.state"].data, vec![222.0, 97.0, 222.0, 97.0]);
    assert_eq!(s.values["action"].shape, vec![16, 2]);
    assert_eq!(&s.values["action"].data[..4], &[233.0, 71.0, 233.0, 71.0]);
    let img = &s.values["observation.image"];
    assert_eq!(img.shape, vec![2, 3, 96, 96]);
    // Padded frame is the clamped (first) frame: both halves equal.
    let n = 3 * 96 * 96;
    assert_eq!(img.data[..n], img.data[n..]);
    assert!(img.data.iter().all(|&x| (0.0..=1.0).contains(&x)));
    let direct = ds.camera_frame("observation.image", 0).unwrap().to_chw_f32();
    assert_eq!(direct, img.data[n..]);

    // End of episode: last actions padded.
    let s = ds.sample(155, &opts).unwrap();
    let pad = &s.pads["action"];
    assert_eq!(pad.iter().filter(|&&p| p).count(), 16 - 1 - 6);
    let (q, p) = query_indices(155, 0, 161, &opts.delta_indices["action"]);
    assert_eq!(&p, pad);
    assert_eq!(*q.last().unwrap(), 160);
    let f1 = ds.camera_frame("observation.image", 154).unwrap().to_chw_f32();
    assert_eq!(s.values["observation.image"].data[..n], f1[..]);
}

#[test]
fn normalization_modes() {
    let Some(root) = common::shared_dataset("pusht_v30") else { return };
    let ds = LeRobotDataset::open(&root).unwrap();
    let st = ds.stats().unwrap();
    // Diffusion: STATE/ACTION MIN_MAX, VISUAL MEAN_STD (dataset stats).
    let n = Normalizer::new(ds.info(), st, &diffusion_norm_map(), false).unwrap();
    assert_eq!(n.mode("action"), NormMode::MinMax);
    assert_eq!(n.mode("timestamp"), NormMode::Identity);
    let mut a = vec![93.0f32, 71.0, 375.0, 449.0, 234.0, 260.0];
    n.normalize("action", &mut a).unwrap();
    assert_eq!(&a[..4], &[-1.0, -1.0, 1.0, 1.0]);
    let want = 2.0 * (234.0f32 - 93.0) / (375.0 - 93.0) - 1.0;
    assert_eq!(a[4], want);
    n.unnormalize("action", &mut a).unwrap();
    assert!((a[5] - 260.0).abs() < 1e-3);
    // ACT: MEAN_STD with eps 1e-8 in f32.
    let n = Normalizer::new(ds.info(), st, &act_norm_map(), true).unwrap();
    let mut s = vec![300.0f32, 100.0];
    n.normalize("observation.state", &mut s).unwrap();
    let (m, sd) = (209.93535201742043f64 as f32, 87.79725496355843f64 as f32);
    assert_eq!(s[0], (300.0 - m) / (sd + 1e-8));
    // Cameras with ImageNet stats, per channel over H*W.
    let mut img = vec![0.5f32; 3 * 4];
    n.normalize_image("observation.image", &mut img, 4).unwrap();
    for c in 0..3 {
        assert_eq!(img[c * 4], (0.5 - IMAGENET_MEAN[c]) / (IMAGENET_STD[c] + 1e-8));
    }
    // Vector API refuses per-channel camera stats.
    assert!(n.normalize("observation.image", &mut [0.0; 12]).is_err());
}

#[test]
fn synthetic_v3_multi_file_with_images() {
    let root = vramlab_testkit::temp_dir("lerobot-synth");
    synth::make_v3(&root);
    let ds = LeRobotDataset::open(&root).unwrap();
    assert_eq!((ds.num_episodes(), ds.num_frames()), (3, 16));
    assert_eq!(ds.episode_range(1).unwrap(), 5..12);
    assert_eq!(ds.episode_range(2).unwrap(), 12..16);
    assert_eq!(ds.episode(2).unwrap().data_file.to_str().unwrap(), "data/chunk-000/file-001.parquet");
    for r in 0..16 {
        let f = ds.frame(r).unwrap();
        assert_eq!(f.values["observation.state"], synth::state_of(r));
        assert_eq!(f.values["action"], synth::action_of(r));
        let ep = if r < 5 { 0 } else if r < 12 { 1 } else { 2 };
        assert_eq!(f.episode_index, ep);
        assert_eq!(f.task, if ep == 1 { "odd" } else { "even" });
    }
    // PNG camera: exact pixels.
    let img = ds.camera_frame("observation.images.png", 13).unwrap();
    assert_eq!((img.width, img.height), (synth::IMG_W, synth::IMG_H));
    assert_eq!(&img.data[..6], &[130, 0, 0, 130, 20, 0]);
    // JPEG camera: approximately the encoded colour.
    let j = ds.camera_frame("observation.images.jpg", 3).unwrap();
    assert_eq!((j.width, j.height), (16, 8));
    for px in j.data.chunks(3) {
        assert!(px[0].abs_diff(50) <= 4 && px[1].abs_diff(101) <= 4 && px[2].abs_diff(202) <= 4, "{px:?}");
    }
    // Delta window across the episode 1 / file boundary.
    let mut d = DeltaIndices::new();
    d.insert("observation.images.png".into(), vec![-1, 0, 1]);
    d.insert("observation.state".into(), vec![-1, 0, 1]);
    let s = ds.sample(11, &SampleOptions::new(d)).unwrap();
    assert_eq!(s.pads["observation.state"], vec![false, false, true]);
    assert_eq!(s.values["observation.state"].data, [synth::state_of(10), synth::state_of(11), synth::state_of(11)].concat());
    let im = &s.values["observation.images.png"];
    assert_eq!(im.shape, vec![3, 3, synth::IMG_H, synth::IMG_W]);
    let plane = synth::IMG_H * synth::IMG_W;
    assert_eq!(im.data[0], 100.0 / 255.0); // R channel of row 10
    assert_eq!(im.data[3 * plane], 110.0 / 255.0); // row 11
    assert_eq!(im.data[6 * plane], 110.0 / 255.0); // clamped to row 11
    assert_eq!(s.values["observation.images.jpg"].shape, vec![3, 8, 16]);
    // Stats + camera normalisation with dataset stats ([3,1,1]).
    let n = Normalizer::new(ds.info(), ds.stats().unwrap(), &diffusion_norm_map(), false).unwrap();
    let mut x = vec![4.0f32, 1.0, 5.0];
    n.normalize("observation.state", &mut x).unwrap();
    // min == max for the last dim: denominator replaced by eps (lerobot 0.4.4).
    assert_eq!(x, vec![1.0, 1.0, -1.0]);
    let mut c = vec![0.75f32; 3 * plane];
    n.normalize_image("observation.images.png", &mut c, plane).unwrap();
    assert!(c.iter().all(|&v| v == (0.75 - 0.5) / (0.25 + 1e-8)));
}

/// v3.0 concatenation: split pusht's single episode into two episodes sharing one mp4, the
/// second starting at `from_timestamp = 10.0` with its own timestamps restarting at 0.
#[test]
fn v3_episodes_share_one_video_file() {
    let Some(src) = common::shared_dataset("pusht_v30") else { return };
    let orig = LeRobotDataset::open(&src).unwrap();
    let root = vramlab_testkit::temp_dir("lerobot-shared-video");
    common::copy_dir(&src.join("videos"), &root.join("videos"));
    common::copy_dir(&src.join("meta"), &root.join("meta"));
    let split = 100usize;
    let n = orig.num_frames();
    let col = |k: &str| -> Vec<Vec<f32>> {
        let (w, v) = orig.column(k).unwrap();
        v.chunks(w).map(|c| c.to_vec()).collect()
    };
    let ep = |r: usize| (r >= split) as i64;
    let local = |r: usize| if r >= split { r - split } else { r };
    use synth::Col;
    synth::write_parquet(
        &root.join("data/chunk-000/file-000.parquet"),
        &[
            ("observation.state", Col::ListF32(col("observation.state"))),
            ("action", Col::ListF32(col("action"))),
            ("episode_index", Col::I64((0..n).map(ep).collect())),
            ("frame_index", Col::I64((0..n).map(|r| local(r) as i64).collect())),
            ("timestamp", Col::F32((0..n).map(|r| local(r) as f32 / 10.0).collect())),
            ("next.reward", Col::F32(col("next.reward").concat())),
            ("next.done", Col::F32(col("next.done").concat())),
            ("next.success", Col::F32(col("next.success").concat())),
            ("index", Col::I64((0..n as i64).collect())),
            ("task_index", Col::I64(vec![0; n])),
        ],
    );
    std::fs::remove_dir_all(root.join("meta/episodes")).unwrap();
    let vk = "videos/observation.image";
    synth::write_parquet(
        &root.join("meta/episodes/chunk-000/file-000.parquet"),
        &[
            ("episode_index", Col::I64(vec![0, 1])),
            ("tasks", Col::ListStr(vec![vec!["pusht".into()], vec!["pusht".into()]])),
            ("length", Col::I64(vec![split as i64, (n - split) as i64])),
            ("data/chunk_index", Col::I64(vec![0, 0])),
            ("data/file_index", Col::I64(vec![0, 0])),
            ("dataset_from_index", Col::I64(vec![0, split as i64])),
            ("dataset_to_index", Col::I64(vec![split as i64, n as i64])),
            (&format!("{vk}/chunk_index"), Col::I64(vec![0, 0])),
            (&format!("{vk}/file_index"), Col::I64(vec![0, 0])),
            (&format!("{vk}/from_timestamp"), Col::F64(vec![0.0, split as f64 / 10.0])),
            (&format!("{vk}/to_timestamp"), Col::F64(vec![split as f64 / 10.0, n as f64 / 10.0])),
        ],
    );
    let ds = LeRobotDataset::open(&root).unwrap();
    assert_eq!(ds.num_episodes(), 2);
    assert_eq!(ds.episode_range(1).unwrap(), split..n);
    let mut d = DeltaIndices::new();
    d.insert("observation.image".into(), vec![-1, 0]);
    let s = ds.sample(split, &SampleOptions::new(d)).unwrap();
    assert_eq!((s.episode_index, s.frame_index, s.timestamp), (1, 0, 0.0));
    assert_eq!(s.pads["observation.image"], vec![true, false]);
    // Frame 0 of episode 1 is frame `split` of the shared file (not frame 0).
    let want = orig.camera_frame("observation.image", split).unwrap().to_chw_f32();
    let m = want.len();
    assert_eq!(s.values["observation.image"].data[m..], want[..]);
    assert_eq!(s.values["observation.image"].data[..m], want[..]);
    assert_ne!(orig.camera_frame("observation.image", 0).unwrap().to_chw_f32(), want);
}

#[test]
fn dataset_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<LeRobotDataset>();
}
