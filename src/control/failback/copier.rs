//! The copy loop of one mirror's failback, on its own thread (`kmirror-failback-<mirror>`):
//! reads each failed-back partition's log on kmirror from where the map ends and produces the
//! batches, one at a time per partition and in order, to the original with an idempotent
//! producer (acks=all). After every acknowledged batch the map and the next sequence are
//! persisted before the next batch is sent.
//!
//! Sessions: a connection error or a retryable partition error ends the session; the next one
//! (after a backoff) reconnects, asks the original's log ends and reconciles:
//! - end == the map's next original offset: nothing was lost;
//! - end == that + the next batch's record count: the original acknowledged (or appended)
//!   that batch and its record was not persisted (kill -9 between the two): it is recorded
//!   at that offset without sending it again;
//! - anything else: another producer wrote to the original partition, or it lost records;
//!   the partition stops with that error (nothing is produced to it).
//!
//! The producer id and epoch are persisted and reused, with each partition's sequence, so a
//! batch sent again whose earlier send the original had appended but not yet counted in its
//! high watermark is answered as a duplicate with its first offset, not written twice. When
//! the original no longer knows the producer (UNKNOWN_PRODUCER_ID, OUT_OF_ORDER_SEQUENCE,
//! INVALID_PRODUCER_EPOCH) the next session takes a new producer id, sequences from 0.
//!
//! Transactional batches go through `txn_replay`: each kmirror producer's transactions are
//! replayed by a transactional producer of their own on the original (AddPartitionsToTxn,
//! transactional Produce, EndTxn at kmirror's marker). After EndTxn the copier waits until the
//! original's marker is in its log end and records the offset it took, so the log-end check
//! stays exact; `ending` is persisted before EndTxn, so a restart sends it again and the check
//! knows the marker may be there.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::control::failback::local::{batch_at, readable_end};
use crate::control::failback::offset_map::{self, Reconciled};
use crate::control::failback::original::{CallError, Original, Produced, ProducerConn, TxnConn};
use crate::control::failback::rewrite::{for_produce, next_sequence, Stamp};
use crate::control::failback::store::{
    FailbackFile, FailbackStore, GroupTranslation, PartitionFailback, Phase, ProducerStamp,
};
use crate::control::failback::txn_replay::{self, BatchFacts, OpenTxn, Outcome, Step};
use crate::control::failback::Shared;
use crate::control::mirror_def::MirrorDefinition;
use crate::control::source_catalog::{BlockingSourceCatalog, Deadline, SourceCatalog};
use crate::fetch::list_offsets::{Listed, OffsetQuery};
use crate::ids::{Offset, ProducerId, TopicPartition};
use crate::limits::{
    FAILBACK_BATCHES_PER_TURN, FAILBACK_COORDINATOR_RETRY_MS, FAILBACK_IDLE_POLL_MS,
    FAILBACK_REQUEST_TIMEOUT_MS, FAILBACK_RETRY_BACKOFF_MS_MAX, FAILBACK_TXN_TIMEOUT_MS,
};
use crate::log::read_view::ReadCatalog;
use crate::serve::groups::SharedCoordinator;
use crate::wire::batch::{Batch, Peek};

/// What the copier needs from the process.
pub struct CopierEnv {
    pub def: MirrorDefinition,
    pub catalog: Arc<ReadCatalog>,
    pub groups: Option<SharedCoordinator>,
    pub store: FailbackStore,
}

/// How a session ended.
enum SessionEnd {
    /// Stop asked and every partition caught up: cut over.
    CaughtUpForStop,
    /// Quit (kmirror shutting down): leave the phase as it is.
    Quit,
}

/// Retryable produce errors: leadership moved, replicas short, timeouts.
fn retryable(code: i16) -> bool {
    matches!(code, 3 | 5 | 6 | 7 | 13 | 14 | 15 | 19 | 20 | 56)
}

/// The original no longer knows our producer: take a new one.
fn producer_lost(code: i16) -> bool {
    matches!(code, 45 | 47 | 59)
}

