//! Kafka's truncation rule: given the source leader's answer about our last epoch, how far back
//! our log diverges from the source (kafka-formats.md §6.7, as in Kafka's
//! `AbstractFetcherThread.getOffsetTruncationState`).
//!
//! kmirror never truncates on its own: a partition whose log diverges from the source is
//! reported and goes FAILED. This rule decides whether there is real divergence (local data at
//! or above the truncation offset) and says where it starts, for the operator and for failback.

use crate::ids::{LeaderEpoch, Offset};

/// Where the local log would have to be cut to agree with the source leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncation {
    pub offset: Offset,
    /// `false` when our history lacks the leader's epoch: Kafka would cut here and ask again
    /// with the epoch below, so the true divergence point may be lower still.
    pub complete: bool,
}

impl Truncation {
    /// Whether local data would be lost, i.e. the logs really differ.
    pub fn diverges(&self, log_end: Offset) -> bool {
        self.offset < log_end
    }
}

/// Apply the rule. `leader` is (epoch, end offset) from DivergingEpoch or OffsetForLeaderEpoch;
/// `local_end_offset_for` is our own leader-epoch cache's `endOffsetFor` (Kafka's semantics:
/// the largest epoch ≤ the one asked and the start of the next higher epoch, the log end for the
/// latest epoch, (-1, -1) when unknown); `high_watermark` is our last known-safe offset.
pub fn truncation_offset(
    leader: (LeaderEpoch, Offset),
    local_end_offset_for: impl Fn(LeaderEpoch) -> (LeaderEpoch, Offset),
    log_end: Offset,
    high_watermark: Offset,
) -> Truncation {
    let (leader_epoch, leader_end) = leader;
    if leader_end.0 < 0 {
        return Truncation {
            offset: high_watermark.min(log_end),
            complete: true,
        };
    }
    if !leader_epoch.is_known() {
        return Truncation {
            offset: leader_end.min(log_end),
            complete: true,
        };
    }
    let (local_epoch, local_end) = local_end_offset_for(leader_epoch);
    if local_end.0 < 0 {
        // We hold no epoch at or below the leader's: fall back to the leader's end offset.
        return Truncation {
            offset: leader_end.min(log_end),
            complete: true,
        };
    }
    if local_epoch == leader_epoch {
        Truncation {
            offset: local_end.min(leader_end).min(log_end),
            complete: true,
        }
    } else {
        Truncation {
            offset: local_end.min(log_end),
            complete: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A local epoch history as (epoch, start offset) entries and Kafka's endOffsetFor over it,
    /// written out here from the rule's definition rather than taken from the log module.
    fn history(
        entries: &'static [(i32, i64)],
        log_end: i64,
    ) -> impl Fn(LeaderEpoch) -> (LeaderEpoch, Offset) {
        move |asked: LeaderEpoch| {
            if asked.0 < 0 {
                return (LeaderEpoch(-1), Offset(-1));
            }
            if entries.last().map(|e| e.0) == Some(asked.0) {
                return (asked, Offset(log_end));
            }
            let Some(higher) = entries.iter().find(|e| e.0 > asked.0) else {
                return (LeaderEpoch(-1), Offset(-1));
            };
            match entries.iter().rev().find(|e| e.0 <= asked.0) {
                Some(floor) => (LeaderEpoch(floor.0), Offset(higher.1)),
                None => (asked, Offset(higher.1)),
            }
        }
    }

    // Local: epoch 1 from 0, epoch 3 from 50, log end 80. Leader says epoch 1 ends at 40: the
    // leader lost 40..50 of epoch 1 and all of epoch 3, so we diverge from 40.
    #[test]
    fn same_epoch_takes_the_lower_end() {
        let t = truncation_offset(
            (LeaderEpoch(1), Offset(40)),
            history(&[(1, 0), (3, 50)], 80),
            Offset(80),
            Offset(80),
        );
        assert_eq!(
            t,
            Truncation {
                offset: Offset(40),
                complete: true
            }
        );
        assert!(t.diverges(Offset(80)));
    }

    // Leader answers epoch 2, which we never saw: cut at the end of our epoch 1 (start of 3)
    // and ask again.
    #[test]
    fn unknown_leader_epoch_is_incomplete() {
        let t = truncation_offset(
            (LeaderEpoch(2), Offset(70)),
            history(&[(1, 0), (3, 50)], 80),
            Offset(80),
            Offset(80),
        );
        assert_eq!(
            t,
            Truncation {
                offset: Offset(50),
                complete: false
            }
        );
    }

    // The leader's answer covers all we have: no divergence.
    #[test]
    fn leader_ahead_means_no_divergence() {
        let t = truncation_offset(
            (LeaderEpoch(3), Offset(120)),
            history(&[(1, 0), (3, 50)], 80),
            Offset(80),
            Offset(80),
        );
        assert!(!t.diverges(Offset(80)));
    }

    #[test]
    fn undefined_answers_fall_back() {
        let h = history(&[(1, 0)], 10);
        let hw = Offset(7);
        assert_eq!(
            truncation_offset((LeaderEpoch(-1), Offset(-1)), &h, Offset(10), hw).offset,
            hw
        );
        assert_eq!(
            truncation_offset((LeaderEpoch(-1), Offset(4)), &h, Offset(10), hw).offset,
            Offset(4)
        );
        let none = history(&[], 10);
        assert_eq!(
            truncation_offset((LeaderEpoch(5), Offset(6)), none, Offset(10), hw).offset,
            Offset(6)
        );
    }
}
