//! Replaying kmirror's transactions on the original (sans-IO): which call each batch of the
//! failed-over log needs, and the per-partition state of the original's transactional
//! producers, persisted with the map.
//!
//! One transactional producer on the original per kmirror producer id and partition, with a
//! transactional id derived from the mirror, the partition and that producer id (`txn_id`), so
//! every kmirror session — and a restart after kill -9 — finds the same one:
//! - a transactional data batch of kmirror producer P: begin P's replayed transaction if it is
//!   not open (InitProducerId once, AddPartitionsToTxn), then Produce under it;
//! - P's COMMIT or ABORT marker: EndTxn with that outcome; the original writes its own marker,
//!   which takes one original offset (`OffsetMap::marker`). Aborted records are replayed and
//!   aborted, so read_uncommitted readers see on the original what they saw on kmirror;
//! - a marker of a producer with no replayed transaction open (the ABORT markers kmirror wrote
//!   at failover for the source's open transactions, whose data lies below the failover point;
//!   an empty transaction): skipped, never copied as data;
//! - anything else: the idempotent producer, as before.
//!
//! The copier only reads kmirror below its last stable offset, so every transaction it begins
//! is already decided on kmirror: an undecided outcome is never replayed.
//!
//! After a kill -9 the open replayed transaction is kept and continued with its persisted
//! producer id, epoch and sequence (the original still holds it open; the batch in flight is
//! deduplicated by its sequence or found by the log-end reconcile). Fencing it with a new
//! InitProducerId would abort records on the original that later interleaved batches of other
//! producers (already copied, not abortable) follow, so the copy could only resume from the
//! transaction's first batch by reordering or doubling those. If the original itself has
//! aborted it (its transaction timeout passed while kmirror was down), the partition stops
//! with that reason: nothing doubled, nothing reordered.

use serde::{Deserialize, Serialize};

use crate::ids::ProducerId;
use crate::wire::batch::{Batch, ControlType};

use super::store::ProducerStamp;

/// The original's transactional producer replaying one kmirror producer's transactions in one
/// partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnReplay {
    /// The kmirror producer id whose transactions this replays.
    pub kmirror_producer_id: i64,
    pub transactional_id: String,
    /// The original's producer id and epoch for `transactional_id` (None: InitProducerId due).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp: Option<ProducerStamp>,
    /// The base sequence of its next batch.
    pub next_sequence: i32,
    /// The replayed transaction open on the original, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open: Option<OpenTxn>,
}

/// A transaction begun on the original and not ended yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenTxn {
    /// kmirror offset of its first replayed batch.
    pub first_kmirror: i64,
    /// Set (and persisted) before EndTxn is sent, so a restart sends it again (EndTxn repeated
    /// with the same outcome and epoch is answered as done) and then waits for the marker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ending: Option<Outcome>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    Commit,
    Abort,
}

impl Outcome {
    pub fn committed(self) -> bool {
        self == Outcome::Commit
    }
}

/// What the copier does with one batch of kmirror's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Produce it with the failback's idempotent producer.
    Plain,
    /// Produce it in the replayed transaction of kmirror producer `kmirror_producer_id`
    /// (beginning it when it is not open).
    TxnData { kmirror_producer_id: i64 },
    /// End that producer's replayed transaction with `outcome`.
    EndTxn {
        kmirror_producer_id: i64,
        outcome: Outcome,
    },
    /// A control batch with nothing to replay.
    Skip,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    #[error("the control batch at kmirror offset {0} has control type {1}, neither COMMIT nor ABORT: failback does not know how to replay it")]
    UnknownControl(i64, i16),
}

/// The transactional id of kmirror producer `pid`'s replay into `topic`-`partition`.
pub fn txn_id(mirror: &str, topic: &str, partition: i32, pid: ProducerId) -> String {
    format!("kmirror-failback-{mirror}-{topic}-{partition}-{}", pid.0)
}

/// The facts about a batch the decision needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchFacts {
    pub base_offset: i64,
    pub producer_id: i64,
    pub transactional: bool,
    pub control: Option<ControlType>,
}

