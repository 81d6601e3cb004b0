//! `--dataset.repo_id`: a LeRobot dataset from the Hugging Face hub, without the network. The
//! dataset is the built-in writer's (two push episodes), laid out as the hub cache holds it, or
//! served over loopback HTTP as the hub API serves it.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use vramlab_lerobot::hub::HubEnv;
use vramlab_lerobot::normalize::NormMode;
use vramlab_workloads::config::{self, RunConfig};
use vramlab_workloads::policy_data::{PolicyDataSpec, Window, open_policy_data};
use vramlab_workloads::{DatasetType, sim};

const SHA: &str = "5e1f0c0ffee0ddba11decafbad0000000000beef";

/// A small LeRobot v3.0 dataset (2 episodes, 16×16 frames) at `dir/src`.
fn dataset(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    sim::generate(&src, 2, 16, &mut || {}).unwrap();
    src
}

/// Every file under `root`, as repo-relative names.
fn files(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, root, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

fn copy_tree(src: &Path, dst: &Path) {
    for f in files(src) {
        let to = dst.join(&f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(src.join(&f), to).unwrap();
    }
}

/// A Hugging Face environment rooted in `dir` (what `HF_*` variables would say).
fn env(dir: &Path, vars: &[(&str, String)]) -> HubEnv {
    let mut all = vec![("HOME", dir.join("home").display().to_string()), ("HF_HUB_CACHE", dir.join("hub").display().to_string())];
    all.extend(vars.iter().map(|(k, v)| (*k, v.clone())));
    HubEnv { progress: false, ..HubEnv::from_vars(|k| all.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())) }
}

fn offline(dir: &Path) -> HubEnv {
    env(dir, &[("HF_HUB_OFFLINE", "1".into())])
}

fn act_config(flags: &[(&str, &str)]) -> RunConfig {
    let mut all = vec![("policy.type".to_string(), "act".to_string())];
    all.extend(flags.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    config::load(None, &all).unwrap()
}

/// Opens the run's data as training does; returns its episode count.
fn open_episodes(cfg: &RunConfig) -> usize {
    let spec = PolicyDataSpec {
        window: Window { obs_steps: None, actions: 4 },
        delta: vramlab_models::policy::DeltaIndices { observation: None, action: Some((0..4).collect()), reward: None },
        norm_map: [("STATE", NormMode::MeanStd), ("ACTION", NormMode::MeanStd)].into(),
        drop_n_last_frames: 0,
    };
    open_policy_data(cfg, &spec).unwrap().expect("a LeRobot dataset").ds.num_episodes()
}

/// `HF_HUB_OFFLINE=1` with the repo in the hub cache: `refs/<revision>` leads to the snapshot,
/// which training opens; the default revision is lerobot's `v3.0` tag.
#[test]
fn cached_snapshot_is_used_offline() {
    let dir = vramlab_testkit::temp_dir("workloads-hub");
    let src = dataset(dir.path());
    let repo = dir.path().join("hub/datasets--lerobot--tiny");
    let snapshot = repo.join("snapshots").join(SHA);
    copy_tree(&src, &snapshot);
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    for r in ["main", "v3.0"] {
        std::fs::write(repo.join("refs").join(r), SHA).unwrap();
    }
    for flags in [&[("dataset.repo_id", "lerobot/tiny")][..], &[("dataset.repo_id", "lerobot/tiny"), ("dataset.revision", "main")]] {
        let cfg = act_config(flags);
        assert_eq!(cfg.dataset_type().unwrap(), DatasetType::Lerobot);
        cfg.validate_with(&offline(dir.path())).unwrap();
        assert_eq!(cfg.lerobot_root().unwrap(), snapshot);
        assert_eq!(open_episodes(&cfg), 2);
    }
    // A revision that is not cached is not silently replaced by another one.
    let cfg = act_config(&[("dataset.repo_id", "lerobot/tiny"), ("dataset.revision", "dev")]);
    let err = cfg.validate_with(&offline(dir.path())).unwrap_err().to_string();
    assert!(err.contains("revision dev") && err.contains("HF_HUB_OFFLINE"), "{err}");
}

/// `--dataset.root` holding the dataset is used as is (lerobot's `root`), with no cache.
#[test]
fn root_holding_the_dataset_is_used_as_is() {
    let dir = vramlab_testkit::temp_dir("workloads-hub");
    let src = dataset(dir.path());
    let cfg = act_config(&[("dataset.repo_id", "lerobot/tiny"), ("dataset.root", src.to_str().unwrap())]);
    cfg.validate_with(&offline(dir.path())).unwrap();
    assert_eq!(cfg.lerobot_root().unwrap(), src);
    assert_eq!(open_episodes(&cfg), 2);
}

/// Offline with nothing cached: the error names the field, the repo, the cache searched and
/// what to do.
#[test]
fn uncached_repo_offline_says_what_to_do() {
    let dir = vramlab_testkit::temp_dir("workloads-hub");
    let cfg = act_config(&[("dataset.repo_id", "lerobot/absent")]);
    let err = cfg.validate_with(&offline(dir.path())).unwrap_err().to_string();
    for want in ["dataset.repo_id", "lerobot/absent", "v3.0", "HF_HUB_OFFLINE", "datasets--lerobot--absent", "--dataset.root"] {
        assert!(err.contains(want), "{want}: {err}");
    }
}

#[test]
fn repo_id_fits_lerobot_data_only() {
    let check = |flags: &[(&str, &str)], want: &[&str]| {
        let dir = vramlab_testkit::temp_dir("workloads-hub");
        let err = config::load(None, &flags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>())
            .and_then(|c| c.validate_with(&offline(dir.path())))
            .unwrap_err()
            .to_string();
        assert!(want.iter().all(|w| err.contains(w)), "{flags:?}: {err}");
    };
    check(&[("policy.type", "act"), ("dataset.repo_id", "lerobot/tiny"), ("dataset.type", "npz")], &["dataset.repo_id", "dataset.type=npz"]);
    check(&[("policy.type", "act"), ("dataset.repo_id", "lerobot/tiny"), ("dataset.type", "sim")], &["dataset.repo_id", "dataset.type=sim"]);
    check(&[("policy.type", "vae3d"), ("dataset.repo_id", "lerobot/tiny")], &["dataset.repo_id", "vae3d"]);
    check(&[("policy.type", "act"), ("dataset.revision", "v3.0")], &["dataset.revision", "dataset.repo_id"]);
    check(&[("policy.type", "act"), ("dataset.repo_id", "../etc")], &["dataset.repo_id", "`../etc`"]);
}

/// The requests a loopback server saw: (path, `Authorization` header).
type RequestLog = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A loopback stand-in for the hub: `GET /api/datasets/<repo>/refs`,
/// `/api/datasets/<repo>/revision/<rev>` and `/datasets/<repo>/resolve/<sha>/<file>` for the
/// repo `lerobot/tiny` holding `src`; every other path is a 404.
fn serve(src: PathBuf) -> (String, RequestLog) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = log.clone();
    let names = files(&src);
    let siblings: Vec<serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, n)| serde_json::json!({"rfilename": n, "size": std::fs::metadata(src.join(n)).unwrap().len(), "blobId": format!("{:040x}", i + 1)}))
        .collect();
    let info = serde_json::json!({"id": "lerobot/tiny", "sha": SHA, "siblings": siblings}).to_string();
    let refs = serde_json::json!({"branches": [{"name": "main"}], "tags": [{"name": "v2.1"}, {"name": "v3.0"}]}).to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            reader.read_line(&mut request).unwrap();
            let mut auth = None;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                if let Some((k, v)) = line.split_once(':')
                    && k.eq_ignore_ascii_case("authorization")
                {
                    auth = Some(v.trim().to_string());
                }
            }
            let path = request.split_whitespace().nth(1).unwrap_or("").to_string();
            seen.lock().unwrap().push((path.clone(), auth));
            let file = path.strip_prefix(&format!("/datasets/lerobot/tiny/resolve/{SHA}/")).map(|f| src.join(f));
            let body: Option<Vec<u8>> = match path.as_str() {
                "/api/datasets/lerobot/tiny/refs" => Some(refs.clone().into_bytes()),
                "/api/datasets/lerobot/tiny/revision/v3.0?blobs=true" => Some(info.clone().into_bytes()),
                _ => file.and_then(|f| std::fs::read(f).ok()),
            };
            let (status, body) = match body {
                Some(b) => ("200 OK", b),
                None => ("404 Not Found", b"{\"error\":\"Repository not found\"}".to_vec()),
            };
            let head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(&body));
        }
    });
    (endpoint, log)
}

