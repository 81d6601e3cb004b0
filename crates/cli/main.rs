//! `vramlab`: train, measure and sweep memory-hungry robot-learning workloads on Burn.
//!
//! The binary is thin (ripgrep style): raw args → [`args::parse`] → a validated
//! [`vramlab_workloads::RunConfig`] → a command. Models, data, the trainer, the memory probe
//! and the workloads that join them live in the library crates under `crates/`.

mod args;
mod commands;

use std::process::ExitCode;

use vramlab_probe::CountingAllocator;

/// Counts every heap byte: on CPU backends this is the device memory the probe reports.
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn main() -> ExitCode {
    // Freed tensor buffers are kept for reuse instead of being handed back to the OS and faulted
    // in again every step (vramlab_probe::heap; GLIBC_TUNABLES overrides).
    vramlab_probe::heap::keep_freed_memory_once();
    // A memory cap for this process (set by `vramlab fit` for its trials; usable by hand to
    // stand in for a smaller GPU on the CPU backend).
    if let Some(v) = std::env::var_os(vramlab_probe::BUDGET_ENV) {
        match v.to_str().and_then(vramlab_bytes::parse) {
            Some(b) => vramlab_probe::set_budget(Some(b)),
            None => {
                eprintln!("error: {}={v:?}: not a byte count (e.g. 2GiB, 512MiB, 1000000)", vramlab_probe::BUDGET_ENV);
                return ExitCode::from(2);
            }
        }
    }
    let cli = match args::parse(std::env::args_os()) {
        Ok(cli) => cli,
        // --help, --version and usage errors, printed and coded by clap (usage errors: 2).
        Err(e) => e.exit(),
    };
    match commands::run(cli) {
        Ok(()) => ExitCode::from(commands::ok_exit_code()),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
