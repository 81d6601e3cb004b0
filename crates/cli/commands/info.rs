//! `vramlab info`: parameter counts and static bytes of a config, without training.

use std::collections::BTreeMap;

use anyhow::Result;
use burn::tensor::backend::AutodiffBackend;
use vramlab_probe::MemoryProbe;
use vramlab_train::metrics::fmt_bytes;

use super::Switches;
use crate::Cli;
use crate::backend::{BackendInfo, Job, dispatch};
use crate::config::{self, RunConfig};
use crate::workloads::PolicyType;
use crate::workloads::{act, diffusion, vae3d};

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn run(cli: &Cli) -> Result<()> {
    let cfg = config::load(cli.config.as_deref(), &cli.overrides)?;
    let sw = Switches::from(&cfg)?;
    dispatch(sw.backend, cfg.device, sw.checkpointing, sw.precision, InfoJob { cfg })
}

struct InfoJob {
    cfg: RunConfig,
}

/// Rows (module, parameters, trainable) grouped by the first segment of each parameter name.
fn rows_by_top_module(shapes: &[(String, Vec<usize>)]) -> Vec<(String, u64, u64)> {
    let mut per_module: BTreeMap<String, u64> = BTreeMap::new();
    for (name, shape) in shapes {
        let top = name.split('.').next().unwrap_or(name).to_string();
        *per_module.entry(top).or_default() += shape.iter().product::<usize>() as u64;
    }
    per_module.into_iter().map(|(m, n)| (m, n, n)).collect()
}

/// Print counts per top-level module and the static bytes of training with Adam(W).
fn report(title: &str, rows: &[(String, u64, u64)]) {
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let train: u64 = rows.iter().map(|r| r.2).sum();
    println!("{title}");
    println!("{:<28} {:>14} {:>14}", "module", "parameters", "trainable");
    for (m, n, t) in rows {
        println!("{m:<28} {:>14} {:>14}", thousands(*n), thousands(*t));
    }
    println!("{:<28} {:>14} {:>14}", "total", thousands(total), thousands(train));
    println!("total parameters: {} ({total})", thousands(total));
    println!("trainable parameters: {} ({train})", thousands(train));
    // Sizes of tensors that exist for the whole run: f32 master weights, one f32 gradient and
    // two f32 Adam moments per trainable parameter. Exact sizes, not a measurement of a run.
    let (p, g, o) = (4 * total, 4 * train, 8 * train);
    println!("static bytes (f32 params + grads + Adam state): {} = params {} + grads {} + optimizer {}", fmt_bytes(p + g + o), fmt_bytes(p), fmt_bytes(g), fmt_bytes(o));
    println!("static_bytes: {}", p + g + o);
}

impl Job for InfoJob {
    type Output = ();
    fn run<B: AutodiffBackend>(self, device: B::Device, _probe: &dyn MemoryProbe, _info: &BackendInfo) -> Result<()> {
        match PolicyType::from_config(&self.cfg)? {
            PolicyType::Vae3d => {
                let vc = vae3d::resolve_config(&self.cfg.policy)?;
                let model = vc.init::<B::InnerBackend>(&device);
                let shapes = vramlab_store::param_shapes::<B::InnerBackend, _>(&model);
                let json = serde_json::to_string(&vc)?;
                report(&format!("vae3d {json}"), &rows_by_top_module(&shapes));
            }
            PolicyType::Act => {
                let ac = act::resolve_config(&self.cfg.policy)?;
                let mut model = ac.init::<B::InnerBackend>(&device);
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
                report(&title, &act::info_rows(&model));
                println!("buffers (FrozenBatchNorm2d, positional tables; not parameters): {}", thousands(model.num_buffer_elements() as u64));
            }
            PolicyType::Diffusion => {
                let dc = diffusion::resolve_config(&self.cfg.policy)?;
                let (enc, unet) = (dc.rgb_encoder_num_params() as u64, dc.unet_num_params() as u64);
                // A frozen backbone: the ResNet trunk's parameters stop being trainable.
                let frozen: u64 = if dc.freeze_backbone {
                    let model = dc.init::<B::InnerBackend>(&device);
                    vramlab_store::param_shapes::<B::InnerBackend, _>(&model)
                        .iter()
                        .filter(|(name, _)| name.contains(".backbone."))
                        .map(|(_, s)| s.iter().product::<usize>() as u64)
                        .sum()
                } else {
                    0
                };
                let title = format!(
                    "diffusion: n_obs_steps {}, horizon {}, down_dims {:?}, diffusion_step_embed_dim {}, crop {:?}, cameras {:?}",
                    dc.n_obs_steps,
                    dc.horizon,
                    dc.down_dims,
                    dc.diffusion_step_embed_dim,
                    dc.crop_shape,
                    dc.image_features()
                );
                let rows = vec![("rgb_encoder".to_string(), enc, enc - frozen), ("unet".to_string(), unet, unet)];
                debug_assert_eq!(enc + unet, dc.num_params() as u64);
                report(&title, &rows);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_separators() {
        assert_eq!(super::thousands(694788), "694,788");
        assert_eq!(super::thousands(40847092), "40,847,092");
        assert_eq!(super::thousands(12), "12");
    }
}
