//! Issue 25, items 5 and 6: one validation for every command, and bounds before allocation.
//! `estimate`, `info`, `sweep` and `fit` refuse what `train` refuses; a flag the chosen data
//! source would ignore is an error naming it and the source; empty sweep lists, `--max_batch=0`,
//! a sweep directory of another config and a point directory vramlab did not make are errors;
//! a run that cannot fit the machine's memory is refused before anything is allocated, with
//! the bytes and the flag; the estimator's own work does not grow with the batch; loader
//! threads are bounded. Each case runs in a scratch working directory and asserts the exit
//! code, that the message names the flag or file, and that no file there changed. Every case
//! exits before training except the one sweep that makes a directory to refuse.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use vramlab_testkit::{TempDir, temp_dir};

const BIN: &str = env!("CARGO_BIN_EXE_vramlab");
/// The tiny VAE of tests/cli.rs: ultra_lightweight on a 4×16×16 grid (the batch left to each
/// case: clap takes `--batch_size` once).
const TINY: [&str; 3] = ["--policy.type=vae3d", "--policy.preset=ultra_lightweight", "--dataset.grid=4,16,16"];

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Every file under `dir` with its bytes (a directory lock's pid, rewritten by each process
/// that takes the lock, aside).
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.insert(p.clone(), Vec::new());
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == ".vramlab.lock") {
                out.insert(p, Vec::new());
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// A scratch working directory holding a file of the user's.
fn workdir(tag: &str) -> TempDir {
    let d = temp_dir(&format!("advcmd-{tag}"));
    std::fs::write(d.join("notes.txt"), "the user's").unwrap();
    d
}

/// `vramlab args…` run in `cwd` with `env`.
fn run_in(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args).current_dir(cwd);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run vramlab")
}

