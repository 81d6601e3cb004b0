//! Parity of vramlab's 3D VAE with the 4D-Radar reference (`cm/vae_3d.py` @ 08c7eb9), on the
//! `../shared/oracle/vae3d_ultra` fixture written by PyTorch, plus model-level checks that need
//! no fixture (parameter counts, stage chain, mixed precision, gradients, checkpoint I/O).

mod common;


use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::prelude::*;
use burn::tensor::{DType, Distribution, TensorData};
use vramlab_models::nn::Precision;
use vramlab_models::stages::Staged;
use vramlab_models::vae3d::{Vae3d, Vae3dConfig, Vae3dInput, Vae3dStage, Vae3dState, load_pretrained, save_pretrained};
use vramlab_models::weights::{param_shapes, read_safetensors};

use common::*;

type B = Flex;

#[test]
fn parity_with_reference_ultra_lightweight() {
    let Some(shared) = shared_dir() else { return };
    let fx = shared.join("oracle/vae3d_ultra");
    let dev = Default::default();
    let (cfg, model) = load_pretrained::<B>(&fx.join("pretrained_model"), &dev).expect("load reference checkpoint");
    assert_eq!(cfg, Vae3dConfig::preset("ultra_lightweight").unwrap(), "fixture config = ultra_lightweight preset");
    assert_eq!(model.num_params(), 694_788);

    let inputs = read_safetensors(&fx.join("inputs.safetensors")).unwrap();
    let outputs = read_safetensors(&fx.join("outputs.safetensors")).unwrap();
    let x = Tensor::<B, 5>::from_data(inputs["x"].clone(), &dev);

    let out = model.forward(x.clone(), None, Precision::F32);
    let loss = model.compute_loss(x, &out);
    let got = [
        ("mean", out.mean().into_data()),
        ("logvar", out.logvar().into_data()),
        ("recon", out.recon.into_data()),
        ("loss", loss.loss.into_data()),
        ("recon_loss", loss.recon_loss.into_data()),
        ("kl_loss", loss.kl_loss.into_data()),
    ];
    let mut worst = 0f32;
    let mut failures = Vec::new();
    for (name, data) in got {
        let want = &outputs[name];
        // The reference's scalar losses are 0-d tensors; ours are [1].
        let data = if want.shape.is_empty() { TensorData::new(data.convert::<f32>().to_vec::<f32>().unwrap(), Vec::<usize>::new()) } else { data };
        assert_eq!(data.shape, want.shape, "{name}: shape");
        let (got, want) = (data.convert::<f32>().to_vec::<f32>().unwrap(), want.clone().convert::<f32>().to_vec::<f32>().unwrap());
        // Asserted: max |a − b| / max |b| (relative to the tensor's scale). Reported only: the
        // element-wise relative error with a floor of 1e-3 · max |b|; this network amplifies f32
        // rounding (perturbing the input by 1e-7 relative moves recon by ~1e-5 absolute), so
        // near-zero elements reach ~1e-3 there even between two f32 implementations.
        let d = vramlab_testkit::diff(name, &got, &want);
        let elem = vramlab_testkit::elementwise_rel(name, &got, &want, 1e-3);
        println!("vae3d parity {name:>10}: max rel error (to scale) {:.2e}; element-wise (floor 1e-3·max) {:.2e}; max abs {:.2e}", d.rel, elem, d.abs);
        worst = worst.max(d.rel);
        failures.extend((d.rel > 1e-4).then(|| format!("{name}: max relative error {:e} > 1e-4", d.rel)));
    }
    println!("vae3d parity worst (to scale): {worst:.2e}");
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn parameter_names_match_the_reference_state_dict() {
    let Some(shared) = shared_dir() else { return };
    let file = shared.join("oracle/vae3d_ultra/pretrained_model/model.safetensors");
    let reference = read_safetensors(&file).unwrap();
    let model = Vae3dConfig::preset("ultra_lightweight").unwrap().init::<B>(&Default::default());
    let ours = param_shapes::<B, _>(&model);
    let mut names: Vec<_> = ours.iter().map(|(k, _)| k.clone()).collect();
    names.sort();
    let theirs: Vec<_> = reference.keys().cloned().collect();
    assert_eq!(names, theirs);
    for (k, shape) in ours {
        assert_eq!(reference[&k].shape.to_vec(), shape, "{k}");
    }
}

#[test]
fn parameter_counts_of_all_presets() {
    let dev = Default::default();
    for (name, expect) in [("ultra_lightweight", 694_788), ("lightweight", 2_717_716), ("base32", 7_652_628), ("standard", 40_847_092)] {
        let cfg = Vae3dConfig::preset(name).unwrap();
        assert_eq!(cfg.num_params(), expect, "{name}: closed form");
        assert_eq!(cfg.init::<B>(&dev).num_params(), expect, "{name}: instantiated");
    }
}

#[test]
fn lightweight_48_channels_builds_with_24_groups() {
    // The reference's own `lightweight` preset asks GroupNorm(32, 48), which PyTorch rejects;
    // vramlab uses 24 groups (the largest divisor of 48 that is <= 32).
    let model = Vae3dConfig::preset("lightweight").unwrap().init::<B>(&Default::default());
    let norm = &model.encoder.norm_out;
    assert_eq!(norm.weight.dims(), [72]);
    assert_eq!(norm.num_groups, 24);
}

fn small_model() -> (Vae3d<B>, Tensor<B, 5>) {
    let dev = Default::default();
    // Fewer surprises from run to run (tests in this binary share the backend RNG, so this
    // is not a full guarantee; the assertions below leave a wide margin for that).
    <B as burn::tensor::backend::Backend>::seed(&dev, 20261121);
    let model = Vae3dConfig::preset("ultra_lightweight").unwrap().init::<B>(&dev);
    // Sparse occupancy in channel 0 (as in the radar data) so every loss term is active.
    let occ = Tensor::<B, 5>::random([2, 1, 4, 16, 16], Distribution::Uniform(0.0, 1.0), &dev).greater_elem(0.9).float();
    let feats = Tensor::<B, 5>::random([2, 3, 4, 16, 16], Distribution::Normal(0.0, 1.0), &dev) * occ.clone();
    (model, Tensor::cat(vec![occ, feats], 1))
}

#[test]
fn stage_plan_runs_like_forward_and_encode_decode_agree() {
    let (model, x) = small_model();
    let eps = Tensor::<B, 5>::random([2, 4, 2, 4, 4], Distribution::Normal(0.0, 1.0), &x.device());
    for eps in [None, Some(eps)] {
        let out = model.forward(x.clone(), eps.clone(), Precision::F32);
        let input = Vae3dInput { x: x.clone(), eps: eps.clone(), precision: Precision::F32 };
        let plan = model.plan(&input);
        assert_eq!(plan.len(), 3 + 3 + 4, "3 encoder levels, 3 decoder levels, moments, latent, mid, out");
        let mut state = model.enter(&input);
        for s in plan {
            state = model.stage(s, state, &input);
            if s == Vae3dStage::Moments {
                let Vae3dState::Moments { moments } = &state else { panic!("{state:?}") };
                assert_eq!(moments.dims(), [2, 8, 2, 4, 4]);
            }
        }
        let staged = model.exit(state, &input);
        assert_eq!(staged.recon.into_data(), out.recon.clone().into_data(), "recon");
        assert_eq!(staged.moments.into_data(), out.moments.clone().into_data(), "moments");

        // encode / decode agree with the chain too (deterministic path).
        if eps.is_none() {
            let (mean, logvar) = model.encode(x.clone(), Precision::F32);
            assert_eq!(mean.clone().into_data(), out.mean().into_data());
            assert_eq!(logvar.into_data(), out.logvar().into_data());
            let z = burn::tensor::module::conv3d(
                mean,
                model.quant_conv.weight.val(),
                model.quant_conv.bias.as_ref().map(|b| b.val()),
                burn::tensor::ops::ConvOptions::new([1; 3], [0; 3], [1; 3], 1),
            );
            let recon = model.decode(z, Precision::F32);
            assert_eq!(recon.into_data(), out.recon.into_data());
        }
    }
}

#[test]
fn bf16_forward_is_close_to_f32() {
    let (model, x) = small_model();
    let f32_out = model.forward(x.clone(), None, Precision::F32);
    let bf16_out = model.forward(x.clone(), None, Precision::Bf16);
    for (name, a, b) in [("recon", bf16_out.recon.clone(), f32_out.recon.clone()), ("mean", bf16_out.mean(), f32_out.mean())] {
        assert_eq!(a.dtype(), DType::F32, "{name} is returned in f32");
        // bf16 keeps ~3 significant digits per op (measured here: RMS error ≈ 3–4% of the RMS
        // of recon through ~10 convs and GroupNorms): bound the typical (RMS) error and
        // the worst element loosely (the weights are random, so outliers vary run to run).
        let scale = b.clone().abs().max().into_scalar();
        let rms_ref = b.clone().square().mean().sqrt().into_scalar();
        let rms_err = (a.clone() - b.clone()).square().mean().sqrt().into_scalar();
        let err = (a - b).abs().max().into_scalar();
        println!("bf16 vs f32 {name}: rms err {rms_err:.3e} (rms {rms_ref:.3e}), max abs err {err:.3e} (scale {scale:.3e})");
        assert!(rms_err <= 0.08 * rms_ref + 1e-4, "{name}: bf16 rms error {rms_err} vs rms {rms_ref}");
        assert!(err <= 0.25 * scale + 1e-3, "{name}: bf16 max abs error {err} vs scale {scale}");
    }
    let l32 = model.compute_loss(x.clone(), &f32_out).loss.into_scalar();
    let l16 = model.compute_loss(x, &bf16_out).loss.into_scalar();
    assert!((l16 - l32).abs() <= 0.05 * l32.abs(), "loss {l16} vs {l32}");
}

#[test]
fn bf16_gradients_reach_f32_parameters() {
    type A = Autodiff<Flex>;
    let dev = Default::default();
    let model = Vae3dConfig::preset("ultra_lightweight").unwrap().init::<A>(&dev);
    let occ = Tensor::<A, 5>::random([1, 1, 2, 8, 8], Distribution::Uniform(0.0, 1.0), &dev).greater_elem(0.7).float();
    let x = Tensor::cat(vec![occ.clone(), occ.clone(), occ.clone() * 0.5, occ], 1);
    let eps = Tensor::<A, 5>::random([1, 4, 1, 2, 2], Distribution::Normal(0.0, 1.0), &dev);
    let out = model.forward(x.clone(), Some(eps), Precision::Bf16);
    let loss = model.compute_loss(x, &out).loss;
    assert_eq!(loss.dtype(), DType::F32);
    let grads = loss.backward();
    let checks = [
        ("encoder.conv_in.weight", model.encoder.conv_in.weight.val()),
        ("quant_conv.weight", model.quant_conv.weight.val()),
        ("decoder.conv_out.weight", model.decoder.conv_out.weight.val()),
    ];
    for (name, p) in checks {
        let g = p.grad(&grads).unwrap_or_else(|| panic!("{name}: no gradient"));
        assert_eq!(g.dtype(), DType::F32, "{name}: gradient dtype");
        let norm = g.abs().sum().into_scalar();
        assert!(norm.is_finite() && norm > 0.0, "{name}: gradient |g|₁ = {norm}");
    }
    let gn = model.encoder.norm_out.weight.val().grad(&grads).expect("norm_out.weight gradient");
    assert_eq!(gn.dtype(), DType::F32);
}

#[test]
fn save_then_load_round_trips() {
    let (model, x) = small_model();
    let cfg = model.config.clone();
    let dir = vramlab_testkit::temp_dir("vae3d-roundtrip");
    save_pretrained(&cfg, &model, &dir).unwrap();
    let (cfg2, model2) = load_pretrained::<B>(&dir, &x.device()).unwrap();
    assert_eq!(cfg2, cfg);
    let a = model.forward(x.clone(), None, Precision::F32).recon.into_data();
    let b = model2.forward(x, None, Precision::F32).recon.into_data();
    assert_eq!(a, b);

    // Errors name the file: a missing weight file, then an unknown config key.
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let e = load_pretrained::<B>(&dir, &Default::default()).err().unwrap().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
    std::fs::write(dir.join("config.json"), r#"{"type": "vae3d", "latent_dims": 4}"#).unwrap();
    let e = load_pretrained::<B>(&dir, &Default::default()).err().unwrap().to_string();
    assert!(e.contains("config.json") && e.contains("latent_dims"), "{e}");
}
