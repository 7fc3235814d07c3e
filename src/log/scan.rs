//! Walking the batches stored in a `.log` file: whole batches (recovery, verify, dump) or just
//! their headers (reads and lookups, which must not pull whole batches into memory).

use std::fs::File;
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::ids::{FilePosition, Offset, TimestampMs};
use crate::limits::{
    BATCH_BYTES_MAX, BATCH_HEADER_PEEK_BYTES, LOG_OVERHEAD, SEGMENT_SCAN_BUFFER_BYTES,
};
use crate::log::LogError;
use crate::wire::batch::{Batch, BatchError, Peek};

/// The header fields of a stored batch that reads and lookups need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub position: FilePosition,
    pub size: u32,
    pub base_offset: Offset,
    pub last_offset: Offset,
    pub max_timestamp: TimestampMs,
}

impl BatchHeader {
    pub fn of(position: FilePosition, batch: &Batch<'_>) -> BatchHeader {
        BatchHeader {
            position,
            size: batch.size() as u32,
            base_offset: batch.base_offset(),
            last_offset: batch.last_offset(),
            max_timestamp: batch.max_timestamp(),
        }
    }

    pub fn end(&self) -> u64 {
        self.position.0 as u64 + self.size as u64
    }
}

/// Reads the header of the batch at `pos`; `None` at the end of the data or when the batch there
/// is not complete before `end` (a torn tail, which the reader treats as the end, as Kafka's
/// file reader does).
pub fn read_header(
    file: &File,
    path: &Path,
    pos: u64,
    end: u64,
) -> Result<Option<BatchHeader>, LogError> {
    if pos >= end {
        return Ok(None);
    }
    let want = (end - pos).min(BATCH_HEADER_PEEK_BYTES as u64) as usize;
    let mut buf = [0u8; BATCH_HEADER_PEEK_BYTES];
    file.read_exact_at(&mut buf[..want], pos)
        .map_err(|e| LogError::io(path, e))?;
    let buf = &buf[..want];
    if buf.len() < LOG_OVERHEAD + 5 {
        return Ok(None);
    }
    let length = i32::from_be_bytes(buf[8..12].try_into().expect("4 bytes"));
    let size = length as i64 + LOG_OVERHEAD as i64;
    let magic = buf[16] as i8;
    let min = match magic {
        2 => BATCH_HEADER_PEEK_BYTES,
        1 => LOG_OVERHEAD + 22,
        0 => LOG_OVERHEAD + 14,
        _ => LOG_OVERHEAD + 14,
    };
    let base = i64::from_be_bytes(buf[..8].try_into().expect("8 bytes"));
    if size < min as i64 || size > BATCH_BYTES_MAX as i64 || !(0..=2).contains(&magic) {
        return Err(LogError::corrupt(
            path,
            format!("malformed batch header at position {pos} (offset {base}, size {size}, magic {magic})"),
        ));
    }
    if pos + size as u64 > end {
        return Ok(None);
    }
    let (last, max_ts) = match magic {
        2 => {
            let delta = i32::from_be_bytes(buf[23..27].try_into().expect("4 bytes"));
            let ts = i64::from_be_bytes(buf[35..43].try_into().expect("8 bytes"));
            (base + delta as i64, ts)
        }
        1 => (
            base,
            i64::from_be_bytes(buf[18..26].try_into().expect("8 bytes")),
        ),
        _ => (base, -1),
    };
    Ok(Some(BatchHeader {
        position: FilePosition(pos as u32),
        size: size as u32,
        base_offset: Offset(base),
        last_offset: Offset(last),
        max_timestamp: TimestampMs(max_ts),
    }))
}

/// How a walk over a `.log` file ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanEnd {
    /// Every byte up to the end belonged to a complete batch.
    Clean,
    /// The callback stopped the walk at this position (the batch there was not consumed).
    Stopped { at: u64 },
    /// A partial batch starts at `at` (a torn write).
    Partial { at: u64 },
    /// The bytes at `at` cannot be framed as a batch.
    Malformed { at: u64, error: BatchError },
}

