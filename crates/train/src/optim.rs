//! Adam / AdamW with PyTorch semantics, parameter groups and global-norm clipping.
//!
//! Written here rather than taken from burn-optim because vramlab needs: PyTorch's defaults
//! (eps 1e-8; Burn's AdamW uses 1e-5), per-group learning rates selected by parameter name
//! (lerobot's `lr_backbone`), clipping by the *global* norm like `clip_grad_norm_` (Burn's
//! `GradientClipping::Norm` clips each tensor on its own), optimizer state saved in torch's
//! `state_dict` layout with parameter names (lerobot's `training_state/`, readable without
//! Burn), and exact byte counts of that state.
//! Frozen parameters (not requiring grad) get no gradient and therefore no state.

use std::collections::BTreeMap;
use std::path::Path;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use vramlab_store::{PathStack, WeightError};

use crate::optim_kernels::{AdamUpdate, Decay, OptimKernels, SqAcc};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimKind {
    /// L2 penalty added to the gradient (`torch.optim.Adam(weight_decay=…)`).
    Adam,
    /// Decoupled weight decay (`torch.optim.AdamW`).
    AdamW,
}

/// Parameters under the module path `prefix` (the parameter `prefix` itself, or any name
/// starting with `prefix.`) use `lr` instead of the base lr.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamGroup {
    pub prefix: String,
    pub lr: f64,
}

impl ParamGroup {
    /// Whether parameter `name` belongs to the group.
    pub fn matches(&self, name: &str) -> bool {
        name.strip_prefix(self.prefix.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    }
}

/// An optimizer config that does not fit the model it would train.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptimError {
    /// A parameter group names a module path the model does not have (a typo, or a prefix
    /// relative to another wrapper): its learning rate would silently apply to nothing.
    #[error("optimizer parameter group `{prefix}` matches no parameter of the model (parameters start with: {found})")]
    UnmatchedGroup { prefix: String, found: String },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimConfig {
    pub kind: OptimKind,
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    /// Clip the global L2 norm of all gradients to this value (None: no clipping).
    pub grad_clip_norm: Option<f64>,
    pub groups: Vec<ParamGroup>,
}

impl Default for OptimConfig {
    fn default() -> Self {
        Self { kind: OptimKind::AdamW, lr: 1e-4, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 1e-2, grad_clip_norm: None, groups: Vec::new() }
    }
}

impl OptimConfig {
    fn lr_for(&self, name: &str) -> f64 {
        self.groups.iter().find(|g| g.matches(name)).map_or(self.lr, |g| g.lr)
    }

    /// Check that every parameter group matches at least one parameter of `module` (trainable
    /// or frozen).
    pub fn check_groups<B: Backend, M: burn::module::Module<B>>(&self, module: &M) -> Result<(), OptimError> {
        if self.groups.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = vramlab_store::param_shapes::<B, M>(module).into_iter().map(|(name, _)| name).collect();
        match self.groups.iter().find(|g| !names.iter().any(|n| g.matches(n))) {
            None => Ok(()),
            Some(g) => {
                let mut roots: Vec<&str> = Vec::new();
                for root in names.iter().filter_map(|n| n.split('.').next()) {
                    if !roots.contains(&root) {
                        roots.push(root);
                    }
                }
                Err(OptimError::UnmatchedGroup { prefix: g.prefix.clone(), found: roots.join(", ") })
            }
        }
    }
}

struct MomentState<B: Backend> {
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
}

/// Adam(W) with state per parameter name.
pub struct Optimizer<B: AutodiffBackend> {
    pub config: OptimConfig,
    /// Number of optimizer steps taken (PyTorch's per-parameter `step`, shared here).
    pub step: u64,
    state: BTreeMap<String, MomentState<B::InnerBackend>>,
}

/// What an optimizer step did.
#[derive(Clone, Copy, Debug)]
pub struct StepInfo {
    /// Global L2 norm of the (unscaled) gradients before clipping.
    pub grad_norm: f64,
    /// False when the step was skipped because a gradient was not finite.
    pub applied: bool,
}

impl<B: AutodiffBackend> Optimizer<B> {
    pub fn new(config: OptimConfig) -> Self {
        Self { config, step: 0, state: BTreeMap::new() }
    }

    /// Bytes held as optimizer state (two f32 moments per trainable parameter with a grad seen).
    pub fn state_bytes(&self) -> u64 {
        self.state.values().map(|s| 2 * 4 * s.m.dims()[0] as u64).sum()
    }

