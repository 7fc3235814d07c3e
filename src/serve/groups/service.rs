//! The group coordinator plugged into the Kafka endpoint: the I/O around the sans-IO
//! `GroupCoordinator`.
//!
//! Handlers run on the endpoint's bounded pool of blocking threads, so a JoinGroup or SyncGroup
//! that must wait for the rest of its group waits on its pool thread: it parks the request in
//! the coordinator under a fresh token and sleeps on a condition variable (which releases the
//! coordinator mutex) until the answer for that token comes out, after another member's request
//! or a timer tick. Nothing sleeps while holding the mutex, and every request holds it for one
//! call only. These waits are not bounded apart from the pool (Fetch long polls are:
//! `serve::fetch_park`), so enough members joining slow groups at once can occupy the pool.
//!
//! A timer thread (`group-timer`) ticks the coordinator at its next deadline, so sessions expire
//! and join rounds end while no request arrives. It waits on the same condition variable, so a
//! request that creates an earlier deadline (a new group's join round) wakes it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{
    ApiKey, DescribeGroupsRequest, FindCoordinatorRequest, HeartbeatRequest, JoinGroupRequest,
    LeaveGroupRequest, ListGroupsRequest, OffsetCommitRequest, OffsetFetchRequest,
    SyncGroupRequest, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use kafka_protocol::ResponseError;

use crate::ids::{ProducerId, TopicPartition};
use crate::limits::{
    GROUP_CLOSE_WAIT_MS, GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT, GROUP_PARK_MAX_MS,
    GROUP_TIMER_MAX_SLEEP_MS,
};
use crate::log::read_view::ReadCatalog;
use crate::serve::authz::group_checks as authz;
use crate::serve::authz::GROUP_AUTHORIZATION_FAILED;
use crate::serve::dispatch::{ApiHandler, Dispatcher, Outcome, Request};
use crate::serve::groups::coordinator::{
    join_error, sync_error, ClientInfo, CoordinatorConfig, Deferred, GroupCoordinator,
};
use crate::serve::groups::group::Waiter;
use crate::serve::groups::offsets::{OffsetStoreError, OffsetsLog};
use crate::serve::groups::versions::GROUP_APIS;
use crate::serve::groups::SharedCoordinator;
use crate::serve::txn::TxnOffsets;
use crate::serve::ServeError;

