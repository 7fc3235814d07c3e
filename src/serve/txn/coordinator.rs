//! The rules of the transaction coordinator, per transactional id (Kafka's transaction
//! version 1 state machine, on a single node):
//!
//! ```text
//! Empty ──AddPartitions──▶ Ongoing ──EndTxn──▶ PrepareCommit ─markers─▶ CompleteCommit
//!   ▲                         │        └─────▶ PrepareAbort  ─markers─▶ CompleteAbort
//!   └──── InitProducerId (epoch + 1; an Ongoing transaction is aborted first) ◀──────┘
//! ```
//!
//! AddOffsetsToTxn adds a consumer group to the transaction (Kafka adds the group's
//! `__consumer_offsets` partition); TxnOffsetCommit then holds that group's offsets as pending
//! in the group coordinator under the producer id (`TxnOffsets`), and the end of the
//! transaction (EndTxn, the timer, fencing, or completion at open) makes them committed or
//! drops them, after the partition markers and before Complete* is recorded.
//!
//! A transaction Ongoing for longer than its timeout is aborted by the timer with the epoch
//! raised, which fences the producer that let it run out (its next request answers
//! INVALID_PRODUCER_EPOCH), as Kafka does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::ids::{ProducerId, TopicPartition};
use crate::limits::{TXN_IDS_MAX, TXN_TIMEOUT_MS_MAX};
use crate::serve::txn::meta::{TxnMeta, TxnState};
use crate::serve::txn::store::{TxnStore, TxnStoreError};
use crate::serve::writes::{PartitionWriter, WriteError};

/// The group coordinator's side of offsets committed inside transactions.
pub trait TxnOffsets: Send + Sync {
    /// Ends `producer`'s pending offsets: committed when `commit`, else dropped. Repeatable.
    fn end_offsets(&self, producer: ProducerId, commit: bool) -> Result<(), String>;
    /// Producers holding pending offsets.
    fn pending_producers(&self) -> Vec<ProducerId>;
}

