//! Minimal columnar parquet reader on the `parquet` crate's low-level column API
//! (no arrow): reads leaf columns with their definition/repetition levels and
//! reassembles the few shapes LeRobot uses (scalars, (fixed-size) lists of numbers,
//! lists of strings, image structs {bytes, path}).

use std::path::{Path, PathBuf};

use parquet::basic::Repetition;
use parquet::column::reader::ColumnReader;
use parquet::data_type::ByteArray;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::Type;

use crate::error::{guard, read_file, DatasetError};

/// Decoded non-null values of one leaf column.
#[derive(Debug)]
pub(crate) enum Values {
    Bool(Vec<bool>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bytes(Vec<ByteArray>),
    Other,
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::Bool(v) => v.len(),
            Values::I32(v) => v.len(),
            Values::I64(v) => v.len(),
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
            Values::Bytes(v) => v.len(),
            Values::Other => 0,
        }
    }
    fn get_f64(&self, i: usize) -> Option<f64> {
        Some(match self {
            Values::Bool(v) => *v.get(i)? as u8 as f64,
            Values::I32(v) => *v.get(i)? as f64,
            Values::I64(v) => *v.get(i)? as f64,
            Values::F32(v) => *v.get(i)? as f64,
            Values::F64(v) => *v.get(i)?,
            Values::Bytes(_) | Values::Other => return None,
        })
    }
    fn get_f32(&self, i: usize) -> Option<f32> {
        Some(match self {
            Values::F32(v) => *v.get(i)?,
            _ => self.get_f64(i)? as f32,
        })
    }
}

/// One leaf column: values plus levels.
#[derive(Debug)]
pub(crate) struct Leaf {
    pub path: Vec<String>,
    values: Values,
    def: Vec<i16>,
    rep: Vec<i16>,
    max_def: i16,
    max_rep: i16,
    /// Definition level at which an element of the innermost repeated group exists.
    elem_def: i16,
}

/// A parquet file read into memory column by column.
#[derive(Debug)]
pub(crate) struct Table {
    pub path: PathBuf,
    pub num_rows: usize,
    pub leaves: Vec<Leaf>,
}

/// Walk the schema along `parts`, returning the definition level at the innermost
/// repeated node (or None when there is none).
fn elem_def_level(root: &Type, parts: &[String]) -> Option<i16> {
    let mut node = root;
    let mut def = 0i16;
    let mut elem = None;
    for p in parts {
        let child = node.get_fields().iter().find(|f| f.name() == p)?;
        node = child.as_ref();
        if node.get_basic_info().has_repetition() {
            match node.get_basic_info().repetition() {
                Repetition::OPTIONAL => def += 1,
                Repetition::REPEATED => {
                    def += 1;
                    elem = Some(def);
                }
                Repetition::REQUIRED => {}
            }
        }
        if !node.is_group() {
            break;
        }
    }
    elem
}

impl Table {
    /// Read a parquet file, keeping only top-level columns accepted by `want`.
    pub fn read(path: &Path, want: &dyn Fn(&str) -> bool) -> Result<Table, DatasetError> {
        let bytes = read_file(path)?;
        Self::from_bytes(path, bytes, want)
    }

    pub fn from_bytes(path: &Path, bytes: Vec<u8>, want: &dyn Fn(&str) -> bool) -> Result<Table, DatasetError> {
        guard(path, "parquet decoding", DatasetError::parquet, || Self::read_inner(path, bytes, want))
    }

