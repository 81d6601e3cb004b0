//! End-to-end tests of the `vramlab` binary: the CLI contract, parity through `predict`,
//! resume after a real kill, measured checkpointing savings, sweeps.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use vramlab_testkit::{TempDir, temp_dir};

const BIN: &str = env!("CARGO_BIN_EXE_vramlab");
/// A VAE small enough for CI: ultra_lightweight on a 4×16×16 grid, batch 1.
const TINY: [&str; 4] = ["--policy.type=vae3d", "--policy.preset=ultra_lightweight", "--dataset.grid=4,16,16", "--batch_size=1"];

fn vramlab(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run vramlab")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `<a fresh temporary directory>/<name>`, not created yet; the directory is removed when the
/// guard drops, whether the test passes or not.
fn tmp(name: &str) -> (TempDir, PathBuf) {
    let dir = temp_dir(&format!("cli-{name}"));
    let path = dir.join(name);
    (dir, path)
}

/// Flex's parallel convolutions overlap per-thread workspaces differently run to run; the runs
/// that compare peaks use one compute thread (each test says how large the variation is).
const ONE_THREAD: [(&str, &str); 1] = [("RAYON_NUM_THREADS", "1")];

/// `vramlab train <flags>` with `env` set, not yet run.
fn train_command<S: AsRef<str>>(flags: &[S], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("train").args(flags.iter().map(AsRef::as_ref)).envs(env.iter().copied());
    c
}

/// Runs `vramlab train <flags>` with `env` set: its output, and the step records it logged in
/// the `--output_dir` among `flags` (none without one, or when it stopped before a step).
fn train_run<S: AsRef<str>>(flags: &[S], env: &[(&str, &str)]) -> (Output, Vec<Rec>) {
    let o = train_command(flags, env).output().expect("run vramlab train");
    let dir = flags.iter().find_map(|f| f.as_ref().strip_prefix("--output_dir="));
    (o, dir.map(|d| records(Path::new(d))).unwrap_or_default())
}

#[derive(serde::Deserialize)]
struct Rec {
    step: u64,
    loss: f64,
    activation_bytes: u64,
    peak_step_bytes: u64,
    loss_scale: Option<f64>,
    #[serde(default)]
    loader_peak_bytes: Option<u64>,
}

fn records(dir: &Path) -> Vec<Rec> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("metrics line"))
        .collect()
}

#[test]
fn info_prints_the_exact_parameter_counts() {
    for (preset, count) in [
        ("ultra_lightweight", "694,788"),
        ("lightweight", "2,717,716"),
        ("base32", "7,652,628"),
        ("standard", "40,847,092"),
    ] {
        let o = vramlab(&["info", "--policy.type=vae3d", &format!("--policy.preset={preset}")]);
        let t = text(&o);
        assert!(o.status.success(), "{t}");
        assert!(t.contains(&format!("total parameters: {count}")), "{preset}: {t}");
    }
}

#[test]
fn bad_input_gives_named_errors_not_panics() {
    let cases: [(&[&str], &[&str]); 7] = [
        (&["train", "--policy.type=vae3d", "--batchsize=2"], &["batchsize", "batch_size"]),
        (&["train", "--policy.type=vae3d", "--policy.base_chanels=2"], &["base_chanels", "base_channels"]),
        (&["train", "--policy.type=vae3d", "--precision=f8"], &["f8", "bf16"]),
        (&["train", "--policy.type=vae3d", "--gradient_checkpointing=maybe"], &["maybe", "blocks"]),
        (&["train", "--policy.type=nope"], &["nope", "vae3d"]),
        (&["train"], &["policy.type"]),
        (&["train", "--config=/nonexistent.toml"], &["/nonexistent.toml"]),
    ];
    for (args, needles) in cases {
        let o = vramlab(args);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {t}");
        assert!(!t.contains("panicked"), "{args:?} panicked: {t}");
        for n in needles {
            assert!(t.contains(n), "{args:?}: `{n}` not in: {t}");
        }
    }
    if !cfg!(feature = "cuda") {
        let t = text(&vramlab(&["train", "--policy.type=vae3d", "--backend=cuda"]));
        assert!(t.contains("not compiled") && t.contains("--features cuda"), "{t}");
    }
}

#[test]
fn malformed_npz_file_is_named() {
    let (_tmp, dir) = tmp("badnpz");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("scene_000.npz");
    std::fs::write(&bad, b"PK\x03\x04 this is not a real archive").unwrap();
    let mut args = vec!["--dataset.type=npz", "--steps=1"];
    args.extend(TINY);
    let root = format!("--dataset.root={}", dir.display());
    args.push(&root);
    let out = format!("--output_dir={}", dir.join("run").display());
    args.push(&out);
    let (o, _) = train_run(&args, &[]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("scene_000.npz") && !t.contains("panicked"), "{t}");
}

