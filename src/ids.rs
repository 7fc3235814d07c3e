//! Distinct types for the numbers that must never be mixed up: offsets, epochs, file positions.
//!
//! Every value that crosses a module boundary as "an offset" or "an epoch" is one of these, so
//! the compiler rejects passing a leader epoch where an offset is expected. Conversions from the
//! wire (plain `i64`/`i32`) happen once, at the edge that parses them.

use std::fmt;

/// An absolute Kafka offset within one partition (source and local offsets are identical).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset(pub i64);

impl Offset {
    pub const ZERO: Offset = Offset(0);

    /// The offset right after this one. Offsets come from batches, which never carry one above
    /// `limits::OFFSET_MAX` (`Batch::peek` refuses them), so this cannot overflow.
    pub fn next(self) -> Offset {
        Offset(
            self.0
                .checked_add(1)
                .expect("offsets stay at or below limits::OFFSET_MAX"),
        )
    }

    /// `self + delta`, or `None` past `limits::OFFSET_MAX` or below zero: for deltas read from
    /// the wire or from files.
    pub fn checked_add(self, delta: i64) -> Option<Offset> {
        self.0
            .checked_add(delta)
            .filter(|o| (0..=crate::limits::OFFSET_MAX).contains(o))
            .map(Offset)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A partition leader epoch as carried in `partitionLeaderEpoch` of a record batch.
/// `-1` (`LeaderEpoch::NONE`) means "no epoch" (legacy data or unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaderEpoch(pub i32);

impl LeaderEpoch {
    pub const NONE: LeaderEpoch = LeaderEpoch(-1);

    pub fn is_known(self) -> bool {
        self.0 >= 0
    }
}

impl fmt::Display for LeaderEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The epoch of a mirror: grows by one every time the mirror is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MirrorEpoch(pub i32);

/// A byte position inside one segment's `.log` file. Kafka stores these as int32 in `.index`,
/// which is why segments are bounded by `limits::SEGMENT_BYTES_MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FilePosition(pub u32);

/// An offset relative to a segment's base offset, as stored in `.index` and `.timeindex`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RelativeOffset(pub u32);

/// A producer id from a batch header; `-1` means none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProducerId(pub i64);

impl ProducerId {
    pub const NONE: ProducerId = ProducerId(-1);
}

impl fmt::Display for ProducerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A record timestamp in milliseconds since the epoch; `-1` means none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimestampMs(pub i64);

impl TimestampMs {
    pub const NONE: TimestampMs = TimestampMs(-1);
}

/// Index of a data-plane shard (one pinned thread with its own io_uring).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(pub u16);

/// A topic name and partition number.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }

    /// The partition directory name Kafka uses: `<topic>-<partition>`.
    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}
