//! Flushes of the shard's logs (a child of `mirror_shard`), performed on its ring without
//! waiting: the fdatasyncs a segment roll or the periodic recovery-point checkpoint asks for
//! are submitted as async FSYNC ops, the shard goes on fetching and appending, and the log's
//! recovery point moves when the last of them completed (`log::flush_plan` says why: a rolled
//! gigabyte segment's write-back held the shard, and every partition on it, for seconds).
//!
//! Each log the shard holds has its flushes deferred (`PartitionLog::set_deferred_flushes`),
//! so a roll only marks a flush wanted and the shard starts it after the append that rolled.
//! At most one flush per log is in flight; one asked for meanwhile begins when it finishes.
//! A log leaves the shard (pause, stop, failure, shutdown) only after its flush in flight
//! finished (`settle_flush`, which waits on the ring for that flush's ops alone), so whoever
//! gets it next sees no sync under way.

use std::collections::HashMap;
use std::io;
use std::time::Instant;

use super::{notice, Cx, Loc, MirrorShard};
use crate::ids::TopicPartition;
use crate::log::flush_plan::FlushPlan;
use crate::log::partition_log::PartitionLog;
use crate::log::LogError;
use crate::runtime::ring::Completion;
use crate::runtime::uring_io::RingIo;

/// Op kind of a flush's FSYNC in the shard's tag layout (kinds 1..=5 are the sources').
pub(super) const KIND_FSYNC: u64 = 6;

/// Tag of sync `index` of flush `id`: the id in bits 32..64, the index in bits 8..32.
fn fsync_tag(id: u32, index: usize) -> u64 {
    (u64::from(id) << 32) | (((index as u64) & 0x00ff_ffff) << 8) | KIND_FSYNC
}

fn fsync_id(tag: u64) -> u32 {
    (tag >> 32) as u32
}

/// One flush whose syncs are on the ring.
struct InFlightFlush {
    tp: TopicPartition,
    plan: FlushPlan,
    began: Instant,
    /// Syncs not completed yet.
    outstanding: usize,
    /// The first failed sync.
    error: Option<LogError>,
}

/// The shard's flushes in flight, by id.
#[derive(Default)]
pub(super) struct Flushes {
    in_flight: HashMap<u32, InFlightFlush>,
    next_id: u32,
}

impl Flushes {
    /// Whether any flush is on the ring (tests and shutdown).
    pub(super) fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }

    fn id_of(&self, tp: &TopicPartition) -> Option<u32> {
        self.in_flight
            .iter()
            .find_map(|(id, f)| (&f.tp == tp).then_some(*id))
    }
}

impl MirrorShard {
    /// Begins `at`'s flush and submits its syncs; nothing waits for them. A flush already in
    /// flight for the log makes this one wanted (it begins when that one finished).
    pub(super) fn start_flush(&mut self, cx: &mut Cx<'_>, at: Loc) {
        let Some(log) = self.log_mut(at) else {
            return;
        };
        let tp = log.topic_partition().clone();
        let plan = match log.begin_flush(&mut RingIo::new(cx.ring)) {
            Ok(Some(plan)) => plan,
            Ok(None) => return,
            Err(e) => return notice(cx, format!("{tp}: flush failed: {e}")),
        };
        if plan.syncs().is_empty() {
            if let Err(e) = log.finish_flush(plan, Ok(())) {
                notice(cx, format!("{tp}: flush failed: {e}"));
            }
            return;
        }
        let id = self.flushes.next_id;
        self.flushes.next_id = self.flushes.next_id.wrapping_add(1);
        let mut flight = InFlightFlush {
            tp,
            began: Instant::now(),
            outstanding: 0,
            error: None,
            plan,
        };
        for (k, sync) in flight.plan.syncs().iter().enumerate() {
            match cx
                .ring
                .fdatasync_async(fsync_tag(id, k), std::sync::Arc::clone(sync.file()))
            {
                Ok(()) => flight.outstanding += 1,
                // No room for another op in flight: this one is synced here and now.
                Err(_) => {
                    if let Err(e) = cx.ring.fdatasync(sync.file()) {
                        flight
                            .error
                            .get_or_insert_with(|| LogError::io(sync.path(), e));
                    }
                }
            }
        }
        cx.stats.flush_started();
        if flight.outstanding == 0 {
            self.finish_flight(cx, flight);
        } else {
            self.flushes.in_flight.insert(id, flight);
        }
    }

