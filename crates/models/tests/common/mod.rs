//! Helpers shared by the parity tests (each test binary uses a subset).
#![allow(dead_code)]

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, TensorData};
use vramlab_models::weights::PathStack;

/// `../shared` beside the repository (`None` with a skip message; a failure under
/// `VRAMLAB_REQUIRE_SHARED=1`).
pub use vramlab_testkit::shared_dir;

/// `(max |a − b| / max|b|, max |a − b|)`: the asserted metric is the first.
pub fn errors(name: &str, got: TensorData, want: &TensorData) -> (f32, f32) {
    let a = got.convert::<f32>().to_vec::<f32>().unwrap();
    let b = want.clone().convert::<f32>().to_vec::<f32>().unwrap();
    let d = vramlab_testkit::diff(name, &a, &b);
    (d.rel, d.abs)
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
