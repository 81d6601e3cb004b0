//! Helpers shared by the parity tests (each test binary uses a subset).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, TensorData};
use vramlab_models::weights::PathStack;

/// `../shared` beside the repository, or `None` with a skip message.
///
/// With `VRAMLAB_REQUIRE_SHARED=1` (as `.ci/run` sets) an absent `../shared` fails the test
/// instead: CI always has it, and a golden test that skips there has silently stopped testing.
pub fn shared_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    if dir.is_dir() {
        Some(dir)
    } else if std::env::var_os("VRAMLAB_REQUIRE_SHARED").is_some_and(|v| v == "1") {
        panic!("../shared not found (looked for {}) and VRAMLAB_REQUIRE_SHARED=1", dir.display());
    } else {
        eprintln!("skipping: ../shared not found (looked for {})", dir.display());
        None
    }
}

/// `(max |a − b| / max|b|, max |a − b|)`: the asserted metric is the first.
pub fn errors(name: &str, got: TensorData, want: &TensorData) -> (f32, f32) {
    let a = got.convert::<f32>().to_vec::<f32>().unwrap();
    let b = want.clone().convert::<f32>().to_vec::<f32>().unwrap();
    assert_eq!(a.len(), b.len(), "{name}: size");
    let max_b = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    let abs = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    (abs / max_b, abs)
}

/// Names of the float tensors of `model` that have / lack a gradient in `grads`; every
/// gradient present must be f32 and finite.
pub fn grad_presence<A: AutodiffBackend, M: Module<A>>(model: &M, grads: &A::Gradients) -> (Vec<String>, Vec<String>) {
    struct V<'a, A: AutodiffBackend> {
        grads: &'a A::Gradients,
        path: PathStack,
        with: Vec<String>,
        without: Vec<String>,
    }
    impl<A: AutodiffBackend> ModuleVisitor<A> for V<'_, A> {
        fn enter_module(&mut self, name: &str, container: &str) {
            self.path.enter(name, container);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<A, D>>) {
            let name = self.path.current();
            match p.val().grad(self.grads) {
                Some(g) => {
                    assert_eq!(g.dtype(), DType::F32, "{name}: gradient dtype");
                    let n = g.abs().sum().into_scalar().elem::<f32>();
                    assert!(n.is_finite(), "{name}: gradient not finite");
                    self.with.push(name)
                }
                None => self.without.push(name),
            }
        }
    }
    let mut v = V::<A> { grads, path: PathStack::default(), with: Vec::new(), without: Vec::new() };
    model.visit(&mut v);
    (v.with, v.without)
}
