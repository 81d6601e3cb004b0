//! Error type: every failure names the file (or dataset root) and what is wrong.

use std::path::{Path, PathBuf};

/// Everything that can go wrong while opening or reading a LeRobot dataset.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// The file could not be read (missing, permissions, ...).
    #[error("{}: cannot read file: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON / JSON-lines metadata file is malformed or misses required fields.
    #[error("{}: invalid metadata: {msg}", path.display())]
    Metadata { path: PathBuf, msg: String },
    /// A parquet file is corrupt, truncated, or its schema does not match info.json.
    #[error("{}: invalid parquet data: {msg}", path.display())]
    Parquet { path: PathBuf, msg: String },
    /// An mp4 container or AV1 stream is corrupt, truncated or unsupported.
    #[error("{}: invalid video: {msg}", path.display())]
    Video { path: PathBuf, msg: String },
    /// An embedded PNG/JPEG image could not be decoded.
    #[error("{}: invalid image: {msg}", path.display())]
    Image { path: PathBuf, msg: String },
    /// No video frame lies within the tolerance of a queried timestamp.
    #[error(
        "{}: no frame within {tolerance_s} s of timestamp {timestamp} s (closest frame at {closest} s)",
        path.display()
    )]
    TimestampNotFound {
        path: PathBuf,
        timestamp: f64,
        closest: f64,
        tolerance_s: f64,
    },
    /// The dataset layout/version is not supported by this reader.
    #[error("{}: unsupported: {msg}", path.display())]
    Unsupported { path: PathBuf, msg: String },
    /// A caller-side error (index out of range, unknown key, bad delta timestamps...).
    #[error("{0}")]
    InvalidArgument(String),
}

impl DatasetError {
    /// The file the error is about, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            DatasetError::Io { path, .. }
            | DatasetError::Metadata { path, .. }
            | DatasetError::Parquet { path, .. }
            | DatasetError::Video { path, .. }
            | DatasetError::Image { path, .. }
            | DatasetError::TimestampNotFound { path, .. }
            | DatasetError::Unsupported { path, .. } => Some(path),
            DatasetError::InvalidArgument(_) => None,
        }
    }

    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        DatasetError::Io { path: path.to_path_buf(), source }
    }
    pub(crate) fn meta(path: &Path, msg: impl Into<String>) -> Self {
        DatasetError::Metadata { path: path.to_path_buf(), msg: msg.into() }
    }
    pub(crate) fn parquet(path: &Path, msg: impl Into<String>) -> Self {
        DatasetError::Parquet { path: path.to_path_buf(), msg: msg.into() }
    }
    pub(crate) fn video(path: &Path, msg: impl Into<String>) -> Self {
        DatasetError::Video { path: path.to_path_buf(), msg: msg.into() }
    }
    pub(crate) fn image(path: &Path, msg: impl Into<String>) -> Self {
        DatasetError::Image { path: path.to_path_buf(), msg: msg.into() }
    }
    pub(crate) fn unsupported(path: &Path, msg: impl Into<String>) -> Self {
        DatasetError::Unsupported { path: path.to_path_buf(), msg: msg.into() }
    }
    pub(crate) fn arg(msg: impl Into<String>) -> Self {
        DatasetError::InvalidArgument(msg.into())
    }
}

/// Read a whole file, mapping the error to [`DatasetError::Io`].
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, DatasetError> {
    std::fs::read(path).map_err(|e| DatasetError::io(path, e))
}

/// Run `f`, turning a panic inside a third-party decoder into an error naming `path`.
pub(crate) fn guard<T>(
    path: &Path,
    what: &str,
    make: fn(&Path, String) -> DatasetError,
    f: impl FnOnce() -> Result<T, DatasetError>,
) -> Result<T, DatasetError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(make(path, format!("{what} failed on malformed input ({msg})")))
        }
    }
}
