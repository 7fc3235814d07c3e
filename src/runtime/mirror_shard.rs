//! The data path on one shard: TCP connections to source brokers on the shard's ring, response
//! frames received into arena slots, handed to the sans-IO `Fetcher` as `Bytes`, and the
//! validated record slices appended to the owned partitions' logs through `RingIo`.
//!
//! Owned by one shard thread. One connection per source broker this shard fetches from (the
//! control thread routes each partition to one shard, so a broker may have one connection per
//! shard). The fetcher keeps one request in flight per connection, like Kafka's replica fetcher,
//! so a connection never has more than one response arriving: a RECV may therefore ask for the
//! whole remaining slot without reading into the next frame (a longer read is treated as a
//! protocol violation).
//!
//! Timing comes only from ring TIMEOUTs: the fetcher's throttle and backoff instants, reconnect
//! delays, and retries when the arena is momentarily exhausted.
//!
//! Connect uses IORING_OP_CONNECT on a fresh socket. Name resolution (`host:port` from metadata)
//! is a blocking `getaddrinfo` on the shard; it runs only when (re)connecting, and brokers are
//! usually given as addresses or /etc/hosts names.

use std::net::{Shutdown, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use uuid::Uuid;

use super::arena::SlotBuf;
use super::ring::{Completion, OpBuf};
use super::shard::{ShardCx, ShardHandler};
use super::stats::{Latency, PartitionStats};
use super::uring_io::RingIo;
use crate::fetch::fetcher::{
    FetchConfig, FetchEvent, Fetcher, PartitionStart, PartitionState, Poll, Slot,
};
use crate::fetch::security::SourceSecurity;
use crate::fetch::versions::Versions;
use crate::ids::{LeaderEpoch, Offset, TopicPartition};
use crate::limits::{ARENA_RETRY_MS, SHARD_SOURCES_MAX, SOURCE_RECONNECT_MS};
use crate::log::partition_log::PartitionLog;
use crate::wire::frame::{self, LENGTH_PREFIX_BYTES};

// TLS and SASL on the ring: kept apart so the plaintext path above stays as it was.
#[path = "mirror_shard_secure.rs"]
mod secure;
// Progress reports for describe.
#[path = "mirror_shard_progress.rs"]
mod progress_report;

/// Control → shard.
#[derive(Debug)]
pub enum MirrorMsg {
    /// Fetch `start.tp` from `broker` (connecting if needed) into `log`, which the shard now owns.
    AddPartition {
        source: SourceSpec,
        start: PartitionStart,
        log: Box<PartitionLog>,
    },
    /// Stop fetching `tp` and hand its log back (pause, stop, source topic deleted). Answered by
    /// `PartitionRemoved`, or by nothing when the shard does not have the partition (it was
    /// already stopped, and `PartitionStopped` said so).
    RemovePartition { tp: TopicPartition },
    /// The answer to `LeaderWanted`: the partition's leader per the source's metadata. The
    /// shard moves the partition to that broker's connection (from its log end) if it is
    /// another broker, takes the new leader epoch, and fails the partition if `topic_id`
    /// differs from the one it fetched (the source topic was deleted and recreated).
    Releader {
        tp: TopicPartition,
        source: SourceSpec,
        topic_id: Uuid,
        leader_epoch: LeaderEpoch,
    },
}

/// How to reach and talk to one source broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    pub broker_id: i32,
    /// `host:port`.
    pub addr: String,
    pub versions: Versions,
    pub fetch: FetchConfig,
    pub client_id: String,
    /// Added to the fetch's `max_wait_ms` to bound how long a response may take.
    pub request_timeout_ms: u32,
    /// TLS and SASL; each mirror's own, so connections are shared only within one mirror.
    pub security: std::sync::Arc<SourceSecurity>,
}

