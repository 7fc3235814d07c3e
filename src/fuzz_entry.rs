//! Entry points of the fuzz targets (`fuzz/fuzz_targets/`), one function per target.
//!
//! Each takes raw bytes, drives the same code the data plane runs on a source's answer, and
//! asserts the invariants that must hold for *any* input: a panic here is a finding. The same
//! functions replay the checked-in corpus (`fuzz/corpus/<target>/`) in the normal test run
//! (`tests/fuzz_corpus.rs`), so the corpus is exercised without a nightly toolchain.
//!
//! To add a target: a function here taking `&[u8]`, a file under `fuzz/fuzz_targets/` that calls
//! it, a `[[bin]]` in `fuzz/Cargo.toml`, its name in `TARGETS`, and seeds in its corpus dir.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::FetchResponse;
use kafka_protocol::messages::ResponseHeader;
use kafka_protocol::protocol::{decode_request_header_from_buffer, Encodable, HeaderVersion};

use crate::fetch::fetcher::{FetchConfig, FetchEvent, Fetcher, PartitionStart, Poll, Slot};
use crate::fetch::response::{check_records, Position};
use crate::fetch::versions::Versions;
use crate::ids::{LeaderEpoch, Offset, TopicPartition};
use crate::limits::OFFSET_MAX;
use crate::wire::batch::{Batch, Batches};
use crate::wire::{api, frame, records};

/// A fuzz target's entry point.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus directory and its function.
pub const TARGETS: &[(&str, Target)] = &[
    ("acl_requests", acl_requests),
    ("batch_validation", batch_validation),
    ("fetch_response", fetch_response),
    ("request_frame", request_frame::request_frame),
    ("sasl_messages", sasl_messages),
];

pub mod request_frame;

/// Topic id the fetch harness's partitions belong to (responses at v13+ name it).
pub const TOPIC_ID: uuid::Uuid = uuid::Uuid::from_u128(0x006b_6d69_7272_6f72);
/// Topic name of the harness's partitions (responses below v13 name it).
pub const TOPIC: &str = "t";

fn i64_at(data: &[u8], at: usize) -> i64 {
    let mut b = [0u8; 8];
    if let Some(s) = data.get(at..at + 8) {
        b.copy_from_slice(s);
    }
    i64::from_be_bytes(b)
}

/// Input: fetch offset (8 bytes, big-endian), log end (8), last epoch (4), then a records blob
/// as a Fetch response carries it. Checks `check_records` and everything it vouches for.
pub fn batch_validation(data: &[u8]) {
    if data.len() < 20 {
        return;
    }
    let pos = Position {
        fetch_offset: Offset(i64_at(data, 0)),
        log_end: Offset(i64_at(data, 8)),
        last_epoch: LeaderEpoch(i32::from_be_bytes(
            data[16..20].try_into().expect("4 bytes"),
        )),
    };
    let blob = &data[20..];
    let checked = check_records(blob, pos);
    if let Some(e) = &checked.error {
        // Rendering the reason (what an operator reads) must not panic either.
        let _ = e.to_string();
        let _ = (e.may_heal_on_refetch(), e.retryable());
    }
    if let Some(v) = &checked.valid {
        assert!(v.bytes.start <= v.bytes.end && v.bytes.end <= blob.len());
        assert!(
            v.first_offset >= pos.log_end,
            "valid range starts below the log end"
        );
        assert!(v.last_offset >= v.first_offset && v.last_offset.0 <= OFFSET_MAX);
        assert!(v.last_offset >= pos.fetch_offset);
        let mut n = 0u32;
        let mut expected_from = pos.log_end;
        for item in Batches::new(&blob[v.bytes.clone()]) {
            let (_, batch) = item.expect("a vouched-for range frames");
            batch.validate().expect("a vouched-for batch validates");
            assert!(batch.base_offset() >= expected_from, "offsets go back");
            expected_from = batch.next_offset();
            inspect(&batch);
            n += 1;
        }
        assert_eq!(n, v.batches);
        assert_eq!(expected_from, v.last_offset.next());
    }
    // Whatever the verdict, every batch the framing finds can be looked at.
    for (_, batch) in Batches::new(blob).flatten() {
        inspect(&batch);
    }
}

