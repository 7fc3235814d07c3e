//! Whether a source's log holds our local history, so a partition can resume from its local
//! log end when its mirror is re-pointed at that source (`mirrors repoint`), instead of being
//! copied again or refused.
//!
//! Two independent pieces of evidence, both required, both from the source's answers:
//! - our last batch (base and last offset, partition leader epoch, CRC: the CRC covers every
//!   record byte) is at the same offsets on the source, byte for byte;
//! - the source's OffsetForLeaderEpoch answer for that batch's epoch does not cut our log
//!   (Kafka's truncation rule, `fetch::divergence::truncation_offset`, the rule the fetcher and
//!   the unclean-election recovery use): the source's epoch ends at or after our log end.
//!
//! A different topic of the same name fails the first (its batches have other CRCs) and
//! usually the second; a source that lost our tail (unclean election, a shorter log) fails
//! both. This module only decides; it never truncates or deletes anything.

use uuid::Uuid;

use crate::control::audit::scrub::BatchId;
use crate::fetch::divergence::truncation_offset;
use crate::ids::{LeaderEpoch, Offset};
use crate::log::epoch_cache::{end_offset_for, EpochEntry};

/// What we hold of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalTail {
    pub topic_id: Option<Uuid>,
    pub log_start: Offset,
    pub log_end: Offset,
    /// The batch ending at `log_end - 1`; `None` for a log holding no batch.
    pub last_batch: Option<BatchId>,
    /// The log's leader-epoch entries (`leader-epoch-checkpoint`).
    pub epochs: Vec<EpochEntry>,
}

/// What the source answered about the same partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceTail {
    pub topic_id: Option<Uuid>,
    pub log_start: Option<Offset>,
    /// The first batch the source returned for a fetch at our last batch's base offset.
    pub batch_at_ours: Option<BatchId>,
    /// OffsetForLeaderEpoch of our last batch's epoch: (epoch, end offset).
    pub epoch_end: Option<(LeaderEpoch, Offset)>,
    /// Why the source could not be asked (no leader, an error code, no answer).
    pub error: Option<String>,
}

/// The source holds our history through `through` (our log end): resume from there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreement {
    pub through: Offset,
}

/// The check for one partition: `Ok` to resume from the local log end, `Err` with the reason
/// to refuse (the partition and its log are left as they are).
pub fn agree(local: &LocalTail, source: &SourceTail) -> Result<Agreement, String> {
    if let Some(why) = &source.error {
        return Err(format!("the new source could not be checked: {why}"));
    }
    // Said with whatever the data check finds: a different id alone (the data agreeing) is
    // refused too, as kmirror keeps the source's topic id and a recreated topic has a new one.
    let foreign = match (local.topic_id, source.topic_id) {
        (Some(ours), Some(theirs)) if !ours.is_nil() && !theirs.is_nil() && ours != theirs => Some(
            format!("the new source's topic id {theirs} is not ours ({ours}): it is another topic of the same name"),
        ),
        _ => None,
    };
    let data = history_agrees(local, source);
    match (data, foreign) {
        (Ok(a), None) => Ok(a),
        (Ok(_), Some(id)) => Err(id),
        (Err(why), None) => Err(why),
        (Err(why), Some(id)) => Err(format!("{why}; {id}")),
    }
}

