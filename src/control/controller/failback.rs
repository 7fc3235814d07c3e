//! `mirrors failback create/start/stop/describe` (design in `control::failback`): the
//! controller's part is the failover points and the mirror's connection settings; the work
//! with the original runs on the failback's threads.

use super::*;
use crate::control::failback::store::FailbackFile;
use crate::control::failback::{FailbackError, FailbackPlane, FailbackReport, StopWait};

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// Attaches the failback plane and restarts the copiers that were copying.
    pub fn attach_failback(&mut self, mut plane: FailbackPlane) {
        let defs: BTreeMap<String, MirrorDefinition> = self
            .mirrors
            .iter()
            .map(|(n, e)| (n.to_string(), e.record.definition.clone()))
            .collect();
        plane.resume_all(|m| defs.get(m).cloned());
        self.failback = Some(plane);
    }

    fn failback_plane(&mut self) -> Result<&mut FailbackPlane, ControlError> {
        self.failback.as_mut().ok_or_else(|| {
            ControlError::Failback(FailbackError::NotAllowed(
                "failback needs the control-plane mode".to_owned(),
            ))
        })
    }

    /// `create`, first half: the mirror's settings and the failover point of every matching
    /// partition, all of which must be STOPPED (failed over) with a recorded mirrored end.
    #[allow(clippy::type_complexity)]
    pub fn failback_inputs(
        &mut self,
        mirror: &str,
        topics: &str,
    ) -> Result<(MirrorDefinition, Vec<(TopicPartition, Offset)>), ControlError> {
        let (name, tps) = self.matching_partitions(mirror, topics)?;
        let entry = &self.mirrors[&name];
        let def = entry.record.definition.clone();
        let mut points = Vec::new();
        for tp in tps {
            let p = &entry.partitions[&tp];
            if p.machine.state() != Some(StateName::Stopped) {
                return Err(ControlError::Failback(FailbackError::NotAllowed(format!(
                    "{tp} is {}, not STOPPED: fail it over (mirrors stop) before failing back",
                    p.machine.state().map_or("unknown", StateName::as_str)
                ))));
            }
            let Some(last) = p.last else {
                return Err(ControlError::Failback(FailbackError::NotAllowed(format!(
                    "{tp} has no recorded failover point"
                ))));
            };
            points.push((tp, Offset(last.end_offset)));
        }
        self.failback_plane()?.check_new(name.as_str())?;
        Ok((def, points))
    }

    pub fn failback_create_finish(
        &mut self,
        file: FailbackFile,
    ) -> Result<FailbackReport, ControlError> {
        Ok(self.failback_plane()?.create(file)?)
    }

    pub fn failback_start(&mut self, mirror: &str) -> Result<FailbackReport, ControlError> {
        let def = self.entry(mirror)?.1.record.definition.clone();
        Ok(self.failback_plane()?.start(def)?)
    }

    pub fn failback_stop_begin(&mut self, mirror: &str) -> Result<StopWait, ControlError> {
        self.entry(mirror)?;
        Ok(self.failback_plane()?.stop_begin(mirror)?)
    }

    pub fn failback_describe(&mut self, mirror: &str) -> Result<FailbackReport, ControlError> {
        self.entry(mirror)?;
        Ok(self.failback_plane()?.describe(mirror)?)
    }

    /// The failbacks' `/metrics` rows (none without the control-plane mode).
    pub fn failback_metrics(&self) -> Vec<crate::ops::metrics::FailbackMetric> {
        self.failback
            .as_ref()
            .map(FailbackPlane::metrics)
            .unwrap_or_default()
    }

    /// `mirrors start` is refused while a failback of the mirror is under way.
    pub(super) fn failback_check_start(&self, mirror: &MirrorName) -> Result<(), ControlError> {
        match &self.failback {
            Some(p) => Ok(p.check_start(mirror.as_str())?),
            None => Ok(()),
        }
    }

    pub(super) fn failback_shutdown(&mut self) {
        if let Some(p) = self.failback.as_mut() {
            p.shutdown();
        }
    }
}
