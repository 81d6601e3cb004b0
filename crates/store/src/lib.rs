//! vramlab-store: weight and state I/O by name: safetensors <-> Burn modules.
//!
//! A parameter's name is its module path (`encoder.down_blocks.0.0.conv1.weight`), built from
//! struct field names and `Vec` indices. Enum variants are *not* part of the name: a
//! heterogeneous PyTorch `ModuleList` maps to a `Vec` of an enum whose variants wrap the
//! layer types, so the names match the reference's state dict without a remap table.
//! A missing, misshapen, unused or non-finite (NaN, ±inf) weight is an error naming the file and the key.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use burn::tensor::TensorData;
use safetensors::{Dtype, SafeTensors};

#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error("{path}: cannot read: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: cannot write: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a valid safetensors file: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("{path}: tensor `{key}` has unsupported dtype {dtype} (expected a float type)")]
    Dtype { path: PathBuf, key: String, dtype: String },
    #[error("{path}: tensor `{key}` has shape {found:?}, the model expects {expected:?}")]
    Shape { path: PathBuf, key: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("{path}: {} weight(s) the model needs are missing: {}", missing.len(), preview(missing))]
    Missing { path: PathBuf, missing: Vec<String> },
    #[error("{path}: {} weight(s) in the file are not used by the model: {}", unused.len(), preview(unused))]
    Unused { path: PathBuf, unused: Vec<String> },
    #[error("{path}: tensor `{key}` has {count} non-finite value(s) (NaN or ±inf) of {total}: not usable (written by a run that diverged, or damaged)")]
    NonFinite { path: PathBuf, key: String, count: usize, total: usize },
}

/// How many values of a float tensor are NaN or ±inf (0 for other dtypes).
pub fn non_finite_count(data: &TensorData) -> usize {
    match data.dtype {
        burn::tensor::DType::F32 => data.as_slice::<f32>().map_or(0, |v| v.iter().filter(|x| !x.is_finite()).count()),
        dt if dt.is_float() => data.clone().convert::<f32>().to_vec::<f32>().map_or(0, |v| v.iter().filter(|x| !x.is_finite()).count()),
        _ => 0,
    }
}

/// `Err` naming `path` and `key` when float tensor `data` holds a NaN or an infinity.
pub fn check_finite(path: &Path, key: &str, data: &TensorData) -> Result<(), WeightError> {
    match non_finite_count(data) {
        0 => Ok(()),
        count => Err(WeightError::NonFinite { path: path.to_path_buf(), key: key.to_string(), count, total: data.num_elements() }),
    }
}

/// Every float tensor of a safetensors file is finite; `Err` names the first that is not.
pub fn check_finite_file(path: &Path) -> Result<(), WeightError> {
    read_safetensors(path)?.iter().try_for_each(|(key, data)| check_finite(path, key, data))
}

fn preview(keys: &[String]) -> String {
    let mut s = keys.iter().take(8).cloned().collect::<Vec<_>>().join(", ");
    if keys.len() > 8 {
        s.push_str(&format!(", … ({} more)", keys.len() - 8));
    }
    s
}

/// Tracks the module path while visiting/mapping; enum variant names are skipped.
/// Public so that other visitors (the optimizer) name parameters the same way.
#[derive(Default)]
pub struct PathStack {
    parts: Vec<Option<String>>,
}

impl PathStack {
    pub fn enter(&mut self, name: &str, container: &str) {
        let keep = !container.starts_with("Enum:");
        self.parts.push(keep.then(|| name.to_string()));
    }
    pub fn exit(&mut self) {
        self.parts.pop();
    }
    /// The current name: the path parts joined with '.', enum variants left out.
    pub fn current(&self) -> String {
        self.parts.iter().flatten().map(String::as_str).collect::<Vec<_>>().join(".")
    }
}

