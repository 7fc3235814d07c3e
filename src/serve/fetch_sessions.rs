//! Incremental fetch sessions (KIP-227) for the endpoint's consumers: the session cache and
//! the rules that turn a Fetch request into the list of partitions to read, and a read's
//! results into what the response carries. No I/O and an explicit clock (`now_ms`), so every
//! rule is tested here; `serve::fetch` does the reading and `FetchSessions` shares one cache
//! between connection threads.
//!
//! A broker's rules, as clients expect them:
//! - epoch 0 (INITIAL) is a full fetch: a session it names is closed, and a new one is created
//!   (non-zero id, next epoch 1) if a slot is free or one can be evicted; otherwise id 0.
//! - epoch -1 (FINAL) is a full fetch that closes the named session and creates none.
//! - any other epoch is incremental: the session must exist (FETCH_SESSION_ID_NOT_FOUND) and
//!   expect this epoch (INVALID_FETCH_SESSION_EPOCH); the request's partitions are added or
//!   update the cached ones, forgotten topics are dropped (by name before Fetch v13, by topic
//!   id from v13), and the fetch reads every partition of the session. The response carries
//!   only partitions with records, an error or diverging epoch, or a high watermark, log start
//!   or last stable offset the client has not been told yet.
//!
//! Kafka's broker compares only the high watermark and log start. kmirror compares the last
//! stable offset too: otherwise a read_committed consumer would not hear that an open
//! transaction ended (its position and lag follow the last stable offset) until a record
//! arrives; the extra partitions cost a few bytes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::FetchRequest;
use rand::Rng;

use crate::ids::Offset;
use crate::limits::{
    SERVE_FETCH_SESSIONS_MAX, SERVE_FETCH_SESSION_EVICTION_MS, SERVE_FETCH_SESSION_PARTITIONS_MAX,
};

pub const INVALID_FETCH_SESSION_EPOCH: i16 = 71;
pub const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
pub const FETCH_SESSION_TOPIC_ID_ERROR: i16 = 106;

/// Session epoch of a full fetch that opens a session.
pub const INITIAL_EPOCH: i32 = 0;
/// Session epoch of a full fetch that closes the session and opens none.
pub const FINAL_EPOCH: i32 = -1;
/// Session id meaning "no session".
pub const NO_SESSION: i32 = 0;

/// First Fetch version with session fields.
const FIRST_SESSION_VERSION: i16 = 7;
/// First Fetch version naming topics by id.
const FIRST_TOPIC_ID_VERSION: i16 = 13;

/// How a request names a topic: by name before Fetch v13, by id from v13.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TopicKey {
    Name(String),
    Id(uuid::Uuid),
}

/// One partition to read, with the client's parameters for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    pub topic: TopicKey,
    pub partition: WantedPartition,
}

/// The fields of a Fetch request's partition that reading it uses, named as in the request.
/// A plain copy: an incremental fetch lists every partition of its session (thousands for a
/// mirror or a large consumer), and cloning and dropping the protocol type, with its map of
/// tagged fields, per partition per request was a visible share of the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WantedPartition {
    pub partition: i32,
    pub current_leader_epoch: i32,
    pub fetch_offset: i64,
    pub last_fetched_epoch: i32,
    pub partition_max_bytes: i32,
}

impl From<&FetchPartition> for WantedPartition {
    fn from(p: &FetchPartition) -> WantedPartition {
        WantedPartition {
            partition: p.partition,
            current_leader_epoch: p.current_leader_epoch,
            fetch_offset: p.fetch_offset,
            last_fetched_epoch: p.last_fetched_epoch,
            partition_max_bytes: p.partition_max_bytes,
        }
    }
}

/// What reading one partition gave, as far as sessions care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub high_watermark: Offset,
    pub log_start: Offset,
    pub last_stable: Offset,
    /// Records were read: always sent.
    pub records: bool,
    /// An error code or a diverging epoch: always sent.
    pub error: bool,
}

/// What to do with one Fetch request.
#[derive(Debug, Clone, PartialEq)]
pub enum Context {
    /// Read the request's partitions, answer them all with session id 0.
    Sessionless(Vec<Wanted>),
    /// Read the request's partitions, answer them all, then `finish_full` (a new session).
    Full(Vec<Wanted>),
    /// Read every partition of session `id` (in this order), then `finish_incremental` with
    /// `epoch` (the epoch the session now expects next).
    Incremental {
        id: i32,
        epoch: i32,
        wanted: Vec<Wanted>,
    },
    /// Answer only this top-level error, with session id 0 and no partitions.
    Error(i16),
}

/// A partition the session holds: the client's last parameters and what it was last told.
#[derive(Debug, Clone)]
struct Cached {
    wanted: Wanted,
    high_watermark: Offset,
    log_start: Offset,
    last_stable: Offset,
}