    /// Apply one update. `grad_scale` divides the gradients first (f16 loss scaling);
    /// `lr_factor` multiplies every group's lr (the schedule).
    pub fn step<M: AutodiffModule<B>>(
        &mut self,
        module: M,
        mut grads: GradientsParams,
        grad_scale: f64,
        lr_factor: f64,
    ) -> (M, StepInfo)
    where
        B::InnerBackend: OptimKernels,
    {
        // Global norm over all gradients, computed on device, read once.
        let mut norm = NormVisitor::<B> { grads: &mut grads, acc: SqAcc::default() };
        module.visit(&mut norm);
        let sq = B::InnerBackend::sq_total(norm.acc);
        let grad_norm = sq.sqrt() / grad_scale;
        if !grad_norm.is_finite() {
            return (module, StepInfo { grad_norm, applied: false });
        }
        let mut coef = 1.0 / grad_scale;
        if let Some(max) = self.config.grad_clip_norm {
            // torch: clip_coef = max_norm / (total_norm + 1e-6), applied when < 1.
            let clip = max / (grad_norm + 1e-6);
            if clip < 1.0 {
                coef *= clip;
            }
        }
        self.step += 1;
        let mut mapper = AdamMapper { opt: self, grads: &mut grads, coef, lr_factor, path: PathStack::default(), later: Default::default() };
        let module = module.map(&mut mapper);
        // The updates a backend held back run now, before anything reads the parameters.
        B::InnerBackend::adam_flush(mapper.later);
        (module, StepInfo { grad_norm, applied: true })
    }

    /// The parameter groups in torch's order: group 0 holds the parameters at the base lr, then
    /// one group per [`ParamGroup`] (lerobot's ACT: everything but the backbone, then the
    /// backbone). Each is a list of indices into `params`.
    fn group_members(&self, params: &[(String, Vec<usize>)]) -> Vec<Vec<usize>> {
        let mut groups = vec![Vec::new(); 1 + self.config.groups.len()];
        for (i, (name, _)) in params.iter().enumerate() {
            let g = self.config.groups.iter().position(|g| g.matches(name)).map_or(0, |g| g + 1);
            groups[g].push(i);
        }
        groups
    }

    /// Save in torch's `optimizer.state_dict()` layout, as lerobot writes it:
    /// `state_path` holds `state/<i>/exp_avg`, `state/<i>/exp_avg_sq` (the parameter's shape)
    /// and `state/<i>/step`; `groups_path` the param groups (lr after the schedule's
    /// `lr_factor`, betas, eps, weight_decay, `params` = the indices, `param_names` as torch
    /// names them when an optimizer is built from named parameters). `params` are the trainable
    /// parameters in module order ([`trainable_params`]).
    pub fn save(&self, state_path: &Path, groups_path: &Path, params: &[(String, Vec<usize>)], lr_factor: f64) -> Result<(), WeightError> {
        let mut tensors = Vec::with_capacity(self.state.len() * 3);
        let mut groups = Vec::new();
        let cfg = &self.config;
        for (g, members) in self.group_members(params).into_iter().enumerate() {
            let base_lr = if g == 0 { cfg.lr } else { cfg.groups[g - 1].lr };
            for &i in &members {
                let (name, shape) = &params[i];
                if let Some(s) = self.state.get(name) {
                    let with_shape = |t: &Tensor<B::InnerBackend, 1>| {
                        let d = t.to_data();
                        TensorData::new(d.to_vec::<f32>().unwrap_or_default(), shape.clone())
                    };
                    tensors.push((format!("state/{i}/exp_avg"), with_shape(&s.m)));
                    tensors.push((format!("state/{i}/exp_avg_sq"), with_shape(&s.v)));
                    tensors.push((format!("state/{i}/step"), TensorData::new(vec![self.step as f32], Vec::<usize>::new())));
                }
            }
            groups.push(serde_json::json!({
                "lr": base_lr * lr_factor,
                "betas": [cfg.betas.0, cfg.betas.1],
                "eps": cfg.eps,
                "weight_decay": cfg.weight_decay,
                "amsgrad": false,
                "maximize": false,
                "foreach": null,
                "capturable": false,
                "differentiable": false,
                "fused": null,
                "decoupled_weight_decay": cfg.kind == OptimKind::AdamW,
                "initial_lr": base_lr,
                "params": members,
                "param_names": members.iter().map(|&i| params[i].0.as_str()).collect::<Vec<_>>(),
            }));
        }
        vramlab_store::write_safetensors(&tensors, state_path)?;
        let text = serde_json::to_string_pretty(&groups).expect("param groups serialise");
        std::fs::write(groups_path, text).map_err(|source| WeightError::Write { path: groups_path.to_path_buf(), source })
    }

