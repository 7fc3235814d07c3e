//! When integrity audit rounds run (`control::audit` has the rules): per mirror every
//! `mirror.audit.interval.ms`, started by the tick on a source worker (`JobKind::Audit`), the
//! answer applied by a later tick; a mismatch or scrub fault fails its partition, not
//! retryable, with the reason.

use super::*;
use crate::control::audit::{AuditPlane, AuditReport, PartitionAudit, RoundAnswer, Verified};
use crate::control::source_worker::JobKind;

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// Starts auditing every mirror whose `mirror.audit.enabled` is on.
    pub fn attach_audit(&mut self, plane: AuditPlane) {
        self.audit = Some(plane);
    }

    /// Starts the round of every mirror that is due. A round still in flight (a slow or
    /// silent source) skips this one.
    pub(super) fn start_audits(&mut self, now_ms: i64) {
        let Some(audit) = self.audit.as_mut() else {
            return;
        };
        let mut jobs = Vec::new();
        for (name, e) in &self.mirrors {
            let def = &e.record.definition;
            if !audit.due(name.as_str(), &def.audit, now_ms) {
                continue;
            }
            // The partitions kmirror holds as the source's copy: not after failover (clients
            // write there) and not while a stop is under way.
            let compacted = |topic: &str| {
                e.configs
                    .get(topic)
                    .and_then(|c| c.get("cleanup.policy"))
                    .is_some_and(|p| p.split(',').any(|x| x.trim() == "compact"))
            };
            let parts: Vec<(TopicPartition, Uuid, bool)> = e
                .partitions
                .iter()
                .filter(|(_, p)| {
                    matches!(
                        p.machine.state(),
                        Some(
                            StateName::Mirroring
                                | StateName::Pausing
                                | StateName::Paused
                                | StateName::Failed
                        )
                    )
                })
                .map(|(tp, p)| (tp.clone(), p.topic_id, !compacted(&tp.topic)))
                .collect();
            if let Some(job) = audit.round(def, &parts) {
                jobs.push((name.clone(), job));
            }
        }
        for (name, job) in jobs {
            self.run_periodic(JobKey::new(name.as_str(), JobKind::Audit), move |by| {
                SourceResult::Audit(job.run(by))
            });
        }
    }

    /// A round's answer: marks advance; mismatches and damaged batches fail their partition.
    pub(super) fn apply_audit(&mut self, a: RoundAnswer) -> Result<(), ControlError> {
        let Some(audit) = self.audit.as_mut() else {
            return Ok(());
        };
        let Ok(name) = MirrorName::new(&a.mirror) else {
            return Ok(());
        };
        let failed = audit.apply(a, now_ms());
        for (tp, message) in failed {
            let Some(p) = self.mirrors.get(&name).and_then(|e| e.partitions.get(&tp)) else {
                continue;
            };
            // Nothing more is appended behind a batch that differs or rotted.
            if p.machine.wants_fetcher() {
                let _ = self.data.remove(&tp);
            }
            self.apply_event(
                &name,
                &tp,
                Event::Failed {
                    message,
                    retryable: false,
                    now_ms: now_ms(),
                },
            )?;
        }
        let held = self
            .mirrors
            .iter()
            .flat_map(|(n, e)| {
                e.partitions
                    .keys()
                    .map(move |tp| (n.to_string(), tp.clone()))
            })
            .collect();
        if let Some(audit) = self.audit.as_mut() {
            audit.retain(&held);
        }
        Ok(())
    }

    /// `kmirror audit report --mirror M`.
    pub fn audit_report(&self, mirror: &str) -> Result<AuditReport, ControlError> {
        let (_, e) = self.entry(mirror)?;
        let tps: Vec<TopicPartition> = e.partitions.keys().cloned().collect();
        let def = &e.record.definition;
        Ok(match &self.audit {
            Some(a) => a.report(def, &tps),
            None => AuditReport {
                mirror: def.name.to_string(),
                settings: def.audit.clone(),
                partitions: Vec::new(),
                events: Vec::new(),
                bytes_read: 0,
                bytes_fetched: 0,
                mismatches: 0,
            },
        })
    }

    /// One partition's audit state, for `describe`.
    pub(super) fn audit_of(&self, mirror: &str, tp: &TopicPartition) -> Option<PartitionAudit> {
        self.audit.as_ref().map(|a| a.partition(mirror, tp))
    }

    /// "Verified through offset N (source timestamp T)" of a partition, when audited.
    pub fn verified_through(&self, tp: &TopicPartition) -> Option<Verified> {
        self.audit.as_ref()?.verified(tp)
    }
}
