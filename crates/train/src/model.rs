//! What the trainer needs from a model: its staged forward, the input for a batch, a loss.

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use vramlab_stages::Staged;

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

/// A model the trainer can train: a wrapper around a model's staged forward
/// ([`vramlab_stages::Staged`]) that builds the forward's input from a batch and the training
/// loss from its output. [`TrainModel::forward_loss`] is the fold over the model's stages, and
/// block checkpointing ([`crate::recompute::staged_forward_backward`]) runs the same
/// stages: there is one forward.
pub trait TrainModel<B: AutodiffBackend>: AutodiffModule<B> + Clone {
    /// What the data gives for one (micro-)batch.
    type Batch;
    /// The model (with its stage plan) inside the wrapper.
    type Model: Staged<B>;

    /// The wrapped model.
    fn model(&self) -> &Self::Model;

    /// The forward's input for a batch: data, randomness, precision (no parameter may be
    /// involved, it gets no gradient).
    fn input(&self, batch: &Self::Batch) -> ModelInput<B, Self>;

    /// The training loss of the forward's output.
    fn loss(&self, output: ModelOutput<B, Self>, batch: &Self::Batch) -> LossParts<B>;

    /// Training-mode loss for one (micro-)batch: the model's forward, then [`TrainModel::loss`].
    /// (Not meant to be overridden: block checkpointing computes the same thing stage by stage.)
    fn forward_loss(&self, batch: &Self::Batch) -> LossParts<B> {
        self.loss(self.model().run(&self.input(batch)), batch)
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

/// The input of a [`TrainModel`]'s forward.
pub type ModelInput<B, M> = <<M as TrainModel<B>>::Model as Staged<B>>::Input;
/// The output of a [`TrainModel`]'s forward.
pub type ModelOutput<B, M> = <<M as TrainModel<B>>::Model as Staged<B>>::Output;
