//! Offset-index append: the bookkeeping alone (an I/O sink that drops the bytes) and with one
//! `pwrite` per entry (`StdIo`, the tools' engine), to show what the per-entry write costs.
//!
//! Run with `cargo bench --bench index`.

use std::fs::File;
use std::hint::black_box;
use std::io;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kmirror::ids::{FilePosition, Offset};
use kmirror::log::io::{LogIo, StdIo};
use kmirror::log::offset_index::OffsetIndex;

/// Entries appended per iteration: a 1 GiB segment with 4 KiB index interval gets ~262k, so a
/// thousand is a slice of one segment's life.
const ENTRIES: u32 = 1000;

/// Accepts every write and keeps nothing, so only the index's own work is timed.
struct SinkIo;

impl LogIo for SinkIo {
    fn write_all_at(&mut self, _file: &File, pos: u64, data: &[u8]) -> io::Result<()> {
        black_box((pos, data));
        Ok(())
    }

    fn sync_data(&mut self, _file: &File) -> io::Result<()> {
        Ok(())
    }
}

fn append_all(index: &mut OffsetIndex, io: &mut impl LogIo) {
    for i in 0..ENTRIES {
        index
            .append(io, Offset(i as i64 * 100), FilePosition(i * 4096))
            .expect("append");
    }
}

fn offset_index_append(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("00000000000000000000.index");
    let mut g = c.benchmark_group("offset_index_append_1000");
    g.throughput(Throughput::Elements(ENTRIES as u64));
    g.bench_function("sink_io", |b| {
        b.iter_batched_ref(
            || OffsetIndex::create(&path, Offset(0), ENTRIES).expect("create"),
            |index| append_all(index, &mut SinkIo),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("std_io_pwrite", |b| {
        b.iter_batched_ref(
            || OffsetIndex::create(&path, Offset(0), ENTRIES).expect("create"),
            |index| append_all(index, &mut StdIo),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = offset_index_append
}
criterion_main!(benches);
