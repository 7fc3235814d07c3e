//! Mirror definitions: a name, the source connection in Kafka's client property vocabulary,
//! topic filters and the start position. Parsing and validation only; nothing connects here.
//!
//! Each mirror has its own connection settings and `client.id` (default `kmirror-<name>`) so
//! source quotas and ACLs apply per mirror, never shared with another mirror.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::ids::TimestampMs;
use crate::limits::{
    GROUP_SYNC_FINAL_TIMEOUT_MS_DEFAULT, GROUP_SYNC_FINAL_TIMEOUT_MS_MAX,
    GROUP_SYNC_FINAL_TIMEOUT_MS_MIN, GROUP_SYNC_INTERVAL_MS_DEFAULT, GROUP_SYNC_INTERVAL_MS_MAX,
    GROUP_SYNC_INTERVAL_MS_MIN, MIRROR_NAME_BYTES_MAX, MIRROR_PROPERTIES_BYTES_MAX,
};

/// What is wrong with a mirror definition; each names the property or value at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    #[error("mirror name is empty")]
    EmptyName,
    #[error("mirror name is longer than {MIRROR_NAME_BYTES_MAX} characters")]
    NameTooLong,
    #[error("mirror name {0:?} is not allowed")]
    ReservedName(String),
    #[error("mirror name {name:?} contains {bad:?}; only A-Z a-z 0-9 . _ - are allowed")]
    NameCharacter { name: String, bad: char },
    #[error("cannot read the mirror config: {0}")]
    Properties(String),
    #[error("mirror config is larger than {MIRROR_PROPERTIES_BYTES_MAX} bytes")]
    PropertiesTooLarge,
    #[error("missing bootstrap.servers")]
    MissingBootstrap,
    #[error("bootstrap.servers entry {0:?} is not host:port")]
    BadBootstrap(String),
    #[error(
        "unknown security.protocol {0:?} (expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL)"
    )]
    UnknownSecurityProtocol(String),
    #[error("unknown sasl.mechanism {0:?} (expected PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")]
    UnknownSaslMechanism(String),
    #[error("security.protocol {0} needs credentials: set sasl.jaas.config or sasl.username and sasl.password")]
    MissingCredentials(SecurityProtocol),
    #[error("sasl.jaas.config: {0}")]
    BadJaas(String),
    #[error("{key} = {value:?}: only PEM files are supported (convert a JKS or PKCS12 store: `keytool -importkeystore -deststoretype PKCS12` then `openssl pkcs12 -nodes -in store.p12 -out store.pem`)")]
    NotPem { key: &'static str, value: String },
    #[error("{key} is set but security.protocol {protocol} does not use it")]
    UnusedSetting {
        key: &'static str,
        protocol: SecurityProtocol,
    },
    #[error("unknown property {0:?}")]
    UnknownProperty(String),
    #[error("property {key} = {value:?} is not a valid {expected}")]
    BadValue {
        key: String,
        value: String,
        expected: &'static str,
    },
    #[error("bad regex {pattern:?}: {reason}")]
    BadRegex { pattern: String, reason: String },
    #[error("bad start position {0:?} (expected earliest, latest or a timestamp in ms)")]
    BadStartFrom(String),
}

/// A mirror's name (kip1279.md §2): 1..=249 of `[A-Za-z0-9._-]`, not "." or "..".
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MirrorName(String);

impl MirrorName {
    pub fn new(name: &str) -> Result<MirrorName, DefinitionError> {
        if name.is_empty() {
            return Err(DefinitionError::EmptyName);
        }
        if name.len() > MIRROR_NAME_BYTES_MAX {
            return Err(DefinitionError::NameTooLong);
        }
        if name == "." || name == ".." {
            return Err(DefinitionError::ReservedName(name.to_owned()));
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(DefinitionError::NameCharacter {
                name: name.to_owned(),
                bad,
            });
        }
        Ok(MirrorName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for MirrorName {
    type Error = DefinitionError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        MirrorName::new(&s)
    }
}

impl From<MirrorName> for String {
    fn from(n: MirrorName) -> String {
        n.0
    }
}

impl fmt::Display for MirrorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SecurityProtocol {
    #[serde(rename = "PLAINTEXT")]
    Plaintext,
    #[serde(rename = "SSL")]
    Ssl,
    #[serde(rename = "SASL_PLAINTEXT")]
    SaslPlaintext,
    #[serde(rename = "SASL_SSL")]
    SaslSsl,
}

impl SecurityProtocol {
    fn parse(s: &str) -> Result<SecurityProtocol, DefinitionError> {
        // Kafka accepts the names case-insensitively.
        match s.to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Ok(SecurityProtocol::Plaintext),
            "SSL" => Ok(SecurityProtocol::Ssl),
            "SASL_PLAINTEXT" => Ok(SecurityProtocol::SaslPlaintext),
            "SASL_SSL" => Ok(SecurityProtocol::SaslSsl),
            _ => Err(DefinitionError::UnknownSecurityProtocol(s.to_owned())),
        }
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl fmt::Display for SaslMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        })
    }
}

