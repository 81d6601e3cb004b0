//! The optimizer's per-parameter arithmetic as a backend extension: the squared norm of a
//! gradient (for global-norm clipping) and one Adam(W) update of a parameter and its moments.
//!
//! Written with tensor ops, each update is about ten full passes over the parameter, each
//! allocating a new tensor, and on flex a gradient that autodiff left in a permuted layout (a
//! conv weight's) is walked element by element in every one of them. Diffusion Policy's UNet
//! (263 M parameters) spent 8.8 s of a 13 s CPU step there. On flex the update below is one
//! pass over contiguous memory, in place, on all threads; it does the same f32 operations in the
//! same order as the tensor version, so the two agree bit for bit (tested). wgpu and cuda run
//! the update as `#[cube]` kernels, in place where the buffers are the update's alone, one
//! launch per group of up to eight parameters with the same hyper-parameters, and the squared
//! norm as one launch per group of gradients instead of the tensor ops' square, sum and add per
//! gradient (`cube`, tested against the tensor versions in `cube_tests`); with Burn's fusion on,
//! the same kernels as custom operations of the fusion stream, one per parameter (`fusion`). The clip itself is a
//! factor of the update's `coef` (computed once per step from the norm read to the host).

use burn::prelude::*;
use burn::tensor::FloatDType;

/// Adam(W) hyper-parameters of one update, PyTorch's formula:
/// `m = b1·m + (1−b1)·g`, `v = b2·v + (1−b2)·g²`, `p −= lr/bc1 · m / (√v/√bc2 + eps)`.
#[derive(Clone, Copy, Debug)]
pub struct AdamUpdate {
    pub b1: f64,
    pub b2: f64,
    pub eps: f64,
    pub lr: f64,
    /// Bias corrections `1 − b1^t`, `1 − b2^t`.
    pub bc1: f64,
    pub bc2: f64,
    /// Multiplies the gradient first (clipping and loss-scale undo); 1 leaves it alone.
    pub coef: f64,
    pub decay: Decay,
}

/// Weight decay of an update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decay {
    None,
    /// `torch.optim.Adam(weight_decay=wd)`: `g += wd·p`.
    L2(f64),
    /// `torch.optim.AdamW`: `p *= 1 − lr·wd` before the update; holds `1 − lr·wd`.
    Decoupled(f64),
}

/// `Σ g²` over the gradients of one step, read to the host once ([`OptimKernels::sq_total`]):
/// a part summed on the host (flex), a one-element sum on the device (the tensor ops) and a
/// kernel's per-unit partial sums on the device (CubeCL), added up at the end.
pub struct SqAcc<B: Backend> {
    pub host: f64,
    pub device: Option<Tensor<B, 1>>,
    pub partials: Option<Tensor<B, 1>>,
    /// Gradients (flat, contiguous) a backend holds back to sum several in one launch (CubeCL:
    /// up to a group's worth), summed into `partials` when the group fills or in `sq_total`.
    pub pending: Vec<Tensor<B, 1>>,
}

impl<B: Backend> Default for SqAcc<B> {
    fn default() -> Self {
        Self { host: 0.0, device: None, partials: None, pending: Vec::new() }
    }
}

/// See the module docs. The default methods are the tensor-op versions.
pub trait OptimKernels: Backend {
    /// Updates [`Self::adam_update_later`] has held back: `()` where each runs at once.
    type Later: Default;

    /// Adds `Σ g²` (f32 arithmetic) to `acc` and hands `g` back (on flex and CubeCL backends laid
    /// out contiguously, so the update reads it in order).
    fn grad_sq_sum<const D: usize>(g: Tensor<Self, D>, acc: &mut SqAcc<Self>) -> Tensor<Self, D> {
        sq_sum_tensors(g, acc)
    }

    /// The sum `acc` holds, read to the host (one read of each device part).
    fn sq_total(acc: SqAcc<Self>) -> f64 {
        sq_total_tensors(acc)
    }

