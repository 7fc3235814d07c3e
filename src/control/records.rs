//! The keys and values of `__mirror_state` records.
//!
//! Key: a big-endian int16 record type (KIP-1279's coordinator-record framing, kip1279.md §6)
//! followed by the key fields as compact JSON. Value: the value fields as compact JSON; a null
//! value is a tombstone. JSON keeps the log readable with Kafka's own DumpLogSegments
//! (`--print-data-log`) and lets fields be added without a version dance; the records are few
//! and small, so the size does not matter.
//!
//! | type | key fields                      | value                                         |
//! |------|---------------------------------|-----------------------------------------------|
//! | 1    | mirror, topic, partition        | last mirror epoch and end offset at stop      |
//! | 2    | mirror, topic, partition        | partition state (state, previous, retry...)  |
//! | 100  | mirror                          | mirror definition + source cluster id, topics |
//! | 101  | mirror                          | mirror epoch                                  |
//! | 102  | mirror, topic                   | the topic configs copied from the source      |
//! | 110  | mirror, acl                     | an ACL synced from the source (when it came)  |
//!
//! Types 1 and 2 carry the KIP's numbers and meaning; 100, 101, 102 and 110 are kmirror's own (the KIP
//! keeps mirror definitions in the KRaft metadata log, which kmirror does not have).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::control::mirror_def::{MirrorDefinition, MirrorName};
use crate::control::state::{Failure, PartitionMachine, Retry, StateName};
use crate::ids::{MirrorEpoch, Offset, TopicPartition};
use crate::serve::authz::acl::AclBinding;

