//! The checkpoint directory, laid out as lerobot 0.4.4 lays it out, and verified on resume.
//!
//! ```text
//! <output_dir>/checkpoints/
//! ├── 000500/
//! │   ├── pretrained_model/      what a policy needs to run: config.json, model.safetensors,
//! │   │                          train_config.json, the pre/post-processor files (the caller's)
//! │   ├── training_state/        what training needs to continue: optimizer_state.safetensors,
//! │   │                          optimizer_param_groups.json, scheduler_state.json,
//! │   │                          training_step.json, and vramlab's trainer_state.json
//! │   └── manifest.json          every file above with its size and SHA-256 (written last)
//! └── last -> 000500             (a relative symbolic link, replaced atomically)
//! ```
//!
//! A checkpoint is built under a temporary name (`.000500.tmp`) and renamed when complete, so
//! a killed run never leaves a half-written `000500/`. [`newest_intact`] checks each
//! checkpoint's files against its manifest (which must cover them all), newest first, and skips
//! (with a reason) any that was truncated or altered afterwards or holds non-finite weights.
//! [`verify_for_load`] checks a `pretrained_model/` the same way before `predict`,
//! `--policy.path` or `bench-inference` load it. A checkpoint whose weights led to a
//! non-finite loss is set aside as `<step>.nonfinite/` ([`set_aside`]).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const PRETRAINED_MODEL_DIR: &str = "pretrained_model";
pub const TRAINING_STATE_DIR: &str = "training_state";
pub const MANIFEST_FILE: &str = "manifest.json";
pub const LAST_LINK: &str = "last";
pub const MODEL_FILE: &str = "pretrained_model/model.safetensors";
pub const OPTIMIZER_STATE_FILE: &str = "training_state/optimizer_state.safetensors";
pub const OPTIMIZER_GROUPS_FILE: &str = "training_state/optimizer_param_groups.json";
pub const SCHEDULER_STATE_FILE: &str = "training_state/scheduler_state.json";
pub const TRAINING_STEP_FILE: &str = "training_state/training_step.json";
pub const TRAINER_STATE_FILE: &str = "training_state/trainer_state.json";

/// lerobot's step directory name: the step zero-padded to 6 digits (more when `total` needs).
pub fn step_dir_name(step: u64, total: u64) -> String {
    let width = total.to_string().len().max(6);
    format!("{step:0width$}")
}

/// One file of a checkpoint as it was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub bytes: u64,
    pub sha256: String,
}

/// `manifest.json`: the step and every file of the checkpoint (paths relative to its directory).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub step: u64,
    pub files: BTreeMap<String, FileEntry>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {msg}")]
    Bad { path: PathBuf, msg: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io { path: path.to_path_buf(), source }
}