impl Cached {
    /// Kafka's rule for leaving a partition out, plus the last stable offset (module comment);
    /// remembers what the client is told. After an error the high watermark is forgotten, so
    /// the partition is sent again once the error clears.
    fn must_respond(&mut self, o: &Outcome) -> bool {
        let changed = o.high_watermark != self.high_watermark
            || o.log_start != self.log_start
            || o.last_stable != self.last_stable;
        self.high_watermark = o.high_watermark;
        self.log_start = o.log_start;
        self.last_stable = o.last_stable;
        if o.error {
            self.high_watermark = Offset(-1);
        }
        changed || o.records || o.error
    }
}

/// A partition's key in a session: its topic (name or id, as the session's version names
/// topics) and index.
type PartitionKey = (TopicKey, i32);

/// What a session holds, laid out so that a request costs hash work only for the partitions
/// it names: a mirror or a consumer with thousands of partitions names the few whose offsets
/// moved, while every fetch reads (and reorders) all of them.
#[derive(Debug)]
struct Session {
    epoch: i32,
    uses_topic_ids: bool,
    /// The partitions, in no particular order (`order` is the read order); a slot moves only
    /// when a partition before it is forgotten.
    slots: Vec<Cached>,
    /// Where each partition is in `slots`. Kept across requests: rebuilding it per request
    /// was most of the session work at 4,096 partitions (benches/RESULTS.md, session 24).
    at: HashMap<PartitionKey, usize>,
    /// Slots in the order they are read: partitions that were sent move to the end, so a
    /// response cut short by max_bytes starts with the others next time.
    order: Vec<usize>,
    created_ms: u64,
    last_used_ms: u64,
}

impl Session {
    /// A session with no partitions yet, opened by a full fetch at `now_ms`.
    fn new(uses_topic_ids: bool, now_ms: u64) -> Session {
        Session {
            epoch: next_epoch(INITIAL_EPOCH),
            uses_topic_ids,
            slots: Vec::new(),
            at: HashMap::new(),
            order: Vec::new(),
            created_ms: now_ms,
            last_used_ms: now_ms,
        }
    }

    /// Adds a partition the request names, or updates its parameters; returns its slot.
    fn name(&mut self, w: Wanted) -> usize {
        let key = (w.topic.clone(), w.partition.partition);
        match self.at.get(&key) {
            Some(&i) => {
                self.slots[i].wanted = w;
                i
            }
            None => {
                let i = self.slots.len();
                self.at.insert(key, i);
                self.order.push(i);
                self.slots.push(Cached {
                    wanted: w,
                    high_watermark: Offset(-1),
                    log_start: Offset(-1),
                    last_stable: Offset(-1),
                });
                i
            }
        }
    }

    /// Drops the partitions of `forgotten`; one pass over the session whatever their number.
    fn forget(&mut self, forgotten: &[PartitionKey]) {
        let mut gone = vec![false; self.slots.len()];
        let mut any = false;
        for key in forgotten {
            if let Some(i) = self.at.remove(key) {
                gone[i] = true;
                any = true;
            }
        }
        if !any {
            return;
        }
        // Old slot -> new slot, for the ones that stay.
        let mut moved = vec![usize::MAX; self.slots.len()];
        let mut next = 0;
        for (i, g) in gone.iter().enumerate() {
            if !g {
                moved[i] = next;
                next += 1;
            }
        }
        let mut i = 0;
        self.slots.retain(|_| {
            i += 1;
            !gone[i - 1]
        });
        for slot in self.at.values_mut() {
            *slot = moved[*slot];
        }
        self.order.retain(|&s| !gone[s]);
        for slot in &mut self.order {
            *slot = moved[*slot];
        }
        debug_assert_eq!(self.slots.len(), self.at.len());
        debug_assert_eq!(self.slots.len(), self.order.len());
    }
}

/// Counters of what the cache did, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCounts {
    pub created: u64,
    pub evicted: u64,
    pub closed: u64,
    pub incremental_fetches: u64,
}

/// The sessions of every client of the endpoint, bounded in number.
#[derive(Debug)]
pub struct SessionCache {
    sessions: HashMap<i32, Session>,
    max_sessions: usize,
    eviction_ms: u64,
    max_partitions: usize,
    counts: SessionCounts,
}

/// The epoch after `epoch`; epochs wrap to 1, since 0 and -1 mean full fetches.
pub fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

fn key_of(version: i16, name: &str, id: uuid::Uuid) -> TopicKey {
    if version >= FIRST_TOPIC_ID_VERSION {
        TopicKey::Id(id)
    } else {
        TopicKey::Name(name.to_string())
    }
}

/// The partitions a request names, in request order.
pub fn requested(version: i16, request: &FetchRequest) -> Vec<Wanted> {
    let mut out = Vec::new();
    for t in &request.topics {
        let topic = key_of(version, &t.topic.0, t.topic_id);
        for p in &t.partitions {
            out.push(Wanted {
                topic: topic.clone(),
                partition: WantedPartition::from(p),
            });
        }
    }
    out
}

