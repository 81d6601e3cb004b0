//! Bounds before allocation: before `train` (or `info`) builds anything, the memory the run
//! will need — the estimator's predicted peak ([`crate::estimate::MemoryEstimate`]), or for `info` the
//! parameter bytes — is compared with the memory the machine has now: on the CPU backend the
//! kernel's `MemAvailable` (`/proc/meminfo`), lowered to the cgroup's limit when the process runs
//! in a container with one; on cuda the free device memory NVML reports; on wgpu nothing is
//! known and nothing is checked. A run whose estimate is above what is available is refused
//! with the bytes needed, the bytes available and the flags to change, instead of aborting on a
//! failed allocation (or being killed by the OOM killer) later.
//!
//! The estimate is within about 10 % of the measured peak (`benches/results/estimate`): only a
//! run whose estimate exceeds the available memory is refused, so a run that fits is never
//! turned away for the estimator's error. [`SKIP_ENV`]`=1` skips the check (swap, or memory
//! that will be freed before the run gets there).

use vramlab_bytes::human;

use crate::backend::BackendKind;
use crate::config::RunConfig;
use crate::error::{Result, WorkloadError};
use crate::estimate::MemoryEstimate;

/// `VRAMLAB_SKIP_MEMORY_CHECK=1`: run without the pre-flight memory check.
pub const SKIP_ENV: &str = "VRAMLAB_SKIP_MEMORY_CHECK";

/// The words every refusal of this check contains (`fit` reads a trial refused for them as one
/// that does not fit the machine).
pub const REFUSAL: &str = "more memory than this machine has available";

/// The words of the refusal of a batch too large to estimate at all ([`crate::estimate()`]).
pub const BEYOND: &str = "beyond what any machine has";

/// Memory the run can use now, and where the figure comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Available {
    pub bytes: u64,
    pub source: String,
}

/// Whether the check is switched off ([`SKIP_ENV`] set to anything but `0` or empty).
fn skipped() -> bool {
    std::env::var_os(SKIP_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line.split_whitespace().skip(1);
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => n.checked_mul(1024),
        Some(_) => None,
    }
}

/// The room left under the cgroup's memory limit (v2 `memory.max` − `memory.current`, or v1
/// `memory.limit_in_bytes` − `memory.usage_in_bytes`), when there is a limit.
fn cgroup_room() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok().and_then(|t| t.trim().parse::<u64>().ok());
    let (limit, used) = match read("/sys/fs/cgroup/memory.max") {
        Some(l) => (l, read("/sys/fs/cgroup/memory.current")?),
        None => (read("/sys/fs/cgroup/memory/memory.limit_in_bytes")?, read("/sys/fs/cgroup/memory/memory.usage_in_bytes")?),
    };
    // v1 reports "no limit" as a huge page-aligned number.
    (limit < 1 << 60).then(|| limit.saturating_sub(used))
}

/// What the machine (CPU backend) or device (cuda) has available for a run of `cfg` now;
/// `None` where it cannot be known (wgpu, no driver, no `/proc`).
pub fn available(cfg: &RunConfig) -> Option<Available> {
    match cfg.backend {
        BackendKind::Flex => {
            let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| mem_available(&t));
            match (meminfo, cgroup_room()) {
                (Some(m), Some(c)) if c < m => Some(Available { bytes: c, source: "left under this container's memory limit (cgroup)".into() }),
                (Some(m), _) => Some(Available { bytes: m, source: "MemAvailable in /proc/meminfo".into() }),
                (None, Some(c)) => Some(Available { bytes: c, source: "left under this container's memory limit (cgroup)".into() }),
                (None, None) => None,
            }
        }
        BackendKind::Cuda => {
            let m = vramlab_probe::nvml::NvmlDevice::open(cfg.device).ok()?.memory()?;
            Some(Available { bytes: m.total.saturating_sub(m.used), source: format!("free on cuda device {} (NVML)", cfg.device) })
        }
        _ => None,
    }
}

/// Refuses `need` bytes (`what`: what they are, e.g. "the estimated peak of a training step";
/// `kind`: "an estimate" or "exact") when they exceed `avail`; `change` names the flags that
/// lower them.
pub fn check_against(need: u64, what: &str, kind: &str, avail: &Available, change: &str) -> Result<()> {
    if need <= avail.bytes {
        return Ok(());
    }
    Err(WorkloadError::Preflight(format!(
        "{what} is {} ({need} bytes, {kind}), {REFUSAL}: {} ({} bytes, {}); {change} (or set {SKIP_ENV}=1 to run anyway)",
        human(need),
        human(avail.bytes),
        avail.bytes,
        avail.source
    )))
}

/// The policy flags the user set (`--policy.base_channels`, …), for a message on what makes the
/// model large.
fn policy_flags(cfg: &RunConfig) -> String {
    let flags: Vec<String> = cfg.policy.as_ref().map(|p| p.raw().keys().filter(|k| *k != "type").map(|k| format!("--policy.{k}")).collect()).unwrap_or_default();
    if flags.is_empty() { "a smaller --policy.preset or model size".into() } else { format!("a smaller model ({})", flags.join(", ")) }
}

/// Whether the check runs for `cfg`: not switched off, and the available memory is known.
pub fn applies(cfg: &RunConfig) -> Option<Available> {
    if skipped() { None } else { available(cfg) }
}

/// `train`: the estimated peak of a training step of `cfg` (`est`) against `avail`.
pub fn check_train(cfg: &RunConfig, est: &MemoryEstimate, avail: &Available) -> Result<()> {
    // The parameters, their gradients and AdamW's moments do not depend on the batch.
    let fixed = est.param_bytes + est.grad_bytes + est.optimizer_state_bytes;
    let change = if fixed > avail.bytes {
        format!("the parameters, gradients and optimizer state alone take {}: choose {}", human(fixed), policy_flags(cfg))
    } else {
        format!("lower --batch_size={} (or use --gradient_checkpointing=blocks, --precision=bf16, --grad_accum_steps)", cfg.batch_size)
    };
    check_against(est.peak_step_bytes, "the estimated peak of a training step", "an estimate", avail, &change)
}

/// `info`: the model's f32 parameter bytes (`params` parameters) against `avail`, before the
/// model is built.
pub fn check_info(cfg: &RunConfig, params: u64, avail: &Available) -> Result<()> {
    let need = params.saturating_mul(4);
    check_against(need, &format!("building the model's {} f32 parameters", crate::thousands(params)), "exact", avail, &format!("choose {}", policy_flags(cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       16384000 kB\nMemFree:         1000 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(mem_available(text), Some(8_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots kB\n"), None);
    }

    #[test]
    fn a_need_above_what_is_available_is_refused_with_both_figures_and_the_flags() {
        let avail = Available { bytes: 1 << 30, source: "test".into() };
        check_against(1 << 30, "x", "an estimate", &avail, "lower --batch_size").unwrap();
        let err = check_against((1 << 30) + 1, "the estimated peak", "an estimate", &avail, "lower --batch_size=9").unwrap_err().to_string();
        for want in ["the estimated peak", "1073741825 bytes", "an estimate", "1073741824 bytes", "--batch_size=9", SKIP_ENV, REFUSAL] {
            assert!(err.contains(want), "{want}: {err}");
        }
    }
}
