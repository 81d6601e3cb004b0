//! Allocation timeline: every allocation and free of a chosen window, with the scope that made it.
//!
//! Off by default; while off, the allocator pays one relaxed atomic load per call. [`start`]
//! takes a fixed-capacity event buffer straight from the system allocator, so the buffer is
//! neither counted in the live bytes it helps explain nor recorded itself; [`stop`] hands the
//! events back as a [`Recording`]. Recording never allocates inside the allocator: an event is
//! written into the slot its atomic index names, and events past the capacity are counted as
//! dropped instead. A thread-local flag guards against re-entrancy.
//!
//! The context of an event is the process-wide current scope ([`scope::enter`]), set from
//! outside by whoever drives the work (the trainer sets `data`, `forward/<stage>`, `backward`,
//! `optimizer`). The scope is global, not per thread: an event from another thread (a backend's
//! compute thread) carries the scope of the moment and is flagged [`Event::other_thread`].
//! Only the model's [`crate::Account`] is recorded: a data loader's blocks appear when the
//! trainer adopts a finished batch ([`crate::adopt`]), as an allocation at that moment.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use crate::CountingAllocator;

/// What happened to a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Action {
    Alloc,
    Free,
}

/// One allocation or free. A `realloc` is a free of the old block followed by an allocation of
/// the new one (as the counters see it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub addr: u64,
    pub size: u64,
    /// Microseconds since [`start`].
    pub time_us: u64,
    /// The scope current when the event happened.
    pub scope: scope::ScopeId,
    pub action: Action,
    /// Made by a thread other than the one that called [`start`].
    pub other_thread: bool,
}

/// Why recording could not start.
#[derive(Debug, PartialEq, Eq)]
pub enum TimelineError {
    /// Another window is being recorded.
    AlreadyRecording,
    /// The event buffer could not be allocated (or its capacity is zero or too large).
    Buffer { capacity: usize },
}

impl std::fmt::Display for TimelineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AlreadyRecording => f.write_str("an allocation timeline is already being recorded"),
            Self::Buffer { capacity } => write!(f, "cannot allocate an event buffer of {capacity} events"),
        }
    }
}

impl std::error::Error for TimelineError {}

/// A recorded window.
#[derive(Clone, Debug)]
pub struct Recording {
    /// In the order they happened (the order of their slots).
    pub events: Vec<Event>,
    /// Events past the buffer's capacity, not kept.
    pub dropped: u64,
    /// Live heap bytes when recording started and when it stopped.
    pub live_at_start: u64,
    pub live_at_end: u64,
    pub duration_us: u64,
    /// Scope labels, indexed by [`scope::ScopeId::index`] (index 0: no scope).
    pub labels: Vec<String>,
}

impl Recording {
    /// The label of a scope ("" for none).
    pub fn label(&self, id: scope::ScopeId) -> &str {
        self.labels.get(id.index()).map_or("", String::as_str)
    }

    /// Live bytes after each event, replayed from [`Recording::live_at_start`].
    pub fn live_after_each(&self) -> impl Iterator<Item = u64> + '_ {
        self.events.iter().scan(self.live_at_start as i128, |live, e| {
            *live += match e.action {
                Action::Alloc => e.size as i128,
                Action::Free => -(e.size as i128),
            };
            Some((*live).max(0) as u64)
        })
    }

    /// The highest live bytes replayed from the events (at least `live_at_start`).
    pub fn peak_live(&self) -> u64 {
        self.live_after_each().fold(self.live_at_start, u64::max)
    }
}

static RECORDING: AtomicBool = AtomicBool::new(false);
/// Threads inside [`record`]: [`stop`] waits for them before reading the buffer.
static WRITERS: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);
static BUF: AtomicPtr<Event> = AtomicPtr::new(std::ptr::null_mut());
static CAP: AtomicUsize = AtomicUsize::new(0);
static START_US: AtomicU64 = AtomicU64::new(0);
static LIVE_AT_START: AtomicU64 = AtomicU64::new(0);
static OWNER: AtomicUsize = AtomicUsize::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();

thread_local! {
    // Const-initialised, without destructors: reading them never allocates.
    static THREAD_MARK: u8 = const { 0 };
    static IN_RECORD: Cell<bool> = const { Cell::new(false) };
}

fn thread_mark() -> usize {
    THREAD_MARK.with(|m| m as *const u8 as usize)
}

fn now_us() -> u64 {
    EPOCH.get().map_or(0, |e| e.elapsed().as_micros() as u64)
}

fn layout(capacity: usize) -> Option<Layout> {
    Layout::array::<Event>(capacity).ok().filter(|l| l.size() > 0)
}

