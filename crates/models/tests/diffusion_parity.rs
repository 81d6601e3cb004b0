//! Parity of vramlab's Diffusion Policy with lerobot 0.4.4 on the
//! `../shared/oracle/diffusion_small` fixture written by PyTorch, plus model-level checks that
//! need no fixture (parameter counts, names, stage plan, mixed precision, gradients, I/O).

mod common;

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::prelude::*;
use burn::tensor::{DType, Distribution, TensorData};
use vramlab_models::diffusion::{
    Diffusion, DiffusionBatch, DiffusionConfig, DiffusionCtx, DiffusionInput, DiffusionStage, DiffusionState, PolicyFeatures, SchedulerKind, UnetStage, file_key,
    load_pretrained, save_pretrained,
};
use vramlab_models::nn::Precision;
use vramlab_models::stages::Staged;
use vramlab_models::weights::{param_shapes, read_safetensors};

use common::*;

type B = Flex;


type Inputs = std::collections::BTreeMap<String, TensorData>;

fn fixture_batch(inputs: &Inputs, dev: &burn::backend::flex::FlexDevice) -> DiffusionBatch<B> {
    DiffusionBatch {
        state: Tensor::from_data(inputs["observation.state"].clone(), dev),
        images: vec![Tensor::from_data(inputs["observation.image"].clone(), dev)],
        env_state: None,
        action: None,
        action_is_pad: None,
    }
}

fn fixture_timesteps(inputs: &Inputs) -> Vec<usize> {
    inputs["timesteps"].clone().to_vec::<i64>().unwrap().into_iter().map(|t| t as usize).collect()
}

#[test]
fn parity_with_lerobot_diffusion_small() {
    let Some(shared) = shared_dir() else { return };
    let fx = shared.join("oracle/diffusion_small");
    let dev = Default::default();
    let t0 = Instant::now();
    let (cfg, model) = load_pretrained::<B>(&fx.join("pretrained_model"), &dev).expect("load lerobot checkpoint");
    println!("diffusion parity: loaded in {:.2} s", t0.elapsed().as_secs_f64());
    let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fx.join("fixture.json")).unwrap()).unwrap();
    let n = fixture["num_parameters"].as_u64().unwrap() as usize;
    assert_eq!(n, 15_618_946);
    assert_eq!(model.num_parameters(), n);
    assert_eq!(cfg.num_params(), n);
    assert_eq!(model.num_buffer_elements(), 18, "pos_grid [9, 2]");
    assert_eq!(cfg.noise_scheduler_type, SchedulerKind::Ddim);
    assert_eq!(model.noise_scheduler.timesteps, [90, 80, 70, 60, 50, 40, 30, 20, 10, 0]);

    let inputs = read_safetensors(&fx.join("inputs.safetensors")).unwrap();
    let outputs = read_safetensors(&fx.join("outputs.safetensors")).unwrap();
    let batch = fixture_batch(&inputs, &dev);
    let ctx = DiffusionCtx::eval(Precision::F32);
    let t0 = Instant::now();
    let global_cond = model.prepare_global_conditioning(&batch, &ctx);
    let x_t = Tensor::<B, 3>::from_data(inputs["x_t"].clone(), &dev);
    let eps = model.unet.forward(x_t, &fixture_timesteps(&inputs), global_cond.clone(), Precision::F32);
    let noise = Tensor::<B, 3>::from_data(inputs["initial_noise"].clone(), &dev);
    let actions = model.generate_actions(&batch, noise, |_| None, &ctx);
    println!("diffusion parity: conditioning + unet + 10 DDIM steps in {:.2} s", t0.elapsed().as_secs_f64());

    let mut failures = Vec::new();
    for (name, data, tol) in [
        ("global_cond", global_cond.into_data(), 1e-4),
        ("unet_eps", eps.into_data(), 1e-4),
        ("ddim_actions", actions.into_data(), 1e-3),
    ] {
        let want = &outputs[name];
        assert_eq!(data.shape, want.shape, "{name}: shape");
        let (rel, abs) = errors(name, data, want);
        println!("diffusion parity {name:>13}: max rel error (to scale) {rel:.2e}; max abs {abs:.2e} (tolerance {tol:e})");
        failures.extend((rel > tol).then(|| format!("{name}: max relative error {rel:e} > {tol:e}")));
    }
    assert!(failures.is_empty(), "{failures:?}");

    // The fixture settles diffusers' DDIM detail: with clip_sample, ε is *not* recomputed from the
    // clipped x₀ (use_clipped_model_output = False).
    let mut recompute = model.clone();
    recompute.noise_scheduler.use_clipped_model_output = true;
    let noise = Tensor::<B, 3>::from_data(inputs["initial_noise"].clone(), &dev);
    let alt = recompute.generate_actions(&batch, noise, |_| None, &ctx);
    let (rel, _) = errors("ddim_actions (recomputed eps)", alt.into_data(), &outputs["ddim_actions"]);
    println!("diffusion parity  ddim_actions with ε recomputed after clipping: max rel error {rel:.2e}");
    assert!(rel > 1e-2, "the fixture should tell the two DDIM variants apart");
}