/// Every accessor a consumer of a batch may call; none may panic.
fn inspect(batch: &Batch<'_>) {
    let _ = batch.validate();
    assert!(batch.last_offset() >= batch.base_offset() || batch.last_offset_delta() < 0);
    let _ = batch.next_offset();
    let _ = (batch.control_type(), batch.coordinator_epoch());
    let _ = (batch.last_sequence(), batch.max_timestamp(), batch.codec());
    let _ = records::records(batch);
    let _ = crate::log::partition_log::first_record_at_or_after(
        batch,
        crate::ids::TimestampMs(0),
        Offset::ZERO,
    );
}

/// The epoch of the last batch the harness's partitions hold: 3 from Fetch v12, none below
/// (a known epoch there makes the first request an OffsetForLeaderEpoch check, not a Fetch).
pub fn harness_last_epoch(version: i16) -> LeaderEpoch {
    if version >= 12 {
        LeaderEpoch(3)
    } else {
        LeaderEpoch::NONE
    }
}

/// The fetcher of `fetch_response`: partition 0 of `TOPIC` at `log_end`, partition 1 at 0, at
/// Fetch `version`, with its first request sent. Returns the fetcher, its two slots and the
/// correlation id the response must carry.
pub fn fetch_harness(version: i16, log_end: Offset) -> (Fetcher, [Slot; 2], i32, Instant) {
    let versions = Versions {
        api_versions: 3,
        metadata: 12,
        fetch: version,
        list_offsets: 7,
        offset_for_leader_epoch: if version >= 12 { 4 } else { 2 },
    };
    let mut f = Fetcher::new(FetchConfig::default(), versions, "fuzz").expect("valid config");
    let mut slots = [Slot(0); 2];
    for (partition, end) in [(0, log_end), (1, Offset::ZERO)] {
        slots[partition as usize] = f
            .add_partition(PartitionStart {
                tp: TopicPartition::new(TOPIC, partition),
                topic_id: TOPIC_ID,
                log_end: end,
                last_epoch: harness_last_epoch(version),
                leader_epoch: LeaderEpoch(5),
            })
            .expect("two partitions fit");
    }
    let now = Instant::now();
    let mut out = BytesMut::new();
    assert!(matches!(
        f.poll_request(&mut out, now).expect("request encodes"),
        Poll::Sent(_)
    ));
    let mut req = frame::split_frame(&mut out)
        .expect("own frame")
        .expect("whole frame");
    let header = decode_request_header_from_buffer(&mut req).expect("own header");
    (f, slots, header.correlation_id, now)
}

/// A response frame (header + `body`) answering the harness's request.
pub fn response_frame(version: i16, correlation_id: i32, body: &[u8]) -> Bytes {
    let mut out = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut out, FetchResponse::header_version(version))
        .expect("header encodes");
    out.extend_from_slice(body);
    out.freeze()
}

