//! `vramlab probe-check`: does the memory probe of this backend report what the device holds?
//!
//! Allocates a fixed pattern of device buffers whose true high-water mark is known, samples the
//! probe after each step of the pattern, and checks the figures against the pattern:
//! - *allocated* at each sampled point equals the live bytes of the pattern (exactly, up to a
//!   few KiB of bookkeeping on the CPU backend);
//! - the *allocated peak* is exact on the counting allocator (it sees a transient buffer that no
//!   sample catches); on CubeCL it is the maximum of the samples, a lower bound that misses the
//!   transient, and the report says so;
//! - *reserved* never decreases and bounds the true peak from above (CubeCL's pools), so its
//!   final value is the exact reserved peak.

use crate::backend::TrainBackend;
use burn::prelude::*;
use vramlab_probe::{MemoryProbe, PeakKind};

use crate::backend::{BackendInfo, Job, dispatch};
use crate::{Result, RunConfig};

const MIB: u64 = 1 << 20;

/// One step of the pattern: allocate a buffer of `mib` MiB under `name`, or free `name`.
#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc(&'static str, u64),
    Free(&'static str),
    /// Allocate and free at once, with no sample in between.
    Transient(u64),
}

/// Live MiB after each op: 4, 16, 12, 14, 34, 22, (22 + 48 transient = 70), 28, 0.
const PATTERN: [Op; 9] = [
    Op::Alloc("a", 4),
    Op::Alloc("b", 12),
    Op::Free("a"),
    Op::Alloc("c", 2),
    Op::Alloc("d", 20),
    Op::Free("b"),
    Op::Transient(48),
    Op::Alloc("e", 6),
    Op::Free("c"),
];

/// The pattern's true high-water mark above the starting point, in bytes.
pub fn true_peak() -> u64 {
    let (mut live, mut peak) = (0u64, 0u64);
    let mut held: Vec<(&str, u64)> = Vec::new();
    for op in PATTERN {
        match op {
            Op::Alloc(n, m) => {
                live += m * MIB;
                held.push((n, m));
            }
            Op::Free(n) => {
                let i = held.iter().position(|(h, _)| *h == n).expect("freed buffers were allocated");
                live -= held.remove(i).1 * MIB;
            }
            Op::Transient(m) => peak = peak.max(live + m * MIB),
        }
        peak = peak.max(live);
    }
    peak
}

/// One sampled point of the pattern.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Point {
    pub op: String,
    pub expected_live: u64,
    pub allocated: u64,
    pub reserved: u64,
}

/// What the probe reported against the known pattern.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeCheck {
    pub backend: String,
    pub probe: String,
    pub allocated_kind: PeakKind,
    pub reserved_kind: PeakKind,
    pub points: Vec<Point>,
    pub true_peak: u64,
    /// The probe's allocated peak over the pattern, above the starting point.
    pub peak_allocated: u64,
    /// Reserved at the end (above the starting point's reserved).
    pub peak_reserved: u64,
    pub failures: Vec<String>,
}

impl ProbeCheck {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    pub fn markdown(&self) -> String {
        let mib = |b: u64| format!("{:.2}", b as f64 / MIB as f64);
        let mut s = format!(
            "# probe-check: {} (probe {}; allocated {:?}, reserved {:?})\n\n| after | expected live MiB | allocated MiB | reserved MiB |\n|---|---:|---:|---:|\n",
            self.backend, self.probe, self.allocated_kind, self.reserved_kind
        );
        for p in &self.points {
            s.push_str(&format!("| {} | {} | {} | {} |\n", p.op, mib(p.expected_live), mib(p.allocated), mib(p.reserved)));
        }
        s.push_str(&format!(
            "\ntrue high-water mark {} MiB; probe: allocated peak {} MiB ({}), reserved {} MiB\n",
            mib(self.true_peak),
            mib(self.peak_allocated),
            match self.allocated_kind {
                PeakKind::Exact => "exact",
                PeakKind::Sampled => "max of samples: a lower bound, misses the 48 MiB transient",
            },
            mib(self.peak_reserved)
        ));
        if self.passed() {
            s.push_str("result: all checks passed\n");
        } else {
            for f in &self.failures {
                s.push_str(&format!("FAILED: {f}\n"));
            }
        }
        s
    }
}

