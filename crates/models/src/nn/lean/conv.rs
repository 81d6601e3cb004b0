//! The convolution nodes (1-D, 2-D, 3-D): they keep what Burn's keep (input and weight) but
//! compute the weight gradient over bounded batch chunks ([`CONV_WORKSPACE_BYTES`],
//! [`conv_chunks`]) and a stride-1 input gradient as a forward convolution with the flipped,
//! in/out-swapped kernel ([`flipped_padding`], [`flipped_weight`]).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::prelude::*;
use burn::tensor::TensorMetadata;
use burn::tensor::ops::ConvOptions;

use super::{LeanBackend, Prim, p, t};

/// The bound on the batch chunk a convolution's weight gradient is computed on: input plus
/// output gradient bytes. Burn computes a weight gradient as a convolution of the input and the
/// output gradient with batch and channels swapped, so it copies both (the swap is not
/// contiguous) and unfolds the input: on the whole batch that is two activation-sized copies
/// at once (225 MiB for ACT's stem output gradient at batch 48, 240×320). Chunking the batch
/// bounds the copies, as cuDNN bounds its workspace; the chunks' gradients are summed (same
/// values up to f32 summation order).
pub const CONV_WORKSPACE_BYTES: usize = 32 << 20;

/// Batch ranges for a weight gradient over `batch` samples of `per_sample` bytes (input plus
/// output gradient): as few chunks as keep each at most [`CONV_WORKSPACE_BYTES`], at least one
/// sample each.
pub fn conv_chunks(batch: usize, per_sample: usize) -> Vec<std::ops::Range<usize>> {
    conv_chunks_within(batch, per_sample, CONV_WORKSPACE_BYTES)
}

fn conv_chunks_within(batch: usize, per_sample: usize, bound: usize) -> Vec<std::ops::Range<usize>> {
    let per_chunk = (bound / per_sample.max(1)).clamp(1, batch.max(1));
    let n = batch.div_ceil(per_chunk);
    // Even chunks (n of them) rather than full ones and a remainder.
    let size = batch.div_ceil(n.max(1));
    (0..n).map(|i| i * size..((i + 1) * size).min(batch)).filter(|r| !r.is_empty()).collect()
}

/// One convolution node on `Autodiff<B, C>`: keeps the input and the weight (as Burn's own
/// convolution does); the backward is [`ConvBackward`]'s.
pub(super) fn conv_node<B: LeanBackend, C: CheckpointStrategy, O: ConvRank<B>>(
    x: Prim<Autodiff<B, C>>,
    weight: Prim<Autodiff<B, C>>,
    bias: Option<Prim<Autodiff<B, C>>>,
    options: O,
    forward: impl Fn(Prim<B>, Prim<B>, Option<Prim<B>>, O) -> Prim<B>,
) -> Prim<Autodiff<B, C>> {
    // Without a bias the third parent slot repeats the weight's node (no new tensor or node
    // per call); the backward registers a bias gradient only when the state says there is one.
    let has_bias = bias.is_some();
    let bias_node = bias.as_ref().map_or_else(|| weight.node.clone(), |b| b.node.clone());
    let prep = ConvBackward::<O>(std::marker::PhantomData).prepare::<C>([x.node.clone(), weight.node.clone(), bias_node]).compute_bound().stateful();
    let bias_inner = bias.map(|b| b.primitive);
    match prep {
        OpsKind::Tracked(prep) => {
            let y = forward(x.primitive.clone(), weight.primitive.clone(), bias_inner, options.clone());
            prep.finish(ConvState { x: x.primitive, weight: weight.primitive, options, has_bias, chunk_bytes: B::conv_workspace_bytes() }, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, weight.primitive, bias_inner, options)),
    }
}

/// A convolution's rank: the backend calls for 1-D, 2-D and 3-D.
pub(super) trait ConvRank<B: Backend>: Clone + Send + std::fmt::Debug + 'static {
    fn x_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B>;
    fn weight_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B>;
    /// The weight and bias gradients together where the backend computes them so (see
    /// [`LeanBackend::lean_conv3d_weight_bias_backward`]); `None`: apart.
    fn weight_bias_backward(_x: &Prim<B>, _w: &Prim<B>, _dy: &Prim<B>, _o: &Self) -> Option<(Prim<B>, Prim<B>)> {
        None
    }
}