/// Feeds `body` as the Fetch response (at `version`) to a fresh harness whose partition 0
/// stands at `log_end`, checks the fetcher's invariants and returns its events (`None` when
/// the connection was poisoned, which the shard answers by reconnecting) with the slots of
/// partitions 0 and 1.
pub fn fetch_response_events(
    version: i16,
    log_end: Offset,
    body: &[u8],
) -> Option<(Vec<FetchEvent>, [Slot; 2])> {
    let (mut f, slots, correlation_id, now) = fetch_harness(version, log_end);
    let before = slots.map(|s| f.fetch_offset(s).expect("harness slot"));
    let index = |slot: Slot| slots.iter().position(|s| *s == slot).expect("harness slot");
    let mut events = Vec::new();
    let frame = response_frame(version, correlation_id, body);
    let whole = f.handle_response(frame.clone(), now, &mut events);
    // The same response read in prefixes, as a shard reads one while it arrives: the same
    // outcome, event for event, whatever the split points.
    let (mut g, _, _, _) = fetch_harness(version, log_end);
    let mut streamed = Vec::new();
    let step = 1 + body.first().map_or(0, |b| usize::from(*b) % 97);
    let mut prefix_failed = false;
    for cut in (1..frame.len()).step_by(step) {
        if g.handle_response_prefix(frame.slice(..cut), frame.len(), now, &mut streamed)
            .is_err()
        {
            prefix_failed = true;
            break;
        }
    }
    if !prefix_failed {
        let streamed_whole = g.handle_response(frame, now, &mut streamed);
        assert_eq!(
            whole.is_err(),
            streamed_whole.is_err(),
            "poisoned one way only"
        );
        assert_eq!(
            format!("{events:?}"),
            format!("{streamed:?}"),
            "streamed events differ"
        );
        for slot in slots {
            assert_eq!(f.fetch_offset(slot), g.fetch_offset(slot));
        }
    } else {
        assert!(whole.is_err(), "a prefix poisoned what the whole did not");
    }
    if whole.is_err() {
        return None;
    }
    // A response may name a partition more than once (the fuzzer found it): each Records
    // event then continues where the previous one for that partition ended.
    let mut position = before;
    for ev in &events {
        let _ = format!("{ev:?}");
        if let FetchEvent::Records(r) = ev {
            let at = &mut position[index(r.slot)];
            assert!(r.first_offset >= *at, "records below the fetch position");
            assert!(r.last_offset >= r.first_offset && r.last_offset.0 <= OFFSET_MAX);
            *at = r.last_offset.next();
            let again = check_records(
                &r.records,
                Position {
                    fetch_offset: r.first_offset,
                    log_end: r.first_offset,
                    last_epoch: LeaderEpoch::NONE,
                },
            );
            let v = again.valid.expect("handed-out records validate again");
            assert_eq!(
                (v.bytes.end, v.last_offset),
                (r.records.len(), r.last_offset)
            );
        }
    }
    for ((slot, was), handed_out) in slots.iter().zip(before).zip(position) {
        let now_at = f.fetch_offset(*slot).expect("harness slot");
        assert!(now_at >= was, "fetch offset went back");
        if handed_out > was {
            assert_eq!(
                now_at, handed_out,
                "fetch offset is not past the records handed out"
            );
        }
    }
    // The next request after any answer still encodes.
    let mut out = BytesMut::new();
    let _ = f.poll_request(&mut out, now + std::time::Duration::from_secs(60));
    Some((events, slots))
}

/// Input: one byte choosing the Fetch version (v4..=v17), eight bytes of partition 0's log end
/// (made non-negative), then the response body after its header.
pub fn fetch_response(data: &[u8]) {
    let Some((&v, rest)) = data.split_first() else {
        return;
    };
    let span = (api::FETCH.max - api::FETCH.min + 1) as u8;
    let version = api::FETCH.min + i16::from(v % span);
    let log_end = Offset((i64_at(rest, 0) & i64::MAX).min(OFFSET_MAX));
    let body = rest.get(8..).unwrap_or(&[]);
    let _ = fetch_response_events(version, log_end, body);
}

