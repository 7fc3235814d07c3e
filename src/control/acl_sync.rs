//! ACL sync from a mirror's source (KIP-1279): which ACLs a mirror takes (`mirror.acls.*`)
//! and the source side of a round, a DescribeAcls over the mirror's own connection settings
//! (TLS, SASL), run on a source worker. The controller (`controller::acl_schedule`) schedules
//! rounds, persists the selected set in `__mirror_state` and puts it in force in the
//! authorizer (`serve::authz::Authz::set_synced`); `serve::authz::sync` reads the answer.
//!
//! `mirror.acls.include` is a comma-separated list of what is taken, or `none`:
//! - `topics`: every TOPIC ACL that applies to a topic of the mirror: LITERAL on its name,
//!   the LITERAL wildcard `*`, and PREFIXED patterns that are a prefix of its name. They are
//!   taken as the source has them (a `*` or prefixed ACL then also covers kmirror topics the
//!   mirror does not own, as it covers every matching topic on the source);
//! - `groups`: every GROUP ACL (any name, pattern type or wildcard): group names are not
//!   bound to topics, and consumers moving to kmirror keep their groups;
//! - `transactional-ids`, `cluster`: every TRANSACTIONAL_ID or CLUSTER ACL (not by default).
//!
//! The default is `topics,groups`. `mirror.acls.interval.ms` (default 30 s) is how often a
//! round runs while the mirror has a partition that is not failed over.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{ApiKey, DescribeAclsRequest};
use serde::{Deserialize, Serialize};

use crate::control::group_sync::{connect_source, pick_version};
use crate::control::mirror_def::{
    parse_u64_in, properties_under, DefinitionError, MirrorDefinition,
};
use crate::control::source_security::security_of;
use crate::limits::{
    ACL_SYNC_INTERVAL_MS_DEFAULT, ACL_SYNC_INTERVAL_MS_MAX, ACL_SYNC_INTERVAL_MS_MIN,
};
use crate::serve::authz::sync::SourceAcls;

/// Every key this module owns starts with this; `MirrorDefinition` leaves them to it.
pub const PREFIX: &str = "mirror.acls.";

const INCLUDE: &str = "mirror.acls.include";
const INTERVAL: &str = "mirror.acls.interval.ms";

/// Which kinds of source ACL a mirror takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclKinds {
    pub topics: bool,
    pub groups: bool,
    pub transactional_ids: bool,
    pub cluster: bool,
}

impl AclKinds {
    pub fn none(&self) -> bool {
        !(self.topics || self.groups || self.transactional_ids || self.cluster)
    }

    fn parse(v: &str) -> Option<AclKinds> {
        let mut k = AclKinds {
            topics: false,
            groups: false,
            transactional_ids: false,
            cluster: false,
        };
        let words: Vec<String> = v
            .split(',')
            .map(|w| w.trim().to_ascii_lowercase())
            .filter(|w| !w.is_empty())
            .collect();
        if words.is_empty() {
            return None;
        }
        if words == ["none"] {
            return Some(k);
        }
        for w in words {
            match w.as_str() {
                "topics" => k.topics = true,
                "groups" => k.groups = true,
                "transactional-ids" => k.transactional_ids = true,
                "cluster" => k.cluster = true,
                _ => return None,
            }
        }
        Some(k)
    }
}

/// A mirror's `mirror.acls.*` settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclSyncSettings {
    pub include: AclKinds,
    pub interval_ms: u64,
}

impl Default for AclSyncSettings {
    fn default() -> Self {
        AclSyncSettings {
            include: AclKinds {
                topics: true,
                groups: true,
                transactional_ids: false,
                cluster: false,
            },
            interval_ms: ACL_SYNC_INTERVAL_MS_DEFAULT,
        }
    }
}

impl AclSyncSettings {
    pub fn enabled(&self) -> bool {
        !self.include.none()
    }

    pub fn from_properties(props: &BTreeMap<String, String>) -> Result<Self, DefinitionError> {
        let mut s = AclSyncSettings::default();
        for (key, v) in properties_under(props, PREFIX) {
            match key.as_str() {
                INCLUDE => {
                    s.include = AclKinds::parse(v).ok_or_else(|| DefinitionError::BadValue {
                        key: key.clone(),
                        value: v.clone(),
                        expected: "none, or a list of topics, groups, transactional-ids, cluster",
                    })?
                }
                INTERVAL => {
                    s.interval_ms = parse_u64_in(
                        key,
                        v,
                        ACL_SYNC_INTERVAL_MS_MIN..=ACL_SYNC_INTERVAL_MS_MAX,
                        "interval in ms (100 ms to 24 h)",
                    )?
                }
                _ => return Err(DefinitionError::UnknownProperty(key.clone())),
            }
        }
        Ok(s)
    }
}