/// Why a request is refused, as the Kafka error the client understands.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    #[error("transaction timeout {0} ms is outside 1..={TXN_TIMEOUT_MS_MAX}")]
    InvalidTimeout(i32),
    #[error("no producer id {0} for this transactional id")]
    UnknownProducer(i64),
    #[error("producer epoch {got} is not the current {current}")]
    Fenced { current: i16, got: i16 },
    #[error("the transaction is completing; try again")]
    Concurrent,
    #[error("{op} is not valid in state {state:?}")]
    InvalidState { op: &'static str, state: TxnState },
    #[error("{0} is not writable on this kmirror")]
    NotWritable(TopicPartition),
    #[error("more than {TXN_IDS_MAX} transactional ids")]
    TooMany,
    #[error("no producer id: {0}")]
    NoProducerId(String),
    #[error("group id {0:?} is invalid")]
    InvalidGroup(String),
    #[error("writing a transaction marker: {0}")]
    Marker(#[from] WriteError),
    #[error("ending transactional offsets: {0}")]
    Offsets(String),
    #[error("__transaction_state: {0}")]
    Store(#[from] TxnStoreError),
}

// Kafka error codes (org.apache.kafka.common.protocol.Errors).
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const INVALID_GROUP_ID: i16 = 24;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const INVALID_TXN_STATE: i16 = 48;
const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
const CONCURRENT_TRANSACTIONS: i16 = 51;
const KAFKA_STORAGE_ERROR: i16 = 56;

impl TxnError {
    pub fn code(&self) -> i16 {
        match self {
            TxnError::InvalidTimeout(_) => INVALID_TRANSACTION_TIMEOUT,
            TxnError::UnknownProducer(_) => INVALID_PRODUCER_ID_MAPPING,
            TxnError::Fenced { .. } => INVALID_PRODUCER_EPOCH,
            TxnError::Concurrent => CONCURRENT_TRANSACTIONS,
            TxnError::InvalidState { .. } => INVALID_TXN_STATE,
            TxnError::NotWritable(_) => UNKNOWN_TOPIC_OR_PARTITION,
            TxnError::TooMany | TxnError::NoProducerId(_) => COORDINATOR_NOT_AVAILABLE,
            TxnError::InvalidGroup(_) => INVALID_GROUP_ID,
            TxnError::Marker(_) | TxnError::Store(_) | TxnError::Offsets(_) => KAFKA_STORAGE_ERROR,
        }
    }
}

pub struct TxnCoordinator<S: TxnStore> {
    store: S,
    writer: Arc<dyn PartitionWriter>,
    offsets: Arc<dyn TxnOffsets>,
    txns: BTreeMap<String, TxnMeta>,
}

impl<S: TxnStore> TxnCoordinator<S> {
    /// Loads every transactional id and completes the transactions a crash left between
    /// Prepare* and Complete* (the markers and offsets still missing are written now); then
    /// drops pending offsets of producers with no open transaction.
    pub fn open(
        store: S,
        writer: Arc<dyn PartitionWriter>,
        offsets: Arc<dyn TxnOffsets>,
    ) -> Result<Self, TxnError> {
        let txns = store.load()?.into_iter().collect();
        let mut c = TxnCoordinator {
            store,
            writer,
            offsets,
            txns,
        };
        let unfinished: Vec<String> = c
            .txns
            .iter()
            .filter(|(_, m)| matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort))
            .map(|(id, _)| id.clone())
            .collect();
        for id in unfinished {
            let commit = c.txns[&id].state == TxnState::PrepareCommit;
            tracing::info!(transactional_id = %id, commit, "completing a transaction left prepared");
            c.complete(&id, commit)?;
        }
        // Complete* is recorded only after the offsets were ended, so pending offsets of a
        // producer without an Ongoing transaction belong to nothing that can still commit.
        let open: BTreeSet<i64> = c
            .txns
            .values()
            .filter(|m| m.state == TxnState::Ongoing)
            .map(|m| m.producer_id)
            .collect();
        for p in c.offsets.pending_producers() {
            if !open.contains(&p.0) {
                tracing::info!(
                    producer_id = p.0,
                    "dropping transactional offsets of no open transaction"
                );
                c.offsets.end_offsets(p, false).map_err(TxnError::Offsets)?;
            }
        }
        Ok(c)
    }

    pub fn get(&self, id: &str) -> Option<&TxnMeta> {
        self.txns.get(id)
    }

    fn put(&mut self, id: &str, meta: TxnMeta) -> Result<(), TxnError> {
        self.store.put(id, &meta)?;
        self.txns.insert(id.to_owned(), meta);
        Ok(())
    }

    /// InitProducerId with a transactional id: a producer id and a fresh epoch; any earlier
    /// producer with this id is fenced, and its open transaction aborted.
    pub fn init_producer(
        &mut self,
        id: &str,
        timeout_ms: i32,
        now_ms: i64,
    ) -> Result<(ProducerId, i16), TxnError> {
        if !(1..=TXN_TIMEOUT_MS_MAX).contains(&timeout_ms) {
            return Err(TxnError::InvalidTimeout(timeout_ms));
        }
        let Some(old) = self.txns.get(id).cloned() else {
            if self.txns.len() >= TXN_IDS_MAX {
                return Err(TxnError::TooMany);
            }
            let pid = self
                .writer
                .new_producer_id()
                .map_err(TxnError::NoProducerId)?;
            let meta = TxnMeta {
                producer_id: pid.0,
                producer_epoch: 0,
                timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                started_ms: now_ms,
                groups: BTreeSet::new(),
            };
            self.put(id, meta)?;
            return Ok((pid, 0));
        };
        match old.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => return Err(TxnError::Concurrent),
            TxnState::Ongoing => self.abort_fencing(id)?,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {}
        }
        let mut meta = self.txns[id].clone();
        if meta.producer_epoch >= i16::MAX - 1 {
            // Epochs are exhausted: a new producer id starts again at 0.
            meta.producer_id = self
                .writer
                .new_producer_id()
                .map_err(TxnError::NoProducerId)?
                .0;
            meta.producer_epoch = 0;
        } else {
            meta.producer_epoch += 1;
        }
        meta.timeout_ms = timeout_ms;
        meta.state = TxnState::Empty;
        meta.partitions.clear();
        meta.groups.clear();
        meta.started_ms = now_ms;
        let answer = (meta.producer(), meta.producer_epoch);
        self.put(id, meta)?;
        Ok(answer)
    }

    /// The producer must be the current one: same producer id and epoch.
    fn check_producer(&self, id: &str, pid: i64, epoch: i16) -> Result<&TxnMeta, TxnError> {
        let meta = self
            .txns
            .get(id)
            .filter(|m| m.producer_id == pid)
            .ok_or(TxnError::UnknownProducer(pid))?;
        if meta.producer_epoch != epoch {
            return Err(TxnError::Fenced {
                current: meta.producer_epoch,
                got: epoch,
            });
        }
        Ok(meta)
    }

    /// AddPartitionsToTxn: the partitions join the current transaction (starting it).
    pub fn add_partitions(
        &mut self,
        id: &str,
        pid: i64,
        epoch: i16,
        tps: &[TopicPartition],
        now_ms: i64,
    ) -> Result<(), TxnError> {
        if let Some(tp) = tps.iter().find(|tp| !self.writer.is_writable(tp)) {
            self.check_producer(id, pid, epoch)?;
            return Err(TxnError::NotWritable(tp.clone()));
        }
        self.join(id, pid, epoch, now_ms, |meta| {
            meta.partitions
                .extend(tps.iter().map(|tp| (tp.topic.clone(), tp.partition)));
        })
    }

    /// AddOffsetsToTxn: `group`'s offsets join the current transaction (starting it), so
    /// TxnOffsetCommit may hold offsets of that group for it.
    pub fn add_offsets(
        &mut self,
        id: &str,
        pid: i64,
        epoch: i16,
        group: &str,
        now_ms: i64,
    ) -> Result<(), TxnError> {
        if group.is_empty() || group.len() > crate::limits::GROUP_ID_BYTES_MAX {
            self.check_producer(id, pid, epoch)?;
            return Err(TxnError::InvalidGroup(group.to_owned()));
        }
        self.join(id, pid, epoch, now_ms, |meta| {
            meta.groups.insert(group.to_owned());
        })
    }

    /// Adds to the current transaction what `add` puts into it, starting the transaction if
    /// none is Ongoing; records the change before answering.
    fn join(
        &mut self,
        id: &str,
        pid: i64,
        epoch: i16,
        now_ms: i64,
        add: impl FnOnce(&mut TxnMeta),
    ) -> Result<(), TxnError> {
        let mut meta = self.check_producer(id, pid, epoch)?.clone();
        if matches!(meta.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
            return Err(TxnError::Concurrent);
        }
        if meta.state != TxnState::Ongoing {
            meta.state = TxnState::Ongoing;
            meta.partitions.clear();
            meta.groups.clear();
            meta.started_ms = now_ms;
        }
        add(&mut meta);
        if meta != self.txns[id] {
            self.put(id, meta)?;
        }
        Ok(())
    }

    /// Whether TxnOffsetCommit may hold offsets of `group` for this producer: it must be the
    /// current producer, with an Ongoing transaction that `group` was added to. Returns the
    /// producer id the offsets are held under.
    pub fn check_offsets(
        &self,
        id: &str,
        pid: i64,
        epoch: i16,
        group: &str,
    ) -> Result<ProducerId, TxnError> {
        let meta = self.check_producer(id, pid, epoch)?;
        match meta.state {
            TxnState::Ongoing if meta.groups.contains(group) => Ok(meta.producer()),
            TxnState::PrepareCommit | TxnState::PrepareAbort => Err(TxnError::Concurrent),
            state => Err(TxnError::InvalidState {
                op: "TxnOffsetCommit for a group not added to the transaction",
                state,
            }),
        }
    }

    /// EndTxn: commit or abort the current transaction; answers once every marker is written.
    pub fn end(&mut self, id: &str, pid: i64, epoch: i16, commit: bool) -> Result<(), TxnError> {
        let meta = self.check_producer(id, pid, epoch)?;
        match (meta.state, commit) {
            (TxnState::Ongoing, _) => {}
            // A retry of an EndTxn that completed.
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => return Ok(()),
            (TxnState::PrepareCommit | TxnState::PrepareAbort, _) => {
                return Err(TxnError::Concurrent)
            }
            (state, _) => {
                return Err(TxnError::InvalidState {
                    op: if commit { "commit" } else { "abort" },
                    state,
                })
            }
        }
        let mut prepared = meta.clone();
        prepared.state = if commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        self.put(id, prepared)?;
        self.complete(id, commit)
    }

    /// Writes the markers (skipping partitions that already have theirs) and records the end.
    fn complete(&mut self, id: &str, commit: bool) -> Result<(), TxnError> {
        let meta = self.txns[id].clone();
        for tp in meta.tps() {
            match self
                .writer
                .end_txn(&tp, meta.producer(), meta.producer_epoch, commit)
            {
                Ok(_) => {}
                // A partition given back (mirrored again, or deleted) has no transaction of
                // this producer to end any more.
                Err(WriteError::NotWritable(_)) => {
                    tracing::warn!(transactional_id = %id, %tp, "transaction marker skipped: the partition is no longer writable here");
                }
                Err(e) => return Err(e.into()),
            }
        }
        // Always asked (cheap when nothing is pending): the group side is the authority on
        // what it holds.
        self.offsets
            .end_offsets(meta.producer(), commit)
            .map_err(TxnError::Offsets)?;
        let mut done = meta;
        done.state = if commit {
            TxnState::CompleteCommit
        } else {
            TxnState::CompleteAbort
        };
        self.put(id, done)
    }

    /// Aborts `id`'s Ongoing transaction with the epoch raised, fencing its producer.
    fn abort_fencing(&mut self, id: &str) -> Result<(), TxnError> {
        let mut meta = self.txns[id].clone();
        meta.producer_epoch = meta.producer_epoch.saturating_add(1);
        meta.state = TxnState::PrepareAbort;
        self.put(id, meta)?;
        self.complete(id, false)
    }

    /// Aborts every transaction Ongoing for longer than its timeout; returns how many.
    pub fn expire(&mut self, now_ms: i64) -> Result<usize, TxnError> {
        let expired: Vec<String> = self
            .txns
            .iter()
            .filter(|(_, m)| {
                m.state == TxnState::Ongoing && now_ms - m.started_ms > i64::from(m.timeout_ms)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            tracing::info!(transactional_id = %id, "transaction timed out: aborted, producer fenced");
            self.abort_fencing(id)?;
        }
        Ok(expired.len())
    }

    /// Forgets every transactional id with no transaction under way (Empty or Complete*) whose
    /// last change is more than `expiration_ms` old (Kafka's `transactional.id.expiration.ms`);
    /// returns how many. The last change is taken as the start of its last transaction (or
    /// its InitProducerId) plus that transaction's timeout, the latest it can have ended, so
    /// an id is never forgotten early. A producer using a forgotten id gets
    /// INVALID_PRODUCER_ID_MAPPING and calls InitProducerId again, as with Kafka.
    pub fn expire_ids(&mut self, now_ms: i64, expiration_ms: i64) -> Result<usize, TxnError> {
        let idle: Vec<String> = self
            .txns
            .iter()
            .filter(|(_, m)| {
                matches!(
                    m.state,
                    TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
                ) && now_ms - (m.started_ms + i64::from(m.timeout_ms)) > expiration_ms
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &idle {
            self.store.delete(id)?;
            self.txns.remove(id);
            tracing::info!(transactional_id = %id, "transactional id expired");
        }
        Ok(idle.len())
    }

    pub fn into_store(self) -> S {
        self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::partition_log::ProduceOutcome;
    use crate::serve::groups::{CoordinatorConfig, GroupCoordinator, MemoryStore};
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{
        GroupId, OffsetFetchRequest, ProducerId as KProducerId, TopicName, TransactionalId,
        TxnOffsetCommitRequest,
    };
    use kafka_protocol::protocol::StrBytes;
    use std::sync::Mutex;

    /// Markers as (partition, producer, epoch, commit); partition "gone" is not writable.
    #[derive(Default)]
    struct Markers(Mutex<Vec<(TopicPartition, i64, i16, bool)>>);

    impl PartitionWriter for Markers {
        fn produce(&self, tp: &TopicPartition, _: &mut [u8]) -> Result<ProduceOutcome, WriteError> {
            Err(WriteError::NotWritable(tp.clone()))
        }
        fn new_producer_id(&self) -> Result<ProducerId, String> {
            Ok(ProducerId(1 << 40))
        }
        fn is_writable(&self, tp: &TopicPartition) -> bool {
            tp.topic != "gone"
        }
        fn end_txn(
            &self,
            tp: &TopicPartition,
            pid: ProducerId,
            epoch: i16,
            commit: bool,
        ) -> Result<bool, WriteError> {
            self.0
                .lock()
                .unwrap()
                .push((tp.clone(), pid.0, epoch, commit));
            Ok(true)
        }
    }

    #[derive(Default, Clone)]
    struct Memory(Arc<Mutex<BTreeMap<String, TxnMeta>>>);

    impl TxnStore for Memory {
        fn load(&self) -> Result<Vec<(String, TxnMeta)>, TxnStoreError> {
            Ok(self.0.lock().unwrap().clone().into_iter().collect())
        }
        fn put(&mut self, id: &str, meta: &TxnMeta) -> Result<(), TxnStoreError> {
            self.0.lock().unwrap().insert(id.to_owned(), meta.clone());
            Ok(())
        }
        fn delete(&mut self, id: &str) -> Result<(), TxnStoreError> {
            self.0.lock().unwrap().remove(id);
            Ok(())
        }
    }

    fn tp(t: &str) -> TopicPartition {
        TopicPartition::new(t, 0)
    }

    type Groups = Mutex<GroupCoordinator<MemoryStore>>;

    fn groups_over(store: MemoryStore) -> Arc<Groups> {
        let config = CoordinatorConfig::new(0, "kmirror", 9092);
        Arc::new(Mutex::new(GroupCoordinator::open(config, store).unwrap()))
    }

    fn no_groups() -> Arc<Groups> {
        groups_over(MemoryStore::default())
    }

    fn all(_: &TopicPartition) -> bool {
        true
    }

    /// TxnOffsetCommit as the service runs it: the transaction check, then the group side.
    fn txn_commit(
        c: &TxnCoordinator<Memory>,
        g: &Groups,
        pid: i64,
        epoch: i16,
        offset: i64,
    ) -> Result<Vec<i16>, i16> {
        let producer = c
            .check_offsets("t", pid, epoch, "g")
            .map_err(|e| e.code())?;
        let req = TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_static_str("t")))
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_producer_id(KProducerId(pid))
            .with_producer_epoch(epoch)
            .with_generation_id(-1)
            .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("in")))
                .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(offset)])]);
        let r = g.lock().unwrap().txn_offset_commit(&all, producer, &req);
        Ok(r.topics[0]
            .partitions
            .iter()
            .map(|p| p.error_code)
            .collect())
    }

    /// OffsetFetch v7 of `g`'s `in-0`: (offset, error), stable or not.
    fn fetched(g: &Groups, require_stable: bool) -> (i64, i16) {
        let req = OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_require_stable(require_stable)
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("in")))
                .with_partition_indexes(vec![0])]));
        let r = g.lock().unwrap().offset_fetch(7, &req);
        let p = &r.topics[0].partitions[0];
        (p.committed_offset, p.error_code)
    }

    #[test]
    fn commit_writes_markers_and_a_new_producer_fences_the_old() {
        let markers = Arc::new(Markers::default());
        let store = Memory::default();
        let mut c = TxnCoordinator::open(store.clone(), markers.clone(), no_groups()).unwrap();
        let (pid, e0) = c.init_producer("t", 60_000, 0).unwrap();
        assert_eq!(e0, 0);
        c.add_partitions("t", pid.0, 0, &[tp("a"), tp("b")], 1)
            .unwrap();
        assert!(matches!(
            c.add_partitions("t", pid.0, 0, &[tp("gone")], 1),
            Err(TxnError::NotWritable(_))
        ));
        c.end("t", pid.0, 0, true).unwrap();
        assert_eq!(
            *markers.0.lock().unwrap(),
            vec![(tp("a"), pid.0, 0, true), (tp("b"), pid.0, 0, true)]
        );
        c.end("t", pid.0, 0, true)
            .expect("a retried commit is answered again");
        assert!(matches!(
            c.end("t", pid.0, 0, false),
            Err(TxnError::InvalidState { .. })
        ));

        // A second producer with the same id while a transaction is open: aborted, fenced.
        c.add_partitions("t", pid.0, 0, &[tp("a")], 2).unwrap();
        let (pid2, e1) = c.init_producer("t", 60_000, 3).unwrap();
        assert_eq!(
            (pid2, e1),
            (pid, 2),
            "abort raised the epoch to 1, init to 2"
        );
        assert_eq!(
            markers.0.lock().unwrap().last().unwrap(),
            &(tp("a"), pid.0, 1, false)
        );
        assert!(matches!(
            c.add_partitions("t", pid.0, 0, &[tp("a")], 4),
            Err(TxnError::Fenced { current: 2, got: 0 })
        ));
        assert_eq!(store.0.lock().unwrap()["t"].producer_epoch, 2);
    }

    #[test]
    fn timeout_aborts_and_prepared_transactions_complete_at_open() {
        let markers = Arc::new(Markers::default());
        let store = Memory::default();
        let mut c = TxnCoordinator::open(store.clone(), markers.clone(), no_groups()).unwrap();
        let (pid, _) = c.init_producer("t", 1_000, 0).unwrap();
        c.add_partitions("t", pid.0, 0, &[tp("a")], 10).unwrap();
        assert_eq!(c.expire(1_000).unwrap(), 0);
        assert_eq!(c.expire(1_011).unwrap(), 1);
        assert_eq!(c.get("t").unwrap().state, TxnState::CompleteAbort);
        assert!(matches!(
            c.end("t", pid.0, 0, true),
            Err(TxnError::Fenced { .. })
        ));

        // A crash after PrepareCommit was recorded: the next open writes the markers.
        let mut prepared = c.get("t").unwrap().clone();
        prepared.state = TxnState::PrepareCommit;
        store.0.lock().unwrap().insert("t".into(), prepared);
        markers.0.lock().unwrap().clear();
        let c = TxnCoordinator::open(store.clone(), markers.clone(), no_groups()).unwrap();
        assert_eq!(c.get("t").unwrap().state, TxnState::CompleteCommit);
        assert_eq!(markers.0.lock().unwrap().len(), 1);
    }

    /// Goal: transactional ids expire only when no transaction is under way, and only once
    /// `transactional.id.expiration.ms` has passed since their last transaction could have
    /// ended; the store forgets them too (a restart does not bring them back).
    #[test]
    fn transactional_ids_expire_only_when_idle_past_the_expiration() {
        let store = Memory::default();
        let mut c =
            TxnCoordinator::open(store.clone(), Arc::new(Markers::default()), no_groups()).unwrap();
        let (idle, _) = c.init_producer("idle", 1_000, 0).unwrap();
        let (busy, _) = c.init_producer("busy", 1_000, 0).unwrap();
        c.add_partitions("busy", busy.0, 0, &[tp("a")], 10).unwrap();
        let (done, _) = c.init_producer("done", 1_000, 0).unwrap();
        c.add_partitions("done", done.0, 0, &[tp("a")], 5_000)
            .unwrap();
        c.end("done", done.0, 0, true).unwrap();
        // "idle" last changed at 0 (+ its 1 s timeout), "done" at 5 s (+ 1 s).
        assert_eq!(c.expire_ids(1_000 + 10_000, 10_000).unwrap(), 0);
        assert_eq!(c.expire_ids(1_001 + 10_000, 10_000).unwrap(), 1);
        assert!(c.get("idle").is_none() && c.get("done").is_some());
        // "busy" is Ongoing: never expired here (its own timeout aborts it first).
        assert_eq!(c.expire_ids(6_001 + 10_000, 10_000).unwrap(), 1);
        assert_eq!(c.get("busy").unwrap().state, TxnState::Ongoing);
        let c = TxnCoordinator::open(store, Arc::new(Markers::default()), no_groups()).unwrap();
        assert!(c.get("idle").is_none() && c.get("done").is_none());
        assert!(matches!(
            c.get("busy"),
            Some(m) if m.producer_id == busy.0
        ));
        let _ = idle;
    }

    #[test]
    fn timeouts_outside_the_limit_are_refused() {
        let mut c =
            TxnCoordinator::open(Memory::default(), Arc::new(Markers::default()), no_groups())
                .unwrap();
        assert_eq!(
            c.init_producer("t", TXN_TIMEOUT_MS_MAX + 1, 0)
                .unwrap_err()
                .code(),
            INVALID_TRANSACTION_TIMEOUT
        );
        assert_eq!(
            c.init_producer("t", 0, 0).unwrap_err().code(),
            INVALID_TRANSACTION_TIMEOUT
        );
    }

    #[test]
    fn transactional_offsets_show_only_when_the_transaction_commits() {
        let g = no_groups();
        let mut c =
            TxnCoordinator::open(Memory::default(), Arc::new(Markers::default()), g.clone())
                .unwrap();
        let (pid, _) = c.init_producer("t", 60_000, 0).unwrap();
        // Not added to the transaction yet: refused, nothing held.
        assert_eq!(txn_commit(&c, &g, pid.0, 0, 5), Err(INVALID_TXN_STATE));
        assert!(matches!(
            c.add_offsets("t", pid.0, 0, "", 1),
            Err(TxnError::InvalidGroup(_))
        ));
        assert_eq!(
            c.add_offsets("t", pid.0, 1, "g", 1).unwrap_err().code(),
            INVALID_PRODUCER_EPOCH
        );
        assert_eq!(
            c.add_offsets("t", pid.0 + 1, 0, "g", 1).unwrap_err().code(),
            INVALID_PRODUCER_ID_MAPPING
        );
        c.add_offsets("t", pid.0, 0, "g", 1).unwrap();
        assert_eq!(c.get("t").unwrap().state, TxnState::Ongoing);
        assert_eq!(txn_commit(&c, &g, pid.0, 0, 10), Ok(vec![0]));
        assert_eq!(
            fetched(&g, false),
            (-1, 0),
            "pending offsets are not visible"
        );
        assert_eq!(fetched(&g, true), (-1, 88), "UNSTABLE_OFFSET_COMMIT");
        c.end("t", pid.0, 0, true).unwrap();
        assert_eq!(fetched(&g, true), (10, 0));

        // Aborted: the committed offset stays.
        c.add_offsets("t", pid.0, 0, "g", 2).unwrap();
        assert_eq!(txn_commit(&c, &g, pid.0, 0, 20), Ok(vec![0]));
        c.end("t", pid.0, 0, false).unwrap();
        assert_eq!(fetched(&g, true), (10, 0));
        // After the end the transaction no longer holds the group.
        assert_eq!(txn_commit(&c, &g, pid.0, 0, 21), Err(INVALID_TXN_STATE));

        // Timed out: aborted and fenced, the pending offset dropped.
        c.add_offsets("t", pid.0, 0, "g", 100).unwrap();
        assert_eq!(txn_commit(&c, &g, pid.0, 0, 30), Ok(vec![0]));
        assert_eq!(c.expire(100 + 60_001).unwrap(), 1);
        assert_eq!(fetched(&g, true), (10, 0));
        assert_eq!(
            txn_commit(&c, &g, pid.0, 0, 31),
            Err(INVALID_PRODUCER_EPOCH)
        );
        assert!(g.lock().unwrap().pending_producers().is_empty());

        // A new producer with the id aborts the open transaction's offsets too.
        let (pid, e) = c.init_producer("t", 60_000, 200).unwrap();
        c.add_offsets("t", pid.0, e, "g", 201).unwrap();
        assert_eq!(txn_commit(&c, &g, pid.0, e, 40), Ok(vec![0]));
        let (_, e2) = c.init_producer("t", 60_000, 202).unwrap();
        assert!(e2 > e);
        assert_eq!(fetched(&g, true), (10, 0));
        assert!(g.lock().unwrap().pending_producers().is_empty());
    }

    #[test]
    fn pending_offsets_survive_a_restart_and_prepared_commits_complete_them() {
        let txn_store = Memory::default();
        let reopen_groups = |g: Arc<Groups>| {
            let store = Arc::try_unwrap(g)
                .ok()
                .expect("one holder")
                .into_inner()
                .unwrap()
                .into_store();
            groups_over(store)
        };
        let g = no_groups();
        let markers = Arc::new(Markers::default());
        let mut c = TxnCoordinator::open(txn_store.clone(), markers.clone(), g.clone()).unwrap();
        let (pid, _) = c.init_producer("t", 60_000, 0).unwrap();
        c.add_offsets("t", pid.0, 0, "g", 1).unwrap();
        c.add_partitions("t", pid.0, 0, &[tp("out")], 1).unwrap();
        assert_eq!(txn_commit(&c, &g, pid.0, 0, 7), Ok(vec![0]));

        // Crash while Ongoing: the pending offset is reloaded, still pending.
        drop(c);
        let g = reopen_groups(g);
        let mut c = TxnCoordinator::open(txn_store.clone(), markers.clone(), g.clone()).unwrap();
        assert_eq!(fetched(&g, true), (-1, 88));
        assert_eq!(g.lock().unwrap().pending_producers(), vec![pid]);

        // Crash after PrepareCommit was recorded: the next open commits the offset.
        let mut prepared = c.get("t").unwrap().clone();
        prepared.state = TxnState::PrepareCommit;
        c.put("t", prepared).unwrap();
        drop(c);
        let g = reopen_groups(g);
        let c = TxnCoordinator::open(txn_store.clone(), markers.clone(), g.clone()).unwrap();
        assert_eq!(c.get("t").unwrap().state, TxnState::CompleteCommit);
        assert_eq!(fetched(&g, true), (7, 0));
        assert_eq!(
            markers.0.lock().unwrap().last().unwrap(),
            &(tp("out"), pid.0, 0, true)
        );

        // Pending offsets of a producer with no open transaction are dropped at open.
        drop(c);
        let g = reopen_groups(g);
        {
            let mut gc = g.lock().unwrap();
            gc.txn_offset_commit(
                &all,
                ProducerId(99),
                &TxnOffsetCommitRequest::default()
                    .with_group_id(GroupId(StrBytes::from_static_str("g")))
                    .with_generation_id(-1)
                    .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_static_str("in")))
                        .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(50)])]),
            );
        }
        let g = reopen_groups(g);
        assert_eq!(g.lock().unwrap().pending_producers(), vec![ProducerId(99)]);
        let _c = TxnCoordinator::open(txn_store, markers, g.clone()).unwrap();
        assert!(g.lock().unwrap().pending_producers().is_empty());
        assert_eq!(fetched(&g, true), (7, 0));
    }
}