/// Start recording every allocation and free into a buffer of `capacity` events.
pub fn start(capacity: usize) -> Result<(), TimelineError> {
    let layout = layout(capacity).ok_or(TimelineError::Buffer { capacity })?;
    EPOCH.get_or_init(Instant::now);
    // SAFETY: a non-zero-sized layout; the memory is only written through `record` and read
    // back by `stop`, and returned to the system allocator with the same layout.
    let buf = unsafe { System.alloc(layout) } as *mut Event;
    if buf.is_null() {
        return Err(TimelineError::Buffer { capacity });
    }
    if BUF.compare_exchange(std::ptr::null_mut(), buf, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        // SAFETY: allocated just above with this layout, never shared.
        unsafe { System.dealloc(buf as *mut u8, layout) };
        return Err(TimelineError::AlreadyRecording);
    }
    CAP.store(capacity, Ordering::SeqCst);
    NEXT.store(0, Ordering::SeqCst);
    OWNER.store(thread_mark(), Ordering::SeqCst);
    START_US.store(now_us(), Ordering::SeqCst);
    LIVE_AT_START.store(CountingAllocator::live(), Ordering::SeqCst);
    RECORDING.store(true, Ordering::SeqCst);
    Ok(())
}

/// Whether a window is being recorded.
pub fn is_recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// Stop recording and return the window (`None` when nothing was being recorded).
pub fn stop() -> Option<Recording> {
    if !RECORDING.swap(false, Ordering::SeqCst) {
        return None;
    }
    // A writer either saw `RECORDING` false or is counted here (both sides are SeqCst).
    while WRITERS.load(Ordering::SeqCst) != 0 {
        std::hint::spin_loop();
    }
    let live_at_end = CountingAllocator::live();
    let duration_us = now_us().saturating_sub(START_US.load(Ordering::SeqCst));
    let taken = NEXT.load(Ordering::SeqCst);
    let cap = CAP.load(Ordering::SeqCst);
    let written = taken.min(cap);
    let mut events = Vec::with_capacity(written);
    let buf = BUF.load(Ordering::SeqCst);
    // SAFETY: slots 0..written were each written once by `record` (no writer is left), the
    // buffer holds `cap` events.
    events.extend_from_slice(unsafe { std::slice::from_raw_parts(buf, written) });
    let layout = layout(cap).expect("the layout `start` allocated with");
    BUF.store(std::ptr::null_mut(), Ordering::SeqCst);
    // SAFETY: allocated by `start` with this layout; no writer can reach it any more.
    unsafe { System.dealloc(buf as *mut u8, layout) };
    Some(Recording {
        events,
        dropped: (taken - written) as u64,
        live_at_start: LIVE_AT_START.load(Ordering::SeqCst),
        live_at_end,
        duration_us,
        labels: scope::labels(),
    })
}

/// Called by the allocator after it obtained a block (the address is ours: no other thread
/// can free or reuse it before this event takes its slot).
#[inline]
pub(crate) fn on_alloc(ptr: *mut u8, size: usize) {
    if RECORDING.load(Ordering::Relaxed) {
        record(Action::Alloc, ptr, size);
    }
}

/// Called by the allocator before it returns a block to the system (for the same reason).
#[inline]
pub(crate) fn on_free(ptr: *mut u8, size: usize) {
    if RECORDING.load(Ordering::Relaxed) {
        record(Action::Free, ptr, size);
    }
}

#[cold]
#[inline(never)]
fn record(action: Action, ptr: *mut u8, size: usize) {
    if IN_RECORD.with(|r| r.replace(true)) {
        return; // re-entered (nothing below allocates; a guard all the same)
    }
    WRITERS.fetch_add(1, Ordering::SeqCst);
    if RECORDING.load(Ordering::SeqCst) {
        let idx = NEXT.fetch_add(1, Ordering::Relaxed);
        if idx < CAP.load(Ordering::Relaxed) {
            let event = Event {
                addr: ptr as u64,
                size: size as u64,
                time_us: now_us().saturating_sub(START_US.load(Ordering::Relaxed)),
                scope: scope::current(),
                action,
                other_thread: thread_mark() != OWNER.load(Ordering::Relaxed),
            };
            // SAFETY: `idx < capacity`, and each index is handed out once per window.
            unsafe { BUF.load(Ordering::Relaxed).add(idx).write(event) };
        }
    }
    WRITERS.fetch_sub(1, Ordering::SeqCst);
    IN_RECORD.with(|r| r.set(false));
}

/// The current scope: a process-wide label that events carry.
pub mod scope {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// An interned scope label; 0 is "no scope".
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct ScopeId(u32);

    impl ScopeId {
        pub const NONE: ScopeId = ScopeId(0);
        pub fn index(self) -> usize {
            self.0 as usize
        }
        /// The id at `index` of a recording's labels (for tests building recordings by hand).
        #[cfg(test)]
        pub(crate) fn from_index(index: u32) -> ScopeId {
            ScopeId(index)
        }
    }

