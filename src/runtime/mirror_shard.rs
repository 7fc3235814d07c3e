//! The data path on one shard: TCP connections to source brokers on the shard's ring, response
//! frames received into arena slots, handed to the sans-IO `Fetcher` as `Bytes`, and the
//! validated record slices appended to the owned partitions' logs through `RingIo`.
//!
//! Owned by one shard thread. One connection per source broker this shard fetches from (the
//! control thread routes each partition to one shard, so a broker may have one connection per
//! shard). A connection's partitions are split into up to `fetch.sessions_per_connection` fetch
//! groups (`Group`), each a `Fetcher` with its own fetch session and at most one request in
//! flight, so a connection may have several requests in flight while each partition is still
//! fetched in order (it belongs to one group, and the source answers a connection's requests
//! in the order they came). Responses are matched to groups by that order (`in_flight`).
//! With one group (the default, like Kafka's replica fetcher) a RECV may ask for the whole
//! slot; with several, a RECV never reads past the frame it is filling (see `ensure_recv`).
//! With one group configured, a connection behind is split into two groups until it caught
//! up (`split`, `fetch.catch_up_pipelining`).
//!
//! The source handles one request of a connection at a time, so a request parked for
//! `max_wait_ms` (a long poll of a group with nothing new) holds back every request behind it.
//! Hence (`drive`): only the request at the head of an empty pipe waits at the source;
//! requests queued behind another one ask for `max_wait_ms = 0`; nothing is queued behind a
//! request that may park; and a group whose last response was empty queues only behind a
//! group that is still receiving records (so idle groups do not spin on empty answers).
//!
//! Timing comes only from ring TIMEOUTs: the fetcher's throttle and backoff instants, reconnect
//! delays, and retries when the arena is momentarily exhausted.
//!
//! Connect uses IORING_OP_CONNECT on a fresh socket. Name resolution (`host:port` from metadata)
//! is a blocking `getaddrinfo` on the shard; it runs only when (re)connecting, and brokers are
//! usually given as addresses or /etc/hosts names.

use std::collections::VecDeque;
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
    DivergenceCause, FetchConfig, FetchEvent, FetchRequestCounts, Fetcher, FetcherError,
    PartitionStart, PartitionState, Poll, Slot,
};
use crate::fetch::security::SourceSecurity;
use crate::fetch::versions::Versions;
use crate::ids::{LeaderEpoch, Offset, TopicPartition};
use crate::limits::{
    ARENA_RETRY_MS, FETCH_READ_EARLY_STEP_BYTES, SHARD_SOURCES_MAX, SOURCE_CONNECTIONS_MAX,
    SOURCE_FETCH_SESSIONS_MAX, SOURCE_RECONNECT_MS,
};
use crate::log::config::LogConfig;
use crate::log::partition_log::PartitionLog;
use crate::wire::frame::{self, LENGTH_PREFIX_BYTES};

// TLS and SASL on the ring: kept apart so the plaintext path above stays as it was.
#[path = "mirror_shard_secure.rs"]
mod secure;
// A response's appends, written with one ring submission.
#[path = "mirror_shard_append.rs"]
mod append;
// Progress reports for describe.
#[path = "mirror_shard_progress.rs"]
mod progress_report;
// Flushes (rolls, checkpoints) performed on the ring without waiting.
#[path = "mirror_shard_flush.rs"]
mod flush;
// A second fetch group on a connection while its partitions are behind.
#[path = "mirror_shard_split.rs"]
mod split;

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
    /// The partition's topic configs changed on the source: use `config` from now on. A config
    /// the log refuses is reported as a `Notice` and the log keeps its previous one. Nothing
    /// happens when the shard does not own `tp` (the control thread applies it to the log when
    /// it comes back).
    SetConfig {
        tp: TopicPartition,
        config: Box<LogConfig>,
    },
    /// A retention pass: every owned log deletes the segments its retention.ms and
    /// retention.bytes (and log start) make deletable at `now_ms`.
    EnforceRetention { now_ms: i64 },
    /// A recovery-point checkpoint round: every owned log with data above its recovery point
    /// is flushed (fdatasync on the ring), which publishes its new recovery point to the log
    /// dir's checkpoint cell.
    Flush,
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
        /// When the stop is a divergence by leader epoch (Fetch v12+ DivergingEpoch, or
        /// OffsetForLeaderEpoch on older sources): the source leader's epoch and its end
        /// offset for it, from which the control plane may recover an unclean election
        /// (`control::unclean_recovery`). `None` for every other stop, a changed topic id
        /// included.
        source_epoch_end: Option<(LeaderEpoch, Offset)>,
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

/// Where a partition lives on a shard: source connection, fetch group, fetcher slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Loc {
    src: usize,
    group: usize,
    slot: Slot,
}

/// One fetch session on a connection: its fetcher and the partitions it fetches.
struct Group {
    fetcher: Fetcher,
    /// Indexed by the fetcher's `Slot`.
    logs: Vec<Option<PartitionLog>>,
    /// Each log's metrics, indexed like `logs`.
    meters: Vec<Option<Arc<PartitionStats>>>,
    /// Indexed by `Slot`: a `LeaderWanted` went out and no `Releader` came back yet.
    leader_wanted: Vec<bool>,
    /// The fetcher's throttle total already added to the shard's counter.
    throttle_seen_ms: u64,
    /// The fetcher's request counts already added to the shard's counters.
    requests_seen: FetchRequestCounts,
    /// The group's last response carried records (true until its first response): it is
    /// catching up, so its next request will most likely be answered at once.
    streaming: bool,
    /// Records of the response being received were handed out before it was whole.
    records_read_early: bool,
    /// What the response being received showed of the source's backlog (`split`).
    backlog: split::Backlog,
}