    /// One update of the parameter `p` with gradient `g` (same shape) and the flattened
    /// moments `(m, v)` (`None` on the first step: zeros). Returns the new `(p, m, v)`.
    fn adam_update<const D: usize>(p: Tensor<Self, D>, g: Tensor<Self, D>, moments: Option<(Tensor<Self, 1>, Tensor<Self, 1>)>, h: &AdamUpdate) -> (Tensor<Self, D>, Tensor<Self, 1>, Tensor<Self, 1>) {
        let shape = p.shape();
        let n = shape.num_elements();
        let (p, m, v) = adam_update_tensors(p.reshape([n]), g.reshape([n]), moments, h);
        (p.reshape(shape), m, v)
    }

    /// [`Self::adam_update`], which the backend may hold back in `later` until
    /// [`Self::adam_flush`] to launch several parameters' updates at once (CubeCL). The tensors
    /// it returns hold the results once flushed: nothing may read them before. The default runs
    /// the update at once.
    fn adam_update_later<const D: usize>(p: Tensor<Self, D>, g: Tensor<Self, D>, moments: Option<(Tensor<Self, 1>, Tensor<Self, 1>)>, h: &AdamUpdate, later: &mut Self::Later) -> (Tensor<Self, D>, Tensor<Self, 1>, Tensor<Self, 1>) {
        let _ = later;
        Self::adam_update(p, g, moments, h)
    }

    /// Runs the updates `later` holds (the step's last call).
    fn adam_flush(later: Self::Later) {
        let _ = later;
    }
}

/// [`OptimKernels::sq_total`] of what `acc` holds on the host, in its one-element sum and in
/// its partial sums (`pending` must be empty: a backend that holds gradients back sums them first).
pub fn sq_total_tensors<B: Backend>(acc: SqAcc<B>) -> f64 {
    debug_assert!(acc.pending.is_empty(), "gradients held back were not summed");
    // The partial sums (16,384 f32 on CubeCL) are read as they are and added here in f64: a
    // device sum would be Burn's autotuned reduction, six kernels compiled on a first step (five
    // candidates and the search's own) for a read of 64 KiB.
    let partials = acc.partials.map_or(0.0, |p| p.into_data().iter::<f32>().map(f64::from).sum::<f64>());
    acc.host + partials + acc.device.map_or(0.0, |s| s.into_scalar().elem::<f64>())
}

/// `Σ g²` with tensor ops (cast, square, sum, and an add into `acc`'s one-element sum).
pub fn sq_sum_tensors<B: Backend, const D: usize>(g: Tensor<B, D>, acc: &mut SqAcc<B>) -> Tensor<B, D> {
    let s = g.clone().cast(FloatDType::F32).square().sum();
    acc.device = Some(match acc.device.take() {
        Some(a) => a + s,
        None => s,
    });
    g
}

/// The update with tensor ops (any backend, any dtype).
pub fn adam_update_tensors<B: Backend>(p: Tensor<B, 1>, g: Tensor<B, 1>, moments: Option<(Tensor<B, 1>, Tensor<B, 1>)>, h: &AdamUpdate) -> (Tensor<B, 1>, Tensor<B, 1>, Tensor<B, 1>) {
    let (mut p, mut g) = (p, g);
    if h.coef != 1.0 {
        g = g * h.coef;
    }
    match h.decay {
        Decay::L2(wd) => g = g + p.clone() * wd,
        Decay::Decoupled(keep) => p = p * keep,
        Decay::None => {}
    }
    let (m, v) = match moments {
        Some((m, v)) => (m * h.b1 + g.clone() * (1.0 - h.b1), v * h.b2 + g.square() * (1.0 - h.b2)),
        None => (g.clone() * (1.0 - h.b1), g.square() * (1.0 - h.b2)),
    };
    let denom = v.clone().sqrt() / h.bc2.sqrt() + h.eps;
    let p = p - m.clone() / denom * (h.lr / h.bc1);
    (p, m, v)
}

// CubeCL backends: the `#[cube]` kernels of `cube`, on `CubeBackend` (`Wgpu` and `Cuda` without
// Burn's fusion) and, through `fusion`, on `Fusion<CubeBackend>`.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cube;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), test))]
mod cube_tests;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), feature = "fusion"))]
mod fusion;

#[cfg(feature = "flex")]
mod flex {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::{DType, TensorPrimitive};
    use burn_flex::FlexTensor;
    use rayon::prelude::*;
    use vramlab_simd::Isa;

