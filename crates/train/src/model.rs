//! What the trainer needs from a model: nothing but a loss (and optionally stages).

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn::tensor::backend::AutodiffBackend;

/// A scalar loss and its named parts (for logging; only `loss` is differentiated).
pub struct LossParts<B: Backend> {
    pub loss: Tensor<B, 1>,
    pub parts: Vec<(&'static str, Tensor<B, 1>)>,
}

impl<B: Backend> LossParts<B> {
    pub fn new(loss: Tensor<B, 1>) -> Self {
        Self { loss, parts: Vec::new() }
    }
    pub fn with(mut self, name: &'static str, value: Tensor<B, 1>) -> Self {
        self.parts.push((name, value));
        self
    }
}

/// A model the trainer can train. The batch type is the model's business.
pub trait TrainModel<B: AutodiffBackend>: AutodiffModule<B> + Clone {
    type Batch;

    /// Training-mode loss for one (micro-)batch.
    fn forward_loss(&self, batch: &Self::Batch) -> LossParts<B>;

    /// The forward pass as a chain of stages, when the model offers one (block checkpointing).
    fn staged(&self) -> Option<&dyn Staged<B, Self::Batch>> {
        None
    }

    /// Write the weights of a checkpoint (default: every parameter under its module path).
    /// Wrappers override this to save the inner model under the reference's names.
    fn save_weights(&self, path: &std::path::Path) -> Result<(), vramlab_store::WeightError> {
        vramlab_store::save_safetensors::<B, Self>(self, path)
    }

    /// Read the weights written by [`TrainModel::save_weights`].
    fn load_weights(self, path: &std::path::Path) -> Result<Self, vramlab_store::WeightError> {
        vramlab_store::load_safetensors(self, path, |k| Some(k.to_string()))
    }
}

/// A tensor of any rank flowing between stages.
#[derive(Clone, Debug)]
pub enum StageTensor<B: Backend> {
    R2(Tensor<B, 2>),
    R3(Tensor<B, 3>),
    R4(Tensor<B, 4>),
    R5(Tensor<B, 5>),
}

macro_rules! each_rank {
    ($self:expr, $t:ident => $e:expr) => {
        match $self {
            StageTensor::R2($t) => StageTensor::R2($e),
            StageTensor::R3($t) => StageTensor::R3($e),
            StageTensor::R4($t) => StageTensor::R4($e),
            StageTensor::R5($t) => StageTensor::R5($e),
        }
    };
}

impl<B: Backend> StageTensor<B> {
    /// The rank-2 tensor (panics on another rank: a bug in the model's stage layout).
    pub fn r2(&self) -> Tensor<B, 2> {
        match self {
            StageTensor::R2(t) => t.clone(),
            other => panic!("stage layout: rank-2 tensor expected, found {}", other.rank()),
        }
    }
    /// The rank-3 tensor (panics on another rank).
    pub fn r3(&self) -> Tensor<B, 3> {
        match self {
            StageTensor::R3(t) => t.clone(),
            other => panic!("stage layout: rank-3 tensor expected, found {}", other.rank()),
        }
    }
    /// The rank-4 tensor (panics on another rank).
    pub fn r4(&self) -> Tensor<B, 4> {
        match self {
            StageTensor::R4(t) => t.clone(),
            other => panic!("stage layout: rank-4 tensor expected, found {}", other.rank()),
        }
    }
    pub fn rank(&self) -> usize {
        match self {
            StageTensor::R2(_) => 2,
            StageTensor::R3(_) => 3,
            StageTensor::R4(_) => 4,
            StageTensor::R5(_) => 5,
        }
    }
}

impl<B: AutodiffBackend> StageTensor<B> {
    /// Cut from any graph and track as a new leaf.
    pub fn leaf(self) -> Self {
        each_rank!(self, t => t.detach().require_grad())
    }
    pub fn detach(self) -> Self {
        each_rank!(self, t => t.detach())
    }
    /// `sum(self * grad)` in f32: backpropagating this scalar sends `grad` into `self`'s graph.
    /// (Stage tensors may be low precision while the loss side is f32; the cast is
    /// differentiable, so the gradient reaches `self` in its own dtype.)
    pub fn dot(&self, grad: &StageGrad<B>) -> Tensor<B, 1> {
        fn f32_dot<B: AutodiffBackend, const D: usize>(t: &Tensor<B, D>, g: &Tensor<B::InnerBackend, D>) -> Tensor<B, 1> {
            let g = Tensor::<B, D>::from_inner(g.clone()).cast(FloatDType::F32);
            (t.clone().cast(FloatDType::F32) * g).sum()
        }
        match (self, grad) {
            (StageTensor::R2(t), StageTensor::R2(g)) => f32_dot(t, g),
            (StageTensor::R3(t), StageTensor::R3(g)) => f32_dot(t, g),
            (StageTensor::R4(t), StageTensor::R4(g)) => f32_dot(t, g),
            (StageTensor::R5(t), StageTensor::R5(g)) => f32_dot(t, g),
            _ => panic!("stage output and its gradient differ in rank (model bug)"),
        }
    }
    /// Gradient of this leaf, or zeros when the loss does not depend on it.
    pub fn grad(&self, grads: &B::Gradients) -> StageGrad<B> {
        match self {
            StageTensor::R2(t) => StageTensor::R2(t.grad(grads).unwrap_or_else(|| t.clone().inner().zeros_like())),
            StageTensor::R3(t) => StageTensor::R3(t.grad(grads).unwrap_or_else(|| t.clone().inner().zeros_like())),
            StageTensor::R4(t) => StageTensor::R4(t.grad(grads).unwrap_or_else(|| t.clone().inner().zeros_like())),
            StageTensor::R5(t) => StageTensor::R5(t.grad(grads).unwrap_or_else(|| t.clone().inner().zeros_like())),
        }
    }
}

/// Gradient of a stage tensor (on the inner backend).
pub type StageGrad<B> = StageTensor<<B as AutodiffBackend>::InnerBackend>;

/// The forward pass as `state_0 = input(batch)`, `state_{i+1} = stage(i, state_i)`,
/// `loss = loss(state_n)`. Running the chain must give exactly `forward_loss`.
/// Any tensor the loss needs from an early stage travels along in the state.
pub trait Staged<B: AutodiffBackend, Batch> {
    fn num_stages(&self) -> usize;
    /// The chain's input (data only: no parameter may be involved).
    fn input(&self, batch: &Batch) -> Vec<StageTensor<B>>;
    fn stage(&self, i: usize, state: Vec<StageTensor<B>>, batch: &Batch) -> Vec<StageTensor<B>>;
    fn loss(&self, state: Vec<StageTensor<B>>, batch: &Batch) -> LossParts<B>;
}