/// `args` run in `cwd` is refused: exit 2, no panic or abort, every needle in the message,
/// and nothing under `cwd` written, changed or deleted.
fn refused_in(cwd: &Path, args: &[&str], needles: &[&str]) -> String {
    let before = tree(cwd);
    let o = run_in(cwd, args, &[]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {t}");
    assert!(!t.contains("panicked") && !t.contains("memory allocation"), "{args:?}: {t}");
    for n in needles {
        assert!(t.contains(n), "{args:?}: `{n}` not in: {t}");
    }
    assert!(tree(cwd) == before, "{args:?}: files under the working directory changed");
    t
}

/// `cmd` with `extra` flags and `--output_dir=out` (relative to the working directory).
fn with<'a>(cmd: &'a [&'a str], extra: &'a [&'a str]) -> Vec<&'a str> {
    cmd.iter().chain(extra).copied().chain(["--output_dir=out"]).collect()
}

#[test]
fn estimate_info_sweep_and_fit_refuse_what_train_refuses() {
    let cwd = workdir("same");
    let cases: [(&[&str], &[&str]); 5] = [
        (&["--batch_size=0"], &["batch_size", "at least 1"]),
        (&["--dataset.grid=5,16,16"], &["dataset.grid", "D=5", "not divisible"]),
        (&["--steps=0"], &["steps", "at least 1"]),
        (&["--optimizer.lr=-1"], &["optimizer.lr", "positive"]),
        (&["--dataset.type=sim"], &["dataset.type", "voxels"]),
    ];
    for (bad, needles) in cases {
        let base: Vec<&str> = TINY.iter().copied().chain(bad.iter().copied()).collect();
        for cmd in [&["train"][..], &["estimate"], &["info"], &["fit", "--budget=1GiB"]] {
            refused_in(cwd.path(), &with(cmd, &base), needles);
        }
        let mut sweep = with(&["sweep", "--sweep.seed=1,2"], &base);
        sweep.push("--steps=1");
        if bad[0] != "--steps=0" {
            refused_in(cwd.path(), &sweep, needles);
        }
    }
}

#[test]
fn a_flag_the_data_source_ignores_is_named_with_the_source() {
    let cwd = workdir("ignored");
    let act = ["--policy.type=act", "--policy.pretrained_backbone_weights=null"];
    let cases: [(&[&str], &[&str]); 11] = [
        // The policies' feature shorthands are random data's only.
        (&["--policy.camera_shape=3,480,640", "--batch_size=8"], &["policy.camera_shape", "dataset.type=sim"]),
        (&["--policy.state_dim=3"], &["policy.state_dim", "dataset.type=sim"]),
        (&["--policy.action_dim=3"], &["policy.action_dim", "dataset.type=sim"]),
        (&["--policy.num_cameras=2"], &["policy.num_cameras", "dataset.type=sim"]),
        // The voxel scenes' fields.
        (&["--dataset.grid=4,16,16"], &["dataset.grid", "dataset.type=sim", "voxels"]),
        (&["--dataset.num_scenes=4"], &["dataset.num_scenes", "dataset.type=sim"]),
        (&["--dataset.num_movers=1"], &["dataset.num_movers", "dataset.type=sim"]),
        (&["--dataset.num_static_boxes=1"], &["dataset.num_static_boxes", "dataset.type=sim"]),
        // The built-in demonstrations' and LeRobot datasets' fields, with random data.
        (&["--dataset.type=random", "--dataset.num_episodes=3"], &["dataset.num_episodes", "dataset.type=random"]),
        (&["--dataset.type=random", "--dataset.image_size=64,64"], &["dataset.image_size", "dataset.type=random"]),
        (&["--dataset.type=random", "--dataset.image_transforms.enable=true"], &["dataset.image_transforms", "dataset.type=random"]),
    ];
    for (bad, needles) in cases {
        let base: Vec<&str> = act.iter().chain(bad).copied().collect();
        for cmd in [&["estimate"][..], &["train"], &["info"]] {
            refused_in(cwd.path(), &with(cmd, &base), needles);
        }
    }
    let vae: [(&[&str], &[&str]); 4] = [
        (&["--dataset.root=somewhere"], &["dataset.root", "dataset.type=voxels"]),
        (&["--dataset.shuffle=false"], &["dataset.shuffle", "dataset.type=voxels"]),
        (&["--dataset.num_episodes=3"], &["dataset.num_episodes", "dataset.type=voxels"]),
        (&["--dataset.image_size=64,64"], &["dataset.image_size", "dataset.type=voxels"]),
    ];
    for (bad, needles) in vae {
        let base: Vec<&str> = TINY.iter().chain(bad).copied().collect();
        for cmd in [&["estimate"][..], &["train"]] {
            refused_in(cwd.path(), &with(cmd, &base), needles);
        }
    }
    // The same flags where their source reads them: accepted.
    let o = run_in(cwd.path(), &["estimate", "--policy.type=act", "--dataset.type=random", "--policy.camera_shape=3,96,96", "--dataset.num_scenes=4"], &[]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn the_imagenet_warning_is_said_by_training_commands_only() {
    let cwd = workdir("warning");
    let o = run_in(cwd.path(), &["estimate", "--policy.type=act", "--batch_size=2"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("WARNING") && !text(&o).contains("ImageNet"), "{}", text(&o));
    let o = run_in(cwd.path(), &["info", "--policy.type=act"], &[]);
    assert!(o.status.success() && !text(&o).contains("ImageNet"), "{}", text(&o));
    // A refused run prints only its error; a run that starts says it.
    let t = refused_in(cwd.path(), &["train", "--policy.type=act", "--steps=0", "--output_dir=out"], &["steps"]);
    assert!(!t.contains("WARNING") && !t.contains("ImageNet"), "{t}");
    let o = run_in(
        cwd.path(),
        &["train", "--policy.type=act", "--dataset.type=random", "--dataset.num_scenes=2", "--policy.camera_shape=3,32,32", "--policy.chunk_size=4", "--policy.n_action_steps=4", "--batch_size=1", "--steps=1", "--save_checkpoint=false", "--output_dir=started"],
        &[],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("WARNING") && t.contains("ImageNet"), "{t}");
}

#[test]
fn empty_sweep_lists_and_invalid_points_are_named_before_any_run() {
    let cwd = workdir("sweep-lists");
    for axis in ["batch_size", "policy.preset", "dataset.grid"] {
        let flag = format!("--sweep.{axis}=[]");
        refused_in(cwd.path(), &with(&["sweep", &flag], &TINY), &[&format!("--sweep.{axis}"), "empty list"]);
    }
    // One value of an axis, then a combination of two valid values.
    refused_in(cwd.path(), &with(&["sweep", "--sweep.batch_size=1,0"], &TINY), &["--sweep.batch_size=0", "at least 1"]);
    refused_in(cwd.path(), &with(&["sweep", "--sweep.steps=1,4", "--sweep.memory_timeline=2"], &TINY), &["sweep.steps=1", "sweep.memory_timeline=2", "memory_timeline"]);
    refused_in(cwd.path(), &with(&["sweep", "--sweep.policy.state_dim=2,3", "--policy.type=act"], &[]), &["--sweep.policy.state_dim=2", "dataset.type=sim"]);
}

#[test]
fn a_sweep_directory_of_another_config_or_not_vramlabs_is_refused() {
    let cwd = workdir("sweep-dir");
    let out = cwd.join("sw");
    // A point directory that vramlab did not make: named, kept.
    std::fs::create_dir_all(out.join("points/seed=1")).unwrap();
    std::fs::write(out.join("points/seed=1/mine.txt"), "keep").unwrap();
    let base: Vec<&str> = ["sweep"].into_iter().chain(TINY).chain(["--batch_size=1", "--sweep.seed=1", "--steps=1", "--save_checkpoint=false", "--output_dir=sw"]).collect();
    let o = run_in(cwd.path(), &base, &[]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("points/seed=1") && t.contains("not made by a vramlab run"), "{t}");
    assert_eq!(std::fs::read_to_string(out.join("points/seed=1/mine.txt")).unwrap(), "keep");
    std::fs::remove_dir_all(out.join("points")).unwrap();
    // A finished one-point sweep, then the same directory under another config.
    let o = run_in(cwd.path(), &base, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(out.join("sweep.csv").is_file() && out.join("sweep_request.json").is_file());
    let mut other = base.clone();
    other.push("--optimizer.lr=0.5");
    refused_in(cwd.path(), &other, &["sweep_request.json", "another request", "--output_dir"]);
    // The same config continues it (the finished point is kept, not run again).
    let o = run_in(cwd.path(), &base, &[]);
    assert!(o.status.success() && !text(&o).contains("[1/1]"), "{}", text(&o));
}

#[test]
fn fit_refuses_max_batch_zero_and_a_budget_below_the_parameters() {
    let cwd = workdir("fit");
    refused_in(cwd.path(), &with(&["fit", "--budget=1GiB", "--max_batch=0"], &TINY), &["max_batch", "at least 1"]);
    refused_in(cwd.path(), &with(&["fit", "--budget=0"], &TINY), &["budget"]);
    // ultra_lightweight has 694,788 f32 parameters (2.65 MiB).
    refused_in(cwd.path(), &with(&["fit", "--budget=1MiB", "--batch_size=1"], &TINY), &["budget", "2779152 bytes", "--budget"]);
    refused_in(cwd.path(), &with(&["fit", "--budget=1GiB", "--sweep.batch_size=1,2"], &TINY), &["sweep"]);
}

#[test]
fn runs_that_cannot_fit_the_machine_are_refused_before_allocating() {
    let cwd = workdir("preflight");
    // Far beyond any machine: named before any estimate figure could overflow.
    for cmd in [&["train"][..], &["estimate"]] {
        let mut args = with(cmd, &TINY);
        args.push("--batch_size=1000000000000");
        refused_in(cwd.path(), &args, &["batch_size", "1000000000000", "beyond what any machine has"]);
    }
    // Beyond this machine (hundreds of TB estimated): the bytes needed and available, the flag.
    let mut args = with(&["train"], &TINY);
    args.push("--batch_size=100000000");
    refused_in(cwd.path(), &args, &["estimated peak", "an estimate", "more memory than this machine has available", "--batch_size=100000000", "VRAMLAB_SKIP_MEMORY_CHECK"]);
    // `info` of a model whose parameters alone do not fit: exact bytes, the policy flag.
    refused_in(cwd.path(), &["info", "--policy.type=vae3d", "--policy.base_channels=100000"], &["f32 parameters", "exact", "more memory than this machine has available", "--policy.base_channels"]);
    // `estimate` only predicts: a batch beyond the machine is estimated, at no cost.
    let t0 = Instant::now();
    let o = run_in(cwd.path(), &["estimate", "--policy.type=vae3d", "--batch_size=1000000000"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("GiB ("), "{}", text(&o));
    assert!(t0.elapsed() < Duration::from_secs(30), "estimate took {:?}", t0.elapsed());
}

#[test]
fn loader_threads_are_bounded() {
    let cwd = workdir("workers");
    for cmd in [&["train"][..], &["estimate"], &["info"]] {
        let mut args = with(cmd, &TINY);
        args.push("--num_workers=100000");
        refused_in(cwd.path(), &args, &["num_workers", "at most 256"]);
    }
    let mut args = with(&["train"], &TINY);
    args.push("--prefetch_factor=1000000");
    refused_in(cwd.path(), &args, &["prefetch_factor", "at most 64"]);
    refused_in(cwd.path(), &["dataset", "bench", "nowhere", "--workers=0,100000"], &["--workers=100000", "at most 256"]);
}
