//! The fetcher for one source broker: which partitions it leads for us, where each stands, the
//! fetch session, and the requests that keep them moving. Sans-IO.
//!
//! # Driving it
//! ```text
//! loop {
//!     match fetcher.poll_request(&mut out, now)? {
//!         Poll::Sent(_)          => write `out` to the socket,
//!         Poll::NotBefore(t)     => wait until t (throttle or backoff),
//!         Poll::Idle | Poll::AwaitingResponse => wait for a frame or a command,
//!     }
//!     on a whole frame: fetcher.handle_response(frame, now, &mut events)?; act on events
//!     on a socket error: fetcher.connection_lost(now)
//! }
//! ```
//! One request is in flight at a time, like Kafka's replica fetcher. Besides Fetch the fetcher
//! sends, on its own, ListOffsets (earliest) after OFFSET_OUT_OF_RANGE and OffsetForLeaderEpoch
//! for sources without Fetch v12 after a leader change.
//!
//! # What it assumes of the caller
//! Records handed out in `FetchEvent::Records` are appended to the local log in order; the
//! fetcher advances its fetch offset as soon as it hands them out (so the next fetch overlaps
//! the append). If an append fails, the caller fails or removes the partition.
//!
//! # Fetch sessions (KIP-227)
//! From Fetch v7 the first request is a full fetch that asks for a session (id 0, epoch 0).
//! Once the broker grants one, later requests are incremental: they carry only partitions that
//! are new or whose fetch parameters changed, and name removed ones in `forgotten_topics_data`.
//! The broker then answers only for partitions with news, so the last high watermark, log start
//! and LSO per partition are kept here. Any session error, failed request or version change
//! falls back to a full fetch.
//!
//! # Work per request
//! A request costs the partitions it carries, not all the fetcher holds. Every mutation of a
//! partition (a response for it, pause, resume, rewind, a leader update, removal) marks it
//! *touched*; a partition whose backoff ends is touched when its time comes (an ordered set of
//! backoff deadlines). An incremental request visits only the touched partitions, in the same
//! stable order a full request uses; the others are exactly as the broker's session holds them
//! (nothing about them changed since they were last visited, and time only ever makes a
//! backed-off partition fetchable, which the deadline set covers). Full requests still list
//! every partition, as the protocol requires. ListOffsets and OffsetForLeaderEpoch walk the
//! partitions only while some partition is known to wait for one.
//!
//! # Steady-state allocation
//! The request structure is kept between fetches and refilled in place. The crate allocates,
//! per response, the `Vec`s of topics and partitions it decodes into (and an empty `BTreeMap`
//! per struct, which does not allocate); records stay slices of the frame.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, ListOffsetsRequest, ListOffsetsResponse, OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;

mod answer;

use crate::fetch::backoff::Backoff;
use crate::fetch::conn::{ConnError, Connection, InFlight};
use crate::fetch::response::{self, Position, RecordsError};
use crate::fetch::source_load::{shared_cap, RateCap};
use crate::fetch::versions::Versions;
use crate::ids::{LeaderEpoch, Offset, TimestampMs, TopicPartition};
use crate::limits::{
    FETCHER_PARTITIONS_MAX, FETCH_BAD_RECORDS_RETRIES, FETCH_RESPONSE_BYTES_MAX, FETCH_WAIT_MS_MAX,
    SOURCE_THROTTLE_MS_MAX,
};
use crate::wire::batch::ValidatedBatches;
use answer::FetchAnswer;

/// Fetch sizing and waiting, from the mirror's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchConfig {
    pub max_wait_ms: u32,
    pub min_bytes: u32,
    pub max_bytes: u32,
    pub partition_max_bytes: u32,
    /// Use fetch sessions when the source speaks Fetch v7+.
    pub sessions: bool,
    /// Record bytes per second all fetchers with this fetcher's client id may fetch together
    /// (`fetch::source_load`); 0: no cap.
    pub max_rate_bytes_per_sec: u64,
    /// Fetch groups (each one `Fetcher`, with its own session and one request in flight) a
    /// shard splits one source connection's partitions into; read by the shard, not by the
    /// fetcher.
    pub sessions_per_connection: u8,
    /// Connections a shard opens to one source broker, its partitions there split between
    /// them; read by the shard, not by the fetcher.
    pub connections_per_source: u8,
    /// With one fetch group per connection: split a connection's partitions into a second
    /// group while they are behind, so two requests are in flight, and merge them back with
    /// the first answer that brings no records; read by the shard (`mirror_shard_split`).
    pub catch_up_pipelining: bool,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            max_wait_ms: 500,
            min_bytes: 1,
            max_bytes: 50 * 1024 * 1024,
            partition_max_bytes: 1024 * 1024,
            sessions: true,
            max_rate_bytes_per_sec: 0,
            sessions_per_connection: crate::limits::SOURCE_FETCH_SESSIONS_DEFAULT,
            connections_per_source: crate::limits::SOURCE_CONNECTIONS_DEFAULT,
            catch_up_pipelining: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetcherError {
    #[error("fetch config: {0}")]
    Config(&'static str),
    #[error("fetcher already holds {0} partitions")]
    TooManyPartitions(usize),
    #[error("partition {0} is already fetched here")]
    Duplicate(TopicPartition),
    #[error("no such partition slot {0:?}")]
    NoSuchSlot(Slot),
    #[error("a request is in flight")]
    RequestInFlight,
    #[error(transparent)]
    Conn(#[from] ConnError),
}

/// A partition's handle in one fetcher, stable until it is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(pub u32);

/// A partition's whole fetch state between `Fetcher::hand_over` and `Fetcher::take_over`.
#[derive(Debug)]
pub struct Handover(Partition);

impl Handover {
    pub fn topic_partition(&self) -> &TopicPartition {
        &self.0.tp
    }
}

/// Where to start fetching a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionStart {
    pub tp: TopicPartition,
    /// `Uuid::nil()` when unknown (source before 2.8): the fetcher then uses Fetch ≤ v12.
    pub topic_id: Uuid,
    /// Our log end offset: the next offset we need.
    pub log_end: Offset,
    /// Epoch of the last batch in our log (`NONE` for an empty log or legacy data).
    pub last_epoch: LeaderEpoch,
    /// Leader epoch from the source's metadata (`NONE` before Metadata v7).
    pub leader_epoch: LeaderEpoch,
}

/// What a partition is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionState {
    Fetching,
    /// Paused by the caller (e.g. its log is busy or out of buffer).
    Paused,
    /// A leader or topic error: the caller must refresh metadata and call `update_leader`.
    AwaitingLeader,
    /// OFFSET_OUT_OF_RANGE: a ListOffsets (earliest) is due.
    AwaitingLogStart,
    /// Leader changed on a source without Fetch v12: an OffsetForLeaderEpoch check is due.
    AwaitingEpochCheck,
    /// The source no longer holds what we hold; fetching stopped for good.
    Diverged,
    /// Stopped for good after bad data (see the event that said why).
    Failed,
}

/// Why a source's log and ours no longer agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DivergenceCause {
    /// The leader's (epoch, end offset) for our last epoch: from Fetch v12+ DivergingEpoch or
    /// from OffsetForLeaderEpoch. Feed it to `divergence::truncation_offset`.
    EpochEnd {
        epoch: LeaderEpoch,
        end_offset: Offset,
    },
    /// OFFSET_OUT_OF_RANGE while the source's log start is at or below our fetch offset: the
    /// source's log ends below data we hold (unclean election, or the topic was recreated).
    BeyondSourceEnd { source_log_start: Offset },
    /// Metadata shows a different topic id under the same name: the source topic was deleted
    /// and recreated, so nothing we hold belongs to it.
    TopicIdChanged { old: Uuid, new: Uuid },
}

