//! Source workers: every call the control plane makes to a source cluster (metadata, leader
//! look-ups, DescribeConfigs, ListOffsets, group-offset reads, the doctor's check) runs here,
//! never on the control thread, which serves the admin API and `/metrics` and must answer
//! while a source is black-holed or frozen.
//!
//! A job is keyed by what it asks and of whom (`JobKey`: a mirror or source, and the kind of
//! call). At most one job per key is in flight, and at most `SOURCE_WORKERS_MAX` in all: a
//! source that never answers holds one thread per kind of call, not one per attempt, and
//! a new attempt is refused (`Busy`) until the old one ends at its deadline. Each job runs on
//! its own short-lived thread and ends by sending its answer as a message (a channel the
//! caller chose: the controller's result queue, or a oneshot an HTTP handler awaits) and
//! waking the control loop (`wake`).
//!
//! `inline` workers run each job on the caller's thread at once: for unit tests and tools
//! that drive the controller without a control loop.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crate::limits::SOURCE_WORKERS_MAX;

/// The kinds of source call; one of each per key at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum JobKind {
    /// Metadata for `create`, `start`, `check_source` (the admin API awaits it).
    Describe,
    /// The periodic source sync: metadata and topic configs.
    Sync,
    /// ListOffsets for `stop --promote`.
    Promote,
    /// ListOffsets of partitions without a fetcher, for `describe`.
    IdleOffsets,
    /// The periodic group-offset read.
    Groups,
    /// The last group-offset read at `stop`.
    FinalGroups,
    /// The source high watermarks `stop` reports what the failover lost against.
    LossListing,
    /// Leaders (and start offsets) of partitions being handed to shards.
    Resolve,
    /// Leaders the shards asked for again (`LeaderWanted`).
    Leaders,
    /// A mirror's integrity audit round (`control::audit`): local re-reads and source fetches.
    Audit,
    /// The periodic DescribeAcls of a mirror's source (`control::acl_sync`).
    Acls,
}

/// Whom a job asks (a mirror name or a source's bootstrap list) and what.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobKey {
    pub scope: String,
    pub kind: JobKind,
}

impl JobKey {
    pub fn new(scope: impl Into<String>, kind: JobKind) -> JobKey {
        JobKey {
            scope: scope.into(),
            kind,
        }
    }
}

/// Why a job was not started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    #[error("a {kind:?} call to the source of {scope} is still waiting for its answer")]
    InFlight { scope: String, kind: JobKind },
    #[error("{SOURCE_WORKERS_MAX} source calls are already in flight")]
    Full,
    #[error("cannot start a source worker thread: {0}")]
    Thread(String),
}

type Wake = Arc<dyn Fn() + Send + Sync>;

/// The set of jobs in flight, shared by clones.
#[derive(Clone)]
pub struct SourceWorkers {
    busy: Arc<Mutex<BTreeSet<JobKey>>>,
    inline: bool,
    wake: Arc<Mutex<Option<Wake>>>,
}

impl std::fmt::Debug for SourceWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceWorkers")
            .field("in_flight", &self.in_flight())
            .field("inline", &self.inline)
            .finish()
    }
}

impl Default for SourceWorkers {
    fn default() -> Self {
        SourceWorkers::threaded()
    }
}

/// Removes the key when the job ends, however it ends (a panicking job frees its key too).
struct Release {
    busy: Arc<Mutex<BTreeSet<JobKey>>>,
    key: JobKey,
    wake: Arc<Mutex<Option<Wake>>>,
}

impl Drop for Release {
    fn drop(&mut self) {
        self.busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
        let wake = self.wake.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(wake) = wake {
            wake();
        }
    }
}

impl SourceWorkers {
    /// Each job on its own thread.
    pub fn threaded() -> SourceWorkers {
        SourceWorkers {
            busy: Arc::default(),
            inline: false,
            wake: Arc::default(),
        }
    }