impl Group {
    fn new(spec: &SourceSpec) -> Result<Group, FetcherError> {
        Ok(Group {
            fetcher: Fetcher::new(spec.fetch, spec.versions, &spec.client_id)?,
            logs: Vec::new(),
            meters: Vec::new(),
            leader_wanted: Vec::new(),
            throttle_seen_ms: 0,
            requests_seen: FetchRequestCounts::default(),
            streaming: true,
            records_read_early: false,
            backlog: Default::default(),
        })
    }

    /// Whether the group fetches any partition (a group the catch-up merge emptied may still
    /// have partitions to forget in its session).
    fn holds_partitions(&self) -> bool {
        self.fetcher.live_partitions() > 0
    }

    /// The slots whose log `pick` picks.
    fn slots_where<'a>(
        &'a self,
        pick: impl Fn(&PartitionLog) -> bool + 'a,
    ) -> impl Iterator<Item = Slot> + 'a {
        self.logs
            .iter()
            .enumerate()
            .filter(move |(_, log)| log.as_ref().is_some_and(&pick))
            .map(|(n, _)| Slot(n as u32))
    }
}

/// A request on the wire, oldest first in `Source::in_flight`.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    group: usize,
    sent_at: Instant,
    /// It may wait `max_wait_ms` at the source (the head of an empty pipe, from a group whose
    /// last response was empty): nothing is queued behind it.
    may_park: bool,
    /// Its group was streaming when it went out.
    streaming: bool,
}

/// One source broker as seen by this shard: its socket, its fetch groups, and the logs they
/// feed.
struct Source {
    spec: SourceSpec,
    groups: Vec<Group>,
    socket: Option<socket2::Socket>,
    /// The TLS/SASL layer of the current connection (none on PLAINTEXT).
    secure: Option<crate::fetch::security::SecureLink>,
    link: Link,
    generation: u32,
    out: BytesMut,
    sending: bool,
    receiving: bool,
    /// The posted RECV may fill its whole slot (one group, one response due); no request goes
    /// out until it completes, so nothing can follow that response on the socket.
    recv_unbounded: bool,
    /// A partly received frame waiting for its next RECV.
    partial: Option<SlotBuf>,
    /// Bytes of `partial` its fetcher has read (`read_prefix`).
    partial_read_to: usize,
    timer_armed: bool,
    /// The requests on the wire, oldest first. The oldest must be answered within
    /// `max_wait_ms + request_timeout_ms` of its turn (`turn_since`) or the connection is
    /// dropped (as Kafka's `request.timeout.ms` does).
    in_flight: VecDeque<InFlight>,
    /// When the oldest request's turn began: when it went out, or when the response before it
    /// arrived (the source does not start on it earlier).
    turn_since: Instant,
    /// When the TLS handshake or SASL exchange began (bounded like a request).
    securing_since: Option<Instant>,
    /// The group the next head-of-pipe request is offered to first (round robin).
    next_head: usize,
    deadline_armed: bool,
    /// The source answered a request on this connection since it (re)connected; mirrored into
    /// every partition's stats when it changes (`kmirror_source_reachable`), never per response.
    answered: bool,
    /// The connection's partitions are split into two fetch groups to catch up (`split`).
    catching_up: bool,
    /// Answers in a row that left partitions behind (`split`).
    behind_streak: u32,
}

impl Source {
    /// Whether the connection's responses may follow each other on the socket: fixed fetch
    /// groups, or a catch-up split. (A group the merge emptied may still send one request to
    /// forget its partitions; it waits while an unbounded RECV is posted, see `drive`.)
    fn pipelines(&self) -> bool {
        self.groups.len() > 1 && (self.spec.fetch.sessions_per_connection > 1 || self.catching_up)
    }
}

/// Logs handed back to the control thread when a shard stops or drops a partition, so the
/// control thread can checkpoint and close the whole log dir. Locked only at those moments.
pub type ReturnedLogs = Arc<Mutex<Vec<PartitionLog>>>;

/// The mirroring `ShardHandler`.
pub struct MirrorShard {
    sources: Vec<Source>,
    events: Vec<FetchEvent>,
    /// The appends of the response being handled, staged until its writes are submitted.
    staged: append::StagedAppends,
    returned: ReturnedLogs,
    progress: super::progress::ProgressBoard,
    /// Progress cells by location, looked up once when a partition arrives.
    cells: std::collections::HashMap<Loc, Arc<super::progress::PartitionProgress>>,
    /// The logs' flushes whose syncs are on the ring.
    flushes: flush::Flushes,
}

impl MirrorShard {
    pub fn new(returned: ReturnedLogs) -> MirrorShard {
        MirrorShard {
            sources: Vec::new(),
            events: Vec::new(),
            staged: Default::default(),
            returned,
            progress: Default::default(),
            cells: Default::default(),
            flushes: Default::default(),
        }
    }

    /// Publishes the partitions' progress on `board` (for the control thread's describe).
    pub fn with_progress(mut self, board: super::progress::ProgressBoard) -> MirrorShard {
        self.progress = board;
        self
    }

