//! ListOffsets: earliest (log start), latest (high watermark, or the last stable offset for
//! READ_COMMITTED), max timestamp, and by timestamp through each segment's `.timeindex` and
//! `.index`, then the records of the batch found (Kafka's `fetchOffsetByTimestamp`).

use std::sync::Arc;

use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};

use crate::ids::{Offset, TimestampMs};
use crate::log::partition_log::first_record_at_or_after;
use crate::log::read_view::{PartitionReadView, ReadCatalog};
use crate::log::LogError;
use crate::serve::authz::acl::{Operation, ResourceType};
use crate::serve::dispatch::{ApiHandler, Outcome, Request};
use crate::serve::fetch::{FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH};
use crate::serve::metadata::{TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION};
use crate::serve::segment_reader::OpenSegment;
use crate::serve::ServeError;
use crate::wire::batch::{Batch, Codec, Peek};
use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;

pub struct ListOffsetsApi {
    pub catalog: Arc<ReadCatalog>,
}

impl ApiHandler for ListOffsetsApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request: ListOffsetsRequest = req.decode()?;
        let committed = request.isolation_level == 1;
        let mut resp = ListOffsetsResponse::default();
        for topic in &request.topics {
            let mut t = ListOffsetsTopicResponse::default();
            t.name = topic.name.clone();
            for p in &topic.partitions {
                let mut r = ListOffsetsPartitionResponse::default();
                r.partition_index = p.partition_index;
                r.timestamp = -1;
                r.offset = -1;
                r.leader_epoch = -1;
                let tp =
                    crate::ids::TopicPartition::new(topic.name.0.to_string(), p.partition_index);
                // DESCRIBE on the topic, per partition (Kafka's handleListOffsetRequest).
                if !req.authorized(Operation::Describe, ResourceType::Topic, &tp.topic) {
                    r.error_code = TOPIC_AUTHORIZATION_FAILED;
                    t.partitions.push(r);
                    continue;
                }
                match self.catalog.get(&tp).map(|h| h.view()) {
                    None => r.error_code = UNKNOWN_TOPIC_OR_PARTITION,
                    Some(view) => {
                        let ours = view.leader_epoch().0;
                        if p.current_leader_epoch >= 0 && p.current_leader_epoch < ours {
                            r.error_code = FENCED_LEADER_EPOCH;
                        } else if p.current_leader_epoch > ours {
                            r.error_code = UNKNOWN_LEADER_EPOCH;
                        } else if let Some((offset, ts)) =
                            offset_for_timestamp(&view, p.timestamp, committed)?
                        {
                            r.offset = offset.0;
                            r.timestamp = ts.0;
                            r.leader_epoch = match p.timestamp {
                                LATEST => ours,
                                _ => view.epoch_for_offset(offset).map_or(-1, |e| e.0),
                            };
                        }
                    }
                }
                t.partitions.push(r);
            }
            resp.topics.push(t);
        }
        Outcome::encode(req, &resp)
    }
}

/// The answer for one partition; `None` when no record is that late.
pub fn offset_for_timestamp(
    view: &PartitionReadView,
    target: i64,
    committed: bool,
) -> Result<Option<(Offset, TimestampMs)>, LogError> {
    match target {
        LATEST => {
            let end = if committed {
                view.last_stable_offset
            } else {
                view.high_watermark
            };
            return Ok(Some((end, TimestampMs::NONE)));
        }
        EARLIEST | EARLIEST_LOCAL => return Ok(Some((view.log_start, TimestampMs::NONE))),
        MAX_TIMESTAMP => {
            let best = view
                .segments
                .iter()
                .filter_map(|s| s.max_timestamp.map(|ts| (ts, s)))
                .fold(None, |acc: Option<(TimestampMs, _)>, (ts, s)| match acc {
                    Some((b, _)) if b >= ts => acc,
                    _ => Some((ts, s)),
                });
            let Some((ts, seg)) = best else {
                return Ok(None);
            };
            return first_at_or_after(&OpenSegment::open(seg)?, ts, view.log_start);
        }
        t if t < 0 => return Ok(None),
        _ => {}
    }
    let target = TimestampMs(target);
    for seg in view.segments.iter() {
        if seg.max_timestamp.is_none_or(|ts| ts < target) {
            continue;
        }
        if let Some(found) = first_at_or_after(&OpenSegment::open(seg)?, target, view.log_start)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

fn first_at_or_after(
    seg: &OpenSegment,
    target: TimestampMs,
    log_start: Offset,
) -> Result<Option<(Offset, TimestampMs)>, LogError> {
    let Some(h) = seg.find_batch_by_timestamp(target, log_start)? else {
        return Ok(None);
    };
    let bytes = seg.read_batch(&h)?;
    match Batch::peek(&bytes)? {
        Peek::Complete(batch) if !batch.is_legacy() && batch.codec() != Codec::None => {
            // Kafka answers with the exact record even inside compressed batches, so the
            // batch is decompressed here (only the one batch the indexes led to).
            let set = RecordBatchDecoder::decode(&mut Bytes::from(bytes.clone()))
                .map_err(|e| LogError::corrupt(&seg.view.files.log, format!("{e:#}")))?;
            let found = set
                .records
                .iter()
                .find(|r| r.timestamp >= target.0 && r.offset >= log_start.0)
                .map(|r| (Offset(r.offset), TimestampMs(r.timestamp)));
            Ok(found.or(Some(first_record_at_or_after(&batch, target, log_start))))
        }
        Peek::Complete(batch) => Ok(Some(first_record_at_or_after(&batch, target, log_start))),
        Peek::Incomplete { .. } => Err(LogError::corrupt(
            &seg.view.files.log,
            "batch shorter than its header",
        )),
    }
}
