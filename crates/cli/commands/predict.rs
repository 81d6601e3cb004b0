//! `vramlab predict`: run a checkpoint (vramlab's or the reference's) on model-level inputs
//! and write the outputs under the fixture's tensor names — the command that checks a port.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use vramlab_models::nn::Precision;
use vramlab_probe::MemoryProbe;

use super::Switches;
use crate::Cli;
use crate::backend::{BackendInfo, Job, dispatch};
use crate::config;

pub fn run(cli: &Cli) -> Result<()> {
    let mut rest = Vec::new();
    let (mut ckpt, mut inputs, mut out) = (None, None, None);
    for (k, v) in &cli.overrides {
        match k.as_str() {
            "checkpoint" => ckpt = Some(PathBuf::from(v)),
            "inputs" => inputs = Some(PathBuf::from(v)),
            "out" => out = Some(PathBuf::from(v)),
            _ => rest.push((k.clone(), v.clone())),
        }
    }
    let (Some(checkpoint), Some(inputs), Some(out)) = (ckpt, inputs, out) else {
        bail!("predict needs --checkpoint DIR --inputs FILE.safetensors --out FILE.safetensors");
    };
    let cfg = config::load(cli.config.as_deref(), &rest)?;
    let sw = Switches::from(&cfg)?;
    let kind = checkpoint_type(&checkpoint)?;
    dispatch(sw.backend, cfg.device, sw.checkpointing, sw.precision, PredictJob { kind, checkpoint, inputs, out, precision: sw.precision })
}

/// The `type` of a checkpoint directory's `config.json`.
fn checkpoint_type(dir: &Path) -> Result<String> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}: cannot read", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))?;
    match v.get("type").and_then(|t| t.as_str()) {
        Some(t) => Ok(t.to_string()),
        None => bail!("{}: field `type` is missing (expected \"vae3d\", \"act\" or \"diffusion\")", path.display()),
    }
}

struct PredictJob {
    kind: String,
    checkpoint: PathBuf,
    inputs: PathBuf,
    out: PathBuf,
    precision: Precision,
}

impl Job for PredictJob {
    type Output = ();
    fn run<B: AutodiffBackend>(self, device: B::Device, _probe: &dyn MemoryProbe, _info: &BackendInfo) -> Result<()> {
        let inputs = vramlab_store::read_safetensors(&self.inputs)?;
        let mut outputs: Vec<(String, TensorData)> = Vec::new();
        match self.kind.as_str() {
            "vae3d" => {
                let (_cfg, model) = vramlab_models::vae3d::load_pretrained::<B::InnerBackend>(&self.checkpoint, &device)
                    .map_err(|e| anyhow!(e))?;
                let x: Tensor<B::InnerBackend, 5> = crate::workloads::input_tensor(&inputs, &self.inputs, "x", &device)?;
                let out = model.forward(x.clone(), None, self.precision);
                let loss = model.compute_loss(x, &out);
                outputs.push(("mean".into(), out.mean.into_data()));
                outputs.push(("logvar".into(), out.logvar.into_data()));
                outputs.push(("recon".into(), out.recon.into_data()));
                outputs.push(("loss".into(), loss.loss.into_data()));
                outputs.push(("recon_loss".into(), loss.recon_loss.into_data()));
                outputs.push(("kl_loss".into(), loss.kl_loss.into_data()));
            }
            "act" => outputs = crate::workloads::act::predict::<B::InnerBackend>(&self.checkpoint, &self.inputs, self.precision, &device)?,
            "diffusion" => outputs = crate::workloads::diffusion::predict::<B::InnerBackend>(&self.checkpoint, &self.inputs, self.precision, &device)?,
            other => bail!("{}: policy type `{other}` is not supported by this build (supported: vae3d, act, diffusion)", self.checkpoint.display()),
        }
        let outputs: Vec<(String, TensorData)> = outputs.into_iter().map(|(k, d)| (k, d.convert::<f32>())).collect();
        vramlab_store::write_safetensors(&outputs, &self.out)?;
        for (k, d) in &outputs {
            eprintln!("{k}: {:?}", d.shape);
        }
        eprintln!("wrote {}", self.out.display());
        Ok(())
    }
}