pub fn run(env: CopierEnv, mut file: FailbackFile, shared: Arc<Shared>) {
    let mut backoff = 100u64;
    loop {
        if shared.quit.load(Ordering::Relaxed) {
            return;
        }
        match session(&env, &mut file, &shared) {
            Ok(SessionEnd::Quit) => return,
            Ok(SessionEnd::CaughtUpForStop) => {
                file.groups = cut_over(&env, &file);
                file.phase = Phase::Stopped;
                let saved = env.store.save(&file);
                let mut st = shared.lock();
                st.file = file.clone();
                st.caught_up = true;
                st.error = saved.err().map(|e| e.to_string());
                st.finished = true;
                drop(st);
                shared.finished.notify_all();
                tracing::info!(mirror = %file.mirror, "failback cut over");
                return;
            }
            Err(e) => {
                tracing::warn!(mirror = %file.mirror, error = %e.message, "failback session ended; retrying");
                {
                    let mut st = shared.lock();
                    st.error = Some(e.message.clone());
                    st.file = file.clone();
                }
                let until = std::time::Instant::now() + Duration::from_millis(backoff);
                while std::time::Instant::now() < until && !shared.quit.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                backoff = (backoff * 2).min(FAILBACK_RETRY_BACKOFF_MS_MAX);
            }
        }
    }
}

fn persist(env: &CopierEnv, file: &FailbackFile, shared: &Shared) -> Result<(), CallError> {
    env.store.save(file).map_err(|e| CallError {
        message: e.to_string(),
        retryable: true,
    })?;
    shared.lock().file = file.clone();
    Ok(())
}

fn tp_of(file: &FailbackFile, i: usize) -> TopicPartition {
    TopicPartition::new(
        file.partitions[i].topic.clone(),
        file.partitions[i].partition,
    )
}

/// The next batch of partition `i` on kmirror: (bytes, is control, base, next, records).
fn next_local(env: &CopierEnv, file: &FailbackFile, i: usize) -> Result<Option<Vec<u8>>, String> {
    let tp = tp_of(file, i);
    let handle = env
        .catalog
        .get(&tp)
        .ok_or_else(|| format!("{tp} is not on kmirror"))?;
    batch_at(&handle.view(), file.partitions[i].map.next_kmirror())
}

fn session(
    env: &CopierEnv,
    file: &mut FailbackFile,
    shared: &Shared,
) -> Result<SessionEnd, CallError> {
    let original = Original::of(&env.def)?;
    let live: Vec<usize> = (0..file.partitions.len())
        .filter(|&i| file.partitions[i].error.is_none())
        .collect();
    let mut topics: Vec<&str> = live
        .iter()
        .map(|&i| file.partitions[i].topic.as_str())
        .collect();
    topics.sort_unstable();
    topics.dedup();
    let md = original.metadata(&topics)?;
    let mut conns: BTreeMap<String, ProducerConn> = BTreeMap::new();
    let mut leaders: BTreeMap<usize, String> = BTreeMap::new();
    for &i in &live {
        leaders.insert(i, Original::leader_addr(&md, &tp_of(file, i))?);
    }
    let stamp = match file.producer {
        Some(p) => p,
        None => {
            let Some(addr) = leaders.values().next().cloned() else {
                // Every partition stopped with an error: nothing to copy, wait for stop.
                loop {
                    if shared.quit.load(Ordering::Relaxed) {
                        return Ok(SessionEnd::Quit);
                    }
                    if let Some(end) = wait_idle(file, shared, env)? {
                        return Ok(end);
                    }
                }
            };
            let conn = conns
                .entry(addr.clone())
                .or_insert(ProducerConn::open(&original, &addr)?);
            let (pid, epoch) = conn.init_producer_id()?;
            let p = ProducerStamp {
                producer_id: pid.0,
                producer_epoch: epoch,
            };
            file.producer = Some(p);
            for part in &mut file.partitions {
                part.next_sequence = 0;
            }
            persist(env, file, shared)?;
            tracing::info!(mirror = %file.mirror, producer_id = pid.0, "failback producer id");
            p
        }
    };
    reconcile(env, file, shared, &live)?;
    shared.lock().error = None;
    let mut s = Session {
        original,
        conns,
        leaders,
        coordinators: BTreeMap::new(),
        added: BTreeSet::new(),
        stamp,
    };
    loop {
        if shared.quit.load(Ordering::Relaxed) {
            return Ok(SessionEnd::Quit);
        }
        let mut progressed = false;
        for &i in &live {
            if file.partitions[i].error.is_some() {
                continue;
            }
            for _ in 0..FAILBACK_BATCHES_PER_TURN {
                // A batch stopped the partition (refused, misplaced): nothing more this turn.
                if file.partitions[i].error.is_some() {
                    break;
                }
                let bytes = match next_local(env, file, i) {
                    Ok(Some(b)) => b,
                    Ok(None) => break,
                    Err(why) => {
                        return Err(CallError {
                            message: why,
                            retryable: true,
                        })
                    }
                };
                let Ok(Peek::Complete(batch)) = Batch::peek(&bytes) else {
                    return Err(CallError {
                        message: format!("{}: unreadable batch on kmirror", tp_of(file, i)),
                        retryable: true,
                    });
                };
                progressed = true;
                if copy_batch(env, file, shared, &mut s, i, &batch)? == Flow::Stop {
                    break;
                }
            }
        }
        if !progressed {
            if let Some(end) = wait_idle(file, shared, env)? {
                return Ok(end);
            }
        }
    }
}

