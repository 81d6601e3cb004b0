//! vramlab-probe: memory measurement, independent of models and of the trainer.
//!
//! Two kinds of probe share one trait:
//! - [`CountingAllocator`]: a global allocator that counts live heap bytes and keeps the exact
//!   high-water mark since the last reset. On CPU backends (flex) every tensor lives on the
//!   heap, so this *is* the device memory. Install it in the binary with
//!   `#[global_allocator] static A: CountingAllocator = CountingAllocator;`. Bytes are counted
//!   per [`Account`]: the model's figures leave out what the data loader holds (its workers and
//!   prefetch queue), which is reported on its own.
//! - [`SampledProbe`]: for devices whose runtime reports current usage but keeps no byte
//!   high-water mark (CubeCL: wgpu, cuda). Its peak is the maximum over the samples taken at
//!   the trainer's probe points, so it is a lower bound of the true peak; reports say so.
//!
//! A probe of a CubeCL device also counts kernels ([`kernels`]: launches, compilations, autotune
//! searches), which the trainer records per step next to the memory figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

pub mod attribution;
mod budget;
pub mod heap;
pub mod kernels;
pub use kernels::KernelCounts;
pub use budget::{BUDGET_ENV, OUT_OF_MEMORY_EXIT_CODE, OUT_OF_MEMORY_MESSAGE, budget, set_budget};
pub mod memory_viz;
pub mod nvml;
mod pickle;
pub mod timeline;
pub use timeline::scope;

/// Memory at one instant, in bytes. `allocated` is what live tensors occupy (like
/// `torch.cuda.memory_allocated`); `reserved` is what the allocator holds from the system or
/// device (like `torch.cuda.memory_reserved`).
/// `device_used` is the whole device's used memory from the driver (NVML on NVIDIA: the number
/// `nvidia-smi` shows, including other processes and the CUDA context), where it can be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemSample {
    pub allocated: u64,
    pub reserved: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_used: Option<u64>,
}

