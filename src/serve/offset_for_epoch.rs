//! OffsetForLeaderEpoch (consumer form): the end offset of a leader epoch from the published
//! epochs, which are the source's (batches keep their epochs). Java consumers use it to check
//! their position after a leader epoch change (KIP-320).

use std::sync::Arc;

use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};

use crate::ids::{LeaderEpoch, TopicPartition};
use crate::log::read_view::ReadCatalog;
use crate::serve::authz::acl::{Operation, ResourceType};
use crate::serve::dispatch::{ApiHandler, Outcome, Request};
use crate::serve::fetch::{FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH};
use crate::serve::metadata::{TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION};
use crate::serve::ServeError;

pub struct OffsetForEpochApi {
    pub catalog: Arc<ReadCatalog>,
}

impl ApiHandler for OffsetForEpochApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request: OffsetForLeaderEpochRequest = req.decode()?;
        let mut resp = OffsetForLeaderEpochResponse::default();
        for t in &request.topics {
            let mut tr = OffsetForLeaderTopicResult::default();
            tr.topic = t.topic.clone();
            for p in &t.partitions {
                let mut e = EpochEndOffset::default();
                e.partition = p.partition;
                e.leader_epoch = -1;
                e.end_offset = -1;
                let tp = TopicPartition::new(t.topic.0.to_string(), p.partition);
                // DESCRIBE on the topic, per partition (Kafka's consumer form; kmirror has no
                // replicas, so the replica form's CLUSTER_ACTION never applies).
                if !req.authorized(Operation::Describe, ResourceType::Topic, &tp.topic) {
                    e.error_code = TOPIC_AUTHORIZATION_FAILED;
                    tr.partitions.push(e);
                    continue;
                }
                match self.catalog.get(&tp).map(|h| h.view()) {
                    None => e.error_code = UNKNOWN_TOPIC_OR_PARTITION,
                    Some(view) => {
                        let ours = view.leader_epoch().0;
                        if p.current_leader_epoch >= 0 && p.current_leader_epoch < ours {
                            e.error_code = FENCED_LEADER_EPOCH;
                        } else if p.current_leader_epoch > ours {
                            e.error_code = UNKNOWN_LEADER_EPOCH;
                        } else {
                            let (epoch, end) = view.end_offset_for(LeaderEpoch(p.leader_epoch));
                            e.leader_epoch = epoch.0;
                            e.end_offset = end.0;
                        }
                    }
                }
                tr.partitions.push(e);
            }
            resp.topics.push(tr);
        }
        Outcome::encode(req, &resp)
    }
}