impl<B: LeanBackend> ConvRank<B> for ConvOptions<1> {
    fn x_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        match spread_if_chosen::<B>(&x, &w, &dy, &o.stride, &o.padding, &o.dilation, o.groups) {
            Some(spread) => B::lean_conv1d(spread, B::lean_flipped_weight(w), None, ConvOptions::new([1], [0], o.dilation, 1)),
            None => B::lean_conv1d_x_backward(x, w, dy, o),
        }
    }
    fn weight_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        B::lean_conv1d_weight_backward(x, w, dy, o)
    }
}

impl<B: LeanBackend> ConvRank<B> for ConvOptions<2> {
    fn x_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        if let Some(pad) = flipped_padding(&w.shape().to_vec()[2..], &o.stride, &o.padding, &o.dilation, o.groups) {
            return B::lean_conv2d(dy, B::lean_flipped_weight(w), None, ConvOptions::new([1, 1], [pad[0], pad[1]], o.dilation, 1));
        }
        match spread_if_chosen::<B>(&x, &w, &dy, &o.stride, &o.padding, &o.dilation, o.groups) {
            Some(spread) => B::lean_conv2d(spread, B::lean_flipped_weight(w), None, ConvOptions::new([1, 1], [0, 0], o.dilation, 1)),
            None => B::conv2d_x_backward(x, w, dy, o),
        }
    }
    fn weight_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        B::lean_conv2d_weight_backward(x, w, dy, o)
    }
}

impl<B: LeanBackend> ConvRank<B> for ConvOptions<3> {
    fn x_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        if let Some(pad) = flipped_padding(&w.shape().to_vec()[2..], &o.stride, &o.padding, &o.dilation, o.groups) {
            return B::lean_conv3d(dy, B::lean_flipped_weight(w), None, ConvOptions::new([1, 1, 1], [pad[0], pad[1], pad[2]], o.dilation, 1));
        }
        match spread_if_chosen::<B>(&x, &w, &dy, &o.stride, &o.padding, &o.dilation, o.groups) {
            Some(spread) => B::lean_conv3d(spread, B::lean_flipped_weight(w), None, ConvOptions::new([1, 1, 1], [0, 0, 0], o.dilation, 1)),
            None => B::conv3d_x_backward(x, w, dy, o),
        }
    }
    fn weight_backward(x: Prim<B>, w: Prim<B>, dy: Prim<B>, o: Self) -> Prim<B> {
        B::lean_conv3d_weight_backward(x, w, dy, o)
    }
    fn weight_bias_backward(x: &Prim<B>, w: &Prim<B>, dy: &Prim<B>, o: &Self) -> Option<(Prim<B>, Prim<B>)> {
        B::lean_conv3d_weight_bias_backward(x.clone(), w.clone(), dy.clone(), o.clone())
    }
}

/// The input gradient of a stride-1, ungrouped convolution is the *forward* convolution of
/// the output gradient with the flipped, in/out-swapped kernel and padding `d·(k−1) − p`
/// (exactly the input's size). Burn computes it as a transposed convolution, which on flex
/// unfolds into one `[cin·k, output positions]` column buffer per sample (905 MiB for a
/// 16-channel 3×3×3 convolution on a 32×128×128 grid) and loops over the batch on one
/// thread; the forward convolution is tiled and parallel. `None`: use Burn's (strided,
/// grouped, or padding beyond the kernel's reach).
pub(super) fn flipped_padding(kernel: &[usize], stride: &[usize], padding: &[usize], dilation: &[usize], groups: usize) -> Option<Vec<usize>> {
    if groups != 1 || stride.iter().any(|&s| s != 1) {
        return None;
    }
    kernel.iter().zip(padding).zip(dilation).map(|((&k, &p), &d)| (d * (k - 1)).checked_sub(p)).collect()
}

/// [`spread_output_grad`] for a strided convolution where the backend asks for it
/// ([`LeanBackend::spread_strided_x_backward`]: always where a kernel's reach `k·d` is shorter
/// than its stride on some axis, e.g. ResNet's 1×1 stride-2 downsampling), else `None`.
fn spread_if_chosen<B: LeanBackend>(x: &Prim<B>, w: &Prim<B>, dy: &Prim<B>, stride: &[usize], padding: &[usize], dilation: &[usize], groups: usize) -> Option<Prim<B>> {
    if stride.iter().all(|&s| s == 1) {
        return None;
    }
    let kernel = w.shape().to_vec()[2..].to_vec();
    let short = kernel.iter().zip(dilation).zip(stride).any(|((&k, &d), &s)| k * d < s);
    if !B::spread_strided_x_backward(kernel.len(), short) {
        return None;
    }
    spread_output_grad::<B>(dy, &x.shape().to_vec()[2..], &kernel, stride, padding, dilation, groups)
}