/// The SASL server of `sasl_messages`: PLAIN user alice/pw, SCRAM-SHA-512 user alice/pencil
/// (derived once: PBKDF2 per input would make the fuzzer crawl).
fn sasl_fixture() -> &'static (
    crate::serve::dispatch::Dispatcher,
    std::sync::Arc<crate::serve::sasl::SaslServer>,
) {
    use crate::fetch::sasl::Mechanism;
    use crate::serve::credentials::{PlainUsers, ScramStore};
    use std::sync::{Arc, OnceLock};
    static FIXTURE: OnceLock<(
        crate::serve::dispatch::Dispatcher,
        Arc<crate::serve::sasl::SaslServer>,
    )> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let path =
            std::env::temp_dir().join(format!("kmirror-fuzz-sasl-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let scram = Arc::new(ScramStore::open(&path).expect("empty store"));
        scram
            .set_password("alice", Mechanism::ScramSha512, "pencil", 4096)
            .expect("store in the temp dir");
        let _ = std::fs::remove_file(&path);
        let server = Arc::new(crate::serve::sasl::SaslServer {
            mechanisms: vec![Mechanism::ScramSha512, Mechanism::Plain],
            scram,
            plain: PlainUsers::from_pairs(&[("alice", "pw")]),
            reauth_ms: 1_000,
        });
        let mut d = crate::serve::dispatch::Dispatcher::new();
        server.register(&mut d);
        (d, server)
    })
}

/// Input: a mode byte, then the mode's bytes. Modes: 0 a SCRAM client-first message, 1 a
/// client-final message, 2 a PLAIN message, 3 a user name to escape and unescape, 4 frames
/// (each a 2-byte big-endian length and a request) into one connection's SASL gate. Checks what
/// each parser vouches for, and that the gate serves nothing but the SASL exchange before the
/// connection authenticated.
pub fn sasl_messages(data: &[u8]) {
    use crate::serve::sasl::{gate::ConnAuth, plain, scram};
    let Some((&mode, msg)) = data.split_first() else {
        return;
    };
    match mode % 5 {
        0 => {
            if let Ok(first) = scram::parse_client_first(msg) {
                assert!(!first.username.is_empty() && !first.nonce.is_empty());
                let text = std::str::from_utf8(msg).expect("parsed input is UTF-8");
                assert_eq!(format!("{}{}", first.gs2_header, first.bare), text);
                assert!(!first.nonce.contains(','));
            }
            let mut s = scram::ScramServer::new(crate::fetch::sasl::Mechanism::ScramSha512);
            let (_, server) = sasl_fixture();
            let step = s.evaluate(
                msg,
                |u| {
                    server
                        .scram
                        .get(u, crate::fetch::sasl::Mechanism::ScramSha512)
                },
                "servernonce",
            );
            if let Ok(scram::ScramStep::Challenge(c)) = &step {
                assert!(c.starts_with(b"r="));
                // A final message that is not the client's proof fails.
                assert!(s.evaluate(msg, |_| None, "x").is_err());
            }
            assert!(!matches!(step, Ok(scram::ScramStep::Done { .. })));
        }
        1 => {
            if let Ok(fin) = scram::parse_client_final(msg) {
                let text = std::str::from_utf8(msg).expect("parsed input is UTF-8");
                assert!(text.starts_with(&fin.without_proof));
                assert!(fin.without_proof.starts_with("c="));
            }
        }
        2 => {
            let (_, server) = sasl_fixture();
            if let Ok(user) = plain::authenticate(msg, &server.plain) {
                assert_eq!(user, "alice");
                assert!(msg.ends_with(b"\0pw"));
            }
        }
        3 => {
            if let Ok(name) = std::str::from_utf8(msg) {
                let escaped = crate::fetch::sasl::sasl_name(name);
                assert_eq!(scram::unescape_sasl_name(&escaped).as_deref(), Ok(name));
            }
        }
        _ => {
            let (dispatcher, server) = sasl_fixture();
            let mut gate = ConnAuth::new(Some(std::sync::Arc::clone(server)));
            let mut session = gate.first_session(None);
            let mut rest = msg;
            while rest.len() >= 2 {
                let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
                let frame = &rest[2..(2 + len).min(rest.len())];
                rest = &rest[(2 + len).min(rest.len())..];
                let was_authenticated = session.authenticated;
                let out = gate.dispatch(
                    std::time::Instant::now(),
                    dispatcher,
                    Bytes::copy_from_slice(frame),
                    &mut session,
                );
                match out {
                    Ok((api, _, _)) => {
                        use kafka_protocol::messages::ApiKey;
                        assert!(
                            was_authenticated
                                || matches!(
                                    api,
                                    ApiKey::ApiVersions
                                        | ApiKey::SaslHandshake
                                        | ApiKey::SaslAuthenticate
                                ),
                            "{api:?} served before authentication"
                        );
                    }
                    Err(_) => break,
                }
            }
        }
    }
}