pub const TYPE_LAST_MIRROR_EPOCH: i16 = 1;
pub const TYPE_PARTITION_STATE: i16 = 2;
pub const TYPE_MIRROR: i16 = 100;
pub const TYPE_MIRROR_EPOCH: i16 = 101;
pub const TYPE_TOPIC_CONFIGS: i16 = 102;
pub const TYPE_SYNCED_ACL: i16 = 110;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordCodecError {
    #[error("record key is shorter than its type field")]
    ShortKey,
    #[error("record type {0} is unknown")]
    UnknownType(i16),
    #[error("record type {kind}: {reason}")]
    Json { kind: i16, reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct MirrorKeyFields {
    mirror: MirrorName,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct TopicKeyFields {
    mirror: MirrorName,
    topic: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct AclKeyFields {
    mirror: MirrorName,
    acl: AclBinding,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct PartitionKeyFields {
    mirror: MirrorName,
    topic: String,
    partition: i32,
}

/// Which record a key names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StateKey {
    LastMirrorEpoch(MirrorName, TopicPartition),
    Partition(MirrorName, TopicPartition),
    Mirror(MirrorName),
    MirrorEpoch(MirrorName),
    /// A mirrored topic's configs as copied from the source.
    TopicConfigs(MirrorName, String),
    /// An ACL synced from the mirror's source (`control::acl_sync`).
    SyncedAcl(MirrorName, AclBinding),
}

impl StateKey {
    pub fn mirror(&self) -> &MirrorName {
        match self {
            StateKey::LastMirrorEpoch(m, _)
            | StateKey::Partition(m, _)
            | StateKey::Mirror(m)
            | StateKey::MirrorEpoch(m)
            | StateKey::TopicConfigs(m, _)
            | StateKey::SyncedAcl(m, _) => m,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let (kind, json) = match self {
            StateKey::LastMirrorEpoch(m, tp) | StateKey::Partition(m, tp) => {
                let kind = if matches!(self, StateKey::Partition(..)) {
                    TYPE_PARTITION_STATE
                } else {
                    TYPE_LAST_MIRROR_EPOCH
                };
                let fields = PartitionKeyFields {
                    mirror: m.clone(),
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                };
                (kind, serde_json::to_vec(&fields))
            }
            StateKey::Mirror(m) | StateKey::MirrorEpoch(m) => {
                let kind = if matches!(self, StateKey::Mirror(_)) {
                    TYPE_MIRROR
                } else {
                    TYPE_MIRROR_EPOCH
                };
                (
                    kind,
                    serde_json::to_vec(&MirrorKeyFields { mirror: m.clone() }),
                )
            }
            StateKey::TopicConfigs(m, topic) => (
                TYPE_TOPIC_CONFIGS,
                serde_json::to_vec(&TopicKeyFields {
                    mirror: m.clone(),
                    topic: topic.clone(),
                }),
            ),
            StateKey::SyncedAcl(m, acl) => (
                TYPE_SYNCED_ACL,
                serde_json::to_vec(&AclKeyFields {
                    mirror: m.clone(),
                    acl: acl.clone(),
                }),
            ),
        };
        // Serialising plain structs of strings and integers cannot fail.
        let json = json.unwrap_or_default();
        let mut out = Vec::with_capacity(2 + json.len());
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&json);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<StateKey, RecordCodecError> {
        if bytes.len() < 2 {
            return Err(RecordCodecError::ShortKey);
        }
        let kind = i16::from_be_bytes([bytes[0], bytes[1]]);
        let json = &bytes[2..];
        let err = |e: serde_json::Error| RecordCodecError::Json {
            kind,
            reason: e.to_string(),
        };
        match kind {
            TYPE_LAST_MIRROR_EPOCH | TYPE_PARTITION_STATE => {
                let f: PartitionKeyFields = serde_json::from_slice(json).map_err(err)?;
                let tp = TopicPartition::new(f.topic, f.partition);
                Ok(if kind == TYPE_PARTITION_STATE {
                    StateKey::Partition(f.mirror, tp)
                } else {
                    StateKey::LastMirrorEpoch(f.mirror, tp)
                })
            }
            TYPE_MIRROR | TYPE_MIRROR_EPOCH => {
                let f: MirrorKeyFields = serde_json::from_slice(json).map_err(err)?;
                Ok(if kind == TYPE_MIRROR {
                    StateKey::Mirror(f.mirror)
                } else {
                    StateKey::MirrorEpoch(f.mirror)
                })
            }
            TYPE_TOPIC_CONFIGS => {
                let f: TopicKeyFields = serde_json::from_slice(json).map_err(err)?;
                Ok(StateKey::TopicConfigs(f.mirror, f.topic))
            }
            TYPE_SYNCED_ACL => {
                let f: AclKeyFields = serde_json::from_slice(json).map_err(err)?;
                // Checked like an ACL from CreateAcls: never a silently different one.
                f.acl.validate().map_err(|e| RecordCodecError::Json {
                    kind,
                    reason: e.to_string(),
                })?;
                Ok(StateKey::SyncedAcl(f.mirror, f.acl))
            }
            other => Err(RecordCodecError::UnknownType(other)),
        }
    }

    fn kind(&self) -> i16 {
        match self {
            StateKey::LastMirrorEpoch(..) => TYPE_LAST_MIRROR_EPOCH,
            StateKey::Partition(..) => TYPE_PARTITION_STATE,
            StateKey::Mirror(_) => TYPE_MIRROR,
            StateKey::MirrorEpoch(_) => TYPE_MIRROR_EPOCH,
            StateKey::TopicConfigs(..) => TYPE_TOPIC_CONFIGS,
            StateKey::SyncedAcl(..) => TYPE_SYNCED_ACL,
        }
    }
}

/// A mirror as stored: its definition, what start commands added, and facts learned from the
/// source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorRecord {
    pub definition: MirrorDefinition,
    /// The source cluster id seen at the first successful connection; a change is fatal
    /// (except through `mirrors repoint`, which checks the new source's history first).
    pub source_cluster_id: Option<String>,
    /// The sources followed before the current one, oldest first (`control::lineage`); empty
    /// for a mirror never re-pointed (records written before lineage existed read so too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lineage: Vec<crate::control::lineage::Hop>,
}

/// Type 1 value: where the partition stood when it was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastMirrorEpochValue {
    pub mirror_epoch: i32,
    pub end_offset: i64,
}

/// Type 2 value, with the KIP's fields (state by name; retry_attempt -1 = non-retryable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionStateValue {
    pub topic_id: Uuid,
    pub state: StateName,
    pub previous_state: Option<StateName>,
    pub retry_attempt: i32,
    pub error_message: Option<String>,
    pub failed_at_ms: i64,
}

impl PartitionStateValue {
    pub fn from_machine(topic_id: Uuid, m: &PartitionMachine) -> Option<PartitionStateValue> {
        let state = m.state()?;
        let f = m.failure();
        Some(PartitionStateValue {
            topic_id,
            state,
            previous_state: f.map(|f| f.previous),
            retry_attempt: f.map_or(0, |f| f.retry.as_kip_value()),
            error_message: f.map(|f| f.message.clone()),
            failed_at_ms: f.map_or(0, |f| f.failed_at_ms),
        })
    }

    /// The machine this value describes; `None` when the fields contradict each other.
    pub fn to_machine(&self) -> Option<PartitionMachine> {
        let failure = match (self.state, self.previous_state) {
            (StateName::Failed, Some(previous)) => Some(Failure {
                previous,
                retry: if self.retry_attempt < 0 {
                    Retry::NonRetryable
                } else {
                    Retry::Attempt(u16::try_from(self.retry_attempt).ok()?)
                },
                message: self.error_message.clone().unwrap_or_default(),
                failed_at_ms: self.failed_at_ms,
            }),
            (StateName::Failed, None) => return None,
            _ => None,
        };
        PartitionMachine::restore(self.state, failure)
    }
}

/// A decoded record value, matching its key's type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateValue {
    LastMirrorEpoch(LastMirrorEpochValue),
    Partition(PartitionStateValue),
    Mirror(Box<MirrorRecord>),
    MirrorEpoch(MirrorEpoch),
    TopicConfigs(TopicConfigsValue),
    SyncedAcl(SyncedAclValue),
}

/// Type 110 value: when the ACL was first synced (wall-clock ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncedAclValue {
    pub synced_at_ms: i64,
}

