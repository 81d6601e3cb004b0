//! Minimal, panic-free `.npy` parser (NumPy array format versions 1.0, 2.0, 3.0).
//!
//! Layout of a `.npy` file: the 6-byte magic `\x93NUMPY`, a major and a minor
//! version byte, the header length (`u16` little endian for 1.0, `u32` for 2.0
//! and 3.0), then an ASCII (latin-1; UTF-8 for 3.0) Python dict literal such as
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`, padded with
//! spaces and a newline, followed by the raw array data.
//!
//! Every supported dtype is converted to `f32`; Fortran-ordered data is
//! reordered to C (row-major) order.

use std::path::{Path, PathBuf};

use crate::DataError;

/// Largest header accepted (NumPy itself refuses headers above 10 000 bytes by default).
const MAX_HEADER_LEN: usize = 1 << 20;
/// Deepest nesting of tuples/lists/dicts accepted in a header literal.
const MAX_NESTING: usize = 16;

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
    const MAGIC: &[u8; 6] = b"\x93NUMPY";
    if !bytes.starts_with(MAGIC) {
        return Err(DataError::BadMagic {
            path: path.to_path_buf(),
            entry: entry.to_string(),
            found: bytes.iter().take(6).copied().collect(),
        });
    }
    let (major, minor) = match (bytes.get(6), bytes.get(7)) {
        (Some(&a), Some(&b)) => (a, b),
        _ => return Err(ctx.header("file ends inside the version bytes")),
    };
    let (header_len, header_start) = match (major, minor) {
        (1, 0) => match bytes.get(8..10) {
            Some(b) => (u16::from_le_bytes([b[0], b[1]]) as usize, 10usize),
            None => return Err(ctx.header("file ends inside the header length")),
        },
        (2, 0) | (3, 0) => match bytes.get(8..12) {
            Some(b) => (
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize,
                12usize,
            ),
            None => return Err(ctx.header("file ends inside the header length")),
        },
        _ => {
            return Err(DataError::UnsupportedVersion {
                path: path.to_path_buf(),
                entry: entry.to_string(),
                major,
                minor,
            });
        }
    };
    if header_len > MAX_HEADER_LEN {
        return Err(ctx.header(&format!(
            "header length {header_len} exceeds the limit of {MAX_HEADER_LEN} bytes"
        )));
    }
    let data_start = header_start
        .checked_add(header_len)
        .ok_or_else(|| ctx.header("header length overflows"))?;
    let header_bytes = bytes.get(header_start..data_start).ok_or_else(|| {
        ctx.header(&format!(
            "header declares {header_len} bytes but the file has only {} after the preamble",
            bytes.len().saturating_sub(header_start)
        ))
    })?;
    let header_text: String = if major == 3 {
        std::str::from_utf8(header_bytes)
            .map_err(|e| ctx.header(&format!("header is not UTF-8: {e}")))?
            .to_string()
    } else {
        // latin-1: every byte maps to the code point of the same value.
        header_bytes.iter().map(|&b| b as char).collect()
    };
    let header = parse_header(&header_text).map_err(|reason| ctx.header(&reason))?;

    let dtype = Dtype::parse(&header.descr).ok_or_else(|| DataError::UnsupportedDtype {
        path: path.to_path_buf(),
        entry: entry.to_string(),
        descr: header.descr.clone(),
    })?;

    let count = header
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| ctx.header(&format!("shape {:?} overflows the element count", header.shape)))?;
    let expected = count
        .checked_mul(dtype.size)
        .ok_or_else(|| ctx.header(&format!("shape {:?} overflows the byte count", header.shape)))?;
    let payload = bytes.get(data_start..).unwrap_or(&[]);
    if payload.len() < expected {
        return Err(DataError::Truncated {
            path: path.to_path_buf(),
            entry: entry.to_string(),
            expected: expected as u64,
            got: payload.len() as u64,
        });
    }
    // Trailing bytes after the array are ignored, as `numpy.load` does.
    let raw = payload.get(..expected).unwrap_or(&[]);
    let mut data: Vec<f32> = raw.chunks_exact(dtype.size).map(|c| dtype.decode(c)).collect();
    if header.fortran_order && header.shape.len() > 1 {
        data = fortran_to_c(&data, &header.shape);
    }
    Ok(NpyArray {
        shape: header.shape,
        data,
        descr: header.descr,
    })
}

struct Ctx<'a> {
    path: &'a Path,
    entry: &'a str,
}

impl Ctx<'_> {
    fn header(&self, reason: &str) -> DataError {
        DataError::BadHeader {
            path: PathBuf::from(self.path),
            entry: self.entry.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// Reorders column-major data of the given shape into row-major order.
fn fortran_to_c(src: &[f32], shape: &[usize]) -> Vec<f32> {
    let n = src.len();
    let mut out = vec![0.0f32; n];
    // Row-major strides.
    let mut cstride = vec![1usize; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        cstride[k] = cstride[k + 1].saturating_mul(shape[k + 1]);
    }
    // Walk the source in column-major order (axis 0 fastest), tracking the C offset.
    let mut idx = vec![0usize; shape.len()];
    let mut c_off = 0usize;
    for &v in src {
        if let Some(slot) = out.get_mut(c_off) {
            *slot = v;
        }
        for k in 0..shape.len() {
            idx[k] += 1;
            if idx[k] < shape[k] {
                c_off += cstride[k];
                break;
            }
            c_off -= (shape[k] - 1) * cstride[k];
            idx[k] = 0;
        }
    }
    out
}

/// Element type of the stored data.
#[derive(Debug, Clone, Copy)]
struct Dtype {
    kind: Kind,
    size: usize,
    big_endian: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Float,
    Int,
    Uint,
    Bool,
}

impl Dtype {
    fn parse(descr: &str) -> Option<Dtype> {
        let mut chars = descr.chars();
        let order = chars.next()?;
        let big_endian = match order {
            '<' | '|' | '=' => false,
            '>' => true,
            _ => return None,
        };
        let kind = match chars.next()? {
            'f' => Kind::Float,
            'i' => Kind::Int,
            'u' => Kind::Uint,
            'b' => Kind::Bool,
            _ => return None,
        };
        let size: usize = chars.as_str().parse().ok()?;
        let ok = match kind {
            Kind::Float => matches!(size, 2 | 4 | 8),
            Kind::Int | Kind::Uint => matches!(size, 1 | 2 | 4 | 8),
            Kind::Bool => size == 1,
        };
        ok.then_some(Dtype {
            kind,
            size,
            big_endian,
        })
    }

    /// Decodes one element; `b.len() == self.size` is guaranteed by `chunks_exact`.
    fn decode(&self, b: &[u8]) -> f32 {
        let mut buf = [0u8; 8];
        let n = self.size.min(8).min(b.len());
        buf[..n].copy_from_slice(&b[..n]);
        if self.big_endian {
            buf[..n].reverse();
        }
        match (self.kind, self.size) {
            (Kind::Bool, _) => f32::from(u8::from(buf[0] != 0)),
            (Kind::Float, 2) => f16_to_f32(u16::from_le_bytes([buf[0], buf[1]])),
            (Kind::Float, 4) => f32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]),
            (Kind::Float, _) => f64::from_le_bytes(buf) as f32,
            (Kind::Int, 1) => f32::from(buf[0] as i8),
            (Kind::Int, 2) => f32::from(i16::from_le_bytes([buf[0], buf[1]])),
            (Kind::Int, 4) => i32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as f32,
            (Kind::Int, _) => i64::from_le_bytes(buf) as f32,
            (Kind::Uint, 1) => f32::from(buf[0]),
            (Kind::Uint, 2) => f32::from(u16::from_le_bytes([buf[0], buf[1]])),
            (Kind::Uint, 4) => u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as f32,
            (Kind::Uint, _) => u64::from_le_bytes(buf) as f32,
        }
    }
}

/// IEEE 754 half precision to single precision (exact).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal half: value = m * 2^-24, exactly representable as f32.
            let v = m as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// The three fields of a `.npy` header that matter.
#[derive(Debug)]
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// Subset of Python literals that appear in `.npy` headers.
#[derive(Debug)]
enum Lit {
    Str(String),
    Bool(bool),
    Int(i128),
    None,
    Seq(Vec<Lit>),
    Dict(Vec<(Lit, Lit)>),
}

impl Lit {
    fn repr(&self) -> String {
        match self {
            Lit::Str(s) => format!("'{s}'"),
            Lit::Bool(b) => if *b { "True" } else { "False" }.to_string(),
            Lit::Int(i) => i.to_string(),
            Lit::None => "None".to_string(),
            Lit::Seq(v) => format!("[{}]", v.iter().map(Lit::repr).collect::<Vec<_>>().join(", ")),
            Lit::Dict(v) => format!(
                "{{{}}}",
                v.iter()
                    .map(|(k, v)| format!("{}: {}", k.repr(), v.repr()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

fn parse_header(text: &str) -> Result<Header, String> {
    let mut p = LitParser {
        s: text.as_bytes(),
        pos: 0,
    };
    let lit = p.value(0)?;
    p.skip_ws();
    if p.pos != p.s.len() {
        return Err(format!("unexpected trailing text at byte {} of the header", p.pos));
    }
    let Lit::Dict(items) = lit else {
        return Err(format!("header is not a dict: {}", lit.repr()));
    };
    let mut descr = None;
    let mut fortran = None;
    let mut shape = None;
    for (k, v) in items {
        let Lit::Str(k) = k else {
            return Err(format!("non-string key {} in header dict", k.repr()));
        };
        match k.as_str() {
            "descr" => match v {
                Lit::Str(s) => descr = Some(s),
                // Structured dtypes are given as a list of fields.
                other => descr = Some(other.repr()),
            },
            "fortran_order" => match v {
                Lit::Bool(b) => fortran = Some(b),
                other => return Err(format!("'fortran_order' is not a bool: {}", other.repr())),
            },
            "shape" => {
                let Lit::Seq(dims) = v else {
                    return Err(format!("'shape' is not a tuple: {}", v.repr()));
                };
                let mut out = Vec::with_capacity(dims.len());
                for d in dims {
                    match d {
                        Lit::Int(i) => out.push(usize::try_from(i).map_err(|_| {
                            format!("'shape' entry {i} is negative or too large")
                        })?),
                        other => {
                            return Err(format!("'shape' entry is not an integer: {}", other.repr()));
                        }
                    }
                }
                shape = Some(out);
            }
            _ => {} // Unknown keys are tolerated.
        }
    }
    Ok(Header {
        descr: descr.ok_or("missing key 'descr'")?,
        fortran_order: fortran.ok_or("missing key 'fortran_order'")?,
        shape: shape.ok_or("missing key 'shape'")?,
    })
}

struct LitParser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl LitParser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Result<Lit, String> {
        if depth > MAX_NESTING {
            return Err(format!("nesting deeper than {MAX_NESTING} levels"));
        }
        self.skip_ws();
        match self.peek() {
            None => Err("unexpected end of header".to_string()),
            Some(b'{') => {
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    self.skip_ws();
                    if self.peek() == Some(b'}') {
                        self.pos += 1;
                        return Ok(Lit::Dict(items));
                    }
                    let k = self.value(depth + 1)?;
                    self.skip_ws();
                    if self.peek() != Some(b':') {
                        return Err(format!("expected ':' at byte {} of the header", self.pos));
                    }
                    self.pos += 1;
                    let v = self.value(depth + 1)?;
                    items.push((k, v));
                    self.skip_ws();
                    match self.peek() {
                        Some(b',') => self.pos += 1,
                        Some(b'}') => {}
                        _ => return Err(format!("expected ',' or '}}' at byte {} of the header", self.pos)),
                    }
                }
            }
            Some(open @ (b'(' | b'[')) => {
                let close = if open == b'(' { b')' } else { b']' };
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    self.skip_ws();
                    if self.peek() == Some(close) {
                        self.pos += 1;
                        return Ok(Lit::Seq(items));
                    }
                    items.push(self.value(depth + 1)?);
                    self.skip_ws();
                    match self.peek() {
                        Some(b',') => self.pos += 1,
                        Some(c) if c == close => {}
                        _ => {
                            return Err(format!(
                                "expected ',' or '{}' at byte {} of the header",
                                close as char, self.pos
                            ));
                        }
                    }
                }
            }
            Some(q @ (b'\'' | b'"')) => {
                self.pos += 1;
                let start = self.pos;
                while let Some(c) = self.peek() {
                    if c == q {
                        let s = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
                        self.pos += 1;
                        return Ok(Lit::Str(s));
                    }
                    if c == b'\\' {
                        return Err("escape sequences in header strings are not supported".to_string());
                    }
                    self.pos += 1;
                }
                Err("unterminated string in header".to_string())
            }
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                let start = self.pos;
                self.pos += 1;
                while matches!(self.peek(), Some(d) if d.is_ascii_digit()) {
                    self.pos += 1;
                }
                // Python 2 long literals (e.g. `3L`) appear in very old files.
                let digits = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
                if matches!(self.peek(), Some(b'L' | b'l')) {
                    self.pos += 1;
                }
                digits
                    .parse::<i128>()
                    .map(Lit::Int)
                    .map_err(|_| format!("bad integer `{digits}` in header"))
            }
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.pos;
                while matches!(self.peek(), Some(d) if d.is_ascii_alphanumeric() || d == b'_') {
                    self.pos += 1;
                }
                match &self.s[start..self.pos] {
                    b"True" => Ok(Lit::Bool(true)),
                    b"False" => Ok(Lit::Bool(false)),
                    b"None" => Ok(Lit::None),
                    other => Err(format!(
                        "unexpected name `{}` in header",
                        String::from_utf8_lossy(other)
                    )),
                }
            }
            Some(c) => Err(format!(
                "unexpected character {:?} at byte {} of the header",
                c as char, self.pos
            )),
        }
    }
}

/// Builds the bytes of a version 1.0 `.npy` file (used by tests and tools).
///
/// `descr` is written verbatim; `data` must already be encoded in that dtype.
pub fn encode_npy(descr: &str, shape: &[usize], fortran_order: bool, data: &[u8]) -> Vec<u8> {
    let shape_txt = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("mem.npy")
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
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

        // 3-D: shape (2, 3, 4), value = C linear index.
        let shape = [2usize, 3, 4];
        let mut fdata = Vec::new();
        for k in 0..4 {
            for j in 0..3 {
                for i in 0..2 {
                    fdata.push((i * 12 + j * 4 + k) as f32);
                }
            }
        }
        let bytes = encode_npy("<f4", &shape, true, &f32_bytes(&fdata));
        let a = parse_npy(&bytes, p(), "x").unwrap();
        assert_eq!(a.data, (0..24).map(|v| v as f32).collect::<Vec<_>>());
    }

    #[test]
    fn converts_all_dtypes() {
        let cases: Vec<(&str, Vec<u8>, Vec<f32>)> = vec![
            ("<f8", [1.5f64, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect(), vec![1.5, -2.0]),
            ("<f2", vec![0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00], vec![1.0, -2.0, 5.960_464_5e-8]),
            ("|u1", vec![0, 255], vec![0.0, 255.0]),
            ("|b1", vec![0, 1], vec![0.0, 1.0]),
            ("<i4", [-7i32, 9].iter().flat_map(|x| x.to_le_bytes()).collect(), vec![-7.0, 9.0]),
            ("<i8", [-3i64, 600].iter().flat_map(|x| x.to_le_bytes()).collect(), vec![-3.0, 600.0]),
            ("<u2", [65535u16, 2].iter().flat_map(|x| x.to_le_bytes()).collect(), vec![65535.0, 2.0]),
            (">f4", [3.25f32, 1.0].iter().flat_map(|x| x.to_be_bytes()).collect(), vec![3.25, 1.0]),
        ];
        for (descr, raw, want) in cases {
            let n = want.len();
            let bytes = encode_npy(descr, &[n], false, &raw);
            let a = parse_npy(&bytes, p(), "x").unwrap_or_else(|e| panic!("{descr}: {e}"));
            assert_eq!(a.data, want, "{descr}");
        }
    }

    #[test]
    fn f16_specials() {
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
    }

    #[test]
    fn scalar_and_empty() {
        let bytes = encode_npy("<f4", &[], false, &f32_bytes(&[4.0]));
        let a = parse_npy(&bytes, p(), "x").unwrap();
        assert!(a.shape.is_empty());
        assert_eq!(a.data, vec![4.0]);
        let bytes = encode_npy("<i8", &[0, 3], false, &[]);
        let a = parse_npy(&bytes, p(), "x").unwrap();
        assert_eq!(a.shape, vec![0, 3]);
        assert!(a.is_empty());
    }

    #[test]
    fn header_variants() {
        for h in [
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
            "{\"shape\": [2], \"fortran_order\": False, \"descr\": \"<f4\"}",
            "{'descr':'<f4','fortran_order':False,'shape':(2L,)}",
        ] {
            let hd = parse_header(h).unwrap();
            assert_eq!(hd.shape, vec![2]);
            assert_eq!(hd.descr, "<f4");
        }
        for bad in [
            "",
            "{'descr': '<f4', 'shape': (2,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
            "{'descr': '<f4', 'fortran_order': 1, 'shape': (2,)}",
            "{'descr': '<f4' 'fortran_order': False}",
            "[(((((((((((((((((((((((((((((((((((((",
        ] {
            assert!(parse_header(bad).is_err(), "{bad}");
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
        v2[6] = 4;
        let e = parse_npy(&v2, p(), "x").unwrap_err().to_string();
        assert!(e.contains("version 4.0"), "{e}");
    }

    #[test]
    fn overflowing_shape_is_an_error() {
        let bytes = encode_npy("<f8", &[usize::MAX / 2, 4], false, &[]);
        let e = parse_npy(&bytes, p(), "x").unwrap_err().to_string();
        assert!(e.contains("mem.npy") && e.contains("overflows"), "{e}");
    }
}
