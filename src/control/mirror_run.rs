//! `kmirror serve`: resolve the configured topics on the source, open (or create) their
//! partition logs under the data dir, start the shards, hand each partition to the shard its
//! hash picks, and run until asked to stop; then stop the shards, which close the logs.
//!
//! Runs on the control thread (the thread that calls `run`). Talks to the source with the
//! blocking client; the shards fetch on their rings.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use crate::config::{ServeConfig, SourceSection, TopicsSection};
use crate::control::leader_refresh::{LeaderRefresh, SourceAccess};
use crate::fetch::blocking::{BlockingClient, BlockingError};
use crate::fetch::fetcher::PartitionStart;
use crate::fetch::metadata::{ClusterMetadata, TopicInfo};
use crate::fetch::versions::Versions;
use crate::ids::{ShardId, TopicPartition};
use crate::limits::{
    RECOVERY_CHECKPOINT_WRITE_LAG_MS, SHARD_FAILURE_EXIT_DELAY_MS, SHARD_STALL_MS,
};
use crate::log::io::StdIo;
use crate::log::log_dir::LogDir;
use crate::log::partition_log::PartitionLog;
use crate::log::read_view::ReadCatalog;
use crate::log::LogError;
use crate::runtime::health::ShardHealth;
use crate::runtime::mirror_shard::{
    resume_point, MirrorEvent, MirrorMsg, MirrorShard, ReturnedLogs, SourceSpec,
};
use crate::runtime::{Runtime, RuntimeError};

/// Metadata refreshes while waiting for every partition to have a leader (new topics).
const LEADER_WAIT_ATTEMPTS: u32 = 40;
const LEADER_WAIT_MS: u64 = 250;

/// Why `kmirror serve` could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the configuration has no [source] and [topics] to mirror")]
    NoStaticMirror,
    #[error("no bootstrap server answered: {0}")]
    Bootstrap(String),
    #[error("source: {0}")]
    Source(#[from] BlockingError),
    #[error("topic {0:?} does not exist on the source")]
    UnknownTopic(String),
    #[error("topic {topic:?} reports error code {code} on the source")]
    TopicError { topic: String, code: i16 },
    #[error("no topic on the source matches the configured regex")]
    NoTopics,
    #[error("Kafka listener: {0}")]
    Kafka(std::io::Error),
    #[error("consumer groups: {0}")]
    Groups(crate::serve::groups::GroupServiceError),
    #[error("opening the ACLs: {0}")]
    Authz(crate::serve::authz::store::AclStoreError),
    #[error("partition {0} has no leader on the source")]
    NoLeader(TopicPartition),
    #[error("leader {0} of a partition is not in the source's broker list")]
    UnknownBroker(i32),
    #[error("cannot create data dir {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Telemetry(#[from] crate::ops::telemetry::TelemetryError),
    #[error(transparent)]
    Metrics(#[from] crate::ops::metrics_server::MetricsServerError),
    #[error("{0}; exited for a restart (the next start recovers its partitions)")]
    ShardFailed(String),
}

fn bootstrap(source: &SourceSection) -> Result<BlockingClient, RunError> {
    let mut errors = Vec::new();
    for addr in &source.bootstrap_servers {
        match BlockingClient::connect(addr, &source.client_id) {
            Ok(c) => return Ok(c),
            Err(e) => errors.push(format!("{addr}: {e}")),
        }
    }
    Err(RunError::Bootstrap(errors.join("; ")))
}

/// The topics to mirror, once every partition has a leader.
fn resolve_topics(
    client: &mut BlockingClient,
    topics: &TopicsSection,
) -> Result<(ClusterMetadata, Vec<TopicInfo>), RunError> {
    let names: Vec<&str> = topics.names.iter().map(String::as_str).collect();
    let regex = match &topics.regex {
        Some(r) => Some(regex::Regex::new(r).map_err(|_| RunError::NoTopics)?),
        None => None,
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let md = client.metadata(if names.is_empty() { None } else { Some(&names) })?;
        let topics: Vec<TopicInfo> = match &regex {
            Some(re) => md
                .topics
                .iter()
                .filter(|t| !t.is_internal && re.is_match(&t.name))
                .cloned()
                .collect(),
            None => {
                let mut found = Vec::new();
                for name in &names {
                    let t = md
                        .topic(name)
                        .ok_or_else(|| RunError::UnknownTopic(name.to_string()))?;
                    if crate::fetch::metadata::is_unknown_topic(t.error) {
                        return Err(RunError::UnknownTopic(name.to_string()));
                    }
                    found.push(t.clone());
                }
                found
            }
        };
        if topics.is_empty() {
            return Err(RunError::NoTopics);
        }
        let not_ready = topics.iter().find_map(|t| {
            if t.error != 0 {
                return Some(RunError::TopicError {
                    topic: t.name.clone(),
                    code: t.error,
                });
            }
            t.partitions
                .iter()
                .find(|p| p.leader.is_none() || p.error != 0)
                .map(|p| RunError::NoLeader(TopicPartition::new(t.name.clone(), p.partition)))
        });
        match not_ready {
            None => return Ok((md, topics)),
            Some(e) if attempt >= LEADER_WAIT_ATTEMPTS => return Err(e),
            Some(_) => std::thread::sleep(Duration::from_millis(LEADER_WAIT_MS)),
        }
    }
}

/// Lends a partition's log (created if new) out of the log dir for a shard to own.
fn lend_log(
    dir: &mut LogDir,
    tp: &TopicPartition,
    topic_id: Uuid,
) -> Result<PartitionLog, LogError> {
    let id = (!topic_id.is_nil()).then_some(topic_id);
    dir.get_or_create(tp, id, None)?;
    Ok(dir.take(tp).expect("just created or found"))
}

/// The shard that owns a partition: a stable hash of its name, so restarts keep the mapping.
pub fn shard_for(tp: &TopicPartition, shards: usize) -> ShardId {
    let h = crc32fast::hash(format!("{}-{}", tp.topic, tp.partition).as_bytes());
    ShardId((h as usize % shards) as u16)
}

/// What `run` did, for the caller's exit message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    pub partitions: usize,
    pub stopped: Vec<(TopicPartition, String)>,
}

