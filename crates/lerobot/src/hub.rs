//! LeRobot datasets from the Hugging Face hub: lerobot's `--dataset.repo_id` and
//! `--dataset.revision` (`LeRobotDataset(repo_id, root, revision)` in lerobot 0.4.4).
//!
//! [`resolve`] turns a repo id into a local directory holding the whole dataset, looking in
//! this order and stopping at the first complete copy (every data and video file the metadata
//! names is present):
//!
//! 1. lerobot's `root`: `--dataset.root`, else `$HF_LEROBOT_HOME/<repo_id>` (where lerobot
//!    itself downloads, so a dataset lerobot already fetched is reused as is);
//! 2. the hub cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`):
//!    `datasets--<org>--<name>/refs/<revision>` → `snapshots/<commit>/`, the layout
//!    `huggingface_hub` writes;
//! 3. unless `HF_HUB_OFFLINE` is set: a download (`meta/info.json` first, then every file of
//!    the revision, progress on stderr) into `--dataset.root` when given (lerobot's
//!    `local_dir`), else into the hub cache (blobs + snapshot symlinks + ref, as
//!    `huggingface_hub`'s `snapshot_download` without `local_dir`).
//!
//! The revision defaults to lerobot's `CODEBASE_VERSION` tag, `v3.0`; a version-like revision
//! is resolved against the repo's tags and branches as lerobot's `get_safe_version` does (the
//! exact version, else the newest one of the same major version that is not newer).
//!
//! Differences from lerobot 0.4.4, on purpose:
//! - Without `--dataset.root`, downloads go to the hub cache, not to `$HF_LEROBOT_HOME/<repo_id>`
//!   (the issue asked for the Hugging Face cache; one copy shared with other hub tools, and
//!   revisions side by side). `$HF_LEROBOT_HOME/<repo_id>` is still read.
//! - When a repo has no v3.x version, the newest v2.x one is used (this reader opens v2.0/v2.1
//!   datasets); lerobot raises `BackwardCompatibilityError` and asks for a conversion.
//! - Every file of the revision is downloaded; lerobot fetches only the selected episodes' files
//!   when `--dataset.episodes` is given.
//! - An incomplete local copy is an error when offline; lerobot's `snapshot_download` would fail
//!   later, file by file.
//!
//! Environment (read once by [`HubEnv::from_process`], so tests pass their own): `HF_HOME`,
//! `HF_HUB_CACHE` (or `HUGGINGFACE_HUB_CACHE`), `HF_LEROBOT_HOME`, `HF_HUB_OFFLINE` (or
//! `TRANSFORMERS_OFFLINE`; `1`/`true`/`yes`/`on`), `HF_ENDPOINT`, `HF_TOKEN` (else the token file
//! `$HF_TOKEN_PATH` or `$HF_HOME/token` that `huggingface-cli login` writes), proxies via
//! `HTTPS_PROXY` / `ALL_PROXY`.
//!
//! One file on purpose: the hub client is one job (resolve, cache, download); ~620 lines, its
//! unit tests at the bottom.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{read_file, DatasetError};
use crate::info::Info;
use crate::meta::load_meta;

