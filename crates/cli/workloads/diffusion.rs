//! Diffusion Policy (lerobot) in the CLI: config from flags, info, predict.

use std::path::Path;

use anyhow::{Result, anyhow};
use burn::prelude::*;
use serde_json::Value;
use vramlab_models::diffusion::{DiffusionBatch, DiffusionConfig, DiffusionCtx};
use vramlab_models::nn::Precision;

/// Features when no dataset defines them: PushT (state 2, action 2, one 96×96 camera).
const FEATURE_KEYS: [&str; 3] = ["state_dim", "action_dim", "camera_shape"];

pub fn resolve_config(policy: &serde_json::Map<String, Value>) -> Result<DiffusionConfig> {
    let (mut fields, feat) = crate::workloads::split_policy(policy, &FEATURE_KEYS);
    // PushT's crop unless the flags say otherwise (lerobot's own default is no crop).
    fields.entry("crop_shape").or_insert(serde_json::json!([84, 84]));
    let mut cfg: DiffusionConfig = serde_json::from_value(Value::Object(fields)).map_err(|e| anyhow!("policy (diffusion): {e}"))?;
    use crate::workloads::{camera_shape, feature_uint};
    let shape = camera_shape(&feat, "camera_shape", [3, 96, 96])?;
    cfg = cfg
        .with_robot_state(feature_uint(&feat, "state_dim", 2)?)
        .with_camera("observation.image", shape)
        .with_action(feature_uint(&feat, "action_dim", 2)?);
    cfg.validate().map_err(|e| anyhow!("policy (diffusion): {e}"))?;
    Ok(cfg)
}

/// `vramlab predict` for a lerobot Diffusion `pretrained_model/` dir with the fixture's names:
/// `global_cond`; with `x_t` + `timesteps`, `unet_eps`; with `initial_noise`, `ddim_actions`
/// (the configured scheduler's sampling, DDIM in the fixture).
pub fn predict<B: Backend>(dir: &Path, inputs: &Path, precision: Precision, device: &B::Device) -> Result<Vec<(String, TensorData)>> {
    let (cfg, model) = vramlab_models::diffusion::load_pretrained::<B>(dir, device).map_err(|e| anyhow!(e))?;
    let map = vramlab_store::read_safetensors(inputs)?;
    let state = crate::workloads::input_tensor::<B, 3>(&map, inputs, "observation.state", device)?;
    let images = cfg.image_features().iter().map(|(k, _)| crate::workloads::input_tensor::<B, 5>(&map, inputs, k, device)).collect::<Result<Vec<_>>>()?;
    let batch = DiffusionBatch { state, images, env_state: None, action: None, action_is_pad: None };
    let ctx = DiffusionCtx::eval(precision);
    let cond = model.prepare_global_conditioning(&batch, &ctx);
    let mut out = vec![("global_cond".to_string(), cond.clone().into_data())];
    if let (Some(x), Some(t)) = (map.get("x_t"), map.get("timesteps")) {
        let x = Tensor::<B, 3>::from_data(x.clone().convert::<f32>(), device);
        let t: Vec<usize> = t.clone().convert::<i64>().to_vec::<i64>().map_err(|e| anyhow!("{}: timesteps: {e:?}", inputs.display()))?.into_iter().map(|v| v.max(0) as usize).collect();
        out.push(("unet_eps".into(), model.unet.forward(x, &t, cond.clone(), precision).into_data()));
    }
    if map.contains_key("initial_noise") {
        let noise = crate::workloads::input_tensor::<B, 3>(&map, inputs, "initial_noise", device)?;
        // DDPM draws fresh noise per step: predict is deterministic only for DDIM.
        let actions = model.generate_actions(&batch, noise, |_| None, &ctx);
        out.push(("ddim_actions".into(), actions.into_data()));
    }
    Ok(out)
}
