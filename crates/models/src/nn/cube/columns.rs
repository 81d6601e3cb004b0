//! Convolutions as matrix products over blocks of im2col columns, for devices without matrix
//! units (no cmma, no mma: lavapipe, and any wgpu device that exposes neither), where Burn's
//! convolutions have only their direct kernel.
//!
//! For a block of output positions, [`columns_kernel`] writes the input values each position's
//! kernel window reads, one row per position (`[kernel position…, input channel]`, the order of a
//! channels-last weight's `[out, k…, in]`); the block's product with the weight is then CubeCL's
//! fixed matmul (the kernel [`super::matmul`] takes). On lavapipe that ran ResNet-18's and the
//! UNet's convolutions 1.2–5.6× faster than the direct kernel on most shapes
//! (`benches/results/kernels/wgpu/conv_columns.md`); [`handles`] says which convolutions take it.
//!
//! - forward ([`forward`]): `y[block, out] = columns[block, K] · w[out, K]ᵀ`, each block written
//!   straight into its rows of the channels-last output, then the bias;
//! - weight gradient ([`weight_backward`]): `dw[out, K] = Σ_blocks dy[block, out]ᵀ · columns[block, K]`.
//!
//! The columns are the only workspace: one buffer of at most [`COLUMN_BYTES`] (or a single row
//! where a row alone is larger), reused by every block. One compiled columns kernel serves every
//! convolution of a dtype (the geometry is runtime scalars; 1-D and 2-D convolutions are run as
//! 3-D ones with leading axes of size 1).

use burn::tensor::DType;
use burn::tensor::ops::ConvOptions;
use burn_cubecl::CubeRuntime;
use super::unit_matmul::matmul_into;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::zspace::metadata::Metadata;

use super::{elem_cubes, empty};

/// How many convolutions this path has run (tests: that a case took it).
#[cfg(test)]
pub(crate) static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The most bytes of im2col columns one block writes (the columns buffer, reused by every block).
pub const COLUMN_BYTES: usize = 4 << 20;

/// One unit per output position of the block and kernel position (`len` = rows × kernel
/// positions), each copying one window's `cin` input channels: `cols[r, (κ, ci)] =
/// x[n, o·s + κ·dil − pad, ci]` for output position `first + r` (`n, o_d, o_h, o_w`), zero in the
/// padding. `x` is `[n, d, h, w, cin]` in any strides; `cols` is `[rows, K]` contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn columns_kernel<F: Float>(
    x: &Tensor<F>,
    cols: &mut Tensor<F>,
    first: u32,
    len: u32,
    out_d: u32,
    out_h: u32,
    out_w: u32,
    win: Window,
    #[define(F)] _dtype: StorageType,
) {
    let j = ABSOLUTE_POS;
    if j >= len as usize {
        terminate!();
    }
    let cin = x.shape(4);
    let (k_d, k_h, k_w) = (win.k_d as usize, win.k_h as usize, win.k_w as usize);
    let (s_d, s_h, s_w) = (win.s_d as usize, win.s_h as usize, win.s_w as usize);
    let (p_d, p_h, p_w) = (win.p_d as usize, win.p_h as usize, win.p_w as usize);
    let (d_d, d_h, d_w) = (win.d_d as usize, win.d_h as usize, win.d_w as usize);
    let (out_d, out_h, out_w) = (out_d as usize, out_h as usize, out_w as usize);
    let kv = k_d * k_h * k_w;
    let kk = j % kv;
    let r = j / kv;
    let p = first as usize + r;
    let kw = kk % k_w;
    let kh = (kk / k_w) % k_h;
    let kd = kk / (k_w * k_h);
    let ow = p % out_w;
    let oh = (p / out_w) % out_h;
    let od = (p / (out_w * out_h)) % out_d;
    let n = p / (out_w * out_h * out_d);
    // Coordinates in the padded input: inside the input when `pad ≤ z < pad + size`.
    let zd = od * s_d + kd * d_d;
    let zh = oh * s_h + kh * d_h;
    let zw = ow * s_w + kw * d_w;
    let out = (r * kv + kk) * cin;
    let mut inside = false;
    let mut at = 0;
    if zd >= p_d && zh >= p_h && zw >= p_w {
        let (id, ih, iw) = (zd - p_d, zh - p_h, zw - p_w);
        if id < x.shape(1) && ih < x.shape(2) && iw < x.shape(3) {
            inside = true;
            at = n * x.stride(0) + id * x.stride(1) + ih * x.stride(2) + iw * x.stride(3);
        }
    }
    let cs = x.stride(4);
    if inside {
        for ci in 0..cin {
            cols[out + ci] = x[at + ci * cs];
        }
    } else {
        for ci in 0..cin {
            cols[out + ci] = F::new(0.0);
        }
    }
}

