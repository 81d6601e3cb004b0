//! ACT (lerobot) as a vramlab workload, with the entry points every model module has:
//! [`setup`] (model, data and optimizer preset of a run; the training adapter is in
//! [`train`]), [`info`], [`predict`] and [`estimate`]; and, as a robot policy,
//! [`bench_inference`] (its modes and `select_action` runner in `vramlab bench-inference`).
//! Its typed `policy` section is [`crate::config::ActPolicy`].

pub mod train;

pub use train::{ActTrain, ActTrainBatch, features_of, to_batch, window};

use vramlab_models::nn::LeanBackend;
use crate::backend::TrainBackend;
use std::path::Path;

use burn::prelude::*;
use vramlab_models::act::{Act, ActBatch, ActConfig, ActCtx, ActPolicyRunner, BackboneWeights, PolicyFeatures, is_act_buffer};
use vramlab_models::nn::Precision;
use vramlab_models::resnet::count_params_and_buffers;

use vramlab_train::trainer::BoxError;

use crate::config::{ActPolicy, RunConfig};
use crate::error::{Result, WorkloadError};
use crate::estimate::{Shapes, features_note};
use crate::inference::policy::{DeviceObs, PolicyIo, Processor, SelectAction, Stats};
use crate::inference::{self, BenchReport, BenchRequest, DEFAULT_ENSEMBLE_COEFF, Mode, ModeChoice};
use crate::inputs::{Dim, Inputs};
use crate::layout;
use crate::model_info::InfoReport;
use crate::policy_data::{PolicyDataSpec, PolicySource, dataset_features, norm_map, open_policy_data, policy_loader, random_source};
use crate::training::TrainSetup;

