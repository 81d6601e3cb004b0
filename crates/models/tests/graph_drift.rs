//! Drift tests: each model's estimate graph (`<model>::graph::training_graph`, replayed by
//! [`vramlab_models::graph`]) against its real training forward, stage by stage, so a change
//! to a forward that the graph does not follow fails here.
//!
//! Measured: the forward runs on `Autodiff<Flex>` with the counting allocator as this test
//! binary's global allocator, after one unrecorded step (parameters materialised, the
//! runtime's one-time buffers made, as in the trainer's later steps), on one rayon thread,
//! stage by stage as the trainer folds the plan, each stage under its own scope
//! (`forward/<stage>`, the trainer's `--memory_timeline` labels). The allocation timeline is
//! attributed per scope ([`vramlab_probe::attribution`]): a stage's bytes are those it
//! allocated that are still live when the backward begins (what autodiff keeps for the
//! backward, plus the stage's output), exact to the byte. `forward/enter` counts with the
//! first stage and `forward/exit+loss` with the last, where the graphs put those ops.
//! Estimated: [`Graph::stored_by_stage`], the same bytes in the graph.
//!
//! Band: ±10 %, the band `vramlab estimate` is validated in against flex's exact peaks
//! (`benches/estimate_validation.sh`, which reports its median and largest error). That
//! validation is of the whole step's peak, where parameters, gradients and optimizer state
//! dominate; stage by stage the graph today differs from the forward by more in some stages
//! (dropout and loss masks are not counted, bookkeeping weighs on small maps). Those stages are listed per model as a
//! [`Gap`] with the graph ÷ measured ratio found when this test was written, and are held to
//! ±10 % around it, so they still fail on a change; every other stage is held to ±10 %
//! around a ratio of one. Stages under [`FLOOR_SHARE`] of the forward's bytes are printed only. The sizes are
//! the smallest where the checked stages are well above autodiff's bookkeeping and the three
//! tests run in a few seconds; Diffusion's UNet stages (~0.1 MB each here) stay under the
//! floor, checking them would take a batch of ~32 (`--nocapture` prints every stage).

use std::sync::Mutex;

use burn::backend::{Autodiff, Flex};
use burn::prelude::*;
use burn::tensor::{Distribution, TensorData};
use vramlab_models::act::{ActBatch, ActConfig, ActCtx, ActInput};
use vramlab_models::diffusion::{DiffusionBatch, DiffusionConfig, DiffusionCtx, DiffusionInput};
use vramlab_models::graph::Graph;
use vramlab_models::nn::Precision;
use vramlab_models::policy::PolicyFeatures;
use vramlab_models::stages::Staged;
use vramlab_models::vae3d::{Vae3dConfig, Vae3dInput};
use vramlab_probe::attribution::attribute;
use vramlab_probe::{CountingAllocator, scope, timeline};
use vramlab_train::recompute::materialize;

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// The timeline and its scope are process-wide: one measurement at a time.
static SERIAL: Mutex<()> = Mutex::new(());

type A = Autodiff<Flex>;

/// The validated band of the estimator (relative to the measured bytes).
const BAND: f64 = 0.10;

/// Per stage of `model`'s plan on `input`: the bytes the forward allocated in that stage and
/// still holds when the backward begins. `loss` turns the forward's output into the loss.
fn measure<M>(model: &M, input: &M::Input, loss: impl Fn(M::Output) -> Tensor<A, 1> + Sync) -> Vec<(String, u64)>
where
    M: Staged<A> + Module<A> + Sync,
    M::Input: Sync,
{
    // One worker thread: the kernels' per-thread scratch is then made once, in the warm-up,
    // instead of in whichever stage a worker first needs it.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    pool.install(|| measure_here(model, input, &loss))
}

fn measure_here<M: Staged<A> + Module<A>>(model: &M, input: &M::Input, loss: impl Fn(M::Output) -> Tensor<A, 1>) -> Vec<(String, u64)> {
    materialize(model);
    // A first step, not recorded: the runtime's one-time buffers (kernel scratch) and
    // autodiff's node map reach their size here, as in the trainer's steps after the first;
    // its backward consumes its graph.
    drop(loss(model.run(input)).backward());
    let plan = model.plan(input);
    let labels: Vec<String> = plan.iter().map(|s| format!("forward/{s:?}")).collect();
    // Interned before recording: the label table's own allocations stay out of the window.
    for l in labels.iter().map(String::as_str).chain(["forward/enter", "forward/exit+loss", "backward"]) {
        scope::intern(l);
    }
    timeline::start(1 << 22).expect("start the allocation timeline");
    let mut state = {
        let _s = scope::enter("forward/enter");
        model.enter(input)
    };
    for (s, label) in plan.iter().zip(&labels) {
        let _s = scope::enter(label);
        state = model.stage(*s, state, input);
    }
    let loss = {
        let _s = scope::enter("forward/exit+loss");
        loss(model.exit(state, input))
    };
    {
        // The backward begins: its first event marks what the forward holds.
        let _s = scope::enter("backward");
        std::hint::black_box(Box::new(0u64));
    }
    let rec = timeline::stop().expect("recording");
    drop(loss);
    assert_eq!(rec.dropped, 0, "timeline buffer too small");
    let att = attribute(&rec);
    let kept = |label: &str| att.rows.iter().find(|r| r.scope == label).map_or(0, |r| r.kept_at_backward);
    // DRIFT_DEBUG=1: every scope's kept bytes, block count and largest blocks.
    if std::env::var_os("DRIFT_DEBUG").is_some() {
        for r in &att.rows {
            eprintln!("DBG {} kept {} blocks {} largest {:?}", r.scope, r.kept_at_backward, r.kept_blocks, r.largest_kept);
        }
    }
    assert_eq!(kept("(no scope)"), 0, "every allocation has a scope");
    let n = labels.len();
    labels
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let extra = if i == 0 { kept("forward/enter") } else { 0 } + if i + 1 == n { kept("forward/exit+loss") } else { 0 };
            (l.trim_start_matches("forward/").to_string(), kept(l) + extra)
        })
        .collect()
}

