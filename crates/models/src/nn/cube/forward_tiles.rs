//! 3-D convolutions (forward, and so the stride-1 input gradients, which the lean nodes compute
//! as forward convolutions with the flipped weight) with a register tile per unit, for devices
//! without matrix units: each unit computes four output positions along the width × four output
//! channels, reading per kernel position and block of four input channels four 4-wide input
//! vectors and four 4-wide weight vectors for 64 multiply-adds (Burn's direct kernel reads five
//! for 16). Bounds are checked per depth and height row once, per width position once per kernel
//! column. Taken ([`handles`]) where both channel counts are multiples of 4; one compiled kernel
//! per dtype serves every shape. On a device with matrix units it is one of [`super::conv`]'s
//! search candidates instead (one unit per tile there too).

use burn::tensor::ops::ConvOptions;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::columns::{Geometry, Window, fits_u32, rank5, tileable_3d};
use super::{contiguous, elem_cubes, empty};

/// How many convolutions this path has run (tests: that a case took it).
#[cfg(test)]
pub(crate) static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

type V4 = Vector<f32, Const<4>>;

/// Σ of the lanes of `a · b`.
#[cube]
fn dot4(a: V4, b: V4) -> f32 {
    let p = a * b;
    p[0] + p[1] + p[2] + p[3]
}

/// One unit per tile (output row `(n, o_d, o_h)`, widths `ow..ow + 4`, channels `co..co + 4`;
/// `t = (row · w_tiles + ow/4) · cout/4 + co/4`): `y[n, o, co + j] = b[co + j] + Σ_{κ, ci}
/// x[n, o·s + κ·dil − pad, ci] · w[co + j, κ, ci]` (zero padding). `x` is `[n, d, h, w, cin]`,
/// `w` `[cout, k_d, k_h, k_w, cin]`, `y` `[n, o_d, o_h, o_w, cout]`, all contiguous; `bias`:
/// 1 adds `b`, 0 does not read it.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn forward_tiles_kernel<F: Float>(
    x: &Tensor<Vector<F, Const<4>>>,
    w: &Tensor<Vector<F, Const<4>>>,
    b: &Tensor<F>,
    y: &mut Tensor<Vector<F, Const<4>>>,
    units: u32,
    win: Window,
    bias: u32,
    #[define(F)] _dtype: StorageType,
) {
    let t = ABSOLUTE_POS;
    if t >= units as usize {
        terminate!();
    }
    let (cin, cout) = (x.shape(4), y.shape(4));
    let (in_d, in_h, in_w) = (x.shape(1), x.shape(2), x.shape(3));
    let (out_d, out_h, out_w) = (y.shape(1), y.shape(2), y.shape(3));
    let (k_d, k_h, k_w) = (win.k_d as usize, win.k_h as usize, win.k_w as usize);
    let (s_d, s_h, s_w) = (win.s_d as usize, win.s_h as usize, win.s_w as usize);
    let (p_d, p_h, p_w) = (win.p_d as usize, win.p_h as usize, win.p_w as usize);
    let (d_d, d_h, d_w) = (win.d_d as usize, win.d_h as usize, win.d_w as usize);
    let co_tiles = cout / 4usize;
    let w_tiles = out_w.div_ceil(4usize);
    let co = (t % co_tiles) * 4usize;
    let ow = ((t / co_tiles) % w_tiles) * 4usize;
    let row = t / (co_tiles * w_tiles);
    let oh = row % out_h;
    let od = (row / out_h) % out_d;
    let n = row / (out_h * out_d);
    let kv = k_d * k_h * k_w;
    let (xs0, xs1, xs2, xs3) = (x.stride(0), x.stride(1), x.stride(2), x.stride(3));
    let mut y0 = V4::new(0.0);
    let mut y1 = V4::new(0.0);
    let mut y2 = V4::new(0.0);
    let mut y3 = V4::new(0.0);
    for kd in 0..k_d {
        let zd = od * s_d + kd * d_d;
        if zd >= p_d && zd - p_d < in_d {
            for kh in 0..k_h {
                let zh = oh * s_h + kh * d_h;
                if zh >= p_h && zh - p_h < in_h {
                    let x_row = n * xs0 + (zd - p_d) * xs1 + (zh - p_h) * xs2;
                    for kw in 0..k_w {
                        // The four positions' input columns, and whether each lies inside.
                        let z0 = ow * s_w + kw * d_w;
                        let (z1, z2, z3) = (z0 + s_w, z0 + 2 * s_w, z0 + 3 * s_w);
                        let i0 = z0 >= p_w && z0 - p_w < in_w && ow < out_w;
                        let i1 = z1 >= p_w && z1 - p_w < in_w && ow + 1 < out_w;
                        let i2 = z2 >= p_w && z2 - p_w < in_w && ow + 2 < out_w;
                        let i3 = z3 >= p_w && z3 - p_w < in_w && ow + 3 < out_w;
                        let a0 = x_row + select(i0, z0 - p_w, 0usize) * xs3;
                        let a1 = x_row + select(i1, z1 - p_w, 0usize) * xs3;
                        let a2 = x_row + select(i2, z2 - p_w, 0usize) * xs3;
                        let a3 = x_row + select(i3, z3 - p_w, 0usize) * xs3;
                        let m0 = V4::new(select(i0, 1.0f32, 0.0f32));
                        let m1 = V4::new(select(i1, 1.0f32, 0.0f32));
                        let m2 = V4::new(select(i2, 1.0f32, 0.0f32));
                        let m3 = V4::new(select(i3, 1.0f32, 0.0f32));
                        let kk = (kd * k_h + kh) * k_w + kw;
                        let w_at = (co * kv + kk) * cin;
                        let w_step = kv * cin;
                        let mut ci = 0usize;
                        while ci < cin {
                            let x0 = V4::cast_from(x[(a0 + ci) / 4usize]) * m0;
                            let x1 = V4::cast_from(x[(a1 + ci) / 4usize]) * m1;
                            let x2 = V4::cast_from(x[(a2 + ci) / 4usize]) * m2;
                            let x3 = V4::cast_from(x[(a3 + ci) / 4usize]) * m3;
                            let w0 = V4::cast_from(w[(w_at + ci) / 4usize]);
                            let w1 = V4::cast_from(w[(w_at + w_step + ci) / 4usize]);
                            let w2 = V4::cast_from(w[(w_at + 2 * w_step + ci) / 4usize]);
                            let w3 = V4::cast_from(w[(w_at + 3 * w_step + ci) / 4usize]);
                            y0[0] += dot4(x0, w0);
                            y0[1] += dot4(x0, w1);
                            y0[2] += dot4(x0, w2);
                            y0[3] += dot4(x0, w3);
                            y1[0] += dot4(x1, w0);
                            y1[1] += dot4(x1, w1);
                            y1[2] += dot4(x1, w2);
                            y1[3] += dot4(x1, w3);
                            y2[0] += dot4(x2, w0);
                            y2[1] += dot4(x2, w1);
                            y2[2] += dot4(x2, w2);
                            y2[3] += dot4(x2, w3);
                            y3[0] += dot4(x3, w0);
                            y3[1] += dot4(x3, w1);
                            y3[2] += dot4(x3, w2);
                            y3[3] += dot4(x3, w3);
                            ci += 4usize;
                        }
                    }
                }
            }
        }
    }
    if bias == 1 {
        let mut bv = V4::empty();
        #[unroll]
        for j in 0..4usize {
            bv[j] = f32::cast_from(b[co + j]);
        }
        y0 += bv;
        y1 += bv;
        y2 += bv;
        y3 += bv;
    }
    let out = ((row * out_w) + ow) * cout + co;
    y[out / 4usize] = Vector::cast_from(y0);
    if ow + 1 < out_w {
        y[(out + cout) / 4usize] = Vector::cast_from(y1);
    }
    if ow + 2 < out_w {
        y[(out + 2 * cout) / 4usize] = Vector::cast_from(y2);
    }
    if ow + 3 < out_w {
        y[(out + 3 * cout) / 4usize] = Vector::cast_from(y3);
    }
}