/// A convolution's window on three spatial axes (`d`, `h`, `w`: kernel, stride, padding,
/// dilation), as one kernel argument ([`Geometry::window`]): the columns kernel's, and
/// `weight_grad`'s and `forward_tiles`'.
#[derive(CubeLaunch, CubeType)]
pub(super) struct Window {
    pub k_d: u32,
    pub k_h: u32,
    pub k_w: u32,
    pub s_d: u32,
    pub s_h: u32,
    pub s_w: u32,
    pub p_d: u32,
    pub p_h: u32,
    pub p_w: u32,
    pub d_d: u32,
    pub d_h: u32,
    pub d_w: u32,
}

/// A convolution's sizes with its spatial axes padded in front to three.
pub(super) struct Geometry {
    pub batch: usize,
    cin: usize,
    pub out: [usize; 3],
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub padding: [usize; 3],
    pub dilation: [usize; 3],
}

impl Geometry {
    pub fn new<const N: usize>(x: &[usize], kernel: &[usize], o: &ConvOptions<N>) -> Self {
        let spatial = &x[1..=N];
        let out = burn::tensor::ops::conv::calculate_conv_output_sizes(kernel, &o.stride, &o.padding, &o.dilation, spatial);
        let three = |v: &[usize], fill: usize| {
            let mut t = [fill; 3];
            t[3 - N..].copy_from_slice(v);
            t
        };
        Self {
            batch: x[0],
            cin: x[N + 1],
            out: three(&out, 1),
            kernel: three(kernel, 1),
            stride: three(&o.stride, 1),
            padding: three(&o.padding, 0),
            dilation: three(&o.dilation, 1),
        }
    }
    /// [`Window`]'s launch argument for this geometry.
    pub fn window<R: Runtime>(&self) -> WindowLaunch<R> {
        let [k, s, p, d] = [self.kernel, self.stride, self.padding, self.dilation].map(|a| a.map(|v| v as u32));
        WindowLaunch::new(k[0], k[1], k[2], s[0], s[1], s[2], p[0], p[1], p[2], d[0], d[1], d[2])
    }
    /// Output positions (the rows of the columns).
    pub fn positions(&self) -> usize {
        self.batch * self.out.iter().product::<usize>()
    }
    /// Positions of the kernel window.
    pub fn kernel_positions(&self) -> usize {
        self.kernel.iter().product()
    }
    /// Columns per row: kernel positions × input channels.
    fn k(&self) -> usize {
        self.kernel_positions() * self.cin
    }
    /// Rows per block: as many as [`COLUMN_BYTES`] holds (at least one), a multiple of what
    /// keeps every block's first row at an offset the device can bind (`row_bytes`: the bytes
    /// of one row of the tensor the blocks are cut from).
    fn block_rows(&self, esize: usize, row_bytes: usize, align: usize) -> usize {
        let step = align / gcd(align, row_bytes);
        let rows = (column_bytes() / (self.k() * esize).max(1)).max(1);
        (rows / step * step).max(step).min(self.positions().next_multiple_of(step))
    }
}

