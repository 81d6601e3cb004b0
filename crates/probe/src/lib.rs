//! vramlab-probe: memory measurement, independent of models and of the trainer.
//!
//! Two kinds of probe share one trait:
//! - [`CountingAllocator`]: a global allocator that counts live heap bytes and keeps the exact
//!   high-water mark since the last reset. On CPU backends (flex) every tensor lives on the
//!   heap, so this *is* the device memory. Install it in the binary with
//!   `#[global_allocator] static A: CountingAllocator = CountingAllocator;`.
//! - [`SampledProbe`]: for devices whose runtime reports current usage but keeps no byte
//!   high-water mark (CubeCL: wgpu, cuda). Its peak is the maximum over the samples taken at
//!   the trainer's probe points, so it is a lower bound of the true peak; reports say so.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

mod budget;
pub use budget::{BUDGET_ENV, OUT_OF_MEMORY_EXIT_CODE, OUT_OF_MEMORY_MESSAGE, budget, set_budget};
pub mod memory_viz;
mod pickle;
pub mod timeline;
pub use timeline::scope;

/// Memory at one instant, in bytes. `allocated` is what live tensors occupy (like
/// `torch.cuda.memory_allocated`); `reserved` is what the allocator holds from the system or
/// device (like `torch.cuda.memory_reserved`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemSample {
    pub allocated: u64,
    pub reserved: u64,
}

impl MemSample {
    pub fn max(self, o: MemSample) -> MemSample {
        MemSample { allocated: self.allocated.max(o.allocated), reserved: self.reserved.max(o.reserved) }
    }
}

/// How a probe's peak relates to the true peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeakKind {
    /// Every allocation is counted: the peak is exact.
    Exact,
    /// Maximum over samples: a lower bound of the true peak.
    Sampled,
}

