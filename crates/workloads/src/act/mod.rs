//! ACT (lerobot) as a vramlab workload: the config with its features, info rows, predict;
//! the training adapter is in [`train`].

pub mod train;

pub use train::{ActTrain, ActTrainBatch, features_of, to_batch, window};

use std::path::Path;

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use vramlab_models::act::{Act, ActBatch, ActConfig, ActCtx, is_act_buffer};
use vramlab_models::nn::Precision;
use vramlab_models::policy::InvalidField;
use vramlab_models::resnet::count_params_and_buffers;

use vramlab_train::trainer::BoxError;

use crate::config::RunConfig;
use crate::inputs::{Dim, Inputs};
use crate::policy::ActPolicy;
use crate::policy_data::{DataFeatures, PolicyDataSpec, PolicySource, norm_map, open_policy_data, policy_loader, random_source};
use crate::training::TrainSetup;
use crate::InfoReport;
use crate::{Result, WorkloadError};

/// A config value the model refuses, named as the flag that sets it.
fn invalid(e: InvalidField) -> WorkloadError {
    WorkloadError::invalid(&format!("policy.{}", e.field), e.msg)
}

impl ActPolicy {
    /// The config with the shorthand features (for random data). Defaults: ALOHA-like, 14-dim
    /// state and action, one 480×640 camera.
    pub fn resolve(&self) -> Result<ActConfig> {
        let f = &self.features;
        let (state, action) = (f.state_dim.unwrap_or(14), f.action_dim.unwrap_or(14));
        let (cams, shape) = (f.num_cameras.unwrap_or(1), f.camera_shape.unwrap_or([3, 480, 640]));
        let mut cfg = self.config.clone();
        if state > 0 {
            cfg = cfg.with_robot_state(state);
        }
        for i in 0..cams {
            let key = if cams == 1 { "observation.images.top".to_string() } else { format!("observation.images.cam{i}") };
            cfg = cfg.with_camera(&key, shape);
        }
        cfg = cfg.with_action(action);
        cfg.validate().map_err(invalid)?;
        Ok(cfg)
    }

    /// The config with the features of a dataset (lerobot takes the features from the dataset).
    pub fn resolve_for(&self, f: &DataFeatures) -> Result<ActConfig> {
        let mut cfg = self.config.clone();
        if let Some(d) = f.state_dim {
            cfg = cfg.with_robot_state(d);
        }
        for (k, s) in &f.cameras {
            cfg = cfg.with_camera(k, *s);
        }
        cfg = cfg.with_action(f.action_dim);
        cfg.validate().map_err(invalid)?;
        Ok(cfg)
    }
}

/// `vramlab info`: parameters per module (backbone, VAE encoder, encoder, decoder, the rest).
pub fn info<B: Backend>(ac: &ActConfig, device: &B::Device) -> Result<InfoReport> {
    let mut model = ac.init::<B>(device);
    if ac.freeze_backbone {
        model = model.with_frozen_backbone();
    }
    let cams: Vec<String> = ac.image_features().iter().map(|(k, s)| format!("{k} {s:?}")).collect();
    let title = format!(
        "act: chunk_size {}, dim_model {}, dim_feedforward {}, {} encoder / {} decoder / {} VAE layers, use_vae {}, state {:?}, action {}, cameras [{}]",
        ac.chunk_size,
        ac.dim_model,
        ac.dim_feedforward,
        ac.n_encoder_layers,
        ac.n_decoder_layers,
        ac.n_vae_encoder_layers,
        ac.use_vae,
        ac.robot_state_dim(),
        ac.action_dim(),
        cams.join(", ")
    );
    let notes = vec![format!("buffers (FrozenBatchNorm2d, positional tables; not parameters): {}", crate::thousands(model.num_buffer_elements() as u64))];
    Ok(InfoReport { title, rows: info_rows(&model), notes })
}

