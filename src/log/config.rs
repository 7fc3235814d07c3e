//! Per-partition log settings, named after the Kafka topic configs they mirror.

use crate::limits::{
    INDEX_INTERVAL_BYTES_DEFAULT, MAX_MESSAGE_BYTES_DEFAULT, OFFSET_INDEX_ENTRY_BYTES,
    SEGMENT_BYTES_DEFAULT, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN, SEGMENT_INDEX_BYTES_DEFAULT,
    SEGMENT_INDEX_BYTES_MIN, SEGMENT_MS_DEFAULT, TIME_INDEX_ENTRY_BYTES,
};

/// When appended data is made durable (Kafka's `flush.messages` / `flush.ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushPolicy {
    /// Leave data in the page cache; sync only when a segment rolls and on close (Kafka's
    /// default). A crash may lose the unsynced tail, which recovery then cuts off cleanly.
    #[default]
    PageCache,
    /// fdatasync after every append.
    EveryAppend,
    /// Sync once `messages` offsets or `ms` milliseconds have accumulated since the last sync,
    /// whichever comes first.
    Interval { messages: u64, ms: i64 },
}

/// `cleanup.policy`. kmirror never compacts: a compacted source topic arrives already
/// compacted (as offset gaps), so `compact` only turns time and size retention off when
/// `delete` is absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupPolicy {
    pub delete: bool,
    pub compact: bool,
}

impl Default for CleanupPolicy {
    fn default() -> Self {
        CleanupPolicy {
            delete: true,
            compact: false,
        }
    }
}

impl CleanupPolicy {
    /// Kafka's spelling: `delete`, `compact`, `compact,delete`, or empty.
    pub fn kafka_value(&self) -> String {
        match (self.compact, self.delete) {
            (true, true) => "compact,delete".into(),
            (true, false) => "compact".into(),
            (false, true) => "delete".into(),
            (false, false) => String::new(),
        }
    }
}

/// Settings of one partition log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// `segment.bytes`: roll when the active segment would exceed this.
    pub segment_bytes: u64,
    /// `segment.ms`: roll when the record time spanned by the active segment exceeds this.
    pub segment_ms: i64,
    /// `segment.index.bytes`: the capacity of `.index`/`.timeindex`; a full index rolls.
    pub segment_index_bytes: u32,
    /// `index.interval.bytes`: log bytes between offset-index entries.
    pub index_interval_bytes: u32,
    /// `retention.bytes`; `None` keeps everything (Kafka's -1).
    pub retention_bytes: Option<u64>,
    /// `retention.ms`; `None` keeps everything (Kafka's -1).
    pub retention_ms: Option<i64>,
    pub flush: FlushPolicy,
    /// `cleanup.policy`: retention by time and size applies only with `delete`.
    pub cleanup: CleanupPolicy,
    /// `max.message.bytes`: the largest batch a client may produce after failover.
    pub max_message_bytes: u32,
    /// The topic's own configs as copied from the source (`control::topic_configs`), applied
    /// or not: DescribeConfigs reports them as DYNAMIC_TOPIC_CONFIG. Empty for a topic with
    /// no overrides and outside the control plane.
    pub topic_configs: std::collections::BTreeMap<String, String>,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            segment_ms: SEGMENT_MS_DEFAULT,
            segment_index_bytes: SEGMENT_INDEX_BYTES_DEFAULT,
            index_interval_bytes: INDEX_INTERVAL_BYTES_DEFAULT,
            retention_bytes: None,
            retention_ms: Some(SEGMENT_MS_DEFAULT),
            flush: FlushPolicy::PageCache,
            cleanup: CleanupPolicy::default(),
            max_message_bytes: MAX_MESSAGE_BYTES_DEFAULT as u32,
            topic_configs: std::collections::BTreeMap::new(),
        }
    }
}

/// A setting outside the range Kafka (and our int32 file positions) allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("segment.bytes {0} is outside [{SEGMENT_BYTES_MIN}, {SEGMENT_BYTES_MAX}]")]
    SegmentBytes(u64),
    #[error("segment.ms {0} must be positive")]
    SegmentMs(i64),
    #[error("segment.index.bytes {0} must be at least {SEGMENT_INDEX_BYTES_MIN}")]
    SegmentIndexBytes(u32),
    #[error("retention.ms {0} must be positive (use none for unlimited)")]
    RetentionMs(i64),
    #[error("flush interval must have messages > 0 and ms > 0")]
    FlushInterval,
}

impl LogConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&self.segment_bytes) {
            return Err(ConfigError::SegmentBytes(self.segment_bytes));
        }
        if self.segment_ms <= 0 {
            return Err(ConfigError::SegmentMs(self.segment_ms));
        }
        if self.segment_index_bytes < SEGMENT_INDEX_BYTES_MIN {
            return Err(ConfigError::SegmentIndexBytes(self.segment_index_bytes));
        }
        if let Some(ms) = self.retention_ms {
            if ms <= 0 {
                return Err(ConfigError::RetentionMs(ms));
            }
        }
        if let FlushPolicy::Interval { messages, ms } = self.flush {
            if messages == 0 || ms <= 0 {
                return Err(ConfigError::FlushInterval);
            }
        }
        Ok(())
    }

    /// retention.ms and retention.bytes as retention applies them: none for a compact-only
    /// topic (Kafka deletes its segments only by compaction, which the source did).
    pub fn effective_retention(&self) -> (Option<i64>, Option<u64>) {
        if self.cleanup.delete {
            (self.retention_ms, self.retention_bytes)
        } else {
            (None, None)
        }
    }

    /// Entries the offset index holds before the segment must roll.
    pub fn offset_index_max_entries(&self) -> u32 {
        self.segment_index_bytes / OFFSET_INDEX_ENTRY_BYTES
    }

    /// Entries the time index holds (it counts as full one entry earlier, see `TimeIndex`).
    pub fn time_index_max_entries(&self) -> u32 {
        self.segment_index_bytes / TIME_INDEX_ENTRY_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_matches_kafka_index_capacity() {
        let c = LogConfig::default();
        c.validate().expect("default is valid");
        // floor(10 MiB / 8) and floor(10 MiB / 12), as Kafka computes maxEntries.
        assert_eq!(c.offset_index_max_entries(), 1_310_720);
        assert_eq!(c.time_index_max_entries(), 873_813);
    }

    #[test]
    fn out_of_range_settings_are_rejected() {
        let c = LogConfig {
            segment_bytes: 1,
            ..LogConfig::default()
        };
        assert_eq!(c.validate(), Err(ConfigError::SegmentBytes(1)));
        let c = LogConfig {
            segment_index_bytes: 8,
            ..LogConfig::default()
        };
        assert!(c.validate().is_err());
        let c = LogConfig {
            flush: FlushPolicy::Interval { messages: 0, ms: 5 },
            ..LogConfig::default()
        };
        assert_eq!(c.validate(), Err(ConfigError::FlushInterval));
    }

    #[test]
    fn compact_only_turns_retention_off() {
        let mut c = LogConfig {
            retention_ms: Some(1000),
            retention_bytes: Some(10),
            ..LogConfig::default()
        };
        assert_eq!(c.effective_retention(), (Some(1000), Some(10)));
        c.cleanup = CleanupPolicy {
            delete: false,
            compact: true,
        };
        assert_eq!(c.effective_retention(), (None, None));
        assert_eq!(c.cleanup.kafka_value(), "compact");
        c.cleanup.delete = true;
        assert_eq!(c.effective_retention(), (Some(1000), Some(10)));
        assert_eq!(c.cleanup.kafka_value(), "compact,delete");
    }
}
