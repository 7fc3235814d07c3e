//! Continuous integrity audit (issue 16 item 1): what the DR copy provably holds.
//!
//! Per mirror, every `mirror.audit.interval.ms`, the controller's tick starts one audit round
//! on a source worker (`JobKind::Audit`, keyed by mirror, within the source request deadline;
//! never on the control thread). The round, for each partition the mirror holds:
//!
//! 1. re-reads the local batches from the partition's verified mark on (`scrub`: framing, CRC,
//!    offsets, index entries), from the published segment files, never the shard's memory;
//! 2. fetches the same offsets again from the source (`source_read`) and compares each batch's
//!    base/last offset, leader epoch and CRC (`compare`); the mark moves past every batch that
//!    matched (`verified`, durable in `<data_dir>/kmirror-audit-verified`);
//! 3. with what the byte budget leaves, re-scrubs already verified data from a cursor that
//!    cycles through the log (local only: bit rot after verification is found here).
//!
//! The round's answer is applied by the next tick on the control thread (`AuditPlane::apply`):
//! marks advance, counters grow, and a mismatch or scrub fault becomes an event (kept for
//! `kmirror audit report`, logged with both CRCs and offsets) and makes the partition FAILED,
//! not retryable, with the reason. One mismatch is not the audit's to decide: offsets of our
//! newest leader epoch rewritten under a newer source epoch (an unclean election) are what the
//! fetcher's divergence check stops on at its next fetch, and it applies
//! `mirror.support.unclean.leader.election`; the audit notes them and leaves it to it.
//! Mirroring at full speed outruns a small budget; the verified mark then lags, and every
//! mirrored range is still verified once, in order.

pub mod compare;
pub mod scrub;
pub mod settings;
pub mod source_read;
pub mod verified;

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::control::mirror_def::MirrorDefinition;
use crate::control::source_catalog::Deadline;
use crate::ids::{Offset, TopicPartition};
use crate::limits::{AUDIT_EVENTS_MAX, AUDIT_PARTITION_SHARE_MIN_BYTES};
use crate::log::read_view::{PartitionHandle, ReadCatalog};
use crate::log::LogError;

pub use compare::Mismatch;
pub use scrub::{BatchId, ScrubFault};
pub use settings::AuditSettings;
pub use verified::{Verified, VerifiedStore};

/// One partition in a round.
pub struct PartJob {
    pub tp: TopicPartition,
    pub topic_id: Uuid,
    pub handle: Arc<PartitionHandle>,
    pub verified: Offset,
    pub rescrub: Offset,
    /// False for compacted topics: scrub only (see `COMPACTED_NOTE`).
    pub compare: bool,
    /// The partition's truncation count when the round was planned (see `PartResult::cuts`).
    pub cuts: u64,
}

/// A round for one mirror, run on a source worker.
pub struct RoundJob {
    pub mirror: String,
    pub def: MirrorDefinition,
    pub parts: Vec<PartJob>,
    pub budget: u64,
}

/// What a round found for one partition.
#[derive(Debug, Clone)]
pub struct PartResult {
    pub tp: TopicPartition,
    pub verified: Option<Verified>,
    pub rescrub_next: Option<Offset>,
    pub log_end: Offset,
    pub bytes_read: u64,
    pub bytes_fetched: u64,
    pub mismatch: Option<Mismatch>,
    pub scrub_fault: Option<ScrubFault>,
    /// A reason this round could not check (source unreachable, a segment deleted under it).
    pub note: Option<String>,
    /// `PartJob::cuts`: a log truncated since (an unclean-election recovery) makes the
    /// round's marks stale, so they are not applied.
    pub cuts: u64,
    /// The mismatch is a rewrite under a newer source leader epoch of our log's newest epoch:
    /// the fetcher's own divergence check (DivergingEpoch / OffsetForLeaderEpoch) stops on it
    /// at its next fetch and applies `mirror.support.unclean.leader.election` (FAILED, or the
    /// recovery into the quarantine). The audit leaves that decision to it, so the outcome
    /// does not depend on which of the two looked first.
    pub fetcher_decides: bool,
}

impl PartResult {
    fn new(tp: TopicPartition) -> PartResult {
        PartResult {
            tp,
            verified: None,
            rescrub_next: None,
            log_end: Offset(0),
            bytes_read: 0,
            bytes_fetched: 0,
            mismatch: None,
            scrub_fault: None,
            note: None,
            cuts: 0,
            fetcher_decides: false,
        }
    }
}

