//! `/metrics`: renders the shards' published counters, the telemetry thread's cumulative
//! latency histograms, the mirrors' partition states and the process basics in Prometheus text
//! format with `prometheus-client`. Runs on the thread that serves HTTP; reads only atomics and
//! snapshots, never a shard's own state.
//!
//! Names follow Prometheus conventions: `kmirror_` prefix, base units (seconds, bytes),
//! `_total` on counters, labels `mirror`/`topic`/`partition` per partition and `shard` per shard.

use std::collections::HashMap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::control::state::StateName;
use crate::ids::TopicPartition;
use crate::ops::process_stats::{self, ProcessStats};
use crate::ops::telemetry::Telemetry;
use crate::runtime::{Latency, LatencySet, PartitionSnapshot, ShardSnapshot};
use crate::serve::fetch_sessions::SessionStats;
use crate::serve::request_stats::{RequestCount, RequestError};

/// Content type of the rendered text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Histogram bucket bounds in seconds. Fetch and append latencies live between 100 µs and
/// seconds; end-to-end latency can be minutes while catching up.
const BUCKETS_SECONDS: [f64; 20] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];

/// A partition the control plane knows, with its state (the state gauge's source).
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionState {
    pub mirror: String,
    pub tp: TopicPartition,
    pub state: StateName,
    /// Unclean-election recoveries of the partition and the records they quarantined
    /// (`control::unclean_recovery`; counted across restarts from the quarantine).
    pub unclean_truncations: u64,
    pub quarantined_records: i64,
}

/// One failed-back partition's reverse copy (`control::failback`), for the `kmirror_failback_*`
/// families.
#[derive(Debug, Clone, PartialEq)]
pub struct FailbackMetric {
    pub mirror: String,
    pub tp: TopicPartition,
    /// The failback's phase (CREATED, COPYING, STOPPED), or FAILED for a partition the copy
    /// stopped with an error.
    pub state: &'static str,
    /// kmirror offsets not copied yet (None: kmirror's end not known).
    pub lag_offsets: Option<i64>,
    pub copied_records: i64,
    pub copied_bytes: i64,
    pub divergent_tail_records: i64,
    pub open_transactions: i64,
}

/// The states `kmirror_failback_state` lists.
pub const FAILBACK_STATES: [&str; 4] = ["CREATED", "COPYING", "STOPPED", "FAILED"];

/// Everything one scrape shows, gathered before encoding.
struct Scrape {
    failback: Vec<FailbackMetric>,
    state_writes: Option<u64>,
    now_ms: i64,
    shards: Vec<ShardSnapshot>,
    latency: Vec<LatencySet>,
    partitions: Vec<(String, PartitionSnapshot)>,
    states: Vec<PartitionState>,
    process: ProcessStats,
    fetch_sessions: Option<SessionStats>,
    endpoint_requests: Option<Vec<RequestCount>>,
    disk: Option<DiskSpace>,
    audit: Option<std::sync::Arc<Vec<crate::control::audit::PartitionAudit>>>,
}

/// The data dir's filesystem, from statvfs at scrape time.
#[derive(Debug, Clone, Copy)]
struct DiskSpace {
    /// Bytes an unprivileged writer (kmirror) may still use (`f_bavail`).
    free: u64,
    capacity: u64,
}

fn disk_space(dir: &std::path::Path) -> Option<DiskSpace> {
    match rustix::fs::statvfs(dir) {
        Ok(v) => Some(DiskSpace {
            free: v.f_bavail.saturating_mul(v.f_frsize),
            capacity: v.f_blocks.saturating_mul(v.f_frsize),
        }),
        Err(e) => {
            // Only these two series go missing from the scrape; the rest is still served.
            tracing::warn!("/metrics: cannot statvfs {}: {e}", dir.display());
            None
        }
    }
}

/// Renders one scrape. `states` are the control plane's partitions; partitions the shards
/// report that no mirror claims are labelled `default_mirror`.
pub fn render(telemetry: &Telemetry, states: Vec<PartitionState>, default_mirror: &str) -> String {
    render_with_control(telemetry, states, default_mirror, ControlMetrics::default())
}

/// What the control plane adds to a scrape when it runs (the admin API's `/metrics`).
#[derive(Debug, Clone, Default)]
pub struct ControlMetrics {
    /// The failbacks' reverse copies.
    pub failback: Vec<FailbackMetric>,
    /// `__mirror_state` appends (each one write and one sync) since the controller opened;
    /// None without a controller.
    pub state_writes: Option<u64>,
}