/// The input gradient of a *strided* (ungrouped) convolution as a stride-1 one: `dy: [n, cout,
/// o…]` written `stride` apart into a zero buffer `[n, cout, in + d·(k−1)]` (per spatial axis)
/// from offset `d·(k−1) − p`; the unpadded forward convolution of that buffer with the flipped,
/// in/out-swapped kernel (dilation `d`) is exactly `dx: [n, cin, in…]` — the zeros stand for
/// the positions the stride skipped and for the padding. `None` where that offset would be
/// negative (padding beyond the kernel's reach) or the convolution is grouped: the backend's
/// transposed convolution then. Costs one buffer of `cout` channels at the input's size plus
/// `d·(k−1)` per axis, and multiplies zeros (`1 − 1/Πstride` of them): taken where the
/// backend's transposed convolution is wrong or much slower than its forward one
/// ([`LeanBackend::spread_strided_x_backward`]). A short kernel padded beyond its reach (a 1×1
/// conv with padding, stride 2: no model here has one) still gets the backend's.
pub(super) fn spread_output_grad<B: Backend>(dy: &Prim<B>, input: &[usize], kernel: &[usize], stride: &[usize], padding: &[usize], dilation: &[usize], groups: usize) -> Option<Prim<B>> {
    if groups != 1 {
        return None;
    }
    let dims = dy.shape().to_vec();
    let mut full = dims[..2].to_vec();
    let mut at: Vec<burn::tensor::Slice> = dims[..2].iter().map(|&d| burn::tensor::Slice::from(0..d)).collect();
    for axis in 0..kernel.len() {
        let reach = dilation[axis] * (kernel[axis] - 1);
        let offset = reach.checked_sub(padding[axis])?;
        let (n_out, step) = (dims[2 + axis], stride[axis]);
        full.push(input[axis] + reach);
        at.push(burn::tensor::Slice::new(offset as isize, Some((offset + (n_out - 1) * step + 1) as isize), step as isize));
    }
    let zeros = B::float_zeros(Shape::from(full), &B::float_device(dy), dy.dtype().into());
    Some(B::float_slice_assign(zeros, &at, dy.clone()))
}

/// Test support: deterministic host values (an LCG in [-1.5, 1.5)) as a tensor on `B`, so that
/// two backends see the same inputs.
#[cfg(test)]
pub(super) fn host_tensor<B: Backend, const D: usize>(dims: [usize; D], seed: u64) -> Tensor<B, D> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let values: Vec<f32> = (0..dims.iter().product::<usize>())
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 3.0 - 1.5
        })
        .collect();
    Tensor::from_data(burn::tensor::TensorData::new(values, dims), &Default::default())
}