/// The ACL APIs a fuzz input of `acl_requests` addresses, by its second byte (mod 3).
pub const ACL_APIS: [kafka_protocol::messages::ApiKey; 3] = [
    kafka_protocol::messages::ApiKey::CreateAcls,
    kafka_protocol::messages::ApiKey::DescribeAcls,
    kafka_protocol::messages::ApiKey::DeleteAcls,
];

/// The correlation id of every request frame the fuzz targets build; answers must carry it.
pub const REQUEST_CORRELATION_ID: i32 = 7;

/// A request frame (header and `body`) for `api` at `version`, as a client sends it minus the
/// length prefix. The one builder for every target that feeds the dispatcher.
pub fn request_frame(api: kafka_protocol::messages::ApiKey, version: i16, body: &[u8]) -> Bytes {
    let mut h = kafka_protocol::messages::RequestHeader::default();
    h.request_api_key = api as i16;
    h.request_api_version = version;
    h.correlation_id = REQUEST_CORRELATION_ID;
    h.client_id = Some(kafka_protocol::protocol::StrBytes::from_static_str("fuzz"));
    let mut out = BytesMut::new();
    h.encode(&mut out, api.request_header_version(version))
        .expect("a request header encodes");
    out.extend_from_slice(body);
    out.freeze()
}

/// Input: a selector byte, then either (selector even) a stored ACL record
/// (`AclBinding::decode`), or (odd) an API byte (CreateAcls, DescribeAcls, DeleteAcls, mod 3),
/// a version byte (1..=3, mod 3) and that request's body, dispatched as the super user of an
/// enabled authorizer so every request reaches the ACL store. Invariants: a record either
/// fails to decode or is a valid binding whose stored form decodes to itself; a request is
/// answered or refused as undecodable, never a panic, and every ACL held afterwards is valid.
pub fn acl_requests(data: &[u8]) {
    use crate::serve::authz::acl::{AclBinding, AclFilter};
    use crate::serve::authz::authorizer::AuthzSettings;
    use crate::serve::authz::store::MemoryStore;
    use crate::serve::authz::Authz;
    use crate::serve::ServeError;

    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    if selector % 2 == 0 {
        if let Ok(b) = AclBinding::decode(rest) {
            b.validate().expect("a decoded binding is valid");
            assert_eq!(AclBinding::decode(&b.encode()).as_ref(), Ok(&b));
        }
        return;
    }
    let [api, version, body @ ..] = rest else {
        return;
    };
    let api = ACL_APIS[usize::from(*api) % 3];
    let version = 1 + i16::from(*version % 3);
    let settings = AuthzSettings {
        enabled: true,
        super_users: ["User:ANONYMOUS".to_string()].into(),
        allow_if_no_acl: false,
    };
    let authz = Authz::with_store(settings, Box::<MemoryStore>::default()).expect("memory store");
    let mut d = crate::serve::dispatch::Dispatcher::new();
    crate::serve::authz::apis::register(&mut d);
    d.authorize_with(std::sync::Arc::clone(&authz));
    match d.dispatch(request_frame(api, version, body)) {
        Ok(_) | Err(ServeError::Decode { .. }) => {}
        Err(e) => panic!("{api:?} v{version}: {e}"),
    }
    for b in authz.describe(&AclFilter::any()) {
        b.validate().expect("only valid ACLs are held");
    }
}
