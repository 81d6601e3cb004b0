//! The 3D-VAE as a vramlab workload, with the entry points every model module has: [`setup`]
//! (model, data and optimizer preset of a run; the training adapter is in [`train`], the
//! voxel data in [`data`]), [`info`], [`predict`] and [`estimate`]. Its typed `policy` section
//! is [`crate::config::Vae3dPolicy`].

pub mod data;
pub mod train;

pub use data::VoxelSource;
pub use train::{Vae3dBatch, Vae3dTrain, make_batch};

use vramlab_models::nn::LeanBackend;
use crate::backend::TrainBackend;
use std::path::Path;

use burn::prelude::*;
use vramlab_models::nn::Precision;

use crate::config::{RunConfig, Vae3dPolicy, grid_mismatch};
use crate::error::{Result, WorkloadError};
use crate::estimate::Shapes;
use crate::inputs::{Dim, Inputs};
use crate::model_info::{InfoReport, rows_by_top_module};
use crate::training::TrainSetup;

/// `vramlab info`: parameters per top-level module (encoder, decoder, …) of the config.
pub fn info<B: LeanBackend>(p: &Vae3dPolicy, device: &B::Device) -> Result<InfoReport> {
    let model = p.config.init::<B>(device);
    let shapes = vramlab_store::param_shapes::<B, _>(&model);
    let json = serde_json::to_string(&p.config).expect("a VAE config serialises");
    Ok(InfoReport { title: format!("vae3d {json}"), rows: rows_by_top_module(&shapes), notes: Vec::new() })
}

/// `vramlab predict` for a VAE checkpoint: `mean`, `logvar`, `recon` (posterior mean, no
/// sampling) and the reference loss terms for input `x`, checked against the config first.
pub fn predict<B: LeanBackend>(dir: &Path, inputs: &mut Inputs, precision: Precision, device: &B::Device) -> Result<Vec<(String, TensorData)>> {
    let (cfg, model) = vramlab_models::vae3d::load_pretrained::<B>(dir, device)?;
    let any = |n| Dim::Any(n);
    let x: Tensor<B, 5> = inputs.float("x", [any("B"), Dim::Is(cfg.in_channels), any("D"), any("H"), any("W")], device)?;
    let [_, _, d, h, w] = x.dims();
    if let Some(why) = grid_mismatch(&cfg, [d, h, w]) {
        return Err(WorkloadError::file(inputs.path(), format!("tensor `x`: {why}")));
    }
    let out = model.forward(x.clone(), None, precision);
    let loss = model.compute_loss(x, &out);
    Ok(vec![
        ("mean".into(), out.mean().into_data()),
        ("logvar".into(), out.logvar().into_data()),
        ("recon".into(), out.recon.into_data()),
        ("loss".into(), loss.loss.into_data()),
        ("recon_loss".into(), loss.recon_loss.into_data()),
        ("kl_loss".into(), loss.kl_loss.into_data()),
    ])
}

/// The model, data and optimizer preset of a VAE run.
pub fn setup<'a, B: TrainBackend>(p: &Vae3dPolicy, cfg: &RunConfig, device: &B::Device) -> Result<TrainSetup<'a, Vae3dTrain<B>, Vae3dBatch<B>>> {
    let kind = cfg.dataset_type()?;
    let source = VoxelSource::open(&cfg.dataset, kind, cfg.seed)?;
    // Seed the backend before the weights are drawn: same seed, same initial model.
    B::seed(device, cfg.seed);
    let vc = p.config.clone();
    let (bs, seed, dev) = (cfg.batch_size as usize, cfg.seed, device.clone());
    Ok(TrainSetup {
        policy: "vae3d",
        model: Vae3dTrain::<B> { vae: vc.init(device), precision: cfg.precision },
        // The reference JSON carries `"type": "vae3d"` (how `vramlab predict` tells the model).
        config_json: serde_json::to_string_pretty(&vc.to_reference_json()).expect("a VAE config serialises"),
        pretrained_files: Vec::new(),
        num_params: vc.num_params(),
        optim: vc.optimizer_preset(),
        data_desc: format!("{} grid {:?}", kind.name(), cfg.dataset.grid),
        data: Box::new(move |step, micro| make_batch::<B>(&source, &vc, bs, seed, step, micro, &dev).map_err(|e| e.into())),
    })
}

/// `vramlab estimate`: the training graph of the config on `dataset.grid`, and the batch
/// (input volume and latent noise).
pub fn estimate(p: &Vae3dPolicy, cfg: &RunConfig) -> Result<Shapes> {
    let (b, vc) = (cfg.batch_size as usize, &p.config);
    vc.validate().map_err(|e| WorkloadError::invalid("policy", format!("(vae3d) {e}")))?;
    let grid = cfg.dataset.grid;
    let graph = vramlab_models::vae3d::graph::training_graph(vc, b, grid, cfg.precision);
    let f = vc.downsample_factor();
    let voxels = grid.iter().product::<usize>();
    let latent = vc.latent_dim * (0..3).map(|a| grid[a] / f[a]).product::<usize>();
    let batch_bytes = (b * (vc.in_channels * voxels + latent) * 4) as u64;
    Ok(Shapes { model: format!("vae3d grid {grid:?}"), graph, batch_bytes, extra_frozen_bytes: 0, num_params: Some(vc.num_params() as u64), notes: Vec::new() })
}
