//! `mirrors drill start/stop` and the drills `describe` shows (design in `control::drill`).

use super::*;
use crate::control::drill::{
    check_name, clone_topic, unshared_bytes, DrillPartition, DrillSummary, TOPIC_PREFIX,
};

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// Clones the mirror's partitions of the matching topics as `drill.<name>.<topic>` while
    /// they keep mirroring. All or nothing: a clone that fails drops those made before it.
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
        let mut ids: BTreeMap<String, Uuid> = BTreeMap::new();
        let mut made: Vec<DrillPartition> = Vec::new();
        for tp in &tps {
            let topic = clone_topic(name, &tp.topic);
            if topic.len() > crate::limits::DRILL_TOPIC_NAME_MAX {
                self.drop_clones(&made);
                return Err(ControlError::Drill(format!(
                    "drill topic {topic} is longer than {} characters",
                    crate::limits::DRILL_TOPIC_NAME_MAX
                )));
            }
            let id = *ids.entry(topic.clone()).or_insert_with(Uuid::new_v4);
            let clone_tp = TopicPartition::new(topic.clone(), tp.partition);
            match self.data.drill_clone(tp, &clone_tp, id) {
                Ok((end, cost)) => made.push(DrillPartition {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    clone_topic: topic,
                    cloned_end: end,
                    cost,
                }),
                Err(why) => {
                    self.drop_clones(&made);
                    return Err(ControlError::Drill(format!("cannot clone {tp}: {why}")));
                }
            }
        }
        let summary = DrillSummary {
            name: name.to_owned(),
            mirror: mname.to_string(),
            started_at_ms: now_ms(),
            linked_bytes: made.iter().map(|p| p.cost.linked_bytes).sum(),
            disk_bytes: made.iter().map(|p| p.cost.copied_bytes).sum(),
            partitions: made,
        };
        tracing::info!(drill = name, mirror = %mname, partitions = summary.partitions.len(), copied = summary.disk_bytes, linked = summary.linked_bytes, "drill started");
        self.drills.insert(name.to_owned(), summary.clone());
        Ok(summary)
    }

    fn drop_clones(&mut self, made: &[DrillPartition]) {
        for p in made {
            let tp = TopicPartition::new(p.clone_topic.clone(), p.partition);
            if let Err(why) = self.data.drill_drop(&tp) {
                tracing::error!(partition = %tp, %why, "drill clone not deleted");
            }
        }
    }

    /// Deletes a drill's clones (the mirror's files they shared keep their own link).
    pub fn drill_stop(&mut self, name: &str) -> Result<DrillSummary, ControlError> {
        let summary = self
            .drills
            .remove(name)
            .ok_or_else(|| ControlError::UnknownDrill(name.to_owned()))?;
        self.drop_clones(&summary.partitions);
        tracing::info!(drill = name, "drill stopped");
        Ok(summary)
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
