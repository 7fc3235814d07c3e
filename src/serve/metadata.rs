//! Metadata: kmirror is the single broker, the controller, and the leader (and only replica)
//! of every partition it stores, at the partition's latest leader epoch (the source's, since
//! batches keep their epochs; see `PartitionReadView::leader_epoch`). Topic ids are the
//! source's, from `partition.metadata`.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use crate::log::read_view::{PartitionHandle, ReadCatalog};
use crate::serve::dispatch::{ApiHandler, Outcome, Request};
use crate::serve::{ServeError, NODE_ID};

/// UNKNOWN_TOPIC_OR_PARTITION.
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
/// UNKNOWN_TOPIC_ID.
pub const UNKNOWN_TOPIC_ID: i16 = 100;

/// The cluster id kmirror reports (it is its own one-broker cluster).
pub const CLUSTER_ID: &str = "kmirror";

/// The catalog grouped by topic: name → (topic id, partitions in order).
pub type Topics = BTreeMap<String, (Option<Uuid>, Vec<(i32, Arc<PartitionHandle>)>)>;

pub fn topics(catalog: &ReadCatalog) -> Topics {
    let mut out: Topics = BTreeMap::new();
    for (tp, handle) in catalog.snapshot().iter() {
        let entry = out
            .entry(tp.topic.clone())
            .or_insert_with(|| (None, Vec::new()));
        if entry.0.is_none() {
            entry.0 = handle.view().topic_id;
        }
        entry.1.push((tp.partition, Arc::clone(handle)));
    }
    out
}

/// The topic name of `id`, if kmirror stores that topic.
pub fn topic_by_id(topics: &Topics, id: Uuid) -> Option<&str> {
    topics
        .iter()
        .find(|(_, (tid, _))| *tid == Some(id))
        .map(|(name, _)| name.as_str())
}

pub struct MetadataApi {
    pub catalog: Arc<ReadCatalog>,
    pub host: String,
    pub port: i32,
}

impl ApiHandler for MetadataApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request: MetadataRequest = req.decode()?;
        let topics = topics(&self.catalog);
        let mut resp = MetadataResponse::default();
        let mut broker = MetadataResponseBroker::default();
        broker.node_id = BrokerId(NODE_ID);
        broker.host = StrBytes::from_string(self.host.clone());
        broker.port = self.port;
        resp.brokers = vec![broker];
        resp.cluster_id = Some(StrBytes::from_static_str(CLUSTER_ID));
        resp.controller_id = BrokerId(NODE_ID);
        // v0: an empty list means every topic; v1+: null does.
        let wanted: Option<Vec<(Option<String>, Uuid)>> = match request.topics {
            None => None,
            Some(t) if t.is_empty() && req.version == 0 => None,
            Some(t) => Some(
                t.into_iter()
                    .map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id))
                    .collect(),
            ),
        };
        resp.topics = match wanted {
            None => topics
                .iter()
                .map(|(name, (id, parts))| topic_entry(name, *id, parts))
                .collect(),
            Some(list) => list
                .into_iter()
                .map(|(name, id)| {
                    let name = name.or_else(|| topic_by_id(&topics, id).map(str::to_string));
                    match name.as_ref().and_then(|n| topics.get(n).map(|t| (n, t))) {
                        Some((n, (tid, parts))) => topic_entry(n, *tid, parts),
                        None => {
                            let mut t = MetadataResponseTopic::default();
                            t.error_code = if name.is_none() {
                                UNKNOWN_TOPIC_ID
                            } else {
                                UNKNOWN_TOPIC_OR_PARTITION
                            };
                            t.name = name.map(|n| TopicName(StrBytes::from_string(n)));
                            t.topic_id = id;
                            t
                        }
                    }
                })
                .collect(),
        };
        Outcome::encode(req, &resp)
    }
}

fn topic_entry(
    name: &str,
    id: Option<Uuid>,
    parts: &[(i32, Arc<PartitionHandle>)],
) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.name = Some(TopicName(StrBytes::from_string(name.to_string())));
    t.topic_id = id.unwrap_or(Uuid::nil());
    t.partitions = parts
        .iter()
        .map(|(p, handle)| {
            let mut m = MetadataResponsePartition::default();
            m.partition_index = *p;
            m.leader_id = BrokerId(NODE_ID);
            m.leader_epoch = handle.view().leader_epoch().0;
            m.replica_nodes = vec![BrokerId(NODE_ID)];
            m.isr_nodes = vec![BrokerId(NODE_ID)];
            m
        })
        .collect();
    t
}
