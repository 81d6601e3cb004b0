//! A model of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`, default
//! settings: no `expandable_segments`, no `max_split_size_mb`, no `empty_cache`), replayed
//! over a stream of tensor allocations and frees: what `torch.cuda.memory_allocated` and
//! `memory_reserved` (and their peaks) read.
//!
//! Rules modelled (PyTorch 2.x source constants):
//! - every request is rounded up to a multiple of 512 bytes (`kMinBlockSize`), at least 512;
//! - requests ≤ 1 MiB (`kSmallSize`) use the small pool, whose segments are 2 MiB
//!   (`kSmallBuffer`); larger ones the large pool, whose new segments are 20 MiB
//!   (`kLargeBuffer`) for requests < 10 MiB (`kMinLargeAlloc`), else the request rounded up to
//!   2 MiB (`kRoundLarge`);
//! - a request takes the smallest free cached block of its pool that fits (best fit); the
//!   block is split when the remainder is ≥ 512 bytes (small pool) or > 1 MiB (large pool),
//!   otherwise the whole block is handed out (and counted as allocated);
//! - a freed block merges with free neighbours of the same segment; segments go back to the
//!   driver only through `emptyCache()` ([`CachingAllocator::empty_cache`]: every segment that
//!   is one free block, `release_cached_blocks`), which nothing in a training step calls except
//!   cuDNN's benchmark search (see `crate::torch_target`); otherwise reserved only grows.
//!
//! Among free blocks of the same size the lowest address goes first (the pool is ordered by
//! size, then address); addresses are modelled as segment creation order, then offset.

use std::collections::HashMap;

pub const MIN_BLOCK: u64 = 512;
pub const SMALL_SIZE: u64 = 1 << 20;
pub const SMALL_BUFFER: u64 = 2 << 20;
pub const LARGE_BUFFER: u64 = 20 << 20;
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
pub const ROUND_LARGE: u64 = 2 << 20;

/// Request size after the allocator's rounding.
pub fn round_size(bytes: u64) -> u64 {
    if bytes < MIN_BLOCK { MIN_BLOCK } else { bytes.div_ceil(MIN_BLOCK) * MIN_BLOCK }
}

/// Size of the segment (`cudaMalloc`) a request of `rounded` bytes creates when no cached
/// block fits.
pub fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[derive(Clone, Copy, Debug)]
struct Block {
    offset: u64,
    size: u64,
    free: bool,
}

#[derive(Clone, Debug)]
struct Segment {
    small: bool,
    blocks: Vec<Block>,
}

/// The allocator's state and statistics.
#[derive(Clone, Debug, Default)]
pub struct CachingAllocator {
    /// Segments by creation (a released one is `None`).
    segments: Vec<Option<Segment>>,
    /// Tensor id → (segment, block offset).
    live: HashMap<u64, (usize, u64)>,
    pub allocated: u64,
    pub reserved: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// Number of `cudaMalloc` calls (segments created).
    pub segments_created: usize,
}

impl CachingAllocator {
    pub fn new() -> Self {
        Self::default()
    }

    /// `reset_peak_memory_stats()`: peaks restart from the current values.
    pub fn reset_peaks(&mut self) {
        self.peak_allocated = self.allocated;
        self.peak_reserved = self.reserved;
    }

    /// Allocate tensor `id` of `bytes` (0 bytes: nothing, as PyTorch).
    pub fn alloc(&mut self, id: u64, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let size = round_size(bytes);
        let small = size <= SMALL_SIZE;
        // Best fit among the free blocks of the pool.
        let mut best: Option<(usize, usize, u64)> = None;
        for (si, s) in self.segments.iter().enumerate().filter_map(|(i, s)| s.as_ref().map(|s| (i, s))).filter(|(_, s)| s.small == small) {
            for (bi, b) in s.blocks.iter().enumerate() {
                if b.free && b.size >= size && best.is_none_or(|(_, _, sz)| b.size < sz) {
                    best = Some((si, bi, b.size));
                }
            }
        }
        let (si, bi) = match best {
            Some((si, bi, _)) => (si, bi),
            None => {
                let seg = segment_size(size);
                self.segments.push(Some(Segment { small, blocks: vec![Block { offset: 0, size: seg, free: true }] }));
                self.reserved += seg;
                self.segments_created += 1;
                self.peak_reserved = self.peak_reserved.max(self.reserved);
                (self.segments.len() - 1, 0)
            }
        };
        let Some(seg) = self.segments[si].as_mut() else { unreachable!("a block of a released segment") };
        let blocks = &mut seg.blocks;
        let b = blocks[bi];
        let rest = b.size - size;
        let split = if small { rest >= MIN_BLOCK } else { rest > SMALL_SIZE };
        let given = if split {
            blocks[bi] = Block { offset: b.offset, size, free: false };
            blocks.insert(bi + 1, Block { offset: b.offset + size, size: rest, free: true });
            size
        } else {
            blocks[bi].free = false;
            b.size
        };
        self.allocated += given;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        self.live.insert(id, (si, b.offset));
    }