/// Online, nothing cached: the revision's files are downloaded into the hub cache as
/// `huggingface_hub` lays it out (blobs, snapshot symlinks, `refs/v3.0`), the token goes along,
/// training opens the snapshot, and a later offline run finds it.
#[test]
fn download_fills_the_hub_cache() {
    let dir = vramlab_testkit::temp_dir("workloads-hub");
    let src = dataset(dir.path());
    let (endpoint, log) = serve(src.clone());
    let online = env(dir.path(), &[("HF_ENDPOINT", endpoint.clone()), ("HF_TOKEN", "hf_secret".into())]);
    let cfg = act_config(&[("dataset.repo_id", "lerobot/tiny")]);
    cfg.validate_with(&online).unwrap();
    let repo = dir.path().join("hub/datasets--lerobot--tiny");
    let snapshot = repo.join("snapshots").join(SHA);
    assert_eq!(cfg.lerobot_root().unwrap(), snapshot);
    assert_eq!(std::fs::read_to_string(repo.join("refs/v3.0")).unwrap(), SHA);
    assert_eq!(files(&snapshot), files(&src));
    let info = snapshot.join("meta/info.json");
    assert!(std::fs::symlink_metadata(&info).unwrap().file_type().is_symlink() || cfg!(not(unix)));
    assert_eq!(std::fs::read(&info).unwrap(), std::fs::read(src.join("meta/info.json")).unwrap());
    assert_eq!(std::fs::read_dir(repo.join("blobs")).unwrap().count(), files(&src).len());
    assert_eq!(open_episodes(&cfg), 2);

    let requests = log.lock().unwrap().clone();
    assert_eq!(requests[0].0, "/api/datasets/lerobot/tiny/refs");
    assert!(requests[2].0.ends_with("/meta/info.json"), "info.json first: {requests:?}");
    assert!(requests.iter().all(|(_, auth)| auth.as_deref() == Some("Bearer hf_secret")), "{requests:?}");

    let again = act_config(&[("dataset.repo_id", "lerobot/tiny")]);
    again.validate_with(&offline(dir.path())).unwrap();
    assert_eq!(again.lerobot_root().unwrap(), snapshot);
    assert_eq!(log.lock().unwrap().len(), requests.len(), "no request once cached");
}