impl std::fmt::Display for DivergenceCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DivergenceCause::EpochEnd { epoch, end_offset } => write!(
                f,
                "the source leader's log for epoch {} ends at offset {}, below data we hold \
                 (the source log was truncated, e.g. by an unclean leader election)",
                epoch.0, end_offset.0
            ),
            DivergenceCause::BeyondSourceEnd { source_log_start } => write!(
                f,
                "the source log ends below our fetch offset (source log start {}): it was \
                 truncated or the topic was recreated",
                source_log_start.0
            ),
            DivergenceCause::TopicIdChanged { old, new } => write!(
                f,
                "the source topic was deleted and recreated (topic id {old} is now {new})"
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Divergence {
    pub slot: Slot,
    pub fetch_offset: Offset,
    pub last_fetched_epoch: LeaderEpoch,
    pub cause: DivergenceCause,
}

/// Validated record batches: `records` is a slice of the response frame (no copy) holding
/// whole batches with offsets `first_offset..=last_offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedRecords {
    pub slot: Slot,
    pub records: ValidatedBatches,
    pub first_offset: Offset,
    pub last_offset: Offset,
    pub max_timestamp: TimestampMs,
    pub last_epoch: LeaderEpoch,
    pub batches: u32,
    pub high_watermark: Offset,
    pub log_start_offset: Offset,
    pub last_stable_offset: Offset,
}

/// What happened to a partition while handling a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchEvent {
    Records(FetchedRecords),
    /// The source's high watermark, LSO or log start moved (no records came with it).
    Watermarks {
        slot: Slot,
        high_watermark: Offset,
        last_stable_offset: Offset,
        log_start_offset: Offset,
    },
    /// The partition's leader moved or its epoch changed (the error code says which); refresh
    /// metadata and call `update_leader`, or move the partition to the new leader's fetcher.
    /// `hint` is the new (leader id, epoch) when the source sent it (Fetch v12+, Kafka 3.7+).
    RefreshMetadata {
        slot: Slot,
        error: i16,
        hint: Option<(i32, LeaderEpoch)>,
    },
    /// The source's log start passed our log end (retention or DeleteRecords while we were
    /// behind or down): offsets `from..to` no longer exist at the source. `from` is our log
    /// end, `to` the base of the first batch the source returned (it may lie a little below
    /// the source's log start: DeleteRecords can cut inside a batch), or the source's log start
    /// when it returned none. The local log keeps every batch; the records that follow are
    /// appended at `to`, leaving the gap `from..to` (as compaction leaves gaps). Never below
    /// `from`: a first batch overlapping local data is refused as `BadRecords` instead.
    LogStartMoved {
        slot: Slot,
        from: Offset,
        to: Offset,
    },
    /// Fetching stopped: see `Divergence`.
    Diverged(Divergence),
    /// Bad records from the source. `retrying` says whether the fetcher retries after a backoff
    /// (corrupt bytes may be a transient fault) or stopped the partition (its offsets or epochs
    /// contradict what we hold).
    BadRecords {
        slot: Slot,
        error: RecordsError,
        retrying: bool,
    },
    /// A partition error the fetcher does not handle itself; it backs off and retries.
    PartitionError {
        slot: Slot,
        error: i16,
    },
    /// The whole request failed (top-level error or undecodable response); retried after a
    /// backoff with a full fetch.
    RequestFailed {
        error: String,
    },
}

/// The outcome of asking for the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll {
    /// A request was framed into the buffer; send it.
    Sent(InFlight),
    /// Nothing may be sent before this instant (throttle or backoff).
    NotBefore(Instant),
    /// A response is outstanding.
    AwaitingResponse,
    /// Nothing to fetch.
    Idle,
}

/// Fetch requests sent, by kind: full ones list every partition, incremental ones (inside a
/// fetch session) only those whose fetch position changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchRequestCounts {
    pub full: u64,
    pub incremental: u64,
}

/// The parameters of a partition the broker's session holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SessionEntry {
    fetch_offset: Offset,
    current_leader_epoch: LeaderEpoch,
    last_fetched_epoch: LeaderEpoch,
}

#[derive(Debug, Clone)]
struct Partition {
    tp: TopicPartition,
    topic_name: TopicName,
    topic_id: Uuid,
    fetch_offset: Offset,
    log_end: Offset,
    last_fetched_epoch: LeaderEpoch,
    current_leader_epoch: LeaderEpoch,
    high_watermark: Offset,
    last_stable_offset: Offset,
    log_start_offset: Offset,
    state: PartitionState,
    backoff: Backoff,
    in_session: Option<SessionEntry>,
    /// Removed by the caller but still in the broker's session: forget it in the next request.
    removed: bool,
    /// Set when the source's log start passed our fetch offset (the old fetch offset); the
    /// move is reported with the next good response for the partition.
    log_start_moved_from: Option<Offset>,
    /// Responses in a row whose records failed their CRC or framing.
    bad_records_streak: u32,
    /// Appends in a row that failed on a full disk (`rewind`), for the retry backoff.
    append_failures: u32,
    /// Rewound while a request was in flight: that request asked for the offsets past the
    /// rolled-back records, so its answer for this partition is dropped (appending it would
    /// leave a gap where the rolled-back records belong).
    skip_in_flight_answer: bool,
    /// Position in `Fetcher::order`: (rank of the topic's group, insertion sequence).
    order_key: OrderKey,
    /// In `Fetcher::touched`, to be visited by the next incremental request.
    touched: bool,
}

/// (topic group rank, insertion sequence): partitions of one topic sort next to each other,
/// topics in the order their group was formed, partitions of a topic in the order added.
type OrderKey = (u64, u64);

impl Partition {
    fn session_entry(&self, send_epochs: bool, send_last_fetched: bool) -> SessionEntry {
        SessionEntry {
            fetch_offset: self.fetch_offset,
            current_leader_epoch: if send_epochs {
                self.current_leader_epoch
            } else {
                LeaderEpoch::NONE
            },
            last_fetched_epoch: if send_last_fetched {
                self.last_fetched_epoch
            } else {
                LeaderEpoch::NONE
            },
        }
    }

    fn fetchable(&self, now: Instant) -> bool {
        !self.removed
            && self.state == PartitionState::Fetching
            && self.backoff.pending(now).is_none()
    }
}

/// Session state as KIP-227 defines it from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Session {
    /// Fetch < v7 or sessions disabled: (0, -1) full fetches.
    None,
    /// The next request is full and asks for a session; `close` is an old session to drop.
    Opening { close: Option<i32> },
    /// The broker holds session `id`; the next incremental request carries `epoch`.
    Open { id: i32, epoch: i32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    Fetch {
        version: i16,
        full: bool,
        session_id: i32,
    },
    ListOffsets {
        version: i16,
    },
    EpochCheck {
        version: i16,
    },
}