/// `vramlab info`: parameters per module (backbone, VAE encoder, encoder, decoder, the rest)
/// of the config with the shorthand features.
pub fn info<B: LeanBackend>(p: &ActPolicy, device: &B::Device) -> Result<InfoReport> {
    let ac = &p.resolve()?;
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
fn info_rows<B: LeanBackend>(model: &Act<B>) -> Vec<(String, u64, u64)> {
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
pub fn predict<B: LeanBackend>(dir: &Path, inputs: &mut Inputs, precision: Precision, device: &B::Device) -> Result<Vec<(String, TensorData)>> {
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
        out.push(("train_actions_z_mu".into(), o.actions.clone().into_data()));
        if let (Some(mu), Some(ls)) = (o.mu(), o.log_sigma_x2()) {
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

/// lerobot's `pretrained_backbone_weights` as a local torchvision state dict: loaded into the
/// backbone (lerobot loads torchvision's ImageNet weights there).
fn load_backbone_weights<B: LeanBackend>(mut model: Act<B>, path: &Path) -> Result<Act<B>> {
    if let Some(bb) = model.backbone.take() {
        let bb = vramlab_models::resnet::load_torchvision_weights(bb, path).map_err(|e| WorkloadError::invalid("policy.pretrained_backbone_weights", e.to_string()))?;
        model.backbone = Some(bb);
    }
    Ok(model)
}

/// The model, data and optimizer preset of an ACT run.
pub fn setup<'a, B: TrainBackend>(p: &ActPolicy, cfg: &RunConfig, device: &B::Device) -> Result<TrainSetup<'a, ActTrain<B>, ActTrainBatch<B>>> {
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
    if p.pretrained.is_none()
        && let BackboneWeights::File(path) = ac.backbone_weights()
    {
        model = load_backbone_weights(model, path)?;
    }
    if let Some(dir) = &p.pretrained {
        // lerobot's --policy.path: fine-tune from those weights (verified first).
        let dir = &layout::verified_pretrained_dir(dir, "policy.path")?;
        model = vramlab_models::act::load_weights(model, &dir.join(layout::WEIGHTS_FILE))?;
    }
    if ac.freeze_backbone {
        model = model.with_frozen_backbone();
    }
    let data_desc = source.describe();
    // torchvision reads weight names, not files: the checkpoint holds the loaded backbone, so
    // its config.json says null (lerobot can read it back).
    let saved = match ac.backbone_weights() {
        BackboneWeights::File(_) => ActConfig { pretrained_backbone_weights: None, ..ac.clone() },
        _ => ac.clone(),
    };
    let config_json = saved.to_json_string();
    let config_value: serde_json::Value = serde_json::from_str(&config_json).map_err(|e| WorkloadError::invalid("policy", format!("config.json: {e}")))?;
    let pretrained_files = crate::processors::files(&config_value, &source.stats())?;
    let mut loader = policy_loader(cfg, source);
    let (seed, dev) = (cfg.seed, device.clone());
    let acc = ac.clone();
    Ok(TrainSetup {
        policy: "act",
        model: ActTrain::<B> { act: model, precision: cfg.precision },
        // lerobot's layout, `"type": "act"` first, as on hub checkpoints.
        config_json,
        pretrained_files,
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

/// `vramlab estimate`: the training graph of the run's config (features from the dataset's
/// `meta/info.json`, or the shorthands), its batch and frozen bytes.
pub fn estimate(p: &ActPolicy, cfg: &RunConfig) -> Result<Shapes> {
    let data = dataset_features(cfg)?;
    let ac = match &data {
        Some(f) => p.resolve_for(f)?,
        None => p.resolve()?,
    };
    let (graph, batch_bytes, frozen) = vramlab_models::act::graph::training_graph(&ac, cfg.batch_size as usize, cfg.precision);
    Ok(Shapes { model: "act".into(), graph, batch_bytes, extra_frozen_bytes: frozen, num_params: Some(ac.num_params() as u64), notes: vec![features_note(&data)] })
}


/// `vramlab bench-inference` on an ACT checkpoint `dir` (its normaliser `stats` read): the
/// queue mode (`n_action_steps` of the request, else the checkpoint's) and the temporal
/// ensembling mode, as `req.modes` asks; fills `report`'s policy line, notes and runs.
pub fn bench_inference<B: LeanBackend>(req: &BenchRequest, dir: &Path, stats: &Stats, device: &B::Device, report: &mut BenchReport) -> Result<()> {
    let (cfg, model) = vramlab_models::act::load_pretrained::<B>(dir, device)?;
    let cams: Vec<String> = cfg.image_features().iter().map(|(k, s)| format!("{k} {s:?}")).collect();
    report.policy = format!(
        "act: chunk_size {}, dim_model {}, {} encoder / {} decoder layers, {}, state {}, action {}, cameras [{}], {} parameters",
        cfg.chunk_size,
        cfg.dim_model,
        cfg.n_encoder_layers,
        cfg.n_decoder_layers,
        cfg.vision_backbone,
        cfg.robot_state_dim().map_or("none".into(), |d| d.to_string()),
        cfg.action_dim(),
        cams.join(", "),
        crate::thousands(model.num_parameters() as u64)
    );
    let io = PolicyIo {
        cameras: cfg.image_features().iter().map(|(k, s)| (k.to_string(), *s)).collect(),
        state: cfg.robot_state_dim().map(|d| (vramlab_models::policy::OBS_STATE.to_string(), d)),
        env_state: cfg.env_state().map(|(k, d)| (k.to_string(), d)),
        action_dim: cfg.action_dim(),
        mapping: cfg.normalization_mapping.clone(),
    };
    let processor = Processor::<B>::new(&io, stats, device)?;
    report.normalisation = stats.note(&processor.neutral);
    let mut modes = Vec::new();
    if req.modes != ModeChoice::Ensemble {
        modes.push(ActConfig { n_action_steps: req.n_action_steps.unwrap_or(cfg.n_action_steps), temporal_ensemble_coeff: None, ..cfg.clone() });
    }
    if req.modes != ModeChoice::Queue {
        let coeff = req.temporal_ensemble_coeff.or(cfg.temporal_ensemble_coeff).unwrap_or(DEFAULT_ENSEMBLE_COEFF);
        modes.push(ActConfig { n_action_steps: 1, temporal_ensemble_coeff: Some(coeff), ..cfg.clone() });
        report.notes.push("temporal ensembling requires n_action_steps = 1 (lerobot's ACTConfig): the ensemble mode runs with it".into());
    }
    for c in modes {
        c.validate().map_err(inference::invalid)?;
        let mode = match c.temporal_ensemble_coeff {
            Some(coeff) => Mode::Ensemble { coeff },
            None => Mode::Queue { n_action_steps: c.n_action_steps },
        };
        let runner = ActSelect { model: &model, runner: ActPolicyRunner::new(&c) };
        report.runs.push(inference::run_mode(req, mode, &io, &processor, runner)?);
    }
    Ok(())
}

/// ACT's [`ActPolicyRunner`] on a loaded model, for the bench's timed loop.
struct ActSelect<'m, B: Backend> {
    model: &'m Act<B>,
    runner: ActPolicyRunner<B>,
}

impl<B: LeanBackend> SelectAction<B> for ActSelect<'_, B> {
    fn reset(&mut self) {
        self.runner.reset();
    }

    fn select_action(&mut self, obs: DeviceObs<B>, precision: Precision) -> (Tensor<B, 2>, bool) {
        let mut ran = false;
        let batch = ActBatch { state: obs.state, env_state: obs.env_state, images: obs.images, action: None, action_is_pad: None };
        let model = self.model;
        let action = self.runner.select_action_with(|| {
            ran = true;
            model.forward(&batch, &ActCtx::eval(precision)).actions
        });
        (action, ran)
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use vramlab_models::resnet::{ResNetConfig, ResNetNorm};

    use super::*;

    /// `policy.pretrained_backbone_weights=FILE.safetensors` (a torchvision ResNet18 state dict)
    /// is what the training run's backbone starts from, and the checkpoint's config.json says
    /// null (the weights travel in the checkpoint).
    #[test]
    fn backbone_starts_from_a_torchvision_state_dict() {
        let dev = Default::default();
        let dir = vramlab_testkit::temp_dir("act-backbone");
        let file = dir.path().join("resnet18.safetensors");
        let source = ResNetConfig::resnet18(ResNetNorm::FrozenBatchNorm).init::<Flex>(&dev);
        let tensors = vramlab_store::named_tensors::<Flex, _>(&source);
        vramlab_store::write_safetensors(&tensors, &file).unwrap();
        let flags = [
            ("policy.type", "act"),
            ("policy.pretrained_backbone_weights", file.to_str().unwrap()),
            ("policy.dim_model", "16"),
            ("policy.n_heads", "2"),
            ("policy.dim_feedforward", "32"),
            ("policy.chunk_size", "4"),
            ("policy.n_action_steps", "4"),
            ("policy.state_dim", "2"),
            ("policy.action_dim", "2"),
            ("policy.camera_shape", "3,32,32"),
            ("dataset.type", "random"),
            ("num_workers", "0"),
        ];
        let cfg = crate::config::load(None, &flags.map(|(k, v)| (k.to_string(), v.to_string()))).unwrap();
        cfg.validate().unwrap();
        assert!(cfg.notes.is_empty() && cfg.training_notes().is_empty(), "a local file: no warning: {:?}", cfg.notes);
        let crate::config::Workload::Act(p) = &cfg.policy().unwrap().kind else { panic!("act") };
        let setup = setup::<Autodiff<Flex>>(p, &cfg, &dev).unwrap();
        let backbone = setup.model.act.backbone.as_ref().expect("a camera");
        let loaded = vramlab_store::named_tensors::<Autodiff<Flex>, _>(backbone);
        assert_eq!(loaded.len(), tensors.len());
        for ((k, a), (_, b)) in loaded.iter().zip(&tensors) {
            assert_eq!(a, b, "{k}");
        }
        assert!(setup.config_json.contains("\"pretrained_backbone_weights\": null"), "{}", setup.config_json);
    }
}
