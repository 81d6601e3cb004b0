//! ACT (lerobot) as a vramlab workload: config resolution from flags, info, predict.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, anyhow, bail};
use burn::prelude::*;
use serde_json::Value;
use vramlab_models::act::{Act, ActBatch, ActConfig, ActCtx, is_act_buffer};
use vramlab_models::nn::Precision;
use vramlab_models::resnet::count_params_and_buffers;

/// vramlab's shorthand for the features when no dataset defines them (lerobot takes them from
/// the dataset): robot state / action sizes and the cameras. Defaults: ALOHA-like, 14-dim
/// state and action, one 480×640 camera.
const FEATURE_KEYS: [&str; 4] = ["state_dim", "action_dim", "camera_shape", "num_cameras"];

pub fn resolve_config(policy: &serde_json::Map<String, Value>) -> Result<ActConfig> {
    let mut fields = serde_json::Map::new();
    let mut feat = BTreeMap::new();
    for (k, v) in policy {
        match k.as_str() {
            "type" => {}
            k if FEATURE_KEYS.contains(&k) => {
                feat.insert(k.to_string(), v.clone());
            }
            _ => {
                fields.insert(k.clone(), v.clone());
            }
        }
    }
    let mut cfg: ActConfig = serde_json::from_value(Value::Object(fields)).map_err(|e| anyhow!("policy (act): {e}"))?;
    let uint = |k: &str, d: usize| -> Result<usize> {
        match feat.get(k) {
            None => Ok(d),
            Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| anyhow!("policy.{k}: expected a non-negative integer, found {v}")),
        }
    };
    let state = uint("state_dim", 14)?;
    let action = uint("action_dim", 14)?;
    let cams = uint("num_cameras", 1)?;
    let shape: [usize; 3] = match feat.get("camera_shape") {
        None => [3, 480, 640],
        Some(v) => serde_json::from_value::<Vec<usize>>(v.clone())
            .ok()
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| anyhow!("policy.camera_shape: expected C,H,W, found {v}"))?,
    };
    if state > 0 {
        cfg = cfg.with_robot_state(state);
    }
    for i in 0..cams {
        let key = if cams == 1 { "observation.images.top".to_string() } else { format!("observation.images.cam{i}") };
        cfg = cfg.with_camera(&key, shape);
    }
    cfg = cfg.with_action(action);
    cfg.validate().map_err(|e| anyhow!("policy (act): {e}"))?;
    Ok(cfg)
}

/// Parameter rows for `vramlab info`: (module, parameters, trainable).
pub fn info_rows<B: Backend>(model: &Act<B>) -> Vec<(String, u64, u64)> {
    let count = |m: &dyn Fn() -> (usize, usize)| m().0 as u64;
    let backbone = model.backbone.as_ref().map_or(0, |b| count(&|| count_params_and_buffers::<B, _>(b, is_act_buffer)));
    let vae = model.vae_encoder.as_ref().map_or(0, |e| count(&|| count_params_and_buffers::<B, _>(e, is_act_buffer)));
    let enc = count(&|| count_params_and_buffers::<B, _>(&model.encoder, is_act_buffer));
    let dec = count(&|| count_params_and_buffers::<B, _>(&model.decoder, is_act_buffer));
    let total = model.num_parameters() as u64;
    let frozen = model.config.freeze_backbone;
    vec![
        ("backbone".into(), backbone, if frozen { 0 } else { backbone }),
        ("vae_encoder".into(), vae, vae),
        ("encoder".into(), enc, enc),
        ("decoder".into(), dec, dec),
        ("projections + embeddings".into(), total - backbone - vae - enc - dec, total - backbone - vae - enc - dec),
    ]
}

fn input<B: Backend, const D: usize>(map: &BTreeMap<String, TensorData>, file: &Path, name: &str, device: &B::Device) -> Result<Tensor<B, D>> {
    let data = map.get(name).ok_or_else(|| {
        anyhow!("{}: tensor `{name}` is missing (present: {})", file.display(), map.keys().cloned().collect::<Vec<_>>().join(", "))
    })?;
    if data.shape.len() != D {
        bail!("{}: tensor `{name}` has shape {:?}; expected rank {D}", file.display(), data.shape);
    }
    Ok(Tensor::from_data(data.clone().convert::<f32>(), device))
}

/// `vramlab predict` for a lerobot (or vramlab) ACT `pretrained_model/` directory, with the
/// fixture's tensor names: `eval_actions` (z = 0), and with actions given, the training pass
/// with the VAE noise set to 0 (`train_actions_z_mu`, `vae_mu`, `vae_log_sigma_x2`, `loss`,
/// `l1_loss`, `kld_loss`).
pub fn predict<B: Backend>(dir: &Path, inputs: &Path, precision: Precision, device: &B::Device) -> Result<Vec<(String, TensorData)>> {
    let (cfg, model) = vramlab_models::act::load_pretrained::<B>(dir, device).map_err(|e| anyhow!(e))?;
    let map = vramlab_store::read_safetensors(inputs)?;
    let state = match cfg.robot_state_dim() {
        Some(_) => Some(input::<B, 2>(&map, inputs, "observation.state", device)?),
        None => None,
    };
    let env_state = match cfg.env_state() {
        Some((key, _)) => Some(input::<B, 2>(&map, inputs, key, device)?),
        None => None,
    };
    let images = cfg.image_features().iter().map(|(k, _)| input::<B, 4>(&map, inputs, k, device)).collect::<Result<Vec<_>>>()?;
    let action = match map.contains_key("action") {
        true => Some(input::<B, 3>(&map, inputs, "action", device)?),
        false => None,
    };
    let action_is_pad = match map.get("action_is_pad") {
        Some(d) => Some(Tensor::<B, 2, Bool>::from_data(d.clone(), device)),
        None => None,
    };
    let mut batch = ActBatch { state, env_state, images, action: None, action_is_pad: None };
    let mut out = vec![("eval_actions".to_string(), model.forward(&batch, &ActCtx::eval(precision)).actions.into_data())];
    if let Some(action) = action {
        batch.action = Some(action.clone());
        batch.action_is_pad = action_is_pad.clone();
        let o = model.forward(&batch, &ActCtx::train(precision));
        let loss = model.loss(&o, action, action_is_pad);
        out.push(("train_actions_z_mu".into(), o.actions.into_data()));
        if let (Some(mu), Some(ls)) = (o.mu, o.log_sigma_x2) {
            out.push(("vae_mu".into(), mu.into_data()));
            out.push(("vae_log_sigma_x2".into(), ls.into_data()));
        }
        out.push(("loss".into(), loss.loss.into_data()));
        out.push(("l1_loss".into(), loss.l1_loss.into_data()));
        if let Some(k) = loss.kld_loss {
            out.push(("kld_loss".into(), k.into_data()));
        }
    }
    Ok(out)
}
