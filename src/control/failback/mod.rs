//! Failback: copying what clients wrote to kmirror after a failover back into the original
//! (stock) Kafka cluster, with an exact, durable offset map (issue 14 item 1).
//!
//! No released Kafka lets a client truncate a log or write at chosen offsets, so the original
//! keeps what it holds past the failover point that kmirror never received (the *divergent
//! tail*: reported by `create`, left in place) and the copy lands after it. Each kmirror offset
//! copied maps to one original offset (`offset_map`); consumer groups are moved with the map at
//! cut-over (`stop`).
//!
//! Steps, per mirror (one failback at a time):
//! - `create`: for each STOPPED partition of the matching topics (its failover point is the
//!   mirrored end recorded in `__mirror_state` at `stop`), the original's log start and end are
//!   listed and its records past the failover point are scanned (Fetch): the divergent tail
//!   report. Stored in `store` (phase CREATED); nothing is written to the original.
//! - `start`: the copier thread (`copier`) runs until `stop`, and again after a restart of
//!   kmirror while the phase is COPYING.
//!   Transactions are replayed with the original's transaction protocol (`txn_replay`).
//! - `stop` (cut-over, after the operator stopped producers on kmirror): waits until every
//!   partition is copied to kmirror's end with no replayed transaction open, moves the
//!   groups' offsets, phase STOPPED.
//!
//! The control thread only flips flags and reads the copier's last status: it never waits on
//! the original (the admin handlers await the copier's answers without the controller lock).

pub mod copier;
pub mod local;
pub mod offset_map;
pub mod original;
pub mod rewrite;
pub mod store;
pub mod txn_replay;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::control::mirror_def::MirrorDefinition;
use crate::control::source_catalog::{BlockingSourceCatalog, Deadline, SourceCatalog};
use crate::fetch::list_offsets::{Listed, OffsetQuery};
use crate::ids::{Offset, TopicPartition};
use crate::limits::{FAILBACK_REQUEST_TIMEOUT_MS, FAILBACK_TAIL_SCAN_BYTES_MAX};
use crate::log::read_view::ReadCatalog;
use crate::serve::groups::SharedCoordinator;

use offset_map::OffsetMap;
use original::Original;
use store::{DivergentTail, FailbackFile, FailbackStore, PartitionFailback, Phase};

/// What the copier thread shares with the control plane.
pub struct Shared {
    status: Mutex<Status>,
    finished: Condvar,
    /// `stop`: cut over once caught up.
    pub stop: AtomicBool,
    /// kmirror shuts down: end without cutting over.
    pub quit: AtomicBool,
}

/// The copier's last word.
#[derive(Debug, Clone)]
pub struct Status {
    pub file: FailbackFile,
    pub error: Option<String>,
    pub caught_up: bool,
    pub finished: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FailbackError {
    #[error("mirror {0} has no failback (create one first)")]
    Unknown(String),
    #[error("mirror {0} already has a failback in phase {1:?}; stop it first")]
    Exists(String, Phase),
    #[error("{0}")]
    NotAllowed(String),
    #[error("{0}")]
    Store(#[from] store::StoreError),
    #[error("the original did not answer: {0}")]
    Original(String),
}

impl FailbackError {
    pub fn status(&self) -> u16 {
        match self {
            FailbackError::Unknown(_) => 404,
            FailbackError::Exists(..) | FailbackError::NotAllowed(_) => 409,
            FailbackError::Store(_) => 500,
            FailbackError::Original(_) => 502,
        }
    }
}

/// `describe`'s row for one partition.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionRow {
    pub topic: String,
    pub partition: i32,
    pub failover_point: i64,
    /// kmirror's readable end now.
    pub kmirror_end: Option<i64>,
    /// The next kmirror offset to copy.
    pub copied_through: i64,
    /// Offsets on kmirror not copied yet (the reverse-copy lag).
    pub lag: Option<i64>,
    pub copied_records: i64,
    pub copied_bytes: i64,
    /// kmirror offsets of the first batches of transactions replayed on the original and not
    /// ended yet (the cut-over waits for none).
    pub open_transactions: Vec<i64>,
    /// Where the copy started on the original and the next offset it will get.
    pub original_copy_base: i64,
    pub original_next: i64,
    pub ranges: Vec<offset_map::MappedRange>,
    pub divergent_tail: DivergentTail,
    pub error: Option<String>,
}

/// `describe`: a failback and each partition's copy.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailbackReport {
    pub mirror: String,
    pub phase: Phase,
    pub created_at_ms: i64,
    pub running: bool,
    pub caught_up: bool,
    pub error: Option<String>,
    pub producer_id: Option<i64>,
    pub partitions: Vec<PartitionRow>,
    pub groups: Vec<store::GroupTranslation>,
}

