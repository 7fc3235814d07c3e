//! The partition as a leader, after failover: the promotion that ends mirroring and the appends
//! of producers writing to kmirror itself (KIP-1279 §9).
//!
//! Promotion aborts every transaction the source left open (a mirrored transaction can never be
//! completed: its coordinator lives on the source), raises the leader epoch above every epoch
//! the source used (so a fetcher or a stale source leader can tell the histories apart), and
//! forgets the source's producers (their sequence state belongs to another cluster; a source
//! producer id reused here must start a fresh sequence). It is idempotent for one epoch, so a
//! crash in the middle is finished by promoting again.
//!
//! A leader append stamps the base offset and the partition leader epoch into the producer's
//! batch. Both sit before the attributes field, where the v2 CRC-32C starts, so the checksum
//! the producer computed stays valid and the bytes are otherwise written as received.

use crate::ids::{LeaderEpoch, Offset, ProducerId, TimestampMs};
use crate::log::checkpoint::sync_dir;
use crate::log::io::LogIo;
use crate::log::producer_state::RecentBatch;
use crate::log::LogError;
use crate::wire::batch::{Batch, BatchError, Batches};
use crate::wire::batch_builder::{control_batch, EndTxnMarker};

use super::{now_ms, PartitionLog};

/// Byte positions in a v2 batch header (kafka-formats.md §1.2).
const BASE_OFFSET_AT: usize = 0;
const LEADER_EPOCH_AT: usize = 12;

/// What a promotion did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promotion {
    pub leader_epoch: LeaderEpoch,
    /// Transactions the source left open, aborted here in offset order.
    pub aborted: Vec<AbortedOpen>,
    /// The log end after the markers: where the first produced batch will go.
    pub log_end: Offset,
}

/// One open transaction ended by promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedOpen {
    pub producer_id: ProducerId,
    pub first_offset: Offset,
    pub marker_offset: Offset,
}

/// The result of a produce that passed the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProduceOutcome {
    Appended {
        base_offset: Offset,
        last_offset: Offset,
    },
    /// A retry of a batch already in the log: the offsets it got the first time; nothing was
    /// written (Kafka answers such retries with success and the original offsets).
    Duplicate {
        base_offset: Offset,
        last_offset: Offset,
    },
}

