//! What the control plane asks a mirror's source cluster (`SourceCatalog`), and its
//! implementation over the blocking Kafka client: each call opens a connection with the
//! mirror's own bootstrap servers and `client.id` (never shared between mirrors), asks, and
//! closes it. Every call has a `Deadline` (connect, handshake and each read and write count),
//! and runs on a source worker (`source_worker`), never on the control thread.

use crate::control::fault::Fault;
use crate::control::mirror_def::MirrorDefinition;
use crate::control::source_security::{fault_of, security_of};
use crate::control::topic_configs::{self, SourceConfigEntry, DESCRIBE_CONFIGS_VERSION};
use crate::fetch::blocking::{BlockingClient, BlockingError};
use crate::fetch::list_offsets::{Listed, OffsetQuery};
use crate::fetch::security::SourceSecurity;
use crate::ids::TopicPartition;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kafka_protocol::messages::DescribeConfigsRequest;
use uuid::Uuid;

/// One source topic as the control plane needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTopic {
    pub name: String,
    pub topic_id: Uuid,
    pub partitions: i32,
    pub internal: bool,
}

/// What the source cluster looks like now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceView {
    pub cluster_id: Option<String>,
    pub topics: Vec<SourceTopic>,
}

/// Each topic's config entries as the source describes them, or why it could not.
pub type DescribedConfigs = BTreeMap<String, Result<Vec<SourceConfigEntry>, String>>;

/// When a source call must be over, and how long any one read or write may take (the request
/// timeout). Passing it makes the whole call bounded, whatever the source does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    pub at: Instant,
    pub io: Duration,
    /// The whole budget in ms, for messages.
    pub ms: u64,
}

impl Deadline {
    /// `ms` from now, each read or write bounded by the same.
    pub fn after_ms(ms: u64) -> Deadline {
        let d = Duration::from_millis(ms.max(1));
        Deadline {
            at: Instant::now() + d,
            io: d,
            ms,
        }
    }

    /// A connection to `addr` with `security` that is over by this deadline.
    pub fn connect(
        &self,
        addr: &str,
        client_id: &str,
        security: &SourceSecurity,
    ) -> Result<BlockingClient, BlockingError> {
        BlockingClient::connect_by(addr, client_id, security, self.io, self.at)
    }

    /// Asks the bootstrap servers in turn until one answers `ask`, all within this deadline.
    /// A refused login ends it at once (another server would refuse the same credentials);
    /// otherwise every server's fault is kept and, if none answered, returned as one.
    pub fn first_answer<T>(
        &self,
        servers: &[String],
        client_id: &str,
        security: &SourceSecurity,
        mut ask: impl FnMut(&mut BlockingClient) -> Result<T, BlockingError>,
    ) -> Result<T, Fault> {
        let mut errors = Vec::new();
        for addr in servers {
            match self
                .connect(addr, client_id, security)
                .and_then(|mut c| ask(&mut c))
            {
                Ok(answer) => return Ok(answer),
                Err(e) if e.is_authentication() => return Err(fault_of(addr, &e)),
                Err(e) => errors.push(self.fault(addr, &e)),
            }
        }
        Err(unanswered(errors))
    }

    /// `e` as a fault, saying "did not answer within" when it is a timeout.
    pub fn fault(&self, addr: &str, e: &BlockingError) -> Fault {
        if e.is_timeout() {
            Fault::timed_out(addr, self.ms)
        } else {
            fault_of(addr, e)
        }
    }
}

