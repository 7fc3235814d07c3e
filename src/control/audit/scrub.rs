//! Scrub: re-reads a range of a partition's published segments from the files (never the
//! owner's memory, like the Kafka endpoint's readers) and checks every batch's framing and CRC,
//! that offsets only go up and stay inside their segment, and that every `.index` entry in the
//! range points at the start of the batch whose last offset it names (kmirror, like Kafka,
//! indexes a batch by its last offset). Bit rot and a bad disk are found here.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ids::{Offset, TimestampMs};
use crate::limits::OFFSET_INDEX_ENTRY_BYTES;
use crate::log::read_view::{PartitionReadView, SegmentView};
use crate::log::scan::read_header;
#[cfg(test)]
use crate::wire::batch::Batches;
use crate::wire::batch::{Batch, Peek};

/// What the audit compares of one batch (the CRC covers everything after it, payload too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchId {
    pub base_offset: i64,
    pub last_offset: i64,
    pub leader_epoch: i32,
    pub crc: u32,
    pub max_timestamp_ms: i64,
}

impl BatchId {
    pub fn of(b: &Batch<'_>) -> BatchId {
        BatchId {
            base_offset: b.base_offset().0,
            last_offset: b.last_offset().0,
            leader_epoch: b.partition_leader_epoch().0,
            crc: b.stored_crc(),
            max_timestamp_ms: b.max_timestamp().0,
        }
    }
}

/// A local batch that failed the scrub.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScrubFault {
    /// The batch's offsets as its header says (the header itself may be what rotted).
    pub base_offset: i64,
    pub last_offset: i64,
    pub segment: String,
    pub position: u64,
    pub stored_crc: Option<u32>,
    pub computed_crc: Option<u32>,
    pub why: String,
}

/// What one scrub read.
#[derive(Debug, Default)]
pub struct ScrubRead {
    pub batches: Vec<BatchId>,
    pub bytes: u64,
    /// The offset after the last batch read (where the next read starts).
    pub next: Offset,
    /// The log end the view published.
    pub log_end: Offset,
    pub fault: Option<ScrubFault>,
}

/// The log end a view published.
pub fn log_end(view: &PartitionReadView) -> Offset {
    view.segments
        .last()
        .map_or(view.log_start, |s| s.next_offset)
}

/// The offset index entries of a segment, as (absolute offset, position); a torn or
/// unreadable file is a fault of its own.
fn index_entries(seg: &SegmentView) -> Result<Vec<(i64, u64)>, String> {
    const N: usize = OFFSET_INDEX_ENTRY_BYTES as usize;
    let n = seg.offset_index_entries as usize;
    if n == 0 {
        return Ok(Vec::new());
    }
    let path = &seg.files.offset_index;
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut bytes = vec![0u8; n * N];
    file.read_exact_at(&mut bytes, 0)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(bytes
        .chunks_exact(N)
        .map(|c| {
            let rel = u32::from_be_bytes(c[..4].try_into().expect("4 bytes"));
            let pos = u32::from_be_bytes(c[4..].try_into().expect("4 bytes"));
            (seg.base().0.saturating_add(i64::from(rel)), u64::from(pos))
        })
        .collect())
}

