//! Adversarial end-to-end cases of the `vramlab` binary around the files it owns (issue 25):
//! output directories that are empty or files, refusals that must leave a directory as it was,
//! `--resume` of a finished run, other processes' directories (`dataset generate`'s
//! `.partial`), advisory locks (concurrent runs, stale locks of killed runs), and the exit
//! status of a run stopped by SIGINT / SIGTERM. Each case asserts the exit code, the message,
//! and that the files it must not touch are unchanged.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use vramlab_testkit::{TempDir, temp_dir};

const BIN: &str = env!("CARGO_BIN_EXE_vramlab");
/// A VAE small enough for CI: ultra_lightweight on a 4×16×16 grid, batch 1.
const TINY: [&str; 4] = ["--policy.type=vae3d", "--policy.preset=ultra_lightweight", "--dataset.grid=4,16,16", "--batch_size=1"];

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn vramlab(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run vramlab")
}

/// `vramlab train TINY <flags>`, not yet run.
fn train(flags: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("train").args(TINY).args(flags);
    c
}

fn dir_flag(dir: &Path) -> String {
    format!("--output_dir={}", dir.display())
}

/// A file's bytes and modification time: what "unchanged" compares.
fn snapshot(path: &Path) -> (Vec<u8>, SystemTime) {
    (std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())), std::fs::metadata(path).unwrap().modified().unwrap())
}

