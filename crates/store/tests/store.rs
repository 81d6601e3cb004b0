//! Safetensors I/O by module path: names (fields, `Vec` indices, enum variants left out),
//! save/load round trips, the dtypes read and written, and the errors that name the tensor
//! and the file.

use std::collections::BTreeMap;
use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use vramlab_store::{
    WeightError, load_safetensors, named_tensors, param_shapes, read_safetensors, save_safetensors, write_safetensors,
};
use vramlab_testkit::temp_dir;

type B = Flex;

/// Like a PyTorch `ModuleList` of mixed layers: the variant name is not part of the path.
#[derive(Module, Debug)]
enum Layer<B: Backend> {
    Lin(Linear<B>),
    Norm(LayerNorm<B>),
}

#[derive(Module, Debug)]
struct Net<B: Backend> {
    embed: Linear<B>,
    blocks: Vec<Layer<B>>,
    head: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            embed: LinearConfig::new(3, 4).init(device),
            blocks: vec![
                Layer::Lin(LinearConfig::new(4, 4).with_bias(false).init(device)),
                Layer::Norm(LayerNormConfig::new(4).init(device)),
            ],
            head: LinearConfig::new(4, 2).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let mut h = self.embed.forward(x);
        for b in &self.blocks {
            h = match b {
                Layer::Lin(l) => l.forward(h),
                Layer::Norm(n) => n.forward(h),
            };
        }
        self.head.forward(h)
    }
}

/// The state-dict names and shapes of [`Net`] (burn's `Linear` weight is `[d_in, d_out]`).
const NAMES: [(&str, &[usize]); 7] = [
    ("embed.weight", &[3, 4]),
    ("embed.bias", &[4]),
    ("blocks.0.weight", &[4, 4]),
    ("blocks.1.gamma", &[4]),
    ("blocks.1.beta", &[4]),
    ("head.weight", &[4, 2]),
    ("head.bias", &[2]),
];

fn values(d: &TensorData) -> Vec<f32> {
    d.clone().convert::<f32>().to_vec::<f32>().unwrap()
}

/// Named parameter values of a module, as a map.
fn params<B: Backend, M: Module<B>>(m: &M) -> BTreeMap<String, Vec<f32>> {
    named_tensors::<B, M>(m).into_iter().map(|(k, d)| (k, values(&d))).collect()
}

