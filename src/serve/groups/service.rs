//! The group coordinator plugged into the Kafka endpoint: the I/O around the sans-IO
//! `GroupCoordinator`.
//!
//! The endpoint runs one blocking thread per client connection, so a JoinGroup or SyncGroup that
//! must wait for the rest of its group waits on its own connection's thread: it parks the
//! request in the coordinator under a fresh token and sleeps on a condition variable (which
//! releases the coordinator mutex) until the answer for that token comes out, after another
//! member's request or a timer tick. Other connections are never held up: nothing sleeps while
//! holding the mutex, and every request holds it for one call only.
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
    SyncGroupRequest,
};
use kafka_protocol::ResponseError;

use crate::ids::TopicPartition;
use crate::limits::{GROUP_CLOSE_WAIT_MS, GROUP_PARK_MAX_MS, GROUP_TIMER_MAX_SLEEP_MS};
use crate::log::read_view::ReadCatalog;
use crate::serve::dispatch::{ApiHandler, Dispatcher, Outcome, Request};
use crate::serve::groups::coordinator::{
    join_error, sync_error, ClientInfo, CoordinatorConfig, Deferred, GroupCoordinator,
};
use crate::serve::groups::group::Waiter;
use crate::serve::groups::offsets::{OffsetStoreError, OffsetsLog};
use crate::serve::groups::versions::GROUP_APIS;
use crate::serve::groups::SharedCoordinator;
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
        let store = OffsetsLog::open(data_dir)?;
        // The address is set when the endpoint has bound (`register`).
        let config = CoordinatorConfig::new(crate::serve::NODE_ID, "", 0);
        let coordinator = GroupCoordinator::open(config, store)?;
        let service = Arc::new(GroupService {
            coordinator: Arc::new(Mutex::new(coordinator)),
            changed: Condvar::new(),
            catalog,
            next_token: AtomicU64::new(1),
            origin: Instant::now(),
            stop: AtomicBool::new(false),
            timer: Mutex::new(None),
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
            host: req.peer.map(|p| format!("/{}", p.ip())).unwrap_or_default(),
        }
    }
}

impl ApiHandler for GroupApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let s = &self.service;
        let v = req.version;
        match req.api_key {
            ApiKey::FindCoordinator => {
                let body: FindCoordinatorRequest = req.decode()?;
                let r = lock(&s.coordinator).find_coordinator(v, &body);
                Outcome::encode(req, &r)
            }
            ApiKey::JoinGroup => {
                let body: JoinGroupRequest = req.decode()?;
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
                let r = lock(&s.coordinator).heartbeat(s.now_ms(), &body);
                Outcome::encode(req, &r)
            }
            ApiKey::LeaveGroup => {
                let body: LeaveGroupRequest = req.decode()?;
                let r = lock(&s.coordinator).leave_group(s.now_ms(), v, &body);
                s.changed.notify_all();
                Outcome::encode(req, &r)
            }
            ApiKey::OffsetCommit => {
                let body: OffsetCommitRequest = req.decode()?;
                let exists = |tp: &TopicPartition| s.catalog.get(tp).is_some();
                let r = lock(&s.coordinator).offset_commit(&exists, &body);
                Outcome::encode(req, &r)
            }
            ApiKey::OffsetFetch => {
                let body: OffsetFetchRequest = req.decode()?;
                let r = lock(&s.coordinator).offset_fetch(v, &body);
                Outcome::encode(req, &r)
            }
            ApiKey::DescribeGroups => {
                let body: DescribeGroupsRequest = req.decode()?;
                let r = lock(&s.coordinator).describe_groups(v, &body);
                Outcome::encode(req, &r)
            }
            ApiKey::ListGroups => {
                let body: ListGroupsRequest = req.decode()?;
                let r = lock(&s.coordinator).list_groups(v, &body);
                Outcome::encode(req, &r)
            }
            other => Err(ServeError::UnsupportedApi { api: other as i16 }),
        }
    }
}