/// Float parameters of a module with their names, as f32 `TensorData`.
pub fn named_tensors<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, TensorData)> {
    struct Collect {
        path: PathStack,
        out: Vec<(String, TensorData)>,
    }
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn enter_module(&mut self, name: &str, container: &str) {
            self.path.enter(name, container);
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            // Param fields are entered like modules: the path already ends with their name.
            let key = self.path.current();
            let data = param.val().into_data().convert::<f32>();
            self.out.push((key, data));
        }
    }
    let mut c = Collect { path: PathStack::default(), out: Vec::new() };
    module.visit(&mut c);
    c.out
}

/// Parameter names and shapes of a module (no data copied).
pub fn param_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, Vec<usize>)> {
    shapes::<B, M>(module, false)
}

/// Names and shapes of the parameters that train (require grad), in module order.
pub fn trainable_param_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, Vec<usize>)> {
    shapes::<B, M>(module, true)
}

fn shapes<B: Backend, M: Module<B>>(module: &M, trainable_only: bool) -> Vec<(String, Vec<usize>)> {
    struct Collect {
        path: PathStack,
        trainable_only: bool,
        out: Vec<(String, Vec<usize>)>,
    }
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn enter_module(&mut self, name: &str, container: &str) {
            self.path.enter(name, container);
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if !self.trainable_only || param.is_require_grad() {
                self.out.push((self.path.current(), param.shape().dims::<D>().to_vec()));
            }
        }
    }
    let mut c = Collect { path: PathStack::default(), trainable_only, out: Vec::new() };
    module.visit(&mut c);
    c.out
}

/// Write a module's float parameters to a safetensors file (f32), atomically (temp + rename).
pub fn save_safetensors<B: Backend, M: Module<B>>(module: &M, path: &Path) -> Result<(), WeightError> {
    let tensors = named_tensors::<B, M>(module);
    write_safetensors(&tensors, path)
}

/// Write named float tensors to a safetensors file as f32, atomically.
///
/// Other float dtypes (f16, bf16, f64) are converted to f32; an integer or bool tensor is a
/// [`WeightError::Dtype`] naming it (its bytes would otherwise be stored under an F32 header).
pub fn write_safetensors(tensors: &[(String, TensorData)], path: &Path) -> Result<(), WeightError> {
    let io = |source| WeightError::Write { path: path.to_path_buf(), source };
    let buf = safetensors_bytes(tensors, path)?;
    let tmp = path.with_extension("safetensors.tmp");
    std::fs::write(&tmp, buf).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The bytes [`write_safetensors`] would write (f32 tensors); `path` names the file in errors.
pub fn safetensors_bytes(tensors: &[(String, TensorData)], path: &Path) -> Result<Vec<u8>, WeightError> {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(k, d)| {
            let f32_bytes = match d.dtype {
                burn::tensor::DType::F32 => d.as_bytes().to_vec(),
                dt if dt.is_float() => d.clone().convert::<f32>().as_bytes().to_vec(),
                dt => {
                    return Err(WeightError::Dtype { path: path.to_path_buf(), key: k.clone(), dtype: format!("{dt:?}") });
                }
            };
            Ok((k.clone(), f32_bytes, d.shape.to_vec()))
        })
        .collect::<Result<_, WeightError>>()?;
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes
        .iter()
        .map(|(k, b, s)| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b)
                .map_err(|e| WeightError::Format { path: path.to_path_buf(), msg: e.to_string() })?;
            Ok((k.clone(), view))
        })
        .collect::<Result<_, WeightError>>()?;
    safetensors::serialize(views, None).map_err(|e| WeightError::Format { path: path.to_path_buf(), msg: e.to_string() })
}

/// All tensors of a safetensors file converted to f32 (float dtypes) — for inputs/outputs files.
pub fn read_safetensors(path: &Path) -> Result<BTreeMap<String, TensorData>, WeightError> {
    let bytes = std::fs::read(path).map_err(|source| WeightError::Io { path: path.to_path_buf(), source })?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| WeightError::Format { path: path.to_path_buf(), msg: e.to_string() })?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        out.insert(name.clone(), view_to_data(path, &name, &view)?);
    }
    Ok(out)
}

