//! Flushes of the shard's logs (a child of `mirror_shard`), performed on its ring without
//! waiting: the fdatasyncs a segment roll or the periodic recovery-point checkpoint asks for
//! are submitted as async FSYNC ops, the shard goes on fetching and appending, and the log's
//! recovery point moves when the last of them completed (`log::flush_plan` says why: a rolled
//! gigabyte segment's write-back held the shard, and every partition on it, for seconds).
//!
//! Each log the shard holds has its flushes deferred (`PartitionLog::set_deferred_flushes`),
//! so a roll only marks a flush wanted and the shard starts it after the append that rolled.
//! At most one flush per log is in flight; one asked for meanwhile begins when it finishes.
//! At most `SHARD_FSYNCS_IN_FLIGHT_MAX` FSYNCs are on the ring at once (a checkpoint round of
//! thousands of logs would otherwise take every op slot the sources need); the rest wait in
//! a queue fed as FSYNCs complete. A log leaves the shard (pause, stop, failure, shutdown)
//! only after its flush in flight finished (`settle_flush`), so whoever gets it next sees no
//! sync under way.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::sync::Arc;
use std::time::Instant;

use super::{notice, Cx, Loc, MirrorShard};
use crate::ids::TopicPartition;
use crate::limits::SHARD_FSYNCS_IN_FLIGHT_MAX;
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

fn fsync_index(tag: u64) -> usize {
    ((tag >> 8) & 0x00ff_ffff) as usize
}

/// One flush whose syncs are queued or on the ring.
struct InFlightFlush {
    tp: TopicPartition,
    /// Where the log was when the flush began (a leader move may have moved it since).
    at: Loc,
    plan: FlushPlan,
    began: Instant,
    /// Syncs not completed yet (queued or on the ring).
    outstanding: usize,
    /// The first failed sync.
    error: Option<LogError>,
}

/// A sync waiting for room on the ring.
struct QueuedSync {
    id: u32,
    index: usize,
    file: Arc<File>,
}

/// The shard's flushes in flight, by id.
#[derive(Default)]
pub(super) struct Flushes {
    in_flight: HashMap<u32, InFlightFlush>,
    queue: VecDeque<QueuedSync>,
    /// FSYNCs on the ring now.
    on_ring: usize,
    next_id: u32,
}

impl Flushes {
    /// Whether no flush is queued or on the ring (shutdown's check).
    pub(super) fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }

    fn id_of(&self, tp: &TopicPartition) -> Option<u32> {
        self.in_flight
            .iter()
            .find_map(|(id, f)| (&f.tp == tp).then_some(*id))
    }

    /// An FSYNC's completion: off the ring, counted into its flush.
    fn completed(&mut self, c: &Completion) {
        self.on_ring -= 1;
        self.count(fsync_id(c.tag), fsync_index(c.tag), c.result);
    }

    /// Counts one completed sync (`result`: the CQE's) into its flush, which stays tracked
    /// (`take_done` removes it). A sync of a flush no longer tracked is ignored.
    fn count(&mut self, id: u32, index: usize, result: i32) {
        let Some(flight) = self.in_flight.get_mut(&id) else {
            return;
        };
        flight.outstanding -= 1;
        if result < 0 && flight.error.is_none() {
            let path = flight
                .plan
                .syncs()
                .get(index)
                .map(|s| s.path().to_path_buf())
                .unwrap_or_default();
            flight.error = Some(LogError::io(&path, io::Error::from_raw_os_error(-result)));
        }
    }

    /// The flush `id` if all its syncs completed, no longer tracked.
    fn take_done(&mut self, id: u32) -> Option<InFlightFlush> {
        if self.in_flight.get(&id)?.outstanding == 0 {
            self.in_flight.remove(&id)
        } else {
            None
        }
    }
}