    static CURRENT: AtomicU32 = AtomicU32::new(0);
    /// Labels by id − 1.
    static LABELS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// The id of `label`, added to the table the first time it is seen (that allocation
    /// happens here, outside the allocator).
    pub fn intern(label: &str) -> ScopeId {
        let mut labels = LABELS.lock().unwrap_or_else(|e| e.into_inner());
        let i = match labels.iter().position(|l| l == label) {
            Some(i) => i,
            None => {
                labels.push(label.to_string());
                labels.len() - 1
            }
        };
        ScopeId(i as u32 + 1)
    }

    /// Make `label` the current scope until the guard drops (the previous one comes back).
    pub fn enter(label: &str) -> ScopeGuard {
        enter_id(intern(label))
    }

    /// [`enter`] with an interned id.
    pub fn enter_id(id: ScopeId) -> ScopeGuard {
        ScopeGuard { previous: ScopeId(CURRENT.swap(id.0, Ordering::Relaxed)) }
    }

    /// The current scope.
    #[inline]
    pub fn current() -> ScopeId {
        ScopeId(CURRENT.load(Ordering::Relaxed))
    }

    /// Every label, indexed by [`ScopeId::index`] (index 0: "").
    pub fn labels() -> Vec<String> {
        let labels = LABELS.lock().unwrap_or_else(|e| e.into_inner());
        std::iter::once(String::new()).chain(labels.iter().cloned()).collect()
    }

    /// Restores the previous scope when dropped.
    #[must_use = "the scope ends when the guard drops"]
    pub struct ScopeGuard {
        previous: ScopeId,
    }

    impl Drop for ScopeGuard {
        fn drop(&mut self) {
            CURRENT.store(self.previous.0, Ordering::Relaxed);
        }
    }
}

/// Recording is process-wide: tests that record take this lock.
#[cfg(test)]
pub(crate) static TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use std::hint::black_box;

    #[test]
    fn records_a_known_pattern_of_allocations_with_their_scopes() {
        let _lock = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // Interned before the window, so the window holds only the test's own blocks.
        let (make, free) = (scope::intern("test/make"), scope::intern("test/free"));
        let sizes = [1000usize, 20_000, 300_000];
        start(1 << 12).unwrap();
        assert_eq!(start(16), Err(TimelineError::AlreadyRecording));
        let blocks: Vec<Vec<u8>> = {
            let _s = scope::enter_id(make);
            let a = black_box(vec![1u8; sizes[0]]);
            let b = black_box(vec![2u8; sizes[1]]);
            let c = black_box(vec![3u8; sizes[2]]);
            let _s2 = scope::enter_id(free);
            drop(b);
            vec![a, c]
        };
        let rec = stop().unwrap();
        assert!(stop().is_none() && !is_recording());
        // The `blocks` Vec itself (2 × 24 bytes) is made while the block's scopes still hold.
        let mine: Vec<&Event> = rec.events.iter().filter(|e| !e.other_thread).collect();
        let got: Vec<(Action, u64, &str)> = mine.iter().map(|e| (e.action, e.size, rec.label(e.scope))).collect();
        assert_eq!(
            got,
            [
                (Action::Alloc, 1000, "test/make"),
                (Action::Alloc, 20_000, "test/make"),
                (Action::Alloc, 300_000, "test/make"),
                (Action::Free, 20_000, "test/free"),
                (Action::Alloc, 48, "test/free"),
            ]
        );
        assert_eq!(mine[0].addr, blocks[0].as_ptr() as u64);
        assert_eq!(mine[2].addr, blocks[1].as_ptr() as u64);
        assert_eq!(mine[1].addr, mine[3].addr, "the free names the block the second allocation made");
        assert!(mine.windows(2).all(|w| w[0].time_us <= w[1].time_us));
        assert_eq!(rec.dropped, 0);
        if rec.events.len() == mine.len() {
            // No other thread allocated: the replay ends where the counter ended.
            let last = rec.live_after_each().last().unwrap();
            assert_eq!(last, rec.live_at_end);
            assert_eq!(rec.peak_live(), rec.live_at_start + 1000 + 20_000 + 300_000);
        }
        drop(blocks);
    }

    #[test]
    fn events_past_the_capacity_are_counted_as_dropped() {
        let _lock = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        start(2).unwrap();
        let boxes: Vec<Box<u64>> = (0..4).map(|i| black_box(Box::new(i))).collect();
        let rec = stop().unwrap();
        assert_eq!(rec.events.len(), 2);
        assert!(rec.dropped >= 3, "4 boxes and a Vec, 2 kept: {} dropped", rec.dropped);
        drop(boxes);
        assert_eq!(start(0), Err(TimelineError::Buffer { capacity: 0 }));
    }
}
