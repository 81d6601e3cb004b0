//! GroupNorm (+ an optional fused SiLU, Mish or ReLU, [`Activation`]) on CubeCL: the forward in two launches (per-group
//! mean and 1/std, one cube per group, two passes over the group: the mean, then the centred
//! sum of squares; then one unit per element for the affine and the activation), or in one
//! where the groups are small or many (the same cube per group then writes its outputs in a
//! third pass, [`fused_forward`]), the backward
//! in three (per `(sample, channel)` sums of `g` and `g · x̂`, one cube each; a small pass for
//! the per-group means and the per-channel parameter gradients; one unit per element for
//! `dx`), or on a GPU in two where the groups are of few channels (the `dx` units then compute
//! the group's means from the sums themselves, [`finish_inline`]). `g` is the gradient at the affine's output: `dy`, or with an activation
//! `dy · act'(z)` with `z` recomputed from the input and the kept statistics. The node's saved state is the one
//! of `lean::norm` (input + per-group mean and 1/std); formulas in that file's header.
//!
//! With a residual `r` ([`forward`]'s `residual`: ResNet's block end, `relu(bn2(·) + identity)`)
//! the forward adds `r` to the affine's output before the activation, and the backward takes the
//! mask from the kept output `y` instead of recomputing the pre-activation: its first pass writes
//! `g = dy where y > 0` (the residual's gradient) beside its sums, and `dx` reads that `g`.
//!
//! `x: [n, c, s…]` is read as `[n, c, S]`, channels first or channels last
//! ([`ChannelLayout`](super::ChannelLayout): the latter is what Burn's convolutions return on CubeCL); `y` and `dx`
//! are written in `x`'s layout, `dy` is read in its own. Any other layout is copied to
//! channels first.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::act::{apply_mish, mish_slope};
use super::{BLOCK, channel_layout, cube_row, cube_sum, elem_cubes, empty, empty_in, f32_of, into_layout, row_cubes};

/// The activation applied to the affine's output `z` in the same kernels (a comptime switch:
/// one compiled kernel each). The backward recomputes `z`, so the node keeps only the norm's
/// input: the 3D-VAE's `norm → silu`, Diffusion's `GroupNorm → Mish` (its `Conv1dBlock`s) and
/// `GroupNorm → ReLU` (its ResNet-18's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    None,
    Silu,
    Mish,
    Relu,
}

const NONE: u32 = 0;
const SILU: u32 = 1;
const MISH: u32 = 2;
const RELU: u32 = 3;

impl Activation {
    fn code(self) -> u32 {
        match self {
            Activation::None => NONE,
            Activation::Silu => SILU,
            Activation::Mish => MISH,
            Activation::Relu => RELU,
        }
    }
}

/// `act(z)` for an [`Activation::code`].
#[cube]
fn activate(z: f32, #[comptime] act: u32) -> f32 {
    let mut out = z;
    if comptime![act == SILU] {
        out = silu(z);
    }
    if comptime![act == MISH] {
        out = apply_mish(z);
    }
    if comptime![act == RELU] {
        out = z.max(0.0f32);
    }
    out
}

/// `dy · act'(z)` for an [`Activation::code`] (ReLU: `dy` where `z > 0`, as the ReLU node's
/// "where the output is > 0").
#[cube]
fn activation_grad(z: f32, dy: f32, #[comptime] act: u32) -> f32 {
    let mut g = dy;
    if comptime![act == SILU] {
        g = silu_grad(z, dy);
    }
    if comptime![act == MISH] {
        g = dy * mish_slope(z);
    }
    if comptime![act == RELU] {
        if z <= 0.0f32 {
            g = 0.0f32;
        }
    }
    g
}

/// The mean of the `len` elements of one group, in every unit of its cube: element `k` at
/// `base + k % inner + (k / inner)·outer`.
#[cube]
fn group_mean<F: Float>(x: &Tensor<F>, base: usize, len: usize, inner: usize, outer: usize, shared: &mut SharedMemory<f32>) -> f32 {
    let mut s = 0.0f32;
    let mut i = UNIT_POS_X as usize;
    while i < len {
        s += f32::cast_from(x[base + i % inner + (i / inner) * outer]);
        i += BLOCK;
    }
    cube_sum(s, shared) / f32::cast_from(len)
}

