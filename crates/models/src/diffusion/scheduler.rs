//! Noise schedulers: diffusers' `DDPMScheduler` and `DDIMScheduler` as lerobot 0.4.4 builds them
//! (`_make_noise_scheduler(num_train_timesteps, beta_start, beta_end, beta_schedule,
//! clip_sample, clip_sample_range, prediction_type)`, every other argument at diffusers'
//! default: `variance_type="fixed_small"`, `timestep_spacing="leading"`, `steps_offset=0`,
//! `set_alpha_to_one=True`, `thresholding=False`, DDIM `eta=0`,
//! `use_clipped_model_output=False`).
//!
//! The tables are host-side and f32, computed as diffusers does: `betas` in f64 Python floats
//! then stored f32 (`squaredcos_cap_v2`, via `betas_for_alpha_bar`) or `torch.linspace` in f32
//! (`linear`, `scaled_linear`); `alphas = 1 − betas` in f32; `alphas_cumprod` = torch's CPU
//! `cumprod` (f64 accumulator, f32 results). A step's scalars (`ᾱ_t^½`, `(1−ᾱ_t)^½`, …) are
//! computed in f32 on the host exactly as diffusers' 0-d f32 tensors, then applied with tensor
//! ops (`sample`, model output and noise in f32), so no device sync is needed.
//!
//! Randomness is the caller's: [`NoiseScheduler::add_noise`] takes the noise and timesteps,
//! the DDPM step takes its variance noise.

use burn::prelude::*;
use crate::nn::LeanBackend;
use burn::tensor::TensorData;

use super::config::{BetaSchedule, DiffusionConfig, PredictionType, SchedulerKind};
use crate::nn::to_f32;

/// `torch.linspace(start, end, steps, dtype=float32)` (CPU kernel: f32 step, symmetric halves).
fn linspace_f32(start: f32, end: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps).map(|i| if i < half { start + step * i as f32 } else { end - step * (steps - i - 1) as f32 }).collect()
}

/// The `betas` table (f32) of a schedule.
pub fn betas(schedule: BetaSchedule, num_train_timesteps: usize, beta_start: f64, beta_end: f64) -> Vec<f32> {
    let t = num_train_timesteps;
    match schedule {
        BetaSchedule::Linear => linspace_f32(beta_start as f32, beta_end as f32, t),
        BetaSchedule::ScaledLinear => {
            linspace_f32(beta_start.sqrt() as f32, beta_end.sqrt() as f32, t).into_iter().map(|b| b * b).collect()
        }
        BetaSchedule::SquaredcosCapV2 => {
            let alpha_bar = |x: f64| ((x + 0.008) / 1.008 * std::f64::consts::PI / 2.0).cos().powi(2);
            (0..t)
                .map(|i| {
                    let (t1, t2) = (i as f64 / t as f64, (i + 1) as f64 / t as f64);
                    (1.0 - alpha_bar(t2) / alpha_bar(t1)).min(0.999) as f32
                })
                .collect()
        }
    }
}

/// A DDPM or DDIM scheduler with its inference timesteps set.
#[derive(Clone, Debug, PartialEq)]
pub struct NoiseScheduler {
    pub kind: SchedulerKind,
    pub prediction_type: PredictionType,
    pub num_train_timesteps: usize,
    pub clip_sample: bool,
    pub clip_sample_range: f64,
    pub betas: Vec<f32>,
    pub alphas: Vec<f32>,
    pub alphas_cumprod: Vec<f32>,
    /// `ᾱ` used after the last step: DDIM's `final_alpha_cumprod` (1 with `set_alpha_to_one`),
    /// DDPM's `self.one`.
    pub final_alpha_cumprod: f32,
    /// DDIM's `use_clipped_model_output` (diffusers' default `False`: the step keeps the model's
    /// ε even when `x₀` is clipped).
    pub use_clipped_model_output: bool,
    pub num_inference_steps: usize,
    /// Inference timesteps, descending (`set_timesteps`).
    pub timesteps: Vec<usize>,
}