/// One session's connections to the original.
struct Session {
    original: Original,
    conns: BTreeMap<String, ProducerConn>,
    leaders: BTreeMap<usize, String>,
    /// Transaction coordinators by transactional id.
    coordinators: BTreeMap<String, TxnConn>,
    /// (partition, kmirror producer id) whose open replayed transaction this session added the
    /// partition to. A transaction persisted open by an earlier process is added again before
    /// its next batch (adding a partition a transaction holds already is a no-op; one the kill
    /// cut off before its AddPartitionsToTxn begins it then).
    added: BTreeSet<(usize, i64)>,
    stamp: ProducerStamp,
}

impl Session {
    fn leader(&mut self, i: usize) -> Result<&mut ProducerConn, CallError> {
        let addr = self.leaders[&i].clone();
        if !self.conns.contains_key(&addr) {
            let c = ProducerConn::open(&self.original, &addr)?;
            self.conns.insert(addr.clone(), c);
        }
        Ok(self.conns.get_mut(&addr).expect("just inserted"))
    }

    fn coordinator(&mut self, tid: &str) -> Result<&mut TxnConn, CallError> {
        if !self.coordinators.contains_key(tid) {
            let c = self.original.txn_coordinator(tid)?;
            self.coordinators.insert(tid.to_owned(), c);
        }
        Ok(self.coordinators.get_mut(tid).expect("just inserted"))
    }
}

/// Test hook (debug builds only, like `runtime::test_hooks`): with
/// `KMIRROR_TEST_FAILBACK_HOLD_FILE=<path>`, while `<path>` exists the copier holds before it
/// continues a replayed transaction already open on the original, and says so by creating
/// `<path>.held`: a test can then kill kmirror or restart the original's broker exactly while a
/// transaction is half replayed, however loaded the machine is.
const HOLD_VAR: &str = "KMIRROR_TEST_FAILBACK_HOLD_FILE";

fn hold_while_asked(shared: &Shared) {
    if !cfg!(debug_assertions) {
        return;
    }
    let Some(path) = std::env::var_os(HOLD_VAR).map(std::path::PathBuf::from) else {
        return;
    };
    if !path.exists() {
        return;
    }
    let mut held = path.clone().into_os_string();
    held.push(".held");
    let held = std::path::PathBuf::from(held);
    tracing::warn!(hold = %path.display(), "failback copier held by the test hook");
    let _ = std::fs::write(&held, b"");
    while path.exists() && !shared.quit.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&held);
}

/// Partition `i`'s replay of kmirror producer `pid` (created when new).
fn replay(file: &mut FailbackFile, i: usize, pid: i64) -> &mut txn_replay::TxnReplay {
    let part = &mut file.partitions[i];
    txn_replay::replay_of(
        &mut part.txns,
        &file.mirror,
        &part.topic,
        part.partition,
        pid,
    )
}

/// Whether the partition goes on this turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Next,
    Stop,
}

/// Stops partition `i` with `why` (persisted; the other partitions go on).
fn refuse(
    env: &CopierEnv,
    file: &mut FailbackFile,
    shared: &Shared,
    i: usize,
    why: String,
) -> Result<Flow, CallError> {
    tracing::error!(mirror = %file.mirror, partition = %tp_of(file, i), error = %why, "failback stops the partition");
    file.partitions[i].error = Some(why);
    persist(env, file, shared)?;
    Ok(Flow::Stop)
}

