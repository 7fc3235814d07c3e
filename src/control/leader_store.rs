//! The partitions kmirror leads after failover, and the producer ids it hands out.
//!
//! A STOPPED partition is promoted (`PartitionLog::promote`) and then lives here instead of in
//! a shard: writes after failover are produced by ordinary clients at client speed, not by the
//! mirror's fetch path, so one mutex per store serialises them and no shard is involved.
//! Readers still read it lock-free through its published view. The logs go back to the log
//! dir on shutdown, where they are closed with everything else.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use crate::control::producer_ids::ProducerIdAllocator;
use crate::ids::{Offset, ProducerId, TopicPartition};
use crate::log::io::StdIo;
use crate::log::partition_log::{PartitionLog, ProduceOutcome};
use crate::log::LogError;
use crate::serve::writes::{PartitionWriter, WriteError};
use crate::wire::batch_builder::EndTxnMarker;

pub struct LeaderStore {
    logs: Mutex<BTreeMap<TopicPartition, PartitionLog>>,
    ids: Mutex<Option<ProducerIdAllocator>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a log half-appended (appends are
    // all-or-nothing), so the data is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LeaderStore {
    pub fn new() -> LeaderStore {
        LeaderStore {
            logs: Mutex::new(BTreeMap::new()),
            ids: Mutex::new(None),
        }
    }

    /// Opens the producer-id allocator of `data_dir` above every id `max_seen` (the largest
    /// producer id of any local partition).
    pub fn open_producer_ids(
        &self,
        data_dir: &Path,
        max_seen: Option<ProducerId>,
    ) -> Result<(), LogError> {
        *lock(&self.ids) = Some(ProducerIdAllocator::open(data_dir, max_seen)?);
        Ok(())
    }

    /// Takes a promoted log and makes it writable for clients.
    pub fn lead(&self, mut log: PartitionLog) {
        log.attach_read_view().set_writable(true);
        lock(&self.logs).insert(log.topic_partition().clone(), log);
    }

    /// Gives a partition back (read-only again), e.g. to mirror it anew.
    pub fn release(&self, tp: &TopicPartition) -> Option<PartitionLog> {
        lock(&self.logs).remove(tp).map(read_only)
    }

    /// The log end of a failed-over partition (writes after failover move it).
    pub fn log_end(&self, tp: &TopicPartition) -> Option<Offset> {
        lock(&self.logs).get(tp).map(|l| l.log_end_offset())
    }

    pub fn contains(&self, tp: &TopicPartition) -> bool {
        lock(&self.logs).contains_key(tp)
    }

    /// A retention pass over the led partitions; returns the failures.
    pub fn enforce_retention(&self, now_ms: i64) -> Vec<String> {
        let mut logs = lock(&self.logs);
        logs.values_mut()
            .filter_map(|log| {
                log.delete_old_segments(&mut StdIo, now_ms)
                    .err()
                    .map(|e| format!("{}: retention failed: {e}", log.topic_partition()))
            })
            .collect()
    }

    /// Flushes every led log with data above its recovery point (a checkpoint round).
    pub fn flush_unflushed(&self) -> Vec<String> {
        let mut logs = lock(&self.logs);
        logs.values_mut()
            .filter(|log| log.has_unflushed())
            .filter_map(|log| {
                log.flush(&mut StdIo)
                    .err()
                    .map(|e| format!("{}: flush failed: {e}", log.topic_partition()))
            })
            .collect()
    }

    /// The led partitions of `topic`.
    pub fn partitions_of(&self, topic: &str) -> Vec<TopicPartition> {
        lock(&self.logs)
            .keys()
            .filter(|tp| tp.topic == topic)
            .cloned()
            .collect()
    }

    /// Applies a topic config change to a led partition; `None` when it is not led here.
    pub fn set_config(
        &self,
        tp: &TopicPartition,
        config: &crate::log::config::LogConfig,
    ) -> Option<Result<(), crate::log::config::ConfigError>> {
        lock(&self.logs)
            .get_mut(tp)
            .map(|log| log.set_config(config.clone()))
    }

    /// Every log, made read-only again, for closing.
    pub fn take_all(&self) -> Vec<PartitionLog> {
        let logs = std::mem::take(&mut *lock(&self.logs));
        logs.into_values().map(read_only).collect()
    }
}

/// A log leaving the store: clients may read it but no longer write it.
fn read_only(mut log: PartitionLog) -> PartitionLog {
    log.attach_read_view().set_writable(false);
    log
}

impl Default for LeaderStore {
    fn default() -> Self {
        Self::new()
    }
}

impl PartitionWriter for LeaderStore {
    fn produce(&self, tp: &TopicPartition, batch: &mut [u8]) -> Result<ProduceOutcome, WriteError> {
        let mut logs = lock(&self.logs);
        let log = logs
            .get_mut(tp)
            .ok_or_else(|| WriteError::NotWritable(tp.clone()))?;
        let epoch = log
            .epoch_cache()
            .latest_epoch()
            .expect("a promoted log has a leader epoch");
        let max = log.config().max_message_bytes as usize;
        Ok(log.append_as_leader(&mut StdIo, batch, epoch, max)?)
    }

