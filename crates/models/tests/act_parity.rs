//! Parity of vramlab's ACT with lerobot 0.4.4 on the `../shared/oracle/act_small` fixture
//! written by PyTorch, plus model-level checks that need no fixture (parameter counts, stage
//! plan, mixed precision, gradients and frozen backbone, dropout, checkpoint I/O).

mod common;

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::prelude::*;
use burn::tensor::{DType, Distribution, TensorData};
use vramlab_models::act::{
    Act, ActBatch, ActConfig, ActCtx, ActInput, ActPolicyRunner, ActStage, ActState, PolicyFeatures, is_act_buffer, load_pretrained, save_pretrained,
};
use vramlab_models::nn::Precision;
use vramlab_models::stages::Staged;
use vramlab_models::weights::{param_shapes, read_safetensors};

use common::*;

type B = Flex;


fn fixture_batch(inputs: &std::collections::BTreeMap<String, TensorData>, dev: &burn::backend::flex::FlexDevice) -> ActBatch<B> {
    ActBatch {
        state: Some(Tensor::from_data(inputs["observation.state"].clone(), dev)),
        env_state: None,
        images: vec![Tensor::from_data(inputs["observation.images.top"].clone(), dev)],
        action: Some(Tensor::from_data(inputs["action"].clone(), dev)),
        action_is_pad: Some(Tensor::from_data(inputs["action_is_pad"].clone(), dev)),
    }
}

#[test]
fn parity_with_lerobot_act_small() {
    let Some(shared) = shared_dir() else { return };
    let fx = shared.join("oracle/act_small");
    let dev = Default::default();
    let t0 = Instant::now();
    let (cfg, model) = load_pretrained::<B>(&fx.join("pretrained_model"), &dev).expect("load lerobot checkpoint");
    println!("act parity: loaded in {:.2} s", t0.elapsed().as_secs_f64());
    let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fx.join("fixture.json")).unwrap()).unwrap();
    assert_eq!(model.num_parameters() as u64, fixture["num_parameters"].as_u64().unwrap());
    assert_eq!(model.num_parameters(), 11_388_182);
    assert_eq!(cfg.num_params(), 11_388_182);
    assert_eq!((cfg.chunk_size, cfg.dim_model, cfg.latent_dim), (10, 64, 8));

    let inputs = read_safetensors(&fx.join("inputs.safetensors")).unwrap();
    let outputs = read_safetensors(&fx.join("outputs.safetensors")).unwrap();
    let batch = fixture_batch(&inputs, &dev);

    let t0 = Instant::now();
    let eval = model.forward(&batch, &ActCtx::eval(Precision::F32));
    assert!(eval.posterior.is_none(), "eval: no VAE");
    // Train mode with eps = 0: z = mu.
    let train = model.forward(&batch, &ActCtx::train(Precision::F32));
    let loss = model.loss(&train, batch.action.clone().unwrap(), batch.action_is_pad.clone());
    println!("act parity: eval + train forward in {:.2} s", t0.elapsed().as_secs_f64());

    let got = [
        ("eval_actions", eval.actions.into_data()),
        ("train_actions_z_mu", train.actions.clone().into_data()),
        ("vae_mu", train.mu().unwrap().into_data()),
        ("vae_log_sigma_x2", train.log_sigma_x2().unwrap().into_data()),
        ("loss", loss.loss.into_data()),
        ("l1_loss", loss.l1_loss.into_data()),
        ("kld_loss", loss.kld_loss.expect("VAE pass has a KL term").into_data()),
    ];
    let mut worst = 0f32;
    let mut failures = Vec::new();
    for (name, data) in got {
        let want = &outputs[name];
        assert_eq!(data.shape, want.shape, "{name}: shape");
        let (rel, abs) = errors(name, data, want);
        println!("act parity {name:>18}: max rel error (to scale) {rel:.2e}; max abs {abs:.2e}");
        worst = worst.max(rel);
        failures.extend((rel > 1e-4).then(|| format!("{name}: max relative error {rel:e} > 1e-4")));
    }
    println!("act parity worst (to scale): {worst:.2e}");
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn parameter_names_match_the_lerobot_state_dict() {
    let Some(shared) = shared_dir() else { return };
    let file = shared.join("oracle/act_small/pretrained_model");
    let reference = read_safetensors(&file.join("model.safetensors")).unwrap();
    let cfg = ActConfig::from_json_file(&file.join("config.json")).unwrap();
    let model = cfg.init::<B>(&Default::default());
    let ours = param_shapes::<B, _>(&model);
    let mut names: Vec<_> = ours.iter().map(|(k, _)| format!("model.{k}")).collect();
    names.sort();
    let theirs: Vec<_> = reference.keys().cloned().collect();
    assert_eq!(names.len(), 186);
    assert_eq!(names, theirs);
    for (k, shape) in ours {
        assert_eq!(reference[&format!("model.{k}")].shape.to_vec(), shape, "{k}");
    }
}

