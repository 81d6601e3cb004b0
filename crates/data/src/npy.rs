//! `.npy` arrays (NumPy format versions 1.0, 2.0, 3.0) read with `ndarray-npy`, converted to `f32`.
//!
//! `ndarray-npy` parses the header (`Header::from_reader`: magic, version, the Python-literal
//! dict) and the data of every dtype it knows, in either byte order and in C or Fortran order
//! (Fortran data comes back as an `ndarray` array that iterates in C order). What stays here,
//! and why:
//!
//! * **dtype dispatch** (`Elem`): `ndarray-npy` reads into a type chosen at compile time, so
//!   the `descr` picks the element type and each is widened to `f32`;
//! * **`float16`** (`F16`): `ndarray-npy` has no half-precision element; a 20-line
//!   `ReadableElement` decodes it with the `half` crate;
//! * **bounds checked before `ndarray-npy` runs**, because these files come from disk and every
//!   failure must be an error naming the file, never an abort:
//!   - the declared header length (a `u32` in versions 2.0/3.0): `Header::from_reader`
//!     allocates it before reading, so a corrupt length would ask for up to 4 GiB;
//!   - the literal's bracket nesting: `py_literal`'s (pest) grammar backtracks exponentially
//!     on nested brackets. Measured on `[[…]]` headers (dependencies at opt-level 3): depth 12
//!     takes 16 ms, 16 takes 0.18 s, 20 takes 2.8 s, 100 did not finish in 60 s — so a
//!     200-byte corrupt header would hang the loader. NumPy writes depth 2 (the dict and the
//!     shape tuple); structured dtypes add a few levels; `MAX_NESTING` is 8 (5 ms);
//!   - the data length against the shape: `read_npy` allocates `shape × itemsize` before
//!     reading; a header declaring `(1 << 40,)` with no data behind it aborts the process
//!     (measured: "memory allocation of 4398046511104 bytes failed", SIGABRT). The check also
//!     keeps the old message ("expected N bytes, got M");
//!   - the shape's extent: `read_npy` unwraps `from_shape_vec`, which fails on a shape like
//!     `(0, 1 << 63)` whose element count is 0 (measured: a panic);
//! * **trailing bytes** after the data are ignored, as `numpy.load` does (`ndarray-npy` refuses
//!   them): only the header and the exact data are handed over.
//!
//! Behaviour differences from the earlier hand-written parser, none of which NumPy ever writes:
//! unknown header keys, headers without the final newline, `=`-ordered or `|f4`-style
//! multi-byte descriptors and `bool` bytes other than 0/1 are now errors.

use std::io::{Cursor, Read};
use std::path::Path;

use ndarray::ArrayD;
use ndarray_npy::npy::header::{Header, ParseHeaderError, ReadHeaderError};
use ndarray_npy::{ReadDataError, ReadNpyError, ReadNpyExt, ReadableElement};
use py_literal::Value as PyValue;

use crate::DataError;

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// Largest header accepted (NumPy itself refuses headers above 10 000 bytes by default).
const MAX_HEADER_LEN: usize = 1 << 20;
/// Deepest bracket nesting accepted in a header literal (NumPy writes 2: the dict and the
/// shape). Parsing time doubles with each level (module doc): 8 levels parse in ~5 ms.
const MAX_NESTING: usize = 8;

/// One array read from a `.npy` file or `.npz` member, converted to `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    /// Shape in C (row-major) order; empty for a 0-d scalar.
    pub shape: Vec<usize>,
    /// Values in C order, `shape.iter().product()` of them.
    pub data: Vec<f32>,
    /// The `descr` of the stored data (e.g. `<f4`, `<i8`), before conversion.
    pub descr: String,
}

impl NpyArray {
    /// Number of elements (`product(shape)`).
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// `true` when the array holds no element.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// Reads a bare `.npy` file.
pub fn read_npy(path: &Path) -> Result<NpyArray, DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let entry = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    parse_npy(&bytes, path, &entry)
}

