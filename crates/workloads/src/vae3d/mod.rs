//! The 3D-VAE as a vramlab workload: data ([`data`]), predict, and the training adapter
//! ([`train`]). Its config is [`crate::policy::Vae3dPolicy`].

pub mod data;
pub mod train;

pub use data::VoxelSource;
pub use train::{Vae3dBatch, Vae3dTrain, make_batch};

use vramlab_models::nn::LeanBackend;
use crate::backend::TrainBackend;
use std::path::Path;

use burn::prelude::*;
use vramlab_models::nn::Precision;
use vramlab_models::vae3d::Vae3dConfig;

use crate::config::RunConfig;
use crate::inputs::{Dim, Inputs};
use crate::policy::Vae3dPolicy;
use crate::training::TrainSetup;
use crate::{Result, WorkloadError};

/// Why a `(D, H, W)` grid cannot go through `cfg`'s VAE (a size its downsampling does not
/// divide), or `None` when it can.
pub fn grid_mismatch(cfg: &Vae3dConfig, grid: [usize; 3]) -> Option<String> {
    let axes = ["D", "H", "W"].into_iter().zip(grid.into_iter().zip(cfg.downsample_factor()));
    axes.into_iter()
        .find(|(_, (size, factor))| size % factor != 0)
        .map(|(axis, (size, factor))| format!("{axis}={size} is not divisible by the VAE's downsampling factor {factor} along {axis}"))
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
        ("mean".into(), out.mean.into_data()),
        ("logvar".into(), out.logvar.into_data()),
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