fn aloha(use_vae: bool) -> ActConfig {
    ActConfig { use_vae, ..ActConfig::default() }
        .with_robot_state(14)
        .with_camera("observation.images.top", [3, 480, 640])
        .with_action(14)
}

#[test]
fn parameter_counts_default_and_no_vae() {
    let default = aloha(true);
    assert_eq!(default.num_params(), 51_613_582);
    assert_eq!(aloha(false).num_params(), 34_232_142);
    // Parts as lerobot reports them.
    let bb = default.backbone_config().unwrap();
    assert_eq!(bb.num_parameters(), 11_166_912);

    let t0 = Instant::now();
    let model = default.init::<B>(&Default::default());
    let secs = t0.elapsed().as_secs_f64();
    println!("default ACT (51.6M) instantiated in {secs:.2} s");
    assert_eq!(model.num_parameters(), 51_613_582);
    assert_eq!(model.num_buffer_elements(), default.num_buffer_elements());
    assert_eq!(model.num_params(), 51_613_582 + default.num_buffer_elements(), "Burn counts buffers too");
    assert_eq!(model.backbone.as_ref().unwrap().num_parameters(), 11_166_912);
    assert_eq!(model.vae_encoder.as_ref().unwrap().num_params(), 17_332_736);
    assert_eq!(model.encoder.num_params(), 17_332_736);
    assert_eq!(model.decoder.num_params(), 5_385_856);
    drop(model);
    let model = aloha(false).init::<B>(&Default::default());
    assert_eq!(model.num_parameters(), 34_232_142);
}

/// A small config with every input kind.
fn small(pre_norm: bool, env: bool) -> ActConfig {
    let mut c = ActConfig {
        chunk_size: 5,
        n_action_steps: 5,
        dim_model: 32,
        n_heads: 4,
        dim_feedforward: 64,
        n_encoder_layers: 2,
        n_decoder_layers: 2,
        n_vae_encoder_layers: 2,
        latent_dim: 4,
        dropout: 0.1,
        pre_norm,
        ..ActConfig::default()
    }
    .with_robot_state(3)
    .with_camera("observation.images.top", [3, 64, 64])
    .with_action(3);
    if env {
        c = c.with_env_state(2);
    }
    c
}

fn small_batch<Bk: Backend>(cfg: &ActConfig, b: usize, dev: &Bk::Device) -> ActBatch<Bk> {
    let [_, h, w] = cfg.image_features()[0].1;
    let n = |shape: Vec<usize>| Tensor::<Bk, 1>::random([shape.iter().product::<usize>()], Distribution::Normal(0.0, 1.0), dev);
    let mut pad = vec![false; b * cfg.chunk_size];
    pad[cfg.chunk_size - 2..cfg.chunk_size].iter_mut().for_each(|p| *p = true);
    ActBatch {
        state: cfg.robot_state_dim().map(|s| n(vec![b, s]).reshape([b, s])),
        env_state: cfg.env_state_dim().map(|e| n(vec![b, e]).reshape([b, e])),
        images: vec![n(vec![b, 3, h, w]).reshape([b, 3, h, w])],
        action: Some(n(vec![b, cfg.chunk_size, cfg.action_dim()]).reshape([b, cfg.chunk_size, cfg.action_dim()])),
        action_is_pad: Some(Tensor::from_data(TensorData::new(pad, [b, cfg.chunk_size]), dev)),
    }
}

