//! Diffusion Policy (lerobot) as a vramlab workload, with the entry points every model module
//! has: [`setup`] (model, data and optimizer preset of a run; the training adapter is in
//! [`train`]), [`info`], [`predict`] and [`estimate`]; and, as a robot policy,
//! [`bench_inference`] (its mode and `select_action` runner in `vramlab bench-inference`).
//! Its typed `policy` section is [`crate::config::DiffusionPolicy`].

pub mod train;

pub use train::{DiffusionTrain, DiffusionTrainBatch, to_batch};

use vramlab_models::nn::LeanBackend;
use crate::backend::TrainBackend;
use std::path::Path;

use burn::prelude::*;
use vramlab_models::diffusion::{Diffusion, DiffusionBatch, DiffusionConfig, DiffusionCtx, DiffusionObs, DiffusionPolicyRunner, PolicyFeatures};
use vramlab_models::nn::Precision;

use vramlab_train::trainer::BoxError;

use crate::config::{DataFeatures, DiffusionPolicy, RunConfig};
use crate::error::{Result, WorkloadError};
use crate::estimate::{Shapes, features_note};
use crate::inference::policy::{DeviceObs, PolicyIo, Processor, SelectAction, Stats};
use crate::inference::{self, BenchReport, BenchRequest, Mode, ModeChoice};
use crate::inputs::{Dim, Inputs};
use crate::layout;
use crate::model_info::InfoReport;
use crate::policy_data::{PolicyDataSpec, PolicySource, Window, dataset_features, norm_map, open_policy_data, policy_loader, random_source};
use crate::training::TrainSetup;

/// `vramlab info`: parameters of the RGB encoder(s) and the UNet, of the config with the
/// shorthand features.
pub fn info<B: LeanBackend>(p: &DiffusionPolicy, device: &B::Device) -> Result<InfoReport> {
    let dc = &p.resolve()?;
    let (enc, unet) = (dc.rgb_encoder_num_params() as u64, dc.unet_num_params() as u64);
    // A frozen backbone: the ResNet trunk's parameters stop being trainable.
    let frozen: u64 = if dc.freeze_backbone {
        let model = dc.init::<B>(device);
        vramlab_store::param_shapes::<B, _>(&model).iter().filter(|(name, _)| name.contains(".backbone.")).map(|(_, s)| s.iter().product::<usize>() as u64).sum()
    } else {
        0
    };
    let title = format!(
        "diffusion: n_obs_steps {}, horizon {}, down_dims {:?}, diffusion_step_embed_dim {}, resize {:?}, crop {:?}, cameras {:?}",
        dc.n_obs_steps,
        dc.horizon,
        dc.down_dims,
        dc.diffusion_step_embed_dim,
        dc.resize_shape,
        dc.effective_crop_shape(),
        dc.image_features()
    );
    debug_assert_eq!(enc + unet, dc.num_params() as u64);
    Ok(InfoReport { title, rows: vec![("rgb_encoder".to_string(), enc, enc - frozen), ("unet".to_string(), unet, unet)], notes: Vec::new() })
}