/// Exit code 2 and `needles` in the output.
fn assert_refused(o: &Output, needles: &[&str]) {
    let t = text(o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    for n in needles {
        assert!(t.contains(n), "expected {n:?} in: {t}");
    }
    assert!(!t.contains("panicked"), "{t}");
}

/// Waits until `dir/metrics.jsonl` has a line (the run is past its checks and holds its lock).
fn wait_for_first_step(child: &mut Child, dir: &Path) {
    let t0 = Instant::now();
    while !std::fs::read_to_string(dir.join("metrics.jsonl")).is_ok_and(|t| t.contains('\n')) {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its first step");
        assert!(t0.elapsed() < Duration::from_secs(120), "no first step");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn checkpoint_steps(dir: &Path) -> Vec<u64> {
    let mut s: Vec<u64> = std::fs::read_dir(dir.join("checkpoints"))
        .map(|rd| rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    s.sort();
    s
}

#[test]
fn an_empty_output_dir_is_refused_and_the_current_directory_is_left_alone() {
    let cwd = temp_dir("adv-empty");
    std::fs::write(cwd.join("metrics.jsonl"), "{\"mine\": 1}\n").unwrap();
    let before = snapshot(&cwd.join("metrics.jsonl"));
    let o = train(&["--steps=1", "--output_dir="]).current_dir(cwd.path()).output().unwrap();
    assert_refused(&o, &["output_dir", "empty"]);
    assert_eq!(snapshot(&cwd.join("metrics.jsonl")), before);
    let names: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["metrics.jsonl"], "nothing written into the current directory");
}

#[test]
fn a_file_as_output_dir_says_so_for_train_resume_and_sweep() {
    let tmp = temp_dir("adv-file");
    let file = tmp.join("notes.txt");
    std::fs::write(&file, "keep me").unwrap();
    let before = snapshot(&file);
    let flag = dir_flag(&file);
    assert_refused(&train(&["--steps=1", &flag]).output().unwrap(), &["output_dir", "is a file"]);
    assert_refused(&vramlab(&["train", "--resume", &flag]), &["output_dir", "is a file"]);
    let mut sweep = vec!["sweep", "--steps=1", "--sweep.batch_size=1,2", &flag];
    sweep.extend(TINY);
    assert_refused(&vramlab(&sweep), &["output_dir", "is a file"]);
    assert_eq!(snapshot(&file), before);
}

#[test]
fn refusals_on_a_finished_run_rewrite_nothing() {
    let tmp = temp_dir("adv-done");
    let dir = tmp.join("run");
    let flag = dir_flag(&dir);
    let o = train(&["--steps=2", "--seed=3", &flag]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let files = ["run_config.json", "metrics.jsonl", "summary.md"].map(|f| dir.join(f));
    let before: Vec<_> = files.iter().map(|f| snapshot(f)).collect();
    let unchanged = |case: &str| {
        let now: Vec<_> = files.iter().map(|f| snapshot(f)).collect();
        assert!(now == before, "{case}: a file of the run changed");
        assert_eq!(checkpoint_steps(&dir), [2], "{case}");
    };
    // A new run into it (another seed): refused before run_config.json is rewritten.
    assert_refused(&train(&["--steps=2", "--seed=4", &flag]).output().unwrap(), &["already holds checkpoints", "--resume"]);
    unchanged("new run");
    // --resume of the finished run, and with --steps at or below its last checkpoint.
    assert_refused(&vramlab(&["train", "--resume", &flag]), &["already at step 2", "--steps"]);
    unchanged("resume");
    assert_refused(&vramlab(&["train", "--resume", "--steps=1", &flag]), &["already at step 2", "--steps"]);
    unchanged("resume --steps=1");
    // Another policy on top of the checkpoint's: named, not "unknown field".
    let o = vramlab(&["train", "--resume", "--policy.type=act", &flag]);
    assert_refused(&o, &["policy.type", "this checkpoint is a vae3d run"]);
    assert!(!text(&o).contains("unknown field"), "{}", text(&o));
    unchanged("resume as act");
    // A --resume that would train (more steps) while another process holds the run's lock.
    let held = hold_lock(&dir, 4243);
    assert_refused(&vramlab(&["train", "--resume", "--steps=3", &flag]), &["pid 4243", "in use by another vramlab process"]);
    unchanged("resume of a locked run");
    drop(held);
}

#[test]
fn a_metrics_file_no_vramlab_run_wrote_is_not_deleted() {
    let tmp = temp_dir("adv-foreign");
    let dir = tmp.join("results");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("metrics.jsonl"), "{\"someone\": \"else\"}\n").unwrap();
    let before = snapshot(&dir.join("metrics.jsonl"));
    assert_refused(&train(&["--steps=1", &dir_flag(&dir)]).output().unwrap(), &["output_dir", "metrics.jsonl", "no vramlab run wrote"]);
    assert_eq!(snapshot(&dir.join("metrics.jsonl")), before);
    assert!(!dir.join("run_config.json").exists());
}

#[test]
fn dataset_generate_keeps_a_partial_directory_it_did_not_make_and_replaces_its_own_stale_one() {
    let tmp = temp_dir("adv-partial");
    let root = tmp.join("ds");
    let partial = tmp.join("ds.partial");
    std::fs::create_dir(&partial).unwrap();
    std::fs::write(partial.join("precious.txt"), "not vramlab's").unwrap();
    let args = ["dataset", "generate", root.to_str().unwrap(), "--episodes=1", "--image_size=16"];
    let o = vramlab(&args);
    assert_refused(&o, &[partial.to_str().unwrap(), "not made by vramlab"]);
    assert_eq!(std::fs::read_to_string(partial.join("precious.txt")).unwrap(), "not vramlab's");
    assert!(!root.exists());
    // vramlab's own, held by a live process (this test): refused naming the pid.
    std::fs::remove_file(partial.join("precious.txt")).unwrap();
    let marker = File::create(partial.join(".vramlab-partial")).unwrap();
    marker.try_lock().unwrap();
    std::fs::write(partial.join(".vramlab-partial"), "4242\n").unwrap();
    assert_refused(&vramlab(&args), &["pid 4242", partial.to_str().unwrap()]);
    assert!(partial.join(".vramlab-partial").exists());
    // Released (its writer died): a stale staging directory of ours is replaced.
    drop(marker);
    let o = vramlab(&args);
    assert!(o.status.success(), "{}", text(&o));
    assert!(root.join("meta/info.json").is_file() && !partial.exists() && !root.join(".vramlab-partial").exists());
}

/// Holds `<dir>/.vramlab.lock` as a running vramlab would, with `pid` written in it.
fn hold_lock(dir: &Path, pid: u32) -> File {
    std::fs::create_dir_all(dir).unwrap();
    let f = File::create(dir.join(".vramlab.lock")).unwrap();
    f.try_lock().unwrap();
    std::fs::write(dir.join(".vramlab.lock"), format!("{pid}\n")).unwrap();
    f
}

#[test]
fn sweep_and_fit_refuse_a_locked_directory_naming_the_holder() {
    let tmp = temp_dir("adv-lock");
    for cmd in ["sweep", "fit"] {
        let dir = tmp.join(cmd);
        let _held = hold_lock(&dir, 31337);
        let flag = dir_flag(&dir);
        let mut args = vec![cmd, "--steps=2", &flag];
        args.extend(TINY);
        if cmd == "sweep" {
            args.push("--sweep.batch_size=1,2");
        } else {
            args.extend(["--budget=64MiB", "--trial_steps=2"]);
        }
        assert_refused(&vramlab(&args), &["pid 31337", "in use by another vramlab process"]);
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [".vramlab.lock"], "{cmd} wrote into a locked directory");
    }
}

/// Two `train` on one directory: the second refuses at once naming the first's pid; once the
/// first is killed (-9), its lock is gone and a third run goes ahead.
#[test]
fn a_second_train_on_a_busy_directory_refuses_and_a_killed_runs_lock_never_blocks() {
    let tmp = temp_dir("adv-busy");
    let dir = tmp.join("run");
    let flag = dir_flag(&dir);
    let mut first = train(&["--steps=100000", "--save_freq=0", "--save_checkpoint=false", &flag]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_for_first_step(&mut first, &dir);
    let t0 = Instant::now();
    let o = train(&["--steps=1", &flag]).output().unwrap();
    assert_refused(&o, &[&format!("pid {}", first.id()), "in use by another vramlab process", "output_dir"]);
    assert!(t0.elapsed() < Duration::from_secs(30), "the second run waited");
    first.kill().unwrap();
    first.wait().unwrap();
    let o = train(&["--steps=1", &flag]).output().unwrap();
    assert!(o.status.success(), "a killed run's lock blocked the next: {}", text(&o));
}

/// SIGINT (Ctrl-C) and SIGTERM stop a run after its checkpoint with 130 and 143, so that a
/// scheduler requeues it; the run then resumes.
#[test]
fn interrupted_runs_checkpoint_and_exit_130_for_sigint_and_143_for_sigterm() {
    for (signal, code) in [("INT", 130), ("TERM", 143)] {
        let tmp: TempDir = temp_dir(&format!("adv-sig{signal}"));
        let dir: PathBuf = tmp.join("run");
        let mut child = train(&["--steps=100000", "--save_freq=0", &dir_flag(&dir)]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        wait_for_first_step(&mut child, &dir);
        let sent = Command::new("kill").arg(format!("-{signal}")).arg(child.id().to_string()).status().unwrap();
        assert!(sent.success());
        let o = child.wait_with_output().unwrap();
        let t = text(&o);
        assert_eq!(o.status.code(), Some(code), "SIG{signal}: {t}");
        assert!(t.contains("interrupted; continue with") && t.contains("--resume"), "{t}");
        let steps = checkpoint_steps(&dir);
        assert_eq!(steps.len(), 1, "SIG{signal}: one checkpoint at the stop, found {steps:?}");
    }
}
