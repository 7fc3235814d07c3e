//! Fuzz target `request_frame`: one client request frame through the dispatcher of a `[kafka]`
//! listener, with every API kmirror serves (catalog, groups, transactions) over an empty
//! catalog whose group and transaction logs live in a private temporary directory.
//!
//! Input: byte 0 picks the API among those advertised (modulo their count), byte 1 the version
//! inside its advertised range, the rest is the request body after a well-formed header, so
//! that the fuzzer spends its time in the body decoders and the handlers rather than being
//! refused at the header. Invariants: nothing panics; a frame is answered, left unanswered
//! (acks=0) or refused with a typed error; an answer's frame head encodes.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

use crate::log::read_view::ReadCatalog;
use crate::serve::catalog_apis;
use crate::serve::dispatch::{decode_body, encode_body, frame_head, Dispatcher, Outcome};
use crate::serve::fetch_sessions::FetchSessions;
use crate::serve::groups::GroupService;
use crate::serve::txn::TxnService;
use crate::serve::writes::{writer_slot, NothingWritable, PartitionWriter};
use crate::serve::ServeError;

struct Served {
    dispatcher: Dispatcher,
    /// (API, min, max) as advertised, ApiVersions included.
    apis: Vec<(ApiKey, i16, i16)>,
    /// Keeps the group and transaction logs' directory for the process's life.
    _dir: std::path::PathBuf,
}

fn served() -> &'static Served {
    static SERVED: OnceLock<Served> = OnceLock::new();
    SERVED.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!(
            "kmirror-fuzz-request-frame-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        std::fs::create_dir_all(&dir).expect("a private temporary directory");
        let catalog = ReadCatalog::new();
        let slot = writer_slot();
        let writer: Arc<dyn PartitionWriter> = Arc::new(NothingWritable);
        let _ = slot.set(Arc::clone(&writer));
        let mut d = catalog_apis::dispatcher(
            Arc::clone(&catalog),
            crate::serve::advertised::Advertised::single("127.0.0.1", 9092),
            Arc::clone(&slot),
            FetchSessions::new(),
        );
        let groups = GroupService::open(&dir, Arc::clone(&catalog)).expect("group log");
        groups.register(&mut d, "127.0.0.1", 9092);
        let txn = TxnService::open(&dir, writer, Arc::clone(&groups)).expect("txn log");
        txn.register(&mut d, &slot);
        let apis = d
            .advertised()
            .iter()
            .filter_map(|v| {
                Some((
                    ApiKey::try_from(v.api_key).ok()?,
                    v.min_version,
                    v.max_version,
                ))
            })
            .collect();
        Served {
            dispatcher: d,
            apis,
            _dir: dir,
        }
    })
}

/// The (API, version) an input's first two bytes pick.
pub fn pick(data: &[u8]) -> Option<(ApiKey, i16)> {
    let apis = &served().apis;
    let (&a, &v) = (data.first()?, data.get(1)?);
    let (api, min, max) = apis[a as usize % apis.len()];
    let span = (max - min + 1) as usize;
    Some((api, min + (v as usize % span) as i16))
}

/// An input for `api` at `version` with `body` (the seeds: one per served API and version).
pub fn input(api: ApiKey, version: i16, body: &[u8]) -> Option<Vec<u8>> {
    let apis = &served().apis;
    let a = apis.iter().position(|(k, _, _)| *k == api)?;
    let (_, min, max) = apis[a];
    if !(min..=max).contains(&version) {
        return None;
    }
    let mut out = vec![a as u8, (version - min) as u8];
    out.extend_from_slice(body);
    Some(out)
}

/// Every API and version served, for seeding.
pub fn served_versions() -> Vec<(ApiKey, i16)> {
    served()
        .apis
        .iter()
        .flat_map(|&(k, min, max)| (min..=max).map(move |v| (k, v)))
        .collect()
}

pub fn request_frame(data: &[u8]) {
    let Some((api, version)) = pick(data) else {
        return;
    };
    let s = served();
    match s
        .dispatcher
        .dispatch(super::request_frame(api, version, &data[2..]))
    {
        Ok((key, v, resp)) => {
            assert_eq!(
                resp.correlation_id,
                super::REQUEST_CORRELATION_ID,
                "{api:?} v{version}: correlation id"
            );
            if let Outcome::Reply(parts) = &resp.outcome {
                let len: u64 = parts.iter().map(|p| p.len()).sum();
                frame_head(key, v, resp.correlation_id, len)
                    .expect("an answer's frame head encodes");
            }
        }
        // A typed refusal: the connection would close with this line.
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// Calls `$m!` with every API a listener serves and its request type (ApiVersions included),
/// so the decode and seed functions below cannot forget one.
macro_rules! served_types {
    ($m:ident) => {{
        use kafka_protocol::messages::*;
        $m!(
            Produce => ProduceRequest,
            Fetch => FetchRequest,
            ListOffsets => ListOffsetsRequest,
            Metadata => MetadataRequest,
            OffsetCommit => OffsetCommitRequest,
            OffsetFetch => OffsetFetchRequest,
            FindCoordinator => FindCoordinatorRequest,
            JoinGroup => JoinGroupRequest,
            Heartbeat => HeartbeatRequest,
            LeaveGroup => LeaveGroupRequest,
            SyncGroup => SyncGroupRequest,
            DescribeGroups => DescribeGroupsRequest,
            ListGroups => ListGroupsRequest,
            InitProducerId => InitProducerIdRequest,
            OffsetForLeaderEpoch => OffsetForLeaderEpochRequest,
            AddPartitionsToTxn => AddPartitionsToTxnRequest,
            AddOffsetsToTxn => AddOffsetsToTxnRequest,
            EndTxn => EndTxnRequest,
            TxnOffsetCommit => TxnOffsetCommitRequest,
            DescribeConfigs => DescribeConfigsRequest,
            ApiVersions => ApiVersionsRequest,
        )
    }};
}

/// Decodes `body` as the request type of `api` through kmirror's own decode path (the decode
/// budget included); `None` when `api` is not in `served_types`.
pub fn decode_served(api: ApiKey, version: i16, body: Bytes) -> Option<Result<(), ServeError>> {
    macro_rules! arms {
        ($($key:ident => $ty:ty),* $(,)?) => {
            match api {
                $(ApiKey::$key => Some(decode_body::<$ty>(api, version, body).map(drop)),)*
                _ => None,
            }
        };
    }
    served_types!(arms)
}

/// A default request of `api` encoded at `version` (a seed that reaches the handler); `None`
/// when `api` is not in `served_types` or its default does not encode at that version.
pub fn default_body(api: ApiKey, version: i16) -> Option<Bytes> {
    macro_rules! arms {
        ($($key:ident => $ty:ty),* $(,)?) => {
            match api {
                $(ApiKey::$key => encode_body(api, version, &<$ty>::default()).ok(),)*
                _ => None,
            }
        };
    }
    served_types!(arms)
}