/// `1/sqrt(var + eps)` of one group (as [`group_mean`]), from the centred sum of squares.
#[cube]
#[allow(clippy::too_many_arguments)]
fn group_rstd<F: Float>(x: &Tensor<F>, base: usize, len: usize, inner: usize, outer: usize, mu: f32, eps: f32, shared: &mut SharedMemory<f32>) -> f32 {
    let mut q = 0.0f32;
    let mut j = UNIT_POS_X as usize;
    while j < len {
        let d = f32::cast_from(x[base + j % inner + (j / inner) * outer]) - mu;
        q += d * d;
        j += BLOCK;
    }
    1.0f32 / (cube_sum(q, shared) / f32::cast_from(len) + eps).sqrt()
}

/// One cube per `(sample, group)` of `len` elements: its mean and `1/sqrt(var + eps)`. Element
/// `k` of group `g` of sample `n` is at `n·sample + g·group + k % inner + (k / inner)·outer`:
/// channels first, the group is one run (`inner = len`); channels last, runs of `c/groups`
/// channels `c` apart.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn stats_kernel<F: Float>(x: &Tensor<F>, mean: &mut Tensor<f32>, rstd: &mut Tensor<f32>, rows: u32, len: u32, groups: u32, sample: u32, group: u32, inner: u32, outer: u32, eps: f32, #[define(F)] _dtype: StorageType) {
    let row = cube_row();
    if row >= rows as usize {
        terminate!();
    }
    let (len, inner, outer) = (len as usize, inner as usize, outer as usize);
    let base = (row / groups as usize) * sample as usize + (row % groups as usize) * group as usize;
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let mu = group_mean::<F>(x, base, len, inner, outer, &mut shared);
    let rs = group_rstd::<F>(x, base, len, inner, outer, mu, eps, &mut shared);
    if UNIT_POS_X == 0 {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

/// [`stats_kernel`] and [`apply_kernel`] in one launch for groups small enough that one cube
/// per group writes its outputs as fast as a unit per element would ([`fused_forward`]): the
/// statistics, then a third pass over the group writing `y` (in `x`'s layout: the same buffer
/// index). Channel of element `k`: `g·cpg + (k / ch_div) % cpg` (`ch_div` the spatial size
/// channels first, 1 channels last). With `residual`, `r` (in `x`'s layout) joins before the
/// activation.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn stats_apply_kernel<F: Float>(x: &Tensor<F>, w: &Tensor<f32>, b: &Tensor<f32>, r: &Tensor<F>, y: &mut Tensor<F>, mean: &mut Tensor<f32>, rstd: &mut Tensor<f32>, rows: u32, len: u32, groups: u32, sample: u32, group: u32, inner: u32, outer: u32, cpg: u32, ch_div: u32, eps: f32, #[comptime] act: u32, #[comptime] residual: bool, #[define(F)] _dtype: StorageType) {
    let row = cube_row();
    if row >= rows as usize {
        terminate!();
    }
    let (len, inner, outer) = (len as usize, inner as usize, outer as usize);
    let base = (row / groups as usize) * sample as usize + (row % groups as usize) * group as usize;
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let mu = group_mean::<F>(x, base, len, inner, outer, &mut shared);
    let rs = group_rstd::<F>(x, base, len, inner, outer, mu, eps, &mut shared);
    if UNIT_POS_X == 0 {
        mean[row] = mu;
        rstd[row] = rs;
    }
    let ch0 = (row % groups as usize) * cpg as usize;
    let mut k = UNIT_POS_X as usize;
    while k < len {
        let at = base + k % inner + (k / inner) * outer;
        let ch = ch0 + (k / ch_div as usize) % cpg as usize;
        let mut z = (f32::cast_from(x[at]) - mu) * rs * w[ch] + b[ch];
        if comptime![residual] {
            z += f32::cast_from(r[at]);
        }
        y[at] = F::cast_from(activate(z, act));
        k += BLOCK;
    }
}