/// `vramlab predict` for a lerobot Diffusion `pretrained_model/` dir with the fixture's names:
/// `global_cond`; with `x_t` + `timesteps`, `unet_eps`; with `initial_noise`, `ddim_actions`
/// (the configured scheduler's sampling, DDIM in the fixture). Inputs are checked against the
/// config first.
pub fn predict<B: LeanBackend>(dir: &Path, inputs: &mut Inputs, precision: Precision, device: &B::Device) -> Result<Vec<(String, TensorData)>> {
    let (cfg, model) = vramlab_models::diffusion::load_pretrained::<B>(dir, device)?;
    let (b, s) = (Dim::Any("B"), Dim::Is(cfg.n_obs_steps));
    let state = inputs.float::<B, 3>("observation.state", [b, s, Dim::Is(cfg.state_dim())], device)?;
    let env_state = match cfg.env_state() {
        Some((key, d)) => Some(inputs.float::<B, 3>(key, [b, s, Dim::Is(d)], device)?),
        None => None,
    };
    let images = cfg
        .image_features()
        .iter()
        .map(|(k, [c, h, w])| inputs.float::<B, 5>(k, [b, s, Dim::Is(*c), Dim::Is(*h), Dim::Is(*w)], device))
        .collect::<Result<Vec<_>>>()?;
    let actions = [b, Dim::Is(cfg.horizon), Dim::Is(cfg.action_dim())];
    let batch = DiffusionBatch { state, images, env_state, action: None, action_is_pad: None };
    let ctx = DiffusionCtx::eval(precision);
    let cond = model.prepare_global_conditioning(&batch, &ctx);
    let mut out = vec![("global_cond".to_string(), cond.clone().into_data())];
    if inputs.contains("x_t") || inputs.contains("timesteps") {
        let x = inputs.float::<B, 3>("x_t", actions, device)?;
        let t = inputs.indices("timesteps", [b], cfg.num_train_timesteps)?;
        out.push(("unet_eps".into(), model.unet.forward(x, &t, cond.clone(), precision).into_data()));
    }
    if let Some(noise) = inputs.float_opt::<B, 3>("initial_noise", actions, device)? {
        // DDPM adds fresh noise at every denoising step: drawn here from a fixed seed (so
        // predict is repeatable), where lerobot draws from torch's RNG — equal to lerobot's
        // only in distribution. DDIM is deterministic and matches lerobot given the same
        // initial noise.
        let dims = noise.dims();
        let step_noise = |k: usize| {
            let v = crate::normal_vec(&mut vramlab_train::step_rng(0, k as u64, 0), dims.iter().product());
            Some(Tensor::<B, 3>::from_data(TensorData::new(v, dims), device))
        };
        let actions = model.generate_actions(&batch, noise, step_noise, &ctx);
        out.push(("ddim_actions".into(), actions.into_data()));
    }
    Ok(out)
}

/// The features of a config (for random data).
pub fn features_of(cfg: &DiffusionConfig) -> DataFeatures {
    DataFeatures {
        state_dim: Some(cfg.state_dim()),
        action_dim: cfg.action_dim(),
        cameras: cfg.image_features().iter().map(|(k, s)| (k.to_string(), *s)).collect(),
    }
}

/// The model, data and optimizer preset of a Diffusion Policy run.
pub fn setup<'a, B: TrainBackend>(p: &DiffusionPolicy, cfg: &RunConfig, device: &B::Device) -> Result<TrainSetup<'a, DiffusionTrain<B>, DiffusionTrainBatch<B>>> {
    let base = &p.config;
    let window = Window { obs_steps: Some(base.n_obs_steps), actions: base.horizon };
    let spec = PolicyDataSpec { window, delta: base.delta_indices(), norm_map: norm_map(&base.normalization_mapping)?, drop_n_last_frames: base.drop_n_last_frames };
    let (dc, source) = match open_policy_data(cfg, &spec)? {
        Some(data) => (p.resolve_for(data.features())?, PolicySource::LeRobot(Box::new(data))),
        None => {
            let dc = p.resolve()?;
            let source = random_source(cfg, window, features_of(&dc));
            (dc, source)
        }
    };
    B::seed(device, cfg.seed);
    let mut model = dc.init(device);
    if let Some(dir) = &p.pretrained {
        // lerobot's --policy.path: fine-tune from those weights (verified first).
        let dir = &layout::verified_pretrained_dir(dir, "policy.path")?;
        model = vramlab_models::diffusion::load_weights(model, &dir.join(layout::WEIGHTS_FILE))?;
    }
    let data_desc = source.describe();
    let config_json = dc.to_json_string();
    let config_value: serde_json::Value = serde_json::from_str(&config_json).map_err(|e| WorkloadError::invalid("policy", format!("config.json: {e}")))?;
    let pretrained_files = crate::processors::files(&config_value, &source.stats())?;
    let mut loader = policy_loader(cfg, source);
    let (seed, dev) = (cfg.seed, device.clone());
    let dcc = dc.clone();
    Ok(TrainSetup {
        policy: "diffusion",
        model: DiffusionTrain::<B> { model, precision: cfg.precision },
        config_json,
        pretrained_files,
        num_params: dc.num_params(),
        optim: dc.optimizer_preset(),
        data_desc,
        data: Box::new(move |step, micro| {
            let h = loader.get(step, micro).map_err(BoxError::from)?;
            Ok(to_batch::<B>(h, &dcc, seed, step, micro, &dev))
        }),
    })
}