/// The faults of every bootstrap server tried, as one (timed out if any was).
pub fn unanswered(faults: Vec<Fault>) -> Fault {
    let timed_out = faults.iter().any(|f| f.timed_out);
    let message = faults
        .iter()
        .map(|f| f.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    Fault {
        message: if message.is_empty() {
            "no bootstrap server".to_owned()
        } else {
            message
        },
        retryable: true,
        timed_out,
    }
}

/// Asks a mirror's source cluster what it has (with the mirror's own connection settings).
/// Shared with the source workers, so calls take `&self` and the implementation is `Send`.
pub trait SourceCatalog: Clone + Send + Sync + 'static {
    fn describe(&self, mirror: &MirrorDefinition, by: Deadline) -> Result<SourceView, Fault>;
    /// DescribeConfigs of `topics`: each topic's entries, or the source's error for it.
    fn topic_configs(
        &self,
        mirror: &MirrorDefinition,
        topics: &[&str],
        by: Deadline,
    ) -> Result<DescribedConfigs, Fault>;
    /// ListOffsets on each partition's leader.
    fn list_offsets(
        &self,
        mirror: &MirrorDefinition,
        tps: &[TopicPartition],
        query: OffsetQuery,
        by: Deadline,
    ) -> Result<Vec<(TopicPartition, Listed)>, Fault>;
    /// The source's tail of each partition, for a re-point's history check
    /// (`control::lineage`).
    fn history(
        &self,
        mirror: &MirrorDefinition,
        tails: &[(TopicPartition, crate::control::lineage::LocalTail)],
        by: Deadline,
    ) -> Result<BTreeMap<TopicPartition, crate::control::lineage::SourceTail>, Fault> {
        let _ = (mirror, tails, by);
        Err(Fault::from(
            "this source cannot be asked for its history".to_owned(),
        ))
    }
}

/// Reads source metadata with a fresh blocking connection per call.
#[derive(Debug, Default, Clone, Copy)]
pub struct BlockingSourceCatalog;

impl BlockingSourceCatalog {
    /// DescribeConfigs for `topics` on the first bootstrap server that answers, with the
    /// mirror's own security and client.id (any broker answers for topic resources).
    pub fn describe_topic_configs(
        mirror: &MirrorDefinition,
        topics: &[&str],
        by: Deadline,
    ) -> Result<DescribedConfigs, Fault> {
        if topics.is_empty() {
            return Ok(BTreeMap::new());
        }
        let security = security_of(&mirror.source)?;
        let req = topic_configs::describe_request(topics);
        let resp = by.first_answer(
            &mirror.source.bootstrap_servers,
            &mirror.source.client_id,
            &security,
            |c| c.request::<DescribeConfigsRequest>(DESCRIBE_CONFIGS_VERSION, &req),
        )?;
        Ok(topic_configs::parse_response(&resp))
    }
}

impl SourceCatalog for BlockingSourceCatalog {
    fn history(
        &self,
        mirror: &MirrorDefinition,
        tails: &[(TopicPartition, crate::control::lineage::LocalTail)],
        by: Deadline,
    ) -> Result<BTreeMap<TopicPartition, crate::control::lineage::SourceTail>, Fault> {
        crate::control::lineage::probe::source_tails(mirror, tails, by)
    }

    fn topic_configs(
        &self,
        mirror: &MirrorDefinition,
        topics: &[&str],
        by: Deadline,
    ) -> Result<DescribedConfigs, Fault> {
        BlockingSourceCatalog::describe_topic_configs(mirror, topics, by)
    }

    /// Finds each partition's leader with a metadata request, then asks each leader once.
    fn list_offsets(
        &self,
        mirror: &MirrorDefinition,
        tps: &[TopicPartition],
        query: OffsetQuery,
        by: Deadline,
    ) -> Result<Vec<(TopicPartition, Listed)>, Fault> {
        let security = security_of(&mirror.source)?;
        let client_id = &mirror.source.client_id;
        let mut topics: Vec<&str> = tps.iter().map(|tp| tp.topic.as_str()).collect();
        topics.sort_unstable();
        topics.dedup();
        let md = by.first_answer(
            &mirror.source.bootstrap_servers,
            client_id,
            &security,
            |c| c.metadata(Some(&topics)),
        )?;
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
            let listed = by
                .connect(&addr, client_id, &security)
                .and_then(|mut c| c.list_offsets(&tps, query))
                .map_err(|e| by.fault(&addr, &e))?;
            out.extend(listed);
        }
        Ok(out)
    }

    fn describe(&self, mirror: &MirrorDefinition, by: Deadline) -> Result<SourceView, Fault> {
        let security = security_of(&mirror.source)?;
        let md = by.first_answer(
            &mirror.source.bootstrap_servers,
            &mirror.source.client_id,
            &security,
            |c| c.metadata(None),
        )?;
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
        Ok(SourceView {
            cluster_id: md.cluster_id,
            topics,
        })
    }
}