/// Copies (or replays, or skips) one batch of partition `i` and persists what it changed.
fn copy_batch(
    env: &CopierEnv,
    file: &mut FailbackFile,
    shared: &Shared,
    s: &mut Session,
    i: usize,
    batch: &Batch<'_>,
) -> Result<Flow, CallError> {
    let tp = tp_of(file, i);
    let step = match txn_replay::step_for(BatchFacts::of(batch), &file.partitions[i].txns) {
        Ok(step) => step,
        Err(e) => return refuse(env, file, shared, i, e.to_string()),
    };
    let count = batch.next_offset().0 - batch.base_offset().0;
    match step {
        Step::EndTxn { .. } => hold_while_asked(shared),
        Step::TxnData {
            kmirror_producer_id,
        } if txn_replay::open_of(&file.partitions[i].txns, kmirror_producer_id).is_some() => {
            hold_while_asked(shared)
        }
        _ => {}
    }
    let (stamp, tid) = match step {
        Step::Skip => {
            let part = &mut file.partitions[i];
            if let Err(e) = part.map.skip(batch.base_offset(), batch.next_offset()) {
                part.error = Some(e.to_string());
            }
            persist(env, file, shared)?;
            return Ok(Flow::Next);
        }
        Step::EndTxn {
            kmirror_producer_id,
            outcome,
        } => return end_txn(env, file, shared, s, i, batch, kmirror_producer_id, outcome),
        Step::Plain => (
            Stamp {
                producer_id: ProducerId(s.stamp.producer_id),
                producer_epoch: s.stamp.producer_epoch,
                base_sequence: file.partitions[i].next_sequence,
            },
            None,
        ),
        Step::TxnData {
            kmirror_producer_id,
        } => {
            if let Some(why) = begin_txn(env, file, shared, s, i, kmirror_producer_id, batch)? {
                return refuse(env, file, shared, i, why);
            }
            let r = file.partitions[i]
                .txns
                .iter()
                .find(|t| t.kmirror_producer_id == kmirror_producer_id)
                .expect("begun");
            let p = r.stamp.expect("begun with a producer");
            (
                Stamp {
                    producer_id: ProducerId(p.producer_id),
                    producer_epoch: p.producer_epoch,
                    base_sequence: r.next_sequence,
                },
                Some((kmirror_producer_id, r.transactional_id.clone())),
            )
        }
    };
    let out = match for_produce(batch, stamp) {
        Ok(out) => out,
        Err(e) => return refuse(env, file, shared, i, e.to_string()),
    };
    let size = out.len() as i64;
    let conn = s.leader(i)?;
    let produced = match &tid {
        None => conn.produce(&tp, out)?,
        Some((_, t)) => conn.produce_txn(&tp, out, t)?,
    };
    match produced {
        Produced::At(at) => {
            let part = &mut file.partitions[i];
            // Appended where the map does not expect it (another writer on the original): the
            // partition stops here, so the same batch is never produced again.
            let misplaced = part.map.copied(batch.base_offset(), count, at).err();
            if let Some(e) = &misplaced {
                part.error = Some(e.to_string());
            }
            part.copied_bytes += size;
            match &tid {
                None => {
                    part.next_sequence = next_sequence(part.next_sequence, batch.records_count())
                }
                Some((pid, _)) => {
                    let r = part
                        .txns
                        .iter_mut()
                        .find(|t| t.kmirror_producer_id == *pid)
                        .expect("begun");
                    r.next_sequence = next_sequence(r.next_sequence, batch.records_count());
                }
            }
            persist(env, file, shared)?;
            if misplaced.is_some() {
                return Ok(Flow::Stop);
            }
            Ok(Flow::Next)
        }
        Produced::Error(code, msg) if tid.is_some() && txn_lost(code) => refuse(
            env,
            file,
            shared,
            i,
            format!("the original ended the replayed transaction at kmirror offset {} by itself (error {code} {msg}: its transaction timeout passed?); nothing more is produced to the partition", batch.base_offset()),
        ),
        // A replayed transaction's batch is only ever sent once in sequence; any other answer
        // (OUT_OF_ORDER_SEQUENCE included) would repeat on every resend, so it stops the
        // partition instead of resetting the plain producer.
        Produced::Error(code, msg) if tid.is_some() && !retryable(code) => refuse(
            env,
            file,
            shared,
            i,
            format!(
                "the original refused the replayed transactional batch at kmirror offset {}: error {code} {msg}",
                batch.base_offset()
            ),
        ),
        Produced::Error(code, msg) if producer_lost(code) => {
            file.producer = None;
            persist(env, file, shared)?;
            Err(CallError {
                message: format!("{tp}: the original lost the failback producer (error {code} {msg}); a new one next session"),
                retryable: true,
            })
        }
        Produced::Error(code, msg) if retryable(code) => Err(CallError {
            message: format!("{tp}: produce error {code} {msg}"),
            retryable: true,
        }),
        Produced::Error(code, msg) => refuse(
            env,
            file,
            shared,
            i,
            format!(
                "the original refused the batch at kmirror offset {}: error {code} {msg}",
                batch.base_offset()
            ),
        ),
    }
}