    /// Elements per parallel task: large enough that rayon's overhead vanishes, small enough to
    /// split a 1 M-element tensor across the threads.
    const CHUNK: usize = 1 << 16;

    fn prim<const D: usize>(t: Tensor<Flex, D>) -> FlexTensor {
        t.into_primitive().tensor()
    }

    fn tensor<const D: usize>(t: FlexTensor) -> Tensor<Flex, D> {
        Tensor::from_primitive(TensorPrimitive::Float(t))
    }

    /// An f32 tensor's elements in logical (row-major) order, read through its layout: the
    /// layout's innermost contiguous run is copied per step of an odometer over the outer dims.
    /// Flex's own copy of a permuted layout (a conv weight's gradient, `[cout, cin, k]` stored
    /// as `[cin, cout, k]`) goes one element at a time through a generic index iterator.
    ///
    /// A transposed matrix (`[r, c]` with strides `[1, s ≥ r]`: every `nn::Linear` weight's
    /// gradient, since the forward multiplies by `weightᵀ`) has runs of one element; it is read
    /// instead as a block transpose of whole rows ([`Transposed`]).
    struct Reader<'a> {
        src: &'a [f32],
        outer_shape: Vec<usize>,
        outer_strides: Vec<isize>,
        start: isize,
        /// Elements per run.
        run: usize,
        transposed: Option<Transposed>,
    }

    /// A `[rows, cols]` layout with strides `[1, col_stride]`: column `j` is the contiguous
    /// `src[start + j·col_stride ..][..rows]`.
    #[derive(Clone, Copy)]
    struct Transposed {
        cols: usize,
        col_stride: usize,
    }

    impl<'a> Reader<'a> {
        fn new(t: &'a FlexTensor) -> Self {
            let layout = t.layout();
            let shape: Vec<usize> = layout.shape().iter().copied().collect();
            let strides = layout.strides().to_vec();
            let (mut run, mut k) = (1usize, shape.len());
            while k > 0 && strides[k - 1] == run as isize {
                run *= shape[k - 1];
                k -= 1;
            }
            let transposed = (shape.len() == 2 && strides[0] == 1 && shape[0] > 1 && shape[1] > 1 && strides[1] >= shape[0] as isize).then(|| Transposed { cols: shape[1], col_stride: strides[1] as usize });
            Self { src: t.storage::<f32>(), outer_shape: shape[..k].to_vec(), outer_strides: strides[..k].to_vec(), start: layout.start_offset() as isize, run, transposed }
        }

        /// Elements per parallel task: whole runs (whole rows of a transposed matrix), about
        /// [`CHUNK`] of them.
        fn chunk(&self) -> usize {
            let unit = self.transposed.map_or(self.run, |t| t.cols);
            unit * (CHUNK / unit).max(1)
        }

        /// Elements `first..first + len` straight from storage when the layout is one contiguous run.
        fn slice(&self, first: usize, len: usize) -> Option<&'a [f32]> {
            let start = self.start as usize + first;
            self.outer_shape.is_empty().then(|| &self.src[start..start + len])
        }

        /// Fills `out` with the elements from logical index `first` (a multiple of the run, or
        /// of the row for a transposed matrix).
        fn read(&self, first: usize, out: &mut [f32]) {
            if let Some(t) = self.transposed {
                // Rows r0.. of the result are the same positions of every stored column: read
                // sixteen columns' segments at a time (sixteen sequential read streams) and
                // write them down the rows (each row's sixteen outputs fill one cache line).
                debug_assert!(first.is_multiple_of(t.cols) && out.len().is_multiple_of(t.cols));
                const TILE: usize = 16;
                let (r0, rows) = (first / t.cols, out.len() / t.cols);
                for j0 in (0..t.cols).step_by(TILE) {
                    let w = TILE.min(t.cols - j0);
                    let cols: [&[f32]; TILE] = std::array::from_fn(|jj| if jj < w { &self.src[self.start as usize + (j0 + jj) * t.col_stride + r0..][..rows] } else { &[] });
                    for (i, row) in out.chunks_exact_mut(t.cols).enumerate() {
                        for (o, col) in row[j0..j0 + w].iter_mut().zip(&cols) {
                            *o = col[i];
                        }
                    }
                }
                return;
            }
            let k = self.outer_shape.len();
            let mut idx = vec![0usize; k];
            let mut rest = first / self.run;
            let mut base = self.start;
            for d in (0..k).rev() {
                idx[d] = rest % self.outer_shape[d];
                rest /= self.outer_shape[d];
                base += idx[d] as isize * self.outer_strides[d];
            }
            for row in out.chunks_mut(self.run) {
                let b = base as usize;
                row.copy_from_slice(&self.src[b..b + row.len()]);
                for d in (0..k).rev() {
                    idx[d] += 1;
                    base += self.outer_strides[d];
                    if idx[d] < self.outer_shape[d] {
                        break;
                    }
                    base -= self.outer_strides[d] * self.outer_shape[d] as isize;
                    idx[d] = 0;
                }
            }
        }
    }

    /// Whether `t`'s storage holds exactly its elements, each once (a permutation of dims, no
    /// offset, no broadcast): then order-free reductions can read the storage directly.
    fn covers_storage(t: &FlexTensor) -> bool {
        let layout = t.layout();
        if layout.start_offset() != 0 || t.bytes().len() != layout.num_elements() * 4 {
            return false;
        }
        // Sorted by stride, each stride must be the product of the smaller dims' extents.
        let mut dims: Vec<(isize, usize)> = layout.strides().iter().copied().zip(layout.shape().iter().copied()).filter(|&(_, n)| n > 1).collect();
        dims.sort();
        let mut expect = 1isize;
        dims.iter().all(|&(stride, n)| {
            let ok = stride == expect;
            expect *= n as isize;
            ok
        })
    }

    /// `t` laid out contiguously from offset 0 over exactly its elements (itself when it is).
    fn dense(t: FlexTensor) -> FlexTensor {
        let layout = t.layout();
        let numel = layout.num_elements();
        if t.is_contiguous() && layout.start_offset() == 0 && t.bytes().len() == numel * 4 {
            return t;
        }
        let reader = Reader::new(&t);
        let mut out = vec![0f32; numel];
        let chunk = reader.chunk();
        out.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| reader.read(i * chunk, c));
        let shape: Vec<usize> = t.layout().shape().iter().copied().collect();
        FlexTensor::from_data(burn::tensor::TensorData::new(out, shape))
    }

    fn is_f32(t: &Tensor<Flex, 1>) -> bool {
        t.dtype() == DType::F32
    }

    /// An update's scalars, as f32.
    struct Consts {
        b1: f32,
        nb1: f32,
        b2: f32,
        nb2: f32,
        sbc2: f32,
        eps: f32,
        step: f32,
    }

    /// The update of one chunk; `prep(p, g)` applies the gradient scaling and weight decay.
    #[inline(always)]
    fn update_body<const FIRST: bool>(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &Consts, prep: impl Fn(f32, f32) -> (f32, f32)) {
        for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
            let (pi, gi) = prep(*p, g);
            let (mi, vi) = if FIRST { (gi * k.nb1, gi * gi * k.nb2) } else { (*m * k.b1 + gi * k.nb1, *v * k.b2 + gi * gi * k.nb2) };
            let denom = vi.sqrt() / k.sbc2 + k.eps;
            *p = pi - mi / denom * k.step;
            *m = mi;
            *v = vi;
        }
    }

    /// [`update_body`] compiled for `isa` (the caller checked the CPU has it). Every level gives
    /// the same bits: Rust never contracts `a * b + c` into an FMA, and vector square roots and
    /// divisions round as the scalar ones do.
    #[inline(always)]
    fn update<const FIRST: bool, P: Fn(f32, f32) -> (f32, f32)>(isa: Isa, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &Consts, prep: P) {
        #[cfg(target_arch = "x86_64")]
        match isa {
            Isa::Avx512 | Isa::Avx512Bf16 => {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                unsafe fn wide<const FIRST: bool, P: Fn(f32, f32) -> (f32, f32)>(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &Consts, prep: P) {
                    update_body::<FIRST>(p, m, v, g, k, prep)
                }
                // SAFETY: the caller checked that the CPU has AVX-512.
                return unsafe { wide::<FIRST, P>(p, m, v, g, k, prep) };
            }
            Isa::Avx2 => {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn wide<const FIRST: bool, P: Fn(f32, f32) -> (f32, f32)>(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &Consts, prep: P) {
                    update_body::<FIRST>(p, m, v, g, k, prep)
                }
                // SAFETY: the caller checked that the CPU has AVX2 and FMA.
                return unsafe { wide::<FIRST, P>(p, m, v, g, k, prep) };
            }
            Isa::Scalar => {}
        }
        update_body::<FIRST>(p, m, v, g, k, prep)
    }

    /// `Σ x²` in f64, over eight partial sums (one f64 chain is bound by the adder's latency:
    /// 3.4× slower on a 51 M-element gradient set).
    #[inline(always)]
    fn sq_body(c: &[f32]) -> f64 {
        let mut acc = [0f64; 8];
        let mut lanes = c.chunks_exact(8);
        for x in &mut lanes {
            for (a, &x) in acc.iter_mut().zip(x) {
                *a += (x * x) as f64;
            }
        }
        acc.iter().sum::<f64>() + lanes.remainder().iter().map(|&x| (x * x) as f64).sum::<f64>()
    }

    /// [`sq_body`] compiled for `isa` (the caller checked the CPU has it).
    fn sq(isa: Isa, c: &[f32]) -> f64 {
        #[cfg(target_arch = "x86_64")]
        match isa {
            Isa::Avx512 | Isa::Avx512Bf16 => {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                unsafe fn wide(c: &[f32]) -> f64 {
                    sq_body(c)
                }
                // SAFETY: the caller checked that the CPU has AVX-512.
                return unsafe { wide(c) };
            }
            Isa::Avx2 => {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn wide(c: &[f32]) -> f64 {
                    sq_body(c)
                }
                // SAFETY: the caller checked that the CPU has AVX2 and FMA.
                return unsafe { wide(c) };
            }
            Isa::Scalar => {}
        }
        sq_body(c)
    }

    /// [`OptimKernels::grad_sq_sum`] on flex with the kernels compiled for `isa` (supported).
    pub(super) fn grad_sq_sum_at<const D: usize>(isa: Isa, g: Tensor<Flex, D>, acc: &mut SqAcc<Flex>) -> Tensor<Flex, D> {
        let g = prim(g);
        if g.dtype() != DType::F32 {
            return sq_sum_tensors(tensor(g), acc);
        }
        let sq = |c: &[f32]| sq(isa, c);
        let s: f64 = if covers_storage(&g) {
            g.storage::<f32>().par_chunks(CHUNK).map(sq).sum()
        } else {
            let reader = Reader::new(&g);
            let chunk = reader.chunk();
            let n = g.layout().num_elements();
            (0..n.div_ceil(chunk))
                .into_par_iter()
                .map_init(Vec::new, |buf, i| {
                    buf.resize(chunk.min(n - i * chunk), 0.0);
                    reader.read(i * chunk, buf);
                    sq(buf)
                })
                .sum()
        };
        acc.host += s;
        tensor(g)
    }

    /// [`OptimKernels::adam_update`] on flex with the update compiled for `isa` (supported).
    pub(super) fn adam_update_at<const D: usize>(isa: Isa, p: Tensor<Flex, D>, g: Tensor<Flex, D>, moments: Option<(Tensor<Flex, 1>, Tensor<Flex, 1>)>, h: &AdamUpdate) -> (Tensor<Flex, D>, Tensor<Flex, 1>, Tensor<Flex, 1>) {
        let f32s = p.dtype() == DType::F32 && g.dtype() == DType::F32;
        if !f32s || moments.as_ref().is_some_and(|(m, v)| !is_f32(m) || !is_f32(v)) {
            let shape = p.shape();
            let n = shape.num_elements();
            let (p, m, v) = adam_update_tensors(p.reshape([n]), g.reshape([n]), moments, h);
            return (p.reshape(shape), m, v);
        }
        let n = p.shape().num_elements();
        // p and the moments are updated in place (they are ours alone after the backward;
        // flex copies a shared buffer first). g is read through its layout, chunk by chunk.
        let (mut p, g) = (dense(prim(p)), prim(g));
        let (mut m, mut v, first) = match moments {
            Some((m, v)) => (dense(prim(m)), dense(prim(v)), false),
            None => (FlexTensor::zeros([n].into(), DType::F32), FlexTensor::zeros([n].into(), DType::F32), true),
        };
        // The scalars as the tensor version's scalar ops see them: converted to f32 first.
        let f = |x: f64| x as f32;
        let (coef, b1, nb1, b2, nb2) = (f(h.coef), f(h.b1), f(1.0 - h.b1), f(h.b2), f(1.0 - h.b2));
        let (sbc2, eps, step) = (f(h.bc2.sqrt()), f(h.eps), f(h.lr / h.bc1));
        let k = Consts { b1, nb1, b2, nb2, sbc2, eps, step };
        let reader = Reader::new(&g);
        let chunk = reader.chunk();
        let (ps, ms, vs) = (p.storage_mut::<f32>(), m.storage_mut::<f32>(), v.storage_mut::<f32>());
        let work = ps.par_chunks_mut(chunk).zip(ms.par_chunks_mut(chunk)).zip(vs.par_chunks_mut(chunk)).enumerate();
        // One monomorphic loop per (scaling, decay) case, so each vectorizes without branches.
        macro_rules! run {
            ($prep:expr) => {
                work.for_each_init(Vec::new, |gbuf, (task, ((pc, mc), vc))| {
                    let gc = match reader.slice(task * chunk, pc.len()) {
                        Some(gc) => gc,
                        None => {
                            gbuf.resize(pc.len(), 0.0);
                            reader.read(task * chunk, gbuf);
                            &gbuf[..]
                        }
                    };
                    if first { update::<true, _>(isa, pc, mc, vc, gc, &k, $prep) } else { update::<false, _>(isa, pc, mc, vc, gc, &k, $prep) }
                })
            };
        }
        let scale = h.coef != 1.0;
        match (scale, h.decay) {
            (false, Decay::None) => run!(|p, g| (p, g)),
            (true, Decay::None) => run!(|p, g| (p, g * coef)),
            (false, Decay::L2(wd)) => run!(|p, g| (p, g + p * f(wd))),
            (true, Decay::L2(wd)) => run!(|p, g| (p, g * coef + p * f(wd))),
            (false, Decay::Decoupled(keep)) => run!(|p, g| (p * f(keep), g)),
            (true, Decay::Decoupled(keep)) => run!(|p, g| (p * f(keep), g * coef)),
        }
        (tensor(p), tensor(m), tensor(v))
    }

    impl OptimKernels for Flex {
        type Later = ();
        fn grad_sq_sum<const D: usize>(g: Tensor<Flex, D>, acc: &mut SqAcc<Flex>) -> Tensor<Flex, D> {
            grad_sq_sum_at(vramlab_simd::level(), g, acc)
        }

        fn adam_update<const D: usize>(p: Tensor<Flex, D>, g: Tensor<Flex, D>, moments: Option<(Tensor<Flex, 1>, Tensor<Flex, 1>)>, h: &AdamUpdate) -> (Tensor<Flex, D>, Tensor<Flex, 1>, Tensor<Flex, 1>) {
            adam_update_at(vramlab_simd::level(), p, g, moments, h)
        }
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;
    use vramlab_simd::testable_levels;

    fn vals(t: Tensor<Flex, 1>) -> Vec<f32> {
        t.into_data().to_vec::<f32>().unwrap()
    }

    /// `n` deterministic values in about [−2, 2) from `seed`: no device generator, which tests
    /// running in parallel reseed (a test drawing the same seed twice could get other values).
    fn random(n: usize, seed: u64) -> Tensor<Flex, 1> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect();
        Tensor::from_data(TensorData::new(v, [n]), &Default::default())
    }

    /// The flex update equals the tensor-op update bit for bit at every ISA level the CPU has,
    /// for every decay kind, with and without gradient scaling, on the first step and later
    /// ones, across parallel chunks and a tail shorter than the vector width.
    #[test]
    fn flex_update_equals_the_tensor_update_bit_for_bit() {
        let n = 3 * (1 << 16) + 123;
        for isa in testable_levels("flex_update_equals_the_tensor_update_bit_for_bit") {
            for (k, decay) in [Decay::None, Decay::L2(0.01), Decay::Decoupled(1.0 - 1e-4 * 0.01)].into_iter().enumerate() {
                for coef in [1.0, 0.37] {
                    let h = AdamUpdate { b1: 0.9, b2: 0.999, eps: 1e-8, lr: 1e-4, bc1: 1.0 - 0.9f64.powi(3), bc2: 1.0 - 0.999f64.powi(3), coef, decay };
                    let (p, g) = (random(n, 1 + k as u64), random(n, 11 + k as u64));
                    let (m, v) = (random(n, 21), random(n, 31).abs());
                    for moments in [None, Some((m.clone(), v.clone()))] {
                        let fast = flex::adam_update_at::<1>(isa, p.clone(), g.clone(), moments.clone(), &h);
                        let slow = adam_update_tensors(p.clone(), g.clone(), moments, &h);
                        let at = format!("{}, {decay:?} coef {coef}", isa.name());
                        assert_eq!(vals(fast.0), vals(slow.0), "p, {at}");
                        assert_eq!(vals(fast.1), vals(slow.1), "m, {at}");
                        assert_eq!(vals(fast.2), vals(slow.2), "v, {at}");
                    }
                }
            }
        }
    }

    /// The flex sum of squares at every ISA level equals one f64 sum of the squares (to f64
    /// rounding: the partial sums add in another order), contiguous and permuted.
    #[test]
    fn flex_sq_sum_at_every_level() {
        let n = (1 << 17) + 13;
        let g = random(n, 3);
        let data = g.clone().into_data().to_vec::<f32>().unwrap();
        let expect: f64 = data.iter().map(|&x| (x * x) as f64).sum();
        for isa in testable_levels("flex_sq_sum_at_every_level") {
            for t in [g.clone().reshape([n]), g.clone().reshape([n]).reshape([1, n]).transpose().reshape([n])] {
                let mut acc = SqAcc::default();
                let back = flex::grad_sq_sum_at(isa, t, &mut acc);
                assert!(((acc.host - expect) / expect).abs() < 1e-12, "{}: {} vs {expect}", isa.name(), acc.host);
                assert_eq!(vals(back), data);
            }
            let m = g.clone().narrow(0, 0, 1 << 17).reshape([256, 512]).transpose();
            let want: f64 = m.clone().into_data().to_vec::<f32>().unwrap().iter().map(|&x| (x * x) as f64).sum();
            let mut acc = SqAcc::default();
            flex::grad_sq_sum_at(isa, m, &mut acc);
            assert!(((acc.host - want) / want).abs() < 1e-12, "{} transposed: {} vs {want}", isa.name(), acc.host);
        }
    }

    /// A gradient in a permuted layout updates as its contiguous copy does.
    #[test]
    fn flex_update_reads_a_permuted_gradient_through_its_layout() {
        let dims = [70usize, 300, 5];
        let n: usize = dims.iter().product();
        let g = Tensor::<Flex, 3>::from_data(TensorData::new((0..n).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect::<Vec<_>>(), dims), &Default::default()).swap_dims(0, 1);
        let dense = Tensor::<Flex, 1>::from_data(TensorData::new(g.clone().into_data().to_vec::<f32>().unwrap(), [n]), &Default::default());
        let h = AdamUpdate { b1: 0.9, b2: 0.999, eps: 1e-8, lr: 1e-3, bc1: 0.1, bc2: 0.001, coef: 0.5, decay: Decay::Decoupled(0.99) };
        let p = random(n, 5);
        let p3 = p.clone().reshape([300, 70, 5]);
        let fast = <Flex as OptimKernels>::adam_update(p3, g, None, &h);
        let slow = adam_update_tensors(p, dense, None, &h);
        assert_eq!(fast.0.into_data().to_vec::<f32>().unwrap(), vals(slow.0));
        assert_eq!(vals(fast.2), vals(slow.2));
    }

    /// A transposed matrix gradient (every `nn::Linear` weight's: `[out, in]` with strides
    /// `[1, out]`), also offset and with a column stride beyond its rows, updates as its
    /// contiguous copy does, across several chunks of whole rows.
    #[test]
    fn flex_update_reads_a_transposed_gradient_by_columns() {
        let mat = |r: usize, c: usize, seed: usize| Tensor::<Flex, 2>::from_data(TensorData::new((0..r * c).map(|i| ((i * 7919 + seed) % 1013) as f32 * 1e-3 - 0.5).collect::<Vec<_>>(), [r, c]), &Default::default());
        let cases = [mat(700, 300, 1).transpose(), mat(400, 300, 2).narrow(0, 50, 300).transpose(), mat(300, 400, 3).narrow(1, 10, 300).transpose(), mat(2, 5, 4).transpose()];
        for (k, g) in cases.into_iter().enumerate() {
            let dims = g.dims();
            let n = dims[0] * dims[1];
            let dense = Tensor::<Flex, 1>::from_data(TensorData::new(g.clone().into_data().to_vec::<f32>().unwrap(), [n]), &Default::default());
            let h = AdamUpdate { b1: 0.9, b2: 0.999, eps: 1e-8, lr: 1e-3, bc1: 0.1, bc2: 0.001, coef: 0.5, decay: Decay::Decoupled(0.99) };
            let p = random(n, 7 + k as u64);
            let slow = adam_update_tensors(p.clone(), dense, None, &h);
            let (p, m, v) = (vals(slow.0), vals(slow.1), vals(slow.2));
            for isa in testable_levels("flex_update_reads_a_transposed_gradient_by_columns") {
                let fast = flex::adam_update_at(isa, random(n, 7 + k as u64).reshape(dims), g.clone(), None, &h);
                assert_eq!(fast.0.into_data().to_vec::<f32>().unwrap(), p, "case {k}, {}: p", isa.name());
                assert_eq!(vals(fast.1), m, "case {k}, {}: m", isa.name());
                assert_eq!(vals(fast.2), v, "case {k}, {}: v", isa.name());
            }
        }
    }

    /// A gradient in a permuted layout (as conv weight gradients come out of autodiff) gives the
    /// same sum of squares, and comes back with the same values.
    #[test]
    fn sq_sum_of_a_permuted_gradient() {
        // Also a permuted layout whose inner run is longer than 1, and a narrowed one (offset).
        for (dims, perm) in [([3usize, 5, 7], [1usize, 0, 2]), ([4, 6, 2], [2, 1, 0])] {
            let n: usize = dims.iter().product();
            let t = Tensor::<Flex, 3>::from_data(TensorData::new((0..n).map(|i| i as f32).collect::<Vec<_>>(), dims), &Default::default()).permute(perm);
            let expect = t.clone().into_data().to_vec::<f32>().unwrap();
            let back = <Flex as OptimKernels>::grad_sq_sum(t, &mut SqAcc::default());
            assert_eq!(back.into_data().to_vec::<f32>().unwrap(), expect, "{dims:?} {perm:?}");
            let t = Tensor::<Flex, 3>::from_data(TensorData::new((0..n).map(|i| i as f32).collect::<Vec<_>>(), dims), &Default::default()).narrow(1, 1, 2);
            let expect = t.clone().into_data().to_vec::<f32>().unwrap();
            let back = <Flex as OptimKernels>::grad_sq_sum(t, &mut SqAcc::default());
            assert_eq!(back.into_data().to_vec::<f32>().unwrap(), expect, "{dims:?} narrowed");
        }
        let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        let expect: f64 = data.iter().map(|&x| (x * x) as f64).sum();
        let g = Tensor::<Flex, 3>::from_data(TensorData::new(data, [2, 3, 4]), &Default::default()).swap_dims(0, 2);
        let before = g.clone().into_data().to_vec::<f32>().unwrap();
        let mut acc = SqAcc::default();
        let back = <Flex as OptimKernels>::grad_sq_sum(g, &mut acc);
        assert!(acc.device.is_none(), "flex f32 sums on the host");
        let s = acc.host;
        assert!((s - expect).abs() < 1e-9, "{s} vs {expect}");
        assert_eq!(back.dims(), [4, 3, 2]);
        assert_eq!(back.into_data().to_vec::<f32>().unwrap(), before);
    }
}
