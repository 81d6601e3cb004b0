//! YUV → RGB conversion (8-bit), matching ffmpeg's default `-pix_fmt rgb24` output:
//! BT.601 matrix unless the stream says BT.709, limited ("tv") range unless flagged
//! full, chroma upsampled by replication (swscale's unscaled yuv2rgb path).

/// Chroma subsampling of a decoded picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChromaLayout {
    I400,
    I420,
    I422,
    I444,
}

impl ChromaLayout {
    pub fn chroma_size(self, w: usize, h: usize) -> (usize, usize) {
        match self {
            ChromaLayout::I400 => (0, 0),
            ChromaLayout::I420 => (w.div_ceil(2), h.div_ceil(2)),
            ChromaLayout::I422 => (w.div_ceil(2), h),
            ChromaLayout::I444 => (w, h),
        }
    }
    fn shifts(self) -> (usize, usize) {
        match self {
            ChromaLayout::I420 => (1, 1),
            ChromaLayout::I422 => (1, 0),
            _ => (0, 0),
        }
    }
}

/// YCbCr → RGB matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matrix {
    Bt601,
    Bt709,
}

/// A decoded 8-bit picture (planes tightly packed).
#[derive(Debug, Clone)]
pub struct YuvFrame {
    pub width: usize,
    pub height: usize,
    pub layout: ChromaLayout,
    pub y: Vec<u8>,
    pub u: Vec<u8>,
    pub v: Vec<u8>,
    pub matrix: Matrix,
    pub full_range: bool,
}

/// An RGB image, interleaved HWC `u8`.
#[derive(Debug, Clone, PartialEq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    /// `height * width * 3` bytes, row-major, R G B.
    pub data: Vec<u8>,
}

impl RgbImage {
    /// CHW `f32` in [0, 1] (what lerobot returns for camera frames).
    pub fn to_chw_f32(&self) -> Vec<f32> {
        let n = self.width * self.height;
        let mut out = vec![0f32; 3 * n];
        let (r, rest) = out.split_at_mut(n);
        let (g, b) = rest.split_at_mut(n);
        for (i, px) in self.data.chunks_exact(3).enumerate() {
            r[i] = px[0] as f32 / 255.0;
            g[i] = px[1] as f32 / 255.0;
            b[i] = px[2] as f32 / 255.0;
        }
        out
    }
}

impl YuvFrame {
    pub fn to_rgb(&self) -> RgbImage {
        const S: i32 = 16;
        let fix = |x: f64| (x * (1 << S) as f64).round() as i32;
        // (Kr, Kb) of the matrix; coefficients derived the standard way.
        let (kr, kb) = match self.matrix {
            Matrix::Bt601 => (0.299, 0.114),
            Matrix::Bt709 => (0.2126, 0.0722),
        };
        let kg = 1.0 - kr - kb;
        let (ys, cs, yoff) = if self.full_range { (1.0, 1.0, 0) } else { (255.0 / 219.0, 255.0 / 224.0, 16) };
        let cy = fix(ys);
        let crv = fix(2.0 * (1.0 - kr) * cs);
        let cbu = fix(2.0 * (1.0 - kb) * cs);
        let cgu = fix(2.0 * (1.0 - kb) * kb / kg * cs);
        let cgv = fix(2.0 * (1.0 - kr) * kr / kg * cs);
        let (w, h) = (self.width, self.height);
        let (cw, _) = self.layout.chroma_size(w, h);
        let (sx, sy) = self.layout.shifts();
        let mut data = vec![0u8; w * h * 3];
        let half = 1 << (S - 1);
        let clip = |x: i32| (x >> S).clamp(0, 255) as u8;
        for row in 0..h {
            let yrow = &self.y[row * w..(row + 1) * w];
            let out = &mut data[row * w * 3..(row + 1) * w * 3];
            if self.layout == ChromaLayout::I400 {
                for (x, &yv) in yrow.iter().enumerate() {
                    let l = clip(cy * (yv as i32 - yoff) + half);
                    out[3 * x..3 * x + 3].copy_from_slice(&[l, l, l]);
                }
                continue;
            }
            let crow = (row >> sy) * cw;
            let (urow, vrow) = (&self.u[crow..crow + cw], &self.v[crow..crow + cw]);
            for (x, &yv) in yrow.iter().enumerate() {
                let yy = cy * (yv as i32 - yoff) + half;
                let u = urow[x >> sx] as i32 - 128;
                let v = vrow[x >> sx] as i32 - 128;
                out[3 * x] = clip(yy + crv * v);
                out[3 * x + 1] = clip(yy - cgu * u - cgv * v);
                out[3 * x + 2] = clip(yy + cbu * u);
            }
        }
        RgbImage { width: w, height: h, data }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn px(y: u8, u: u8, v: u8, matrix: Matrix, full_range: bool) -> [u8; 3] {
        let f = YuvFrame {
            width: 2,
            height: 2,
            layout: ChromaLayout::I420,
            y: vec![y; 4],
            u: vec![u],
            v: vec![v],
            matrix,
            full_range,
        };
        let rgb = f.to_rgb();
        assert!(rgb.data.chunks(3).all(|p| p == &rgb.data[..3]));
        [rgb.data[0], rgb.data[1], rgb.data[2]]
    }

    #[test]
    fn bt601_limited_reference_colours() {
        assert_eq!(px(16, 128, 128, Matrix::Bt601, false), [0, 0, 0]);
        assert_eq!(px(235, 128, 128, Matrix::Bt601, false), [255, 255, 255]);
        // 75% red (191, 0, 0) is Y 65, Cb 100, Cr 212 in BT.601 limited range.
        let r = px(65, 100, 212, Matrix::Bt601, false);
        assert!(r[0].abs_diff(191) <= 2 && r[1] <= 2 && r[2] <= 2, "{r:?}");
        assert_eq!(px(0, 128, 128, Matrix::Bt601, true), [0, 0, 0]);
        assert_eq!(px(255, 128, 128, Matrix::Bt709, true), [255, 255, 255]);
    }
}