/// Type 102 value: the copied configs (already filtered, see `control::topic_configs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfigsValue {
    pub configs: BTreeMap<String, String>,
    /// The topic's upstream chain (`control::lineage::chain`); absent in records written
    /// before lineage was kept per topic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lineage: Vec<crate::control::lineage::chain::Link>,
}

#[derive(Serialize, Deserialize)]
struct MirrorEpochJson {
    epoch: i32,
}

impl StateValue {
    pub fn encode(&self) -> Vec<u8> {
        let json = match self {
            StateValue::LastMirrorEpoch(v) => serde_json::to_vec(v),
            StateValue::Partition(v) => serde_json::to_vec(v),
            StateValue::Mirror(v) => serde_json::to_vec(v),
            StateValue::MirrorEpoch(e) => serde_json::to_vec(&MirrorEpochJson { epoch: e.0 }),
            StateValue::TopicConfigs(v) => serde_json::to_vec(v),
            StateValue::SyncedAcl(v) => serde_json::to_vec(v),
        };
        // Our value types hold only strings, numbers, enums and maps with string keys.
        json.unwrap_or_default()
    }

    pub fn decode(key: &StateKey, bytes: &[u8]) -> Result<StateValue, RecordCodecError> {
        let kind = key.kind();
        let err = |e: serde_json::Error| RecordCodecError::Json {
            kind,
            reason: e.to_string(),
        };
        Ok(match key {
            StateKey::LastMirrorEpoch(..) => {
                StateValue::LastMirrorEpoch(serde_json::from_slice(bytes).map_err(err)?)
            }
            StateKey::Partition(..) => {
                StateValue::Partition(serde_json::from_slice(bytes).map_err(err)?)
            }
            StateKey::Mirror(_) => StateValue::Mirror(serde_json::from_slice(bytes).map_err(err)?),
            StateKey::MirrorEpoch(_) => {
                let v: MirrorEpochJson = serde_json::from_slice(bytes).map_err(err)?;
                StateValue::MirrorEpoch(MirrorEpoch(v.epoch))
            }
            StateKey::TopicConfigs(..) => {
                StateValue::TopicConfigs(serde_json::from_slice(bytes).map_err(err)?)
            }
            StateKey::SyncedAcl(..) => {
                StateValue::SyncedAcl(serde_json::from_slice(bytes).map_err(err)?)
            }
        })
    }
}