impl SaslMechanism {
    fn parse(s: &str) -> Result<SaslMechanism, DefinitionError> {
        match s {
            "PLAIN" => Ok(SaslMechanism::Plain),
            "SCRAM-SHA-256" => Ok(SaslMechanism::ScramSha256),
            "SCRAM-SHA-512" => Ok(SaslMechanism::ScramSha512),
            _ => Err(DefinitionError::UnknownSaslMechanism(s.to_owned())),
        }
    }
}

/// SASL credentials. `Debug` never prints the password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaslCredentials {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: String,
}

impl fmt::Debug for SaslCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SaslCredentials")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// TLS files, all PEM: CA certificates to trust, and an optional client certificate + key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TlsFiles {
    pub truststore: Option<PathBuf>,
    pub keystore: Option<PathBuf>,
    /// Whether to check the broker's host name against its certificate
    /// (`ssl.endpoint.identification.algorithm` = https, Kafka's default).
    pub verify_hostname: bool,
}

/// How to reach and authenticate to the source cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceConnection {
    pub bootstrap_servers: Vec<String>,
    pub security_protocol: SecurityProtocol,
    pub sasl: Option<SaslCredentials>,
    pub tls: Option<TlsFiles>,
    pub client_id: String,
}

/// Which source topics a mirror takes: a topic matches when some include pattern matches its
/// whole name and no exclude pattern does (Java `Pattern.matches` semantics).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicFilter {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

/// Kafka's default `mirror.topics.exclude`: internal topics.
pub const DEFAULT_EXCLUDE: &str = "__.*";

impl TopicFilter {
    pub fn new(include: Vec<String>, exclude: Vec<String>) -> Result<TopicFilter, DefinitionError> {
        let f = TopicFilter { include, exclude };
        f.compile()?;
        Ok(f)
    }

    /// Compiles the patterns (the stored form keeps the operator's text).
    pub fn compile(&self) -> Result<CompiledFilter, DefinitionError> {
        Ok(CompiledFilter {
            include: self
                .include
                .iter()
                .map(|p| anchored(p))
                .collect::<Result<_, _>>()?,
            exclude: self
                .exclude
                .iter()
                .map(|p| anchored(p))
                .collect::<Result<_, _>>()?,
        })
    }
}

fn anchored(pattern: &str) -> Result<Regex, DefinitionError> {
    Regex::new(&format!("^(?:{pattern})$")).map_err(|e| DefinitionError::BadRegex {
        pattern: pattern.to_owned(),
        reason: e.to_string(),
    })
}

/// Splits a comma-separated regex list (Kafka's list type), dropping empty entries.
pub fn split_patterns(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[derive(Debug, Clone)]
pub struct CompiledFilter {
    include: Vec<Regex>,
    exclude: Vec<Regex>,
}

impl CompiledFilter {
    pub fn matches(&self, topic: &str) -> bool {
        self.include.iter().any(|r| r.is_match(topic))
            && !self.exclude.iter().any(|r| r.is_match(topic))
    }
}

/// Where a newly mirrored partition starts on the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum StartFrom {
    Earliest,
    Latest,
    Timestamp(TimestampMs),
}

impl StartFrom {
    pub fn parse(s: &str) -> Result<StartFrom, DefinitionError> {
        match s.trim() {
            "earliest" => Ok(StartFrom::Earliest),
            "latest" => Ok(StartFrom::Latest),
            other => other
                .parse::<i64>()
                .ok()
                .filter(|ms| *ms >= 0)
                .map(|ms| StartFrom::Timestamp(TimestampMs(ms)))
                .ok_or_else(|| DefinitionError::BadStartFrom(s.to_owned())),
        }
    }
}

impl TryFrom<String> for StartFrom {
    type Error = DefinitionError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        StartFrom::parse(&s)
    }
}