struct Running {
    shared: Arc<Shared>,
}

/// The failbacks of this kmirror: their files and the copier of each that runs.
pub struct FailbackPlane {
    store: FailbackStore,
    catalog: Arc<ReadCatalog>,
    groups: Option<SharedCoordinator>,
    running: BTreeMap<String, Running>,
}

/// Everything `create` asks the original, off the control thread: the divergent tail of each
/// partition and where the copy will land.
pub fn plan(
    def: &MirrorDefinition,
    failover_points: &[(TopicPartition, Offset)],
    now_ms: i64,
) -> Result<FailbackFile, FailbackError> {
    let by = || Deadline::after_ms(FAILBACK_REQUEST_TIMEOUT_MS);
    let tps: Vec<TopicPartition> = failover_points.iter().map(|(tp, _)| tp.clone()).collect();
    let list = |q| {
        BlockingSourceCatalog
            .list_offsets(def, &tps, q, by())
            .map_err(|f| FailbackError::Original(f.message))
    };
    let starts = list(OffsetQuery::Earliest)?;
    let ends = list(OffsetQuery::Latest)?;
    let original = Original::of(def).map_err(|e| FailbackError::Original(e.message))?;
    let mut topics: Vec<&str> = tps.iter().map(|tp| tp.topic.as_str()).collect();
    topics.sort_unstable();
    topics.dedup();
    let md = original
        .metadata(&topics)
        .map_err(|e| FailbackError::Original(e.message))?;
    let mut partitions = Vec::new();
    for (((tp, fp), (_, start)), (_, end)) in failover_points.iter().zip(starts).zip(ends) {
        let (Listed::At(start), Listed::At(end)) = (&start, &end) else {
            return Err(FailbackError::Original(format!(
                "{tp}: log start {start:?}, end {end:?} on the original"
            )));
        };
        if *end < *fp {
            return Err(FailbackError::NotAllowed(format!(
                "{tp}: the original's log end {end} is below the failover point {fp}: it lost records kmirror mirrored (unclean election?); failback would misalign offsets"
            )));
        }
        let from = (*fp).max(*start);
        let scan =
            original::scan_tail(&original, &md, tp, from, *end, FAILBACK_TAIL_SCAN_BYTES_MAX)
                .map_err(|e| FailbackError::Original(e.message))?;
        let tail = DivergentTail {
            from_offset: fp.0,
            to_offset: end.0,
            offsets: end.0 - fp.0,
            records: scan.records,
            first_offset: scan.first_offset,
            last_offset: scan.last_offset,
            first_timestamp_ms: scan.first_timestamp_ms,
            last_timestamp_ms: scan.last_timestamp_ms,
            scan_complete: scan.complete && *start <= *fp,
        };
        partitions.push(PartitionFailback {
            topic: tp.topic.clone(),
            partition: tp.partition,
            tail,
            map: OffsetMap::new(*fp, *end),
            next_sequence: 0,
            error: None,
            txns: Vec::new(),
            copied_bytes: 0,
        });
    }
    Ok(FailbackFile {
        mirror: def.name.to_string(),
        created_at_ms: now_ms,
        phase: Phase::Created,
        producer: None,
        partitions,
        groups: Vec::new(),
    })
}

impl FailbackPlane {
    pub fn open(
        data_dir: &std::path::Path,
        catalog: Arc<ReadCatalog>,
        groups: Option<SharedCoordinator>,
    ) -> FailbackPlane {
        FailbackPlane {
            store: FailbackStore::new(data_dir),
            catalog,
            groups,
            running: BTreeMap::new(),
        }
    }

    /// Restarts the copier of every failback that was copying (after a restart of kmirror).
    pub fn resume_all(&mut self, def_of: impl Fn(&str) -> Option<MirrorDefinition>) {
        for f in self.store.all() {
            match f {
                Ok(f) if f.phase == Phase::Copying => match def_of(&f.mirror) {
                    Some(def) => {
                        tracing::info!(mirror = %f.mirror, "failback resumes");
                        self.spawn(def, f);
                    }
                    None => {
                        tracing::warn!(mirror = %f.mirror, "failback of a mirror that no longer exists; not resumed")
                    }
                },
                Ok(_) => {}
                Err(e) => tracing::error!("failback state not read: {e}"),
            }
        }
    }

