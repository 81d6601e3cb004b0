//! Claims: a number a report states and the assumptions under which it is reproduced
//! ([`crate::config::PaperConfig::with_assumptions`] applies them to a description).

use serde::{Deserialize, Serialize};

use crate::setup::{ActPrecision, Checkpointing, DType, Optimizer, Sharding};

/// Changes to the set-up under which a claim's number is reproduced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assume {
    pub weights: Option<DType>,
    pub grads: Option<DType>,
    pub optimizer: Option<Optimizer>,
    pub optimizer_state: Option<DType>,
    pub master_weights: Option<bool>,
    pub activations: Option<ActPrecision>,
    pub checkpointing: Option<Checkpointing>,
    pub batch: Option<u64>,
    pub gpus: Option<u64>,
    /// Count gradients (false: the claim leaves them out).
    pub include_grads: Option<bool>,
    /// Count activations.
    pub include_activations: Option<bool>,
    /// The claim's own parameter counts instead of the ones computed from the dims.
    pub total_params: Option<f64>,
    pub trainable_params: Option<f64>,
    /// Only these components (e.g. leave out a part the report did not count).
    pub only_components: Option<Vec<String>>,
    /// Leave out the `activation` entries whose name contains any of these strings.
    pub leave_out: Option<Vec<String>>,
}

/// What quantity a claim states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Quantity {
    Static,
    Activations,
    Total,
    /// Per-GPU total under `sharding`.
    PerGpu,
    /// Live bytes when the forward first fails to allocate on `[paper] gpu_memory_gib`.
    OomAllocated,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unit {
    #[serde(rename = "GiB")]
    Gib,
    #[serde(rename = "GB")]
    Gb,
}

impl Unit {
    pub fn bytes(self) -> f64 {
        match self {
            Unit::Gib => (1u64 << 30) as f64,
            Unit::Gb => 1e9,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Unit::Gib => "GiB",
            Unit::Gb => "GB",
        }
    }
}

/// A number a report states, and the set-up under which this crate reproduces it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    pub label: String,
    pub quantity: Quantity,
    /// The claimed value (a range's low end when `value_high` is given).
    pub value: f64,
    pub value_high: Option<f64>,
    pub unit: Unit,
    /// For `per-gpu`: the strategy (default `zero3`).
    pub sharding: Option<Sharding>,
    /// The report's own assumptions, applied to the description to reproduce its number.
    #[serde(default)]
    pub assume: Assume,
    /// A measurement of the same quantity, when one exists (same unit).
    pub measured: Option<f64>,
    /// Where the number comes from.
    pub source: Option<String>,
}
