//! Which segments retention deletes (Kafka's `deleteOldSegments`), as pure functions over
//! segment facts so the rules can be tested exhaustively.

/// What retention needs to know about one segment, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentFacts {
    pub size: u64,
    /// Kafka's `largestTimestamp`: max record timestamp, else file modification time.
    pub largest_timestamp_ms: i64,
    /// Base offset of the next segment (the log end offset for the active one).
    pub next_base: i64,
}

/// Number of leading segments that retention.ms, retention.bytes and the log start offset make
/// deletable, applied in Kafka's order (time, then size, then log start). The active segment is
/// deletable too unless it is empty; the caller rolls a fresh one before deleting it.
pub fn deletable_prefix(
    segments: &[SegmentFacts],
    now_ms: i64,
    retention_ms: Option<i64>,
    retention_bytes: Option<u64>,
    log_start_offset: i64,
) -> usize {
    let usable = |i: usize| -> bool {
        let last_and_empty = i + 1 == segments.len() && segments[i].size == 0;
        !last_and_empty
    };
    let mut n = 0;
    if let Some(ms) = retention_ms {
        while n < segments.len() && usable(n) && now_ms - segments[n].largest_timestamp_ms > ms {
            n += 1;
        }
    }
    if let Some(limit) = retention_bytes {
        let total: u64 = segments[n..].iter().map(|s| s.size).sum();
        let mut excess = total.saturating_sub(limit) as i64;
        while n < segments.len() && usable(n) && excess - segments[n].size as i64 >= 0 {
            excess -= segments[n].size as i64;
            n += 1;
        }
    }
    while n < segments.len() && usable(n) && segments[n].next_base <= log_start_offset {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seg(size: u64, ts: i64, next: i64) -> SegmentFacts {
        SegmentFacts {
            size,
            largest_timestamp_ms: ts,
            next_base: next,
        }
    }

    #[test]
    fn time_retention_stops_at_first_young_segment() {
        let s = [seg(10, 100, 10), seg(10, 500, 20), seg(10, 200, 30)];
        // Only the first is older than 300 ms at now=450; the third is old but behind a young one.
        assert_eq!(deletable_prefix(&s, 450, Some(300), None, 0), 1);
    }

    #[test]
    fn size_retention_keeps_total_under_limit() {
        let s = [seg(100, 0, 10), seg(100, 0, 20), seg(50, 0, 30)];
        assert_eq!(deletable_prefix(&s, 0, None, Some(150), 0), 1);
        assert_eq!(deletable_prefix(&s, 0, None, Some(49), 0), 2);
    }

    #[test]
    fn empty_active_segment_is_never_deleted() {
        let s = [seg(100, 0, 10), seg(0, 0, 10)];
        assert_eq!(deletable_prefix(&s, 1_000, Some(1), Some(0), 100), 1);
    }

    proptest! {
        /// After size retention, the remaining bytes are ≤ the limit unless only the empty
        /// active segment's predecessor could not go, and removing one more would overshoot.
        #[test]
        fn size_retention_is_minimal_and_sufficient(
            sizes in proptest::collection::vec(1u64..1000, 1..20),
            limit in 0u64..10_000,
        ) {
            let mut next = 0;
            let s: Vec<_> = sizes.iter().map(|&sz| { next += 10; seg(sz, 0, next) }).collect();
            let n = deletable_prefix(&s, 0, None, Some(limit), 0);
            let rest: u64 = s[n..].iter().map(|x| x.size).sum();
            let total: u64 = s.iter().map(|x| x.size).sum();
            // Deleted segments fit entirely within the excess...
            prop_assert!(total - rest <= total.saturating_sub(limit));
            // ...and the next one would not have.
            if n < s.len() {
                prop_assert!(total - rest + s[n].size > total.saturating_sub(limit));
            }
        }
    }
}