/// lerobot's `CODEBASE_VERSION`: the default revision (a tag every converted v3.0 dataset has).
pub const CODEBASE_VERSION: &str = "v3.0";
/// `huggingface_hub`'s default endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Everything a hub lookup can report; each message names the repo and what to do.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("`{repo_id}` is not a hub repo id ({why}); expected `<org>/<name>`, e.g. lerobot/pusht")]
    InvalidRepoId { repo_id: String, why: String },
    #[error("{repo_id}: `{revision}` is not a usable revision ({why})")]
    InvalidRevision { repo_id: String, revision: String, why: String },
    /// Nothing usable locally and `HF_HUB_OFFLINE` forbids a download.
    #[error(
        "{repo_id} (revision {revision}) is not downloaded and HF_HUB_OFFLINE is set; searched {searched}{note}. \
         Run once without HF_HUB_OFFLINE to download it, or pass --dataset.root=DIR holding the dataset"
    )]
    Offline { repo_id: String, revision: String, searched: String, note: String },
    /// The endpoint could not be reached (DNS, connection, TLS, timeout).
    #[error(
        "{repo_id}: cannot reach {url}: {msg}. Check the network (or HF_ENDPOINT / HTTPS_PROXY), or use a local copy: \
         --dataset.root=DIR, or HF_HUB_OFFLINE=1 with the dataset in {cache}"
    )]
    Network { repo_id: String, url: String, msg: String, cache: String },
    /// The endpoint answered with an error status.
    #[error("{repo_id}: {url} answered HTTP {status}: {hint}")]
    Http { repo_id: String, url: String, status: u16, hint: String },
    /// No tag or branch of the repo is a version this reader can open.
    #[error(
        "{repo_id}: no version compatible with {revision} on the hub (versions: {available}); \
         pass --dataset.revision=<branch, tag or commit> to choose one"
    )]
    NoVersion { repo_id: String, revision: String, available: String },
    /// The endpoint answered something that is not what the hub API returns.
    #[error("{repo_id}: unexpected answer from {url}: {msg}")]
    BadResponse { repo_id: String, url: String, msg: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The download finished but the directory is not a complete LeRobot dataset.
    #[error("{repo_id}: downloaded to {} but it is not a usable LeRobot dataset: {msg}", root.display())]
    Incomplete { repo_id: String, root: PathBuf, msg: String },
    /// Built without the `hub` feature: cached copies only.
    #[error("{repo_id} (revision {revision}) is not downloaded and this build has no hub client (feature `hub` of vramlab-lerobot); searched {searched}")]
    NoClient { repo_id: String, revision: String, searched: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io { path: path.to_path_buf(), source }
}

/// The environment of a hub lookup (paths, endpoint, offline switch, token).
#[derive(Clone)]
pub struct HubEnv {
    /// The hub cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`).
    pub hub_cache: PathBuf,
    /// lerobot's dataset home (`$HF_LEROBOT_HOME`, else `$HF_HOME/lerobot`).
    pub lerobot_home: PathBuf,
    /// `HF_HUB_OFFLINE`: never touch the network.
    pub offline: bool,
    /// `HF_ENDPOINT` without a trailing `/`.
    pub endpoint: String,
    /// `HF_TOKEN`, else the token file of `huggingface-cli login`.
    pub token: Option<String>,
    /// Report downloads on stderr.
    pub progress: bool,
}

/// Everything but the token's value.
impl std::fmt::Debug for HubEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubEnv")
            .field("hub_cache", &self.hub_cache)
            .field("lerobot_home", &self.lerobot_home)
            .field("offline", &self.offline)
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("progress", &self.progress)
            .finish()
    }
}

impl HubEnv {
    /// The environment of this process.
    pub fn from_process() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// The environment given by `var` (empty values count as unset), as `huggingface_hub` and
    /// lerobot read it.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let var = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let home = var("HOME").or_else(|| var("USERPROFILE")).map(PathBuf::from).unwrap_or_default();
        let path = |v: String| match v.strip_prefix("~/") {
            Some(rest) => home.join(rest),
            None => PathBuf::from(v),
        };
        let hf_home = var("HF_HOME")
            .map(path)
            .unwrap_or_else(|| var("XDG_CACHE_HOME").map(path).unwrap_or_else(|| home.join(".cache")).join("huggingface"));
        let hub_cache = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")).map(path).unwrap_or_else(|| hf_home.join("hub"));
        let lerobot_home = var("HF_LEROBOT_HOME").map(path).unwrap_or_else(|| hf_home.join("lerobot"));
        let truthy = |v: Option<String>| v.is_some_and(|v| matches!(v.trim().to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE"));
        let offline = truthy(var("HF_HUB_OFFLINE").or_else(|| var("TRANSFORMERS_OFFLINE")));
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into()).trim_end_matches('/').to_string();
        let token_file = var("HF_TOKEN_PATH").map(path).unwrap_or_else(|| hf_home.join("token"));
        let token = var("HF_TOKEN")
            .or_else(|| std::fs::read_to_string(token_file).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        HubEnv { hub_cache, lerobot_home, offline, endpoint, token, progress: true }
    }

    /// The cache folder of a dataset repo: `datasets--<org>--<name>`.
    pub fn repo_cache(&self, repo_id: &str) -> PathBuf {
        self.hub_cache.join(format!("datasets--{}", repo_id.replace('/', "--")))
    }
}

/// What to resolve: lerobot's `repo_id`, `revision` and `root`.
#[derive(Clone, Copy, Debug)]
pub struct HubRequest<'a> {
    pub repo_id: &'a str,
    /// Branch, tag or commit (default [`CODEBASE_VERSION`]).
    pub revision: Option<&'a str>,
    /// Where the dataset is, or is downloaded to (default: the hub cache).
    pub root: Option<&'a Path>,
}