#[test]
fn parameter_names_match_the_lerobot_state_dict() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("oracle/diffusion_small/pretrained_model");
    let reference = read_safetensors(&dir.join("model.safetensors")).unwrap();
    let cfg = DiffusionConfig::from_json_file(&dir.join("config.json")).unwrap();
    let model = cfg.init::<B>(&Default::default());
    let ours = param_shapes::<B, _>(&model);
    let mut names: Vec<_> = ours.iter().map(|(k, _)| file_key(k)).collect();
    names.sort();
    let theirs: Vec<_> = reference.keys().cloned().collect();
    assert_eq!(names.len(), 213);
    assert_eq!(names, theirs);
    for (k, shape) in ours {
        assert_eq!(reference[&file_key(&k)].shape.to_vec(), shape, "{k}");
    }
    // Our pos_grid (computed) equals the checkpoint's buffer.
    let grid = model.rgb_encoder(0).pool.pos_grid.val().into_data();
    assert_eq!(grid, reference["diffusion.rgb_encoder.pool.pos_grid"].clone());
}

#[test]
fn pusht_parameter_count() {
    let cfg = DiffusionConfig::pusht();
    assert_eq!(cfg.rgb_encoder_num_params(), 11_197_088);
    assert_eq!(cfg.unet_num_params(), 251_511_938);
    assert_eq!(cfg.num_params(), 262_709_026);
    let t0 = Instant::now();
    let model = cfg.init::<B>(&Default::default());
    let secs = t0.elapsed().as_secs_f64();
    println!("PushT Diffusion Policy (262.7M) instantiated in {secs:.2} s");
    assert_eq!(model.num_parameters(), 262_709_026);
    assert_eq!(model.rgb_encoder(0).num_params(), 11_197_088 + 18, "+ pos_grid buffer");
    assert_eq!(model.unet.num_params(), 251_511_938);
    assert_eq!(model.num_buffer_elements(), 18);
}

/// A small config: two cameras (2×2 feature maps), env state, 2 UNet levels.
fn small(separate: bool) -> DiffusionConfig {
    DiffusionConfig {
        crop_shape: Some([56, 60]),
        down_dims: vec![16, 32],
        diffusion_step_embed_dim: 8,
        spatial_softmax_num_keypoints: 4,
        horizon: 8,
        n_action_steps: 4,
        num_train_timesteps: 20,
        num_inference_steps: Some(4),
        noise_scheduler_type: SchedulerKind::Ddim,
        use_separate_rgb_encoder_per_camera: separate,
        do_mask_loss_for_padding: true,
        ..DiffusionConfig::default()
    }
    .with_robot_state(3)
    .with_camera("observation.images.a", [3, 64, 64])
    .with_camera("observation.images.b", [3, 64, 64])
    .with_env_state(2)
    .with_action(3)
}

fn small_batch<Bk: Backend>(cfg: &DiffusionConfig, b: usize, dev: &Bk::Device) -> DiffusionBatch<Bk> {
    let s = cfg.n_obs_steps;
    let n = |shape: [usize; 3]| Tensor::<Bk, 3>::random(shape, Distribution::Normal(0.0, 1.0), dev);
    let mut pad = vec![false; b * cfg.horizon];
    pad[cfg.horizon - 2..cfg.horizon].iter_mut().for_each(|p| *p = true);
    DiffusionBatch {
        state: n([b, s, cfg.state_dim()]),
        images: cfg
            .image_features()
            .iter()
            .map(|(_, [c, h, w])| Tensor::<Bk, 5>::random([b, s, *c, *h, *w], Distribution::Normal(0.0, 1.0), dev))
            .collect(),
        env_state: cfg.env_state_dim().map(|e| n([b, s, e])),
        action: Some(n([b, cfg.horizon, cfg.action_dim()])),
        action_is_pad: Some(Tensor::from_data(TensorData::new(pad, [b, cfg.horizon]), dev)),
    }
}

