//! Gradient checkpointing.
//!
//! Two real mechanisms, selected with `--gradient_checkpointing`:
//! - `blocks`: explicit block recomputation (Chen et al. 2016), done here in the trainer on
//!   the model's [`Staged`] view. The forward runs every stage without a graph, keeping only
//!   stage inputs; the backward walks the stages in reverse, re-running each with autodiff from
//!   its saved input and back-propagating `sum(output * grad_output)`. Parameter gradients are
//!   the same sums of the same products as in the plain run.
//! - `balanced`: Burn's `Autodiff<B, BalancedCheckpointing>` backend (chosen by the CLI). It
//!   recomputes only operations Burn marks memory-bound (element-wise ops, activations); conv and
//!   matmul outputs stay stored.

use std::fmt;

use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::AutodiffBackend;

use crate::model::{LossParts, StageTensor, TrainModel};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointMode {
    #[default]
    Off,
    Blocks,
    Balanced,
}

impl CheckpointMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "off" | "false" | "no" | "none" | "0" => Some(Self::Off),
            "blocks" | "true" | "on" | "yes" | "1" => Some(Self::Blocks),
            "balanced" => Some(Self::Balanced),
            _ => None,
        }
    }
    pub const NAMES: &'static str = "off, blocks (= true), balanced";
}

impl fmt::Display for CheckpointMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Off => "off",
            Self::Blocks => "blocks",
            Self::Balanced => "balanced",
        })
    }
}

/// Hooks the trainer gives the staged pass so it can measure the forward and backward phases.
pub trait PhaseHooks {
    fn forward_done(&mut self);
}

/// One micro-batch with block recomputation: returns the loss parts (values detached) and the
/// parameter gradients of `loss * loss_scale`.
pub fn staged_forward_backward<B, M>(
    model: &M,
    batch: &M::Batch,
    loss_scale: f32,
    hooks: &mut dyn PhaseHooks,
) -> Option<(LossParts<B>, GradientsParams)>
where
    B: AutodiffBackend,
    M: TrainModel<B> + AutodiffModule<B>,
{
    let staged = model.staged()?;
    let n = staged.num_stages();
    // Forward without a graph: parameters are cut from autodiff, only stage inputs are kept.
    let frozen = model.clone().no_grad();
    let frozen_staged = frozen.staged()?;
    let mut inputs: Vec<Vec<StageTensor<B>>> = Vec::with_capacity(n);
    let mut state: Vec<StageTensor<B>> = staged.input(batch).into_iter().map(StageTensor::detach).collect();
    for i in 0..n.saturating_sub(1) {
        inputs.push(state.clone());
        state = frozen_staged.stage(i, state, batch).into_iter().map(StageTensor::detach).collect();
    }
    drop(frozen);
    hooks.forward_done();

    // Last stage and the loss, with a graph.
    let mut acc = GradientsAccumulator::<M>::new();
    let last_in: Vec<StageTensor<B>> = state.into_iter().map(StageTensor::leaf).collect();
    let out = if n > 0 { staged.stage(n - 1, last_in.clone(), batch) } else { last_in.clone() };
    let parts = staged.loss(out, batch);
    let scaled = if loss_scale == 1.0 { parts.loss.clone() } else { parts.loss.clone() * loss_scale };
    let mut grads = scaled.backward();
    let mut upstream: Vec<_> = last_in.iter().map(|t| t.grad(&grads)).collect();
    acc.accumulate(model, GradientsParams::from_module(&mut grads, model));
    drop(grads);
    let parts = LossParts {
        loss: parts.loss.detach(),
        parts: parts.parts.into_iter().map(|(k, v)| (k, v.detach())).collect(),
    };

    // Earlier stages in reverse: recompute with a graph, push the upstream gradient through.
    for i in (0..n.saturating_sub(1)).rev() {
        let saved = inputs.pop().unwrap_or_default();
        let need_input_grad = i > 0;
        let leaves: Vec<StageTensor<B>> = if need_input_grad {
            saved.into_iter().map(StageTensor::leaf).collect()
        } else {
            saved
        };
        let out = staged.stage(i, leaves.clone(), batch);
        let surrogate = out
            .iter()
            .zip(upstream.iter())
            .map(|(o, g)| o.dot(g))
            .reduce(|a, b| a + b);
        let Some(surrogate) = surrogate else { continue };
        let mut grads = surrogate.backward();
        if need_input_grad {
            upstream = leaves.iter().map(|t| t.grad(&grads)).collect();
        }
        acc.accumulate(model, GradientsParams::from_module(&mut grads, model));
    }
    Some((parts, acc.grads()))
}
