//! What the latency bench reports: percentiles, the machine (CPU, cores, frequency governor),
//! the markdown table, `latency.jsonl` and `summary.md`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::{BenchReport, ModeRun};
use crate::{Result, WorkloadError};

/// The `q`-th percentile (0–100) of ascending `sorted`, linearly interpolated between the
/// closest ranks (numpy's default); `NaN` when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n => {
            let rank = q.clamp(0.0, 100.0) / 100.0 * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// Latency percentiles of a set of calls, in ms, and how many exceeded the frame budget.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyStats {
    pub n: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub overruns: usize,
}

impl LatencyStats {
    /// `None` for no calls.
    pub fn of(latencies_ms: impl IntoIterator<Item = f64>, budget_ms: f64) -> Option<Self> {
        let mut v: Vec<f64> = latencies_ms.into_iter().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let p = |q| percentile(&v, q);
        Some(Self { n: v.len(), p50: p(50.0), p95: p(95.0), p99: p(99.0), max: v[v.len() - 1], overruns: v.iter().filter(|&&l| l > budget_ms).count() })
    }
}

/// The CPU frequency governors (`cpufreq/scaling_governor`), CPUs per governor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Governor {
    /// No `cpufreq` in sysfs (most VMs and containers).
    NotExposed,
    Found(BTreeMap<String, usize>),
}

impl Governor {
    /// Read `<cpu_root>/cpu<N>/cpufreq/scaling_governor` (`cpu_root` is
    /// `/sys/devices/system/cpu` on Linux).
    pub fn read(cpu_root: &Path) -> Self {
        let mut found = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir(cpu_root) else { return Self::NotExposed };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let is_cpu = name.strip_prefix("cpu").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            if let (true, Ok(g)) = (is_cpu, std::fs::read_to_string(e.path().join("cpufreq/scaling_governor"))) {
                *found.entry(g.trim().to_string()).or_insert(0) += 1;
            }
        }
        if found.is_empty() { Self::NotExposed } else { Self::Found(found) }
    }

    /// `governor: performance (16 CPUs)` / `governor: not exposed by this machine`.
    pub fn line(&self) -> String {
        match self {
            Self::NotExposed => "governor: not exposed by this machine".into(),
            Self::Found(m) => {
                let parts: Vec<String> = m.iter().map(|(g, n)| format!("{g} ({n} CPU{})", if *n == 1 { "" } else { "s" })).collect();
                format!("governor: {}", parts.join(", "))
            }
        }
    }

    /// The warning to print when any CPU runs the `powersave` governor.
    pub fn warning(&self) -> Option<String> {
        let Self::Found(m) = self else { return None };
        let n = m.get("powersave")?;
        Some(format!(
            "WARNING: {n} CPU(s) run the `powersave` frequency governor: latencies will be several ms higher than the \
             hardware allows (7-8 ms extra per call at 30 Hz were traced to it). For real runs: \
             `sudo cpupower frequency-set -g performance`."
        ))
    }
}

/// The machine the bench ran on.
#[derive(Clone, Debug)]
pub struct Machine {
    pub cpu_model: String,
    pub cores: usize,
    pub governor: Governor,
    /// GPU models from `/proc/driver/nvidia` (empty elsewhere).
    pub gpus: Vec<String>,
}

impl Machine {
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo.lines().find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string()));
        let mut gpus: Vec<String> = std::fs::read_dir("/proc/driver/nvidia/gpus")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("information")).ok())
            .filter_map(|info| info.lines().find_map(|l| l.strip_prefix("Model:").map(|m| m.trim().to_string())))
            .collect();
        gpus.sort();
        Self {
            cpu_model: cpu_model.unwrap_or_else(|| "unknown CPU".into()),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            governor: Governor::read(Path::new("/sys/devices/system/cpu")),
            gpus,
        }
    }

    pub fn line(&self) -> String {
        let gpus = if self.gpus.is_empty() { String::new() } else { format!("; GPU: {}", self.gpus.join(", ")) };
        format!("{}, {} cores (nproc); {}{gpus}", self.cpu_model, self.cores, self.governor.line())
    }
}

fn ms(v: f64) -> String {
    if v >= 100.0 { format!("{v:.0}") } else { format!("{v:.2}") }
}

impl ModeRun {
    /// Calls per second over the measured calls (sleeps included).
    pub fn calls_per_s(&self) -> f64 {
        self.records.len() as f64 / self.wall_s.max(f64::MIN_POSITIVE)
    }
}

impl BenchReport {
    pub fn budget_ms(&self) -> f64 {
        1000.0 / self.fps
    }