/// The original fenced or ended a replayed transaction (INVALID_PRODUCER_EPOCH,
/// INVALID_TXN_STATE, PRODUCER_FENCED, UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_ID_MAPPING).
fn txn_lost(code: i16) -> bool {
    matches!(code, 47 | 48 | 90 | 59 | 49)
}

/// Begins kmirror producer `pid`'s replayed transaction on the original if it is not open
/// (InitProducerId for its transactional id the first time, then AddPartitionsToTxn), or adds
/// the partition again to one an earlier process left open. `Some(why)`
/// when the original refused.
fn begin_txn(
    env: &CopierEnv,
    file: &mut FailbackFile,
    shared: &Shared,
    s: &mut Session,
    i: usize,
    pid: i64,
    batch: &Batch<'_>,
) -> Result<Option<String>, CallError> {
    let tp = tp_of(file, i);
    let mirror = file.mirror.clone();
    let r = replay(file, i, pid);
    if r.open.is_some() && s.added.contains(&(i, pid)) {
        return Ok(None);
    }
    let tid = r.transactional_id.clone();
    if r.stamp.is_none() {
        // First transaction of this kmirror producer here: no transaction of the id can be
        // open on the original, so InitProducerId fences nothing of ours.
        let (p, e) = match s
            .coordinator(&tid)?
            .init_producer_id(&tid, FAILBACK_TXN_TIMEOUT_MS)
        {
            Ok(answer) => answer,
            // Refused for good (the original's transaction timeout bound): the partition stops
            // with the reason instead of retrying for ever.
            Err(e) if !e.retryable => return Ok(Some(e.message)),
            Err(e) => return Err(e),
        };
        let r = replay(file, i, pid);
        r.stamp = Some(ProducerStamp {
            producer_id: p.0,
            producer_epoch: e,
        });
        r.next_sequence = 0;
        persist(env, file, shared)?;
        tracing::info!(mirror = %mirror, partition = %tp, kmirror_producer = pid, producer_id = p.0, transactional_id = %tid, "failback replays the producer's transactions");
    }
    let r = replay(file, i, pid);
    let st = r.stamp.expect("just set");
    if r.open.is_none() {
        // Persisted open before the partition is added: a restart continues this transaction.
        r.open = Some(OpenTxn {
            first_kmirror: batch.base_offset().0,
            ending: None,
        });
        persist(env, file, shared)?;
    }
    let code = s.coordinator(&tid)?.add_partition(
        &tid,
        (ProducerId(st.producer_id), st.producer_epoch),
        &tp,
    )?;
    match code {
        0 => {
            s.added.insert((i, pid));
            Ok(None)
        }
        15 | 16 => {
            s.coordinators.remove(&tid);
            Err(CallError {
                message: format!("{tp}: AddPartitionsToTxn {tid}: coordinator moved (error {code})"),
                retryable: true,
            })
        }
        c => Ok(Some(format!(
            "AddPartitionsToTxn for the replay of kmirror producer {pid} (transactional id {tid}) at kmirror offset {}: error {c}",
            batch.base_offset()
        ))),
    }
}