impl From<StartFrom> for String {
    fn from(s: StartFrom) -> String {
        s.to_string()
    }
}

impl fmt::Display for StartFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartFrom::Earliest => f.write_str("earliest"),
            StartFrom::Latest => f.write_str("latest"),
            StartFrom::Timestamp(t) => write!(f, "{}", t.0),
        }
    }
}

/// A complete, validated mirror definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorDefinition {
    pub name: MirrorName,
    pub source: SourceConnection,
    /// Auto-discovery filter (`mirror.topics.include` / `.exclude`); `start` adds patterns.
    pub topics: TopicFilter,
    pub start_from: StartFrom,
    /// Source topic config keys never copied (`mirror.topic.properties.exclude`).
    pub topic_properties_exclude: Vec<String>,
    /// Group-offset sync from the source (absent in mirrors stored by older versions: the
    /// defaults apply).
    #[serde(default)]
    pub groups: GroupSyncSettings,
    /// Continuous integrity audit (`mirror.audit.*`, `control::audit::settings`).
    #[serde(default)]
    pub audit: crate::control::audit::AuditSettings,
    /// ACL sync from the source (`mirror.acls.*`, `control::acl_sync`).
    #[serde(default)]
    pub acls: crate::control::acl_sync::AclSyncSettings,
    /// Unclean-election recovery (`mirror.support.unclean.leader.election`); off in mirrors
    /// stored by older versions.
    #[serde(default)]
    pub unclean: UncleanElectionSettings,
}

/// `mirror.support.unclean.leader.election` (default false: a partition whose source log
/// diverges by leader epoch goes FAILED) and `mirror.support.unclean.leader.election.topics`
/// (the topics it applies to, patterns as `mirror.topics.include`; default all): when on, such
/// a partition is truncated to the divergence point, the cut records kept in the quarantine,
/// and mirroring goes on (`control::unclean_recovery`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UncleanElectionSettings {
    pub enabled: bool,
    pub topics: TopicFilter,
}

impl Default for UncleanElectionSettings {
    fn default() -> Self {
        UncleanElectionSettings {
            enabled: false,
            topics: TopicFilter {
                include: vec![".*".to_owned()],
                exclude: Vec::new(),
            },
        }
    }
}

pub const UNCLEAN_ELECTION_KEY: &str = "mirror.support.unclean.leader.election";
pub const UNCLEAN_ELECTION_TOPICS_KEY: &str = "mirror.support.unclean.leader.election.topics";

impl UncleanElectionSettings {
    fn from_properties(props: &BTreeMap<String, String>) -> Result<Self, DefinitionError> {
        let mut s = UncleanElectionSettings::default();
        if let Some(v) = props.get(UNCLEAN_ELECTION_KEY) {
            s.enabled = parse_bool(UNCLEAN_ELECTION_KEY, v)?;
        }
        if let Some(v) = props.get(UNCLEAN_ELECTION_TOPICS_KEY) {
            s.topics.include = split_patterns(v);
        }
        s.topics.compile()?;
        Ok(s)
    }

    /// Whether partitions of `topic` recover from an unclean election.
    pub fn applies_to(&self, topic: &str) -> bool {
        self.enabled && self.topics.compile().is_ok_and(|f| f.matches(topic))
    }
}

/// The properties whose keys start with `prefix`, in key order (one settings group, e.g.
/// `mirror.audit.`).
pub(crate) fn properties_under<'a>(
    props: &'a BTreeMap<String, String>,
    prefix: &'a str,
) -> impl Iterator<Item = (&'a String, &'a String)> + 'a {
    props
        .range(prefix.to_owned()..)
        .take_while(move |(key, _)| key.starts_with(prefix))
}

/// `v` as a number within `range`, else BadValue naming `expected`.
pub(crate) fn parse_u64_in(
    key: &str,
    v: &str,
    range: std::ops::RangeInclusive<u64>,
    expected: &'static str,
) -> Result<u64, DefinitionError> {
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| DefinitionError::BadValue {
            key: key.into(),
            value: v.to_owned(),
            expected,
        })
}

pub(crate) fn parse_bool(key: &str, v: &str) -> Result<bool, DefinitionError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(DefinitionError::BadValue {
            key: key.into(),
            value: v.to_owned(),
            expected: "boolean",
        }),
    }
}