impl MirrorShard {
    /// Begins `at`'s flush and queues its syncs; nothing waits for them. A flush already in
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
            if let Err(e) = log.finish_flush(&mut RingIo::new(cx.ring), plan, Ok(())) {
                notice(cx, format!("{tp}: flush failed: {e}"));
            }
            return;
        }
        let id = self.flushes.next_id;
        self.flushes.next_id = self.flushes.next_id.wrapping_add(1);
        for (index, sync) in plan.syncs().iter().enumerate() {
            self.flushes.queue.push_back(QueuedSync {
                id,
                index,
                file: Arc::clone(sync.file()),
            });
        }
        cx.stats.flush_started();
        self.flushes.in_flight.insert(
            id,
            InFlightFlush {
                tp,
                at,
                outstanding: plan.syncs().len(),
                plan,
                began: Instant::now(),
                error: None,
            },
        );
        self.pump_syncs(cx);
    }

    /// Moves queued syncs onto the ring while fewer than the cap are there and the ring has
    /// op slots free (a full slab leaves them queued for the next completion or turn).
    pub(super) fn pump_syncs(&mut self, cx: &mut Cx<'_>) {
        while self.flushes.on_ring < SHARD_FSYNCS_IN_FLIGHT_MAX {
            let Some(q) = self.flushes.queue.pop_front() else {
                return;
            };
            let tag = fsync_tag(q.id, q.index);
            if cx.ring.fdatasync_async(tag, Arc::clone(&q.file)).is_err() {
                self.flushes.queue.push_front(q);
                return;
            }
            self.flushes.on_ring += 1;
        }
    }

    /// Starts the flush of every log that wants one (after a roll or retention pass).
    pub(super) fn start_wanted_flushes(&mut self, cx: &mut Cx<'_>) {
        for at in self.logs_where(PartitionLog::wants_flush) {
            self.start_flush(cx, at);
        }
    }

    /// A flush's FSYNC completed (dispatched before the shard completes any response writes).
    /// It is counted before anything else happens: completing those writes may hand a log
    /// back (`settle_flush`), which must see this sync as done rather than wait for a CQE
    /// already taken off the ring.
    pub(super) fn on_fsync(&mut self, cx: &mut Cx<'_>, c: Completion) {
        self.flushes.completed(&c);
        let id = fsync_id(c.tag);
        self.complete_staged(cx);
        // Unless the log left the shard meanwhile (settled then).
        if let Some(flight) = self.flushes.take_done(id) {
            self.finish_flight(cx, flight);
        }
        self.pump_syncs(cx);
    }

    /// Completes a flush whose syncs all finished on the log it belongs to, and starts the
    /// next one if the log asked for it meanwhile.
    fn finish_flight(&mut self, cx: &mut Cx<'_>, flight: InFlightFlush) {
        let InFlightFlush {
            tp,
            at,
            plan,
            error,
            began,
            ..
        } = flight;
        cx.stats.flush_finished(began.elapsed());
        let still_there = self.log(at).is_some_and(|l| l.topic_partition() == &tp);
        let Some(at) = still_there.then_some(at).or_else(|| self.find(&tp)) else {
            // Logs leave the shard only through `settle_flush`, which finishes their flush.
            unreachable!("{tp}: a flush finished for a log the shard no longer holds");
        };
        let log = self.log_mut(at).expect("found above");
        if let Err(e) = log.finish_flush(&mut RingIo::new(cx.ring), plan, error.map_or(Ok(()), Err))
        {
            notice(cx, format!("{tp}: flush failed: {e}"));
        }
        if log.wants_flush() {
            self.start_flush(cx, at);
        }
    }

    /// Before `log` leaves the shard: finishes its flush in flight, if any. Its syncs still
    /// queued go to the ring at once, and all of them are waited for (other completions that
    /// arrive meanwhile stay queued for the shard's loop; the heartbeat goes on for up to
    /// `SHARD_DISK_WAIT_MAX_MS`, so a long write-back is not taken for a stall but a wait
    /// that never ends is). Then the log's flushes are handed back to synchronous owners.
    pub(super) fn settle_flush(&mut self, cx: &mut Cx<'_>, log: &mut PartitionLog) {
        if log.flush_in_flight() {
            let tp = log.topic_partition().clone();
            let id = self
                .flushes
                .id_of(&tp)
                .expect("a log's flush in flight is tracked by the shard");
            let (mine, rest): (VecDeque<QueuedSync>, VecDeque<QueuedSync>) =
                std::mem::take(&mut self.flushes.queue)
                    .into_iter()
                    .partition(|q| q.id == id);
            self.flushes.queue = rest;
            // Its queued syncs go to the ring now, past the cap (this wait is for them); one
            // the slab has no room for runs here and now.
            for q in mine {
                match cx
                    .ring
                    .fdatasync_async(fsync_tag(id, q.index), Arc::clone(&q.file))
                {
                    Ok(()) => self.flushes.on_ring += 1,
                    Err(_) => {
                        let result = match cx.ring.fdatasync(&q.file) {
                            Ok(()) => 0,
                            Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
                        };
                        self.flushes.count(id, q.index, result);
                    }
                }
            }
            // The heartbeat goes on while the disk writes back, but not for ever: a wait
            // that outlasts SHARD_DISK_WAIT_MAX_MS lets the health check fail the shard.
            let waiting_since = Instant::now();
            let flight = loop {
                for c in cx
                    .ring
                    .take_ready(|c| c.tag & 0xff == KIND_FSYNC && fsync_id(c.tag) == id)
                {
                    self.flushes.completed(&c);
                }
                if let Some(flight) = self.flushes.take_done(id) {
                    break flight;
                }
                cx.ring.disk_wait_step(waiting_since);
            };
            cx.ring.disk_wait_end();
            cx.stats.flush_finished(flight.began.elapsed());
            let synced = flight.error.map_or(Ok(()), Err);
            if let Err(e) = log.finish_flush(&mut RingIo::new(cx.ring), flight.plan, synced) {
                notice(cx, format!("{tp}: flush failed: {e}"));
            }
            self.pump_syncs(cx);
        }
        log.set_deferred_flushes(false);
    }
}