/// Replays kmirror's marker `batch` of producer `pid`: EndTxn with its outcome, then waits
/// until the original's own marker is in its log (the one offset it takes is recorded).
#[allow(clippy::too_many_arguments)]
fn end_txn(
    env: &CopierEnv,
    file: &mut FailbackFile,
    shared: &Shared,
    s: &mut Session,
    i: usize,
    batch: &Batch<'_>,
    pid: i64,
    outcome: Outcome,
) -> Result<Flow, CallError> {
    let tp = tp_of(file, i);
    let r = replay(file, i, pid);
    let tid = r.transactional_id.clone();
    let st = r.stamp.expect("an open replay has its producer");
    if let Some(open) = &mut r.open {
        if open.ending.is_none() {
            open.ending = Some(outcome);
            persist(env, file, shared)?;
        }
    }
    let code = s.coordinator(&tid)?.end_txn(
        &tid,
        (ProducerId(st.producer_id), st.producer_epoch),
        outcome.committed(),
    )?;
    match code {
        0 => {}
        15 | 16 => {
            s.coordinators.remove(&tid);
            return Err(CallError {
                message: format!("{tp}: EndTxn {tid}: coordinator moved (error {code})"),
                retryable: true,
            });
        }
        c => {
            return refuse(
                env,
                file,
                shared,
                i,
                format!("EndTxn {outcome:?} for the replay of kmirror producer {pid} (transactional id {tid}) at kmirror offset {}: error {c} (the original ended the transaction by itself?)", batch.base_offset()),
            )
        }
    }
    // The coordinator writes the marker after it answers: wait until the log end holds it.
    let expected = file.partitions[i].map.next_original();
    let until = std::time::Instant::now() + Duration::from_millis(FAILBACK_REQUEST_TIMEOUT_MS);
    loop {
        let end = log_end(env, &tp)?;
        if end == Offset(expected.0 + 1) {
            break;
        }
        if end > Offset(expected.0 + 1) || end < expected {
            return refuse(
                env,
                file,
                shared,
                i,
                format!("after EndTxn the original's log end is {end}, expected {expected} + its marker: another producer wrote to it; nothing more is produced to it"),
            );
        }
        if std::time::Instant::now() >= until || shared.quit.load(Ordering::Relaxed) {
            return Err(CallError {
                message: format!("{tp}: the original's marker for {tid} is not in its log yet"),
                retryable: true,
            });
        }
        std::thread::sleep(Duration::from_millis(FAILBACK_COORDINATOR_RETRY_MS));
    }
    record_marker(file, i, batch, pid, expected);
    persist(env, file, shared)?;
    Ok(Flow::Next)
}

/// The original's marker for `pid`'s replay of kmirror's marker `batch` is at `at`.
fn record_marker(file: &mut FailbackFile, i: usize, batch: &Batch<'_>, pid: i64, at: Offset) {
    let part = &mut file.partitions[i];
    if let Err(e) = part
        .map
        .marker(batch.base_offset(), batch.next_offset(), at)
    {
        part.error = Some(e.to_string());
        return;
    }
    if let Some(r) = part.txns.iter_mut().find(|t| t.kmirror_producer_id == pid) {
        r.open = None;
    }
}

fn log_end(env: &CopierEnv, tp: &TopicPartition) -> Result<Offset, CallError> {
    Ok(log_ends(env, std::slice::from_ref(tp))?[0])
}

/// The original's log end (high watermark) of each of `tps`, in order.
fn log_ends(env: &CopierEnv, tps: &[TopicPartition]) -> Result<Vec<Offset>, CallError> {
    let ends = BlockingSourceCatalog
        .list_offsets(
            &env.def,
            tps,
            OffsetQuery::Latest,
            Deadline::after_ms(FAILBACK_REQUEST_TIMEOUT_MS),
        )
        .map_err(|f| CallError {
            message: f.message,
            retryable: f.retryable,
        })?;
    let mut out = Vec::with_capacity(tps.len());
    for tp in tps {
        match ends.iter().find(|(t, _)| t == tp) {
            Some((_, Listed::At(o))) => out.push(*o),
            other => {
                return Err(CallError {
                    message: format!("{tp}: log end on the original: {other:?}"),
                    retryable: true,
                })
            }
        }
    }
    Ok(out)
}

/// Nothing to copy this turn: says whether every partition is caught up (kmirror's readable
/// end reached and no replayed transaction open), ends the session for a stop when it is,
/// else sleeps a little.
fn wait_idle(
    file: &FailbackFile,
    shared: &Shared,
    env: &CopierEnv,
) -> Result<Option<SessionEnd>, CallError> {
    // A stopped partition counts as done unless it still holds a replayed transaction open on
    // the original: cutting over then would leave the original's last stable offset pinned
    // until that transaction times out and is aborted.
    let caught_up = file.partitions.iter().all(|p| {
        (p.error.is_some() && txn_replay::open_transactions(&p.txns).is_empty())
            || env
                .catalog
                .get(&TopicPartition::new(p.topic.clone(), p.partition))
                .is_some_and(|h| {
                    txn_replay::caught_up(p.map.next_kmirror, readable_end(&h.view()).0, &p.txns)
                })
    });
    shared.lock().caught_up = caught_up;
    if caught_up && shared.stop.load(Ordering::Relaxed) {
        return Ok(Some(SessionEnd::CaughtUpForStop));
    }
    std::thread::sleep(Duration::from_millis(FAILBACK_IDLE_POLL_MS));
    shared.lock().caught_up = false;
    Ok(None)
}

