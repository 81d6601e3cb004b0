//! What `fit` is asked ([`FitSpec`]) and what each of its trials is: the toggles of a
//! candidate ([`Toggles`]), how it ended ([`Status`]), its line of `fit.jsonl` ([`Trial`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

/// What `fit` is asked.
pub struct FitSpec<'a> {
    /// `vramlab` itself: each trial is `exe train …` in its own process.
    pub exe: &'a Path,
    pub config_file: Option<&'a Path>,
    /// Every flag of the command line (config fields, `output_dir` included).
    pub overrides: &'a [(String, String)],
    pub budget: u64,
    /// Steps per trial: the first pays one-time costs, the median of the others is the speed.
    pub trial_steps: u64,
    /// Upper end of the largest-batch search.
    pub max_batch: u64,
    /// Estimator pruning: candidates estimated above `prune × budget` are not run.
    pub prune: f64,
    pub command_line: String,
}

/// The toggles of one candidate (values as config flags take them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Toggles {
    pub batch_size: u64,
    pub grad_accum_steps: u64,
    pub precision: String,
    pub gradient_checkpointing: String,
    pub freeze_backbone: Option<bool>,
}

impl Toggles {
    pub(super) fn name(&self) -> String {
        let mut n = format!("b{}x{}_{}_ckpt-{}", self.batch_size, self.grad_accum_steps, self.precision, self.gradient_checkpointing);
        if self.freeze_backbone == Some(true) {
            n.push_str("_frozen");
        }
        n
    }

    pub(super) fn flags(&self) -> Vec<(String, String)> {
        let mut f = vec![
            ("batch_size".to_string(), self.batch_size.to_string()),
            ("grad_accum_steps".to_string(), self.grad_accum_steps.to_string()),
            ("precision".to_string(), self.precision.clone()),
            ("gradient_checkpointing".to_string(), self.gradient_checkpointing.clone()),
        ];
        if let Some(b) = self.freeze_backbone {
            f.push(("policy.freeze_backbone".to_string(), b.to_string()));
        }
        f
    }

    /// The settings as a person reads them.
    pub fn describe(&self) -> String {
        let mut d = format!("batch {} × accum {}, {}, checkpointing {}", self.batch_size, self.grad_accum_steps, self.precision, self.gradient_checkpointing);
        if self.freeze_backbone == Some(true) {
            d.push_str(", frozen backbone (not trained)");
        }
        d
    }
}

/// How a trial ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Ran every step; its measured peak is within the budget.
    Fits,
    /// Ran, but its measured peak is above the budget (GPU backends, which have no cap).
    OverBudget,
    /// Ended by the budget cap or a device out-of-memory error.
    OutOfMemory,
    /// Not run: the estimator puts it well over the budget.
    Pruned,
    /// Failed for another reason (its error is kept).
    Failed,
}

impl Status {
    pub(super) fn text(self) -> &'static str {
        match self {
            Status::Fits => "fits",
            Status::OverBudget => "over budget",
            Status::OutOfMemory => "out of memory",
            Status::Pruned => "skipped (estimate)",
            Status::Failed => "failed",
        }
    }
}

/// One finished trial (a line of `fit.jsonl`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Trial {
    pub name: String,
    /// `batch` (largest-batch search), `toggles` (fastest toggle set) or `verify`.
    pub search: String,
    pub toggles: Toggles,
    pub status: Status,
    /// Highest allocated bytes over all steps (exact on the CPU backend).
    pub peak_bytes: Option<u64>,
    /// Highest reserved bytes over all steps (RSS on CPU; CubeCL pools on GPU).
    pub reserved_bytes: Option<u64>,
    /// Median optimizer-step time after the first step.
    pub step_time_s: Option<f64>,
    pub samples_per_s: Option<f64>,
    /// The estimator's peak for this candidate, when it has one.
    pub estimate_bytes: Option<u64>,
    pub steps_done: u64,
    pub message: String,
}