/// Which consumer groups' committed offsets are copied from the source, and how often:
/// `sync.group.offsets.enabled` (default true), `sync.group.offsets.interval.ms` (default 30 s),
/// `sync.group.offsets.final.timeout.ms` (the last sync at `stop`, default 10 s),
/// `mirror.groups.include` (default `.*`) and `mirror.groups.exclude` (default none; it wins).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSyncSettings {
    pub enabled: bool,
    pub interval_ms: u64,
    /// Absent in mirrors stored by older versions: the default applies.
    #[serde(default = "default_final_timeout_ms")]
    pub final_timeout_ms: u64,
    pub filter: TopicFilter,
}

fn default_final_timeout_ms() -> u64 {
    GROUP_SYNC_FINAL_TIMEOUT_MS_DEFAULT
}

impl Default for GroupSyncSettings {
    fn default() -> Self {
        GroupSyncSettings {
            enabled: true,
            interval_ms: GROUP_SYNC_INTERVAL_MS_DEFAULT,
            final_timeout_ms: GROUP_SYNC_FINAL_TIMEOUT_MS_DEFAULT,
            filter: TopicFilter {
                include: vec![".*".to_owned()],
                exclude: Vec::new(),
            },
        }
    }
}

impl GroupSyncSettings {
    fn from_properties(props: &BTreeMap<String, String>) -> Result<Self, DefinitionError> {
        let mut s = GroupSyncSettings::default();
        if let Some(v) = props.get("sync.group.offsets.enabled") {
            s.enabled = match v.trim().to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(DefinitionError::BadValue {
                        key: "sync.group.offsets.enabled".into(),
                        value: v.clone(),
                        expected: "boolean",
                    })
                }
            };
        }
        if let Some(v) = props.get("sync.group.offsets.interval.ms") {
            s.interval_ms = v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|ms| (GROUP_SYNC_INTERVAL_MS_MIN..=GROUP_SYNC_INTERVAL_MS_MAX).contains(ms))
                .ok_or_else(|| DefinitionError::BadValue {
                    key: "sync.group.offsets.interval.ms".into(),
                    value: v.clone(),
                    expected: "interval in ms (100 ms to 24 h)",
                })?;
        }
        if let Some(v) = props.get("sync.group.offsets.final.timeout.ms") {
            let bounds = GROUP_SYNC_FINAL_TIMEOUT_MS_MIN..=GROUP_SYNC_FINAL_TIMEOUT_MS_MAX;
            s.final_timeout_ms = v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|ms| bounds.contains(ms))
                .ok_or_else(|| DefinitionError::BadValue {
                    key: "sync.group.offsets.final.timeout.ms".into(),
                    value: v.clone(),
                    expected: "timeout in ms (100 ms to 10 min)",
                })?;
        }
        if let Some(v) = props.get("mirror.groups.include") {
            s.filter.include = split_patterns(v);
        }
        if let Some(v) = props.get("mirror.groups.exclude") {
            s.filter.exclude = split_patterns(v);
        }
        s.filter.compile()?;
        Ok(s)
    }
}

/// Kafka's default `mirror.topic.properties.exclude` (kip1279.md §4); `mirror.name` is
/// always excluded on top of it.
pub const DEFAULT_TOPIC_PROPERTIES_EXCLUDE: [&str; 8] = [
    "follower.replication.throttled.replicas",
    "leader.replication.throttled.replicas",
    "message.timestamp.difference.max.ms",
    "log.message.timestamp.before.max.ms",
    "log.message.timestamp.after.max.ms",
    "message.timestamp.type",
    "unclean.leader.election.enable",
    "min.insync.replicas",
];

/// Kafka client settings accepted for compatibility with existing client property files but not
/// used by kmirror's source client (it has its own timeouts and fetch sizes).
const ACCEPTED_UNUSED: [&str; 9] = [
    "request.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "socket.connection.setup.timeout.max.ms",
    "connections.max.idle.ms",
    "ssl.protocol",
    "ssl.enabled.protocols",
    "ssl.key.password",
    "mirror.source.cluster.id",
    "metadata.max.age.ms",
];

/// Parses Java `.properties` text (comments, `=`/`:`/space separators, continuations, escapes).
pub fn parse_properties(text: &str) -> Result<BTreeMap<String, String>, DefinitionError> {
    if text.len() > MIRROR_PROPERTIES_BYTES_MAX {
        return Err(DefinitionError::PropertiesTooLarge);
    }
    let map = java_properties::read(text.as_bytes())
        .map_err(|e| DefinitionError::Properties(e.to_string()))?;
    Ok(map.into_iter().collect())
}

