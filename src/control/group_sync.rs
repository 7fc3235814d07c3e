//! Group-offset sync: copies the committed offsets of the source's consumer groups onto
//! kmirror, for the partitions a mirror mirrors, so consumers that move to kmirror resume where
//! they were (kip1279.md §8).
//!
//! - Offsets are copied as they are: kmirror stores the source's batches at the source's
//!   offsets, so no translation is needed.
//! - Each is clamped to `max(local log start, min(source committed, local log end))`: a
//!   consumer must never be sent past what kmirror holds (it would skip records after
//!   failover), nor below what it still has. A clamped offset carries the local leader epoch of
//!   the record before it.
//! - Groups with an active member on kmirror are skipped: their own commits win.
//! - Runs every `sync.group.offsets.interval.ms` per mirror on the control thread, and once
//!   more on demand (`sync_now`, for the failover path) with a deadline after which a source
//!   that does not answer is skipped.
//!
//! The source, the local logs and the coordinator are traits so the rules are tested alone;
//! `BlockingSourceGroups` reads a real source with the blocking client.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ListGroupsRequest, OffsetFetchRequest};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::control::mirror_def::{MirrorDefinition, MirrorName};
use crate::control::source_security::security_of;
use crate::fetch::blocking::{BlockingClient, BlockingError};
use crate::fetch::security::SourceSecurity;
use crate::fetch::versions;
use crate::ids::{LeaderEpoch, Offset, TopicPartition};
use crate::limits::{BLOCKING_CONNECT_TIMEOUT_MS, GROUP_SYNC_GROUPS_MAX};
use crate::log::log_dir::LogDir;
use crate::serve::groups::coordinator::SyncWriteError;
use crate::serve::groups::OffsetStore;

#[derive(Debug, thiserror::Error)]
pub enum GroupSyncError {
    #[error("source of mirror {mirror} did not answer the group sync: {reason}")]
    Source { mirror: String, reason: String },
    #[error("bad group filter: {0}")]
    Filter(#[from] crate::control::mirror_def::DefinitionError),
    #[error("writing offsets of group {group}: {reason}")]
    Write { group: String, reason: String },
}

/// One group's committed offsets on the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceGroup {
    pub group: String,
    pub offsets: Vec<SourceOffset>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceOffset {
    pub tp: TopicPartition,
    pub offset: Offset,
    pub leader_epoch: LeaderEpoch,
    pub metadata: String,
}

/// Reads consumer groups and their offsets from a mirror's source.
pub trait SourceGroups {
    /// Every consumer group on the source whose name `wanted` accepts, with its committed
    /// offsets for the topics in `topics`. Gives up at `deadline`.
    fn read(
        &self,
        mirror: &MirrorDefinition,
        wanted: &dyn Fn(&str) -> bool,
        topics: &BTreeSet<String>,
        deadline: Instant,
    ) -> Result<Vec<SourceGroup>, String>;
}

/// What kmirror holds of a partition now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalBounds {
    pub log_start: Offset,
    pub log_end: Offset,
    /// The leader epoch kmirror announces for the partition now (Metadata, see
    /// `PartitionReadView::leader_epoch`).
    pub leader_epoch: LeaderEpoch,
}

/// The local logs, as the group sync needs them.
pub trait LocalLogs {
    fn bounds(&self, tp: &TopicPartition) -> Option<LocalBounds>;
    /// The leader epoch of the record just before `offset` (what a consumer that consumed up
    /// to `offset` commits), or `NONE`.
    fn epoch_before(&self, tp: &TopicPartition, offset: Offset) -> LeaderEpoch;
}

impl<T: LocalLogs + ?Sized> LocalLogs for std::sync::Arc<T> {
    fn bounds(&self, tp: &TopicPartition) -> Option<LocalBounds> {
        (**self).bounds(tp)
    }
    fn epoch_before(&self, tp: &TopicPartition, offset: Offset) -> LeaderEpoch {
        (**self).epoch_before(tp, offset)
    }
}

