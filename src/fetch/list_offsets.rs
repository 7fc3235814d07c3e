//! ListOffsets as a consumer (replica id -1, READ_UNCOMMITTED): the source's log start, its
//! high watermark, or the first offset at or after a timestamp. Request building and answer
//! reading only; the blocking client sends it to the partition's leader.

use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, ListOffsetsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::ids::{Offset, TimestampMs, TopicPartition};

/// Kafka's special ListOffsets timestamps.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;

/// Which offset to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetQuery {
    /// The log start offset.
    Earliest,
    /// The high watermark (the next offset a READ_UNCOMMITTED consumer would see).
    Latest,
    /// The first offset whose record timestamp is at or after this one.
    Timestamp(TimestampMs),
}

impl OffsetQuery {
    fn wire(self) -> i64 {
        match self {
            OffsetQuery::Earliest => EARLIEST,
            OffsetQuery::Latest => LATEST,
            OffsetQuery::Timestamp(t) => t.0,
        }
    }
}

/// One partition's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listed {
    At(Offset),
    /// A timestamp query past every record.
    NoneAfter,
    /// The broker's error code for this partition.
    Error(i16),
}

pub fn request(tps: &[TopicPartition], query: OffsetQuery) -> ListOffsetsRequest {
    let mut topics: Vec<ListOffsetsTopic> = Vec::new();
    for tp in tps {
        let mut part = ListOffsetsPartition::default();
        part.partition_index = tp.partition;
        part.current_leader_epoch = -1;
        part.timestamp = query.wire();
        match topics.iter_mut().find(|t| t.name.as_str() == tp.topic) {
            Some(t) => t.partitions.push(part),
            None => {
                let mut t = ListOffsetsTopic::default();
                t.name = TopicName(StrBytes::from_string(tp.topic.clone()));
                t.partitions.push(part);
                topics.push(t);
            }
        }
    }
    let mut req = ListOffsetsRequest::default();
    req.replica_id = BrokerId(-1);
    req.isolation_level = 0;
    req.topics = topics;
    req
}

/// The answer for every partition asked about; one the broker left out is reported as
/// UNKNOWN_TOPIC_OR_PARTITION (3).
pub fn answers(
    asked: &[TopicPartition],
    resp: &ListOffsetsResponse,
) -> Vec<(TopicPartition, Listed)> {
    // Indexed once: a start of thousands of partitions asks about all of them in one request.
    let by_partition: std::collections::HashMap<(&str, i32), _> = resp
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| ((t.name.as_str(), p.partition_index), p))
        })
        .collect();
    asked
        .iter()
        .map(|tp| {
            let found = by_partition.get(&(tp.topic.as_str(), tp.partition));
            let listed = match found {
                None => Listed::Error(3),
                Some(p) if p.error_code != 0 => Listed::Error(p.error_code),
                Some(p) if p.offset < 0 => Listed::NoneAfter,
                Some(p) => Listed::At(Offset(p.offset)),
            };
            (tp.clone(), listed)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::list_offsets_response::{
        ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
    };

    #[test]
    fn groups_by_topic_and_reads_each_answer() {
        let tps = [
            TopicPartition::new("a", 0),
            TopicPartition::new("a", 1),
            TopicPartition::new("b", 0),
        ];
        let req = request(&tps, OffsetQuery::Timestamp(TimestampMs(5)));
        assert_eq!(req.topics.len(), 2);
        assert_eq!(req.topics[0].partitions[1].timestamp, 5);
        let mut resp = ListOffsetsResponse::default();
        let mut t = ListOffsetsTopicResponse::default();
        t.name = TopicName(StrBytes::from_static_str("a"));
        let mut p0 = ListOffsetsPartitionResponse::default();
        p0.offset = 42;
        let mut p1 = ListOffsetsPartitionResponse::default();
        p1.partition_index = 1;
        p1.offset = -1;
        t.partitions = vec![p0, p1];
        resp.topics.push(t);
        assert_eq!(
            answers(&tps, &resp)
                .into_iter()
                .map(|(_, l)| l)
                .collect::<Vec<_>>(),
            [Listed::At(Offset(42)), Listed::NoneAfter, Listed::Error(3)]
        );
    }
}