#[test]
fn closed_form_counts_match_instantiated_variants() {
    let dev = Default::default();
    for (pre_norm, env) in [(false, false), (true, false), (false, true), (true, true)] {
        let cfg = small(pre_norm, env);
        let m = cfg.init::<B>(&dev);
        assert_eq!(m.num_parameters(), cfg.num_params(), "pre_norm {pre_norm} env {env}");
        assert_eq!(m.num_buffer_elements(), cfg.num_buffer_elements());
        let names: Vec<String> = param_shapes::<B, _>(&m).into_iter().map(|(k, _)| k).collect();
        assert_eq!(names.iter().any(|k| k == "encoder.norm.weight"), pre_norm);
        assert_eq!(names.iter().any(|k| k == "vae_encoder.norm.weight"), pre_norm);
        assert_eq!(names.iter().any(|k| k == "encoder_env_state_input_proj.weight"), env);
        assert!(names.iter().any(|k| k == "decoder.norm.weight"));
    }
    let no_vae = ActConfig { use_vae: false, ..small(false, false) };
    let m = no_vae.init::<B>(&dev);
    assert_eq!(m.num_parameters(), no_vae.num_params());
    assert!(m.vae_encoder_pos_enc.is_none());
    // Env-state only: no backbone.
    let env_only = ActConfig { input_features: Default::default(), ..small(false, false) }.with_env_state(4).with_robot_state(3);
    let m = env_only.init::<B>(&dev);
    assert!(m.backbone.is_none());
    assert_eq!(m.num_parameters(), env_only.num_params());
    let batch = ActBatch { images: vec![], env_state: Some(Tensor::<B, 2>::ones([2, 4], &dev)), ..small_batch::<B>(&small(false, false), 2, &dev) };
    let out = m.forward(&batch, &ActCtx::train(Precision::F32));
    assert_eq!(out.actions.dims(), [2, 5, 3]);
}

#[test]
fn stage_plan_runs_like_forward_and_pre_norm_runs() {
    let dev = Default::default();
    for pre_norm in [false, true] {
        let cfg = small(pre_norm, true);
        let model = cfg.init::<B>(&dev);
        let batch = small_batch::<B>(&cfg, 2, &dev);
        let eps = Tensor::<B, 2>::random([2, cfg.latent_dim], Distribution::Normal(0.0, 1.0), &dev);
        let ctx = ActCtx::train(Precision::F32).with_eps(eps.clone()).with_dropout(11);
        let out = model.forward(&batch, &ctx);

        // The plan: VAE, backbone (the trunk's own stages), encoder, decoder, head.
        let input = ActInput { batch: batch.clone(), ctx };
        let plan = model.plan(&input);
        let bb = model.backbone.as_ref().unwrap().stages();
        let expect: Vec<ActStage> = [ActStage::VaeInput, ActStage::VaeLayer(0), ActStage::VaeLayer(1), ActStage::VaePosterior]
            .into_iter()
            .chain(bb.iter().map(|s| ActStage::Backbone(*s)))
            .chain([ActStage::EncoderInput, ActStage::EncoderLayer(0), ActStage::EncoderLayer(1), ActStage::DecoderInput])
            .chain([ActStage::DecoderLayer(0), ActStage::DecoderLayer(1), ActStage::ActionHead])
            .collect();
        assert_eq!(plan, expect);
        assert_eq!(bb.len(), 5, "stem + layer1..layer4");
        // Stage by stage through the public API: the states have the documented shapes.
        let mut state = model.enter(&input);
        for s in plan {
            state = model.stage(s, state, &input);
            match (&s, &state) {
                (ActStage::EncoderInput, ActState::Encoder { tokens, pos, posterior: Some(_) }) => {
                    assert_eq!(tokens.dims(), [2, cfg.encoder_seq_len(), 32]);
                    assert_eq!(pos.dims(), [1, cfg.encoder_seq_len(), 32]);
                }
                (ActStage::Backbone(_), ActState::Backbone { features, posterior: Some(_) }) => assert_eq!(features.len(), 1),
                (ActStage::EncoderInput | ActStage::Backbone(_), other) => panic!("unexpected state {other:?}"),
                _ => {}
            }
        }
        let staged = model.exit(state, &input);
        assert_eq!(staged.actions.into_data(), out.actions.clone().into_data(), "pre_norm {pre_norm}");
        assert_eq!(staged.posterior.unwrap().into_data(), out.posterior.clone().unwrap().into_data());
        let loss = model.loss(&out, batch.action.clone().unwrap(), batch.action_is_pad.clone()).loss.into_scalar();
        assert!(loss.is_finite());
        // Eval: no VAE stages, z = 0.
        let eval = ActInput { batch: batch.clone(), ctx: ActCtx::eval(Precision::F32) };
        assert_eq!(model.plan(&eval)[0], ActStage::Backbone(bb[0]));
        assert!(model.run(&eval).posterior.is_none());
    }
}