/// `silu(z)`.
#[cube]
fn silu(z: f32) -> f32 {
    z / (1.0f32 + (-z).exp())
}

/// `dy · silu'(z)`.
#[cube]
fn silu_grad(z: f32, dy: f32) -> f32 {
    let s = 1.0f32 / (1.0f32 + (-z).exp());
    dy * s * (z * (1.0f32 - s) + 1.0f32)
}

/// One unit per element of `x` and `y` (one layout): `y = act((x − mean) · rstd · w + b (+ r))`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn apply_kernel<F: Float>(x: &Tensor<F>, mean: &Tensor<f32>, rstd: &Tensor<f32>, w: &Tensor<f32>, b: &Tensor<f32>, r: &Tensor<F>, y: &mut Tensor<F>, sample: u32, channel: u32, channels: u32, cpg: u32, #[comptime] act: u32, #[comptime] residual: bool, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= y.len() {
        terminate!();
    }
    let ch = (i / channel as usize) % channels as usize;
    let grp = ((i / sample as usize) * channels as usize + ch) / cpg as usize;
    let mut z = (f32::cast_from(x[i]) - mean[grp]) * rstd[grp] * w[ch] + b[ch];
    if comptime![residual] {
        z += f32::cast_from(r[i]);
    }
    y[i] = F::cast_from(activate(z, act));
}

/// One cube per `(sample, channel)` row of `spatial` elements: `Σ g` and `Σ g · x̂`. `x`'s
/// element `(n, c, s)` is at `n·sample + c·x_c + s·x_s`, `dy`'s at `n·sample + c·dy_c + s·dy_s`.
/// `masked` (a residual's forward): `g = dy where y > 0` (`y` the kept output, in `x`'s layout),
/// written to `g_out` at `dy`'s index (every element once: the rows cover the tensor).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn reduce_kernel<F: Float, G: Float>(x: &Tensor<F>, dy: &Tensor<G>, y: &Tensor<F>, mean: &Tensor<f32>, rstd: &Tensor<f32>, w: &Tensor<f32>, b: &Tensor<f32>, sum_g: &mut Tensor<f32>, sum_gx: &mut Tensor<f32>, g_out: &mut Tensor<G>, rows: u32, spatial: u32, channels: u32, cpg: u32, sample: u32, x_c: u32, x_s: u32, dy_c: u32, dy_s: u32, #[comptime] act: u32, #[comptime] masked: bool, #[define(F, G)] _dtypes: [StorageType; 2]) {
    let row = cube_row();
    if row >= rows as usize {
        terminate!();
    }
    let spatial = spatial as usize;
    let ch = row % channels as usize;
    let grp = row / cpg as usize;
    let (mu, r, wc, bc) = (mean[grp], rstd[grp], w[ch], b[ch]);
    let n0 = (row / channels as usize) * sample as usize;
    let (xb, dyb) = (n0 + ch * x_c as usize, n0 + ch * dy_c as usize);
    let (x_s, dy_s) = (x_s as usize, dy_s as usize);
    let mut s1 = 0.0f32;
    let mut s2 = 0.0f32;
    let mut i = UNIT_POS_X as usize;
    while i < spatial {
        let xh = (f32::cast_from(x[xb + i * x_s]) - mu) * r;
        let mut dyv = dy[dyb + i * dy_s];
        if comptime![masked] {
            dyv = select(y[xb + i * x_s] <= F::new(0.0), G::new(0.0), dyv);
            g_out[dyb + i * dy_s] = dyv;
        }
        let mut g = f32::cast_from(dyv);
        if comptime![!masked && act != NONE] {
            g = activation_grad(xh * wc + bc, g, act);
        }
        s1 += g;
        s2 += g * xh;
        i += BLOCK;
    }
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let t1 = cube_sum(s1, &mut shared);
    let t2 = cube_sum(s2, &mut shared);
    if UNIT_POS_X == 0 {
        sum_g[row] = t1;
        sum_gx[row] = t2;
    }
}

