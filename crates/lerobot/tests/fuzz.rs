//! Deterministic mutation fuzzing: mutated info.json / parquet files / mp4 headers / AV1
//! payloads must give errors (or valid data), never a panic. Prints how many inputs ran.
mod common;

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

use common::synth;
use vramlab_lerobot::{LeRobotDataset, SampleOptions, VideoReader};

/// xorshift64* — deterministic, no dependencies.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// 1-3 byte-level mutations, positions drawn from `regions` (truncation anywhere).
fn mutate(data: &[u8], rng: &mut Rng, regions: &[(usize, usize)]) -> Vec<u8> {
    let mut d = data.to_vec();
    for _ in 0..1 + rng.below(3) {
        if d.is_empty() {
            break;
        }
        let (a, b) = regions[rng.below(regions.len())];
        let (a, b) = (a.min(d.len() - 1), b.min(d.len()));
        let pos = a + rng.below(b - a);
        match rng.below(8) {
            0 => d[pos] ^= 1 << rng.below(8),
            1 => d[pos] = rng.next() as u8,
            2 => d.truncate(rng.below(d.len())),
            3 | 4 => {
                let vals = [0u32, 1, 0xFFFF_FFFF, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF, 8, 16];
                let v = vals[rng.below(vals.len())].to_be_bytes();
                for (i, x) in v.iter().enumerate() {
                    if let Some(y) = d.get_mut(pos + i) {
                        *y = *x;
                    }
                }
            }
            5 => {
                let n = (1 + rng.below(16)).min(d.len() - pos);
                d.drain(pos..pos + n);
            }
            6 => {
                let n = 1 + rng.below(16);
                let ins: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                d.splice(pos..pos, ins);
            }
            _ => {
                let n = 1 + rng.below(32);
                let src = rng.below(d.len());
                let chunk: Vec<u8> = d[src..(src + n).min(d.len())].to_vec();
                for (i, x) in chunk.iter().enumerate() {
                    if let Some(y) = d.get_mut(pos + i) {
                        *y = *x;
                    }
                }
            }
        }
    }
    d
}

/// Structural JSON mutation: replace a random value somewhere with a hostile one.
fn mutate_json(v: &serde_json::Value, rng: &mut Rng) -> serde_json::Value {
    use serde_json::{json, Value};
    let hostile = [
        json!(null),
        json!(-1),
        json!(0),
        json!(1e300),
        json!(4294967296u64),
        json!("x"),
        json!("{episode_index:09999d}"),
        json!([]),
        json!({}),
        json!([1, [2]]),
        json!([100000000, 100000000]),
        json!("v2.1"),
        json!("video"),
        json!("image"),
        json!("string"),
    ];
    let mut out = v.clone();
    fn pick<'a>(v: &'a mut Value, rng: &mut Rng, depth: usize) -> &'a mut Value {
        let go = depth < 5 && rng.below(4) != 0;
        let descend = match &*v {
            Value::Object(m) => go && !m.is_empty(),
            Value::Array(a) => go && !a.is_empty(),
            _ => false,
        };
        if !descend {
            return v;
        }
        match v {
            Value::Object(m) => {
                let k = m.keys().nth(rng.below(m.len())).unwrap().clone();
                pick(m.get_mut(&k).unwrap(), rng, depth + 1)
            }
            Value::Array(a) => {
                let i = rng.below(a.len());
                pick(&mut a[i], rng, depth + 1)
            }
            _ => unreachable!(),
        }
    }
    let target = pick(&mut out, rng, 0);
    *target = hostile[rng.below(hostile.len())].clone();
    out
}

#[derive(Default, Debug)]
struct Tally {
    tried: usize,
    ok: usize,
    err: usize,
    panics: Vec<String>,
}

impl Tally {
    fn run(&mut self, label: &str, f: impl FnOnce() -> Result<(), vramlab_lerobot::DatasetError>) {
        self.tried += 1;
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) => self.ok += 1,
            Ok(Err(e)) => {
                assert!(e.path().is_some() || matches!(e, vramlab_lerobot::DatasetError::InvalidArgument(_)));
                self.err += 1
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                self.panics.push(format!("{label}: {msg}"));
            }
        }
    }
    fn report(&self, what: &str) {
        println!(
            "fuzz {what}: {} inputs tried, {} opened/read fine, {} rejected with DatasetError, {} panics",
            self.tried,
            self.ok,
            self.err,
            self.panics.len()
        );
        assert!(self.panics.is_empty(), "{what}: panics: {:#?}", self.panics);
    }
}

/// Open and read everything tabular (+ a few samples with delta windows, no cameras).
fn exercise(root: &Path) -> Result<(), vramlab_lerobot::DatasetError> {
    let ds = LeRobotDataset::open(root)?;
    for i in 0..ds.num_frames() {
        ds.frame(i)?;
    }
    let mut opts = SampleOptions::new(common::diffusion_delta_indices(ds.info(), 2, 16));
    opts.cameras = false;
    for i in [0, ds.num_frames() / 2, ds.num_frames().saturating_sub(1)] {
        if i < ds.num_frames() {
            ds.sample(i, &opts)?;
        }
    }
    Ok(())
}

const N: usize = 200;