/// Where the dataset was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `--dataset.root` or `$HF_LEROBOT_HOME/<repo_id>`, complete already.
    Local,
    /// A hub-cache snapshot, complete already.
    Cached { commit: String },
    /// Downloaded now (into `--dataset.root` or the hub cache).
    Downloaded { commit: String },
}

/// A dataset on disk, ready to open.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub root: PathBuf,
    pub source: Source,
}

/// The local directory of `req` (see the module docs for the order of lookup).
pub fn resolve(req: &HubRequest<'_>, env: &HubEnv) -> Result<Resolved, HubError> {
    let repo_id = req.repo_id;
    check_repo_id(repo_id)?;
    let revision = req.revision.unwrap_or(CODEBASE_VERSION);
    check_revision(repo_id, revision)?;

    let local = req.root.map(Path::to_path_buf).unwrap_or_else(|| env.lerobot_home.join(repo_id));
    let local_state = completeness(&local);
    if local_state.is_ok() {
        return Ok(Resolved { root: local, source: Source::Local });
    }
    let repo_cache = env.repo_cache(repo_id);
    let cached = cached_snapshot(&repo_cache, revision);
    let cached_state = cached.as_ref().map(|(_, dir)| completeness(dir));
    if let (Some((commit, dir)), Some(Ok(()))) = (&cached, &cached_state) {
        return Ok(Resolved { root: dir.clone(), source: Source::Cached { commit: commit.clone() } });
    }

    let searched = format!("{} and {}", local.display(), repo_cache.display());
    if env.offline {
        let mut note = String::new();
        for (dir, state) in [(Some(&local), Some(&local_state)), (cached.as_ref().map(|c| &c.1), cached_state.as_ref())] {
            if let (Some(dir), Some(Err(why))) = (dir, state)
                && dir.join("meta/info.json").exists()
            {
                note += &format!(" ({} is incomplete: {why})", dir.display());
            }
        }
        return Err(HubError::Offline { repo_id: repo_id.into(), revision: revision.into(), searched, note });
    }
    download(req, revision, env, &repo_cache, searched)
}

/// Why `root` is not a complete LeRobot dataset, if it is not: its metadata must read and
/// every data and video file it names must exist.
pub fn completeness(root: &Path) -> Result<(), String> {
    let info_path = root.join("meta/info.json");
    if !info_path.is_file() {
        return Err(format!("{} is missing", info_path.display()));
    }
    let missing = (|| -> Result<Vec<PathBuf>, DatasetError> {
        let info = Info::parse(&read_file(&info_path)?, &info_path)?;
        let meta = load_meta(root, &info)?;
        let files: BTreeSet<&PathBuf> = meta.episodes.iter().flat_map(|e| std::iter::once(&e.data_file).chain(e.videos.values().map(|v| &v.file))).collect();
        Ok(files.into_iter().filter(|f| !root.join(f).is_file()).cloned().collect())
    })()
    .map_err(|e| e.to_string())?;
    match missing.as_slice() {
        [] => Ok(()),
        [first, ..] => Err(format!("{} of its files are missing, e.g. {}", missing.len(), first.display())),
    }
}

/// A hub repo id: `<org>/<name>` (or a bare legacy `<name>`), with the hub's characters, so it
/// is also a safe relative path.
fn check_repo_id(repo_id: &str) -> Result<(), HubError> {
    let bad = |why: &str| Err(HubError::InvalidRepoId { repo_id: repo_id.into(), why: why.into() });
    let parts: Vec<&str> = repo_id.split('/').collect();
    if parts.len() > 2 {
        return bad("more than one `/`");
    }
    for p in parts {
        if p.is_empty() || p.len() > 96 {
            return bad("each part must be 1 to 96 characters");
        }
        if !p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return bad("only letters, digits, `-`, `_` and `.` are allowed");
        }
        if p.contains("--") || p.contains("..") || p.starts_with(['-', '.']) || p.ends_with(['-', '.']) {
            return bad("`--` and `..` are not allowed, nor `-` or `.` at either end");
        }
    }
    Ok(())
}