/// A round's answer, applied on the control thread.
#[derive(Debug, Clone)]
pub struct RoundAnswer {
    pub mirror: String,
    pub parts: Vec<PartResult>,
}

impl RoundJob {
    /// Runs the round within `by`. Partitions are taken oldest-unverified first; the budget is
    /// shared equally (a partition with nothing new gives its share to the re-scrub).
    pub fn run(self, by: Deadline) -> RoundAnswer {
        let n = self.parts.len().max(1) as u64;
        let share = (self.budget / n).max(1);
        let mut results = Vec::new();
        let mut asks = Vec::new();
        let mut locals = Vec::new();
        // Each partition's newest leader epoch in the view its batches were read from.
        let mut newest = Vec::new();
        for p in &self.parts {
            let view = p.handle.view();
            newest.push(view.leader_epoch().0);
            let mut r = PartResult::new(p.tp.clone());
            r.cuts = p.cuts;
            if !p.compare {
                // The source's cleaner rewrites batches of a compacted topic (new CRCs, fewer
                // records), so comparing would report differences that are not damage: its
                // partitions get the local scrub only, over the whole log.
                r.log_end = scrub::log_end(&view);
                rescrub(&view, p.rescrub, r.log_end, share, &mut r);
                r.note = r.note.take().or(Some(COMPACTED_NOTE.into()));
                results.push(r);
                locals.push(Vec::new());
                continue;
            }
            let from = p.verified.max(view.log_start);
            let read = match scrub::scrub(&view, from, share) {
                Ok(read) => read,
                Err(why) => {
                    r.note = Some(why);
                    results.push(r);
                    locals.push(Vec::new());
                    continue;
                }
            };
            r.log_end = read.log_end;
            r.bytes_read = read.bytes;
            if let Some(f) = read.fault {
                r.scrub_fault = Some(f);
                results.push(r);
                locals.push(Vec::new());
                continue;
            }
            if !read.batches.is_empty() {
                asks.push(source_read::SourceAsk {
                    tp: p.tp.clone(),
                    from: Offset(read.batches[0].base_offset),
                    max_bytes: read.bytes.clamp(1, i32::MAX as u64) as i32,
                });
            } else if from > p.verified {
                // Nothing local below `from` any more (retention): the mark starts there.
                r.verified = Some(Verified {
                    next: from,
                    source_timestamp: None,
                });
            }
            // What the share leaves re-scrubs verified data, cycling through the log.
            let left = share.saturating_sub(read.bytes);
            if left > 0 && p.verified > view.log_start {
                rescrub(&view, p.rescrub, p.verified, left, &mut r);
            }
            results.push(r);
            locals.push(read.batches);
        }
        let answers = if asks.is_empty() {
            Ok(BTreeMap::new())
        } else {
            source_read::read(&self.def, &asks, by)
        };
        for (((r, local), p), newest) in
            results.iter_mut().zip(&locals).zip(&self.parts).zip(newest)
        {
            if local.is_empty() || r.scrub_fault.is_some() {
                continue;
            }
            let answer = match &answers {
                Ok(a) => a.get(&r.tp),
                Err(f) => {
                    r.note = Some(format!("source not read: {}", f.message));
                    continue;
                }
            };
            let Some(s) = answer else {
                r.note = Some("the source's answer left this partition out".into());
                continue;
            };
            r.bytes_fetched = s.bytes;
            let c = compare::compare(local, &s.batches);
            if let Some(next) = c.verified_next {
                r.verified = Some(Verified {
                    next,
                    source_timestamp: c.source_timestamp,
                });
            }
            if let Some(mut m) = c.mismatch {
                if let Some(id) = s.topic_id.filter(|id| !id.is_nil() && *id != p.topic_id) {
                    m.why.push_str(&format!(
                        "; the source topic's id is now {id}, mirrored from {} (deleted and recreated)",
                        p.topic_id
                    ));
                }
                r.fetcher_decides = fetcher_sees(&m, newest);
                r.mismatch = Some(m);
            } else if c.matched == 0 {
                r.note = s.error.clone().or_else(|| {
                    s.log_start
                        .filter(|start| start.0 > local[0].base_offset)
                        .map(|start| {
                            format!(
                                "the source no longer holds offsets below {start} (its retention)"
                            )
                        })
                });
            }
        }
        RoundAnswer {
            mirror: self.mirror,
            parts: results,
        }
    }
}

