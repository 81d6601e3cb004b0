//! vramlab-stages: a forward pass as a typed chain of stages.
//!
//! Models (`vramlab-models`) describe their forward pass with [`Staged`]: a plan (a list of
//! stage names), a typed state that flows from stage to stage, and `forward` as the fold over
//! the plan ([`Staged::run`]). The trainer (`vramlab-train`) drives the same stages for block
//! gradient checkpointing. Neither crate knows the other; this crate is all they share.
//!
//! The trainer never looks inside a state: it only needs to visit or map every tensor of it,
//! in a fixed order, whatever their ranks ([`TensorBundle`], like Burn's `ModuleVisitor` /
//! `ModuleMapper` for parameters). A model's state is a struct or enum of named tensors;
//! [`tensor_bundle!`] implements the trait for it from the list of its fields.
//!
//! ```ignore
//! pub enum UnetState<B: Backend> {
//!     Down { x: Tensor<B, 3>, skips: Vec<Tensor<B, 3>> },
//!     Done { prediction: Tensor<B, 3> },
//! }
//! vramlab_stages::tensor_bundle!(enum UnetState { Down { x, skips }, Done { prediction } });
//! ```
//!
//! [`StateGrads`] holds what block checkpointing keeps between stages: the gradient of every
//! tensor of a state, rank-erased (float primitives), in visit order.
//!
//! [`CheckpointMode`] names how a training pass saves what its backward needs: the trainer runs
//! it, the estimator (`vramlab-models`' graph) replays it.

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, TensorPrimitive};

#[doc(hidden)]
pub use burn as __burn;

/// How a training pass saves what its backward needs (`--gradient_checkpointing`): the trainer
/// runs the mode (`vramlab-train`'s `recompute` module) and the estimator replays it
/// (`vramlab-models`' graph).
/// - `off`: plain autodiff, every op keeps its inputs;
/// - `blocks`: only each stage's input is kept; each stage is re-run with autodiff in the backward;
/// - `balanced`: Burn's `BalancedCheckpointing` recomputes memory-bound ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointMode {
    #[default]
    Off,
    Blocks,
    Balanced,
}

impl CheckpointMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "off" | "false" | "no" | "none" | "0" => Some(Self::Off),
            "blocks" | "true" | "on" | "yes" | "1" => Some(Self::Blocks),
            "balanced" => Some(Self::Balanced),
            _ => None,
        }
    }
    pub const NAMES: &'static str = "off, blocks (= true), balanced";
}

impl std::fmt::Display for CheckpointMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Off => "off",
            Self::Blocks => "blocks",
            Self::Balanced => "balanced",
        })
    }
}

/// Sees every tensor of a [`TensorBundle`], whatever its rank.
pub trait TensorVisitor<B: Backend> {
    fn visit<const D: usize>(&mut self, tensor: &Tensor<B, D>);
}

/// Replaces every tensor of a [`TensorBundle`] (keeping its rank).
pub trait TensorMapper<B: Backend> {
    fn map<const D: usize>(&mut self, tensor: Tensor<B, D>) -> Tensor<B, D>;
}

/// A value holding float tensors of any rank, visited and mapped in one fixed order (field
/// order, then element order); cloning it clones tensor handles, not data. Implemented for tensors, `Option`, `Vec`, `()`, [`Constant`] (nothing visited), and by
/// [`tensor_bundle!`] for a model's state types.
pub trait TensorBundle<B: Backend>: Sized + Clone {
    fn visit<V: TensorVisitor<B>>(&self, visitor: &mut V);
    fn map<M: TensorMapper<B>>(self, mapper: &mut M) -> Self;
}

impl<B: Backend, const D: usize> TensorBundle<B> for Tensor<B, D> {
    fn visit<V: TensorVisitor<B>>(&self, visitor: &mut V) {
        visitor.visit(self);
    }
    fn map<M: TensorMapper<B>>(self, mapper: &mut M) -> Self {
        mapper.map(self)
    }
}

impl<B: Backend, T: TensorBundle<B>> TensorBundle<B> for Option<T> {
    fn visit<V: TensorVisitor<B>>(&self, visitor: &mut V) {
        if let Some(t) = self {
            t.visit(visitor);
        }
    }
    fn map<M: TensorMapper<B>>(self, mapper: &mut M) -> Self {
        self.map(|t| t.map(mapper))
    }
}