/// A plain safetensors file written with the `safetensors` crate: `(name, dtype, shape, bytes)`.
fn write_raw(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(k, dt, shape, b)| (k.to_string(), TensorView::new(*dt, shape.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `Net`'s tensors with value `i + 0.25 * j` at element `j` of tensor `i`, as f32 files hold them.
fn net_tensors() -> Vec<(String, Vec<usize>, Vec<f32>)> {
    NAMES
        .iter()
        .enumerate()
        .map(|(i, (k, shape))| {
            let n: usize = shape.iter().product();
            (k.to_string(), shape.to_vec(), (0..n).map(|j| i as f32 + 0.25 * j as f32).collect())
        })
        .collect()
}

fn err_text<T: std::fmt::Debug>(r: Result<T, WeightError>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn names_follow_the_module_path_without_enum_variants() {
    let dev = Default::default();
    let net = Net::<B>::new(&dev);
    let got = param_shapes::<B, _>(&net);
    let want: Vec<(String, Vec<usize>)> = NAMES.iter().map(|(k, s)| (k.to_string(), s.to_vec())).collect();
    assert_eq!(got, want);
    let named: Vec<String> = named_tensors::<B, _>(&net).into_iter().map(|(k, _)| k).collect();
    assert_eq!(named, want.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>());
}

#[test]
fn save_then_load_round_trips_exactly() {
    let tmp = temp_dir("roundtrip");
    let path = tmp.path().join("model.safetensors");
    let dev = Default::default();
    let a = Net::<B>::new(&dev);
    let b = Net::<B>::new(&dev);
    assert_ne!(params::<B, _>(&a), params::<B, _>(&b), "two random inits should differ");

    save_safetensors::<B, _>(&a, &path).unwrap();
    assert!(!tmp.path().join("model.safetensors.tmp").exists(), "the temporary file must be renamed away");
    let b = load_safetensors(b, &path, |k| Some(k.to_string())).unwrap();
    assert_eq!(params::<B, _>(&b), params::<B, _>(&a));

    let x = Tensor::<B, 2>::from_data(TensorData::new((0..6).map(|v| v as f32 * 0.3 - 1.0).collect::<Vec<_>>(), [2, 3]), &dev);
    let (ya, yb) = (a.forward(x.clone()).into_data(), b.forward(x).into_data());
    assert_eq!(values(&ya), values(&yb));

    // Saving again over an existing file replaces it.
    let c = Net::<B>::new(&dev);
    save_safetensors::<B, _>(&c, &path).unwrap();
    let b = load_safetensors(b, &path, |k| Some(k.to_string())).unwrap();
    assert_eq!(params::<B, _>(&b), params::<B, _>(&c));
}

#[test]
fn saved_file_is_plain_f32_safetensors() {
    let tmp = temp_dir("plain");
    let path = tmp.path().join("w.safetensors");
    let net = Net::<B>::new(&Default::default());
    save_safetensors::<B, _>(&net, &path).unwrap();

    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(|k| k.to_string()).collect();
    names.sort();
    let mut want: Vec<String> = NAMES.iter().map(|(k, _)| k.to_string()).collect();
    want.sort();
    assert_eq!(names, want);
    let expected = params::<B, _>(&net);
    for (k, shape) in NAMES {
        let view = st.tensor(k).unwrap();
        assert_eq!(view.dtype(), Dtype::F32, "{k}");
        assert_eq!(view.shape(), shape, "{k}");
        let v: Vec<f32> = view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert_eq!(&v, &expected[k], "{k}");
    }
}

#[test]
fn loads_a_reference_file_with_renamed_and_ignored_keys() {
    let tmp = temp_dir("rename");
    let path = tmp.path().join("ref.safetensors");
    let tensors = net_tensors();
    // A PyTorch-style file: a `model.` prefix and a buffer the module does not have.
    let mut raw: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> =
        tensors.iter().map(|(k, s, v)| (format!("model.{k}"), Dtype::F32, s.clone(), f32_bytes(v))).collect();
    raw.push(("model.blocks.1.num_batches_tracked".into(), Dtype::I64, vec![], 7i64.to_le_bytes().to_vec()));
    let raw_ref: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> =
        raw.iter().map(|(k, d, s, b)| (k.as_str(), *d, s.clone(), b.clone())).collect();
    write_raw(&path, &raw_ref);

    let rename = |k: &str| (!k.ends_with("num_batches_tracked")).then(|| k.strip_prefix("model.").unwrap_or(k).to_string());
    let net = load_safetensors(Net::<B>::new(&Default::default()), &path, rename).unwrap();
    let got = params::<B, _>(&net);
    for (k, _, v) in &tensors {
        assert_eq!(&got[k], v, "{k}");
    }

    // Without the rename nothing matches: every module weight is missing.
    let e = err_text(load_safetensors(Net::<B>::new(&Default::default()), &path, |k| Some(k.to_string())));
    assert!(e.contains("ref.safetensors") && e.contains("7 weight(s) the model needs are missing"), "{e}");
    assert!(e.contains("embed.weight") && e.contains("head.bias"), "{e}");
}

#[test]
fn half_and_double_files_load_as_f32() {
    let tmp = temp_dir("dtypes");
    let tensors = net_tensors(); // every value is a multiple of 0.25 below 64: exact in f16 and bf16
    type Encode = fn(f32) -> Vec<u8>;
    let encodings: [(Dtype, Encode); 3] = [
        (Dtype::F16, |v| half::f16::from_f32(v).to_le_bytes().to_vec()),
        (Dtype::BF16, |v| half::bf16::from_f32(v).to_le_bytes().to_vec()),
        (Dtype::F64, |v| f64::from(v).to_le_bytes().to_vec()),
    ];
    for (dtype, encode) in encodings {
        let path = tmp.path().join(format!("{dtype:?}.safetensors"));
        let raw: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> =
            tensors.iter().map(|(k, s, v)| (k.as_str(), dtype, s.clone(), v.iter().flat_map(|&x| encode(x)).collect())).collect();
        write_raw(&path, &raw);

        let read = read_safetensors(&path).unwrap();
        for (k, _, v) in &tensors {
            assert_eq!(read[k].dtype, DType::F32, "{dtype:?} {k}");
            assert_eq!(&values(&read[k]), v, "{dtype:?} {k}");
        }
        let net = load_safetensors(Net::<B>::new(&Default::default()), &path, |k| Some(k.to_string())).unwrap();
        let got = params::<B, _>(&net);
        for (k, _, v) in &tensors {
            assert_eq!(&got[k], v, "{dtype:?} {k}");
        }
    }
}

#[test]
fn plain_files_keep_integers_and_bools() {
    let tmp = temp_dir("ints");
    let path = tmp.path().join("inputs.safetensors");
    write_raw(
        &path,
        &[
            ("x", Dtype::F32, vec![2, 2], f32_bytes(&[1.0, -2.5, 3.0, 0.125])),
            ("t", Dtype::I64, vec![3], [-1i64, 0, 1 << 40].iter().flat_map(|v| v.to_le_bytes()).collect()),
            ("i", Dtype::I32, vec![2], [-7i32, 9].iter().flat_map(|v| v.to_le_bytes()).collect()),
            ("mask", Dtype::BOOL, vec![3], vec![1, 0, 1]),
            ("u", Dtype::U8, vec![2], vec![0, 200]),
        ],
    );
    let read = read_safetensors(&path).unwrap();
    assert_eq!(read.keys().map(String::as_str).collect::<Vec<_>>(), ["i", "mask", "t", "u", "x"]);
    assert_eq!(read["x"].shape.to_vec(), vec![2, 2]);
    assert_eq!(values(&read["x"]), vec![1.0, -2.5, 3.0, 0.125]);
    assert_eq!(read["t"].dtype, DType::I64);
    assert_eq!(read["t"].to_vec::<i64>().unwrap(), vec![-1, 0, 1 << 40]);
    assert_eq!(read["i"].dtype, DType::I64);
    assert_eq!(read["i"].to_vec::<i64>().unwrap(), vec![-7, 9]);
    assert_eq!(read["mask"].to_vec::<bool>().unwrap(), vec![true, false, true]);
    assert_eq!(read["u"].to_vec::<bool>().unwrap(), vec![false, true]);

    // What `write_safetensors` writes, `read_safetensors` gives back (as f32).
    let out = tmp.path().join("out.safetensors");
    let list = vec![
        ("a".to_string(), TensorData::new(vec![1.5f32, 2.0, -3.0], [3])),
        ("b.c".to_string(), TensorData::new(vec![0.5f64, 4.0], [1, 2])),
        ("h".to_string(), TensorData::new(vec![half::f16::from_f32(0.75)], [1])),
    ];
    write_safetensors(&list, &out).unwrap();
    let back = read_safetensors(&out).unwrap();
    assert_eq!(back.len(), 3);
    assert_eq!(values(&back["a"]), vec![1.5, 2.0, -3.0]);
    assert_eq!(back["b.c"].shape.to_vec(), vec![1, 2]);
    assert_eq!(values(&back["b.c"]), vec![0.5, 4.0]);
    assert_eq!(values(&back["h"]), vec![0.75]);
    let st_bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st_bytes).unwrap();
    assert!(st.tensors().iter().all(|(_, v)| v.dtype() == Dtype::F32));
}

#[test]
fn integer_tensors_are_not_written_as_f32() {
    let tmp = temp_dir("write-int");
    let out = tmp.path().join("bad.safetensors");
    let list = vec![
        ("ok".to_string(), TensorData::new(vec![1.0f32], [1])),
        ("steps".to_string(), TensorData::new(vec![3i32, 4], [2])),
    ];
    let e = err_text(write_safetensors(&list, &out));
    assert!(e.contains("bad.safetensors") && e.contains("`steps`") && e.contains("I32"), "{e}");
    assert!(!out.exists());
}

#[test]
fn unsupported_dtype_names_the_tensor_and_file() {
    let tmp = temp_dir("u16");
    let path = tmp.path().join("odd.safetensors");
    write_raw(&path, &[("ok", Dtype::F32, vec![1], f32_bytes(&[1.0])), ("ids", Dtype::U16, vec![2], vec![1, 0, 2, 0])]);
    let e = err_text(read_safetensors(&path));
    assert!(e.contains("odd.safetensors") && e.contains("tensor `ids`") && e.contains("unsupported dtype U16"), "{e}");
}

#[test]
fn missing_extra_and_misshapen_tensors_are_errors() {
    let tmp = temp_dir("errors");
    let tensors = net_tensors();
    let write = |name: &str, list: &[(String, Vec<usize>, Vec<f32>)]| {
        let path = tmp.path().join(name);
        let raw: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> =
            list.iter().map(|(k, s, v)| (k.as_str(), Dtype::F32, s.clone(), f32_bytes(v))).collect();
        write_raw(&path, &raw);
        path
    };
    let load = |path: &Path| load_safetensors(Net::<B>::new(&Default::default()), path, |k| Some(k.to_string()));

    // Missing: the error names the file and each missing weight.
    let without: Vec<_> = tensors.iter().filter(|(k, _, _)| k != "blocks.1.gamma").cloned().collect();
    let e = err_text(load(&write("missing.safetensors", &without)));
    assert!(e.contains("missing.safetensors") && e.contains("1 weight(s) the model needs are missing: blocks.1.gamma"), "{e}");

    // Extra: a tensor the model does not use.
    let mut extra = tensors.clone();
    extra.push(("blocks.2.weight".into(), vec![4, 4], vec![0.0; 16]));
    let e = err_text(load(&write("extra.safetensors", &extra)));
    assert!(e.contains("extra.safetensors") && e.contains("1 weight(s) in the file are not used by the model: blocks.2.weight"), "{e}");

    // Mis-shaped: transposed head weight (PyTorch's [out, in] layout).
    let mut transposed = tensors.clone();
    transposed[5].1 = vec![2, 4];
    let e = err_text(load(&write("shape.safetensors", &transposed)));
    assert!(e.contains("shape.safetensors") && e.contains("tensor `head.weight` has shape [2, 4], the model expects [4, 2]"), "{e}");

    // Same element count but another rank is just as wrong.
    let mut flat = tensors.clone();
    flat[2].1 = vec![16];
    let e = err_text(load(&write("rank.safetensors", &flat)));
    assert!(e.contains("tensor `blocks.0.weight` has shape [16], the model expects [4, 4]"), "{e}");

    // An empty file lists the first 8 missing names and counts the rest.
    #[derive(Module, Debug)]
    struct Wide<B: Backend> {
        layers: Vec<Linear<B>>,
    }
    let wide = Wide::<B> { layers: (0..6).map(|_| LinearConfig::new(2, 2).init(&Default::default())).collect() };
    let e = err_text(load_safetensors(wide, &write("empty.safetensors", &[]), |k| Some(k.to_string())));
    assert!(e.contains("12 weight(s) the model needs are missing") && e.contains("… (4 more)"), "{e}");
    assert!(e.contains("layers.0.weight") && !e.contains("layers.5.bias"), "{e}");
}

#[test]
fn unreadable_files_name_the_path() {
    let tmp = temp_dir("io");
    let absent = tmp.path().join("absent.safetensors");
    let e = err_text(read_safetensors(&absent));
    assert!(e.contains("absent.safetensors") && e.contains("cannot read"), "{e}");
    let e = err_text(load_safetensors(Net::<B>::new(&Default::default()), &absent, |k| Some(k.to_string())));
    assert!(e.contains("absent.safetensors"), "{e}");

    let garbage = tmp.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot json").unwrap();
    let e = err_text(read_safetensors(&garbage));
    assert!(e.contains("garbage.safetensors") && e.contains("not a valid safetensors file"), "{e}");

    let e = err_text(write_safetensors(&[("a".into(), TensorData::new(vec![1.0f32], [1]))], &tmp.path().join("no/such/dir/w.safetensors")));
    assert!(e.contains("w.safetensors") && e.contains("cannot write"), "{e}");
}

#[test]
fn loading_keeps_trainable_and_frozen_parameters_as_they_were() {
    type A = Autodiff<Flex>;
    let tmp = temp_dir("grad");
    let path = tmp.path().join("w.safetensors");
    let dev = Default::default();
    let mut net = Net::<A>::new(&dev);
    // Freeze the head's bias.
    let bias = net.head.bias.take().unwrap();
    net.head.bias = Some(Param::from_tensor(bias.val()).set_require_grad(false));
    save_safetensors::<A, _>(&Net::<A>::new(&dev), &path).unwrap();

    let net = load_safetensors(net, &path, |k| Some(k.to_string())).unwrap();
    assert!(net.embed.weight.is_require_grad());
    assert!(net.head.weight.is_require_grad());
    assert!(!net.head.bias.as_ref().unwrap().is_require_grad());
    // The loaded values take part in autodiff: a backward pass reaches the embedding.
    let x = Tensor::<A, 2>::ones([1, 3], &dev);
    let grads = net.forward(x).sum().backward();
    assert!(net.embed.weight.val().grad(&grads).is_some());
    assert!(net.head.bias.as_ref().unwrap().val().grad(&grads).is_none());
}

#[test]
fn non_finite_weights_are_refused_naming_the_tensor_and_the_file() {
    let tmp = temp_dir("nonfinite");
    let path = tmp.path().join("model.safetensors");
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let tensors: Vec<(String, TensorData)> = net_tensors()
            .into_iter()
            .map(|(k, shape, mut v)| {
                if k == "blocks.1.gamma" {
                    v[2] = bad;
                }
                (k, TensorData::new(v, shape))
            })
            .collect();
        write_safetensors(&tensors, &path).unwrap();
        let e = err_text(load_safetensors(Net::<B>::new(&Default::default()), &path, |k| Some(k.to_string())));
        assert!(e.contains("model.safetensors") && e.contains("`blocks.1.gamma`") && e.contains("1 non-finite value(s)") && e.contains("of 4"), "{bad}: {e}");
        let e = err_text(vramlab_store::check_finite_file(&path));
        assert!(e.contains("`blocks.1.gamma`"), "{e}");
    }
    // Finite weights pass both.
    let tensors: Vec<(String, TensorData)> = net_tensors().into_iter().map(|(k, s, v)| (k, TensorData::new(v, s))).collect();
    write_safetensors(&tensors, &path).unwrap();
    vramlab_store::check_finite_file(&path).unwrap();
    load_safetensors(Net::<B>::new(&Default::default()), &path, |k| Some(k.to_string())).unwrap();
}