impl SessionCache {
    pub fn new(max_sessions: usize, eviction_ms: u64, max_partitions: usize) -> SessionCache {
        SessionCache {
            sessions: HashMap::new(),
            max_sessions,
            eviction_ms,
            max_partitions,
            counts: SessionCounts::default(),
        }
    }

    /// Sessions held now.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    pub fn counts(&self) -> SessionCounts {
        self.counts
    }

    /// Partitions held by all sessions.
    pub fn partitions(&self) -> usize {
        self.sessions.values().map(|s| s.slots.len()).sum()
    }

    /// Applies the request's session fields: closes, checks or updates the named session and
    /// says what to read.
    pub fn begin(&mut self, version: i16, request: &FetchRequest, now_ms: u64) -> Context {
        if version < FIRST_SESSION_VERSION {
            return Context::Sessionless(requested(version, request));
        }
        let (id, epoch) = (request.session_id, request.session_epoch);
        if epoch == INITIAL_EPOCH || epoch == FINAL_EPOCH {
            if id != NO_SESSION && self.sessions.remove(&id).is_some() {
                self.counts.closed += 1;
            }
            let wanted = requested(version, request);
            return if epoch == FINAL_EPOCH {
                Context::Sessionless(wanted)
            } else {
                Context::Full(wanted)
            };
        }
        let max_partitions = self.max_partitions;
        let Some(session) = self.sessions.get_mut(&id) else {
            return Context::Error(FETCH_SESSION_ID_NOT_FOUND);
        };
        if session.epoch != epoch {
            return Context::Error(INVALID_FETCH_SESSION_EPOCH);
        }
        if session.uses_topic_ids != (version >= FIRST_TOPIC_ID_VERSION) {
            return Context::Error(FETCH_SESSION_TOPIC_ID_ERROR);
        }
        // One hash lookup per named partition: a session may hold thousands and this runs
        // under the cache's lock.
        for w in requested(version, request) {
            session.name(w);
        }
        let forgotten: Vec<PartitionKey> = request
            .forgotten_topics_data
            .iter()
            .flat_map(|f| {
                let topic = key_of(version, &f.topic.0, f.topic_id);
                f.partitions.iter().map(move |&p| (topic.clone(), p))
            })
            .collect();
        session.forget(&forgotten);
        if session.slots.len() > max_partitions {
            self.sessions.remove(&id);
            self.counts.closed += 1;
            return Context::Error(FETCH_SESSION_ID_NOT_FOUND);
        }
        if session.slots.is_empty() {
            // Nothing left to follow: the session ends, as a broker ends it.
            self.sessions.remove(&id);
            self.counts.closed += 1;
            return Context::Sessionless(requested(version, request));
        }
        session.epoch = next_epoch(epoch);
        session.last_used_ms = now_ms;
        Context::Incremental {
            id,
            epoch: session.epoch,
            wanted: session
                .order
                .iter()
                .map(|&i| session.slots[i].wanted.clone())
                .collect(),
        }
    }

    /// After a full fetch (`Context::Full`) was read: creates its session from what the client
    /// was told, if there is a slot, and returns its id (0 when none was created).
    pub fn finish_full(
        &mut self,
        version: i16,
        wanted: &[Wanted],
        outcomes: &[Outcome],
        now_ms: u64,
    ) -> i32 {
        let mut session = Session::new(version >= FIRST_TOPIC_ID_VERSION, now_ms);
        for (w, o) in wanted.iter().zip(outcomes) {
            // A partition named twice keeps its last parameters and what it was last told
            // (`must_respond` overwrites all of that), as a map would.
            let i = session.name(w.clone());
            session.slots[i].must_respond(o);
        }
        let size = session.slots.len();
        if size == 0 || size > self.max_partitions {
            return NO_SESSION;
        }
        if self.sessions.len() >= self.max_sessions && !self.evict_for(size, now_ms) {
            return NO_SESSION;
        }
        let id = self.new_id();
        self.sessions.insert(id, session);
        self.counts.created += 1;
        id
    }

    /// After an incremental fetch (`Context::Incremental`) was read, `outcomes` in the order
    /// of its `wanted`: which partitions the response keeps. An error when the session ended
    /// or moved on meanwhile (another request with the same epoch, or a full fetch closing it).
    pub fn finish_incremental(
        &mut self,
        id: i32,
        epoch: i32,
        outcomes: &[Outcome],
    ) -> Result<Vec<bool>, i16> {
        let Some(session) = self.sessions.get_mut(&id) else {
            return Err(FETCH_SESSION_ID_NOT_FOUND);
        };
        // Same epoch means nothing changed the session since `begin`, so the outcomes line up.
        if session.epoch != epoch || session.order.len() != outcomes.len() {
            return Err(INVALID_FETCH_SESSION_EPOCH);
        }
        let keep: Vec<bool> = session
            .order
            .iter()
            .zip(outcomes)
            .map(|(&i, o)| session.slots[i].must_respond(o))
            .collect();
        // Sent partitions move to the end, each group keeping its order.
        let mut order = Vec::with_capacity(session.order.len());
        order.extend(
            session
                .order
                .iter()
                .zip(&keep)
                .filter(|(_, k)| !**k)
                .map(|(&i, _)| i),
        );
        order.extend(
            session
                .order
                .iter()
                .zip(&keep)
                .filter(|(_, k)| **k)
                .map(|(&i, _)| i),
        );
        session.order = order;
        self.counts.incremental_fetches += 1;
        Ok(keep)
    }

    /// Frees a slot for a new session of `size` partitions, as Kafka does: the least recently
    /// used session if it has been idle past the eviction time, else the smallest session
    /// older than the eviction time if the new one has more partitions.
    fn evict_for(&mut self, size: usize, now_ms: u64) -> bool {
        let idle = self
            .sessions
            .iter()
            .min_by_key(|(id, s)| (s.last_used_ms, **id))
            .map(|(id, s)| (*id, s.last_used_ms));
        let victim = match idle {
            Some((id, used)) if now_ms.saturating_sub(used) > self.eviction_ms => Some(id),
            _ => self
                .sessions
                .iter()
                .filter(|(_, s)| now_ms.saturating_sub(s.created_ms) > self.eviction_ms)
                .min_by_key(|(id, s)| (s.slots.len(), **id))
                .filter(|(_, s)| s.slots.len() < size)
                .map(|(id, _)| *id),
        };
        match victim {
            Some(id) => {
                self.sessions.remove(&id);
                self.counts.evicted += 1;
                true
            }
            None => false,
        }
    }

    /// A random positive id no session has: ids are not guessable, so one client cannot
    /// easily step on another's session.
    fn new_id(&self) -> i32 {
        let mut rng = rand::thread_rng();
        loop {
            let id = rng.gen_range(1..=i32::MAX);
            if !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }
}