impl<B: Backend, T: TensorBundle<B>> TensorBundle<B> for Vec<T> {
    fn visit<V: TensorVisitor<B>>(&self, visitor: &mut V) {
        self.iter().for_each(|t| t.visit(visitor));
    }
    fn map<M: TensorMapper<B>>(self, mapper: &mut M) -> Self {
        self.into_iter().map(|t| t.map(mapper)).collect()
    }
}

impl<B: Backend> TensorBundle<B> for () {
    fn visit<V: TensorVisitor<B>>(&self, _visitor: &mut V) {}
    fn map<M: TensorMapper<B>>(self, _mapper: &mut M) -> Self {}
}

/// A value a state carries from stage to stage that is not part of the graph: built from the
/// input once, read by later stages, never differentiated (a mask, say). Its tensors are not
/// visited nor mapped: block checkpointing neither tracks nor detaches them, and they get no
/// gradient.
#[derive(Clone, Debug)]
pub struct Constant<T>(pub T);

impl<B: Backend, T: Clone> TensorBundle<B> for Constant<T> {
    fn visit<V: TensorVisitor<B>>(&self, _visitor: &mut V) {}
    fn map<M: TensorMapper<B>>(self, _mapper: &mut M) -> Self {
        self
    }
}

/// Implement [`TensorBundle`] for a struct or enum generic over `B: Backend` whose fields are
/// all bundles (tensors, `Option`s, `Vec`s, other bundles), by listing every field in the
/// order they are visited:
///
/// ```ignore
/// tensor_bundle!(struct Latent { mu, log_sigma_x2 });
/// tensor_bundle!(enum ActState { Start {}, Vae { tokens }, Encoder { tokens, pos, latent } });
/// ```
#[macro_export]
macro_rules! tensor_bundle {
    (struct $name:ident { $($field:ident),* $(,)? }) => {
        impl<B: $crate::__burn::tensor::backend::Backend> $crate::TensorBundle<B> for $name<B> {
            fn visit<V: $crate::TensorVisitor<B>>(&self, _visitor: &mut V) {
                $( $crate::TensorBundle::visit(&self.$field, _visitor); )*
            }
            fn map<M: $crate::TensorMapper<B>>(self, _mapper: &mut M) -> Self {
                Self { $( $field: $crate::TensorBundle::map(self.$field, _mapper), )* }
            }
        }
    };
    (enum $name:ident { $($variant:ident { $($field:ident),* $(,)? }),* $(,)? }) => {
        impl<B: $crate::__burn::tensor::backend::Backend> $crate::TensorBundle<B> for $name<B> {
            fn visit<V: $crate::TensorVisitor<B>>(&self, _visitor: &mut V) {
                match self {
                    $( Self::$variant { $($field),* } => { $( $crate::TensorBundle::visit($field, _visitor); )* } )*
                }
            }
            fn map<M: $crate::TensorMapper<B>>(self, _mapper: &mut M) -> Self {
                match self {
                    $( Self::$variant { $($field),* } => Self::$variant { $( $field: $crate::TensorBundle::map($field, _mapper) ),* }, )*
                }
            }
        }
    };
}

/// A forward pass as a chain of stages over a typed state:
///
/// ```text
/// state = enter(input); for s in plan(input) { state = stage(s, state, input) }; exit(state, input)
/// ```
///
/// [`Staged::run`] is that fold; a model's `forward` calls it, so inference, tests and block
/// checkpointing share one implementation. Rules a stage chain must keep (block checkpointing
/// relies on them):
/// - `enter` is data only (no parameter may be involved): its state gets no gradient;
/// - everything a later stage needs from an earlier one travels in the state (anything that
///   depends on a parameter must, so its gradient can flow back);
/// - a stage is a pure function of its state, the input and the parameters: running it twice
///   gives the same result (randomness comes with the input).
pub trait Staged<B: Backend> {
    /// What the stages read besides the state: the batch, the caller's randomness, precision.
    type Input;
    /// The tensors flowing from one stage to the next.
    type State: TensorBundle<B>;
    /// What the forward returns (built by [`Staged::exit`] from the last state).
    type Output;
    /// A stage's name; the plan is a list of them.
    type Stage: Copy + core::fmt::Debug;

    /// The stages, in order, of a forward with this input.
    fn plan(&self, input: &Self::Input) -> Vec<Self::Stage>;
    /// The first state (data only).
    fn enter(&self, input: &Self::Input) -> Self::State;
    /// Run one stage.
    fn stage(&self, stage: Self::Stage, state: Self::State, input: &Self::Input) -> Self::State;
    /// The output from the last state (may use parameters).
    fn exit(&self, state: Self::State, input: &Self::Input) -> Self::Output;

