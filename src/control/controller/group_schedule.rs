//! When group-offset syncs run (`control::group_sync` has the rules): every
//! `sync.group.offsets.interval.ms` per mirror from the tick, the source read on a worker and
//! its answer applied by a later tick; and once more at `stop` (`FinalSync`), bounded by the
//! mirror's `sync.group.offsets.final.timeout.ms`, skipped (and reported so) when the source
//! does not answer in time.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::control::group_sync::{
    self, GroupSyncError, GroupSyncSchedule, LocalLogs, OffsetSink, SourceGroup, SourceGroups,
    SyncReport,
};
use crate::control::source_worker::JobKind;
use crate::limits::GROUP_SYNC_ROUND_TIMEOUT_MS;

/// What the controller needs to run the group-offset sync (`control::group_sync`).
pub struct GroupSyncPlane {
    /// Read on the source workers.
    pub source: Arc<dyn SourceGroups + Send + Sync>,
    pub local: Box<dyn LocalLogs + Send>,
    pub sink: Box<dyn OffsetSink + Send>,
    pub schedule: GroupSyncSchedule,
}

/// A periodic group read's answer.
pub(super) struct GroupsAnswer {
    mirror: MirrorName,
    groups: Result<Vec<SourceGroup>, GroupSyncError>,
}

/// The last group sync of a `stop`, between `command_begin` and `command_finish`.
pub struct FinalSync {
    pub(super) name: MirrorName,
    partitions: BTreeSet<TopicPartition>,
    /// The source read (taken when run).
    pub ask: Option<SourceAsk<Result<Vec<SourceGroup>, GroupSyncError>>>,
    pub timeout_ms: u64,
}

/// What a sync did, for the operator.
fn done(r: &SyncReport) -> String {
    format!(
        "done: {} group(s) read, {} offset(s) written, {} unchanged, {} clamped, {} group(s) \
         left alone (active on kmirror)",
        r.groups_seen, r.written, r.unchanged, r.clamped, r.groups_active
    )
}

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// Starts the periodic group-offset sync of every mirror.
    pub fn attach_group_sync(&mut self, plane: GroupSyncPlane) {
        self.group_sync = Some(plane);
    }

    /// The partitions whose group offsets a mirror syncs: those in MIRRORING, plus those being
    /// stopped when `stopping` (the last sync at failover).
    pub(super) fn group_sync_partitions(
        &self,
        name: &MirrorName,
        stopping: bool,
    ) -> std::collections::BTreeSet<TopicPartition> {
        self.mirrors[name]
            .partitions
            .iter()
            .filter(|(_, p)| match p.machine.state() {
                Some(StateName::Mirroring) => true,
                Some(StateName::Stopping) => stopping,
                _ => false,
            })
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    /// Starts the group read of every mirror whose round is due, on the workers. A read of
    /// the same mirror still in flight (a source that does not answer) skips the round.
    pub(super) fn start_group_syncs(&mut self, now_ms: i64) {
        let Some(plane) = self.group_sync.as_mut() else {
            return;
        };
        let mut due = Vec::new();
        for (name, e) in &self.mirrors {
            let def = &e.record.definition;
            if plane.schedule.due(def, now_ms) {
                due.push(name.clone());
            }
        }
        let source = Arc::clone(&plane.source);
        for name in due {
            let parts = self.group_sync_partitions(&name, false);
            if parts.is_empty() {
                continue;
            }
            let def = self.mirrors[&name].record.definition.clone();
            let source = Arc::clone(&source);
            let mirror = name.clone();
            self.run_periodic(JobKey::new(name.as_str(), JobKind::Groups), move |by| {
                let deadline = by
                    .at
                    .min(Instant::now() + Duration::from_millis(GROUP_SYNC_ROUND_TIMEOUT_MS));
                let groups = group_sync::read_groups(&def, &parts, source.as_ref(), deadline);
                SourceResult::Groups(GroupsAnswer { mirror, groups })
            });
        }
    }

    /// A periodic group read's answer: written for the partitions MIRRORING now.
    pub(super) fn apply_group_sync(&mut self, a: GroupsAnswer) {
        if !self.mirrors.contains_key(&a.mirror) {
            return;
        }
        let parts = self.group_sync_partitions(&a.mirror, false);
        let Some(plane) = self.group_sync.as_mut() else {
            return;
        };
        let def = &self.mirrors[&a.mirror].record.definition;
        let name = &a.mirror;
        let result = a.groups.and_then(|groups| {
            group_sync::apply_groups(
                def,
                &parts,
                groups,
                plane.local.as_ref(),
                plane.sink.as_mut(),
            )
        });
        match result {
            Ok(r) if r.written > 0 => tracing::info!(mirror = %name, ?r, "group offsets synced"),
            Ok(r) => tracing::debug!(mirror = %name, ?r, "group offsets unchanged"),
            Err(e) => tracing::warn!(mirror = %name, "group-offset sync: {e}"),
        }
    }

    /// The last group sync of a `stop` of `name`'s STOPPING partitions, or why there is none
    /// (the report's text). While it runs, the tick does not fail those partitions over.
    pub(super) fn final_sync_ask(&mut self, name: &MirrorName) -> Result<FinalSync, String> {
        let def = self.mirrors[name].record.definition.clone();
        if !def.groups.enabled {
            return Err("disabled for this mirror".to_owned());
        }
        let Some(plane) = self.group_sync.as_ref() else {
            return Err(done(&SyncReport::default()));
        };
        let partitions = self.group_sync_partitions(name, true);
        let timeout_ms = def.groups.final_timeout_ms;
        let source = Arc::clone(&plane.source);
        let parts = partitions.clone();
        let ask = SourceAsk::new(
            JobKey::new(name.as_str(), JobKind::FinalGroups),
            timeout_ms,
            move |by| group_sync::read_groups(&def, &parts, source.as_ref(), by.at),
        );
        // Bounded even if the stop's caller goes away: the tick fails over after this.
        let hold = i64::try_from(timeout_ms.saturating_add(5_000)).unwrap_or(i64::MAX);
        self.stop_holds
            .insert(name.clone(), now_ms().saturating_add(hold));
        Ok(FinalSync {
            name: name.clone(),
            partitions,
            ask: Some(ask),
            timeout_ms,
        })
    }

    /// Applies the last group sync's answer (`None`: not answered within its timeout) and
    /// says what it did or why it was skipped.
    pub(super) fn finish_final_sync(
        &mut self,
        last: FinalSync,
        answer: Option<Result<Vec<SourceGroup>, GroupSyncError>>,
    ) -> String {
        let name = &last.name;
        let result = match answer {
            None => {
                let why = format!(
                    "skipped: source did not answer within {} ms (sync.group.offsets.final.timeout.ms)",
                    last.timeout_ms
                );
                tracing::warn!(mirror = %name, "stop: last group-offset sync {why}");
                return why;
            }
            Some(r) => r,
        };
        let (Some(plane), Some(e)) = (self.group_sync.as_mut(), self.mirrors.get(name)) else {
            return done(&SyncReport::default());
        };
        let def = &e.record.definition;
        let result = result.and_then(|groups| {
            group_sync::apply_groups(
                def,
                &last.partitions,
                groups,
                plane.local.as_ref(),
                plane.sink.as_mut(),
            )
        });
        match result {
            Ok(r) => {
                tracing::info!(mirror = %name, ?r, "stop: last group-offset sync");
                done(&r)
            }
            Err(e) => {
                tracing::warn!(mirror = %name, "stop: last group-offset sync skipped: {e}");
                format!("skipped: {e}")
            }
        }
    }
}
