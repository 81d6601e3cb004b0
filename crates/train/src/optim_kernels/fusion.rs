//! [`OptimKernels`] on `Fusion<CubeBackend>` (Burn's fusion on): `cube`'s squared-norm and
//! Adam(W) kernels as custom operations of the fusion stream (`OperationIr::Custom`), with the
//! same fallbacks to the tensor versions (another dtype, `VRAMLAB_COMPOSED_KERNELS=1`).
//!
//! Registering an operation hands out its outputs at once; the stream runs it in order, after
//! everything queued before it, taking each input's `CubeTensor` from the stream's handles:
//! moved out when no other fusion tensor holds it (status `ReadWrite`), cloned otherwise
//! (`ReadOnly`). So `cube`'s in-place test (`CubeTensor::can_mut`: no other holder of the
//! buffer) sees a parameter or moment that the caller still shares — a clone, or the tensor a
//! reshape came from — as shared, and writes new buffers (tested in `cube_tests`).
//! `vramlab-models`' `nn/cube/fusion.rs` registers the lean nodes' kernels the same way (the
//! trainer does not depend on the models crate).

use std::marker::PhantomData;

use burn::backend::ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use burn::tensor::backend::{Backend, BackendTypes};
use burn::tensor::{DType, Shape, Tensor as BurnTensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};

use super::cube::{self, adam_update_f32, composed, kernel_takes, sq_sum_group};
use super::{AdamUpdate, OptimKernels, SqAcc, adam_update_tensors, sq_sum_tensors};

type Inner<R, F, I, BT> = CubeBackend<R, F, I, BT>;
type Runtime<R, F, I, BT> = <Inner<R, F, I, BT> as FusionBackend>::FusionRuntime;

/// One kernel call in the fusion stream: its inputs and outputs (`desc`) and the kernel.
struct KernelOp<B, K, const NI: usize, const O: usize> {
    desc: CustomOpIr,
    kernel: K,
    _backend: PhantomData<fn() -> B>,
}

impl<B, K, const NI: usize, const O: usize> std::fmt::Debug for KernelOp<B, K, NI, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KernelOp({})", self.desc.id)
    }
}

impl<R, F, I, BT, K, const NI: usize, const O: usize> Operation<Runtime<R, F, I, BT>> for KernelOp<Inner<R, F, I, BT>, K, NI, O>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
    K: Fn([CubeTensor<R>; NI]) -> [CubeTensor<R>; O] + Send + Sync,
{
    fn execute(&self, handles: &mut HandleContainer<<Runtime<R, F, I, BT> as FusionRuntime>::FusionHandle>) {
        let (ins, outs) = self.desc.as_fixed::<NI, O>();
        let inputs = ins.each_ref().map(|t| handles.get_float_tensor::<Inner<R, F, I, BT>>(t));
        for (t, ir) in (self.kernel)(inputs).into_iter().zip(outs) {
            let dims = t.meta.shape().to_vec();
            assert!(dims == ir.shape.to_vec() && t.dtype == ir.dtype, "{}: the kernel returned {dims:?} {:?}, declared {:?} {:?}", self.desc.id, t.dtype, ir.shape, ir.dtype);
            handles.register_float_tensor::<Inner<R, F, I, BT>>(&ir.id, t);
        }
    }
}

/// Registers `kernel` on `inputs` with outputs of the declared dims and dtypes.
fn register<R, F, I, BT, const NI: usize, const O: usize>(name: &'static str, inputs: [FusionTensor<Runtime<R, F, I, BT>>; NI], outputs: [(Vec<usize>, DType); O], kernel: impl Fn([CubeTensor<R>; NI]) -> [CubeTensor<R>; O] + Send + Sync + 'static) -> [FusionTensor<Runtime<R, F, I, BT>>; O]
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    // Each input's status (read-only or moved) is taken here, in order.
    let ins: Vec<TensorIr> = inputs.into_iter().map(FusionTensor::into_ir).collect();
    let outs: Vec<TensorIr> = outputs.into_iter().map(|(dims, dtype)| TensorIr::uninit(client.create_empty_handle(), Shape::from(dims), dtype)).collect();
    let desc = CustomOpIr::new(name, &ins, &outs);
    let op = KernelOp::<Inner<R, F, I, BT>, _, NI, O> { desc: desc.clone(), kernel, _backend: PhantomData };
    client.register(streams, OperationIr::Custom(desc), op).try_into().unwrap_or_else(|v: Vec<_>| panic!("{name}: {} outputs registered, {O} declared", v.len()))
}