/// A branch, tag or commit; it becomes a path under `refs/`, so no `..` and no absolute paths.
fn check_revision(repo_id: &str, revision: &str) -> Result<(), HubError> {
    let bad = |why: &str| Err(HubError::InvalidRevision { repo_id: repo_id.into(), revision: revision.into(), why: why.into() });
    if revision.is_empty() || revision.len() > 255 {
        return bad("must be 1 to 255 characters");
    }
    if revision.split('/').any(|p| p.is_empty() || p == "." || p == "..") || revision.contains(['\\', '\0']) || revision.chars().any(char::is_control) {
        return bad("empty, `.` or `..` path parts and `\\` are not allowed");
    }
    Ok(())
}

/// A version number as lerobot's revisions write them (`v3.0`, `2.1`): (major, minor, patch).
fn parse_version(s: &str) -> Option<(u64, u64, u64)> {
    let t = s.strip_prefix('v').unwrap_or(s);
    let parts: Vec<u64> = t.split('.').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    match parts.as_slice() {
        [a] => Some((*a, 0, 0)),
        [a, b] => Some((*a, *b, 0)),
        [a, b, c] => Some((*a, *b, *c)),
        _ => None,
    }
}

/// lerobot's `get_safe_version` over the refs `available`: the exact version, else the newest
/// of the same major version that is not newer; then (unlike lerobot, see the module docs) the
/// newest v2.x. `None` when no ref fits.
fn pick_version(target: &str, available: &[String]) -> Option<String> {
    let t = parse_version(target)?;
    let versions: Vec<((u64, u64, u64), &String)> = available.iter().filter_map(|a| parse_version(a).map(|v| (v, a))).collect();
    if let Some((_, name)) = versions.iter().find(|(v, _)| *v == t) {
        return Some((*name).clone());
    }
    let newest = |keep: &dyn Fn(&(u64, u64, u64)) -> bool| versions.iter().filter(|(v, _)| keep(v)).max_by_key(|(v, _)| *v).map(|(_, n)| (*n).clone());
    newest(&|v| v.0 == t.0 && *v <= t).or_else(|| newest(&|v| v.0 == 2 && v.0 < t.0))
}

fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The snapshot of `revision` in a repo's cache folder: `(commit, snapshots/<commit>)`, through
/// `refs/<revision>`, a commit hash itself, or (a version) the best cached version ref.
fn cached_snapshot(repo_cache: &Path, revision: &str) -> Option<(String, PathBuf)> {
    let snapshot = |commit: &str| {
        let commit = commit.trim();
        let dir = repo_cache.join("snapshots").join(commit);
        (is_commit(commit) && dir.is_dir()).then(|| (commit.to_string(), dir))
    };
    if is_commit(revision) {
        return snapshot(revision);
    }
    let read_ref = |name: &str| std::fs::read_to_string(repo_cache.join("refs").join(name)).ok();
    if let Some(found) = read_ref(revision).and_then(|c| snapshot(&c)) {
        return Some(found);
    }
    parse_version(revision)?;
    let refs: Vec<String> = std::fs::read_dir(repo_cache.join("refs")).ok()?.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    read_ref(&pick_version(revision, &refs)?).and_then(|c| snapshot(&c))
}

/// One file of a revision, as the hub's repo API lists it with `blobs=true`.
#[derive(Debug, Deserialize)]
struct Sibling {
    rfilename: String,
    #[serde(default)]
    size: Option<u64>,
    /// Git blob id (the cache's blob name for files outside LFS).
    #[serde(default, rename = "blobId")]
    blob_id: Option<String>,
    #[serde(default)]
    lfs: Option<Lfs>,
}

#[derive(Debug, Deserialize)]
struct Lfs {
    sha256: String,
}