/// The endpoint's one session cache, shared by its connection threads (a session is not tied
/// to a connection). The mutex guards map work only: `FetchApi` takes it once before reading
/// and once after, never across the long-poll wait or a file read. Counters are mirrored into
/// atomics after each change, so `/metrics` reads them without the lock.
#[derive(Debug)]
pub struct FetchSessions {
    cache: Mutex<SessionCache>,
    started: Instant,
    sessions: AtomicU64,
    created: AtomicU64,
    evicted: AtomicU64,
    closed: AtomicU64,
    incremental_fetches: AtomicU64,
}

/// What `/metrics` shows of the sessions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub sessions: u64,
    pub counts: SessionCounts,
}

impl FetchSessions {
    /// A cache with kmirror's bounds (`SERVE_FETCH_SESSIONS_MAX` and friends).
    pub fn new() -> Arc<FetchSessions> {
        Arc::new(FetchSessions::with_cache(SessionCache::new(
            SERVE_FETCH_SESSIONS_MAX,
            SERVE_FETCH_SESSION_EVICTION_MS,
            SERVE_FETCH_SESSION_PARTITIONS_MAX,
        )))
    }

    pub fn with_cache(cache: SessionCache) -> FetchSessions {
        FetchSessions {
            cache: Mutex::new(cache),
            started: Instant::now(),
            sessions: AtomicU64::new(0),
            created: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            incremental_fetches: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Runs `f` on the cache and publishes the counters it changed.
    fn with<T>(&self, f: impl FnOnce(&mut SessionCache, u64) -> T) -> T {
        let now = self.now_ms();
        // A thread that panicked while holding the lock left a consistent map (every change is
        // a single insert, remove or field write), so a poisoned lock is still usable.
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let out = f(&mut cache, now);
        let c = cache.counts();
        self.sessions.store(cache.len() as u64, Ordering::Relaxed);
        self.created.store(c.created, Ordering::Relaxed);
        self.evicted.store(c.evicted, Ordering::Relaxed);
        self.closed.store(c.closed, Ordering::Relaxed);
        self.incremental_fetches
            .store(c.incremental_fetches, Ordering::Relaxed);
        out
    }

    pub fn begin(&self, version: i16, request: &FetchRequest) -> Context {
        self.with(|c, now| c.begin(version, request, now))
    }

    pub fn finish_full(&self, version: i16, wanted: &[Wanted], outcomes: &[Outcome]) -> i32 {
        self.with(|c, now| c.finish_full(version, wanted, outcomes, now))
    }

    pub fn finish_incremental(
        &self,
        id: i32,
        epoch: i32,
        outcomes: &[Outcome],
    ) -> Result<Vec<bool>, i16> {
        self.with(|c, _| c.finish_incremental(id, epoch, outcomes))
    }

    /// The published counters (no lock).
    pub fn stats(&self) -> SessionStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SessionStats {
            sessions: load(&self.sessions),
            counts: SessionCounts {
                created: load(&self.created),
                evicted: load(&self.evicted),
                closed: load(&self.closed),
                incremental_fetches: load(&self.incremental_fetches),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_request::{FetchTopic, ForgottenTopic};
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;

    const EVICT: u64 = 1_000;

    fn cache(max: usize) -> SessionCache {
        SessionCache::new(max, EVICT, 100)
    }

    fn part(p: i32, offset: i64) -> FetchPartition {
        let mut fp = FetchPartition::default();
        fp.partition = p;
        fp.fetch_offset = offset;
        fp.partition_max_bytes = 1 << 20;
        fp
    }

    fn topic_id(name: &str) -> uuid::Uuid {
        uuid::Uuid::from_u128(name.bytes().map(u128::from).sum::<u128>() + 1)
    }

    fn topic(version: i16, name: &str, parts: &[(i32, i64)]) -> FetchTopic {
        let mut t = FetchTopic::default();
        if version >= 13 {
            t.topic_id = topic_id(name);
        } else {
            t.topic = TopicName(StrBytes::from_string(name.to_string()));
        }
        t.partitions = parts.iter().map(|&(p, o)| part(p, o)).collect();
        t
    }

    fn forget(version: i16, name: &str, parts: &[i32]) -> ForgottenTopic {
        let mut f = ForgottenTopic::default();
        if version >= 13 {
            f.topic_id = topic_id(name);
        } else {
            f.topic = TopicName(StrBytes::from_string(name.to_string()));
        }
        f.partitions = parts.to_vec();
        f
    }

    fn req(id: i32, epoch: i32, topics: Vec<FetchTopic>) -> FetchRequest {
        let mut r = FetchRequest::default();
        r.session_id = id;
        r.session_epoch = epoch;
        r.topics = topics;
        r
    }

    fn key(version: i16, name: &str) -> TopicKey {
        if version >= 13 {
            TopicKey::Id(topic_id(name))
        } else {
            TopicKey::Name(name.into())
        }
    }

    fn out(hw: i64, error: bool) -> Outcome {
        Outcome {
            high_watermark: Offset(hw),
            log_start: Offset(0),
            last_stable: Offset(hw),
            records: false,
            error,
        }
    }

    fn with_records(hw: i64) -> Outcome {
        Outcome {
            records: true,
            ..out(hw, false)
        }
    }

    /// A session over `t` partitions 0..n, created by a full fetch at `now`; returns its id.
    fn open(c: &mut SessionCache, version: i16, n: i32, now: u64) -> i32 {
        let parts: Vec<(i32, i64)> = (0..n).map(|p| (p, 0)).collect();
        let r = req(0, INITIAL_EPOCH, vec![topic(version, "t", &parts)]);
        let Context::Full(wanted) = c.begin(version, &r, now) else {
            panic!("not a full fetch")
        };
        let outcomes: Vec<Outcome> = wanted.iter().map(|_| out(10, false)).collect();
        c.finish_full(version, &wanted, &outcomes, now)
    }

    fn incremental(c: &mut SessionCache, version: i16, r: &FetchRequest) -> (i32, Vec<Wanted>) {
        match c.begin(version, r, 5) {
            Context::Incremental { epoch, wanted, .. } => (epoch, wanted),
            other => panic!("not incremental: {other:?}"),
        }
    }

    // Goal: a full fetch with epoch 0 opens a session with a non-zero id whose next epoch is
    // 1; an incremental fetch with that epoch reads every partition of the session and moves
    // the epoch on; ids are unique.
    #[test]
    fn full_fetch_opens_a_session_and_incremental_fetches_follow_it() {
        let mut c = cache(10);
        let id = open(&mut c, 12, 3, 0);
        assert_ne!(id, NO_SESSION);
        assert_eq!((c.len(), c.partitions(), c.counts().created), (1, 3, 1));
        let (epoch, wanted) = incremental(&mut c, 12, &req(id, 1, vec![]));
        assert_eq!(epoch, 2);
        let parts: Vec<i32> = wanted.iter().map(|w| w.partition.partition).collect();
        assert_eq!(parts, vec![0, 1, 2]);
        assert!(wanted.iter().all(|w| w.topic == key(12, "t")));
        c.finish_incremental(id, epoch, &[out(10, false); 3])
            .unwrap();
        assert_eq!(c.counts().incremental_fetches, 1);
        let (epoch, _) = incremental(&mut c, 12, &req(id, 2, vec![]));
        assert_eq!(epoch, 3);
        let other = open(&mut c, 12, 1, 0);
        assert!(other != NO_SESSION && other != id);
        assert_eq!(next_epoch(i32::MAX), 1);
    }

    // Goal: session errors: an unknown id → FETCH_SESSION_ID_NOT_FOUND; a wrong epoch (old,
    // replayed, or ahead) → INVALID_FETCH_SESSION_EPOCH and the session is left as it was;
    // a session opened by names used by a topic-id version (or the reverse) →
    // FETCH_SESSION_TOPIC_ID_ERROR; Fetch before v7 never has a session.
    #[test]
    fn unknown_ids_and_wrong_epochs_are_refused() {
        let mut c = cache(10);
        assert_eq!(
            c.begin(12, &req(12345, 1, vec![]), 0),
            Context::Error(FETCH_SESSION_ID_NOT_FOUND)
        );
        let id = open(&mut c, 12, 2, 0);
        for wrong in [2, 7, i32::MAX] {
            assert_eq!(
                c.begin(12, &req(id, wrong, vec![]), 0),
                Context::Error(INVALID_FETCH_SESSION_EPOCH),
                "epoch {wrong}"
            );
        }
        let (epoch, _) = incremental(&mut c, 12, &req(id, 1, vec![]));
        // The same request again (a duplicate) has a stale epoch now.
        assert_eq!(
            c.begin(12, &req(id, 1, vec![]), 0),
            Context::Error(INVALID_FETCH_SESSION_EPOCH)
        );
        assert_eq!(
            c.begin(13, &req(id, epoch, vec![]), 0),
            Context::Error(FETCH_SESSION_TOPIC_ID_ERROR)
        );
        let v13 = open(&mut c, 13, 1, 0);
        assert_eq!(
            c.begin(12, &req(v13, 1, vec![]), 0),
            Context::Error(FETCH_SESSION_TOPIC_ID_ERROR)
        );
        let old = req(id, epoch, vec![topic(6, "t", &[(0, 0)])]);
        assert!(matches!(c.begin(6, &old, 0), Context::Sessionless(w) if w.len() == 1));
    }

    // Goal: epoch -1 closes the named session and reads the request without opening one;
    // epoch 0 naming a session closes it and opens a fresh one; the old id is gone after both.
    #[test]
    fn final_epoch_closes_and_initial_epoch_replaces() {
        let mut c = cache(10);
        let id = open(&mut c, 12, 2, 0);
        let r = req(id, FINAL_EPOCH, vec![topic(12, "t", &[(0, 4)])]);
        match c.begin(12, &r, 0) {
            Context::Sessionless(w) => assert_eq!(w[0].partition.fetch_offset, 4),
            other => panic!("{other:?}"),
        }
        assert!(c.is_empty());
        assert_eq!(c.counts().closed, 1);
        assert_eq!(
            c.begin(12, &req(id, 1, vec![]), 0),
            Context::Error(FETCH_SESSION_ID_NOT_FOUND)
        );
        let id = open(&mut c, 12, 2, 0);
        let r = req(id, INITIAL_EPOCH, vec![topic(12, "t", &[(0, 0)])]);
        let Context::Full(wanted) = c.begin(12, &r, 0) else {
            panic!("not full")
        };
        assert!(
            c.is_empty(),
            "the named session is closed by the full fetch"
        );
        let new = c.finish_full(12, &wanted, &[out(10, false)], 0);
        assert!(new != NO_SESSION && new != id);
        assert_eq!(c.len(), 1);
    }

    // Goal: an incremental request's partitions update cached ones (new fetch offset) or are
    // added; forgotten topics drop partitions, by name before v13 and by topic id from v13;
    // forgetting everything ends the session (answered without one).
    #[test]
    fn incremental_requests_add_update_and_forget_partitions() {
        for version in [12, 13] {
            let mut c = cache(10);
            let id = open(&mut c, version, 3, 0);
            let mut r = req(
                id,
                1,
                vec![
                    topic(version, "t", &[(1, 40)]),
                    topic(version, "u", &[(0, 7)]),
                ],
            );
            r.forgotten_topics_data = vec![forget(version, "t", &[0]), forget(version, "x", &[2])];
            let (epoch, wanted) = incremental(&mut c, version, &r);
            let got: Vec<(TopicKey, i32, i64)> = wanted
                .iter()
                .map(|w| {
                    (
                        w.topic.clone(),
                        w.partition.partition,
                        w.partition.fetch_offset,
                    )
                })
                .collect();
            assert_eq!(
                got,
                vec![
                    (key(version, "t"), 1, 40),
                    (key(version, "t"), 2, 0),
                    (key(version, "u"), 0, 7),
                ],
                "v{version}"
            );
            c.finish_incremental(id, epoch, &[out(10, false); 3])
                .unwrap();
            let mut r = req(id, epoch, vec![]);
            r.forgotten_topics_data =
                vec![forget(version, "t", &[1, 2]), forget(version, "u", &[0])];
            assert_eq!(c.begin(version, &r, 0), Context::Sessionless(vec![]));
            assert!(c.is_empty(), "v{version}");
        }
    }

    // Goal: the response of an incremental fetch keeps only partitions with records, errors,
    // or a changed high watermark, log start or last stable offset; an error forgets the high
    // watermark so the partition is sent again after it clears; sent partitions move to the
    // end of the session's read order.
    #[test]
    fn incremental_responses_carry_only_what_changed() {
        let mut c = cache(10);
        let id = open(&mut c, 12, 6, 0); // every partition told hw 10, lso 10, log start 0
        let (epoch, _) = incremental(&mut c, 12, &req(id, 1, vec![]));
        let mut lso_moved = out(10, false);
        lso_moved.last_stable = Offset(8);
        let mut start_moved = out(10, false);
        start_moved.log_start = Offset(3);
        let first = [
            out(10, false),
            out(10, true),
            out(11, false),
            lso_moved,
            start_moved,
            with_records(10),
        ];
        let keep = c.finish_incremental(id, epoch, &first).unwrap();
        assert_eq!(keep, vec![false, true, true, true, true, true]);
        let (epoch, wanted) = incremental(&mut c, 12, &req(id, epoch, vec![]));
        let order: Vec<i32> = wanted.iter().map(|w| w.partition.partition).collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4, 5]);
        // Nothing changed: nothing sent, except partition 1 whose error cleared (records
        // alone do not make a partition be sent again).
        let same = [
            out(10, false),
            out(10, false),
            out(11, false),
            lso_moved,
            start_moved,
            out(10, false),
        ];
        let keep = c.finish_incremental(id, epoch, &same).unwrap();
        assert_eq!(keep, vec![false, true, false, false, false, false]);
        let (_, wanted) = incremental(&mut c, 12, &req(id, epoch, vec![]));
        let order: Vec<i32> = wanted.iter().map(|w| w.partition.partition).collect();
        assert_eq!(
            order,
            vec![0, 2, 3, 4, 5, 1],
            "the sent partition goes last"
        );
    }

    // Goal: a session that moved on between begin and finish (a duplicate request with the
    // same epoch got in first, or a full fetch closed it) fails the later finish.
    #[test]
    fn finish_refuses_a_session_that_moved_on() {
        let mut c = cache(10);
        let id = open(&mut c, 12, 1, 0);
        let (epoch, _) = incremental(&mut c, 12, &req(id, 1, vec![]));
        let (later, _) = incremental(&mut c, 12, &req(id, epoch, vec![]));
        assert_eq!(
            c.finish_incremental(id, epoch, &[out(10, false)]),
            Err(INVALID_FETCH_SESSION_EPOCH)
        );
        assert!(c.finish_incremental(id, later, &[out(10, false)]).is_ok());
        c.begin(12, &req(id, FINAL_EPOCH, vec![]), 0);
        assert_eq!(
            c.finish_incremental(id, later, &[out(10, false)]),
            Err(FETCH_SESSION_ID_NOT_FOUND)
        );
    }

    // Goal: the cache is bounded: when full, a new full fetch evicts a session idle past the
    // eviction time; otherwise it may evict the smallest session older than the eviction time
    // only if it has more partitions; otherwise it gets id 0 (no session).
    #[test]
    fn full_cache_evicts_idle_or_smaller_old_sessions_or_gives_no_session() {
        let mut c = cache(2);
        let a = open(&mut c, 12, 2, 0);
        let b = open(&mut c, 12, 2, 0);
        assert_eq!(
            open(&mut c, 12, 5, 10),
            NO_SESSION,
            "full, nothing evictable"
        );
        // Keep b busy; a goes idle past the eviction time.
        let (epoch, _) = incremental(&mut c, 12, &req(b, 1, vec![]));
        c.finish_incremental(b, epoch, &[out(10, false); 2])
            .unwrap();
        c.begin(12, &req(b, epoch, vec![]), EVICT); // b used at EVICT
        let d = open(&mut c, 12, 1, EVICT + 1);
        assert_ne!(d, NO_SESSION);
        assert_eq!(c.counts().evicted, 1);
        assert_eq!(
            c.begin(12, &req(a, 1, vec![]), 0),
            Context::Error(FETCH_SESSION_ID_NOT_FOUND),
            "the idle session was evicted"
        );
        // Full again (b and d, both recently used). Only b is older than the eviction time;
        // with 2 partitions it gives way to a 3-partition session, not to a 1-partition one.
        assert_eq!(open(&mut c, 12, 1, EVICT + 2), NO_SESSION);
        let e = open(&mut c, 12, 3, EVICT + 3);
        assert_ne!(e, NO_SESSION);
        assert_eq!(c.counts().evicted, 2);
        assert_eq!(c.len(), 2);
        assert!(matches!(
            c.begin(12, &req(d, 1, vec![]), EVICT + 4),
            Context::Incremental { .. }
        ));
    }

    // Goal: the partition bound: a full fetch with more partitions than a session may hold
    // gets no session, and an incremental fetch growing a session past it closes the session.
    #[test]
    fn sessions_are_bounded_in_partitions() {
        let mut c = SessionCache::new(10, EVICT, 3);
        assert_eq!(open(&mut c, 12, 4, 0), NO_SESSION);
        let id = open(&mut c, 12, 3, 0);
        assert_ne!(id, NO_SESSION);
        let r = req(id, 1, vec![topic(12, "u", &[(0, 0)])]);
        assert_eq!(
            c.begin(12, &r, 0),
            Context::Error(FETCH_SESSION_ID_NOT_FOUND)
        );
        assert!(c.is_empty());
    }

    // Goal: the session's layout (slots, a kept index, a read order) behaves exactly like the
    // plain list it replaced: for any run of incremental requests that name, update and forget
    // partitions of two topics, with any outcomes, every fetch reads the same partitions with
    // the same parameters in the same order, and the responses keep the same ones. Method: a
    // reference model (one Vec in read order: a named partition updated in place or pushed,
    // forgotten ones retained out, sent ones moved to the end) run side by side with the cache.
    proptest::proptest! {
        #[test]
        fn the_session_reads_and_orders_partitions_as_a_plain_list_would(
            version in proptest::sample::select(vec![12i16, 13]),
            steps in proptest::collection::vec(
                (
                    proptest::collection::vec((0usize..2, 0i32..12, 0i64..50), 0..6),
                    proptest::collection::vec((0usize..2, 0i32..12), 0..4),
                    proptest::collection::vec((0i64..3, proptest::bool::ANY), 40),
                ),
                1..25,
            ),
        ) {
            let names = ["a", "b"];
            let mut c = SessionCache::new(4, EVICT, 1_000);
            let id = open(&mut c, version, 6, 0);
            // The model: (topic, partition, fetch offset, last high watermark told), in order;
            // topic 2 is the session's first topic, "t" (`open`), which no step names.
            let mut model: Vec<(usize, i32, i64, i64)> = (0..6).map(|p| (2, p, 0, 10)).collect();
            let mut epoch = 1;
            for (named, forgotten, outs) in steps {
                let mut topics = Vec::new();
                for (t, name) in names.iter().enumerate() {
                    let parts: Vec<(i32, i64)> = named
                        .iter()
                        .filter(|(nt, _, _)| *nt == t)
                        .map(|&(_, p, o)| (p, o))
                        .collect();
                    if !parts.is_empty() {
                        topics.push(topic(version, name, &parts));
                    }
                    for &(p, o) in &parts {
                        match model.iter_mut().find(|m| m.0 == t && m.1 == p) {
                            Some(m) => m.2 = o,
                            None => model.push((t, p, o, -1)),
                        }
                    }
                }
                let mut r = req(id, epoch, topics);
                for (t, name) in names.iter().enumerate() {
                    let parts: Vec<i32> = forgotten
                        .iter()
                        .filter(|(ft, _)| *ft == t)
                        .map(|&(_, p)| p)
                        .collect();
                    if !parts.is_empty() {
                        r.forgotten_topics_data.push(forget(version, name, &parts));
                        model.retain(|m| !(m.0 == t && parts.contains(&m.1)));
                    }
                }
                let ctx = c.begin(version, &r, 5);
                if model.is_empty() {
                    // The session ended with its last partition, as a broker ends it.
                    proptest::prop_assert!(matches!(ctx, Context::Sessionless(_)));
                    return Ok(());
                }
                let Context::Incremental { epoch: next, wanted, .. } = ctx else {
                    panic!("not incremental: {ctx:?}");
                };
                let read: Vec<(TopicKey, i32, i64)> = wanted
                    .iter()
                    .map(|w| (w.topic.clone(), w.partition.partition, w.partition.fetch_offset))
                    .collect();
                let topic_key = |t: usize| key(version, names.get(t).copied().unwrap_or("t"));
                let expected: Vec<(TopicKey, i32, i64)> =
                    model.iter().map(|m| (topic_key(m.0), m.1, m.2)).collect();
                proptest::prop_assert_eq!(&read, &expected);
                let outcomes: Vec<Outcome> = (0..wanted.len())
                    .map(|i| {
                        let (hw, records) = outs[i % outs.len()];
                        Outcome { records, ..out(10 + hw, false) }
                    })
                    .collect();
                let keep = c.finish_incremental(id, next, &outcomes).expect("same epoch");
                let expected_keep: Vec<bool> = model
                    .iter_mut()
                    .zip(&outcomes)
                    .map(|(m, o)| {
                        let k = o.records || o.high_watermark.0 != m.3;
                        m.3 = o.high_watermark.0;
                        k
                    })
                    .collect();
                proptest::prop_assert_eq!(&keep, &expected_keep);
                let (sent, rest): (Vec<_>, Vec<_>) =
                    model.iter().zip(&keep).partition(|(_, k)| **k);
                model = rest.into_iter().chain(sent).map(|(m, _)| *m).collect();
                proptest::prop_assert_eq!(c.partitions(), model.len());
                epoch = next;
            }
        }
    }
}
