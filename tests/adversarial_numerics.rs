//! Issue 25, items 3 and 4: nothing silently wrong. A run that diverges checkpoints nothing of
//! the weights that gave the non-finite loss and names the last good checkpoint, from which
//! `--resume` with a smaller lr trains; every load of a checkpoint (`predict`, `--policy.path`,
//! resume) checks its manifest and refuses non-finite weights; `predict` refuses non-finite
//! inputs. Each case asserts the exit code, the message and the files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use burn::tensor::TensorData;
use vramlab_testkit::{TempDir, temp_dir};

const BIN: &str = env!("CARGO_BIN_EXE_vramlab");
/// The tiny VAE of tests/cli.rs: ultra_lightweight on a 4×16×16 grid, batch 1.
const TINY: [&str; 4] = ["--policy.type=vae3d", "--policy.preset=ultra_lightweight", "--dataset.grid=4,16,16", "--batch_size=1"];

fn vramlab<S: AsRef<str>>(args: &[S]) -> Output {
    Command::new(BIN).args(args.iter().map(AsRef::as_ref)).output().expect("run vramlab")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Exit code 2, no panic, and every needle in the output.
fn assert_refused(o: &Output, needles: &[&str]) {
    let t = text(o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(!t.contains("panicked"), "{t}");
    for n in needles {
        assert!(t.contains(n), "`{n}` not in: {t}");
    }
}

/// `vramlab train` of the tiny VAE into `dir` with `extra` flags.
fn train_tiny(dir: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<String> = ["train"].iter().chain(TINY.iter()).chain(extra).map(|s| s.to_string()).collect();
    args.push(format!("--output_dir={}", dir.display()));
    vramlab(&args)
}

fn resume(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["train".to_string(), "--resume".into(), format!("--output_dir={}", dir.display())];
    args.extend(extra.iter().map(|s| s.to_string()));
    vramlab(&args)
}

/// The names in `dir/checkpoints`, sorted.
fn checkpoint_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("checkpoints")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    names.sort();
    names
}

fn logged_steps(dir: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()).map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap())).collect()
}

/// A tiny VAE run of one step: its checkpoint, and VAE inputs `x` [1, 4, 4, 16, 16].
fn vae_checkpoint(name: &str) -> (TempDir, PathBuf, PathBuf) {
    let tmp = temp_dir(&format!("numerics-{name}"));
    let run = tmp.join("run");
    let o = train_tiny(&run, &["--steps=1"]);
    assert!(o.status.success(), "{}", text(&o));
    let inputs = tmp.join("inputs.safetensors");
    write_x(&inputs, vec![0.25; 4 * 4 * 16 * 16]);
    (tmp, run.join("checkpoints/000001"), inputs)
}

fn write_x(path: &Path, values: Vec<f32>) {
    vramlab_store::write_safetensors(&[("x".into(), TensorData::new(values, [1, 4, 4, 16, 16]))], path).unwrap();
}

fn predict(checkpoint: &Path, inputs: &Path, out: &Path) -> Output {
    vramlab(&["predict".to_string(), format!("--checkpoint={}", checkpoint.display()), format!("--inputs={}", inputs.display()), format!("--out={}", out.display())])
}

/// Overwrite 4 bytes of a safetensors file's data region (its header kept) with `bytes`.
fn poke_data(path: &Path, bytes: [u8; 4]) {
    let mut b = std::fs::read(path).unwrap();
    let header = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let at = 8 + header + 64;
    b[at..at + 4].copy_from_slice(&bytes);
    std::fs::write(path, b).unwrap();
}