/// Units `< batch · groups`: the group's `mean(g · w)` and `mean(g · w · x̂)`; units
/// `< channels`: `dweight = Σ_n Σ g · x̂`, `dbias = Σ_n Σ g`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn finish_kernel(sum_g: &Tensor<f32>, sum_gx: &Tensor<f32>, w: &Tensor<f32>, m1: &mut Tensor<f32>, m2: &mut Tensor<f32>, dweight: &mut Tensor<f32>, dbias: &mut Tensor<f32>, batch: u32, channels: u32, groups: u32, len: u32) {
    let i = ABSOLUTE_POS;
    let (batch, channels, groups) = (batch as usize, channels as usize, groups as usize);
    let cpg = channels / groups;
    if i < batch * groups {
        let n = i / groups;
        let first = n * channels + (i % groups) * cpg;
        let mut a = 0.0f32;
        let mut c = 0.0f32;
        for k in 0..cpg {
            let wk = w[(i % groups) * cpg + k];
            a += wk * sum_g[first + k];
            c += wk * sum_gx[first + k];
        }
        m1[i] = a / f32::cast_from(len);
        m2[i] = c / f32::cast_from(len);
    }
    if i < channels {
        let mut dw = 0.0f32;
        let mut db = 0.0f32;
        for n in 0..batch {
            dw += sum_gx[n * channels + i];
            db += sum_g[n * channels + i];
        }
        dweight[i] = dw;
        dbias[i] = db;
    }
}

/// One unit per element of `x` and `dx` (one layout): `dx = (g · w − m1 − x̂ · m2) · rstd`,
/// `dy` in its own layout (`n·sample + c·dy_c + s·dy_s`). Without `finish`, `s1`, `s2` are the
/// group means `m1`, `m2` of [`finish_kernel`] (`[n · groups]`), which also wrote `dweight` and
/// `dbias` (not touched here). With `finish` ([`finish_inline`]), they are the per-channel sums
/// `sum_g`, `sum_gx` (`[n · c]`): each unit sums its group's into `m1`, `m2` itself (the same
/// products in the same order as [`finish_kernel`]), and units `< channels` write `dweight`,
/// `dbias`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn dx_kernel<F: Float, G: Float>(x: &Tensor<F>, dy: &Tensor<G>, mean: &Tensor<f32>, rstd: &Tensor<f32>, w: &Tensor<f32>, b: &Tensor<f32>, s1: &Tensor<f32>, s2: &Tensor<f32>, dx: &mut Tensor<F>, dweight: &mut Tensor<f32>, dbias: &mut Tensor<f32>, batch: u32, len: u32, sample: u32, spatial: u32, channels: u32, cpg: u32, x_c: u32, x_s: u32, dy_c: u32, dy_s: u32, #[comptime] act: u32, #[comptime] finish: bool, #[define(F, G)] _dtypes: [StorageType; 2]) {
    let i = ABSOLUTE_POS;
    if i >= dx.len() {
        terminate!();
    }
    let (channels, cpg) = (channels as usize, cpg as usize);
    let n = i / sample as usize;
    let ch = (i / x_c as usize) % channels;
    let sp = (i / x_s as usize) % spatial as usize;
    let grp = (n * channels + ch) / cpg;
    let mut m1 = 0.0f32;
    let mut m2 = 0.0f32;
    if comptime![finish] {
        if i < channels {
            let mut dw = 0.0f32;
            let mut db = 0.0f32;
            for k in 0..batch as usize {
                dw += s2[k * channels + i];
                db += s1[k * channels + i];
            }
            dweight[i] = dw;
            dbias[i] = db;
        }
        // The group's first channel in `w` and in the `[n, c]` sums.
        let (w0, first) = ((ch / cpg) * cpg, grp * cpg);
        for k in 0..cpg {
            let wk = w[w0 + k];
            m1 += wk * s1[first + k];
            m2 += wk * s2[first + k];
        }
        m1 /= f32::cast_from(len);
        m2 /= f32::cast_from(len);
    } else {
        m1 = s1[grp];
        m2 = s2[grp];
    }
    let r = rstd[grp];
    let xh = (f32::cast_from(x[i]) - mean[grp]) * r;
    let mut g = f32::cast_from(dy[n * sample as usize + ch * dy_c as usize + sp * dy_s as usize]);
    if comptime![act != NONE] {
        g = activation_grad(xh * w[ch] + b[ch], g, act);
    }
    dx[i] = F::cast_from((g * w[ch] - m1 - xh * m2) * r);
}