/// What the register-tile kernels ([`super::forward_tiles`], [`super::weight_grad`]) both need: a
/// 3-D, ungrouped convolution whose input and output channel counts (of the channels-last weight
/// shape `[out, k…, in]`) are multiples of 4, in a float dtype, `x`'s indices within `u32`.
pub(super) fn tileable_3d<R: CubeRuntime, const N: usize>(x: &CubeTensor<R>, w_shape: &[usize], o: &ConvOptions<N>) -> bool {
    N == 3
        && o.groups == 1
        && w_shape[0] % 4 == 0
        && w_shape[N + 1] % 4 == 0
        && matches!(x.dtype, DType::F32 | DType::F16 | DType::BF16)
        && fits_u32(x.meta.num_elements())
}

/// Whether `n` is a non-zero size whose indices fit a kernel's `u32`.
pub(super) fn fits_u32(n: usize) -> bool {
    n > 0 && n <= u32::MAX as usize
}

/// [`COLUMN_BYTES`]; tests set less, to cut small convolutions into several blocks.
fn column_bytes() -> usize {
    #[cfg(test)]
    if let Some(b) = COLUMN_BYTES_FOR_TESTS.get() {
        return b;
    }
    COLUMN_BYTES
}

#[cfg(test)]
thread_local! {
    pub(crate) static COLUMN_BYTES_FOR_TESTS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// `t` (rank `N + 2`, channels last) seen as rank 5 `[n, d, h, w, c]` (size-1 axes in front of
/// its spatial ones), without a copy.
pub(super) fn rank5<R: CubeRuntime>(mut t: CubeTensor<R>) -> CubeTensor<R> {
    while t.meta.num_dims() < 5 {
        t.meta.insert(1, 1, 1);
    }
    t
}

/// `t`'s rows `first..first + rows` of its `[rows, cols]` (row-major, contiguous) view, without a
/// copy (`first`'s byte offset must be one the device binds: [`Geometry::block_rows`]).
fn rows<R: CubeRuntime>(t: &CubeTensor<R>, first: usize, rows: usize, cols: usize) -> CubeTensor<R> {
    let mut v = t.clone();
    v.handle = v.handle.offset_start((first * cols * t.dtype.size()) as u64);
    v.meta = Box::new(Metadata::new(vec![rows, cols], vec![cols, 1]));
    v
}

/// Writes the columns of output positions `first..first + len / kernel positions` into `cols`.
fn launch_columns<R: CubeRuntime>(x: &CubeTensor<R>, cols: &CubeTensor<R>, g: &Geometry, first: usize, len: usize) {
    let client = x.client.clone();
    let (count, dim) = elem_cubes(&client, len);
    let u = |v: usize| v as u32;
    let dtype: StorageType = x.dtype.into();
    columns_kernel::launch::<R>(
        &client,
        count,
        dim,
        x.clone().into_tensor_arg(),
        cols.clone().into_tensor_arg(),
        u(first),
        u(len),
        u(g.out[0]),
        u(g.out[1]),
        u(g.out[2]),
        g.window(),
        dtype,
    );
}

/// Whether this path takes a convolution: 1-D or 2-D, ungrouped, every index within `u32`, a
/// dtype the matmul computes in.
///
/// 3-D convolutions keep Burn's direct kernel: on lavapipe, on the VAE's shapes (16 and 32
/// channels, 3×3×3), the columns' forward was 1.2–1.3× slower and the 16-channel weight gradient
/// 1.15× slower (`benches/results/kernels/wgpu/conv_columns.md`); they are
/// [`super::forward_tiles`] and [`super::weight_grad`] where those take them.
pub fn handles<R: CubeRuntime, const N: usize>(x: &CubeTensor<R>, w_shape: &[usize], o: &ConvOptions<N>) -> bool {
    let g = Geometry::new::<N>(x.meta.shape(), &w_shape[1..=N], o);
    N <= 2 && o.groups == 1 && matches!(x.dtype, DType::F32 | DType::F16 | DType::BF16) && fits_u32(g.positions() * g.k()) && fits_u32(x.meta.num_elements())
}

/// The convolution of channels-last `x` (`[n, s…, cin]`) with channels-last `w` (`[out, k…, cin]`),
/// channels last (`[n, o…, out]` contiguous); `None` where the matmul cannot be set up for one of
/// its blocks (the caller then runs the convolution another way; what was launched is discarded).
pub fn forward<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, w: CubeTensor<R>, b: Option<CubeTensor<R>>, o: &ConvOptions<N>) -> Option<CubeTensor<R>> {
    #[cfg(test)]
    RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ws = w.meta.shape().to_vec();
    let g = Geometry::new::<N>(x.meta.shape(), &ws[1..=N], o);
    let (cout, k, positions) = (ws[0], g.k(), g.positions());
    let w = super::contiguous(w);
    let wt = burn_cubecl::ops::permute(reshape(w, vec![cout, k]), &[1, 0]);
    let mut dims = vec![g.batch];
    dims.extend(&g.out[3 - N..]);
    dims.push(cout);
    let y = empty(&x, dims.clone(), x.dtype);
    let row_bytes = cout * x.dtype.size();
    for_each_block(x, &g, row_bytes, |first, n, c| {
        matmul_into(c, wt.clone(), Some(rows(&y, first, n, cout)), y.dtype).ok().map(|_| ())
    })?;
    Some(match b {
        Some(b) => {
            let b = reshape(b, vec![1, cout]);
            reshape(burn_cubecl::ops::numeric::add(reshape(y, vec![positions, cout]), b), dims)
        }
        None => y,
    })
}