/// Why a produce was refused. Each maps to one Kafka error code at the protocol layer.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error("a produce must carry exactly one record batch per partition, found {0}")]
    BatchCount(usize),
    #[error("record batches of magic {0} cannot be produced to kmirror (message format v2 only)")]
    UnsupportedMagic(i8),
    #[error("records end with {trailing} bytes of an incomplete batch")]
    Truncated { trailing: usize },
    #[error("corrupt record batch: {0}")]
    Corrupt(#[from] BatchError),
    #[error("record batch of {size} bytes is larger than max.message.bytes {max}")]
    TooLarge { size: usize, max: usize },
    #[error("record batch declares {count} records but a last offset delta of {delta}")]
    RecordCount { count: i32, delta: i32 },
    #[error("control batches are written by the transaction coordinator, not produced")]
    ControlBatch,
    #[error("producer {producer_id}: expected sequence {expected}, got {got}")]
    OutOfOrderSequence {
        producer_id: ProducerId,
        expected: i32,
        got: i32,
    },
    #[error("producer {producer_id}: epoch {got} is older than the current epoch {current}")]
    InvalidProducerEpoch {
        producer_id: ProducerId,
        current: i16,
        got: i16,
    },
    #[error("leader epoch {requested} is below the partition's latest epoch {latest}")]
    StaleLeaderEpoch {
        requested: LeaderEpoch,
        latest: LeaderEpoch,
    },
    #[error(transparent)]
    Log(#[from] LogError),
}

impl PartitionLog {
    /// Ends mirroring for this partition: ABORT markers for open transactions, `epoch` as the
    /// new leader epoch from the log end, producer state reset, a new segment at the log end
    /// with an empty producer snapshot, everything flushed. Once the owner has checkpointed the
    /// recovery point, no recovery can rebuild the source's producers from the mirrored
    /// batches; until then, the owner promotes again after a restart. `epoch` must be at least the latest epoch in the
    /// log; promoting again with the same epoch only finishes what a crash interrupted.
    pub fn promote(
        &mut self,
        io: &mut impl LogIo,
        epoch: LeaderEpoch,
    ) -> Result<Promotion, ProduceError> {
        assert!(epoch.is_known(), "a leader epoch is never NONE");
        self.check_leader_epoch(epoch)?;
        let now = TimestampMs(now_ms());
        let mut aborted = Vec::new();
        for (producer_id, producer_epoch, first_offset) in self.producers.ongoing_transactions() {
            // The marker carries the coordinator epoch of the producer's last marker (0 when it
            // never had one), so a broker adopting the files sees a plausible coordinator.
            let coordinator_epoch = self
                .producers
                .producer(producer_id)
                .map_or(0, |e| e.coordinator_epoch.max(0));
            let marker_offset = self.log_end_offset();
            let marker = control_batch(
                marker_offset,
                epoch,
                producer_id,
                producer_epoch,
                EndTxnMarker::Abort,
                coordinator_epoch,
                now,
            );
            self.append(io, &marker)?;
            aborted.push(AbortedOpen {
                producer_id,
                first_offset,
                marker_offset,
            });
        }
        let log_end = self.log_end_offset();
        if self.epochs.latest_epoch() != Some(epoch) {
            self.epochs.assign(epoch, log_end);
        }
        self.epochs.flush()?;
        // The leader's history starts on a segment boundary whose producer snapshot is empty:
        // recovery always restarts at a segment base and loads the snapshot there, so no crash
        // after this point can replay the source's producers back into the state.
        self.producers.reset(log_end);
        self.roll(io, log_end, now_ms())?;
        // The snapshot after the flush: one at a segment's base tells recovery the segments
        // before it are whole (`recovery::unflushed_roll_hole`). (The roll's own pending
        // snapshot, written by the flush, is this same empty state; a roll that found the
        // active segment empty at `log_end` left none.)
        self.flush(io)?;
        self.producers.take_snapshot(&self.dir, log_end)?;
        sync_dir(&self.dir)?;
        // Readers must see the new epoch (Metadata) and the rolled segment.
        self.publish_view();
        Ok(Promotion {
            leader_epoch: epoch,
            aborted,
            log_end,
        })
    }

    /// Appends one producer's batch as the leader at `epoch`: Kafka's checks for a produced
    /// v2 batch (one batch, valid CRC, size, not a control batch) and its idempotence rules
    /// (producer epoch not going back, sequences contiguous, a retry of one of the last five
    /// batches answered with its original offsets), then the offsets are assigned from the log
    /// end. `batch` is modified in place (base offset and leader epoch) and written as is.
    pub fn append_as_leader(
        &mut self,
        io: &mut impl LogIo,
        batch: &mut [u8],
        epoch: LeaderEpoch,
        max_message_bytes: usize,
    ) -> Result<ProduceOutcome, ProduceError> {
        assert!(epoch.is_known(), "a leader epoch is never NONE");
        self.check_leader_epoch(epoch)?;
        let delta = {
            let view = single_batch(batch)?;
            if view.size() > max_message_bytes {
                return Err(ProduceError::TooLarge {
                    size: view.size(),
                    max: max_message_bytes,
                });
            }
            if let Some(dup) = self.check_producer(&view)? {
                return Ok(ProduceOutcome::Duplicate {
                    base_offset: dup.first_offset,
                    last_offset: dup.last_offset,
                });
            }
            view.last_offset_delta()
        };
        let base = self.log_end_offset();
        batch[BASE_OFFSET_AT..BASE_OFFSET_AT + 8].copy_from_slice(&base.0.to_be_bytes());
        batch[LEADER_EPOCH_AT..LEADER_EPOCH_AT + 4].copy_from_slice(&epoch.0.to_be_bytes());
        self.append(io, batch)?;
        Ok(ProduceOutcome::Appended {
            base_offset: base,
            last_offset: Offset(base.0 + i64::from(delta)),
        })
    }

    /// Writes a COMMIT or ABORT marker for a transaction of a producer writing to kmirror (the
    /// transaction coordinator's WriteTxnMarkers). Returns the marker's offset.
    pub fn write_txn_marker(
        &mut self,
        io: &mut impl LogIo,
        producer_id: ProducerId,
        producer_epoch: i16,
        marker: EndTxnMarker,
        coordinator_epoch: i32,
        epoch: LeaderEpoch,
    ) -> Result<Offset, ProduceError> {
        self.check_leader_epoch(epoch)?;
        if let Some(current) = self.producers.producer(producer_id).map(|e| e.epoch) {
            if producer_epoch < current {
                return Err(ProduceError::InvalidProducerEpoch {
                    producer_id,
                    current,
                    got: producer_epoch,
                });
            }
        }
        let offset = self.log_end_offset();
        let bytes = control_batch(
            offset,
            epoch,
            producer_id,
            producer_epoch,
            marker,
            coordinator_epoch,
            TimestampMs(now_ms()),
        );
        self.append(io, &bytes)?;
        Ok(offset)
    }

    /// The largest producer id in this partition's state: producer ids handed out after
    /// failover must lie above it.
    pub fn max_producer_id(&self) -> Option<ProducerId> {
        self.producers.max_producer_id()
    }

    fn check_leader_epoch(&self, epoch: LeaderEpoch) -> Result<(), ProduceError> {
        match self.epochs.latest_epoch() {
            Some(latest) if latest > epoch => Err(ProduceError::StaleLeaderEpoch {
                requested: epoch,
                latest,
            }),
            _ => Ok(()),
        }
    }

    /// Kafka's producer checks for a leader append. `Ok(Some)` is a retry of a recent batch.
    fn check_producer(&self, batch: &Batch<'_>) -> Result<Option<RecentBatch>, ProduceError> {
        let producer_id = batch.producer_id();
        if producer_id.0 < 0 {
            return Ok(None);
        }
        let got = batch.base_sequence();
        let out_of_order = |expected: i32| ProduceError::OutOfOrderSequence {
            producer_id,
            expected,
            got,
        };
        let Some(entry) = self.producers.producer(producer_id) else {
            // A producer this partition has never seen (or forgot at promotion) starts at 0.
            return if got == 0 {
                Ok(None)
            } else {
                Err(out_of_order(0))
            };
        };
        if batch.producer_epoch() < entry.epoch {
            return Err(ProduceError::InvalidProducerEpoch {
                producer_id,
                current: entry.epoch,
                got: batch.producer_epoch(),
            });
        }
        if batch.producer_epoch() > entry.epoch || entry.last_sequence < 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(out_of_order(0))
            };
        }
        let last = batch.last_sequence();
        let mut recent = self.producers.recent_batches(producer_id).peekable();
        if recent.peek().is_none() {
            // Reloaded from a snapshot: only the last batch is known.
            let first_offset = Offset(entry.last_offset.0 - i64::from(entry.offset_delta));
            let first_sequence = entry.last_sequence.wrapping_sub(entry.offset_delta);
            if entry.last_sequence == last && first_sequence == got {
                return Ok(Some(RecentBatch {
                    first_sequence,
                    last_sequence: last,
                    first_offset,
                    last_offset: entry.last_offset,
                }));
            }
        } else if let Some(dup) =
            recent.find(|r| r.first_sequence == got && r.last_sequence == last)
        {
            return Ok(Some(*dup));
        }
        let expected = if entry.last_sequence == i32::MAX {
            0
        } else {
            entry.last_sequence + 1
        };
        if got == expected {
            Ok(None)
        } else {
            Err(out_of_order(expected))
        }
    }
}