/// `[n, c, S]` and the group size of `x`'s dims.
struct Dims {
    n: usize,
    c: usize,
    spatial: usize,
    groups: usize,
}

impl Dims {
    fn of(dims: &[usize], groups: usize) -> Self {
        Dims { n: dims[0], c: dims[1], spatial: dims[2..].iter().product(), groups }
    }
    fn cpg(&self) -> usize {
        self.c / self.groups
    }
    fn len(&self) -> usize {
        self.cpg() * self.spatial
    }
}

/// Whether the forward takes one launch ([`stats_apply_kernel`]: a cube per group computes the
/// statistics and writes the group's outputs) rather than two (the statistics, then a unit per
/// element). A cube per group already reads every group twice for the statistics; a third pass
/// there costs less than a second launch while the groups are small or many: Diffusion's UNet
/// (at most 4,096 elements a group) and its ResNet-18's GroupNorms from batch 16 on
/// (`[n, c, h, w]` with `c/16` groups: 16·h·w elements, `n·c/16` groups). Few large groups
/// (the VAE's `[2, c, 8, 32, 32]` with 8 groups, 16 cubes) keep the two launches, where the
/// second pass over the map runs a unit per element instead of a cube per group.
fn fused_forward(rows: usize, len: usize) -> bool {
    len <= 4096 || (len <= 32_768 && rows >= 128)
}

/// Whether the backward takes two launches rather than three: each `dx` unit sums its group's
/// per-channel sums itself ([`dx_kernel`]'s `finish`, `2·cpg` more reads a unit, from cache) instead
/// of reading the group's means from a launch of their own ([`finish_kernel`]). Taken on a GPU
/// for groups of at most 4 channels: the VAE's GroupNorms (up to 32 groups: 1 channel a group
/// in ultra_lightweight, up to 4 in base32, 8 in standard's widest) save a launch each (ultra
/// b2: 28 of 438 a step). Not on lavapipe ([`super::cpu_vulkan`]), where the launch saved costs
/// less than the reads: on the VAE ultra b2 row the `dx` pass took 74.6 instead of 52.5 ms a step
/// and the 28 finishing launches under 9 ms (`benches/results/kernels/wgpu/launch_trims.md`,
/// 2026-12-07, third session). Diffusion's ResNet-18 (16 channels a group) and UNet (64–256)
/// keep the third launch everywhere.
fn finish_inline<R: CubeRuntime>(client: &ComputeClient<R>, cpg: usize) -> bool {
    #[cfg(test)]
    let asked = FINISH_INLINE_FOR_TESTS.get();
    #[cfg(not(test))]
    let asked: Option<bool> = None;
    cpg <= 4 && asked.unwrap_or_else(|| !super::cpu_vulkan(&client.properties().features))
}