    /// Free tensor `id` (unknown ids, e.g. 0-byte tensors, are ignored).
    pub fn free(&mut self, id: u64) {
        let Some((si, off)) = self.live.remove(&id) else { return };
        let Some(seg) = self.segments[si].as_mut() else { return };
        let blocks = &mut seg.blocks;
        let Some(bi) = blocks.iter().position(|b| b.offset == off) else { return };
        self.allocated -= blocks[bi].size;
        blocks[bi].free = true;
        // Merge with the next, then the previous free neighbour.
        if bi + 1 < blocks.len() && blocks[bi + 1].free {
            blocks[bi].size += blocks[bi + 1].size;
            blocks.remove(bi + 1);
        }
        if bi > 0 && blocks[bi - 1].free {
            blocks[bi - 1].size += blocks[bi].size;
            blocks.remove(bi);
        }
    }

    /// `torch.cuda.empty_cache()` / `emptyCache()`: every segment that is a single free block
    /// goes back to the driver (`cudaFree`); split segments with any live block stay.
    pub fn empty_cache(&mut self) {
        for slot in &mut self.segments {
            if let Some(s) = slot
                && s.blocks.len() == 1
                && s.blocks[0].free
            {
                self.reserved -= s.blocks[0].size;
                *slot = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn rounding_and_segment_sizes() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(segment_size(512), 2 * MIB);
        assert_eq!(segment_size(MIB), 2 * MIB);
        assert_eq!(segment_size(MIB + 512), 20 * MIB);
        assert_eq!(segment_size(10 * MIB - 512), 20 * MIB);
        assert_eq!(segment_size(10 * MIB), 10 * MIB);
        assert_eq!(segment_size(11 * MIB + 1), 12 * MIB);
    }

    #[test]
    fn small_requests_share_a_2mib_segment() {
        let mut a = CachingAllocator::new();
        for i in 0..4 {
            a.alloc(i, 100);
        }
        assert_eq!((a.allocated, a.reserved, a.segments_created), (4 * 512, 2 * MIB, 1));
        // 4 × 512 KiB fill the segment; the fifth opens a second one.
        let mut b = CachingAllocator::new();
        for i in 0..5 {
            b.alloc(i, 512 * 1024);
        }
        assert_eq!(b.reserved, 4 * MIB);
    }

    #[test]
    fn large_blocks_split_reuse_and_merge() {
        let mut a = CachingAllocator::new();
        a.alloc(1, 3 * MIB); // a 20 MiB segment, split: 17 MiB free
        a.alloc(2, 5 * MIB); // fits the remainder
        assert_eq!((a.reserved, a.allocated), (20 * MIB, 8 * MIB));
        a.free(1);
        a.free(2);
        assert_eq!(a.allocated, 0);
        // Merged back into one 20 MiB block: a 19 MiB request fits, the 1 MiB rest is kept
        // with it (not > 1 MiB: no split), so allocated counts the whole 20 MiB.
        a.alloc(3, 19 * MIB);
        assert_eq!((a.reserved, a.allocated), (20 * MIB, 20 * MIB));
        // A second large request needs a new segment, exact size rounded to 2 MiB.
        a.alloc(4, 13 * MIB + 1);
        assert_eq!(a.reserved, 20 * MIB + 14 * MIB);
        a.free(3);
        a.free(4);
        a.reset_peaks();
        assert_eq!((a.peak_allocated, a.peak_reserved), (0, 34 * MIB));
    }

    #[test]
    fn empty_cache_releases_only_wholly_free_segments() {
        let mut a = CachingAllocator::new();
        a.alloc(1, 30 * MIB); // its own 30 MiB segment
        a.alloc(2, 3 * MIB); // a 20 MiB segment, split
        a.alloc(3, 4 * MIB); // the same 20 MiB segment
        a.alloc(4, 100); // a 2 MiB small segment
        assert_eq!(a.reserved, 52 * MIB);
        a.free(1);
        a.free(2);
        a.free(4);
        a.empty_cache();
        // The 30 MiB and the small segment go; the 20 MiB one still holds tensor 3.
        assert_eq!((a.reserved, a.allocated), (20 * MIB, 4 * MIB));
        assert_eq!(a.peak_reserved, 52 * MIB);
        a.free(3);
        a.empty_cache();
        assert_eq!(a.reserved, 0);
        // A later request makes a new segment (the released ones are gone).
        a.alloc(5, 30 * MIB);
        assert_eq!((a.reserved, a.segments_created), (30 * MIB, 4));
    }

    #[test]
    fn best_fit_prefers_the_smallest_block() {
        let mut a = CachingAllocator::new();
        a.alloc(1, 12 * MIB);
        a.alloc(2, 30 * MIB);
        a.free(1);
        a.free(2);
        a.alloc(3, 11 * MIB);
        // Took the 12 MiB segment (its 1 MiB rest is not split off), not the 30 MiB one.
        assert_eq!(a.allocated, 12 * MIB);
        a.alloc(4, 25 * MIB);
        assert_eq!(a.reserved, 42 * MIB);
    }
}