impl BatchFacts {
    pub fn of(b: &Batch<'_>) -> BatchFacts {
        BatchFacts {
            base_offset: b.base_offset().0,
            producer_id: b.producer_id().0,
            transactional: b.is_transactional(),
            control: if b.is_control() {
                Some(b.control_type().unwrap_or(ControlType::Other(-1)))
            } else {
                None
            },
        }
    }
}

/// The open replay of kmirror producer `pid`, if any.
pub fn open_of(txns: &[TxnReplay], pid: i64) -> Option<&OpenTxn> {
    txns.iter()
        .find(|t| t.kmirror_producer_id == pid)
        .and_then(|t| t.open.as_ref())
}

/// Decides what `b` needs, given the partition's replayed transactions.
pub fn step_for(b: BatchFacts, txns: &[TxnReplay]) -> Result<Step, TxnError> {
    match b.control {
        Some(ctl) => {
            if open_of(txns, b.producer_id).is_none() {
                return Ok(Step::Skip);
            }
            let outcome = match ctl {
                ControlType::Commit => Outcome::Commit,
                ControlType::Abort => Outcome::Abort,
                ControlType::Other(t) => return Err(TxnError::UnknownControl(b.base_offset, t)),
            };
            Ok(Step::EndTxn {
                kmirror_producer_id: b.producer_id,
                outcome,
            })
        }
        None if b.transactional => Ok(Step::TxnData {
            kmirror_producer_id: b.producer_id,
        }),
        None => Ok(Step::Plain),
    }
}

/// The replay of `pid`, created (no producer yet, nothing open) if it is new.
pub fn replay_of<'a>(
    txns: &'a mut Vec<TxnReplay>,
    mirror: &str,
    topic: &str,
    partition: i32,
    pid: i64,
) -> &'a mut TxnReplay {
    let i = match txns.iter().position(|t| t.kmirror_producer_id == pid) {
        Some(i) => i,
        None => {
            txns.push(TxnReplay {
                kmirror_producer_id: pid,
                transactional_id: txn_id(mirror, topic, partition, ProducerId(pid)),
                stamp: None,
                next_sequence: 0,
                open: None,
            });
            txns.len() - 1
        }
    };
    &mut txns[i]
}

/// The kmirror offsets of the first batches of transactions still open on the original (for
/// `describe`); the cut-over waits until there is none.
pub fn open_transactions(txns: &[TxnReplay]) -> Vec<i64> {
    let mut v: Vec<i64> = txns
        .iter()
        .filter_map(|t| t.open.map(|o| o.first_kmirror))
        .collect();
    v.sort_unstable();
    v
}

/// The original offsets kmirror's next item takes, for the log-end check after a restart: a
/// data batch its `batch_offsets`; the marker of a replayed transaction whose EndTxn was sent,
/// 1 (the original's own marker); one whose EndTxn was not sent yet, 0 (nothing of it can be
/// on the original).
pub fn original_offsets_taken(step: Step, txns: &[TxnReplay], batch_offsets: i64) -> i64 {
    match step {
        Step::EndTxn {
            kmirror_producer_id,
            ..
        } => i64::from(open_of(txns, kmirror_producer_id).is_some_and(|o| o.ending.is_some())),
        Step::Skip => 0,
        Step::Plain | Step::TxnData { .. } => batch_offsets,
    }
}