/// Parses the bytes of one `.npy` array. `path` and `entry` are only used in error messages.
pub fn parse_npy(bytes: &[u8], path: &Path, entry: &str) -> Result<NpyArray, DataError> {
    let ctx = Ctx { path, entry };
    check_preamble(bytes).map_err(|reason| ctx.header(reason))?;
    let mut cursor = Cursor::new(bytes);
    let header = Header::from_reader(&mut cursor).map_err(|e| ctx.read_header(e, bytes))?;
    // The cursor stops at the end of the header, inside `bytes`.
    let data_start = usize::try_from(cursor.position()).unwrap_or(bytes.len());

    let descr = match &header.type_descriptor {
        PyValue::String(s) => s.clone(),
        other => other.to_string(), // structured dtypes are a list of fields
    };
    let elem = Elem::parse(&descr).ok_or_else(|| ctx.dtype(&descr))?;
    let shape = header.shape;
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| ctx.header(format!("shape {shape:?} overflows the element count")))?;
    // `ndarray` needs the product of the non-zero dims to fit an isize, even for 0 elements.
    let extent = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d.max(1)));
    let expected = count
        .checked_mul(elem.size())
        .filter(|_| extent.is_some_and(|e| e <= isize::MAX as usize))
        .ok_or_else(|| ctx.header(format!("shape {shape:?} overflows the byte count")))?;
    let payload = bytes.len().saturating_sub(data_start);
    if payload < expected {
        return Err(DataError::Truncated {
            path: path.to_path_buf(),
            entry: entry.to_string(),
            expected: expected as u64,
            got: payload as u64,
        });
    }
    // Trailing bytes after the array are ignored, as `numpy.load` does.
    let exact = bytes.get(..data_start + expected).unwrap_or(bytes);
    let data = elem.read(exact).map_err(|e| ctx.data(e, &descr))?;
    Ok(NpyArray { shape, data, descr })
}

/// The bounds `Header::from_reader` relies on: a header length within the file and
/// [`MAX_HEADER_LEN`], and a literal nested at most [`MAX_NESTING`] deep.
fn check_preamble(bytes: &[u8]) -> Result<(), String> {
    if !bytes.starts_with(MAGIC) {
        return Ok(()); // ndarray-npy reports the bad magic
    }
    let (len, start) = match (bytes.get(6..8), bytes.get(8..10), bytes.get(8..12)) {
        (Some([1, 0]), Some(&[a, b]), _) => (usize::from(u16::from_le_bytes([a, b])), 10),
        (Some([2 | 3, 0]), _, Some(&[a, b, c, d])) => (u32::from_le_bytes([a, b, c, d]) as usize, 12),
        _ => return Ok(()), // a short file or an unknown version: ndarray-npy reports it
    };
    if len > MAX_HEADER_LEN {
        return Err(format!("header length {len} exceeds the limit of {MAX_HEADER_LEN} bytes"));
    }
    let Some(header) = bytes.get(start..start + len) else {
        let have = bytes.len() - start;
        return Err(format!("header declares {len} bytes but the file has only {have} after the preamble"));
    };
    if nesting(header) > MAX_NESTING {
        return Err(format!("header literal nested deeper than {MAX_NESTING} levels"));
    }
    Ok(())
}

