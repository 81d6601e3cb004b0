//! Trainer behaviour on a tiny staged MLP: block checkpointing gives the same gradients,
//! a resumed run reproduces an uninterrupted one bit for bit, and the probe sees activations.

use std::path::PathBuf;

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use rand::Rng;
use vramlab_probe::{CountingAllocator, CpuProbe};
use vramlab_train::recompute::{compare_gradients, named_gradients};
use vramlab_train::*;
use vramlab_testkit::{TempDir, temp_dir};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

type B = Autodiff<Flex>;

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    layers: Vec<Linear<B>>,
}

#[derive(Clone)]
struct Batch<B: Backend> {
    x: Tensor<B, 2>,
    y: Tensor<B, 2>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        let layers = (0..4).map(|i| LinearConfig::new(16, if i == 3 { 4 } else { 16 }).init(device)).collect();
        Self { layers }
    }
    fn layer(&self, i: usize, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let h = self.layers[i].forward(x);
        if i + 1 < self.layers.len() { burn::tensor::activation::gelu(h) } else { h }
    }
}

fn mse<B: Backend>(p: Tensor<B, 2>, y: Tensor<B, 2>) -> Tensor<B, 1> {
    (p - y).square().mean()
}

/// The forward: one stage per layer, the state is the activation.
impl<Bk: Backend> Staged<Bk> for Mlp<Bk> {
    type Input = Tensor<Bk, 2>;
    type State = Tensor<Bk, 2>;
    type Output = Tensor<Bk, 2>;
    type Stage = usize;
    fn plan(&self, _x: &Tensor<Bk, 2>) -> Vec<usize> {
        (0..self.layers.len()).collect()
    }
    fn enter(&self, x: &Tensor<Bk, 2>) -> Tensor<Bk, 2> {
        x.clone()
    }
    fn stage(&self, i: usize, h: Tensor<Bk, 2>, _x: &Tensor<Bk, 2>) -> Tensor<Bk, 2> {
        self.layer(i, h)
    }
    fn exit(&self, h: Tensor<Bk, 2>, _x: &Tensor<Bk, 2>) -> Tensor<Bk, 2> {
        h
    }
}

impl TrainModel<B> for Mlp<B> {
    type Batch = Batch<B>;
    type Model = Self;
    fn model(&self) -> &Self {
        self
    }
    fn input(&self, b: &Batch<B>) -> Tensor<B, 2> {
        b.x.clone()
    }
    fn loss(&self, prediction: Tensor<B, 2>, b: &Batch<B>) -> LossParts<B> {
        let l = mse(prediction, b.y.clone());
        LossParts::new(l.clone()).with("mse", l)
    }
}

fn batch(seed: u64, step: u64, micro: u64) -> Batch<B> {
    let dev = Default::default();
    let mut rng = step_rng(seed, step, micro);
    let x: Vec<f32> = (0..8 * 16).map(|_| rng.random_range(-1.0..1.0)).collect();
    let y: Vec<f32> = (0..8 * 4).map(|_| rng.random_range(-1.0..1.0)).collect();
    Batch { x: Tensor::from_data(TensorData::new(x, [8, 16]), &dev), y: Tensor::from_data(TensorData::new(y, [8, 4]), &dev) }
}

#[test]
fn block_checkpointing_gives_the_same_gradients() {
    let model = Mlp::<B>::new(&Default::default());
    let b = batch(1, 1, 0);
    let plain = named_gradients(&model, &b, CheckpointMode::Off);
    assert_eq!(plain.1.len(), 8, "4 layers × (weight, bias)");
    compare_gradients(&plain, &named_gradients(&model, &b, CheckpointMode::Blocks), 1e-5).unwrap();
}

fn config(dir: PathBuf, steps: u64, resume: bool, mode: CheckpointMode) -> TrainConfig {
    TrainConfig {
        save_checkpoint: true,
        steps,
        batch_size: 8,
        grad_accum_steps: 2,
        optim: OptimConfig { lr: 1e-2, grad_clip_norm: Some(1.0), ..Default::default() },
        schedule: LrSchedule { kind: ScheduleKind::Cosine, warmup_steps: 2, total_steps: steps },
        gradient_checkpointing: mode,
        loss_scale: None,
        seed: 7,
        save_freq: 3,
        output_dir: dir,
        resume,
        memory_timeline: Vec::new(),
        memory_timeline_min_bytes: 0,
    }
}