/// Parameter rows: (module, parameters, trainable).
fn info_rows<B: Backend>(model: &Act<B>) -> Vec<(String, u64, u64)> {
    let count = |m: &dyn Fn() -> (usize, usize)| m().0 as u64;
    let backbone = model.backbone.as_ref().map_or(0, |b| count(&|| count_params_and_buffers::<B, _>(b, is_act_buffer)));
    let vae = model.vae_encoder.as_ref().map_or(0, |e| count(&|| count_params_and_buffers::<B, _>(e, is_act_buffer)));
    let enc = count(&|| count_params_and_buffers::<B, _>(&model.encoder, is_act_buffer));
    let dec = count(&|| count_params_and_buffers::<B, _>(&model.decoder, is_act_buffer));
    let total = model.num_parameters() as u64;
    let frozen = model.config.freeze_backbone;
    let rest = total - backbone - vae - enc - dec;
    vec![
        ("backbone".into(), backbone, if frozen { 0 } else { backbone }),
        ("vae_encoder".into(), vae, vae),
        ("encoder".into(), enc, enc),
        ("decoder".into(), dec, dec),
        ("projections + embeddings".into(), rest, rest),
    ]
}

/// `vramlab predict` for a lerobot (or vramlab) ACT `pretrained_model/` directory, with the
/// fixture's tensor names: `eval_actions` (z = 0), and with actions given, the training pass
/// with the VAE noise set to 0 (`train_actions_z_mu`, `vae_mu`, `vae_log_sigma_x2`, `loss`,
/// `l1_loss`, `kld_loss`). Inputs are checked against the config first.
pub fn predict<B: Backend>(dir: &Path, inputs: &mut Inputs, precision: Precision, device: &B::Device) -> Result<Vec<(String, TensorData)>> {
    let (cfg, model) = vramlab_models::act::load_pretrained::<B>(dir, device)?;
    let b = Dim::Any("B");
    let state = match cfg.robot_state_dim() {
        Some(d) => Some(inputs.float::<B, 2>("observation.state", [b, Dim::Is(d)], device)?),
        None => None,
    };
    let env_state = match cfg.env_state() {
        Some((key, d)) => Some(inputs.float::<B, 2>(key, [b, Dim::Is(d)], device)?),
        None => None,
    };
    let images = cfg
        .image_features()
        .iter()
        .map(|(k, [c, h, w])| inputs.float::<B, 4>(k, [b, Dim::Is(*c), Dim::Is(*h), Dim::Is(*w)], device))
        .collect::<Result<Vec<_>>>()?;
    let chunk = [b, Dim::Is(cfg.chunk_size)];
    let action = inputs.float_opt::<B, 3>("action", [b, Dim::Is(cfg.chunk_size), Dim::Is(cfg.action_dim())], device)?;
    let action_is_pad = inputs.mask_opt::<B, 2>("action_is_pad", chunk, device)?;
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

/// The model, data and optimizer preset of an ACT run.
pub fn setup<'a, B: AutodiffBackend>(p: &ActPolicy, cfg: &RunConfig, device: &B::Device) -> Result<TrainSetup<'a, ActTrain<B>, ActTrainBatch<B>>> {
    let c = &p.config;
    let spec = PolicyDataSpec { window: window(c.chunk_size), delta: c.delta_indices(), norm_map: norm_map(&c.normalization_mapping)?, drop_n_last_frames: 0 };
    let (ac, source) = match open_policy_data(cfg, &spec)? {
        Some(data) => (p.resolve_for(data.features())?, PolicySource::LeRobot(Box::new(data))),
        None => {
            let ac = p.resolve()?;
            let source = random_source(cfg, spec.window, features_of(&ac));
            (ac, source)
        }
    };
    B::seed(device, cfg.seed);
    let mut model = ac.init::<B>(device);
    if ac.freeze_backbone {
        model = model.with_frozen_backbone();
    }
    let data_desc = source.describe();
    let mut loader = policy_loader(cfg, source);
    let (seed, dev) = (cfg.seed, device.clone());
    let acc = ac.clone();
    Ok(TrainSetup {
        policy: "act",
        model: ActTrain::<B> { act: model, precision: cfg.precision },
        // lerobot's layout, `"type": "act"` first, as on hub checkpoints.
        config_json: ac.to_json_string(),
        num_params: ac.num_params(),
        // The trainer sees the model under the wrapper's field `act`.
        optim: {
            let mut preset = ac.optimizer_preset();
            preset.backbone = preset.backbone.map(|g| g.under("act"));
            preset
        },
        data_desc,
        data: Box::new(move |step, micro| {
            let h = loader.get(step, micro).map_err(BoxError::from)?;
            Ok(to_batch::<B>(h, &acc, seed, step, micro, &dev))
        }),
    })
}
