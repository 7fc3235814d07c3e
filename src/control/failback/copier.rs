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

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::control::failback::local::batch_at;
use crate::control::failback::offset_map::{self, Reconciled};
use crate::control::failback::original::{CallError, Original, Produced, ProducerConn};
use crate::control::failback::rewrite::{for_produce, next_sequence, Stamp};
use crate::control::failback::store::{
    FailbackFile, FailbackStore, GroupTranslation, Phase, ProducerStamp,
};
use crate::control::failback::Shared;
use crate::control::mirror_def::MirrorDefinition;
use crate::control::source_catalog::{BlockingSourceCatalog, Deadline, SourceCatalog};
use crate::fetch::list_offsets::{Listed, OffsetQuery};
use crate::ids::{Offset, ProducerId, TopicPartition};
use crate::limits::{
    FAILBACK_BATCHES_PER_TURN, FAILBACK_IDLE_POLL_MS, FAILBACK_REQUEST_TIMEOUT_MS,
    FAILBACK_RETRY_BACKOFF_MS_MAX,
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
                let part = &mut file.partitions[i];
                if batch.is_control() {
                    if let Err(e) = part.map.skip(batch.base_offset(), batch.next_offset()) {
                        part.error = Some(e.to_string());
                    }
                    persist(env, file, shared)?;
                    continue;
                }
                let count = batch.next_offset().0 - batch.base_offset().0;
                let s = Stamp {
                    producer_id: ProducerId(stamp.producer_id),
                    producer_epoch: stamp.producer_epoch,
                    base_sequence: part.next_sequence,
                };
                let out = match for_produce(&batch, s) {
                    Ok(out) => out,
                    Err(e) => {
                        part.error = Some(e.to_string());
                        tracing::error!(mirror = %file.mirror, partition = %tp_of(file, i), error = %e, "failback refuses the partition");
                        persist(env, file, shared)?;
                        break;
                    }
                };
                let tp = tp_of(file, i);
                let addr = leaders[&i].clone();
                if !conns.contains_key(&addr) {
                    conns.insert(addr.clone(), ProducerConn::open(&original, &addr)?);
                }
                let conn = conns.get_mut(&addr).expect("just inserted");
                match conn.produce(&tp, out)? {
                    Produced::At(at) => {
                        let part = &mut file.partitions[i];
                        if let Err(e) = part.map.copied(batch.base_offset(), count, at) {
                            part.error = Some(e.to_string());
                        }
                        part.next_sequence =
                            next_sequence(part.next_sequence, batch.records_count());
                        persist(env, file, shared)?;
                    }
                    Produced::Error(code, msg) if producer_lost(code) => {
                        file.producer = None;
                        persist(env, file, shared)?;
                        return Err(CallError {
                            message: format!("{tp}: the original lost the failback producer (error {code} {msg}); a new one next session"),
                            retryable: true,
                        });
                    }
                    Produced::Error(code, msg) if retryable(code) => {
                        return Err(CallError {
                            message: format!("{tp}: produce error {code} {msg}"),
                            retryable: true,
                        });
                    }
                    Produced::Error(code, msg) => {
                        let part = &mut file.partitions[i];
                        part.error = Some(format!("the original refused the batch at kmirror offset {}: error {code} {msg}", batch.base_offset()));
                        persist(env, file, shared)?;
                        break;
                    }
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

/// Nothing to copy this turn: says so, ends the session for a stop, else sleeps a little.
fn wait_idle(
    _file: &FailbackFile,
    shared: &Shared,
    _env: &CopierEnv,
) -> Result<Option<SessionEnd>, CallError> {
    shared.lock().caught_up = true;
    if shared.stop.load(Ordering::Relaxed) {
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
    let ends = BlockingSourceCatalog
        .list_offsets(
            &env.def,
            &tps,
            OffsetQuery::Latest,
            Deadline::after_ms(FAILBACK_REQUEST_TIMEOUT_MS),
        )
        .map_err(|f| CallError {
            message: f.message,
            retryable: f.retryable,
        })?;
    for (&i, (tp, listed)) in live.iter().zip(ends) {
        let end = match listed {
            Listed::At(o) => o,
            other => {
                return Err(CallError {
                    message: format!("{tp}: log end on the original: {other:?}"),
                    retryable: true,
                })
            }
        };
        let expected = file.partitions[i].map.next_original();
        if end == expected {
            continue;
        }
        // Past control batches to the next data batch: was it appended before the crash?
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
            if b.is_control() {
                let part = &mut file.partitions[i];
                if let Err(e) = part.map.skip(b.base_offset(), b.next_offset()) {
                    part.error = Some(e.to_string());
                    break None;
                }
                continue;
            }
            break Some((
                b.base_offset(),
                b.next_offset().0 - b.base_offset().0,
                b.records_count(),
            ));
        };
        let part = &mut file.partitions[i];
        match offset_map::reconcile(expected, end, next.map(|(_, count, _)| count)) {
            Reconciled::InStep => {}
            Reconciled::AppendedUnrecorded => {
                let (base, count, records) = next.expect("a next batch was compared");
                tracing::info!(mirror = %file.mirror, partition = %tp, kmirror = base.0, original = expected.0, "failback: the batch in flight at the last stop was appended; recorded");
                part.map
                    .copied(base, count, expected)
                    .expect("checked contiguous and at the next original offset");
                part.next_sequence = next_sequence(part.next_sequence, records);
            }
            Reconciled::Lost => {
                part.error = Some(format!("the original's log end {end} is below the {expected} the copy reached: the original lost acknowledged records; nothing more is produced to it"));
            }
            Reconciled::Foreign => {
                part.error = Some(format!("the original holds {} offsets past the copy ({expected}..{end}) that are not kmirror's next batch: another producer wrote to it; nothing more is produced to it", end.0 - expected.0));
            }
        }
        persist(env, file, shared)?;
    }
    Ok(())
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
