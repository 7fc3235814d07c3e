//! Hot-path microbenchmarks: batch header validation with CRC, walking a fetch response's
//! records, decoding a whole fetch response, and CRC-32C alone as the baseline they are bound by.
//!
//! Run with `cargo bench --bench batch`; each group is kept to a couple of seconds.

use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::fetch_response::FetchResponse;
use kafka_protocol::messages::ResponseHeader;
use kafka_protocol::protocol::Decodable;
use kmirror::bench::fetch_response::{self, ResponseFrame};
use kmirror::bench::records::{BatchTemplate, Catalog};
use kmirror::bench::{SynthCodec, SynthSpec};
use kmirror::ids::Offset;
use kmirror::wire::batch::{crc32c, Batch, Batches, Peek};
use kmirror::wire::crc32c::Kernel;
use std::hint::black_box;

const SIZES: [(&str, usize); 2] = [("16KiB", 16 * 1024), ("1MiB", 1024 * 1024)];

fn template(batch_bytes: usize) -> BatchTemplate {
    let spec = SynthSpec {
        codec: SynthCodec::Lz4,
        batch_bytes,
        ..SynthSpec::default()
    };
    BatchTemplate::for_spec(&spec).expect("template builds")
}

fn crc_baseline(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc32c");
    for (name, size) in SIZES {
        let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), &data, |b, d| {
            b.iter(|| crc32c(black_box(d)))
        });
        // Each kernel on its own (`wire::crc32c`): the one above is whichever was faster at start.
        for k in Kernel::ALL {
            g.bench_with_input(BenchmarkId::new(k.name(), name), &data, |b, d| {
                b.iter(|| k.checksum(black_box(d)))
            });
        }
    }
    g.finish();
    let chosen = kmirror::wire::crc32c::choice();
    eprintln!(
        "crc32c kernel chosen: {} (calibration: fusion {:?}, folding {:?})",
        chosen.kernel.name(),
        chosen.best[0],
        chosen.best[1]
    );
}

fn batch_validate(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch_peek_validate");
    for (name, size) in SIZES {
        let t = template(size);
        let bytes = t.stamped(Offset(1_000_000));
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), &bytes, |b, buf| {
            b.iter(|| match Batch::peek(black_box(buf)) {
                Ok(Peek::Complete(batch)) => batch.validate().is_ok(),
                _ => false,
            })
        });
    }
    g.finish();
}

/// One partition's records in a fetch response: `total` bytes of back-to-back batches of
/// `batch` bytes each, consecutive offsets, cut at a partial trailing batch like a broker does.
fn records_blob(batch: usize, total: usize) -> Vec<u8> {
    let t = template(batch);
    let rpb = t.records_per_batch() as i64;
    let mut out = Vec::with_capacity(total + batch);
    let mut i = 0;
    while out.len() + t.size() <= total {
        out.extend_from_slice(&t.stamped(Offset(i * rpb)));
        i += 1;
    }
    let partial = t.stamped(Offset(i * rpb));
    out.extend_from_slice(&partial[..partial.len() / 2]);
    out
}

fn walk_records(c: &mut Criterion) {
    let mut g = c.benchmark_group("records_walk_1MiB");
    let blob = records_blob(16 * 1024, 1024 * 1024);
    g.throughput(Throughput::Bytes(blob.len() as u64));
    g.bench_function("batches_16KiB_headers_only", |b| {
        b.iter(|| Batches::new(black_box(&blob)).filter(|r| r.is_ok()).count())
    });
    g.bench_function("batches_16KiB_with_crc", |b| {
        b.iter(|| {
            Batches::new(black_box(&blob))
                .filter(|r| matches!(r, Ok((_, batch)) if batch.validate().is_ok()))
                .count()
        })
    });
    g.finish();
}

/// A 16-partition, 16 MiB fetch response as the synthetic source sends it, decoded with
/// kafka-protocol from `Bytes` (records stay zero-copy slices of the frame).
fn decode_fetch_response(c: &mut Criterion) {
    let spec = SynthSpec {
        partitions: 16,
        codec: SynthCodec::Lz4,
        ..SynthSpec::default()
    };
    let catalog = Catalog::new(spec.clone()).expect("catalog");
    let topic = FetchTopic::default()
        .with_topic_id(SynthSpec::topic_id(&spec.topics[0]))
        .with_partitions(
            (0..16)
                .map(|p| {
                    FetchPartition::default()
                        .with_partition(p)
                        .with_partition_max_bytes(1 << 20)
                })
                .collect(),
        );
    let req = FetchRequest::default()
        .with_max_bytes(i32::MAX)
        .with_topics(vec![topic]);
    let mut frame = ResponseFrame::default();
    fetch_response::build(&catalog, 1, 17, &req, &mut frame, &mut Vec::new()).expect("build");
    let bytes = Bytes::from(frame.to_vec(catalog.template.body_after_offset())).slice(4..);
    let mut g = c.benchmark_group("fetch_response_decode");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("v17_16_partitions_16KiB_batches", |b| {
        b.iter(|| {
            let mut buf = black_box(&bytes).clone();
            ResponseHeader::decode(&mut buf, 1).expect("header");
            FetchResponse::decode(&mut buf, 17)
                .expect("body")
                .responses
                .len()
        })
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
    targets = crc_baseline, batch_validate, walk_records, decode_fetch_response
}
criterion_main!(benches);
