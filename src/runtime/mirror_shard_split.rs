//! Catch-up pipelining (a child of `mirror_shard`): a second fetch session on a connection
//! only while its partitions are behind.
//!
//! With one request in flight the shard and its source take turns: the source waits while
//! the shard writes a response, and the shard waits while the source reads the next one. A
//! second request in flight hides that (one shard 15–25 % faster on a two-core box,
//! benches/RESULTS.md sessions 20 and 22), but two fetch groups for good cost RPO: when both
//! are idle only one may long-poll at the source (it answers a connection's requests one at
//! a time), and the other group's new records wait up to `max_wait_ms` behind that park.
//!
//! So the connection keeps one group, Kafka's replica-fetcher shape, and moves every other
//! fetching partition into a second group only while it is behind: after
//! `CATCH_UP_SPLIT_AFTER_RESPONSES` answers in a row that each showed a backlog (`Backlog`:
//! partitions cut short, or half a response's worth of records). The first answer of either
//! group that shows none (an empty answer, or a small one: a steady stream the connection
//! keeps up with; or one that asked for a throttle, so the source gets fewer requests) merges its partitions into the other group before anything else is sent. A
//! group that answered has no request in flight, so its partitions leave it between
//! requests, with their whole fetch state (`Fetcher::hand_over`). A group with a backlog
//! never parks, so while the connection is split neither request waits at the source. Only
//! the merge's own moment can meet a park: the partitions that just caught up join the other
//! group's next request, not the one it may have in flight.
//!
//! A move first completes the appends staged so far (their writes name the partition's
//! location), so a partition moves with its log end equal to its fetch position. The group
//! left empty sends one request that forgets what left it (never parked, see `drive`); a
//! broker closes a session that empties, and the next split opens a new one.

use super::{Cx, Group, Loc, MirrorShard};
use crate::fetch::fetcher::{FetchedRecords, PartitionState, Slot};
use crate::limits::CATCH_UP_SPLIT_AFTER_RESPONSES;

/// What one response showed of the source's backlog for its group.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Backlog {
    /// Partitions it left with more records at the source than it brought (each one's
    /// `partition_max_bytes` cut it short).
    partitions_left: u32,
    /// Record bytes it brought.
    record_bytes: u64,
    /// It asked for a throttle (`throttle_time_ms`): the source wants fewer requests, not a
    /// second one in flight.
    throttled: bool,
}

impl Backlog {
    pub(super) fn count(&mut self, r: &FetchedRecords) {
        if r.high_watermark.0 > r.last_offset.0 + 1 {
            self.partitions_left += 1;
        }
        self.record_bytes += r.records.as_ref().len() as u64;
    }

    pub(super) fn throttled(&mut self) {
        self.throttled = true;
    }

    /// Whether the group is behind: two or more of its partitions were cut short, or the
    /// response brought half of what it could (`fetch.max_bytes`, or each partition's
    /// `partition_max_bytes`); and the source did not ask us to slow down. The first is many partitions with a lot each, the second many
    /// with a little each: 4,096 partitions of 733 KB fill an 8 MiB response eleven whole
    /// partitions at a time, none of them cut short.
    fn behind(&self, partitions: usize, max_bytes: u32, partition_max_bytes: u32) -> bool {
        let could = u64::from(max_bytes).min(partitions as u64 * u64::from(partition_max_bytes));
        !self.throttled && (self.partitions_left >= 2 || self.record_bytes * 2 >= could)
    }
}

impl MirrorShard {
    /// After group `g` of source `i` handled a whole response: `records` says whether it
    /// carried any, `backlog` what it showed of the source's backlog. Splits after
    /// `CATCH_UP_SPLIT_AFTER_RESPONSES` answers in a row that show one, merges at the first
    /// answer of either group that does not (a steady stream of small answers is caught up:
    /// two groups would only double the requests).
    pub(super) fn pipeline_catch_up(
        &mut self,
        cx: &mut Cx<'_>,
        i: usize,
        g: usize,
        records: bool,
        backlog: Backlog,
    ) {
        let src = &mut self.sources[i];
        let fetch = &src.spec.fetch;
        if !fetch.catch_up_pipelining || fetch.sessions_per_connection != 1 {
            return;
        }
        let partitions = src.groups[g].fetcher.live_partitions();
        let behind = records
            && partitions >= 2
            && backlog.behind(partitions, fetch.max_bytes, fetch.partition_max_bytes);
        if src.catching_up {
            if !behind {
                self.merge_group(cx, i, g);
            }
            return;
        }
        if !behind {
            src.behind_streak = 0;
            return;
        }
        src.behind_streak += 1;
        if src.behind_streak >= CATCH_UP_SPLIT_AFTER_RESPONSES {
            self.split_group(cx, i, g);
        }
    }