/// The one v2 data batch a produce carries for a partition, validated.
fn single_batch(bytes: &[u8]) -> Result<Batch<'_>, ProduceError> {
    let mut batches = Batches::new(bytes);
    let mut first = None;
    let mut count = 0;
    for item in batches.by_ref() {
        let (_, batch) = item?;
        count += 1;
        first.get_or_insert(batch);
    }
    if batches.trailing_bytes() != 0 {
        return Err(ProduceError::Truncated {
            trailing: batches.trailing_bytes(),
        });
    }
    let batch = match (first, count) {
        (Some(batch), 1) => batch,
        _ => return Err(ProduceError::BatchCount(count)),
    };
    if batch.is_legacy() {
        return Err(ProduceError::UnsupportedMagic(batch.magic()));
    }
    batch.validate()?;
    if batch.is_control() {
        return Err(ProduceError::ControlBatch);
    }
    let count = batch.records_count();
    if count < 1 || count - 1 != batch.last_offset_delta() {
        return Err(ProduceError::RecordCount {
            count,
            delta: batch.last_offset_delta(),
        });
    }
    Ok(batch)
}

/// The failover fence across restarts: the promoted epoch is in the epoch checkpoint when
/// `promote` returns and is the log's leader epoch again after every kind of reopen, whether a
/// batch carries it yet or not.
#[cfg(test)]
mod fence_tests {
    use super::*;
    use crate::ids::TopicPartition;
    use crate::log::config::LogConfig;
    use crate::log::epoch_cache::LeaderEpochCache;
    use crate::log::io::StdIo;
    use crate::log::recovery::LoadOptions;
    use crate::wire::batch_builder::BatchBuilder;