/// Shard → control.
#[derive(Debug)]
pub enum MirrorEvent {
    PartitionAdded {
        tp: TopicPartition,
    },
    /// The partition stopped (append failure, divergence, bad data); why is in `why`. Its log
    /// is in the returned-logs list. `retryable` is false when fetching again cannot help
    /// (the source no longer holds what we hold).
    PartitionStopped {
        tp: TopicPartition,
        why: String,
        retryable: bool,
    },
    /// The partition waits for its leader (a leader or topic error, or its broker's connection
    /// broke): the control thread looks it up and answers with `MirrorMsg::Releader`. Asked
    /// once until answered.
    LeaderWanted {
        tp: TopicPartition,
        why: String,
    },
    /// The partition's fetcher is gone and its log is in the returned-logs list.
    PartitionRemoved {
        tp: TopicPartition,
        log_end: Offset,
    },
    /// Something the operator may want to see (connection loss, source errors); fetching goes on.
    Notice {
        what: String,
    },
}

const KIND_CONNECT: u64 = 1;
const KIND_SEND: u64 = 2;
const KIND_RECV: u64 = 3;
const KIND_TIMER: u64 = 4;
const KIND_DEADLINE: u64 = 5;

/// Tag layout: source index (bits 32..56), connection generation (bits 8..32), op kind (0..8).
/// The generation lets completions of a closed connection's ops be recognised and dropped.
fn tag(source: usize, generation: u32, kind: u64) -> u64 {
    ((source as u64) << 32) | (u64::from(generation & 0x00ff_ffff) << 8) | kind
}

