//! LayerNorm over the last axis on CubeCL: the forward in one launch (one cube per row: the
//! mean, the centred sum of squares, the affine; the row's mean and 1/std kept), the backward
//! in two (one cube per row for `dx = r · (g − mean(g) − x̂ · mean(g · x̂))`, `g = dy · w`;
//! one cube per column for `dweight = Σ dy · x̂`, `dbias = Σ dy` over the rows). f32 compute
//! and output (as the composed LayerNorm), `x` in any float dtype, `dx` in `x`'s.

use burn::tensor::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{BLOCK, contiguous, cube_row, cube_sum, empty, f32_of, row_cubes};

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel<F: Float>(x: &Tensor<F>, w: &Tensor<f32>, b: &Tensor<f32>, y: &mut Tensor<f32>, mean: &mut Tensor<f32>, rstd: &mut Tensor<f32>, rows: u32, len: u32, eps: f32, #[define(F)] _dtype: StorageType) {
    let row = cube_row();
    if row >= rows as usize {
        terminate!();
    }
    let len = len as usize;
    let base = row * len;
    let u = UNIT_POS_X as usize;
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let mut s = 0.0f32;
    let mut i = u;
    while i < len {
        s += f32::cast_from(x[base + i]);
        i += BLOCK;
    }
    let mu = cube_sum(s, &mut shared) / f32::cast_from(len);
    let mut q = 0.0f32;
    let mut j = u;
    while j < len {
        let d = f32::cast_from(x[base + j]) - mu;
        q += d * d;
        j += BLOCK;
    }
    let r = 1.0f32 / (cube_sum(q, &mut shared) / f32::cast_from(len) + eps).sqrt();
    let mut k = u;
    while k < len {
        y[base + k] = (f32::cast_from(x[base + k]) - mu) * r * w[k] + b[k];
        k += BLOCK;
    }
    if u == 0 {
        mean[row] = mu;
        rstd[row] = r;
    }
}

/// One cube per row: `dx`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn dx_kernel<F: Float, G: Float>(x: &Tensor<F>, dy: &Tensor<G>, mean: &Tensor<f32>, rstd: &Tensor<f32>, w: &Tensor<f32>, dx: &mut Tensor<F>, rows: u32, len: u32, #[define(F, G)] _dtypes: [StorageType; 2]) {
    let row = cube_row();
    if row >= rows as usize {
        terminate!();
    }
    let len = len as usize;
    let base = row * len;
    let u = UNIT_POS_X as usize;
    let (mu, r) = (mean[row], rstd[row]);
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let mut s1 = 0.0f32;
    let mut s2 = 0.0f32;
    let mut i = u;
    while i < len {
        let g = f32::cast_from(dy[base + i]) * w[i];
        s1 += g;
        s2 += g * (f32::cast_from(x[base + i]) - mu) * r;
        i += BLOCK;
    }
    let m1 = cube_sum(s1, &mut shared) / f32::cast_from(len);
    let m2 = cube_sum(s2, &mut shared) / f32::cast_from(len);
    let mut k = u;
    while k < len {
        let xh = (f32::cast_from(x[base + k]) - mu) * r;
        let g = f32::cast_from(dy[base + k]) * w[k];
        dx[base + k] = F::cast_from((g - m1 - xh * m2) * r);
        k += BLOCK;
    }
}

/// One cube per column: `dweight = Σ_rows dy · x̂`, `dbias = Σ_rows dy`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn params_kernel<F: Float, G: Float>(x: &Tensor<F>, dy: &Tensor<G>, mean: &Tensor<f32>, rstd: &Tensor<f32>, dweight: &mut Tensor<f32>, dbias: &mut Tensor<f32>, rows: u32, len: u32, #[define(F, G)] _dtypes: [StorageType; 2]) {
    let col = cube_row();
    let len = len as usize;
    if col >= len {
        terminate!();
    }
    let rows = rows as usize;
    let mut shared = SharedMemory::<f32>::new(BLOCK);
    let mut s1 = 0.0f32;
    let mut s2 = 0.0f32;
    let mut i = UNIT_POS_X as usize;
    while i < rows {
        let at = i * len + col;
        let d = f32::cast_from(dy[at]);
        s1 += d;
        s2 += d * (f32::cast_from(x[at]) - mean[i]) * rstd[i];
        i += BLOCK;
    }
    let t1 = cube_sum(s1, &mut shared);
    let t2 = cube_sum(s2, &mut shared);
    if UNIT_POS_X == 0 {
        dbias[col] = t1;
        dweight[col] = t2;
    }
}

fn rows_of<R: CubeRuntime>(x: &CubeTensor<R>) -> (usize, usize) {
    let dims = x.meta.shape().to_vec();
    let len = dims[dims.len() - 1].max(1);
    (dims.iter().product::<usize>() / len, len)
}

/// The forward: `(y, mean, rstd)`, `y` f32 in `x`'s dims, `mean`/`rstd` f32 `[rows, 1]`.
pub fn forward<R: CubeRuntime>(x: CubeTensor<R>, weight: CubeTensor<R>, bias: CubeTensor<R>, eps: f64) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let x = contiguous(x);
    let (w, b) = (f32_of(weight), f32_of(bias));
    let (rows, len) = rows_of(&x);
    let y = empty(&x, x.meta.shape().to_vec(), DType::F32);
    let mean = empty(&x, vec![rows, 1], DType::F32);
    let rstd = empty(&x, vec![rows, 1], DType::F32);
    let (count, dim) = row_cubes(rows);
    let dtype: StorageType = x.dtype.into();
    let client = x.client.clone();
    forward_kernel::launch::<R>(
        &client,
        count,
        dim,
        x.into_tensor_arg(),
        w.into_tensor_arg(),
        b.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        mean.clone().into_tensor_arg(),
        rstd.clone().into_tensor_arg(),
        rows as u32,
        len as u32,
        eps as f32,
        dtype,
    );
    (y, mean, rstd)
}

/// The backward: `(dx, dweight, dbias)`, `dx` in `x`'s dims and dtype, the others f32 `[len]`.
pub fn backward<R: CubeRuntime>(x: CubeTensor<R>, mean: CubeTensor<R>, rstd: CubeTensor<R>, weight: CubeTensor<R>, dy: CubeTensor<R>) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let (x, dy) = (contiguous(x), contiguous(dy));
    let (mean, rstd, w) = (f32_of(mean), f32_of(rstd), f32_of(weight));
    let (rows, len) = rows_of(&x);
    let client = x.client.clone();
    let dtypes: [StorageType; 2] = [x.dtype.into(), dy.dtype.into()];
    let dx = empty(&x, x.meta.shape().to_vec(), x.dtype);
    let (count, dim) = row_cubes(rows);
    dx_kernel::launch::<R>(
        &client,
        count,
        dim,
        x.clone().into_tensor_arg(),
        dy.clone().into_tensor_arg(),
        mean.clone().into_tensor_arg(),
        rstd.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        rows as u32,
        len as u32,
        dtypes,
    );
    let dweight = empty(&x, vec![len], DType::F32);
    let dbias = empty(&x, vec![len], DType::F32);
    let (count, dim) = row_cubes(len);
    params_kernel::launch::<R>(
        &client,
        count,
        dim,
        x.into_tensor_arg(),
        dy.into_tensor_arg(),
        mean.into_tensor_arg(),
        rstd.into_tensor_arg(),
        dweight.clone().into_tensor_arg(),
        dbias.clone().into_tensor_arg(),
        rows as u32,
        len as u32,
        dtypes,
    );
    (dx, dweight, dbias)
}