/// Test support: strided 3-D and 2-D input gradients on `B` — odd sizes (an output padding),
/// mixed strides, dilation, 1×1 kernels with stride 2 — as [`spread_output_grad`]'s stride-1
/// convolution and as the backend's own (`conv{2,3}d_x_backward`, a transposed convolution):
/// `(case, short, spread, own)` per case (`short`: the kernel's reach `k·d` is below the stride
/// on some axis), on the same host inputs whatever `B`. Also checks that
/// padding beyond the kernel's reach and groups are declined.
#[cfg(test)]
pub(super) fn spread_x_backward_cases<B: LeanBackend>() -> Vec<(String, bool, Vec<f32>, Vec<f32>)> {
    use burn::tensor::TensorPrimitive::Float;
    let v = |p: Prim<B>| super::tests::vals(Tensor::<B, 1>::from_primitive(Float(B::float_reshape(p.clone(), Shape::from([p.shape().num_elements()])))));
    let mut out = Vec::new();
    let cases3: [([usize; 5], [usize; 5], [usize; 3], [usize; 3], [usize; 3]); 5] = [
        ([2, 3, 7, 9, 8], [4, 3, 3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1]),
        ([2, 4, 8, 8, 8], [8, 4, 3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1]),
        ([1, 2, 8, 6, 10], [3, 2, 3, 3, 3], [2, 1, 3], [1, 0, 1], [1, 1, 1]),
        ([2, 2, 9, 9, 9], [2, 2, 3, 3, 3], [2, 2, 2], [2, 2, 2], [2, 2, 2]),
        ([1, 3, 6, 7, 6], [2, 3, 1, 1, 1], [2, 2, 2], [0, 0, 0], [1, 1, 1]),
    ];
    for (i, (xd, wd, stride, padding, dilation)) in cases3.into_iter().enumerate() {
        let o = ConvOptions::new(stride, padding, dilation, 1);
        let (x, w) = (host_tensor::<B, 5>(xd, 40 + i as u64).into_primitive().tensor(), host_tensor::<B, 5>(wd, 50 + i as u64).into_primitive().tensor());
        let yd: [usize; 5] = B::conv3d(x.clone(), w.clone(), None, o.clone()).shape().dims();
        let dy = host_tensor::<B, 5>(yd, 60 + i as u64).into_primitive().tensor();
        let spread = spread_output_grad::<B>(&dy, &xd[2..], &wd[2..], &stride, &padding, &dilation, 1).expect("padding within reach");
        let lean = B::lean_conv3d(spread, B::lean_flipped_weight(w.clone()), None, ConvOptions::new([1, 1, 1], [0, 0, 0], dilation, 1));
        assert_eq!(lean.shape().to_vec(), xd.to_vec(), "3-D case {i}: the input's shape");
        let own = B::conv3d_x_backward(x, w, dy, o);
        let short = (0..3).any(|a| wd[2 + a] * dilation[a] < stride[a]);
        out.push((format!("3-D x {xd:?} w {wd:?} stride {stride:?} padding {padding:?} dilation {dilation:?}"), short, v(lean), v(own)));
    }
    let cases2: [([usize; 4], [usize; 4], [usize; 2], [usize; 2]); 3] = [
        ([2, 4, 8, 8], [8, 4, 1, 1], [2, 2], [0, 0]),
        ([1, 3, 7, 6], [2, 3, 1, 1], [2, 2], [0, 0]),
        ([1, 3, 16, 15], [4, 3, 7, 7], [2, 2], [3, 3]),
    ];
    for (i, (xd, wd, stride, padding)) in cases2.into_iter().enumerate() {
        let o = ConvOptions::new(stride, padding, [1, 1], 1);
        let (x, w) = (host_tensor::<B, 4>(xd, 70 + i as u64).into_primitive().tensor(), host_tensor::<B, 4>(wd, 80 + i as u64).into_primitive().tensor());
        let yd: [usize; 4] = B::conv2d(x.clone(), w.clone(), None, o.clone()).shape().dims();
        let dy = host_tensor::<B, 4>(yd, 90 + i as u64).into_primitive().tensor();
        let spread = spread_output_grad::<B>(&dy, &xd[2..], &wd[2..], &stride, &padding, &[1, 1], 1).expect("padding within reach");
        let lean = B::lean_conv2d(spread, B::lean_flipped_weight(w.clone()), None, ConvOptions::new([1, 1], [0, 0], [1, 1], 1));
        assert_eq!(lean.shape().to_vec(), xd.to_vec(), "2-D case {i}: the input's shape");
        let own = B::conv2d_x_backward(x, w, dy, o);
        let short = (0..2).any(|a| wd[2 + a] < stride[a]);
        out.push((format!("2-D x {xd:?} w {wd:?} stride {stride:?} padding {padding:?}"), short, v(lean), v(own)));
    }
    let dy = host_tensor::<B, 5>([1, 2, 3, 3, 3], 99).into_primitive().tensor();
    assert!(spread_output_grad::<B>(&dy, &[6, 6, 6], &[3, 3, 3], &[2, 2, 2], &[3, 3, 3], &[1, 1, 1], 1).is_none(), "padding 3 > the kernel's reach 2");
    assert!(spread_output_grad::<B>(&dy, &[6, 6, 6], &[3, 3, 3], &[2, 2, 2], &[1, 1, 1], &[1, 1, 1], 2).is_none(), "grouped");
    out
}

