//! Per-(API, version) request counters of the Kafka endpoint, shown in `/metrics` as
//! `kmirror_endpoint_requests_total` and `kmirror_endpoint_request_errors_total`.
//!
//! Why: which versions stock clients really send (and whether each was understood) is the
//! compatibility evidence the tests check (`tests/serve_api_audit.rs`), and what an operator
//! needs to see when a client misbehaves. Cost: one relaxed atomic add per request on a fixed
//! table; no lock, no allocation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::limits::{SERVE_STATS_API_KEYS, SERVE_STATS_VERSIONS};
use crate::serve::ServeError;

/// Why a request closed its connection instead of being answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError {
    /// The body (or header) did not decode as the version it claims.
    Decode,
    /// The API or this version of it is not served.
    Unsupported,
    /// Anything else (encoding, I/O, a log read).
    Other,
}

impl RequestError {
    pub const ALL: [RequestError; 3] = [
        RequestError::Decode,
        RequestError::Unsupported,
        RequestError::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RequestError::Decode => "decode",
            RequestError::Unsupported => "unsupported",
            RequestError::Other => "other",
        }
    }

    pub fn of(e: &ServeError) -> RequestError {
        match e {
            ServeError::Decode { .. } | ServeError::Truncated { .. } => RequestError::Decode,
            ServeError::UnknownApi { .. }
            | ServeError::UnsupportedApi { .. }
            | ServeError::UnsupportedVersion { .. } => RequestError::Unsupported,
            _ => RequestError::Other,
        }
    }
}

/// One row of a snapshot: requests of `api_key` at `version` answered and refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestCount {
    pub api_key: i16,
    pub version: i16,
    pub served: u64,
    /// Indexed like `RequestError::ALL`.
    pub errors: [u64; 3],
}

const SLOTS: usize = SERVE_STATS_API_KEYS * SERVE_STATS_VERSIONS;

/// The counters; shared by every connection thread of a listener.
#[derive(Debug)]
pub struct RequestStats {
    served: Box<[AtomicU64]>,
    errors: Box<[[AtomicU64; 3]]>,
    /// Requests whose key or version lies outside the table (counted, not labelled).
    out_of_table: AtomicU64,
}

impl RequestStats {
    pub fn new() -> Arc<RequestStats> {
        Arc::new(RequestStats {
            served: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            errors: (0..SLOTS).map(|_| Default::default()).collect(),
            out_of_table: AtomicU64::new(0),
        })
    }

    fn slot(api_key: i16, version: i16) -> Option<usize> {
        let (k, v) = (
            usize::try_from(api_key).ok()?,
            usize::try_from(version).ok()?,
        );
        (k < SERVE_STATS_API_KEYS && v < SERVE_STATS_VERSIONS)
            .then_some(k * SERVE_STATS_VERSIONS + v)
    }

    /// Counts a request that was answered (or, for acks=0 produce, handled).
    pub fn served(&self, api_key: i16, version: i16) {
        match Self::slot(api_key, version) {
            Some(i) => self.served[i].fetch_add(1, Ordering::Relaxed),
            None => self.out_of_table.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Counts a request that closed its connection.
    pub fn failed(&self, api_key: i16, version: i16, why: RequestError) {
        let e = RequestError::ALL
            .iter()
            .position(|x| *x == why)
            .expect("every error is in ALL");
        match Self::slot(api_key, version) {
            Some(i) => self.errors[i][e].fetch_add(1, Ordering::Relaxed),
            None => self.out_of_table.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Every (API, version) seen so far, in key and version order.
    pub fn snapshot(&self) -> Vec<RequestCount> {
        let mut out = Vec::new();
        for i in 0..SLOTS {
            let served = self.served[i].load(Ordering::Relaxed);
            let errors = [0, 1, 2].map(|e| self.errors[i][e].load(Ordering::Relaxed));
            if served == 0 && errors.iter().all(|&e| e == 0) {
                continue;
            }
            out.push(RequestCount {
                api_key: (i / SERVE_STATS_VERSIONS) as i16,
                version: (i % SERVE_STATS_VERSIONS) as i16,
                served,
                errors,
            });
        }
        out
    }

    /// Requests with a key or version beyond the table.
    pub fn out_of_table(&self) -> u64 {
        self.out_of_table.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_api_and_version() {
        let s = RequestStats::new();
        s.served(3, 12);
        s.served(3, 12);
        s.failed(3, 12, RequestError::Decode);
        s.failed(68, 0, RequestError::Unsupported);
        s.served(-1, 0);
        s.served(1, SERVE_STATS_VERSIONS as i16);
        assert_eq!(
            s.snapshot(),
            vec![
                RequestCount {
                    api_key: 3,
                    version: 12,
                    served: 2,
                    errors: [1, 0, 0]
                },
                RequestCount {
                    api_key: 68,
                    version: 0,
                    served: 0,
                    errors: [0, 1, 0]
                },
            ]
        );
        assert_eq!(s.out_of_table(), 2);
    }
}