/// Size and SHA-256 of a file, streamed.
pub fn file_entry(path: &Path) -> Result<FileEntry, CheckpointError> {
    let mut f = fs::File::open(path).map_err(io(path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    let sha256 = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(FileEntry { bytes, sha256 })
}

/// Every regular file under `dir` (relative paths with '/' separators), sorted.
fn files_under(dir: &Path) -> Result<Vec<String>, CheckpointError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).map_err(io(&d))? {
            let path = entry.map_err(io(&d))?.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                out.push(rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Write `manifest.json` for the files now in `dir` (call it last, before the final rename).
pub fn write_manifest(dir: &Path, step: u64) -> Result<(), CheckpointError> {
    let mut files = BTreeMap::new();
    for rel in files_under(dir)?.into_iter().filter(|f| f != MANIFEST_FILE) {
        files.insert(rel.clone(), file_entry(&dir.join(&rel))?);
    }
    let text = serde_json::to_string_pretty(&Manifest { step, files }).expect("a manifest serialises");
    let path = dir.join(MANIFEST_FILE);
    fs::write(&path, text).map_err(io(&path))
}

/// Check every file of the manifest (size, then hash), and that it covers every file of the
/// checkpoint (a manifest listing no files, or missing one, proves nothing). `Err` says what
/// is wrong.
pub fn verify(dir: &Path) -> Result<Manifest, CheckpointError> {
    verify_under(dir, "")
}

/// [`verify`] restricted to the files under `prefix` (`"pretrained_model/"`: what a policy
/// load reads); `""` is the whole checkpoint.
pub fn verify_under(dir: &Path, prefix: &str) -> Result<Manifest, CheckpointError> {
    let path = dir.join(MANIFEST_FILE);
    let bad = |msg: String| CheckpointError::Bad { path: dir.to_path_buf(), msg };
    let text = fs::read_to_string(&path).map_err(|e| bad(format!("no readable {MANIFEST_FILE} ({e})")))?;
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| bad(format!("{MANIFEST_FILE} is not valid: {e}")))?;
    if manifest.files.is_empty() {
        return Err(bad(format!("{MANIFEST_FILE} lists no files: it verifies nothing")));
    }
    let present = files_under(dir)?;
    if let Some(extra) = present.iter().find(|f| f.starts_with(prefix) && *f != MANIFEST_FILE && !manifest.files.contains_key(*f)) {
        return Err(bad(format!("{extra} is not in {MANIFEST_FILE} (added after the checkpoint was written?)")));
    }
    for (rel, want) in manifest.files.iter().filter(|(rel, _)| rel.starts_with(prefix)) {
        let file = dir.join(rel);
        let len = fs::metadata(&file).map_err(|e| bad(format!("{rel}: {e}")))?.len();
        if len != want.bytes {
            return Err(bad(format!("{rel} has {len} bytes, the manifest says {} (truncated or replaced)", want.bytes)));
        }
        if file_entry(&file)?.sha256 != want.sha256 {
            return Err(bad(format!("{rel}: SHA-256 differs from the manifest (the file changed after it was written)")));
        }
    }
    Ok(manifest)
}

/// The weights and optimizer state of checkpoint `dir` hold no NaN or infinity (`Err` names
/// the file and the tensor).
pub fn check_finite(dir: &Path) -> Result<(), vramlab_store::WeightError> {
    for rel in [MODEL_FILE, OPTIMIZER_STATE_FILE] {
        let path = dir.join(rel);
        if path.exists() {
            vramlab_store::check_finite_file(&path)?;
        }
    }
    Ok(())
}

/// How a policy directory about to be loaded (`predict`, `--policy.path`, `bench-inference`)
/// was checked by [`verify_for_load`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadCheck {
    /// Its files match the manifest of the checkpoint holding it.
    Verified,
    /// Nothing to check against (lerobot writes no manifest; a bare `pretrained_model/`): why.
    Unverified(String),
}

/// Verify `pretrained` (a `pretrained_model/` directory, or a checkpoint step directory) against
/// its checkpoint's manifest before its files are loaded: the files under `pretrained_model/`
/// must match it and be covered by it. A vramlab checkpoint (it has `trainer_state.json`)
/// without a manifest is an error; lerobot's checkpoints and bare directories have none to
/// check ([`LoadCheck::Unverified`]).
pub fn verify_for_load(pretrained: &Path) -> Result<LoadCheck, CheckpointError> {
    if pretrained.join(MANIFEST_FILE).exists() {
        verify(pretrained)?;
        return Ok(LoadCheck::Verified);
    }
    let step = pretrained.parent().filter(|_| pretrained.file_name().is_some_and(|n| n == PRETRAINED_MODEL_DIR));
    let Some(step) = step else {
        return Ok(LoadCheck::Unverified(format!("{} has no {MANIFEST_FILE} (not inside a vramlab checkpoint)", pretrained.display())));
    };
    if step.join(MANIFEST_FILE).exists() {
        verify_under(step, &format!("{PRETRAINED_MODEL_DIR}/"))?;
        Ok(LoadCheck::Verified)
    } else if step.join(TRAINER_STATE_FILE).exists() {
        let msg = format!("no {MANIFEST_FILE}: vramlab writes it last, so this checkpoint is incomplete or its manifest was removed; its files cannot be trusted");
        Err(CheckpointError::Bad { path: step.to_path_buf(), msg })
    } else if is_lerobot_checkpoint(step) {
        Ok(LoadCheck::Unverified(format!("{} has no {MANIFEST_FILE} (written by lerobot)", step.display())))
    } else {
        Ok(LoadCheck::Unverified(format!("{} has no {MANIFEST_FILE}", step.display())))
    }
}

/// Complete checkpoint directories (named by their step; temporaries start with '.'), newest
/// first.
pub fn step_dirs(root: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let mut dirs = Vec::new();
    for entry in fs::read_dir(root).map_err(io(root))? {
        let entry = entry.map_err(io(root))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if let Ok(step) = name.parse::<u64>()
            && entry.path().is_dir()
        {
            dirs.push((step, entry.path()));
        }
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
    Ok(dirs)
}

/// A checkpoint that failed verification: where, and why.
#[derive(Clone, Debug)]
pub struct Skipped {
    pub dir: PathBuf,
    pub reason: String,
}

/// What [`newest_intact`] found.
#[derive(Clone, Debug)]
pub struct Intact {
    /// The newest checkpoint whose files match its manifest: (step, directory).
    pub newest: Option<(u64, PathBuf)>,
    /// Newer checkpoints that did not, with why.
    pub skipped: Vec<Skipped>,
    /// `newest` has no manifest: written by lerobot (which records none), so not verified.
    pub unverified: bool,
}

/// lerobot writes no manifest; its checkpoints are recognised by `training_step.json`.
fn is_lerobot_checkpoint(dir: &Path) -> bool {
    !dir.join(MANIFEST_FILE).exists() && dir.join(TRAINING_STEP_FILE).exists() && !dir.join(TRAINER_STATE_FILE).exists()
}

/// The newest checkpoint whose files match its manifest and whose weights are finite (or,
/// having no manifest, was written by lerobot), and the newer ones skipped (with why).
pub fn newest_intact(root: &Path) -> Result<Intact, CheckpointError> {
    let mut skipped = Vec::new();
    for (step, dir) in step_dirs(root)? {
        if is_lerobot_checkpoint(&dir) {
            return Ok(Intact { newest: Some((step, dir)), skipped, unverified: true });
        }
        // A file that does not parse is left to the load (which names it); NaN weights are
        // skipped here, so that the run falls back to an older checkpoint.
        let finite = |dir: &Path| match check_finite(dir) {
            Err(e @ vramlab_store::WeightError::NonFinite { .. }) => Err(CheckpointError::Bad { path: dir.to_path_buf(), msg: e.to_string() }),
            _ => Ok(()),
        };
        match verify(&dir).and_then(|_| finite(&dir)) {
            Ok(_) => return Ok(Intact { newest: Some((step, dir)), skipped, unverified: false }),
            Err(CheckpointError::Bad { msg, .. }) => skipped.push(Skipped { dir, reason: msg }),
            Err(e) => skipped.push(Skipped { dir, reason: e.to_string() }),
        }
    }
    Ok(Intact { newest: None, skipped, unverified: false })
}

/// What a checkpoint set aside by [`set_aside`] is renamed to: `<step>.nonfinite`.
pub const NON_FINITE_SUFFIX: &str = ".nonfinite";

/// Set checkpoint `step` of `root` aside (its weights gave a non-finite loss): renamed to
/// `<name>.nonfinite`, so that `--resume` and `last` pass over it while it stays for
/// inspection (an earlier one of that name, vramlab's own, is replaced). `None`: no such
/// checkpoint.
pub fn set_aside(root: &Path, step: u64) -> Result<Option<PathBuf>, CheckpointError> {
    let Some((_, dir)) = step_dirs(root)?.into_iter().find(|(s, _)| *s == step) else { return Ok(None) };
    let name = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let target = root.join(format!("{name}{NON_FINITE_SUFFIX}"));
    if target.exists() {
        fs::remove_dir_all(&target).map_err(io(&target))?;
    }
    fs::rename(&dir, &target).map_err(io(&target))?;
    Ok(Some(target))
}

/// Point `root/last` at `name` (relative link, swapped in with a rename). Where symbolic links
/// cannot be made, `last` is left out: [`newest_intact`] does not need it.
pub fn update_last_link(root: &Path, name: &str) -> Result<(), CheckpointError> {
    #[cfg(unix)]
    {
        let tmp = root.join(".last.tmp");
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(name, &tmp).map_err(io(&tmp))?;
        let last = root.join(LAST_LINK);
        fs::rename(&tmp, &last).map_err(io(&last))?;
    }
    #[cfg(not(unix))]
    let _ = (root, name);
    Ok(())
}

/// Remove `root/last` (no checkpoint is left to point at).
pub fn remove_last_link(root: &Path) -> Result<(), CheckpointError> {
    let last = root.join(LAST_LINK);
    if fs::symlink_metadata(&last).is_ok() {
        fs::remove_file(&last).map_err(io(&last))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(root: &Path, step: u64, model: &[u8]) -> PathBuf {
        let dir = root.join(step_dir_name(step, 10));
        fs::create_dir_all(dir.join(PRETRAINED_MODEL_DIR)).unwrap();
        fs::write(dir.join(MODEL_FILE), model).unwrap();
        write_manifest(&dir, step).unwrap();
        dir
    }

    #[test]
    fn a_truncated_or_altered_checkpoint_is_skipped_for_the_previous_one() {
        let tmp = vramlab_testkit::temp_dir("train-checkpoint");
        let root = tmp.path();
        let first = checkpoint(root, 2, b"weights at step 2");
        let second = checkpoint(root, 4, b"weights at step 4");
        assert_eq!(newest_intact(root).unwrap().newest.unwrap().1, second);

        // Truncated: caught by the size.
        fs::write(second.join(MODEL_FILE), b"weights").unwrap();
        let Intact { newest, skipped, .. } = newest_intact(root).unwrap();
        assert_eq!(newest.unwrap(), (2, first.clone()));
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].reason.contains("pretrained_model/model.safetensors has 7 bytes"), "{}", skipped[0].reason);

        // Same size, other bytes: caught by the hash.
        fs::write(second.join(MODEL_FILE), b"weights at step 5").unwrap();
        let skipped = newest_intact(root).unwrap().skipped;
        assert!(skipped[0].reason.contains("SHA-256"), "{}", skipped[0].reason);

        // No manifest (killed before it was written, or an older layout).
        fs::remove_file(first.join(MANIFEST_FILE)).unwrap();
        let Intact { newest, skipped, .. } = newest_intact(root).unwrap();
        assert!(newest.is_none() && skipped.len() == 2);

        // lerobot's checkpoints carry no manifest: taken as they are, marked unverified.
        fs::create_dir_all(first.join(TRAINING_STATE_DIR)).unwrap();
        fs::write(first.join(TRAINING_STEP_FILE), "{\"step\": 2}").unwrap();
        let found = newest_intact(root).unwrap();
        assert_eq!(found.newest.unwrap().0, 2);
        assert!(found.unverified);
    }

    #[test]
    fn a_manifest_must_cover_every_file_it_vouches_for() {
        let tmp = vramlab_testkit::temp_dir("train-checkpoint");
        let dir = checkpoint(tmp.path(), 2, b"weights");
        verify(&dir).unwrap();
        // A file added after the manifest was written.
        fs::write(dir.join(PRETRAINED_MODEL_DIR).join("extra.safetensors"), b"x").unwrap();
        let e = verify(&dir).unwrap_err().to_string();
        assert!(e.contains("pretrained_model/extra.safetensors is not in manifest.json"), "{e}");
        // Outside the scope of a policy load, the extra file is still caught by a full verify.
        fs::remove_file(dir.join(PRETRAINED_MODEL_DIR).join("extra.safetensors")).unwrap();
        fs::create_dir_all(dir.join(TRAINING_STATE_DIR)).unwrap();
        fs::write(dir.join(TRAINING_STEP_FILE), "{}").unwrap();
        assert!(verify_under(&dir, "pretrained_model/").is_ok());
        assert!(verify(&dir).unwrap_err().to_string().contains("training_state/training_step.json is not in"));
        fs::remove_file(dir.join(TRAINING_STEP_FILE)).unwrap();
        // A manifest listing no files verifies nothing.
        fs::write(dir.join(MANIFEST_FILE), r#"{"step": 2, "files": {}}"#).unwrap();
        let e = verify(&dir).unwrap_err().to_string();
        assert!(e.contains("lists no files"), "{e}");
        assert!(newest_intact(tmp.path()).unwrap().newest.is_none());
    }

    #[test]
    fn a_policy_load_verifies_its_checkpoint() {
        let tmp = vramlab_testkit::temp_dir("train-checkpoint");
        let dir = checkpoint(tmp.path(), 2, b"weights");
        let pretrained = dir.join(PRETRAINED_MODEL_DIR);
        assert_eq!(verify_for_load(&pretrained).unwrap(), LoadCheck::Verified);
        assert_eq!(verify_for_load(&dir).unwrap(), LoadCheck::Verified);
        fs::write(dir.join(MODEL_FILE), b"weighTs").unwrap();
        let e = verify_for_load(&pretrained).unwrap_err().to_string();
        assert!(e.contains("model.safetensors: SHA-256 differs"), "{e}");
        // A vramlab checkpoint with its manifest removed is refused; lerobot's and a bare
        // directory load unverified.
        fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
        fs::create_dir_all(dir.join(TRAINING_STATE_DIR)).unwrap();
        fs::write(dir.join(TRAINER_STATE_FILE), "{}").unwrap();
        assert!(verify_for_load(&pretrained).unwrap_err().to_string().contains("no manifest.json"));
        fs::remove_file(dir.join(TRAINER_STATE_FILE)).unwrap();
        fs::write(dir.join(TRAINING_STEP_FILE), "{\"step\": 2}").unwrap();
        assert!(matches!(verify_for_load(&pretrained).unwrap(), LoadCheck::Unverified(why) if why.contains("lerobot")));
        assert!(matches!(verify_for_load(tmp.path()).unwrap(), LoadCheck::Unverified(_)));
    }

    #[test]
    fn a_checkpoint_with_non_finite_weights_is_skipped_naming_the_tensor() {
        use burn::tensor::TensorData;
        let tmp = vramlab_testkit::temp_dir("train-checkpoint");
        let root = tmp.path();
        for (step, bad) in [(1, 0.5f32), (2, f32::NAN)] {
            let dir = root.join(step_dir_name(step, 10));
            fs::create_dir_all(dir.join(PRETRAINED_MODEL_DIR)).unwrap();
            vramlab_store::write_safetensors(&[("w".into(), TensorData::new(vec![0.0, bad], [2]))], &dir.join(MODEL_FILE)).unwrap();
            write_manifest(&dir, step).unwrap();
        }
        let Intact { newest, skipped, .. } = newest_intact(root).unwrap();
        assert_eq!(newest.unwrap().0, 1);
        assert!(skipped[0].reason.contains("tensor `w` has 1 non-finite value(s)"), "{}", skipped[0].reason);
    }

    #[test]
    fn a_set_aside_checkpoint_is_no_step_directory() {
        let tmp = vramlab_testkit::temp_dir("train-checkpoint");
        checkpoint(tmp.path(), 1, b"a");
        checkpoint(tmp.path(), 2, b"b");
        assert_eq!(set_aside(tmp.path(), 3).unwrap(), None);
        let aside = set_aside(tmp.path(), 2).unwrap().unwrap();
        assert!(aside.ends_with("000002.nonfinite") && aside.join(MODEL_FILE).exists());
        assert_eq!(newest_intact(tmp.path()).unwrap().newest.unwrap().0, 1);
        // Again at the same step: the earlier one set aside is replaced.
        checkpoint(tmp.path(), 2, b"c");
        set_aside(tmp.path(), 2).unwrap();
        assert_eq!(fs::read(aside.join(MODEL_FILE)).unwrap(), b"c");
    }

    #[test]
    fn names_and_last_link() {
        assert_eq!(step_dir_name(5, 100), "000005");
        assert_eq!(step_dir_name(5, 12_345_678), "00000005");
        let tmp = vramlab_testkit::temp_dir("train-checkpoint");
        checkpoint(tmp.path(), 2, b"a");
        update_last_link(tmp.path(), "000002").unwrap();
        update_last_link(tmp.path(), "000002").unwrap();
        #[cfg(unix)]
        assert_eq!(fs::read_link(tmp.path().join(LAST_LINK)).unwrap(), PathBuf::from("000002"));
        // `last` is not a step directory.
        assert_eq!(step_dirs(tmp.path()).unwrap().len(), 1);
    }
}
