//! A measured run in a child process, as `sweep` and `fit` start them: the `vramlab train`
//! command line ([`train_command`]), its records read back from JSONL ([`read_jsonl`]; a torn
//! last line of a killed run is dropped) and the line that says why it failed
//! ([`last_error`]). Each run in its own process, so one run's memory cannot leak into another's
//! figures and an out-of-memory run does not end the search.
//!
//! Also what both commands do to their directories: the request a directory was made for
//! ([`check_request`]: results are reused only under the same config) and the removal of a
//! child's scratch directory, only when vramlab made it ([`clear_run_dir`]).

use std::path::Path;
use std::process::Command;

use crate::error::{Result, WorkloadError};
use crate::lock::LOCK_FILE;

/// What a `sweep` or `fit` directory `out` was asked (`file`: `sweep_request.json`,
/// `fit_request.json`; `request`: the config file, the flags, and what else makes its results
/// what they are). The first run into the directory writes it; a later one keeps the earlier
/// results only when it asks the same, and is otherwise refused before anything runs, so no
/// result measured under another config is reused under this command line.
pub fn check_request(out: &Path, file: &str, request: &serde_json::Value) -> Result<()> {
    let path = out.join(file);
    match std::fs::read_to_string(&path) {
        Ok(text) => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(earlier) if earlier == *request => Ok(()),
            Ok(earlier) => Err(WorkloadError::file(
                &path,
                format!("this directory holds results of another request ({earlier}); give another --output_dir, or the same config and flags to continue it"),
            )),
            Err(e) => Err(WorkloadError::file(&path, format!("not valid JSON: {e}"))),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let tmp = path.with_extension("tmp");
            let text = serde_json::to_string_pretty(request).expect("JSON values serialise");
            std::fs::write(&tmp, text).map_err(|source| WorkloadError::Io { path: tmp.clone(), source })?;
            std::fs::rename(&tmp, &path).map_err(|source| WorkloadError::Io { path: path.clone(), source })
        }
        Err(source) => Err(WorkloadError::Io { path, source }),
    }
}

/// Remove a child run's directory `dir` before the run starts again: only one that vramlab's
/// `train` made (it holds [`LOCK_FILE`], the first file `train` writes) or an empty one. Any
/// other existing directory or file is an error naming it: vramlab deletes only what it made.
pub fn clear_run_dir(dir: &Path) -> Result<()> {
    let io = |source| WorkloadError::Io { path: dir.to_path_buf(), source };
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(e)),
        Ok(m) if !m.is_dir() => return Err(WorkloadError::file(dir, "exists and is not a run directory; move it away".into())),
        Ok(_) => {}
    }
    let empty = std::fs::read_dir(dir).map_err(io)?.next().is_none();
    if !empty && !dir.join(LOCK_FILE).is_file() {
        return Err(WorkloadError::file(dir, format!("exists and was not made by a vramlab run (no {LOCK_FILE} inside); move it away or choose another --output_dir")));
    }
    std::fs::remove_dir_all(dir).map_err(io)
}

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