    /// Load what [`Optimizer::save`] wrote, or what lerobot wrote for the same policy: saved
    /// indices are matched to this model's parameters by `param_names` where the file has
    /// them, otherwise by position within each group (torch's own rule), checking counts and
    /// shapes. `step` comes from the trainer state.
    pub fn load(
        &mut self,
        state_path: &Path,
        groups_path: &Path,
        params: &[(String, Vec<usize>)],
        step: u64,
        device: &burn::tensor::Device<B::InnerBackend>,
    ) -> Result<(), WeightError> {
        let bad = |msg: String| WeightError::Format { path: groups_path.to_path_buf(), msg };
        let text = std::fs::read_to_string(groups_path).map_err(|source| WeightError::Io { path: groups_path.to_path_buf(), source })?;
        let saved: Vec<serde_json::Value> = serde_json::from_str(&text).map_err(|e| bad(format!("not a list of param groups: {e}")))?;
        let ours = self.group_members(params);
        if saved.len() != ours.len() {
            return Err(bad(format!("{} param group(s), this run has {}", saved.len(), ours.len())));
        }
        let shapes: BTreeMap<&str, &Vec<usize>> = params.iter().map(|(n, s)| (n.as_str(), s)).collect();
        let mut name_of: BTreeMap<u64, String> = BTreeMap::new();
        for (g, (group, members)) in saved.iter().zip(&ours).enumerate() {
            let indices: Vec<u64> = group["params"].as_array().map(|a| a.iter().filter_map(|v| v.as_u64()).collect()).unwrap_or_default();
            let names: Option<Vec<String>> = group.get("param_names").and_then(|v| serde_json::from_value(v.clone()).ok());
            match names {
                Some(names) if names.len() == indices.len() => {
                    for (i, n) in indices.iter().zip(names) {
                        if !shapes.contains_key(n.as_str()) {
                            return Err(bad(format!("group {g} names parameter `{n}`, which this model does not train")));
                        }
                        name_of.insert(*i, n);
                    }
                }
                _ if indices.len() == members.len() => {
                    for (i, &m) in indices.iter().zip(members) {
                        name_of.insert(*i, params[m].0.clone());
                    }
                }
                _ => return Err(bad(format!("group {g} holds {} parameters, this run trains {} in that group", indices.len(), members.len()))),
            }
        }
        let raw = vramlab_store::read_safetensors(state_path)?;
        let mut pending: BTreeMap<String, (Option<TensorData>, Option<TensorData>)> = BTreeMap::new();
        for (k, v) in raw {
            vramlab_store::check_finite(state_path, &k, &v)?;
            let mut parts = k.split('/');
            let (Some("state"), Some(i), Some(field), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
                return Err(WeightError::Unused { path: state_path.to_path_buf(), unused: vec![k] });
            };
            let Some(name) = i.parse::<u64>().ok().and_then(|i| name_of.get(&i)) else {
                return Err(WeightError::Unused { path: state_path.to_path_buf(), unused: vec![k] });
            };
            let want = shapes[name.as_str()];
            if field != "step" && v.shape.iter().product::<usize>() != want.iter().product::<usize>() {
                return Err(WeightError::Shape { path: state_path.to_path_buf(), key: k, expected: want.clone(), found: v.shape.to_vec() });
            }
            match field {
                "exp_avg" => pending.entry(name.clone()).or_default().0 = Some(v),
                "exp_avg_sq" => pending.entry(name.clone()).or_default().1 = Some(v),
                "step" => {}
                _ => return Err(WeightError::Unused { path: state_path.to_path_buf(), unused: vec![k] }),
            }
        }
        let mut state = BTreeMap::new();
        for (name, pair) in pending {
            let (Some(m), Some(v)) = pair else {
                return Err(WeightError::Missing { path: state_path.to_path_buf(), missing: vec![format!("{name} (exp_avg and exp_avg_sq)")] });
            };
            // Stored in the parameter's shape (torch's layout), kept flat here.
            let to = |d: TensorData| {
                let n = d.num_elements();
                let flat = TensorData::new(d.convert::<f32>().to_vec::<f32>().unwrap_or_default(), [n]);
                Tensor::<B::InnerBackend, 1>::from_data(flat, device)
            };
            state.insert(name, MomentState { m: to(m), v: to(v) });
        }
        self.state = state;
        self.step = step;
        Ok(())
    }
}

/// The parameters of `module` that train (require grad), in module order, with their shapes:
/// the order of torch's `named_parameters()` where the module declares its fields as the
/// reference does (checked against lerobot for ACT and Diffusion).
pub fn trainable_params<B: Backend, M: burn::module::Module<B>>(module: &M) -> Vec<(String, Vec<usize>)> {
    vramlab_store::trainable_param_shapes::<B, M>(module)
}

struct NormVisitor<'a, B: AutodiffBackend<InnerBackend: OptimKernels>> {
    grads: &'a mut GradientsParams,
    acc: SqAcc<B::InnerBackend>,
}