impl MemSample {
    pub fn max(self, o: MemSample) -> MemSample {
        let device_used = match (self.device_used, o.device_used) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        MemSample { allocated: self.allocated.max(o.allocated), reserved: self.reserved.max(o.reserved), device_used }
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
    /// The window's peak ([`MemoryProbe::peak`]), then a new window from the same moment
    /// ([`MemoryProbe::reset_peak`]). A sampling probe takes one sample for both (on CubeCL a
    /// device sync and, on CUDA, an NVML query) where the two calls take two.
    fn take_peak(&self) -> MemSample {
        let peak = self.peak();
        self.reset_peak();
        peak
    }
    /// The current usage ([`MemoryProbe::sample`]), then a new window from it
    /// ([`MemoryProbe::reset_peak`]); one sample where a probe samples.
    fn restart(&self) -> MemSample {
        let now = self.sample();
        self.reset_peak();
        now
    }
    /// How the allocated peak relates to the true one.
    fn peak_kind(&self) -> PeakKind;
    /// How the reserved peak relates to the true one.
    fn reserved_kind(&self) -> PeakKind {
        PeakKind::Sampled
    }
    /// Number of allocations since start, where the probe can count them.
    fn allocation_count(&self) -> Option<u64> {
        None
    }
    /// Kernel counts since the process started ([`kernels`]), on devices that run kernels and
    /// where they are counted; `None` elsewhere (CPU backends). Waits for the counts of the work
    /// submitted so far to arrive: call after a [`MemoryProbe::sample`] (which synchronises).
    fn kernel_counts(&self) -> Option<KernelCounts> {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// CPU: counting global allocator

/// Whom an allocation is charged to. Every block carries its account in a small header, so a
/// block freed on another thread (a batch built by a loader worker and dropped by the training
/// thread) is taken off the account that allocated it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Account {
    /// The model's work: tensors, autodiff graphs, optimizer state (every thread by default,
    /// including a backend's compute threads).
    Model = 0,
    /// The data pipeline's host memory: decoding and batching in loader workers, batches
    /// waiting in the prefetch queue. See [`charge_to`] and [`adopt`].
    Loader = 1,
}

const ACCOUNTS: usize = 2;

impl Account {
    #[inline]
    fn from_tag(tag: usize) -> Account {
        if tag & 0xff == Account::Loader as usize { Account::Loader } else { Account::Model }
    }
}

static LIVE: [AtomicUsize; ACCOUNTS] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static PEAK: [AtomicUsize; ACCOUNTS] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The account this thread's allocations are charged to (const-initialised, no destructor:
    /// safe to read inside the allocator).
    static CURRENT: std::cell::Cell<u8> = const { std::cell::Cell::new(Account::Model as u8) };
}

#[inline]
fn current_account() -> Account {
    Account::from_tag(CURRENT.try_with(|c| c.get() as usize).unwrap_or(0))
}

/// Charges this thread's allocations to `account` until the guard is dropped (then the
/// previous account applies again). A loader wraps each batch it builds in
/// `charge_to(Account::Loader)`.
pub fn charge_to(account: Account) -> AccountGuard {
    let previous = CURRENT.with(|c| c.replace(account as u8));
    AccountGuard { previous, _not_send: std::marker::PhantomData }
}

/// Restores the thread's previous account when dropped (see [`charge_to`]).
pub struct AccountGuard {
    previous: u8,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for AccountGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}

/// Moves the heap block of `v` to the calling thread's account: the consumer of a batch takes
/// it over from the loader that built it, so the model's figures include its inputs whether
/// they were built on a worker or on the training thread. A no-op when the counting allocator
/// is not the global allocator or `v` owns no heap block.
pub fn adopt<T>(v: &Vec<T>) {
    let size = v.capacity() * std::mem::size_of::<T>();
    if size == 0 || !CountingAllocator::is_installed() {
        return;
    }
    let to = current_account();
    // SAFETY: the counting allocator is the global allocator (it has served an allocation, and
    // it cannot be swapped at run time), so the block of a non-empty `Vec` starts right after
    // a header it wrote; `&Vec` keeps the block alive.
    unsafe {
        let tag = header(v.as_ptr() as *mut u8);
        let from = Account::from_tag(*tag);
        if from != to {
            *tag = TAG_MAGIC | to as usize;
            CountingAllocator::sub(from, size);
            CountingAllocator::add(to, size);
            // The allocation timeline follows the model's account: the block enters or leaves it.
            let p = v.as_ptr() as *mut u8;
            if to == Account::Model {
                timeline::on_alloc(p, size);
            } else {
                timeline::on_free(p, size);
            }
        }
    }
}

/// Space in front of every block: its account tag sits in the last word before the block.
const HEADER: usize = 16;
const TAG_MAGIC: usize = 0x7a6d_0000;

#[inline]
fn prefix(align: usize) -> usize {
    align.max(HEADER)
}

/// The tag word of the block at `user` (the address the program sees).
#[inline]
unsafe fn header(user: *mut u8) -> *mut usize {
    // SAFETY (caller): `user` was returned by the counting allocator, which reserved `prefix`
    // ≥ 16 bytes before it, and `user` is at least 16-byte aligned.
    unsafe { user.sub(std::mem::size_of::<usize>()) as *mut usize }
}

/// Global allocator wrapper around the system allocator that counts live bytes per
/// [`Account`] and keeps each account's high-water mark.
pub struct CountingAllocator;

impl CountingAllocator {
    #[inline]
    fn add(account: Account, size: usize) {
        let i = account as usize;
        let live = LIVE[i].fetch_add(size, Ordering::Relaxed) + size;
        PEAK[i].fetch_max(live, Ordering::Relaxed);
    }
    #[inline]
    fn sub(account: Account, size: usize) {
        LIVE[account as usize].fetch_sub(size, Ordering::Relaxed);
    }

    /// Live heap bytes of the model now.
    pub fn live() -> u64 {
        Self::live_of(Account::Model)
    }
    /// High-water mark of the model's live bytes since the last [`CountingAllocator::reset_peak`].
    pub fn peak() -> u64 {
        Self::peak_of(Account::Model)
    }
    /// Start a new peak window for the model at its current live bytes.
    pub fn reset_peak() {
        Self::reset_peak_of(Account::Model)
    }
    /// Live heap bytes charged to `account`.
    pub fn live_of(account: Account) -> u64 {
        LIVE[account as usize].load(Ordering::Relaxed) as u64
    }
    /// High-water mark of `account` since its last reset.
    pub fn peak_of(account: Account) -> u64 {
        PEAK[account as usize].load(Ordering::Relaxed) as u64
    }
    /// Start a new peak window for `account` at its current live bytes.
    pub fn reset_peak_of(account: Account) {
        let i = account as usize;
        PEAK[i].store(LIVE[i].load(Ordering::Relaxed), Ordering::Relaxed);
    }
    pub fn allocations() -> u64 {
        ALLOCS.load(Ordering::Relaxed)
    }
    /// Whether this allocator is the process's global allocator (it has seen an allocation).
    pub fn is_installed() -> bool {
        INSTALLED.load(Ordering::Relaxed)
    }

