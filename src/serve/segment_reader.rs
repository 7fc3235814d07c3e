//! Lookups on a published segment by reading its files (`pread`), never the owner's memory.
//!
//! Index files are exact-size and append-only (ARCHITECTURE.md "On-disk layout"), so the
//! first `n` entries a view publishes are stable; a lookup binary-searches them with one small
//! read per step, then walks batch headers in the `.log` from the position found, exactly as
//! the owner's in-memory lookups do.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::ids::{FilePosition, Offset, TimestampMs};
use crate::limits::{OFFSET_INDEX_ENTRY_BYTES, TIME_INDEX_ENTRY_BYTES, TXN_INDEX_ENTRY_BYTES};
use crate::log::read_view::SegmentView;
use crate::log::scan::{read_header, BatchHeader};
use crate::log::txn_index::AbortedTxn;
use crate::log::LogError;

/// A published segment with its `.log` open.
#[derive(Debug)]
pub struct OpenSegment {
    pub view: SegmentView,
    pub log: std::sync::Arc<File>,
}

impl OpenSegment {
    pub fn open(view: &SegmentView) -> Result<OpenSegment, LogError> {
        let log = File::open(&view.files.log).map_err(|e| LogError::io(&view.files.log, e))?;
        let log = std::sync::Arc::new(log);
        Ok(OpenSegment {
            view: view.clone(),
            log,
        })
    }

    fn read_header(&self, pos: u64) -> Result<Option<BatchHeader>, LogError> {
        read_header(&self.log, &self.view.files.log, pos, self.view.size)
    }

    /// The first batch whose last offset is ≥ `offset` (Kafka's `translateOffset`).
    pub fn translate(&self, offset: Offset) -> Result<Option<BatchHeader>, LogError> {
        let (_, start) = index_lookup(&self.view, offset)?;
        let mut pos = start.0 as u64;
        while let Some(h) = self.read_header(pos)? {
            if h.last_offset >= offset {
                return Ok(Some(h));
            }
            pos = h.end();
        }
        Ok(None)
    }

    /// The byte position where data at offsets ≥ `offset` begins (the segment size when every
    /// batch lies below it).
    pub fn position_of(&self, offset: Offset) -> Result<u64, LogError> {
        Ok(self
            .translate(offset)?
            .map_or(self.view.size, |h| h.position.0 as u64))
    }

    /// The header of the batch starting at `pos`.
    pub fn header_at(&self, pos: u64) -> Result<Option<BatchHeader>, LogError> {
        self.read_header(pos)
    }

    /// First batch whose max timestamp is ≥ `target` and last offset ≥ `min_offset` (Kafka's
    /// `searchForTimestamp` at batch level).
    pub fn find_batch_by_timestamp(
        &self,
        target: TimestampMs,
        min_offset: Offset,
    ) -> Result<Option<BatchHeader>, LogError> {
        let (_, indexed) = time_lookup(&self.view, target)?;
        let (_, start) = index_lookup(&self.view, indexed.max(min_offset))?;
        let mut pos = start.0 as u64;
        while let Some(h) = self.read_header(pos)? {
            if h.max_timestamp >= target && h.last_offset >= min_offset {
                return Ok(Some(h));
            }
            pos = h.end();
        }
        Ok(None)
    }

    /// The whole batch described by `h`.
    pub fn read_batch(&self, h: &BatchHeader) -> Result<Vec<u8>, LogError> {
        let mut buf = vec![0u8; h.size as usize];
        self.log
            .read_exact_at(&mut buf, h.position.0 as u64)
            .map_err(|e| LogError::io(&self.view.files.log, e))?;
        Ok(buf)
    }
}

fn read_entry<const N: usize>(
    file: &File,
    path: &std::path::Path,
    i: u32,
) -> Result<[u8; N], LogError> {
    let mut buf = [0u8; N];
    file.read_exact_at(&mut buf, i as u64 * N as u64)
        .map_err(|e| LogError::io(path, e))?;
    Ok(buf)
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}

/// The largest `.index` entry with offset ≤ `target`, as (offset, position); the segment
/// start when there is none.
pub fn index_lookup(seg: &SegmentView, target: Offset) -> Result<(Offset, FilePosition), LogError> {
    const N: usize = OFFSET_INDEX_ENTRY_BYTES as usize;
    let base = seg.base();
    let n = seg.offset_index_entries;
    if target <= base || n == 0 {
        return Ok((base, FilePosition(0)));
    }
    let path = &seg.files.offset_index;
    let file = File::open(path).map_err(|e| LogError::io(path, e))?;
    let rel = (target.0 - base.0).min(u32::MAX as i64) as u32;
    // Invariant of the search: entries below `lo` are ≤ target, entries at `hi` and above are >.
    let (mut lo, mut hi) = (0u32, n);
    let mut found = None;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let e: [u8; N] = read_entry(&file, path, mid)?;
        if be_u32(&e[..4]) <= rel {
            found = Some((be_u32(&e[..4]), be_u32(&e[4..])));
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(match found {
        Some((r, pos)) => (entry_offset(path, base, r)?, FilePosition(pos)),
        None => (base, FilePosition(0)),
    })
}

/// The absolute offset of an index entry read straight from the file (the owner checked its
/// entries, but a file is read here without its help): a sum past `OFFSET_MAX` is corruption.
fn entry_offset(path: &std::path::Path, base: Offset, rel: u32) -> Result<Offset, LogError> {
    base.checked_add(i64::from(rel)).ok_or_else(|| {
        LogError::corrupt(
            path,
            format!("entry at relative offset {rel} overflows base {base}"),
        )
    })
}

/// The `.timeindex` entry with the largest timestamp ≤ `target`, as (timestamp, offset);
/// (NONE, base) when there is none.
pub fn time_lookup(
    seg: &SegmentView,
    target: TimestampMs,
) -> Result<(TimestampMs, Offset), LogError> {
    const N: usize = TIME_INDEX_ENTRY_BYTES as usize;
    let base = seg.base();
    let n = seg.time_index_entries;
    if n == 0 {
        return Ok((TimestampMs::NONE, base));
    }
    let path = &seg.files.time_index;
    let file = File::open(path).map_err(|e| LogError::io(path, e))?;
    let (mut lo, mut hi) = (0u32, n);
    let mut found = None;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let e: [u8; N] = read_entry(&file, path, mid)?;
        let ts = i64::from_be_bytes(e[..8].try_into().expect("8 bytes"));
        if ts <= target.0 {
            found = Some((ts, be_u32(&e[8..])));
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(match found {
        Some((ts, r)) => (TimestampMs(ts), entry_offset(path, base, r)?),
        None => (TimestampMs::NONE, base),
    })
}

/// The published entries of the segment's `.txnindex`.
pub fn aborted_txns(seg: &SegmentView) -> Result<Vec<AbortedTxn>, LogError> {
    const N: usize = TXN_INDEX_ENTRY_BYTES as usize;
    let n = seg.txn_index_entries;
    if n == 0 {
        return Ok(Vec::new());
    }
    let path = &seg.files.txn_index;
    let file = File::open(path).map_err(|e| LogError::io(path, e))?;
    let mut bytes = vec![0u8; n as usize * N];
    file.read_exact_at(&mut bytes, 0)
        .map_err(|e| LogError::io(path, e))?;
    bytes
        .chunks_exact(N)
        .enumerate()
        .map(|(i, c)| {
            AbortedTxn::decode(c.try_into().expect("exact chunk"))
                .map_err(|why| LogError::corrupt(path, format!("entry {i}: {why}")))
        })
        .collect()
}
