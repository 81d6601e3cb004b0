//! Kernel accounting for CubeCL backends (wgpu, cuda): kernel launches, kernels compiled or
//! loaded from CubeCL's disk cache, autotune searches and the time they took, counted from the
//! messages CubeCL 0.10 sends through the `log` crate.
//!
//! CubeCL has no counters to read; what it has are loggers. This module installs a `log::Log`
//! that counts, per process:
//! - **launches**: CubeCL's *profiling* logger at level `minimal` sends `Executing <kernel>` for
//!   every launch (`<kernel>` a timed line `| <duration> | <kernel>` at levels `basic`+) to the
//!   sinks it is given; the backend gives it the `log` crate ([`PROFILING_TARGET`]). Every launch
//!   through `ComputeClient::launch`/`launch_unchecked` is counted, those of autotune's
//!   benchmarks included. CubeCL sends these lines from a logger thread, so [`settle`] waits for
//!   it to go quiet before a step is closed: the total is exact, the split between two steps can
//!   move a few launches when that thread is descheduled for more than [`SETTLE_QUIET`].
//! - **compiled**: a kernel CubeCL compiles in this process (each distinct kernel id, once):
//!   wgpu logs `[cubecl-wgpu] compiling WGSL module` at trace level when it creates a module,
//!   CUDA `Compiling kernel` before NVRTC. Exact.
//! - **from cache**: a compiled kernel read from CubeCL's disk cache instead (`Using PTX cache`,
//!   `Using SPIR-V cache`). Exact. WGSL kernels have no disk cache in CubeCL 0.10.
//! - **autotune searches** and **autotune seconds**: `Tuning <key>` (info, when an autotune key
//!   misses the cache) starts a search; the autotune logger's `Fastest result <name>-<key>` (sent
//!   synchronously on the same thread when the search ends) closes it. The time between the two
//!   is measured wall time (compiling and benchmarking every candidate). A search with a single
//!   candidate ends without a result line and is counted with zero seconds.
//!
//! - **launches by kernel**: the same launch lines, counted per kernel name (the `<kernel>` of the
//!   line: the kernel's type name as CubeCL formats it, generic arguments as ` | `-separated
//!   parts; [`short_name`] cuts long ones for display). Exact in the same way as the total, which
//!   they sum to.
//!
//! - **time by kernel** (opt-in: only when CubeCL's profiling level is `basic` or above, which
//!   vramlab sets for `VRAMLAB_KERNEL_ACCOUNTING=time`): the durations of the timed lines
//!   `| <duration> | <kernel>`, summed per kernel name. CubeCL 0.10 times a kernel by wrapping
//!   its launch in `ComputeClient::profile` (`cubecl-runtime` `client.rs`, `launch_inner`): the
//!   server is taken exclusively, pending work is flushed (wgpu, device timing) or the device is
//!   synchronised (system timing), the kernel is submitted alone and its end is recorded. The
//!   duration is the device's timestamps around the kernel where the adapter has timestamp
//!   queries (`TimingMethod::Device`), else host wall time from a sync before to a sync after
//!   (`TimingMethod::System`). Either way every kernel becomes its own submission: a timed step
//!   is slower than an untimed one and its kernels do not overlap, so the times say where a step
//!   goes kernel by kernel, not what the untimed step takes.
//!
//! - **trace** (opt-in, `VRAMLAB_KERNEL_TRACE=<file>`): every launch's kernel name in order.
//!
//! Time spent compiling kernels outside autotune is not logged by CubeCL with a duration; reports
//! infer it from step 1's time over the steady step and say so.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The `log` target CubeCL's own loggers (compilation, profiling, autotune) write to when they are
/// given the `log` crate as a sink (`cubecl_common::config::logger`).
pub const PROFILING_TARGET: &str = "cubecl_common::config::logger";
const TUNER_TARGET: &str = "cubecl_runtime::tune::tuner";
const WGPU_COMPILE_TARGET: &str = "cubecl_wgpu::backend::base";
const CUDA_COMPILE_TARGET: &str = "cubecl_cuda::compute::context";