    fn read_inner(path: &Path, bytes: Vec<u8>, want: &dyn Fn(&str) -> bool) -> Result<Table, DatasetError> {
        let perr = |e: parquet::errors::ParquetError| DatasetError::parquet(path, e.to_string());
        let reader = SerializedFileReader::new(bytes::Bytes::from(bytes)).map_err(perr)?;
        let meta = reader.metadata();
        let schema = meta.file_metadata().schema_descr();
        let num_rows = usize::try_from(meta.file_metadata().num_rows())
            .map_err(|_| DatasetError::parquet(path, "negative row count"))?;
        let rg_rows: i64 = meta.row_groups().iter().map(|rg| rg.num_rows()).sum();
        if rg_rows != num_rows as i64 {
            return Err(DatasetError::parquet(
                path,
                format!("row groups hold {rg_rows} rows but the footer says {num_rows}"),
            ));
        }
        let mut leaves = Vec::new();
        for (ci, col) in schema.columns().iter().enumerate() {
            let parts = col.path().parts().to_vec();
            if parts.is_empty() || !want(&parts[0]) {
                continue;
            }
            let max_def = col.max_def_level();
            let max_rep = col.max_rep_level();
            let elem_def = elem_def_level(schema.root_schema(), &parts).unwrap_or(0);
            let mut leaf = Leaf {
                path: parts,
                values: Values::Other,
                def: Vec::new(),
                rep: Vec::new(),
                max_def,
                max_rep,
                elem_def,
            };
            for rg in 0..reader.num_row_groups() {
                let rgr = reader.get_row_group(rg).map_err(perr)?;
                let n = rgr.metadata().num_rows().max(0) as usize;
                let cr = rgr.get_column_reader(ci).map_err(perr)?;
                let def = if max_def > 0 { Some(&mut leaf.def) } else { None };
                let rep = if max_rep > 0 { Some(&mut leaf.rep) } else { None };
                macro_rules! rd {
                    ($r:expr, $variant:ident, $t:ty) => {{
                        if !matches!(leaf.values, Values::$variant(_)) {
                            leaf.values = Values::$variant(Vec::<$t>::new());
                        }
                        let Values::$variant(buf) = &mut leaf.values else { unreachable!() };
                        let mut r = $r;
                        let (recs, _, _) = r.read_records(n, def, rep, buf).map_err(perr)?;
                        if recs != n {
                            return Err(DatasetError::parquet(
                                path,
                                format!("column {:?}: row group {rg} has {recs} records, expected {n}", leaf.path),
                            ));
                        }
                    }};
                }
                match cr {
                    ColumnReader::BoolColumnReader(r) => rd!(r, Bool, bool),
                    ColumnReader::Int32ColumnReader(r) => rd!(r, I32, i32),
                    ColumnReader::Int64ColumnReader(r) => rd!(r, I64, i64),
                    ColumnReader::FloatColumnReader(r) => rd!(r, F32, f32),
                    ColumnReader::DoubleColumnReader(r) => rd!(r, F64, f64),
                    ColumnReader::ByteArrayColumnReader(r) => rd!(r, Bytes, ByteArray),
                    _ => {
                        leaf.values = Values::Other;
                    }
                }
            }
            leaves.push(leaf);
        }
        Ok(Table { path: path.to_path_buf(), num_rows, leaves })
    }

    fn err(&self, msg: impl Into<String>) -> DatasetError {
        DatasetError::parquet(&self.path, msg)
    }