/// `w: [cout, cin, k…]` → `[cin, cout, k…]` flipped along every kernel axis.
pub(super) fn flipped_weight<B: Backend>(w: Prim<B>) -> Prim<B> {
    let rank = w.shape().num_dims();
    let axes: Vec<usize> = (2..rank).collect();
    B::float_flip(B::float_swap_dims(w, 0, 1), &axes)
}

#[derive(Debug)]
struct ConvBackward<O>(std::marker::PhantomData<O>);

#[derive(Clone, Debug)]
struct ConvState<B: Backend, O> {
    x: Prim<B>,
    weight: Prim<B>,
    options: O,
    /// Whether the third parent is a bias (else it repeats the weight).
    has_bias: bool,
    /// [`LeanBackend::conv_workspace_bytes`] of the inner backend.
    chunk_bytes: Option<usize>,
}

/// Rows `range` of dimension 0.
fn batch_slice<B: Backend>(x: &Prim<B>, range: std::ops::Range<usize>) -> Prim<B> {
    let dims = x.shape().to_vec();
    let mut slices: Vec<burn::tensor::Slice> = dims.iter().map(|&d| burn::tensor::Slice::from(0..d)).collect();
    slices[0] = burn::tensor::Slice::from(range);
    B::float_slice(x.clone(), &slices)
}

impl<B: LeanBackend, O: ConvRank<B>> Backward<B, 3> for ConvBackward<O> {
    type State = ConvState<B, O>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let ConvState { x, weight, options, has_bias, chunk_bytes } = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let [node_x, node_w, node_b] = ops.parents;
        let node_b = node_b.filter(|_| has_bias);
        let batch = x.shape()[0];
        let per_sample = (x.shape().num_elements() / batch.max(1)) * x.dtype().size() + (dy.shape().num_elements() / batch.max(1)) * dy.dtype().size();
        // No bound: one chunk, the whole batch.
        let chunks = conv_chunks_within(batch, per_sample, chunk_bytes.unwrap_or(usize::MAX));
        // Both gradients from one call where the backend has one (the whole batch at once);
        // what is left of the pair takes the calls below.
        let (node_w, node_b) = match (node_w, node_b) {
            (Some(w), Some(b)) if chunks.len() == 1 => match O::weight_bias_backward(&x, &weight, &dy, &options) {
                Some((dw, db)) => {
                    grads.register::<B>(b.id, db);
                    grads.register::<B>(w.id, dw);
                    (None, None)
                }
                None => (Some(w), Some(b)),
            },
            pair => pair,
        };
        if let Some(node) = node_b {
            grads.register::<B>(node.id, B::lean_channel_sum(dy.clone(), 1));
        }
        if let Some(node) = node_w {
            let mut dw: Option<Prim<B>> = None;
            for r in chunks {
                let (xs, gs) = if r.len() == batch { (x.clone(), dy.clone()) } else { (batch_slice::<B>(&x, r.clone()), batch_slice::<B>(&dy, r)) };
                let part = O::weight_backward(xs, weight.clone(), gs, options.clone());
                dw = Some(match dw {
                    None => part,
                    Some(acc) => B::float_add(acc, part),
                });
            }
            grads.register::<B>(node.id, dw.expect("batch ≥ 1"));
        }
        if let Some(node) = node_x {
            grads.register::<B>(node.id, O::x_backward(x, weight, dy, options));
        }
    }
}

/// [`LeanBackend::lean_conv1d`] on tensors.
pub fn conv1d<B: LeanBackend>(x: Tensor<B, 3>, weight: Tensor<B, 3>, bias: Option<Tensor<B, 1>>, options: ConvOptions<1>) -> Tensor<B, 3> {
    t(B::lean_conv1d(p(x), p(weight), bias.map(p), options))
}

/// [`LeanBackend::lean_conv2d`] on tensors.
pub fn conv2d<B: LeanBackend>(x: Tensor<B, 4>, weight: Tensor<B, 4>, bias: Option<Tensor<B, 1>>, options: ConvOptions<2>) -> Tensor<B, 4> {
    t(B::lean_conv2d(p(x), p(weight), bias.map(p), options))
}

/// [`LeanBackend::lean_conv3d`] on tensors.
pub fn conv3d<B: LeanBackend>(x: Tensor<B, 5>, weight: Tensor<B, 5>, bias: Option<Tensor<B, 1>>, options: ConvOptions<3>) -> Tensor<B, 5> {
    t(B::lean_conv3d(p(x), p(weight), bias.map(p), options))
}