/// Whether the fetcher's divergence check is bound to stop on `m`: the source holds a newer
/// leader epoch at offsets where our log has its newest epoch `newest`. Source epochs only
/// grow with offsets, so the source's end of epoch `newest` is at or below `m`'s offsets,
/// below our log end, and the next fetch (last fetched epoch `newest`) is told it diverged.
/// A rewrite under an older epoch of ours is behind the fetcher's position: only the audit
/// sees it.
fn fetcher_sees(m: &Mismatch, newest: i32) -> bool {
    m.source.leader_epoch > m.local.leader_epoch && m.local.leader_epoch == newest
}

/// Why a partition's verified mark does not move although the audit runs.
pub const COMPACTED_NOTE: &str =
    "compacted topic: the source's cleaner rewrites batches, so only the local scrub runs";

/// Re-scrubs from `cursor` (back at the log start once it reached `until`) with `budget`.
fn rescrub(
    view: &crate::log::read_view::PartitionReadView,
    cursor: Offset,
    until: Offset,
    budget: u64,
    r: &mut PartResult,
) {
    let at = if cursor >= until || cursor < view.log_start {
        view.log_start
    } else {
        cursor
    };
    match scrub::scrub(view, at, budget) {
        Ok(again) => {
            r.bytes_read += again.bytes;
            r.rescrub_next = Some(again.next);
            if let Some(f) = again.fault {
                r.scrub_fault = Some(f);
            }
        }
        Err(why) => r.note = Some(why),
    }
}

/// A mismatch or scrub fault, as kept for the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub at_ms: i64,
    pub mirror: String,
    pub topic: String,
    pub partition: i32,
    /// `mismatch` (differs from the source) or `scrub` (the local copy is damaged).
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<Mismatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub: Option<ScrubFault>,
    pub message: String,
}

/// One partition's audit state, for describe, the report and /metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionAudit {
    pub mirror: String,
    pub topic: String,
    pub partition: i32,
    /// Every offset below this was compared with the source and matched.
    pub verified_offset: Option<i64>,
    pub verified_timestamp_ms: Option<i64>,
    /// The local log end when the last round looked.
    pub log_end_offset: Option<i64>,
    /// Where the re-scrub of verified data stands.
    pub rescrub_offset: Option<i64>,
    pub bytes_read: u64,
    pub bytes_fetched: u64,
    pub mismatches: u64,
    /// Why the last round could not check (transient: retried next round).
    pub note: Option<String>,
}

impl PartitionAudit {
    /// 0 when verified to the log end, else the age of the newest verified source record.
    pub fn verified_lag_seconds(&self, now_ms: i64) -> Option<f64> {
        match (self.verified_offset, self.log_end_offset) {
            (Some(v), Some(end)) if v >= end => Some(0.0),
            _ => self
                .verified_timestamp_ms
                .map(|ts| (now_ms - ts).max(0) as f64 / 1000.0),
        }
    }
}

/// `kmirror audit report`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditReport {
    pub mirror: String,
    pub settings: AuditSettings,
    pub partitions: Vec<PartitionAudit>,
    pub events: Vec<AuditEvent>,
    pub bytes_read: u64,
    pub bytes_fetched: u64,
    pub mismatches: u64,
}

/// The audit rows /metrics renders, published by the control thread after each round.
#[derive(Debug, Default)]
pub struct AuditBoard {
    rows: Mutex<Arc<Vec<PartitionAudit>>>,
}

