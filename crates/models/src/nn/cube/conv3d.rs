//! The 3-D convolution's weight gradient on CubeCL, one launch, in the NCDHW layout the model
//! keeps (no permute copies): one unit per weight element `[co, ci, kd, kh, kw]` sums
//! `dy[n, co, o] · x[n, ci, o·s + k·d − p]` over the batch and the output positions, an output
//! row at a time (the row's input bounds checked once, the `w` axis walked in order). Adjacent
//! units differ in `kw` first, so they read neighbouring input elements and the same output
//! gradient element. f32 accumulation, values in the input's dtype; ungrouped only.
//!
//! Burn's weight gradient (`burn_cubecl::kernel::conv::conv_weight_backward`, the direct
//! convolution where the device has no matrix units, as on lavapipe) is a convolution of the
//! channel-swapped input with the swapped output gradient as its kernel: each unit walks the
//! whole output volume through the direct kernel's per-position index and bounds arithmetic,
//! over an inner loop of only the batch's length, after permute copies of both operands. The
//! profile of the VAE's steady step on lavapipe (`benches/results/kernels/wgpu/time_profile.md`)
//! puts those weight gradients at about 40 % of the step's kernel time.

use burn::tensor::TensorMetadata;
use burn::tensor::ops::ConvOptions;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{contiguous, elem_cubes, empty};

/// Stride, padding and dilation of one spatial axis.
#[derive(CubeLaunch, CubeType, Clone, Copy)]
pub(crate) struct Axis {
    stride: u32,
    padding: u32,
    dilation: u32,
}

#[cube(launch)]
fn weight_grad_kernel<F: Float, G: Float>(x: &Tensor<F>, dy: &Tensor<G>, dw: &mut Tensor<F>, ad: Axis, ah: Axis, aw: Axis, #[define(F, G)] _dtypes: [StorageType; 2]) {
    let o = ABSOLUTE_POS;
    if o >= dw.len() {
        terminate!();
    }
    let (kd_n, kh_n, kw_n) = (dw.shape(2), dw.shape(3), dw.shape(4));
    let ci_n = dw.shape(1);
    let kw = o % kw_n;
    let kh = (o / kw_n) % kh_n;
    let kd = (o / (kw_n * kh_n)) % kd_n;
    let ci = (o / (kw_n * kh_n * kd_n)) % ci_n;
    let co = o / (kw_n * kh_n * kd_n * ci_n);
    let (n_n, d_n, h_n, w_n) = (x.shape(0), x.shape(2) as i32, x.shape(3) as i32, x.shape(4) as i32);
    let (od_n, oh_n, ow_n) = (dy.shape(2), dy.shape(3), dy.shape(4));
    // Input position of output position 0 along each axis, and the input step per output step.
    let d0 = (kd as u32 * ad.dilation) as i32 - ad.padding as i32;
    let h0 = (kh as u32 * ah.dilation) as i32 - ah.padding as i32;
    let w0 = (kw as u32 * aw.dilation) as i32 - aw.padding as i32;
    let (sd, sh, sw) = (ad.stride as i32, ah.stride as i32, aw.stride as i32);
    let mut acc = 0.0f32;
    for n in 0..n_n {
        let x_nc = n * x.stride(0) + ci * x.stride(1);
        let dy_nc = n * dy.stride(0) + co * dy.stride(1);
        for od in 0..od_n {
            let id = d0 + od as i32 * sd;
            if id >= 0 && id < d_n {
                for oh in 0..oh_n {
                    let ih = h0 + oh as i32 * sh;
                    if ih >= 0 && ih < h_n {
                        let x_row = x_nc + id as usize * x.stride(2) + ih as usize * x.stride(3);
                        let dy_row = dy_nc + od * dy.stride(2) + oh * dy.stride(3);
                        for ow in 0..ow_n {
                            let iw = w0 + ow as i32 * sw;
                            if iw >= 0 && iw < w_n {
                                acc += f32::cast_from(dy[dy_row + ow]) * f32::cast_from(x[x_row + iw as usize]);
                            }
                        }
                    }
                }
            }
        }
    }
    dw[o] = F::cast_from(acc);
}

/// Whether [`weight_backward`] computes this convolution's weight gradient: ungrouped, 3-D.
pub fn handles(options: &ConvOptions<3>) -> bool {
    options.groups == 1
}

fn axis<R: Runtime>(o: &ConvOptions<3>, i: usize) -> AxisLaunch<R> {
    AxisLaunch::new(o.stride[i] as u32, o.padding[i] as u32, o.dilation[i] as u32)
}