    /// Starts the flush of every log that wants one (after a roll or retention pass).
    pub(super) fn start_wanted_flushes(&mut self, cx: &mut Cx<'_>) {
        let mut wanted = Vec::new();
        for (i, src) in self.sources.iter().enumerate() {
            for (g, group) in src.groups.iter().enumerate() {
                for (n, log) in group.logs.iter().enumerate() {
                    if log.as_ref().is_some_and(PartitionLog::wants_flush) {
                        wanted.push(Loc {
                            src: i,
                            group: g,
                            slot: crate::fetch::fetcher::Slot(n as u32),
                        });
                    }
                }
            }
        }
        for at in wanted {
            self.start_flush(cx, at);
        }
    }

    /// A flush's FSYNC completed.
    pub(super) fn on_fsync(&mut self, cx: &mut Cx<'_>, c: Completion) {
        let id = fsync_id(c.tag);
        let Some(flight) = self.flushes.in_flight.get_mut(&id) else {
            return;
        };
        Self::count_sync(flight, &c);
        if flight.outstanding == 0 {
            let flight = self.flushes.in_flight.remove(&id).expect("looked up above");
            self.finish_flight(cx, flight);
        }
    }

    fn count_sync(flight: &mut InFlightFlush, c: &Completion) {
        flight.outstanding -= 1;
        if c.result < 0 && flight.error.is_none() {
            let index = ((c.tag >> 8) & 0x00ff_ffff) as usize;
            let path = flight
                .plan
                .syncs()
                .get(index)
                .map(|s| s.path().to_path_buf())
                .unwrap_or_default();
            flight.error = Some(LogError::io(&path, io::Error::from_raw_os_error(-c.result)));
        }
    }

    /// Completes a flush whose syncs all finished on the log it belongs to, and starts the
    /// next one if the log asked for it meanwhile.
    fn finish_flight(&mut self, cx: &mut Cx<'_>, flight: InFlightFlush) {
        let InFlightFlush {
            tp,
            plan,
            error,
            began,
            ..
        } = flight;
        cx.stats.flush_finished(began.elapsed());
        let Some(at) = self.find(&tp) else {
            // Logs leave the shard only through `settle_flush`, which finishes their flush.
            unreachable!("{tp}: a flush finished for a log the shard no longer holds");
        };
        let log = self.log_mut(at).expect("found above");
        if let Err(e) = log.finish_flush(plan, error.map_or(Ok(()), Err)) {
            notice(cx, format!("{tp}: flush failed: {e}"));
        }
        if log.wants_flush() {
            self.start_flush(cx, at);
        }
    }

    /// Before `log` leaves the shard: waits for its flush in flight, if any, and finishes it
    /// (other completions that arrive meanwhile stay queued for the shard's loop), then hands
    /// the log's flushes back to synchronous owners.
    pub(super) fn settle_flush(&mut self, cx: &mut Cx<'_>, log: &mut PartitionLog) {
        if log.flush_in_flight() {
            let tp = log.topic_partition().clone();
            let id = self
                .flushes
                .id_of(&tp)
                .expect("a log's flush in flight is tracked by the shard");
            loop {
                let done = cx
                    .ring
                    .take_ready(|c| c.tag & 0xff == KIND_FSYNC && fsync_id(c.tag) == id);
                let flight = self.flushes.in_flight.get_mut(&id).expect("tracked");
                for c in &done {
                    Self::count_sync(flight, c);
                }
                if flight.outstanding == 0 {
                    break;
                }
                // The heartbeat's TIMEOUT completes meanwhile too, so a long write-back is
                // still seen as progress.
                cx.stats.heartbeat().beat();
                cx.ring.submit_and_wait_new();
            }
            let flight = self.flushes.in_flight.remove(&id).expect("tracked");
            cx.stats.flush_finished(flight.began.elapsed());
            if let Err(e) = log.finish_flush(flight.plan, flight.error.map_or(Ok(()), Err)) {
                notice(cx, format!("{tp}: flush failed: {e}"));
            }
        }
        log.set_deferred_flushes(false);
    }
}