struct CheckJob;

impl Job for CheckJob {
    type Output = ProbeCheck;
    fn run<B: TrainBackend>(self, device: B::Device, probe: &dyn MemoryProbe, info: &BackendInfo) -> Result<ProbeCheck> {
        // Warm the device (context, pools' bookkeeping) before the starting point.
        drop(Tensor::<B, 1>::full([1024], 1.0, &device));
        let base = probe.sample();
        probe.reset_peak();
        let (allocated_kind, reserved_kind) = (probe.peak_kind(), probe.reserved_kind());
        let mut held: Vec<(&str, u64, Tensor<B, 1>)> = Vec::new();
        let mut points = Vec::new();
        let mut failures = Vec::new();
        let mut last_reserved = base.reserved;
        // `full`, not `empty`/`zeros`: on flex those build a byte vector and copy it into an
        // aligned one, a transient second copy the exact probe sees (and the pattern would not).
        let buffer = |mib: u64| Tensor::<B, 1>::full([(mib * MIB / 4) as usize], 1.0, &device);
        for op in PATTERN {
            let label = match op {
                Op::Alloc(n, m) => {
                    held.push((n, m, buffer(m)));
                    format!("alloc {n} ({m} MiB)")
                }
                Op::Free(n) => {
                    let i = held.iter().position(|(h, ..)| *h == n).expect("freed buffers were allocated");
                    held.remove(i);
                    format!("free {n}")
                }
                Op::Transient(m) => {
                    drop(buffer(m));
                    format!("alloc + free {m} MiB (no sample between)")
                }
            };
            let s = probe.sample();
            let expected_live: u64 = held.iter().map(|(_, m, _)| m * MIB).sum();
            let allocated = s.allocated.saturating_sub(base.allocated);
            let reserved = s.reserved.saturating_sub(base.reserved);
            // The CPU backend keeps a few small blocks of bookkeeping per tensor.
            let slack = if allocated_kind == PeakKind::Exact { 64 << 10 } else { 0 };
            if allocated.abs_diff(expected_live) > slack {
                failures.push(format!("after `{label}`: allocated {allocated} B, the pattern holds {expected_live} B"));
            }
            if reserved_kind == PeakKind::Exact && s.reserved < last_reserved {
                failures.push(format!("after `{label}`: reserved fell from {last_reserved} to {} B though the probe calls it never decreasing", s.reserved));
            }
            last_reserved = s.reserved;
            points.push(Point { op: label, expected_live, allocated, reserved });
        }
        drop(held);
        let peak = probe.peak();
        let true_peak = true_peak();
        let peak_allocated = peak.allocated.saturating_sub(base.allocated);
        let peak_reserved = peak.reserved.saturating_sub(base.reserved);
        let sampled_max = points.iter().map(|p| p.expected_live).max().unwrap_or(0);
        match allocated_kind {
            PeakKind::Exact if peak_allocated.abs_diff(true_peak) > 64 << 10 => {
                failures.push(format!("exact allocated peak {peak_allocated} B, true high-water mark {true_peak} B"))
            }
            PeakKind::Sampled if peak_allocated != sampled_max || peak_allocated > true_peak => failures.push(format!(
                "sampled allocated peak {peak_allocated} B: expected the largest sampled live bytes {sampled_max} B (≤ true {true_peak} B)"
            )),
            _ => {}
        }
        if reserved_kind == PeakKind::Exact && peak.reserved < base.reserved + true_peak {
            failures.push(format!("reserved peak {peak_reserved} B above the start is below the true high-water mark {true_peak} B: not an upper bound"));
        }
        Ok(ProbeCheck { backend: info.backend.to_string(), probe: info.probe.clone(), allocated_kind, reserved_kind, points, true_peak, peak_allocated, peak_reserved, failures })
    }
}

/// Run the check on the backend and device of `cfg` (`--backend`, `--device`).
pub fn run(cfg: &RunConfig) -> Result<ProbeCheck> {
    dispatch(cfg.backend, cfg.device, &cfg.gpu_options(), Default::default(), Default::default(), CheckJob)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_patterns_true_peak_includes_the_transient() {
        assert_eq!(super::true_peak(), 70 << 20);
    }
}