/// How long no launch line may arrive before [`settle`] returns.
pub const SETTLE_QUIET: Duration = Duration::from_millis(3);

/// Kernel counts since the start of the process (or, as a difference, over a step).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct KernelCounts {
    /// Kernel launches (autotune's benchmark launches included).
    pub launches: u64,
    /// Kernels compiled in this process (WGSL modules on wgpu, NVRTC programs on CUDA).
    pub compiled: u64,
    /// Compiled kernels read from CubeCL's disk cache instead of compiled (CUDA PTX, SPIR-V).
    pub from_cache: u64,
    /// Autotune searches started (an autotune key missing from the in-memory and disk caches).
    pub autotune_searches: u64,
    /// Wall time of those searches, seconds.
    pub autotune_s: f64,
    /// Launches per kernel name as CubeCL logs it, most launched first (ties by name); kernels
    /// with no launch are left out. Sums to `launches`.
    pub by_kernel: Vec<(String, u64)>,
    /// Timed seconds per kernel name (timed profiling levels only: see the module's header),
    /// most time first (ties by name); kernels with no timed launch are left out. Empty when
    /// kernels are not timed.
    pub time_by_kernel: Vec<(String, f64)>,
}

impl std::ops::Sub for KernelCounts {
    type Output = KernelCounts;
    fn sub(self, o: KernelCounts) -> KernelCounts {
        let before: HashMap<&str, u64> = o.by_kernel.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        let by_kernel = self.by_kernel.iter().filter_map(|(k, n)| Some((k.clone(), n.checked_sub(before.get(k.as_str()).copied().unwrap_or(0)).filter(|&d| d > 0)?))).collect();
        let time_before: HashMap<&str, f64> = o.time_by_kernel.iter().map(|(k, t)| (k.as_str(), *t)).collect();
        let time_by_kernel = self.time_by_kernel.iter().filter_map(|(k, t)| Some((k.clone(), Some(t - time_before.get(k.as_str()).copied().unwrap_or(0.0)).filter(|&d| d > 0.0)?))).collect();
        KernelCounts {
            launches: self.launches.saturating_sub(o.launches),
            compiled: self.compiled.saturating_sub(o.compiled),
            from_cache: self.from_cache.saturating_sub(o.from_cache),
            autotune_searches: self.autotune_searches.saturating_sub(o.autotune_searches),
            autotune_s: (self.autotune_s - o.autotune_s).max(0.0),
            by_kernel: sorted(by_kernel),
            time_by_kernel: sorted_by_time(time_by_kernel),
        }
    }
}

/// Most time first, ties by name.
fn sorted_by_time(mut v: Vec<(String, f64)>) -> Vec<(String, f64)> {
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// A duration as Rust's `Debug` writes it (CubeCL's timed lines: `12.5µs`, `3.25ms`, `1.5s`,
/// `800ns`, padded with spaces). `None` for anything else.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "µs" | "us" => 1e-6,
        "ns" => 1e-9,
        _ => return None,
    };
    Duration::try_from_secs_f64(value * scale).ok()
}

/// Most launched first, ties by name (a stable order for reports and tests).
fn sorted(mut v: Vec<(String, u64)>) -> Vec<(String, u64)> {
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// A kernel name for display. CubeCL 0.10 logs a kernel's type name in its "balanced" format,
/// generic arguments as ` | `-separated parts (`KernelBinop | AddOp | WgpuRuntime`); a name of
/// more than [`SHORT_PARTS`]` + 2` parts (a matmul's runs to thirty) keeps its first
/// [`SHORT_PARTS`] and ` | …`. A full type name (`burn_cubecl::kernel::binary::Op<f32,
/// burn_cubecl::ops::AddOp>`) loses its module paths (`Op<f32, AddOp>`): every path segment
/// before a `::` goes; the generic arguments and their nesting stay.
pub fn short_name(name: &str) -> String {
    let parts: Vec<&str> = name.split(" | ").collect();
    if parts.len() > SHORT_PARTS + 2 {
        return format!("{} | …", parts[..SHORT_PARTS].iter().map(|p| drop_paths(p)).collect::<Vec<_>>().join(" | "));
    }
    drop_paths(name)
}

/// How many ` | `-separated parts a long kernel name keeps ([`short_name`]).
pub const SHORT_PARTS: usize = 4;

fn drop_paths(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    // Where the identifier being written started in `out`.
    let mut word_start = 0;
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.truncate(word_start);
            continue;
        }
        out.push(c);
        if !(c.is_alphanumeric() || c == '_') {
            word_start = out.len();
        }
    }
    out
}

