//! The storage layer's error type: every failure names the file and what was wrong with it.

use std::path::PathBuf;

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
}

impl LogError {
    /// Wraps an I/O error with the path it happened on (the std error alone does not say).
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> LogError {
        LogError::Io {
            path: path.into(),
            source,
        }
    }

    pub fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> LogError {
        LogError::Corrupt {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