    /// Each job on the caller's thread, before `spawn` returns.
    pub fn inline() -> SourceWorkers {
        SourceWorkers {
            inline: true,
            ..SourceWorkers::threaded()
        }
    }

    /// Called after every job ended (its answer is sent by then): wakes the control loop.
    pub fn set_wake(&self, wake: impl Fn() + Send + Sync + 'static) {
        *self.wake.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(wake));
    }

    pub fn in_flight(&self) -> usize {
        self.busy.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_busy(&self, key: &JobKey) -> bool {
        self.busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }

    /// Runs `job` unless a job with the same key is in flight or the pool is full. The job
    /// delivers its own answer (it owns the sending end of the caller's channel).
    pub fn spawn(&self, key: JobKey, job: impl FnOnce() + Send + 'static) -> Result<(), Busy> {
        {
            let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
            if busy.contains(&key) {
                return Err(Busy::InFlight {
                    scope: key.scope,
                    kind: key.kind,
                });
            }
            if busy.len() >= SOURCE_WORKERS_MAX {
                return Err(Busy::Full);
            }
            busy.insert(key.clone());
        }
        let release = Release {
            busy: Arc::clone(&self.busy),
            key,
            wake: Arc::clone(&self.wake),
        };
        if self.inline {
            job();
            drop(release);
            return Ok(());
        }
        let name = format!("kmirror-source-{:?}", release.key.kind).to_lowercase();
        // The thread owns `release`: a spawn failure drops the closure and with it the key.
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _release = release;
                job();
            })
            .map(drop)
            .map_err(|e| Busy::Thread(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn one_job_per_key_and_the_key_is_free_again_when_it_ends() {
        let w = SourceWorkers::threaded();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<u32>();
        let key = JobKey::new("m", JobKind::Describe);
        let tx = done_tx.clone();
        w.spawn(key.clone(), move || {
            let _ = go_rx.recv();
            let _ = tx.send(1);
        })
        .unwrap();
        // A source that never answers: the second call of the same kind is refused, another
        // kind or mirror is not.
        assert!(matches!(
            w.spawn(key.clone(), || {}),
            Err(Busy::InFlight { .. })
        ));
        let tx = done_tx.clone();
        w.spawn(JobKey::new("m", JobKind::Groups), move || {
            let _ = tx.send(2);
        })
        .unwrap();
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(2));
        go_tx.send(()).unwrap();
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(1));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while w.is_busy(&key) {
            assert!(std::time::Instant::now() < deadline, "key never released");
            std::thread::sleep(Duration::from_millis(5));
        }
        w.spawn(key, || {}).unwrap();
    }

    #[test]
    fn the_pool_is_bounded() {
        let w = SourceWorkers::threaded();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let go_rx = Arc::new(Mutex::new(go_rx));
        for i in 0..SOURCE_WORKERS_MAX {
            let rx = Arc::clone(&go_rx);
            w.spawn(JobKey::new(format!("m{i}"), JobKind::Sync), move || {
                let _ = rx.lock().unwrap().recv_timeout(Duration::from_secs(30));
            })
            .unwrap();
        }
        assert_eq!(
            w.spawn(JobKey::new("one more", JobKind::Sync), || {}),
            Err(Busy::Full)
        );
        for _ in 0..SOURCE_WORKERS_MAX {
            let _ = go_tx.send(());
        }
    }

    #[test]
    fn inline_jobs_run_before_spawn_returns_and_wake_the_loop() {
        let w = SourceWorkers::inline();
        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let w2 = Arc::clone(&woken);
        w.set_wake(move || {
            w2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        let (tx, rx) = mpsc::channel();
        w.spawn(JobKey::new("m", JobKind::Sync), move || tx.send(7).unwrap())
            .unwrap();
        assert_eq!(rx.try_recv(), Ok(7));
        assert_eq!(w.in_flight(), 0);
        assert_eq!(woken.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
