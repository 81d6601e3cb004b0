//! A measured run in a child process, as `sweep` and `fit` start them: the `vramlab train`
//! command line ([`train_command`]), its records read back from JSONL ([`read_jsonl`]; a torn
//! last line of a killed run is dropped) and the line that says why it failed
//! ([`last_error`]). Each run in its own process, so one run's memory cannot leak into another's
//! figures and an out-of-memory run does not end the search.

use std::path::Path;
use std::process::Command;

/// The lines of a JSONL file that parse (a torn last line of a killed run is dropped); none
/// when the file is missing.
pub fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Vec<T> {
    std::fs::read_to_string(path)
        .map(|t| t.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
        .unwrap_or_default()
}

/// `exe train [--config=F] --k=v … --output_dir=DIR`: one measured run in its own process
/// (later flags win over earlier ones).
pub fn train_command(exe: &Path, config_file: Option<&Path>, flags: &[(String, String)], dir: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg("train");
    if let Some(c) = config_file {
        cmd.arg(format!("--config={}", c.display()));
    }
    for (k, v) in flags {
        cmd.arg(format!("--{k}={v}"));
    }
    cmd.arg(format!("--output_dir={}", dir.display()));
    cmd
}

/// The line that says why a child `vramlab` failed: its last `error:` line, or the message of
/// its panic (on the line after the location).
pub fn last_error(stderr: &str) -> Option<String> {
    let l = stderr.lines().rev().find(|l| l.starts_with("error:") || l.contains("panicked at"))?;
    Some(match l.contains("panicked at") {
        true => stderr.lines().skip_while(|x| *x != l).nth(1).map_or(l.to_string(), |m| format!("panic: {m}")),
        false => l.to_string(),
    })
}