impl Sibling {
    /// The cache's blob name: the LFS sha256, else the git blob id (what `huggingface_hub`
    /// names blobs by, from the `X-Linked-Etag` / `ETag` headers).
    fn blob_name(&self) -> Option<&str> {
        let name = self.lfs.as_ref().map(|l| l.sha256.as_str()).or(self.blob_id.as_deref())?;
        (!name.is_empty() && name.len() <= 128 && name.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(name)
    }
}

#[derive(Debug, Deserialize)]
struct RepoInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Debug, Deserialize)]
struct Refs {
    #[serde(default)]
    branches: Vec<RefName>,
    #[serde(default)]
    tags: Vec<RefName>,
}

#[derive(Debug, Deserialize)]
struct RefName {
    name: String,
}

/// Percent-encode a URL path segment (`keep_slash`: a path of segments).
fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out += &format!("%{b:02X}");
        }
    }
    out
}

/// A repo-relative file name from the hub, as a safe relative path (no `..`, not absolute).
fn safe_relative(name: &str) -> Option<PathBuf> {
    let ok = !name.is_empty() && !name.starts_with('/') && !name.contains('\\') && name.split('/').all(|p| !p.is_empty() && p != "." && p != "..");
    ok.then(|| PathBuf::from(name))
}

/// `meta/info.json` first (a dataset this reader cannot open fails before the big files), then
/// the rest of `meta/`, then everything else by name.
fn download_order(name: &str) -> (u8, &str) {
    let rank = match name {
        "meta/info.json" => 0,
        n if n.starts_with("meta/") => 1,
        _ => 2,
    };
    (rank, name)
}

fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Download the revision into `--dataset.root` or the hub cache, skipping files already there.
fn download(req: &HubRequest<'_>, revision: &str, env: &HubEnv, repo_cache: &Path, searched: String) -> Result<Resolved, HubError> {
    let repo_id = req.repo_id;
    let client = Client::new(repo_id, env, searched, revision)?;
    let api = format!("{}/api/datasets/{repo_id}", env.endpoint);
    let revision = if parse_version(revision).is_some() && !is_commit(revision) {
        let url = format!("{api}/refs");
        let refs: Refs = client.json(&url)?;
        let names: Vec<String> = refs.branches.into_iter().chain(refs.tags).map(|r| r.name).collect();
        pick_version(revision, &names).ok_or_else(|| HubError::NoVersion {
            repo_id: repo_id.into(),
            revision: revision.into(),
            available: if names.is_empty() { "none".into() } else { names.join(", ") },
        })?
    } else {
        revision.to_string()
    };
    let url = format!("{api}/revision/{}?blobs=true", encode(&revision, false));
    let info: RepoInfo = client.json(&url)?;
    if !is_commit(&info.sha) {
        return Err(HubError::BadResponse { repo_id: repo_id.into(), url, msg: format!("`sha` {:?} is not a commit hash", info.sha) });
    }
    let mut files = Vec::with_capacity(info.siblings.len());
    for s in &info.siblings {
        let rel = safe_relative(&s.rfilename)
            .ok_or_else(|| HubError::BadResponse { repo_id: repo_id.into(), url: url.clone(), msg: format!("unsafe file name {:?}", s.rfilename) })?;
        files.push((s, rel));
    }
    if !files.iter().any(|(s, _)| s.rfilename == "meta/info.json") {
        return Err(HubError::BadResponse { repo_id: repo_id.into(), url, msg: "the revision has no meta/info.json: not a LeRobot dataset".into() });
    }
    files.sort_by(|a, b| download_order(&a.0.rfilename).cmp(&download_order(&b.0.rfilename)));

    let commit = info.sha;
    let target = match req.root {
        Some(root) => root.to_path_buf(),
        None => repo_cache.join("snapshots").join(&commit),
    };
    let total: u64 = files.iter().filter_map(|(s, _)| s.size).sum();
    if env.progress {
        eprintln!("{repo_id}@{revision} ({}): {} files, {} → {}", &commit[..8], files.len(), megabytes(total), target.display());
    }
    let start = std::time::Instant::now();
    let n = files.len();
    for (i, (s, rel)) in files.iter().enumerate() {
        let dest = target.join(rel);
        let present = std::fs::metadata(&dest).is_ok_and(|m| m.is_file() && s.size.is_none_or(|size| m.len() == size));
        if !present {
            // One line per file, or about every 5% of a dataset of many files.
            if env.progress && (n <= 50 || (i + 1).is_multiple_of(n / 20) || i + 1 == n) {
                eprintln!("  [{}/{n}] {}{}", i + 1, s.rfilename, s.size.map(|b| format!(" ({})", megabytes(b))).unwrap_or_default());
            }
            let file_url = format!("{}/datasets/{repo_id}/resolve/{commit}/{}", env.endpoint, encode(&s.rfilename, true));
            match (req.root, s.blob_name()) {
                (None, Some(blob)) => {
                    let blob_path = repo_cache.join("blobs").join(blob);
                    if !std::fs::metadata(&blob_path).is_ok_and(|m| s.size.is_none_or(|size| m.len() == size)) {
                        client.fetch(&file_url, &blob_path, s.size)?;
                    }
                    link_blob(&blob_path, &dest, rel)?;
                }
                _ => client.fetch(&file_url, &dest, s.size)?,
            }
        }
        if rel == Path::new("meta/info.json") {
            Info::parse(&read_file(&dest).map_err(|e| incomplete(repo_id, &target, e))?, &dest).map_err(|e| incomplete(repo_id, &target, e))?;
        }
    }
    if req.root.is_none() && revision != commit {
        let ref_path = repo_cache.join("refs").join(&revision);
        if let Some(dir) = ref_path.parent() {
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        std::fs::write(&ref_path, &commit).map_err(io_err(&ref_path))?;
    }
    if env.progress {
        eprintln!("{repo_id}: downloaded in {:.1} s", start.elapsed().as_secs_f64());
    }
    completeness(&target).map_err(|msg| HubError::Incomplete { repo_id: repo_id.into(), root: target.clone(), msg })?;
    Ok(Resolved { root: target, source: Source::Downloaded { commit } })
}

fn incomplete(repo_id: &str, root: &Path, e: DatasetError) -> HubError {
    HubError::Incomplete { repo_id: repo_id.into(), root: root.to_path_buf(), msg: e.to_string() }
}

/// Point `snapshots/<commit>/<rel>` at `blobs/<blob>` with a relative symlink, as
/// `huggingface_hub` does (a copy where symlinks are unavailable).
fn link_blob(blob: &Path, dest: &Path, rel: &Path) -> Result<(), HubError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    if std::fs::symlink_metadata(dest).is_ok() {
        std::fs::remove_file(dest).map_err(io_err(dest))?;
    }
    #[cfg(unix)]
    {
        // From snapshots/<commit>/<rel's folders>/ up to the repo folder, then into blobs/.
        let mut target = PathBuf::new();
        for _ in 0..rel.components().count() + 1 {
            target.push("..");
        }
        target.push("blobs");
        target.push(blob.file_name().unwrap_or_default());
        std::os::unix::fs::symlink(&target, dest).map_err(io_err(dest))
    }
    #[cfg(not(unix))]
    {
        let _ = rel;
        std::fs::copy(blob, dest).map(|_| ()).map_err(io_err(dest))
    }
}

/// The HTTP side: the hub's JSON API and file downloads (feature `hub`).
struct Client<'a> {
    repo_id: &'a str,
    env: &'a HubEnv,
    #[cfg(feature = "hub")]
    agent: ureq::Agent,
}

impl<'a> Client<'a> {
    #[cfg(feature = "hub")]
    fn new(repo_id: &'a str, env: &'a HubEnv, _searched: String, _revision: &str) -> Result<Self, HubError> {
        use std::time::Duration;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .user_agent(concat!("vramlab/", env!("CARGO_PKG_VERSION")))
            // The token goes to the endpoint only, not to the CDN it redirects files to.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .build()
            .into();
        Ok(Client { repo_id, env, agent })
    }

    #[cfg(not(feature = "hub"))]
    fn new(repo_id: &'a str, _env: &'a HubEnv, searched: String, revision: &str) -> Result<Self, HubError> {
        Err(HubError::NoClient { repo_id: repo_id.into(), revision: revision.into(), searched })
    }

    fn network(&self, url: &str, msg: impl ToString) -> HubError {
        HubError::Network { repo_id: self.repo_id.into(), url: url.into(), msg: msg.to_string(), cache: self.env.hub_cache.display().to_string() }
    }