/// Whether this path takes a convolution: 3-D, ungrouped, both channel counts multiples of 4, a
/// float dtype, every index within `u32`.
pub fn handles<R: CubeRuntime, const N: usize>(x: &CubeTensor<R>, w_shape: &[usize], o: &ConvOptions<N>) -> bool {
    let g = Geometry::new::<N>(x.meta.shape(), &w_shape[1..=N], o);
    tileable_3d(x, w_shape, o) && fits_u32(g.positions() * w_shape[0] + 4 * w_shape[0])
}

/// The convolution of channels-last `x` (`[n, s…, cin]`) with channels-last `w` (`[out, k…,
/// cin]`), channels last (`[n, o…, out]` contiguous), where [`handles`] said yes.
pub fn forward<R: CubeRuntime, const N: usize>(x: CubeTensor<R>, w: CubeTensor<R>, b: Option<CubeTensor<R>>, o: &ConvOptions<N>) -> CubeTensor<R> {
    #[cfg(test)]
    RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ws = w.meta.shape().to_vec();
    let g = Geometry::new::<N>(x.meta.shape(), &ws[1..=N], o);
    let cout = ws[0];
    let x = rank5(contiguous(x));
    let w = rank5(contiguous(w));
    let mut dims = vec![g.batch];
    dims.extend(&g.out[3 - N..]);
    dims.push(cout);
    let y = empty(&x, dims, x.dtype);
    let units = g.batch * g.out[0] * g.out[1] * g.out[2].div_ceil(4) * (cout / 4);
    let client = x.client.clone();
    let (count, dim) = elem_cubes(&client, units);
    let u = |v: usize| v as u32;
    let dtype: StorageType = x.dtype.into();
    let has_bias = b.is_some();
    // Without a bias, an unread placeholder (an allocation, no kernel).
    let b = b.map(contiguous).unwrap_or_else(|| empty(&x, vec![cout], x.dtype));
    forward_tiles_kernel::launch::<R>(
        &client,
        count,
        dim,
        x.into_tensor_arg(),
        w.into_tensor_arg(),
        b.into_tensor_arg(),
        rank5(y.clone()).into_tensor_arg(),
        u(units),
        g.window(),
        u(has_bias as usize),
        dtype,
    );
    y
}