    fn is_writable(&self, tp: &TopicPartition) -> bool {
        self.contains(tp)
    }

    fn end_txn(
        &self,
        tp: &TopicPartition,
        producer_id: ProducerId,
        producer_epoch: i16,
        commit: bool,
    ) -> Result<bool, WriteError> {
        let mut logs = lock(&self.logs);
        let log = logs
            .get_mut(tp)
            .ok_or_else(|| WriteError::NotWritable(tp.clone()))?;
        let open = log
            .producer_state()
            .ongoing_transactions()
            .iter()
            .any(|(pid, _, _)| *pid == producer_id);
        if !open {
            return Ok(false);
        }
        let epoch = log
            .epoch_cache()
            .latest_epoch()
            .expect("a promoted log has a leader epoch");
        let marker = if commit {
            EndTxnMarker::Commit
        } else {
            EndTxnMarker::Abort
        };
        // One coordinator that never moves: its epoch is always 0.
        log.write_txn_marker(&mut StdIo, producer_id, producer_epoch, marker, 0, epoch)?;
        Ok(true)
    }

    fn new_producer_id(&self) -> Result<ProducerId, String> {
        lock(&self.ids)
            .as_mut()
            .ok_or_else(|| "producer ids are not open yet".to_owned())?
            .allocate()
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{LeaderEpoch, Offset, TimestampMs};
    use crate::log::config::LogConfig;
    use crate::wire::batch_builder::BatchBuilder;

    fn batch(pid: i64, seq: i32) -> Vec<u8> {
        BatchBuilder::new(Offset(0))
            .producer(ProducerId(pid), 0, seq)
            .value(TimestampMs(1_700_000_000_000), b"v")
            .build()
    }

    #[test]
    fn writes_reach_only_led_partitions_with_fresh_producer_ids() {
        let d = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("orders", 0);
        let mut log = PartitionLog::create(
            &d.path().join("orders-0"),
            tp.clone(),
            None,
            LogConfig::default(),
        )
        .unwrap();
        let mirrored = BatchBuilder::new(Offset(0))
            .leader_epoch(LeaderEpoch(4))
            .producer(ProducerId(77), 0, 0)
            .value(TimestampMs(1_700_000_000_000), b"m")
            .build();
        log.append(&mut StdIo, &mirrored).unwrap();
        let max_seen = log.max_producer_id();
        log.promote(&mut StdIo, LeaderEpoch(5)).unwrap();

        let store = LeaderStore::new();
        store.open_producer_ids(d.path(), max_seen).unwrap();
        let pid = store.new_producer_id().unwrap();
        assert!(
            pid.0 >= crate::limits::PRODUCER_ID_FLOOR,
            "above the floor, so above 77"
        );

        // Not led yet: refused as not writable, nothing written.
        assert!(matches!(
            store.produce(&tp, &mut batch(pid.0, 0)),
            Err(WriteError::NotWritable(_))
        ));
        store.lead(log);
        let out = store.produce(&tp, &mut batch(pid.0, 0)).unwrap();
        assert_eq!(
            out,
            ProduceOutcome::Appended {
                base_offset: Offset(1),
                last_offset: Offset(1)
            }
        );
        assert!(matches!(
            store.produce(&tp, &mut batch(pid.0, 5)),
            Err(WriteError::Produce(_))
        ));
        let mut logs = store.take_all();
        assert_eq!(logs.len(), 1);
        let log = logs.pop().unwrap();
        assert_eq!(log.log_end_offset(), Offset(2));
        assert_eq!(log.epoch_cache().latest_epoch(), Some(LeaderEpoch(5)));
        assert!(!store.contains(&tp));
    }
}
