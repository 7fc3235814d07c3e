//! Reports: `list`, `describe` and the partition states for `/metrics`. None of them waits on
//! a source: `describe` shows the source high watermark the fetchers last saw, or for
//! partitions without a fetcher the last background listing with its age.

use super::*;
use crate::control::unclean_recovery::UncleanRecoveries;

/// A row of `list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MirrorSummary {
    pub mirror: String,
    pub topics: usize,
    pub source_cluster_id: Option<String>,
    pub source_bootstrap_servers: String,
    pub mirror_epoch: i32,
    /// The sources followed before this one, oldest first (`mirrors repoint`; absent when
    /// never re-pointed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lineage: Vec<crate::control::lineage::Hop>,
}

/// The answer of `check_source`: whether the source answered Metadata over the mirror's own
/// connection (TLS, SASL), or why not. `retryable: false` means credentials or certificates
/// were refused: trying again cannot help.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SourceCheck {
    pub mirror: String,
    pub bootstrap_servers: String,
    pub security_protocol: String,
    pub sasl_mechanism: Option<String>,
    pub sasl_username: Option<String>,
    pub cluster_id: Option<String>,
    pub topics: Option<usize>,
    pub error: Option<String>,
    pub retryable: bool,
}

/// A row of `describe` (field names as KIP-1279's `--describe --json`, plus kmirror's extras).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionRow {
    pub mirror: String,
    pub topic: String,
    pub partition: i32,
    pub state: StateName,
    pub source_offset: Option<i64>,
    pub destination_offset: Option<i64>,
    pub lag: Option<i64>,
    pub lag_seconds: Option<f64>,
    /// How old `source_offset` is (ms) when it was listed for a partition without a fetcher
    /// (the listing runs in the background; `describe` never waits for the source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_offset_age_ms: Option<i64>,
    /// Throttle time (ms) the source's quotas imposed on this partition's fetch connection.
    #[serde(default)]
    pub throttle_time_ms: Option<i64>,
    /// -1 non-retryable, n the attempt, 0 when not FAILED.
    pub retry_attempt: i32,
    pub error_message: Option<String>,
    pub last_mirror_epoch: Option<i32>,
    pub last_end_offset: Option<i64>,
    /// Why the topic's latest source configs were not applied (the previous ones are).
    #[serde(default)]
    pub config_error: Option<String>,
    /// Offsets skipped since this process started because the source's retention passed the
    /// local log end: the log keeps its batches and has an offset gap (issue 11 item 5).
    #[serde(default)]
    pub skipped_records: i64,
    /// While MIRRORING, why appends are paused and retried (a full disk: issue 11 item 6).
    #[serde(default)]
    pub stalled: Option<String>,
    /// Unclean-election recoveries (`mirror.support.unclean.leader.election`): how many, the
    /// records they moved to the quarantine, and the newest ones with offsets and epochs.
    #[serde(default, skip_serializing_if = "UncleanRecoveries::is_empty")]
    pub unclean_recoveries: UncleanRecoveries,
    /// Integrity audit (`control::audit`): every offset below this was re-read locally and
    /// matched the source's batch (offsets, leader epoch, CRC); durable across restarts.
    #[serde(default)]
    pub verified_offset: Option<i64>,
    /// Newest source timestamp among the verified batches.
    #[serde(default)]
    pub verified_timestamp_ms: Option<i64>,
    /// 0 when verified to the local log end, else the age of the newest verified record.
    #[serde(default)]
    pub verified_lag_seconds: Option<f64>,
    /// The mirror's ACL sync from its source (the same on every row of the mirror).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl_sync: Option<super::AclSyncStatus>,
    /// The topic's upstream chain, oldest first (`control::lineage::chain`): each cluster its
    /// data came through with the mirror epoch of the kmirror that copied it; the last link is
    /// this kmirror's current source. Empty until the first config sync records it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lineage: Vec<crate::control::lineage::chain::Link>,
}

