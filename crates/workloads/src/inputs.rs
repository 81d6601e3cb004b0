//! User tensors for `vramlab predict`, checked against the checkpoint's config before anything
//! runs: every tensor the model needs is present, is a float tensor, and has the rank and sizes
//! the config implies (a 3-channel input for a 4-channel VAE is an error naming the file, the
//! tensor and the expected shape, not a panic inside a convolution).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn::tensor::DType;

use crate::{Result, WorkloadError};

/// One expected size: a fixed number, or any size shared under a name (the batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    Is(usize),
    /// Any size ≥ 1, the same wherever the same name appears.
    Any(&'static str),
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Is(n) => write!(f, "{n}"),
            Dim::Any(name) => f.write_str(name),
        }
    }
}

fn shape_text(dims: &[Dim]) -> String {
    format!("[{}]", dims.iter().map(Dim::to_string).collect::<Vec<_>>().join(", "))
}

/// The tensors of an inputs file, with the sizes bound so far (`B` = batch).
pub struct Inputs {
    path: PathBuf,
    map: BTreeMap<String, TensorData>,
    bound: BTreeMap<&'static str, usize>,
}

impl Inputs {
    /// The tensors of `path`; a float tensor holding a NaN or an infinity is an error naming it
    /// (a model would only turn it into non-finite outputs).
    pub fn read(path: &Path) -> Result<Self> {
        let map = vramlab_store::read_safetensors(path)?;
        for (name, data) in &map {
            let count = vramlab_store::non_finite_count(data);
            if count > 0 {
                let all = if count == data.num_elements() { "all " } else { "" };
                let msg = format!("tensor `{name}` has {all}{count} of {} values non-finite (NaN or ±inf); predict needs finite inputs", data.num_elements());
                return Err(WorkloadError::file(path, msg));
            }
        }
        Ok(Self { path: path.to_path_buf(), map, bound: BTreeMap::new() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    fn err(&self, msg: String) -> WorkloadError {
        WorkloadError::file(&self.path, msg)
    }

    /// Normalise every input the preprocessor knows, in place (lerobot's `normalizer_processor`):
    /// cameras per channel over their last two axes, vectors over their last axis.
    pub fn normalize(&mut self, p: &crate::processors::Processors) -> Result<()> {
        let path = self.path.clone();
        for (name, data) in self.map.iter_mut() {
            if p.normalize.mode(name) == vramlab_lerobot::NormMode::Identity || !data.dtype.is_float() {
                continue;
            }
            let shape = data.shape.to_vec();
            let mut v = data.clone().convert::<f32>().to_vec::<f32>().map_err(|e| WorkloadError::file(&path, format!("tensor `{name}`: {e:?}")))?;
            let done = if p.cameras.contains(name) {
                let plane = shape.iter().rev().take(2).product();
                p.normalize.normalize_image(name, &mut v, plane)
            } else {
                p.normalize.normalize(name, &mut v)
            };
            done.map_err(|e| WorkloadError::file(&path, format!("tensor `{name}` {shape:?}: {e}")))?;
            *data = TensorData::new(v, shape);
        }
        Ok(())
    }

    /// Check tensor `name` against `dims` (binding named sizes) and return its data.
    fn checked(&mut self, name: &str, dims: &[Dim], want_float: bool) -> Result<TensorData> {
        let data = self.map.get(name).ok_or_else(|| {
            self.err(format!("tensor `{name}` is missing (present: {}); expected shape {}", self.map.keys().cloned().collect::<Vec<_>>().join(", "), shape_text(dims)))
        })?;
        if want_float && !matches!(data.dtype, DType::F64 | DType::F32 | DType::F16 | DType::BF16) {
            return Err(self.err(format!("tensor `{name}` has dtype {:?}; expected a float tensor", data.dtype)));
        }
        let shape = data.shape.clone();
        let mismatch = || self.err(format!("tensor `{name}` has shape {shape:?}; expected {} ({})", shape_text(dims), self.bound_text()));
        if shape.len() != dims.len() {
            return Err(mismatch());
        }
        let mut bound = self.bound.clone();
        for (&size, dim) in shape.iter().zip(dims) {
            let ok = match dim {
                Dim::Is(n) => size == *n,
                Dim::Any(k) => size >= 1 && *bound.entry(k).or_insert(size) == size,
            };
            if !ok {
                return Err(mismatch());
            }
        }
        self.bound = bound;
        Ok(data.clone())
    }

    fn bound_text(&self) -> String {
        if self.bound.is_empty() {
            return "from the checkpoint's config".into();
        }
        let b: Vec<String> = self.bound.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        format!("from the checkpoint's config, with {}", b.join(", "))
    }

    /// Float tensor `name` of shape `dims`.
    pub fn float<B: Backend, const D: usize>(&mut self, name: &str, dims: [Dim; D], device: &B::Device) -> Result<Tensor<B, D>> {
        let data = self.checked(name, &dims, true)?;
        Ok(Tensor::from_data(data.convert::<f32>(), device))
    }

    /// Optional float tensor (checked when present).
    pub fn float_opt<B: Backend, const D: usize>(&mut self, name: &str, dims: [Dim; D], device: &B::Device) -> Result<Option<Tensor<B, D>>> {
        if self.contains(name) { self.float(name, dims, device).map(Some) } else { Ok(None) }
    }

    /// Boolean mask `name` (stored as bool or integers) of shape `dims`, when present.
    pub fn mask_opt<B: Backend, const D: usize>(&mut self, name: &str, dims: [Dim; D], device: &B::Device) -> Result<Option<Tensor<B, D, Bool>>> {
        if !self.contains(name) {
            return Ok(None);
        }
        let data = self.checked(name, &dims, false)?;
        let shape = data.shape.clone();
        let values: Vec<bool> = match data.dtype {
            DType::Bool(_) => data.to_vec::<bool>().map_err(|e| self.err(format!("tensor `{name}`: {e:?}")))?,
            _ => data.convert::<f32>().to_vec::<f32>().map_err(|e| self.err(format!("tensor `{name}`: {e:?}")))?.into_iter().map(|v| v != 0.0).collect(),
        };
        Ok(Some(Tensor::from_data(TensorData::new(values, shape), device)))
    }

    /// Integer vector `name` of shape `dims` (e.g. diffusion timesteps), each in `0..limit`.
    pub fn indices(&mut self, name: &str, dims: [Dim; 1], limit: usize) -> Result<Vec<usize>> {
        let data = self.checked(name, &dims, false)?;
        let v = data.convert::<i64>().to_vec::<i64>().map_err(|e| self.err(format!("tensor `{name}`: {e:?}")))?;
        v.into_iter()
            .map(|t| usize::try_from(t).ok().filter(|t| *t < limit).ok_or_else(|| self.err(format!("tensor `{name}`: value {t} is outside 0..{limit}"))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;

    /// An inputs file with f32 `x` [2, 3, 4] and i64 `t` = [1, 7], in their own dtypes.
    fn file() -> (vramlab_testkit::TempDir, PathBuf) {
        use safetensors::{Dtype, tensor::TensorView};
        let dir = vramlab_testkit::temp_dir("inputs");
        let path = dir.path().join("inputs.safetensors");
        let x: Vec<u8> = (0..24).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let t: Vec<u8> = [1i64, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
        let views = vec![("x", TensorView::new(Dtype::F32, vec![2, 3, 4], &x).unwrap()), ("t", TensorView::new(Dtype::I64, vec![2], &t).unwrap())];
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
        (dir, path)
    }

    #[test]
    fn shapes_dtypes_and_names_are_checked_before_use() {
        let (_dir, path) = file();
        let dev = Default::default();
        let mut inputs = Inputs::read(&path).unwrap();
        let ok = inputs.float::<Flex, 3>("x", [Dim::Any("B"), Dim::Is(3), Dim::Is(4)], &dev);
        assert!(ok.is_ok());
        // The batch is bound to 2 by now.
        let err = inputs.indices("t", [Dim::Any("B")], 5).unwrap_err().to_string();
        assert!(err.contains("value 7") && err.contains("0..5"), "{err}");
        let err = inputs.float::<Flex, 3>("x", [Dim::Any("B"), Dim::Is(4), Dim::Is(4)], &dev).unwrap_err().to_string();
        assert!(err.contains("inputs.safetensors") && err.contains("[2, 3, 4]") && err.contains("[B, 4, 4]") && err.contains("B = 2"), "{err}");
        let err = inputs.float::<Flex, 2>("y", [Dim::Any("B"), Dim::Is(4)], &dev).unwrap_err().to_string();
        assert!(err.contains("`y` is missing") && err.contains("present: t, x"), "{err}");
        let err = inputs.float::<Flex, 1>("t", [Dim::Any("B")], &dev).unwrap_err().to_string();
        assert!(err.contains("dtype") && err.contains("float"), "{err}");
    }

    #[test]
    fn non_finite_inputs_are_refused_naming_the_tensor() {
        let dir = vramlab_testkit::temp_dir("inputs");
        let path = dir.path().join("inputs.safetensors");
        for (values, needle) in [(vec![f32::NAN; 4], "all 4 of 4"), (vec![1.0, f32::INFINITY, 0.0, 2.0], "1 of 4"), (vec![f32::NEG_INFINITY; 4], "all 4 of 4")] {
            vramlab_store::write_safetensors(&[("ok".into(), TensorData::new(vec![0.5f32; 2], [2])), ("x".into(), TensorData::new(values, [2, 2]))], &path).unwrap();
            let err = Inputs::read(&path).err().expect("non-finite inputs").to_string();
            assert!(err.contains("inputs.safetensors") && err.contains("tensor `x`") && err.contains(needle) && err.contains("non-finite"), "{err}");
        }
    }
}
