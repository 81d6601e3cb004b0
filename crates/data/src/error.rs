//! Error type of the crate.
//!
//! Every variant that concerns a file carries its path and the message always
//! starts with that path, followed by what exactly is wrong with it.

use std::path::PathBuf;

/// Errors produced while generating or loading voxel data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// Invalid configuration value (procedural generator, dataset options).
    #[error("invalid config: field `{field}`: {reason}")]
    InvalidConfig {
        /// Name of the offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// The file (or directory) could not be read.
    #[error("{}: I/O error: {source}", .path.display())]
    Io {
        /// File or directory that failed.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The file is not a readable zip archive (an `.npz` is a zip of `.npy` members).
    #[error("{}: not a valid .npz (zip) archive: {reason}", .path.display())]
    NotZip {
        /// Offending file.
        path: PathBuf,
        /// Reason given by the zip reader.
        reason: String,
    },

    /// A member of the zip archive could not be extracted (bad CRC, corrupt deflate stream, ...).
    #[error("{}: cannot extract archive member `{entry}`: {reason}", .path.display())]
    ZipEntry {
        /// Offending file.
        path: PathBuf,
        /// Member name inside the archive.
        entry: String,
        /// Reason given by the zip reader.
        reason: String,
    },

    /// A required array is not in the archive.
    #[error("{}: missing array `{key}` (arrays present: [{}])", .path.display(), .present.join(", "))]
    MissingKey {
        /// Offending file.
        path: PathBuf,
        /// Array name(s) that were looked for.
        key: String,
        /// Array names that the file does contain.
        present: Vec<String>,
    },

    /// The `.npy` data does not start with the `\x93NUMPY` magic string.
    #[error("{}: array `{entry}`: bad .npy magic (expected \\x93NUMPY, got {found:02x?})", .path.display())]
    BadMagic {
        /// Offending file.
        path: PathBuf,
        /// Array (member) name; the file name for a bare `.npy`.
        entry: String,
        /// First bytes that were found instead (at most 6).
        found: Vec<u8>,
    },

    /// The `.npy` format version is not 1.0, 2.0 or 3.0.
    #[error("{}: array `{entry}`: unsupported .npy format version {major}.{minor} (supported: 1.0, 2.0, 3.0)", .path.display())]
    UnsupportedVersion {
        /// Offending file.
        path: PathBuf,
        /// Array name.
        entry: String,
        /// Major version byte.
        major: u8,
        /// Minor version byte.
        minor: u8,
    },

    /// The array's dtype cannot be converted to `f32`.
    #[error("{}: array `{entry}`: unsupported dtype {descr} (supported: f2/f4/f8, i1/i2/i4/i8, u1/u2/u4/u8, b1)", .path.display())]
    UnsupportedDtype {
        /// Offending file.
        path: PathBuf,
        /// Array name.
        entry: String,
        /// The `descr` value found in the header.
        descr: String,
    },

    /// The `.npy` header dictionary could not be parsed or is inconsistent.
    #[error("{}: array `{entry}`: unparsable .npy header: {reason}", .path.display())]
    BadHeader {
        /// Offending file.
        path: PathBuf,
        /// Array name.
        entry: String,
        /// What is wrong.
        reason: String,
    },

    /// Fewer data bytes than the header's shape and dtype require.
    #[error("{}: array `{entry}`: data truncated: expected {expected} bytes, got {got}", .path.display())]
    Truncated {
        /// Offending file.
        path: PathBuf,
        /// Array name.
        entry: String,
        /// Bytes required by shape x itemsize.
        expected: u64,
        /// Bytes actually present.
        got: u64,
    },

    /// The array's data bytes are not valid for its dtype (e.g. a `bool` byte other than 0 or 1).
    #[error("{}: array `{entry}`: invalid data: {reason}", .path.display())]
    BadData {
        /// Offending file.
        path: PathBuf,
        /// Array name.
        entry: String,
        /// What is wrong, as the `.npy` reader says it.
        reason: String,
    },

    /// An array has a shape the loader cannot use (e.g. not 4 channels).
    #[error("{}: wrong shape: {detail}", .path.display())]
    WrongShape {
        /// Offending file.
        path: PathBuf,
        /// Expected vs. found.
        detail: String,
    },

    /// Sparse voxel coordinates are inconsistent with the grid (out of bounds, not integers).
    #[error("{}: invalid sparse voxel data: {detail}", .path.display())]
    BadSparse {
        /// Offending file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },

    /// NaN or infinite values in the voxel features.
    #[error("{}: {count} non-finite value(s) (NaN/inf) found in `{entry}`", .path.display())]
    NonFinite {
        /// Offending file.
        path: PathBuf,
        /// Array name.
        entry: String,
        /// Number of non-finite values.
        count: usize,
    },

    /// A size is beyond what this reader accepts (protects against corrupt headers).
    #[error("{}: {what} too large: {size} exceeds the limit of {limit}", .path.display())]
    TooLarge {
        /// Offending file.
        path: PathBuf,
        /// What was too large.
        what: String,
        /// Size found.
        size: u64,
        /// Limit.
        limit: u64,
    },

    /// The grid in a file is smaller than the requested center crop.
    #[error("{}: grid (D, H, W) = {grid:?} is smaller than the requested crop {crop:?}", .path.display())]
    CropTooLarge {
        /// Offending file.
        path: PathBuf,
        /// Spatial size of the file's grid after transposition.
        grid: [usize; 3],
        /// Requested crop.
        crop: [usize; 3],
    },

    /// Two files of a dataset have different grid shapes and no crop was requested.
    #[error("{}: grid shape {found:?} differs from {expected:?} of {} (set a crop to batch them)", .path.display(), .first.display())]
    ShapeMismatch {
        /// File with the differing shape.
        path: PathBuf,
        /// Its shape (C, D, H, W).
        found: [usize; 4],
        /// First file of the batch.
        first: PathBuf,
        /// Shape (C, D, H, W) of the first file.
        expected: [usize; 4],
    },

    /// The dataset directory holds no `.npz`/`.npy` files.
    #[error("{}: no .npz or .npy voxel files found in directory", .path.display())]
    EmptyDataset {
        /// Directory that was scanned.
        path: PathBuf,
    },

    /// A batch index is not smaller than the dataset length.
    #[error("{}: sample index {index} out of range (dataset has {len} files)", .path.display())]
    IndexOutOfRange {
        /// Dataset directory.
        path: PathBuf,
        /// Requested index.
        index: u64,
        /// Dataset length.
        len: usize,
    },
}
