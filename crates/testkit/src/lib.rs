//! vramlab-testkit: what the tests of every crate share, and nothing else (a dev-dependency
//! only, never published).
//!
//! - [`shared_dir`], [`shared`]: the golden fixtures and datasets in `../shared` beside the
//!   repository; a test skips without them, or fails under `VRAMLAB_REQUIRE_SHARED=1` (CI).
//! - [`temp_dir`]: a fresh directory, removed when the test drops it, even when it fails.
//! - [`diff`], [`assert_close`]: how far a tensor is from its reference (max absolute and
//!   scale-relative difference), as the parity tests measure it; [`elementwise_rel`], the
//!   element-wise relative error with a floor, for reports.

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// Environment variable that turns a missing `../shared` into a failure (`.ci/run` sets it
/// to `1`): CI always has `../shared`, and a golden test that skips there has silently
/// stopped testing.
pub const REQUIRE_SHARED_ENV: &str = "VRAMLAB_REQUIRE_SHARED";

/// `../shared` beside the repository, or `None` with a skip message (a panic under
/// `VRAMLAB_REQUIRE_SHARED=1`).
pub fn shared_dir() -> Option<PathBuf> {
    shared("")
}

/// `../shared/<rel>` when it exists (a fixture directory, a dataset's `meta/info.json`), or
/// `None` with a skip message (a panic under `VRAMLAB_REQUIRE_SHARED=1`).
pub fn shared(rel: &str) -> Option<PathBuf> {
    // This crate is `crates/testkit`: the repository is two levels up, `shared` beside it.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    let path = if rel.is_empty() { dir } else { dir.join(rel) };
    if path.exists() {
        Some(path)
    } else if std::env::var_os(REQUIRE_SHARED_ENV).is_some_and(|v| v == "1") {
        panic!("../shared/{rel} not found (looked for {}) and {REQUIRE_SHARED_ENV}=1", path.display());
    } else {
        eprintln!("skipping: ../shared/{rel} not found (looked for {})", path.display());
        None
    }
}

/// A temporary directory that is removed (with everything in it) when dropped, so a failing
/// test leaves nothing behind either. Reads as the [`Path`] it is.
#[derive(Debug)]
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

/// A fresh, empty directory named `vramlab-<tag>-<random>` in the system's temporary
/// directory; unique per call, so parallel tests never share one.
pub fn temp_dir(tag: &str) -> TempDir {
    match tempfile::Builder::new().prefix(&format!("vramlab-{tag}-")).tempdir() {
        Ok(d) => TempDir(d),
        Err(e) => panic!("cannot create a temporary directory for {tag}: {e}"),
    }
}

/// How far a tensor is from its reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Diff {
    /// max |got − want|.
    pub abs: f32,
    /// max |got − want| / max |want|: relative to the tensor's scale (the metric the parity
    /// tests assert, robust to near-zero elements).
    pub rel: f32,
    /// max |want| (at least `f32::MIN_POSITIVE`).
    pub scale: f32,
}

/// `n` values uniform in `[lo, lo + span)` from a seeded generator (a 64-bit LCG, top 24 bits):
/// test inputs made on the host, the same on every backend and run.
pub fn uniform_values(n: usize, seed: u64, lo: f32, span: f32) -> Vec<f32> {
    let mut state = seed ^ 0x2545_F491_4F6C_DD1D;
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lo + span * ((state >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// [`Diff`] of `got` against `want`, element by element; panics, naming `name`, when their
/// lengths differ.
pub fn diff(name: &str, got: &[f32], want: &[f32]) -> Diff {
    assert_eq!(got.len(), want.len(), "{name}: size");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    let abs = got.iter().zip(want).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    Diff { abs, rel: abs / scale, scale }
}

/// max |got − want| / max(|want|, `floor` · max |want|): the element-wise relative error, with
/// a floor relative to the tensor's scale so that near-zero elements do not dominate (reported
/// beside [`Diff::rel`] where a network amplifies rounding); panics, naming `name`, when their
/// lengths differ.
pub fn elementwise_rel(name: &str, got: &[f32], want: &[f32], floor: f32) -> f32 {
    let d = diff(name, got, want);
    let floor = floor * d.scale;
    got.iter().zip(want).map(|(x, y)| (x - y).abs() / y.abs().max(floor)).fold(0f32, f32::max)
}

/// Panics, naming `name` and both differences, unless `got` is within `rel_tol` of `want`'s
/// scale ([`Diff::rel`]).
pub fn assert_close(name: &str, got: &[f32], want: &[f32], rel_tol: f32) -> Diff {
    let d = diff(name, got, want);
    assert!(d.rel <= rel_tol, "{name}: relative error {} > {rel_tol} (max abs {}, scale {})", d.rel, d.abs, d.scale);
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_is_relative_to_the_reference_scale() {
        let d = diff("t", &[1.0, 2.5, -4.0], &[1.0, 2.0, -4.0]);
        assert_eq!(d.abs, 0.5);
        assert_eq!(d.scale, 4.0);
        assert_eq!(d.rel, 0.125);
        assert_eq!(diff("zeros", &[0.0; 3], &[0.0; 3]).rel, 0.0);
        assert_close("t", &[1.0, 2.0001], &[1.0, 2.0], 1e-4);
    }

    #[test]
    fn elementwise_error_has_a_floor_relative_to_the_scale() {
        // |Δ| 0.5 on 2.0 → 0.25; |Δ| 0.01 on 0.001 is measured against the floor 0.1 · 4 → 0.025.
        assert_eq!(elementwise_rel("t", &[2.5, 0.011, -4.0], &[2.0, 0.001, -4.0], 0.1), 0.25);
        assert!((elementwise_rel("t", &[2.0, 0.011, -4.0], &[2.0, 0.001, -4.0], 0.1) - 0.025).abs() < 1e-7);
        assert_eq!(elementwise_rel("zeros", &[0.0; 2], &[0.0; 2], 1e-3), 0.0);
    }

    #[test]
    #[should_panic(expected = "t: relative error")]
    fn assert_close_names_the_tensor() {
        assert_close("t", &[1.0, 3.0], &[1.0, 2.0], 1e-4);
    }

    #[test]
    #[should_panic(expected = "t: size")]
    fn different_lengths_are_an_error() {
        diff("t", &[1.0], &[1.0, 2.0]);
    }

    #[test]
    fn temp_dirs_are_fresh_and_removed_on_drop() {
        let a = temp_dir("testkit");
        let b = temp_dir("testkit");
        assert_ne!(a.path(), b.path());
        std::fs::write(a.join("f"), b"x").unwrap();
        let kept = a.to_path_buf();
        assert!(kept.join("f").exists());
        drop(a);
        assert!(!kept.exists());
    }

    #[test]
    fn shared_points_beside_the_repository() {
        // Whether or not ../shared exists here, a missing entry is `None` (or the panic that
        // VRAMLAB_REQUIRE_SHARED=1 asks for).
        if std::env::var_os(REQUIRE_SHARED_ENV).is_none_or(|v| v != "1") {
            assert_eq!(shared("no-such-fixture-in-shared"), None);
        }
        if let Some(d) = shared_dir() {
            assert!(d.is_dir() && d.ends_with("shared"));
        }
    }
}