    const SOURCE_EPOCH: LeaderEpoch = LeaderEpoch(3);
    const PROMOTED: LeaderEpoch = LeaderEpoch(8);
    const MAX_MESSAGE_BYTES: usize = 1 << 20;
    const T0: i64 = 1_700_000_000_000;

    /// How the process ended before the log was opened again.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Restart {
        /// `close`, then an open with the clean-shutdown marker.
        Clean,
        /// kill -9: no close; the open recovers from the recovery point the owner checkpointed
        /// after the promotion.
        Crash,
        /// kill -9 with the recovery-point checkpoint lost: everything is revalidated.
        CrashNoCheckpoint,
    }

    fn tp() -> TopicPartition {
        TopicPartition::new("orders", 0)
    }

    /// Offsets 0-1 plain at the source's epoch; with `open_txn`, 2 a transaction of source
    /// producer 100 that the source never ended.
    fn mirrored(dir: &std::path::Path, open_txn: bool) -> PartitionLog {
        let mut log = PartitionLog::create(dir, tp(), None, LogConfig::default()).unwrap();
        let at = |o: i64| BatchBuilder::new(Offset(o)).leader_epoch(SOURCE_EPOCH);
        let plain = at(0)
            .value(TimestampMs(T0), b"a")
            .value(TimestampMs(T0), b"b");
        log.append(&mut StdIo, &plain.build()).unwrap();
        if open_txn {
            let txn = at(2)
                .producer(ProducerId(100), 0, 0)
                .transactional(true)
                .value(TimestampMs(T0), b"t");
            log.append(&mut StdIo, &txn.build()).unwrap();
        }
        log
    }

    fn produce(log: &mut PartitionLog, seq: i32) -> Offset {
        let epoch = log.epoch_cache().latest_epoch().expect("promoted");
        let mut batch = BatchBuilder::new(Offset(0))
            .producer(ProducerId(1 << 40), 0, seq)
            .value(TimestampMs(T0), b"after")
            .build();
        match log
            .append_as_leader(&mut StdIo, &mut batch, epoch, MAX_MESSAGE_BYTES)
            .unwrap()
        {
            ProduceOutcome::Appended { base_offset, .. } => base_offset,
            other => panic!("{other:?}"),
        }
    }

    fn reopen(dir: &std::path::Path, restart: Restart, recovery_point: Offset) -> PartitionLog {
        let load = match restart {
            Restart::Clean => LoadOptions {
                clean_shutdown: true,
                recovery_point,
                log_start_offset: None,
            },
            Restart::Crash => LoadOptions {
                clean_shutdown: false,
                recovery_point,
                log_start_offset: None,
            },
            Restart::CrashNoCheckpoint => LoadOptions::unclean(),
        };
        PartitionLog::open(dir, tp(), None, LogConfig::default(), load, &mut StdIo).unwrap()
    }

    fn end(log: PartitionLog, restart: Restart) {
        match restart {
            Restart::Clean => log.close(&mut StdIo).unwrap(),
            // Dropping without close leaves the files as a kill -9 would (page cache kept).
            Restart::Crash | Restart::CrashNoCheckpoint => drop(log),
        }
    }

    /// The leader epoch of the batch at `offset`.
    fn epoch_of_batch_at(log: &PartitionLog, offset: Offset) -> LeaderEpoch {
        let bytes = log.read_bytes(offset, 1 << 20).unwrap();
        let (_, batch) = Batches::new(&bytes).next().unwrap().unwrap();
        assert_eq!(batch.base_offset(), offset);
        batch.partition_leader_epoch()
    }

    fn assert_fenced(log: &mut PartitionLog, start: Offset, case: &str) {
        assert_eq!(
            log.epoch_cache().latest(),
            Some((PROMOTED, start)),
            "{case}: epoch cache"
        );
        let on_disk = LeaderEpochCache::load(log.dir()).unwrap();
        assert_eq!(
            on_disk.latest(),
            Some((PROMOTED, start)),
            "{case}: leader-epoch-checkpoint"
        );
        let view = log.attach_read_view().view();
        assert_eq!(view.leader_epoch(), PROMOTED, "{case}: announced epoch");
        assert_eq!(
            view.end_offset_for(PROMOTED),
            (PROMOTED, log.log_end_offset()),
            "{case}: OffsetForLeaderEpoch of the promoted epoch"
        );
        assert_eq!(
            view.end_offset_for(SOURCE_EPOCH),
            (SOURCE_EPOCH, start),
            "{case}: the source's epoch ends where the promoted one starts"
        );
    }

    #[test]
    fn promoted_epoch_survives_every_restart() {
        for open_txn in [false, true] {
            for produced_before in [false, true] {
                for restart in [Restart::Clean, Restart::Crash, Restart::CrashNoCheckpoint] {
                    let case = format!(
                        "open_txn={open_txn} produced={produced_before} restart={restart:?}"
                    );
                    let d = tempfile::tempdir().unwrap();
                    let dir = d.path().join("orders-0");
                    let mut log = mirrored(&dir, open_txn);
                    let mirrored_end = log.log_end_offset();
                    let promotion = log.promote(&mut StdIo, PROMOTED).unwrap();
                    assert_eq!(promotion.aborted.len(), usize::from(open_txn), "{case}");
                    // The promoted epoch begins with the first ABORT marker, else at the end.
                    let start = mirrored_end;
                    assert_eq!(
                        LeaderEpochCache::load(&dir).unwrap().latest(),
                        Some((PROMOTED, start)),
                        "{case}: durable when promote returns"
                    );
                    // What the owner checkpoints right after the promotion.
                    let recovery_point = log.recovery_point();
                    assert_eq!(recovery_point, promotion.log_end, "{case}");
                    if produced_before {
                        let at = produce(&mut log, 0);
                        assert_eq!(at, promotion.log_end, "{case}");
                        assert_eq!(epoch_of_batch_at(&log, at), PROMOTED, "{case}");
                    }
                    end(log, restart);

                    let mut log = reopen(&dir, restart, recovery_point);
                    assert_fenced(&mut log, start, &format!("{case}, first reopen"));
                    // A producer writing after the restart writes at the promoted epoch.
                    let at = produce(&mut log, i32::from(produced_before));
                    assert_eq!(epoch_of_batch_at(&log, at), PROMOTED, "{case}");
                    log.close(&mut StdIo).unwrap();
                    let mut log = reopen(&dir, Restart::Clean, Offset::ZERO);
                    assert_fenced(&mut log, start, &format!("{case}, second reopen"));
                }
            }
        }
    }

    /// An epoch whose start lies beyond the log end describes batches that are gone (a power
    /// cut after the checkpoint was written): opening drops it, clean or not.
    #[test]
    fn an_epoch_starting_past_the_end_is_dropped_at_open() {
        for restart in [Restart::Clean, Restart::Crash, Restart::CrashNoCheckpoint] {
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().join("orders-0");
            let log = mirrored(&dir, false);
            log.close(&mut StdIo).unwrap();
            let file = dir.join(crate::log::epoch_cache::FILE_NAME);
            std::fs::write(
                &file,
                format!("0\n2\n{} 0\n{} 5\n", SOURCE_EPOCH.0, PROMOTED.0),
            )
            .unwrap();
            let log = reopen(&dir, restart, Offset(2));
            assert_eq!(log.log_end_offset(), Offset(2));
            assert_eq!(
                log.epoch_cache().latest(),
                Some((SOURCE_EPOCH, Offset(0))),
                "{restart:?}"
            );
            assert_eq!(
                LeaderEpochCache::load(&dir).unwrap().latest(),
                Some((SOURCE_EPOCH, Offset(0))),
                "{restart:?}: the checkpoint is rewritten without it"
            );
        }
    }
}