#[test]
fn closed_form_counts_match_instantiated_variants() {
    let dev = Default::default();
    for separate in [false, true] {
        let cfg = small(separate);
        let m = cfg.init::<B>(&dev);
        assert_eq!(m.num_parameters(), cfg.num_params(), "separate {separate}");
        assert_eq!(m.num_buffer_elements(), cfg.num_buffer_elements());
        assert_eq!(m.num_rgb_encoders(), if separate { 2 } else { 1 });
        assert_eq!(cfg.feature_map_size(), Some([2, 2]));
        let names: Vec<String> = param_shapes::<B, _>(&m).into_iter().map(|(k, _)| file_key(&k)).collect();
        let first = if separate { "diffusion.rgb_encoder.1.backbone.0.weight" } else { "diffusion.rgb_encoder.backbone.0.weight" };
        assert!(names.iter().any(|k| k == first), "{first}");
    }
    let no_film = DiffusionConfig { use_film_scale_modulation: false, ..small(false) };
    assert_eq!(no_film.init::<B>(&dev).num_parameters(), no_film.num_params());
    let no_cam = DiffusionConfig { input_features: Default::default(), ..small(false) }.with_robot_state(3).with_env_state(5);
    let m = no_cam.init::<B>(&dev);
    assert!(m.rgb_encoder.is_none());
    assert_eq!(m.num_parameters(), no_cam.num_params());
    let batch = DiffusionBatch { images: vec![], env_state: Some(Tensor::ones([2, 2, 5], &dev)), ..small_batch::<B>(&small(false), 2, &dev) };
    let a = m.generate_actions(&batch, Tensor::zeros([2, 8, 3], &dev), |_| None, &DiffusionCtx::eval(Precision::F32));
    assert_eq!(a.dims(), [2, 4, 3]);
}

#[test]
fn stage_plan_runs_like_compute_loss() {
    let dev = Default::default();
    for separate in [false, true] {
        let cfg = small(separate);
        let model = cfg.init::<B>(&dev);
        let batch = small_batch::<B>(&cfg, 2, &dev);
        let noise = Tensor::<B, 3>::random([2, cfg.horizon, 3], Distribution::Normal(0.0, 1.0), &dev);
        let ts = [3, 17];
        let ctx = DiffusionCtx::train(Precision::F32).with_crop_offsets(vec![[1, 2]; model.num_rgb_encoders()]);
        let loss = model.compute_loss(&batch, noise.clone(), &ts, &ctx);

        // The plan: the trunk's own stages, conditioning, the UNet's stages (2 levels).
        let input = DiffusionInput { batch: batch.clone(), noise: noise.clone(), timesteps: ts.to_vec(), ctx: ctx.clone() };
        let plan = model.plan(&input);
        let unet = [UnetStage::Down(0, 0), UnetStage::Down(0, 1), UnetStage::Down(1, 0), UnetStage::Down(1, 1)]
            .into_iter()
            .chain([UnetStage::Mid(0), UnetStage::Mid(1), UnetStage::Up(0, 0), UnetStage::Up(0, 1), UnetStage::Out]);
        let expect: Vec<DiffusionStage> = model.rgb_encoder(0).backbone.stages().into_iter().map(DiffusionStage::Backbone)
            .chain([DiffusionStage::Conditioning])
            .chain(unet.map(DiffusionStage::Unet))
            .collect();
        assert_eq!(plan, expect);
        // Stage by stage through the public API: the states have the documented shapes.
        let mut state = model.enter(&input);
        for s in plan {
            state = model.stage(s, state, &input);
            match (&s, &state) {
                (DiffusionStage::Backbone(_), DiffusionState::Encoders { maps }) => assert_eq!(maps.len(), model.num_rgb_encoders()),
                (DiffusionStage::Conditioning, DiffusionState::Unet { unet }) => {
                    assert_eq!(unet.x.dims(), [2, 3, cfg.horizon]);
                    assert_eq!(unet.mish_cond.dims(), [2, cfg.cond_dim()]);
                }
                (DiffusionStage::Unet(UnetStage::Down(1, 1)), DiffusionState::Unet { unet }) => {
                    assert_eq!(unet.skips.len(), 1, "the first level's skip is never read, so not kept");
                }
                (DiffusionStage::Unet(UnetStage::Out), DiffusionState::Unet { unet }) => assert_eq!(unet.x.dims(), [2, cfg.horizon, 3]),
                (DiffusionStage::Backbone(_) | DiffusionStage::Conditioning, other) => panic!("unexpected state {other:?}"),
                _ => {}
            }
        }
        let staged = model.exit(state, &input);
        assert_eq!(staged.into_data(), loss.clone().into_data(), "separate {separate}");
        assert!(loss.into_scalar().is_finite());
        // A different random crop changes the loss; eval uses the center crop.
        let p = ctx.precision;
        let other = model.compute_loss(&batch, noise.clone(), &ts, &DiffusionCtx::train(p).with_crop_offsets(vec![[4, 0]; model.num_rgb_encoders()]));
        let center = model.compute_loss(&batch, noise.clone(), &ts, &DiffusionCtx::eval(p));
        let center2 = model.compute_loss(&batch, noise, &ts, &DiffusionCtx::train(p));
        assert_ne!(other.into_data(), center.clone().into_data());
        assert_eq!(center.into_data(), center2.into_data(), "no offsets → center crop");
    }
}

