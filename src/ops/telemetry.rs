//! The telemetry thread: collects the latency intervals the shards hand over, keeps per-shard
//! cumulative histograms for `/metrics`, and appends every interval to an HdrHistogram interval
//! log under `<data_dir>/latency/` (compressed V2 entries, one per shard and latency, tagged
//! `<latency>.shard<N>`), rotated by size and age with the oldest files deleted.
//!
//! It never touches a shard: shards publish through `ShardStats` (lock-free queues), and the
//! only lock here (the cumulative histograms) is shared with the metrics renderer.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use hdrhistogram::serialization::V2DeflateSerializer;

use crate::limits::{
    LATENCY_INTERVAL_MS, LATENCY_LOG_BYTES_MAX, LATENCY_LOG_FILES_MAX, LATENCY_LOG_SECS_MAX,
};
use crate::runtime::{Latency, LatencySet, ShardStats};
use crate::serve::fetch_sessions::FetchSessions;
use crate::serve::request_stats::RequestStats;

/// Sub-directory of the data dir holding the interval logs.
pub const LATENCY_DIR: &str = "latency";

/// Why the telemetry thread could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot create latency log dir {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start the telemetry thread: {0}")]
    Thread(std::io::Error),
}

/// The shards' stats plus what the telemetry thread accumulated; read by the metrics renderer.
#[derive(Debug)]
pub struct Telemetry {
    pub shards: Vec<Arc<ShardStats>>,
    /// Everything recorded since start, per shard.
    cumulative: Mutex<Vec<LatencySet>>,
    /// When collection began.
    pub started: SystemTime,
    /// The Kafka endpoint's fetch sessions, once a listener serves them.
    fetch_sessions: OnceLock<Arc<FetchSessions>>,
    /// The Kafka endpoint's requests per API and version, once a listener counts them.
    endpoint_requests: OnceLock<Arc<RequestStats>>,
    /// The integrity audit's per-partition rows, once the control plane audits.
    audit: OnceLock<Arc<crate::control::audit::AuditBoard>>,
    /// The data dir, whose filesystem's free space `/metrics` shows (none: not shown).
    data_dir: Option<PathBuf>,
}

impl Telemetry {
    pub fn new(shards: Vec<Arc<ShardStats>>) -> Telemetry {
        let cumulative = shards.iter().map(|_| LatencySet::new()).collect();
        Telemetry {
            shards,
            cumulative: Mutex::new(cumulative),
            started: SystemTime::now(),
            fetch_sessions: OnceLock::new(),
            endpoint_requests: OnceLock::new(),
            audit: OnceLock::new(),
            data_dir: None,
        }
    }

    pub fn data_dir(&self) -> Option<&Path> {
        self.data_dir.as_deref()
    }

    /// Shows the endpoint's fetch session counters in `/metrics` from now on (the listener
    /// starts after the telemetry in one mode and before it in the other).
    pub fn attach_fetch_sessions(&self, sessions: Arc<FetchSessions>) {
        let _ = self.fetch_sessions.set(sessions);
    }

    pub fn fetch_sessions(&self) -> Option<&Arc<FetchSessions>> {
        self.fetch_sessions.get()
    }

    /// Shows the endpoint's request counters in `/metrics` from now on.
    pub fn attach_endpoint_requests(&self, stats: Arc<RequestStats>) {
        let _ = self.endpoint_requests.set(stats);
    }

    pub fn endpoint_requests(&self) -> Option<&Arc<RequestStats>> {
        self.endpoint_requests.get()
    }

    /// Shows the integrity audit's rows in `/metrics`.
    pub fn attach_audit(&self, board: Arc<crate::control::audit::AuditBoard>) {
        let _ = self.audit.set(board);
    }

    pub fn audit(&self) -> Option<&Arc<crate::control::audit::AuditBoard>> {
        self.audit.get()
    }