/// With `--dataset.root`, files go there (lerobot's `local_dir`), as plain files.
#[test]
fn download_into_root() {
    let dir = vramlab_testkit::temp_dir("workloads-hub");
    let src = dataset(dir.path());
    let (endpoint, _) = serve(src.clone());
    let root = dir.path().join("mine");
    let cfg = act_config(&[("dataset.repo_id", "lerobot/tiny"), ("dataset.root", root.to_str().unwrap())]);
    cfg.validate_with(&env(dir.path(), &[("HF_ENDPOINT", endpoint)])).unwrap();
    assert_eq!(cfg.lerobot_root().unwrap(), root);
    assert_eq!(files(&root), files(&src));
    assert!(!std::fs::symlink_metadata(root.join("meta/info.json")).unwrap().file_type().is_symlink());
    assert!(!dir.path().join("hub").exists(), "nothing in the hub cache");
    assert_eq!(open_episodes(&cfg), 2);
}

/// An unknown repo (404) and an unreachable endpoint: errors name the repo and the URL.
#[test]
fn network_failures_name_the_repo_and_url() {
    let dir = vramlab_testkit::temp_dir("workloads-hub");
    std::fs::create_dir_all(dir.path().join("nothing")).unwrap();
    let (endpoint, _) = serve(dir.path().join("nothing"));
    let cfg = act_config(&[("dataset.repo_id", "lerobot/nope")]);
    let err = cfg.validate_with(&env(dir.path(), &[("HF_ENDPOINT", endpoint.clone())])).unwrap_err().to_string();
    for want in ["dataset.repo_id", "lerobot/nope", &format!("{endpoint}/api/datasets/lerobot/nope/refs"), "404"] {
        assert!(err.contains(want), "{want}: {err}");
    }
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let err = cfg.validate_with(&env(dir.path(), &[("HF_ENDPOINT", closed.clone())])).unwrap_err().to_string();
    for want in ["lerobot/nope", "cannot reach", &closed, "HF_HUB_OFFLINE"] {
        assert!(err.contains(want), "{want}: {err}");
    }
}
