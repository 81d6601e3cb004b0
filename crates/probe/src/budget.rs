//! A memory budget for the counting allocator: the CPU stand-in for a GPU's capacity.
//!
//! With a budget set, an allocation that would take the live heap bytes above it ends the
//! process at once with [`OUT_OF_MEMORY_EXIT_CODE`] and one line on stderr, the way a device
//! out-of-memory error ends a PyTorch step. Nothing is unwound: the allocator cannot return an
//! error to Burn, and a null pointer would abort without saying why. The line is formatted on
//! the stack and written with `write(2)`, so ending the run allocates nothing.
//!
//! `vramlab fit` runs every trial in its own process with a budget (environment variable
//! [`BUDGET_ENV`]), so a trial that does not fit is a clean, reported out-of-memory result.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Exit status of a process that crossed its memory budget.
pub const OUT_OF_MEMORY_EXIT_CODE: i32 = 86;
/// Environment variable holding the budget in bytes (read by the `vramlab` binary at start).
pub const BUDGET_ENV: &str = "VRAMLAB_MEMORY_BUDGET";
/// First words of the line written when the budget is crossed (callers match on them).
pub const OUT_OF_MEMORY_MESSAGE: &str = "error: out of memory:";

static BUDGET: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Cap the live heap bytes of this process (`None`: no cap).
pub fn set_budget(bytes: Option<u64>) {
    let b = bytes.map_or(usize::MAX, |b| usize::try_from(b).unwrap_or(usize::MAX));
    BUDGET.store(b, Ordering::Relaxed);
}

/// The current cap, if any.
pub fn budget() -> Option<u64> {
    let b = BUDGET.load(Ordering::Relaxed);
    (b != usize::MAX).then_some(b as u64)
}

/// Called by the allocator before it asks the system for `size` more bytes.
#[inline]
pub(crate) fn check(live: usize, size: usize) {
    let budget = BUDGET.load(Ordering::Relaxed);
    if budget != usize::MAX && live.saturating_add(size) > budget {
        exceeded(size, live, budget);
    }
}

#[cold]
fn exceeded(size: usize, live: usize, budget: usize) -> ! {
    let mut line = StackLine::default();
    line.push(OUT_OF_MEMORY_MESSAGE.as_bytes());
    line.push(b" an allocation of ");
    line.number(size);
    line.push(b" bytes with ");
    line.number(live);
    line.push(b" bytes live would exceed the memory budget of ");
    line.number(budget);
    line.push(b" bytes\n");
    line.write_stderr_and_exit()
}

/// A fixed buffer for the one line written on the way out.
struct StackLine {
    buf: [u8; 256],
    len: usize,
}

impl Default for StackLine {
    fn default() -> Self {
        Self { buf: [0; 256], len: 0 }
    }
}

impl StackLine {
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn number(&mut self, mut v: usize) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }

    #[cfg(unix)]
    fn write_stderr_and_exit(&self) -> ! {
        // SAFETY: writes bytes of a live stack buffer to fd 2, then ends the process without
        // running destructors or exit handlers (which could allocate or take locks).
        unsafe {
            libc::write(2, self.buf.as_ptr().cast(), self.len);
            libc::_exit(OUT_OF_MEMORY_EXIT_CODE)
        }
    }

    #[cfg(not(unix))]
    fn write_stderr_and_exit(&self) -> ! {
        use std::io::Write;
        let _ = std::io::stderr().write_all(&self.buf[..self.len]);
        std::process::abort()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_formats_numbers_without_allocating() {
        let mut l = StackLine::default();
        l.push(b"a ");
        l.number(0);
        l.push(b" ");
        l.number(1_234_567_890);
        assert_eq!(&l.buf[..l.len], b"a 0 1234567890");
        // A full buffer truncates instead of overflowing.
        for _ in 0..100 {
            l.number(usize::MAX);
        }
        assert_eq!(l.len, 256);
    }

    #[test]
    fn budget_round_trips() {
        assert_eq!(budget(), None);
        check(usize::MAX - 1, 1); // no budget: never ends the process
    }
}