type Float<B> = <B as BackendTypes>::FloatTensorPrimitive;

fn prim<B: Backend, const D: usize>(t: BurnTensor<B, D>) -> Float<B> {
    t.into_primitive().tensor()
}

fn tensor<B: Backend, const D: usize>(t: Float<B>) -> BurnTensor<B, D> {
    BurnTensor::from_primitive(TensorPrimitive::Float(t))
}

/// `CubeBackend`'s 1-D tensor of a `CubeTensor` and back: `cube::adam_update_f32` takes tensors.
fn cube_tensor<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(t: CubeTensor<R>) -> BurnTensor<Inner<R, F, I, BT>, 1> {
    BurnTensor::from_primitive(TensorPrimitive::Float(t))
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> OptimKernels for Fusion<Inner<R, F, I, BT>> {
    // One custom operation per parameter (the fusion stream holds no group of them).
    type Later = ();

    fn grad_sq_sum<const D: usize>(g: BurnTensor<Self, D>, acc: &mut SqAcc<Self>) -> BurnTensor<Self, D> {
        let n = g.shape().num_elements();
        if g.dtype() != DType::F32 || n == 0 || n > u32::MAX as usize || composed() {
            return sq_sum_tensors(g, acc);
        }
        let dims = g.dims().to_vec();
        let slots = vec![cube::SQ_SLOTS];
        // The gradient comes back contiguous (as without fusion), the partial sums updated.
        let kernel = |g: CubeTensor<R>, partials: Option<CubeTensor<R>>| {
            let g = burn_cubecl::kernel::into_contiguous(g);
            // The sums are the accumulator's alone (`SqAcc` is not `Clone`); copied if not.
            let mut partials = partials.map(|p| if p.can_mut() { p } else { p.copy() });
            sq_sum_group(vec![g.clone()], &mut partials);
            [g, partials.expect("sq_sum_group allocates the partial sums")]
        };
        let outs = [(dims, DType::F32), (slots, DType::F32)];
        let [g, partials] = match acc.partials.take() {
            None => register::<R, F, I, BT, 1, 2>("vramlab.grad_sq_sum", [prim(g)], outs, move |[g]| kernel(g, None)),
            Some(p) => register::<R, F, I, BT, 2, 2>("vramlab.grad_sq_sum_add", [prim(g), prim(p)], outs, move |[g, p]| kernel(g, Some(p))),
        };
        acc.partials = Some(tensor(partials));
        tensor(g)
    }

    fn adam_update<const D: usize>(p: BurnTensor<Self, D>, g: BurnTensor<Self, D>, moments: Option<(BurnTensor<Self, 1>, BurnTensor<Self, 1>)>, h: &AdamUpdate) -> (BurnTensor<Self, D>, BurnTensor<Self, 1>, BurnTensor<Self, 1>) {
        let shape = p.shape();
        let n = shape.num_elements();
        let takes = kernel_takes(&p, &g, &moments);
        let (p, g) = (p.reshape([n]), g.reshape([n]));
        if !takes {
            let (p, m, v) = adam_update_tensors(p, g, moments, h);
            return (p.reshape(shape), m, v);
        }
        let h = *h;
        let outs = || [(vec![n], DType::F32), (vec![n], DType::F32), (vec![n], DType::F32)];
        let run = move |p: CubeTensor<R>, g: CubeTensor<R>, moments: Option<(CubeTensor<R>, CubeTensor<R>)>| {
            let (p, m, v) = adam_update_f32::<R, F, I, BT>(cube_tensor(p), g, moments.map(|(m, v)| (cube_tensor(m), cube_tensor(v))), &h);
            [p, m, v].map(|t| t.into_primitive().tensor())
        };
        let [p, m, v] = match moments {
            None => register::<R, F, I, BT, 2, 3>("vramlab.adam_first", [prim(p), prim(g)], outs(), move |[p, g]| run(p, g, None)),
            Some((m, v)) => register::<R, F, I, BT, 4, 3>("vramlab.adam", [prim(p), prim(g), prim(m), prim(v)], outs(), move |[p, g, m, v]| run(p, g, Some((m, v)))),
        };
        (tensor::<Self, 1>(p).reshape(shape), tensor(m), tensor(v))
    }
}