    /// Allocate `layout` plus the header in front, charged to this thread's account.
    #[inline]
    unsafe fn alloc_with(layout: Layout, zeroed: bool) -> *mut u8 {
        let account = current_account();
        if account == Account::Model {
            budget::check(LIVE[0].load(Ordering::Relaxed), layout.size());
        }
        let pre = prefix(layout.align());
        let Ok(full) = Layout::from_size_align(layout.size().saturating_add(pre), layout.align()) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `full` has a non-zero size (it includes the header).
        let base = unsafe { if zeroed { System.alloc_zeroed(full) } else { System.alloc(full) } };
        if base.is_null() {
            return base;
        }
        // SAFETY: `base` has `pre` bytes before the block, and `pre` is a multiple of the
        // alignment, so `user` keeps it.
        let user = unsafe { base.add(pre) };
        unsafe { *header(user) = TAG_MAGIC | account as usize };
        Self::add(account, layout.size());
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        if account == Account::Model {
            timeline::on_alloc(user, layout.size());
        }
        user
    }
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the system allocator's contract.
        unsafe { Self::alloc_with(layout, false) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the system allocator's contract.
        unsafe { Self::alloc_with(layout, true) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let pre = prefix(layout.align());
        // SAFETY: `ptr` came from `alloc_with` with this layout: header and base are ours.
        let account = unsafe {
            let tag = *header(ptr);
            debug_assert_eq!(tag & !0xff, TAG_MAGIC, "block without a counting-allocator header");
            Account::from_tag(tag)
        };
        // Recorded while the block is still ours, so no reuse of the address is recorded first.
        if account == Account::Model {
            timeline::on_free(ptr, layout.size());
        }
        unsafe { System.dealloc(ptr.sub(pre), Layout::from_size_align_unchecked(layout.size() + pre, layout.align())) };
        Self::sub(account, layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let pre = prefix(layout.align());
        // SAFETY: `ptr` came from `alloc_with` with this layout.
        let account = unsafe { Account::from_tag(*header(ptr)) };
        if account == Account::Model {
            budget::check(LIVE[0].load(Ordering::Relaxed), new_size.saturating_sub(layout.size()));
        }
        let Some(new_full) = new_size.checked_add(pre) else {
            return std::ptr::null_mut();
        };
        let model = account == Account::Model;
        if model {
            timeline::on_free(ptr, layout.size());
        }
        // SAFETY: the whole block, header included, is resized; the header moves with it.
        let base = unsafe { System.realloc(ptr.sub(pre), Layout::from_size_align_unchecked(layout.size() + pre, layout.align()), new_full) };
        if base.is_null() {
            if model {
                timeline::on_alloc(ptr, layout.size()); // the old block stays
            }
            return base;
        }
        let user = unsafe { base.add(pre) };
        Self::sub(account, layout.size());
        Self::add(account, new_size);
        if model {
            timeline::on_alloc(user, new_size);
        }
        user
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
        MemSample { allocated: CountingAllocator::live(), reserved: self.rss(), device_used: None }
    }
    fn peak(&self) -> MemSample {
        self.rss();
        MemSample { allocated: CountingAllocator::peak(), reserved: self.rss_peak.load(Ordering::Relaxed), device_used: None }
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
    reserved_exact: bool,
    kernels: bool,
}

impl SampledProbe {
    pub fn new(name: impl Into<String>, sample: impl Fn() -> MemSample + Send + Sync + 'static) -> Self {
        Self { name: name.into(), sample: Box::new(sample), peak: Mutex::new(MemSample::default()), reserved_exact: false, kernels: false }
    }

    /// This device's kernels are counted ([`kernels::install`] succeeded and CubeCL's loggers
    /// write to the `log` crate): [`MemoryProbe::kernel_counts`] reports them.
    pub fn with_kernel_counts(mut self) -> Self {
        self.kernels = true;
        self
    }

    /// The sampled `reserved` never decreases while the probe is used (a pool that does not
    /// give pages back), so its value when a window closes is the window's exact peak.
    pub fn reserved_never_decreases(mut self) -> Self {
        self.reserved_exact = true;
        self
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
        self.restart();
    }
    fn take_peak(&self) -> MemSample {
        let s = (self.sample)();
        let Ok(mut p) = self.peak.lock() else { return s };
        let peak = p.max(s);
        *p = s;
        peak
    }
    fn restart(&self) -> MemSample {
        let s = (self.sample)();
        if let Ok(mut p) = self.peak.lock() {
            *p = s;
        }
        s
    }
    fn peak_kind(&self) -> PeakKind {
        PeakKind::Sampled
    }
    fn reserved_kind(&self) -> PeakKind {
        if self.reserved_exact { PeakKind::Exact } else { PeakKind::Sampled }
    }
    fn kernel_counts(&self) -> Option<KernelCounts> {
        if !self.kernels {
            return None;
        }
        kernels::settle();
        Some(kernels::totals())
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
        let _serial = serial();
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
    fn a_loader_thread_allocating_100_mib_leaves_the_model_peak_unchanged() {
        let _serial = serial();
        let n = 100 << 20;
        CountingAllocator::reset_peak();
        CountingAllocator::reset_peak_of(Account::Loader);
        let model_before = CountingAllocator::live();
        let loader_before = CountingAllocator::live_of(Account::Loader);
        // A worker builds a 100 MiB batch while the model holds 8 MiB; the batch is then handed
        // to this thread, which frees it: the free is taken off the loader's account.
        let mine = std::hint::black_box(vec![1u8; 8 << 20]);
        let batch = std::thread::spawn(move || {
            let _loader = charge_to(Account::Loader);
            std::hint::black_box(vec![2u8; n])
        })
        .join()
        .unwrap();
        assert!(CountingAllocator::live_of(Account::Loader) >= loader_before + n as u64);
        drop(batch);
        let model_peak = CountingAllocator::peak() - model_before;
        assert!(model_peak >= 8 << 20 && model_peak < 9 << 20, "model peak grew by {model_peak}, expected 8 MiB");
        assert!(CountingAllocator::peak_of(Account::Loader) >= loader_before + n as u64);
        let loader_after = CountingAllocator::live_of(Account::Loader);
        assert!(loader_after < loader_before + (1 << 20), "the loader's 100 MiB were freed: {loader_before} -> {loader_after}");
        drop(mine);
    }

    #[test]
    fn an_adopted_batch_moves_to_the_model_and_is_freed_from_it() {
        let _serial = serial();
        let n = 32 << 20;
        let batch = std::thread::spawn(move || {
            let _loader = charge_to(Account::Loader);
            let mut v = Vec::with_capacity(n / 4);
            v.resize(n / 4, 1.0f32);
            v
        })
        .join()
        .unwrap();
        let (model, loader) = (CountingAllocator::live(), CountingAllocator::live_of(Account::Loader));
        adopt(&batch);
        assert_eq!(CountingAllocator::live(), model + n as u64);
        assert_eq!(CountingAllocator::live_of(Account::Loader), loader - n as u64);
        adopt(&batch); // already the model's: nothing moves
        assert_eq!(CountingAllocator::live(), model + n as u64);
        drop(batch);
        assert!(CountingAllocator::live() < model + (1 << 20));
        // Empty vectors own no block.
        adopt(&Vec::<f32>::new());
        adopt(&vec![(); 10]);
    }

    #[test]
    fn blocks_keep_their_alignment_and_contents_through_realloc() {
        let _serial = serial();
        for align in [1usize, 8, 16, 64, 4096] {
            let layout = Layout::from_size_align(100, align).unwrap();
            unsafe {
                let p = GLOBAL.alloc(layout);
                assert_eq!(p as usize % align, 0);
                for i in 0..100 {
                    *p.add(i) = i as u8;
                }
                let q = GLOBAL.realloc(p, layout, 5000);
                assert_eq!(q as usize % align, 0);
                assert!((0..100).all(|i| *q.add(i) == i as u8));
                GLOBAL.dealloc(q, Layout::from_size_align(5000, align).unwrap());
            }
        }
    }

    /// The counters are global: tests that measure them run one at a time.
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        static LOCK: Mutex<()> = Mutex::new(());
        LOCK.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[test]
    fn sampled_probe_keeps_the_max_of_samples() {
        use std::sync::Arc;
        let v = Arc::new(AtomicU64::new(10));
        let v2 = v.clone();
        let p = SampledProbe::new("fake", move || MemSample { allocated: v2.load(Ordering::Relaxed), reserved: 100, device_used: None });
        p.reset_peak();
        v.store(50, Ordering::Relaxed);
        p.sample();
        v.store(20, Ordering::Relaxed);
        assert_eq!(p.peak().allocated, 50);
        p.reset_peak();
        assert_eq!(p.peak().allocated, 20);
    }

    /// `take_peak` and `restart` give what `peak` + `reset_peak` and `sample` + `reset_peak` give,
    /// from one sample each (the sampling function is the probe's device sync).
    #[test]
    fn sampled_probe_takes_one_sample_per_window_edge() {
        use std::sync::Arc;
        let (v, calls) = (Arc::new(AtomicU64::new(10)), Arc::new(AtomicU64::new(0)));
        let (v2, calls2) = (v.clone(), calls.clone());
        let p = SampledProbe::new("fake", move || {
            calls2.fetch_add(1, Ordering::Relaxed);
            MemSample { allocated: v2.load(Ordering::Relaxed), reserved: 100, device_used: None }
        });
        assert_eq!(p.restart().allocated, 10);
        v.store(50, Ordering::Relaxed);
        p.sample();
        v.store(20, Ordering::Relaxed);
        assert_eq!(p.take_peak().allocated, 50, "the closing window's peak");
        assert_eq!(p.peak().allocated, 20, "the new window starts at the take's sample");
        v.store(5, Ordering::Relaxed);
        assert_eq!(p.take_peak().allocated, 20, "a peak above the closing sample");
        assert_eq!(p.take_peak().allocated, 5);
        assert_eq!(calls.load(Ordering::Relaxed), 6, "one sample per call");
    }
}
