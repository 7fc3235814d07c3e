//! The sans-IO half of ACL sync from a mirror's source (KIP-1279): what a source's
//! DescribeAcls answer means, and which of its ACLs a mirror takes (`select`; the rule is
//! documented with `mirror.acls.include` in `control::acl_sync`). The control plane reads the
//! source on a source worker (`control::acl_sync`), keeps the selection in `__mirror_state`
//! and puts it in force with `Authz::set_synced` (`control::controller::acl_schedule`).

use std::collections::BTreeSet;

use kafka_protocol::messages::DescribeAclsResponse;

use crate::control::acl_sync::AclKinds;

use crate::serve::authz::acl::{AclBinding, PatternType, ResourceType, WILDCARD};

/// Kafka's SECURITY_DISABLED: the source runs no authorizer.
const SECURITY_DISABLED: i16 = 54;

/// What a source said about its ACLs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceAcls {
    /// The source's ACLs (each valid; invalid ones are counted, not taken).
    Acls {
        acls: BTreeSet<AclBinding>,
        skipped: usize,
    },
    /// The source has no authorizer: nothing to sync, the mirror carries on.
    NoAuthorizer,
    /// Another error (the mirror's credentials may lack DESCRIBE on the source cluster).
    Error { code: i16, message: String },
}

impl SourceAcls {
    /// Reads a DescribeAcls answer.
    pub fn from_response(resp: &DescribeAclsResponse) -> SourceAcls {
        match resp.error_code {
            0 => {}
            SECURITY_DISABLED => return SourceAcls::NoAuthorizer,
            code => {
                return SourceAcls::Error {
                    code,
                    message: resp
                        .error_message
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default(),
                }
            }
        }
        let mut acls = BTreeSet::new();
        let mut skipped = 0;
        for r in &resp.resources {
            for a in &r.acls {
                match AclBinding::from_wire(
                    r.resource_type,
                    &r.resource_name,
                    r.pattern_type,
                    &a.principal,
                    &a.host,
                    a.operation,
                    a.permission_type,
                ) {
                    Ok(b) => {
                        acls.insert(b);
                    }
                    Err(_) => skipped += 1,
                }
            }
        }
        SourceAcls::Acls { acls, skipped }
    }

    /// The line `mirrors describe` shows for this answer.
    pub fn describe(&self) -> String {
        match self {
            SourceAcls::Acls { acls, skipped: 0 } => format!("{} ACLs synced", acls.len()),
            SourceAcls::Acls { acls, skipped } => {
                format!(
                    "{} ACLs synced, {skipped} not valid here skipped",
                    acls.len()
                )
            }
            SourceAcls::NoAuthorizer => {
                "the source has no authorizer (SECURITY_DISABLED): no ACLs to sync".into()
            }
            SourceAcls::Error { code, message } => {
                let name = kafka_protocol::ResponseError::try_from_code(*code)
                    .map_or_else(|| "unknown error".to_owned(), |e| format!("{e:?}"));
                format!("DescribeAcls on the source failed: error {code} ({name}) {message}")
            }
        }
    }
}

/// The ACLs of `acls` a mirror whose topics are `topics` takes, given `kinds`: TOPIC ACLs
/// that apply to one of `topics` (LITERAL on its name, LITERAL `*`, PREFIXED covering it),
/// and every GROUP, TRANSACTIONAL_ID or CLUSTER ACL when asked for.
pub fn select<'a>(
    acls: &'a BTreeSet<AclBinding>,
    topics: &'a BTreeSet<String>,
    kinds: AclKinds,
) -> impl Iterator<Item = &'a AclBinding> + 'a {
    acls.iter().filter(move |b| {
        let p = &b.pattern;
        match p.resource_type {
            ResourceType::Group => kinds.groups,
            ResourceType::TransactionalId => kinds.transactional_ids,
            ResourceType::Cluster => kinds.cluster,
            ResourceType::Topic if !kinds.topics => false,
            ResourceType::Topic => match p.pattern_type {
                PatternType::Literal if p.name == WILDCARD => true,
                PatternType::Literal => topics.contains(&p.name),
                PatternType::Prefixed => topics.iter().any(|t| t.starts_with(&p.name)),
                PatternType::Any | PatternType::Match => false,
            },
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::authz::apis::describe_resources;

    fn b(rt: i8, name: &str, pt: i8) -> AclBinding {
        AclBinding::from_wire(rt, name, pt, "User:a", "*", 3, 3).unwrap()
    }

    #[test]
    fn answers_are_read_and_selected() {
        let all: Vec<AclBinding> = vec![
            b(2, "orders", 3),
            b(2, "other", 3),
            b(2, "*", 3),
            b(2, "ord", 4),
            b(2, "x", 4),
            b(3, "g", 3),
            b(4, "kafka-cluster", 3),
            b(5, "tx", 3),
        ];
        let mut resp = DescribeAclsResponse::default();
        resp.resources = describe_resources(&all);
        let SourceAcls::Acls { acls, skipped: 0 } = SourceAcls::from_response(&resp) else {
            panic!("not read")
        };
        assert_eq!(acls.len(), all.len());
        let topics: BTreeSet<String> = ["orders".to_string()].into();
        let default = crate::control::acl_sync::AclSyncSettings::default().include;
        let picked: Vec<&AclBinding> = select(&acls, &topics, default).collect();
        let want: BTreeSet<AclBinding> = [
            b(2, "orders", 3),
            b(2, "*", 3),
            b(2, "ord", 4),
            b(3, "g", 3),
        ]
        .into();
        assert_eq!(picked.into_iter().cloned().collect::<BTreeSet<_>>(), want);
        let only = AclKinds {
            topics: false,
            groups: false,
            transactional_ids: true,
            cluster: true,
        };
        let picked: BTreeSet<AclBinding> = select(&acls, &topics, only).cloned().collect();
        assert_eq!(picked, [b(4, "kafka-cluster", 3), b(5, "tx", 3)].into());
    }

    #[test]
    fn a_source_without_authorizer_is_not_a_failure() {
        let mut resp = DescribeAclsResponse::default();
        resp.error_code = SECURITY_DISABLED;
        let r = SourceAcls::from_response(&resp);
        assert_eq!(r, SourceAcls::NoAuthorizer);
        assert!(r.describe().contains("no authorizer"), "{}", r.describe());
        resp.error_code = 31;
        let r = SourceAcls::from_response(&resp);
        assert!(matches!(r, SourceAcls::Error { code: 31, .. }));
        assert!(
            r.describe()
                .contains("error 31 (ClusterAuthorizationFailed)"),
            "{}",
            r.describe()
        );
    }
}
