//! `mirrors drill start/stop` and the drills `describe` shows (design in `control::drill`):
//! each step recorded (`kmirror-drills/<name>.json`) before it acts, so a restart serves a
//! running drill again, deletes a half-started one and finishes a stop.

use std::collections::BTreeSet;

use super::*;
use crate::control::drill::{
    check_name, clone_topic, unshared_bytes, DrillPartition, DrillPhase, DrillRecord, DrillSummary,
    RECORDS_DIR, TOPIC_PREFIX,
};
use crate::control::group_sync::{clamp, synced_epoch, SourceOffset};
use crate::control::json_records::JsonRecords;
use crate::serve::groups::coordinator::SyncWriteError;

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// The records in `dir_name` beside `__mirror_state` (drills here, cuts in `loss.rs`).
    pub(super) fn json_records(&self, dir_name: &str) -> Result<JsonRecords, String> {
        self.store
            .dir()
            .parent()
            .map(|d| JsonRecords::new(d, dir_name))
            .ok_or_else(|| "__mirror_state has no parent directory".to_owned())
    }

    fn drill_records(&self) -> Result<JsonRecords, ControlError> {
        self.json_records(RECORDS_DIR).map_err(ControlError::Drill)
    }

    fn drill_put(&self, phase: DrillPhase, summary: &DrillSummary) -> Result<(), ControlError> {
        let record = DrillRecord {
            phase,
            summary: summary.clone(),
        };
        self.drill_records()?
            .put(&summary.name, &record)
            .map_err(|e| ControlError::Drill(format!("drill {:?} not recorded: {e}", summary.name)))
    }

    fn drill_unrecord(&self, name: &str) {
        if let Err(e) = self.drill_records().and_then(|r| {
            r.remove(name)
                .map_err(|e| ControlError::Drill(e.to_string()))
        }) {
            tracing::error!(drill = name, "drill record not deleted: {e}");
        }
    }

    /// Clones the mirror's partitions of the matching topics as `drill.<name>.<topic>` while
    /// they keep mirroring, and copies their group offsets for the clones. All or nothing: a
    /// clone that fails drops those made before it.
    pub fn drill_start(
        &mut self,
        name: &str,
        mirror: &str,
        topics: &str,
    ) -> Result<DrillSummary, ControlError> {
        check_name(name).map_err(ControlError::Drill)?;
        if self.drills.contains_key(name) {
            return Err(ControlError::Drill(format!(
                "drill {name:?} is already running"
            )));
        }
        let (mname, tps) = self.matching_partitions(mirror, topics)?;
        if let Some(tp) = tps.iter().find(|tp| tp.topic.starts_with(TOPIC_PREFIX)) {
            return Err(ControlError::Drill(format!("{tp} is itself a drill topic")));
        }
        let mut planned: Vec<DrillPartition> = Vec::with_capacity(tps.len());
        for tp in &tps {
            let topic = clone_topic(name, &tp.topic);
            if topic.len() > crate::limits::DRILL_TOPIC_NAME_MAX {
                return Err(ControlError::Drill(format!(
                    "drill topic {topic} is longer than {} characters",
                    crate::limits::DRILL_TOPIC_NAME_MAX
                )));
            }
            planned.push(DrillPartition {
                topic: tp.topic.clone(),
                partition: tp.partition,
                clone_topic: topic,
                cloned_end: -1,
                cost: Default::default(),
                group_offsets: 0,
            });
        }
        let mut summary = DrillSummary {
            name: name.to_owned(),
            mirror: mname.to_string(),
            started_at_ms: now_ms(),
            partitions: planned,
            disk_bytes: 0,
            linked_bytes: 0,
            groups_left_alone: Vec::new(),
        };
        // Before any clone exists: a restart that finds this deletes what was made.
        self.drill_put(DrillPhase::Starting, &summary)?;
        let mut ids: BTreeMap<String, Uuid> = BTreeMap::new();
        for i in 0..summary.partitions.len() {
            let p = &summary.partitions[i];
            let tp = TopicPartition::new(p.topic.clone(), p.partition);
            let id = *ids
                .entry(p.clone_topic.clone())
                .or_insert_with(Uuid::new_v4);
            let clone_tp = TopicPartition::new(p.clone_topic.clone(), p.partition);
            match self.data.drill_clone(&tp, &clone_tp, id) {
                Ok((end, cost)) => {
                    let p = &mut summary.partitions[i];
                    p.cloned_end = end;
                    p.cost = cost;
                }
                Err(why) => {
                    self.drill_abandon(&summary);
                    return Err(ControlError::Drill(format!("cannot clone {tp}: {why}")));
                }
            }
        }
        match self.drill_copy_group_offsets(&mut summary.partitions) {
            Ok(left_alone) => summary.groups_left_alone = left_alone,
            Err(why) => {
                self.drill_abandon(&summary);
                return Err(ControlError::Drill(format!(
                    "group offsets not copied for drill {name:?}: {why}"
                )));
            }
        }
        summary.linked_bytes = summary.partitions.iter().map(|p| p.cost.linked_bytes).sum();
        summary.disk_bytes = summary.partitions.iter().map(|p| p.cost.copied_bytes).sum();
        if let Err(e) = self.drill_put(DrillPhase::Running, &summary) {
            self.drill_abandon(&summary);
            return Err(e);
        }
        let offsets: u32 = summary.partitions.iter().map(|p| p.group_offsets).sum();
        tracing::info!(drill = name, mirror = %mname, partitions = summary.partitions.len(), copied = summary.disk_bytes, linked = summary.linked_bytes, group_offsets = offsets, "drill started");
        self.drills.insert(name.to_owned(), summary.clone());
        Ok(summary)
    }

    /// A start that failed part-way: its clones (those made) and their record go.
    fn drill_abandon(&mut self, summary: &DrillSummary) {
        let failed = self.drop_clones(&summary.partitions);
        if failed.is_empty() {
            self.drill_unrecord(&summary.name);
        } else {
            // Recorded as stopping: the next `drill stop` or restart deletes the rest.
            let _ = self.drill_put(DrillPhase::Stopping, summary);
            self.drills.insert(summary.name.clone(), summary.clone());
        }
    }

    /// Every group's committed offset of each drilled partition, written for its clone under
    /// the same group id (clamped to the clone, the epoch as the group-offset sync picks it).
    /// Groups with members on kmirror are left alone and returned.
    fn drill_copy_group_offsets(
        &mut self,
        parts: &mut [DrillPartition],
    ) -> Result<Vec<String>, String> {
        let Some(plane) = self.group_sync.as_mut() else {
            return Ok(Vec::new());
        };
        let GroupSyncPlane { local, sink, .. } = plane;
        let mut left_alone = BTreeSet::new();
        for p in parts.iter_mut() {
            let tp = TopicPartition::new(p.topic.clone(), p.partition);
            let clone_tp = TopicPartition::new(p.clone_topic.clone(), p.partition);
            let Some(bounds) = local.bounds(&clone_tp) else {
                return Err(format!("{clone_tp} is not served"));
            };
            for (group, o) in sink.committed_on(&tp) {
                if o.offset.0 < 0 {
                    continue;
                }
                if sink.is_active(&group) {
                    left_alone.insert(group);
                    continue;
                }
                let (offset, moved) = clamp(o.offset, bounds);
                let leader_epoch = synced_epoch(o.leader_epoch, moved, bounds.leader_epoch, || {
                    local.epoch_before(&clone_tp, offset)
                });
                let copy = SourceOffset {
                    tp: clone_tp.clone(),
                    offset,
                    leader_epoch,
                    metadata: o.metadata,
                };
                match sink.write(&group, &copy) {
                    Ok(_) => p.group_offsets += 1,
                    Err(SyncWriteError::Active(_)) => {
                        left_alone.insert(group);
                    }
                    Err(e) => return Err(format!("group {group} on {clone_tp}: {e}")),
                }
            }
        }
        Ok(left_alone.into_iter().collect())
    }

    /// Deletes clones and the offsets committed on them; repeatable (a clone already gone is
    /// fine). The reasons of those that could not be deleted.
    fn drop_clones(&mut self, parts: &[DrillPartition]) -> Vec<String> {
        let mut failed = Vec::new();
        for p in parts {
            let tp = TopicPartition::new(p.clone_topic.clone(), p.partition);
            if let Some(plane) = self.group_sync.as_mut() {
                if let Err(why) = plane.sink.forget(&tp) {
                    tracing::error!(partition = %tp, %why, "drill clone's group offsets not deleted");
                    failed.push(format!("{tp} group offsets: {why}"));
                }
            }
            if let Err(why) = self.data.drill_drop(&tp) {
                tracing::error!(partition = %tp, %why, "drill clone not deleted");
                failed.push(format!("{tp}: {why}"));
            }
        }
        failed
    }

    /// Deletes a drill's clones (the mirror's files they shared keep their own link) and the
    /// group offsets committed on them. Recorded as stopping first: a crash or a clone that
    /// could not be deleted leaves the drill listed, and the next `drill stop` (or restart)
    /// finishes it.
    pub fn drill_stop(&mut self, name: &str) -> Result<DrillSummary, ControlError> {
        let summary = self
            .drills
            .get(name)
            .cloned()
            .ok_or_else(|| ControlError::UnknownDrill(name.to_owned()))?;
        self.drill_put(DrillPhase::Stopping, &summary)?;
        let failed = self.drop_clones(&summary.partitions);
        if !failed.is_empty() {
            return Err(ControlError::Drill(format!(
                "drill {name:?} not fully deleted (stop it again): {}",
                failed.join("; ")
            )));
        }
        self.drill_unrecord(name);
        self.drills.remove(name);
        tracing::info!(drill = name, "drill stopped");
        Ok(summary)
    }

    /// At start (`open`): every recorded drill. A running one's clones are served again
    /// (with the drilled topic's copied configs), a starting one is deleted, a stopping one's
    /// deletion finished.
    pub(super) fn restore_drills(&mut self) {
        let Ok(records) = self.drill_records() else {
            return;
        };
        for (name, record) in records.load_readable::<DrillRecord>("drill") {
            let summary = record.summary;
            match record.phase {
                DrillPhase::Running => {
                    self.drill_configure(&summary);
                    for p in &summary.partitions {
                        let tp = TopicPartition::new(p.clone_topic.clone(), p.partition);
                        if let Err(why) = self.data.writable(&tp) {
                            tracing::error!(drill = %name, partition = %tp, %why, "drill clone not served after the restart");
                        }
                    }
                    tracing::info!(drill = %name, partitions = summary.partitions.len(), "drill served again after the restart");
                    self.drills.insert(name, summary);
                }
                DrillPhase::Starting | DrillPhase::Stopping => {
                    tracing::warn!(drill = %name, phase = ?record.phase, "drill was starting or stopping when kmirror stopped: deleting its clones");
                    if self.drop_clones(&summary.partitions).is_empty() {
                        self.drill_unrecord(&name);
                    } else {
                        let _ = self.drill_put(DrillPhase::Stopping, &summary);
                        self.drills.insert(name, summary);
                    }
                }
            }
        }
    }

    /// A restored drill's clones get their drilled topic's copied configs (as at the start).
    fn drill_configure(&mut self, summary: &DrillSummary) {
        let Some(entry) = self
            .mirrors
            .iter()
            .find(|(n, _)| n.as_str() == summary.mirror)
            .map(|(_, e)| e)
        else {
            return;
        };
        let configs: Vec<(String, LogConfig)> = summary
            .partitions
            .iter()
            .filter_map(|p| {
                let c = entry.configs.get(&p.topic)?;
                let config = crate::control::topic_configs::apply(&LogConfig::default(), c).ok()?;
                Some((p.clone_topic.clone(), config))
            })
            .collect();
        for (topic, config) in configs {
            if let Err(why) = self.data.configure(&topic, &config) {
                tracing::error!(%topic, %why, "drill topic configs not applied");
            }
        }
    }

    /// The drills in progress, with the disk each uses now beyond what it shares.
    pub fn drills(&self) -> Vec<DrillSummary> {
        let root = self.store.dir().parent().map(std::path::Path::to_path_buf);
        self.drills
            .values()
            .map(|d| {
                let mut d = d.clone();
                if let Some(root) = &root {
                    d.disk_bytes = d
                        .partitions
                        .iter()
                        .map(|p| {
                            unshared_bytes(&root.join(format!("{}-{}", p.clone_topic, p.partition)))
                        })
                        .sum();
                }
                d
            })
            .collect()
    }
}