    /// The markdown table: per mode, all calls and the model-running ones.
    pub fn table(&self) -> String {
        let budget = self.budget_ms();
        let mut s = format!(
            "| mode | calls | n | p50 ms | p95 ms | p99 ms | max ms | > {} ms | calls/s |\n|---|---|--:|--:|--:|--:|--:|--:|--:|\n",
            ms(budget)
        );
        let mut row = |mode: &str, which: &str, st: &LatencyStats, rate: String| {
            let _ = writeln!(s, "| {mode} | {which} | {} | {} | {} | {} | {} | {} | {rate} |", st.n, ms(st.p50), ms(st.p95), ms(st.p99), ms(st.max), st.overruns);
        };
        for run in &self.runs {
            let label = run.mode.label();
            let all = LatencyStats::of(run.records.iter().map(|r| r.latency_ms), budget);
            let model = LatencyStats::of(run.records.iter().filter(|r| r.ran_model).map(|r| r.latency_ms), budget);
            let every_call_runs = run.records.iter().all(|r| r.ran_model);
            if let Some(all) = &all {
                row(&label, if every_call_runs { "all (each runs the model)" } else { "all" }, all, format!("{:.1}", run.calls_per_s()));
            }
            if let (Some(m), false) = (&model, every_call_runs) {
                row(&label, "model-running", m, "—".into());
            }
            if let (Some(m), false) = (LatencyStats::of(run.records.iter().filter(|r| !r.ran_model).map(|r| r.latency_ms), budget), every_call_runs) {
                row(&label, "queued (no model)", &m, "—".into());
            }
        }
        s
    }

    /// The report's header lines (policy, backend, budget, machine, normalisation).
    pub fn header(&self) -> Vec<String> {
        vec![
            format!("checkpoint: {} ({})", self.checkpoint.display(), self.policy),
            format!(
                "backend: {} ({}); {} fps → budget {} ms per call; {} calls per mode after {} warmup calls",
                self.backend,
                self.precision.name(),
                self.fps,
                ms(self.budget_ms()),
                self.runs.first().map_or(0, |r| r.records.len()),
                self.warmup
            ),
            format!("machine: {}", self.machine.line()),
            self.normalisation.clone(),
        ]
    }

    /// `latency.jsonl` (one line per measured call) and `summary.md` in `dir`.
    pub fn write(&self, dir: &Path, command_line: &str) -> Result<()> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| WorkloadError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut jsonl = String::new();
        for run in &self.runs {
            for r in &run.records {
                let _ = writeln!(jsonl, r#"{{"mode":"{}","call":{},"ran_model":{},"latency_ms":{:.4}}}"#, run.mode.name(), r.call, r.ran_model, r.latency_ms);
            }
        }
        let path = dir.join("latency.jsonl");
        std::fs::write(&path, jsonl).map_err(io(&path))?;
        let path = dir.join("summary.md");
        std::fs::write(&path, self.summary_md(command_line)).map_err(io(&path))
    }

    fn summary_md(&self, command_line: &str) -> String {
        let mut s = format!("# Inference latency: {}\n\n```\n{command_line}\n```\n\n", self.policy);
        for line in self.header() {
            let _ = writeln!(s, "- {line}");
        }
        if let Some(w) = self.machine.governor.warning() {
            let _ = writeln!(s, "\n**{w}**");
        }
        let _ = write!(s, "\n{}\n", self.table());
        for note in NOTES.iter().map(|n| n.to_string()).chain(self.notes.iter().cloned()) {
            let _ = writeln!(s, "- {note}");
        }
        s
    }
}

/// How to read the numbers (also in the README).
const NOTES: &[&str] = &[
    "latency: from the raw observation (uint8 frames, state) to the unnormalised action on the host: \
     preprocessing (HWC→CHW, /255, upload, normalisation), `select_action`, unnormalisation and the copy back \
     (which waits for the device); the synthetic camera's capture is outside it",
    "fixed rate as lerobot's control loop: each call starts a period of 1/fps; the loop sleeps for what is left of it \
     and starts the next call at once when late",
    "queue mode: lerobot's `select_action` pops a queued action; every n_action_steps-th call runs the model; \
     temporal ensembling (ACT) runs the model on every call (n_action_steps = 1)",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let v: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 95.0), 96.0);
        assert_eq!(percentile(&v, 100.0), 101.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.5);
        assert!((percentile(&[1.0, 2.0, 3.0, 4.0], 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
        let st = LatencyStats::of([5.0, 1.0, 40.0, 3.0], 33.3).unwrap();
        assert_eq!((st.n, st.max, st.overruns, st.p50), (4, 40.0, 1, 4.0));
    }

    #[test]
    fn governor_from_a_fake_sysfs() {
        let root = vramlab_testkit::temp_dir("bench-report");
        assert_eq!(Governor::read(root.path()), Governor::NotExposed);
        assert_eq!(Governor::read(&root.path().join("missing")).line(), "governor: not exposed by this machine");
        for (cpu, g) in [("cpu0", "powersave\n"), ("cpu1", "performance\n"), ("cpu2", "powersave\n")] {
            std::fs::create_dir_all(root.path().join(cpu).join("cpufreq")).unwrap();
            std::fs::write(root.path().join(cpu).join("cpufreq/scaling_governor"), g).unwrap();
        }
        std::fs::create_dir_all(root.path().join("cpufreq")).unwrap(); // not a CPU
        let g = Governor::read(root.path());
        assert_eq!(g.line(), "governor: performance (1 CPU), powersave (2 CPUs)");
        assert!(g.warning().is_some_and(|w| w.contains("2 CPU(s)") && w.contains("powersave")));
        assert!(Governor::Found([("performance".to_string(), 2)].into()).warning().is_none());
    }
}