/// `render`, with what the control plane knows.
pub fn render_with_control(
    telemetry: &Telemetry,
    states: Vec<PartitionState>,
    default_mirror: &str,
    control: ControlMetrics,
) -> String {
    let owner: HashMap<&TopicPartition, &str> =
        states.iter().map(|s| (&s.tp, s.mirror.as_str())).collect();
    let mut partitions = Vec::new();
    for shard in &telemetry.shards {
        for p in shard.partitions() {
            let mirror = owner
                .get(&p.tp)
                .copied()
                .unwrap_or(default_mirror)
                .to_owned();
            partitions.push((mirror, p));
        }
    }
    partitions.sort_by(|a, b| (&a.0, &a.1.tp).cmp(&(&b.0, &b.1.tp)));
    let scrape = Scrape {
        failback: control.failback,
        state_writes: control.state_writes,
        now_ms: (process_stats::now_seconds() * 1000.0) as i64,
        shards: telemetry.shards.iter().map(|s| s.snapshot()).collect(),
        latency: telemetry.cumulative(),
        partitions,
        states,
        process: process_stats::read(),
        fetch_sessions: telemetry.fetch_sessions().map(|s| s.stats()),
        endpoint_requests: telemetry.endpoint_requests().map(|s| s.snapshot()),
        disk: telemetry.data_dir().and_then(disk_space),
        audit: telemetry.audit().map(|b| b.rows()),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
        .expect("writing to a String cannot fail");
    out
}

type Labels = Vec<(&'static str, String)>;

fn part_labels(mirror: &str, tp: &TopicPartition) -> Labels {
    vec![
        ("mirror", mirror.to_owned()),
        ("topic", tp.topic.clone()),
        ("partition", tp.partition.to_string()),
    ]
}

fn shard_labels(i: usize) -> Labels {
    vec![("shard", i.to_string())]
}

/// One family of const metrics.
struct Family<'e, 'a> {
    enc: &'e mut DescriptorEncoder<'a>,
}

impl<'a> Family<'_, 'a> {
    fn gauge<V>(&mut self, name: &str, help: &str, rows: &[(Labels, V)]) -> std::fmt::Result
    where
        V: prometheus_client::encoding::EncodeGaugeValue + Copy + std::fmt::Debug,
    {
        let mut m = self
            .enc
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, v) in rows {
            ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn counter<V>(&mut self, name: &str, help: &str, rows: &[(Labels, V)]) -> std::fmt::Result
    where
        V: prometheus_client::encoding::EncodeCounterValue + Copy + std::fmt::Debug,
    {
        let mut m = self
            .enc
            .encode_descriptor(name, help, None, MetricType::Counter)?;
        for (labels, v) in rows {
            ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        rows: &[(Labels, &hdrhistogram::Histogram<u64>)],
    ) -> std::fmt::Result {
        let mut m = self
            .enc
            .encode_descriptor(name, help, None, MetricType::Histogram)?;
        for (labels, h) in rows {
            let mut buckets = Vec::with_capacity(BUCKETS_SECONDS.len());
            let mut below = 0;
            for le in BUCKETS_SECONDS {
                let upto = h.count_between(0, (le * 1e9) as u64);
                buckets.push((le, upto - below));
                below = upto;
            }
            // HdrHistogram keeps no exact sum; mean × count is within its 0.1% precision.
            let sum = h.mean() * h.len() as f64 / 1e9;
            m.encode_family(labels)?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    sum,
                    h.len(),
                    &buckets,
                    None,
                )?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Family<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Family")
    }
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let mut f = Family { enc: &mut enc };
        self.encode_partitions(&mut f)?;
        self.encode_shards(&mut f)?;
        self.encode_fetch_sessions(&mut f)?;
        self.encode_endpoint_requests(&mut f)?;
        self.encode_disk(&mut f)?;
        self.encode_audit(&mut f)?;
        self.encode_failback(&mut f)?;
        self.encode_control(&mut f)?;
        self.encode_process(&mut f)
    }
}

impl Scrape {
    fn encode_control(&self, f: &mut Family<'_, '_>) -> std::fmt::Result {
        let Some(writes) = self.state_writes else {
            return Ok(());
        };
        f.counter(
            "kmirror_mirror_state_writes",
            "__mirror_state appends (one write and one sync each, any number of records) since this process started; a command over thousands of partitions is one.",
            &[(Vec::new(), writes)],
        )
    }

    /// The reverse copies of failbacks (none: no series).
    fn encode_failback(&self, f: &mut Family<'_, '_>) -> std::fmt::Result {
        if self.failback.is_empty() {
            return Ok(());
        }
        let rows = |v: &dyn Fn(&FailbackMetric) -> i64| -> Vec<(Labels, i64)> {
            self.failback
                .iter()
                .map(|m| (part_labels(&m.mirror, &m.tp), v(m)))
                .collect()
        };
        let lag: Vec<(Labels, i64)> = self
            .failback
            .iter()
            .filter_map(|m| m.lag_offsets.map(|l| (part_labels(&m.mirror, &m.tp), l)))
            .collect();
        f.gauge(
            "kmirror_failback_lag_offsets",
            "Offsets written on kmirror after the failover not yet copied back to the original \
             (the reverse-copy lag; 0 when caught up).",
            &lag,
        )?;
        let counted = |v: &dyn Fn(&FailbackMetric) -> i64| -> Vec<(Labels, u64)> {
            rows(v)
                .into_iter()
                .map(|(l, n)| (l, u64::try_from(n).unwrap_or(0)))
                .collect()
        };
        f.counter(
            "kmirror_failback_copied_records",
            "Records the original acknowledged from the failback's copy.",
            &counted(&|m| m.copied_records),
        )?;
        f.counter(
            "kmirror_failback_copied_bytes",
            "Bytes of the batches the original acknowledged from the failback's copy.",
            &counted(&|m| m.copied_bytes),
        )?;
        f.gauge(
            "kmirror_failback_divergent_tail_records",
            "Records the original holds past the failover point that kmirror never received \
             (left in place, before the copied records).",
            &rows(&|m| m.divergent_tail_records),
        )?;
        f.gauge(
            "kmirror_failback_open_transactions",
            "Transactions replayed on the original and not ended yet (the cut-over waits for 0).",
            &rows(&|m| m.open_transactions),
        )?;
        let mut states = Vec::new();
        for m in &self.failback {
            for name in FAILBACK_STATES {
                let mut l = part_labels(&m.mirror, &m.tp);
                l.push(("state", name.to_owned()));
                states.push((l, i64::from(m.state == name)));
            }
        }
        f.gauge(
            "kmirror_failback_state",
            "1 for the partition's failback state (CREATED, COPYING, STOPPED; FAILED when the \
             copy stopped it with an error), 0 for the others.",
            &states,
        )
    }
}

impl Scrape {
    fn encode_partitions(&self, f: &mut Family<'_, '_>) -> std::fmt::Result {
        let rows = |v: &dyn Fn(&PartitionSnapshot) -> Option<i64>| -> Vec<(Labels, i64)> {
            self.partitions
                .iter()
                .filter_map(|(m, p)| v(p).map(|x| (part_labels(m, &p.tp), x)))
                .collect()
        };
        let lag = |p: &PartitionSnapshot| {
            p.high_watermark
                .map(|hw| hw.0.saturating_sub(p.log_end.0).max(0))
        };
        f.gauge(
            "kmirror_partition_lag_offsets",
            "Source high watermark minus the local log end offset.",
            &rows(&lag),
        )?;
        let lag_seconds: Vec<(Labels, f64)> = self
            .partitions
            .iter()
            .filter_map(|(m, p)| {
                let behind = lag(p)?;
                // Caught up: no lag. Behind: how old the newest record we hold is.
                let secs = match (behind, p.max_timestamp) {
                    (0, _) => 0.0,
                    (_, Some(ts)) => ((self.now_ms - ts.0).max(0)) as f64 / 1000.0,
                    (_, None) => return None,
                };
                Some((part_labels(m, &p.tp), secs))
            })
            .collect();
        f.gauge(
            "kmirror_partition_lag_seconds",
            "While behind the source: age of the newest mirrored record's timestamp; 0 when caught up.",
            &lag_seconds,
        )?;
        f.gauge(
            "kmirror_partition_log_end_offset",
            "Local log end offset (next offset to be mirrored).",
            &rows(&|p| Some(p.log_end.0)),
        )?;
        f.gauge(
            "kmirror_partition_source_high_watermark",
            "The source's high watermark as of the last fetch response.",
            &rows(&|p| p.high_watermark.map(|o| o.0)),
        )?;
        let counter = |v: fn(&PartitionSnapshot) -> u64| -> Vec<(Labels, u64)> {
            self.partitions
                .iter()
                .map(|(m, p)| (part_labels(m, &p.tp), v(p)))
                .collect()
        };
        f.counter(
            "kmirror_partition_mirrored_bytes",
            "Record batch bytes appended to the local log since this process started.",
            &counter(|p| p.bytes),
        )?;
        f.counter(
            "kmirror_partition_mirrored_batches",
            "Record batches appended to the local log since this process started.",
            &counter(|p| p.batches),
        )?;
        f.counter(
            "kmirror_partition_fetch_errors",
            "Fetch failures affecting the partition (partition errors, bad records, failed requests, lost connections).",
            &counter(|p| p.fetch_errors),
        )?;
        f.counter(
            "kmirror_partition_records_skipped",
            "Offsets never mirrored because the source's retention passed the local log end (the mirrored log keeps its batches and has an offset gap there), since this process started.",
            &counter(|p| p.records_skipped),
        )?;
        let throttle: Vec<(Labels, f64)> = self
            .partitions
            .iter()
            .map(|(m, p)| (part_labels(m, &p.tp), p.throttle_ms as f64 / 1000.0))
            .collect();
        f.counter(
            "kmirror_partition_throttle_seconds",
            "Throttle time the source imposed on the connection fetching the partition.",
            &throttle,
        )?;
        let mut states = Vec::new();
        for s in &self.states {
            for name in StateName::ALL {
                let mut l = part_labels(&s.mirror, &s.tp);
                l.push(("state", name.to_string()));
                states.push((l, i64::from(s.state == name)));
            }
        }
        f.gauge(
            "kmirror_partition_state",
            "1 for the partition's current mirror state (KIP-1279 names), 0 for the others.",
            &states,
        )?;
        let recovered: Vec<&PartitionState> = self
            .states
            .iter()
            .filter(|s| s.unclean_truncations > 0)
            .collect();
        f.counter(
            "kmirror_partition_unclean_truncations",
            "Unclean leader elections on the source the partition recovered from \
             (mirror.support.unclean.leader.election): its log truncated to the divergence \
             point, the cut records moved to the quarantine.",
            &recovered
                .iter()
                .map(|s| (part_labels(&s.mirror, &s.tp), s.unclean_truncations))
                .collect::<Vec<_>>(),
        )?;
        f.counter(
            "kmirror_partition_quarantined_records",
            "Records cut from the partition's log by unclean-election recoveries, kept in the \
             quarantine (kmirror-quarantine/unclean-*).",
            &recovered
                .iter()
                .map(|s| {
                    let n = u64::try_from(s.quarantined_records).unwrap_or(0);
                    (part_labels(&s.mirror, &s.tp), n)
                })
                .collect::<Vec<_>>(),
        )?;
        // Per mirror, over the partitions the shards fetch for it (none: no series).
        let mut reachable: Vec<(Labels, i64)> = Vec::new();
        for (m, p) in &self.partitions {
            match reachable.last_mut() {
                Some((l, v)) if l[0].1 == *m => *v = (*v).min(i64::from(p.source_answered)),
                _ => reachable.push((vec![("mirror", m.clone())], i64::from(p.source_answered))),
            }
        }
        f.gauge(
            "kmirror_source_reachable",
            "1 when the source broker of every partition the mirror fetches has answered on its \
             current connection; 0 while one is connecting or reconnecting.",
            &reachable,
        )
    }

    /// The integrity audit (`control::audit`), per partition it audits.
    fn encode_audit(&self, f: &mut Family<'_, '_>) -> std::fmt::Result {
        let Some(rows) = &self.audit else {
            return Ok(());
        };
        let labels = |a: &crate::control::audit::PartitionAudit| {
            vec![
                ("mirror", a.mirror.clone()),
                ("topic", a.topic.clone()),
                ("partition", a.partition.to_string()),
            ]
        };
        let verified: Vec<(Labels, i64)> = rows
            .iter()
            .filter_map(|a| a.verified_offset.map(|v| (labels(a), v)))
            .collect();
        f.gauge(
            "kmirror_partition_verified_offset",
            "Every offset below this was re-read locally and matched the source's batch (offsets, leader epoch, CRC).",
            &verified,
        )?;
        let lag: Vec<(Labels, f64)> = rows
            .iter()
            .filter_map(|a| a.verified_lag_seconds(self.now_ms).map(|s| (labels(a), s)))
            .collect();
        f.gauge(
            "kmirror_partition_verified_lag_seconds",
            "0 when verified to the local log end (as of the last audit round), else the age of the newest verified source record.",
            &lag,
        )?;
        let count = |v: fn(&crate::control::audit::PartitionAudit) -> u64| -> Vec<(Labels, u64)> {
            rows.iter().map(|a| (labels(a), v(a))).collect()
        };
        f.counter(
            "kmirror_audit_mismatches",
            "Batches the audit found different from the source or damaged locally, since this process started.",
            &count(|a| a.mismatches),
        )?;
        f.counter(
            "kmirror_audit_read_bytes",
            "Local segment bytes the audit re-read, since this process started.",
            &count(|a| a.bytes_read),
        )?;
        f.counter(
            "kmirror_audit_fetched_bytes",
            "Record bytes the audit fetched again from the source, since this process started.",
            &count(|a| a.bytes_fetched),
        )
    }

    fn encode_disk(&self, f: &mut Family<'_, '_>) -> std::fmt::Result {
        let Some(d) = self.disk else {
            return Ok(());
        };
        let none: Labels = Vec::new();
        f.gauge(
            "kmirror_data_dir_free_bytes",
            "Bytes still available to kmirror on the data dir's filesystem (statvfs f_bavail).",
            &[(none.clone(), d.free as i64)],
        )?;
        f.gauge(
            "kmirror_data_dir_capacity_bytes",
            "Size of the data dir's filesystem (statvfs f_blocks).",
            &[(none, d.capacity as i64)],
        )
    }

    fn encode_shards(&self, f: &mut Family<'_, '_>) -> std::fmt::Result {
        let rows = |v: fn(&ShardSnapshot) -> u64| -> Vec<(Labels, u64)> {
            self.shards
                .iter()
                .enumerate()
                .map(|(i, s)| (shard_labels(i), v(s)))
                .collect()
        };
        // One row per shard and value of `label`, in the order given.
        type Kinds = [(&'static str, fn(&ShardSnapshot) -> u64); 2];
        let rows_by = |label: &'static str, kinds: Kinds| -> Vec<(Labels, u64)> {
            self.shards
                .iter()
                .enumerate()
                .flat_map(|(i, s)| {
                    kinds.map(|(value, get)| {
                        let mut l = shard_labels(i);
                        l.push((label, value.to_string()));
                        (l, get(s))
                    })
                })
                .collect()
        };
        f.counter(
            "kmirror_shard_written_bytes",
            "Bytes appended to partition logs by the shard.",
            &rows(|s| s.bytes_written),
        )?;
        f.counter(
            "kmirror_shard_appends",
            "Partition log appends (one per fetched partition with records).",
            &rows(|s| s.appends),
        )?;
        f.counter(
            "kmirror_shard_fetches",
            "Fetch responses received.",
            &rows(|s| s.fetches),
        )?;
        f.counter(
            "kmirror_shard_uring_submissions",
            "SQEs queued on the shard's io_uring.",
            &rows(|s| s.ring_submitted),
        )?;
        f.counter(
            "kmirror_shard_uring_completions",
            "CQEs reaped from the shard's io_uring.",
            &rows(|s| s.ring_completed),
        )?;
        f.counter(
            "kmirror_shard_log_writes_inline",
            "Log writes performed on the shard thread (runtime.log_writes = shard_when_fast).",
            &rows(|s| s.log_writes_inline),
        )?;
        f.counter(
            "kmirror_shard_log_writes_inline_slow",
            "Shard-thread log writes slower than their size explains (typically dirty-page \
             throttling); each sends the shard's writes to io_uring workers for a second.",
            &rows(|s| s.log_writes_inline_slow),
        )?;
        f.gauge(
            "kmirror_shard_arena_slots_in_use",
            "Registered arena slots holding a receive or records not yet written.",
            &rows(|s| s.arena_slots_in_use),
        )?;
        f.gauge(
            "kmirror_shard_arena_slots",
            "Registered arena slots of the shard.",
            &rows(|s| s.arena_slots),
        )?;
        f.gauge(
            "kmirror_shard_healthy",
            "1 while the shard's loop keeps turning (its heartbeat advances), 0 once it stalled or died.",
            &rows(|s| s.healthy),
        )?;
        f.counter(
            "kmirror_shard_failures",
            "Times the shard was found stalled or dead (its partitions were failed and kmirror exits).",
            &rows(|s| s.failures),
        )?;
        f.counter(
            "kmirror_shard_flushes",
            "Flushes the shard performed on its ring without waiting (segment rolls, \
             recovery-point checkpoint rounds).",
            &rows(|s| s.flushes),
        )?;
        let flush_time: Vec<(Labels, f64)> = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| (shard_labels(i), s.flush_ns as f64 / 1e9))
            .collect();
        f.counter(
            "kmirror_shard_flush_seconds",
            "Time those flushes took, from planning to the last fdatasync (the disk's write-back \
             of what was dirty); the shard fetched and appended meanwhile.",
            &flush_time,
        )?;
        f.gauge(
            "kmirror_shard_flushes_in_flight",
            "Flushes whose fdatasyncs are on the shard's ring now.",
            &rows(|s| s.flushes_in_flight),
        )?;
        let throttle: Vec<(Labels, f64)> = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| (shard_labels(i), s.throttle_ms as f64 / 1000.0))
            .collect();
        f.counter(
            "kmirror_shard_throttle_seconds",
            "Throttle time sources asked the shard's connections to wait.",
            &throttle,
        )?;
        let requests = rows_by(
            "kind",
            [
                ("full", |s| s.fetch_full),
                ("incremental", |s| s.fetch_incremental),
            ],
        );
        f.counter(
            "kmirror_shard_fetch_requests",
            "Fetch requests the shard sent to sources: full ones list every partition, \
             incremental ones (KIP-227 fetch sessions) only partitions whose position changed.",
            &requests,
        )?;
        let catch_up = rows_by(
            "change",
            [
                ("split", |s| s.fetch_group_splits),
                ("merge", |s| s.fetch_group_merges),
            ],
        );
        f.counter(
            "kmirror_shard_catch_up_group_changes",
            "Connections that split their partitions into a second fetch group while behind \
             (two requests in flight), and merged them back once caught up.",
            &catch_up,
        )?;
        for (which, name, help) in [
            (
                Latency::FetchRoundTrip,
                "kmirror_shard_fetch_round_trip_seconds",
                "Fetch request sent to whole response received.",
            ),
            (
                Latency::Append,
                "kmirror_shard_append_seconds",
                "Appending one fetched partition's records to its log (page cache).",
            ),
            (
                Latency::EndToEnd,
                "kmirror_shard_end_to_end_latency_seconds",
                "Newest batch timestamp at the source to local append done (two hosts' clocks).",
            ),
        ] {
            let rows: Vec<(Labels, &hdrhistogram::Histogram<u64>)> = self
                .latency
                .iter()
                .enumerate()
                .map(|(i, set)| (shard_labels(i), set.get(which)))
                .collect();
            f.histogram(name, help, &rows)?;
        }
        Ok(())
    }

    fn encode_fetch_sessions(&self, f: &mut Family<'_, '_>) -> std::fmt::Result {
        let Some(s) = self.fetch_sessions else {
            return Ok(());
        };
        let none: Labels = Vec::new();
        f.gauge(
            "kmirror_endpoint_fetch_sessions",
            "Incremental fetch sessions (KIP-227) the Kafka endpoint holds for its clients.",
            &[(none.clone(), s.sessions as i64)],
        )?;
        for (name, help, v) in [
            (
                "kmirror_endpoint_fetch_sessions_created",
                "Fetch sessions opened by full fetches.",
                s.counts.created,
            ),
            (
                "kmirror_endpoint_fetch_sessions_evicted",
                "Fetch sessions evicted to make room for new ones.",
                s.counts.evicted,
            ),
            (
                "kmirror_endpoint_fetch_sessions_closed",
                "Fetch sessions closed by their client (or left with no partitions).",
                s.counts.closed,
            ),
            (
                "kmirror_endpoint_incremental_fetches",
                "Incremental fetches answered from a session.",
                s.counts.incremental_fetches,
            ),
        ] {
            f.counter(name, help, &[(none.clone(), v)])?;
        }
        self.encode_connections(f)
    }

    /// The endpoint's connection counters (process-wide, `serve::admission::CONN_STATS`);
    /// shown with the fetch sessions, i.e. when a Kafka listener runs.
    fn encode_connections(&self, f: &mut Family<'_, '_>) -> std::fmt::Result {
        use crate::serve::admission::CONN_STATS as C;
        use std::sync::atomic::Ordering::Relaxed;
        let none: Labels = Vec::new();
        f.gauge(
            "kmirror_endpoint_connections",
            "Kafka client connections the endpoint holds now.",
            &[(none.clone(), C.open.load(Relaxed) as i64)],
        )?;
        for (name, help, v) in [
            (
                "kmirror_endpoint_connections_accepted",
                "Kafka client connections let in.",
                &C.accepted,
            ),
            (
                "kmirror_endpoint_connections_refused_max_connections",
                "Connections closed at once because max.connections were held.",
                &C.refused_max_connections,
            ),
            (
                "kmirror_endpoint_connections_refused_per_ip",
                "Connections closed at once because their address held max.connections.per.ip.",
                &C.refused_per_ip,
            ),
            (
                "kmirror_endpoint_connections_closed_idle",
                "Connections closed after connections.max.idle.ms without a request.",
                &C.closed_idle,
            ),
            (
                "kmirror_endpoint_connections_closed_receive_timeout",
                "Connections closed because a begun request frame missed request.receive.timeout.ms.",
                &C.closed_receive_timeout,
            ),
            (
                "kmirror_endpoint_handler_panics",
                "Requests whose handler panicked (their connection was closed).",
                &C.handler_panics,
            ),
        ] {
            f.counter(name, help, &[(none.clone(), v.load(Relaxed))])?;
        }
        self.encode_tls(f)
    }

    /// TLS connections by listener and principal (`serve::tls::TLS_STATS`).
    fn encode_tls(&self, f: &mut Family<'_, '_>) -> std::fmt::Result {
        let (principals, failed) = crate::serve::tls::TLS_STATS.snapshot();
        if principals.is_empty() && failed.is_empty() {
            return Ok(());
        }
        let rows: Vec<(Labels, u64)> = principals
            .into_iter()
            .map(|(l, p, n)| (vec![("listener", l), ("principal", p)], n))
            .collect();
        f.counter(
            "kmirror_endpoint_tls_connections",
            "TLS connections that completed their handshake, by listener and principal (the client certificate's subject, User:ANONYMOUS without one).",
            &rows,
        )?;
        let rows: Vec<(Labels, u64)> = failed
            .into_iter()
            .map(|(l, n)| (vec![("listener", l)], n))
            .collect();
        f.counter(
            "kmirror_endpoint_tls_handshakes_failed",
            "TLS connections refused in the handshake (untrusted or missing client certificate, no common protocol, timeout).",
            &rows,
        )
    }

    fn encode_endpoint_requests(&self, f: &mut Family<'_, '_>) -> std::fmt::Result {
        let Some(rows) = &self.endpoint_requests else {
            return Ok(());
        };
        let labels = |r: &RequestCount| -> Labels {
            let name = kafka_protocol::messages::ApiKey::try_from(r.api_key)
                .map(|k| format!("{k:?}"))
                .unwrap_or_else(|_| r.api_key.to_string());
            vec![
                ("api_key", r.api_key.to_string()),
                ("api", name),
                ("version", r.version.to_string()),
            ]
        };
        let served: Vec<(Labels, u64)> = rows
            .iter()
            .filter(|r| r.served > 0)
            .map(|r| (labels(r), r.served))
            .collect();
        f.counter(
            "kmirror_endpoint_requests",
            "Kafka requests the endpoint answered, by API and version.",
            &served,
        )?;
        let mut errors: Vec<(Labels, u64)> = Vec::new();
        for r in rows {
            for (i, why) in RequestError::ALL.iter().enumerate() {
                if r.errors[i] > 0 {
                    let mut l = labels(r);
                    l.push(("error", why.name().to_string()));
                    errors.push((l, r.errors[i]));
                }
            }
        }
        f.counter(
            "kmirror_endpoint_request_errors",
            "Kafka requests that closed their connection, by API, version and why: decode \
             (not understood), unsupported (API or version not served), other.",
            &errors,
        )
    }

    fn encode_process(&self, f: &mut Family<'_, '_>) -> std::fmt::Result {
        let p = &self.process;
        let none: Labels = Vec::new();
        if let Some(v) = p.cpu_seconds {
            f.counter(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                &[(none.clone(), v)],
            )?;
        }
        let gauges: [(&str, &str, Option<f64>); 6] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                p.resident_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                p.virtual_bytes.map(|v| v as f64),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                p.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                p.max_fds.map(|v| v as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                p.start_time_seconds,
            ),
            (
                "process_threads",
                "Number of OS threads in the process.",
                p.threads.map(|v| v as f64),
            ),
        ];
        for (name, help, v) in gauges {
            if let Some(v) = v {
                f.gauge(name, help, &[(none.clone(), v)])?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrape")
            .field("shards", &self.shards.len())
            .field("partitions", &self.partitions.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Offset, ShardId};
    use crate::runtime::ShardStats;
    use std::sync::Arc;

    fn sample(text: &str, key: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn source_reachable_is_one_only_when_every_partition_of_the_mirror_was_answered() {
        let shards = [ShardStats::new(ShardId(0)), ShardStats::new(ShardId(1))].map(Arc::new);
        let tp = |t: &str, p| TopicPartition::new(t, p);
        // east: one partition on each shard, one of them reconnecting; west: all answered.
        let east0 = shards[0].register(tp("orders", 0), Offset(0));
        let east1 = shards[1].register(tp("orders", 1), Offset(0));
        let west = shards[1].register(tp("pay", 0), Offset(0));
        east0.source_answered(true);
        west.source_answered(true);
        let telemetry = Telemetry::new(shards.to_vec());
        let state = |mirror: &str, tp| PartitionState {
            mirror: mirror.to_owned(),
            tp,
            state: StateName::Mirroring,
            unclean_truncations: 0,
            quarantined_records: 0,
        };
        let states = || {
            vec![
                state("east", tp("orders", 0)),
                state("east", tp("orders", 1)),
                state("west", tp("pay", 0)),
            ]
        };
        let text = render(&telemetry, states(), "");
        let east = r#"kmirror_source_reachable{mirror="east"}"#;
        let west_key = r#"kmirror_source_reachable{mirror="west"}"#;
        assert_eq!(sample(&text, east), Some(0.0), "{text}");
        assert_eq!(sample(&text, west_key), Some(1.0), "{text}");
        east1.source_answered(true);
        let text = render(&telemetry, states(), "");
        assert_eq!(sample(&text, east), Some(1.0), "{text}");
        // No data dir given: no disk gauges rather than made-up ones.
        assert!(!text.contains("kmirror_data_dir_"), "{text}");
    }

    #[test]
    fn failback_rows_render_one_series_each_and_one_state_and_state_writes_one_counter() {
        let telemetry = Telemetry::new(Vec::new());
        let row = |topic: &str, state, lag| FailbackMetric {
            mirror: "east".to_owned(),
            tp: TopicPartition::new(topic, 0),
            state,
            lag_offsets: lag,
            copied_records: 12,
            copied_bytes: 3400,
            divergent_tail_records: 20,
            open_transactions: 1,
        };
        let text = render_with_control(
            &telemetry,
            Vec::new(),
            "",
            ControlMetrics {
                failback: vec![row("a", "COPYING", Some(7)), row("b", "FAILED", None)],
                state_writes: Some(3),
            },
        );
        assert_eq!(
            sample(&text, "kmirror_mirror_state_writes_total"),
            Some(3.0)
        );
        let l = r#"mirror="east",topic="a",partition="0""#;
        for (name, v) in [
            ("kmirror_failback_lag_offsets", 7.0),
            ("kmirror_failback_copied_records_total", 12.0),
            ("kmirror_failback_copied_bytes_total", 3400.0),
            ("kmirror_failback_divergent_tail_records", 20.0),
            ("kmirror_failback_open_transactions", 1.0),
        ] {
            assert_eq!(sample(&text, &format!("{name}{{{l}}}")), Some(v), "{text}");
        }
        for state in FAILBACK_STATES {
            let key = format!(r#"kmirror_failback_state{{{l},state="{state}"}}"#);
            let want = if state == "COPYING" { 1.0 } else { 0.0 };
            assert_eq!(sample(&text, &key), Some(want), "{text}");
        }
        // b's end on kmirror is not known: no lag sample rather than a made-up one.
        let b = r#"mirror="east",topic="b",partition="0""#;
        assert_eq!(
            sample(&text, &format!("kmirror_failback_lag_offsets{{{b}}}")),
            None
        );
        assert_eq!(
            sample(
                &text,
                &format!(r#"kmirror_failback_state{{{b},state="FAILED"}}"#)
            ),
            Some(1.0)
        );
        // Without failbacks: no family at all.
        assert!(!render(&telemetry, Vec::new(), "").contains("kmirror_failback_"));
    }
}
