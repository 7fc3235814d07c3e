//! Request dispatch: one frame in, one reply (or none, or "close") out, with no I/O.
//!
//! Each API is a handler registered with the versions it was tested with; ApiVersions answers
//! from that registry, so what is advertised is exactly what is implemented. Other modules
//! (the consumer-group coordinator) plug in with `Dispatcher::register`.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::buf::BudgetedBytes;
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::limits::{SERVE_DECODE_BUDGET_FLOOR_BYTES, SERVE_DECODE_BYTES_PER_REQUEST_BYTE};
use crate::serve::authz::acl::{Operation, ResourceType};
use crate::serve::authz::Authz;
use crate::serve::request_stats::{RequestError, RequestStats};
use crate::serve::session::Session;
use crate::serve::ServeError;

/// Kafka's UNSUPPORTED_VERSION error code.
const UNSUPPORTED_VERSION: i16 = 35;

/// A decoded request header and the undecoded body that follows it.
#[derive(Debug, Clone)]
pub struct Request {
    pub api_key: ApiKey,
    pub version: i16,
    pub header: RequestHeader,
    pub body: Bytes,
    /// The connection's listener, address and principal as of this request.
    pub session: Arc<Session>,
    /// The authorizer the handler checks this request's resources with.
    pub authz: Arc<Authz>,
}

impl Request {
    /// May this request's client do `op` on resource `name` of type `rtype`?
    pub fn authorized(&self, op: Operation, rtype: ResourceType, name: &str) -> bool {
        self.authz.authorize(&self.session, op, rtype, name)
    }

    /// `authorized` on the cluster resource.
    pub fn cluster_authorized(&self, op: Operation) -> bool {
        self.authz.authorize_cluster(&self.session, op)
    }

    /// The client's address, when the request came from a socket (DescribeGroups shows it).
    pub fn peer(&self) -> Option<SocketAddr> {
        self.session.peer
    }

    /// Decodes the body as `M`, refusing trailing bytes (they mean we misread the layout).
    pub fn decode<M: Decodable>(&self) -> Result<M, ServeError> {
        decode_body(self.api_key, self.version, self.body.clone())
    }
}

/// Decodes a request body as `M` (`api` and `version` name it in errors), allocating at most
/// `decode_budget` of its length whatever element counts it declares, and refusing trailing
/// bytes.
pub fn decode_body<M: Decodable>(api: ApiKey, version: i16, body: Bytes) -> Result<M, ServeError> {
    let budget = decode_budget(body.len());
    let mut body = BudgetedBytes::new(body, budget);
    let m = M::decode(&mut body, version).map_err(|e| ServeError::Decode {
        api: api as i16,
        version,
        reason: format!("{e:#}"),
    })?;
    if body.has_remaining() {
        return Err(ServeError::Decode {
            api: api as i16,
            version,
            reason: format!("{} bytes left after the body", body.remaining()),
        });
    }
    Ok(m)
}

/// A piece of a response body: bytes we built, or a range of a file the kernel sends itself.
#[derive(Debug, Clone)]
pub enum Part {
    Bytes(Bytes),
    File {
        file: Arc<File>,
        position: u64,
        length: u64,
    },
}