    /// Moves every other fetching partition of group `g` into the connection's other group
    /// (made on first use).
    fn split_group(&mut self, cx: &mut Cx<'_>, i: usize, g: usize) {
        let src = &mut self.sources[i];
        src.behind_streak = 0;
        let h = match src.groups.len() {
            1 => match Group::new(&src.spec) {
                Ok(group) => {
                    src.groups.push(group);
                    1
                }
                // The same config built group `g`; if it fails now, stay with one group.
                Err(_) => return,
            },
            _ => 1 - g,
        };
        // First, as the moves need: a failed write may stop or rewind a partition.
        self.write_staged(cx);
        let src = &self.sources[i];
        let fetcher = &src.groups[g].fetcher;
        let moving: Vec<Slot> = src.groups[g]
            .slots_where(|_| true)
            .filter(|&s| fetcher.state(s) == Some(PartitionState::Fetching))
            .skip(1)
            .step_by(2)
            .collect();
        if moving.is_empty() {
            return;
        }
        for slot in moving {
            self.move_partition(i, g, slot, h);
        }
        self.sources[i].catching_up = true;
        cx.stats.fetch_group_split();
    }

    /// Moves every partition of group `g` into the connection's other group.
    fn merge_group(&mut self, cx: &mut Cx<'_>, i: usize, g: usize) {
        self.write_staged(cx);
        let src = &self.sources[i];
        debug_assert_eq!(
            src.groups.len(),
            2,
            "a connection catching up has two groups"
        );
        let h = 1 - g;
        let moving: Vec<Slot> = src.groups[g].slots_where(|_| true).collect();
        let mut all = true;
        for slot in moving {
            all &= self.move_partition(i, g, slot, h);
        }
        // A partition the other group has no room for stays here, and the next answer without
        // a backlog tries again.
        if all {
            self.sources[i].catching_up = false;
            cx.stats.fetch_group_merge();
        }
    }

    /// Moves one partition, with its fetch state, log, meter and progress cell, from group
    /// `from` to group `to` of source `i`; false when it stays where it is.
    fn move_partition(&mut self, i: usize, from: usize, slot: Slot, to: usize) -> bool {
        let src = &mut self.sources[i];
        let n = slot.0 as usize;
        if !src.groups[to].fetcher.has_room() {
            return false;
        }
        let Ok(handover) = src.groups[from].fetcher.hand_over(slot) else {
            return false;
        };
        let group = &mut src.groups[from];
        let log = group.logs[n].take();
        let meter = group.meters[n].take();
        let wanted = std::mem::take(&mut group.leader_wanted[n]);
        let target = &mut src.groups[to];
        let Slot(m) = target
            .fetcher
            .take_over(handover)
            .expect("checked: the target has room, and a partition lives in one group");
        let m = m as usize;
        if target.logs.len() <= m {
            target.logs.resize_with(m + 1, || None);
            target.meters.resize_with(m + 1, || None);
            target.leader_wanted.resize(m + 1, false);
        }
        target.logs[m] = log;
        target.meters[m] = meter;
        target.leader_wanted[m] = wanted;
        let old = Loc {
            src: i,
            group: from,
            slot,
        };
        if let Some(cell) = self.cells.remove(&old) {
            let new = Loc {
                src: i,
                group: to,
                slot: Slot(m as u32),
            };
            self.cells.insert(new, cell);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::Backlog;

    const MAX: u32 = 8 << 20;
    const PART_MAX: u32 = 1 << 20;

    fn backlog(partitions_left: u32, record_bytes: u64) -> Backlog {
        Backlog {
            partitions_left,
            record_bytes,
            throttled: false,
        }
    }

    // Goal: what counts as a backlog. Two partitions cut short by their own limit, or half of
    // what the response could carry (the smaller of max_bytes and the partitions' limits), is
    // one; a small answer, or one partition cut short with little else, is a stream kept up
    // with.
    #[test]
    fn a_backlog_is_partitions_cut_short_or_half_a_response() {
        assert!(backlog(2, 64 << 10).behind(16, MAX, PART_MAX));
        assert!(!backlog(1, 64 << 10).behind(16, MAX, PART_MAX));
        // 4,096 partitions drained whole, eleven to an 8 MiB response: none cut short.
        assert!(backlog(0, 8 << 20).behind(4096, MAX, PART_MAX));
        assert!(backlog(0, 4 << 20).behind(4096, MAX, PART_MAX));
        assert!(!backlog(0, (4 << 20) - 1).behind(4096, MAX, PART_MAX));
        // Two partitions can carry 2 MiB at most: half of that is a backlog.
        assert!(backlog(0, 1 << 20).behind(2, MAX, PART_MAX));
        assert!(!backlog(0, 200 << 10).behind(2, MAX, PART_MAX));
        // A source that asks for a throttle gets no second request in flight.
        let mut asked = backlog(16, 8 << 20);
        asked.throttled();
        assert!(!asked.behind(16, MAX, PART_MAX));
    }
}
