//! [`CubeLaunch`] on `Fusion<CubeBackend>` (Burn's fusion on): a kernel becomes a custom
//! operation of the fusion stream (`OperationIr::Custom`). Registering it hands out its output
//! tensors at once, with the declared dims and dtypes; the stream runs it in order, which first
//! executes (fused) everything queued before it, then [`CubeOp::execute`] takes the inputs'
//! `CubeTensor`s from the stream's handles, launches the kernel and registers its results under
//! the outputs' ids.
//!
//! An input whose fusion tensor is held nowhere else is moved out of the handles (status
//! `ReadWrite`), one held elsewhere is cloned (`ReadOnly`), so a kernel's own `can_mut` test (no
//! other holder of the buffer) means the same as without fusion.

use std::marker::PhantomData;

use burn::backend::ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use burn::tensor::Shape;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};

use super::{CubeLaunch, OutSpec};

type Inner<R, F, I, BT> = CubeBackend<R, F, I, BT>;
type Runtime<R, F, I, BT> = <Inner<R, F, I, BT> as FusionBackend>::FusionRuntime;

/// One kernel call in the fusion stream: its inputs and outputs (`desc`) and the kernel.
struct CubeOp<B, K, const NI: usize, const O: usize> {
    desc: CustomOpIr,
    outputs: [OutSpec; O],
    kernel: K,
    _backend: PhantomData<fn() -> B>,
}

impl<B, K, const NI: usize, const O: usize> std::fmt::Debug for CubeOp<B, K, NI, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CubeOp({}, {} in, {O} out)", self.desc.id, self.desc.inputs.len())
    }
}

impl<R, F, I, BT, K, const NI: usize, const O: usize> Operation<Runtime<R, F, I, BT>> for CubeOp<Inner<R, F, I, BT>, K, NI, O>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
    K: Fn([CubeTensor<R>; NI]) -> [CubeTensor<R>; O] + Send + Sync,
{
    fn execute(&self, handles: &mut HandleContainer<<Runtime<R, F, I, BT> as FusionRuntime>::FusionHandle>) {
        let (ins, outs) = self.desc.as_fixed::<NI, O>();
        // In order: an input passed twice is read-only first, then moved (see `into_ir`).
        let inputs = ins.each_ref().map(|t| handles.get_float_tensor::<Inner<R, F, I, BT>>(t));
        for ((t, ir), spec) in (self.kernel)(inputs).into_iter().zip(outs).zip(&self.outputs) {
            spec.check(&self.desc.id, &t);
            handles.register_float_tensor::<Inner<R, F, I, BT>>(&ir.id, t);
        }
    }
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> CubeLaunch for Fusion<Inner<R, F, I, BT>> {
    type Runtime = R;
    fn cube_op<const NI: usize, const O: usize>(name: &'static str, inputs: [FusionTensor<Runtime<R, F, I, BT>>; NI], outputs: [OutSpec; O], kernel: impl Fn([CubeTensor<R>; NI]) -> [CubeTensor<R>; O] + Send + Sync + 'static) -> [FusionTensor<Runtime<R, F, I, BT>>; O] {
        let client = inputs.first().expect("a cube op has inputs").client.clone();
        let streams = OperationStreams::with_inputs(inputs.iter());
        // Each input's status (read-only or moved) is taken here, in order.
        let ins: Vec<TensorIr> = inputs.into_iter().map(FusionTensor::into_ir).collect();
        let outs: Vec<TensorIr> = outputs.iter().map(|s| TensorIr::uninit(client.create_empty_handle(), Shape::from(s.dims.clone()), s.dtype)).collect();
        let desc = CustomOpIr::new(name, &ins, &outs);
        let op = CubeOp::<Inner<R, F, I, BT>, _, NI, O> { desc: desc.clone(), outputs, kernel, _backend: PhantomData };
        let out = client.register(streams, OperationIr::Custom(desc), op);
        out.try_into().unwrap_or_else(|v: Vec<_>| panic!("{name}: {} outputs registered, {O} declared", v.len()))
    }
    fn strides(_: &FusionTensor<Runtime<R, F, I, BT>>) -> Option<Vec<usize>> {
        None
    }
}
