//! A multi-worker prefetching loader (lerobot's `DataLoader(num_workers, prefetch_factor,
//! persistent_workers)`) and a seeded epoch sampler.
//!
//! Batches are numbered `0, 1, 2, …` and batch `k` is a pure function of `k` (the caller's
//! `make(k)`), so workers can build any batch independently and a resumed run asks for the
//! same batches as an uninterrupted one. Workers keep up to `num_workers × prefetch_factor`
//! batches ready ahead of the consumer; `get(k)` blocks only when batch `k` is not ready yet
//! (that time is the trainer's data wait). A worker thread the OS refuses to start is an error
//! of `get` ([`SpawnError`]), not a panic.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// The OS refused a loader worker thread (too many threads, no memory for its stack).
#[derive(Debug, thiserror::Error)]
#[error("num_workers: cannot start loader worker {worker} of {workers}: {source}; lower --num_workers")]
pub struct SpawnError {
    pub worker: usize,
    pub workers: usize,
    #[source]
    pub source: std::io::Error,
}

/// Builds batch `k`.
pub type MakeBatch<T, E> = Arc<dyn Fn(u64) -> Result<T, E> + Send + Sync>;

/// How the loader runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoaderConfig {
    /// 0: batches are built on the caller's thread when asked for (no prefetch).
    pub num_workers: usize,
    /// Batches kept in flight per worker.
    pub prefetch_factor: usize,
    /// Keep worker threads across epochs; otherwise they are stopped at each epoch boundary and
    /// new ones start (as PyTorch re-creates its worker processes).
    pub persistent_workers: bool,
    /// Batches per epoch (for `persistent_workers = false`); 0 = unknown/infinite.
    pub batches_per_epoch: u64,
}

struct Shared<T, E> {
    /// Next batch index a worker should claim.
    next: u64,
    /// Finished batches waiting for the consumer.
    ready: BTreeMap<u64, Result<T, E>>,
    /// Batches claimed and not yet consumed (in flight or ready).
    in_flight: usize,
    /// Workers stop claiming at this index (end of the current epoch when not persistent).
    limit: u64,
    stop: bool,
}

/// The prefetching loader.
pub struct Prefetcher<T: Send + 'static, E: Send + 'static> {
    cfg: LoaderConfig,
    make: MakeBatch<T, E>,
    state: Arc<(Mutex<Shared<T, E>>, Condvar)>,
    workers: VecDeque<JoinHandle<()>>,
    /// The batch the consumer should ask for next.
    expected: u64,
    /// Worker generations started (1 with persistent workers).
    pub generations: u64,
}

impl<T: Send + 'static, E: Send + From<SpawnError> + 'static> Prefetcher<T, E> {
    pub fn new(cfg: LoaderConfig, make: MakeBatch<T, E>) -> Self {
        let state = Arc::new((
            Mutex::new(Shared { next: 0, ready: BTreeMap::new(), in_flight: 0, limit: 0, stop: false }),
            Condvar::new(),
        ));
        Self { cfg: LoaderConfig { prefetch_factor: cfg.prefetch_factor.max(1), ..cfg }, make, state, workers: VecDeque::new(), expected: 0, generations: 0 }
    }

    fn epoch_end(&self, k: u64) -> u64 {
        match (self.cfg.persistent_workers, self.cfg.batches_per_epoch) {
            (false, n) if n > 0 => (k / n + 1) * n,
            _ => u64::MAX,
        }
    }

    /// Start the workers at batch `from`; a refused thread stops the ones already started.
    fn start_workers(&mut self, from: u64) -> Result<(), SpawnError> {
        {
            let mut s = self.state.0.lock().unwrap_or_else(|p| p.into_inner());
            s.next = from;
            s.ready.clear();
            s.in_flight = 0;
            s.limit = self.epoch_end(from);
            s.stop = false;
        }
        self.generations += 1;
        let cap = self.cfg.num_workers * self.cfg.prefetch_factor;
        for w in 0..self.cfg.num_workers {
            let state = self.state.clone();
            let make = self.make.clone();
            match std::thread::Builder::new().name(format!("vramlab-loader-{w}")).spawn(move || worker(&state, &*make, cap)) {
                Ok(handle) => self.workers.push_back(handle),
                Err(source) => {
                    self.stop_workers();
                    return Err(SpawnError { worker: w, workers: self.cfg.num_workers, source });
                }
            }
        }
        Ok(())
    }