/// The logs while the calling thread holds them (static mode, tools, tests): log start and log
/// end of each partition, epochs from its leader-epoch cache.
impl LocalLogs for LogDir {
    fn bounds(&self, tp: &TopicPartition) -> Option<LocalBounds> {
        self.get(tp).map(|l| LocalBounds {
            log_start: l.log_start_offset(),
            log_end: l.log_end_offset(),
            leader_epoch: l
                .epoch_cache()
                .latest_epoch()
                .map_or(LeaderEpoch(0), |e| e.max(LeaderEpoch(0))),
        })
    }

    fn epoch_before(&self, tp: &TopicPartition, offset: Offset) -> LeaderEpoch {
        if offset.0 <= 0 {
            return LeaderEpoch::NONE;
        }
        self.get(tp)
            .and_then(|l| l.epoch_cache().epoch_for_offset(Offset(offset.0 - 1)))
            .unwrap_or(LeaderEpoch::NONE)
    }
}

/// The logs as the Kafka endpoint publishes them (`serve`'s read views): readable from the
/// control thread while the shards own the logs. A mirror's high watermark is its log end.
impl LocalLogs for crate::log::read_view::ReadCatalog {
    fn bounds(&self, tp: &TopicPartition) -> Option<LocalBounds> {
        let v = self.get(tp)?.view();
        Some(LocalBounds {
            log_start: v.log_start,
            log_end: v.high_watermark,
            leader_epoch: v.leader_epoch(),
        })
    }

    fn epoch_before(&self, tp: &TopicPartition, offset: Offset) -> LeaderEpoch {
        if offset.0 <= 0 {
            return LeaderEpoch::NONE;
        }
        self.get(tp)
            .and_then(|h| h.view().epoch_for_offset(Offset(offset.0 - 1)))
            .unwrap_or(LeaderEpoch::NONE)
    }
}

/// Where synced offsets go: the group coordinator.
pub trait OffsetSink {
    fn is_active(&self, group: &str) -> bool;
    /// Writes one offset; `Ok(false)` when it was already there.
    fn write(&mut self, group: &str, o: &SourceOffset) -> Result<bool, SyncWriteError>;
    /// Every group's committed offset of `tp` here (a drill copies them for its clone).
    fn committed_on(&self, tp: &TopicPartition) -> Vec<(String, SourceOffset)>;
    /// Deletes every group's committed offset of `tp` (a drill's clone, deleted); how many.
    fn forget(&mut self, tp: &TopicPartition) -> Result<usize, SyncWriteError>;
}

impl<S: OffsetStore> OffsetSink
    for std::sync::Arc<std::sync::Mutex<crate::serve::groups::GroupCoordinator<S>>>
{
    fn is_active(&self, group: &str) -> bool {
        self.lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_active(group)
    }
    fn write(&mut self, group: &str, o: &SourceOffset) -> Result<bool, SyncWriteError> {
        self.lock().unwrap_or_else(|p| p.into_inner()).sync_offset(
            group,
            o.tp.clone(),
            o.offset,
            o.leader_epoch,
            &o.metadata,
        )
    }
    fn committed_on(&self, tp: &TopicPartition) -> Vec<(String, SourceOffset)> {
        let c = self.lock().unwrap_or_else(|p| p.into_inner());
        c.committed_by_groups(tp)
            .into_iter()
            .map(|(g, o)| {
                (
                    g,
                    SourceOffset {
                        tp: tp.clone(),
                        offset: o.offset,
                        leader_epoch: o.leader_epoch,
                        metadata: o.metadata,
                    },
                )
            })
            .collect()
    }
    fn forget(&mut self, tp: &TopicPartition) -> Result<usize, SyncWriteError> {
        Ok(self
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .delete_partition_offsets(tp)?)
    }
}

/// What one sync of one mirror did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub groups_seen: usize,
    pub groups_active: usize,
    pub written: usize,
    pub unchanged: usize,
    pub clamped: usize,
}

/// The offset a consumer of kmirror should resume from, and whether it had to be moved.
pub fn clamp(source: Offset, local: LocalBounds) -> (Offset, bool) {
    let target = Offset(source.0.min(local.log_end.0).max(local.log_start.0));
    (target, target != source)
}