    /// Hands `log` back to the control thread once its flush in flight, if any, finished.
    fn give_back(&mut self, cx: &mut Cx<'_>, mut log: PartitionLog) {
        self.settle_flush(cx, &mut log);
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
    /// The connection a partition of the broker `spec` names joins: an empty one, a new one
    /// while there are fewer than `fetch.connections_per_source`, else the one with fewest
    /// partitions.
    fn source_index(&mut self, cx: &mut Cx<'_>, spec: SourceSpec) -> Option<usize> {
        let same = || {
            self.sources
                .iter()
                .enumerate()
                .filter(|(_, s)| secure::same_connection(&s.spec, &spec))
                .map(|(i, s)| (i, s.groups.iter().map(|g| g.fetcher.partitions()).sum()))
        };
        let max = usize::from(spec.fetch.connections_per_source).clamp(1, SOURCE_CONNECTIONS_MAX);
        let open = same().count();
        let fewest = same().min_by_key(|&(_, partitions): &(usize, usize)| partitions);
        if let Some((i, _)) = fewest.filter(|&(_, n)| n == 0 || open >= max) {
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
        // Checked here so a bad fetch config is refused before a connection is opened.
        if let Err(e) = Fetcher::new(spec.fetch, spec.versions, &spec.client_id) {
            notice(cx, format!("broker {}: {e}", spec.broker_id));
            return None;
        }
        self.sources.push(Source {
            spec,
            groups: Vec::new(),
            socket: None,
            secure: None,
            link: Link::Down,
            generation: 0,
            out: BytesMut::with_capacity(64 * 1024),
            sending: false,
            receiving: false,
            recv_unbounded: false,
            partial: None,
            partial_read_to: 0,
            timer_armed: false,
            in_flight: VecDeque::with_capacity(SOURCE_FETCH_SESSIONS_MAX),
            turn_since: Instant::now(),
            securing_since: None,
            next_head: 0,
            deadline_armed: false,
            answered: false,
            catching_up: false,
            behind_streak: 0,
        });
        let i = self.sources.len() - 1;
        self.connect(cx, i);
        Some(i)
    }

    /// The fetch group a new partition joins: an empty one, else a new one while the
    /// connection has fewer than `sessions_per_connection`, else the one with fewest
    /// partitions. With one session per connection, outside a catch-up split, that is the
    /// group that holds the connection's partitions (the split's second group stays empty).
    fn pick_group(src: &mut Source) -> Result<usize, FetcherError> {
        let max =
            usize::from(src.spec.fetch.sessions_per_connection).clamp(1, SOURCE_FETCH_SESSIONS_MAX);
        if max == 1 && !src.catching_up {
            if let Some(g) = src.groups.iter().position(Group::holds_partitions) {
                return Ok(g);
            }
        }
        if let Some(g) = src.groups.iter().position(|g| g.fetcher.partitions() == 0) {
            return Ok(g);
        }
        if src.groups.len() < max {
            src.groups.push(Group::new(&src.spec)?);
            return Ok(src.groups.len() - 1);
        }
        let fewest = (0..src.groups.len()).min_by_key(|&g| src.groups[g].fetcher.partitions());
        Ok(fewest.expect("a connection at its group limit has at least one group"))
    }

    /// Every location of a partition on source `i` (slots that may hold a log).
    fn locs(&self, i: usize) -> Vec<Loc> {
        let src = &self.sources[i];
        src.groups
            .iter()
            .enumerate()
            .flat_map(|(g, group)| {
                (0..group.logs.len()).map(move |n| Loc {
                    src: i,
                    group: g,
                    slot: Slot(n as u32),
                })
            })
            .collect()
    }

    fn group_mut(&mut self, at: Loc) -> &mut Group {
        &mut self.sources[at.src].groups[at.group]
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
            self.give_back(cx, log);
            let _ = cx.emit(MirrorEvent::PartitionStopped {
                tp,
                why,
                retryable: true,
                source_epoch_end: None,
            });
            return;
        };
        let src = &mut self.sources[i];
        let added = Self::pick_group(src)
            .and_then(|g| src.groups[g].fetcher.add_partition(start).map(|s| (g, s)));
        match added {
            Ok((g, Slot(n))) => {
                let group = &mut src.groups[g];
                let n = n as usize;
                if group.logs.len() <= n {
                    group.logs.resize_with(n + 1, || None);
                    group.meters.resize_with(n + 1, || None);
                    group.leader_wanted.resize(n + 1, false);
                }
                let meter = cx.stats.register(tp.clone(), log.log_end_offset());
                meter.source_answered(src.answered);
                group.meters[n] = Some(meter);
                let mut log = log;
                // Rolls and checkpoints are flushed on the ring while fetching goes on.
                log.set_deferred_flushes(true);
                group.logs[n] = Some(log);
                group.leader_wanted[n] = false;
                let at = Loc {
                    src: i,
                    group: g,
                    slot: Slot(n as u32),
                };
                self.track_progress(at, &tp);
                let _ = cx.emit(MirrorEvent::PartitionAdded { tp });
                self.drive(cx, i);
            }
            Err(e) => {
                self.give_back(cx, log);
                let _ = cx.emit(MirrorEvent::PartitionStopped {
                    tp,
                    why: e.to_string(),
                    retryable: true,
                    source_epoch_end: None,
                });
            }
        }
    }

    fn enforce_retention(&mut self, cx: &mut Cx<'_>, now_ms: i64) {
        let mut failed = Vec::new();
        for src in &mut self.sources {
            for group in &mut src.groups {
                for log in group.logs.iter_mut().flatten() {
                    if let Err(e) = log.delete_old_segments(&mut RingIo::new(cx.ring), now_ms) {
                        failed.push(format!("{}: retention failed: {e}", log.topic_partition()));
                    }
                }
            }
        }
        for what in failed {
            let _ = cx.emit(MirrorEvent::Notice { what });
        }
        // Deleting every segment rolls first, which asks for a flush.
        self.start_wanted_flushes(cx);
    }

    /// A checkpoint round: every log with data above its recovery point starts a flush on
    /// the ring (`flush`); none is waited for.
    fn flush_logs(&mut self, cx: &mut Cx<'_>) {
        for at in self.logs_where(PartitionLog::has_unflushed) {
            self.start_flush(cx, at);
        }
    }

    /// Where every log `pick` picks is.
    fn logs_where(&self, pick: impl Fn(&PartitionLog) -> bool) -> Vec<Loc> {
        let mut found = Vec::new();
        for (i, src) in self.sources.iter().enumerate() {
            for (g, group) in src.groups.iter().enumerate() {
                found.extend(group.slots_where(&pick).map(|slot| Loc {
                    src: i,
                    group: g,
                    slot,
                }));
            }
        }
        found
    }

    fn set_config(&mut self, cx: &mut Cx<'_>, tp: &TopicPartition, config: LogConfig) {
        let Some(at) = self.find(tp) else {
            return;
        };
        let n = at.slot.0 as usize;
        if let Some(log) = self.group_mut(at).logs[n].as_mut() {
            if let Err(e) = log.set_config(config) {
                let _ = cx.emit(MirrorEvent::Notice {
                    what: format!("{tp}: topic configs not applied, the previous stay: {e}"),
                });
            }
        }
    }

    fn remove_partition(&mut self, cx: &mut Cx<'_>, tp: TopicPartition) {
        let Some(at) = self.find(&tp) else {
            return;
        };
        self.cells.remove(&at);
        let group = self.group_mut(at);
        let n = at.slot.0 as usize;
        let log = group.logs[n].take();
        if let Some(m) = group.meters[n].take() {
            cx.stats.deregister(&m);
        }
        // The fetcher forgets the slot; a response already in flight for it is dropped by the
        // fetcher, so nothing is appended to the log after it is handed back.
        let _ = group.fetcher.remove_partition(at.slot);
        if let Some(log) = log {
            let log_end = log.log_end_offset();
            self.give_back(cx, log);
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
    /// the oldest outstanding request's allowance, so TIMEOUTs never pile up in the slab.
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
        let since = match (src.in_flight.front(), src.securing_since) {
            (Some(r), _) => r.sent_at.max(src.turn_since),
            (None, Some(t)) => t,
            (None, None) => return,
        };
        let limit = Self::request_limit(src);
        let waited = since.elapsed();
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

    /// Forgets the connection's state: the socket, in-flight ops (they complete and are ignored
    /// by generation), every group's requests and session. Fetch offsets only advance when a
    /// whole response was validated, so the next requests fetch again from the log ends: a
    /// response cut short loses nothing.
    pub(super) fn reset_connection(&mut self, i: usize) {
        let src = &mut self.sources[i];
        if let Some(s) = src.socket.take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        src.link = Link::Down;
        src.secure = None;
        src.securing_since = None;
        src.in_flight.clear();
        src.generation = src.generation.wrapping_add(1);
        src.sending = false;
        src.receiving = false;
        src.recv_unbounded = false;
        src.partial = None;
        src.partial_read_to = 0;
        src.out.clear();
        let now = Instant::now();
        let answered = std::mem::replace(&mut src.answered, false);
        src.behind_streak = 0;
        for group in &mut src.groups {
            group.fetcher.connection_lost(now);
            group.streaming = true;
            group.backlog = Default::default();
            if answered {
                group
                    .meters
                    .iter()
                    .flatten()
                    .for_each(|m| m.source_answered(false));
            }
        }
    }

    /// Drops the connection and schedules a reconnect.
    fn disconnect(&mut self, cx: &mut Cx<'_>, i: usize, why: String) {
        self.complete_staged(cx);
        self.reset_connection(i);
        let src = &self.sources[i];
        for group in &src.groups {
            group.meters.iter().flatten().for_each(|m| m.fetch_error());
        }
        notice(
            cx,
            format!("source broker {}: {why}; reconnecting", src.spec.addr),
        );
        self.arm_timer(cx, i, Duration::from_millis(SOURCE_RECONNECT_MS));
        // The broker may have gone for good and its partitions moved: have the control thread
        // check each one's leader while we reconnect (an unchanged leader costs one lookup).
        let broker = self.sources[i].spec.broker_id;
        for at in self.locs(i) {
            self.want_leader(cx, at, format!("connection to broker {broker} lost"));
        }
    }

    /// Asks the control thread for the partition's leader, once until it answers.
    fn want_leader(&mut self, cx: &mut Cx<'_>, at: Loc, why: String) {
        let group = self.group_mut(at);
        let n = at.slot.0 as usize;
        let Some(log) = group.logs.get(n).and_then(Option::as_ref) else {
            return;
        };
        if group.leader_wanted[n] {
            return;
        }
        let tp = log.topic_partition().clone();
        if cx.emit(MirrorEvent::LeaderWanted { tp, why }).is_ok() {
            group.leader_wanted[n] = true;
        } else {
            // The control thread is behind; ask again shortly (the timer re-asks every slot
            // still waiting for its leader).
            self.arm_timer(cx, at.src, Duration::from_millis(SOURCE_RECONNECT_MS));
        }
    }

    /// Re-asks for leaders whose request could not be queued.
    fn want_waiting_leaders(&mut self, cx: &mut Cx<'_>, i: usize) {
        for at in self.locs(i) {
            let group = self.group_mut(at);
            let n = at.slot.0 as usize;
            let waiting = group.logs[n].is_some()
                && !group.leader_wanted[n]
                && group.fetcher.state(at.slot) == Some(PartitionState::AwaitingLeader);
            if waiting {
                self.want_leader(cx, at, "waiting for the source leader".to_string());
            }
        }
    }

    /// Where `tp`'s log is: through each fetcher's index, so a message naming a partition
    /// (a config change, a removal, a new leader) costs the same at 16,384 partitions as at
    /// one; a scan of the logs made the configs of a 10,000-partition start quadratic.
    fn find(&self, tp: &TopicPartition) -> Option<Loc> {
        let found = self.sources.iter().enumerate().find_map(|(i, src)| {
            src.groups.iter().enumerate().find_map(|(g, group)| {
                let slot = group.fetcher.slot_of(tp)?;
                let holds = group
                    .logs
                    .get(slot.0 as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|l| l.topic_partition() == tp);
                holds.then_some(Loc {
                    src: i,
                    group: g,
                    slot,
                })
            })
        });
        debug_assert_eq!(
            found,
            self.find_by_scan(tp),
            "fetcher index and logs disagree"
        );
        found
    }

    /// `find` the slow way, to check the index in debug builds (tests).
    fn find_by_scan(&self, tp: &TopicPartition) -> Option<Loc> {
        self.sources.iter().enumerate().find_map(|(i, src)| {
            src.groups.iter().enumerate().find_map(|(g, group)| {
                let n = group
                    .logs
                    .iter()
                    .position(|l| l.as_ref().is_some_and(|l| l.topic_partition() == tp))?;
                Some(Loc {
                    src: i,
                    group: g,
                    slot: Slot(n as u32),
                })
            })
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
        let Some(at) = self.find(&tp) else {
            return; // removed or stopped meanwhile
        };
        self.group_mut(at).leader_wanted[at.slot.0 as usize] = false;
        let mut events = std::mem::take(&mut self.events);
        let updated =
            self.group_mut(at)
                .fetcher
                .update_leader(at.slot, topic_id, leader_epoch, &mut events);
        // A changed topic id comes back as `Diverged` and stops the partition here.
        self.apply_events(cx, at.src, at.group, &mut events);
        self.events = events;
        if updated.is_err() || self.log_mut(at).is_none() {
            return;
        }
        let from = self.sources[at.src].spec.broker_id;
        if spec.broker_id != from {
            self.cells.remove(&at);
            let group = self.group_mut(at);
            let n = at.slot.0 as usize;
            let log = group.logs[n].take().expect("checked above");
            if let Some(m) = group.meters[n].take() {
                cx.stats.deregister(&m);
            }
            let _ = group.fetcher.remove_partition(at.slot);
            // Appends are synchronous, so the log end is exactly where fetching stood.
            let (log_end, last_epoch) = resume_point(&log);
            notice(
                cx,
                format!(
                    "{tp}: leader moved from broker {from} to broker {} ({}); fetching from \
                     {log_end}",
                    spec.broker_id, spec.addr
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
            self.drive(cx, at.src);
        }
    }

    /// Frames the next request of every group that may send one now (see the module notes for
    /// which), in the order they go on the wire, sends them, and keeps a RECV posted while
    /// responses are due.
    fn drive(&mut self, cx: &mut Cx<'_>, i: usize) {
        let src = &mut self.sources[i];
        if src.link != Link::Up {
            return;
        }
        debug_assert!(
            src.spec.fetch.sessions_per_connection > 1
                || src.catching_up
                || src.groups.iter().filter(|g| g.holds_partitions()).count() <= 1,
            "outside a catch-up split, one fetch group holds a connection's partitions"
        );
        let now = Instant::now();
        let mut wake: Option<Instant> = None;
        let n = src.groups.len();
        // Streaming groups first, so a request that may park never goes out ahead of a group
        // that has records waiting; round robin within each kind, so no group always leads.
        let start = src.next_head % n.max(1);
        let mut order = [0usize; SOURCE_FETCH_SESSIONS_MAX];
        let mut len = 0;
        for want_streaming in [true, false] {
            for k in 0..n {
                let g = (start + k) % n;
                if src.groups[g].streaming == want_streaming {
                    order[len] = g;
                    len += 1;
                }
            }
        }
        for &g in &order[..len] {
            let head = src.in_flight.is_empty();
            let streaming = src.groups[g].streaming;
            let allowed = head
                || (!src.in_flight.iter().any(|r| r.may_park)
                    && (streaming || src.in_flight.iter().any(|r| r.streaming)));
            if !allowed {
                continue;
            }
            let group = &mut src.groups[g];
            // A group the catch-up merge emptied only forgets: it must not park at the head
            // with nothing to wait for while the other group's request waits behind it.
            let parks = head && group.holds_partitions();
            let wait = if parks { src.spec.fetch.max_wait_ms } else { 0 };
            group.fetcher.set_max_wait_ms(wait);
            match group.fetcher.poll_request(&mut src.out, now) {
                Ok(Poll::Sent(_)) => {
                    if head {
                        src.turn_since = now;
                        src.next_head = g + 1;
                    }
                    src.in_flight.push_back(InFlight {
                        group: g,
                        sent_at: now,
                        may_park: head && !streaming && wait > 0,
                        streaming,
                    });
                }
                Ok(Poll::NotBefore(t)) => wake = Some(wake.map_or(t, |w| w.min(t))),
                Ok(Poll::AwaitingResponse | Poll::Idle) => {}
                Err(e) => return self.disconnect(cx, i, e.to_string()),
            }
        }
        if let Some(t) = wake {
            self.arm_timer(cx, i, t.saturating_duration_since(now));
        }
        let src = &mut self.sources[i];
        if !src.sending && !src.recv_unbounded && !src.out.is_empty() {
            let request = src.out.split().freeze();
            let limit = Self::request_limit(src);
            self.arm_deadline(cx, i, limit);
            let Some(request) = self.wire_bytes(cx, i, request) else {
                return;
            };
            self.send(cx, i, request);
        }
        self.ensure_recv(cx, i);
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

    /// Posts a RECV while bytes are due. With one fetch group a connection has at most one
    /// response coming, so a RECV may ask for the whole slot. With several, responses follow
    /// each other on the socket, so a RECV never reads past the frame it is filling: first the
    /// 4-byte length, then exactly the rest (no byte of the next response lands in this slot,
    /// and record bytes are never copied between slots). Through TLS the slot takes
    /// ciphertext, which the link buffers, so any amount may be read.
    fn ensure_recv(&mut self, cx: &mut Cx<'_>, i: usize) {
        let src = &mut self.sources[i];
        let due = match src.link {
            Link::Securing => true,
            Link::Up => !src.in_flight.is_empty(),
            Link::Down | Link::Connecting => false,
        };
        if src.receiving || !due {
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
        let (max, unbounded) = if src.secure_reads() {
            (slot.remaining(), false)
        } else {
            match frame::body_len(slot.filled()) {
                Ok(Some(len)) => (
                    (LENGTH_PREFIX_BYTES + len)
                        .saturating_sub(slot.len())
                        .min(slot.remaining()),
                    false,
                ),
                _ if src.pipelines() || src.in_flight.len() > 1 => {
                    (LENGTH_PREFIX_BYTES.saturating_sub(slot.len()), false)
                }
                _ => (slot.remaining(), true),
            }
        };
        if max == 0 {
            // A full slot with its frame incomplete; `on_recv` refuses such frames first, so
            // this is only a guard against reading nothing forever.
            drop(slot);
            return self.disconnect(cx, i, "response frame exceeds the arena slot".to_string());
        }
        if cx
            .ring
            .recv(tag(i, src.generation, KIND_RECV), fd, slot, max)
            .is_err()
        {
            self.disconnect(cx, i, "ring op slab full".to_string());
            return;
        }
        self.sources[i].receiving = true;
        self.sources[i].recv_unbounded = unbounded;
    }

    fn on_recv(&mut self, cx: &mut Cx<'_>, i: usize, c: Completion) {
        self.sources[i].receiving = false;
        self.sources[i].recv_unbounded = false;
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
            let mut slot = slot;
            if slot.len() >= self.sources[i].partial_read_to + FETCH_READ_EARLY_STEP_BYTES {
                self.sources[i].partial_read_to = slot.len();
                let prefix = slot.share_filled().slice(LENGTH_PREFIX_BYTES..);
                let generation = self.sources[i].generation;
                if let Err(why) = self.read_prefix(cx, i, prefix, total - LENGTH_PREFIX_BYTES) {
                    return self.disconnect(cx, i, why);
                }
                if self.sources[i].generation != generation {
                    return;
                }
            }
            self.sources[i].partial = Some(slot);
            self.ensure_recv(cx, i);
            return;
        }
        self.sources[i].partial_read_to = 0;
        let body = slot.freeze().slice(LENGTH_PREFIX_BYTES..);
        match self.handle_frame(cx, i, body) {
            Ok(()) => self.drive(cx, i),
            Err(why) => self.disconnect(cx, i, why),
        }
    }

    /// The first bytes of a response frame (without its length prefix; `whole_len` is its
    /// body's full length): the oldest request's group reads the partitions whose entries are
    /// whole in it, and their appends are staged and submitted now, while the rest of the
    /// response arrives, so their validation and page-cache copy read bytes the socket copy
    /// has just written (benches/RESULTS.md, session 20).
    fn read_prefix(
        &mut self,
        cx: &mut Cx<'_>,
        i: usize,
        prefix: Bytes,
        whole_len: usize,
    ) -> Result<(), String> {
        let Some(g) = self.sources[i].in_flight.front().map(|r| r.group) else {
            return Ok(());
        };
        // The previous writes first, as for a whole response: one batch on the ring at a
        // time, and the fetcher learns of each append before it reads further.
        self.complete_staged(cx);
        let mut events = std::mem::take(&mut self.events);
        let handled = self.sources[i].groups[g].fetcher.handle_response_prefix(
            prefix,
            whole_len,
            Instant::now(),
            &mut events,
        );
        if events.iter().any(|e| matches!(e, FetchEvent::Records(_))) {
            self.sources[i].groups[g].records_read_early = true;
        }
        self.apply_events(cx, i, g, &mut events);
        self.events = events;
        handled.map_err(|e| e.to_string())
    }

    /// One whole response frame (without its length prefix): it answers the oldest request on
    /// the wire, so it goes to that request's group.
    pub(super) fn handle_frame(
        &mut self,
        cx: &mut Cx<'_>,
        i: usize,
        body: Bytes,
    ) -> Result<(), String> {
        // The previous response's writes (its CQEs are usually in by now).
        self.complete_staged(cx);
        let now = Instant::now();
        let src = &mut self.sources[i];
        let Some(request) = src.in_flight.pop_front() else {
            return Err("response with no request outstanding".to_string());
        };
        src.turn_since = now;
        if !src.answered {
            src.answered = true;
            for group in &src.groups {
                group
                    .meters
                    .iter()
                    .flatten()
                    .for_each(|m| m.source_answered(true));
            }
        }
        let took = now.saturating_duration_since(request.sent_at);
        cx.stats.fetched(took);
        cx.latency.record(Latency::FetchRoundTrip, took);
        let g = request.group;
        let mut events = std::mem::take(&mut self.events);
        let handled = self.sources[i].groups[g]
            .fetcher
            .handle_response(body, now, &mut events);
        let streaming = events.iter().any(|e| matches!(e, FetchEvent::Records(_)))
            || std::mem::take(&mut self.sources[i].groups[g].records_read_early);
        self.apply_events(cx, i, g, &mut events);
        self.events = events;
        let group = &mut self.sources[i].groups[g];
        group.streaming = streaming;
        let mut backlog = std::mem::take(&mut group.backlog);
        let requests = group.fetcher.fetch_requests();
        cx.stats.fetch_requests(
            requests.full - group.requests_seen.full,
            requests.incremental - group.requests_seen.incremental,
        );
        group.requests_seen = requests;
        let throttled = group.fetcher.throttled_ms_total() - group.throttle_seen_ms;
        if throttled > 0 {
            backlog.throttled();
            group.throttle_seen_ms += throttled;
            cx.stats.throttled(throttled);
            group
                .meters
                .iter()
                .flatten()
                .for_each(|m| m.throttled(throttled));
        }
        handled.map_err(|e| e.to_string())?;
        self.pipeline_catch_up(cx, i, g, streaming, backlog);
        Ok(())
    }

    fn apply_events(&mut self, cx: &mut Cx<'_>, i: usize, g: usize, events: &mut Vec<FetchEvent>) {
        let at = |slot| Loc {
            src: i,
            group: g,
            slot,
        };
        for ev in events.drain(..) {
            // Anything but records and watermarks may stop a partition or read its log end:
            // the appends staged so far are written (and completed) first.
            if !matches!(ev, FetchEvent::Records(_) | FetchEvent::Watermarks { .. }) {
                self.write_staged(cx);
            }
            match ev {
                FetchEvent::Records(r) => {
                    self.sources[i].groups[g].backlog.count(&r);
                    self.stage_records(cx, at(r.slot), r)
                }
                FetchEvent::LogStartMoved { slot, to, .. } => {
                    // Mirrored history is never deleted because the source lost it: the log
                    // keeps its batches and the next append lands at `to`, past a gap. Only
                    // the size of the gap is recorded (describe, /metrics; the fetcher logged
                    // both offsets).
                    let skipped = match self.log_mut(at(slot)) {
                        Some(log) => to.0.saturating_sub(log.log_end_offset().0).max(0),
                        None => continue,
                    };
                    self.report_skipped(at(slot), skipped as u64);
                }
                FetchEvent::Diverged(d) => {
                    let why = format!(
                        "source log diverged from ours at fetch offset {} (last fetched epoch \
                         {}): {}; our log is kept as it is and fetching stopped",
                        d.fetch_offset, d.last_fetched_epoch.0, d.cause
                    );
                    let epoch_end = match d.cause {
                        DivergenceCause::EpochEnd { epoch, end_offset } => {
                            Some((epoch, end_offset))
                        }
                        _ => None,
                    };
                    self.stop_partition_diverged(cx, at(d.slot), why, epoch_end);
                }
                FetchEvent::RefreshMetadata { slot, error, hint } => {
                    let why = match hint {
                        Some((leader, epoch)) => format!(
                            "source error {error}, leader now {leader} at epoch {}",
                            epoch.0
                        ),
                        None => format!("source error {error}"),
                    };
                    self.want_leader(cx, at(slot), why);
                }
                FetchEvent::BadRecords {
                    slot,
                    error,
                    retrying: false,
                } => {
                    let why = format!("bad records from the source: {error}");
                    let retryable = error.retryable();
                    self.stop_partition(cx, at(slot), why, retryable);
                }
                FetchEvent::Watermarks {
                    slot,
                    high_watermark,
                    ..
                } => {
                    if let Some(m) = self.meter(at(slot)) {
                        m.high_watermark(high_watermark);
                    }
                    self.report_high_watermark(at(slot), high_watermark);
                }
                FetchEvent::BadRecords { slot, .. } | FetchEvent::PartitionError { slot, .. } => {
                    if let Some(m) = self.meter(at(slot)) {
                        m.fetch_error();
                    }
                    let addr = &self.sources[i].spec.addr;
                    notice(cx, format!("source broker {addr}: {ev:?}"));
                }
                FetchEvent::RequestFailed { .. } => {
                    let src = &self.sources[i];
                    let group = &src.groups[g];
                    group.meters.iter().flatten().for_each(|m| m.fetch_error());
                    notice(cx, format!("source broker {}: {ev:?}", src.spec.addr));
                }
            }
        }
        // Submitted, not waited for: the caller sends the next fetch first (`on_recv` →
        // `drive`); the writes complete when the next response is whole, at any handler entry
        // other than a RECV or SEND completion, or at the end of the turn their CQEs came in.
        self.submit_staged(cx);
    }

    fn meter(&self, at: Loc) -> Option<&Arc<PartitionStats>> {
        self.sources[at.src].groups[at.group]
            .meters
            .get(at.slot.0 as usize)?
            .as_ref()
    }

    /// Counters and latencies of one successful append; `took` and `now_ms` are read once per
    /// response (the appends of a response complete together).
    fn meter_append(
        &self,
        cx: &mut Cx<'_>,
        at: Loc,
        r: &crate::fetch::fetcher::FetchedRecords,
        (took, now_ms): (Duration, i64),
        log_end: Offset,
    ) {
        let bytes = r.records.len() as u64;
        cx.stats.appended(bytes, took);
        cx.latency.record(Latency::Append, took);
        if let Some(m) = self.meter(at) {
            m.appended(bytes, u64::from(r.batches), log_end, r.max_timestamp);
            m.high_watermark(r.high_watermark);
        }
        // Clocks of two hosts: a batch stamped in our future counts as no latency.
        if r.max_timestamp.0 > 0 {
            let ms = (now_ms - r.max_timestamp.0).max(0) as u64;
            cx.latency
                .record(Latency::EndToEnd, Duration::from_millis(ms));
        }
    }

    fn log(&self, at: Loc) -> Option<&PartitionLog> {
        self.sources[at.src].groups[at.group]
            .logs
            .get(at.slot.0 as usize)?
            .as_ref()
    }

    fn log_mut(&mut self, at: Loc) -> Option<&mut PartitionLog> {
        self.group_mut(at)
            .logs
            .get_mut(at.slot.0 as usize)?
            .as_mut()
    }

    fn stop_partition(&mut self, cx: &mut Cx<'_>, at: Loc, why: String, retryable: bool) {
        self.stop_partition_with(cx, at, why, retryable, None);
    }

    /// A divergence stops the partition for good (not retryable), with the source leader's
    /// epoch answer when there is one.
    fn stop_partition_diverged(
        &mut self,
        cx: &mut Cx<'_>,
        at: Loc,
        why: String,
        source_epoch_end: Option<(LeaderEpoch, Offset)>,
    ) {
        self.stop_partition_with(cx, at, why, false, source_epoch_end);
    }

    fn stop_partition_with(
        &mut self,
        cx: &mut Cx<'_>,
        at: Loc,
        why: String,
        retryable: bool,
        source_epoch_end: Option<(LeaderEpoch, Offset)>,
    ) {
        self.cells.remove(&at);
        let group = self.group_mut(at);
        let n = at.slot.0 as usize;
        let log = group.logs.get_mut(n).and_then(Option::take);
        if let Some(m) = group.meters.get_mut(n).and_then(Option::take) {
            cx.stats.deregister(&m);
        }
        let tp = match group.fetcher.remove_partition(at.slot) {
            Ok(tp) => tp,
            Err(_) => match &log {
                Some(l) => l.topic_partition().clone(),
                None => return,
            },
        };
        if let Some(log) = log {
            self.give_back(cx, log);
        }
        let _ = cx.emit(MirrorEvent::PartitionStopped {
            tp,
            why,
            retryable,
            source_epoch_end,
        });
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
        // A message first completes the response writes still in flight, so nothing below
        // sees a log with an append under way.
        self.complete_staged(cx);
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
            MirrorMsg::SetConfig { tp, config } => self.set_config(cx, &tp, *config),
            MirrorMsg::EnforceRetention { now_ms } => self.enforce_retention(cx, now_ms),
            MirrorMsg::Flush => self.flush_logs(cx),
        }
    }

    fn on_completion(&mut self, cx: &mut ShardCx<'_, MirrorEvent>, c: Completion) {
        // A response's writes are completed before anything that may touch a log. Receiving
        // and sending do not: a RECV completes them only once it holds a whole response
        // (`handle_frame`), so the next response streams in while the page-cache copy of the
        // previous one runs (waiting here held the source's bytes in its socket buffer).
        let (_, _, kind) = untag(c.tag);
        if kind == flush::KIND_FSYNC {
            // Counted before the writes complete (`on_fsync` completes them itself).
            return self.on_fsync(cx, c);
        }
        if kind != KIND_RECV && kind != KIND_SEND {
            self.complete_staged(cx);
        }
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
                Link::Up => self.drive(cx, i),
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

    fn end_of_turn(&mut self, cx: &mut ShardCx<'_, MirrorEvent>) {
        // Only when the writes are in: their CQEs end the ring wait, so a turn follows them
        // at once, and waiting here would hold up receiving (see `on_completion`).
        if cx.ring.write_batch_settled() {
            self.complete_staged(cx);
        }
        // Syncs a full slab kept queued.
        self.pump_syncs(cx);
    }

    /// Hands every log back to the control thread (each once its flush in flight finished),
    /// which closes the log dir as a whole (final index entries, fsync, checkpoints,
    /// clean-shutdown marker).
    fn stop(&mut self, cx: &mut ShardCx<'_, MirrorEvent>) {
        self.complete_staged(cx);
        let mut logs = Vec::new();
        for src in &mut self.sources {
            if let Some(s) = src.socket.take() {
                let _ = s.shutdown(Shutdown::Both);
            }
            for group in &mut src.groups {
                for m in group.meters.iter_mut().filter_map(Option::take) {
                    cx.stats.deregister(&m);
                }
                logs.extend(group.logs.iter_mut().filter_map(Option::take));
            }
        }
        for log in logs {
            self.give_back(cx, log);
        }
        debug_assert!(
            self.flushes.is_empty(),
            "a flush in flight for a log the shard gave back"
        );
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