#[test]
fn bf16_forward_is_close_to_f32() {
    let dev = Default::default();
    let (model, batch, x_t, ts) = match shared_dir() {
        Some(shared) => {
            let fx = shared.join("oracle/diffusion_small");
            let (_, model) = load_pretrained::<B>(&fx.join("pretrained_model"), &dev).unwrap();
            let inputs = read_safetensors(&fx.join("inputs.safetensors")).unwrap();
            let x_t = Tensor::<B, 3>::from_data(inputs["x_t"].clone(), &dev);
            (model, fixture_batch(&inputs, &dev), x_t, fixture_timesteps(&inputs))
        }
        None => {
            let cfg = small(false);
            let batch = small_batch::<B>(&cfg, 2, &dev);
            let x_t = batch.action.clone().unwrap();
            (cfg.init::<B>(&dev), batch, x_t, vec![3, 11])
        }
    };
    let run = |p| {
        let ctx = DiffusionCtx::eval(p);
        let cond = model.prepare_global_conditioning(&batch, &ctx);
        let eps = model.unet.forward(x_t.clone(), &ts, cond.clone(), p);
        (cond, eps)
    };
    let (c32, e32) = run(Precision::F32);
    let (c16, e16) = run(Precision::Bf16);
    assert_eq!((c16.dtype(), e16.dtype()), (DType::F32, DType::F32), "returned in f32");
    for (name, a, b) in [("global_cond", c16.reshape([-1]), c32.reshape([-1])), ("unet_eps", e16.reshape([-1]), e32.reshape([-1]))] {
        let scale = b.clone().abs().max().into_scalar();
        let err = (a - b).abs().max().into_scalar();
        println!("bf16 vs f32 {name}: max abs err {err:.3e} (scale {scale:.3e})");
        assert!(err <= 0.1 * scale + 1e-2, "{name}: bf16 max abs error {err} vs scale {scale}");
    }
}