/// Compares each partition's map with the original's log end (see the module comment).
fn reconcile(
    env: &CopierEnv,
    file: &mut FailbackFile,
    shared: &Shared,
    live: &[usize],
) -> Result<(), CallError> {
    let tps: Vec<TopicPartition> = live.iter().map(|&i| tp_of(file, i)).collect();
    let ends = log_ends(env, &tps)?;
    for ((&i, tp), end) in live.iter().zip(&tps).zip(ends) {
        let expected = file.partitions[i].map.next_original();
        if end == expected {
            continue;
        }
        // Past control batches with nothing to replay to the next batch that takes original
        // offsets: was it appended before the crash?
        let next = loop {
            let Some(bytes) = next_local(env, file, i).map_err(|m| CallError {
                message: m,
                retryable: true,
            })?
            else {
                break None;
            };
            let Ok(Peek::Complete(b)) = Batch::peek(&bytes) else {
                return Err(CallError {
                    message: format!("{tp}: unreadable batch on kmirror"),
                    retryable: true,
                });
            };
            let step = txn_replay::step_for(BatchFacts::of(&b), &file.partitions[i].txns);
            let part = &mut file.partitions[i];
            match step {
                Ok(Step::Skip) => {
                    if let Err(e) = part.map.skip(b.base_offset(), b.next_offset()) {
                        part.error = Some(e.to_string());
                        break None;
                    }
                }
                Ok(step) => {
                    let count = b.next_offset().0 - b.base_offset().0;
                    let taken = txn_replay::original_offsets_taken(step, &part.txns, count);
                    let marker_of = match step {
                        Step::EndTxn {
                            kmirror_producer_id,
                            ..
                        } => Some(kmirror_producer_id),
                        _ => None,
                    };
                    break Some((bytes.clone(), taken, marker_of));
                }
                Err(e) => {
                    part.error = Some(e.to_string());
                    break None;
                }
            }
        };
        let taken = next.as_ref().map(|(_, n, _)| *n).filter(|n| *n > 0);
        let part = &mut file.partitions[i];
        match offset_map::reconcile(expected, end, taken) {
            Reconciled::InStep => {}
            Reconciled::AppendedUnrecorded => {
                let (bytes, _, marker_of) = next.expect("a next batch was compared");
                let Ok(Peek::Complete(b)) = Batch::peek(&bytes) else {
                    unreachable!("peeked above")
                };
                match marker_of {
                    // The offset past the map may be our commit's marker or the ABORT the
                    // original wrote when the replay's timeout passed: EndTxn is sent again
                    // (same epoch and outcome: answered 0 if it was ours, fenced if not) and
                    // the marker is recorded only then.
                    Some(_) => {
                        tracing::info!(mirror = %file.mirror, partition = %tp, original = expected.0, "failback: a marker follows the map; EndTxn is sent again to learn whose it is");
                    }
                    // One offset past the map while a replayed transaction is open may be that
                    // transaction's timeout ABORT rather than our single-record batch: the
                    // partition stops rather than mark unsent records as copied.
                    None if b.next_offset().0 - b.base_offset().0 == 1
                        && !txn_replay::open_transactions(&part.txns).is_empty() =>
                    {
                        part.error = Some(format!("the original's log holds one offset ({expected}) past the copy while a replayed transaction is open: it is either the one-record batch at kmirror offset {} or the original's ABORT of that transaction after its timeout; nothing more is produced to the partition until an operator checks it (kafka-dump-log.sh on the original)", b.base_offset()));
                    }
                    None => {
                        tracing::info!(mirror = %file.mirror, partition = %tp, kmirror = b.base_offset().0, original = expected.0, "failback: the batch in flight at the last stop was appended; recorded");
                        record_appended(part, &b, expected);
                    }
                }
            }
            Reconciled::Lost => {
                part.error = Some(format!("the original's log end {end} is below the {expected} the copy reached: the original lost acknowledged records; nothing more is produced to it"));
            }
            Reconciled::Foreign => {
                // With a replayed transaction open, one more offset can also be the ABORT
                // marker the original wrote when that transaction's timeout passed.
                let open = txn_replay::open_transactions(&part.txns);
                let or_timeout = if open.is_empty() {
                    String::new()
                } else {
                    format!(" (or the original aborted the replayed transaction begun at kmirror offset {} by itself: its transaction timeout passed)", open[0])
                };
                part.error = Some(format!("the original holds {} offsets past the copy ({expected}..{end}) that are not kmirror's next batch: another producer wrote to it{or_timeout}; nothing more is produced to it", end.0 - expected.0));
            }
        }
        persist(env, file, shared)?;
    }
    Ok(())
}

