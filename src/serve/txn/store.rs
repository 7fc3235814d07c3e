//! `<data_dir>/__transaction_state-0`: the coordinator's durable state, a compacted keyed log
//! in Kafka's on-disk format (the same `KeyedLog` as `__mirror_state`). Key: the transactional
//! id's UTF-8 bytes; value: `TxnMeta` as JSON. This is kmirror's own schema, not Kafka's
//! `__transaction_state` record format: nothing but kmirror reads it.

use std::path::Path;

use crate::log::config::FlushPolicy;
use crate::log::keyed_log::{KeyedLog, KeyedLogError};
use crate::serve::txn::meta::TxnMeta;

pub const TOPIC: &str = "__transaction_state";

#[derive(Debug, thiserror::Error)]
pub enum TxnStoreError {
    #[error(transparent)]
    Log(#[from] KeyedLogError),
    #[error("__transaction_state record for {id:?}: {source}")]
    Decode {
        id: String,
        source: serde_json::Error,
    },
}

/// Where the coordinator keeps its records (a trait so the rules are testable without disk).
pub trait TxnStore: Send {
    fn load(&self) -> Result<Vec<(String, TxnMeta)>, TxnStoreError>;
    /// Durable before it returns (fdatasync): an answer is only sent after its record.
    fn put(&mut self, id: &str, meta: &TxnMeta) -> Result<(), TxnStoreError>;
    /// Forgets `id` (a tombstone, durable before it returns).
    fn delete(&mut self, id: &str) -> Result<(), TxnStoreError>;
}

#[derive(Debug)]
pub struct TxnLog {
    log: KeyedLog,
}

impl TxnLog {
    pub fn open(data_dir: &Path) -> Result<TxnLog, TxnStoreError> {
        Ok(TxnLog {
            log: KeyedLog::open(data_dir, TOPIC, FlushPolicy::EveryAppend)?,
        })
    }

    pub fn close(self) -> Result<(), TxnStoreError> {
        Ok(self.log.close()?)
    }
}

impl TxnStore for TxnLog {
    fn load(&self) -> Result<Vec<(String, TxnMeta)>, TxnStoreError> {
        self.log
            .live()
            .iter()
            .map(|(k, v)| {
                let id = String::from_utf8_lossy(k).into_owned();
                serde_json::from_slice(v)
                    .map(|m| (id.clone(), m))
                    .map_err(|source| TxnStoreError::Decode { id, source })
            })
            .collect()
    }

    fn put(&mut self, id: &str, meta: &TxnMeta) -> Result<(), TxnStoreError> {
        let value = serde_json::to_vec(meta).expect("TxnMeta serialises");
        Ok(self.log.put(id.as_bytes().to_vec(), value)?)
    }

    fn delete(&mut self, id: &str) -> Result<(), TxnStoreError> {
        Ok(self.log.delete(id.as_bytes())?)
    }
}