fn untag(tag: u64) -> (usize, u32, u64) {
    (
        (tag >> 32) as usize,
        ((tag >> 8) & 0x00ff_ffff) as u32,
        tag & 0xff,
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Down,
    Connecting,
    /// TCP is up; TLS handshake and/or SASL authentication are in progress.
    Securing,
    Up,
}

/// One source broker as seen by this shard: its socket, its fetcher, and the logs it feeds.
struct Source {
    spec: SourceSpec,
    fetcher: Fetcher,
    socket: Option<socket2::Socket>,
    /// The TLS/SASL layer of the current connection (none on PLAINTEXT).
    secure: Option<crate::fetch::security::SecureLink>,
    link: Link,
    generation: u32,
    out: BytesMut,
    sending: bool,
    receiving: bool,
    /// A partly received frame waiting for its next RECV.
    partial: Option<SlotBuf>,
    timer_armed: bool,
    /// When the outstanding request went out; a response must arrive within
    /// `max_wait_ms + request_timeout_ms` or the connection is dropped (as Kafka's
    /// `request.timeout.ms` does).
    request_sent_at: Option<Instant>,
    deadline_armed: bool,
    /// Indexed by the fetcher's `Slot`.
    logs: Vec<Option<PartitionLog>>,
    /// Each log's metrics, indexed like `logs`.
    meters: Vec<Option<Arc<PartitionStats>>>,
    /// The fetcher's throttle total already added to the shard's counter.
    throttle_seen_ms: u64,
    /// Indexed by `Slot`: a `LeaderWanted` went out and no `Releader` came back yet.
    leader_wanted: Vec<bool>,
}

/// Logs handed back to the control thread when a shard stops or drops a partition, so the
/// control thread can checkpoint and close the whole log dir. Locked only at those moments.
pub type ReturnedLogs = Arc<Mutex<Vec<PartitionLog>>>;

/// The mirroring `ShardHandler`.
pub struct MirrorShard {
    sources: Vec<Source>,
    events: Vec<FetchEvent>,
    returned: ReturnedLogs,
    progress: super::progress::ProgressBoard,
    /// Progress cells by (source, slot), looked up once when a partition arrives.
    cells: std::collections::HashMap<(usize, u32), Arc<super::progress::PartitionProgress>>,
}

impl MirrorShard {
    pub fn new(returned: ReturnedLogs) -> MirrorShard {
        MirrorShard {
            sources: Vec::new(),
            events: Vec::new(),
            returned,
            progress: Default::default(),
            cells: Default::default(),
        }
    }

    /// Publishes the partitions' progress on `board` (for the control thread's describe).
    pub fn with_progress(mut self, board: super::progress::ProgressBoard) -> MirrorShard {
        self.progress = board;
        self
    }

    fn give_back(&self, log: PartitionLog) {
        // A poisoned lock means another shard panicked mid-push; the Vec is still sound.
        let mut logs = self.returned.lock().unwrap_or_else(|p| p.into_inner());
        logs.push(log);
    }
}

type Cx<'a> = ShardCx<'a, MirrorEvent>;

fn notice(cx: &mut Cx<'_>, what: String) {
    // A full event queue only loses a notice; the data path must not block on the control thread.
    let _ = cx.emit(MirrorEvent::Notice { what });
}

impl MirrorShard {
    fn source_index(&mut self, cx: &mut Cx<'_>, spec: SourceSpec) -> Option<usize> {
        if let Some(i) = self
            .sources
            .iter()
            .position(|s| secure::same_connection(&s.spec, &spec))
        {
            secure::reconnect_if_refused(self, cx, i);
            return Some(i);
        }
        if self.sources.len() >= SHARD_SOURCES_MAX {
            notice(
                cx,
                format!("too many source brokers on shard {}", cx.shard.0),
            );
            return None;
        }
        let fetcher = match Fetcher::new(spec.fetch, spec.versions, &spec.client_id) {
            Ok(f) => f,
            Err(e) => {
                notice(cx, format!("broker {}: {e}", spec.broker_id));
                return None;
            }
        };
        self.sources.push(Source {
            spec,
            fetcher,
            socket: None,
            secure: None,
            link: Link::Down,
            generation: 0,
            out: BytesMut::with_capacity(64 * 1024),
            sending: false,
            receiving: false,
            partial: None,
            timer_armed: false,
            request_sent_at: None,
            deadline_armed: false,
            logs: Vec::new(),
            meters: Vec::new(),
            throttle_seen_ms: 0,
            leader_wanted: Vec::new(),
        });
        let i = self.sources.len() - 1;
        self.connect(cx, i);
        Some(i)
    }

    fn add_partition(
        &mut self,
        cx: &mut Cx<'_>,
        spec: SourceSpec,
        start: PartitionStart,
        log: PartitionLog,
    ) {
        let tp = start.tp.clone();
        let Some(i) = self.source_index(cx, spec) else {
            let why = "cannot set up its source broker".to_string();
            self.give_back(log);
            let _ = cx.emit(MirrorEvent::PartitionStopped {
                tp,
                why,
                retryable: true,
            });
            return;
        };
        let src = &mut self.sources[i];
        match src.fetcher.add_partition(start) {
            Ok(Slot(n)) => {
                let n = n as usize;
                if src.logs.len() <= n {
                    src.logs.resize_with(n + 1, || None);
                    src.meters.resize_with(n + 1, || None);
                    src.leader_wanted.resize(n + 1, false);
                }
                src.meters[n] = Some(cx.stats.register(tp.clone(), log.log_end_offset()));
                src.logs[n] = Some(log);
                src.leader_wanted[n] = false;
                self.track_progress(i, Slot(n as u32), &tp);
                let _ = cx.emit(MirrorEvent::PartitionAdded { tp });
                self.drive(cx, i);
            }
            Err(e) => {
                self.give_back(log);
                let _ = cx.emit(MirrorEvent::PartitionStopped {
                    tp,
                    why: e.to_string(),
                    retryable: true,
                });
            }
        }
    }

    fn remove_partition(&mut self, cx: &mut Cx<'_>, tp: TopicPartition) {
        let found = self.sources.iter().enumerate().find_map(|(i, src)| {
            src.logs
                .iter()
                .position(|l| l.as_ref().is_some_and(|l| *l.topic_partition() == tp))
                .map(|slot| (i, slot))
        });
        let Some((i, slot)) = found else {
            return;
        };
        let src = &mut self.sources[i];
        let log = src.logs[slot].take();
        if let Some(m) = src.meters[slot].take() {
            cx.stats.deregister(&m);
        }
        // The fetcher forgets the slot; a response already in flight for it is dropped by the
        // fetcher, so nothing is appended to the log after it is handed back.
        let _ = src.fetcher.remove_partition(Slot(slot as _));
        if let Some(log) = log {
            let log_end = log.log_end_offset();
            self.give_back(log);
            let _ = cx.emit(MirrorEvent::PartitionRemoved { tp, log_end });
        }
    }

    fn arm_timer(&mut self, cx: &mut Cx<'_>, i: usize, after: Duration) {
        let src = &mut self.sources[i];
        if src.timer_armed {
            return;
        }
        if cx.ring.timeout(tag(i, 0, KIND_TIMER), after).is_ok() {
            src.timer_armed = true;
        }
    }

    fn request_limit(src: &Source) -> Duration {
        Duration::from_millis(
            u64::from(src.spec.fetch.max_wait_ms) + u64::from(src.spec.request_timeout_ms),
        )
    }

    /// One deadline timer per source at most: when it fires it re-arms for whatever is left of
    /// the outstanding request's allowance, so TIMEOUTs never pile up in the slab.
    fn arm_deadline(&mut self, cx: &mut Cx<'_>, i: usize, after: Duration) {
        let src = &mut self.sources[i];
        if src.deadline_armed {
            return;
        }
        if cx.ring.timeout(tag(i, 0, KIND_DEADLINE), after).is_ok() {
            src.deadline_armed = true;
        }
    }

    fn on_deadline(&mut self, cx: &mut Cx<'_>, i: usize) {
        let src = &mut self.sources[i];
        src.deadline_armed = false;
        let Some(sent_at) = src.request_sent_at else {
            return;
        };
        let limit = Self::request_limit(src);
        let waited = sent_at.elapsed();
        if waited >= limit {
            let why = format!("no response within {} ms", limit.as_millis());
            self.disconnect(cx, i, why);
        } else {
            self.arm_deadline(cx, i, limit - waited);
        }
    }

    fn connect(&mut self, cx: &mut Cx<'_>, i: usize) {
        let src = &mut self.sources[i];
        let addr = match src.spec.addr.to_socket_addrs().map(|mut a| a.next()) {
            Ok(Some(a)) => a,
            _ => {
                let what = format!("cannot resolve source broker {}", src.spec.addr);
                notice(cx, what);
                self.arm_timer(cx, i, Duration::from_millis(SOURCE_RECONNECT_MS));
                return;
            }
        };
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            None,
        )
        .and_then(|s| s.set_tcp_nodelay(true).map(|()| s));
        let socket = match socket {
            Ok(s) => s,
            Err(e) => {
                notice(cx, format!("socket for {}: {e}", src.spec.addr));
                self.arm_timer(cx, i, Duration::from_millis(SOURCE_RECONNECT_MS));
                return;
            }
        };
        src.generation = src.generation.wrapping_add(1);
        let t = tag(i, src.generation, KIND_CONNECT);
        if cx.ring.connect(t, socket.as_raw_fd(), addr.into()).is_err() {
            self.arm_timer(cx, i, Duration::from_millis(SOURCE_RECONNECT_MS));
            return;
        }
        src.socket = Some(socket);
        src.link = Link::Connecting;
    }

    /// Drops the connection: in-flight ops complete (shutdown wakes them) and are ignored by
    /// generation; the fetcher forgets its session; a reconnect is scheduled.
    fn disconnect(&mut self, cx: &mut Cx<'_>, i: usize, why: String) {
        let src = &mut self.sources[i];
        if let Some(s) = src.socket.take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        src.link = Link::Down;
        src.secure = None;
        src.request_sent_at = None;
        src.generation = src.generation.wrapping_add(1);
        src.sending = false;
        src.receiving = false;
        src.partial = None;
        src.out.clear();
        src.fetcher.connection_lost(Instant::now());
        src.meters.iter().flatten().for_each(|m| m.fetch_error());
        notice(
            cx,
            format!("source broker {}: {why}; reconnecting", src.spec.addr),
        );
        self.arm_timer(cx, i, Duration::from_millis(SOURCE_RECONNECT_MS));
        // The broker may have gone for good and its partitions moved: have the control thread
        // check each one's leader while we reconnect (an unchanged leader costs one lookup).
        for n in 0..self.sources[i].logs.len() {
            if self.sources[i].logs[n].is_some() {
                let why = format!(
                    "connection to broker {} lost",
                    self.sources[i].spec.broker_id
                );
                self.want_leader(cx, i, Slot(n as u32), why);
            }
        }
    }

    /// Asks the control thread for the partition's leader, once until it answers.
    fn want_leader(&mut self, cx: &mut Cx<'_>, i: usize, slot: Slot, why: String) {
        let src = &mut self.sources[i];
        let n = slot.0 as usize;
        let Some(log) = src.logs.get(n).and_then(Option::as_ref) else {
            return;
        };
        if src.leader_wanted[n] {
            return;
        }
        let tp = log.topic_partition().clone();
        if cx.emit(MirrorEvent::LeaderWanted { tp, why }).is_ok() {
            src.leader_wanted[n] = true;
        } else {
            // The control thread is behind; ask again shortly (the timer re-asks every slot
            // still waiting for its leader).
            self.arm_timer(cx, i, Duration::from_millis(SOURCE_RECONNECT_MS));
        }
    }

    /// Re-asks for leaders whose request could not be queued.
    fn want_waiting_leaders(&mut self, cx: &mut Cx<'_>, i: usize) {
        for n in 0..self.sources[i].logs.len() {
            let src = &self.sources[i];
            let waiting = src.logs[n].is_some()
                && !src.leader_wanted[n]
                && src.fetcher.state(Slot(n as u32)) == Some(PartitionState::AwaitingLeader);
            if waiting {
                let why = "waiting for the source leader".to_string();
                self.want_leader(cx, i, Slot(n as u32), why);
            }
        }
    }

    fn find(&self, tp: &TopicPartition) -> Option<(usize, Slot)> {
        self.sources.iter().enumerate().find_map(|(i, src)| {
            src.logs
                .iter()
                .position(|l| l.as_ref().is_some_and(|l| l.topic_partition() == tp))
                .map(|n| (i, Slot(n as u32)))
        })
    }

    /// The control thread's answer to `LeaderWanted`.
    fn releader(
        &mut self,
        cx: &mut Cx<'_>,
        tp: TopicPartition,
        spec: SourceSpec,
        topic_id: Uuid,
        leader_epoch: LeaderEpoch,
    ) {
        let Some((i, slot)) = self.find(&tp) else {
            return; // removed or stopped meanwhile
        };
        self.sources[i].leader_wanted[slot.0 as usize] = false;
        let mut events = std::mem::take(&mut self.events);
        let updated =
            self.sources[i]
                .fetcher
                .update_leader(slot, topic_id, leader_epoch, &mut events);
        // A changed topic id comes back as `Diverged` and stops the partition here.
        self.apply_events(cx, i, &mut events);
        self.events = events;
        if updated.is_err() || self.log_mut(i, slot).is_none() {
            return;
        }
        if spec.broker_id != self.sources[i].spec.broker_id {
            let src = &mut self.sources[i];
            let log = src.logs[slot.0 as usize].take().expect("checked above");
            let _ = src.fetcher.remove_partition(slot);
            // Appends are synchronous, so the log end is exactly where fetching stood.
            let (log_end, last_epoch) = resume_point(&log);
            notice(
                cx,
                format!(
                    "{tp}: leader moved from broker {} to broker {} ({}); fetching from {log_end}",
                    src.spec.broker_id, spec.broker_id, spec.addr
                ),
            );
            let start = PartitionStart {
                tp,
                topic_id,
                log_end,
                last_epoch,
                leader_epoch,
            };
            self.add_partition(cx, spec, start, log);
        } else {
            self.drive(cx, i);
        }
    }

    /// Sends the next request if the fetcher has one, and keeps a RECV posted while a response
    /// is due.
    fn drive(&mut self, cx: &mut Cx<'_>, i: usize) {
        let src = &mut self.sources[i];
        if src.link != Link::Up || src.sending {
            return;
        }
        let now = Instant::now();
        match src.fetcher.poll_request(&mut src.out, now) {
            Ok(Poll::Sent(_)) => {
                src.request_sent_at = Some(now);
                let limit = Self::request_limit(src);
                let request = src.out.split().freeze();
                self.arm_deadline(cx, i, limit);
                let Some(request) = self.wire_bytes(cx, i, request) else {
                    return;
                };
                self.send(cx, i, request);
                self.ensure_recv(cx, i);
            }
            Ok(Poll::NotBefore(t)) => {
                self.arm_timer(cx, i, t.saturating_duration_since(now));
            }
            Ok(Poll::AwaitingResponse) => self.ensure_recv(cx, i),
            Ok(Poll::Idle) => {}
            Err(e) => self.disconnect(cx, i, e.to_string()),
        }
    }

    fn send(&mut self, cx: &mut Cx<'_>, i: usize, data: Bytes) {
        let src = &mut self.sources[i];
        let Some(fd) = src.socket.as_ref().map(|s| s.as_raw_fd()) else {
            return;
        };
        if cx
            .ring
            .send(tag(i, src.generation, KIND_SEND), fd, data)
            .is_err()
        {
            self.disconnect(cx, i, "ring op slab full".to_string());
            return;
        }
        self.sources[i].sending = true;
    }

    fn ensure_recv(&mut self, cx: &mut Cx<'_>, i: usize) {
        let src = &mut self.sources[i];
        if src.receiving || !matches!(src.link, Link::Up | Link::Securing) {
            return;
        }
        let Some(fd) = src.socket.as_ref().map(|s| s.as_raw_fd()) else {
            return;
        };
        let slot = match src.partial.take().or_else(|| cx.arena.take()) {
            Some(s) => s,
            None => {
                // Every slot holds records not yet appended elsewhere on this shard; they return
                // within the loop iteration, so retry shortly.
                self.arm_timer(cx, i, Duration::from_millis(ARENA_RETRY_MS));
                return;
            }
        };
        let max = slot.remaining();
        if cx
            .ring
            .recv(tag(i, src.generation, KIND_RECV), fd, slot, max)
            .is_err()
        {
            self.disconnect(cx, i, "ring op slab full".to_string());
            return;
        }
        self.sources[i].receiving = true;
    }

    fn on_recv(&mut self, cx: &mut Cx<'_>, i: usize, c: Completion) {
        self.sources[i].receiving = false;
        let result = c.io_result();
        let OpBuf::Slot(slot) = c.buf else {
            unreachable!("RECV completions carry their slot")
        };
        if c.result <= 0 {
            let why = match result {
                Ok(_) => "connection closed by the source".to_string(),
                Err(e) => format!("receive failed: {e}"),
            };
            self.disconnect(cx, i, why);
            return;
        }
        if self.sources[i].secure_reads() {
            return self.on_secure_recv(cx, i, slot);
        }
        let total = match frame::body_len(slot.filled()) {
            Ok(Some(len)) => LENGTH_PREFIX_BYTES + len,
            Ok(None) => {
                self.sources[i].partial = Some(slot);
                self.ensure_recv(cx, i);
                return;
            }
            Err(e) => return self.disconnect(cx, i, e.to_string()),
        };
        if total > slot.capacity() {
            let why = format!(
                "response frame of {total} B exceeds the {} B arena slot (raise \
                 runtime.arena_slot_bytes or lower fetch sizes)",
                slot.capacity()
            );
            return self.disconnect(cx, i, why);
        }
        if slot.len() > total {
            return self.disconnect(cx, i, "source sent bytes beyond the response".to_string());
        }
        if slot.len() < total {
            self.sources[i].partial = Some(slot);
            self.ensure_recv(cx, i);
            return;
        }
        if let Some(sent) = self.sources[i].request_sent_at.take() {
            let took = sent.elapsed();
            cx.stats.fetched(took);
            cx.latency.record(Latency::FetchRoundTrip, took);
        }
        let body = slot.freeze().slice(LENGTH_PREFIX_BYTES..);
        let mut events = std::mem::take(&mut self.events);
        let handled = self.sources[i]
            .fetcher
            .handle_response(body, Instant::now(), &mut events);
        self.apply_events(cx, i, &mut events);
        self.events = events;
        let src = &mut self.sources[i];
        let throttled = src.fetcher.throttled_ms_total() - src.throttle_seen_ms;
        if throttled > 0 {
            src.throttle_seen_ms += throttled;
            cx.stats.throttled(throttled);
            src.meters
                .iter()
                .flatten()
                .for_each(|m| m.throttled(throttled));
        }
        match handled {
            Ok(()) => self.drive(cx, i),
            Err(e) => self.disconnect(cx, i, e.to_string()),
        }
    }

    fn apply_events(&mut self, cx: &mut Cx<'_>, i: usize, events: &mut Vec<FetchEvent>) {
        for ev in events.drain(..) {
            match ev {
                FetchEvent::Records(r) => {
                    let began = Instant::now();
                    let result = match self.log_mut(i, r.slot) {
                        Some(log) => log
                            .append(&mut RingIo::new(cx.ring), &r.records)
                            .map(|_| log.log_end_offset()),
                        None => continue,
                    };
                    match result {
                        Ok(end) => {
                            self.meter_append(cx, i, &r, began, end);
                            self.report_append(i, &r);
                        }
                        Err(e) => {
                            let why = format!("append failed: {e}");
                            self.stop_partition(cx, i, r.slot, why, true);
                        }
                    }
                }
                FetchEvent::LogStartMoved { slot, to, .. } => {
                    let result = match self.log_mut(i, slot) {
                        Some(log) if log.log_end_offset() < to => {
                            log.truncate_fully_and_start_at(&mut RingIo::new(cx.ring), to)
                        }
                        _ => Ok(()),
                    };
                    if let Err(e) = result {
                        let why = format!("cannot restart at {to}: {e}");
                        self.stop_partition(cx, i, slot, why, true);
                    }
                }
                FetchEvent::Diverged(d) => {
                    let why = format!(
                        "source log diverged from ours at fetch offset {} (last fetched epoch \
                         {}): {}; our log is kept as it is and fetching stopped",
                        d.fetch_offset, d.last_fetched_epoch.0, d.cause
                    );
                    self.stop_partition(cx, i, d.slot, why, false);
                }
                FetchEvent::RefreshMetadata { slot, error, hint } => {
                    let why = match hint {
                        Some((leader, epoch)) => format!(
                            "source error {error}, leader now {leader} at epoch {}",
                            epoch.0
                        ),
                        None => format!("source error {error}"),
                    };
                    self.want_leader(cx, i, slot, why);
                }
                FetchEvent::BadRecords {
                    slot,
                    error,
                    retrying: false,
                } => {
                    let why = format!("bad records from the source: {error}");
                    self.stop_partition(cx, i, slot, why, true);
                }
                FetchEvent::Watermarks {
                    slot,
                    high_watermark,
                    ..
                } => {
                    if let Some(m) = self.meter(i, slot) {
                        m.high_watermark(high_watermark);
                    }
                    self.report_high_watermark(i, slot, high_watermark);
                }
                FetchEvent::BadRecords { slot, .. } | FetchEvent::PartitionError { slot, .. } => {
                    if let Some(m) = self.meter(i, slot) {
                        m.fetch_error();
                    }
                    let addr = &self.sources[i].spec.addr;
                    notice(cx, format!("source broker {addr}: {ev:?}"));
                }
                FetchEvent::RequestFailed { .. } => {
                    let src = &self.sources[i];
                    src.meters.iter().flatten().for_each(|m| m.fetch_error());
                    notice(cx, format!("source broker {}: {ev:?}", src.spec.addr));
                }
            }
        }
    }

    fn meter(&self, i: usize, slot: Slot) -> Option<&Arc<PartitionStats>> {
        self.sources[i].meters.get(slot.0 as usize)?.as_ref()
    }

    /// Counters and latencies of one successful append.
    fn meter_append(
        &self,
        cx: &mut Cx<'_>,
        i: usize,
        r: &crate::fetch::fetcher::FetchedRecords,
        began: Instant,
        log_end: Offset,
    ) {
        let took = began.elapsed();
        let bytes = r.records.len() as u64;
        cx.stats.appended(bytes, took);
        cx.latency.record(Latency::Append, took);
        if let Some(m) = self.meter(i, r.slot) {
            m.appended(bytes, u64::from(r.batches), log_end, r.max_timestamp);
            m.high_watermark(r.high_watermark);
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        // Clocks of two hosts: a batch stamped in our future counts as no latency.
        if r.max_timestamp.0 > 0 {
            let ms = (now_ms - r.max_timestamp.0).max(0) as u64;
            cx.latency
                .record(Latency::EndToEnd, Duration::from_millis(ms));
        }
    }

    fn log_mut(&mut self, i: usize, slot: Slot) -> Option<&mut PartitionLog> {
        self.sources[i].logs.get_mut(slot.0 as usize)?.as_mut()
    }

    fn stop_partition(
        &mut self,
        cx: &mut Cx<'_>,
        i: usize,
        slot: Slot,
        why: String,
        retryable: bool,
    ) {
        let src = &mut self.sources[i];
        let log = src.logs.get_mut(slot.0 as usize).and_then(Option::take);
        if let Some(m) = src.meters.get_mut(slot.0 as usize).and_then(Option::take) {
            cx.stats.deregister(&m);
        }
        let tp = match src.fetcher.remove_partition(slot) {
            Ok(tp) => tp,
            Err(_) => match &log {
                Some(l) => l.topic_partition().clone(),
                None => return,
            },
        };
        if let Some(log) = log {
            self.give_back(log);
        }
        let _ = cx.emit(MirrorEvent::PartitionStopped { tp, why, retryable });
    }

    fn on_send(&mut self, cx: &mut Cx<'_>, i: usize, c: Completion) {
        let result = c.io_result();
        let OpBuf::Bytes(data) = c.buf else {
            unreachable!("SEND completions carry their bytes")
        };
        let sent = match result {
            Ok(0) => return self.disconnect(cx, i, "send wrote nothing".to_string()),
            Ok(n) => n,
            Err(e) => return self.disconnect(cx, i, format!("send failed: {e}")),
        };
        self.sources[i].sending = false;
        if sent < data.len() {
            self.send(cx, i, data.slice(sent..));
        } else if !self.flush_secure(cx, i) {
            self.drive(cx, i);
        }
    }
}

impl ShardHandler for MirrorShard {
    type Msg = MirrorMsg;
    type Event = MirrorEvent;

    fn start(&mut self, _cx: &mut ShardCx<'_, MirrorEvent>) {}

    fn on_message(&mut self, cx: &mut ShardCx<'_, MirrorEvent>, msg: MirrorMsg) {
        match msg {
            MirrorMsg::AddPartition { source, start, log } => {
                self.add_partition(cx, source, start, *log)
            }
            MirrorMsg::RemovePartition { tp } => self.remove_partition(cx, tp),
            MirrorMsg::Releader {
                tp,
                source,
                topic_id,
                leader_epoch,
            } => self.releader(cx, tp, source, topic_id, leader_epoch),
        }
    }

    fn on_completion(&mut self, cx: &mut ShardCx<'_, MirrorEvent>, c: Completion) {
        let (i, generation, kind) = untag(c.tag);
        let Some(src) = self.sources.get_mut(i) else {
            return;
        };
        if kind == KIND_DEADLINE {
            return self.on_deadline(cx, i);
        }
        if kind == KIND_TIMER {
            src.timer_armed = false;
            match src.link {
                Link::Down => self.connect(cx, i),
                Link::Connecting | Link::Securing => {}
                Link::Up => {
                    self.drive(cx, i);
                    self.ensure_recv(cx, i);
                }
            }
            self.want_waiting_leaders(cx, i);
            return;
        }
        if generation != (src.generation & 0x00ff_ffff) {
            // An op of a connection already dropped; its buffer is released here.
            return;
        }
        match kind {
            KIND_CONNECT => match c.io_result() {
                Ok(_) if !src.spec.security.is_plaintext() => self.start_secure(cx, i),
                Ok(_) => {
                    src.link = Link::Up;
                    self.drive(cx, i);
                }
                Err(e) => self.disconnect(cx, i, format!("connect failed: {e}")),
            },
            KIND_SEND => self.on_send(cx, i, c),
            KIND_RECV => self.on_recv(cx, i, c),
            _ => unreachable!("unknown op kind in tag {:#x}", c.tag),
        }
    }

    /// Hands every log back to the control thread, which closes the log dir as a whole
    /// (final index entries, fsync, checkpoints, clean-shutdown marker).
    fn stop(&mut self, cx: &mut ShardCx<'_, MirrorEvent>) {
        let mut logs = Vec::new();
        for src in &mut self.sources {
            for m in src.meters.iter_mut().filter_map(Option::take) {
                cx.stats.deregister(&m);
            }
            if let Some(s) = src.socket.take() {
                let _ = s.shutdown(Shutdown::Both);
            }
            logs.extend(src.logs.iter_mut().filter_map(Option::take));
        }
        for log in logs {
            self.give_back(log);
        }
    }
}

/// The log end a partition log resumes from, for `PartitionStart`.
pub fn resume_point(log: &PartitionLog) -> (Offset, crate::ids::LeaderEpoch) {
    let epoch = log
        .epoch_cache()
        .latest_epoch()
        .unwrap_or(crate::ids::LeaderEpoch::NONE);
    (log.log_end_offset(), epoch)
}
