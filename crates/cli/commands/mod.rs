//! One module per subcommand.

pub mod dataset;
pub mod info;
pub mod predict;
pub mod sweep;
pub mod train;

use anyhow::{Result, anyhow};
use vramlab_models::nn::Precision;
use vramlab_train::CheckpointMode;

use crate::backend::BackendKind;
use crate::config::RunConfig;

/// The run-level switches every command validates the same way.
pub struct Switches {
    pub backend: BackendKind,
    pub precision: Precision,
    pub checkpointing: CheckpointMode,
}

impl Switches {
    pub fn from(cfg: &RunConfig) -> Result<Self> {
        let backend = BackendKind::parse(&cfg.backend)?;
        let precision = Precision::parse(&cfg.precision)
            .ok_or_else(|| anyhow!("--precision={}: unknown; valid: f32, bf16, f16", cfg.precision))?;
        let checkpointing = CheckpointMode::parse(&cfg.gradient_checkpointing).ok_or_else(|| {
            anyhow!("--gradient_checkpointing={}: unknown; valid: {}", cfg.gradient_checkpointing, CheckpointMode::NAMES)
        })?;
        Ok(Self { backend, precision, checkpointing })
    }
}

/// UTC timestamp `YYYYmmdd-HHMMSS` for default run names.
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}