/// Runs the mirror until `stop` is set (by SIGTERM/SIGINT in the binary).
pub fn run(config: &ServeConfig, stop: &AtomicBool) -> Result<RunSummary, RunError> {
    let data_dir = &config.storage.data_dir;
    std::fs::create_dir_all(data_dir).map_err(|source| RunError::DataDir {
        path: data_dir.display().to_string(),
        source,
    })?;
    let (source, topics) = config.static_mirror().ok_or(RunError::NoStaticMirror)?;
    let mut client = bootstrap(source)?;
    let (md, topics) = resolve_topics(&mut client, topics)?;
    tracing::info!(
        topics = topics.len(),
        partitions = topics.iter().map(|t| t.partitions.len()).sum::<usize>(),
        "source answered: every partition has a leader"
    );
    // Opened once the source answered, so a source outage leaves the data dir untouched.
    // Opening recovers every partition found (fully unless the last stop was clean); an error
    // from here until the shards start leaves the dir without its clean-shutdown marker, so
    // the next start recovers again.
    let mut log_dir = crate::control::shard_plane::open_log_dir(data_dir)?;
    // The group coordinator owns `__consumer_offsets-0`; it is not a mirrored partition.
    log_dir.hand_off(&TopicPartition::new(
        crate::serve::groups::offsets::TOPIC,
        0,
    ));
    let catalog = ReadCatalog::new();
    log_dir.attach_catalog(std::sync::Arc::clone(&catalog));
    // New partitions are created together, on threads (a first start of thousands).
    let wanted: Vec<(TopicPartition, Option<Uuid>)> = topics
        .iter()
        .flat_map(|t| {
            let id = (!t.topic_id.is_nil()).then_some(t.topic_id);
            t.partitions
                .iter()
                .map(move |p| (TopicPartition::new(t.name.clone(), p.partition), id))
        })
        .collect();
    let created = log_dir.create_missing(&wanted)?;
    if created > 0 {
        tracing::info!(created, "partition directories created");
    }
    let mut versions: HashMap<i32, (String, Versions)> = HashMap::new();
    let mut work = Vec::new();
    for t in &topics {
        for p in &t.partitions {
            let leader = p.leader.expect("resolve_topics waits for leaders");
            if let std::collections::hash_map::Entry::Vacant(e) = versions.entry(leader) {
                let b = md.broker(leader).ok_or(RunError::UnknownBroker(leader))?;
                let addr = format!("{}:{}", b.host, b.port);
                let v = BlockingClient::connect(&addr, &source.client_id)?.versions;
                e.insert((addr, v));
            }
            let tp = TopicPartition::new(t.name.clone(), p.partition);
            let log = lend_log(&mut log_dir, &tp, t.topic_id)?;
            let (log_end, last_epoch) = resume_point(&log);
            let start = PartitionStart {
                tp,
                topic_id: t.topic_id,
                log_end,
                last_epoch,
                leader_epoch: p.leader_epoch,
            };
            work.push((leader, start, log));
        }
    }
    drop(client);
    // The shards start after the log dir is open, not beside it: both are CPU work (the kernel
    // zeroing each arena page as it is pinned; reading every partition's index files), and on a
    // 2-core box overlapping them made a 5,000-partition restart 0.3-0.5 s slower, not faster.
    let returned: ReturnedLogs = Arc::new(Mutex::new(Vec::new()));
    let shard_returned = Arc::clone(&returned);
    let started = Runtime::start(&config.runtime_config(), move |_| {
        MirrorShard::new(Arc::clone(&shard_returned))
    });
    let mut rt = match started {
        Ok(rt) => rt,
        Err(e) => {
            for (_, _, log) in work {
                log_dir.restore(log);
            }
            log_dir.close(&mut StdIo)?;
            return Err(e.into());
        }
    };
    for info in rt.infos() {
        tracing::info!(
            shard = info.shard.0,
            core = info.core,
            ring = %info.ring_mode,
            arena_bytes = info.arena_bytes,
            "shard started"
        );
    }
    let partitions = work.len();
    let mut stopped = Vec::new();
    let access = SourceAccess {
        bootstrap_servers: source.bootstrap_servers.clone(),
        client_id: source.client_id.clone(),
        request_timeout_ms: config.fetch.request_timeout_ms,
        security: Default::default(),
    };
    let mut leaders = Leaders {
        refresh: LeaderRefresh::new(config.fetch_config()),
        access,
    };
    // Which shard holds each partition, to fail a dead shard's partitions.
    let mut owners: Vec<(TopicPartition, ShardId)> = Vec::with_capacity(work.len());
    for (leader, start, log) in work {
        let (addr, v) = versions[&leader].clone();
        let source = SourceSpec {
            broker_id: leader,
            addr,
            versions: v,
            fetch: config.fetch_config(),
            client_id: source.client_id.clone(),
            request_timeout_ms: config.fetch.request_timeout_ms,
            security: Default::default(),
        };
        let shard = shard_for(&start.tp, rt.shard_count());
        owners.push((start.tp.clone(), shard));
        let mut msg = MirrorMsg::AddPartition {
            source,
            start,
            log: Box::new(log),
        };
        loop {
            match rt.send(shard, msg) {
                Ok(()) => break,
                Err(full) => {
                    msg = full.0;
                    drain_events(
                        &mut rt,
                        &mut stopped,
                        &mut leaders,
                        Duration::from_millis(10),
                    );
                }
            }
        }
    }
    // Consumer groups are served with the endpoint; `__consumer_offsets-0` was left out of the
    // log dir above, so the coordinator is its only opener.
    let groups = match config.kafka.as_ref().map(|k| {
        crate::serve::groups::GroupService::open_with(
            data_dir,
            std::sync::Arc::clone(&catalog),
            k.group_initial_rebalance_delay_ms,
        )
    }) {
        None => None,
        Some(Ok(g)) => Some(g),
        Some(Err(e)) => {
            rt.stop();
            return Err(RunError::Groups(e));
        }
    };
    let fetch_sessions = crate::serve::fetch_sessions::FetchSessions::new();
    let endpoint_requests = crate::serve::request_stats::RequestStats::new();
    let authz = match crate::serve::authz::open_configured(config, data_dir) {
        Ok(a) => a,
        Err(e) => {
            if let Some(g) = groups {
                let _ = g.close();
            }
            rt.stop();
            return Err(RunError::Authz(e));
        }
    };
    let kafka = match crate::serve::start_configured(
        config,
        &catalog,
        &crate::serve::writes::writer_slot(),
        groups.as_ref(),
        // Nothing is writable in static mode: no transactions to coordinate.
        None,
        &fetch_sessions,
        &endpoint_requests,
        &authz,
    ) {
        Ok(k) => k,
        Err(e) => {
            if let Some(g) = groups {
                let _ = g.close();
            }
            rt.stop();
            return Err(RunError::Kafka(e));
        }
    };
    let telemetry = crate::ops::telemetry::TelemetryThread::start(rt.stats().to_vec(), data_dir)?;
    if kafka.is_some() {
        telemetry
            .telemetry
            .attach_fetch_sessions(Arc::clone(&fetch_sessions));
        telemetry
            .telemetry
            .attach_endpoint_requests(Arc::clone(&endpoint_requests));
    }
    let failed: Arc<Mutex<Vec<TopicPartition>>> = Arc::default();
    let _metrics = match &config.metrics {
        Some(m) => Some(crate::ops::metrics_server::MetricsServer::start(
            m.listen,
            static_metrics(Arc::clone(&telemetry.telemetry), Arc::clone(&failed)),
        )?),
        None => None,
    };
    tracing::info!(partitions, shards = rt.shard_count(), "mirroring");
    crate::ops::sd_notify::ready("mirroring");
    let mut watchdog = crate::ops::sd_notify::Watchdog::from_env();
    let mut health = ShardHealth::new(
        rt.stats(),
        Duration::from_millis(SHARD_STALL_MS),
        std::time::Instant::now(),
    );
    let mut shard_failed: Option<(String, std::time::Instant)> = None;
    let checkpoint_every = Duration::from_millis(config.storage.recovery_checkpoint_interval_ms);
    let mut next_checkpoint = std::time::Instant::now() + checkpoint_every;
    let mut checkpoint_write_at: Option<std::time::Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        // Recovery-point checkpoints: the shards flush what they own, the file follows.
        let now = std::time::Instant::now();
        if now >= next_checkpoint {
            next_checkpoint = now + checkpoint_every;
            for shard in 0..rt.shard_count() {
                let shard = ShardId(shard as u16);
                if !health.is_failed(shard) && rt.send(shard, MirrorMsg::Flush).is_err() {
                    tracing::warn!(shard = shard.0, "checkpoint flush skipped: mailbox full");
                }
            }
            checkpoint_write_at =
                Some(now + Duration::from_millis(RECOVERY_CHECKPOINT_WRITE_LAG_MS));
        }
        if checkpoint_write_at.is_some_and(|at| now >= at) {
            checkpoint_write_at = None;
            if let Err(e) = log_dir.write_checkpoints() {
                tracing::error!("writing the recovery-point checkpoint: {e}");
            }
        }
        let before = stopped.len();
        drain_events(
            &mut rt,
            &mut stopped,
            &mut leaders,
            Duration::from_millis(200),
        );
        leaders.answer(&mut rt);
        for f in health.check(std::time::Instant::now()) {
            let lost: Vec<TopicPartition> = owners
                .iter()
                .filter(|(tp, s)| *s == f.shard && !stopped.iter().any(|(t, _)| t == tp))
                .map(|(tp, _)| tp.clone())
                .collect();
            tracing::error!(shard = f.shard.0, partitions = lost.len(), why = %f.why,
                "shard failed: its partitions are FAILED and kmirror exits to be restarted");
            for tp in lost {
                leaders.refresh.forget(&tp);
                tracing::error!(partition = %tp, why = %f.why, "partition stopped");
                stopped.push((tp, f.why.clone()));
            }
            crate::ops::sd_notify::shard_failed(&f.why);
            shard_failed.get_or_insert((
                f.why,
                std::time::Instant::now() + Duration::from_millis(SHARD_FAILURE_EXIT_DELAY_MS),
            ));
        }
        crate::ops::sd_notify::shards_checked(health.all_healthy());
        if stopped.len() > before {
            let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
            f.extend(stopped[before..].iter().map(|(tp, _)| tp.clone()));
        }
        watchdog.ping();
        // /metrics shows the FAILED partitions a little longer, then the process exits.
        if shard_failed
            .as_ref()
            .is_some_and(|(_, at)| std::time::Instant::now() >= *at)
        {
            break;
        }
    }
    crate::ops::sd_notify::stopping();
    tracing::info!("stopping: closing partition logs");
    drop(kafka);
    if let Some(g) = groups {
        if let Err(e) = g.close() {
            tracing::warn!("closing __consumer_offsets-0: {e}");
        }
    }
    if let Err(e) = authz.close() {
        tracing::warn!("closing the ACL log: {e}");
    }
    rt.stop();
    drop(telemetry);
    // The shards handed every log back: close the dir with checkpoints and the clean-shutdown
    // marker, so the next start skips recovery.
    let back = std::mem::take(&mut *returned.lock().unwrap_or_else(|p| p.into_inner()));
    for log in back {
        log_dir.restore(log);
    }
    log_dir.close(&mut StdIo)?;
    if let Some((why, _)) = shard_failed {
        return Err(RunError::ShardFailed(why));
    }
    Ok(RunSummary {
        partitions,
        stopped,
    })
}