    /// The forward pass: [`Staged::enter`], every stage of [`Staged::plan`], [`Staged::exit`].
    fn run(&self, input: &Self::Input) -> Self::Output {
        let state = self.plan(input).into_iter().fold(self.enter(input), |state, s| self.stage(s, state, input));
        self.exit(state, input)
    }
}

/// Cut every tensor of `state` from its graph. (Burn's `detach` keeps a tensor's
/// `require_grad` flag: the states of a forward under a `no_grad` model have none to keep.)
pub fn detach<B: AutodiffBackend, S: TensorBundle<B>>(state: S) -> S {
    struct Detach;
    impl<B: AutodiffBackend> TensorMapper<B> for Detach {
        fn map<const D: usize>(&mut self, t: Tensor<B, D>) -> Tensor<B, D> {
            t.detach()
        }
    }
    state.map(&mut Detach)
}

/// Cut every tensor of `state` from its graph and track it as a new leaf.
pub fn leaves<B: AutodiffBackend, S: TensorBundle<B>>(state: S) -> S {
    struct Leaf;
    impl<B: AutodiffBackend> TensorMapper<B> for Leaf {
        fn map<const D: usize>(&mut self, t: Tensor<B, D>) -> Tensor<B, D> {
            t.detach().require_grad()
        }
    }
    state.map(&mut Leaf)
}

/// The gradient of every tensor of a state, in visit order, rank-erased (on the inner
/// backend, in each tensor's own dtype).
pub struct StateGrads<B: AutodiffBackend> {
    grads: Vec<FloatTensor<B::InnerBackend>>,
}

impl<B: AutodiffBackend> Default for StateGrads<B> {
    /// No gradients (the gradient of a state without tensors).
    fn default() -> Self {
        Self { grads: Vec::new() }
    }
}

impl<B: AutodiffBackend> StateGrads<B> {
    /// Zeros shaped like every tensor of `state` (the gradient of a state the loss does not
    /// depend on).
    pub fn zeros<S: TensorBundle<B>>(state: &S) -> Self {
        struct Zeros<B: AutodiffBackend>(Vec<FloatTensor<B::InnerBackend>>);
        impl<B: AutodiffBackend> TensorVisitor<B> for Zeros<B> {
            fn visit<const D: usize>(&mut self, t: &Tensor<B, D>) {
                self.0.push(t.clone().inner().zeros_like().into_primitive().tensor());
            }
        }
        let mut z = Zeros::<B>(Vec::new());
        state.visit(&mut z);
        Self { grads: z.0 }
    }