/// Deepest `(`/`[`/`{` nesting of a Python literal, brackets inside quoted strings ignored.
fn nesting(text: &[u8]) -> usize {
    let (mut depth, mut deepest, mut quote) = (0usize, 0usize, None);
    for &c in text {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, b'\'' | b'"') => quote = Some(c),
            (None, b'(' | b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (None, b')' | b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

struct Ctx<'a> {
    path: &'a Path,
    entry: &'a str,
}

impl Ctx<'_> {
    fn header(&self, reason: impl Into<String>) -> DataError {
        DataError::BadHeader {
            path: self.path.to_path_buf(),
            entry: self.entry.to_string(),
            reason: reason.into(),
        }
    }

    fn dtype(&self, descr: &str) -> DataError {
        DataError::UnsupportedDtype {
            path: self.path.to_path_buf(),
            entry: self.entry.to_string(),
            descr: descr.to_string(),
        }
    }

    fn read_header(&self, e: ReadHeaderError, bytes: &[u8]) -> DataError {
        match e {
            _ if !bytes.starts_with(MAGIC) => DataError::BadMagic {
                path: self.path.to_path_buf(),
                entry: self.entry.to_string(),
                found: bytes.iter().take(MAGIC.len()).copied().collect(),
            },
            ReadHeaderError::Parse(ParseHeaderError::Version { major, minor }) => DataError::UnsupportedVersion {
                path: self.path.to_path_buf(),
                entry: self.entry.to_string(),
                major,
                minor,
            },
            ReadHeaderError::Io(_) => self.header("file ends inside the header"),
            ReadHeaderError::Parse(p) => self.header(p.to_string()),
        }
    }

    fn data(&self, e: ReadNpyError, descr: &str) -> DataError {
        match e {
            ReadNpyError::WrongDescriptor(_) => self.dtype(descr),
            other => DataError::BadData {
                path: self.path.to_path_buf(),
                entry: self.entry.to_string(),
                reason: other.to_string(),
            },
        }
    }
}

/// Element types read, named by `descr` without its byte-order character.
#[derive(Debug, Clone, Copy)]
enum Elem {
    F2,
    F4,
    F8,
    I1,
    I2,
    I4,
    I8,
    U1,
    U2,
    U4,
    U8,
    B1,
}

impl Elem {
    fn parse(descr: &str) -> Option<Elem> {
        let code = descr.strip_prefix(['<', '>', '|', '=']).unwrap_or(descr);
        Some(match code {
            "f2" => Elem::F2,
            "f4" => Elem::F4,
            "f8" => Elem::F8,
            "i1" => Elem::I1,
            "i2" => Elem::I2,
            "i4" => Elem::I4,
            "i8" => Elem::I8,
            "u1" => Elem::U1,
            "u2" => Elem::U2,
            "u4" => Elem::U4,
            "u8" => Elem::U8,
            "b1" => Elem::B1,
            _ => return None,
        })
    }

    /// Bytes per element.
    fn size(self) -> usize {
        match self {
            Elem::I1 | Elem::U1 | Elem::B1 => 1,
            Elem::F2 | Elem::I2 | Elem::U2 => 2,
            Elem::F4 | Elem::I4 | Elem::U4 => 4,
            Elem::F8 | Elem::I8 | Elem::U8 => 8,
        }
    }

    /// Reads a whole `.npy` (header and exactly the data) as `f32`, in C order.
    fn read(self, npy: &[u8]) -> Result<Vec<f32>, ReadNpyError> {
        match self {
            Elem::F2 => read_as(npy, |v: F16| v.0),
            Elem::F4 => read_as(npy, |v: f32| v),
            Elem::F8 => read_as(npy, |v: f64| v as f32),
            Elem::I1 => read_as(npy, |v: i8| f32::from(v)),
            Elem::I2 => read_as(npy, |v: i16| f32::from(v)),
            Elem::I4 => read_as(npy, |v: i32| v as f32),
            Elem::I8 => read_as(npy, |v: i64| v as f32),
            Elem::U1 => read_as(npy, |v: u8| f32::from(v)),
            Elem::U2 => read_as(npy, |v: u16| f32::from(v)),
            Elem::U4 => read_as(npy, |v: u32| v as f32),
            Elem::U8 => read_as(npy, |v: u64| v as f32),
            Elem::B1 => read_as(npy, |v: bool| f32::from(u8::from(v))),
        }
    }
}

fn read_as<T: ReadableElement + Copy>(npy: &[u8], to_f32: impl Fn(T) -> f32) -> Result<Vec<f32>, ReadNpyError> {
    let a = ArrayD::<T>::read_npy(npy)?;
    Ok(if a.is_standard_layout() {
        // In place for f32 (same size and alignment), one pass for the other types.
        a.into_raw_vec_and_offset().0.into_iter().map(to_f32).collect()
    } else {
        a.iter().map(|&v| to_f32(v)).collect() // Fortran order: iterates in C order
    })
}

/// IEEE half precision, which `ndarray-npy` does not read; widened exactly to `f32`.
#[derive(Debug, Clone, Copy)]
struct F16(f32);

impl ReadableElement for F16 {
    fn read_to_end_exact_vec<R: Read>(mut reader: R, desc: &PyValue, len: usize) -> Result<Vec<Self>, ReadDataError> {
        let from_bytes = match desc {
            PyValue::String(s) if s == "<f2" => half::f16::from_le_bytes,
            PyValue::String(s) if s == ">f2" => half::f16::from_be_bytes,
            other => return Err(ReadDataError::WrongDescriptor(other.clone())),
        };
        let mut raw = vec![0u8; len.checked_mul(2).ok_or(ReadDataError::MissingData)?];
        reader.read_exact(&mut raw)?;
        let extra = reader.read_to_end(&mut Vec::new())?;
        if extra > 0 {
            return Err(ReadDataError::ExtraBytes(extra));
        }
        Ok(raw.chunks_exact(2).map(|c| F16(from_bytes([c[0], c[1]]).to_f32())).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("mem.npy")
    }

    /// Builds the bytes of a version 1.0 `.npy` file.
    ///
    /// `descr` is written verbatim; `data` must already be encoded in that dtype.
    fn encode_npy(descr: &str, shape: &[usize], fortran_order: bool, data: &[u8]) -> Vec<u8> {
        let shape_txt = match shape.len() {
            1 => format!("({},)", shape[0]),
            _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
        };
        let fo = if fortran_order { "True" } else { "False" };
        let mut header = format!("{{'descr': '{descr}', 'fortran_order': {fo}, 'shape': {shape_txt}, }}");
        // Pad so that magic + version + len + header is a multiple of 64, ending in '\n'.
        let unpadded = 10 + header.len() + 1;
        let pad = (64 - unpadded % 64) % 64;
        header.extend(std::iter::repeat_n(' ', pad));
        header.push('\n');
        let mut out = Vec::with_capacity(10 + header.len() + data.len());
        out.extend_from_slice(b"\x93NUMPY\x01\x00");
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A version 1.0 `.npy` with `header` (a dict literal) written verbatim.
    fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
        let header = format!("{header}\n");
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn parses_c_order_f4() {
        let bytes = encode_npy("<f4", &[2, 3], false, &f32_bytes(&[0., 1., 2., 3., 4., 5.]));
        let a = parse_npy(&bytes, p(), "x").unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.data, vec![0., 1., 2., 3., 4., 5.]);
        assert_eq!(a.descr, "<f4");
    }

    #[test]
    fn parses_fortran_order() {
        // C-order matrix [[0,1,2],[3,4,5]] stored column-major: 0,3,1,4,2,5.
        let bytes = encode_npy("<f4", &[2, 3], true, &f32_bytes(&[0., 3., 1., 4., 2., 5.]));
        let a = parse_npy(&bytes, p(), "x").unwrap();
        assert_eq!(a.data, vec![0., 1., 2., 3., 4., 5.]);

        // 3-D: shape (2, 3, 4), value = C linear index; also as i8 and f16 (their own read paths).
        let shape = [2usize, 3, 4];
        let mut fdata = Vec::new();
        for k in 0..4 {
            for j in 0..3 {
                for i in 0..2 {
                    fdata.push((i * 12 + j * 4 + k) as f32);
                }
            }
        }
        let want: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let bytes = encode_npy("<f4", &shape, true, &f32_bytes(&fdata));
        assert_eq!(parse_npy(&bytes, p(), "x").unwrap().data, want);
        let i1: Vec<u8> = fdata.iter().map(|&v| v as i8 as u8).collect();
        assert_eq!(parse_npy(&encode_npy("|i1", &shape, true, &i1), p(), "x").unwrap().data, want);
        let f2: Vec<u8> = fdata.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
        assert_eq!(parse_npy(&encode_npy("<f2", &shape, true, &f2), p(), "x").unwrap().data, want);
    }

    #[test]
    fn converts_all_dtypes() {
        let cases: Vec<(&str, Vec<u8>, Vec<f32>)> = vec![
            ("<f8", [1.5f64, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect(), vec![1.5, -2.0]),
            (">f8", [1.5f64, -2.0].iter().flat_map(|x| x.to_be_bytes()).collect(), vec![1.5, -2.0]),
            ("<f2", vec![0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00], vec![1.0, -2.0, 5.960_464_5e-8]),
            (">f2", vec![0x3c, 0x00, 0xc0, 0x00, 0x00, 0x01], vec![1.0, -2.0, 5.960_464_5e-8]),
            ("|u1", vec![0, 255], vec![0.0, 255.0]),
            ("|i1", vec![0x80, 7], vec![-128.0, 7.0]),
            ("|b1", vec![0, 1], vec![0.0, 1.0]),
            ("<i2", [-300i16, 2].iter().flat_map(|x| x.to_le_bytes()).collect(), vec![-300.0, 2.0]),
            ("<i4", [-7i32, 9].iter().flat_map(|x| x.to_le_bytes()).collect(), vec![-7.0, 9.0]),
            ("<i8", [-3i64, 600].iter().flat_map(|x| x.to_le_bytes()).collect(), vec![-3.0, 600.0]),
            (">i8", [-3i64, 600].iter().flat_map(|x| x.to_be_bytes()).collect(), vec![-3.0, 600.0]),
            ("<u2", [65535u16, 2].iter().flat_map(|x| x.to_le_bytes()).collect(), vec![65535.0, 2.0]),
            ("<u4", [70000u32, 2].iter().flat_map(|x| x.to_le_bytes()).collect(), vec![70000.0, 2.0]),
            ("<u8", [1u64 << 40, 2].iter().flat_map(|x| x.to_le_bytes()).collect(), vec![2f32.powi(40), 2.0]),
            (">f4", [3.25f32, 1.0].iter().flat_map(|x| x.to_be_bytes()).collect(), vec![3.25, 1.0]),
        ];
        for (descr, raw, want) in cases {
            let n = want.len();
            let bytes = encode_npy(descr, &[n], false, &raw);
            let a = parse_npy(&bytes, p(), "x").unwrap_or_else(|e| panic!("{descr}: {e}"));
            assert_eq!(a.data, want, "{descr}");
            assert_eq!(a.descr, descr);
        }
    }

    #[test]
    fn f16_specials() {
        let bits = [0x7c00u16, 0xfc00, 0x7e00, 0x8000, 0x3555, 0x7bff];
        let raw: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let a = parse_npy(&encode_npy("<f2", &[6], false, &raw), p(), "x").unwrap().data;
        assert_eq!(a[0], f32::INFINITY);
        assert_eq!(a[1], f32::NEG_INFINITY);
        assert!(a[2].is_nan());
        assert_eq!(a[3].to_bits(), (-0.0f32).to_bits());
        assert_eq!(a[4], 0.333_251_95);
        assert_eq!(a[5], 65504.0);
    }

    #[test]
    fn scalar_empty_and_trailing_bytes() {
        let bytes = encode_npy("<f4", &[], false, &f32_bytes(&[4.0]));
        let a = parse_npy(&bytes, p(), "x").unwrap();
        assert!(a.shape.is_empty());
        assert_eq!(a.data, vec![4.0]);
        let bytes = encode_npy("<i8", &[0, 3], false, &[]);
        let a = parse_npy(&bytes, p(), "x").unwrap();
        assert_eq!(a.shape, vec![0, 3]);
        assert!(a.is_empty());
        // Bytes after the data are ignored, as numpy.load does.
        let bytes = encode_npy("<f4", &[2], false, &f32_bytes(&[1.0, 2.0, 99.0]));
        assert_eq!(parse_npy(&bytes, p(), "x").unwrap().data, vec![1.0, 2.0]);
    }

    #[test]
    fn header_variants() {
        let data = f32_bytes(&[1.0, 2.0]);
        for h in [
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
            "{\"shape\": (2,), \"fortran_order\": False, \"descr\": \"<f4\"}",
            "{'descr':'<f4','fortran_order':False,'shape':(2,)}",
        ] {
            let a = parse_npy(&with_header(h, &data), p(), "x").unwrap_or_else(|e| panic!("{h}: {e}"));
            assert_eq!((a.shape, a.data), (vec![2], vec![1.0, 2.0]));
        }
        // Without the nesting bound the parser would take ~2^40 steps here (module doc).
        let deep = format!("{{'descr': {}'<f4'{}}}", "[".repeat(40), "]".repeat(40));
        for bad in [
            "",
            "{'descr': '<f4', 'shape': (2,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
            "{'descr': '<f4', 'fortran_order': 1, 'shape': (2,)}",
            "{'descr': '<f4' 'fortran_order': False}",
            "[(((((((((((((((((((((((((((((((((((((",
            deep.as_str(),
        ] {
            let e = parse_npy(&with_header(bad, &data), p(), "x").unwrap_err().to_string();
            assert!(e.contains("mem.npy") && e.contains("`x`") && e.contains("unparsable .npy header"), "{bad:.40}: {e}");
        }
    }

    #[test]
    fn version_2_header() {
        let v1 = encode_npy("<f4", &[1], false, &f32_bytes(&[7.0]));
        let hl = u16::from_le_bytes([v1[8], v1[9]]) as u32;
        let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
        v2.extend_from_slice(&hl.to_le_bytes());
        v2.extend_from_slice(&v1[10..]);
        assert_eq!(parse_npy(&v2, p(), "x").unwrap().data, vec![7.0]);
        v2[6] = 3;
        assert_eq!(parse_npy(&v2, p(), "x").unwrap().data, vec![7.0]);
        // A header length beyond the file is refused before anything is allocated.
        let mut huge = v2.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = parse_npy(&huge, p(), "x").unwrap_err().to_string();
        assert!(e.contains("exceeds the limit"), "{e}");
        huge[8..12].copy_from_slice(&1000u32.to_le_bytes());
        let e = parse_npy(&huge, p(), "x").unwrap_err().to_string();
        assert!(e.contains("header declares 1000 bytes"), "{e}");
        v2[6] = 4;
        let e = parse_npy(&v2, p(), "x").unwrap_err().to_string();
        assert!(e.contains("version 4.0"), "{e}");
    }

    #[test]
    fn overflowing_shape_is_an_error() {
        for shape in [[usize::MAX / 2, 4], [0, 1 << 63]] {
            let bytes = encode_npy("<f8", &shape, false, &[]);
            let e = parse_npy(&bytes, p(), "x").unwrap_err().to_string();
            assert!(e.contains("mem.npy") && e.contains("overflows"), "{e}");
        }
        let bytes = encode_npy("<f4", &[1 << 40], false, &[]);
        let e = parse_npy(&bytes, p(), "x").unwrap_err().to_string();
        assert!(e.contains("data truncated: expected 4398046511104 bytes, got 0"), "{e}");
    }

    #[test]
    fn bad_bool_and_unsupported_descriptors() {
        let e = parse_npy(&encode_npy("|b1", &[2], false, &[0, 2]), p(), "x").unwrap_err().to_string();
        assert!(e.contains("mem.npy") && e.contains("`x`") && e.contains("invalid data"), "{e}");
        for descr in ["=f4", "|f4", "<c8", "<U3", "<M8[s]"] {
            let e = parse_npy(&encode_npy(descr, &[1], false, &[0; 16]), p(), "x").unwrap_err().to_string();
            assert!(e.contains(&format!("unsupported dtype {descr}")), "{e}");
        }
    }
}