#[test]
fn gradients_reach_parameters_and_frozen_parts_get_none() {
    type A = Autodiff<Flex>;
    let dev = Default::default();
    for freeze in [false, true] {
        let cfg = DiffusionConfig { freeze_backbone: freeze, ..small(false) };
        let model = cfg.init::<A>(&dev);
        let batch = small_batch::<A>(&cfg, 2, &dev);
        let noise = Tensor::<A, 3>::random([2, cfg.horizon, 3], Distribution::Normal(0.0, 1.0), &dev);
        let ctx = DiffusionCtx::train(Precision::Bf16).with_crop_offsets(vec![[2, 1]]);
        let loss = model.compute_loss(&batch, noise, &[5, 19], &ctx);
        assert_eq!(loss.dtype(), DType::F32);
        let grads = loss.backward();
        let (with, without) = grad_presence(&model, &grads);
        for k in &without {
            let ok = k.ends_with("pos_grid") || (freeze && k.starts_with("rgb_encoder.backbone."));
            assert!(ok, "{k}: no gradient (freeze_backbone {freeze})");
        }
        assert!(!with.iter().any(|k| k.ends_with("pos_grid")));
        assert_eq!(with.iter().any(|k| k == "rgb_encoder.backbone.conv1.weight"), !freeze);
        for k in ["unet.diffusion_step_encoder.1.weight", "unet.down_modules.0.2.weight", "unet.up_modules.0.2.weight", "rgb_encoder.pool.nets.weight", "unet.final_conv.1.bias"] {
            assert!(with.iter().any(|w| w == k), "{k}: no gradient");
        }
        println!("freeze_backbone {freeze}: {} tensors with gradient, {} without", with.len(), without.len());
    }
    // from_inner leaves everything untracked; set_trainable restores the rules.
    let cfg = DiffusionConfig { freeze_backbone: true, ..small(true) };
    let model = <Diffusion<A> as burn::module::AutodiffModule<A>>::from_inner(cfg.init::<Flex>(&dev)).set_trainable();
    let batch = small_batch::<A>(&cfg, 1, &dev);
    let loss = model.compute_loss(&batch, Tensor::ones([1, cfg.horizon, 3], &dev), &[7], &DiffusionCtx::train(Precision::F32));
    let (with, _) = grad_presence(&model, &loss.backward());
    assert!(with.iter().all(|k| !k.contains(".backbone.") && !k.ends_with("pos_grid")), "{with:?}");
    assert!(with.iter().any(|k| k == "rgb_encoder.1.out.weight"));
}

#[test]
fn save_then_load_round_trips_with_lerobot_names() {
    let dev = Default::default();
    let cfg = DiffusionConfig { freeze_backbone: true, ..small(true) };
    let model = cfg.init::<B>(&dev);
    let batch = small_batch::<B>(&cfg, 2, &dev);
    let dir = vramlab_testkit::temp_dir("diffusion-roundtrip");
    save_pretrained(&cfg, &model, &dir).unwrap();
    let keys = read_safetensors(&dir.join("model.safetensors")).unwrap();
    assert!(keys.keys().all(|k| k.starts_with("diffusion.")), "lerobot names");
    assert!(keys.contains_key("diffusion.rgb_encoder.0.backbone.4.0.conv1.weight"));
    assert!(keys.contains_key("diffusion.rgb_encoder.1.pool.pos_grid"));
    let (cfg2, model2) = load_pretrained::<B>(&dir, &dev).unwrap();
    assert_eq!(cfg2, cfg);
    let ctx = DiffusionCtx::eval(Precision::F32);
    let noise = Tensor::<B, 3>::random([2, cfg.horizon, 3], Distribution::Normal(0.0, 1.0), &dev);
    let a = model.generate_actions(&batch, noise.clone(), |_| None, &ctx).into_data();
    let b = model2.generate_actions(&batch, noise, |_| None, &ctx).into_data();
    assert_eq!(a, b);
    // Errors name the file and the key / field.
    let other = DiffusionConfig { down_dims: vec![8, 16], ..cfg.clone() };
    std::fs::write(dir.join("config.json"), other.to_json_string()).unwrap();
    let e = load_pretrained::<B>(&dir, &dev).err().unwrap().to_string();
    assert!(e.contains("model.safetensors") && e.contains("diffusion.unet"), "{e}");
    std::fs::write(dir.join("config.json"), r#"{"type": "diffusion", "horizn": 4}"#).unwrap();
    let e = load_pretrained::<B>(&dir, &dev).err().unwrap().to_string();
    assert!(e.contains("config.json") && e.contains("horizn"), "{e}");
}

#[test]
fn ddpm_sampling_uses_the_callers_noise() {
    let dev = Default::default();
    let cfg = DiffusionConfig { noise_scheduler_type: SchedulerKind::Ddpm, ..small(false) };
    let model = cfg.init::<B>(&dev);
    let batch = small_batch::<B>(&cfg, 1, &dev);
    let ctx = DiffusionCtx::eval(Precision::F32);
    let init = Tensor::<B, 3>::random([1, cfg.horizon, 3], Distribution::Normal(0.0, 1.0), &dev);
    let noises: Vec<Tensor<B, 3>> =
        (0..4).map(|_| Tensor::random([1, cfg.horizon, 3], Distribution::Normal(0.0, 1.0), &dev)).collect();
    let run = |scale: f32| model.generate_actions(&batch, init.clone(), |k| Some(noises[k].clone() * scale), &ctx).into_data();
    assert_eq!(run(1.0), run(1.0));
    assert_ne!(run(1.0), run(0.0));
}