/// Why the group service could not start.
#[derive(Debug, thiserror::Error)]
pub enum GroupServiceError {
    #[error("opening __consumer_offsets-0: {0}")]
    Store(#[from] OffsetStoreError),
    #[error("starting the group timer thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// The process's coordinator as the endpoint's connection threads, its timer and the control
/// thread's group-offset sync share it.
pub struct GroupService {
    coordinator: SharedCoordinator,
    /// Signalled after every change that may have answered a parked request or moved a
    /// deadline; waited on by parked requests and by the timer.
    changed: Condvar,
    /// Partitions that exist on kmirror (a commit for another one is refused).
    catalog: Arc<ReadCatalog>,
    next_token: AtomicU64,
    /// The coordinator's monotonic clock starts here.
    origin: Instant,
    stop: AtomicBool,
    timer: Mutex<Option<JoinHandle<()>>>,
    /// Each listener's address, for FindCoordinator (set by the endpoint once bound).
    advertised: std::sync::OnceLock<Arc<crate::serve::advertised::Advertised>>,
}

impl std::fmt::Debug for GroupService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupService").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GroupService {
    /// Opens `<data_dir>/__consumer_offsets-0` (replay and compaction) and starts the timer.
    /// The data dir's partitions must have been opened already without it (the log dir leaves
    /// it out), so that only the coordinator has it open.
    pub fn open(
        data_dir: &Path,
        catalog: Arc<ReadCatalog>,
    ) -> Result<Arc<GroupService>, GroupServiceError> {
        Self::open_with(data_dir, catalog, GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT)
    }

    /// `open` with another `group.initial.rebalance.delay.ms`.
    pub fn open_with(
        data_dir: &Path,
        catalog: Arc<ReadCatalog>,
        initial_rebalance_delay_ms: i64,
    ) -> Result<Arc<GroupService>, GroupServiceError> {
        let store = OffsetsLog::open(data_dir)?;
        // The address is set when the endpoint has bound (`register`).
        let mut config = CoordinatorConfig::new(crate::serve::NODE_ID, "", 0);
        config.initial_rebalance_delay_ms = initial_rebalance_delay_ms;
        let coordinator = GroupCoordinator::open(config, store)?;
        let service = Arc::new(GroupService {
            coordinator: Arc::new(Mutex::new(coordinator)),
            changed: Condvar::new(),
            catalog,
            next_token: AtomicU64::new(1),
            origin: Instant::now(),
            stop: AtomicBool::new(false),
            timer: Mutex::new(None),
            advertised: std::sync::OnceLock::new(),
        });
        let me = Arc::clone(&service);
        let timer = std::thread::Builder::new()
            .name("group-timer".into())
            .spawn(move || me.timer_loop())?;
        *lock(&service.timer) = Some(timer);
        Ok(service)
    }

    /// The coordinator, for the group-offset sync (which locks it per write).
    pub fn coordinator(&self) -> &SharedCoordinator {
        &self.coordinator
    }

    fn now_ms(&self) -> i64 {
        i64::try_from(self.origin.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    fn timer_loop(&self) {
        let mut c = lock(&self.coordinator);
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.now_ms();
            c.tick(now);
            if c.has_replies() {
                self.changed.notify_all();
            }
            let sleep = c.next_deadline().map_or(GROUP_TIMER_MAX_SLEEP_MS, |d| {
                u64::try_from(d.saturating_sub(now)).unwrap_or(0)
            });
            // At least 1 ms, so a deadline that `tick` cannot move never spins the thread.
            let sleep = sleep.clamp(1, GROUP_TIMER_MAX_SLEEP_MS);
            c = self
                .changed
                .wait_timeout(c, Duration::from_millis(sleep))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Registers every group API on the endpoint's dispatcher; `host:port` is where
    /// FindCoordinator sends clients (the endpoint itself).
    pub fn register(self: &Arc<Self>, d: &mut Dispatcher, host: &str, port: i32) {
        lock(&self.coordinator).set_address(host, port);
        for api in GROUP_APIS {
            d.register(
                api.key,
                api.min,
                api.max,
                Arc::new(GroupApi {
                    service: Arc::clone(self),
                }),
            );
        }
    }

    /// FindCoordinator then names the address of the listener each request came in on.
    pub fn advertise_per_listener(&self, advertised: Arc<crate::serve::advertised::Advertised>) {
        let _ = self.advertised.set(advertised);
    }

    /// Waits (with the lock released while asleep) until the parked request `token` has its
    /// answer; `None` when kmirror is stopping or the backstop ran out.
    fn wait_for(
        &self,
        mut c: MutexGuard<'_, GroupCoordinator<OffsetsLog>>,
        token: u64,
    ) -> Option<Deferred> {
        let give_up = Instant::now() + Duration::from_millis(GROUP_PARK_MAX_MS);
        loop {
            if let Some(d) = c.take_reply(token) {
                return Some(d);
            }
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() || self.stop.load(Ordering::Relaxed) {
                return None;
            }
            let nap = left.min(Duration::from_millis(GROUP_TIMER_MAX_SLEEP_MS));
            c = self
                .changed
                .wait_timeout(c, nap)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Stops the timer and wakes parked requests (they answer COORDINATOR_NOT_AVAILABLE), then
    /// closes `__consumer_offsets-0` cleanly once every other holder (connection threads, the
    /// group sync) has let go. If one still holds it after `GROUP_CLOSE_WAIT_MS`, the log is
    /// left as it is: every commit is already on the page cache, and the next start's replay
    /// recovers it like after `kill -9`.
    pub fn close(self: Arc<Self>) -> Result<(), OffsetStoreError> {
        self.stop.store(true, Ordering::Relaxed);
        self.changed.notify_all();
        if let Some(t) = lock(&self.timer).take() {
            let _ = t.join();
        }
        let deadline = Instant::now() + Duration::from_millis(GROUP_CLOSE_WAIT_MS);
        let mut service = self;
        let service = loop {
            match Arc::try_unwrap(service) {
                Ok(s) => break s,
                Err(still) if Instant::now() < deadline => {
                    service = still;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => {
                    tracing::warn!("group coordinator still in use at shutdown; __consumer_offsets-0 is recovered at the next start");
                    return Ok(());
                }
            }
        };
        let mut coordinator = service.coordinator;
        loop {
            match Arc::try_unwrap(coordinator) {
                Ok(m) => {
                    let c = m.into_inner().unwrap_or_else(|p| p.into_inner());
                    return c.into_store().close();
                }
                Err(still) if Instant::now() < deadline => {
                    coordinator = still;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => {
                    tracing::warn!("group coordinator still in use at shutdown; __consumer_offsets-0 is recovered at the next start");
                    return Ok(());
                }
            }
        }
    }
}

impl GroupService {
    /// TxnOffsetCommit for `producer`, whose transaction the caller has checked.
    pub fn txn_offset_commit(
        &self,
        producer: ProducerId,
        req: &TxnOffsetCommitRequest,
    ) -> TxnOffsetCommitResponse {
        let exists = |tp: &TopicPartition| self.catalog.get(tp).is_some();
        lock(&self.coordinator).txn_offset_commit(&exists, producer, req)
    }
}

impl TxnOffsets for GroupService {
    fn end_offsets(&self, producer: ProducerId, commit: bool) -> Result<(), String> {
        self.coordinator.end_offsets(producer, commit)
    }

    fn pending_producers(&self) -> Vec<ProducerId> {
        self.coordinator.pending_producers()
    }
}

/// The handler of every group API: decode, one coordinator call under the lock, encode.
struct GroupApi {
    service: Arc<GroupService>,
}

impl GroupApi {
    fn client(req: &Request) -> ClientInfo {
        ClientInfo {
            client_id: req
                .header
                .client_id
                .as_ref()
                .map(|c| c.to_string())
                .unwrap_or_default(),
            // Kafka shows a member's host as the address with a leading slash.
            host: req
                .peer()
                .map(|p| format!("/{}", p.ip()))
                .unwrap_or_default(),
        }
    }
}

impl ApiHandler for GroupApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let s = &self.service;
        let v = req.version;
        let check = |op, rtype, name: &str| req.authorized(op, rtype, name);
        match req.api_key {
            ApiKey::FindCoordinator => {
                let body: FindCoordinatorRequest = req.decode()?;
                let mut r = lock(&s.coordinator).find_coordinator(v, &body);
                if let Some(a) = s.advertised.get() {
                    let (host, port) = a.of(&req.session.listener);
                    crate::serve::advertised::point_coordinator_at(&mut r, host, port);
                }

                let keys: Vec<String> = if v >= 4 {
                    body.coordinator_keys
                        .iter()
                        .map(|k| k.to_string())
                        .collect()
                } else {
                    vec![body.key.to_string()]
                };
                authz::find_coordinator(&check, body.key_type, &keys, &mut r);
                Outcome::encode(req, &r)
            }
            ApiKey::JoinGroup => {
                let body: JoinGroupRequest = req.decode()?;
                if !authz::membership(&check, body.group_id.as_str()) {
                    let r = join_error(
                        v,
                        ResponseError::GroupAuthorizationFailed,
                        body.member_id.as_str(),
                    );
                    return Outcome::encode(req, &r);
                }
                let client = Self::client(req);
                let waiter = Waiter {
                    token: s.next_token.fetch_add(1, Ordering::Relaxed),
                    version: v,
                };
                let mut c = lock(&s.coordinator);
                let answered = c.join_group(s.now_ms(), waiter, &client, &body);
                // Other members' parked joins may be answered now; the timer may have a nearer
                // deadline.
                s.changed.notify_all();
                let resp = match answered {
                    Some(r) => r,
                    None => match s.wait_for(c, waiter.token) {
                        Some(Deferred::Join(_, r)) => r,
                        _ => join_error(
                            v,
                            ResponseError::CoordinatorNotAvailable,
                            body.member_id.as_str(),
                        ),
                    },
                };
                Outcome::encode(req, &resp)
            }
            ApiKey::SyncGroup => {
                let body: SyncGroupRequest = req.decode()?;
                if !authz::membership(&check, body.group_id.as_str()) {
                    return Outcome::encode(
                        req,
                        &sync_error(ResponseError::GroupAuthorizationFailed),
                    );
                }
                let waiter = Waiter {
                    token: s.next_token.fetch_add(1, Ordering::Relaxed),
                    version: v,
                };
                let mut c = lock(&s.coordinator);
                let answered = c.sync_group(s.now_ms(), waiter, &body);
                s.changed.notify_all();
                let resp = match answered {
                    Some(r) => r,
                    None => match s.wait_for(c, waiter.token) {
                        Some(Deferred::Sync(_, r)) => r,
                        _ => sync_error(ResponseError::CoordinatorNotAvailable),
                    },
                };
                Outcome::encode(req, &resp)
            }
            ApiKey::Heartbeat => {
                let body: HeartbeatRequest = req.decode()?;
                if !authz::membership(&check, body.group_id.as_str()) {
                    let mut r = kafka_protocol::messages::HeartbeatResponse::default();
                    r.error_code = GROUP_AUTHORIZATION_FAILED;
                    return Outcome::encode(req, &r);
                }
                let r = lock(&s.coordinator).heartbeat(s.now_ms(), &body);
                Outcome::encode(req, &r)
            }
            ApiKey::LeaveGroup => {
                let body: LeaveGroupRequest = req.decode()?;
                if !authz::membership(&check, body.group_id.as_str()) {
                    let mut r = kafka_protocol::messages::LeaveGroupResponse::default();
                    r.error_code = GROUP_AUTHORIZATION_FAILED;
                    return Outcome::encode(req, &r);
                }
                let r = lock(&s.coordinator).leave_group(s.now_ms(), v, &body);
                s.changed.notify_all();
                Outcome::encode(req, &r)
            }
            ApiKey::OffsetCommit => {
                let mut body: OffsetCommitRequest = req.decode()?;
                let refused = match authz::offset_commit(&check, &mut body) {
                    Ok(refused) => refused,
                    Err(all) => {
                        let mut r = kafka_protocol::messages::OffsetCommitResponse::default();
                        r.topics = all;
                        return Outcome::encode(req, &r);
                    }
                };
                let exists = |tp: &TopicPartition| s.catalog.get(tp).is_some();
                let mut r = lock(&s.coordinator).offset_commit(&exists, &body);
                authz::offset_commit_answer(&mut r, refused);
                Outcome::encode(req, &r)
            }
            ApiKey::OffsetFetch => {
                let body: OffsetFetchRequest = req.decode()?;
                let mut r = lock(&s.coordinator).offset_fetch(v, &body);
                let named: Vec<bool> = if v >= 8 {
                    body.groups.iter().map(|g| g.topics.is_some()).collect()
                } else {
                    vec![body.topics.is_some()]
                };
                authz::offset_fetch(&check, v, body.group_id.as_str(), &named, &mut r);
                Outcome::encode(req, &r)
            }
            ApiKey::DescribeGroups => {
                let body: DescribeGroupsRequest = req.decode()?;
                let mut r = lock(&s.coordinator).describe_groups(v, &body);
                authz::describe_groups(&check, &mut r);
                Outcome::encode(req, &r)
            }
            ApiKey::ListGroups => {
                let body: ListGroupsRequest = req.decode()?;
                let mut r = lock(&s.coordinator).list_groups(v, &body);
                authz::list_groups(&check, &mut r);
                Outcome::encode(req, &r)
            }
            other => Err(ServeError::UnsupportedApi { api: other as i16 }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::dispatch::Part;
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::{
        DescribeGroupsResponse, GroupId, HeartbeatResponse, JoinGroupResponse, RequestHeader,
        SyncGroupResponse,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
    use std::sync::mpsc;

    const GROUP: &str = "g";

    fn frame<M: Encodable>(key: ApiKey, version: i16, body: &M) -> Bytes {
        let mut buf = BytesMut::new();
        let mut h = RequestHeader::default();
        h.request_api_key = key as i16;
        h.request_api_version = version;
        h.correlation_id = 1;
        h.client_id = Some(StrBytes::from_static_str("unit"));
        h.encode(&mut buf, key.request_header_version(version))
            .unwrap();
        body.encode(&mut buf, version).unwrap();
        buf.freeze()
    }

    /// Sends one request through the dispatcher on a thread of its own (as a connection
    /// would) and returns its decoded answer; fails if none comes within a minute (a request
    /// that blocks on another connection's parked one would hang here).
    fn call<Q, R>(d: &Arc<Dispatcher>, key: ApiKey, version: i16, body: Q) -> mpsc::Receiver<R>
    where
        Q: Encodable + Send + 'static,
        R: Decodable + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let d = Arc::clone(d);
        std::thread::spawn(move || {
            let (_, _, resp) = d.dispatch(frame(key, version, &body)).unwrap();
            let Outcome::Reply(parts) = resp.outcome else {
                panic!("no reply")
            };
            let mut bytes = BytesMut::new();
            for p in parts {
                let Part::Bytes(b) = p else {
                    panic!("file part")
                };
                bytes.extend_from_slice(&b);
            }
            let _ = tx.send(R::decode(&mut bytes.freeze(), version).unwrap());
        });
        rx
    }

    fn wait<R>(rx: &mpsc::Receiver<R>) -> R {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("no answer: the request is blocked")
    }

    fn join(member: &str) -> JoinGroupRequest {
        JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str(GROUP)))
            .with_session_timeout_ms(6_000)
            .with_rebalance_timeout_ms(60_000)
            .with_member_id(StrBytes::from_string(member.to_owned()))
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(Bytes::from_static(b"m"))])
    }

    fn sync(member: &str, generation: i32, assign: &[&str]) -> SyncGroupRequest {
        SyncGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str(GROUP)))
            .with_generation_id(generation)
            .with_member_id(StrBytes::from_string(member.to_owned()))
            .with_assignments(
                assign
                    .iter()
                    .map(|m| {
                        SyncGroupRequestAssignment::default()
                            .with_member_id(StrBytes::from_string((*m).to_owned()))
                            .with_assignment(Bytes::from(format!("for-{m}")))
                    })
                    .collect(),
            )
    }

    fn state(d: &Arc<Dispatcher>) -> String {
        let req = DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(StrBytes::from_static_str(GROUP))]);
        let r: DescribeGroupsResponse = wait(&call(d, ApiKey::DescribeGroups, 5, req));
        r.groups[0].group_state.to_string()
    }

    #[test]
    fn a_parked_join_holds_up_no_other_connection_and_the_timer_expires_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let service = GroupService::open_with(dir.path(), ReadCatalog::new(), 0).unwrap();
        let mut d = Dispatcher::new();
        service.register(&mut d, "kmirror", 9092);
        let d = Arc::new(d);

        // A alone: generation 1, A leads and is Stable after its SyncGroup.
        let a: JoinGroupResponse = wait(&call(&d, ApiKey::JoinGroup, 3, join("")));
        assert_eq!(a.error_code, 0);
        let a_id = a.member_id.to_string();
        assert_eq!((a.generation_id, a.leader.as_str()), (1, a_id.as_str()));
        let s: SyncGroupResponse = wait(&call(&d, ApiKey::SyncGroup, 3, sync(&a_id, 1, &[&a_id])));
        assert_eq!(s.error_code, 0);

        // B joins: its JoinGroup is parked until A rejoins (or A's 60 s rebalance timeout).
        let b_join = call::<_, JoinGroupResponse>(&d, ApiKey::JoinGroup, 3, join(""));
        let start = Instant::now();
        while state(&d) != "PreparingRebalance" {
            assert!(start.elapsed() < Duration::from_secs(30), "B never joined");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Meanwhile A's own requests are answered on their connection: the heartbeat tells it
        // to rejoin. B is still parked; nothing else can end the round.
        let hb = HeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str(GROUP)))
            .with_generation_id(1)
            .with_member_id(StrBytes::from_string(a_id.clone()));
        let h: HeartbeatResponse = wait(&call(&d, ApiKey::Heartbeat, 3, hb));
        assert_eq!(h.error_code, ResponseError::RebalanceInProgress.code());
        assert!(
            b_join.try_recv().is_err(),
            "B was answered before A rejoined"
        );
        let a2: JoinGroupResponse = wait(&call(&d, ApiKey::JoinGroup, 3, join(&a_id)));
        let b = wait(&b_join);
        assert_eq!((a2.error_code, b.error_code), (0, 0));
        assert_eq!((a2.generation_id, b.generation_id), (2, 2));
        let b_id = b.member_id.to_string();
        assert_eq!(a2.leader.as_str(), a_id, "the first member keeps leading");
        assert_eq!(a2.members.len(), 2);

        // B's SyncGroup waits for the leader's; then both hold their assignment.
        let b_sync = call::<_, SyncGroupResponse>(&d, ApiKey::SyncGroup, 3, sync(&b_id, 2, &[]));
        let a_sync: SyncGroupResponse = wait(&call(
            &d,
            ApiKey::SyncGroup,
            3,
            sync(&a_id, 2, &[&a_id, &b_id]),
        ));
        let b_sync = wait(&b_sync);
        assert_eq!(a_sync.assignment, Bytes::from(format!("for-{a_id}")));
        assert_eq!(b_sync.assignment, Bytes::from(format!("for-{b_id}")));
        assert_eq!(state(&d), "Stable");

        // Neither sends another heartbeat: the timer removes both when their 6 s sessions run
        // out, with no request arriving to drive it.
        let start = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(500));
            if state(&d) == "Dead" {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "members never expired: {}",
                state(&d)
            );
        }
        drop(d);
        service.close().unwrap();
    }
}
