//! Errors of the benchmark tools.

/// Why the synthetic source or the raw-copy client stopped or refused a request.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("invalid synthetic source spec: {0}")]
    BadSpec(String),
    #[error("could not build the batch template: {0}")]
    Template(String),
    #[error("request frame of {size} bytes exceeds the limit {max}")]
    FrameTooLarge { size: usize, max: usize },
    #[error("request frame length {0} is negative")]
    NegativeFrame(i32),
    #[error("could not decode {what}: {reason}")]
    Decode { what: &'static str, reason: String },
    #[error("could not encode {what}: {reason}")]
    Encode { what: &'static str, reason: String },
    #[error("unsupported request: api key {api_key} version {api_version}")]
    Unsupported { api_key: i16, api_version: i16 },
    #[error("source answered {got} bytes where the spec predicts {expected}")]
    UnexpectedResponseSize { expected: usize, got: usize },
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}
