//! The storage layer's error type: every failure names the file and what was wrong with it.

use std::path::PathBuf;

use crate::ids::Offset;
use crate::log::config::ConfigError;
use crate::wire::batch::BatchError;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("invalid batch: {0}")]
    InvalidBatch(#[from] BatchError),
    #[error("{partition}: append at offset {first} is below the log end offset {log_end}")]
    UnexpectedAppendOffset {
        partition: String,
        first: Offset,
        log_end: Offset,
    },
    #[error("{partition}: batch at offset {offset} does not follow the previous batch ending at {previous}")]
    NonIncreasingOffsets {
        partition: String,
        offset: Offset,
        previous: Offset,
    },
    #[error("{partition}: records end with a partial batch ({trailing} bytes)")]
    PartialBatch { partition: String, trailing: usize },
    #[error(
        "{partition}: batch at offset {offset} has {size} bytes, more than segment.bytes {max}"
    )]
    BatchLargerThanSegment {
        partition: String,
        offset: Offset,
        size: usize,
        max: u64,
    },
    #[error("{partition}: offset {requested} is outside [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        partition: String,
        requested: Offset,
        log_start: Offset,
        log_end: Offset,
    },
    #[error(
        "{partition}: log is offline after a disk error ({reason}); restart kmirror once the \
         disk is fixed (the log is recovered when it is opened again)"
    )]
    Failed { partition: String, reason: String },
    #[error("invalid log config: {0}")]
    Config(#[from] ConfigError),
}

impl LogError {
    /// Wraps an I/O error with the path it happened on (the std error alone does not say).
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> LogError {
        LogError::Io {
            path: path.into(),
            source,
        }
    }

    /// An I/O error saying the disk (or the user's quota) is full: `ENOSPC`/`EDQUOT`. Such
    /// a write may succeed once space is freed; every other I/O error is taken as the disk
    /// failing.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, LogError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)))
    }

    /// An I/O error of any kind (what takes a log offline unless the disk is merely full).
    pub fn is_io(&self) -> bool {
        matches!(self, LogError::Io { .. })
    }

    pub fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> LogError {
        LogError::Corrupt {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