#[cfg(test)]
thread_local! {
    /// Tests: whether [`finish_inline`] takes the two launches where the groups allow it, on
    /// this thread, whatever the device.
    pub(crate) static FINISH_INLINE_FOR_TESTS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// The forward: `(y, mean, rstd)`, `y` in `x`'s dims and dtype, `mean`/`rstd` f32
/// `[n, groups, 1, 1]`. `weight`, `bias`: `[c]` (cast to f32 if they are not). `residual` (`x`'s
/// dims and dtype, read in `x`'s layout: copied into it if it is not) is added to the affine's
/// output before `act`: `act(norm(x) + residual)`.
#[allow(clippy::too_many_arguments)]
pub fn forward<R: CubeRuntime>(x: CubeTensor<R>, weight: CubeTensor<R>, bias: CubeTensor<R>, residual: Option<CubeTensor<R>>, groups: usize, eps: f64, act: Activation) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let (x, layout) = channel_layout(x);
    let (w, b) = (f32_of(weight), f32_of(bias));
    let dims = x.meta.shape().to_vec();
    let d = Dims::of(&dims, groups);
    let rows = d.n * groups;
    let mean = empty(&x, vec![d.n, groups, 1, 1], DType::F32);
    let rstd = empty(&x, vec![d.n, groups, 1, 1], DType::F32);
    let client = x.client.clone();
    let dtype: StorageType = x.dtype.into();
    let with_residual = residual.is_some();
    // Without a residual the kernels never read their `r` argument: `x` stands in for it.
    let r = residual.map(|r| into_layout(r, layout)).unwrap_or_else(|| x.clone());
    let (count, dim) = row_cubes(rows);
    // A group's elements: one run channels first; `c/groups`-channel runs `c` apart channels last.
    let (inner, outer) = if layout.is_last() { (d.cpg(), d.c) } else { (d.len(), 0) };
    let (sample, group) = ((d.c * d.spatial) as u32, (d.cpg() * layout.channel) as u32);
    if fused_forward(rows, d.len()) {
        let y = empty_in(&x, dims, x.dtype, layout);
        let ch_div = if layout.is_last() { 1 } else { d.spatial };
        stats_apply_kernel::launch::<R>(
            &client,
            count,
            dim,
            x.into_tensor_arg(),
            w.into_tensor_arg(),
            b.into_tensor_arg(),
            r.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            mean.clone().into_tensor_arg(),
            rstd.clone().into_tensor_arg(),
            rows as u32,
            d.len() as u32,
            groups as u32,
            sample,
            group,
            inner as u32,
            outer as u32,
            d.cpg() as u32,
            ch_div as u32,
            eps as f32,
            act.code(),
            with_residual,
            dtype,
        );
        return (y, mean, rstd);
    }
    stats_kernel::launch::<R>(&client, count, dim, x.clone().into_tensor_arg(), mean.clone().into_tensor_arg(), rstd.clone().into_tensor_arg(), rows as u32, d.len() as u32, groups as u32, sample, group, inner as u32, outer as u32, eps as f32, dtype);
    let y = empty_in(&x, dims, x.dtype, layout);
    let (count, dim) = elem_cubes(&client, d.n * d.c * d.spatial);
    apply_kernel::launch::<R>(
        &client,
        count,
        dim,
        x.into_tensor_arg(),
        mean.clone().into_tensor_arg(),
        rstd.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        b.into_tensor_arg(),
        r.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        sample,
        layout.channel as u32,
        d.c as u32,
        d.cpg() as u32,
        act.code(),
        with_residual,
        dtype,
    );
    (y, mean, rstd)
}

