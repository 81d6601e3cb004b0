//! The built-in demonstrations are a real LeRobot v3.0 dataset: written by the writer, read back
//! by the reader with the same frames, windows, pads and stats.

use vramlab_data::push::{dataset_spec, record_episode};
use vramlab_lerobot::{LeRobotDataset, SampleOptions, Version, resolve_delta_indices, writer::write_dataset};

#[test]
fn generated_dataset_reads_back_exactly() {
    // The writer never overwrites: the dataset goes into a directory that does not exist yet.
    let tmp = vramlab_testkit::temp_dir("push");
    let root = tmp.join("push");
    let episodes: Vec<_> = (0..3).map(|s| record_episode(100 + s, 120, 32)).collect();
    write_dataset(&root, &dataset_spec(32), &episodes).unwrap();
    assert!(write_dataset(&root, &dataset_spec(32), &episodes).is_err(), "never overwrites");

    let ds = LeRobotDataset::open(&root).unwrap();
    assert_eq!(ds.version(), Version::V3);
    assert_eq!(ds.num_episodes(), 3);
    let lens: Vec<usize> = episodes.iter().map(|e| e.frames.len()).collect();
    assert_eq!(ds.num_frames(), lens.iter().sum::<usize>());
    assert_eq!(ds.fps(), 10.0);
    assert_eq!(ds.tasks().values().next().map(String::as_str), Some(vramlab_data::push::TASK));

    // Frame 1 of episode 1 with Diffusion's window: obs [-1, 0], actions -1..14.
    let start = lens[0];
    let opts = SampleOptions::new(resolve_delta_indices(ds.info(), Some(&[-1, 0]), Some(&(-1..15).collect::<Vec<i64>>()), None));
    let s = ds.sample(start + 1, &opts).unwrap();
    assert_eq!(s.episode_index, 1);
    assert_eq!(s.frame_index, 1);
    let state = &s.values["observation.state"];
    assert_eq!(state.shape, vec![2, 2]);
    assert_eq!(state.data, episodes[1].state[0..4].to_vec());
    let act = &s.values["action"];
    assert_eq!(act.shape, vec![16, 2]);
    assert_eq!(&act.data[..4], &episodes[1].action[0..4]);
    assert_eq!(s.pads["action"].iter().filter(|&&p| p).count(), 0);
    // Near the episode's end the actions are clamped and padded.
    let e = ds.sample(start + lens[1] - 2, &opts).unwrap();
    let pads = &e.pads["action"];
    assert_eq!(pads.iter().filter(|&&p| p).count(), 16 - 3);
    // Episode start: the previous observation is padded with the first one.
    let f = ds.sample(start, &opts).unwrap();
    assert_eq!(f.pads["observation.state"], vec![true, false]);

    // PNG frames are lossless: the decoded camera equals the render.
    let img = &s.values["observation.image"];
    assert_eq!(img.shape, vec![2, 3, 32, 32]);
    let rendered = &episodes[1].frames[1];
    let plane = 32 * 32;
    for (i, px) in rendered.chunks_exact(3).enumerate() {
        for (c, &byte) in px.iter().enumerate() {
            assert_eq!((img.data[plane * 3 + c * plane + i] * 255.0).round() as u8, byte);
        }
    }

    // Stats: min/max of the actions over all frames.
    let st = ds.stats().unwrap();
    let all: Vec<f32> = episodes.iter().flat_map(|e| e.action.iter().copied()).collect();
    let a = &st["action"];
    let min_x = all.iter().step_by(2).copied().fold(f32::INFINITY, f32::min);
    assert!((a.min[0] - min_x as f64).abs() < 1e-3, "{:?} vs {min_x}", a.min);
    assert_eq!(st["observation.image"].mean.len(), 3);
}