#[test]
fn dropout_is_deterministic_and_only_in_training() {
    let dev = Default::default();
    let cfg = small(false, false);
    let model = cfg.init::<B>(&dev);
    let batch = small_batch::<B>(&cfg, 2, &dev);
    let run = |ctx: ActCtx<B>| model.forward(&batch, &ctx).actions.into_data();
    let a = run(ActCtx::train(Precision::F32).with_dropout(1));
    assert_eq!(a, run(ActCtx::train(Precision::F32).with_dropout(1)), "same seed, same masks");
    assert_ne!(a, run(ActCtx::train(Precision::F32).with_dropout(2)));
    let plain = run(ActCtx::train(Precision::F32));
    assert_ne!(a, plain, "dropout changes the output");
    // Eval ignores a dropout context; a rate of 0 ignores it too.
    let eval = run(ActCtx::eval(Precision::F32));
    let mut eval_ctx = ActCtx::eval(Precision::F32);
    eval_ctx.dropout = Some(vramlab_models::nn::DropoutCtx::new(1));
    assert_eq!(eval, run(eval_ctx));
    let zero = ActConfig { dropout: 0.0, ..cfg }.init::<B>(&dev);
    let x = zero.forward(&batch, &ActCtx::train(Precision::F32)).actions.into_data();
    assert_eq!(x, zero.forward(&batch, &ActCtx::train(Precision::F32).with_dropout(5)).actions.into_data());
}

#[test]
fn bf16_forward_is_close_to_f32() {
    let Some(shared) = shared_dir() else {
        return bf16_close(small(false, false).init::<B>(&Default::default()), small_batch::<B>(&small(false, false), 2, &Default::default()));
    };
    // Realistic weights: the fixture's.
    let fx = shared.join("oracle/act_small");
    let dev = Default::default();
    let (_, model) = load_pretrained::<B>(&fx.join("pretrained_model"), &dev).unwrap();
    let inputs = read_safetensors(&fx.join("inputs.safetensors")).unwrap();
    bf16_close(model, fixture_batch(&inputs, &dev));
}

fn bf16_close(model: Act<B>, batch: ActBatch<B>) {
    for training in [false, true] {
        let ctx = |p| if training { ActCtx::train(p) } else { ActCtx::eval(p) };
        let f32_out = model.forward(&batch, &ctx(Precision::F32));
        let bf_out = model.forward(&batch, &ctx(Precision::Bf16));
        assert_eq!(bf_out.actions.dtype(), DType::F32, "actions are returned in f32");
        let scale = f32_out.actions.clone().abs().max().into_scalar();
        let err = (bf_out.actions.clone() - f32_out.actions.clone()).abs().max().into_scalar();
        println!("bf16 vs f32 actions (training {training}): max abs err {err:.3e} (scale {scale:.3e})");
        assert!(err <= 0.1 * scale + 1e-2, "bf16 max abs error {err} vs scale {scale}");
        if training {
            let mu = f32_out.mu().unwrap();
            let e = (bf_out.mu().unwrap() - mu.clone()).abs().max().into_scalar();
            let s = mu.abs().max().into_scalar();
            println!("bf16 vs f32 mu: max abs err {e:.3e} (scale {s:.3e})");
            assert!(e <= 0.1 * s + 1e-2);
            let action = batch.action.clone().unwrap();
            let l32 = model.loss(&f32_out, action.clone(), batch.action_is_pad.clone()).loss.into_scalar();
            let l16 = model.loss(&bf_out, action, batch.action_is_pad.clone()).loss.into_scalar();
            assert!((l16 - l32).abs() <= 0.05 * l32.abs() + 1e-3, "loss {l16} vs {l32}");
        }
    }
}