/// Reads batches of `view` from `from` (a batch boundary, or the log start) until `budget`
/// bytes were read (at least one batch) or the published end. I/O errors (a segment deleted
/// by retention under the reader) are `Err`: not a fault of the data, the next round retries.
pub fn scrub(view: &PartitionReadView, from: Offset, budget: u64) -> Result<ScrubRead, String> {
    let end = log_end(view);
    let mut out = ScrubRead {
        next: from.max(view.log_start),
        log_end: end,
        ..ScrubRead::default()
    };
    let mut i = view.segment_for(out.next);
    while i < view.segments.len() && out.next < end {
        let seg = &view.segments[i];
        let path = seg.files.log.clone();
        let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let index = index_entries(seg);
        let index = match index {
            Ok(ix) => ix,
            Err(why) => {
                out.fault = Some(fault_at(&path, 0, out.next.0, out.next.0, why));
                return Ok(out);
            }
        };
        // Start at the batch holding `next` (index lookup, then a header walk).
        let mut pos = index
            .iter()
            .take_while(|(o, _)| *o < out.next.0)
            .last()
            .map_or(0, |(_, p)| *p);
        let mut prev_next = seg.base();
        while pos < seg.size {
            let h = match read_header(&file, &path, pos, seg.size) {
                Ok(Some(h)) => h,
                Ok(None) => {
                    out.fault = Some(fault_at(
                        &path,
                        pos,
                        prev_next.0,
                        prev_next.0,
                        "a batch is cut short before the published segment size".into(),
                    ));
                    return Ok(out);
                }
                Err(e) => {
                    out.fault = Some(fault_at(
                        &path,
                        pos,
                        prev_next.0,
                        prev_next.0,
                        e.to_string(),
                    ));
                    return Ok(out);
                }
            };
            if h.last_offset < out.next {
                prev_next = Offset(h.last_offset.0 + 1);
                pos = h.end();
                continue;
            }
            let mut buf = vec![0u8; h.size as usize];
            file.read_exact_at(&mut buf, pos)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            out.bytes += buf.len() as u64;
            let fault = |why: String, stored, computed| ScrubFault {
                stored_crc: stored,
                computed_crc: computed,
                ..fault_at(&path, pos, h.base_offset.0, h.last_offset.0, why)
            };
            let batch = match Batch::peek(&buf) {
                Ok(Peek::Complete(b)) => b,
                Ok(Peek::Incomplete { .. }) => {
                    out.fault = Some(fault("batch shorter than its length".into(), None, None));
                    return Ok(out);
                }
                Err(e) => {
                    out.fault = Some(fault(e.to_string(), None, None));
                    return Ok(out);
                }
            };
            if let Err(e) = batch.validate() {
                let (s, c) = (batch.stored_crc(), batch.computed_crc());
                out.fault = Some(fault(e.to_string(), Some(s), Some(c)));
                return Ok(out);
            }
            if batch.base_offset() < prev_next || batch.next_offset() > seg.next_offset {
                out.fault = Some(fault(
                    format!(
                        "offsets out of order: batch {}..={} after offset {} in a segment ending at {}",
                        batch.base_offset(),
                        batch.last_offset(),
                        prev_next,
                        seg.next_offset
                    ),
                    None,
                    None,
                ));
                return Ok(out);
            }
            // Index entries naming a position inside this batch must name its start and its
            // last offset.
            let batch_end = pos + buf.len() as u64;
            let first = index.partition_point(|(_, p)| *p < pos);
            if let Some((o, p)) = index[first..]
                .iter()
                .take_while(|(_, p)| *p < batch_end)
                .find(|(o, p)| *p != pos || *o != batch.last_offset().0)
            {
                out.fault = Some(fault(
                    format!(
                        "index entry (offset {o}, position {p}) does not match the batch at position {pos} (last offset {})",
                        batch.last_offset()
                    ),
                    None,
                    None,
                ));
                return Ok(out);
            }
            out.batches.push(BatchId::of(&batch));
            prev_next = batch.next_offset();
            out.next = prev_next;
            pos = batch_end;
            if out.bytes >= budget {
                return Ok(out);
            }
        }
        // Every index entry must lie inside the segment's published size.
        if let Some((o, p)) = index.iter().find(|(_, p)| *p >= seg.size) {
            out.fault = Some(fault_at(
                &path,
                *p,
                *o,
                *o,
                format!(
                    "index entry (offset {o}, position {p}) points past the segment's size {}",
                    seg.size
                ),
            ));
            return Ok(out);
        }
        // A gap to the next segment's base (compaction at the source) is fine.
        out.next = out.next.max(seg.next_offset);
        i += 1;
    }
    Ok(out)
}

fn fault_at(path: &Path, position: u64, base: i64, last: i64, why: String) -> ScrubFault {
    ScrubFault {
        base_offset: base,
        last_offset: last,
        segment: path.display().to_string(),
        position,
        stored_crc: None,
        computed_crc: None,
        why,
    }
}

