//! The audit's source side: fetches the same offsets again from the source (a sessionless
//! Fetch as a consumer, READ_UNCOMMITTED, no wait) on each partition's leader, with the
//! mirror's own connection settings, all within the source worker's deadline, and keeps only
//! what the comparison needs of each batch (`BatchId`).

use std::collections::BTreeMap;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use crate::control::audit::scrub::BatchId;
use crate::control::fault::Fault;
use crate::control::mirror_def::MirrorDefinition;
use crate::control::source_catalog::Deadline;
use crate::control::source_security::security_of;
use crate::ids::{Offset, TopicPartition};
use crate::wire::batch::Batches;

/// One partition to read: from which offset, and at most how many bytes.
#[derive(Debug, Clone)]
pub struct SourceAsk {
    pub tp: TopicPartition,
    pub from: Offset,
    pub max_bytes: i32,
}

/// What the source answered for one partition.
#[derive(Debug, Clone, Default)]
pub struct SourceRead {
    pub batches: Vec<BatchId>,
    /// Record bytes the answer carried (the audit's cost to the source).
    pub bytes: u64,
    /// The source's topic id now (a recreated topic has a new one).
    pub topic_id: Option<Uuid>,
    pub log_start: Option<Offset>,
    /// A Kafka error code, or a batch that did not arrive intact (retried next round).
    pub error: Option<String>,
}

/// Reads every ask on its leader. A metadata failure (no bootstrap server answered) is the
/// whole call's fault; one leader not answering marks only its partitions.
pub fn read(
    def: &MirrorDefinition,
    asks: &[SourceAsk],
    by: Deadline,
) -> Result<BTreeMap<TopicPartition, SourceRead>, Fault> {
    let mut out = BTreeMap::new();
    if asks.is_empty() {
        return Ok(out);
    }
    let security = security_of(&def.source)?;
    let client_id = &def.source.client_id;
    let mut topics: Vec<&str> = asks.iter().map(|a| a.tp.topic.as_str()).collect();
    topics.sort_unstable();
    topics.dedup();
    let md = by.first_answer(&def.source.bootstrap_servers, client_id, &security, |c| {
        c.metadata(Some(&topics))
    })?;
    let mut by_leader: BTreeMap<i32, Vec<&SourceAsk>> = BTreeMap::new();
    for a in asks {
        match md
            .partition(&a.tp.topic, a.tp.partition)
            .and_then(|p| p.leader)
        {
            Some(l) => by_leader.entry(l).or_default().push(a),
            None => {
                out.insert(
                    a.tp.clone(),
                    SourceRead {
                        error: Some("no leader on the source".into()),
                        ..SourceRead::default()
                    },
                );
            }
        }
    }
    for (leader, asks) in by_leader {
        let addr = match md.broker(leader) {
            Some(b) => format!("{}:{}", b.host, b.port),
            None => {
                for a in asks {
                    out.insert(
                        a.tp.clone(),
                        SourceRead {
                            error: Some(format!("leader {leader} not in the source's metadata")),
                            ..SourceRead::default()
                        },
                    );
                }
                continue;
            }
        };
        let ids: BTreeMap<&str, Uuid> = asks
            .iter()
            .filter_map(|a| {
                md.topic(&a.tp.topic)
                    .map(|t| (a.tp.topic.as_str(), t.topic_id))
            })
            .collect();
        let answer = by.connect(&addr, client_id, &security).and_then(|mut c| {
            let version = c.versions.fetch;
            let req = request(&asks, &ids, version);
            c.request::<FetchRequest>(version, &req)
                .map(|r| (version, r))
        });
        let (version, resp) = match answer {
            Ok(a) => a,
            Err(e) => {
                let why = by.fault(&addr, &e).message;
                for a in asks {
                    out.insert(
                        a.tp.clone(),
                        SourceRead {
                            error: Some(why.clone()),
                            ..SourceRead::default()
                        },
                    );
                }
                continue;
            }
        };
        for t in &resp.responses {
            let name = if version >= 13 {
                ids.iter()
                    .find(|(_, id)| **id == t.topic_id)
                    .map(|(n, _)| (*n).to_owned())
            } else {
                Some(t.topic.0.to_string())
            };
            let Some(name) = name else { continue };
            for p in &t.partitions {
                let tp = TopicPartition::new(name.clone(), p.partition_index);
                out.insert(tp, partition_read(p, ids.get(name.as_str()).copied()));
            }
        }
    }
    Ok(out)
}

fn request(asks: &[&SourceAsk], ids: &BTreeMap<&str, Uuid>, version: i16) -> FetchRequest {
    let mut topics: Vec<FetchTopic> = Vec::new();
    let mut total: i64 = 0;
    for a in asks {
        total += i64::from(a.max_bytes);
        let p = FetchPartition::default()
            .with_partition(a.tp.partition)
            .with_fetch_offset(a.from.0)
            .with_partition_max_bytes(a.max_bytes);
        let id = ids.get(a.tp.topic.as_str()).copied().unwrap_or_default();
        let same = |t: &FetchTopic| {
            if version >= 13 {
                t.topic_id == id
            } else {
                t.topic.0.as_str() == a.tp.topic
            }
        };
        match topics.iter_mut().find(|t| same(t)) {
            Some(t) => t.partitions.push(p),
            None => {
                let mut t = FetchTopic::default();
                t.topic_id = id;
                t.topic = TopicName(StrBytes::from_string(a.tp.topic.clone()));
                t.partitions.push(p);
                topics.push(t);
            }
        }
    }
    FetchRequest::default()
        .with_max_wait_ms(0)
        .with_min_bytes(0)
        .with_max_bytes(total.clamp(1, i64::from(i32::MAX)) as i32)
        .with_topics(topics)
}

fn partition_read(
    p: &kafka_protocol::messages::fetch_response::PartitionData,
    topic_id: Option<Uuid>,
) -> SourceRead {
    let mut r = SourceRead {
        topic_id,
        log_start: (p.log_start_offset >= 0).then_some(Offset(p.log_start_offset)),
        ..SourceRead::default()
    };
    if p.error_code != 0 {
        r.error = Some(format!("source error code {}", p.error_code));
        return r;
    }
    let Some(records) = &p.records else {
        return r;
    };
    r.bytes = records.len() as u64;
    for item in Batches::new(records) {
        match item {
            Ok((_, b)) => {
                // A batch damaged on the way is not a mismatch: it is fetched again next round.
                if let Err(e) = b.validate() {
                    r.error = Some(format!("source batch did not arrive intact: {e}"));
                    break;
                }
                r.batches.push(BatchId::of(&b));
            }
            Err(e) => {
                r.error = Some(format!("source batch did not arrive intact: {e}"));
                break;
            }
        }
    }
    r
}