/// A run directory (not created yet) inside a fresh temporary directory that is removed when
/// the returned guard drops.
fn tmpdir(name: &str) -> (TempDir, PathBuf) {
    let tmp = temp_dir(&format!("train-test-{name}"));
    let run = tmp.join("run");
    (tmp, run)
}

fn train(cfg: TrainConfig, model: Mlp<B>) -> Result<TrainOutcome<Mlp<B>>, TrainError> {
    let probe = CpuProbe::new().unwrap();
    let t = Trainer::new(cfg.clone(), &probe);
    t.run::<B, _>(model, &Default::default(), &mut |s, m| Ok(batch(cfg.seed, s, m)), &mut |_| {})
}

#[test]
fn resume_reproduces_the_uninterrupted_run_bit_for_bit() {
    let init = Mlp::<B>::new(&Default::default());
    // Parameters initialise lazily, and clones of an uninitialised parameter initialise apart:
    // touch every value once so all runs start from the same weights.
    vramlab_train::optim::param_bytes::<B, _>(&init);
    let (_full_tmp, full_dir) = tmpdir("full");
    let full = train(config(full_dir.clone(), 8, false, CheckpointMode::Off), init.clone()).unwrap();
    // "Killed" while writing step 4's checkpoint: its weights are truncated, so --resume falls
    // back to step 3's; step 4 is logged but recomputed.
    let (_part_tmp, part_dir) = tmpdir("part");
    let mut cfg = config(part_dir.clone(), 4, false, CheckpointMode::Off);
    cfg.schedule.total_steps = 8; // the same schedule as the 8-step run
    train(cfg, init.clone()).unwrap();
    let weights = part_dir.join("checkpoints/000004/pretrained_model/model.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&weights).unwrap().set_len(len / 2).unwrap();
    assert_eq!(vramlab_train::trainer::resume_step(&part_dir.join("checkpoints")).unwrap(), 3);
    let resumed = train(config(part_dir.clone(), 8, true, CheckpointMode::Off), init).unwrap();
    let log = std::fs::read_to_string(part_dir.join("metrics.jsonl")).unwrap();
    let losses: Vec<f64> = log.lines().map(|l| serde_json::from_str::<StepRecord>(l).unwrap().loss).collect();
    let full_losses: Vec<f64> = full.records.iter().map(|r| r.loss).collect();
    assert_eq!(losses, full_losses, "resumed trajectory differs");
    assert_eq!(resumed.records.first().map(|r| r.step), Some(4));
    let wa = full.model.layers[0].weight.val().into_data().to_vec::<f32>().unwrap();
    let wb = resumed.model.layers[0].weight.val().into_data().to_vec::<f32>().unwrap();
    assert_eq!(wa, wb);
    // A second run into the same directory without --resume is refused.
    assert!(matches!(train(config(full_dir.clone(), 2, false, CheckpointMode::Off), Mlp::new(&Default::default())), Err(TrainError::OutputExists(_))));
}

#[test]
fn loss_falls_and_records_are_complete() {
    let (_tmp, dir) = tmpdir("fall");
    let mut cfg = config(dir.clone(), 30, false, CheckpointMode::Blocks);
    cfg.schedule = LrSchedule::constant();
    let out = train(cfg, Mlp::new(&Default::default())).unwrap();
    let first = out.records.first().unwrap();
    let last = out.records.last().unwrap();
    assert!(last.loss < first.loss, "{} -> {}", first.loss, last.loss);
    assert!(last.param_bytes == (4 * (16 * 16 + 16) * 3 + 4 * (16 * 4 + 4)) as u64);
    assert_eq!(last.grad_bytes, last.param_bytes);
    assert_eq!(last.optimizer_state_bytes, 2 * last.param_bytes);
    assert!(last.peak_backward_bytes > 0 && last.peak_forward_bytes > 0);
    assert!(dir.join("summary.md").exists());
}

#[test]
fn frozen_parameters_get_no_gradient_no_state_and_do_not_move() {
    let (_tmp, dir) = tmpdir("frozen");
    let mut model = Mlp::<B>::new(&Default::default());
    vramlab_train::optim::param_bytes::<B, _>(&model);
    // Freeze the first layer as a model would freeze its backbone.
    model.layers[0] = model.layers[0].clone().no_grad();
    let before = model.layers[0].weight.val().into_data().to_vec::<f32>().unwrap();
    let out = train(config(dir.clone(), 3, false, CheckpointMode::Off), model).unwrap();
    let after = out.model.layers[0].weight.val().into_data().to_vec::<f32>().unwrap();
    assert_eq!(before, after, "a frozen layer moved");
    let last = out.records.last().unwrap();
    let frozen = (4 * (16 * 16 + 16)) as u64;
    assert_eq!(last.grad_bytes, last.param_bytes - frozen);
    assert_eq!(last.optimizer_state_bytes, 2 * (last.param_bytes - frozen));
}

/// Issue 25: the weights that gave a non-finite loss are never checkpointed (here none were
/// saved before it: there is nothing to resume from, and no checkpoint is left behind).
#[test]
fn non_finite_loss_stops_naming_the_step_without_a_checkpoint_of_its_weights() {
    let (_tmp, dir) = tmpdir("nan");
    let mut cfg = config(dir.clone(), 50, false, CheckpointMode::Off);
    cfg.optim.lr = 1e30;
    cfg.optim.grad_clip_norm = None;
    cfg.schedule = LrSchedule::constant();
    cfg.save_freq = 1000;
    let err = train(cfg, Mlp::new(&Default::default())).err().expect("the run must stop");
    let TrainError::NonFinite { step, last_good, .. } = &err else { panic!("unexpected error: {err}") };
    assert!(*step >= 2, "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("at step {step}")) && msg.contains("nothing to resume from"), "{msg}");
    assert!(last_good.is_none(), "{msg}");
    assert!(checkpoint::step_dirs(&dir.join("checkpoints")).unwrap().is_empty(), "{msg}");
}

/// A run that diverges after periodic checkpoints: the checkpoint of the weights that gave the
/// non-finite loss is set aside, the one before is the last good one (and `last`), and
/// resuming from it with a smaller lr trains.
#[test]
fn after_a_non_finite_loss_resume_continues_from_the_last_good_checkpoint() {
    let (_tmp, dir) = tmpdir("nan-resume");
    let with = |steps, resume, lr| {
        let mut cfg = config(dir.clone(), steps, resume, CheckpointMode::Off);
        (cfg.optim.lr, cfg.optim.grad_clip_norm, cfg.schedule, cfg.save_freq) = (lr, None, LrSchedule::constant(), 1);
        cfg
    };
    train(with(3, false, 1e-2), Mlp::new(&Default::default())).unwrap();
    let err = train(with(50, true, 1e30), Mlp::new(&Default::default())).err().expect("the run must stop");
    let TrainError::NonFinite { step, last_good, .. } = &err else { panic!("unexpected error: {err}") };
    let msg = err.to_string();
    assert_eq!(*step, 5, "{msg}");
    let root = dir.join("checkpoints");
    assert!(root.join("000004.nonfinite/pretrained_model/model.safetensors").exists(), "{msg}");
    assert_eq!(last_good.as_deref(), Some(root.join("000003").as_path()), "{msg}");
    assert!(msg.contains("set aside") && msg.contains("Last good checkpoint") && msg.contains("000003"), "{msg}");
    #[cfg(unix)]
    assert_eq!(std::fs::read_link(root.join("last")).unwrap(), PathBuf::from("000003"));
    checkpoint::check_finite(&root.join("000003")).unwrap();
    let out = train(with(6, true, 1e-3), Mlp::new(&Default::default())).unwrap();
    assert_eq!(out.records.iter().map(|r| r.step).collect::<Vec<_>>(), [4, 5, 6]);
    assert!(out.records.iter().all(|r| r.loss.is_finite()));
}

#[test]
fn a_parameter_group_that_matches_nothing_is_an_error() {
    let model = Mlp::<B>::new(&Default::default());
    let with = |prefix: &str| OptimConfig { groups: vec![ParamGroup { prefix: prefix.into(), lr: 1e-3 }], ..Default::default() };
    // A group is a module path: `layers.1` is layer 1 (and not `layers.10`), `layers` all of them.
    for ok in ["layers", "layers.1", "layers.3.bias"] {
        with(ok).check_groups::<B, _>(&model).unwrap();
    }
    assert!(with("layers.1").groups[0].matches("layers.1.weight") && !with("layers.1").groups[0].matches("layers.10.weight"));
    for bad in ["act.backbone", "layer", "layers.4"] {
        let err = with(bad).check_groups::<B, _>(&model).unwrap_err();
        assert_eq!(err, OptimError::UnmatchedGroup { prefix: bad.into(), found: "layers".into() });
        assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
    }
    // The trainer refuses to start with it.
    let (_tmp, dir) = tmpdir("group");
    let mut cfg = config(dir.clone(), 1, false, CheckpointMode::Off);
    cfg.optim.groups = with("backbone").groups;
    assert!(matches!(train(cfg, model), Err(TrainError::Optim(OptimError::UnmatchedGroup { .. }))));
}

#[test]
fn a_materialized_model_clones_with_its_weights() {
    // Burn creates these Linear parameters lazily; a clone taken before first use would draw
    // its own values (block checkpointing clones the model for its graph-free forward).
    let model = Mlp::<B>::new(&Default::default());
    vramlab_train::recompute::materialize::<B, _>(&model);
    let copy = model.clone().no_grad();
    for (a, b) in model.layers.iter().zip(&copy.layers) {
        assert_eq!(a.weight.val().into_data(), b.weight.val().into_data());
    }
}

#[test]
fn optimizer_state_reads_back_in_torch_layout_with_or_without_param_names() {
    let (_tmp, dir) = tmpdir("optim");
    let cfg = config(dir.clone(), 2, false, CheckpointMode::Off);
    let out = train(cfg.clone(), Mlp::new(&Default::default())).unwrap();
    let state_dir = dir.join("checkpoints/000002/training_state");
    let params = vramlab_train::optim::trainable_params::<B, _>(&out.model);
    // lerobot (torch) writes param groups without `param_names`: indices map by position.
    let text = std::fs::read_to_string(state_dir.join("optimizer_param_groups.json")).unwrap();
    let mut groups: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(groups[0]["param_names"].as_array().unwrap().len(), params.len());
    for g in &mut groups {
        g.as_object_mut().unwrap().remove("param_names");
    }
    let bare = dir.join("groups_without_names.json");
    std::fs::write(&bare, serde_json::to_string(&groups).unwrap()).unwrap();
    let mut optim = vramlab_train::Optimizer::<B>::new(cfg.optim.clone());
    optim.load(&state_dir.join("optimizer_state.safetensors"), &bare, &params, 2, &Default::default()).unwrap();
    let again = dir.join("again.safetensors");
    optim.save(&again, &dir.join("again.json"), &params, 1.0).unwrap();
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(state_dir.join("optimizer_state.safetensors")).unwrap());
    // A file for another model is refused, naming the group.
    groups[0]["params"] = serde_json::json!([0, 1]);
    std::fs::write(&bare, serde_json::to_string(&groups).unwrap()).unwrap();
    let err = optim.load(&state_dir.join("optimizer_state.safetensors"), &bare, &params, 2, &Default::default()).unwrap_err();
    assert!(err.to_string().contains("group 0 holds 2 parameters"), "{err}");
}

#[test]
fn memory_timeline_writes_a_labelled_snapshot_of_the_chosen_step() {
    let has = |bytes: &[u8], s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
    for (mode, labels) in [
        (CheckpointMode::Off, &["data", "forward/0", "forward/3", "forward/exit+loss", "backward", "optimizer"][..]),
        (CheckpointMode::Blocks, &["data", "forward/0", "forward/2", "backward/2", "backward/0", "optimizer"][..]),
    ] {
        let (_tmp, dir) = tmpdir(&format!("timeline-{mode}"));
        let mut cfg = config(dir.clone(), 3, false, mode);
        cfg.memory_timeline = vec![2];
        train(cfg, Mlp::new(&Default::default())).unwrap();
        let bytes = std::fs::read(dir.join("memory_timeline/step_2.pickle")).unwrap();
        assert_eq!(&bytes[..2], [0x80, 4], "pickle protocol 4");
        for label in labels {
            assert!(has(&bytes, label), "{mode}: no event labelled {label}");
        }
        for other in [1, 3] {
            assert!(!dir.join(format!("memory_timeline/step_{other}.pickle")).exists());
        }
        let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
        assert!(summary.contains("memory_timeline/step_2.pickle") && summary.contains("https://pytorch.org/memory_viz"), "{summary}");
    }
}