/// `vramlab predict` on a reference fixture reproduces every output it stores (≤ 1e-4 of the
/// tensor's largest magnitude).
fn check_predict(fixture: &str, names: &[&str]) {
    let Some(oracle) = vramlab_testkit::shared("oracle") else { return };
    let fx = oracle.join(fixture);
    let (_tmp, dir) = tmp(&format!("predict-{fixture}"));
    let out = dir.with_extension("safetensors");
    let o = vramlab(&[
        "predict",
        &format!("--checkpoint={}", fx.join("pretrained_model").display()),
        &format!("--inputs={}", fx.join("inputs.safetensors").display()),
        &format!("--out={}", out.display()),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let ours = vramlab_store::read_safetensors(&out).unwrap();
    let theirs = vramlab_store::read_safetensors(&fx.join("outputs.safetensors")).unwrap();
    for name in names {
        let a = ours[*name].to_vec::<f32>().unwrap();
        let b = theirs[*name].to_vec::<f32>().unwrap();
        assert_eq!(ours[*name].shape, theirs[*name].shape, "{name}");
        vramlab_testkit::assert_close(&format!("{fixture}/{name}"), &a, &b, 1e-4);
    }
}

#[test]
fn predict_reproduces_the_reference_vae() {
    check_predict("vae3d_ultra", &["mean", "logvar", "recon", "loss", "recon_loss", "kl_loss"]);
}

#[test]
fn predict_reproduces_lerobot_act() {
    check_predict("act_small", &["eval_actions", "train_actions_z_mu", "vae_mu", "vae_log_sigma_x2", "loss", "l1_loss", "kld_loss"]);
}

#[test]
fn info_prints_the_exact_act_counts() {
    for (extra, count) in [(None, "51,613,582"), (Some("--policy.use_vae=false"), "34,232,142")] {
        let mut args = vec!["info", "--policy.type=act"];
        args.extend(extra);
        let o = vramlab(&args);
        let t = text(&o);
        assert!(o.status.success(), "{t}");
        assert!(t.contains(&format!("total parameters: {count}")), "{t}");
    }
    let t = text(&vramlab(&["info", "--policy.type=act"]));
    for (module, count) in [("backbone", "11,166,912"), ("vae_encoder", "17,332,736"), ("encoder", "17,332,736"), ("decoder", "5,385,856")] {
        assert!(t.lines().any(|l| l.starts_with(module) && l.contains(count)), "{module} {count}: {t}");
    }
}

#[test]
fn warmup_runs_one_step_and_leaves_nothing_behind() {
    let o = vramlab(&["warmup", "--steps=50", "--save_freq=1"].iter().copied().chain(TINY).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("1 steps") && text(&o).contains("warmup: one step"), "{}", text(&o));
    let scratch = text(&o).lines().find_map(|l| l.split("→ ").nth(1).map(|p| p.trim().to_string())).expect("the run's directory");
    assert!(!Path::new(&scratch).exists(), "{scratch} was left behind");
}

#[test]
fn killed_run_resumes_with_bit_identical_losses() {
    let (_full_tmp, full) = tmp("full");
    let (_part_tmp, part) = tmp("part");
    let flags = |dir: &Path| {
        let mut f: Vec<String> = ["--steps=6", "--save_freq=1", "--seed=5"].into_iter().chain(TINY).map(String::from).collect();
        f.push(format!("--output_dir={}", dir.display()));
        f
    };
    let (o, full_records) = train_run(&flags(&full), &[]);
    assert!(o.status.success(), "{}", text(&o));
    // Kill -9 the second run once it has logged three steps.
    let mut child = train_command(&flags(&part), &[]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let t0 = Instant::now();
    while records(&part).len() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(300), "run did not progress");
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let killed_at = records(&part).len();
    // The newest complete checkpoint loses half its weights file (a disk that filled up, a
    // copy cut short): --resume says so and continues from the one before.
    let mut steps: Vec<PathBuf> = std::fs::read_dir(part.join("checkpoints")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.file_name().unwrap().to_string_lossy().parse::<u64>().is_ok()).collect();
    steps.sort();
    let newest = steps.last().expect("a checkpoint").clone();
    assert!(steps.len() >= 2, "killed after {killed_at} steps with checkpoints {steps:?}");
    let weights = newest.join("pretrained_model/model.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&weights).unwrap().set_len(len / 2).unwrap();
    // Only --resume and the run directory: everything else comes from the checkpoint.
    let (o, part_records) = train_run(&["--resume", &format!("--output_dir={}", part.display())], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(&format!("skipping {}", newest.display())) && text(&o).contains("truncated"), "{}", text(&o));
    let a: Vec<(u64, f64)> = full_records.iter().map(|r| (r.step, r.loss)).collect();
    let b: Vec<(u64, f64)> = part_records.iter().map(|r| (r.step, r.loss)).collect();
    assert_eq!(a.len(), 6);
    assert_eq!(a, b, "killed after {killed_at} logged steps; trajectories differ");
    // Without --resume the same directory is refused.
    let (o, _) = train_run(&flags(&part), &[]);
    assert!(text(&o).contains("--resume"), "{}", text(&o));
}

#[test]
fn checkpointing_lowers_measured_activations_and_low_precision_trains() {
    let mut act = Vec::new();
    let mut first_loss = Vec::new();
    for (mode, precision) in [("off", "f32"), ("blocks", "f32"), ("balanced", "f32"), ("off", "bf16"), ("blocks", "bf16"), ("off", "f16")] {
        let (_tmp, dir) = tmp(&format!("mem-{mode}-{precision}"));
        let mut args = vec!["--steps=3".to_string()];
        args.extend(TINY.iter().map(|s| s.to_string()));
        args.push(format!("--gradient_checkpointing={mode}"));
        args.push(format!("--precision={precision}"));
        args.push(format!("--output_dir={}", dir.display()));
        // One compute thread: flex's parallel convolutions hold per-thread workspaces whose
        // overlap depends on scheduling (±1.7 MiB, an im2col buffer, at this size), as large as
        // what checkpointing saves on this tiny model. With one thread the figures repeat.
        let (o, r) = train_run(&args, &ONE_THREAD);
        assert!(o.status.success(), "{mode}/{precision}: {}", text(&o));
        assert_eq!(r.len(), 3);
        assert!(r.iter().all(|r| r.loss.is_finite() && r.peak_step_bytes > 0));
        assert_eq!(r[0].loss_scale.is_some(), precision == "f16", "loss scaling only for f16");
        // Steady state: step 1 also pays one-time allocations (thread pools, first-use buffers).
        act.push(((mode, precision), r[1..].iter().map(|r| r.activation_bytes).max().unwrap()));
        first_loss.push(r[0].loss);
    }
    let get = |m: &str, p: &str| act.iter().find(|((a, b), _)| *a == m && *b == p).unwrap().1;
    assert!(get("blocks", "f32") < get("off", "f32"), "{act:?}");
    // Same seed, same weights, same batch: low precision changes the first loss only a little.
    for l in &first_loss[3..] {
        assert!((l - first_loss[0]).abs() < 0.05 * first_loss[0].abs(), "{first_loss:?}");
    }
}

#[test]
fn sweep_writes_csv_and_markdown() {
    let (_tmp, dir) = tmp("sweep");
    let mut args = vec!["sweep", "--steps=1", "--sweep.gradient_checkpointing=off,blocks"];
    args.extend(TINY);
    let out = format!("--output_dir={}", dir.display());
    args.push(&out);
    let o = vramlab(&args);
    assert!(o.status.success(), "{}", text(&o));
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    assert!(csv.lines().skip(1).all(|l| l.contains(",ok,")), "{csv}");
    let md = std::fs::read_to_string(dir.join("sweep.md")).unwrap();
    assert!(md.contains("Effect of `gradient_checkpointing`"), "{md}");
    // The pictures: the sweep's, linked from sweep.md, and each point's run.
    assert!(md.contains("](sweep_peak.svg)") && md.contains("](sweep_breakdown.svg)"), "{md}");
    for f in ["sweep_peak.svg", "sweep_breakdown.svg", "points/gradient_checkpointing=off/memory.svg", "points/gradient_checkpointing=blocks/memory_breakdown.svg"] {
        assert!(std::fs::read_to_string(dir.join(f)).is_ok_and(|s| s.contains("</svg>")), "{f}");
    }
}

/// The probe's figures against a known allocation pattern (the wgpu run is in `.ci/run`).
#[test]
fn probe_check_passes_on_the_counting_allocator() {
    let o = vramlab(&["probe-check"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("true high-water mark 70.00 MiB") && text(&o).contains("allocated peak 70.00 MiB (exact)"), "{}", text(&o));
}

/// The model's figures mean the same with and without loader workers: what the workers hold
/// while decoding and batching is the loader's, reported as `loader_peak_bytes`.
#[test]
fn step_peaks_do_not_depend_on_the_number_of_loader_workers() {
    let (_tmp, root) = tmp("workers");
    let tiny = [
        "--policy.type=diffusion", "--dataset.type=sim", "--dataset.num_episodes=4", "--dataset.image_size=48,48",
        "--policy.crop_shape=40,40", "--policy.down_dims=16,32", "--policy.diffusion_step_embed_dim=32", "--batch_size=4",
        "--steps=4", "--save_checkpoint=false",
    ];
    let mut peaks = Vec::new();
    for workers in [0, 3] {
        let dir = root.join(format!("w{workers}"));
        let mut args: Vec<String> = tiny.iter().map(|s| s.to_string()).collect();
        args.push(format!("--dataset.root={}", root.join("push").display()));
        args.push(format!("--num_workers={workers}"));
        args.push(format!("--output_dir={}", dir.display()));
        // One compute thread: flex's parallel convolutions overlap per-thread workspaces
        // differently run to run (±1.2 MiB here), more than this tiny model's 1 % slack; the
        // loader's worker threads are what varies.
        let (o, r) = train_run(&args, &ONE_THREAD);
        assert!(o.status.success(), "{workers} workers: {}", text(&o));
        assert_eq!(r.len(), 4);
        assert!(r.iter().all(|r| r.loader_peak_bytes.unwrap_or(0) > 0), "{workers} workers: the loader's memory is reported");
        peaks.push(r.iter().skip(1).map(|r| (r.peak_step_bytes, r.activation_bytes)).collect::<Vec<_>>());
    }
    for (a, b) in peaks[0].iter().zip(&peaks[1]) {
        // Flex's worker threads may overlap their scratch buffers differently: 1 % slack.
        assert!(a.0.abs_diff(b.0) * 100 <= a.0, "peak_step_bytes {} (0 workers) vs {} (3 workers)", a.0, b.0);
        assert!(a.1.abs_diff(b.1) * 100 <= a.1, "activation_bytes {} (0 workers) vs {} (3 workers)", a.1, b.1);
    }
}

/// A tiny ACT: trains, the loss falls, and block recomputation follows the same trajectory.
#[test]
fn act_trains_and_block_checkpointing_matches() {
    let tiny = [
        "--policy.type=act", "--policy.chunk_size=8", "--policy.n_action_steps=8", "--policy.dim_model=32",
        "--policy.n_heads=4", "--policy.dim_feedforward=64", "--policy.n_encoder_layers=2", "--policy.n_vae_encoder_layers=1",
        "--policy.latent_dim=8", "--policy.camera_shape=3,32,32", "--policy.state_dim=4", "--policy.action_dim=4",
        "--dataset.type=random", "--dataset.num_scenes=4", "--batch_size=2", "--steps=10", "--optimizer.lr=1e-3",
    ];
    let mut losses = Vec::new();
    for mode in ["off", "blocks"] {
        let (_tmp, dir) = tmp(&format!("act-{mode}"));
        let mut args: Vec<String> = tiny.iter().map(|s| s.to_string()).collect();
        args.push(format!("--gradient_checkpointing={mode}"));
        args.push(format!("--output_dir={}", dir.display()));
        let (o, r) = train_run(&args, &[]);
        assert!(o.status.success(), "{mode}: {}", text(&o));
        // The checkpoint is a lerobot-style pretrained_model dir: `predict` runs it.
        let ckpt = dir.join("checkpoints/000010");
        {
            let inputs = dir.join("inputs.safetensors");
            let d = |v: Vec<f32>, s: Vec<usize>| burn::tensor::TensorData::new(v, s);
            vramlab_store::write_safetensors(
                &[
                    ("observation.state".into(), d(vec![0.1; 2 * 4], vec![2, 4])),
                    ("observation.images.top".into(), d(vec![0.2; 2 * 3 * 32 * 32], vec![2, 3, 32, 32])),
                ],
                &inputs,
            )
            .unwrap();
            let out = dir.join("out.safetensors");
            let o = vramlab(&["predict", &format!("--checkpoint={}", ckpt.display()), &format!("--inputs={}", inputs.display()), &format!("--out={}", out.display())]);
            assert!(o.status.success(), "{}", text(&o));
            assert_eq!(vramlab_store::read_safetensors(&out).unwrap()["eval_actions"].shape, burn::tensor::Shape::new([2, 8, 4]));
        }
        losses.push(r.iter().map(|r| r.loss).collect::<Vec<_>>());
    }
    let (off, blocks) = (&losses[0], &losses[1]);
    assert!(off.last().unwrap() < off.first().unwrap(), "{off:?}");
    // Block recomputation gives the plain run's gradients to f32 rounding (≤ 1e-5 relative,
    // `diffusion::train`'s `checkpointing_modes_give_equal_gradients`); 16 Adam steps at lr 1e-3 amplify that to a few 1e-4 by
    // the middle of the run (2e-4 seen), so the first steps are compared tightly and the rest
    // within 1e-3: a recomputation that differed would leave the trajectory by far more.
    for (i, (a, b)) in off.iter().zip(blocks).enumerate() {
        let tol = if i < 2 { 1e-5 } else { 1e-3 };
        assert!((a - b).abs() <= tol * a.abs(), "step {}: off {off:?} vs blocks {blocks:?}", i + 1);
    }
}

/// ACT trains on a real LeRobot v3.0 dataset (PushT, AV1 video) and the loss falls.
#[test]
fn act_trains_on_a_lerobot_dataset() {
    let Some(shared) = vramlab_testkit::shared_dir() else { return };
    let (_tmp, dir) = tmp("act-pusht");
    let (o, r) = train_run(&[
        "--policy.type=act",
        "--dataset.type=lerobot",
        &format!("--dataset.root={}", shared.join("datasets/pusht_v30").display()),
        "--policy.chunk_size=10",
        "--policy.n_action_steps=10",
        "--policy.dim_model=32",
        "--policy.n_heads=4",
        "--policy.dim_feedforward=64",
        "--policy.n_encoder_layers=1",
        "--policy.n_vae_encoder_layers=1",
        "--policy.latent_dim=8",
        "--batch_size=4",
        "--steps=12",
        "--optimizer.lr=1e-3",
        &format!("--output_dir={}", dir.display()),
    ], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(r.len(), 12);
    let first: f64 = r[..3].iter().map(|x| x.loss).sum::<f64>() / 3.0;
    let last: f64 = r[9..].iter().map(|x| x.loss).sum::<f64>() / 3.0;
    assert!(last < first, "loss did not fall: {first} -> {last}");
    // lerobot's checkpoint layout, with the processors' normalisation stats and a `last` link.
    let last = dir.join("checkpoints/last");
    for f in [
        "pretrained_model/config.json",
        "pretrained_model/model.safetensors",
        "pretrained_model/train_config.json",
        "pretrained_model/policy_preprocessor.json",
        "pretrained_model/policy_preprocessor_step_3_normalizer_processor.safetensors",
        "pretrained_model/policy_postprocessor.json",
        "pretrained_model/policy_postprocessor_step_0_unnormalizer_processor.safetensors",
        "training_state/optimizer_state.safetensors",
        "training_state/optimizer_param_groups.json",
        "training_state/training_step.json",
        "manifest.json",
    ] {
        assert!(last.join(f).exists(), "checkpoint lacks {f}");
    }
    let stats = vramlab_store::read_safetensors(&last.join("pretrained_model/policy_preprocessor_step_3_normalizer_processor.safetensors")).unwrap();
    assert_eq!(stats["observation.image.mean"].shape, burn::tensor::Shape::new([3, 1, 1]));
    assert_eq!(stats["action.std"].shape, burn::tensor::Shape::new([2]));
    // lerobot's --policy.path: fine-tune from that pretrained_model/ (config and weights).
    let (_tuned_tmp, tuned) = tmp("act-pusht-tuned");
    let (o, tuned_records) = train_run(&[
        &format!("--policy.path={}", last.join("pretrained_model").display()),
        "--dataset.type=lerobot",
        &format!("--dataset.root={}", shared.join("datasets/pusht_v30").display()),
        "--batch_size=4",
        "--steps=1",
        "--optimizer.lr=1e-3",
        &format!("--output_dir={}", tuned.display()),
    ], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let tuned_loss = tuned_records[0].loss;
    assert!(tuned_loss < first, "fine-tuning starts from the trained weights: {tuned_loss} vs a fresh {first}");
    let t = text(&vramlab(&["dataset", "info", &shared.join("datasets/g1_v21_subset").display().to_string()]));
    assert!(t.contains("frames    1461") && t.contains("codec av1"), "{t}");
}

#[test]
fn predict_reproduces_lerobot_diffusion() {
    // DDIM sampling accumulates 10 steps: the tolerance for it is 1e-3; the check
    // below uses 1e-4 for every output, which the port meets (≈3.5e-6 measured).
    check_predict("diffusion_small", &["global_cond", "unet_eps", "ddim_actions"]);
}

#[test]
fn info_prints_the_exact_diffusion_count() {
    let t = text(&vramlab(&["info", "--policy.type=diffusion"]));
    assert!(t.contains("total parameters: 262,709,026"), "{t}");
    assert!(t.lines().any(|l| l.starts_with("rgb_encoder") && l.contains("11,197,088")), "{t}");
    assert!(t.lines().any(|l| l.starts_with("unet") && l.contains("251,511,938")), "{t}");
}

/// Diffusion Policy on the built-in demonstrations (generated on first use): it trains, the loss
/// falls, block recomputation (per ResNet stage and UNet residual block) follows the same
/// trajectory, and the checkpoint runs through `predict`.
#[test]
fn diffusion_trains_on_built_in_demonstrations() {
    let (_tmp, root) = tmp("diffusion-sim");
    let data = root.join("push");
    let tiny = [
        "--policy.type=diffusion", "--dataset.type=sim", "--dataset.num_episodes=6", "--dataset.image_size=48,48",
        "--policy.crop_shape=40,40", "--policy.down_dims=16,32", "--policy.diffusion_step_embed_dim=32", "--batch_size=8",
        "--steps=16", "--optimizer.lr=1e-3", "--scheduler.warmup_steps=0", "--num_workers=1",
    ];
    let mut losses = Vec::new();
    for mode in ["off", "blocks"] {
        let dir = root.join(mode);
        let mut args: Vec<String> = tiny.iter().map(|s| s.to_string()).collect();
        args.push(format!("--dataset.root={}", data.display()));
        args.push(format!("--gradient_checkpointing={mode}"));
        args.push(format!("--output_dir={}", dir.display()));
        let (o, r) = train_run(&args, &[]);
        assert!(o.status.success(), "{mode}: {}", text(&o));
        assert_eq!(r.len(), 16);
        losses.push(r.iter().map(|r| r.loss).collect::<Vec<_>>());
        if mode == "off" {
            assert!(text(&o).contains("generating"), "first run generates the demonstrations: {}", text(&o));
            let ckpt = dir.join("checkpoints/000016");
            let inputs = root.join("inputs.safetensors");
            let d = |v: Vec<f32>, s: Vec<usize>| burn::tensor::TensorData::new(v, s);
            vramlab_store::write_safetensors(
                &[
                    ("observation.state".into(), d(vec![0.1; 2 * 2 * 2], vec![2, 2, 2])),
                    ("observation.image".into(), d(vec![0.2; 2 * 2 * 3 * 48 * 48], vec![2, 2, 3, 48, 48])),
                ],
                &inputs,
            )
            .unwrap();
            let out = root.join("out.safetensors");
            let o = vramlab(&["predict", &format!("--checkpoint={}", ckpt.display()), &format!("--inputs={}", inputs.display()), &format!("--out={}", out.display())]);
            assert!(o.status.success(), "{}", text(&o));
            // 2 steps × (2 state + 32 × 2 keypoint coordinates).
            assert_eq!(vramlab_store::read_safetensors(&out).unwrap()["global_cond"].shape, burn::tensor::Shape::new([2, 2 * (2 + 64)]));
        }
    }
    let (off, blocks) = (&losses[0], &losses[1]);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    // The diffusion loss is noisy (random timesteps per sample): compare window means.
    assert!(mean(&off[8..]) < 0.95 * mean(&off[..4]), "loss did not fall: {off:?}");
    // Block recomputation gives the plain run's gradients to f32 rounding (≤ 1e-5 relative,
    // `diffusion::train`'s `checkpointing_modes_give_equal_gradients`); 16 Adam steps at lr 1e-3 amplify that to a few 1e-4 by
    // the middle of the run (2e-4 seen), so the first steps are compared tightly and the rest
    // within 1e-3: a recomputation that differed would leave the trajectory by far more.
    for (i, (a, b)) in off.iter().zip(blocks).enumerate() {
        let tol = if i < 2 { 1e-5 } else { 1e-3 };
        assert!((a - b).abs() <= tol * a.abs(), "step {}: off {off:?} vs blocks {blocks:?}", i + 1);
    }
}

#[test]
fn config_errors_come_before_any_data_or_model() {
    // A typo in a policy field, and a range error: nothing is generated, no run directory.
    let (_tmp, dir) = tmp("early");
    let sim = dir.join("sim");
    let out = dir.join("run");
    for bad in ["--policy.chunk_sise=50", "--steps=0"] {
        let (o, _) = train_run(&[
            "--policy.type=act",
            bad,
            &format!("--dataset.root={}", sim.display()),
            &format!("--output_dir={}", out.display()),
        ], &[]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{t}");
        assert!(!t.contains("generating") && !sim.exists() && !out.exists(), "{bad}: {t}");
    }
    let t = text(&vramlab(&["train", "--policy.type=act", "--policy.chunk_sise=50"]));
    assert!(t.contains("chunk_sise") && t.contains("chunk_size"), "{t}");
    // Shorthand features with a dataset, and a dataset type of the other family.
    let t = text(&vramlab(&["train", "--policy.type=act", "--policy.state_dim=3", "--dataset.type=sim"]));
    assert!(t.contains("policy.state_dim") && t.contains("dataset"), "{t}");
    let t = text(&vramlab(&["train", "--policy.type=vae3d", "--dataset.type=sim"]));
    assert!(t.contains("dataset.type") && t.contains("voxels"), "{t}");
    let t = text(&vramlab(&["train", "--policy.type=act", "--dataset.type=lerobot", "--dataset.root=/nonexistent/ds"]));
    assert!(t.contains("/nonexistent/ds"), "{t}");
}

#[test]
fn predict_checks_inputs_against_the_checkpoint() {
    let Some(oracle) = vramlab_testkit::shared("oracle") else { return };
    let fx = oracle.join("vae3d_ultra/pretrained_model");
    let (_tmp, dir) = tmp("predict-bad");
    std::fs::create_dir_all(&dir).unwrap();
    // A 3-channel grid for a 4-channel VAE.
    let inputs = dir.join("inputs.safetensors");
    let x: Vec<u8> = (0..3 * 4 * 16 * 16).flat_map(|_| 0.5f32.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1, 3, 4, 16, 16], &x).unwrap();
    std::fs::write(&inputs, safetensors::serialize(vec![("x", view)], None).unwrap()).unwrap();
    let o = vramlab(&[
        "predict",
        &format!("--checkpoint={}", fx.display()),
        &format!("--inputs={}", inputs.display()),
        &format!("--out={}", dir.join("out.safetensors").display()),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(!t.contains("panicked") && t.contains("inputs.safetensors") && t.contains("`x`") && t.contains("[B, 4, D, H, W]"), "{t}");
}

#[test]
fn help_per_subcommand_and_completions() {
    for cmd in ["train", "info", "sweep", "predict", "dataset"] {
        let o = vramlab(&[cmd, "--help"]);
        assert!(o.status.success() && text(&o).contains("Usage: vramlab"), "{cmd}: {}", text(&o));
    }
    let o = vramlab(&["completions", "bash"]);
    assert!(o.status.success() && text(&o).contains("gradient_checkpointing"));
}

#[derive(serde::Deserialize)]
struct FitTrial {
    search: String,
    status: String,
    peak_bytes: Option<u64>,
    toggles: FitToggles,
}

#[derive(serde::Deserialize)]
struct FitToggles {
    batch_size: u64,
}

/// The budget cap (the CPU stand-in for a GPU's capacity): a run whose peak is above it ends
/// at the allocation that would cross it, with its own exit code and one clear line, and no
/// checkpoint; the same run under a budget above its peak trains.
#[test]
fn a_memory_budget_ends_a_run_with_a_clean_out_of_memory() {
    let (_free_tmp, free) = tmp("budget-free");
    let mut args: Vec<String> = TINY.iter().map(|s| s.to_string()).collect();
    // Measurement only: writing a checkpoint after the last step takes memory of its own.
    args.extend(["--steps=2".into(), "--save_checkpoint=false".into()]);
    let run = |dir: &Path, budget: Option<u64>| {
        let mut flags = args.clone();
        flags.push(format!("--output_dir={}", dir.display()));
        let budget = budget.map(|b| b.to_string());
        let env: Vec<(&str, &str)> = budget.iter().map(|b| ("VRAMLAB_MEMORY_BUDGET", b.as_str())).collect();
        train_run(&flags, &env)
    };
    let (o, free_records) = run(&free, None);
    assert!(o.status.success(), "{}", text(&o));
    let peak = free_records.iter().map(|r| r.peak_step_bytes).max().unwrap();

    let (_capped_tmp, capped) = tmp("budget-capped");
    let (o, _) = run(&capped, Some(peak / 2));
    assert_eq!(o.status.code(), Some(86), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("error: out of memory: an allocation of") && err.contains(&format!("budget of {} bytes", peak / 2)), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!capped.join("checkpoints/000002").exists(), "no checkpoint of an out-of-memory run");

    let (_roomy_tmp, roomy) = tmp("budget-roomy");
    let (o, _) = run(&roomy, Some(peak + peak / 2));
    assert!(o.status.success(), "a budget above the peak must not end the run: {}", text(&o));

    let (o, _) = train_run(&args, &[("VRAMLAB_MEMORY_BUDGET", "lots")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("VRAMLAB_MEMORY_BUDGET"), "{}", text(&o));
}

/// `fit` under a budget below the configured batch's peak: the configured batch runs out of
/// memory, a smaller one fits, the recommendation's re-measured peak is within the budget, and
/// a second `fit` in the same directory reuses every trial.
#[test]
fn fit_recommends_only_what_was_measured_to_fit() {
    let (_probe_tmp, probe) = tmp("fit-probe");
    let mut train: Vec<String> = vec!["--policy.type=vae3d".into(), "--policy.preset=ultra_lightweight".into(), "--dataset.grid=8,32,32".into()];
    train.extend(["--batch_size=4".into(), "--steps=2".into(), format!("--output_dir={}", probe.display())]);
    // One compute thread here and in `fit`'s trials (they inherit it): with two, flex's
    // parallel convolutions make this tiny model's peak vary by up to 8 %, close to the
    // budget's 10 % margin. Grid 8×32×32 (the main job's): on 4×16×16 the estimate of batch 4
    // is 14 % above its measured peak (the runtime-baseline constant is measured on larger
    // runs), past `fit`'s pruning margin (1.25 × a budget of 0.9 × the peak), so batch 4 would
    // be pruned on the estimate instead of measured out of memory.
    let (o, r) = train_run(&train, &ONE_THREAD);
    assert!(o.status.success(), "{}", text(&o));
    let peak4 = r.iter().map(|r| r.peak_step_bytes).max().unwrap();
    let budget = peak4 * 9 / 10;

    let (_fit_tmp, dir) = tmp("fit");
    let args: Vec<String> = vec![
        "fit".into(),
        "--policy.type=vae3d".into(),
        "--policy.preset=ultra_lightweight".into(),
        "--dataset.grid=8,32,32".into(),
        "--batch_size=4".into(),
        "--max_batch=8".into(),
        format!("--budget={budget}"),
        format!("--output_dir={}", dir.display()),
    ];
    let o = Command::new(BIN).args(&args).env("RAYON_NUM_THREADS", "1").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.starts_with("vramlab train") && stdout.contains("--grad_accum_steps="), "{stdout}");
    let trials: Vec<FitTrial> = std::fs::read_to_string(dir.join("fit.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let batch: Vec<&FitTrial> = trials.iter().filter(|t| t.search == "batch").collect();
    assert!(batch.iter().any(|t| t.toggles.batch_size == 4 && t.status == "out_of_memory"), "batch 4 needs more than 0.9 × its peak");
    assert!(batch.iter().any(|t| t.status == "fits" && t.toggles.batch_size < 4), "a smaller batch fits");
    let verify: Vec<&FitTrial> = trials.iter().filter(|t| t.search == "verify").collect();
    assert_eq!(verify.len(), 1);
    assert_eq!(verify[0].status, "fits");
    assert!(verify[0].peak_bytes.unwrap() <= budget);
    for t in trials.iter().filter(|t| t.status == "fits") {
        assert!(t.peak_bytes.unwrap() <= budget, "a fitting trial's measured peak is within the budget");
    }
    let md = std::fs::read_to_string(dir.join("fit.md")).unwrap();
    assert!(md.contains("re-measured") && md.contains("out of memory"), "{md}");
    assert!(dir.join("fit.csv").exists());

    // Restartable: everything is kept, nothing runs again.
    let o = Command::new(BIN).args(&args).env("RAYON_NUM_THREADS", "1").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("0 new trials"), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), stdout);
    // Trials measured under one budget are never reused under another.
    let mut other = args.clone();
    other[6] = format!("--budget={}", budget * 2);
    let o = Command::new(BIN).args(&other).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("fit_request.json") && text(&o).contains("another request"), "{}", text(&o));
}

/// `estimate` on a model described on paper: the seed report's static total is reproduced and
/// the per-GPU sharded totals are printed; flags that only training configs take are refused.
#[test]
fn estimate_reads_paper_descriptions() {
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/estimate/openvla_oft_7b_lora.toml");
    let o = vramlab(&["estimate", &format!("--config={}", cfg.display())]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for needle in ["23.57", "ZeRO-3", "DDP"] {
        assert!(out.contains(needle), "{needle} missing:\n{out}");
    }
    let o = vramlab(&["estimate", &format!("--config={}", cfg.display()), "--batch_size=4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("on paper"), "{}", text(&o));
}