/// The leader epoch written with a synced offset. A Java consumer takes a committed offset's
/// epoch as a leader epoch it has seen (`updateLastSeenEpochIfNewer`) and ignores Metadata
/// answers below it, refreshing metadata again and again: so the committed epoch must never
/// be above the epoch kmirror announces. The source's epoch is above it when the source's
/// leader moved without records since (a consumer positioned by ListOffsets commits the
/// leader's current epoch) or when kmirror has not mirrored that far; then, as for a clamped
/// offset, the epoch of kmirror's own record before the offset is used (`before`), which is
/// what OffsetsForLeaderEpoch validation needs to find the offset inside kmirror's log.
pub fn synced_epoch(
    source: LeaderEpoch,
    moved: bool,
    announced: LeaderEpoch,
    before: impl FnOnce() -> LeaderEpoch,
) -> LeaderEpoch {
    if moved || source > announced {
        before()
    } else {
        source
    }
}

/// Copies one mirror's group offsets for `partitions` (the mirror's MIRRORING ones, or those
/// being stopped at failover): `read_groups`, then `apply_groups`.
pub fn sync_mirror(
    def: &MirrorDefinition,
    partitions: &BTreeSet<TopicPartition>,
    source: &dyn SourceGroups,
    local: &dyn LocalLogs,
    sink: &mut dyn OffsetSink,
    deadline: Instant,
) -> Result<SyncReport, GroupSyncError> {
    if partitions.is_empty() {
        return Ok(SyncReport::default());
    }
    let groups = read_groups(def, partitions, source, deadline)?;
    apply_groups(def, partitions, groups, local, sink)
}

/// The source side of a sync (a source worker runs it): the groups `def`'s filter accepts,
/// with their offsets for the topics of `partitions`.
pub fn read_groups(
    def: &MirrorDefinition,
    partitions: &BTreeSet<TopicPartition>,
    source: &dyn SourceGroups,
    deadline: Instant,
) -> Result<Vec<SourceGroup>, GroupSyncError> {
    let filter = def.groups.filter.compile()?;
    let topics: BTreeSet<String> = partitions.iter().map(|tp| tp.topic.clone()).collect();
    let wanted = |g: &str| filter.matches(g);
    source
        .read(def, &wanted, &topics, deadline)
        .map_err(|reason| GroupSyncError::Source {
            mirror: def.name.to_string(),
            reason,
        })
}

/// The local side of a sync (the control thread runs it once the groups were read): each
/// offset clamped to what kmirror holds and written, unless the group is active here.
pub fn apply_groups(
    def: &MirrorDefinition,
    partitions: &BTreeSet<TopicPartition>,
    groups: Vec<SourceGroup>,
    local: &dyn LocalLogs,
    sink: &mut dyn OffsetSink,
) -> Result<SyncReport, GroupSyncError> {
    let mut report = SyncReport::default();
    let filter = def.groups.filter.compile()?;
    for g in groups {
        if !filter.matches(&g.group) {
            continue;
        }
        report.groups_seen += 1;
        if sink.is_active(&g.group) {
            report.groups_active += 1;
            continue;
        }
        for o in g.offsets {
            if !partitions.contains(&o.tp) || o.offset.0 < 0 {
                continue;
            }
            let Some(bounds) = local.bounds(&o.tp) else {
                continue;
            };
            let (offset, moved) = clamp(o.offset, bounds);
            if moved {
                report.clamped += 1;
            }
            let leader_epoch = synced_epoch(o.leader_epoch, moved, bounds.leader_epoch, || {
                local.epoch_before(&o.tp, offset)
            });
            let synced = SourceOffset {
                offset,
                leader_epoch,
                ..o
            };
            match sink.write(&g.group, &synced) {
                Ok(true) => report.written += 1,
                Ok(false) => report.unchanged += 1,
                // A member joined on kmirror since we looked: its commits win.
                Err(SyncWriteError::Active(_)) => {
                    report.groups_active += 1;
                    break;
                }
                Err(e) => {
                    return Err(GroupSyncError::Write {
                        group: g.group.clone(),
                        reason: e.to_string(),
                    })
                }
            }
        }
    }
    Ok(report)
}