/// What a command changed, for the operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CommandReport {
    pub mirror: String,
    pub changed: Vec<String>,
    pub unchanged: Vec<String>,
    /// `stop` only: what the last group-offset sync did, or why it was skipped (the consumers
    /// moving to kmirror then resume from the last periodic sync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_sync: Option<String>,
}

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    pub(super) fn summary(&self, name: &MirrorName) -> MirrorSummary {
        let e = &self.mirrors[name];
        let mut topics: Vec<&str> = e.partitions.keys().map(|tp| tp.topic.as_str()).collect();
        topics.dedup();
        MirrorSummary {
            mirror: name.to_string(),
            topics: topics.len(),
            source_cluster_id: e.record.source_cluster_id.clone(),
            source_bootstrap_servers: e.record.definition.source.bootstrap_servers.join(","),
            mirror_epoch: e.epoch.0,
            lineage: e.record.lineage.clone(),
        }
    }

    pub fn list(&self) -> Vec<MirrorSummary> {
        self.mirrors.keys().map(|n| self.summary(n)).collect()
    }

    /// `describe`: one row per partition of one mirror, or of all (never waits on a source). Lag is the source's high
    /// watermark minus the local log end; lag in seconds is 0 when caught up, else the age
    /// (now minus its batch's max timestamp) of the newest record stored.
    pub fn describe(&mut self, mirror: Option<&str>) -> Result<Vec<PartitionRow>, ControlError> {
        let names: Vec<MirrorName> = match mirror {
            Some(m) => vec![self.entry(m)?.0.clone()],
            None => self.mirrors.keys().cloned().collect(),
        };
        // Answers that came back since the last tick, then a new listing in the background.
        self.apply_results()?;
        let now = now_ms();
        let mut rows = Vec::new();
        for name in names {
            self.refresh_idle_offsets(&name);
            let acl_sync = self.acl_sync_status(&name);
            let e = &self.mirrors[&name];
            for (tp, p) in &e.partitions {
                let Some(state) = p.machine.state() else {
                    continue;
                };
                let mut progress = self.data.progress(tp);
                let mut age = None;
                if !p.machine.wants_fetcher() {
                    if let Some((hw, at)) = self.idle_offsets.get(tp) {
                        progress.source_high_watermark = Some(*hw);
                        age = Some((now - at).max(0));
                    }
                }
                let lag = match (progress.source_high_watermark, progress.local_log_end) {
                    (Some(hw), Some(end)) => Some(hw.saturating_sub(end).max(0)),
                    _ => None,
                };
                let lag_seconds = match lag {
                    Some(0) => Some(0.0),
                    Some(_) => progress
                        .newest_timestamp_ms
                        .map(|ts| (now - ts).max(0) as f64 / 1000.0),
                    None => None,
                };
                let audit = self.audit_of(name.as_str(), tp).map(|mut a| {
                    a.log_end_offset = progress.local_log_end.or(a.log_end_offset);
                    a
                });
                rows.push(PartitionRow {
                    mirror: name.to_string(),
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    state,
                    source_offset: progress.source_high_watermark,
                    destination_offset: progress.local_log_end,
                    lag,
                    lag_seconds,
                    source_offset_age_ms: age,
                    throttle_time_ms: progress.throttled_ms,
                    retry_attempt: p.machine.failure().map_or(0, |f| f.retry.as_kip_value()),
                    error_message: p.machine.failure().map(|f| f.message.clone()),
                    last_mirror_epoch: p.last.map(|l| l.mirror_epoch),
                    last_end_offset: p.last.map(|l| l.end_offset),
                    config_error: e.config_errors.get(&tp.topic).cloned(),
                    skipped_records: progress.skipped_records,
                    stalled: progress.stalled.clone(),
                    unclean_recoveries: progress.unclean.clone(),
                    verified_offset: audit.as_ref().and_then(|a| a.verified_offset),
                    verified_timestamp_ms: audit.as_ref().and_then(|a| a.verified_timestamp_ms),
                    verified_lag_seconds: audit.as_ref().and_then(|a| a.verified_lag_seconds(now)),
                    acl_sync: acl_sync.clone(),
                    lineage: e.lineages.get(&tp.topic).cloned().unwrap_or_default(),
                });
            }
        }
        Ok(rows)
    }

    /// Every partition's state, without asking any source (for `/metrics`, which is scraped
    /// often and must not send ListOffsets to the sources the way `describe` does).
    pub fn partition_states(&self) -> Vec<(MirrorName, TopicPartition, StateName)> {
        let mut out = Vec::new();
        for (name, e) in &self.mirrors {
            for (tp, p) in &e.partitions {
                if let Some(state) = p.machine.state() {
                    out.push((name.clone(), tp.clone(), state));
                }
            }
        }
        out
    }
}