/// The static mode's `/metrics`: every partition is in mirror `static`, MIRRORING while a
/// shard holds it and FAILED once it stopped.
fn static_metrics(
    telemetry: Arc<crate::ops::telemetry::Telemetry>,
    failed: Arc<Mutex<Vec<TopicPartition>>>,
) -> Arc<dyn Fn() -> String + Send + Sync> {
    use crate::control::state::StateName;
    use crate::ops::metrics::{render, PartitionState};
    Arc::new(move || {
        // The static mode recovers no unclean elections (a divergence stops the partition).
        let state = |tp: TopicPartition, state| PartitionState {
            mirror: STATIC_MIRROR.to_owned(),
            tp,
            state,
            unclean_truncations: 0,
            quarantined_records: 0,
        };
        let mut states: Vec<PartitionState> = telemetry
            .shards
            .iter()
            .flat_map(|s| s.partitions())
            .map(|p| state(p.tp, StateName::Mirroring))
            .collect();
        let f = failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        states.extend(f.into_iter().map(|tp| state(tp, StateName::Failed)));
        render(&telemetry, states, STATIC_MIRROR)
    })
}

/// The mirror label of the static `[source]` mode's partitions.
pub const STATIC_MIRROR: &str = "static";

/// Leader look-ups the shards asked for (one source in the static mode).
struct Leaders {
    refresh: LeaderRefresh,
    access: SourceAccess,
}

