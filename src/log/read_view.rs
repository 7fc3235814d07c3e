//! Immutable, published snapshots of a partition log for readers on other threads.
//!
//! Kafka's files are append-only: any byte below a published end stays what it was until the
//! owner truncates or deletes (rare, and announced by a new view). So the thread that owns a
//! `PartitionLog` (a shard, or the control thread while it holds the log) publishes, after
//! every append, roll, truncation and retention pass, a `PartitionReadView`: the segment list
//! with each segment's files and published sizes, log start, high watermark, last stable
//! offset and epochs. Readers (the Kafka endpoint) load the current view through an
//! `ArcSwap`, never touch the owner's mutable state and take no lock the owner takes: a
//! publish is one allocation and one atomic swap on the owner's side.
//!
//! Paths of a segment are shared (`Arc`) between views, so a publish after an append copies
//! no path; the list of sealed segments is shared until a roll, truncation or retention
//! changes it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use uuid::Uuid;

use crate::ids::{LeaderEpoch, Offset, TimestampMs, TopicPartition};
use crate::log::config::LogConfig;
use crate::log::epoch_cache::EpochEntry;
use crate::log::segment::Segment;

/// The files of one segment.
#[derive(Debug, PartialEq, Eq)]
pub struct SegmentFiles {
    pub base: Offset,
    pub log: PathBuf,
    pub offset_index: PathBuf,
    pub time_index: PathBuf,
    pub txn_index: PathBuf,
}

/// One segment as published: how much of each file a reader may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentView {
    pub files: Arc<SegmentFiles>,
    /// Bytes of `.log` holding whole, published batches.
    pub size: u64,
    /// The offset after the segment's last batch.
    pub next_offset: Offset,
    pub offset_index_entries: u32,
    pub time_index_entries: u32,
    pub txn_index_entries: u32,
    pub max_timestamp: Option<TimestampMs>,
}

impl SegmentView {
    pub fn base(&self) -> Offset {
        self.files.base
    }
}

/// Everything a reader needs to serve one partition, as of one publish.
#[derive(Debug, Clone)]
pub struct PartitionReadView {
    pub tp: TopicPartition,
    pub topic_id: Option<Uuid>,
    pub dir: Arc<Path>,
    pub config: Arc<LogConfig>,
    pub log_start: Offset,
    /// A mirror exposes all it stored: the high watermark is the log end.
    pub high_watermark: Offset,
    pub last_stable_offset: Offset,
    pub epochs: Arc<[EpochEntry]>,
    /// Sorted by base offset; the last one is the active segment. Never empty.
    pub segments: Arc<[SegmentView]>,
}

impl PartitionReadView {
    /// The epoch kmirror announces as leader epoch: the latest in the data (the source's), or 0
    /// for a log without epochs.
    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.epochs
            .last()
            .map_or(LeaderEpoch(0), |e| e.epoch.max(LeaderEpoch(0)))
    }

    /// The epoch of the entry covering `offset`.
    pub fn epoch_for_offset(&self, offset: Offset) -> Option<LeaderEpoch> {
        self.epochs
            .iter()
            .rev()
            .find(|e| e.start_offset <= offset)
            .map(|e| e.epoch)
    }

    /// Kafka's `endOffsetFor` over the published epochs (see `LeaderEpochCache::end_offset_for`).
    pub fn end_offset_for(&self, requested: LeaderEpoch) -> (LeaderEpoch, Offset) {
        crate::log::epoch_cache::end_offset_for(&self.epochs, requested, self.high_watermark)
    }

    /// Index of the last segment whose base is ≤ `offset` (0 when `offset` is below all).
    pub fn segment_for(&self, offset: Offset) -> usize {
        self.segments
            .partition_point(|s| s.base() <= offset)
            .saturating_sub(1)
    }
}