/// The data half of `agree`: our last batch and our epochs against the source's.
fn history_agrees(local: &LocalTail, source: &SourceTail) -> Result<Agreement, String> {
    let Some(ours) = local.last_batch else {
        // Nothing mirrored yet: there is no history to contradict.
        return Ok(Agreement {
            through: local.log_end,
        });
    };
    if let Some(start) = source.log_start {
        if start.0 > ours.base_offset {
            return Err(format!(
                "the new source's log starts at {}, after our last batch at {}..={}: it no longer holds what would prove our history is its own",
                start.0, ours.base_offset, ours.last_offset
            ));
        }
    }
    let theirs = source.batch_at_ours.ok_or_else(|| {
        format!(
            "the new source has no batch at offset {} (our last batch {}..={}): its log ends before ours",
            ours.base_offset, ours.base_offset, ours.last_offset
        )
    })?;
    let same = theirs.base_offset == ours.base_offset
        && theirs.last_offset == ours.last_offset
        && theirs.leader_epoch == ours.leader_epoch
        && theirs.crc == ours.crc;
    if !same {
        return Err(format!(
            "our last batch (offsets {}..={}, leader epoch {}, CRC {:#010x}) differs from the new source's at offset {} (offsets {}..={}, leader epoch {}, CRC {:#010x}): its history is not ours",
            ours.base_offset,
            ours.last_offset,
            ours.leader_epoch,
            ours.crc,
            ours.base_offset,
            theirs.base_offset,
            theirs.last_offset,
            theirs.leader_epoch,
            theirs.crc
        ));
    }
    let epoch = LeaderEpoch(ours.leader_epoch);
    if epoch.is_known() {
        let (their_epoch, their_end) = source.epoch_end.ok_or_else(|| {
            format!(
                "the new source did not answer OffsetForLeaderEpoch for epoch {}",
                epoch.0
            )
        })?;
        let cut = truncation_offset(
            (their_epoch, their_end),
            |e| end_offset_for(&local.epochs, e, local.log_end),
            local.log_end,
            local.log_end,
        );
        if cut.diverges(local.log_end) {
            return Err(format!(
                "the new source's leader epochs disagree with ours: for epoch {} it answers epoch {} ending at {}, which would cut our log (end {}) at {}",
                epoch.0, their_epoch.0, their_end.0, local.log_end.0, cut.offset.0
            ));
        }
    }
    Ok(Agreement {
        through: local.log_end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(base: i64, last: i64, epoch: i32, crc: u32) -> BatchId {
        BatchId {
            base_offset: base,
            last_offset: last,
            leader_epoch: epoch,
            crc,
            max_timestamp_ms: 0,
        }
    }

    fn id(n: u128) -> Option<Uuid> {
        Some(Uuid::from_u128(n))
    }

    /// Our log: epochs 0 from 0 and 3 from 40, last batch 90..=99 at epoch 3, end 100.
    fn ours() -> LocalTail {
        LocalTail {
            topic_id: id(7),
            log_start: Offset(0),
            log_end: Offset(100),
            last_batch: Some(batch(90, 99, 3, 0xabcd)),
            epochs: vec![
                EpochEntry {
                    epoch: LeaderEpoch(0),
                    start_offset: Offset(0),
                },
                EpochEntry {
                    epoch: LeaderEpoch(3),
                    start_offset: Offset(40),
                },
            ],
        }
    }

    fn same_source() -> SourceTail {
        SourceTail {
            topic_id: id(7),
            log_start: Some(Offset(0)),
            batch_at_ours: Some(batch(90, 99, 3, 0xabcd)),
            // The source went on to epoch 4 at 150: epoch 3 ends there, past our end.
            epoch_end: Some((LeaderEpoch(3), Offset(150))),
            error: None,
        }
    }

    #[test]
    fn a_source_holding_our_history_as_a_prefix_agrees() {
        assert_eq!(
            agree(&ours(), &same_source()),
            Ok(Agreement {
                through: Offset(100)
            })
        );
        // Still in our epoch, ending exactly at our end (nothing newer yet).
        let s = SourceTail {
            epoch_end: Some((LeaderEpoch(3), Offset(100))),
            ..same_source()
        };
        assert!(agree(&ours(), &s).is_ok());
        // An empty local log has nothing to contradict.
        let empty = LocalTail {
            last_batch: None,
            epochs: Vec::new(),
            log_end: Offset(0),
            ..ours()
        };
        assert!(agree(&empty, &SourceTail::default()).is_ok());
    }

    #[test]
    fn each_kind_of_different_history_is_refused_with_its_reason() {
        let refuse = |s: SourceTail, words: &str| {
            let why = agree(&ours(), &s).unwrap_err();
            assert!(why.contains(words), "{why:?} should say {words:?}");
        };
        refuse(
            SourceTail {
                batch_at_ours: Some(batch(90, 99, 3, 0x1234)),
                ..same_source()
            },
            "differs from the new source's",
        );
        refuse(
            SourceTail {
                batch_at_ours: Some(batch(90, 95, 3, 0xabcd)),
                ..same_source()
            },
            "differs",
        );
        refuse(
            SourceTail {
                topic_id: id(8),
                ..same_source()
            },
            "another topic of the same name",
        );
        let both = agree(
            &ours(),
            &SourceTail {
                topic_id: id(8),
                batch_at_ours: Some(batch(90, 99, 0, 0x1234)),
                ..same_source()
            },
        )
        .unwrap_err();
        assert!(
            both.contains("differs") && both.contains("another topic of the same name"),
            "{both}"
        );
        refuse(
            SourceTail {
                batch_at_ours: None,
                ..same_source()
            },
            "ends before ours",
        );
        refuse(
            SourceTail {
                log_start: Some(Offset(95)),
                ..same_source()
            },
            "no longer holds",
        );
        // Epoch 3 ended at 70 on the source (an unclean election elsewhere): our 70..100 is
        // not its history even though a batch at 90 happens to match.
        refuse(
            SourceTail {
                epoch_end: Some((LeaderEpoch(3), Offset(70))),
                ..same_source()
            },
            "would cut our log (end 100) at 70",
        );
        // The source never had epoch 3: it answers epoch 2 ending at 60.
        refuse(
            SourceTail {
                epoch_end: Some((LeaderEpoch(2), Offset(60))),
                ..same_source()
            },
            "disagree",
        );
        refuse(
            SourceTail {
                error: Some("no leader on the source".into()),
                ..same_source()
            },
            "could not be checked: no leader",
        );
    }
}