/// The weight gradient of [`forward`] for channels-last `x` and output gradient `dy`
/// (`[n, o…, out]`), as a channels-last `[out, k…, cin]` (`shape`) tensor; `None` as in
/// [`forward`].
pub fn weight_backward<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, dy: CubeTensor<R>, shape: &[usize], o: &ConvOptions<N>) -> Option<CubeTensor<R>> {
    #[cfg(test)]
    RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let g = Geometry::new::<N>(x.meta.shape(), &shape[1..=N], o);
    let cout = shape[0];
    let dtype = x.dtype;
    let dy = super::contiguous(dy);
    let mut dw: Option<CubeTensor<R>> = None;
    for_each_block(x, &g, cout * dy.dtype.size(), |first, n, c| {
        let part = matmul_into(burn_cubecl::ops::permute(rows(&dy, first, n, cout), &[1, 0]), c, None, dtype).ok()?;
        dw = Some(match dw.take() {
            None => part,
            Some(acc) => burn_cubecl::ops::numeric::add(acc, part),
        });
        Some(())
    })?;
    Some(reshape(dw?, shape.to_vec()))
}

/// Cuts the output positions of `g` into blocks ([`Geometry::block_rows`], `row_bytes` the bytes
/// of one position's row in the tensor the caller cuts into the same blocks), writes each block's
/// columns of `x` (channels last) into one reused buffer, and hands `f` the block's first
/// position, its length and its columns (`[rows, K]`). Stops at the first `None` from `f`.
fn for_each_block<R: CubeRuntime>(x: CubeTensor<R>, g: &Geometry, row_bytes: usize, mut f: impl FnMut(usize, usize, CubeTensor<R>) -> Option<()>) -> Option<()> {
    let (k, positions) = (g.k(), g.positions());
    let x = rank5(x);
    let align = x.client.properties().memory.alignment as usize;
    let block = g.block_rows(x.dtype.size(), row_bytes, align);
    let cols = empty(&x, vec![block, k], x.dtype);
    let mut first = 0;
    while first < positions {
        let n = block.min(positions - first);
        let c = rows(&cols, 0, n, k);
        launch_columns(&x, &c, g, first, n * g.kernel_positions());
        f(first, n, c)?;
        first += n;
    }
    Some(())
}

/// `t` with `dims` (Burn's reshape: without a copy where `t` is contiguous, as everywhere here).
fn reshape<R: CubeRuntime>(t: CubeTensor<R>, dims: Vec<usize>) -> CubeTensor<R> {
    burn_cubecl::ops::reshape(t, burn::tensor::Shape::from(dims))
}