/// A partition's published view plus what the endpoint must know about its state.
#[derive(Debug)]
pub struct PartitionHandle {
    view: ArcSwap<PartitionReadView>,
    /// False while the partition is mirrored (clients may only read it); the failover path
    /// sets it once the partition is STOPPED and local producers may write.
    writable: AtomicBool,
}

impl PartitionHandle {
    pub fn view(&self) -> Arc<PartitionReadView> {
        self.view.load_full()
    }

    pub fn is_writable(&self) -> bool {
        self.writable.load(Ordering::Acquire)
    }

    pub fn set_writable(&self, writable: bool) {
        self.writable.store(writable, Ordering::Release)
    }
}

/// The partitions readers can see, by name. Changed by the control thread when partitions are
/// added or deleted (rare); read on every request without a lock.
#[derive(Debug, Default)]
pub struct ReadCatalog {
    partitions: ArcSwap<BTreeMap<TopicPartition, Arc<PartitionHandle>>>,
    /// The cluster id of the data dir these partitions live in (`serve::cluster_id`), told
    /// to clients in Metadata; set once at start.
    cluster_id: std::sync::OnceLock<String>,
}

impl ReadCatalog {
    pub fn new() -> Arc<ReadCatalog> {
        Arc::new(ReadCatalog::default())
    }

    /// Sets the cluster id once; a second call keeps the first (one data dir, one id).
    pub fn set_cluster_id(&self, id: String) {
        let _ = self.cluster_id.set(id);
    }

    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.get().map(String::as_str)
    }

    pub fn snapshot(&self) -> Arc<BTreeMap<TopicPartition, Arc<PartitionHandle>>> {
        self.partitions.load_full()
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<Arc<PartitionHandle>> {
        self.partitions.load().get(tp).cloned()
    }

    pub(crate) fn insert(&self, tp: TopicPartition, handle: Arc<PartitionHandle>) {
        self.partitions.rcu(|old| {
            let mut map = BTreeMap::clone(old);
            map.insert(tp.clone(), Arc::clone(&handle));
            map
        });
    }

    /// `insert` of many partitions with one copy of the map: inserting 16,384 one by one
    /// copied it 16,384 times (52 s of a restart at load 35).
    pub(crate) fn insert_many(
        &self,
        handles: impl IntoIterator<Item = (TopicPartition, Arc<PartitionHandle>)>,
    ) {
        let handles: Vec<_> = handles.into_iter().collect();
        self.partitions.rcu(|old| {
            let mut map = BTreeMap::clone(old);
            for (tp, handle) in &handles {
                map.insert(tp.clone(), Arc::clone(handle));
            }
            map
        });
    }

    pub(crate) fn remove(&self, tp: &TopicPartition) {
        self.partitions.rcu(|old| {
            let mut map = BTreeMap::clone(old);
            map.remove(tp);
            map
        });
    }
}

/// The owner's side: the handle it publishes to and the pieces it reuses between publishes.
#[derive(Debug)]
pub(crate) struct Publisher {
    handle: Arc<PartitionHandle>,
    dir: Arc<Path>,
    config: Arc<LogConfig>,
    sealed: Arc<[SegmentView]>,
    active_files: Arc<SegmentFiles>,
    epochs: Arc<[EpochEntry]>,
}

/// What a publish is built from (the owner's current state).
pub(crate) struct LogState<'a> {
    pub tp: &'a TopicPartition,
    pub topic_id: Option<Uuid>,
    pub dir: &'a Path,
    pub config: &'a LogConfig,
    pub segments: &'a [Segment],
    pub log_start: Offset,
    pub high_watermark: Offset,
    pub last_stable_offset: Offset,
    pub epochs: &'a [EpochEntry],
}

fn files_of(seg: &Segment) -> Arc<SegmentFiles> {
    Arc::new(SegmentFiles {
        base: seg.base_offset(),
        log: seg.log_path().to_path_buf(),
        offset_index: seg.offset_index().path().to_path_buf(),
        time_index: seg.time_index().path().to_path_buf(),
        txn_index: seg.txn_index().path().to_path_buf(),
    })
}

