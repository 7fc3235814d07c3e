//! The loss report of `stop` (issue 16 item 3; what the figures mean is in
//! `control::loss_report`). `loss_ask` lists the source's high watermarks on a source worker
//! (never on the control thread; the admin API runs it beside the last group sync, or before
//! the stop when `--max-loss-seconds` must be checked first), `loss_estimate` turns the answer
//! (or its absence) and what this process saw into a report, `loss_record` stores it.

use std::path::Path;

use super::*;
use crate::control::consistent_cut::CutReport;
use crate::control::json_records::JsonRecords;
use crate::control::loss_report::{
    bytes_per_offset, partition_loss, LossInput, LossReport, LossReports,
};
use crate::control::source_worker::JobKind;
use crate::fetch::list_offsets::{Listed, OffsetQuery};
use crate::ids::TimestampMs;

/// The source's answer to a loss listing.
pub type LossListing = Result<Vec<(TopicPartition, Listed)>, Fault>;

/// The partitions a stop reports on (those not STOPPED when it began).
#[derive(Debug, Clone)]
pub struct LossPlan {
    name: MirrorName,
    tps: Vec<TopicPartition>,
}

impl LossPlan {
    pub fn is_empty(&self) -> bool {
        self.tps.is_empty()
    }
}

/// A consistent cut under way: its timestamp, its quarantine label, the partitions cut so far.
#[derive(Debug, Clone)]
pub(super) struct PendingCut {
    ts: TimestampMs,
    label: String,
    reports: Vec<CutReport>,
    /// Between `cut_begin` and `cut_finish` of a `stop`: that stop reports the cuts. Otherwise
    /// (its partitions' failovers retried by the tick, or a cut found at a restart) the tick
    /// ends the cut once no partition of the mirror is STOPPING (`settle_cuts`).
    in_stop: bool,
}

/// Where cuts under way are recorded (`control::json_records`, one file per mirror): a
/// restart finds the cut and applies it to the partitions still STOPPING, so a kill -9 in the
/// middle of a cut never leaves some partitions cut and the others failed over uncut.
const CUTS_DIR: &str = "kmirror-cuts";