    fn current(&self, mirror: &str) -> Result<Option<FailbackFile>, FailbackError> {
        if let Some(r) = self.running.get(mirror) {
            return Ok(Some(r.shared.lock().file.clone()));
        }
        Ok(self.store.load(mirror)?)
    }

    /// Refuses `mirrors start` while the mirror has a failback that is not STOPPED: mirroring
    /// the original again would fetch the failback's own copies back at other offsets.
    pub fn check_start(&self, mirror: &str) -> Result<(), FailbackError> {
        match self.current(mirror)? {
            Some(f) if f.phase != Phase::Stopped => Err(FailbackError::NotAllowed(format!(
                "mirror {mirror} has a failback in phase {:?}: mirroring its topics again would copy the failback's writes back; run mirrors failback stop first",
                f.phase
            ))),
            _ => Ok(()),
        }
    }

    /// Refuses a new failback while one that is not STOPPED exists for the mirror.
    pub fn check_new(&self, mirror: &str) -> Result<(), FailbackError> {
        match self.current(mirror)? {
            Some(f) if f.phase != Phase::Stopped => {
                Err(FailbackError::Exists(mirror.to_owned(), f.phase))
            }
            _ => Ok(()),
        }
    }

    /// Stores a planned failback (replacing a STOPPED one).
    pub fn create(&mut self, file: FailbackFile) -> Result<FailbackReport, FailbackError> {
        self.check_new(&file.mirror)?;
        self.running.remove(&file.mirror);
        self.store.save(&file)?;
        Ok(self.report_of(&file, None))
    }

    /// Starts (or keeps) the copier.
    pub fn start(&mut self, def: MirrorDefinition) -> Result<FailbackReport, FailbackError> {
        let mirror = def.name.to_string();
        if let Some(r) = self.running.get(&mirror) {
            if !r.shared.lock().finished {
                return self.describe(&mirror);
            }
        }
        let mut file = self
            .store
            .load(&mirror)?
            .ok_or_else(|| FailbackError::Unknown(mirror.clone()))?;
        if file.phase == Phase::Stopped {
            return Err(FailbackError::NotAllowed(format!(
                "the failback of mirror {mirror} is STOPPED (cut over); create a new one"
            )));
        }
        file.phase = Phase::Copying;
        self.store.save(&file)?;
        self.spawn(def, file);
        self.describe(&mirror)
    }

    fn spawn(&mut self, def: MirrorDefinition, file: FailbackFile) {
        let mirror = file.mirror.clone();
        let shared = Arc::new(Shared {
            status: Mutex::new(Status {
                file: file.clone(),
                error: None,
                caught_up: false,
                finished: false,
            }),
            finished: Condvar::new(),
            stop: AtomicBool::new(false),
            quit: AtomicBool::new(false),
        });
        let env = copier::CopierEnv {
            def,
            catalog: Arc::clone(&self.catalog),
            groups: self.groups.clone(),
            store: self.store.clone(),
        };
        let for_thread = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name(format!(
                "kmirror-failback-{}",
                &mirror[..mirror.len().min(6)]
            ))
            .spawn(move || copier::run(env, file, for_thread));
        if let Err(e) = spawned {
            shared.lock().error = Some(format!("copier thread not started: {e}"));
        }
        self.running.insert(mirror, Running { shared });
    }

    /// Asks the copier to cut over; the returned handle waits for it (off the control thread).
    pub fn stop_begin(&mut self, mirror: &str) -> Result<StopWait, FailbackError> {
        if !self.running.contains_key(mirror) {
            // Never started: nothing was copied and no group moves; it just ends.
            let mut file = self
                .store
                .load(mirror)?
                .ok_or_else(|| FailbackError::Unknown(mirror.to_owned()))?;
            if file.phase != Phase::Created {
                return Err(FailbackError::NotAllowed(format!(
                    "the failback of mirror {mirror} is {:?}, not copying",
                    file.phase
                )));
            }
            file.phase = Phase::Stopped;
            self.store.save(&file)?;
            let done = Shared {
                status: Mutex::new(Status {
                    file,
                    error: None,
                    caught_up: true,
                    finished: true,
                }),
                finished: Condvar::new(),
                stop: AtomicBool::new(true),
                quit: AtomicBool::new(false),
            };
            return Ok(StopWait {
                shared: Arc::new(done),
            });
        }
        let r = &self.running[mirror];
        r.shared.stop.store(true, Ordering::Relaxed);
        Ok(StopWait {
            shared: Arc::clone(&r.shared),
        })
    }