fn segment_view(seg: &Segment, files: Arc<SegmentFiles>) -> SegmentView {
    SegmentView {
        files,
        size: seg.size(),
        next_offset: seg.next_offset(),
        offset_index_entries: seg.offset_index().len() as u32,
        time_index_entries: seg.time_index().len() as u32,
        txn_index_entries: seg.txn_index().entries().len() as u32,
        max_timestamp: seg.max_timestamp(),
    }
}

fn build_view(state: &LogState<'_>, p: &Publisher) -> PartitionReadView {
    let active = state.segments.last().expect("a log has an active segment");
    let mut segments = Vec::with_capacity(p.sealed.len() + 1);
    segments.extend(p.sealed.iter().cloned());
    segments.push(segment_view(active, Arc::clone(&p.active_files)));
    PartitionReadView {
        tp: state.tp.clone(),
        topic_id: state.topic_id,
        dir: Arc::clone(&p.dir),
        config: Arc::clone(&p.config),
        log_start: state.log_start,
        high_watermark: state.high_watermark,
        last_stable_offset: state.last_stable_offset,
        epochs: Arc::clone(&p.epochs),
        segments: segments.into(),
    }
}

impl Publisher {
    /// A new handle showing `state`.
    pub fn new(state: &LogState<'_>) -> Publisher {
        let active = state.segments.last().expect("a log has an active segment");
        let sealed = sealed_views(state.segments);
        let mut p = Publisher {
            handle: Arc::new(PartitionHandle {
                view: ArcSwap::from_pointee(PartitionReadView {
                    tp: state.tp.clone(),
                    topic_id: state.topic_id,
                    dir: Arc::from(state.dir),
                    config: Arc::new(state.config.clone()),
                    log_start: state.log_start,
                    high_watermark: state.high_watermark,
                    last_stable_offset: state.last_stable_offset,
                    epochs: Arc::from(state.epochs),
                    segments: Arc::from(Vec::new()),
                }),
                writable: AtomicBool::new(false),
            }),
            dir: Arc::from(state.dir),
            config: Arc::new(state.config.clone()),
            sealed,
            active_files: files_of(active),
            epochs: Arc::from(state.epochs),
        };
        p.publish(state);
        p
    }

    /// The settings the next publish carries.
    pub fn set_config(&mut self, config: &LogConfig) {
        self.config = Arc::new(config.clone());
    }

    pub fn handle(&self) -> &Arc<PartitionHandle> {
        &self.handle
    }

    /// Publishes `state`. Sealed segments and epochs are rebuilt only when they changed
    /// (roll, truncation, retention, a new epoch), so an ordinary append costs one allocation
    /// for the segment list and one for the view.
    pub fn publish(&mut self, state: &LogState<'_>) {
        let active = state.segments.last().expect("a log has an active segment");
        let sealed_now = &state.segments[..state.segments.len() - 1];
        let sealed_same = self.sealed.len() == sealed_now.len()
            && self
                .sealed
                .iter()
                .zip(sealed_now)
                .all(|(v, s)| v.base() == s.base_offset() && v.size == s.size());
        if !sealed_same {
            self.sealed = sealed_views(state.segments);
        }
        if self.active_files.base != active.base_offset() || !sealed_same {
            self.active_files = files_of(active);
        }
        if *self.epochs != *state.epochs {
            self.epochs = Arc::from(state.epochs);
        }
        let view = build_view(state, self);
        self.handle.view.store(Arc::new(view));
    }
}

fn sealed_views(segments: &[Segment]) -> Arc<[SegmentView]> {
    segments[..segments.len() - 1]
        .iter()
        .map(|s| segment_view(s, files_of(s)))
        .collect::<Vec<_>>()
        .into()
}