/// Stages whose bytes are under this share of the forward's measured total are printed, not
/// checked: there autodiff's own bookkeeping is of the order of the tensors (its graph nodes,
/// 100–700 small blocks a stage, and blocks of up to ~150 KB when its tables grow, which land
/// in one stage or a neighbour from one run to the next).
const FLOOR_SHARE: f64 = 0.03;

/// One growth of autodiff's own tables: a block of up to this many bytes that lands in one
/// stage or its neighbour from one run to the next (ACT's decoder layer or its action head,
/// 123 KB, seen both ways in consecutive runs of the same binary). A checked stage whose
/// measured bytes are above the band passes when they are inside it less at most this block.
const TABLE_GROWTH: u64 = 160 << 10;

/// A stage where the graph is known to differ from the forward today: `ratio` is graph ÷
/// measured as measured when the test was written; the stage is checked at that ratio ± the
/// band, so it still fails when the forward (or the graph) changes there.
struct Gap {
    stage: &'static str,
    ratio: f64,
}

/// Compare each stage's measured bytes with the graph's; prints the table, fails on any
/// checked stage outside the band (around 1, or around its [`Gap`] ratio).
fn check(model: &str, measured: &[(String, u64)], graph: &Graph, gaps: &[Gap]) {
    let estimated = graph.stored_by_stage();
    assert_eq!(estimated.len(), measured.len(), "{model}: the graph has one stage per stage of the plan ({measured:?} vs {estimated:?})");
    let total = measured.iter().map(|r| r.1).sum::<u64>();
    let floor = (FLOOR_SHARE * total as f64) as u64;
    let mut bad = Vec::new();
    eprintln!("{model}: stage | measured B | graph B | graph/measured | expected");
    for ((name, m), (i, e)) in measured.iter().zip(&estimated) {
        let ratio = *e as f64 / (*m).max(1) as f64;
        let expected = gaps.iter().find(|g| g.stage == name).map_or(1.0, |g| g.ratio);
        let checked = *m >= floor;
        eprintln!("{model}: {i:>2} {name:<24} | {m:>10} | {e:>10} | {ratio:.3} | {}", if checked { format!("{expected:.2} ± {:.0} %", 100.0 * BAND) } else { "(under the floor)".into() });
        // The ratio grows as measured bytes shrink: with the measured bytes anywhere from `m`
        // down to `m` less one table growth, it spans [ratio, ratio_less_growth]; that span must
        // meet the band.
        let ratio_less_growth = *e as f64 / m.saturating_sub(TABLE_GROWTH).max(1) as f64;
        let meets_band = ratio <= expected * (1.0 + BAND) && ratio_less_growth >= expected * (1.0 - BAND);
        if checked && !meets_band {
            bad.push(format!("{name}: measured {m} B, graph {e} B: graph/measured {ratio:.3}, expected {expected:.2} ± {:.0} %", 100.0 * BAND));
        }
    }
    let e = estimated.iter().map(|r| r.1).sum::<u64>();
    eprintln!("{model}: total | {total:>10} | {e:>10} | {:.3}", e as f64 / total as f64);
    assert!(bad.is_empty(), "{model}: stages outside the band:\n{}", bad.join("\n"));
}

fn normal<const D: usize>(shape: [usize; D], dev: &burn::backend::flex::FlexDevice) -> Tensor<A, D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
}

/// The loss's occupancy weights and masks are graph inputs (made in the forward, not counted).
const VAE3D_GAPS: &[Gap] = &[Gap { stage: "Out", ratio: 0.79 }];