/// The `username="..."` / `password="..."` options of a JAAS login module line.
fn parse_jaas(config: &str) -> Result<(String, String), DefinitionError> {
    let bad = |m: &str| DefinitionError::BadJaas(m.to_owned());
    let body = config.trim().trim_end_matches(';');
    let mut words = body.splitn(3, char::is_whitespace);
    let _module = words
        .next()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| bad("empty"))?;
    let flag = words.next().unwrap_or("");
    if !matches!(flag, "required" | "requisite" | "sufficient" | "optional") {
        return Err(bad(
            "expected a login module class followed by a control flag such as `required`",
        ));
    }
    let mut options = BTreeMap::new();
    let mut rest = words.next().unwrap_or("").trim();
    while !rest.is_empty() {
        let eq = rest.find('=').ok_or_else(|| bad("option without `=`"))?;
        let key = rest[..eq].trim().to_owned();
        let after = rest[eq + 1..].trim_start();
        let (value, tail) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted
                .find('"')
                .ok_or_else(|| bad("unterminated quoted value"))?;
            (quoted[..end].to_owned(), &quoted[end + 1..])
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            (after[..end].to_owned(), &after[end..])
        };
        options.insert(key, value);
        rest = tail.trim();
    }
    match (options.remove("username"), options.remove("password")) {
        (Some(u), Some(p)) => Ok((u, p)),
        _ => Err(bad("needs username=\"...\" and password=\"...\"")),
    }
}

fn pem_path(
    props: &BTreeMap<String, String>,
    location: &'static str,
    kind: &'static str,
) -> Result<Option<PathBuf>, DefinitionError> {
    if let Some(t) = props.get(kind) {
        if !t.eq_ignore_ascii_case("PEM") {
            return Err(DefinitionError::NotPem {
                key: kind,
                value: t.clone(),
            });
        }
    }
    Ok(props.get(location).map(PathBuf::from))
}

