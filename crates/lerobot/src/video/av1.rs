//! Safe wrapper around rav1d's dav1d-compatible API (pure Rust build, no assembly).

use std::mem::MaybeUninit;
use std::ptr::NonNull;

use rav1d::include::dav1d::data::Dav1dData;
use rav1d::include::dav1d::dav1d::{Dav1dContext, Dav1dSettings};
use rav1d::include::dav1d::headers::{
    DAV1D_MC_BT709, DAV1D_PIXEL_LAYOUT_I400, DAV1D_PIXEL_LAYOUT_I420, DAV1D_PIXEL_LAYOUT_I422,
    DAV1D_PIXEL_LAYOUT_I444,
};
use rav1d::include::dav1d::picture::Dav1dPicture;
use rav1d::src::lib::{
    dav1d_close, dav1d_data_create, dav1d_data_unref, dav1d_default_settings, dav1d_flush, dav1d_get_picture,
    dav1d_open, dav1d_picture_unref, dav1d_send_data,
};

use super::color::{ChromaLayout, Matrix, YuvFrame};

const EAGAIN: i32 = -libc::EAGAIN;

/// A dav1d/rav1d decoder context.
///
/// Two frame contexts (`n_threads = max_frame_delay = 2`): with a single frame context,
/// rav1d 1.1.0 aborts the process on any corrupt frame (memorysafety/rav1d#1497: a panic
/// inside `extern "C"` `dav1d_send_data`); the multi-context error path returns errors.
/// Outputs are matched to inputs by the timestamp we attach to each sample.
pub(crate) struct Av1Decoder {
    ctx: Option<Dav1dContext>,
}

// SAFETY: the context is an `Arc<Rav1dContext>` (internally synchronised); we only use it
// through `&mut self`, so it is never touched from two threads at once.
unsafe impl Send for Av1Decoder {}

impl Av1Decoder {
    pub fn new() -> Result<Self, String> {
        let mut s = MaybeUninit::<Dav1dSettings>::uninit();
        // SAFETY: `s` is valid for writes; dav1d_default_settings fully initialises it.
        let mut s = unsafe {
            dav1d_default_settings(NonNull::new(s.as_mut_ptr()).unwrap());
            s.assume_init()
        };
        s.n_threads = 2;
        s.max_frame_delay = 2;
        s.apply_grain = 1;
        s.frame_size_limit = 8192 * 8192;
        // No logging to stderr: errors are reported through our return values.
        // SAFETY: the logger is a repr(C) pair of nullable pointers; all-zero means "none".
        s.logger = unsafe { std::mem::zeroed() };
        let mut ctx: Option<Dav1dContext> = None;
        // SAFETY: both pointers are valid for the duration of the call.
        let r = unsafe { dav1d_open(NonNull::new(&mut ctx), NonNull::new(&mut s)) };
        if r.0 != 0 || ctx.is_none() {
            return Err(format!("cannot open AV1 decoder (error {})", r.0));
        }
        Ok(Av1Decoder { ctx })
    }

    /// Drop all buffered state (before seeking to a keyframe).
    pub fn flush(&mut self) {
        if let Some(c) = self.ctx {
            // SAFETY: `c` came from dav1d_open and is not closed.
            unsafe { dav1d_flush(c) };
        }
    }

    /// Fetch one decoded picture (with the timestamp of its input), if any is ready.
    fn get_picture(&mut self) -> Result<Option<(i64, YuvFrame)>, String> {
        let mut pic = Dav1dPicture::default();
        // SAFETY: ctx is open; `pic` is valid for writes.
        let r = unsafe { dav1d_get_picture(self.ctx, NonNull::new(&mut pic)) };
        if r.0 == EAGAIN {
            return Ok(None);
        }
        if r.0 != 0 {
            return Err(format!("AV1 decoding error ({})", r.0));
        }
        let ts = pic.m.timestamp;
        let out = copy_picture(&pic);
        // SAFETY: `pic` holds references from dav1d_get_picture.
        unsafe { dav1d_picture_unref(NonNull::new(&mut pic)) };
        out.map(|f| Some((ts, f)))
    }

    /// Output every picture still buffered (frame delay): dav1d arms draining on the first
    /// `get_picture` after input and drains on the following calls.
    pub fn drain(&mut self) -> Result<Vec<(i64, YuvFrame)>, String> {
        let mut out = Vec::new();
        let mut misses = 0;
        while misses < 2 {
            match self.get_picture()? {
                Some(p) => {
                    out.push(p);
                    misses = 0;
                }
                None => misses += 1,
            }
        }
        Ok(out)
    }