#[test]
fn a_diverged_run_names_its_last_good_checkpoint_and_resumes_from_it_with_a_smaller_lr() {
    let tmp = temp_dir("numerics-diverge");
    let run = tmp.join("run");
    let o = train_tiny(&run, &["--steps=2", "--save_freq=1"]);
    assert!(o.status.success(), "{}", text(&o));
    // lr 1e30 from step 3: the update of step 3 blows the weights up, step 4's loss is NaN.
    let o = resume(&run, &["--steps=6", "--optimizer.lr=1e30"]);
    assert_refused(&o, &["loss is NaN at step 4", "000003.nonfinite", "Last good checkpoint", "checkpoints/000002", "--optimizer.lr"]);
    assert_eq!(checkpoint_names(&run), ["000001", "000002", "000003.nonfinite", "last"]);
    #[cfg(unix)]
    assert_eq!(std::fs::read_link(run.join("checkpoints/last")).unwrap(), PathBuf::from("000002"));
    vramlab_store::check_finite_file(&run.join("checkpoints/000002/pretrained_model/model.safetensors")).unwrap();

    // `--resume` continues from the last good checkpoint, and a smaller lr trains.
    let o = resume(&run, &["--steps=4", "--optimizer.lr=1e-4"]);
    assert!(o.status.success(), "{}", text(&o));
    let steps = logged_steps(&run);
    assert_eq!(steps.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert!(steps.iter().all(|s| s.1.is_finite()), "{steps:?}");
    assert_eq!(checkpoint_names(&run), ["000001", "000002", "000003", "000003.nonfinite", "000004", "last"]);
}

#[test]
fn a_run_that_goes_bad_before_any_good_checkpoint_leaves_nothing_to_resume() {
    let tmp = temp_dir("numerics-first");
    let run = tmp.join("run");
    // The first update blows the weights up; its checkpoint (step 1) gives step 2's NaN loss.
    let o = train_tiny(&run, &["--steps=3", "--save_freq=1", "--optimizer.lr=1e30"]);
    assert_refused(&o, &["loss is NaN at step 2", "000001.nonfinite", "nothing to resume from"]);
    assert_eq!(checkpoint_names(&run), ["000001.nonfinite"]);
    let o = resume(&run, &[]);
    assert_refused(&o, &["resume", "no checkpoint to resume from", "diverged", "000001.nonfinite"]);
    // Nor is the directory taken for a fresh run: it is the diverged run's (its metrics and
    // config stay as they are).
    let files = ["run_config.json", "metrics.jsonl"].map(|f| run.join(f));
    let before: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let o = train_tiny(&run, &["--steps=1"]);
    assert_refused(&o, &["output_dir", "diverged", "000001.nonfinite", "another --output_dir"]);
    assert_eq!(files.iter().map(|f| std::fs::read(f).unwrap()).collect::<Vec<_>>(), before);
    assert_eq!(checkpoint_names(&run), ["000001.nonfinite"]);
}

#[test]
fn predict_refuses_a_checkpoint_whose_model_bytes_changed() {
    let (tmp, ckpt, inputs) = vae_checkpoint("changed");
    let out = tmp.join("out.safetensors");
    let o = predict(&ckpt, &inputs, &out);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::remove_file(&out).unwrap();

    poke_data(&ckpt.join("pretrained_model/model.safetensors"), [1, 2, 3, 4]);
    for path in [ckpt.clone(), ckpt.join("pretrained_model"), ckpt.parent().unwrap().to_path_buf()] {
        let o = predict(&path, &inputs, &out);
        assert_refused(&o, &["--checkpoint", "pretrained_model/model.safetensors", "SHA-256 differs", "refusing to load"]);
        assert!(!out.exists());
    }
    // `--resume` skips it the same way (and has nothing older).
    let o = resume(&tmp.join("run"), &["--steps=2"]);
    assert_refused(&o, &["no intact checkpoint", "SHA-256 differs"]);
}

#[test]
fn a_manifest_that_lists_no_files_verifies_nothing() {
    let (tmp, ckpt, inputs) = vae_checkpoint("empty-manifest");
    std::fs::write(ckpt.join("manifest.json"), r#"{"step": 1, "files": {}}"#).unwrap();
    let out = tmp.join("out.safetensors");
    assert_refused(&predict(&ckpt, &inputs, &out), &["--checkpoint", "manifest.json lists no files"]);
    assert!(!out.exists());
    assert_refused(&resume(&tmp.join("run"), &["--steps=2"]), &["no intact checkpoint", "lists no files"]);
    // A file the manifest does not cover is refused too.
    let (tmp, ckpt, inputs) = vae_checkpoint("extra-file");
    std::fs::write(ckpt.join("pretrained_model/extra.json"), "{}").unwrap();
    assert_refused(&predict(&ckpt, &inputs, &tmp.join("out.safetensors")), &["pretrained_model/extra.json is not in manifest.json"]);
}

#[test]
fn non_finite_weights_are_refused_naming_the_tensor_and_the_file() {
    let (tmp, ckpt, inputs) = vae_checkpoint("nan-weights");
    // A bare copy of the pretrained_model/ (no manifest to check: a note), with a NaN in it.
    let bare = tmp.join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    for e in std::fs::read_dir(ckpt.join("pretrained_model")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), bare.join(e.file_name())).unwrap();
    }
    poke_data(&bare.join("model.safetensors"), f32::NAN.to_le_bytes());
    let out = tmp.join("out.safetensors");
    let o = predict(&bare, &inputs, &out);
    assert_refused(&o, &["note:", "not verified", "bare/model.safetensors", "tensor `", "1 non-finite value(s)"]);
    assert!(!out.exists());
}

