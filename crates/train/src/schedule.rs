//! Learning-rate schedules (lerobot / diffusers names and formulas).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    #[default]
    Constant,
    /// Linear warmup from 0, then half a cosine down to 0 at `total_steps`
    /// (`get_cosine_schedule_with_warmup`, as lerobot's diffusion preset uses).
    Cosine,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    pub kind: ScheduleKind,
    pub warmup_steps: u64,
    pub total_steps: u64,
}

impl LrSchedule {
    pub fn constant() -> Self {
        Self { kind: ScheduleKind::Constant, warmup_steps: 0, total_steps: 0 }
    }

    /// Multiplier applied to every group's base lr at optimizer step `step` (0-based).
    pub fn factor(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return step as f64 / self.warmup_steps.max(1) as f64;
        }
        match self.kind {
            ScheduleKind::Constant => 1.0,
            ScheduleKind::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
                let progress = (step - self.warmup_steps) as f64 / span;
                (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())).max(0.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_with_warmup_matches_transformers() {
        let s = LrSchedule { kind: ScheduleKind::Cosine, warmup_steps: 10, total_steps: 110 };
        assert_eq!(s.factor(0), 0.0);
        assert!((s.factor(5) - 0.5).abs() < 1e-12);
        assert!((s.factor(10) - 1.0).abs() < 1e-12);
        assert!((s.factor(60) - 0.5).abs() < 1e-12);
        assert!(s.factor(110).abs() < 1e-12);
        assert_eq!(LrSchedule::constant().factor(1234), 1.0);
    }
}