    #[cfg(feature = "hub")]
    fn status(&self, url: &str, status: u16) -> HubError {
        let hint = match status {
            401 | 403 => "the dataset is private or gated: accept its terms on the hub and set HF_TOKEN (or run `huggingface-cli login`)".to_string(),
            404 => format!("no dataset `{}` or no such revision on {} (check --dataset.repo_id and --dataset.revision)", self.repo_id, self.env.endpoint),
            429 => "rate limited: try again later (or set HF_TOKEN)".to_string(),
            s if s >= 500 => "the hub failed: try again later".to_string(),
            _ => "unexpected status".to_string(),
        };
        HubError::Http { repo_id: self.repo_id.into(), url: url.into(), status, hint }
    }

    /// GET `url`, a reader of its body (and its length when announced).
    #[cfg(feature = "hub")]
    fn get(&self, url: &str) -> Result<(Box<dyn Read>, Option<u64>), HubError> {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.env.token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        let resp = req.call().map_err(|e| self.network(url, e))?;
        if !resp.status().is_success() {
            return Err(self.status(url, resp.status().as_u16()));
        }
        let len = resp.headers().get("content-length").and_then(|v| v.to_str().ok()?.parse().ok());
        Ok((Box::new(resp.into_body().into_reader()), len))
    }

    #[cfg(not(feature = "hub"))]
    fn get(&self, url: &str) -> Result<(Box<dyn Read>, Option<u64>), HubError> {
        Err(self.network(url, "built without the `hub` feature"))
    }

    fn json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, HubError> {
        let (body, _) = self.get(url)?;
        let mut text = Vec::new();
        body.take(64 << 20).read_to_end(&mut text).map_err(|e| self.network(url, e))?;
        serde_json::from_slice(&text).map_err(|e| HubError::BadResponse { repo_id: self.repo_id.into(), url: url.into(), msg: e.to_string() })
    }