/// The fetcher for one source broker.
#[derive(Debug)]
pub struct Fetcher {
    config: FetchConfig,
    versions: Versions,
    conn: Connection,
    slots: Vec<Option<Partition>>,
    free: Vec<u32>,
    by_name: HashMap<(TopicName, i32), Slot>,
    by_id: HashMap<(Uuid, i32), Slot>,
    /// Slots in a stable order grouped by topic, so each request lists a topic once.
    order: BTreeMap<OrderKey, Slot>,
    /// Per topic held here (removed partitions still in the session included): its group's
    /// rank in `order` and how many partitions it has.
    topic_groups: HashMap<TopicName, (u64, usize)>,
    next_rank: u64,
    next_seq: u64,
    /// Partitions changed since the last request visited them (see "Work per request").
    touched: Vec<Slot>,
    /// Partitions whose answer in the response now awaited is dropped (`rewind`).
    skip_answers: Vec<Slot>,
    /// The next request's partitions, in `order` (kept to reuse its allocation).
    visit: Vec<Slot>,
    /// Partition backoff deadlines, earliest first. Entries go stale when a backoff is reset or
    /// renewed; they are checked against the partition's backoff when read.
    backoffs: BTreeSet<(Instant, Slot)>,
    /// Partitions (removed ones included) that the broker's session holds.
    in_session: usize,
    /// Removed partitions still held to be forgotten (counted in `order`).
    removed: usize,
    /// Partitions without a topic id (they force Fetch v12 on sources that have ids).
    nil_ids: BTreeSet<Slot>,
    /// Some partition may be in `AwaitingLogStart` / `AwaitingEpochCheck`: set when one enters
    /// that state, cleared by a walk that finds none.
    want_list_offsets: bool,
    want_epoch_check: bool,
    session: Session,
    session_version: Option<i16>,
    pending: Option<Pending>,
    /// How far the answer to the Fetch in flight has been read, once its header was.
    answer: Option<FetchAnswer>,
    backoff: Backoff,
    request: FetchRequest,
    spare_topics: Vec<FetchTopic>,
    /// The mirror's byte budget when `max_rate_bytes_per_sec` caps it.
    cap: Option<std::sync::Arc<RateCap>>,
    requests: FetchRequestCounts,
}

fn topic_name(tp: &TopicPartition) -> TopicName {
    TopicName(StrBytes::from_string(tp.topic.clone()))
}

