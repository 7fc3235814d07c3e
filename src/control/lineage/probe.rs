//! The source calls of a re-point's history check, and reading our own tails: for each
//! partition, our last batch (from the published read view, like the audit's scrub) and,
//! on the new source with the mirror's new connection settings, the batch at the same offset
//! (a sessionless Fetch, the audit's `source_read`) and OffsetForLeaderEpoch of its epoch on
//! the partition's leader. Everything within one `Deadline`.

use std::collections::BTreeMap;

use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{BrokerId, OffsetForLeaderEpochRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::control::audit::scrub;
use crate::control::audit::source_read::{self, SourceAsk};
use crate::control::fault::Fault;
use crate::control::lineage::agreement::{LocalTail, SourceTail};
use crate::control::mirror_def::MirrorDefinition;
use crate::control::source_catalog::Deadline;
use crate::control::source_security::security_of;
use crate::ids::{LeaderEpoch, Offset, TopicPartition};
use crate::limits::LINEAGE_PROBE_FETCH_BYTES;
use crate::log::read_view::PartitionReadView;

/// Our tail of one partition from its published view; `Err` when our own last batch cannot
/// be read back intact (then nothing can be compared).
pub fn local_tail(view: &PartitionReadView) -> Result<LocalTail, String> {
    let log_end = scrub::log_end(view);
    let last_batch = if log_end > view.log_start {
        let read = scrub::scrub(view, Offset(log_end.0 - 1), 1)?;
        if let Some(f) = read.fault {
            return Err(format!(
                "our own last batch cannot be read back intact ({}: {})",
                f.segment, f.why
            ));
        }
        read.batches.last().copied()
    } else {
        None
    };
    Ok(LocalTail {
        topic_id: view.topic_id,
        log_start: view.log_start,
        log_end,
        last_batch,
        epochs: view.epochs.to_vec(),
    })
}

/// The new source's tail of each partition. A metadata failure is the whole call's fault; a
/// partition the source cannot answer for gets its `error`.
pub fn source_tails(
    def: &MirrorDefinition,
    tails: &[(TopicPartition, LocalTail)],
    by: Deadline,
) -> Result<BTreeMap<TopicPartition, SourceTail>, Fault> {
    let security = security_of(&def.source)?;
    let client_id = &def.source.client_id;
    let md = by.first_answer(&def.source.bootstrap_servers, client_id, &security, |c| {
        c.metadata(None)
    })?;
    let mut out: BTreeMap<TopicPartition, SourceTail> = BTreeMap::new();
    let mut asks = Vec::new();
    for (tp, local) in tails {
        let mut s = SourceTail::default();
        match md.topic(&tp.topic) {
            None => s.error = Some(format!("the new source has no topic {}", tp.topic)),
            Some(t) => {
                s.topic_id = (!t.topic_id.is_nil()).then_some(t.topic_id);
                if md.partition(&tp.topic, tp.partition).is_none() {
                    s.error = Some(format!("the new source has no partition {tp}"));
                }
            }
        }
        if s.error.is_none() {
            if let Some(b) = local.last_batch {
                asks.push(SourceAsk {
                    tp: tp.clone(),
                    from: Offset(b.base_offset),
                    max_bytes: LINEAGE_PROBE_FETCH_BYTES,
                });
            }
        }
        out.insert(tp.clone(), s);
    }
    for (tp, read) in source_read::read(def, &asks, by)? {
        let Some(s) = out.get_mut(&tp) else { continue };
        s.log_start = read.log_start;
        s.batch_at_ours = read.batches.first().copied();
        if read.error.is_some() && s.batch_at_ours.is_none() {
            s.error = read.error;
        }
    }
    // OffsetForLeaderEpoch of our last epoch, on each leader.
    let mut by_leader: BTreeMap<i32, Vec<(&TopicPartition, LeaderEpoch)>> = BTreeMap::new();
    for (tp, local) in tails {
        let Some(b) = local.last_batch else { continue };
        if out[tp].error.is_some() || b.leader_epoch < 0 {
            continue;
        }
        match md.partition(&tp.topic, tp.partition).and_then(|p| p.leader) {
            Some(l) => by_leader
                .entry(l)
                .or_default()
                .push((tp, LeaderEpoch(b.leader_epoch))),
            None => {
                out.get_mut(tp).expect("inserted above").error =
                    Some("no leader on the new source".into())
            }
        }
    }
    for (leader, parts) in by_leader {
        let answer = match md.broker(leader) {
            None => Err(format!(
                "leader {leader} is not in the new source's metadata"
            )),
            Some(b) => {
                let addr = format!("{}:{}", b.host, b.port);
                by.connect(&addr, client_id, &security)
                    .and_then(|mut c| {
                        let version = c.versions.offset_for_leader_epoch;
                        c.request::<OffsetForLeaderEpochRequest>(
                            version,
                            &epoch_request(&parts, version),
                        )
                    })
                    .map_err(|e| by.fault(&addr, &e).message)
            }
        };
        match answer {
            Err(why) => {
                for (tp, _) in parts {
                    out.get_mut(tp).expect("inserted above").error = Some(why.clone());
                }
            }
            Ok(resp) => {
                for t in &resp.topics {
                    for p in &t.partitions {
                        let tp = TopicPartition::new(t.topic.0.to_string(), p.partition);
                        let Some(s) = out.get_mut(&tp) else { continue };
                        if p.error_code != 0 {
                            s.error =
                                Some(format!("OffsetForLeaderEpoch error code {}", p.error_code));
                        } else {
                            s.epoch_end = Some((LeaderEpoch(p.leader_epoch), Offset(p.end_offset)));
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

fn epoch_request(
    parts: &[(&TopicPartition, LeaderEpoch)],
    version: i16,
) -> OffsetForLeaderEpochRequest {
    let mut req = OffsetForLeaderEpochRequest::default();
    if version >= 3 {
        // A consumer's question (KIP-320): any broker version answers it from its leader.
        req.replica_id = BrokerId(-1);
    }
    for (tp, epoch) in parts {
        let name = TopicName(StrBytes::from_string(tp.topic.clone()));
        let i = match req.topics.iter().position(|t| t.topic == name) {
            Some(i) => i,
            None => {
                req.topics
                    .push(OffsetForLeaderTopic::default().with_topic(name));
                req.topics.len() - 1
            }
        };
        let mut p = OffsetForLeaderPartition::default();
        p.partition = tp.partition;
        p.current_leader_epoch = -1;
        p.leader_epoch = epoch.0;
        req.topics[i].partitions.push(p);
    }
    req
}