/// The 3D-VAE: the `ultra_lightweight` preset (the main job's) on one 16×32×32 grid.
#[test]
fn vae3d_graph_matches_the_forward_per_stage() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dev = Default::default();
    let (b, grid) = (1, [16, 32, 32]);
    let cfg = Vae3dConfig::preset("ultra_lightweight").unwrap();
    let model = cfg.init::<A>(&dev);
    let f = cfg.downsample_factor();
    let x = normal([b, cfg.in_channels, grid[0], grid[1], grid[2]], &dev);
    let eps = normal([b, cfg.latent_dim, grid[0] / f[0], grid[1] / f[1], grid[2] / f[2]], &dev);
    let input = Vae3dInput { x: x.clone(), eps: Some(eps), precision: Precision::F32 };
    let measured = measure(&model, &input, |out| model.compute_loss(x.clone(), &out).loss);
    check("vae3d", &measured, &vramlab_models::vae3d::graph::training_graph(&cfg, b, grid, Precision::F32), VAE3D_GAPS);
}

const ACT_GAPS: &[Gap] = &[
    // Dropout's 1-byte masks are graph inputs (made in the forward, not counted), and the
    // layers' maps are small next to autodiff's bookkeeping (~400 blocks a layer).
    Gap { stage: "VaeLayer(0)", ratio: 0.87 },
    Gap { stage: "VaeLayer(1)", ratio: 0.87 },
    Gap { stage: "EncoderLayer(0)", ratio: 0.84 },
    Gap { stage: "EncoderLayer(1)", ratio: 0.84 },
    Gap { stage: "DecoderLayer(0)", ratio: 0.87 },
    // Small maps next to ~370 bookkeeping blocks.
    Gap { stage: "Backbone(Layer(2))", ratio: 0.88 },
];

/// ACT: a narrow transformer (dim 128) with the VAE encoder and dropout, the ResNet-18
/// backbone on one 96×96 camera, chunk 20, batch 2.
#[test]
fn act_graph_matches_the_forward_per_stage() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dev = Default::default();
    let b = 2;
    let cfg = ActConfig {
        chunk_size: 20,
        n_action_steps: 20,
        dim_model: 128,
        n_heads: 4,
        dim_feedforward: 512,
        n_encoder_layers: 2,
        n_decoder_layers: 1,
        n_vae_encoder_layers: 2,
        ..ActConfig::default()
    }
    .with_robot_state(6)
    .with_camera("observation.images.top", [3, 96, 96])
    .with_action(6);
    let model = cfg.init::<A>(&dev);
    let (c, a) = (cfg.chunk_size, cfg.action_dim());
    let batch = ActBatch {
        state: Some(normal([b, 6], &dev)),
        env_state: None,
        images: vec![normal([b, 3, 96, 96], &dev)],
        action: Some(normal([b, c, a], &dev)),
        action_is_pad: Some(Tensor::from_data(TensorData::new(vec![false; b * c], [b, c]), &dev)),
    };
    let ctx = ActCtx::train(Precision::F32).with_eps(normal([b, cfg.latent_dim], &dev)).with_dropout(7);
    let input = ActInput { batch: batch.clone(), ctx };
    let measured = measure(&model, &input, |out| model.loss(&out, batch.action.clone().unwrap(), batch.action_is_pad.clone()).loss);
    check("act", &measured, &vramlab_models::act::graph::training_graph(&cfg, b, Precision::F32).0, ACT_GAPS);
}

// None: the trunk runs at the crop's size in the graph as in the forward (issue 26; before,
// the graph ran it at the camera's size and its early stages were 1.16–1.30× the forward's).
const DIFFUSION_GAPS: &[Gap] = &[];

/// Diffusion Policy: the validation's small UNet (64, 128, 256) on one 64×64 camera cropped
/// to 56×56, batch 4.
#[test]
fn diffusion_graph_matches_the_forward_per_stage() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dev = Default::default();
    let b = 4;
    let cfg = DiffusionConfig { crop_shape: Some([56, 56]), down_dims: vec![64, 128, 256], ..DiffusionConfig::default() }
        .with_robot_state(2)
        .with_camera("observation.image", [3, 64, 64])
        .with_action(2);
    let model = cfg.init::<A>(&dev);
    let (s, h, a) = (cfg.n_obs_steps, cfg.horizon, cfg.action_dim());
    let batch = DiffusionBatch {
        state: normal([b, s, cfg.state_dim()], &dev),
        images: vec![normal([b, s, 3, 64, 64], &dev)],
        env_state: None,
        action: Some(normal([b, h, a], &dev)),
        action_is_pad: Some(Tensor::from_data(TensorData::new(vec![false; b * h], [b, h]), &dev)),
    };
    let timesteps: Vec<usize> = (0..b).map(|i| 10 + 7 * i).collect();
    let ctx = DiffusionCtx::train(Precision::F32).with_crop_offsets(vec![[3, 5]; model.num_rgb_encoders()]);
    let input = DiffusionInput { batch, noise: normal([b, h, a], &dev), timesteps, ctx };
    let measured = measure(&model, &input, |loss| loss);
    check("diffusion", &measured, &vramlab_models::diffusion::graph::training_graph(&cfg, b, Precision::F32).0, DIFFUSION_GAPS);
}