/// The periodic driver: which mirror is due when.
#[derive(Debug, Default)]
pub struct GroupSyncSchedule {
    next_due_ms: BTreeMap<MirrorName, i64>,
}

impl GroupSyncSchedule {
    /// Whether `def` is due at `now_ms`; if so its next round is scheduled.
    pub fn due(&mut self, def: &MirrorDefinition, now_ms: i64) -> bool {
        if !def.groups.enabled {
            return false;
        }
        let next = self.next_due_ms.entry(def.name.clone()).or_insert(0);
        if now_ms < *next {
            return false;
        }
        *next = now_ms.saturating_add(i64::try_from(def.groups.interval_ms).unwrap_or(i64::MAX));
        true
    }

    pub fn forget(&mut self, name: &MirrorName) {
        self.next_due_ms.remove(name);
    }
}

/// `SourceGroups` over the blocking Kafka client: a fresh connection per broker per round,
/// with the mirror's own bootstrap servers and `client.id`.
#[derive(Debug, Default, Clone, Copy)]
pub struct BlockingSourceGroups;

fn left(deadline: Instant) -> Result<Duration, String> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        Err("deadline passed".to_owned())
    } else {
        Ok(d)
    }
}

/// A blocking connection to `addr` that gives up at `deadline` (every read and write too).
pub(crate) fn connect_source(
    addr: &str,
    client_id: &str,
    security: &SourceSecurity,
    deadline: Instant,
) -> Result<BlockingClient, String> {
    // Every read and write of the round, not just the connect, ends by the deadline.
    let timeout = left(deadline)?.min(Duration::from_millis(BLOCKING_CONNECT_TIMEOUT_MS));
    BlockingClient::connect_by(addr, client_id, security, timeout, deadline)
        .map_err(|e| format!("{addr}: {e}"))
}

/// The highest version of `key` both the broker and we speak, if any.
pub(crate) fn pick_version(
    client: &mut BlockingClient,
    key: ApiKey,
    ours: (i16, i16),
) -> Result<Option<i16>, BlockingError> {
    let v = client.versions.api_versions;
    let resp = client.request::<ApiVersionsRequest>(v, &versions::api_versions_request(v))?;
    Ok(resp
        .api_keys
        .iter()
        .find(|k| k.api_key == key as i16)
        .and_then(|k| {
            let hi = k.max_version.min(ours.1);
            (hi >= k.min_version.max(ours.0)).then_some(hi)
        }))
}

/// Versions we use as a client: ListGroups v0-4 (v4 filters by state; we read every state),
/// OffsetFetch v2-7 (one group per request; v2 is the first with "all topics").
const LIST_GROUPS: (i16, i16) = (0, 4);
const OFFSET_FETCH: (i16, i16) = (2, 7);