#[test]
fn predict_refuses_non_finite_inputs_naming_the_tensor() {
    let (tmp, ckpt, _) = vae_checkpoint("nan-inputs");
    let n = 4 * 4 * 16 * 16;
    let mut one_nan = vec![0.25; n];
    one_nan[17] = f32::NAN;
    for (name, values, needle) in [("nan", vec![f32::NAN; n], "all 4096 of 4096"), ("inf", vec![f32::INFINITY; n], "all 4096 of 4096"), ("one", one_nan, "has 1 of 4096")] {
        let inputs = tmp.join(format!("{name}.safetensors"));
        write_x(&inputs, values);
        let out = tmp.join(format!("{name}-out.safetensors"));
        let o = predict(&ckpt, &inputs, &out);
        assert_refused(&o, &[&format!("{name}.safetensors"), "tensor `x`", needle, "non-finite"]);
        assert!(!out.exists(), "{name}");
    }
}

#[test]
fn policy_path_and_bench_inference_refuse_a_checkpoint_whose_model_bytes_changed() {
    let act = [
        "--policy.type=act", "--policy.chunk_size=8", "--policy.n_action_steps=8", "--policy.dim_model=32", "--policy.n_heads=4",
        "--policy.dim_feedforward=64", "--policy.n_encoder_layers=2", "--policy.n_vae_encoder_layers=1", "--policy.latent_dim=8",
        "--policy.camera_shape=3,32,32", "--policy.state_dim=4", "--policy.action_dim=4", "--dataset.type=random",
        "--dataset.num_scenes=4", "--batch_size=1", "--steps=1",
    ];
    let tmp = temp_dir("numerics-policy-path");
    let run = |out: &Path, extra: Option<String>| {
        let mut args: Vec<String> = std::iter::once("train").chain(act).map(str::to_string).collect();
        args.extend(extra);
        args.push(format!("--output_dir={}", out.display()));
        vramlab(&args)
    };
    let o = run(&tmp.join("a"), None);
    assert!(o.status.success(), "{}", text(&o));
    let ckpt = tmp.join("a/checkpoints/000001");
    // Intact, it fine-tunes from it.
    let o = run(&tmp.join("b"), Some(format!("--policy.path={}", ckpt.display())));
    assert!(o.status.success(), "{}", text(&o));
    poke_data(&ckpt.join("pretrained_model/model.safetensors"), [1, 2, 3, 4]);
    let o = run(&tmp.join("c"), Some(format!("--policy.path={}", ckpt.display())));
    assert_refused(&o, &["--policy.path", "pretrained_model/model.safetensors", "SHA-256 differs", "refusing to load"]);
    assert!(!tmp.join("c").exists(), "nothing is written for a refused run");
    // bench-inference loads it the same way.
    let bench = tmp.join("bench");
    let o = vramlab(&["bench-inference".to_string(), format!("--checkpoint={}", ckpt.display()), "--calls=3".into(), "--warmup=1".into(), format!("--out={}", bench.display())]);
    assert_refused(&o, &["--checkpoint", "pretrained_model/model.safetensors", "SHA-256 differs"]);
    assert!(!bench.exists());
}
