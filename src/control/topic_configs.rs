//! Topic configs copied from the source (kip1279.md §4): which of a source topic's configs a
//! mirror copies, and how the copied ones become the local partition logs' `LogConfig`.
//!
//! `apply` always starts from the partition's base config (the log dir's default), so a config
//! removed on the source reverts locally too.
//!
//! Only the topic's own dynamic overrides are copied (DescribeConfigs source
//! DYNAMIC_TOPIC_CONFIG): broker defaults and static settings describe the source's brokers,
//! not the topic. Of those, `NEVER_COPIED` is dropped always and the mirror's
//! `mirror.topic.properties.exclude` on top. kmirror applies the six settings in `APPLIED`; the
//! other copied configs are kept in `__mirror_state` (so a later version can apply them) but
//! change nothing locally.

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::control::mirror_def::MirrorDefinition;
use crate::log::config::{CleanupPolicy, ConfigError, LogConfig};

/// A topic's copied configs, by Kafka name.
pub type TopicConfigs = BTreeMap<String, String>;

/// DescribeConfigs version used on the source: v1 is the first with `config_source` (needed
/// to tell a topic override from a broker default) and is served from Kafka 1.1 through 4.x
/// (4.0 removed only v0).
pub const DESCRIBE_CONFIGS_VERSION: i16 = 1;
/// ConfigResource type TOPIC.
const RESOURCE_TOPIC: i8 = 2;
/// ConfigSource DYNAMIC_TOPIC_CONFIG: an override set on the topic itself.
pub const SOURCE_DYNAMIC_TOPIC: i8 = 1;

/// Configs a mirror never copies, whatever its `mirror.topic.properties.exclude` says, with the
/// reason. They describe the source's brokers, replicas or storage tiers, not the topic's data,
/// and applied to kmirror they would be wrong or meaningless.
pub const NEVER_COPIED: [(&str, &str); 14] = [
    (
        "leader.replication.throttled.replicas",
        "a replication throttle names the source's brokers and slows their replication",
    ),
    (
        "follower.replication.throttled.replicas",
        "a replication throttle names the source's brokers and slows their replication",
    ),
    (
        "unclean.leader.election.enable",
        "leader election among the source's replicas; kmirror has one copy and elects nobody",
    ),
    (
        "min.insync.replicas",
        "the source's ISR durability rule for acks=all; kmirror's copy has one replica",
    ),
    (
        "confluent.placement.constraints",
        "replica placement on the source's racks",
    ),
    (
        "remote.storage.enable",
        "tiered storage of the source's brokers; kmirror keeps every segment local",
    ),
    (
        "local.retention.ms",
        "the local tier of the source's tiered storage",
    ),
    (
        "local.retention.bytes",
        "the local tier of the source's tiered storage",
    ),
    (
        "remote.log.copy.disable",
        "the remote tier of the source's tiered storage",
    ),
    (
        "remote.log.delete.on.disable",
        "the remote tier of the source's tiered storage",
    ),
    (
        "flush.messages",
        "fsync policy of the source's disks; kmirror's durability is its own setting",
    ),
    (
        "flush.ms",
        "fsync policy of the source's disks; kmirror's durability is its own setting",
    ),
    (
        "file.delete.delay.ms",
        "housekeeping timing of the source's log dirs",
    ),
    (
        crate::control::lineage::chain::LINEAGE_CONFIG,
        "a kmirror source's lineage of the topic: recorded as the topic's upstream chain (control::lineage::chain), never a config",
    ),
];

/// The copied configs kmirror applies to its partition logs.
pub const APPLIED: [&str; 6] = [
    "retention.ms",
    "retention.bytes",
    "segment.bytes",
    "segment.ms",
    "cleanup.policy",
    "max.message.bytes",
];

/// One config entry as the source described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfigEntry {
    pub name: String,
    pub value: Option<String>,
    pub source: i8,
}

/// A copied config kmirror cannot apply; the log keeps its previous settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicConfigError {
    #[error("{key}={value} from the source is not a valid {key}: {reason}")]
    Parse {
        key: &'static str,
        value: String,
        reason: String,
    },
    #[error("copied topic configs refused: {0}")]
    Invalid(#[from] ConfigError),
}

/// Why a key is never copied, when it is one of `NEVER_COPIED`.
pub fn never_copied(key: &str) -> Option<&'static str> {
    NEVER_COPIED
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, why)| *why)
}