impl Part {
    pub fn len(&self) -> u64 {
        match self {
            Part::Bytes(b) => b.len() as u64,
            Part::File { length, .. } => *length,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What to do with a request.
#[derive(Debug)]
pub enum Outcome {
    /// Send this response body (the header is added by the dispatcher).
    Reply(Vec<Part>),
    /// Send nothing (Produce with acks=0).
    NoReply,
    /// Close the connection, logging why (Kafka closes on errors of acks=0 produces).
    Close(String),
}

impl Outcome {
    /// A body encoded by the `kafka-protocol` crate.
    pub fn encode<M: Encodable>(req: &Request, body: &M) -> Result<Outcome, ServeError> {
        Ok(Outcome::Reply(vec![Part::Bytes(encode_body(
            req.api_key,
            req.version,
            body,
        )?)]))
    }
}

pub fn encode_body<M: Encodable>(api: ApiKey, version: i16, body: &M) -> Result<Bytes, ServeError> {
    let mut buf = BytesMut::new();
    body.encode(&mut buf, version)
        .map_err(|e| ServeError::Encode {
            api: api as i16,
            version,
            reason: format!("{e:#}"),
        })?;
    Ok(buf.freeze())
}

/// One API's implementation. Handlers run on connection threads, concurrently.
pub trait ApiHandler: Send + Sync {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError>;
}

/// A complete response: the frame head (length prefix and response header) and the body.
#[derive(Debug)]
pub struct Response {
    pub correlation_id: i32,
    pub outcome: Outcome,
}

/// Serialises the length prefix and header for `body` (whose total length is `body_len`).
pub fn frame_head(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    body_len: u64,
) -> Result<Bytes, ServeError> {
    let header_version = api.response_header_version(version);
    let mut header = BytesMut::new();
    let mut h = ResponseHeader::default();
    h.correlation_id = correlation_id;
    h.encode(&mut header, header_version)
        .map_err(|e| ServeError::Encode {
            api: api as i16,
            version,
            reason: format!("response header: {e:#}"),
        })?;
    let total = header.len() as u64 + body_len;
    let total = i32::try_from(total).map_err(|_| ServeError::Encode {
        api: api as i16,
        version,
        reason: format!("response of {total} bytes does not fit a frame"),
    })?;
    let mut out = BytesMut::with_capacity(4 + header.len());
    out.extend_from_slice(&total.to_be_bytes());
    out.extend_from_slice(&header);
    Ok(out.freeze())
}

/// The registry of handlers and the ApiVersions answer built from it.
#[derive(Clone)]
pub struct Dispatcher {
    handlers: BTreeMap<i16, (ApiVersion, Arc<dyn ApiHandler>)>,
    /// Every request dispatched, by API and version, answered or refused.
    stats: Arc<RequestStats>,
    /// The SASL configuration connections of SASL listeners authenticate against.
    sasl: Option<Arc<crate::serve::sasl::SaslServer>>,

    /// What every request is authorized with (allow-all unless `authorize_with`).
    authz: Arc<Authz>,
}

impl Default for Dispatcher {
    fn default() -> Dispatcher {
        Dispatcher {
            handlers: BTreeMap::new(),
            stats: RequestStats::new(),
            sasl: None,

            authz: Authz::allow_all(),
        }
    }
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("apis", &self.handlers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Dispatcher {
    /// A dispatcher that knows only ApiVersions.
    pub fn new() -> Dispatcher {
        Dispatcher::default()
    }

    /// Counts requests into `stats` (shown in `/metrics`) instead of a private table.
    pub fn count_into(&mut self, stats: Arc<RequestStats>) {
        self.stats = stats;
    }

    /// Checks every request's resources with `authz` from now on.
    pub fn authorize_with(&mut self, authz: Arc<Authz>) {
        self.authz = authz;
    }

    pub fn stats(&self) -> &Arc<RequestStats> {
        &self.stats
    }

    /// Connections on SASL listeners authenticate against `sasl` (see `serve::sasl::gate`).
    pub fn set_sasl(&mut self, sasl: Arc<crate::serve::sasl::SaslServer>) {
        self.sasl = Some(sasl);
    }

    pub fn sasl(&self) -> Option<Arc<crate::serve::sasl::SaslServer>> {
        self.sasl.clone()
    }

    /// Serves `key` in versions `min..=max` with `handler`, replacing any earlier handler.
    /// The range must lie inside what the `kafka-protocol` crate can decode and encode.
    pub fn register(&mut self, key: ApiKey, min: i16, max: i16, handler: Arc<dyn ApiHandler>) {
        let valid = key.valid_versions();
        assert!(
            valid.min <= min && min <= max && max <= valid.max,
            "{key:?} {min}..={max} is outside the crate's {}..={}",
            valid.min,
            valid.max
        );
        assert!(
            key != ApiKey::ApiVersions,
            "ApiVersions is the dispatcher's own"
        );
        let mut v = ApiVersion::default();
        v.api_key = key as i16;
        v.min_version = min;
        v.max_version = max;
        self.handlers.insert(key as i16, (v, handler));
    }

    /// The advertised APIs, ApiVersions (0..=4) included.
    pub fn advertised(&self) -> Vec<ApiVersion> {
        let mut own = ApiVersion::default();
        own.api_key = ApiKey::ApiVersions as i16;
        own.min_version = 0;
        own.max_version = 4;
        let mut all: Vec<ApiVersion> = self.handlers.values().map(|(v, _)| v.clone()).collect();
        all.push(own);
        all.sort_by_key(|v| v.api_key);
        all
    }

    /// Handles one frame body (length prefix removed). An error means the request could not be
    /// understood: the caller closes the connection.
    pub fn dispatch(&self, frame: Bytes) -> Result<(ApiKey, i16, Response), ServeError> {
        self.dispatch_from(frame, &Arc::new(Session::plaintext(None)))
    }

    /// `dispatch` for a frame that arrived on the connection whose identity is `session`;
    /// counted in the request stats.
    pub fn dispatch_from(
        &self,
        frame: Bytes,
        session: &Arc<Session>,
    ) -> Result<(ApiKey, i16, Response), ServeError> {
        let key_version = (frame.len() >= 4).then(|| {
            (
                i16::from_be_bytes([frame[0], frame[1]]),
                i16::from_be_bytes([frame[2], frame[3]]),
            )
        });
        let result = self.dispatch_counted(frame, session);
        if let Some((key, version)) = key_version {
            match &result {
                Ok(_) => self.stats.served(key, version),
                Err(e) => self.stats.failed(key, version, RequestError::of(e)),
            }
        }
        result
    }

    fn dispatch_counted(
        &self,
        frame: Bytes,
        session: &Arc<Session>,
    ) -> Result<(ApiKey, i16, Response), ServeError> {
        if frame.len() < 8 {
            return Err(ServeError::Truncated { len: frame.len() });
        }
        let key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let api = ApiKey::try_from(key).map_err(|_| ServeError::UnknownApi { api: key })?;
        if api == ApiKey::ApiVersions {
            return self.api_versions(frame, version);
        }
        let Some((range, handler)) = self.handlers.get(&key) else {
            return Err(ServeError::UnsupportedApi { api: key });
        };
        if version < range.min_version || version > range.max_version {
            return Err(ServeError::UnsupportedVersion { api: key, version });
        }
        let (header, body) = split_header(api, version, frame)?;
        let correlation_id = header.correlation_id;
        let req = Request {
            api_key: api,
            version,
            header,
            body,
            session: Arc::clone(session),
            authz: Arc::clone(&self.authz),
        };
        let outcome = handler.handle(&req)?;
        Ok((
            api,
            version,
            Response {
                correlation_id,
                outcome,
            },
        ))
    }

    fn api_versions(
        &self,
        frame: Bytes,
        version: i16,
    ) -> Result<(ApiKey, i16, Response), ServeError> {
        let api = ApiKey::ApiVersions;
        let mut resp = ApiVersionsResponse::default();
        resp.api_keys = self.advertised();
        if !(0..=4).contains(&version) {
            // Kafka answers a version it does not know in the v0 layout with
            // UNSUPPORTED_VERSION, so that the client can retry with one it lists.
            let header_version = if version >= 3 { 2 } else { 1 };
            let mut rest = frame;
            let header = RequestHeader::decode(&mut rest, header_version).map_err(|e| {
                ServeError::Decode {
                    api: api as i16,
                    version,
                    reason: format!("header: {e:#}"),
                }
            })?;
            resp.error_code = UNSUPPORTED_VERSION;
            resp.api_keys.retain(|v| v.api_key == api as i16);
            let body = encode_body(api, 0, &resp)?;
            return Ok((
                api,
                0,
                Response {
                    correlation_id: header.correlation_id,
                    outcome: Outcome::Reply(vec![Part::Bytes(body)]),
                },
            ));
        }
        let (header, body) = split_header(api, version, frame)?;
        let req = Request {
            api_key: api,
            version,
            header,
            body,
            session: Arc::new(Session::plaintext(None)),
            authz: Arc::clone(&self.authz),
        };
        // The request carries only the client's name and version (v3+); nothing to check.
        let _: ApiVersionsRequest = req.decode()?;
        Ok((
            api,
            version,
            Response {
                correlation_id: req.header.correlation_id,
                outcome: Outcome::encode(&req, &resp)?,
            },
        ))
    }
}

/// What decoding a request of `len` bytes may allocate (the vendored decoder's budget, see
/// vendor/kafka-protocol/KMIRROR-PATCH.md): a lying element count is refused before memory is
/// reserved for it, and an honest request whose structures would outgrow this is refused too.
pub fn decode_budget(len: usize) -> usize {
    len.saturating_mul(SERVE_DECODE_BYTES_PER_REQUEST_BYTE)
        .saturating_add(SERVE_DECODE_BUDGET_FLOOR_BYTES)
}

pub(crate) fn split_header(
    api: ApiKey,
    version: i16,
    frame: Bytes,
) -> Result<(RequestHeader, Bytes), ServeError> {
    let header_version = api.request_header_version(version);
    let budget = decode_budget(frame.len());
    let mut frame = BudgetedBytes::new(frame, budget);
    let header =
        RequestHeader::decode(&mut frame, header_version).map_err(|e| ServeError::Decode {
            api: api as i16,
            version,
            reason: format!("header: {e:#}"),
        })?;
    Ok((header, frame.into_inner()))
}