static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static COMPILED: AtomicU64 = AtomicU64::new(0);
static FROM_CACHE: AtomicU64 = AtomicU64::new(0);
static SEARCHES: AtomicU64 = AtomicU64::new(0);
static TUNE_NANOS: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Launches and timed nanoseconds per kernel name (the name as logged).
static BY_KERNEL: Mutex<Option<HashMap<String, (u64, u64)>>> = Mutex::new(None);
/// The search in progress: its key and start (searches block the thread that asked).
static PENDING_TUNE: Mutex<Option<(String, Instant)>> = Mutex::new(None);

/// Totals since the process started.
pub fn totals() -> KernelCounts {
    let map = BY_KERNEL.lock().unwrap_or_else(|p| p.into_inner());
    KernelCounts {
        launches: LAUNCHES.load(Ordering::Relaxed),
        compiled: COMPILED.load(Ordering::Relaxed),
        from_cache: FROM_CACHE.load(Ordering::Relaxed),
        autotune_searches: SEARCHES.load(Ordering::Relaxed),
        autotune_s: TUNE_NANOS.load(Ordering::Relaxed) as f64 * 1e-9,
        by_kernel: sorted(map.iter().flatten().map(|(k, (n, _))| (k.clone(), *n)).collect()),
        time_by_kernel: sorted_by_time(map.iter().flatten().filter(|(_, (_, t))| *t > 0).map(|(k, (_, t))| (k.clone(), *t as f64 * 1e-9)).collect()),
    }
}

/// Whether the counting logger is the process's `log` logger.
pub fn is_installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// Install the counting logger as the process's `log` logger (idempotent). Fails when another
/// logger is installed: then nothing is counted. Messages are counted, never printed.
pub fn install() -> Result<(), String> {
    static COUNTER: Counter = Counter;
    if is_installed() {
        return Ok(());
    }
    log::set_logger(&COUNTER).map_err(|_| "another `log` logger is installed: kernel accounting is off".to_string())?;
    // Compilation lines are at trace level; the logger drops every other target at once.
    log::set_max_level(log::LevelFilter::Trace);
    INSTALLED.store(true, Ordering::Relaxed);
    Ok(())
}

/// Wait until CubeCL's logger thread has delivered the launch lines of the work submitted so far:
/// returns once no line has arrived for [`SETTLE_QUIET`] (at most 250 ms). Call after a device
/// sync, so that every launch has been submitted.
pub fn settle() {
    if !is_installed() {
        return;
    }
    let deadline = Instant::now() + Duration::from_millis(250);
    let mut last = LAUNCHES.load(Ordering::Relaxed);
    while Instant::now() < deadline {
        std::thread::sleep(SETTLE_QUIET);
        let now = LAUNCHES.load(Ordering::Relaxed);
        if now == last {
            return;
        }
        last = now;
    }
}

struct Counter;

impl log::Log for Counter {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.target().starts_with("cubecl")
    }

    fn log(&self, record: &log::Record) {
        let target = record.target();
        if !target.starts_with("cubecl") {
            return;
        }
        classify(target, record.level(), record.args());
    }

    fn flush(&self) {}
}