/// The configs of one source topic that `mirror` copies: dynamic topic overrides with a value,
/// minus `NEVER_COPIED` and the mirror's own exclusions.
pub fn copied(mirror: &MirrorDefinition, entries: &[SourceConfigEntry]) -> TopicConfigs {
    entries
        .iter()
        .filter(|e| e.source == SOURCE_DYNAMIC_TOPIC)
        .filter(|e| never_copied(&e.name).is_none() && mirror.copies_topic_property(&e.name))
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect()
}

fn parse_i64(key: &'static str, value: &str) -> Result<i64, TopicConfigError> {
    value
        .trim()
        .parse::<i64>()
        .map_err(|e| TopicConfigError::Parse {
            key,
            value: value.to_owned(),
            reason: e.to_string(),
        })
}

fn bad(key: &'static str, value: &str, reason: &str) -> TopicConfigError {
    TopicConfigError::Parse {
        key,
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

/// `base` with the copied configs applied (a key the source no longer overrides takes
/// `base`'s value again), validated; all of `configs` are kept in `topic_configs`.
pub fn apply(base: &LogConfig, configs: &TopicConfigs) -> Result<LogConfig, TopicConfigError> {
    let mut c = base.clone();
    c.topic_configs = configs.clone();
    for key in APPLIED {
        let Some(value) = configs.get(key) else {
            continue;
        };
        match key {
            "retention.ms" => {
                let ms = parse_i64(key, value)?;
                c.retention_ms = match ms {
                    -1 => None,
                    ms if ms > 0 => Some(ms),
                    _ => return Err(bad(key, value, "must be -1 (unlimited) or positive")),
                };
            }
            "retention.bytes" => {
                let b = parse_i64(key, value)?;
                c.retention_bytes = match b {
                    -1 => None,
                    b if b >= 0 => Some(b as u64),
                    _ => return Err(bad(key, value, "must be -1 (unlimited) or at least 0")),
                };
            }
            "segment.bytes" => {
                let b = parse_i64(key, value)?;
                c.segment_bytes =
                    u64::try_from(b).map_err(|_| bad(key, value, "must not be negative"))?;
            }
            "segment.ms" => c.segment_ms = parse_i64(key, value)?,
            "cleanup.policy" => {
                let mut p = CleanupPolicy {
                    delete: false,
                    compact: false,
                };
                for part in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    match part {
                        "delete" => p.delete = true,
                        "compact" => p.compact = true,
                        _ => return Err(bad(key, value, "only delete and compact are known")),
                    }
                }
                c.cleanup = p;
            }
            "max.message.bytes" => {
                let b = parse_i64(key, value)?;
                c.max_message_bytes = u32::try_from(b)
                    .ok()
                    .filter(|b| i32::try_from(*b).is_ok())
                    .ok_or_else(|| bad(key, value, "must be between 0 and 2147483647"))?;
            }
            // APPLIED lists only the keys matched above.
            _ => continue,
        }
    }
    c.validate()?;
    Ok(c)
}

/// DescribeConfigs for `topics`, every config (no key filter), no synonyms.
pub fn describe_request(topics: &[&str]) -> DescribeConfigsRequest {
    let mut req = DescribeConfigsRequest::default();
    for t in topics {
        let mut r = DescribeConfigsResource::default();
        r.resource_type = RESOURCE_TOPIC;
        r.resource_name = StrBytes::from_string((*t).to_owned());
        r.configuration_keys = None;
        req.resources.push(r);
    }
    req
}

/// Each topic's entries, or the source's error for it (e.g. the topic is gone).
pub fn parse_response(
    resp: &DescribeConfigsResponse,
) -> BTreeMap<String, Result<Vec<SourceConfigEntry>, String>> {
    resp.results
        .iter()
        .filter(|r| r.resource_type == RESOURCE_TOPIC)
        .map(|r| {
            let name = r.resource_name.to_string();
            if r.error_code != 0 {
                let why = r
                    .error_message
                    .as_ref()
                    .map_or_else(String::new, |m| format!(": {m}"));
                return (name, Err(format!("error code {}{why}", r.error_code)));
            }
            let entries = r
                .configs
                .iter()
                .map(|e| SourceConfigEntry {
                    name: e.name.to_string(),
                    value: e.value.as_ref().map(|v| v.to_string()),
                    source: e.config_source,
                })
                .collect();
            (name, Ok(entries))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::mirror_def::MirrorName;

    fn mirror(extra: &str) -> MirrorDefinition {
        let text = format!("bootstrap.servers=src:9092\n{extra}");
        let props = crate::control::mirror_def::parse_properties(&text).unwrap();
        MirrorDefinition::from_properties(MirrorName::new("m").unwrap(), &props).unwrap()
    }

    fn entry(name: &str, value: &str, source: i8) -> SourceConfigEntry {
        SourceConfigEntry {
            name: name.into(),
            value: Some(value.into()),
            source,
        }
    }

    #[test]
    fn only_dynamic_topic_overrides_outside_the_exclusions_are_copied() {
        const STATIC_BROKER: i8 = 4;
        const DEFAULT: i8 = 5;
        let entries = [
            entry("retention.ms", "3600000", SOURCE_DYNAMIC_TOPIC),
            entry("cleanup.policy", "compact", SOURCE_DYNAMIC_TOPIC),
            entry("segment.bytes", "1073741824", DEFAULT),
            entry("max.message.bytes", "2000000", STATIC_BROKER),
            entry(
                "leader.replication.throttled.replicas",
                "0:1",
                SOURCE_DYNAMIC_TOPIC,
            ),
            entry(
                "follower.replication.throttled.replicas",
                "*",
                SOURCE_DYNAMIC_TOPIC,
            ),
            entry("min.insync.replicas", "2", SOURCE_DYNAMIC_TOPIC),
            entry(
                "unclean.leader.election.enable",
                "true",
                SOURCE_DYNAMIC_TOPIC,
            ),
            entry("local.retention.ms", "1000", SOURCE_DYNAMIC_TOPIC),
            entry(
                "message.timestamp.type",
                "LogAppendTime",
                SOURCE_DYNAMIC_TOPIC,
            ),
            entry("compression.type", "zstd", SOURCE_DYNAMIC_TOPIC),
        ];
        let got = copied(&mirror(""), &entries);
        let keys: Vec<&str> = got.keys().map(String::as_str).collect();
        assert_eq!(keys, ["cleanup.policy", "compression.type", "retention.ms"]);
        // An explicit exclusion list replaces Kafka's default one (as in Kafka), so
        // message.timestamp.type is copied again, but NEVER_COPIED still holds.
        let m = mirror("mirror.topic.properties.exclude=compression.type\n");
        let keys: Vec<String> = copied(&m, &entries).into_keys().collect();
        assert_eq!(
            keys,
            ["cleanup.policy", "message.timestamp.type", "retention.ms"]
        );
        assert!(never_copied("min.insync.replicas").is_some());
    }

    #[test]
    fn applied_configs_reach_the_log_config_and_revert_when_dropped() {
        let base = LogConfig::default();
        let configs: TopicConfigs = [
            ("retention.ms", "3600000"),
            ("retention.bytes", "-1"),
            ("segment.bytes", "1048576"),
            ("segment.ms", "600000"),
            ("cleanup.policy", "compact,delete"),
            ("max.message.bytes", "2000000"),
            ("compression.type", "zstd"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let c = apply(&base, &configs).unwrap();
        assert_eq!(c.retention_ms, Some(3_600_000));
        assert_eq!(c.retention_bytes, None);
        assert_eq!(c.segment_bytes, 1_048_576);
        assert_eq!(c.segment_ms, 600_000);
        assert_eq!(
            c.cleanup,
            CleanupPolicy {
                delete: true,
                compact: true
            }
        );
        assert_eq!(c.max_message_bytes, 2_000_000);
        assert_eq!(c.topic_configs, configs);
        let fresh = apply(&base, &TopicConfigs::new()).unwrap();
        assert_eq!(fresh, base);
    }

    #[test]
    fn invalid_values_name_the_key() {
        let one = |k: &str, v: &str| -> TopicConfigs { [(k.to_owned(), v.to_owned())].into() };
        let base = LogConfig::default();
        let e = apply(&base, &one("retention.ms", "soon")).unwrap_err();
        assert!(e.to_string().starts_with("retention.ms=soon"), "{e}");
        assert!(apply(&base, &one("retention.ms", "0")).is_err());
        assert!(apply(&base, &one("retention.bytes", "-2")).is_err());
        assert!(apply(&base, &one("cleanup.policy", "shred")).is_err());
        assert!(apply(&base, &one("max.message.bytes", "-1")).is_err());
        let e = apply(&base, &one("segment.bytes", "3")).unwrap_err();
        assert!(e.to_string().contains("segment.bytes 3"), "{e}");
        let e = apply(&base, &one("segment.ms", "0")).unwrap_err();
        assert!(matches!(e, TopicConfigError::Invalid(_)), "{e}");
    }
}