/// A source of memory figures. Implementations synchronise the device when sampling.
pub trait MemoryProbe: Send + Sync {
    /// Short name for reports, e.g. "cpu-allocator" or "cubecl-wgpu".
    fn name(&self) -> String;
    /// Current usage (synchronises the device first where needed).
    fn sample(&self) -> MemSample;
    /// Highest usage seen since the last [`MemoryProbe::reset_peak`] (includes a fresh sample).
    fn peak(&self) -> MemSample;
    /// Start a new peak window at the current usage.
    fn reset_peak(&self);
    fn peak_kind(&self) -> PeakKind;
    /// Number of allocations since start, where the probe can count them.
    fn allocation_count(&self) -> Option<u64> {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// CPU: counting global allocator

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Global allocator wrapper around the system allocator that counts live bytes.
pub struct CountingAllocator;

impl CountingAllocator {
    #[inline]
    fn add(size: usize) {
        let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
        PEAK.fetch_max(live, Ordering::Relaxed);
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
    }
    #[inline]
    fn sub(size: usize) {
        LIVE.fetch_sub(size, Ordering::Relaxed);
    }

    /// Live heap bytes now.
    pub fn live() -> u64 {
        LIVE.load(Ordering::Relaxed) as u64
    }
    /// High-water mark of live bytes since the last [`CountingAllocator::reset_peak`].
    pub fn peak() -> u64 {
        PEAK.load(Ordering::Relaxed) as u64
    }
    /// Start a new peak window at the current live bytes.
    pub fn reset_peak() {
        PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    pub fn allocations() -> u64 {
        ALLOCS.load(Ordering::Relaxed)
    }
    /// Whether this allocator is the process's global allocator (it has seen an allocation).
    pub fn is_installed() -> bool {
        INSTALLED.load(Ordering::Relaxed)
    }
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        budget::check(LIVE.load(Ordering::Relaxed), layout.size());
        // SAFETY: forwarded unchanged to the system allocator.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            Self::add(layout.size());
            timeline::on_alloc(p, layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        budget::check(LIVE.load(Ordering::Relaxed), layout.size());
        // SAFETY: forwarded unchanged to the system allocator.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            Self::add(layout.size());
            timeline::on_alloc(p, layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Recorded while the block is still ours, so no reuse of the address is recorded first.
        timeline::on_free(ptr, layout.size());
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) };
        Self::sub(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        budget::check(LIVE.load(Ordering::Relaxed), new_size.saturating_sub(layout.size()));
        timeline::on_free(ptr, layout.size());
        // SAFETY: forwarded unchanged to the system allocator.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            Self::sub(layout.size());
            Self::add(new_size);
            timeline::on_alloc(p, new_size);
        } else {
            timeline::on_alloc(ptr, layout.size()); // the old block stays
        }
        p
    }
}

/// Resident set size of this process in bytes (Linux `/proc/self/statm`), if readable.
pub fn process_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Probe backed by [`CountingAllocator`]: `allocated` = live heap bytes (exact peak),
/// `reserved` = process RSS (what the OS has handed out, sampled at probe points).
#[derive(Default)]
pub struct CpuProbe {
    rss_peak: AtomicU64,
}

impl CpuProbe {
    /// Fails when the counting allocator is not the global allocator (figures would be zero).
    pub fn new() -> Result<Self, String> {
        // Force one allocation so an installed allocator marks itself.
        drop(std::hint::black_box(vec![0u8; 16]));
        if !CountingAllocator::is_installed() {
            return Err("CountingAllocator is not installed as #[global_allocator]".into());
        }
        Ok(Self::default())
    }
    fn rss(&self) -> u64 {
        let r = process_rss().unwrap_or(0);
        self.rss_peak.fetch_max(r, Ordering::Relaxed);
        r
    }
}

impl MemoryProbe for CpuProbe {
    fn name(&self) -> String {
        "cpu-counting-allocator".into()
    }
    fn sample(&self) -> MemSample {
        MemSample { allocated: CountingAllocator::live(), reserved: self.rss() }
    }
    fn peak(&self) -> MemSample {
        self.rss();
        MemSample { allocated: CountingAllocator::peak(), reserved: self.rss_peak.load(Ordering::Relaxed) }
    }
    fn reset_peak(&self) {
        CountingAllocator::reset_peak();
        self.rss_peak.store(0, Ordering::Relaxed);
        self.rss();
    }
    fn peak_kind(&self) -> PeakKind {
        PeakKind::Exact
    }
    fn allocation_count(&self) -> Option<u64> {
        Some(CountingAllocator::allocations())
    }
}

// ---------------------------------------------------------------------------------------------
// Devices without a high-water mark: sampled peak

type SampleFn = dyn Fn() -> MemSample + Send + Sync;

/// Peak as the maximum of samples taken at probe points. CubeCL keeps its memory pools per
/// stream, and a stream belongs to the thread that submits work, so sampling must happen on the
/// training thread: a background poller would read another (empty) stream's pool.
pub struct SampledProbe {
    name: String,
    sample: Box<SampleFn>,
    peak: Mutex<MemSample>,
}

impl SampledProbe {
    pub fn new(name: impl Into<String>, sample: impl Fn() -> MemSample + Send + Sync + 'static) -> Self {
        Self { name: name.into(), sample: Box::new(sample), peak: Mutex::new(MemSample::default()) }
    }
}

impl MemoryProbe for SampledProbe {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn sample(&self) -> MemSample {
        let s = (self.sample)();
        if let Ok(mut p) = self.peak.lock() {
            *p = p.max(s);
        }
        s
    }
    fn peak(&self) -> MemSample {
        self.sample();
        self.peak.lock().map(|p| *p).unwrap_or_default()
    }
    fn reset_peak(&self) {
        let s = (self.sample)();
        if let Ok(mut p) = self.peak.lock() {
            *p = s;
        }
    }
    fn peak_kind(&self) -> PeakKind {
        PeakKind::Sampled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static GLOBAL: CountingAllocator = CountingAllocator;

    // Tests in this module share the global counters: run the allocation checks in one test.
    #[test]
    fn counts_a_known_allocation_and_its_peak() {
        let probe = CpuProbe::new().expect("installed in tests");
        probe.reset_peak();
        let before = probe.sample().allocated;
        let n = 64 << 20; // 64 MiB: far above any background noise of the test harness
        let big = std::hint::black_box(vec![1u8; n]);
        let during = probe.sample().allocated;
        let grew = during as i64 - before as i64;
        assert!((grew - n as i64).abs() < (1 << 20), "live grew by {grew}, expected {n}");
        drop(big);
        let after = probe.sample().allocated;
        assert!((after as i64 - before as i64).abs() < (1 << 20), "freed: {before} -> {after}");
        let peak = probe.peak().allocated;
        assert!(peak >= before + n as u64, "peak {peak} must include the 64 MiB block (before {before})");
        // A new window forgets the old peak.
        probe.reset_peak();
        assert!(probe.peak().allocated < before + (n as u64) / 2);
        assert_eq!(probe.peak_kind(), PeakKind::Exact);
        assert!(probe.allocation_count().unwrap_or(0) > 0);
    }

    #[test]
    fn sampled_probe_keeps_the_max_of_samples() {
        use std::sync::Arc;
        let v = Arc::new(AtomicU64::new(10));
        let v2 = v.clone();
        let p = SampledProbe::new("fake", move || MemSample { allocated: v2.load(Ordering::Relaxed), reserved: 100 });
        p.reset_peak();
        v.store(50, Ordering::Relaxed);
        p.sample();
        v.store(20, Ordering::Relaxed);
        assert_eq!(p.peak().allocated, 50);
        p.reset_peak();
        assert_eq!(p.peak().allocated, 20);
    }
}
