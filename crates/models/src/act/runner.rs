//! Step-by-step action selection: lerobot's `ACTPolicy.select_action` (action queue of
//! `n_action_steps`) and `ACTTemporalEnsembler` (online exponentially weighted average).
//!
//! Reference: huggingface/lerobot v0.4.4 `src/lerobot/policies/act/modeling_act.py`
//! (`ACTPolicy.reset`, `select_action`, `predict_action_chunk`, `ACTTemporalEnsembler`).

use std::collections::VecDeque;

use burn::prelude::*;
use crate::nn::LeanBackend;
use burn::tensor::TensorData;

use super::model::{Act, ActBatch, ActCtx};
use crate::nn::Precision;

/// lerobot's `ACTTemporalEnsembler`: weights `wᵢ = exp(−coeff · i)` (`w₀` for the oldest
/// prediction of a time step), combined online:
/// `avg ← (avg · Σ_{<n} w + a · w_n) / Σ_{≤n} w` where `n` predictions were already averaged.
#[derive(Clone, Debug)]
pub struct TemporalEnsembler<B: Backend> {
    pub chunk_size: usize,
    /// `wᵢ`, f32 as torch computes them.
    pub weights: Vec<f32>,
    /// Cumulative sums of `weights`.
    pub weights_cumsum: Vec<f32>,
    /// `[b, n, action_dim]` running averages for the next `n` time steps.
    ensembled: Option<Tensor<B, 3>>,
    /// Predictions averaged so far per pending time step (`n` entries).
    counts: Vec<usize>,
}

impl<B: LeanBackend> TemporalEnsembler<B> {
    pub fn new(coeff: f64, chunk_size: usize) -> Self {
        let weights: Vec<f32> = (0..chunk_size).map(|i| (-(coeff as f32) * i as f32).exp()).collect();
        let weights_cumsum = weights
            .iter()
            .scan(0f32, |acc, w| {
                *acc += w;
                Some(*acc)
            })
            .collect();
        Self { chunk_size, weights, weights_cumsum, ensembled: None, counts: Vec::new() }
    }

    pub fn reset(&mut self) {
        self.ensembled = None;
        self.counts.clear();
    }

    /// Fold in a new chunk `[b, chunk, action_dim]` and pop the action for this step `[b, action_dim]`.
    pub fn update(&mut self, actions: Tensor<B, 3>) -> Tensor<B, 2> {
        let [b, chunk, a] = actions.dims();
        assert_eq!(chunk, self.chunk_size, "TemporalEnsembler: chunk of {chunk} actions, expected {}", self.chunk_size);
        let device = actions.device();
        let column = |v: Vec<f32>| Tensor::<B, 3>::from_data(TensorData::new(v.clone(), [1, v.len(), 1]), &device);
        let (ens, mut counts) = match self.ensembled.take() {
            None => (actions, vec![1; chunk]),
            Some(ens) => {
                let n = self.counts.len(); // chunk - 1
                let prev = column(self.counts.iter().map(|&c| self.weights_cumsum[c - 1]).collect());
                let w_new = column(self.counts.iter().map(|&c| self.weights[c]).collect());
                let total = column(self.counts.iter().map(|&c| self.weights_cumsum[c]).collect());
                let head = (ens * prev + actions.clone().narrow(1, 0, n) * w_new) / total;
                let mut counts: Vec<usize> = self.counts.iter().map(|&c| (c + 1).min(chunk)).collect();
                counts.push(1);
                (Tensor::cat(vec![head, actions.narrow(1, chunk - 1, 1)], 1), counts)
            }
        };
        let n = counts.len();
        let action = ens.clone().narrow(1, 0, 1).reshape([b, a]);
        self.ensembled = Some(ens.narrow(1, 1, n - 1));
        counts.remove(0);
        self.counts = counts;
        action
    }
}

/// lerobot's `ACTPolicy` inference loop: either temporal ensembling (every step queries the
/// model) or a queue of `n_action_steps` actions refilled from each predicted chunk.
#[derive(Clone, Debug)]
pub struct ActPolicyRunner<B: Backend> {
    pub n_action_steps: usize,
    queue: VecDeque<Tensor<B, 2>>,
    ensembler: Option<TemporalEnsembler<B>>,
}

impl<B: LeanBackend> ActPolicyRunner<B> {
    /// From the config's `n_action_steps`, `chunk_size` and `temporal_ensemble_coeff`.
    pub fn new(config: &super::ActConfig) -> Self {
        Self {
            n_action_steps: config.n_action_steps,
            queue: VecDeque::new(),
            ensembler: config.temporal_ensemble_coeff.map(|c| TemporalEnsembler::new(c, config.chunk_size)),
        }
    }

