//! The raw-copy client against the synthetic source: over a finite data set it must write every
//! response byte as received, and those responses (decoded here with kafka-protocol) must hold
//! every batch of every partition exactly once, CRC-valid, in offset order. That shows it
//! advances its fetch offsets correctly without ever parsing what it receives.

use std::collections::BTreeMap;

use bytes::{Buf, Bytes};
use kafka_protocol::messages::fetch_response::FetchResponse;
use kafka_protocol::messages::ResponseHeader;
use kafka_protocol::protocol::Decodable;
use kmirror::bench::raw_copy::{self, RawCopyConfig};
use kmirror::bench::records::Catalog;
use kmirror::bench::server::SynthServer;
use kmirror::bench::{SynthCodec, SynthSpec};
use kmirror::wire::batch::Batches;

fn spec(batches: u64) -> SynthSpec {
    let mut spec = SynthSpec {
        topics: vec!["a".into(), "b".into()],
        partitions: 5,
        codec: SynthCodec::Zstd,
        batch_bytes: 4096,
        ..SynthSpec::default()
    };
    let size = Catalog::new(spec.clone()).unwrap().template.size() as u64;
    spec.partition_bytes = Some(size * batches);
    spec
}

fn copy_and_check(version: i16, connections: usize) {
    let spec = spec(37);
    let server = SynthServer::bind("127.0.0.1:0", spec.clone()).unwrap();
    let catalog = server.catalog().clone();
    let addr = server.spawn().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = RawCopyConfig::new(addr.to_string(), spec.clone());
    config.fetch_version = version;
    config.connections = connections;
    // Small budgets force many responses, partial partitions and the KIP-74 first batch.
    config.max_bytes = 3 * catalog.template.size() as i32 + 100;
    config.partition_max_bytes = 2 * catalog.template.size() as i32;
    config.out_dir = Some(dir.path().to_path_buf());
    config.duration = std::time::Duration::from_secs(120);
    let report = raw_copy::run(&config).unwrap();

    let mut written = 0u64;
    let mut seen: BTreeMap<(Vec<u8>, i32), Vec<i64>> = BTreeMap::new();
    let mut responses = 0u64;
    for i in 0..connections {
        let mut file =
            Bytes::from(std::fs::read(dir.path().join(format!("raw-copy-{i}.bin"))).unwrap());
        written += file.len() as u64;
        while !file.is_empty() {
            let len = file.get_i32() as usize;
            let mut frame = file.split_to(len);
            let header_version = if version >= 12 { 1 } else { 0 };
            ResponseHeader::decode(&mut frame, header_version).unwrap();
            let r = FetchResponse::decode(&mut frame, version).unwrap();
            assert!(frame.is_empty());
            responses += 1;
            for t in &r.responses {
                let key = if version >= 13 {
                    t.topic_id.as_bytes().to_vec()
                } else {
                    t.topic.as_bytes().to_vec()
                };
                for p in &t.partitions {
                    assert_eq!(p.error_code, 0);
                    for b in Batches::new(p.records.as_ref().unwrap()) {
                        let (_, b) = b.unwrap();
                        b.validate().unwrap();
                        seen.entry((key.clone(), p.partition_index))
                            .or_default()
                            .push(b.base_offset().0);
                    }
                }
            }
        }
    }
    assert_eq!(written, report.bytes);
    assert_eq!(responses, report.responses);
    let rpb = catalog.records_per_batch();
    let want: Vec<i64> = (0..37).map(|i| i * rpb).collect();
    assert_eq!(seen.len(), 10, "every partition of both topics was fetched");
    for (k, offs) in &seen {
        assert_eq!(offs, &want, "partition {k:?}");
    }
    assert_eq!(report.batches, 10 * 37);
}

#[test]
fn raw_copy_writes_every_batch_once_with_topic_ids() {
    copy_and_check(17, 1);
}

#[test]
fn raw_copy_over_two_connections_with_topic_names() {
    copy_and_check(11, 2);
}
