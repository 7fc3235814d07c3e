//! The durable record of one transactional id: what the coordinator decides on and what the
//! store writes to `__transaction_state-0`. It sits apart from both so that the store does not
//! depend on the coordinator's rules, nor the rules on the store beyond its trait.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::ids::{ProducerId, TopicPartition};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

/// One transactional id's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnMeta {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    /// `(topic, partition)` of every partition written in the current transaction.
    pub partitions: BTreeSet<(String, i32)>,
    /// When the current transaction began (wall clock, ms): its timeout counts from here.
    pub started_ms: i64,
    /// Consumer groups whose offsets the current transaction may commit (AddOffsetsToTxn).
    /// Absent in records written before offsets were served.
    #[serde(default)]
    pub groups: BTreeSet<String>,
}

impl TxnMeta {
    pub(super) fn producer(&self) -> ProducerId {
        ProducerId(self.producer_id)
    }

    pub(super) fn tps(&self) -> Vec<TopicPartition> {
        self.partitions
            .iter()
            .map(|(t, p)| TopicPartition::new(t.clone(), *p))
            .collect()
    }
}