    /// Call when the environment resets.
    pub fn reset(&mut self) {
        self.queue.clear();
        if let Some(e) = &mut self.ensembler {
            e.reset();
        }
    }

    /// Actions still queued.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The next action `[b, action_dim]`; `predict` returns a chunk `[b, chunk, action_dim]` and
    /// is called only when needed (every step with ensembling, else when the queue is empty).
    pub fn select_action_with(&mut self, predict: impl FnOnce() -> Tensor<B, 3>) -> Tensor<B, 2> {
        if let Some(e) = &mut self.ensembler {
            return e.update(predict());
        }
        if self.queue.is_empty() {
            let chunk = predict();
            let [b, _, a] = chunk.dims();
            for t in 0..self.n_action_steps {
                self.queue.push_back(chunk.clone().narrow(1, t, 1).reshape([b, a]));
            }
        }
        self.queue.pop_front().expect("n_action_steps >= 1")
    }

    /// [`ActPolicyRunner::select_action_with`] running `model` in eval mode (z = 0) on `batch`
    /// (observations only; actions in the batch are ignored in eval).
    pub fn select_action(&mut self, model: &Act<B>, batch: &ActBatch<B>, p: Precision) -> Tensor<B, 2> {
        self.select_action_with(|| model.forward(batch, &ActCtx::eval(p)).actions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    type Tb = Flex;

    fn chunk(v: [f32; 3]) -> Tensor<Tb, 3> {
        Tensor::from_data(TensorData::new(v.to_vec(), [1, 3, 1]), &Default::default())
    }

    fn scalar(t: Tensor<Tb, 2>) -> f32 {
        t.into_data().to_vec::<f32>().unwrap()[0]
    }

    #[test]
    fn ensembler_matches_hand_computed_weighted_averages() {
        // coeff ln 2: w = [1, 1/2, 1/4], oldest prediction weighted most.
        let mut e = TemporalEnsembler::<Tb>::new(std::f64::consts::LN_2, 3);
        assert!((e.weights[2] - 0.25).abs() < 1e-7 && (e.weights_cumsum[2] - 1.75).abs() < 1e-6);
        // t=0: only chunk 1 predicts step 0.
        assert_eq!(scalar(e.update(chunk([10.0, 20.0, 30.0]))), 10.0);
        // t=1: step 1 predicted by chunk 1 (20, weight 1) and chunk 2 (100, weight 1/2).
        let a1 = scalar(e.update(chunk([100.0, 200.0, 300.0])));
        assert!((a1 - (20.0 + 0.5 * 100.0) / 1.5).abs() < 1e-4, "{a1}");
        // t=2: step 2 by chunks 1, 2, 3: (30·1 + 200·½ + 1000·¼) / 1.75.
        let a2 = scalar(e.update(chunk([1000.0, 2000.0, 3000.0])));
        assert!((a2 - 380.0 / 1.75).abs() < 1e-3, "{a2}");
        // t=3: step 3 by chunks 2, 3, 4 (chunk 1 ended): (300·1 + 2000·½ + 7·¼) / 1.75.
        let a3 = scalar(e.update(chunk([7.0, 8.0, 9.0])));
        assert!((a3 - (300.0 + 1000.0 + 1.75) / 1.75).abs() < 1e-3, "{a3}");
        e.reset();
        assert_eq!(scalar(e.update(chunk([5.0, 6.0, 7.0]))), 5.0);
    }

    #[test]
    fn queue_refills_every_n_action_steps() {
        let cfg = crate::act::ActConfig { chunk_size: 3, n_action_steps: 2, ..Default::default() };
        let mut r = ActPolicyRunner::<Tb>::new(&cfg);
        let mut calls = 0;
        let mut step = |r: &mut ActPolicyRunner<Tb>, base: f32| {
            scalar(r.select_action_with(|| {
                calls += 1;
                chunk([base, base + 1.0, base + 2.0])
            }))
        };
        assert_eq!(step(&mut r, 0.0), 0.0);
        assert_eq!(step(&mut r, 10.0), 1.0, "second action from the same chunk");
        assert_eq!(step(&mut r, 20.0), 20.0, "queue empty: new chunk");
        assert_eq!(r.queued(), 1);
        r.reset();
        assert_eq!(step(&mut r, 30.0), 30.0);
        assert_eq!(calls, 3);
    }
}