/// kmirror's data batch `b`, found appended at `at` on the original after a crash, recorded
/// with the sequence of the producer it was sent under.
fn record_appended(part: &mut PartitionFailback, b: &Batch<'_>, at: Offset) {
    let count = b.next_offset().0 - b.base_offset().0;
    part.map
        .copied(b.base_offset(), count, at)
        .expect("checked contiguous and at the next original offset");
    part.copied_bytes += b.size() as i64;
    let facts = BatchFacts::of(b);
    match txn_replay::step_for(facts, &part.txns) {
        Ok(Step::TxnData {
            kmirror_producer_id,
        }) => {
            if let Some(r) = part
                .txns
                .iter_mut()
                .find(|t| t.kmirror_producer_id == kmirror_producer_id)
            {
                r.next_sequence = next_sequence(r.next_sequence, b.records_count());
            }
        }
        _ => part.next_sequence = next_sequence(part.next_sequence, b.records_count()),
    }
}

/// Moves the committed offsets of kmirror's groups on the failed-back partitions to the
/// original, translated with the maps. Groups with members on kmirror are not moved.
fn cut_over(env: &CopierEnv, file: &FailbackFile) -> Vec<GroupTranslation> {
    let Some(groups) = &env.groups else {
        return Vec::new();
    };
    let maps: BTreeMap<TopicPartition, &crate::control::failback::offset_map::OffsetMap> = file
        .partitions
        .iter()
        .map(|p| (TopicPartition::new(p.topic.clone(), p.partition), &p.map))
        .collect();
    let mut out = Vec::new();
    let mut to_commit: BTreeMap<String, Vec<(TopicPartition, Offset, usize)>> = BTreeMap::new();
    {
        let coord = groups.lock().unwrap_or_else(|p| p.into_inner());
        for (group, tp, offset) in coord.committed_offsets() {
            let Some(map) = maps.get(&tp) else { continue };
            let mut t = GroupTranslation {
                group: group.clone(),
                topic: tp.topic.clone(),
                partition: tp.partition,
                kmirror_offset: offset.0,
                original_offset: None,
                outcome: String::new(),
            };
            if coord.is_active(&group) {
                t.outcome = "the group has members on kmirror: not moved".to_owned();
            } else {
                match map.translate(offset) {
                    Some(o) => {
                        t.original_offset = Some(o.0);
                        to_commit.entry(group.clone()).or_default().push((
                            tp.clone(),
                            o,
                            out.len(),
                        ));
                    }
                    None => t.outcome = "past what was copied: not moved".to_owned(),
                }
            }
            out.push(t);
        }
    }
    let original = match Original::of(&env.def) {
        Ok(o) => o,
        Err(e) => {
            for t in out.iter_mut().filter(|t| t.outcome.is_empty()) {
                t.outcome = e.message.clone();
            }
            return out;
        }
    };
    for (group, offsets) in to_commit {
        let list: Vec<(TopicPartition, Offset)> =
            offsets.iter().map(|(tp, o, _)| (tp.clone(), *o)).collect();
        match original.commit_group(&group, &list) {
            Ok(answers) => {
                for (tp, _, idx) in &offsets {
                    let code = answers
                        .iter()
                        .find(|(t, _)| t == tp)
                        .map_or(-1, |(_, c)| *c);
                    out[*idx].outcome = match code {
                        0 => "committed".to_owned(),
                        22 | 25 | 27 => format!(
                            "the group is active on the original (error {code}): not committed"
                        ),
                        -1 => "no answer for the partition".to_owned(),
                        c => format!("OffsetCommit error {c}"),
                    };
                }
            }
            Err(e) => {
                for (_, _, idx) in &offsets {
                    out[*idx].outcome = e.message.clone();
                }
            }
        }
    }
    for t in &out {
        tracing::info!(mirror = %file.mirror, group = %t.group, topic = %t.topic, partition = t.partition, kmirror = t.kmirror_offset, original = ?t.original_offset, outcome = %t.outcome, "failback group offset");
    }
    out
}