#[test]
fn gradients_flow_and_frozen_parts_get_none() {
    type A = Autodiff<Flex>;
    let dev = Default::default();
    for freeze in [false, true] {
        let cfg = ActConfig { freeze_backbone: freeze, dropout: 0.1, ..small(false, false) };
        let model = cfg.init::<A>(&dev);
        let batch = small_batch::<A>(&cfg, 2, &dev);
        let eps = Tensor::<A, 2>::random([2, cfg.latent_dim], Distribution::Normal(0.0, 1.0), &dev);
        let ctx = ActCtx::train(Precision::Bf16).with_eps(eps).with_dropout(3);
        let out = model.forward(&batch, &ctx);
        let loss = model.loss(&out, batch.action.clone().unwrap(), batch.action_is_pad.clone());
        assert_eq!(loss.loss.dtype(), DType::F32);
        let grads = loss.loss.backward();
        let (with, without) = grad_presence(&model, &grads);
        let is_buffer = |k: &str| k == "vae_encoder_pos_enc" || k.contains("bn") || k.contains("downsample.1.");
        for k in &without {
            let frozen_ok = freeze && k.starts_with("backbone.");
            assert!(is_buffer(k) || frozen_ok, "{k}: no gradient (freeze_backbone {freeze})");
        }
        for k in &with {
            assert!(!is_buffer(k), "{k}: a buffer got a gradient");
            assert!(!(freeze && k.starts_with("backbone.")), "{k}: frozen backbone got a gradient");
        }
        assert_eq!(with.iter().any(|k| k == "backbone.conv1.weight"), !freeze);
        assert!(with.iter().any(|k| k == "vae_encoder.layers.0.self_attn.in_proj_weight"));
        assert!(with.iter().any(|k| k == "encoder_img_feat_input_proj.weight"));
        assert!(with.iter().any(|k| k == "decoder_pos_embed.weight"));
        println!("freeze_backbone {freeze}: {} tensors with gradient, {} without", with.len(), without.len());
    }

    // from_inner leaves everything untracked; set_trainable restores the rules.
    let cfg = ActConfig { freeze_backbone: true, ..small(false, false) };
    let inner = cfg.init::<Flex>(&dev);
    let model = <Act<A> as burn::module::AutodiffModule<A>>::from_inner(inner).set_trainable();
    let batch = small_batch::<A>(&cfg, 1, &dev);
    let out = model.forward(&batch, &ActCtx::train(Precision::F32));
    let grads = model.loss(&out, batch.action.clone().unwrap(), None).loss.backward();
    let (with, _) = grad_presence(&model, &grads);
    assert!(with.iter().all(|k| !k.starts_with("backbone.") && k != "vae_encoder_pos_enc"));
    assert!(with.iter().any(|k| k == "action_head.weight"));
    assert!(is_act_buffer("Struct:Act", "vae_encoder_pos_enc"));
}

#[test]
fn save_then_load_round_trips_with_lerobot_names() {
    let dev = Default::default();
    let cfg = ActConfig { freeze_backbone: true, ..small(false, true) };
    let model = cfg.init::<B>(&dev);
    let batch = small_batch::<B>(&cfg, 2, &dev);
    let dir = vramlab_testkit::temp_dir("act-roundtrip");
    save_pretrained(&cfg, &model, &dir).unwrap();
    let keys = read_safetensors(&dir.join("model.safetensors")).unwrap();
    assert!(keys.keys().all(|k| k.starts_with("model.")), "lerobot names");
    assert!(keys.contains_key("model.backbone.layer1.0.bn1.running_mean"));
    assert!(keys.contains_key("model.vae_encoder_pos_enc"));
    let (cfg2, model2) = load_pretrained::<B>(&dir, &dev).unwrap();
    assert_eq!(cfg2, cfg);
    let a = model.forward(&batch, &ActCtx::eval(Precision::F32)).actions.into_data();
    let b = model2.forward(&batch, &ActCtx::eval(Precision::F32)).actions.into_data();
    assert_eq!(a, b);

    // A runner on the loaded model: the queue serves n_action_steps actions per chunk.
    let mut runner = ActPolicyRunner::new(&cfg2);
    let obs = ActBatch { action: None, action_is_pad: None, ..batch.clone() };
    let first = runner.select_action(&model2, &obs, Precision::F32);
    assert_eq!(first.dims(), [2, 3]);
    assert_eq!(runner.queued(), cfg.n_action_steps - 1);

    // Errors name the file and the key / field.
    let other = ActConfig { dim_model: 16, n_heads: 2, ..cfg.clone() };
    std::fs::write(dir.join("config.json"), other.to_json_string()).unwrap();
    let e = load_pretrained::<B>(&dir, &dev).err().unwrap().to_string();
    assert!(e.contains("model.safetensors") && e.contains("model."), "{e}");
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let e = load_pretrained::<B>(&dir, &dev).err().unwrap().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
    std::fs::write(dir.join("config.json"), r#"{"type": "act", "chunk_sise": 4}"#).unwrap();
    let e = load_pretrained::<B>(&dir, &dev).err().unwrap().to_string();
    assert!(e.contains("config.json") && e.contains("chunk_sise"), "{e}");
}