/// Count one message (the `log` record's target, level and text).
fn classify(target: &str, level: log::Level, args: &fmt::Arguments) {
    let head = Prefix::of(args);
    let head = head.as_str();
    match (target, level) {
        (PROFILING_TARGET, _) if head.starts_with("Executing ") || head.starts_with("| ") => {
            count_launch(args);
        }
        (PROFILING_TARGET, _) if head.starts_with("Fastest result ") => {
            let text = args.to_string();
            let mut pending = PENDING_TUNE.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, t0)) = pending.take_if(|(key, _)| text.contains(key.as_str())) {
                TUNE_NANOS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
        (TUNER_TARGET, log::Level::Info) if head.starts_with("Tuning ") => {
            let key = args.to_string()["Tuning ".len()..].to_string();
            SEARCHES.fetch_add(1, Ordering::Relaxed);
            // A search is blocking: one still open here had a single candidate and no result line.
            *PENDING_TUNE.lock().unwrap_or_else(|p| p.into_inner()) = Some((key, Instant::now()));
        }
        (WGPU_COMPILE_TARGET | CUDA_COMPILE_TARGET, log::Level::Trace) => {
            if head.starts_with("[cubecl-wgpu] compiling") || head.starts_with("Compiling kernel") {
                COMPILED.fetch_add(1, Ordering::Relaxed);
            } else if head.starts_with("Using PTX cache") || head.starts_with("Using SPIR-V cache") {
                FROM_CACHE.fetch_add(1, Ordering::Relaxed);
            }
        }
        _ => {}
    }
}

/// `VRAMLAB_KERNEL_TRACE=<file>`: every launch's kernel name, one per line in launch order,
/// appended to that file (to see which kernels an op launches, e.g. the copies around a
/// convolution); unset, nothing is written.
fn trace(name: &str) {
    use std::io::Write;
    static FILE: std::sync::OnceLock<Option<Mutex<std::io::LineWriter<std::fs::File>>>> = std::sync::OnceLock::new();
    let file = FILE.get_or_init(|| {
        let path = std::env::var_os("VRAMLAB_KERNEL_TRACE").filter(|p| !p.is_empty())?;
        match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
            Ok(f) => Some(Mutex::new(std::io::LineWriter::new(f))),
            Err(e) => {
                eprintln!("vramlab: VRAMLAB_KERNEL_TRACE={}: {e}; no kernel trace", std::path::Path::new(&path).display());
                None
            }
        }
    });
    if let Some(f) = file {
        let _ = writeln!(f.lock().unwrap_or_else(|p| p.into_inner()), "{name}");
    }
}

/// One launch line: `Executing <kernel>` or `| <duration> | <kernel>` (its duration added to
/// the kernel's time). The per-kernel count is updated before the total, so a reading never
/// shows more launches in total than by kernel.
fn count_launch(args: &fmt::Arguments) {
    let text = args.to_string();
    let (name, nanos) = match text.strip_prefix("Executing ") {
        Some(name) => (name, 0),
        None => text[2..].split_once(" | ").map_or(("?", 0), |(d, name)| (name, parse_duration(d).map_or(0, |d| d.as_nanos() as u64))),
    };
    trace(name);
    let mut map = BY_KERNEL.lock().unwrap_or_else(|p| p.into_inner());
    let map = map.get_or_insert_with(HashMap::new);
    match map.get_mut(name) {
        Some((n, t)) => {
            *n += 1;
            *t += nanos;
        }
        None => {
            map.insert(name.to_string(), (1, nanos));
        }
    }
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
}

/// The first bytes of a message, formatted without allocating (a launch line per kernel).
struct Prefix {
    buf: [u8; 32],
    len: usize,
}

impl Prefix {
    fn of(args: &fmt::Arguments) -> Prefix {
        let mut p = Prefix { buf: [0; 32], len: 0 };
        // Stops with an error once the buffer is full: only the head is needed.
        let _ = fmt::write(&mut p, *args);
        p
    }
    fn as_str(&self) -> &str {
        // The buffer may end inside a multi-byte character: keep the valid part.
        match std::str::from_utf8(&self.buf[..self.len]) {
            Ok(s) => s,
            Err(e) => std::str::from_utf8(&self.buf[..e.valid_up_to()]).unwrap_or(""),
        }
    }
}

