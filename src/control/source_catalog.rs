//! `SourceCatalog` over the blocking Kafka client: each call opens a connection with the
//! mirror's own bootstrap servers and `client.id` (never shared between mirrors), asks for all
//! topics' metadata, and closes it.

use crate::control::controller::{Fault, SourceCatalog, SourceTopic, SourceView};
use crate::control::mirror_def::MirrorDefinition;
use crate::control::source_security::{fault_of, security_of};
use crate::control::topic_configs::{self, SourceConfigEntry, DESCRIBE_CONFIGS_VERSION};
use crate::fetch::blocking::BlockingClient;
use crate::fetch::list_offsets::{Listed, OffsetQuery};
use crate::ids::TopicPartition;

use std::collections::BTreeMap;

use kafka_protocol::messages::DescribeConfigsRequest;

/// Reads source metadata with a fresh blocking connection per call.
#[derive(Debug, Default, Clone, Copy)]
pub struct BlockingSourceCatalog;

/// Each topic's config entries as the source describes them, or why it could not.
pub type DescribedConfigs = BTreeMap<String, Result<Vec<SourceConfigEntry>, String>>;

impl BlockingSourceCatalog {
    /// DescribeConfigs for `topics` on the first bootstrap server that answers, with the
    /// mirror's own security and client.id (any broker answers for topic resources).
    pub fn describe_topic_configs(
        mirror: &MirrorDefinition,
        topics: &[&str],
    ) -> Result<DescribedConfigs, Fault> {
        if topics.is_empty() {
            return Ok(BTreeMap::new());
        }
        let security = security_of(&mirror.source)?;
        let req = topic_configs::describe_request(topics);
        let mut errors = Vec::new();
        for addr in &mirror.source.bootstrap_servers {
            let result = BlockingClient::connect_secure(addr, &mirror.source.client_id, &security)
                .and_then(|mut c| {
                    c.request::<DescribeConfigsRequest>(DESCRIBE_CONFIGS_VERSION, &req)
                });
            match result {
                Ok(resp) => return Ok(topic_configs::parse_response(&resp)),
                Err(e) if e.is_authentication() => return Err(fault_of(addr, &e)),
                Err(e) => errors.push(format!("{addr}: {e}")),
            }
        }
        Err(Fault::from(errors.join("; ")))
    }
}

impl SourceCatalog for BlockingSourceCatalog {
    fn topic_configs(
        &mut self,
        mirror: &MirrorDefinition,
        topics: &[&str],
    ) -> Result<DescribedConfigs, Fault> {
        BlockingSourceCatalog::describe_topic_configs(mirror, topics)
    }

    /// Finds each partition's leader with a metadata request, then asks each leader once.
    fn list_offsets(
        &mut self,
        mirror: &MirrorDefinition,
        tps: &[TopicPartition],
        query: OffsetQuery,
    ) -> Result<Vec<(TopicPartition, Listed)>, Fault> {
        let security = security_of(&mirror.source)?;
        let client_id = &mirror.source.client_id;
        let mut topics: Vec<&str> = tps.iter().map(|tp| tp.topic.as_str()).collect();
        topics.sort_unstable();
        topics.dedup();
        let mut errors = Vec::new();
        let mut md = None;
        for addr in &mirror.source.bootstrap_servers {
            match BlockingClient::connect_secure(addr, client_id, &security)
                .and_then(|mut c| c.metadata(Some(&topics)))
            {
                Ok(m) => {
                    md = Some(m);
                    break;
                }
                Err(e) if e.is_authentication() => return Err(fault_of(addr, &e)),
                Err(e) => errors.push(format!("{addr}: {e}")),
            }
        }
        let md = md.ok_or_else(|| Fault::from(errors.join("; ")))?;
        let mut by_leader: std::collections::BTreeMap<i32, Vec<TopicPartition>> =
            Default::default();
        let mut out = Vec::new();
        for tp in tps {
            match md.partition(&tp.topic, tp.partition).and_then(|p| p.leader) {
                Some(leader) => by_leader.entry(leader).or_default().push(tp.clone()),
                // LEADER_NOT_AVAILABLE
                None => out.push((tp.clone(), Listed::Error(5))),
            }
        }
        for (leader, tps) in by_leader {
            let Some(b) = md.broker(leader) else {
                out.extend(tps.into_iter().map(|tp| (tp, Listed::Error(5))));
                continue;
            };
            let addr = format!("{}:{}", b.host, b.port);
            let listed = BlockingClient::connect_secure(&addr, client_id, &security)
                .and_then(|mut c| c.list_offsets(&tps, query))
                .map_err(|e| fault_of(&addr, &e))?;
            out.extend(listed);
        }
        Ok(out)
    }

    fn describe(&mut self, mirror: &MirrorDefinition) -> Result<SourceView, Fault> {
        let security = security_of(&mirror.source)?;
        let mut errors = Vec::new();
        for addr in &mirror.source.bootstrap_servers {
            let result = BlockingClient::connect_secure(addr, &mirror.source.client_id, &security)
                .and_then(|mut c| c.metadata(None));
            match result {
                Ok(md) => {
                    let topics = md
                        .topics
                        .into_iter()
                        .filter(|t| t.error == 0)
                        .map(|t| SourceTopic {
                            partitions: t.partitions.len() as i32,
                            name: t.name,
                            topic_id: t.topic_id,
                            internal: t.is_internal,
                        })
                        .collect();
                    return Ok(SourceView {
                        cluster_id: md.cluster_id,
                        topics,
                    });
                }
                // Another bootstrap server would refuse the same credentials.
                Err(e) if e.is_authentication() => return Err(fault_of(addr, &e)),
                Err(e) => errors.push(format!("{addr}: {e}")),
            }
        }
        Err(Fault::from(errors.join("; ")))
    }
}