/// Reads a source's ACLs (a trait so the controller's rules are tested without a broker).
pub trait SourceAclReader {
    /// Every ACL of `mirror`'s source, or why not; gives up at `deadline`.
    fn read(&self, mirror: &MirrorDefinition, deadline: Instant) -> Result<SourceAcls, String>;
}

/// DescribeAcls v1-3 (v1 is the first with pattern types; Kafka 4 serves v1-3).
const DESCRIBE_ACLS: (i16, i16) = (1, 3);
/// Kafka's `ANY` code for each DescribeAcls filter field.
const ANY: i8 = 1;

/// `SourceAclReader` over the blocking client: one DescribeAcls (match everything) to the
/// first bootstrap server that answers, with the mirror's own credentials and `client.id`.
/// Any broker answers it from its metadata (KRaft) or ZooKeeper cache.
#[derive(Debug, Default, Clone, Copy)]
pub struct BlockingSourceAcls;

impl SourceAclReader for BlockingSourceAcls {
    fn read(&self, mirror: &MirrorDefinition, deadline: Instant) -> Result<SourceAcls, String> {
        let security = security_of(&mirror.source).map_err(|f| f.message)?;
        let client_id = &mirror.source.client_id;
        let mut errors = Vec::new();
        for addr in &mirror.source.bootstrap_servers {
            let answer = connect_source(addr, client_id, &security, deadline).and_then(|mut c| {
                let v = pick_version(&mut c, ApiKey::DescribeAcls, DESCRIBE_ACLS)
                    .map_err(|e| format!("{addr}: {e}"))?
                    .ok_or_else(|| format!("{addr} does not offer DescribeAcls v1+"))?;
                let mut req = DescribeAclsRequest::default();
                req.resource_type_filter = ANY;
                req.resource_name_filter = None;
                req.pattern_type_filter = ANY;
                req.principal_filter = None;
                req.host_filter = None;
                req.operation = ANY;
                req.permission_type = ANY;
                c.request::<DescribeAclsRequest>(v, &req)
                    .map_err(|e| format!("{addr}: DescribeAcls: {e}"))
            });
            match answer {
                Ok(resp) => return Ok(SourceAcls::from_response(&resp)),
                Err(e) => errors.push(e),
            }
            if deadline.saturating_duration_since(Instant::now()) == Duration::ZERO {
                break;
            }
        }
        Err(errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::mirror_def::{parse_properties, MirrorName};

    fn def(extra: &str) -> Result<MirrorDefinition, DefinitionError> {
        MirrorDefinition::from_properties(
            MirrorName::new("m").unwrap(),
            &parse_properties(&format!("bootstrap.servers=src:9092\n{extra}")).unwrap(),
        )
    }

    #[test]
    fn include_and_interval_parse() {
        let d = def("").unwrap();
        assert_eq!(d.acls, AclSyncSettings::default());
        assert!(d.acls.include.topics && d.acls.include.groups && !d.acls.include.cluster);
        let d = def("mirror.acls.include=none\n").unwrap();
        assert!(!d.acls.enabled());
        let d = def("mirror.acls.include=Groups, cluster\nmirror.acls.interval.ms=500\n").unwrap();
        assert!(!d.acls.include.topics && d.acls.include.groups && d.acls.include.cluster);
        assert_eq!(d.acls.interval_ms, 500);
        for bad in [
            "mirror.acls.include=topics,users\n",
            "mirror.acls.include=\n",
            "mirror.acls.include=none,topics\n",
            "mirror.acls.interval.ms=5\n",
            "mirror.acls.sync=true\n",
        ] {
            assert!(def(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_definition_stored_before_acl_sync_gets_the_default() {
        let d = def("").unwrap();
        let mut json = serde_json::to_value(&d).unwrap();
        json.as_object_mut().unwrap().remove("acls");
        let old: MirrorDefinition = serde_json::from_value(json).unwrap();
        assert_eq!(old.acls, AclSyncSettings::default());
    }

    #[test]
    fn a_source_that_refuses_connections_is_an_error() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut d = def("").unwrap();
        d.source.bootstrap_servers = vec![format!("127.0.0.1:{port}")];
        let e = BlockingSourceAcls
            .read(&d, Instant::now() + Duration::from_secs(2))
            .unwrap_err();
        assert!(e.contains("127.0.0.1"), "{e}");
    }
}