    /// Feed one temporal unit tagged `ts`; returns the pictures that became available.
    pub fn decode(&mut self, data: &[u8], ts: i64) -> Result<Vec<(i64, YuvFrame)>, String> {
        if data.is_empty() {
            return Err("empty AV1 sample".into());
        }
        let mut out = Vec::new();
        let mut stalls = 0;
        let mut d = Dav1dData::default();
        // SAFETY: `d` is valid for writes; on success the returned buffer has `data.len()` bytes.
        let ptr = unsafe { dav1d_data_create(NonNull::new(&mut d), data.len()) };
        if ptr.is_null() {
            return Err("cannot allocate AV1 input buffer".into());
        }
        // SAFETY: `ptr` points to `data.len()` writable bytes owned by `d`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
        d.m.timestamp = ts;
        loop {
            // SAFETY: ctx is open; `d` is a valid Dav1dData.
            let r = unsafe { dav1d_send_data(self.ctx, NonNull::new(&mut d)) };
            if r.0 == 0 {
                if d.sz == 0 {
                    break;
                }
                // Partially consumed: pictures must be drained before sending the rest.
            } else if r.0 != EAGAIN {
                // SAFETY: `d` still owns its buffer after a failed send.
                unsafe { dav1d_data_unref(NonNull::new(&mut d)) };
                return Err(format!("AV1 bitstream error ({})", r.0));
            }
            match self.get_picture() {
                Ok(Some(p)) => out.push(p),
                Ok(None) => {
                    stalls += 1;
                    if stalls > 64 {
                        // SAFETY: as above.
                        unsafe { dav1d_data_unref(NonNull::new(&mut d)) };
                        return Err("AV1 decoder stalled".into());
                    }
                }
                Err(e) => {
                    // SAFETY: as above.
                    unsafe { dav1d_data_unref(NonNull::new(&mut d)) };
                    return Err(e);
                }
            }
        }
        while let Some(p) = self.get_picture()? {
            out.push(p);
        }
        Ok(out)
    }
}

impl Drop for Av1Decoder {
    fn drop(&mut self) {
        if self.ctx.is_some() {
            // SAFETY: ctx came from dav1d_open; dav1d_close sets it to None.
            unsafe { dav1d_close(NonNull::new(&mut self.ctx)) };
        }
    }
}

fn copy_picture(pic: &Dav1dPicture) -> Result<YuvFrame, String> {
    let w = pic.p.w;
    let h = pic.p.h;
    if pic.p.bpc != 8 {
        return Err(format!("{}-bit video is not supported (8-bit only)", pic.p.bpc));
    }
    if w <= 0 || h <= 0 {
        return Err("decoded picture has no size".into());
    }
    let (w, h) = (w as usize, h as usize);
    let layout = match pic.p.layout {
        l if l == DAV1D_PIXEL_LAYOUT_I420 => ChromaLayout::I420,
        l if l == DAV1D_PIXEL_LAYOUT_I422 => ChromaLayout::I422,
        l if l == DAV1D_PIXEL_LAYOUT_I444 => ChromaLayout::I444,
        l if l == DAV1D_PIXEL_LAYOUT_I400 => ChromaLayout::I400,
        l => return Err(format!("unknown pixel layout {l}")),
    };
    let (cw, ch) = layout.chroma_size(w, h);
    let copy_plane = |ptr: Option<NonNull<core::ffi::c_void>>, stride: isize, pw: usize, ph: usize| -> Result<Vec<u8>, String> {
        let p = ptr.ok_or("decoded picture has no data")?.as_ptr() as *const u8;
        if stride < pw as isize {
            return Err("bad picture stride".into());
        }
        let mut v = Vec::with_capacity(pw * ph);
        for y in 0..ph {
            // SAFETY: dav1d guarantees `ph` rows of at least `pw` bytes at `stride` spacing.
            let row = unsafe { std::slice::from_raw_parts(p.offset(y as isize * stride), pw) };
            v.extend_from_slice(row);
        }
        Ok(v)
    };
    let y = copy_plane(pic.data[0], pic.stride[0], w, h)?;
    let (u, v) = if layout == ChromaLayout::I400 {
        (Vec::new(), Vec::new())
    } else {
        (copy_plane(pic.data[1], pic.stride[1], cw, ch)?, copy_plane(pic.data[2], pic.stride[1], cw, ch)?)
    };
    let (mut matrix, mut full_range) = (Matrix::Bt601, false);
    if let Some(seq) = pic.seq_hdr {
        // SAFETY: the sequence header lives as long as the picture reference.
        let seq = unsafe { seq.as_ref() };
        full_range = seq.color_range != 0;
        if seq.mtrx == DAV1D_MC_BT709 {
            matrix = Matrix::Bt709;
        }
    }
    Ok(YuvFrame { width: w, height: h, layout, y, u, v, matrix, full_range })
}