    /// Batch `k`. Batches are meant to be asked for in increasing order; asking for another
    /// one restarts the workers there.
    pub fn get(&mut self, k: u64) -> Result<T, E> {
        if self.cfg.num_workers == 0 {
            return (self.make)(k);
        }
        let restart = {
            let s = self.state.0.lock().unwrap_or_else(|p| p.into_inner());
            // Out of order (a jump, as after resume) or past this generation's epoch.
            self.workers.is_empty() || k != self.expected || k >= s.limit
        };
        self.expected = k + 1;
        if restart {
            self.stop_workers();
            self.start_workers(k)?;
        }
        let (lock, cv) = &*self.state;
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = s.ready.remove(&k) {
                // In-order access (anything else restarted the workers at `k`): no batch below
                // `k` is ever ready, so nothing else holds the window.
                s.in_flight -= 1;
                cv.notify_all();
                return r;
            }
            if self.workers.iter().all(|h| h.is_finished()) {
                drop(s);
                // A worker panicked: build the batch here so the error (or panic) surfaces.
                return (self.make)(k);
            }
            s = cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl<T: Send + 'static, E: Send + 'static> Prefetcher<T, E> {
    fn stop_workers(&mut self) {
        {
            let mut s = self.state.0.lock().unwrap_or_else(|p| p.into_inner());
            s.stop = true;
        }
        self.state.1.notify_all();
        while let Some(h) = self.workers.pop_front() {
            let _ = h.join();
        }
    }
}

impl<T: Send + 'static, E: Send + 'static> Drop for Prefetcher<T, E> {
    fn drop(&mut self) {
        self.stop_workers();
    }
}

fn worker<T, E>(state: &(Mutex<Shared<T, E>>, Condvar), make: &(dyn Fn(u64) -> Result<T, E> + Send + Sync), cap: usize) {
    let (lock, cv) = state;
    loop {
        let k = {
            let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if s.stop {
                    return;
                }
                if s.in_flight < cap && s.next < s.limit {
                    break;
                }
                s = cv.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            let k = s.next;
            s.next += 1;
            s.in_flight += 1;
            k
        };
        let r = make(k);
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        s.ready.insert(k, r);
        cv.notify_all();
    }
}

/// lerobot's sampling: a seeded shuffle of the sampleable frames each epoch (with
/// `drop_n_last_frames`, the last frames of every episode are never drawn, as lerobot's
/// `EpisodeAwareSampler`). Sample `p` of the run is `perm(p / n)[p % n]`.
#[derive(Debug)]
pub struct EpochSampler {
    indices: Vec<usize>,
    seed: u64,
    shuffle: bool,
    cache: Mutex<VecDeque<(u64, Arc<Vec<usize>>)>>,
}

impl EpochSampler {
    /// `episodes`: `(from, to)` frame ranges.
    pub fn new(episodes: impl IntoIterator<Item = (usize, usize)>, drop_n_last_frames: usize, seed: u64, shuffle: bool) -> Self {
        let indices = episodes.into_iter().flat_map(|(a, b)| a..b.saturating_sub(drop_n_last_frames).max(a)).collect();
        Self { indices, seed, shuffle, cache: Mutex::new(VecDeque::new()) }
    }

    pub fn len(&self) -> usize {
        self.indices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    fn perm(&self, epoch: u64) -> Arc<Vec<usize>> {
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, p)) = c.iter().find(|(e, _)| *e == epoch) {
            return p.clone();
        }
        let mut p = self.indices.clone();
        if self.shuffle {
            // Fisher–Yates with a SplitMix64 stream seeded by (seed, epoch).
            let mut z = self.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED;
            let mut next = || {
                z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut x = z;
                x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                x ^ (x >> 31)
            };
            for i in (1..p.len()).rev() {
                let j = (next() % (i as u64 + 1)) as usize;
                p.swap(i, j);
            }
        }
        let p = Arc::new(p);
        if c.len() >= 2 {
            c.pop_front();
        }
        c.push_back((epoch, p.clone()));
        p
    }

    /// The frame index of the run's `p`-th sample. Panics if the sampler is empty.
    pub fn index(&self, p: u64) -> usize {
        let n = self.indices.len() as u64;
        assert!(n > 0, "EpochSampler: no sampleable frames");
        self.perm(p / n)[(p % n) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    impl From<SpawnError> for String {
        fn from(e: SpawnError) -> String {
            e.to_string()
        }
    }

    #[test]
    fn sampler_is_a_permutation_per_epoch_and_drops_last_frames() {
        let s = EpochSampler::new([(0, 10), (10, 15)], 2, 7, true);
        assert_eq!(s.len(), 8 + 3);
        let mut e0: Vec<usize> = (0..11).map(|p| s.index(p)).collect();
        let e1: Vec<usize> = (11..22).map(|p| s.index(p)).collect();
        assert_ne!(e0, e1, "epochs are shuffled differently");
        e0.sort();
        assert_eq!(e0, vec![0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12]);
        let again = EpochSampler::new([(0, 10), (10, 15)], 2, 7, true);
        assert_eq!(again.index(13), s.index(13), "same seed, same order");
        let plain = EpochSampler::new([(0, 3)], 0, 7, false);
        assert_eq!((0..6).map(|p| plain.index(p)).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn prefetcher_gives_batches_in_order_with_any_worker_count() {
        for workers in [0, 1, 3] {
            for persistent in [true, false] {
                let calls = Arc::new(AtomicUsize::new(0));
                let c = calls.clone();
                let make: MakeBatch<u64, String> = Arc::new(move |k| {
                    c.fetch_add(1, Ordering::Relaxed);
                    if k == 13 { Err(format!("bad batch {k}")) } else { Ok(k * k) }
                });
                let cfg = LoaderConfig { num_workers: workers, prefetch_factor: 2, persistent_workers: persistent, batches_per_epoch: 5 };
                let mut p = Prefetcher::new(cfg, make);
                for k in 0..13 {
                    assert_eq!(p.get(k), Ok(k * k), "workers {workers}");
                }
                assert_eq!(p.get(13), Err("bad batch 13".to_string()));
                // Jump (as after a resume): restarts at the new index.
                assert_eq!(p.get(40), Ok(1600));
                if workers > 0 {
                    let expected_gens = if persistent { 2 } else { 4 };
                    assert!(p.generations >= expected_gens, "workers {workers} persistent {persistent}: {} generations", p.generations);
                }
            }
        }
    }
}
