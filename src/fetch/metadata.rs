//! Source cluster metadata: brokers, topics, partitions, leaders, leader epochs, topic ids.
//!
//! Used on the control thread (it allocates freely) to decide which source broker each mirrored
//! partition is fetched from, with which current leader epoch and topic id.

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;

use crate::ids::LeaderEpoch;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata response failed with error code {0}")]
    Broker(i16),
    #[error("metadata response names a topic without a name")]
    NamelessTopic,
}

/// One broker of the source cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    pub node_id: i32,
    pub host: String,
    pub port: u16,
    pub rack: Option<String>,
}

/// One partition as the source sees it. `error` is the Kafka error code (0 = none);
/// `leader` is `None` while the partition has no leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    pub partition: i32,
    pub leader: Option<i32>,
    /// `LeaderEpoch::NONE` before Metadata v7.
    pub leader_epoch: LeaderEpoch,
    pub error: i16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    /// `Uuid::nil()` before Metadata v10 (source older than 2.8).
    pub topic_id: Uuid,
    pub is_internal: bool,
    pub error: i16,
    pub partitions: Vec<PartitionInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterMetadata {
    pub cluster_id: Option<String>,
    pub controller_id: Option<i32>,
    pub brokers: Vec<BrokerInfo>,
    pub topics: Vec<TopicInfo>,
}

impl ClusterMetadata {
    pub fn topic(&self, name: &str) -> Option<&TopicInfo> {
        self.topics.iter().find(|t| t.name == name)
    }

    pub fn broker(&self, node_id: i32) -> Option<&BrokerInfo> {
        self.brokers.iter().find(|b| b.node_id == node_id)
    }

    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionInfo> {
        self.topic(topic)?
            .partitions
            .iter()
            .find(|p| p.partition == partition)
    }
}

/// A request for the named topics, or for all topics when `topics` is `None`. Never asks the
/// source to auto-create a topic: a mirror must not change its source.
pub fn metadata_request(topics: Option<&[&str]>) -> MetadataRequest {
    let mut req = MetadataRequest::default();
    req.allow_auto_topic_creation = false;
    req.topics = topics.map(|names| {
        names
            .iter()
            .map(|n| {
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string((*n).to_owned()))))
            })
            .collect()
    });
    req
}

/// Read a Metadata response (any version from `wire::api::METADATA`).
pub fn parse_metadata(resp: &MetadataResponse) -> Result<ClusterMetadata, MetadataError> {
    // Only v13+ has a top-level error code; earlier versions leave it 0.
    if resp.error_code != 0 {
        return Err(MetadataError::Broker(resp.error_code));
    }
    let brokers = resp
        .brokers
        .iter()
        .map(|b| BrokerInfo {
            node_id: b.node_id.0,
            host: b.host.to_string(),
            port: u16::try_from(b.port).unwrap_or(0),
            rack: b.rack.as_ref().map(|r| r.to_string()),
        })
        .collect();
    let mut topics = Vec::with_capacity(resp.topics.len());
    for t in &resp.topics {
        let name = t
            .name
            .as_ref()
            .ok_or(MetadataError::NamelessTopic)?
            .0
            .to_string();
        let partitions = t
            .partitions
            .iter()
            .map(|p| PartitionInfo {
                partition: p.partition_index,
                leader: (p.leader_id.0 >= 0).then_some(p.leader_id.0),
                leader_epoch: LeaderEpoch(p.leader_epoch.max(-1)),
                error: p.error_code,
            })
            .collect();
        topics.push(TopicInfo {
            name,
            topic_id: t.topic_id,
            is_internal: t.is_internal,
            error: t.error_code,
            partitions,
        });
    }
    Ok(ClusterMetadata {
        cluster_id: resp.cluster_id.as_ref().map(|c| c.to_string()),
        controller_id: (resp.controller_id.0 >= 0).then_some(resp.controller_id.0),
        brokers,
        topics,
    })
}

/// Whether a topic-level metadata error means the topic does not exist (as opposed to a
/// transient condition such as LEADER_NOT_AVAILABLE).
pub fn is_unknown_topic(error: i16) -> bool {
    error == ResponseError::UnknownTopicOrPartition.code()
        || error == ResponseError::UnknownTopicId.code()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::messages::BrokerId;

    #[test]
    fn parses_leaders_epochs_and_ids() {
        let id = Uuid::from_u128(42);
        let mut resp = MetadataResponse::default();
        resp.cluster_id = Some(StrBytes::from_static_str("c1"));
        resp.brokers = vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(1))
            .with_host(StrBytes::from_static_str("h"))
            .with_port(9092)];
        resp.topics = vec![MetadataResponseTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str("t"))))
            .with_topic_id(id)
            .with_partitions(vec![
                MetadataResponsePartition::default()
                    .with_partition_index(0)
                    .with_leader_id(BrokerId(1))
                    .with_leader_epoch(3),
                MetadataResponsePartition::default()
                    .with_partition_index(1)
                    .with_leader_id(BrokerId(-1))
                    .with_error_code(ResponseError::LeaderNotAvailable.code()),
            ])];
        let meta = parse_metadata(&resp).unwrap();
        assert_eq!(meta.cluster_id.as_deref(), Some("c1"));
        assert_eq!(meta.broker(1).unwrap().port, 9092);
        assert_eq!(meta.topic("t").unwrap().topic_id, id);
        let p0 = meta.partition("t", 0).unwrap();
        assert_eq!((p0.leader, p0.leader_epoch), (Some(1), LeaderEpoch(3)));
        assert_eq!(meta.partition("t", 1).unwrap().leader, None);
    }

    #[test]
    fn request_never_auto_creates() {
        let req = metadata_request(Some(&["a", "b"]));
        assert!(!req.allow_auto_topic_creation);
        assert_eq!(req.topics.unwrap().len(), 2);
        assert!(metadata_request(None).topics.is_none());
    }
}
