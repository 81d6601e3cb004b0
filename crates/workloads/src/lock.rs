//! Advisory directory locks: `train`, `--resume`, `sweep` and `fit` hold an exclusive OS lock
//! (`flock`) on `<dir>/.vramlab.lock` while they write into `<dir>`, so a second vramlab process
//! on the same directory refuses at once, naming the holder's pid. The kernel releases the lock
//! when its process dies (even by `kill -9`): a stale lock file never blocks. The file stays
//! (removing it would let two processes lock two different files of one name).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::{Result, WorkloadError};

/// The lock file in a locked directory.
pub const LOCK_FILE: &str = ".vramlab.lock";

/// A held lock: released when dropped (or when the process ends).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    pub path: PathBuf,
}

/// Lock `dir` (which must exist) for this process; `flag` names the option that chose the
/// directory (`output_dir`) in the error when another process holds it.
pub fn lock_dir(dir: &Path, flag: &str) -> Result<DirLock> {
    let path = dir.join(LOCK_FILE);
    let io = |source| WorkloadError::Io { path: path.clone(), source };
    let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
    match file.try_lock() {
        Ok(()) => {
            file.set_len(0).map_err(io)?;
            file.write_all(format!("{}\n", std::process::id()).as_bytes()).map_err(io)?;
            Ok(DirLock { _file: file, path })
        }
        Err(TryLockError::WouldBlock) => {
            let pid = holder_pid(&mut file).map_or_else(|| "pid unknown".to_string(), |p| format!("pid {p}"));
            Err(WorkloadError::invalid(
                flag,
                format!("{} is in use by another vramlab process ({pid}, lock {}); wait for it to finish or choose another --{flag}", dir.display(), path.display()),
            ))
        }
        Err(TryLockError::Error(source)) => Err(WorkloadError::Io { path, source }),
    }
}

/// The pid the holder wrote into the lock file (it writes right after locking: a few tries).
fn holder_pid(file: &mut File) -> Option<u32> {
    for _ in 0..20 {
        let mut text = String::new();
        if file.rewind().is_ok() && file.read_to_string(&mut text).is_ok() {
            if let Ok(pid) = text.trim().parse() {
                return Some(pid);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_directory_is_refused_with_the_pid_and_freed_on_drop() {
        let dir = vramlab_testkit::temp_dir("lock");
        let held = lock_dir(dir.path(), "output_dir").unwrap();
        let err = lock_dir(dir.path(), "output_dir").unwrap_err().to_string();
        assert!(err.contains(&format!("pid {}", std::process::id())) && err.contains("--output_dir"), "{err}");
        drop(held);
        lock_dir(dir.path(), "output_dir").unwrap();
    }
}