impl<B: AutodiffBackend<InnerBackend: OptimKernels>> ModuleVisitor<B> for NormVisitor<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            // The kernel may hand the gradient back re-laid out for the update.
            let g = B::InnerBackend::grad_sq_sum(g, &mut self.acc);
            self.grads.register::<B::InnerBackend, D>(param.id, g);
        }
    }
}

struct AdamMapper<'a, B: AutodiffBackend<InnerBackend: OptimKernels>> {
    opt: &'a mut Optimizer<B>,
    grads: &'a mut GradientsParams,
    coef: f64,
    lr_factor: f64,
    path: PathStack,
    later: <B::InnerBackend as OptimKernels>::Later,
}

impl<B: AutodiffBackend<InnerBackend: OptimKernels>> ModuleMapper<B> for AdamMapper<'_, B> {
    fn enter_module(&mut self, name: &str, container: &str) {
        self.path.enter(name, container);
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.exit();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return param;
        };
        let name = self.path.current();
        let cfg = &self.opt.config;
        let (b1, b2) = cfg.betas;
        let t = self.opt.step as i32;
        let lr = cfg.lr_for(&name) * self.lr_factor;
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let p = tensor.inner();
        let decay = match cfg.kind {
            _ if cfg.weight_decay == 0.0 => Decay::None,
            OptimKind::Adam => Decay::L2(cfg.weight_decay),
            OptimKind::AdamW => Decay::Decoupled(1.0 - lr * cfg.weight_decay),
        };
        let h = AdamUpdate { b1, b2, eps: cfg.eps, lr, bc1: 1.0 - b1.powi(t), bc2: 1.0 - b2.powi(t), coef: self.coef, decay };
        let moments = self.opt.state.remove(&name).map(|s| (s.m, s.v));
        let (p, m, v) = B::InnerBackend::adam_update_later(p, grad, moments, &h, &mut self.later);
        self.opt.state.insert(name, MomentState { m, v });
        let mut value = Tensor::<B, D>::from_inner(p);
        if require_grad {
            value = value.require_grad();
        }
        Param::from_mapped_value(id, value, mapper)
    }
}

/// Bytes of all float parameters of a module (f32 master weights or whatever dtype they hold).
pub fn param_bytes<B: Backend, M: burn::module::Module<B>>(module: &M) -> (u64, u64, u64) {
    struct V {
        bytes: u64,
        count: u64,
        trainable: u64,
    }
    impl<B: Backend> ModuleVisitor<B> for V {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            let n = t.shape().num_elements() as u64;
            self.bytes += n * t.dtype().size() as u64;
            self.count += n;
            if param.is_require_grad() {
                self.trainable += n;
            }
        }
    }
    let mut v = V { bytes: 0, count: 0, trainable: 0 };
    module.visit(&mut v);
    (v.bytes, v.count, v.trainable)
}

/// Bytes held by a set of parameter gradients.
pub fn grad_bytes<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M, grads: &GradientsParams) -> u64 {
    struct V<'a> {
        grads: &'a GradientsParams,
        bytes: u64,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for V<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                self.bytes += g.shape().num_elements() as u64 * g.dtype().size() as u64;
            }
        }
    }
    let mut v = V { grads, bytes: 0 };
    module.visit(&mut v);
    v.bytes
}