/// Convert a safetensors view to `TensorData`: floats become f32, integers i64, bools bool.
fn view_to_data(path: &Path, key: &str, view: &safetensors::tensor::TensorView<'_>) -> Result<TensorData, WeightError> {
    let shape = view.shape().to_vec();
    let b = view.data();
    let chunks = |n: usize| b.chunks_exact(n);
    let data = match view.dtype() {
        Dtype::F32 => TensorData::new(chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>(), shape),
        Dtype::F64 => TensorData::new(
            chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32).collect::<Vec<_>>(),
            shape,
        ),
        Dtype::F16 => TensorData::new(chunks(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect::<Vec<_>>(), shape),
        Dtype::BF16 => TensorData::new(chunks(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect::<Vec<_>>(), shape),
        Dtype::I64 => TensorData::new(
            chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect::<Vec<_>>(),
            shape,
        ),
        Dtype::I32 => TensorData::new(chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect::<Vec<_>>(), shape),
        Dtype::BOOL | Dtype::U8 => TensorData::new(b.iter().map(|&v| v != 0).collect::<Vec<_>>(), shape),
        other => {
            return Err(WeightError::Dtype { path: path.to_path_buf(), key: key.to_string(), dtype: format!("{other:?}") });
        }
    };
    Ok(data)
}

/// Load a module's float parameters from a safetensors file by name.
///
/// `rename` maps a file key to the module's name (return `None` to declare a file key as
/// knowingly unused, e.g. `num_batches_tracked`). Every parameter must be found with the
/// right shape and every remaining file key must be consumed, or an error lists them.
pub fn load_safetensors<B: Backend, M: Module<B>>(
    module: M,
    path: &Path,
    rename: impl Fn(&str) -> Option<String>,
) -> Result<M, WeightError> {
    let raw = read_safetensors(path)?;
    let mut map = BTreeMap::new();
    for (k, v) in raw {
        if let Some(name) = rename(&k) {
            map.insert(name, (k, v));
        }
    }
    load_named(module, map, path)
}

fn load_named<B: Backend, M: Module<B>>(
    module: M,
    mut map: BTreeMap<String, (String, TensorData)>,
    path: &Path,
) -> Result<M, WeightError> {
    struct Loader {
        path: PathStack,
        map: BTreeMap<String, (String, TensorData)>,
        missing: Vec<String>,
        error: Option<WeightError>,
        file: PathBuf,
        used: BTreeSet<String>,
    }
    impl<B: Backend> ModuleMapper<B> for Loader {
        fn enter_module(&mut self, name: &str, container: &str) {
            self.path.enter(name, container);
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.exit();
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let key = self.path.current();
            let Some((file_key, data)) = self.map.remove(&key) else {
                self.missing.push(key);
                return param;
            };
            self.used.insert(file_key.clone());
            let expected = param.shape().dims::<D>().to_vec();
            if data.shape.to_vec() != expected {
                if self.error.is_none() {
                    self.error = Some(WeightError::Shape {
                        path: self.file.clone(),
                        key: file_key,
                        expected,
                        found: data.shape.to_vec(),
                    });
                }
                return param;
            }
            if let Err(e) = check_finite(&self.file, &file_key, &data) {
                self.error.get_or_insert(e);
                return param;
            }
            let require_grad = param.is_require_grad();
            let (id, tensor, mapper) = param.consume();
            let device = tensor.device();
            let value = Tensor::<B, D>::from_data(data.convert::<f32>(), &device);
            let value = if require_grad { value.require_grad() } else { value };
            let _: ParamId = id;
            Param::from_mapped_value(id, value, mapper)
        }
    }
    let mut loader = Loader {
        path: PathStack::default(),
        map: std::mem::take(&mut map),
        missing: Vec::new(),
        error: None,
        file: path.to_path_buf(),
        used: BTreeSet::new(),
    };
    let module = module.map(&mut loader);
    if let Some(e) = loader.error {
        return Err(e);
    }
    if !loader.missing.is_empty() {
        return Err(WeightError::Missing { path: path.to_path_buf(), missing: loader.missing });
    }
    if !loader.map.is_empty() {
        let unused = loader.map.into_values().map(|(k, _)| k).collect();
        return Err(WeightError::Unused { path: path.to_path_buf(), unused });
    }
    Ok(module)
}