/// The weight gradient of `conv3d(x, w)` (shape of `w`, dtype of `x`) from its output gradient
/// `dy`, for an ungrouped convolution ([`handles`]).
pub fn weight_backward<R: CubeRuntime>(x: CubeTensor<R>, weight_shape: [usize; 5], dy: CubeTensor<R>, options: &ConvOptions<3>) -> CubeTensor<R> {
    debug_assert!(handles(options), "conv3d weight gradient: grouped convolutions take Burn's");
    let (x, dy) = (contiguous(x), contiguous(dy));
    let dw = empty(&x, weight_shape.to_vec(), x.dtype);
    let n = weight_shape.iter().product::<usize>();
    let (count, dim) = elem_cubes(&x.client, n);
    let dtypes: [StorageType; 2] = [x.dtype.into(), dy.dtype.into()];
    weight_grad_kernel::launch::<R>(&x.client.clone(), count, dim, x.into_tensor_arg(), dy.into_tensor_arg(), dw.clone().into_tensor_arg(), axis(options, 0), axis(options, 1), axis(options, 2), dtypes);
    dw
}

/// The lean conv node's 3-D weight gradient on a CubeCL backend: [`weight_backward`] where it
/// applies, else (grouped, or [`super::composed`]) Burn's.
pub fn weight_backward_3d<B: super::CubePrim>(x: FloatPrim<B>, w: FloatPrim<B>, dy: FloatPrim<B>, o: ConvOptions<3>) -> FloatPrim<B> {
    if super::composed() || !handles(&o) {
        return B::conv3d_weight_backward(x, w, dy, o);
    }
    let dims = w.shape().to_vec();
    let shape = [dims[0], dims[1], dims[2], dims[3], dims[4]];
    B::from_cube(weight_backward(B::into_cube(x), shape, B::into_cube(dy), &o))
}

type FloatPrim<B> = <B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;

/// The kernel against Burn's weight gradient on the same device (CI: wgpu on lavapipe), f32
/// within 1e-5 relative (max |a − b| / max |b|): padded, strided as the VAE's downsampling,
/// dilated, asymmetric, 1×1×1, one input channel, ragged sizes.
#[cfg(all(test, feature = "wgpu"))]
mod cube_tests {
    use burn::backend::Wgpu;
    use burn::prelude::*;
    use burn::tensor::ops::ConvOptions;
    use burn::tensor::{TensorData, TensorPrimitive};

    type W = Wgpu;

    /// Deterministic values in [−1, 1) (host-side: the device generator is shared by parallel tests).
    fn data<const D: usize>(dims: [usize; D], seed: u64) -> Tensor<W, D> {
        let n: usize = dims.iter().product();
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_data(TensorData::new(v, dims), &Default::default())
    }

    fn vals(x: <W as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive) -> Vec<f32> {
        Tensor::<W, 5>::from_primitive(TensorPrimitive::Float(x)).into_data().convert::<f32>().to_vec().unwrap()
    }

    #[test]
    fn conv3d_weight_gradient_matches_burns() {
        let cases: [([usize; 5], [usize; 5], [usize; 3], [usize; 3], [usize; 3]); 7] = [
            ([2, 3, 5, 6, 7], [4, 3, 3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1]),
            ([2, 4, 4, 9, 8], [3, 4, 3, 3, 3], [1, 2, 2], [1, 1, 1], [1, 1, 1]),
            ([1, 2, 7, 7, 9], [2, 2, 3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1]),
            ([2, 3, 6, 7, 8], [2, 3, 3, 2, 3], [1, 1, 2], [2, 0, 1], [2, 1, 2]),
            ([3, 5, 3, 4, 5], [6, 5, 1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 1, 1]),
            ([2, 1, 8, 16, 16], [16, 1, 3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1]),
            ([2, 16, 4, 8, 8], [16, 16, 3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1]),
        ];
        for (i, (xd, wd, stride, padding, dilation)) in cases.into_iter().enumerate() {
            let o = ConvOptions::new(stride, padding, dilation, 1);
            assert!(super::handles(&o));
            let x = data(xd, 3 * i as u64 + 1);
            let w = data(wd, 3 * i as u64 + 2);
            let y = burn::tensor::module::conv3d(x.clone(), w.clone(), None, o.clone());
            let dy = data(y.dims(), 3 * i as u64 + 3);
            let (x, w, dy) = (x.into_primitive().tensor(), w.into_primitive().tensor(), dy.into_primitive().tensor());
            let want = vals(<W as burn::tensor::ops::ModuleOps<W>>::conv3d_weight_backward(x.clone(), w.clone(), dy.clone(), o.clone()));
            let got = vals(super::weight_backward(x, wd, dy, &o));
            assert_eq!(got.len(), want.len());
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
            assert!(err <= 1e-5, "case {i} ({xd:?} * {wd:?}, stride {stride:?}, padding {padding:?}, dilation {dilation:?}): relative error {err:e}");
        }
        assert!(!super::handles(&ConvOptions::new([1, 1, 1], [1, 1, 1], [1, 1, 1], 2)), "grouped: Burn's");
    }
}