impl NoiseScheduler {
    /// Build the scheduler from explicit settings; timesteps are set to `num_train_timesteps`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: SchedulerKind,
        schedule: BetaSchedule,
        num_train_timesteps: usize,
        beta_start: f64,
        beta_end: f64,
        prediction_type: PredictionType,
        clip_sample: bool,
        clip_sample_range: f64,
    ) -> Self {
        assert!(num_train_timesteps > 0, "NoiseScheduler: num_train_timesteps must be > 0");
        let betas = betas(schedule, num_train_timesteps, beta_start, beta_end);
        let alphas: Vec<f32> = betas.iter().map(|b| 1.0f32 - b).collect();
        let mut acc = 1f64;
        let alphas_cumprod = alphas
            .iter()
            .map(|a| {
                acc *= *a as f64;
                acc as f32
            })
            .collect();
        let mut s = Self {
            kind,
            prediction_type,
            num_train_timesteps,
            clip_sample,
            clip_sample_range,
            betas,
            alphas,
            alphas_cumprod,
            final_alpha_cumprod: 1.0,
            use_clipped_model_output: false,
            num_inference_steps: num_train_timesteps,
            timesteps: Vec::new(),
        };
        s.set_timesteps(num_train_timesteps);
        s
    }

    /// lerobot's `_make_noise_scheduler(config.noise_scheduler_type, …)` with
    /// `set_timesteps(num_inference_steps or num_train_timesteps)` (the scheduler, schedule and
    /// prediction type are typed when the config is read; [`DiffusionConfig::validate`] bounds
    /// `num_inference_steps`).
    pub fn from_config(cfg: &DiffusionConfig) -> Self {
        let mut s = Self::new(
            cfg.noise_scheduler_type,
            cfg.beta_schedule,
            cfg.num_train_timesteps,
            cfg.beta_start,
            cfg.beta_end,
            cfg.prediction_type,
            cfg.clip_sample,
            cfg.clip_sample_range,
        );
        s.set_timesteps(cfg.inference_steps());
        s
    }

    /// `set_timesteps(n)` with `timestep_spacing="leading"`, `steps_offset=0`:
    /// `arange(0, n) · (T // n)`, reversed.
    pub fn set_timesteps(&mut self, n: usize) {
        assert!(
            n > 0 && n <= self.num_train_timesteps,
            "set_timesteps: {n} inference steps for {} train timesteps",
            self.num_train_timesteps
        );
        let ratio = self.num_train_timesteps / n;
        self.num_inference_steps = n;
        self.timesteps = (0..n).rev().map(|i| i * ratio).collect();
    }

    /// The timestep after `t` in the reverse process (`t − T // n`; negative past the end).
    pub fn previous_timestep(&self, t: usize) -> i64 {
        t as i64 - (self.num_train_timesteps / self.num_inference_steps) as i64
    }

    fn alpha_prod(&self, t: i64) -> f32 {
        if t >= 0 { self.alphas_cumprod[t as usize] } else { self.final_alpha_cumprod }
    }

    /// `x₀` and `ε` from the model output (before clipping).
    fn split_prediction<B: LeanBackend>(&self, model_output: Tensor<B, 3>, sample: Tensor<B, 3>, a_t: f32) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let b_t = 1.0f32 - a_t;
        match self.prediction_type {
            PredictionType::Epsilon => {
                let x0 = (sample - model_output.clone().mul_scalar(b_t.sqrt())).div_scalar(a_t.sqrt());
                (x0, model_output)
            }
            PredictionType::Sample => {
                let eps = (sample - model_output.clone().mul_scalar(a_t.sqrt())).div_scalar(b_t.sqrt());
                (model_output, eps)
            }
        }
    }

    fn clip<B: LeanBackend>(&self, x0: Tensor<B, 3>) -> Tensor<B, 3> {
        if self.clip_sample {
            let r = self.clip_sample_range;
            x0.clamp(-r, r)
        } else {
            x0
        }
    }

    /// One reverse step `x_t → x_{t−1}` (diffusers' `step(...).prev_sample`), in f32.
    /// `variance_noise` is DDPM's `randn` for `t > 0` (required then; ignored by DDIM, whose
    /// `eta` is 0).
    ///
    /// # Shapes
    /// - model_output, sample, variance_noise: `[b, horizon, action_dim]` → same (f32)
    pub fn step<B: LeanBackend>(&self, model_output: Tensor<B, 3>, t: usize, sample: Tensor<B, 3>, variance_noise: Option<Tensor<B, 3>>) -> Tensor<B, 3> {
        assert!(t < self.num_train_timesteps, "step: timestep {t} >= num_train_timesteps {}", self.num_train_timesteps);
        let (model_output, sample) = (to_f32(model_output), to_f32(sample));
        let prev_t = self.previous_timestep(t);
        let a_t = self.alphas_cumprod[t];
        let a_prev = self.alpha_prod(prev_t);
        let b_t = 1.0f32 - a_t;
        let (x0, eps) = self.split_prediction(model_output, sample.clone(), a_t);
        let x0 = self.clip(x0);
        match self.kind {
            SchedulerKind::Ddim => {
                let eps = if self.use_clipped_model_output {
                    (sample - x0.clone().mul_scalar(a_t.sqrt())).div_scalar(b_t.sqrt())
                } else {
                    eps
                };
                // std_dev_t = eta · variance^½ = 0.
                x0.mul_scalar(a_prev.sqrt()) + eps.mul_scalar((1.0f32 - a_prev - 0.0f32).sqrt())
            }
            SchedulerKind::Ddpm => {
                let b_prev = 1.0f32 - a_prev;
                let current_alpha = a_t / a_prev;
                let current_beta = 1.0f32 - current_alpha;
                let c_x0 = a_prev.sqrt() * current_beta / b_t;
                let c_xt = current_alpha.sqrt() * b_prev / b_t;
                let mean = x0.mul_scalar(c_x0) + sample.mul_scalar(c_xt);
                if t == 0 {
                    return mean;
                }
                let noise = variance_noise.expect("DDPM step at t > 0 needs its variance noise (caller-provided randomness)");
                mean + to_f32(noise).mul_scalar(self.variance(t).sqrt())
            }
        }
    }

    /// DDPM's `_get_variance(t)` for `variance_type="fixed_small"`:
    /// `(1 − ᾱ_prev) / (1 − ᾱ_t) · (1 − ᾱ_t / ᾱ_prev)`, clamped to ≥ 1e-20 (f32).
    pub fn variance(&self, t: usize) -> f32 {
        let a_t = self.alphas_cumprod[t];
        let a_prev = self.alpha_prod(self.previous_timestep(t));
        let current_beta = 1.0f32 - a_t / a_prev;
        ((1.0f32 - a_prev) / (1.0f32 - a_t) * current_beta).max(1e-20)
    }

    /// `add_noise(original, noise, timesteps)`: `ᾱ_t^½ · x₀ + (1 − ᾱ_t)^½ · ε` per sample
    /// (f32), one timestep per batch element.
    ///
    /// # Shapes
    /// - original, noise: `[b, horizon, action_dim]`; timesteps: `b` entries → `[b, horizon, action_dim]`
    pub fn add_noise<B: LeanBackend>(&self, original: Tensor<B, 3>, noise: Tensor<B, 3>, timesteps: &[usize]) -> Tensor<B, 3> {
        let b = original.dims()[0];
        assert_eq!(timesteps.len(), b, "add_noise: one timestep per batch element");
        let device = original.device();
        let coef = |f: &dyn Fn(f32) -> f32| {
            let v: Vec<f32> = timesteps
                .iter()
                .map(|&t| {
                    assert!(t < self.num_train_timesteps, "add_noise: timestep {t} >= num_train_timesteps {}", self.num_train_timesteps);
                    f(self.alphas_cumprod[t])
                })
                .collect();
            Tensor::<B, 3>::from_data(TensorData::new(v, [b, 1, 1]), &device)
        };
        let sqrt_alpha = coef(&|a| a.sqrt());
        let sqrt_one_minus = coef(&|a| (1.0f32 - a).sqrt());
        sqrt_alpha * to_f32(original) + sqrt_one_minus * to_f32(noise)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    fn cosine(t: usize) -> NoiseScheduler {
        NoiseScheduler::new(SchedulerKind::Ddim, BetaSchedule::SquaredcosCapV2, t, 1e-4, 0.02, PredictionType::Epsilon, true, 1.0)
    }

    #[test]
    fn alphas_cumprod_follow_the_cosine_formula() {
        let s = cosine(100);
        let alpha_bar = |x: f64| ((x + 0.008) / 1.008 * std::f64::consts::PI / 2.0).cos().powi(2);
        // ᾱ_i = Π_{j<=i} (1 − β_j) = alpha_bar((i+1)/T) / alpha_bar(0) while no β is capped.
        let first = alpha_bar(0.01) / alpha_bar(0.0);
        assert!((s.alphas_cumprod[0] as f64 - first).abs() < 1e-7, "{} vs {first}", s.alphas_cumprod[0]);
        assert!((s.betas[0] as f64 - (1.0 - first)).abs() < 1e-9);
        assert!(s.betas.iter().all(|b| *b > 0.0 && *b <= 0.999));
        assert_eq!(s.betas[99], 0.999, "the last beta is capped");
        let uncapped = alpha_bar(0.99) / alpha_bar(0.0);
        assert!((s.alphas_cumprod[98] as f64 - uncapped).abs() < 1e-6);
        let last = uncapped * (1.0 - 0.999f32 as f64);
        assert!((s.alphas_cumprod[99] as f64 - last).abs() < 1e-9, "{} vs {last}", s.alphas_cumprod[99]);
        assert!(s.alphas_cumprod.windows(2).all(|w| w[1] < w[0]));
    }

    #[test]
    fn leading_timesteps() {
        let mut s = cosine(100);
        s.set_timesteps(10);
        assert_eq!(s.timesteps, [90, 80, 70, 60, 50, 40, 30, 20, 10, 0]);
        assert_eq!(s.previous_timestep(90), 80);
        assert_eq!(s.previous_timestep(0), -10);
        s.set_timesteps(3);
        assert_eq!(s.timesteps, [66, 33, 0]);
        s.set_timesteps(100);
        assert_eq!(s.timesteps.len(), 100);
        assert_eq!((s.timesteps[0], s.timesteps[99]), (99, 0));
    }

    #[test]
    fn linear_schedules_match_torch_linspace() {
        let b = betas(BetaSchedule::Linear, 1000, 1e-4, 0.02);
        assert_eq!((b[0], b[999]), (1e-4f32, 0.02f32));
        assert!((b[500] as f64 - (1e-4 + 500.0 * (0.02 - 1e-4) / 999.0)).abs() < 1e-8);
        let s = betas(BetaSchedule::ScaledLinear, 10, 1e-4, 0.02);
        assert!((s[0] - 1e-4).abs() < 1e-10 && (s[9] - 0.02).abs() < 1e-8);
    }

    #[test]
    fn ddim_step_recovers_clean_sample_at_the_end_and_add_noise_inverts() {
        type B = Flex;
        let dev = Default::default();
        let mut s = cosine(100);
        s.set_timesteps(10);
        let x0 = Tensor::<B, 3>::from_floats([[[0.5, -0.25]]], &dev);
        let eps = Tensor::<B, 3>::from_floats([[[1.0, -2.0]]], &dev);
        // With the exact ε, one DDIM step from any t lands on the noised x0 at prev_t.
        let xt = s.add_noise(x0.clone(), eps.clone(), &[50]);
        let prev = s.step(eps.clone(), 50, xt, None);
        let want = s.add_noise(x0.clone(), eps.clone(), &[40]);
        let d = (prev - want).abs().max().into_scalar();
        assert!(d < 1e-5, "{d}");
        // At t = 0 the step returns x0 (ᾱ_prev = 1).
        let x = s.add_noise(x0.clone(), eps.clone(), &[0]);
        let d = (s.step(eps.clone(), 0, x, None) - x0.clone()).abs().max().into_scalar();
        assert!(d < 1e-5, "{d}");
        // DDPM with zero variance noise at t = 0 also returns x0; at t > 0 it needs noise.
        let ddpm = NoiseScheduler { kind: SchedulerKind::Ddpm, ..s.clone() };
        let x = ddpm.add_noise(x0.clone(), eps.clone(), &[0]);
        let d = (ddpm.step(eps.clone(), 0, x, None) - x0.clone()).abs().max().into_scalar();
        assert!(d < 1e-5, "{d}");
        assert!(ddpm.variance(50) > 0.0);
        let x = ddpm.add_noise(x0.clone(), eps.clone(), &[50]);
        let zero = Tensor::<B, 3>::zeros([1, 1, 2], &dev);
        let mean = ddpm.step(eps.clone(), 50, x.clone(), Some(zero));
        let noisy = ddpm.step(eps.clone(), 50, x, Some(Tensor::ones([1, 1, 2], &dev)));
        let d: Vec<f32> = (noisy - mean).into_data().to_vec().unwrap();
        assert!((d[0] - ddpm.variance(50).sqrt()).abs() < 1e-6);
    }
}