impl MirrorDefinition {
    /// Builds a definition from Kafka-style properties, validating every setting.
    pub fn from_properties(
        name: MirrorName,
        props: &BTreeMap<String, String>,
    ) -> Result<MirrorDefinition, DefinitionError> {
        const KNOWN: [&str; 23] = [
            UNCLEAN_ELECTION_KEY,
            UNCLEAN_ELECTION_TOPICS_KEY,
            "bootstrap.servers",
            "security.protocol",
            "sasl.mechanism",
            "sasl.jaas.config",
            "sasl.username",
            "sasl.password",
            "ssl.truststore.location",
            "ssl.truststore.type",
            "ssl.keystore.location",
            "ssl.keystore.type",
            "ssl.endpoint.identification.algorithm",
            "client.id",
            "mirror.topics.include",
            "mirror.topics.exclude",
            "mirror.start.from",
            "mirror.topic.properties.exclude",
            "sync.group.offsets.enabled",
            "sync.group.offsets.interval.ms",
            "sync.group.offsets.final.timeout.ms",
            "mirror.groups.include",
            "mirror.groups.exclude",
        ];
        if let Some(unknown) = props
            .keys()
            // `mirror.audit.*` keys are checked by their own settings (below).
            .filter(|k| !k.starts_with(crate::control::audit::settings::PREFIX))
            .filter(|k| !k.starts_with(crate::control::acl_sync::PREFIX))
            .find(|k| !KNOWN.contains(&k.as_str()) && !ACCEPTED_UNUSED.contains(&k.as_str()))
        {
            return Err(DefinitionError::UnknownProperty(unknown.clone()));
        }
        let bootstrap = props
            .get("bootstrap.servers")
            .map(|s| split_patterns(s))
            .filter(|v| !v.is_empty())
            .ok_or(DefinitionError::MissingBootstrap)?;
        for server in &bootstrap {
            let ok = server
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !ok {
                return Err(DefinitionError::BadBootstrap(server.clone()));
            }
        }
        let protocol = props
            .get("security.protocol")
            .map(|s| SecurityProtocol::parse(s))
            .transpose()?
            .unwrap_or(SecurityProtocol::Plaintext);
        let sasl = if protocol.uses_sasl() {
            let mechanism = props
                .get("sasl.mechanism")
                .map(|s| SaslMechanism::parse(s))
                .transpose()?
                .unwrap_or(SaslMechanism::Plain);
            let (username, password) = match (
                props.get("sasl.jaas.config"),
                props.get("sasl.username"),
                props.get("sasl.password"),
            ) {
                (Some(jaas), _, _) => parse_jaas(jaas)?,
                (None, Some(u), Some(p)) => (u.clone(), p.clone()),
                _ => return Err(DefinitionError::MissingCredentials(protocol)),
            };
            Some(SaslCredentials {
                mechanism,
                username,
                password,
            })
        } else {
            for key in [
                "sasl.mechanism",
                "sasl.jaas.config",
                "sasl.username",
                "sasl.password",
            ] {
                if props.contains_key(key) {
                    return Err(DefinitionError::UnusedSetting { key, protocol });
                }
            }
            None
        };
        let tls = if protocol.uses_tls() {
            let verify_hostname = match props
                .get("ssl.endpoint.identification.algorithm")
                .map(String::as_str)
            {
                None | Some("https") => true,
                Some("") => false,
                Some(other) => {
                    return Err(DefinitionError::BadValue {
                        key: "ssl.endpoint.identification.algorithm".into(),
                        value: other.into(),
                        expected: "algorithm (https or empty)",
                    })
                }
            };
            Some(TlsFiles {
                truststore: pem_path(props, "ssl.truststore.location", "ssl.truststore.type")?,
                keystore: pem_path(props, "ssl.keystore.location", "ssl.keystore.type")?,
                verify_hostname,
            })
        } else {
            for key in ["ssl.truststore.location", "ssl.keystore.location"] {
                if props.contains_key(key) {
                    return Err(DefinitionError::UnusedSetting { key, protocol });
                }
            }
            None
        };
        let client_id = props
            .get("client.id")
            .cloned()
            .unwrap_or_else(|| format!("kmirror-{name}"));
        let include = props
            .get("mirror.topics.include")
            .map(|s| split_patterns(s))
            .unwrap_or_default();
        let exclude = props
            .get("mirror.topics.exclude")
            .map(|s| split_patterns(s))
            .unwrap_or_else(|| vec![DEFAULT_EXCLUDE.to_owned()]);
        let topics = TopicFilter::new(include, exclude)?;
        let start_from = props
            .get("mirror.start.from")
            .map(|s| StartFrom::parse(s))
            .transpose()?
            .unwrap_or(StartFrom::Earliest);
        let topic_properties_exclude = props
            .get("mirror.topic.properties.exclude")
            .map(|s| split_patterns(s))
            .unwrap_or_else(|| {
                DEFAULT_TOPIC_PROPERTIES_EXCLUDE
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect()
            });
        Ok(MirrorDefinition {
            name,
            source: SourceConnection {
                bootstrap_servers: bootstrap,
                security_protocol: protocol,
                sasl,
                tls,
                client_id,
            },
            topics,
            start_from,
            topic_properties_exclude,
            groups: GroupSyncSettings::from_properties(props)?,
            audit: crate::control::audit::AuditSettings::from_properties(props)?,
            acls: crate::control::acl_sync::AclSyncSettings::from_properties(props)?,
            unclean: UncleanElectionSettings::from_properties(props)?,
        })
    }