fn clamp_i32(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

impl Fetcher {
    pub fn new(
        config: FetchConfig,
        versions: Versions,
        client_id: &str,
    ) -> Result<Fetcher, FetcherError> {
        if config.max_wait_ms > FETCH_WAIT_MS_MAX {
            return Err(FetcherError::Config("max_wait_ms above FETCH_WAIT_MS_MAX"));
        }
        if config.max_bytes as usize > FETCH_RESPONSE_BYTES_MAX {
            return Err(FetcherError::Config(
                "max_bytes above FETCH_RESPONSE_BYTES_MAX",
            ));
        }
        if config.partition_max_bytes == 0 || config.partition_max_bytes > config.max_bytes {
            return Err(FetcherError::Config(
                "partition_max_bytes must be in 1..=max_bytes",
            ));
        }
        let session = if config.sessions && versions.fetch_has_sessions() {
            Session::Opening { close: None }
        } else {
            Session::None
        };
        let mut request = FetchRequest::default();
        request.replica_id = BrokerId(-1);
        request.isolation_level = 0; // READ_UNCOMMITTED: markers and aborted data are mirrored too
        request.max_wait_ms = clamp_i32(config.max_wait_ms);
        request.min_bytes = clamp_i32(config.min_bytes);
        request.max_bytes = clamp_i32(config.max_bytes);
        Ok(Fetcher {
            config,
            versions,
            conn: Connection::new(client_id),
            slots: Vec::new(),
            free: Vec::new(),
            by_name: HashMap::new(),
            by_id: HashMap::new(),
            order: BTreeMap::new(),
            topic_groups: HashMap::new(),
            next_rank: 0,
            next_seq: 0,
            touched: Vec::new(),
            skip_answers: Vec::new(),
            visit: Vec::new(),
            backoffs: BTreeSet::new(),
            in_session: 0,
            removed: 0,
            nil_ids: BTreeSet::new(),
            want_list_offsets: false,
            want_epoch_check: false,
            session,
            session_version: None,
            pending: None,
            answer: None,
            backoff: Backoff::default(),
            request,
            spare_topics: Vec::new(),
            cap: shared_cap(client_id, config.max_rate_bytes_per_sec),
            requests: FetchRequestCounts::default(),
        })
    }

    /// How long the source may hold this fetcher's next Fetch requests for `min_bytes`: the
    /// configured `max_wait_ms` at most. A shard that queues a request behind another one on
    /// the same connection sets 0, because the source answers a connection's requests one at
    /// a time and a parked request would hold back every request queued behind it.
    pub fn set_max_wait_ms(&mut self, ms: u32) {
        self.request.max_wait_ms = clamp_i32(ms.min(self.config.max_wait_ms));
    }

    pub fn versions(&self) -> Versions {
        self.versions
    }

    /// Start fetching a partition from this broker.
    pub fn add_partition(&mut self, start: PartitionStart) -> Result<Slot, FetcherError> {
        let needs_epoch_check =
            !self.versions.fetch_has_divergence() && start.last_epoch.is_known();
        let partition = Partition {
            topic_name: topic_name(&start.tp),
            topic_id: start.topic_id,
            fetch_offset: start.log_end,
            log_end: start.log_end,
            last_fetched_epoch: start.last_epoch,
            current_leader_epoch: start.leader_epoch,
            high_watermark: Offset(-1),
            last_stable_offset: Offset(-1),
            log_start_offset: Offset(-1),
            state: if needs_epoch_check {
                PartitionState::AwaitingEpochCheck
            } else {
                PartitionState::Fetching
            },
            backoff: Backoff::default(),
            in_session: None,
            removed: false,
            log_start_moved_from: None,
            bad_records_streak: 0,
            append_failures: 0,
            skip_in_flight_answer: false,
            order_key: (0, 0),
            touched: false,
            tp: start.tp,
        };
        self.insert(partition)
    }

    /// Takes `slot`'s partition out of this fetcher with all its fetch state, for another
    /// fetcher of the same broker to go on with (`take_over`): the shard's catch-up split and
    /// merge move partitions between its fetch groups this way, keeping every position,
    /// watermark, epoch, backoff and pending check. Only between requests: the answer to a
    /// request in flight would be read against a partition that is no longer here. The
    /// broker's session forgets it with this fetcher's next request.
    pub fn hand_over(&mut self, slot: Slot) -> Result<Handover, FetcherError> {
        if self.pending.is_some() {
            return Err(FetcherError::RequestInFlight);
        }
        let p = self
            .partition(slot)
            .ok_or(FetcherError::NoSuchSlot(slot))?
            .clone();
        self.remove_partition(slot)?;
        Ok(Handover(p))
    }

    /// Goes on fetching a partition another fetcher of the same broker handed over.
    pub fn take_over(&mut self, handover: Handover) -> Result<Slot, FetcherError> {
        let mut p = handover.0;
        p.in_session = None;
        p.removed = false;
        p.touched = false;
        p.skip_in_flight_answer = false;
        self.insert(p)
    }

    /// Adds `partition` (not in the session yet) and touches it.
    fn insert(&mut self, mut partition: Partition) -> Result<Slot, FetcherError> {
        if !self.has_room() {
            return Err(FetcherError::TooManyPartitions(self.by_name.len()));
        }
        let name = partition.topic_name.clone();
        let partition_index = partition.tp.partition;
        let key = (name.clone(), partition_index);
        if let Some(slot) = self.by_name.get(&key) {
            // A removed partition still waiting to be forgotten may be added again.
            // (`partition()` hides removed partitions, so look at the slot itself.)
            let removed = self
                .slots
                .get(slot.0 as usize)
                .and_then(Option::as_ref)
                .is_some_and(|p| p.removed);
            if !removed {
                return Err(FetcherError::Duplicate(partition.tp));
            }
            self.drop_slot(*slot);
        }
        // Keep partitions of one topic next to each other.
        let next_rank = &mut self.next_rank;
        let group = self.topic_groups.entry(name).or_insert_with(|| {
            *next_rank += 1;
            (*next_rank, 0)
        });
        group.1 += 1;
        self.next_seq += 1;
        let order_key = (group.0, self.next_seq);
        partition.order_key = order_key;
        let topic_id = partition.topic_id;
        let slot = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(partition);
                Slot(i)
            }
            None => {
                self.slots.push(Some(partition));
                Slot((self.slots.len() - 1) as u32)
            }
        };
        self.by_name.insert(key, slot);
        if topic_id.is_nil() {
            self.nil_ids.insert(slot);
        } else {
            self.by_id.insert((topic_id, partition_index), slot);
        }
        self.order.insert(order_key, slot);
        self.touch(slot);
        Ok(slot)
    }

    /// Records that `slot` changed: the next request visits it, a backoff it started is
    /// watched, and a state that needs ListOffsets or OffsetForLeaderEpoch is noticed.
    fn touch(&mut self, slot: Slot) {
        let Some(p) = self.slots.get_mut(slot.0 as usize).and_then(Option::as_mut) else {
            return;
        };
        if !p.touched {
            p.touched = true;
            self.touched.push(slot);
        }
        if let Some(t) = p.backoff.until() {
            self.backoffs.insert((t, slot));
        }
        match p.state {
            PartitionState::AwaitingLogStart => self.want_list_offsets = true,
            PartitionState::AwaitingEpochCheck => self.want_epoch_check = true,
            _ => {}
        }
    }

    /// Stop fetching a partition. If the broker's session holds it, the next request forgets it.
    pub fn remove_partition(&mut self, slot: Slot) -> Result<TopicPartition, FetcherError> {
        let p = self
            .partition_mut(slot)
            .ok_or(FetcherError::NoSuchSlot(slot))?;
        let tp = p.tp.clone();
        if p.in_session.is_some() {
            p.removed = true;
            self.removed += 1;
            self.touch(slot);
        } else {
            self.drop_slot(slot);
        }
        Ok(tp)
    }

    fn drop_slot(&mut self, slot: Slot) {
        let Some(p) = self.slots.get_mut(slot.0 as usize).and_then(Option::take) else {
            return;
        };
        self.by_name.remove(&(p.topic_name.clone(), p.tp.partition));
        self.by_id.remove(&(p.topic_id, p.tp.partition));
        self.order.remove(&p.order_key);
        if let Some(group) = self.topic_groups.get_mut(&p.topic_name) {
            group.1 -= 1;
            if group.1 == 0 {
                self.topic_groups.remove(&p.topic_name);
            }
        }
        self.nil_ids.remove(&slot);
        if p.removed {
            self.removed -= 1;
        }
        if p.in_session.is_some() {
            self.in_session -= 1;
        }
        // A stale `touched` or `backoffs` entry for the slot only costs a look: a partition
        // added to the slot later is touched itself.
        self.free.push(slot.0);
    }

    fn partition(&self, slot: Slot) -> Option<&Partition> {
        self.slots
            .get(slot.0 as usize)?
            .as_ref()
            .filter(|p| !p.removed)
    }

    fn partition_mut(&mut self, slot: Slot) -> Option<&mut Partition> {
        self.slots
            .get_mut(slot.0 as usize)?
            .as_mut()
            .filter(|p| !p.removed)
    }

    pub fn topic_partition(&self, slot: Slot) -> Option<&TopicPartition> {
        self.partition(slot).map(|p| &p.tp)
    }

    pub fn state(&self, slot: Slot) -> Option<PartitionState> {
        self.partition(slot).map(|p| p.state)
    }

    pub fn fetch_offset(&self, slot: Slot) -> Option<Offset> {
        self.partition(slot).map(|p| p.fetch_offset)
    }

    /// Last known (high watermark, last stable offset, log start) of the source partition.
    pub fn watermarks(&self, slot: Slot) -> Option<(Offset, Offset, Offset)> {
        self.partition(slot)
            .map(|p| (p.high_watermark, p.last_stable_offset, p.log_start_offset))
    }

    /// Whether one more partition may be added (`FETCHER_PARTITIONS_MAX`, partitions still to
    /// be forgotten included).
    pub fn has_room(&self) -> bool {
        self.by_name.len() < FETCHER_PARTITIONS_MAX
    }

    pub fn partitions(&self) -> usize {
        self.order.len()
    }

    /// Partitions fetched here: `partitions` but those removed and not yet forgotten.
    pub fn live_partitions(&self) -> usize {
        self.order.len() - self.removed
    }

    /// The broker's fetch session, if one is open: (id, next epoch).
    pub fn session(&self) -> Option<(i32, i32)> {
        match self.session {
            Session::Open { id, epoch } => Some((id, epoch)),
            _ => None,
        }
    }

    pub fn pause(&mut self, slot: Slot) -> Result<(), FetcherError> {
        let p = self
            .partition_mut(slot)
            .ok_or(FetcherError::NoSuchSlot(slot))?;
        if p.state == PartitionState::Fetching {
            p.state = PartitionState::Paused;
        }
        self.touch(slot);
        Ok(())
    }

    pub fn resume(&mut self, slot: Slot) -> Result<(), FetcherError> {
        let p = self
            .partition_mut(slot)
            .ok_or(FetcherError::NoSuchSlot(slot))?;
        if p.state == PartitionState::Paused {
            p.state = PartitionState::Fetching;
        }
        self.touch(slot);
        Ok(())
    }

    /// The append of records this fetcher handed out failed and was rolled back (a full disk):
    /// fetch them again from `log_end` (the log's end, with `last_epoch` its newest epoch)
    /// after a backoff that grows with each failure in a row, so a full disk is retried
    /// slowly and mirroring resumes by itself once there is space.
    pub fn rewind(
        &mut self,
        slot: Slot,
        log_end: Offset,
        last_epoch: LeaderEpoch,
        now: Instant,
    ) -> Result<(), FetcherError> {
        let in_flight = self.pending.is_some();
        let p = self
            .partition_mut(slot)
            .ok_or(FetcherError::NoSuchSlot(slot))?;
        p.fetch_offset = log_end;
        p.log_end = log_end;
        p.last_fetched_epoch = last_epoch;
        p.append_failures = p.append_failures.saturating_add(1);
        // The shard sends the next fetch before the previous response's writes complete, so
        // the request in flight may already ask for the offsets after the rolled-back ones.
        let skip = in_flight && !p.skip_in_flight_answer;
        p.skip_in_flight_answer |= skip;
        // The backoff was reset by the response that brought the records; replay the streak.
        p.backoff.succeed();
        for _ in 0..p.append_failures {
            p.backoff.fail(now);
        }
        if skip {
            self.skip_answers.push(slot);
        }
        self.touch(slot);
        Ok(())
    }

    /// The records handed out were appended: a full-disk streak (see `rewind`) is over.
    pub fn appended(&mut self, slot: Slot) {
        if let Some(p) = self.partition_mut(slot) {
            p.append_failures = 0;
        }
    }

    /// New leader epoch from metadata for a partition this broker still leads. On sources
    /// without Fetch v12 an epoch change triggers an OffsetForLeaderEpoch check first.
    /// A changed topic id means the source topic was deleted and recreated: the partition is
    /// reported as diverged (our data belongs to a topic that no longer exists there).
    pub fn update_leader(
        &mut self,
        slot: Slot,
        topic_id: Uuid,
        leader_epoch: LeaderEpoch,
        events: &mut Vec<FetchEvent>,
    ) -> Result<(), FetcherError> {
        let has_divergence = self.versions.fetch_has_divergence();
        let p = self
            .partition_mut(slot)
            .ok_or(FetcherError::NoSuchSlot(slot))?;
        if matches!(p.state, PartitionState::Diverged | PartitionState::Failed) {
            return Ok(());
        }
        if !p.topic_id.is_nil() && !topic_id.is_nil() && p.topic_id != topic_id {
            p.state = PartitionState::Diverged;
            events.push(FetchEvent::Diverged(Divergence {
                slot,
                fetch_offset: p.fetch_offset,
                last_fetched_epoch: p.last_fetched_epoch,
                cause: DivergenceCause::TopicIdChanged {
                    old: p.topic_id,
                    new: topic_id,
                },
            }));
            self.touch(slot);
            return Ok(());
        }
        let epoch_changed = leader_epoch != p.current_leader_epoch;
        p.current_leader_epoch = leader_epoch;
        if p.topic_id.is_nil() && !topic_id.is_nil() {
            p.topic_id = topic_id;
            let key = (topic_id, p.tp.partition);
            self.by_id.insert(key, slot);
            self.nil_ids.remove(&slot);
        }
        let p = self.partition_mut(slot).expect("checked above");
        if matches!(
            p.state,
            PartitionState::AwaitingLeader | PartitionState::Fetching
        ) {
            p.state = if epoch_changed && !has_divergence && p.last_fetched_epoch.is_known() {
                PartitionState::AwaitingEpochCheck
            } else {
                PartitionState::Fetching
            };
        }
        p.backoff.succeed();
        self.touch(slot);
        Ok(())
    }

    /// The socket broke: forget what was in flight and the session, back off.
    pub fn connection_lost(&mut self, now: Instant) {
        self.conn.reset();
        self.pending = None;
        self.answer = None;
        self.reset_session(None);
        self.backoff.fail(now);
    }

    fn reset_session(&mut self, close: Option<i32>) {
        if self.session != Session::None {
            self.session = Session::Opening { close };
        }
        for p in self.slots.iter_mut().flatten() {
            p.in_session = None;
        }
        self.in_session = 0;
        // Removed partitions were only kept to be forgotten; a new session never had them.
        let removed: Vec<Slot> = self
            .order
            .values()
            .copied()
            .filter(|s| self.slots[s.0 as usize].as_ref().is_some_and(|p| p.removed))
            .collect();
        for slot in removed {
            self.drop_slot(slot);
        }
    }

    /// When something can happen next without new input, or what to send now.
    pub fn poll_request(&mut self, out: &mut BytesMut, now: Instant) -> Result<Poll, FetcherError> {
        if self.pending.is_some() {
            return Ok(Poll::AwaitingResponse);
        }
        let mut not_before = self.conn.throttled_until(now);
        if let Some(t) = self.backoff.pending(now) {
            not_before = Some(not_before.map_or(t, |n| n.max(t)));
        }
        if let Some(t) = self.cap.as_ref().and_then(|c| c.ready_at(now)) {
            not_before = Some(not_before.map_or(t, |n| n.max(t)));
        }
        if let Some(t) = not_before {
            return Ok(Poll::NotBefore(t));
        }
        if let Some(sent) = self.send_list_offsets(out)? {
            return Ok(Poll::Sent(sent));
        }
        if let Some(sent) = self.send_epoch_check(out)? {
            return Ok(Poll::Sent(sent));
        }
        if let Some(sent) = self.send_fetch(out, now)? {
            return Ok(Poll::Sent(sent));
        }
        // Nothing due now: report the earliest partition backoff, if any.
        Ok(self
            .earliest_backoff(now)
            .map_or(Poll::Idle, Poll::NotBefore))
    }

    /// The earliest backoff still ahead of `now` among fetching partitions, dropping the
    /// deadline entries that no longer match their partition's backoff.
    fn earliest_backoff(&mut self, now: Instant) -> Option<Instant> {
        let mut stale = Vec::new();
        let mut earliest = None;
        for &(t, slot) in &self.backoffs {
            if t <= now {
                continue; // due: `send_fetch` touches it
            }
            let p = self.slots.get(slot.0 as usize).and_then(Option::as_ref);
            match p {
                Some(p) if p.backoff.until() == Some(t) => {
                    if !p.removed && p.state == PartitionState::Fetching {
                        earliest = Some(t);
                        break;
                    }
                }
                _ => stale.push((t, slot)),
            }
        }
        for entry in stale {
            self.backoffs.remove(&entry);
        }
        earliest
    }

    /// Touches every partition whose backoff deadline has come.
    fn touch_due_backoffs(&mut self, now: Instant) {
        while let Some(&(t, slot)) = self.backoffs.first() {
            if t > now {
                break;
            }
            self.backoffs.pop_first();
            if let Some(p) = self.slots.get_mut(slot.0 as usize).and_then(Option::as_mut) {
                if !p.touched {
                    p.touched = true;
                    self.touched.push(slot);
                }
            }
        }
    }

    fn fetch_version(&self, now: Instant) -> i16 {
        // As Kafka's consumer does: fetch by topic id only when every partition has one.
        let all_ids = !self.nil_ids.iter().any(|s| {
            self.slots[s.0 as usize]
                .as_ref()
                .is_some_and(|p| p.fetchable(now) || p.in_session.is_some())
        });
        if self.versions.fetch_uses_topic_ids() && !all_ids {
            12
        } else {
            self.versions.fetch
        }
    }

    fn send_fetch(
        &mut self,
        out: &mut BytesMut,
        now: Instant,
    ) -> Result<Option<InFlight>, FetcherError> {
        let version = self.fetch_version(now);
        if self.session_version.is_some_and(|v| v != version) && self.session != Session::None {
            // A session must not mix name- and id-based versions (the broker answers
            // FETCH_SESSION_TOPIC_ID_ERROR even to a close), so the old session is left to
            // expire and a new one is opened.
            self.reset_session(None);
        }
        let (session_id, session_epoch, full) = match self.session {
            Session::None => (0, -1, true),
            Session::Opening { close } => (close.unwrap_or(0), 0, true),
            Session::Open { id, epoch } => (id, epoch, false),
        };
        let by_id = version >= 13;
        let send_epochs = version >= 9;
        let send_last_fetched = version >= 12;
        let partition_max_bytes = clamp_i32(self.config.partition_max_bytes);

        for mut t in self.request.topics.drain(..) {
            t.partitions.clear();
            self.spare_topics.push(t);
        }
        self.request.forgotten_topics_data.clear();
        let mut any_partition = false;
        let mut any_forgotten = false;
        let mut forgotten_removed = Vec::new();
        // Which partitions to look at (see "Work per request"): all of them for a full
        // request, else those touched since the last request.
        self.touch_due_backoffs(now);
        let mut visit = std::mem::take(&mut self.visit);
        visit.clear();
        if full {
            visit.extend(self.order.values().copied());
            for slot in self.touched.drain(..) {
                if let Some(p) = self.slots.get_mut(slot.0 as usize).and_then(Option::as_mut) {
                    p.touched = false;
                }
            }
        } else {
            for slot in self.touched.drain(..) {
                if let Some(p) = self.slots.get_mut(slot.0 as usize).and_then(Option::as_mut) {
                    if p.touched {
                        p.touched = false;
                        visit.push(slot);
                    }
                }
            }
            let slots = &self.slots;
            let key = |s: &Slot| slots[s.0 as usize].as_ref().map(|p| p.order_key);
            visit.sort_unstable_by_key(key);
        }
        for &slot in &visit {
            let Some(p) = self.slots[slot.0 as usize].as_mut() else {
                continue;
            };
            let entry = p.session_entry(send_epochs, send_last_fetched);
            if p.fetchable(now) {
                if full || p.in_session != Some(entry) {
                    let topics = &mut self.request.topics;
                    let same_topic = topics.last().is_some_and(|t| {
                        if by_id {
                            t.topic_id == p.topic_id
                        } else {
                            t.topic == p.topic_name
                        }
                    });
                    if !same_topic {
                        let mut t = self.spare_topics.pop().unwrap_or_default();
                        t.topic = if by_id {
                            TopicName::default()
                        } else {
                            p.topic_name.clone()
                        };
                        t.topic_id = if by_id { p.topic_id } else { Uuid::nil() };
                        topics.push(t);
                    }
                    let mut fp = FetchPartition::default();
                    fp.partition = p.tp.partition;
                    fp.current_leader_epoch = entry.current_leader_epoch.0;
                    fp.fetch_offset = entry.fetch_offset.0;
                    fp.last_fetched_epoch = entry.last_fetched_epoch.0;
                    fp.partition_max_bytes = partition_max_bytes;
                    topics.last_mut().expect("pushed above").partitions.push(fp);
                    any_partition = true;
                }
                if session_epoch >= 0 {
                    if p.in_session.is_none() {
                        self.in_session += 1;
                    }
                    p.in_session = Some(entry);
                }
                continue;
            }
            let was_in_session = p.in_session.take().is_some();
            if was_in_session {
                self.in_session -= 1;
            }
            if was_in_session && !full {
                let forgotten = &mut self.request.forgotten_topics_data;
                let same_topic = forgotten.last().is_some_and(|t| {
                    if by_id {
                        t.topic_id == p.topic_id
                    } else {
                        t.topic == p.topic_name
                    }
                });
                if !same_topic {
                    let mut t = ForgottenTopic::default();
                    t.topic = if by_id {
                        TopicName::default()
                    } else {
                        p.topic_name.clone()
                    };
                    t.topic_id = if by_id { p.topic_id } else { Uuid::nil() };
                    forgotten.push(t);
                }
                forgotten
                    .last_mut()
                    .expect("pushed above")
                    .partitions
                    .push(p.tp.partition);
                any_forgotten = true;
                if p.removed {
                    forgotten_removed.push(slot);
                }
            }
        }
        self.visit = visit;
        for slot in forgotten_removed {
            self.drop_slot(slot);
        }
        let session_has_partitions = self.in_session > 0;
        let session_polls = matches!(self.session, Session::Open { .. }) && session_has_partitions;
        if !(any_partition || any_forgotten || session_polls) {
            return Ok(None);
        }
        self.request.session_id = session_id;
        self.request.session_epoch = session_epoch;
        let sent = self.conn.encode(out, version, &self.request)?;
        if full {
            self.requests.full += 1;
        } else {
            self.requests.incremental += 1;
        }
        self.session_version = Some(version);
        self.pending = Some(Pending::Fetch {
            version,
            full,
            session_id,
        });
        Ok(Some(sent))
    }

    fn send_list_offsets(&mut self, out: &mut BytesMut) -> Result<Option<InFlight>, FetcherError> {
        if !self.want_list_offsets {
            return Ok(None);
        }
        let version = self.versions.list_offsets;
        let mut req = ListOffsetsRequest::default();
        req.replica_id = BrokerId(-1);
        for &slot in self.order.values() {
            let Some(p) = self.slots[slot.0 as usize].as_ref() else {
                continue;
            };
            if p.removed || p.state != PartitionState::AwaitingLogStart {
                continue;
            }
            if req.topics.last().is_none_or(|t| t.name != p.topic_name) {
                req.topics
                    .push(ListOffsetsTopic::default().with_name(p.topic_name.clone()));
            }
            let mut lp = ListOffsetsPartition::default();
            lp.partition_index = p.tp.partition;
            lp.current_leader_epoch = if version >= 4 {
                p.current_leader_epoch.0
            } else {
                -1
            };
            lp.timestamp = -2; // EARLIEST
            req.topics
                .last_mut()
                .expect("pushed above")
                .partitions
                .push(lp);
        }
        if req.topics.is_empty() {
            self.want_list_offsets = false;
            return Ok(None);
        }
        let sent = self.conn.encode(out, version, &req)?;
        self.pending = Some(Pending::ListOffsets { version });
        Ok(Some(sent))
    }

    fn send_epoch_check(&mut self, out: &mut BytesMut) -> Result<Option<InFlight>, FetcherError> {
        if !self.want_epoch_check {
            return Ok(None);
        }
        let version = self.versions.offset_for_leader_epoch;
        let mut req = OffsetForLeaderEpochRequest::default();
        if version >= 3 {
            req.replica_id = BrokerId(-1);
        }
        for &slot in self.order.values() {
            let Some(p) = self.slots[slot.0 as usize].as_ref() else {
                continue;
            };
            if p.removed || p.state != PartitionState::AwaitingEpochCheck {
                continue;
            }
            if req.topics.last().is_none_or(|t| t.topic != p.topic_name) {
                req.topics
                    .push(OffsetForLeaderTopic::default().with_topic(p.topic_name.clone()));
            }
            let mut op = OffsetForLeaderPartition::default();
            op.partition = p.tp.partition;
            op.current_leader_epoch = p.current_leader_epoch.0;
            op.leader_epoch = p.last_fetched_epoch.0;
            req.topics
                .last_mut()
                .expect("pushed above")
                .partitions
                .push(op);
        }
        if req.topics.is_empty() {
            self.want_epoch_check = false;
            return Ok(None);
        }
        let sent = self.conn.encode(out, version, &req)?;
        self.pending = Some(Pending::EpochCheck { version });
        Ok(Some(sent))
    }

    /// Handle one response frame (a body from `wire::frame::split_frame`).
    ///
    /// A response that cannot be decoded fails the request (event `RequestFailed`, backoff,
    /// full fetch next); a connection-level error (poison) is returned, and the driver must
    /// reconnect and call `connection_lost`.
    pub fn handle_response(
        &mut self,
        frame: Bytes,
        now: Instant,
        events: &mut Vec<FetchEvent>,
    ) -> Result<(), FetcherError> {
        // Partitions rewound while this response's request was in flight skip their answer in
        // it, and only in it.
        let skipped = std::mem::take(&mut self.skip_answers);
        let handled = self.handle_response_frame(frame, now, events);
        for slot in skipped {
            if let Some(p) = self.partition_mut(slot) {
                p.skip_in_flight_answer = false;
            }
        }
        handled
    }

    fn handle_response_frame(
        &mut self,
        frame: Bytes,
        now: Instant,
        events: &mut Vec<FetchEvent>,
    ) -> Result<(), FetcherError> {
        if let Some(Pending::Fetch { .. }) = self.pending {
            let whole_len = frame.len();
            return self.read_fetch_answer(&frame, whole_len, true, now, events);
        }
        let Some(pending) = self.pending.take() else {
            return Err(ConnError::UnexpectedResponse.into());
        };
        let result = match pending {
            Pending::Fetch { .. } => unreachable!("read above"),
            Pending::ListOffsets { version } => {
                let (_, body) = self.conn.accept::<ListOffsetsRequest>(frame)?;
                crate::wire::frame::decode_response_body::<ListOffsetsRequest>(body, version)
                    .map(|resp| self.on_list_offsets(resp, version, now, events))
            }
            Pending::EpochCheck { version } => {
                let (_, body) = self.conn.accept::<OffsetForLeaderEpochRequest>(frame)?;
                crate::wire::frame::decode_response_body::<OffsetForLeaderEpochRequest>(
                    body, version,
                )
                .map(|resp| self.on_epoch_check(resp, version, now, events))
            }
        };
        if let Err(e) = result {
            self.request_failed(e.to_string(), now, events);
        }
        Ok(())
    }

    fn request_failed(&mut self, error: String, now: Instant, events: &mut Vec<FetchEvent>) {
        let close = match self.session {
            Session::Open { id, .. } => Some(id),
            _ => None,
        };
        self.reset_session(close);
        self.backoff.fail(now);
        events.push(FetchEvent::RequestFailed { error });
    }

    fn throttle(&mut self, throttle_ms: i32, now: Instant) {
        if throttle_ms > 0 {
            let ms = (throttle_ms as u64).min(SOURCE_THROTTLE_MS_MAX);
            self.conn.throttle(now + Duration::from_millis(ms));
            self.conn.record_throttle(ms);
        }
    }

    /// Fetch requests sent so far, full and incremental.
    pub fn fetch_requests(&self) -> FetchRequestCounts {
        self.requests
    }

    /// Every throttle the source asked for on this fetcher's connection, summed, in ms.
    pub fn throttled_ms_total(&self) -> u64 {
        self.conn.throttled_ms_total()
    }

    /// The slot `tp` was added at, removed-but-not-yet-forgotten slots included.
    pub fn slot_of(&self, tp: &TopicPartition) -> Option<Slot> {
        self.by_name.get(&(topic_name(tp), tp.partition)).copied()
    }

    fn lookup(&self, by_id: bool, name: &TopicName, id: Uuid, partition: i32) -> Option<Slot> {
        let slot = if by_id {
            self.by_id.get(&(id, partition))
        } else {
            self.by_name.get(&(name.clone(), partition))
        };
        slot.copied().filter(|s| self.partition(*s).is_some())
    }

    /// The fields before a Fetch response's topics: throttle, errors, the session. Whether the
    /// partitions that follow are to be read (not after a response-level error).
    #[allow(clippy::too_many_arguments)]
    fn on_fetch_head(
        &mut self,
        throttle_time_ms: i32,
        error_code: i16,
        session_id: i32,
        version: i16,
        full: bool,
        sent_session_id: i32,
        now: Instant,
        events: &mut Vec<FetchEvent>,
    ) -> bool {
        if version >= 8 {
            self.throttle(throttle_time_ms, now);
        }
        if error_code != 0 {
            let code = error_code;
            // An unknown session or one fetched with mixed topic identification cannot be
            // closed by id; a wrong epoch can (Kafka's client does the same).
            let close = if code == ResponseError::InvalidFetchSessionEpoch.code() {
                Some(sent_session_id).filter(|id| *id != 0)
            } else {
                None
            };
            self.reset_session(close);
            // Session errors are answered by a full fetch at once; anything else backs off.
            let session_error = code == ResponseError::FetchSessionIdNotFound.code()
                || code == ResponseError::InvalidFetchSessionEpoch.code()
                || code == ResponseError::FetchSessionTopicIdError.code();
            if !session_error {
                self.backoff.fail(now);
            }
            events.push(FetchEvent::RequestFailed {
                error: format!("fetch error code {code}"),
            });
            return false;
        }
        self.backoff.succeed();
        self.session = match self.session {
            Session::None => Session::None,
            Session::Opening { .. } if session_id != 0 => Session::Open {
                id: session_id,
                epoch: 1,
            },
            // The broker did not grant a session (cache full): keep asking with full fetches.
            Session::Opening { .. } => Session::Opening { close: None },
            // The broker answered without the session: it closes a session whose last
            // partitions were just forgotten (a mirror paused whole). Without this the next
            // request, after a resume, would name a session the broker no longer has.
            Session::Open { .. } if session_id == 0 => Session::Opening { close: None },
            Session::Open { id, epoch } => {
                debug_assert!(!full);
                Session::Open {
                    id,
                    epoch: if epoch == i32::MAX { 1 } else { epoch + 1 },
                }
            }
        };
        if matches!(self.session, Session::Opening { .. }) {
            // Nothing is in a session now (removed partitions included, which were only kept
            // to be forgotten).
            self.reset_session(None);
        }
        true
    }

    fn on_partition(
        &mut self,
        slot: Slot,
        pd: kafka_protocol::messages::fetch_response::PartitionData,
        now: Instant,
        events: &mut Vec<FetchEvent>,
    ) {
        let p = self.slots[slot.0 as usize].as_mut().expect("looked up");
        if p.state != PartitionState::Fetching || p.skip_in_flight_answer {
            return;
        }
        let code = pd.error_code;
        if code != 0 {
            on_partition_error(slot, p, code, &pd, now, events);
            return;
        }
        if pd.diverging_epoch.epoch >= 0 || pd.diverging_epoch.end_offset >= 0 {
            p.state = PartitionState::Diverged;
            events.push(FetchEvent::Diverged(Divergence {
                slot,
                fetch_offset: p.fetch_offset,
                last_fetched_epoch: p.last_fetched_epoch,
                cause: DivergenceCause::EpochEnd {
                    epoch: LeaderEpoch(pd.diverging_epoch.epoch),
                    end_offset: Offset(pd.diverging_epoch.end_offset),
                },
            }));
            return;
        }
        let old = (p.high_watermark, p.last_stable_offset, p.log_start_offset);
        p.high_watermark = Offset(pd.high_watermark);
        if pd.last_stable_offset >= 0 {
            p.last_stable_offset = Offset(pd.last_stable_offset);
        }
        if pd.log_start_offset >= 0 {
            p.log_start_offset = Offset(pd.log_start_offset);
        }
        let records = pd.records.unwrap_or_default();
        let checked = response::check_records(
            &records,
            Position {
                fetch_offset: p.fetch_offset,
                log_end: p.log_end,
                last_epoch: p.last_fetched_epoch,
            },
        );
        // Reported with the first response that shows where the source's data now begins
        // (records, or none at all); a response rejected whole reports it with the next one.
        let shows_start = checked.valid.is_some() || checked.error.is_none();
        if let Some(from) = p.log_start_moved_from.filter(|_| shows_start) {
            p.log_start_moved_from = None;
            // The first batch may begin below the source's log start (DeleteRecords can cut
            // inside a batch); like a Kafka follower, the log then continues at that batch.
            let to = checked
                .valid
                .as_ref()
                .map_or(p.fetch_offset, |v| v.first_offset.min(p.fetch_offset));
            tracing::warn!(
                partition = %p.tp, local_log_end = from.0, source_log_start = to.0,
                skipped = to.0 - from.0,
                "the source's retention passed our log end: offsets {}..{} are gone at the \
                 source; every local batch is kept and mirroring continues at {} (an offset \
                 gap in the mirrored log)", from.0, to.0, to.0
            );
            events.push(FetchEvent::LogStartMoved { slot, from, to });
        }
        if let Some(valid) = &checked.valid {
            p.fetch_offset = valid.last_offset.next();
            p.log_end = p.fetch_offset;
            if valid.last_epoch.is_known() {
                p.last_fetched_epoch = valid.last_epoch;
            }
            p.backoff.succeed();
            if checked.error.is_none() {
                p.bad_records_streak = 0;
            }
            events.push(FetchEvent::Records(FetchedRecords {
                slot,
                // `check_records` ran `Batch::validate` on every batch of the valid range.
                records: ValidatedBatches::already_validated(records.slice(valid.bytes.clone())),
                first_offset: valid.first_offset,
                last_offset: valid.last_offset,
                max_timestamp: valid.max_timestamp,
                last_epoch: valid.last_epoch,
                batches: valid.batches,
                high_watermark: p.high_watermark,
                log_start_offset: p.log_start_offset,
                last_stable_offset: p.last_stable_offset,
            }));
        } else if old != (p.high_watermark, p.last_stable_offset, p.log_start_offset) {
            events.push(FetchEvent::Watermarks {
                slot,
                high_watermark: p.high_watermark,
                last_stable_offset: p.last_stable_offset,
                log_start_offset: p.log_start_offset,
            });
        }
        if let Some(error) = checked.error {
            // Bytes that fail their CRC or framing may be a transient fault: retry a few times.
            // The same fault every time, or offsets or epochs that contradict our log, will
            // not heal by themselves: stop.
            p.bad_records_streak = p.bad_records_streak.saturating_add(1);
            let retrying =
                error.may_heal_on_refetch() && p.bad_records_streak <= FETCH_BAD_RECORDS_RETRIES;
            if retrying {
                p.backoff.fail(now);
            } else {
                p.state = PartitionState::Failed;
            }
            events.push(FetchEvent::BadRecords {
                slot,
                error,
                retrying,
            });
        }
    }

    fn on_list_offsets(
        &mut self,
        resp: ListOffsetsResponse,
        version: i16,
        now: Instant,
        events: &mut Vec<FetchEvent>,
    ) {
        if version >= 3 {
            self.throttle(resp.throttle_time_ms, now);
        }
        self.backoff.succeed();
        let mut answered = Vec::new();
        for topic in resp.topics {
            for lp in topic.partitions {
                let Some(slot) = self.lookup(false, &topic.name, Uuid::nil(), lp.partition_index)
                else {
                    continue;
                };
                answered.push(slot);
                let p = self.slots[slot.0 as usize].as_mut().expect("looked up");
                if p.state != PartitionState::AwaitingLogStart {
                    continue;
                }
                if lp.error_code != 0 {
                    on_leader_error(slot, p, lp.error_code, None, now, events);
                    continue;
                }
                let source_start = Offset(lp.offset);
                if source_start > p.fetch_offset {
                    let from = p.fetch_offset;
                    // Reported with the first response from the new position, which tells
                    // whether the log restarts at the source's log start or at the base of the
                    // batch containing it.
                    p.fetch_offset = source_start;
                    p.log_start_offset = source_start;
                    p.log_start_moved_from = Some(from);
                    // Unlike a Kafka follower, the local log is not emptied: it keeps every
                    // batch and continues at the source's log start, leaving an offset gap.
                    // `log_end` stays, so a batch overlapping what we hold is still refused.
                    p.state = PartitionState::Fetching;
                } else {
                    p.state = PartitionState::Diverged;
                    events.push(FetchEvent::Diverged(Divergence {
                        slot,
                        fetch_offset: p.fetch_offset,
                        last_fetched_epoch: p.last_fetched_epoch,
                        cause: DivergenceCause::BeyondSourceEnd {
                            source_log_start: source_start,
                        },
                    }));
                }
            }
        }
        for slot in answered {
            self.touch(slot);
        }
    }

    fn on_epoch_check(
        &mut self,
        resp: OffsetForLeaderEpochResponse,
        version: i16,
        now: Instant,
        events: &mut Vec<FetchEvent>,
    ) {
        if version >= 3 {
            self.throttle(resp.throttle_time_ms, now);
        }
        self.backoff.succeed();
        let mut answered = Vec::new();
        for topic in resp.topics {
            for ep in topic.partitions {
                let Some(slot) = self.lookup(false, &topic.topic, Uuid::nil(), ep.partition) else {
                    continue;
                };
                answered.push(slot);
                let p = self.slots[slot.0 as usize].as_mut().expect("looked up");
                if p.state != PartitionState::AwaitingEpochCheck {
                    continue;
                }
                if ep.error_code != 0 {
                    on_leader_error(slot, p, ep.error_code, None, now, events);
                    continue;
                }
                // The same test the leader applies for Fetch v12+ DivergingEpoch. An undefined
                // answer (-1, -1: the leader keeps no epochs, e.g. old message format) cannot
                // prove divergence; fetching resumes.
                let (epoch, end) = (LeaderEpoch(ep.leader_epoch), Offset(ep.end_offset));
                let undefined = end.0 < 0;
                if !undefined && (epoch < p.last_fetched_epoch || end < p.fetch_offset) {
                    p.state = PartitionState::Diverged;
                    events.push(FetchEvent::Diverged(Divergence {
                        slot,
                        fetch_offset: p.fetch_offset,
                        last_fetched_epoch: p.last_fetched_epoch,
                        cause: DivergenceCause::EpochEnd {
                            epoch,
                            end_offset: end,
                        },
                    }));
                } else {
                    p.state = PartitionState::Fetching;
                }
            }
        }
        for slot in answered {
            self.touch(slot);
        }
    }
}