/// Newest timestamp in `batches`, for "verified through offset N (source timestamp T)".
pub fn newest_timestamp(batches: &[BatchId]) -> Option<TimestampMs> {
    batches
        .iter()
        .map(|b| TimestampMs(b.max_timestamp_ms))
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{LeaderEpoch, TopicPartition};
    use crate::log::config::LogConfig;
    use crate::log::io::StdIo;
    use crate::log::partition_log::PartitionLog;
    use crate::wire::batch_builder::BatchBuilder;

    /// A log of `n` batches of 3 records, an index entry after every batch, 2 per segment.
    fn log(
        n: i64,
    ) -> (
        tempfile::TempDir,
        PartitionLog,
        std::sync::Arc<crate::log::read_view::PartitionHandle>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            index_interval_bytes: 1,
            segment_bytes: 500,
            ..LogConfig::default()
        };
        let mut log = PartitionLog::create(
            &dir.path().join("t-0"),
            TopicPartition::new("t", 0),
            None,
            config,
        )
        .unwrap();
        let handle = log.attach_read_view();
        for i in 0..n {
            let mut b = BatchBuilder::new(Offset(i * 3)).leader_epoch(LeaderEpoch(2));
            for r in 0..3 {
                b = b.value(TimestampMs(1_000 + i * 3 + r), &[i as u8; 40]);
            }
            log.append(&mut StdIo, &b.build()).unwrap();
        }
        (dir, log, handle)
    }

    #[test]
    fn a_clean_log_reads_whole_and_within_a_budget() {
        let (_d, _log, h) = log(7);
        let v = h.view();
        assert!(v.segments.len() >= 3, "{:?}", v.segments.len());
        let all = scrub(&v, Offset(0), u64::MAX).unwrap();
        assert!(all.fault.is_none(), "{:?}", all.fault);
        assert_eq!(all.batches.len(), 7);
        assert_eq!((all.next, all.log_end), (Offset(21), Offset(21)));
        let some = scrub(&v, Offset(6), 1).unwrap();
        assert_eq!(
            some.batches.len(),
            1,
            "at least one batch, even below the budget"
        );
        assert_eq!((some.batches[0].base_offset, some.next), (6, Offset(9)));
        assert_eq!(some.batches[0].leader_epoch, 2);
    }

    #[test]
    fn a_flipped_byte_and_a_wrong_index_entry_name_their_batch() {
        let (_d, _log, h) = log(6);
        let v = h.view();
        let seg = &v.segments[1];
        let bytes = std::fs::read(&seg.files.log).unwrap();
        let (pos, second) = {
            let mut it = Batches::new(&bytes).map(|b| b.unwrap());
            it.next();
            it.next().unwrap()
        };
        let (base, last, size) = (
            second.base_offset().0,
            second.last_offset().0,
            second.size(),
        );
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&seg.files.log)
            .unwrap();
        let at = (pos + size - 1) as u64;
        f.write_all_at(&[bytes[pos + size - 1] ^ 1], at).unwrap();
        let r = scrub(&v, Offset(0), u64::MAX).unwrap();
        let fault = r.fault.unwrap();
        assert_eq!((fault.base_offset, fault.last_offset), (base, last));
        assert_eq!(fault.position, pos as u64);
        assert_ne!(fault.stored_crc, fault.computed_crc);
        assert_eq!(r.next, Offset(base), "verified up to the batch before");
        f.write_all_at(&[bytes[pos + size - 1]], at).unwrap();
        assert!(scrub(&v, Offset(0), u64::MAX).unwrap().fault.is_none());

        // The index's first entry of the segment says a wrong last offset.
        let ix = std::fs::OpenOptions::new()
            .write(true)
            .open(&seg.files.offset_index)
            .unwrap();
        ix.write_all_at(&7u32.to_be_bytes(), 0).unwrap();
        let fault = scrub(&v, Offset(0), u64::MAX).unwrap().fault.unwrap();
        assert!(fault.why.contains("index entry"), "{fault:?}");
    }
}