impl SourceGroups for BlockingSourceGroups {
    fn read(
        &self,
        mirror: &MirrorDefinition,
        wanted: &dyn Fn(&str) -> bool,
        topics: &BTreeSet<String>,
        deadline: Instant,
    ) -> Result<Vec<SourceGroup>, String> {
        // The mirror's own connection settings (TLS, SASL), as its fetchers use them.
        let security = security_of(&mirror.source).map_err(|f| f.message)?;
        let client_id = &mirror.source.client_id;
        let mut errors = Vec::new();
        let mut brokers = None;
        for addr in &mirror.source.bootstrap_servers {
            match connect_source(addr, client_id, &security, deadline)
                .and_then(|mut c| c.metadata(Some(&[])).map_err(|e| e.to_string()))
            {
                Ok(md) => {
                    brokers = Some(md.brokers);
                    break;
                }
                Err(e) => errors.push(e),
            }
        }
        let brokers = brokers.ok_or_else(|| errors.join("; "))?;
        let mut out = Vec::new();
        // Each broker lists the groups it coordinates and answers OffsetFetch for them.
        for b in brokers {
            let addr = format!("{}:{}", b.host, b.port);
            let mut c = connect_source(&addr, client_id, &security, deadline)?;
            let list_v = pick_version(&mut c, ApiKey::ListGroups, LIST_GROUPS)
                .map_err(|e| format!("{addr}: {e}"))?
                .ok_or_else(|| format!("{addr} does not offer ListGroups"))?;
            let fetch_v = pick_version(&mut c, ApiKey::OffsetFetch, OFFSET_FETCH)
                .map_err(|e| format!("{addr}: {e}"))?
                .ok_or_else(|| format!("{addr} does not offer OffsetFetch v2+"))?;
            let listed = c
                .request::<ListGroupsRequest>(list_v, &ListGroupsRequest::default())
                .map_err(|e| format!("{addr}: ListGroups: {e}"))?;
            if listed.error_code != 0 {
                return Err(format!("{addr}: ListGroups error {}", listed.error_code));
            }
            for g in listed.groups {
                let name = g.group_id.0.to_string();
                // Consumer groups (classic and KIP-848 both say "consumer") and groups that
                // only hold offsets (""); share, connect and streams groups are not.
                let kind = g.protocol_type.as_str();
                if !(kind == "consumer" || kind.is_empty()) || !wanted(&name) {
                    continue;
                }
                if out.len() >= GROUP_SYNC_GROUPS_MAX {
                    tracing::warn!(mirror = %mirror.name, "more than {GROUP_SYNC_GROUPS_MAX} groups on the source; the rest wait for the next round");
                    break;
                }
                left(deadline)?;
                let mut req = OffsetFetchRequest::default();
                req.group_id = g.group_id.clone();
                req.topics = None;
                let resp = c
                    .request::<OffsetFetchRequest>(fetch_v, &req)
                    .map_err(|e| format!("{addr}: OffsetFetch {name}: {e}"))?;
                if resp.error_code != 0 {
                    // Loading, moved or deleted since the listing: next round.
                    tracing::info!(group = %name, error = ?ResponseError::try_from_code(resp.error_code), "source OffsetFetch refused; skipping the group this round");
                    continue;
                }
                let offsets = resp
                    .topics
                    .iter()
                    .filter(|t| topics.contains(t.name.0.as_str()))
                    .flat_map(|t| {
                        t.partitions
                            .iter()
                            .filter(|p| p.error_code == 0 && p.committed_offset >= 0)
                            .map(|p| SourceOffset {
                                tp: TopicPartition::new(t.name.0.as_str(), p.partition_index),
                                offset: Offset(p.committed_offset),
                                leader_epoch: LeaderEpoch(p.committed_leader_epoch.max(-1)),
                                metadata: p
                                    .metadata
                                    .as_ref()
                                    .map(StrBytes::to_string)
                                    .unwrap_or_default(),
                            })
                    })
                    .collect();
                out.push(SourceGroup {
                    group: name,
                    offsets,
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::mirror_def::{parse_properties, MirrorName};

    fn def(extra: &str) -> MirrorDefinition {
        MirrorDefinition::from_properties(
            MirrorName::new("m").unwrap(),
            &parse_properties(&format!("bootstrap.servers=src:9092\n{extra}")).unwrap(),
        )
        .unwrap()
    }

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("orders", p)
    }

    struct FakeSource(Vec<SourceGroup>, bool);
    impl SourceGroups for FakeSource {
        fn read(
            &self,
            _: &MirrorDefinition,
            wanted: &dyn Fn(&str) -> bool,
            _: &BTreeSet<String>,
            _: Instant,
        ) -> Result<Vec<SourceGroup>, String> {
            if self.1 {
                return Err("connection refused".into());
            }
            Ok(self
                .0
                .iter()
                .filter(|g| wanted(&g.group))
                .cloned()
                .collect())
        }
    }

    struct FakeLocal;
    impl LocalLogs for FakeLocal {
        fn bounds(&self, tp: &TopicPartition) -> Option<LocalBounds> {
            (tp.topic == "orders").then_some(LocalBounds {
                log_start: Offset(10),
                log_end: Offset(100),
                leader_epoch: LeaderEpoch(if tp.partition == 3 { 2 } else { 8 }),
            })
        }
        fn epoch_before(&self, tp: &TopicPartition, offset: Offset) -> LeaderEpoch {
            LeaderEpoch(match (tp.partition, offset.0 > 50) {
                (3, _) => 1,
                (_, true) => 7,
                (_, false) => 6,
            })
        }
    }

    #[derive(Default)]
    struct FakeSink {
        active: BTreeSet<String>,
        written: BTreeMap<(String, TopicPartition), (Offset, LeaderEpoch)>,
    }
    impl OffsetSink for FakeSink {
        fn is_active(&self, group: &str) -> bool {
            self.active.contains(group)
        }
        fn write(&mut self, group: &str, o: &SourceOffset) -> Result<bool, SyncWriteError> {
            let new = (o.offset, o.leader_epoch);
            Ok(self.written.insert((group.to_owned(), o.tp.clone()), new) != Some(new))
        }
        fn committed_on(&self, tp: &TopicPartition) -> Vec<(String, SourceOffset)> {
            self.written
                .iter()
                .filter(|((_, t), _)| t == tp)
                .map(|((g, _), (offset, leader_epoch))| {
                    (
                        g.clone(),
                        SourceOffset {
                            tp: tp.clone(),
                            offset: *offset,
                            leader_epoch: *leader_epoch,
                            metadata: String::new(),
                        },
                    )
                })
                .collect()
        }
        fn forget(&mut self, tp: &TopicPartition) -> Result<usize, SyncWriteError> {
            let before = self.written.len();
            self.written.retain(|(_, t), _| t != tp);
            Ok(before - self.written.len())
        }
    }

    fn off(p: i32, o: i64) -> SourceOffset {
        SourceOffset {
            tp: tp(p),
            offset: Offset(o),
            leader_epoch: LeaderEpoch(3),
            metadata: String::new(),
        }
    }

    #[test]
    fn clamp_rule() {
        let b = LocalBounds {
            log_start: Offset(10),
            log_end: Offset(100),
            leader_epoch: LeaderEpoch(0),
        };
        assert_eq!(clamp(Offset(50), b), (Offset(50), false));
        assert_eq!(clamp(Offset(100), b), (Offset(100), false));
        assert_eq!(clamp(Offset(150), b), (Offset(100), true));
        assert_eq!(clamp(Offset(3), b), (Offset(10), true));
    }

    #[test]
    fn synced_epoch_never_exceeds_the_announced_one() {
        let before = || LeaderEpoch(4);
        // The source's epoch is kept when kmirror announces at least that much.
        assert_eq!(
            synced_epoch(LeaderEpoch(3), false, LeaderEpoch(3), before),
            LeaderEpoch(3)
        );
        assert_eq!(
            synced_epoch(LeaderEpoch(3), false, LeaderEpoch(9), before),
            LeaderEpoch(3)
        );
        // Above it (the source's leader moved on without records): kmirror's own epoch.
        assert_eq!(
            synced_epoch(LeaderEpoch(5), false, LeaderEpoch(4), before),
            LeaderEpoch(4)
        );
        // A moved offset always takes kmirror's epoch, even a lower one.
        assert_eq!(
            synced_epoch(LeaderEpoch(3), true, LeaderEpoch(9), before),
            LeaderEpoch(4)
        );
        assert_eq!(
            synced_epoch(LeaderEpoch::NONE, false, LeaderEpoch(0), before),
            LeaderEpoch::NONE
        );
    }

    #[test]
    fn a_source_epoch_above_kmirrors_is_replaced_by_the_local_one() {
        let d = def("");
        // Partition 3 announces epoch 2; the source committed at epoch 3.
        let parts: BTreeSet<TopicPartition> = [tp(0), tp(3)].into();
        let source = FakeSource(
            vec![SourceGroup {
                group: "app".into(),
                offsets: vec![off(0, 42), off(3, 42)],
            }],
            false,
        );
        let mut sink = FakeSink::default();
        let deadline = Instant::now() + Duration::from_secs(1);
        let r = sync_mirror(&d, &parts, &source, &FakeLocal, &mut sink, deadline).unwrap();
        assert_eq!((r.written, r.clamped), (2, 0));
        let w = |p| sink.written[&("app".to_owned(), tp(p))];
        assert_eq!(w(0), (Offset(42), LeaderEpoch(3)));
        assert_eq!(
            w(3),
            (Offset(42), LeaderEpoch(1)),
            "epoch of the local record before 42"
        );
    }

    #[test]
    fn copies_clamps_filters_and_skips_active_groups() {
        let d = def("mirror.groups.exclude=tmp-.*\n");
        let parts: BTreeSet<TopicPartition> = [tp(0), tp(1), tp(2)].into();
        let source = FakeSource(
            vec![
                SourceGroup {
                    group: "app".into(),
                    offsets: vec![
                        off(0, 42),
                        off(1, 500),
                        off(2, 1),
                        off(9, 5),
                        SourceOffset {
                            tp: TopicPartition::new("other", 0),
                            ..off(0, 5)
                        },
                    ],
                },
                SourceGroup {
                    group: "busy".into(),
                    offsets: vec![off(0, 1)],
                },
                SourceGroup {
                    group: "tmp-1".into(),
                    offsets: vec![off(0, 1)],
                },
            ],
            false,
        );
        let mut sink = FakeSink::default();
        sink.active.insert("busy".into());
        let deadline = Instant::now() + Duration::from_secs(1);
        let r = sync_mirror(&d, &parts, &source, &FakeLocal, &mut sink, deadline).unwrap();
        assert_eq!(
            r,
            SyncReport {
                groups_seen: 2,
                groups_active: 1,
                written: 3,
                unchanged: 0,
                clamped: 2
            }
        );
        let w = |p| sink.written[&("app".to_owned(), tp(p))];
        assert_eq!(w(0), (Offset(42), LeaderEpoch(3)), "copied as it is");
        assert_eq!(
            w(1),
            (Offset(100), LeaderEpoch(7)),
            "clamped to the local end"
        );
        assert_eq!(
            w(2),
            (Offset(10), LeaderEpoch(6)),
            "clamped to the local start"
        );
        assert_eq!(
            sink.written.len(),
            3,
            "unmirrored partitions and busy/excluded groups untouched"
        );
        // Again: nothing changes.
        let r = sync_mirror(&d, &parts, &source, &FakeLocal, &mut sink, deadline).unwrap();
        assert_eq!((r.written, r.unchanged), (0, 3));
    }

    #[test]
    fn a_dead_source_is_an_error_not_a_hang() {
        let d = def("");
        let parts: BTreeSet<TopicPartition> = [tp(0)].into();
        let mut sink = FakeSink::default();
        let e = sync_mirror(
            &d,
            &parts,
            &FakeSource(vec![], true),
            &FakeLocal,
            &mut sink,
            Instant::now(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("connection refused"), "{e}");
    }

    #[test]
    fn blocking_source_gives_up_at_the_deadline() {
        // A port nobody listens on (bound, then closed) answers with a refusal at once; an
        // expired deadline fails before connecting at all.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let d = def("").clone();
        let mut d = d;
        d.source.bootstrap_servers = vec![format!("127.0.0.1:{port}")];
        let start = Instant::now();
        let e = BlockingSourceGroups
            .read(
                &d,
                &|_| true,
                &BTreeSet::new(),
                Instant::now() + Duration::from_secs(2),
            )
            .unwrap_err();
        assert!(e.contains("127.0.0.1"), "{e}");
        let e = BlockingSourceGroups
            .read(&d, &|_| true, &BTreeSet::new(), start)
            .unwrap_err();
        assert!(e.contains("deadline"), "{e}");
    }

    #[test]
    fn schedule_runs_each_mirror_once_per_interval() {
        let d = def("sync.group.offsets.interval.ms=1000\n");
        let mut s = GroupSyncSchedule::default();
        assert!(s.due(&d, 0));
        assert!(!s.due(&d, 999));
        assert!(s.due(&d, 1000));
        let off = def("sync.group.offsets.enabled=false\n");
        assert!(!s.due(&off, 5000));
    }
}
