//! How the system allocator under [`crate::CountingAllocator`] hands memory back to the OS.
//!
//! glibc's malloc returns freed memory eagerly: a block above its mmap threshold (128 KiB at
//! start, raised up to 32 MiB as such blocks are freed) is unmapped on `free`, and free space at
//! the top of a heap above its trim threshold is given back. A training step frees and
//! re-allocates the same activation-sized buffers every step, so each step faults them in again
//! page by page: the VAE ultra b2 8×32×32 f32 on flex took ~5,900 page faults per step and
//! ~7 % of its CPU time in the kernel for them (Zen 4 EPYC, `perf stat -e page-faults`; 30
//! steps: 177,879 faults as glibc comes, 14,499 with the settings below).
//!
//! [`keep_freed_memory`] fixes both thresholds at the start of the process (so the dynamic
//! adjustment stops): blocks up to 32 MiB (glibc's largest mmap threshold) come from the heaps
//! and are reused, and a heap is trimmed only once 512 MiB are free at its top. Blocks above
//! 32 MiB are still mapped per allocation. Exact allocated figures do not change (the counting
//! allocator counts requests); the resident set after a peak stays nearer that peak, as
//! PyTorch's CUDA caching allocator keeps its reserved memory. `GLIBC_TUNABLES` naming a
//! `glibc.malloc.*` tunable leaves glibc's settings to the user.

/// The largest mmap threshold glibc accepts on 64-bit (`HEAP_MAX_SIZE / 2`).
pub const MMAP_THRESHOLD: usize = 32 << 20;
/// Free bytes at the top of a heap before glibc gives them back.
pub const TRIM_THRESHOLD: usize = 512 << 20;

/// Keep freed memory for reuse (see the module docs); returns a line for run summaries saying
/// what was done. Call once, at the start of `main`, before threads allocate.
pub fn keep_freed_memory() -> String {
    let user = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."));
    if user {
        return "glibc malloc as GLIBC_TUNABLES sets it".into();
    }
    set_thresholds()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() -> String {
    // SAFETY: mallopt only changes allocator parameters; both values are in glibc's ranges.
    let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as i32) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as i32) == 1 };
    if ok { "glibc malloc: freed blocks up to 32 MiB kept for reuse, heaps trimmed above 512 MiB free".into() } else { "glibc malloc: default thresholds (mallopt refused)".into() }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> String {
    "the platform's allocator, untuned".into()
}

/// The line [`keep_freed_memory`] returned in this process, if it was called.
pub fn described() -> Option<&'static str> {
    DESCRIBED.get().map(String::as_str)
}

static DESCRIBED: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// [`keep_freed_memory`], remembering its line for [`described`] (the binary's entry point).
pub fn keep_freed_memory_once() -> &'static str {
    DESCRIBED.get_or_init(keep_freed_memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After the call, a step-like pattern (allocate 8 blocks of 4 MiB, free them all, allocate
    /// them again) faults its pages in once, not every round: with glibc's defaults the second
    /// round faults ~8,000 pages again (the 32 MiB freed at the heap's top are above its dynamic
    /// trim threshold, twice the largest block freed so far, and are given back).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_blocks_are_reused_not_faulted_in_again() {
        if std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
            eprintln!("skipped: GLIBC_TUNABLES sets malloc's thresholds");
            return;
        }
        let line = keep_freed_memory_once();
        assert!(line.contains("32 MiB"), "{line}");
        let faults = || {
            let s = std::fs::read_to_string("/proc/self/stat").unwrap();
            // minflt: the 8th field after the `(comm)` field's closing parenthesis and state.
            let rest = &s[s.rfind(')').unwrap() + 2..];
            rest.split_whitespace().nth(7).unwrap().parse::<u64>().unwrap()
        };
        let round = || {
            let blocks: Vec<Vec<u8>> = (0..8)
                .map(|_| {
                    let mut v = Vec::<u8>::with_capacity(4 << 20);
                    v.resize(4 << 20, 1);
                    v
                })
                .collect();
            std::hint::black_box(&blocks);
        };
        round();
        let before = faults();
        round();
        // 8 × 1,024 pages if the blocks were mapped anew; reused memory faults (almost) none.
        // Other test threads allocate too: leave room for them.
        let again = faults() - before;
        assert!(again < 2048, "{again} page faults in the second round");
    }
}