    /// Whether a source topic config key is copied to the local topic.
    pub fn copies_topic_property(&self, key: &str) -> bool {
        key != "mirror.name" && !self.topic_properties_exclude.iter().any(|k| k == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(text: &str) -> BTreeMap<String, String> {
        parse_properties(text).unwrap()
    }

    fn def(text: &str) -> Result<MirrorDefinition, DefinitionError> {
        MirrorDefinition::from_properties(MirrorName::new("m1").unwrap(), &props(text))
    }

    #[test]
    fn name_rules() {
        assert!(MirrorName::new("east-1_a.b").is_ok());
        assert_eq!(MirrorName::new(""), Err(DefinitionError::EmptyName));
        assert_eq!(
            MirrorName::new(".."),
            Err(DefinitionError::ReservedName("..".into()))
        );
        assert_eq!(
            MirrorName::new("a b").unwrap_err().to_string(),
            "mirror name \"a b\" contains ' '; only A-Z a-z 0-9 . _ - are allowed"
        );
        assert!(MirrorName::new(&"a".repeat(249)).is_ok());
        assert_eq!(
            MirrorName::new(&"a".repeat(250)),
            Err(DefinitionError::NameTooLong)
        );
        assert!(serde_json::from_str::<MirrorName>("\"a/b\"").is_err());
    }

    #[test]
    fn plaintext_defaults() {
        let d = def("bootstrap.servers=a:9092, b:9093\n").unwrap();
        assert_eq!(d.source.bootstrap_servers, ["a:9092", "b:9093"]);
        assert_eq!(d.source.security_protocol, SecurityProtocol::Plaintext);
        assert_eq!(d.source.client_id, "kmirror-m1");
        assert_eq!(d.topics.exclude, ["__.*"]);
        assert_eq!(d.start_from, StartFrom::Earliest);
        assert!(!d.copies_topic_property("min.insync.replicas"));
        assert!(!d.copies_topic_property("mirror.name"));
        assert!(d.copies_topic_property("retention.ms"));
    }

    #[test]
    fn sasl_ssl_with_jaas_and_pem() {
        let d = def(r#"
# source cluster
bootstrap.servers = src:9094
security.protocol = sasl_ssl
sasl.mechanism = SCRAM-SHA-512
sasl.jaas.config = org.apache.kafka.common.security.scram.ScramLoginModule required \
    username="mirror" password="s3cr et";
ssl.truststore.type = PEM
ssl.truststore.location = /etc/kmirror/ca.pem
client.id = east
"#)
        .unwrap();
        let sasl = d.source.sasl.clone().unwrap();
        assert_eq!(sasl.mechanism, SaslMechanism::ScramSha512);
        assert_eq!(
            (sasl.username.as_str(), sasl.password.as_str()),
            ("mirror", "s3cr et")
        );
        assert!(!format!("{sasl:?}").contains("s3cr"));
        let tls = d.source.tls.unwrap();
        assert_eq!(tls.truststore, Some(PathBuf::from("/etc/kmirror/ca.pem")));
        assert!(tls.verify_hostname);
        assert_eq!(d.source.client_id, "east");
    }

    #[test]
    fn errors_name_the_problem() {
        let cases = [
            ("client.id=x\n", "missing bootstrap.servers"),
            ("bootstrap.servers=nohost\n", "bootstrap.servers entry \"nohost\" is not host:port"),
            (
                "bootstrap.servers=a:1\nsecurity.protocol=TLS\n",
                "unknown security.protocol \"TLS\"",
            ),
            (
                "bootstrap.servers=a:1\nsecurity.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.username=u\nsasl.password=p\n",
                "unknown sasl.mechanism \"GSSAPI\"",
            ),
            (
                "bootstrap.servers=a:1\nsecurity.protocol=SASL_PLAINTEXT\n",
                "security.protocol SASL_PLAINTEXT needs credentials",
            ),
            (
                "bootstrap.servers=a:1\nsecurity.protocol=SSL\nssl.truststore.type=JKS\n",
                "ssl.truststore.type = \"JKS\": only PEM files are supported",
            ),
            (
                "bootstrap.servers=a:1\nmirror.topics.include=orders-(\n",
                "bad regex \"orders-(\"",
            ),
            ("bootstrap.servers=a:1\nbootstrap.server=b:1\n", "unknown property \"bootstrap.server\""),
            (
                "bootstrap.servers=a:1\nsasl.username=u\n",
                "sasl.username is set but security.protocol PLAINTEXT does not use it",
            ),
            ("bootstrap.servers=a:1\nmirror.start.from=yesterday\n", "bad start position"),
            (
                "bootstrap.servers=a:1\nsecurity.protocol=SASL_SSL\nsasl.jaas.config=Foo required user=\"u\";\n",
                "sasl.jaas.config: needs username",
            ),
        ];
        for (text, expected) in cases {
            let err = def(text).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{text:?}: got {err:?}");
        }
    }

    #[test]
    fn filter_matches_whole_names_and_exclusions_win() {
        let f = TopicFilter::new(
            split_patterns("orders-.*, payments"),
            vec![DEFAULT_EXCLUDE.into(), "orders-tmp.*".into()],
        )
        .unwrap()
        .compile()
        .unwrap();
        assert!(f.matches("orders-eu"));
        assert!(f.matches("payments"));
        assert!(
            !f.matches("payments-old"),
            "include must match the whole name"
        );
        assert!(!f.matches("xorders-eu"));
        assert!(!f.matches("orders-tmp1"));
        let all = TopicFilter::new(vec![".*".into()], vec![DEFAULT_EXCLUDE.into()])
            .unwrap()
            .compile()
            .unwrap();
        assert!(!all.matches("__consumer_offsets"));
        assert!(all.matches("_single_underscore"));
    }

    // Goal: the unclean-election option is off by default, per mirror, narrowed to topics by
    // patterns, and a bad value is refused naming the key.
    #[test]
    fn unclean_election_settings() {
        let d = def("bootstrap.servers=a:1\n").unwrap();
        assert!(!d.unclean.applies_to("orders"));
        let d =
            def("bootstrap.servers=a:1\nmirror.support.unclean.leader.election=true\n").unwrap();
        assert!(d.unclean.applies_to("orders") && d.unclean.applies_to("logs"));
        let d = def("bootstrap.servers=a:1\nmirror.support.unclean.leader.election=TRUE\nmirror.support.unclean.leader.election.topics=logs-.*,metrics\n").unwrap();
        assert!(d.unclean.applies_to("logs-app") && d.unclean.applies_to("metrics"));
        assert!(!d.unclean.applies_to("orders"));
        let d =
            def("bootstrap.servers=a:1\nmirror.support.unclean.leader.election.topics=logs-.*\n")
                .unwrap();
        assert!(!d.unclean.applies_to("logs-app"), "off unless enabled");
        let err =
            def("bootstrap.servers=a:1\nmirror.support.unclean.leader.election=yes\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("mirror.support.unclean.leader.election"),
            "{err}"
        );
    }

    #[test]
    fn group_sync_settings() {
        let d = def("bootstrap.servers=a:1\n").unwrap();
        assert!(d.groups.enabled);
        assert_eq!(d.groups.interval_ms, 30_000);
        let f = d.groups.filter.compile().unwrap();
        assert!(f.matches("any-group"));
        let d = def("bootstrap.servers=a:1\nsync.group.offsets.interval.ms=500\nmirror.groups.include=app-.*\nmirror.groups.exclude=app-test\nsync.group.offsets.enabled=FALSE\n").unwrap();
        assert!(!d.groups.enabled);
        assert_eq!(d.groups.interval_ms, 500);
        let f = d.groups.filter.compile().unwrap();
        assert!(f.matches("app-billing"));
        assert!(!f.matches("app-test"));
        assert!(!f.matches("other"));
        assert_eq!(
            d.groups.final_timeout_ms,
            GROUP_SYNC_FINAL_TIMEOUT_MS_DEFAULT
        );
        let d = def("bootstrap.servers=a:1\nsync.group.offsets.final.timeout.ms=60000\n").unwrap();
        assert_eq!(d.groups.final_timeout_ms, 60_000);
        for bad in [
            "sync.group.offsets.final.timeout.ms=0\n",
            "sync.group.offsets.final.timeout.ms=600001\n",
            "sync.group.offsets.interval.ms=5\n",
            "sync.group.offsets.interval.ms=soon\n",
            "sync.group.offsets.enabled=yes\n",
            "mirror.groups.include=(\n",
        ] {
            assert!(
                def(&format!("bootstrap.servers=a:1\n{bad}")).is_err(),
                "{bad}"
            );
        }
        // A definition stored before these settings existed reads with the defaults.
        let mut json = serde_json::to_value(def("bootstrap.servers=a:1\n").unwrap()).unwrap();
        json.as_object_mut().unwrap().remove("groups");
        let old: MirrorDefinition = serde_json::from_value(json).unwrap();
        assert_eq!(old.groups, GroupSyncSettings::default());
        let mut json = serde_json::to_value(def("bootstrap.servers=a:1\n").unwrap()).unwrap();
        json["groups"]
            .as_object_mut()
            .unwrap()
            .remove("final_timeout_ms");
        let old: MirrorDefinition = serde_json::from_value(json).unwrap();
        assert_eq!(old.groups, GroupSyncSettings::default());
    }

    #[test]
    fn start_positions() {
        assert_eq!(StartFrom::parse("latest"), Ok(StartFrom::Latest));
        assert_eq!(
            StartFrom::parse("1700000000000"),
            Ok(StartFrom::Timestamp(TimestampMs(1_700_000_000_000)))
        );
        assert!(StartFrom::parse("-5").is_err());
    }

    #[test]
    fn definition_round_trips_through_json() {
        let d = def("bootstrap.servers=a:1\nsecurity.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\nsasl.username=u\nsasl.password=p\nmirror.start.from=latest\n").unwrap();
        let json = serde_json::to_vec(&d).unwrap();
        assert_eq!(
            serde_json::from_slice::<MirrorDefinition>(&json).unwrap(),
            d
        );
    }
}