impl fmt::Write for Prefix {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - self.len;
        let n = room.min(s.len());
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() { Err(fmt::Error) } else { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters are global: the messages of one test must not be counted by another.
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        static LOCK: Mutex<()> = Mutex::new(());
        LOCK.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[test]
    fn counts_cubecls_messages_by_target_and_text() {
        let _serial = serial();
        let before = totals();
        let name = "burn_cubecl::kernel::binary::kernel_scalar_binop<f32, burn_cubecl::ops::AddOp>";
        for _ in 0..5 {
            classify(PROFILING_TARGET, log::Level::Info, &format_args!("Executing {name}"));
        }
        classify(PROFILING_TARGET, log::Level::Info, &format_args!("| {:<10?} | {name}", Duration::from_micros(12)));
        // Other lines of the same logger (compilation, memory) are not launches.
        classify(PROFILING_TARGET, log::Level::Info, &format_args!("[Compiling kernel] {name}"));
        classify(WGPU_COMPILE_TARGET, log::Level::Trace, &format_args!("[cubecl-wgpu] compiling WGSL module `{}`\n{}", "main", "fn main() {}"));
        classify(CUDA_COMPILE_TARGET, log::Level::Trace, &format_args!("Compiling kernel"));
        classify(CUDA_COMPILE_TARGET, log::Level::Trace, &format_args!("Using PTX cache"));
        // The same text under another target is not CubeCL's.
        classify("wgpu_core::device", log::Level::Trace, &format_args!("Compiling kernel"));
        let d = totals() - before;
        assert_eq!((d.launches, d.compiled, d.from_cache), (6, 2, 1), "{d:?}");
        assert_eq!(d.by_kernel, vec![(name.to_string(), 6)], "{d:?}");
    }

    #[test]
    fn launches_are_counted_per_kernel_and_a_step_keeps_only_its_own() {
        let _serial = serial();
        let (a, b, c) = ("m::Reduce<f32>", "m::Matmul<f32, m::Tile<4>>", "m::Copy");
        classify(PROFILING_TARGET, log::Level::Info, &format_args!("Executing {c}"));
        let before = totals();
        for name in [a, b, a, b, a, "m::Zeta", "m::Alpha"] {
            classify(PROFILING_TARGET, log::Level::Info, &format_args!("Executing {name}"));
        }
        classify(PROFILING_TARGET, log::Level::Info, &format_args!("| {:<10?} | {b}", Duration::from_micros(3)));
        let d = totals() - before;
        // Most launched first, ties by name; `Copy` launched only before the step is absent.
        let want: Vec<(String, u64)> = [(b, 3), (a, 3), ("m::Alpha", 1), ("m::Zeta", 1)].iter().map(|(k, n)| (k.to_string(), *n)).collect();
        assert_eq!(d.by_kernel, want);
        assert_eq!(d.launches, d.by_kernel.iter().map(|(_, n)| n).sum::<u64>());
    }

    #[test]
    fn durations_parse_as_rusts_debug_writes_them() {
        for d in [Duration::from_nanos(800), Duration::from_micros(12), Duration::from_nanos(12_345), Duration::from_micros(3_250), Duration::from_millis(1_500), Duration::ZERO] {
            let text = format!("{d:<10?}");
            let back = parse_duration(&text).unwrap_or_else(|| panic!("{text:?}"));
            assert!((back.as_secs_f64() - d.as_secs_f64()).abs() <= 1e-12 + 1e-9 * d.as_secs_f64(), "{text:?} → {back:?}");
        }
        assert_eq!(parse_duration(" 2.5ms "), Some(Duration::from_micros(2_500)));
        assert_eq!(parse_duration("7us"), Some(Duration::from_micros(7)));
        for bad in ["", "ms", "12", "12 ms", "1.2.3s", "5min", "-3ms"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn timed_lines_add_their_durations_per_kernel_and_a_step_keeps_only_its_own() {
        let _serial = serial();
        let (conv, copy) = ("t::Conv<f32>", "t::Copy");
        classify(PROFILING_TARGET, log::Level::Info, &format_args!("| {:<10?} | {conv}", Duration::from_millis(40)));
        let before = totals();
        for us in [1500, 2500] {
            classify(PROFILING_TARGET, log::Level::Info, &format_args!("| {:<10?} | {conv}", Duration::from_micros(us)));
        }
        classify(PROFILING_TARGET, log::Level::Info, &format_args!("| {:<10?} | {copy}", Duration::from_micros(5_000)));
        // An untimed launch of the same kernel counts a launch and no time.
        classify(PROFILING_TARGET, log::Level::Info, &format_args!("Executing {copy}"));
        let d = totals() - before;
        assert_eq!(d.launches, 4);
        assert_eq!(d.by_kernel.iter().find(|(k, _)| k == copy).map(|e| e.1), Some(2));
        let t: Vec<(&str, f64)> = d.time_by_kernel.iter().map(|(k, t)| (k.as_str(), *t)).collect();
        assert_eq!(t.len(), 2, "{t:?}");
        // Most time first: the copy's 5 ms before the conv's 4 ms (its 40 ms before the step excluded).
        assert_eq!(t[0].0, copy);
        assert!((t[0].1 - 5e-3).abs() < 1e-9 && t[1].0 == conv && (t[1].1 - 4e-3).abs() < 1e-9, "{t:?}");
    }

    #[test]
    fn a_short_name_drops_module_paths_but_keeps_generics() {
        assert_eq!(short_name("burn_cubecl::kernel::binary::kernel_scalar_binop::KernelScalarBinop<cubecl_wgpu::WgpuRuntime, f32, burn_cubecl::ops::AddOp>"), "KernelScalarBinop<WgpuRuntime, f32, AddOp>");
        assert_eq!(short_name("a::b<c::d<e::f, 2>, [g::h; 3]>"), "b<d<f, 2>, [h; 3]>");
        assert_eq!(short_name("plain"), "plain");
        assert_eq!(short_name("KernelBinop | AddOp | WgpuRuntime"), "KernelBinop | AddOp | WgpuRuntime");
        let matmul = "MatmulEntry | TensorArgs | DynamicScalar | __Lhs | DynamicSize | __LhsSize | UnitMatmulFamily | WgpuRuntime";
        assert_eq!(short_name(matmul), "MatmulEntry | TensorArgs | DynamicScalar | __Lhs | …");
        assert_eq!(short_name("A | B | C | D | E | F"), "A | B | C | D | E | F");
    }

    #[test]
    fn an_autotune_search_is_timed_from_its_start_to_its_result() {
        let _serial = serial();
        let before = totals();
        let key = "MatmulAutotuneKey { m: 64, n: 64, k: 32 }";
        classify(TUNER_TARGET, log::Level::Info, &format_args!("Tuning {key}"));
        std::thread::sleep(Duration::from_millis(20));
        classify(PROFILING_TARGET, log::Level::Info, &format_args!("Fastest result simple-{key}. \n Top 3 times: [], context: "));
        // A search with one candidate has no result line; a result for another key closes nothing.
        classify(TUNER_TARGET, log::Level::Info, &format_args!("Tuning {}", "ReduceKey { axis: 1 }"));
        classify(PROFILING_TARGET, log::Level::Info, &format_args!("Fastest result x-{key}. "));
        let d = totals() - before;
        assert_eq!(d.autotune_searches, 2);
        assert!(d.autotune_s >= 0.02 && d.autotune_s < 5.0, "{d:?}");
    }

    #[test]
    fn a_long_message_is_classified_by_its_head_without_being_formatted_whole() {
        let long = "x".repeat(10_000);
        let p = Prefix::of(&format_args!("Executing {long}"));
        assert_eq!(p.as_str().len(), 32);
        assert!(p.as_str().starts_with("Executing x"));
        let p = Prefix::of(&format_args!("{}", "é".repeat(40)));
        assert!(p.as_str().chars().all(|c| c == 'é'));
    }
}