/// A cut's durable record.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct CutRecord {
    ts: i64,
    label: String,
}

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    fn cut_records(&self) -> Result<JsonRecords, ControlError> {
        self.json_records(CUTS_DIR).map_err(ControlError::Cut)
    }

    /// `stop --cut-at-timestamp T`, before the stop: every partition of the mirror that fails
    /// over from now on is cut at T first (a stop already cutting keeps its own T). Recorded
    /// durably before any partition goes STOPPING.
    pub fn cut_begin(&mut self, mirror: &str, ts: TimestampMs) -> Result<(), ControlError> {
        let name = self.entry(mirror)?.0.clone();
        if let Some(c) = self.cuts.get_mut(&name) {
            c.in_stop = true;
            return Ok(());
        }
        let label = format!("cut-{name}-{}", now_ms());
        let record = CutRecord {
            ts: ts.0,
            label: label.clone(),
        };
        self.cut_records()?
            .put(name.as_str(), &record)
            .map_err(|e| ControlError::Cut(format!("cut of mirror {name} not recorded: {e}")))?;
        self.cuts.insert(
            name,
            PendingCut {
                ts,
                label,
                reports: Vec::new(),
                in_stop: true,
            },
        );
        Ok(())
    }

    /// After the stop: the partitions cut, and the cut ended unless a partition of the mirror
    /// is still STOPPING (its failover is retried by the tick, and cut first).
    pub fn cut_finish(&mut self, mirror: &str) -> Vec<CutReport> {
        let Ok((name, _)) = self.entry(mirror) else {
            return Vec::new();
        };
        let name = name.clone();
        if self.mirror_stopping(&name) {
            return self
                .cuts
                .get_mut(&name)
                .map(|c| {
                    c.in_stop = false;
                    std::mem::take(&mut c.reports)
                })
                .unwrap_or_default();
        }
        let reports = self.cuts.remove(&name).map(|c| c.reports);
        self.cut_unrecord(&name);
        reports.unwrap_or_default()
    }

    fn mirror_stopping(&self, name: &MirrorName) -> bool {
        self.mirrors.get(name).is_some_and(|e| {
            e.partitions
                .values()
                .any(|p| p.machine.state() == Some(StateName::Stopping))
        })
    }

    fn cut_unrecord(&self, name: &MirrorName) {
        if let Err(e) = self.cut_records().and_then(|r| {
            r.remove(name.as_str())
                .map_err(|e| ControlError::Cut(e.to_string()))
        }) {
            tracing::error!(mirror = %name, "cut record not deleted: {e}");
        }
    }

    /// At start (`open`, before the partitions are reconciled): the cuts under way when
    /// kmirror stopped, so the STOPPING partitions' failovers cut first.
    pub(super) fn restore_cuts(&mut self) {
        let Ok(records) = self.cut_records() else {
            return;
        };
        // An unreadable record is left as it is, for the operator (logged).
        for (mirror, record) in records.load_readable::<CutRecord>("consistent cut") {
            let Some(name) = self.mirrors.keys().find(|n| n.as_str() == mirror).cloned() else {
                tracing::warn!(%mirror, "cut record of a mirror that does not exist: deleted");
                let _ = records.remove(&mirror);
                continue;
            };
            tracing::warn!(mirror = %name, cut_at_timestamp = record.ts, label = %record.label, "a consistent cut was under way when kmirror stopped: its partitions still STOPPING are cut before their failover");
            self.cuts.insert(
                name,
                PendingCut {
                    ts: TimestampMs(record.ts),
                    label: record.label,
                    reports: Vec::new(),
                    in_stop: false,
                },
            );
        }
    }

    /// Ends the cuts no `stop` reports (see `PendingCut::in_stop`) once no partition of their
    /// mirror is STOPPING; what each partition's cut took is in its quarantine `report.json`.
    pub(super) fn settle_cuts(&mut self) {
        let done: Vec<MirrorName> = self
            .cuts
            .iter()
            .filter(|(n, c)| !c.in_stop && !self.mirror_stopping(n))
            .map(|(n, _)| n.clone())
            .collect();
        for name in done {
            let Some(cut) = self.cuts.remove(&name) else {
                continue;
            };
            let cut_partitions = cut
                .reports
                .iter()
                .filter(|r| r.cut_offset.is_some())
                .count();
            tracing::info!(mirror = %name, cut_at_timestamp = cut.ts.0, label = %cut.label, partitions = cut.reports.len(), cut_partitions, "consistent cut finished");
            self.cut_unrecord(&name);
        }
    }

    /// `prepare_failover`'s cut of one partition: its new end when a cut is under way.
    pub(super) fn cut_before_promotion(
        &mut self,
        name: &MirrorName,
        tp: &TopicPartition,
    ) -> Result<Option<Offset>, String> {
        let Some(cut) = self.cuts.get(name) else {
            return Ok(None);
        };
        let (ts, label) = (cut.ts, cut.label.clone());
        let report = self.data.cut_at_timestamp(tp, ts, &label)?;
        let end = Offset(report.log_end_after);
        tracing::info!(
            mirror = %name,
            partition = %tp,
            cut_at_timestamp = ts.0,
            log_end_before = report.log_end_before,
            log_end_after = report.log_end_after,
            "stop: consistent cut"
        );
        if let Some(c) = self.cuts.get_mut(name) {
            c.reports.push(report);
        }
        Ok(Some(end))
    }

    /// The partitions of a stop and the ListOffsets that says what the source holds now (none
    /// when every partition is STOPPED already). Its deadline is the mirror's final group-sync
    /// timeout, so with both run side by side `stop` stays within that timeout.
    pub fn loss_ask(
        &self,
        mirror: &str,
        topics: &str,
    ) -> Result<(LossPlan, Option<SourceAsk<LossListing>>), ControlError> {
        let (name, tps) = self.matching_partitions(mirror, topics)?;
        let tps: Vec<TopicPartition> = tps
            .into_iter()
            .filter(|tp| {
                self.mirrors[&name].partitions[tp].machine.state() != Some(StateName::Stopped)
            })
            .collect();
        let ask = (!tps.is_empty()).then(|| {
            let def = self.mirrors[&name].record.definition.clone();
            let timeout_ms = def.groups.final_timeout_ms.min(self.source_timeout_ms);
            let source = self.source.clone();
            let asked = tps.clone();
            SourceAsk::new(
                JobKey::new(name.as_str(), JobKind::LossListing),
                timeout_ms,
                move |by| source.list_offsets(&def, &asked, OffsetQuery::Latest, by),
            )
        });
        Ok((LossPlan { name, tps }, ask))
    }

    /// The report for `plan`: against `listing` when the source answered (listed at
    /// `listed_at_ms`), else against the last high watermark this process saw. The local end
    /// is the mirrored end recorded at the failover once a partition is STOPPED, before that
    /// the log's current end (a preview for `--max-loss-seconds`: it only grows until then).
    pub fn loss_estimate(
        &self,
        plan: &LossPlan,
        listing: Option<&LossListing>,
        listed_at_ms: i64,
    ) -> LossReport {
        let now = now_ms();
        let (listed, source_error): (BTreeMap<&TopicPartition, i64>, Option<String>) = match listing
        {
            Some(Ok(l)) => (
                l.iter()
                    .filter_map(|(tp, x)| match x {
                        Listed::At(o) => Some((tp, o.0)),
                        _ => None,
                    })
                    .collect(),
                None,
            ),
            Some(Err(f)) => (BTreeMap::new(), Some(f.to_string())),
            None => (
                BTreeMap::new(),
                Some("the source did not answer within the stop's deadline".to_owned()),
            ),
        };
        let data_dir = self.store.dir().parent().map(Path::to_path_buf);
        let mut partitions = Vec::with_capacity(plan.tps.len());
        for tp in &plan.tps {
            let p = self
                .mirrors
                .get(&plan.name)
                .and_then(|e| e.partitions.get(tp));
            let progress = self.data.progress(tp);
            let local_end = match p {
                Some(p) if p.machine.state() == Some(StateName::Stopped) => {
                    p.last.map(|l| l.end_offset).or(progress.local_log_end)
                }
                _ => progress.local_log_end,
            };
            let fetched = progress
                .source_high_watermark
                .zip(progress.source_high_watermark_at_ms);
            let idle = self.idle_offsets.get(tp).copied();
            let seen = match (fetched, idle) {
                (Some(f), Some(i)) => Some(if i.1 > f.1 { i } else { f }),
                (f, i) => f.or(i),
            };
            let bytes = match (&data_dir, local_end) {
                (Some(d), Some(end)) => bytes_per_offset(&d.join(tp.to_string()), end),
                _ => None,
            };
            let input = LossInput {
                listed: listed.get(tp).copied(),
                seen,
                local_end,
                newest_timestamp_ms: progress.newest_timestamp_ms,
                bytes_per_offset: bytes,
            };
            let mut loss = partition_loss(tp, &input, listed_at_ms, now);
            // The integrity audit's mark, as describe's verifiedOffset: every offset below it
            // was checked against the source.
            loss.verified_through = self.verified_through(tp).map(|v| v.next.0);
            partitions.push(loss);
        }
        LossReport {
            mirror: plan.name.to_string(),
            at_ms: now,
            source_answered: matches!(listing, Some(Ok(_))),
            source_error,
            max_loss_seconds: None,
            forced: false,
            partitions,
        }
    }

    /// `--max-loss-seconds`: refuses (nothing changed) when a partition may lose more.
    pub fn loss_check(report: &LossReport, max_seconds: f64) -> Result<(), ControlError> {
        let over = report.over_limit(max_seconds);
        if over.is_empty() {
            return Ok(());
        }
        Err(ControlError::LossTooHigh {
            mirror: report.mirror.clone(),
            max_seconds,
            partitions: over.join(", "),
        })
    }

    /// Stores a stop's report beside `__mirror_state` (fsynced before `stop` answers).
    pub fn loss_record(&self, report: &LossReport) -> Result<(), String> {
        self.loss_store()?.append(report).map_err(|e| e.to_string())
    }

    /// Every stored report of a mirror, oldest first.
    pub fn loss_reports(&self, mirror: &str) -> Result<Vec<LossReport>, ControlError> {
        let name = self.entry(mirror)?.0.clone();
        self.loss_store()
            .and_then(|s| s.load(name.as_str()).map_err(|e| e.to_string()))
            .map_err(ControlError::LossReports)
    }

    fn loss_store(&self) -> Result<LossReports, String> {
        self.store
            .dir()
            .parent()
            .map(LossReports::new)
            .ok_or_else(|| "__mirror_state has no parent directory".to_owned())
    }
}