impl AuditBoard {
    pub fn rows(&self) -> Arc<Vec<PartitionAudit>> {
        Arc::clone(&self.rows.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn publish(&self, rows: Vec<PartitionAudit>) {
        *self.rows.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(rows);
    }
}

#[derive(Debug, Default, Clone)]
struct PartState {
    rescrub: Offset,
    log_end: Option<Offset>,
    bytes_read: u64,
    bytes_fetched: u64,
    mismatches: u64,
    /// A fault was found: not audited again (until a restart, which finds it again).
    faulted: bool,
    /// The round that last included this partition.
    last_round: u64,
    note: Option<String>,
}

/// The audit's state; owned by the control thread (inside the controller).
pub struct AuditPlane {
    catalog: Arc<ReadCatalog>,
    store: VerifiedStore,
    parts: BTreeMap<(String, TopicPartition), PartState>,
    next_round: BTreeMap<String, i64>,
    events: VecDeque<AuditEvent>,
    board: Arc<AuditBoard>,
    /// Rounds planned so far (orders the re-scrub of caught-up partitions).
    rounds: u64,
    /// Per partition, how often its log was truncated under the audit (`truncated`).
    cuts: BTreeMap<TopicPartition, u64>,
}

impl AuditPlane {
    pub fn open(data_dir: &Path, catalog: Arc<ReadCatalog>) -> Result<AuditPlane, LogError> {
        Ok(AuditPlane {
            catalog,
            store: VerifiedStore::open(data_dir)?,
            parts: BTreeMap::new(),
            next_round: BTreeMap::new(),
            events: VecDeque::new(),
            board: Arc::default(),
            rounds: 0,
            cuts: BTreeMap::new(),
        })
    }

    pub fn board(&self) -> Arc<AuditBoard> {
        Arc::clone(&self.board)
    }

    /// Whether a round of `mirror` is due at `now_ms` (the first one a little after start,
    /// so start-up is not slowed by it); schedules the next.
    pub fn due(&mut self, mirror: &str, settings: &AuditSettings, now_ms: i64) -> bool {
        if !settings.enabled {
            return false;
        }
        let next = self
            .next_round
            .entry(mirror.to_owned())
            .or_insert(now_ms.saturating_add(settings.interval_ms.min(1_000) as i64));
        if now_ms < *next {
            return false;
        }
        *next = now_ms.saturating_add(settings.interval_ms as i64);
        true
    }

    /// The round of `mirror` over `parts` (partition, source topic id, whether to compare with
    /// the source), oldest-unverified
    /// first; partitions with a fault found, or not in the catalog, are left out.
    pub fn round(
        &mut self,
        def: &MirrorDefinition,
        parts: &[(TopicPartition, Uuid, bool)],
    ) -> Option<RoundJob> {
        let mirror = def.name.to_string();
        self.rounds += 1;
        let round = self.rounds;
        let mut jobs = Vec::new();
        for (tp, topic_id, compare) in parts {
            let st = self.parts.entry((mirror.clone(), tp.clone())).or_default();
            if st.faulted {
                continue;
            }
            let Some(handle) = self.catalog.get(tp) else {
                continue;
            };
            let v = self.store.get(tp);
            let verified = v.map_or(Offset(0), |v| v.next);
            // Partitions with unverified data first, oldest verified source time first; then
            // the caught-up ones (re-scrub only), the longest unaudited first.
            let behind = *compare && verified < scrub::log_end(&handle.view());
            let key = (
                !behind,
                if behind {
                    v.and_then(|v| v.source_timestamp).map_or(i64::MIN, |t| t.0)
                } else {
                    st.last_round as i64
                },
            );
            jobs.push((
                key,
                PartJob {
                    tp: tp.clone(),
                    topic_id: *topic_id,
                    handle,
                    verified,
                    rescrub: st.rescrub,
                    compare: *compare,
                    cuts: self.cuts.get(tp).copied().unwrap_or(0),
                },
            ));
        }
        if jobs.is_empty() {
            return None;
        }
        jobs.sort_by(|(a, x), (b, y)| (a, &x.tp).cmp(&(b, &y.tp)));
        // Each partition in a round gets at least `AUDIT_PARTITION_SHARE_MIN_BYTES` of the
        // budget, so a mirror of many partitions audits a few hundred per round, in turn.
        let budget = def.audit.round_budget();
        let most = (budget / AUDIT_PARTITION_SHARE_MIN_BYTES).max(1) as usize;
        jobs.truncate(most);
        for (_, j) in &jobs {
            if let Some(st) = self.parts.get_mut(&(mirror.clone(), j.tp.clone())) {
                st.last_round = round;
            }
        }
        Some(RoundJob {
            mirror,
            def: def.clone(),
            parts: jobs.into_iter().map(|(_, j)| j).collect(),
            budget,
        })
    }

    /// Applies a round's answer; returns the partitions to fail, with why.
    pub fn apply(&mut self, a: RoundAnswer, now_ms: i64) -> Vec<(TopicPartition, String)> {
        let mut failed = Vec::new();
        for r in a.parts {
            let st = self
                .parts
                .entry((a.mirror.clone(), r.tp.clone()))
                .or_default();
            st.bytes_read += r.bytes_read;
            st.bytes_fetched += r.bytes_fetched;
            if r.cuts != self.cuts.get(&r.tp).copied().unwrap_or(0) {
                // The log was cut while this round read it: what it verified may be gone.
                st.note = Some("the log was truncated during this round; checked again".into());
                continue;
            }
            st.log_end = Some(r.log_end);
            st.note = r.note.clone();
            if let Some(next) = r.rescrub_next {
                st.rescrub = next;
            }
            if let Some(v) = r.verified {
                self.store.advance(&r.tp, v);
            }
            let event = |kind: &str, message: String| AuditEvent {
                at_ms: now_ms,
                mirror: a.mirror.clone(),
                topic: r.tp.topic.clone(),
                partition: r.tp.partition,
                kind: kind.to_owned(),
                mismatch: r.mismatch.clone(),
                scrub: r.scrub_fault.clone(),
                message,
            };
            if let (Some(m), true) = (&r.mismatch, r.fetcher_decides) {
                st.note = Some(format!(
                    "batch {}..={} was rewritten at the source under leader epoch {} (ours {}): \
                     left to the fetcher's divergence check",
                    m.local.base_offset,
                    m.local.last_offset,
                    m.source.leader_epoch,
                    m.local.leader_epoch
                ));
                tracing::warn!(mirror = %a.mirror, partition = %r.tp, "audit: {}; left to the fetcher's divergence check", m.why);
                continue;
            }
            let found = if let Some(m) = &r.mismatch {
                let message = format!(
                    "audit: batch {}..={} differs from the source: {} (local crc {:#010x} epoch {}, source offsets {}..={} crc {:#010x} epoch {})",
                    m.local.base_offset,
                    m.local.last_offset,
                    m.why,
                    m.local.crc,
                    m.local.leader_epoch,
                    m.source.base_offset,
                    m.source.last_offset,
                    m.source.crc,
                    m.source.leader_epoch
                );
                Some(event("mismatch", message))
            } else {
                r.scrub_fault.as_ref().map(|f| {
                    let crcs = match (f.stored_crc, f.computed_crc) {
                        (Some(s), Some(c)) => {
                            format!(" (stored crc {s:#010x}, computed {c:#010x})")
                        }
                        _ => String::new(),
                    };
                    event(
                        "scrub",
                        format!(
                            "audit: local batch {}..={} is damaged: {}{crcs} in {} at position {}",
                            f.base_offset, f.last_offset, f.why, f.segment, f.position
                        ),
                    )
                })
            };
            if let Some(e) = found {
                st.mismatches += 1;
                st.faulted = true;
                tracing::error!(mirror = %a.mirror, partition = %r.tp, "{}", e.message);
                failed.push((r.tp.clone(), e.message.clone()));
                if self.events.len() >= AUDIT_EVENTS_MAX {
                    self.events.pop_front();
                }
                self.events.push_back(e);
            }
        }
        if let Err(e) = self.store.save() {
            tracing::warn!("audit: cannot write the verified marks (kept in memory): {e}");
        }
        self.publish();
        failed
    }

    /// `tp`'s log was truncated to `end` (`control::unclean_recovery`): what was verified
    /// above it is gone, so the mark and the re-scrub cursor come down to `end`, durably.
    pub fn truncated(&mut self, tp: &TopicPartition, end: Offset) {
        *self.cuts.entry(tp.clone()).or_default() += 1;
        self.store.truncate(tp, end);
        for ((_, t), st) in self.parts.iter_mut() {
            if t == tp {
                st.rescrub = st.rescrub.min(end);
                st.log_end = st.log_end.map(|e| e.min(end));
            }
        }
        if let Err(e) = self.store.save() {
            tracing::warn!("audit: cannot write the verified marks (kept in memory): {e}");
        }
        self.publish();
    }

    /// "Verified through offset N (source timestamp T)" of `tp` (for the loss report).
    pub fn verified(&self, tp: &TopicPartition) -> Option<Verified> {
        self.store.get(tp)
    }

    /// Forgets partitions no mirror holds any more (their marks too); `held` is every
    /// (mirror, partition) the controller has, in any state.
    pub fn retain(&mut self, held: &std::collections::BTreeSet<(String, TopicPartition)>) {
        self.parts.retain(|k, _| held.contains(k));
        let tps: std::collections::BTreeSet<&TopicPartition> =
            held.iter().map(|(_, tp)| tp).collect();
        self.store.retain(|tp| tps.contains(tp));
    }

    pub fn partition(&self, mirror: &str, tp: &TopicPartition) -> PartitionAudit {
        let st = self
            .parts
            .get(&(mirror.to_owned(), tp.clone()))
            .cloned()
            .unwrap_or_default();
        let v = self.store.get(tp);
        PartitionAudit {
            mirror: mirror.to_owned(),
            topic: tp.topic.clone(),
            partition: tp.partition,
            verified_offset: v.map(|v| v.next.0),
            verified_timestamp_ms: v.and_then(|v| v.source_timestamp).map(|t| t.0),
            log_end_offset: st.log_end.map(|o| o.0),
            rescrub_offset: (st.rescrub > Offset(0)).then_some(st.rescrub.0),
            bytes_read: st.bytes_read,
            bytes_fetched: st.bytes_fetched,
            mismatches: st.mismatches,
            note: st.note,
        }
    }

    pub fn report(&self, def: &MirrorDefinition, tps: &[TopicPartition]) -> AuditReport {
        let mirror = def.name.to_string();
        let partitions: Vec<PartitionAudit> =
            tps.iter().map(|tp| self.partition(&mirror, tp)).collect();
        AuditReport {
            bytes_read: partitions.iter().map(|p| p.bytes_read).sum(),
            bytes_fetched: partitions.iter().map(|p| p.bytes_fetched).sum(),
            mismatches: partitions.iter().map(|p| p.mismatches).sum(),
            events: self
                .events
                .iter()
                .filter(|e| e.mirror == mirror)
                .cloned()
                .collect(),
            settings: def.audit.clone(),
            mirror,
            partitions,
        }
    }

    fn publish(&self) {
        let rows = self
            .parts
            .keys()
            .map(|(m, tp)| self.partition(m, tp))
            .collect();
        self.board.publish(rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::mirror_def::{parse_properties, MirrorName};
    use crate::ids::{LeaderEpoch, TimestampMs};
    use crate::log::config::LogConfig;
    use crate::log::io::StdIo;
    use crate::log::partition_log::PartitionLog;
    use crate::wire::batch_builder::BatchBuilder;

    fn def(extra: &str) -> MirrorDefinition {
        let props = parse_properties(&format!("bootstrap.servers=127.0.0.1:1\n{extra}")).unwrap();
        MirrorDefinition::from_properties(MirrorName::new("m").unwrap(), &props).unwrap()
    }

    /// Two partitions of 2 batches each; the first one's marks say it is verified to its end.
    #[test]
    fn a_round_takes_unverified_partitions_first_and_at_most_its_budget_allows() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = ReadCatalog::new();
        let mut logs = Vec::new();
        for p in 0..2 {
            let tp = TopicPartition::new("t", p);
            let mut log = PartitionLog::create(
                &dir.path().join(tp.dir_name()),
                tp.clone(),
                None,
                LogConfig::default(),
            )
            .unwrap();
            catalog.insert(tp, log.attach_read_view());
            for i in 0..2 {
                let b = BatchBuilder::new(Offset(i))
                    .leader_epoch(LeaderEpoch(0))
                    .value(TimestampMs(5), b"v")
                    .build();
                log.append(&mut StdIo, &b).unwrap();
            }
            logs.push(log);
        }
        let mut plane = AuditPlane::open(dir.path(), catalog).unwrap();
        plane.store.advance(
            &TopicPartition::new("t", 0),
            Verified {
                next: Offset(2),
                source_timestamp: Some(TimestampMs(1)),
            },
        );
        let parts: Vec<(TopicPartition, Uuid, bool)> = (0..2)
            .map(|p| (TopicPartition::new("t", p), Uuid::nil(), true))
            .collect();
        // 1 byte a second: one partition per round, the one with unverified data.
        let small = def("mirror.audit.bytes.per.sec=1\n");
        let job = plane.round(&small, &parts).unwrap();
        let tps: Vec<i32> = job.parts.iter().map(|j| j.tp.partition).collect();
        assert_eq!(tps, [1]);
        assert_eq!(job.parts[0].verified, Offset(0));
        // The default budget takes both, unverified first.
        let job = plane.round(&def(""), &parts).unwrap();
        let tps: Vec<i32> = job.parts.iter().map(|j| j.tp.partition).collect();
        assert_eq!(tps, [1, 0]);
        assert_eq!(job.parts[1].verified, Offset(2));
        // A round against an unreachable source verifies nothing and says why.
        let answer = job.run(Deadline::after_ms(2_000));
        assert!(answer
            .parts
            .iter()
            .all(|r| r.verified.is_none() && r.mismatch.is_none()));
        assert!(answer.parts[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("source not read")));
        drop(logs);
    }
    // Goal: a log cut by an unclean-election recovery brings its verified mark down to the cut,
    // and a round planned before the cut cannot raise it over the cut range when it answers.
    #[test]
    fn a_truncation_lowers_the_mark_and_drops_a_stale_round() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = ReadCatalog::new();
        let tp = TopicPartition::new("t", 0);
        let mut log = PartitionLog::create(
            &dir.path().join(tp.dir_name()),
            tp.clone(),
            None,
            LogConfig::default(),
        )
        .unwrap();
        catalog.insert(tp.clone(), log.attach_read_view());
        let b = BatchBuilder::new(Offset(0))
            .leader_epoch(LeaderEpoch(0))
            .value(TimestampMs(5), b"v")
            .build();
        log.append(&mut StdIo, &b).unwrap();
        let mut plane = AuditPlane::open(dir.path(), catalog).unwrap();
        let mark = |next| Verified {
            next: Offset(next),
            source_timestamp: Some(TimestampMs(5)),
        };
        plane.store.advance(&tp, mark(3));
        let parts = [(tp.clone(), Uuid::nil(), true)];
        let stale = plane.round(&def(""), &parts).unwrap();
        plane.truncated(&tp, Offset(1));
        assert_eq!(plane.verified(&tp).map(|v| v.next), Some(Offset(1)));
        let answer = |cuts| {
            let mut r = PartResult::new(tp.clone());
            r.verified = Some(mark(4));
            r.cuts = cuts;
            RoundAnswer {
                mirror: "m".into(),
                parts: vec![r],
            }
        };
        plane.apply(answer(stale.parts[0].cuts), 0);
        assert_eq!(plane.verified(&tp).map(|v| v.next), Some(Offset(1)));
        let fresh = plane.round(&def(""), &parts).unwrap();
        plane.apply(answer(fresh.parts[0].cuts), 0);
        assert_eq!(plane.verified(&tp).map(|v| v.next), Some(Offset(4)));
        drop(log);
    }

    // Goal: a rewrite under a newer source epoch of the log's newest epoch is left to the
    // fetcher (which applies mirror.support.unclean.leader.election), not failed by the audit;
    // one under an older epoch of ours, which the fetcher is already past, fails the partition.
    #[test]
    fn a_rewrite_the_fetcher_will_see_is_left_to_it_and_one_behind_it_fails() {
        let id = |base, last, epoch, crc| BatchId {
            base_offset: base,
            last_offset: last,
            leader_epoch: epoch,
            crc,
            max_timestamp_ms: 0,
        };
        let rewrite = Mismatch {
            local: id(200, 201, 0, 1),
            source: id(200, 229, 2, 2),
            why: "rewritten".into(),
        };
        assert!(fetcher_sees(&rewrite, 0));
        assert!(!fetcher_sees(&rewrite, 1), "ours moved on to epoch 1");
        let damaged = Mismatch {
            source: id(200, 201, 0, 2),
            ..rewrite.clone()
        };
        assert!(!fetcher_sees(&damaged, 0), "same epoch, other bytes");

        let dir = tempfile::tempdir().unwrap();
        let mut plane = AuditPlane::open(dir.path(), ReadCatalog::new()).unwrap();
        let answer = |m: Mismatch, decides| {
            let mut r = PartResult::new(TopicPartition::new("t", 0));
            r.mismatch = Some(m);
            r.fetcher_decides = decides;
            RoundAnswer {
                mirror: "m".into(),
                parts: vec![r],
            }
        };
        assert!(plane.apply(answer(rewrite.clone(), true), 0).is_empty());
        let row = plane.partition("m", &TopicPartition::new("t", 0));
        assert_eq!(row.mismatches, 0);
        assert!(row.note.unwrap().contains("fetcher's divergence check"));
        let failed = plane.apply(answer(rewrite, false), 0);
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].1.contains("differs from the source"),
            "{failed:?}"
        );
    }
}