/// Whether a partition is ready for the cut-over: copied to kmirror's readable end and no
/// replayed transaction left open on the original.
pub fn caught_up(next_kmirror: i64, readable_end: i64, txns: &[TxnReplay]) -> bool {
    next_kmirror >= readable_end && txns.iter().all(|t| t.open.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(pid: i64, transactional: bool, control: Option<ControlType>) -> BatchFacts {
        BatchFacts {
            base_offset: 10,
            producer_id: pid,
            transactional,
            control,
        }
    }

    #[test]
    fn each_batch_gets_the_call_its_kind_needs() {
        let mut txns = Vec::new();
        // Plain and idempotent data: the failback's own producer.
        assert_eq!(step_for(facts(4, false, None), &txns), Ok(Step::Plain));
        // Transactional data: that producer's replay.
        assert_eq!(
            step_for(facts(7, true, None), &txns),
            Ok(Step::TxnData {
                kmirror_producer_id: 7
            })
        );
        // A marker with no replayed transaction open (the failover's ABORT of a source
        // transaction, an empty transaction): skipped, never copied as data.
        assert_eq!(
            step_for(facts(7, true, Some(ControlType::Commit)), &txns),
            Ok(Step::Skip)
        );
        let r = replay_of(&mut txns, "m", "t", 0, 7);
        r.open = Some(OpenTxn {
            first_kmirror: 3,
            ending: None,
        });
        assert_eq!(r.transactional_id, "kmirror-failback-m-t-0-7");
        // Markers end the open transaction with kmirror's outcome.
        assert_eq!(
            step_for(facts(7, true, Some(ControlType::Abort)), &txns),
            Ok(Step::EndTxn {
                kmirror_producer_id: 7,
                outcome: Outcome::Abort
            })
        );
        assert_eq!(
            step_for(facts(7, true, Some(ControlType::Commit)), &txns),
            Ok(Step::EndTxn {
                kmirror_producer_id: 7,
                outcome: Outcome::Commit
            })
        );
        // Another producer's marker while 7's is open: nothing of 7's changes.
        assert_eq!(
            step_for(facts(8, true, Some(ControlType::Commit)), &txns),
            Ok(Step::Skip)
        );
        assert_eq!(
            step_for(facts(7, true, Some(ControlType::Other(5))), &txns),
            Err(TxnError::UnknownControl(10, 5))
        );
    }

    #[test]
    fn a_restart_knows_what_the_original_may_hold_and_when_the_copy_is_done() {
        let mut txns = Vec::new();
        let end = |pid| Step::EndTxn {
            kmirror_producer_id: pid,
            outcome: Outcome::Commit,
        };
        let data = Step::TxnData {
            kmirror_producer_id: 7,
        };
        assert_eq!(original_offsets_taken(Step::Plain, &txns, 5), 5);
        assert_eq!(original_offsets_taken(data, &txns, 3), 3);
        assert_eq!(original_offsets_taken(Step::Skip, &txns, 1), 0);
        replay_of(&mut txns, "m", "t", 0, 7).open = Some(OpenTxn {
            first_kmirror: 40,
            ending: None,
        });
        // Open, EndTxn not sent: the original cannot hold its marker; the copy is not done
        // even at kmirror's end.
        assert_eq!(original_offsets_taken(end(7), &txns, 1), 0);
        assert!(!caught_up(50, 50, &txns));
        // EndTxn sent (persisted before sending): the original may hold its marker.
        replay_of(&mut txns, "m", "t", 0, 7).open = Some(OpenTxn {
            first_kmirror: 40,
            ending: Some(Outcome::Commit),
        });
        assert_eq!(original_offsets_taken(end(7), &txns, 1), 1);
        replay_of(&mut txns, "m", "t", 0, 7).open = None;
        assert!(caught_up(50, 50, &txns));
        assert!(!caught_up(49, 50, &txns));
    }

    #[test]
    fn interleaved_producers_keep_one_replay_each() {
        let mut txns = Vec::new();
        replay_of(&mut txns, "m", "t", 2, 7).open = Some(OpenTxn {
            first_kmirror: 20,
            ending: None,
        });
        replay_of(&mut txns, "m", "t", 2, 9).open = Some(OpenTxn {
            first_kmirror: 12,
            ending: None,
        });
        // The same producer again: the same replay, not a second one.
        replay_of(&mut txns, "m", "t", 2, 7).next_sequence = 5;
        assert_eq!(txns.len(), 2);
        assert_eq!(open_transactions(&txns), [12, 20]);
        assert_ne!(txns[0].transactional_id, txns[1].transactional_id);
        replay_of(&mut txns, "m", "t", 2, 9).open = None;
        assert_eq!(open_transactions(&txns), [20]);
        assert!(open_of(&txns, 9).is_none());
        // Persisted and read back whole.
        let json = serde_json::to_string(&txns).unwrap();
        let back: Vec<TxnReplay> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, txns);
    }
}
