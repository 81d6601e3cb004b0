//! Step-by-step action selection: lerobot's `DiffusionPolicy.select_action` — observation
//! queues of `n_obs_steps` (the first observation repeated until they are full, as
//! `populate_queues`) and an action queue refilled with the `n_action_steps` actions of each
//! sampled chunk.
//!
//! Reference: huggingface/lerobot v0.4.4 `src/lerobot/policies/diffusion/modeling_diffusion.py`
//! (`DiffusionPolicy.reset`, `select_action`, `predict_action_chunk`). ACT's counterpart is
//! `ActPolicyRunner` in `act/runner.rs`; the caller normalises the observations and
//! unnormalises the actions.

use std::collections::VecDeque;

use burn::prelude::*;
use burn::tensor::Distribution;

use super::config::{DiffusionConfig, PolicyFeatures, SchedulerKind};
use super::model::{Diffusion, DiffusionBatch, DiffusionCtx};
use crate::nn::{LeanBackend, Precision};

/// One observation step (already normalised), as `select_action` receives it.
#[derive(Clone, Debug)]
pub struct DiffusionObs<B: Backend> {
    /// `observation.state` `[b, state_dim]`.
    pub state: Tensor<B, 2>,
    /// One `[b, 3, h, w]` per camera, in [`DiffusionConfig::image_features`](crate::policy::PolicyFeatures::image_features) order.
    pub images: Vec<Tensor<B, 4>>,
    /// The ENV input `[b, env_dim]` (when the config has one).
    pub env_state: Option<Tensor<B, 2>>,
}

/// lerobot's `DiffusionPolicy` inference loop: the last `n_obs_steps` observations and the
/// queued actions.
#[derive(Clone, Debug)]
pub struct DiffusionPolicyRunner<B: Backend> {
    pub n_obs_steps: usize,
    observations: VecDeque<DiffusionObs<B>>,
    actions: VecDeque<Tensor<B, 2>>,
}

impl<B: LeanBackend> DiffusionPolicyRunner<B> {
    /// From the config's `n_obs_steps` (the chunk length is the model's `n_action_steps`).
    pub fn new(config: &DiffusionConfig) -> Self {
        Self { n_obs_steps: config.n_obs_steps, observations: VecDeque::new(), actions: VecDeque::new() }
    }

    /// Call when the environment resets (empties both queues).
    pub fn reset(&mut self) {
        self.observations.clear();
        self.actions.clear();
    }

    /// Actions still queued.
    pub fn queued(&self) -> usize {
        self.actions.len()
    }

    /// Queue `obs` and return the next action `[b, action_dim]`; `predict` gets the queued
    /// observations stacked on a time axis and returns a chunk `[b, n, action_dim]` (every
    /// action of it is queued). It is called only when no action is queued.
    pub fn select_action_with(&mut self, obs: DiffusionObs<B>, predict: impl FnOnce(&DiffusionBatch<B>) -> Tensor<B, 3>) -> Tensor<B, 2> {
        while self.observations.len() + 1 < self.n_obs_steps {
            self.observations.push_back(obs.clone());
        }
        self.observations.push_back(obs);
        if self.observations.len() > self.n_obs_steps {
            self.observations.pop_front();
        }
        if self.actions.is_empty() {
            let chunk = predict(&self.batch()); // [b, n_action_steps, a]
            let [b, n, a] = chunk.dims();
            self.actions.extend((0..n).map(|t| chunk.clone().narrow(1, t, 1).reshape([b, a])));
        }
        self.actions.pop_front().expect("generate_actions returns n_action_steps >= 1 actions")
    }

    /// [`DiffusionPolicyRunner::select_action_with`] sampling with `model`
    /// ([`DiffusionPolicyRunner::predict_action_chunk`]).
    pub fn select_action(&mut self, model: &Diffusion<B>, obs: DiffusionObs<B>, precision: Precision) -> Tensor<B, 2> {
        self.select_action_with(obs, |batch| Self::predict_action_chunk(model, batch, precision))
    }

    /// `predict_action_chunk`: the model's `n_action_steps` actions `[b, n_action_steps, a]`,
    /// sampled from fresh Gaussian noise (and fresh variance noise per DDPM step, as
    /// `torch.randn` does).
    pub fn predict_action_chunk(model: &Diffusion<B>, batch: &DiffusionBatch<B>, precision: Precision) -> Tensor<B, 3> {
        let device = batch.state.device();
        let shape = [batch.state.dims()[0], model.config.horizon, model.config.action_dim()];
        let noise = Tensor::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let ddpm = model.noise_scheduler.kind == SchedulerKind::Ddpm;
        let step_noise = |_| ddpm.then(|| Tensor::random(shape, Distribution::Normal(0.0, 1.0), &device));
        model.generate_actions(batch, noise, step_noise, &DiffusionCtx::eval(precision))
    }

    /// The queued observations stacked on a time axis (no actions: inference).
    fn batch(&self) -> DiffusionBatch<B> {
        let stack2 = |f: &dyn Fn(&DiffusionObs<B>) -> Tensor<B, 2>| Tensor::stack::<3>(self.observations.iter().map(f).collect(), 1); // [b, s, d]
        let first = &self.observations[0];
        let state = stack2(&|o| o.state.clone());
        let env_state = first.env_state.as_ref().map(|_| stack2(&|o| o.env_state.clone().expect("every observation has the ENV input")));
        let images = (0..first.images.len()).map(|c| Tensor::stack::<5>(self.observations.iter().map(|o| o.images[c].clone()).collect(), 1)).collect(); // [b, s, 3, h, w]
        DiffusionBatch { state, images, env_state, action: None, action_is_pad: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;

    type Tb = Flex;

    fn obs(v: f32) -> DiffusionObs<Tb> {
        DiffusionObs { state: Tensor::from_data(TensorData::new(vec![v], [1, 1]), &Default::default()), images: Vec::new(), env_state: None }
    }

    fn values<const D: usize>(t: Tensor<Tb, D>) -> Vec<f32> {
        t.into_data().to_vec::<f32>().unwrap()
    }

    /// The first observation fills the queue; a chunk is sampled only when no action is queued,
    /// from the last `n_obs_steps` observations.
    #[test]
    fn queues_fill_slide_and_refill() {
        let cfg = DiffusionConfig { n_obs_steps: 2, ..Default::default() };
        let mut r = DiffusionPolicyRunner::<Tb>::new(&cfg);
        let mut seen = Vec::new();
        let mut step = |r: &mut DiffusionPolicyRunner<Tb>, v: f32| {
            values(r.select_action_with(obs(v), |b| {
                let s = values(b.state.clone()); // [1, 2, 1]
                seen.push(s.clone());
                Tensor::from_data(TensorData::new(vec![s[1] * 10.0, s[1] * 10.0 + 1.0], [1, 2, 1]), &Default::default())
            }))
        };
        assert_eq!(step(&mut r, 1.0), [10.0]);
        assert_eq!(step(&mut r, 2.0), [11.0], "second action of the same chunk");
        assert_eq!(step(&mut r, 3.0), [30.0], "queue empty: a new chunk");
        assert_eq!(r.queued(), 1);
        r.reset();
        assert_eq!(step(&mut r, 4.0), [40.0]);
        assert_eq!(seen, [vec![1.0, 1.0], vec![2.0, 3.0], vec![4.0, 4.0]]);
    }
}
