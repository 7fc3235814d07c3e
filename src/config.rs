//! `kmirror serve` configuration: a TOML file loaded into typed sections, unknown keys rejected,
//! every value checked against `limits.rs` with a message that names the key. Read once by the
//! control thread at start-up.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::fetch::fetcher::FetchConfig;
use crate::limits::{
    ARENA_SLOTS_MAX, ARENA_SLOT_BYTES_MAX, ARENA_SLOT_BYTES_MIN, FETCH_RESPONSE_BYTES_MAX,
    FETCH_WAIT_MS_MAX, RESPONSE_OVERHEAD_BYTES_MAX, SHARDS_MAX, SOURCE_CONNECTIONS_MAX,
    SOURCE_FETCH_SESSIONS_MAX, SOURCE_REQUEST_TIMEOUT_MS_MAX, SOURCE_REQUEST_TIMEOUT_MS_MIN,
};
use crate::runtime::inline_writes::LogWrites;
use crate::runtime::RuntimeConfig;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("config: {key}: {why}")]
    Invalid { key: &'static str, why: String },
}

pub(crate) fn is_host_port(s: &str) -> bool {
    s.rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
}

fn invalid(key: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        why: why.into(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSection {
    /// `host:port` of one or more source brokers.
    pub bootstrap_servers: Vec<String>,
    #[serde(default = "default_client_id")]
    pub client_id: String,
}

fn default_client_id() -> String {
    "kmirror".to_string()
}

/// Which source topics to mirror: a list of names or one regex (not both).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicsSection {
    #[serde(default)]
    pub names: Vec<String>,
    #[serde(default)]
    pub regex: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSection {
    /// The log dir: one `<topic>-<partition>` directory per mirrored partition.
    pub data_dir: PathBuf,
    /// How often every partition with new data is flushed and the recovery points
    /// checkpointed (Kafka's `log.flush.offset.checkpoint.interval.ms`), so a restart after a
    /// crash revalidates only what came after.
    #[serde(default = "default_recovery_checkpoint_interval_ms")]
    pub recovery_checkpoint_interval_ms: u64,
}

fn default_recovery_checkpoint_interval_ms() -> u64 {
    crate::limits::RECOVERY_CHECKPOINT_INTERVAL_MS_DEFAULT
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    #[serde(default = "default_shards")]
    pub shards: usize,
    #[serde(default)]
    pub cores: Option<Vec<usize>>,
    /// One response frame is received into one slot, so this bounds a fetch response.
    #[serde(default = "default_slot_bytes")]
    pub arena_slot_bytes: usize,
    #[serde(default = "default_slots")]
    pub arena_slots: usize,
    /// Where the shards' log writes run: "shard_when_fast" (default: on the shard thread
    /// while they stay fast, `runtime::inline_writes`) or "io_worker" (always ring WRITEs).
    #[serde(default)]
    pub log_writes: LogWrites,
}

fn default_shards() -> usize {
    1
}
fn default_slot_bytes() -> usize {
    16 * 1024 * 1024
}
fn default_slots() -> usize {
    8
}

impl Default for RuntimeSection {
    fn default() -> Self {
        RuntimeSection {
            shards: default_shards(),
            cores: None,
            arena_slot_bytes: default_slot_bytes(),
            arena_slots: default_slots(),
            log_writes: LogWrites::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchSection {
    #[serde(default = "default_max_wait_ms")]
    pub max_wait_ms: u32,
    #[serde(default = "default_min_bytes")]
    pub min_bytes: u32,
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u32,
    #[serde(default = "default_partition_max_bytes")]
    pub partition_max_bytes: u32,
    /// How long a response may take beyond `max_wait_ms` before the connection is dropped.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u32,
    /// Fetch sessions per source connection, each with one request in flight (partitions are
    /// split between them); 1 gives Kafka's replica-fetcher behaviour.
    #[serde(default = "default_sessions_per_connection")]
    pub sessions_per_connection: u8,
    /// Connections per source broker and shard, the broker's partitions split between them;
    /// each pipelines with the others without holding idle partitions back.
    #[serde(default = "default_connections_per_source")]
    pub connections_per_source: u8,
    /// With `sessions_per_connection = 1`: a second fetch session on the connection only
    /// while its partitions are behind (two requests in flight), merged back into one long
    /// poll with the first answer that brings no records.
    #[serde(default = "default_catch_up_pipelining")]
    pub catch_up_pipelining: bool,
    /// `[fetch.source_load]`: fetch sessions on/off and the per-mirror rate cap.
    #[serde(default)]
    pub source_load: crate::fetch::source_load::SourceLoadSection,
}

fn default_sessions_per_connection() -> u8 {
    crate::limits::SOURCE_FETCH_SESSIONS_DEFAULT
}

fn default_catch_up_pipelining() -> bool {
    true
}

fn default_connections_per_source() -> u8 {
    crate::limits::SOURCE_CONNECTIONS_DEFAULT
}

fn default_request_timeout_ms() -> u32 {
    crate::limits::SOURCE_REQUEST_TIMEOUT_MS_DEFAULT
}

fn default_max_wait_ms() -> u32 {
    500
}
fn default_min_bytes() -> u32 {
    1
}
fn default_max_bytes() -> u32 {
    8 * 1024 * 1024
}
fn default_partition_max_bytes() -> u32 {
    1024 * 1024
}

impl Default for FetchSection {
    fn default() -> Self {
        FetchSection {
            max_wait_ms: default_max_wait_ms(),
            min_bytes: default_min_bytes(),
            max_bytes: default_max_bytes(),
            partition_max_bytes: default_partition_max_bytes(),
            request_timeout_ms: default_request_timeout_ms(),
            sessions_per_connection: default_sessions_per_connection(),
            connections_per_source: default_connections_per_source(),
            catch_up_pipelining: default_catch_up_pipelining(),
            source_load: Default::default(),
        }
    }
}

/// The admin API of the control plane. With this section `kmirror serve` runs the controller
/// and mirrors are managed with `kmirror mirrors ...`; without it, `[source]` and `[topics]`
/// name one static mirror.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// `ip:port` to listen on: loopback unless `token_file` is set.
    pub listen: std::net::SocketAddr,
    /// A file (mode 0600 or stricter) holding the bearer token every request must carry
    /// (`Authorization: Bearer ...`); required for a non-loopback `listen`.
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
    /// PEM certificate chain and unencrypted private key: serve HTTPS instead of HTTP.
    #[serde(default)]
    pub tls_cert_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// Host names the API answers to besides IP addresses and `localhost` (the `Host` check
    /// that stops DNS rebinding from a browser).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// How often each mirror's source is read for new topics, partitions, configs, deletions.
    #[serde(default = "default_sync_interval_ms")]
    pub sync_interval_ms: u64,
    /// How often the partition logs' retention (retention.ms / retention.bytes) is applied.
    #[serde(default = "default_retention_check_interval_ms")]
    pub retention_check_interval_ms: u64,
}

impl AdminSection {
    /// The admin endpoint these settings describe; reads the token file (which must be
    /// private).
    pub fn endpoint(
        &self,
    ) -> Result<crate::control::admin_guard::AdminEndpoint, crate::control::admin_guard::GuardError>
    {
        use crate::control::admin_guard::{AdminEndpoint, AdminGuard};
        let guard = match &self.token_file {
            Some(f) => AdminGuard::with_token_file(f, &self.allowed_hosts)?,
            None => AdminGuard::open(&self.allowed_hosts),
        };
        Ok(AdminEndpoint {
            addr: self.listen,
            guard,
            tls: self.tls_cert_file.clone().zip(self.tls_key_file.clone()),
        })
    }
}

fn default_retention_check_interval_ms() -> u64 {
    crate::limits::RETENTION_CHECK_INTERVAL_MS_DEFAULT
}

fn default_sync_interval_ms() -> u64 {
    crate::limits::MIRROR_SYNC_INTERVAL_MS_DEFAULT
}

/// The Kafka-protocol listener that serves the mirrored partitions to stock clients.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSection {
    /// `ip:port` to accept Kafka clients on (port 0 picks a free one): one PLAINTEXT listener
    /// named `PLAINTEXT`. Either this or `listeners`.
    #[serde(default)]
    pub listen: Option<std::net::SocketAddr>,
    /// Kafka's named listeners, each with its security protocol and TLS files.
    #[serde(default)]
    pub listeners: Vec<crate::serve::listener_config::ListenerSection>,
    /// `host:port` that Metadata tells clients to connect to; the bound address by default.
    /// Required when `listen` is a wildcard address (clients cannot connect to 0.0.0.0).
    #[serde(default)]
    pub advertised: Option<String>,
    /// Kafka's `max.connections`: connections held at once; more are closed at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Kafka's `max.connections.per.ip` (no other limit than `max_connections` by default).
    #[serde(default)]
    pub max_connections_per_ip: Option<usize>,
    /// Kafka's `connections.max.idle.ms`: a connection with no request this long is closed.
    #[serde(default = "default_connections_max_idle_ms")]
    pub connections_max_idle_ms: u64,
    /// Once a request frame has begun to arrive, it must be complete within this, else the
    /// connection is closed (a half-sent frame holds no slot for ever).
    #[serde(default = "default_request_receive_timeout_ms")]
    pub request_receive_timeout_ms: u64,
    /// Kafka's `queued.max.request.bytes`: request bytes all connections may buffer at once; a
    /// connection waits for room rather than allocating.
    #[serde(default = "default_queued_max_request_bytes")]
    pub queued_max_request_bytes: usize,
    /// Kafka's `transactional.id.expiration.ms`: a transactional id with no transaction under
    /// way is forgotten this long after its last one.
    #[serde(default = "default_transactional_id_expiration_ms")]
    pub transactional_id_expiration_ms: i64,
    /// Kafka's `group.initial.rebalance.delay.ms`: the first rebalance of an empty group waits
    /// this long for more members to join (3 s, as Kafka's default).
    #[serde(default = "default_group_initial_rebalance_delay_ms")]
    pub group_initial_rebalance_delay_ms: i64,
    /// `[kafka.sasl]`: SASL mechanisms, credentials, re-authentication (serve::sasl).
    #[serde(default)]
    pub sasl: Option<crate::serve::sasl::SaslSection>,

    /// `[kafka.authorizer]`: ACLs (serve::authz).
    #[serde(default)]
    pub authorizer: crate::serve::authz::AuthorizerConfig,
}

fn default_group_initial_rebalance_delay_ms() -> i64 {
    crate::limits::GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT
}

fn default_transactional_id_expiration_ms() -> i64 {
    crate::limits::TXN_ID_EXPIRATION_MS_DEFAULT
}

fn default_max_connections() -> usize {
    crate::limits::SERVE_CONNECTIONS_DEFAULT
}
fn default_connections_max_idle_ms() -> u64 {
    crate::limits::SERVE_CONNECTIONS_MAX_IDLE_MS_DEFAULT
}
fn default_request_receive_timeout_ms() -> u64 {
    crate::limits::SERVE_REQUEST_RECEIVE_TIMEOUT_MS_DEFAULT
}
fn default_queued_max_request_bytes() -> usize {
    crate::limits::SERVE_QUEUED_REQUEST_BYTES_DEFAULT
}

impl KafkaSection {
    /// The listeners to bind: `listeners`, or the one PLAINTEXT listener of `listen`.
    pub fn listener_configs(&self) -> Result<Vec<crate::serve::ListenerConfig>, String> {
        match (self.listen, self.listeners.is_empty()) {
            (Some(listen), true) => {
                let mut l =
                    crate::serve::ListenerConfig::plaintext(listen, self.advertised.clone());
                // `[kafka.sasl]` with the single-listener form: that listener is SASL_PLAINTEXT
                // (named listeners say their protocol themselves).
                if self.sasl.is_some() {
                    l.name = std::sync::Arc::from("SASL_PLAINTEXT");
                    l.protocol = crate::serve::session::SecurityProtocol::SaslPlaintext;
                }
                Ok(vec![l])
            }
            (None, false) if self.advertised.is_none() => {
                crate::serve::listener_config::listener_configs(&self.listeners, is_host_port)
            }
            (None, false) => Err("advertised is set per listener with listeners".into()),
            (None, true) => Err("needs listen or listeners".into()),
            (Some(_), false) => Err(
                "listen and listeners both given: use one form (listen is one PLAINTEXT listener)"
                    .into(),
            ),
        }
    }

    /// The listener's limits from this section.
    pub fn conn_limits(&self) -> crate::serve::admission::ConnLimits {
        crate::serve::admission::ConnLimits {
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip.unwrap_or(self.max_connections),
            connections_max_idle_ms: self.connections_max_idle_ms,
            request_receive_timeout_ms: self.request_receive_timeout_ms,
            queued_max_request_bytes: self.queued_max_request_bytes,
        }
    }
}

/// `/metrics` for the static `[source]` mode, which has no admin port. With `[admin]` the
/// metrics are served on the admin port instead.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// `ip:port` to serve `GET /metrics` on.
    pub listen: std::net::SocketAddr,
}

/// The whole `kmirror serve` configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    #[serde(default)]
    pub source: Option<SourceSection>,
    #[serde(default)]
    pub topics: Option<TopicsSection>,
    #[serde(default)]
    pub admin: Option<AdminSection>,
    #[serde(default)]
    pub kafka: Option<KafkaSection>,
    pub metrics: Option<MetricsSection>,
    pub storage: StorageSection,
    #[serde(default)]
    pub runtime: RuntimeSection,
    #[serde(default)]
    pub fetch: FetchSection,
}

impl ServeConfig {
    pub fn load(path: &Path) -> Result<ServeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { source, .. } => ConfigError::Parse {
                path: path.to_owned(),
                source,
            },
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<ServeConfig, ConfigError> {
        let config: ServeConfig = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::new(),
            source,
        })?;
        config.validate()?;
        Ok(config)
    }

    /// The static mirror's source and topics (`None` when the control plane runs instead).
    pub fn static_mirror(&self) -> Option<(&SourceSection, &TopicsSection)> {
        self.source.as_ref().zip(self.topics.as_ref())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        match (&self.admin, &self.source, &self.topics) {
            (Some(a), None, None) => {
                use crate::limits::{MIRROR_SYNC_INTERVAL_MS_MAX, MIRROR_SYNC_INTERVAL_MS_MIN};
                if !(MIRROR_SYNC_INTERVAL_MS_MIN..=MIRROR_SYNC_INTERVAL_MS_MAX)
                    .contains(&a.sync_interval_ms)
                {
                    return Err(invalid(
                        "admin.sync_interval_ms",
                        format!(
                            "must be {MIRROR_SYNC_INTERVAL_MS_MIN}..={MIRROR_SYNC_INTERVAL_MS_MAX}"
                        ),
                    ));
                }
                use crate::limits::{
                    RETENTION_CHECK_INTERVAL_MS_MAX as RMAX,
                    RETENTION_CHECK_INTERVAL_MS_MIN as RMIN,
                };
                if !(RMIN..=RMAX).contains(&a.retention_check_interval_ms) {
                    return Err(invalid(
                        "admin.retention_check_interval_ms",
                        format!("must be {RMIN}..={RMAX}"),
                    ));
                }
                if !a.listen.ip().is_loopback() && a.token_file.is_none() {
                    return Err(invalid(
                        "admin.listen",
                        format!(
                            "{} is not a loopback address: set admin.token_file (and \
                             preferably admin.tls_cert_file/tls_key_file) to serve the API \
                             beyond this host",
                            a.listen
                        ),
                    ));
                }
                if a.tls_cert_file.is_some() != a.tls_key_file.is_some() {
                    return Err(invalid(
                        "admin.tls_cert_file",
                        "tls_cert_file and tls_key_file go together",
                    ));
                }
            }
            (Some(_), _, _) => {
                return Err(invalid(
                    "admin",
                    "[source] and [topics] are not used with [admin]: create mirrors with \
                     `kmirror mirrors create` instead",
                ))
            }
            (None, None, _) => return Err(invalid("source", "missing (or configure [admin])")),
            (None, _, None) => return Err(invalid("topics", "missing (or configure [admin])")),
            (None, Some(source), Some(topics)) => Self::validate_static(source, topics)?,
        }
        if let Some(k) = &self.kafka {
            Self::validate_kafka(k)?;
        }
        if self.admin.is_some() && self.metrics.is_some() {
            return Err(invalid(
                "metrics",
                "with [admin], /metrics is served on the admin port; remove [metrics]",
            ));
        }
        if self.storage.data_dir.as_os_str().is_empty() {
            return Err(invalid("storage.data_dir", "must not be empty"));
        }
        use crate::limits::{
            RECOVERY_CHECKPOINT_INTERVAL_MS_MAX as CMAX,
            RECOVERY_CHECKPOINT_INTERVAL_MS_MIN as CMIN,
        };
        if !(CMIN..=CMAX).contains(&self.storage.recovery_checkpoint_interval_ms) {
            return Err(invalid(
                "storage.recovery_checkpoint_interval_ms",
                format!("must be {CMIN}..={CMAX}"),
            ));
        }
        self.validate_runtime()
    }

    fn validate_static(source: &SourceSection, topics: &TopicsSection) -> Result<(), ConfigError> {
        if source.bootstrap_servers.is_empty() {
            return Err(invalid(
                "source.bootstrap_servers",
                "must list at least one host:port",
            ));
        }
        for s in &source.bootstrap_servers {
            if !is_host_port(s) {
                return Err(invalid(
                    "source.bootstrap_servers",
                    format!("{s:?} is not host:port"),
                ));
            }
        }
        match (&topics.names.is_empty(), &topics.regex) {
            (true, None) => return Err(invalid("topics", "set either names or regex")),
            (false, Some(_)) => return Err(invalid("topics", "set names or regex, not both")),
            (_, Some(re)) => {
                regex::Regex::new(re).map_err(|e| invalid("topics.regex", e.to_string()))?;
            }
            (false, None) => {}
        }
        Ok(())
    }

    fn validate_kafka(k: &KafkaSection) -> Result<(), ConfigError> {
        k.authorizer
            .validate()
            .map_err(|why| invalid("kafka.authorizer.super_users", why))?;
        use crate::limits::{
            SERVE_CONNECTIONS_MAX as CMAX, SERVE_CONN_TIMEOUT_MS_MAX as TMAX,
            SERVE_CONN_TIMEOUT_MS_MIN as TMIN, SERVE_QUEUED_REQUEST_BYTES_MIN as QMIN,
        };
        if !(1..=CMAX).contains(&k.max_connections) {
            return Err(invalid(
                "kafka.max_connections",
                format!("must be 1..={CMAX}"),
            ));
        }
        if k.max_connections_per_ip
            .is_some_and(|n| !(1..=CMAX).contains(&n))
        {
            return Err(invalid(
                "kafka.max_connections_per_ip",
                format!("must be 1..={CMAX}"),
            ));
        }
        for (key, v) in [
            ("kafka.connections_max_idle_ms", k.connections_max_idle_ms),
            (
                "kafka.request_receive_timeout_ms",
                k.request_receive_timeout_ms,
            ),
        ] {
            if !(TMIN..=TMAX).contains(&v) {
                return Err(invalid(key, format!("must be {TMIN}..={TMAX}")));
            }
        }
        use crate::limits::{TXN_ID_EXPIRATION_MS_MAX as XMAX, TXN_ID_EXPIRATION_MS_MIN as XMIN};
        if !(XMIN..=XMAX).contains(&k.transactional_id_expiration_ms) {
            return Err(invalid(
                "kafka.transactional_id_expiration_ms",
                format!("must be {XMIN}..={XMAX}"),
            ));
        }
        use crate::limits::GROUP_INITIAL_REBALANCE_DELAY_MS_MAX as RMAX;
        if !(0..=RMAX).contains(&k.group_initial_rebalance_delay_ms) {
            return Err(invalid(
                "kafka.group_initial_rebalance_delay_ms",
                format!("must be 0..={RMAX}"),
            ));
        }
        if let Some(sasl) = &k.sasl {
            sasl.validate()?;
        }
        if k.queued_max_request_bytes < QMIN {
            return Err(invalid(
                "kafka.queued_max_request_bytes",
                format!("must be at least {QMIN}"),
            ));
        }
        if let Err(why) = k.listener_configs() {
            return Err(invalid("kafka.listeners", why));
        }
        match &k.advertised {
            None if k.listen.is_some_and(|l| l.ip().is_unspecified()) => Err(invalid(
                "kafka.advertised",
                format!(
                    "required when kafka.listen ({}) is a wildcard address: clients must be told \
                     a host they can reach",
                    k.listen.expect("checked above")
                ),
            )),
            Some(a) if !is_host_port(a) => Err(invalid(
                "kafka.advertised",
                format!("{a:?} is not host:port"),
            )),
            _ => Ok(()),
        }
    }

    fn validate_runtime(&self) -> Result<(), ConfigError> {
        let r = &self.runtime;
        if !(1..=SHARDS_MAX).contains(&r.shards) {
            return Err(invalid(
                "runtime.shards",
                format!("must be in 1..={SHARDS_MAX}"),
            ));
        }
        if !(ARENA_SLOT_BYTES_MIN..=ARENA_SLOT_BYTES_MAX).contains(&r.arena_slot_bytes) {
            return Err(invalid(
                "runtime.arena_slot_bytes",
                format!("must be in {ARENA_SLOT_BYTES_MIN}..={ARENA_SLOT_BYTES_MAX}"),
            ));
        }
        if !(1..=ARENA_SLOTS_MAX).contains(&r.arena_slots) {
            return Err(invalid(
                "runtime.arena_slots",
                format!("must be in 1..={ARENA_SLOTS_MAX}"),
            ));
        }
        let f = &self.fetch;
        if f.max_wait_ms > FETCH_WAIT_MS_MAX {
            return Err(invalid(
                "fetch.max_wait_ms",
                format!("must be <= {FETCH_WAIT_MS_MAX}"),
            ));
        }
        if f.max_bytes == 0 || f.max_bytes as usize > FETCH_RESPONSE_BYTES_MAX {
            return Err(invalid(
                "fetch.max_bytes",
                format!("must be in 1..={FETCH_RESPONSE_BYTES_MAX}"),
            ));
        }
        if !(SOURCE_REQUEST_TIMEOUT_MS_MIN..=SOURCE_REQUEST_TIMEOUT_MS_MAX)
            .contains(&f.request_timeout_ms)
        {
            return Err(invalid(
                "fetch.request_timeout_ms",
                format!(
                    "must be in {SOURCE_REQUEST_TIMEOUT_MS_MIN}..={SOURCE_REQUEST_TIMEOUT_MS_MAX}"
                ),
            ));
        }
        let sessions = usize::from(f.sessions_per_connection);
        if !(1..=SOURCE_FETCH_SESSIONS_MAX).contains(&sessions) {
            return Err(invalid(
                "fetch.sessions_per_connection",
                format!("must be in 1..={SOURCE_FETCH_SESSIONS_MAX}"),
            ));
        }
        let connections = usize::from(f.connections_per_source);
        if !(1..=SOURCE_CONNECTIONS_MAX).contains(&connections) {
            return Err(invalid(
                "fetch.connections_per_source",
                format!("must be in 1..={SOURCE_CONNECTIONS_MAX}"),
            ));
        }
        f.source_load
            .validate()
            .map_err(|e| invalid("fetch.source_load", e))?;
        if f.partition_max_bytes == 0 || f.partition_max_bytes > f.max_bytes {
            return Err(invalid(
                "fetch.partition_max_bytes",
                "must be in 1..=fetch.max_bytes",
            ));
        }
        // A whole response is received into one slot: fetched bytes plus response headers.
        let needed = f.max_bytes as usize + RESPONSE_OVERHEAD_BYTES_MAX;
        if r.arena_slot_bytes < needed {
            return Err(invalid(
                "runtime.arena_slot_bytes",
                format!(
                    "must be at least fetch.max_bytes + {RESPONSE_OVERHEAD_BYTES_MAX} = {needed} \
                     (one fetch response is received into one slot)"
                ),
            ));
        }
        Ok(())
    }

    pub fn runtime_config(&self) -> RuntimeConfig {
        RuntimeConfig {
            shards: self.runtime.shards,
            cores: self.runtime.cores.clone(),
            arena_slot_bytes: self.runtime.arena_slot_bytes,
            arena_slots: self.runtime.arena_slots,
            log_writes: self.runtime.log_writes,
        }
    }

    pub fn fetch_config(&self) -> FetchConfig {
        FetchConfig {
            max_wait_ms: self.fetch.max_wait_ms,
            min_bytes: self.fetch.min_bytes,
            max_bytes: self.fetch.max_bytes,
            partition_max_bytes: self.fetch.partition_max_bytes,
            sessions: self.fetch.source_load.sessions,
            max_rate_bytes_per_sec: self.fetch.source_load.max_rate_bytes_per_sec,
            sessions_per_connection: self.fetch.sessions_per_connection,
            connections_per_source: self.fetch.connections_per_source,
            catch_up_pipelining: self.fetch.catch_up_pipelining,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[source]
bootstrap_servers = ["127.0.0.1:9092"]
[topics]
names = ["orders"]
[storage]
data_dir = "/tmp/kmirror"
"#;

    // Goal: a minimal file loads with defaults that pass validation.
    #[test]
    fn minimal_config_loads() {
        let c = ServeConfig::parse(GOOD).unwrap();
        assert_eq!(c.runtime.shards, 1);
        assert_eq!(c.topics.unwrap().names, vec!["orders".to_string()]);
        assert!(c.runtime.arena_slot_bytes >= c.fetch.max_bytes as usize);
    }

    // Goal: each kind of bad input names the offending key.
    #[test]
    fn bad_configs_name_the_key() {
        let cases = [
            (GOOD.replace("names = [\"orders\"]", ""), "topics"),
            (
                GOOD.replace("names = [\"orders\"]", "names = [\"a\"]\nregex = \"x\""),
                "topics",
            ),
            (
                GOOD.replace("names = [\"orders\"]", "regex = \"(\""),
                "topics.regex",
            ),
            (
                GOOD.replace("127.0.0.1:9092", "nohost"),
                "source.bootstrap_servers",
            ),
            (format!("{GOOD}[runtime]\nshards = 0\n"), "runtime.shards"),
            (
                format!("{GOOD}[runtime]\narena_slot_bytes = 65536\n"),
                "runtime.arena_slot_bytes",
            ),
            (
                format!("{GOOD}[fetch]\nmax_wait_ms = 99999999\n"),
                "fetch.max_wait_ms",
            ),
            (
                format!("{GOOD}[fetch]\npartition_max_bytes = 0\n"),
                "fetch.partition_max_bytes",
            ),
            (
                format!("{GOOD}[fetch]\nsessions_per_connection = 0\n"),
                "fetch.sessions_per_connection",
            ),
            (
                format!("{GOOD}[fetch]\nsessions_per_connection = 9\n"),
                "fetch.sessions_per_connection",
            ),
            (
                format!("{GOOD}[fetch]\nconnections_per_source = 0\n"),
                "fetch.connections_per_source",
            ),
            (
                format!("{GOOD}[fetch]\nconnections_per_source = 9\n"),
                "fetch.connections_per_source",
            ),
        ];
        for (text, key) in cases {
            let err = ServeConfig::parse(&text).unwrap_err().to_string();
            assert!(err.contains(key), "expected {key} in: {err}");
        }
    }

    const ADMIN: &str = r#"
[admin]
listen = "127.0.0.1:9190"
[storage]
data_dir = "/tmp/kmirror"
"#;

    // Goal: `[admin]` alone (no static topics) runs the control plane.
    #[test]
    fn admin_config_loads_without_static_topics() {
        let c = ServeConfig::parse(ADMIN).unwrap();
        assert_eq!(
            c.admin.clone().unwrap().listen,
            "127.0.0.1:9190".parse().unwrap()
        );
        assert!(c.static_mirror().is_none());
        assert_eq!(
            c.admin.unwrap().retention_check_interval_ms,
            crate::limits::RETENTION_CHECK_INTERVAL_MS_DEFAULT
        );
    }

    // Goal: the admin API is never exposed beyond loopback, and the two modes do not mix.
    #[test]
    fn bad_admin_configs_name_the_key() {
        let cases = [
            (ADMIN.replace("127.0.0.1", "0.0.0.0"), "admin.listen"),
            (ADMIN.replace("127.0.0.1:9190", "localhost"), "listen"),
            (
                format!("{ADMIN}[source]\nbootstrap_servers = [\"h:1\"]\n"),
                "admin",
            ),
            (
                ADMIN.replace("[admin]\nlisten = \"127.0.0.1:9190\"\n", ""),
                "source",
            ),
            (
                ADMIN.replace("[admin]\n", "[admin]\nretention_check_interval_ms = 10\n"),
                "admin.retention_check_interval_ms",
            ),
        ];
        for (text, key) in cases {
            let err = ServeConfig::parse(&text).unwrap_err().to_string();
            assert!(err.contains(key), "expected {key} in: {err}");
        }
    }

    // Goal: the Kafka listener section loads, and a wildcard listen address without an
    // advertised host (which clients could not connect to) or a bad advertised value is
    // refused naming the key.
    #[test]
    fn kafka_listener_config() {
        let c =
            ServeConfig::parse(&format!("{GOOD}[kafka]\nlisten = \"127.0.0.1:9092\"\n")).unwrap();
        let k = c.kafka.unwrap();
        assert_eq!(k.listen, Some("127.0.0.1:9092".parse().unwrap()));
        assert_eq!(k.advertised, None);
        // Kafka's defaults where it has bounded ones; connections bounded (a thread each).
        let l = k.conn_limits();
        assert_eq!(
            (
                l.max_connections,
                l.max_connections_per_ip,
                l.connections_max_idle_ms
            ),
            (1024, 1024, 600_000)
        );
        let c = ServeConfig::parse(&format!(
            "{GOOD}[kafka]\nlisten = \"127.0.0.1:9092\"\nmax_connections_per_ip = 5\n\
             connections_max_idle_ms = 2000\nrequest_receive_timeout_ms = 1000\n\
             queued_max_request_bytes = 1048576\n"
        ))
        .unwrap();
        let l = c.kafka.unwrap().conn_limits();
        assert_eq!(
            (l.max_connections_per_ip, l.connections_max_idle_ms),
            (5, 2000)
        );
        assert_eq!(
            (l.request_receive_timeout_ms, l.queued_max_request_bytes),
            (1000, 1 << 20)
        );
        let c = ServeConfig::parse(&format!(
            "{GOOD}[kafka]\nlisten = \"0.0.0.0:9092\"\nadvertised = \"mirror.example:9092\"\n"
        ))
        .unwrap();
        let k = c.kafka.unwrap();
        assert_eq!(k.advertised.as_deref(), Some("mirror.example:9092"));
        // Kafka's own default, so a consumer fleet starting at once rebalances once.
        assert_eq!(k.group_initial_rebalance_delay_ms, 3_000);
        let cases = [
            (
                format!("{GOOD}[kafka]\nlisten = \"0.0.0.0:9092\"\n"),
                "kafka.advertised",
            ),
            (
                format!("{GOOD}[kafka]\nlisten = \"127.0.0.1:9092\"\nadvertised = \"nohost\"\n"),
                "kafka.advertised",
            ),
            (format!("{GOOD}[kafka]\nlisten = \"localhost\"\n"), "listen"),
            (
                format!("{GOOD}[kafka]\nlisten = \"127.0.0.1:1\"\nmax_connections = 0\n"),
                "kafka.max_connections",
            ),
            (
                format!("{GOOD}[kafka]\nlisten = \"127.0.0.1:1\"\nconnections_max_idle_ms = 5\n"),
                "kafka.connections_max_idle_ms",
            ),
            (
                format!("{GOOD}[kafka]\nlisten = \"127.0.0.1:1\"\nqueued_max_request_bytes = 5\n"),
                "kafka.queued_max_request_bytes",
            ),
            (
                format!("{ADMIN}[kafka]\nlisten = \"127.0.0.1:1\"\nport = 3\n"),
                "port",
            ),
            (
                format!(
                    "{GOOD}[kafka]\nlisten = \"127.0.0.1:1\"\ngroup_initial_rebalance_delay_ms = -1\n"
                ),
                "kafka.group_initial_rebalance_delay_ms",
            ),
        ];
        for (text, key) in cases {
            let err = ServeConfig::parse(&text).unwrap_err().to_string();
            assert!(err.contains(key), "expected {key} in: {err}");
        }
    }

    // Goal: a misspelt key is refused rather than silently ignored.
    #[test]
    fn unknown_keys_are_rejected() {
        let err = ServeConfig::parse(&format!("{GOOD}[fetch]\nmax_byte = 5\n")).unwrap_err();
        assert!(err.to_string().contains("max_byte"), "{err}");
    }
}