#[cfg(test)]
mod tests {
    use burn::prelude::*;

    use super::super::tests::{A, random, rel, vals};

    #[test]
    fn conv_chunks_cover_the_batch_within_the_bound() {
        let mib = 1 << 20;
        assert_eq!(super::conv_chunks(48, 4 * mib), vec![0..8, 8..16, 16..24, 24..32, 32..40, 40..48]);
        assert_eq!(super::conv_chunks(12, 4 * mib), vec![0..6, 6..12]);
        assert_eq!(super::conv_chunks(3, mib), vec![0..3]);
        assert_eq!(super::conv_chunks(2, 100 * mib), vec![0..1, 1..2], "at least one sample per chunk");
        assert_eq!(super::conv_chunks_within(48, 4 * mib, usize::MAX), vec![0..48], "no bound: the whole batch");
    }

    type ConvFn<'a, const D: usize> = dyn Fn(Tensor<A, D>, Tensor<A, D>, Option<Tensor<A, 1>>) -> Tensor<A, D> + 'a;

    /// Gradients of `sum(conv(x, w, b) · r)` for the lean node and Burn's convolution.
    fn check_conv<const D: usize>(x: [usize; D], w: [usize; D], bias: bool, lean: impl Fn(Tensor<A, D>, Tensor<A, D>, Option<Tensor<A, 1>>) -> Tensor<A, D>, plain: impl Fn(Tensor<A, D>, Tensor<A, D>, Option<Tensor<A, 1>>) -> Tensor<A, D>) {
        let x0: Tensor<A, D> = random(x, 11);
        let w0: Tensor<A, D> = random(w, 12) * 0.2;
        let b0: Tensor<A, 1> = random([w[0]], 13);
        // Drawn once for both runs: the RNG's seed is global, other tests reseed it.
        let r: Tensor<A, D> = random(plain(x0.clone(), w0.clone(), bias.then(|| b0.clone())).dims(), 14);
        let run = |f: &ConvFn<'_, D>| {
            let (x, w, b) = (x0.clone().require_grad(), w0.clone().require_grad(), b0.clone().require_grad());
            let y = f(x.clone(), w.clone(), bias.then(|| b.clone()));
            let r = r.clone();
            let out = vals(y.clone());
            let g = (y * r).sum().backward();
            let gb = if bias { vals(b.grad(&g).unwrap()) } else { Vec::new() };
            (out, vals(x.grad(&g).unwrap()), vals(w.grad(&g).unwrap()), gb)
        };
        let (lo, lx, lw, lb) = run(&lean);
        let (po, px, pw, pb) = run(&plain);
        for (name, a, b) in [("output", lo, po), ("dx", lx, px), ("dweight", lw, pw), ("dbias", lb, pb)] {
            if b.is_empty() {
                continue;
            }
            let e = rel(&a, &b);
            assert!(e <= 1e-5, "{name}: relative error {e:e}");
        }
    }

    #[test]
    fn conv_backward_equals_burns_including_chunked_weight_gradients() {
        use burn::tensor::module::{conv2d, conv3d};
        use burn::tensor::ops::ConvOptions;
        // Strided: Burn's input gradient; stride 1 (same, valid, dilated, 7×7): the flipped
        // forward convolution.
        let o2 = || ConvOptions::new([2, 1], [1, 1], [1, 1], 1);
        check_conv::<4>([3, 4, 9, 7], [5, 4, 3, 3], true, |x, w, b| super::conv2d(x, w, b, o2()), |x, w, b| conv2d(x, w, b, o2()));
        for (pad, dil, k) in [([1, 1], [1, 1], 3), ([0, 0], [1, 1], 3), ([2, 1], [2, 1], 3), ([3, 3], [1, 1], 7), ([1, 0], [1, 1], 3)] {
            let o = move || ConvOptions::new([1, 1], pad, dil, 1);
            check_conv::<4>([2, 3, 11, 10], [4, 3, k, k], true, move |x, w, b| super::conv2d(x, w, b, o()), move |x, w, b| conv2d(x, w, b, o()));
        }
        check_conv::<4>([3, 4, 9, 7], [5, 4, 3, 3], false, |x, w, b| super::conv2d(x, w, b, o2()), |x, w, b| conv2d(x, w, b, o2()));
        let o3 = || ConvOptions::new([1, 1, 1], [1, 1, 1], [1, 1, 1], 1);
        check_conv::<5>([2, 3, 4, 5, 6], [4, 3, 3, 3, 3], true, |x, w, b| super::conv3d(x, w, b, o3()), |x, w, b| conv3d(x, w, b, o3()));
        // 2 MiB of input and 2 MiB of output gradient per sample: two chunks of 6.
        assert_eq!(super::conv_chunks(12, 4 << 20).len(), 2);
        let o = || ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
        check_conv::<4>([12, 2, 512, 512], [2, 2, 3, 3], true, |x, w, b| super::conv2d(x, w, b, o()), |x, w, b| conv2d(x, w, b, o()));
    }

    /// The 1-D convolution (on flex: one GEMM over the batch, col2im input gradient) against
    /// Burn's: same-padded k5 and k3 as Diffusion's UNet, strided k3 (its downsampling), 1×1,
    /// dilated, unpadded, without bias, and one whose batch chunks the weight gradient.
    #[test]
    fn conv1d_backward_equals_burns() {
        use burn::tensor::module::conv1d;
        use burn::tensor::ops::ConvOptions;
        for (x, w, stride, pad, dil, bias) in [
            ([3, 6, 16], [5, 6, 5], 1, 2, 1, true),
            ([2, 4, 8], [4, 4, 3], 1, 1, 1, true),
            ([3, 4, 9], [6, 4, 3], 2, 1, 1, true),
            ([2, 8, 4], [3, 8, 1], 1, 0, 1, true),
            ([2, 3, 11], [4, 3, 3], 1, 2, 2, false),
            ([2, 3, 10], [4, 3, 3], 1, 0, 1, true),
            ([3, 5, 7], [2, 5, 5], 3, 1, 1, false),
        ] {
            let o = move || ConvOptions::new([stride], [pad], [dil], 1);
            check_conv::<3>(x, w, bias, move |x, w, b| super::conv1d(x, w, b, o()), move |x, w, b| conv1d(x, w, b, o()));
        }
        // 2 MiB of input and output gradient per sample: chunks of the batch.
        let o = || ConvOptions::new([1], [2], [1], 1);
        check_conv::<3>([24, 4, 65536], [4, 4, 5], true, |x, w, b| super::conv1d(x, w, b, o()), |x, w, b| conv1d(x, w, b, o()));
    }

    /// The strided input gradient as a stride-1 convolution over the spread output gradient
    /// equals flex's transposed convolution (flex itself keeps the latter).
    #[test]
    fn spread_output_gradient_gives_the_strided_input_gradient() {
        for (case, _, spread, own) in super::spread_x_backward_cases::<burn::backend::Flex>() {
            let e = rel(&spread, &own);
            assert!(e <= 1e-5, "{case}: relative error {e:e}");
        }
    }

    /// A bf16 conv3d's weight gradient (flex: f32 columns from bf16 blocks) against f32 Burn.
    #[test]
    fn bf16_conv_weight_gradient_matches_f32_within_rounding() {
        use burn::tensor::FloatDType;
        use burn::tensor::ops::ConvOptions;
        let o = || ConvOptions::new([1, 2, 1], [1, 1, 1], [1, 1, 1], 1);
        let x: Tensor<A, 5> = random([2, 3, 4, 6, 5], 31).cast(FloatDType::BF16);
        let w: Tensor<A, 5> = (random::<A, 5>([4, 3, 3, 3, 3], 32) * 0.2).cast(FloatDType::BF16);
        let r: Tensor<A, 5> = random([2, 4, 4, 3, 5], 33);
        let run = |x: Tensor<A, 5>, w: Tensor<A, 5>, lean: bool| {
            let w = w.require_grad();
            let y = if lean { super::conv3d(x, w.clone(), None, o()) } else { burn::tensor::module::conv3d(x, w.clone(), None, o()) };
            let g = (y.cast(FloatDType::F32) * r.clone()).sum().backward();
            vals(w.grad(&g).unwrap().cast(FloatDType::F32))
        };
        let lean = run(x.clone(), w.clone(), true);
        let plain = run(x.cast(FloatDType::F32), w.cast(FloatDType::F32), false);
        assert!(rel(&lean, &plain) <= 2e-2, "dweight {}", rel(&lean, &plain));
    }
}
