//! Goal: a request that declares more array elements than it has bytes is refused before any
//! memory is reserved for them (the patched `kafka-protocol`, vendor/kafka-protocol). Method:
//! decode Metadata requests whose topic array claims 2^31-1 (v0, `Array`) and 2^32-2 (v12,
//! `CompactArray`) elements in a few bytes, measuring the peak bytes allocated meanwhile; the
//! unpatched decoder asks for over 100 GB here. `serve_clients` sends the same frames to a
//! running kmirror and checks only their connections close.

use bytes::Bytes;
use kafka_protocol::messages::{FetchRequest, MetadataRequest, ProduceRequest};
use kafka_protocol::protocol::Decodable;

/// What decoding a few hostile bytes may allocate at its peak: the error message and little else.
const PEAK_BYTES_MAX: u64 = 64 * 1024;

fn peak_while_refusing<M: Decodable + std::fmt::Debug>(what: &str, version: i16, body: &[u8]) {
    let mut result = None;
    let info = allocation_counter::measure(|| {
        result = Some(M::decode(&mut Bytes::copy_from_slice(body), version));
    });
    let err = result.unwrap().expect_err(&format!(
        "{what}: a count beyond the bytes left must be refused"
    ));
    assert!(
        info.bytes_max < PEAK_BYTES_MAX,
        "{what}: {} bytes reserved at the peak ({err:#})",
        info.bytes_max
    );
}

#[test]
fn element_counts_beyond_the_request_reserve_no_memory() {
    peak_while_refusing::<MetadataRequest>("Metadata v0 topics", 0, &[0x7f, 0xff, 0xff, 0xff]);
    peak_while_refusing::<MetadataRequest>(
        "Metadata v12 topics (compact)",
        12,
        &[0xff, 0xff, 0xff, 0xff, 0x0f],
    );
    // Fetch v4: replica id, max wait, min bytes, max bytes, isolation, then the topic array.
    let mut fetch = vec![
        0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0,
    ];
    fetch.extend([0x7f, 0xff, 0xff, 0xff]);
    peak_while_refusing::<FetchRequest>("Fetch v4 topics", 4, &fetch);
    // Produce v3: null transactional id, acks, timeout, then the topic array.
    let produce = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff];
    peak_while_refusing::<ProduceRequest>("Produce v3 topics", 3, &produce);
}

#[test]
fn an_honest_count_still_decodes() {
    // One topic named "t" in Metadata v0: the check refuses only impossible counts.
    let body = [0, 0, 0, 1, 0, 1, b't'];
    let req = MetadataRequest::decode(&mut Bytes::copy_from_slice(&body), 0).unwrap();
    let topics = req.topics.unwrap();
    assert_eq!(topics.len(), 1);
    assert_eq!(topics[0].name.as_ref().unwrap().as_str(), "t");
}