impl Leaders {
    /// Looks up the leaders now due and sends each answer to the partition's shard.
    fn answer(&mut self, rt: &mut Runtime<MirrorShard>) {
        let now = std::time::Instant::now();
        for (found, access) in self.refresh.run_due(now) {
            let shard = shard_for(&found.tp, rt.shard_count());
            let msg = MirrorMsg::Releader {
                tp: found.tp.clone(),
                source: found.source.clone(),
                topic_id: found.topic_id,
                leader_epoch: found.leader_epoch,
            };
            if rt.send(shard, msg).is_err() {
                self.refresh.retry_soon(&found, access, now);
            }
        }
    }
}

fn drain_events(
    rt: &mut Runtime<MirrorShard>,
    stopped: &mut Vec<(TopicPartition, String)>,
    leaders: &mut Leaders,
    wait: Duration,
) {
    let Some(first) = rt.next_event(wait) else {
        return;
    };
    let mut next = Some(first);
    while let Some((shard, event)) = next {
        match event {
            MirrorEvent::PartitionAdded { tp } => {
                tracing::info!(shard = shard.0, partition = %tp, "partition added")
            }
            MirrorEvent::PartitionStopped { tp, why, .. } => {
                // The static mode has no retry: the partition stays stopped until a restart.
                tracing::error!(shard = shard.0, partition = %tp, %why, "partition stopped");
                leaders.refresh.forget(&tp);
                stopped.push((tp, why));
            }
            MirrorEvent::LeaderWanted { tp, why } => {
                tracing::info!(shard = shard.0, partition = %tp, %why, "looking up the source leader");
                leaders
                    .refresh
                    .want(tp, leaders.access.clone(), std::time::Instant::now());
            }
            MirrorEvent::PartitionRemoved { tp, log_end } => {
                tracing::info!(shard = shard.0, partition = %tp, %log_end, "partition removed")
            }
            MirrorEvent::Notice { what } => tracing::warn!(shard = shard.0, "{what}"),
        }
        next = rt.try_event();
    }
}