fn on_leader_error(
    slot: Slot,
    p: &mut Partition,
    code: i16,
    hint: Option<(i32, LeaderEpoch)>,
    now: Instant,
    events: &mut Vec<FetchEvent>,
) {
    if is_leader_error(code) {
        p.state = PartitionState::AwaitingLeader;
        events.push(FetchEvent::RefreshMetadata {
            slot,
            error: code,
            hint,
        });
    } else {
        p.backoff.fail(now);
        events.push(FetchEvent::PartitionError { slot, error: code });
    }
}

fn on_partition_error(
    slot: Slot,
    p: &mut Partition,
    code: i16,
    pd: &kafka_protocol::messages::fetch_response::PartitionData,
    now: Instant,
    events: &mut Vec<FetchEvent>,
) {
    if code == ResponseError::OffsetOutOfRange.code() {
        p.state = PartitionState::AwaitingLogStart;
        return;
    }
    let hint = (pd.current_leader.leader_id.0 >= 0).then_some((
        pd.current_leader.leader_id.0,
        LeaderEpoch(pd.current_leader.leader_epoch),
    ));
    on_leader_error(slot, p, code, hint, now, events);
}

/// Partition errors that mean "the leader or the topic changed; ask metadata again".
fn is_leader_error(code: i16) -> bool {
    [
        ResponseError::NotLeaderOrFollower,
        ResponseError::FencedLeaderEpoch,
        ResponseError::UnknownLeaderEpoch,
        ResponseError::UnknownTopicOrPartition,
        ResponseError::UnknownTopicId,
        ResponseError::InconsistentTopicId,
        ResponseError::LeaderNotAvailable,
        ResponseError::ReplicaNotAvailable,
        ResponseError::KafkaStorageError,
        ResponseError::OffsetNotAvailable,
    ]
    .iter()
    .any(|e| e.code() == code)
}