    /// Names of the top-level columns.
    pub fn column_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.leaves.iter().map(|l| l.path[0].clone()).collect();
        v.dedup();
        v
    }

    pub fn has_column(&self, name: &str) -> bool {
        self.leaves.iter().any(|l| l.path[0] == name)
    }

    fn leaf(&self, name: &str) -> Result<&Leaf, DatasetError> {
        let mut it = self.leaves.iter().filter(|l| l.path[0] == name);
        let leaf = it.next().ok_or_else(|| self.err(format!("missing column `{name}`")))?;
        if it.next().is_some() {
            return Err(self.err(format!("column `{name}` is a struct, expected a number or a list of numbers")));
        }
        Ok(leaf)
    }

    fn sub_leaf(&self, name: &str, field: &str) -> Option<&Leaf> {
        self.leaves.iter().find(|l| l.path[0] == name && l.path.last().map(String::as_str) == Some(field) && l.path.len() == 2)
    }

    /// Walk levels row by row: calls `f(row, Some(value_idx))` for each present element and
    /// `f(row, None)` for null elements; rows are delimited by repetition level 0.
    /// Every row needs at least one level (or value): rejects footers claiming more rows
    /// than the column holds before anything is allocated per row.
    fn check_rows(&self, leaf: &Leaf) -> Result<(), DatasetError> {
        let have = leaf.values.len().max(leaf.def.len()).max(leaf.rep.len());
        if self.num_rows > have {
            return Err(self.err(format!("column {:?}: {have} entries for {} rows", leaf.path, self.num_rows)));
        }
        Ok(())
    }

    fn walk(&self, leaf: &Leaf, mut f: impl FnMut(usize, Option<usize>) -> Result<(), DatasetError>) -> Result<(), DatasetError> {
        self.check_rows(leaf)?;
        let nvals = leaf.values.len();
        if leaf.max_def == 0 && leaf.max_rep == 0 {
            if nvals != self.num_rows {
                return Err(self.err(format!("column {:?}: {nvals} values for {} rows", leaf.path, self.num_rows)));
            }
            for i in 0..nvals {
                f(i, Some(i))?;
            }
            return Ok(());
        }
        let nlev = leaf.def.len().max(leaf.rep.len());
        if (leaf.max_def > 0 && leaf.def.len() != nlev) || (leaf.max_rep > 0 && leaf.rep.len() != nlev) {
            return Err(self.err(format!("column {:?}: inconsistent level counts", leaf.path)));
        }
        let mut row: isize = -1;
        let mut vi = 0usize;
        for li in 0..nlev {
            let d = if leaf.max_def > 0 { leaf.def[li] } else { 0 };
            let r = if leaf.max_rep > 0 { leaf.rep[li] } else { 0 };
            if r == 0 {
                row += 1;
            }
            if row < 0 {
                return Err(self.err(format!("column {:?}: first repetition level is not 0", leaf.path)));
            }
            if leaf.max_rep > 0 && d < leaf.elem_def {
                continue; // null or empty list: no element
            }
            if d == leaf.max_def {
                if vi >= nvals {
                    return Err(self.err(format!("column {:?}: more levels than values", leaf.path)));
                }
                f(row as usize, Some(vi))?;
                vi += 1;
            } else {
                f(row as usize, None)?;
            }
        }
        if (row + 1) as usize != self.num_rows {
            return Err(self.err(format!("column {:?}: {} rows decoded, expected {}", leaf.path, row + 1, self.num_rows)));
        }
        Ok(())
    }

    /// A numeric column (scalar, or list / fixed-size list / nested list) as rows of exactly
    /// `width` f32 values each, concatenated.
    pub fn f32_rows(&self, name: &str, width: usize) -> Result<Vec<f32>, DatasetError> {
        let leaf = self.leaf(name)?;
        if matches!(leaf.values, Values::Bytes(_) | Values::Other) {
            return Err(self.err(format!("column `{name}` is not numeric")));
        }
        let total = self.num_rows.checked_mul(width).ok_or_else(|| self.err("column too large"))?;
        if leaf.values.len() > total.max(1) * 4 + 1024 {
            return Err(self.err(format!("column `{name}`: {} values for {} rows of width {width}", leaf.values.len(), self.num_rows)));
        }
        self.check_rows(leaf)?;
        let mut out = Vec::with_capacity(total.min(leaf.values.len() + 16));
        let mut counts = vec![0usize; self.num_rows];
        self.walk(leaf, |row, v| {
            let vi = v.ok_or_else(|| self.err(format!("column `{name}`: null value in row {row}")))?;
            let c = counts.get_mut(row).ok_or_else(|| self.err(format!("column `{name}`: row {row} out of range")))?;
            *c += 1;
            if *c > width {
                return Err(self.err(format!("column `{name}`: row {row} has more than {width} values")));
            }
            out.push(leaf.values.get_f32(vi).unwrap_or(f32::NAN));
            Ok(())
        })?;
        if let Some((row, &c)) = counts.iter().enumerate().find(|(_, c)| **c != width) {
            return Err(self.err(format!("column `{name}`: row {row} has {c} values, expected {width}")));
        }
        Ok(out)
    }

    /// A scalar integer column.
    pub fn i64_col(&self, name: &str) -> Result<Vec<i64>, DatasetError> {
        let leaf = self.leaf(name)?;
        if leaf.max_rep != 0 {
            return Err(self.err(format!("column `{name}` is a list, expected an integer")));
        }
        let mut out = Vec::with_capacity(self.num_rows);
        self.walk(leaf, |row, v| {
            let vi = v.ok_or_else(|| self.err(format!("column `{name}`: null value in row {row}")))?;
            out.push(match &leaf.values {
                Values::I64(x) => x[vi],
                Values::I32(x) => x[vi] as i64,
                _ => return Err(self.err(format!("column `{name}` is not an integer column"))),
            });
            Ok(())
        })?;
        Ok(out)
    }

    /// A scalar float column as f64.
    pub fn f64_col(&self, name: &str) -> Result<Vec<f64>, DatasetError> {
        let leaf = self.leaf(name)?;
        if leaf.max_rep != 0 || matches!(leaf.values, Values::Bytes(_) | Values::Other) {
            return Err(self.err(format!("column `{name}` is not a numeric scalar")));
        }
        let mut out = Vec::with_capacity(self.num_rows);
        self.walk(leaf, |row, v| {
            let vi = v.ok_or_else(|| self.err(format!("column `{name}`: null value in row {row}")))?;
            out.push(leaf.values.get_f64(vi).unwrap_or(f64::NAN));
            Ok(())
        })?;
        Ok(out)
    }

    /// A string column, or a list-of-strings column, as one `Vec<String>` per row.
    pub fn string_lists(&self, name: &str) -> Result<Vec<Vec<String>>, DatasetError> {
        let leaf = self.leaf(name)?;
        let Values::Bytes(vals) = &leaf.values else {
            return Err(self.err(format!("column `{name}` is not a string column")));
        };
        self.check_rows(leaf)?;
        let mut out = vec![Vec::new(); self.num_rows];
        self.walk(leaf, |row, v| {
            if let Some(vi) = v {
                let s = std::str::from_utf8(vals[vi].data())
                    .map_err(|_| self.err(format!("column `{name}`: row {row} is not valid UTF-8")))?;
                out.get_mut(row).ok_or_else(|| self.err("row out of range"))?.push(s.to_string());
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// An image struct column {bytes: binary, path: string}: the raw encoded bytes per row
    /// (None where null) and the `path` field per row.
    pub fn image_col(&self, name: &str) -> Result<Vec<(Option<Vec<u8>>, Option<String>)>, DatasetError> {
        let bytes_leaf = self
            .sub_leaf(name, "bytes")
            .ok_or_else(|| self.err(format!("image column `{name}` has no `bytes` field (expected struct{{bytes, path}})")))?;
        self.check_rows(bytes_leaf)?;
        let mut out: Vec<(Option<Vec<u8>>, Option<String>)> = vec![(None, None); self.num_rows];
        let Values::Bytes(vals) = &bytes_leaf.values else {
            return Err(self.err(format!("image column `{name}`: `bytes` is not binary")));
        };
        if bytes_leaf.max_rep != 0 {
            return Err(self.err(format!("image column `{name}`: `bytes` is a list")));
        }
        self.walk(bytes_leaf, |row, v| {
            if let Some(vi) = v {
                out[row].0 = Some(vals[vi].data().to_vec());
            }
            Ok(())
        })?;
        if let Some(pl) = self.sub_leaf(name, "path")
            && let (Values::Bytes(pv), 0) = (&pl.values, pl.max_rep) {
                self.walk(pl, |row, v| {
                    if let Some(vi) = v {
                        out[row].1 = Some(String::from_utf8_lossy(pv[vi].data()).into_owned());
                    }
                    Ok(())
                })?;
            }
        Ok(out)
    }
}