    /// A copy of the cumulative histograms, one set per shard.
    pub fn cumulative(&self) -> Vec<LatencySet> {
        self.cumulative
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Takes every interval the shards finished, adds it to the cumulative histograms and
    /// returns them (with their shard index) for the interval log; the caller recycles them.
    fn drain(&self) -> Vec<(usize, Box<LatencySet>)> {
        let mut out = Vec::new();
        for (i, s) in self.shards.iter().enumerate() {
            while let Some(set) = s.take_latency() {
                out.push((i, set));
            }
        }
        let mut cum = self.cumulative.lock().unwrap_or_else(|p| p.into_inner());
        for (i, set) in &out {
            for which in Latency::ALL {
                // Same bounds on both sides, so `add` cannot fail.
                let _ = cum[*i].hists[which as usize].add(set.get(which));
            }
        }
        out
    }
}

/// The running telemetry thread; stopped (and its log flushed) on drop.
pub struct TelemetryThread {
    pub telemetry: Arc<Telemetry>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TelemetryThread {
    /// Starts collecting from `shards`, logging under `data_dir/latency`.
    pub fn start(
        shards: Vec<Arc<ShardStats>>,
        data_dir: &Path,
    ) -> Result<TelemetryThread, TelemetryError> {
        let dir = data_dir.join(LATENCY_DIR);
        std::fs::create_dir_all(&dir).map_err(|source| TelemetryError::Dir {
            path: dir.clone(),
            source,
        })?;
        let telemetry = Arc::new(Telemetry {
            data_dir: Some(data_dir.to_owned()),
            ..Telemetry::new(shards)
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (Arc::clone(&telemetry), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("kmirror-telemetry".into())
            .spawn(move || run(&t, &dir, &s))
            .map_err(TelemetryError::Thread)?;
        Ok(TelemetryThread {
            telemetry,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for TelemetryThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn unix(t: SystemTime) -> Duration {
    t.duration_since(UNIX_EPOCH).unwrap_or_default()
}

fn run(telemetry: &Telemetry, dir: &Path, stop: &AtomicBool) {
    loop {
        match write_one_file(telemetry, dir, stop) {
            Ok(true) => return,
            Ok(false) => prune(dir),
            Err(e) => {
                // Metrics keep working without the log; try a new file after a pause.
                tracing::warn!("latency log under {}: {e}", dir.display());
                std::thread::park_timeout(Duration::from_millis(LATENCY_INTERVAL_MS * 10));
                if stop.load(Ordering::Acquire) {
                    return;
                }
            }
        }
    }
}

/// Appends intervals to one new file until it is due for rotation (`Ok(false)`) or the thread
/// is asked to stop (`Ok(true)`, after a last drain).
fn write_one_file(telemetry: &Telemetry, dir: &Path, stop: &AtomicBool) -> std::io::Result<bool> {
    let opened = SystemTime::now();
    let path = dir.join(format!("latency-{}.hlog", unix(opened).as_millis()));
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path)?);
    let mut ser = V2DeflateSerializer::new();
    let mut log = IntervalLogWriterBuilder::new()
        .add_comment("kmirror latency intervals: values in ns; tags <latency>.shard<N>")
        .with_start_time(opened)
        .with_base_time(opened)
        .with_max_value_divisor(1e6)
        .begin_log_with(&mut file, &mut ser)?;
    let began = Instant::now();
    loop {
        let stopping = stop.load(Ordering::Acquire);
        for (shard, set) in telemetry.drain() {
            for which in Latency::ALL {
                let h = set.get(which);
                let tag = format!("{}.shard{shard}", which.name());
                let start = unix(set.start).saturating_sub(unix(opened));
                let len = set.end.duration_since(set.start).unwrap_or_default();
                log.write_histogram(h, start, len, Tag::new(&tag))
                    .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
            }
            telemetry.shards[shard].recycle_latency(set);
        }
        drop(log);
        file.flush()?;
        if stopping {
            return Ok(true);
        }
        if file.get_ref().metadata()?.len() >= LATENCY_LOG_BYTES_MAX
            || began.elapsed() >= Duration::from_secs(LATENCY_LOG_SECS_MAX)
        {
            return Ok(false);
        }
        std::thread::park_timeout(Duration::from_millis(LATENCY_INTERVAL_MS));
        log = IntervalLogWriterBuilder::new().begin_log_with(&mut file, &mut ser)?;
    }
}

/// Keeps the newest `LATENCY_LOG_FILES_MAX` logs.
fn prune(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut logs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "hlog"))
        .collect();
    // Names carry the opening time in ms, all of the same width for centuries to come.
    logs.sort();
    while logs.len() > LATENCY_LOG_FILES_MAX {
        let _ = std::fs::remove_file(logs.remove(0));
    }
}