    /// The gradients of the leaves of `state` (see [`leaves`]) in `grads`; zeros for a tensor
    /// the loss does not depend on.
    pub fn of<S: TensorBundle<B>>(state: &S, grads: &B::Gradients) -> Self {
        struct Collect<'a, B: AutodiffBackend> {
            grads: &'a B::Gradients,
            out: Vec<FloatTensor<B::InnerBackend>>,
        }
        impl<B: AutodiffBackend> TensorVisitor<B> for Collect<'_, B> {
            fn visit<const D: usize>(&mut self, t: &Tensor<B, D>) {
                let g = t.grad(self.grads).unwrap_or_else(|| t.clone().inner().zeros_like());
                self.out.push(g.into_primitive().tensor());
            }
        }
        let mut c = Collect { grads, out: Vec::new() };
        state.visit(&mut c);
        Self { grads: c.out }
    }

    /// `Σ sum(t · grad_t)` over the tensors of `state` in f32: backpropagating this scalar
    /// sends each gradient into its tensor's graph. `state` must have the structure the
    /// gradients were collected from. (Stage tensors may be low precision while the loss side
    /// is f32; the cast is differentiable, so each gradient reaches its tensor in its own
    /// dtype.) `None` for a state without tensors.
    pub fn dot<S: TensorBundle<B>>(self, state: &S) -> Option<Tensor<B, 1>> {
        struct Dot<B: AutodiffBackend> {
            grads: std::vec::IntoIter<FloatTensor<B::InnerBackend>>,
            sum: Option<Tensor<B, 1>>,
        }
        impl<B: AutodiffBackend> TensorVisitor<B> for Dot<B> {
            fn visit<const D: usize>(&mut self, t: &Tensor<B, D>) {
                let g = self.grads.next().expect("a stage's output and its gradient differ in structure (model bug)");
                let g = Tensor::<B::InnerBackend, D>::from_primitive(TensorPrimitive::Float(g));
                assert_eq!(g.dims(), t.dims(), "a stage's output and its gradient differ in shape (model bug)");
                let g = Tensor::<B, D>::from_inner(g).cast(FloatDType::F32);
                let term = (t.clone().cast(FloatDType::F32) * g).sum();
                self.sum = Some(match self.sum.take() {
                    Some(acc) => acc + term,
                    None => term,
                });
            }
        }
        let mut d = Dot::<B> { grads: self.grads.into_iter(), sum: None };
        state.visit(&mut d);
        assert!(d.grads.next().is_none(), "a stage's output has fewer tensors than its gradient (model bug)");
        d.sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};

    type A = Autodiff<Flex>;

    #[derive(Clone)]
    struct Pair<B: Backend> {
        a: Tensor<B, 2>,
        rest: Vec<Tensor<B, 3>>,
        opt: Option<Tensor<B, 1>>,
    }
    tensor_bundle!(struct Pair { a, rest, opt });

    #[derive(Clone)]
    enum Phase<B: Backend> {
        Empty {},
        One { x: Tensor<B, 2> },
    }
    tensor_bundle!(enum Phase { Empty {}, One { x } });

    #[test]
    fn bundles_visit_in_field_order_and_grads_round_trip() {
        let dev = Default::default();
        let p = Pair::<A> {
            a: Tensor::ones([2, 3], &dev),
            rest: vec![Tensor::ones([1, 2, 2], &dev) * 2.0, Tensor::ones([1, 1, 1], &dev)],
            opt: Some(Tensor::ones([4], &dev)),
        };
        struct Dims(Vec<Vec<usize>>);
        impl<B: Backend> TensorVisitor<B> for Dims {
            fn visit<const D: usize>(&mut self, t: &Tensor<B, D>) {
                self.0.push(t.dims().to_vec());
            }
        }
        let mut dims = Dims(vec![]);
        p.visit(&mut dims);
        assert_eq!(dims.0, [vec![2, 3], vec![1, 2, 2], vec![1, 1, 1], vec![4]]);

        // loss = sum(a²) + 3·sum(rest[0]) (rest[1] and opt unused): grads 2a, 3, 0, 0.
        let p = leaves(p);
        let loss = p.a.clone().square().sum() + p.rest[0].clone().sum() * 3.0;
        let grads = StateGrads::<A>::of(&p, &loss.backward());
        // The surrogate Σ t·g on the same state: its value is Σ 2a·a + 3·rest[0] = 12 + 24.
        let s = grads.dot(&p).unwrap().into_scalar();
        assert_eq!(s, 36.0);
        assert!(StateGrads::<A>::of(&Phase::<A>::Empty {}, &Tensor::<A, 1>::ones([1], &dev).require_grad().sum().backward()).dot(&Phase::<A>::Empty {}).is_none());
        let Phase::One { x } = leaves(Phase::<A>::One { x: Tensor::ones([1, 1], &dev) * 2.0 }) else { unreachable!() };
        assert!(x.is_require_grad());
        let one = detach(Phase::<A>::One { x });
        assert_eq!(StateGrads::zeros(&one).dot(&one).unwrap().into_scalar(), 0.0);
    }

    #[derive(Clone, Debug)]
    struct Masked<B: Backend> {
        x: Tensor<B, 2>,
        mask: Constant<Tensor<B, 2>>,
    }
    tensor_bundle!(struct Masked { x, mask });

    #[test]
    fn a_constant_is_neither_visited_nor_tracked() {
        let dev = Default::default();
        let m = leaves(Masked::<A> { x: Tensor::ones([2, 2], &dev), mask: Constant(Tensor::ones([2, 3], &dev) * 4.0) });
        assert!(m.x.is_require_grad());
        assert!(!m.mask.0.is_require_grad(), "leaves() tracks no constant");
        // The loss reads the constant; only `x` has a gradient in the state's.
        let loss = (m.x.clone().sum() * m.mask.0.clone().sum()).sum();
        let grads = StateGrads::<A>::of(&m, &loss.backward());
        assert_eq!(grads.dot(&m).unwrap().into_scalar(), 4.0 * 24.0);
        let mut n = 0;
        struct Count<'a>(&'a mut usize);
        impl<B: Backend> TensorVisitor<B> for Count<'_> {
            fn visit<const D: usize>(&mut self, _: &Tensor<B, D>) {
                *self.0 += 1;
            }
        }
        m.visit(&mut Count(&mut n));
        assert_eq!(n, 1, "only `x` is visited");
    }
}