/// The backward: `(dx, dweight, dbias, g)`, `dx` in `x`'s dims and dtype, the others f32 `[c]`.
/// `y`: the kept output of a forward with a residual (`act` then [`Activation::Relu`], whose
/// mask it gives: `g = dy where y > 0`, the residual's gradient, returned in `dy`'s layout and
/// dtype; `None` otherwise).
#[allow(clippy::too_many_arguments)]
pub fn backward<R: CubeRuntime>(x: CubeTensor<R>, mean: CubeTensor<R>, rstd: CubeTensor<R>, weight: CubeTensor<R>, bias: CubeTensor<R>, dy: CubeTensor<R>, y: Option<CubeTensor<R>>, groups: usize, act: Activation) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>, Option<CubeTensor<R>>) {
    let (x, xl) = channel_layout(x);
    let (dy, dyl) = channel_layout(dy);
    let (mean, rstd) = (f32_of(mean), f32_of(rstd));
    let (w, b) = (f32_of(weight), f32_of(bias));
    let dims = x.meta.shape().to_vec();
    let d = Dims::of(&dims, groups);
    let sample = (d.c * d.spatial) as u32;
    let client = x.client.clone();
    let dtypes: [StorageType; 2] = [x.dtype.into(), dy.dtype.into()];
    let rows = d.n * d.c;
    let sum_g = empty(&x, vec![rows], DType::F32);
    let sum_gx = empty(&x, vec![rows], DType::F32);
    let masked = y.is_some();
    // Without a mask the kernel reads no `y` (`x` stands in) and writes no `g` (one element
    // stands in: a writable binding may not alias a read one). With it, `g` goes into `dy`'s
    // buffer when that is `dy`'s alone (each unit reads its `dy` before writing the same index).
    let y = y.map(|y| into_layout(y, xl)).unwrap_or_else(|| x.clone());
    let (g, g_arg) = if !masked {
        (None, empty(&x, vec![1], dy.dtype).into_tensor_arg())
    } else if dy.can_mut() {
        (Some(dy.clone()), dy.as_tensor_alias(1))
    } else {
        let g = empty_in(&dy, dims.clone(), dy.dtype, dyl);
        (Some(g.clone()), g.into_tensor_arg())
    };
    let (count, dim) = row_cubes(rows);
    reduce_kernel::launch::<R>(
        &client,
        count,
        dim,
        x.clone().into_tensor_arg(),
        dy.clone().into_tensor_arg(),
        y.into_tensor_arg(),
        mean.clone().into_tensor_arg(),
        rstd.clone().into_tensor_arg(),
        w.clone().into_tensor_arg(),
        b.clone().into_tensor_arg(),
        sum_g.clone().into_tensor_arg(),
        sum_gx.clone().into_tensor_arg(),
        g_arg,
        rows as u32,
        d.spatial as u32,
        d.c as u32,
        d.cpg() as u32,
        sample,
        xl.channel as u32,
        xl.spatial as u32,
        dyl.channel as u32,
        dyl.spatial as u32,
        act.code(),
        masked,
        dtypes,
    );
    let dweight = empty(&x, vec![d.c], DType::F32);
    let dbias = empty(&x, vec![d.c], DType::F32);
    let dx = empty_in(&x, dims, x.dtype, xl);
    let (count, dim) = elem_cubes(&client, d.n * d.c * d.spatial);
    // With the mask, `dx` reads the masked `g` the first pass wrote (no activation left).
    let (grad, act) = match &g {
        Some(g) => (g.clone(), NONE),
        None => (dy, act.code()),
    };
    let finish = finish_inline(&client, d.cpg());
    // The group means `m1`, `m2` from a launch of their own, or in the `dx` launch from the sums.
    let (s1, s2) = if finish {
        (sum_g, sum_gx)
    } else {
        let m1 = empty(&x, vec![d.n * groups], DType::F32);
        let m2 = empty(&x, vec![d.n * groups], DType::F32);
        let (count, dim) = elem_cubes(&client, (d.n * groups).max(d.c));
        finish_kernel::launch::<R>(
            &client,
            count,
            dim,
            sum_g.into_tensor_arg(),
            sum_gx.into_tensor_arg(),
            w.clone().into_tensor_arg(),
            m1.clone().into_tensor_arg(),
            m2.clone().into_tensor_arg(),
            dweight.clone().into_tensor_arg(),
            dbias.clone().into_tensor_arg(),
            d.n as u32,
            d.c as u32,
            groups as u32,
            d.len() as u32,
        );
        (m1, m2)
    };
    dx_kernel::launch::<R>(
        &client,
        count,
        dim,
        x.into_tensor_arg(),
        grad.into_tensor_arg(),
        mean.into_tensor_arg(),
        rstd.into_tensor_arg(),
        w.into_tensor_arg(),
        b.into_tensor_arg(),
        s1.into_tensor_arg(),
        s2.into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        dweight.clone().into_tensor_arg(),
        dbias.clone().into_tensor_arg(),
        d.n as u32,
        d.len() as u32,
        sample,
        d.spatial as u32,
        d.c as u32,
        d.cpg() as u32,
        xl.channel as u32,
        xl.spatial as u32,
        dyl.channel as u32,
        dyl.spatial as u32,
        act,
        finish,
        dtypes,
    );
    (dx, dweight, dbias, g)
}