    /// Ends every copier without cutting over (kmirror shuts down; COPYING resumes at start).
    pub fn shutdown(&mut self) {
        for r in self.running.values() {
            r.shared.quit.store(true, Ordering::Relaxed);
        }
    }

    pub fn describe(&self, mirror: &str) -> Result<FailbackReport, FailbackError> {
        if let Some(r) = self.running.get(mirror) {
            let st = r.shared.lock().clone();
            return Ok(self.report_of(&st.file, Some(&st)));
        }
        let file = self
            .store
            .load(mirror)?
            .ok_or_else(|| FailbackError::Unknown(mirror.to_owned()))?;
        Ok(self.report_of(&file, None))
    }

    fn report_of(&self, file: &FailbackFile, st: Option<&Status>) -> FailbackReport {
        let partitions = file
            .partitions
            .iter()
            .map(|p| {
                let tp = TopicPartition::new(p.topic.clone(), p.partition);
                let end = self
                    .catalog
                    .get(&tp)
                    .map(|h| local::readable_end(&h.view()).0);
                PartitionRow {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    failover_point: p.map.failover_point,
                    kmirror_end: end,
                    copied_through: p.map.next_kmirror,
                    lag: end.map(|e| (e - p.map.next_kmirror).max(0)),
                    copied_records: p.map.copied_records(),
                    copied_bytes: p.copied_bytes,
                    open_transactions: txn_replay::open_transactions(&p.txns),
                    original_copy_base: p.map.copy_base,
                    original_next: p.map.next_original().0,
                    ranges: p.map.ranges.clone(),
                    divergent_tail: p.tail.clone(),
                    error: p.error.clone(),
                }
            })
            .collect();
        FailbackReport {
            mirror: file.mirror.clone(),
            phase: file.phase,
            created_at_ms: file.created_at_ms,
            running: st.is_some_and(|s| !s.finished),
            caught_up: st.is_some_and(|s| s.caught_up),
            error: st.and_then(|s| s.error.clone()),
            producer_id: file.producer.map(|p| p.producer_id),
            partitions,
            groups: file.groups.clone(),
        }
    }
}

impl FailbackPlane {
    /// The `kmirror_failback_*` rows of every stored failback (`/metrics`).
    pub fn metrics(&self) -> Vec<crate::ops::metrics::FailbackMetric> {
        let mut files: BTreeMap<String, FailbackFile> = BTreeMap::new();
        for f in self.store.all().into_iter().flatten() {
            files.insert(f.mirror.clone(), f);
        }
        for (mirror, r) in &self.running {
            files.insert(mirror.clone(), r.shared.lock().file.clone());
        }
        let mut out = Vec::new();
        for f in files.values() {
            let report = self.report_of(f, None);
            for (row, p) in report.partitions.iter().zip(&f.partitions) {
                out.push(crate::ops::metrics::FailbackMetric {
                    mirror: f.mirror.clone(),
                    tp: TopicPartition::new(p.topic.clone(), p.partition),
                    state: if p.error.is_some() {
                        "FAILED"
                    } else {
                        match f.phase {
                            Phase::Created => "CREATED",
                            Phase::Copying => "COPYING",
                            Phase::Stopped => "STOPPED",
                        }
                    },
                    lag_offsets: row.lag,
                    copied_records: row.copied_records,
                    copied_bytes: row.copied_bytes,
                    divergent_tail_records: p.tail.records,
                    open_transactions: row.open_transactions.len() as i64,
                });
            }
        }
        out
    }
}

/// Waits for a copier's cut-over.
pub struct StopWait {
    shared: Arc<Shared>,
}

impl StopWait {
    /// Blocks (a failback thread or a blocking task, never the control thread) until the
    /// copier cut over or `timeout` passed: whether it finished.
    pub fn wait(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut st = self.shared.lock();
        while !st.finished {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .shared
                .finished
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}