#[test]
fn fuzz_info_json() {
    let root = vramlab_testkit::temp_dir("lerobot-fuzz-info");
    synth::make_v3(&root);
    let p = root.join("meta/info.json");
    let orig = fs::read(&p).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&orig).unwrap();
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    let mut t = Tally::default();
    for i in 0..N {
        let m = if i % 2 == 0 {
            serde_json::to_vec(&mutate_json(&json, &mut rng)).unwrap()
        } else {
            mutate(&orig, &mut rng, &[(0, orig.len())])
        };
        fs::write(&p, &m).unwrap();
        t.run(&format!("info case {i}"), || exercise(&root));
    }
    t.report("info.json");
}

#[test]
fn fuzz_parquet() {
    let root = vramlab_testkit::temp_dir("lerobot-fuzz-parquet");
    synth::make_v3(&root);
    let mut rng = Rng(0xDEAD_BEEF_0BAD_F00D);
    let mut t = Tally::default();
    // Data file (most cases), episodes metadata and tasks.
    let targets = [
        ("data/chunk-000/file-000.parquet", N),
        ("meta/episodes/chunk-000/file-000.parquet", N / 2),
        ("meta/tasks.parquet", N / 4),
    ];
    for (rel, n) in targets {
        let p = root.join(rel);
        let orig = fs::read(&p).unwrap();
        let len = orig.len();
        // Footer (metadata) and page headers are where lengths live: weight them.
        let regions = [(0, len), (len.saturating_sub(400), len), (0, 64.min(len))];
        for i in 0..n {
            fs::write(&p, mutate(&orig, &mut rng, &regions)).unwrap();
            t.run(&format!("{rel} case {i}"), || {
                exercise(&root)?;
                // Embedded images of the mutated file too.
                let ds = LeRobotDataset::open(&root)?;
                ds.camera_frame("observation.images.png", 1)?;
                ds.camera_frame("observation.images.jpg", 2)?;
                Ok(())
            });
        }
        fs::write(&p, &orig).unwrap();
    }
    t.report("parquet");
}

#[test]
fn fuzz_mp4() {
    let Some(src) = common::shared_dataset("pusht_v30") else { return };
    let slow = common::av1_probe_secs(&src) > 0.05;
    if slow {
        eprintln!("NOTE: {}; AV1 decoding in the fuzz runs within a 4 s budget", common::SLOW_AV1_NOTE);
    }
    let budget = if slow { Duration::from_secs(4) } else { Duration::from_secs(30) };
    let orig = fs::read(src.join("videos/observation.image/chunk-000/file-000.mp4")).unwrap();
    let dir = vramlab_testkit::temp_dir("lerobot-fuzz-mp4");
    let p = dir.join("f.mp4");
    let reference = VideoReader::open(&src.join("videos/observation.image/chunk-000/file-000.mp4")).unwrap();
    let ref_samples = reference.track().samples.clone();
    let moov = orig.len() - 1912;
    assert_eq!(&orig[moov + 4..moov + 8], b"moov");
    let mut rng = Rng(0x0F0F_1234_AAAA_5555);
    let mut t = Tally::default();
    let (mut decodes, mut decode_time, mut changed_tables) = (0usize, Duration::ZERO, 0usize);
    // 1) Container: mutate the top-level headers and the moov box.
    for i in 0..N {
        fs::write(&p, mutate(&orig, &mut rng, &[(0, 48), (moov, orig.len())])).unwrap();
        t.run(&format!("mp4 header case {i}"), || {
            let mut r = VideoReader::open(&p)?;
            let changed = r.track().samples != ref_samples;
            changed_tables += changed as usize;
            // Decoding an unchanged table repeats the clean case: only decode changed ones.
            if changed && decode_time < budget {
                let t0 = Instant::now();
                decodes += 1;
                let last = r.num_frames() - 1;
                let res = r.frame(0).and_then(|_| r.frame(last).map(|_| ()));
                decode_time += t0.elapsed();
                res?;
            }
            Ok(())
        });
    }
    // 2) Bitstream: corrupt the AV1 payload of the first temporal units, decode frames 0-1.
    let (s0, s1) = (ref_samples[0], ref_samples[1]);
    let payload = (s0.offset as usize, (s1.offset + s1.size as u64) as usize);
    let mut payload_cases = 0;
    for i in 0..N {
        if decode_time >= budget {
            break;
        }
        payload_cases += 1;
        let mut m = orig.clone();
        // Only in-place edits: keep the sample table valid.
        for _ in 0..1 + rng.below(4) {
            let pos = payload.0 + rng.below(payload.1 - payload.0);
            m[pos] = if rng.below(2) == 0 { m[pos] ^ (1 << rng.below(8)) } else { rng.next() as u8 };
        }
        fs::write(&p, &m).unwrap();
        t.run(&format!("av1 payload case {i}"), || {
            let mut r = VideoReader::open(&p)?;
            let t0 = Instant::now();
            decodes += 1;
            let res = r.frame(0).and_then(|_| r.frame(1).map(|_| ()));
            decode_time += t0.elapsed();
            res
        });
    }
    println!(
        "fuzz mp4: {N} container mutations ({changed_tables} parsed to a different sample table), \
         {payload_cases} AV1 payload mutations, {decodes} decode runs in {decode_time:?}"
    );
    t.report("mp4");
}
