//! The Kafka-protocol endpoint that serves mirrored partitions to stock clients.
//!
//! Threads: one tokio runtime (`SERVE_IO_THREADS`) that accepts on every listener and runs each
//! connection as a task, and a bounded pool of handler threads that answer requests, none
//! pinned to a shard core. They never touch a shard: each partition's owner publishes an immutable read view
//! (`log::read_view`) after every change, and requests are answered from the current view and
//! the partition's files (Kafka's logs are append-only, so anything below a published end can
//! be read without coordination). Record bytes go from the page cache to the socket with
//! `sendfile`; only headers are built in user space. See ARCHITECTURE.md "Kafka endpoint".
//!
//! | module | job |
//! |---|---|
//! | `listener` | the runtime, named listeners, accept loops, TLS handshake, start/stop |
//! | `listener_config` | `[[kafka.listeners]]`: name, address, security protocol, `ssl_*` files |
//! | `tls` | rustls server config from PEM files, client certificate → principal, TLS counters |
//! | `advertised` | each listener's advertised address (Metadata, FindCoordinator) |
//! | `admission` | connection slots (total, per IP), request-bytes budget, connection counters |
//! | `conn` | one connection task: frames in, `answer` on a handler thread, responses (bytes + `sendfile` ranges) out |
//! | `dispatch` | API registry, ApiVersions, request header decoding; no I/O |
//! | `catalog_apis` | builds the dispatcher with every API this module implements |
//! | `metadata`, `fetch`, `list_offsets`, `describe_configs`, `produce`, `offset_for_epoch` | one API each |
//! | `fetch_sessions` | the fetch session cache (KIP-227) and its rules, sans-IO |
//! | `writes` | Produce and InitProducerId for failed-over partitions, through the control plane's leader store |
//! | `request_stats` | requests per API and version, answered and refused (`/metrics`) |
//! | `session` | a connection's listener, peer and principal, carried by every request |
//! | `segment_reader` | offset/time/txn index lookups on a published segment, by `pread` |
//! | `groups` | the consumer-group coordinator (sans-IO), registered on the dispatcher |
//! | `sasl` | SASL PLAIN/SCRAM on SASL listeners: the per-connection gate (KIP-368 re-authentication) |
//! | `credentials` | kmirror's SCRAM store and PLAIN users, and the APIs that manage them |
//! | `authz` | ACLs and the authorizer every handler checks requests with; the ACL APIs |

pub mod admission;
pub mod advertised;
pub mod authz;
pub mod catalog_apis;
pub mod cluster_id;
pub mod conn;
pub mod credentials;
pub mod describe_configs;
pub mod dispatch;
pub mod fetch;
pub mod fetch_park;
pub mod fetch_sessions;
pub mod groups;
pub mod list_offsets;
pub mod listener;
pub mod listener_config;
pub mod metadata;
pub mod offset_for_epoch;
pub mod produce;
pub mod request_stats;
pub mod sasl;
pub mod segment_reader;
pub mod session;
pub mod tls;
pub mod txn;
pub mod writes;

pub use listener::{KafkaListener, ListenerConfig};

use crate::log::LogError;

/// Starts the Kafka listener when the configuration has a `[kafka]` section, with the group
/// APIs of `groups` when given; Fetch keeps its sessions in `sessions` and every request is
/// counted in `stats` (the caller shows both in `/metrics`); every request is authorized with
/// `authz`, which also serves the ACL APIs.
#[allow(clippy::too_many_arguments)]
pub fn start_configured(
    config: &crate::config::ServeConfig,
    catalog: &std::sync::Arc<crate::log::read_view::ReadCatalog>,
    writer: &writes::WriterSlot,
    groups: Option<&std::sync::Arc<groups::GroupService>>,
    txn: Option<&std::sync::Arc<txn::TxnService>>,
    sessions: &std::sync::Arc<fetch_sessions::FetchSessions>,
    stats: &std::sync::Arc<request_stats::RequestStats>,
    authz: &std::sync::Arc<authz::Authz>,
) -> std::io::Result<Option<KafkaListener>> {
    let Some(k) = &config.kafka else {
        return Ok(None);
    };
    let sasl = match &k.sasl {
        Some(section) => Some(std::sync::Arc::new(
            sasl::SaslServer::open(section, &config.storage.data_dir)
                .map_err(std::io::Error::other)?,
        )),
        None => None,
    };
    let listeners = k
        .listener_configs()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    catalog.set_cluster_id(cluster_id::load_or_create(&config.storage.data_dir)?);
    KafkaListener::start(
        &listeners,
        k.conn_limits(),
        std::sync::Arc::clone(catalog),
        std::sync::Arc::clone(writer),
        std::sync::Arc::clone(sessions),
        std::sync::Arc::clone(stats),
        |d, advertised| {
            d.authorize_with(std::sync::Arc::clone(authz));
            authz::apis::register(d);
            if let Some(s) = &sasl {
                s.register(d);
            }
            if let Some(g) = groups {
                let (host, port) = advertised.of("");
                g.register(d, host, port);
                g.advertise_per_listener(std::sync::Arc::clone(advertised));
            }
            if let Some(t) = txn {
                t.set_id_expiration_ms(k.transactional_id_expiration_ms);
                t.register(d, writer);
            }
        },
    )
    .map(Some)
}

/// The node id kmirror announces for itself: it is the only broker clients see.
pub const NODE_ID: i32 = 0;

/// Why a request could not be served; the connection that sent it is closed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("request frame of {len} bytes is too short for a header")]
    Truncated { len: usize },
    #[error("request frame length {len} is invalid (limit {max})")]
    FrameLength { len: i64, max: usize },
    #[error("unknown api key {api}")]
    UnknownApi { api: i16 },
    #[error("api {api} is not served by kmirror")]
    UnsupportedApi { api: i16 },
    #[error("api {api} v{version} is not served by kmirror")]
    UnsupportedVersion { api: i16, version: i16 },
    #[error("decoding api {api} v{version}: {reason}")]
    Decode {
        api: i16,
        version: i16,
        reason: String,
    },
    #[error("encoding api {api} v{version}: {reason}")]
    Encode {
        api: i16,
        version: i16,
        reason: String,
    },
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("reading a partition: {0}")]
    Log(#[from] LogError),
}