/// `vramlab estimate`: the training graph of the run's config (features from the dataset's
/// `meta/info.json`, or the shorthands), its batch and frozen bytes.
pub fn estimate(p: &DiffusionPolicy, cfg: &RunConfig) -> Result<Shapes> {
    let data = dataset_features(cfg)?;
    let dc = match &data {
        Some(f) => p.resolve_for(f)?,
        None => p.resolve()?,
    };
    let (graph, batch_bytes, frozen) = vramlab_models::diffusion::graph::training_graph(&dc, cfg.batch_size as usize, cfg.precision);
    Ok(Shapes { model: "diffusion".into(), graph, batch_bytes, extra_frozen_bytes: frozen, num_params: Some(dc.num_params() as u64), notes: vec![features_note(&data)] })
}

/// `vramlab bench-inference` on a Diffusion Policy checkpoint `dir` (its normaliser `stats`
/// read): the queue mode only (lerobot's DiffusionPolicy has no temporal ensembling), with the
/// request's `n_action_steps` else the checkpoint's; fills `report`'s policy line, notes and runs.
pub fn bench_inference<B: LeanBackend>(req: &BenchRequest, dir: &Path, stats: &Stats, device: &B::Device, report: &mut BenchReport) -> Result<()> {
    if req.modes == ModeChoice::Ensemble || req.temporal_ensemble_coeff.is_some() {
        return Err(WorkloadError::invalid("temporal_ensemble_coeff", "temporal ensembling is ACT's; lerobot's DiffusionPolicy has none".into()));
    }
    let (cfg, mut model) = vramlab_models::diffusion::load_pretrained::<B>(dir, device)?;
    let cfg = DiffusionConfig { n_action_steps: req.n_action_steps.unwrap_or(cfg.n_action_steps), ..cfg };
    cfg.validate().map_err(inference::invalid)?;
    let cams: Vec<String> = cfg.image_features().iter().map(|(k, s)| format!("{k} {s:?}")).collect();
    // `generate_actions` keeps the model config's n_action_steps actions.
    model.config.n_action_steps = cfg.n_action_steps;
    report.policy = format!(
        "diffusion: n_obs_steps {}, horizon {}, {} {} inference steps, down_dims {:?}, crop {}, state {}, action {}, cameras [{}], {} parameters",
        cfg.n_obs_steps,
        cfg.horizon,
        cfg.noise_scheduler_type,
        cfg.inference_steps(),
        cfg.down_dims,
        cfg.crop_shape.map_or("none".into(), |c| format!("{c:?}")),
        cfg.state_dim(),
        cfg.action_dim(),
        cams.join(", "),
        crate::thousands(model.num_parameters() as u64)
    );
    let io = PolicyIo {
        cameras: cfg.image_features().iter().map(|(k, s)| (k.to_string(), *s)).collect(),
        state: Some((vramlab_models::policy::OBS_STATE.to_string(), cfg.state_dim())),
        env_state: cfg.env_state().map(|(k, d)| (k.to_string(), d)),
        action_dim: cfg.action_dim(),
        mapping: cfg.normalization_mapping.clone(),
    };
    let processor = Processor::<B>::new(&io, stats, device)?;
    report.normalisation = stats.note(&processor.neutral);
    let runner = DiffusionSelect { model: &model, runner: DiffusionPolicyRunner::new(&cfg) };
    report.runs.push(inference::run_mode(req, Mode::Queue { n_action_steps: cfg.n_action_steps }, &io, &processor, runner)?);
    if req.modes == ModeChoice::Both {
        report.notes.push("Diffusion Policy has no temporal ensembling in lerobot: queue mode only".into());
    }
    Ok(())
}

/// Diffusion's [`DiffusionPolicyRunner`] on a loaded model, for the bench's timed loop.
struct DiffusionSelect<'m, B: Backend> {
    model: &'m Diffusion<B>,
    runner: DiffusionPolicyRunner<B>,
}

impl<B: LeanBackend> SelectAction<B> for DiffusionSelect<'_, B> {
    fn reset(&mut self) {
        self.runner.reset();
    }

    fn select_action(&mut self, obs: DeviceObs<B>, precision: Precision) -> (Tensor<B, 2>, bool) {
        let mut ran = false;
        let obs = DiffusionObs { state: obs.state.expect("Diffusion Policy has observation.state"), images: obs.images, env_state: obs.env_state };
        let model = self.model;
        let action = self.runner.select_action_with(obs, |batch| {
            ran = true;
            DiffusionPolicyRunner::predict_action_chunk(model, batch, precision)
        });
        (action, ran)
    }
}