/// Calls `f` with each complete batch from `start` to `end`, in order. The batch is framed, not
/// validated: the caller checks CRCs as its job requires.
pub fn for_each_batch<F>(
    file: &File,
    path: &Path,
    start: u64,
    end: u64,
    mut f: F,
) -> Result<ScanEnd, LogError>
where
    F: FnMut(FilePosition, Batch<'_>) -> Result<ControlFlow<()>, LogError>,
{
    let mut buf: Vec<u8> = Vec::new();
    let mut buf_start = start; // file position of buf[0]
    let mut consumed = 0usize; // bytes of buf already handed out
    let mut file_pos = start; // next byte to read from the file
    loop {
        // Hand out every complete batch in the buffer.
        let mut needed = None;
        while consumed < buf.len() {
            match Batch::peek(&buf[consumed..]) {
                Ok(Peek::Complete(batch)) => {
                    let at = buf_start + consumed as u64;
                    let size = batch.size();
                    if f(FilePosition(at as u32), batch)?.is_break() {
                        return Ok(ScanEnd::Stopped { at });
                    }
                    consumed += size;
                }
                Ok(Peek::Incomplete { needed: n }) => {
                    needed = n;
                    break;
                }
                Err(error) => {
                    return Ok(ScanEnd::Malformed {
                        at: buf_start + consumed as u64,
                        error,
                    })
                }
            }
        }
        if file_pos >= end {
            return Ok(if consumed < buf.len() {
                ScanEnd::Partial {
                    at: buf_start + consumed as u64,
                }
            } else {
                ScanEnd::Clean
            });
        }
        // Keep the unconsumed tail and read more behind it, enough for the pending batch.
        buf.drain(..consumed);
        buf_start += consumed as u64;
        consumed = 0;
        let want = needed
            .unwrap_or(0)
            .max(SEGMENT_SCAN_BUFFER_BYTES)
            .saturating_sub(buf.len());
        let want = want
            .min((end - file_pos) as usize)
            .max(1)
            .min((end - file_pos) as usize);
        let old = buf.len();
        buf.resize(old + want, 0);
        file.read_exact_at(&mut buf[old..], file_pos)
            .map_err(|e| LogError::io(path, e))?;
        file_pos += want as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::batch_builder::BatchBuilder;
    use std::io::Write;

    #[test]
    fn walks_batches_and_reports_partial_tail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("0.log");
        let a = BatchBuilder::new(Offset(0))
            .value(TimestampMs(10), b"12345")
            .value(TimestampMs(11), b"12345")
            .build();
        let b = BatchBuilder::new(Offset(2))
            .value(TimestampMs(20), b"12345")
            .build();
        let mut f = std::fs::File::create(&path).expect("create");
        f.write_all(&a).expect("write");
        f.write_all(&b).expect("write");
        f.write_all(&b[..20]).expect("write");
        let file = std::fs::File::open(&path).expect("open");
        let end = (a.len() + b.len() + 20) as u64;
        let mut seen = Vec::new();
        let outcome = for_each_batch(&file, &path, 0, end, |pos, batch| {
            seen.push((pos.0, batch.base_offset().0));
            Ok(ControlFlow::Continue(()))
        })
        .expect("scan");
        assert_eq!(seen, vec![(0, 0), (a.len() as u32, 2)]);
        assert_eq!(
            outcome,
            ScanEnd::Partial {
                at: (a.len() + b.len()) as u64
            }
        );
        let h = read_header(&file, &path, a.len() as u64, end)
            .expect("header")
            .expect("some");
        assert_eq!(
            (h.base_offset, h.last_offset, h.max_timestamp),
            (Offset(2), Offset(2), TimestampMs(20))
        );
        assert_eq!(
            read_header(&file, &path, (a.len() + b.len()) as u64, end).expect("header"),
            None
        );
    }
}