/// The end offset recorded at stop, typed.
pub fn last_mirror_epoch(epoch: MirrorEpoch, end: Offset) -> StateValue {
    StateValue::LastMirrorEpoch(LastMirrorEpochValue {
        mirror_epoch: epoch.0,
        end_offset: end.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> MirrorName {
        MirrorName::new("m").unwrap()
    }

    #[test]
    fn keys_round_trip_and_start_with_the_type() {
        let keys = [
            StateKey::LastMirrorEpoch(name(), TopicPartition::new("t", 3)),
            StateKey::Partition(name(), TopicPartition::new("t", 3)),
            StateKey::Mirror(name()),
            StateKey::MirrorEpoch(name()),
            StateKey::TopicConfigs(name(), "t".into()),
        ];
        for (k, kind) in keys.iter().zip([1i16, 2, 100, 101, 102]) {
            let bytes = k.encode();
            assert_eq!(i16::from_be_bytes([bytes[0], bytes[1]]), kind);
            assert_eq!(&StateKey::decode(&bytes).unwrap(), k);
        }
        assert_eq!(
            StateKey::Partition(name(), TopicPartition::new("t", 3)).encode()[2..],
            *br#"{"mirror":"m","topic":"t","partition":3}"#
        );
        assert_eq!(
            StateKey::decode(&[0, 9, b'{', b'}']),
            Err(RecordCodecError::UnknownType(9))
        );
        assert_eq!(StateKey::decode(&[0]), Err(RecordCodecError::ShortKey));
        assert_eq!(
            StateKey::TopicConfigs(name(), "t".into()).encode()[2..],
            *br#"{"mirror":"m","topic":"t"}"#
        );
        let key = StateKey::TopicConfigs(name(), "t".into());
        let value = StateValue::TopicConfigs(TopicConfigsValue {
            configs: [("retention.ms".to_owned(), "60000".to_owned())].into(),
            lineage: vec![crate::control::lineage::chain::Link {
                cluster_id: Some("AAAAAAAAAAAAAAAAAAAAAA".into()),
                mirror_epoch: 2,
            }],
        });
        assert_eq!(
            StateValue::decode(&key, &value.encode()).unwrap(),
            value,
            "type 102 value round-trips"
        );
        assert!(StateKey::decode(&[0, 100, b'{', b'"', b'm']).is_err());
        let acl = AclBinding::from_wire(2, "t", 3, "User:a", "*", 3, 3).unwrap();
        let key = StateKey::SyncedAcl(name(), acl.clone());
        let bytes = key.encode();
        assert_eq!(i16::from_be_bytes([bytes[0], bytes[1]]), 110);
        assert_eq!(StateKey::decode(&bytes).unwrap(), key);
        let value = StateValue::SyncedAcl(SyncedAclValue { synced_at_ms: 7 });
        assert_eq!(StateValue::decode(&key, &value.encode()).unwrap(), value);
        // A stored ACL that does not validate is an error, not a different ACL.
        let mut bad = acl;
        bad.entry.principal = "nobody".into();
        let json = serde_json::to_vec(&AclKeyFields {
            mirror: name(),
            acl: bad,
        })
        .unwrap();
        let mut bytes = 110i16.to_be_bytes().to_vec();
        bytes.extend_from_slice(&json);
        assert!(StateKey::decode(&bytes).is_err());
    }

    #[test]
    fn failed_partition_value_keeps_retry_fields() {
        let mut m = PartitionMachine::new();
        let p = crate::control::state::RetryPolicy::default();
        m.command(crate::control::state::Command::Start).unwrap();
        m.event(
            crate::control::state::Event::Failed {
                message: "source topic is deleted".into(),
                retryable: false,
                now_ms: 7,
            },
            &p,
        )
        .unwrap();
        let v = PartitionStateValue::from_machine(Uuid::from_u128(5), &m).unwrap();
        assert_eq!(v.retry_attempt, -1);
        assert_eq!(v.previous_state, Some(StateName::LogAlignment));
        let bytes = StateValue::Partition(v.clone()).encode();
        let key = StateKey::Partition(name(), TopicPartition::new("t", 0));
        let StateValue::Partition(back) = StateValue::decode(&key, &bytes).unwrap() else {
            panic!("wrong value type");
        };
        let restored = back.to_machine().unwrap();
        assert_eq!(
            (restored.state(), restored.failure()),
            (m.state(), m.failure())
        );
    }
}