    /// Download `url` to `dest` through `dest.<pid>.incomplete` (renamed when whole).
    fn fetch(&self, url: &str, dest: &Path, size: Option<u64>) -> Result<(), HubError> {
        let dir = dest.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let mut tmp_name = dest.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(format!(".{}.incomplete", std::process::id()));
        let tmp = dir.join(tmp_name);
        let result = (|| {
            let (mut body, len) = self.get(url)?;
            let mut file = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
            let got = std::io::copy(&mut body, &mut file).map_err(|e| self.network(url, format!("download interrupted: {e}")))?;
            file.sync_all().map_err(io_err(&tmp))?;
            if let Some(want) = size.or(len)
                && got != want
            {
                return Err(self.network(url, format!("received {got} bytes, expected {want}")));
            }
            std::fs::rename(&tmp, dest).map_err(io_err(dest))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> HubEnv {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        HubEnv::from_vars(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn environment_is_read_as_huggingface_hub_does() {
        let e = env_of(&[("HOME", "/h")]);
        assert_eq!(e.hub_cache, Path::new("/h/.cache/huggingface/hub"));
        assert_eq!(e.lerobot_home, Path::new("/h/.cache/huggingface/lerobot"));
        assert_eq!((e.offline, e.endpoint.as_str(), e.token.as_deref()), (false, DEFAULT_ENDPOINT, None));
        let e = env_of(&[("HOME", "/h"), ("HF_HOME", "~/hf"), ("HF_HUB_OFFLINE", "yes"), ("HF_ENDPOINT", "http://m/"), ("HF_TOKEN", " t ")]);
        assert_eq!((e.hub_cache.as_path(), e.lerobot_home.as_path()), (Path::new("/h/hf/hub"), Path::new("/h/hf/lerobot")));
        assert_eq!((e.offline, e.endpoint.as_str(), e.token.as_deref()), (true, "http://m", Some("t")));
        let e = env_of(&[("HF_HUB_CACHE", "/c"), ("HF_LEROBOT_HOME", "/l"), ("HF_HUB_OFFLINE", "0")]);
        assert_eq!((e.hub_cache.as_path(), e.lerobot_home.as_path(), e.offline), (Path::new("/c"), Path::new("/l"), false));
        for on in ["1", "true", "TRUE", "on"] {
            assert!(env_of(&[("HF_HUB_OFFLINE", on)]).offline, "{on}");
        }
        assert_eq!(e.repo_cache("lerobot/pusht"), Path::new("/c/datasets--lerobot--pusht"));
    }

    #[test]
    fn repo_ids_and_revisions_are_checked() {
        for ok in ["lerobot/pusht", "a-b/c.d_e", "squad"] {
            check_repo_id(ok).unwrap();
        }
        for bad in ["", "a/b/c", "../x", "a/..", "a/b c", "a--b/c", "/a", "a/"] {
            let e = check_repo_id(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("`{bad}`")), "{bad}: {e}");
        }
        for ok in ["main", "v3.0", "refs/pr/1", &"a".repeat(40)] {
            check_revision("r", ok).unwrap();
        }
        for bad in ["", "../x", "a//b", "/a", "a\\b"] {
            assert!(check_revision("r", bad).is_err(), "{bad}");
        }
    }

    /// lerobot's `get_safe_version`, plus the v2.x fallback.
    #[test]
    fn versions_resolve_as_lerobot_does() {
        let refs = |r: &[&str]| r.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(pick_version("v3.0", &refs(&["main", "v2.1", "v3.0"])).as_deref(), Some("v3.0"));
        assert_eq!(pick_version("v3.1", &refs(&["main", "v3.0", "v4.0"])).as_deref(), Some("v3.0"));
        assert_eq!(pick_version("v3.0", &refs(&["main", "v2.0", "v2.1"])).as_deref(), Some("v2.1"));
        assert_eq!(pick_version("v3.0", &refs(&["main", "v4.0", "v1.6"])), None);
        assert_eq!(pick_version("main", &refs(&["main"])), None);
        assert_eq!(parse_version("v2.1"), Some((2, 1, 0)));
        assert_eq!(parse_version("main"), None);
    }

    #[test]
    fn hub_file_names_become_safe_paths() {
        assert_eq!(safe_relative("data/chunk-000/file-000.parquet"), Some(PathBuf::from("data/chunk-000/file-000.parquet")));
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a\\b"] {
            assert_eq!(safe_relative(bad), None, "{bad}");
        }
        assert_eq!(encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(encode("videos/a b/x.mp4", true), "videos/a%20b/x.mp4");
        let mut names = vec!["data/x.parquet", "README.md", "meta/stats.json", "meta/info.json"];
        names.sort_by_key(|n| download_order(n));
        assert_eq!(names, ["meta/info.json", "meta/stats.json", "README.md", "data/x.parquet"]);
    }

    /// Offline with nothing cached: the error names the repo, the revision, where it looked and
    /// what to do.
    #[test]
    fn offline_without_a_copy_says_what_to_do() {
        let dir = vramlab_testkit::temp_dir("hub");
        let env = HubEnv { offline: true, progress: false, ..env_of(&[("HF_HOME", dir.path().to_str().unwrap())]) };
        let err = resolve(&HubRequest { repo_id: "lerobot/absent", revision: None, root: None }, &env).unwrap_err().to_string();
        for want in ["lerobot/absent", "v3.0", "HF_HUB_OFFLINE", "datasets--lerobot--absent", "--dataset.root"] {
            assert!(err.contains(want), "{want}: {err}");
        }
    }

    /// A snapshot whose metadata names files that are absent is not used (it is incomplete).
    #[test]
    fn cached_refs_lead_to_snapshots() {
        let dir = vramlab_testkit::temp_dir("hub");
        let repo = dir.path().join("datasets--o--n");
        let sha = "0123456789abcdef0123456789abcdef01234567";
        std::fs::create_dir_all(repo.join("snapshots").join(sha)).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/v2.1"), sha).unwrap();
        assert_eq!(cached_snapshot(&repo, "v2.1").map(|c| c.0).as_deref(), Some(sha));
        assert_eq!(cached_snapshot(&repo, "v3.0").map(|c| c.0).as_deref(), Some(sha), "v2.1 is the best cached version");
        assert_eq!(cached_snapshot(&repo, sha).map(|c| c.1), Some(repo.join("snapshots").join(sha)));
        assert!(cached_snapshot(&repo, "main").is_none());
        assert!(completeness(&repo.join("snapshots").join(sha)).unwrap_err().contains("meta/info.json"));
    }
}
