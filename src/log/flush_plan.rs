//! A flush a partition log plans and its owner performs: the fdatasyncs that make everything
//! below a target offset durable, after which the log's recovery point may move there.
//!
//! Why a plan: a segment roll (every `segment.bytes` of a partition) and the periodic
//! recovery-point checkpoint make the data above the recovery point durable, and an fdatasync
//! waits for the disk to write everything still dirty (a gigabyte segment took 2 s on this
//! VM). Done inline, that stopped the shard, and every partition it fetches, for the whole
//! write-back. Kafka runs these flushes on its scheduler, off the append path; here the shard
//! submits the plan's syncs to its ring and goes on fetching and appending, and the log moves
//! its recovery point only when the owner reports that every sync succeeded
//! (`PartitionLog::finish_flush`). Synchronous owners (tools, the control thread, tests) run
//! the same plan through their `LogIo` (`PartitionLog::flush`), so a test disk still sees, and
//! can fail, every sync.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::ids::Offset;
use crate::log::lazy_file::SyncTicket;

/// Which file of a segment a planned sync covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentFile {
    Log,
    OffsetIndex,
    TimeIndex,
    TxnIndex,
}

/// One fdatasync of a plan.
#[derive(Debug)]
pub struct PlannedSync {
    /// The base offset of the segment the file belongs to.
    pub(crate) segment: Offset,
    /// Which of its files; `None` for the partition directory.
    pub(crate) which: Option<SegmentFile>,
    pub(crate) path: PathBuf,
    pub(crate) ticket: SyncTicket,
}

impl PlannedSync {
    /// The partition directory (new segment files' entries). fdatasync of a directory on
    /// Linux writes its entries, which is all a new file's name needs.
    pub(crate) fn directory(dir: &Path) -> Result<PlannedSync, crate::log::LogError> {
        let file = File::open(dir).map_err(|e| crate::log::LogError::io(dir, e))?;
        Ok(PlannedSync {
            segment: Offset(-1),
            which: None,
            path: dir.to_path_buf(),
            ticket: SyncTicket {
                file: Arc::new(file),
                covers: 0,
            },
        })
    }

    /// The descriptor to fdatasync; the plan keeps it open until the plan is dropped, also when
    /// the log closes or deletes the file meanwhile.
    pub fn file(&self) -> &Arc<File> {
        &self.ticket.file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The syncs of one flush, in no particular order (they may all run at once), and the offset
/// below which they make the log durable. Hand it back to `PartitionLog::finish_flush` with
/// the first error among them.
#[derive(Debug)]
#[must_use = "a planned flush must be finished with PartitionLog::finish_flush"]
pub struct FlushPlan {
    pub(crate) target: Offset,
    /// The log's unflushed message count when the plan was made (what finishing it flushed).
    pub(crate) messages: u64,
    pub(crate) syncs: Vec<PlannedSync>,
}

impl FlushPlan {
    pub fn syncs(&self) -> &[PlannedSync] {
        &self.syncs
    }

    /// The recovery point the log moves to when the plan's syncs all succeeded.
    pub fn target(&self) -> Offset {
        self.target
    }
}
