//! ACL bindings as Kafka defines them (`org.apache.kafka.common.acl`): a resource pattern
//! (type, name, LITERAL or PREFIXED) and an entry (principal, host, operation, ALLOW/DENY),
//! with the wire codes the ACL APIs use, the filters DescribeAcls/DeleteAcls match with, and
//! kmirror's stored form of one binding. No I/O.

use serde::{Deserialize, Serialize};

/// The name of the one cluster resource (Kafka's `kafka-cluster`).
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// A LITERAL resource name, principal name or host matching every one.
pub const WILDCARD: &str = "*";
/// The principal `User:*`, which every principal matches.
pub const WILDCARD_PRINCIPAL: &str = "User:*";

macro_rules! codes {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $code:literal => $text:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name { $($variant),* }

        impl $name {
            /// The code on the wire (Kafka's enum `code()`).
            pub fn code(self) -> i8 {
                match self { $($name::$variant => $code),* }
            }

            /// The value of a wire code; `None` for codes Kafka does not define.
            pub fn from_code(code: i8) -> Option<$name> {
                match code { $($code => Some($name::$variant),)* _ => None }
            }

            /// The name Kafka's tools print (`TOPIC`, `PREFIXED`, `READ`, `ALLOW`).
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }
        }
    };
}

codes!(
    /// Kafka's `ResourceType`; `Any` only in filters.
    ResourceType {
        Any = 1 => "ANY",
        Topic = 2 => "TOPIC",
        Group = 3 => "GROUP",
        Cluster = 4 => "CLUSTER",
        TransactionalId = 5 => "TRANSACTIONAL_ID",
        DelegationToken = 6 => "DELEGATION_TOKEN",
        User = 7 => "USER",
    }
);

codes!(
    /// Kafka's `PatternType`; `Any` and `Match` only in filters.
    PatternType {
        Any = 1 => "ANY",
        Match = 2 => "MATCH",
        Literal = 3 => "LITERAL",
        Prefixed = 4 => "PREFIXED",
    }
);

codes!(
    /// Kafka's `AclOperation`; `Any` only in filters.
    Operation {
        Any = 1 => "ANY",
        All = 2 => "ALL",
        Read = 3 => "READ",
        Write = 4 => "WRITE",
        Create = 5 => "CREATE",
        Delete = 6 => "DELETE",
        Alter = 7 => "ALTER",
        Describe = 8 => "DESCRIBE",
        ClusterAction = 9 => "CLUSTER_ACTION",
        DescribeConfigs = 10 => "DESCRIBE_CONFIGS",
        AlterConfigs = 11 => "ALTER_CONFIGS",
        IdempotentWrite = 12 => "IDEMPOTENT_WRITE",
        CreateTokens = 13 => "CREATE_TOKENS",
        DescribeTokens = 14 => "DESCRIBE_TOKENS",
    }
);

codes!(
    /// Kafka's `AclPermissionType`; `Any` only in filters.
    Permission {
        Any = 1 => "ANY",
        Deny = 2 => "DENY",
        Allow = 3 => "ALLOW",
    }
);

/// What an ACL applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ResourcePattern {
    pub resource_type: ResourceType,
    pub name: String,
    pub pattern_type: PatternType,
}

impl ResourcePattern {
    /// Whether this pattern covers the resource `name` (of this pattern's type): the same
    /// name, the LITERAL wildcard `*`, or a PREFIXED pattern the name starts with.
    pub fn covers(&self, name: &str) -> bool {
        match self.pattern_type {
            PatternType::Literal => self.name == name || self.name == WILDCARD,
            PatternType::Prefixed => name.starts_with(&self.name),
            _ => false,
        }
    }
}

/// Who may (or may not) do what from where.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AclEntry {
    /// `Type:name` as Kafka writes it (`User:alice`, `User:*`).
    pub principal: String,
    /// An IP address as the client connects from, or `*`.
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

/// One ACL: Kafka's `AclBinding`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AclBinding {
    pub pattern: ResourcePattern,
    pub entry: AclEntry,
}

/// Why a binding cannot be stored (CreateAcls answers INVALID_REQUEST with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error("unknown {what} code {code}")]
    UnknownCode { what: &'static str, code: i8 },
    #[error("{what} {value} is only valid in a filter")]
    FilterOnly {
        what: &'static str,
        value: &'static str,
    },
    #[error("principal {0:?} is not of the form Type:name")]
    Principal(String),
    #[error("the cluster resource is named {CLUSTER_NAME}, not {0:?}")]
    ClusterName(String),
    #[error("empty resource name")]
    EmptyName,
    #[error("empty host")]
    EmptyHost,
    #[error("{what} of {len} bytes is longer than {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
}

fn code<T>(what: &'static str, c: i8, f: impl Fn(i8) -> Option<T>) -> Result<T, AclError> {
    f(c).ok_or(AclError::UnknownCode { what, code: c })
}

fn bounded(what: &'static str, s: &str) -> Result<(), AclError> {
    let max = crate::limits::ACL_FIELD_BYTES_MAX;
    if s.len() > max {
        return Err(AclError::TooLong {
            what,
            len: s.len(),
            max,
        });
    }
    Ok(())
}

impl AclBinding {
    /// A binding from the wire fields of CreateAcls (or a DescribeAcls answer), checked as
    /// Kafka's `AclControlManager.validateNewAcl` does.
    pub fn from_wire(
        resource_type: i8,
        name: &str,
        pattern_type: i8,
        principal: &str,
        host: &str,
        operation: i8,
        permission: i8,
    ) -> Result<AclBinding, AclError> {
        let b = AclBinding {
            pattern: ResourcePattern {
                resource_type: code("resource type", resource_type, ResourceType::from_code)?,
                name: name.to_string(),
                pattern_type: code("pattern type", pattern_type, PatternType::from_code)?,
            },
            entry: AclEntry {
                principal: principal.to_string(),
                host: host.to_string(),
                operation: code("operation", operation, Operation::from_code)?,
                permission: code("permission type", permission, Permission::from_code)?,
            },
        };
        b.validate()?;
        Ok(b)
    }

    /// The checks every stored binding passes (also applied to decoded records and to ACLs
    /// read from a source).
    pub fn validate(&self) -> Result<(), AclError> {
        let p = &self.pattern;
        let e = &self.entry;
        if p.resource_type == ResourceType::Any {
            return Err(AclError::FilterOnly {
                what: "resource type",
                value: "ANY",
            });
        }
        if matches!(p.pattern_type, PatternType::Any | PatternType::Match) {
            return Err(AclError::FilterOnly {
                what: "pattern type",
                value: p.pattern_type.name(),
            });
        }
        if e.operation == Operation::Any {
            return Err(AclError::FilterOnly {
                what: "operation",
                value: "ANY",
            });
        }
        if e.permission == Permission::Any {
            return Err(AclError::FilterOnly {
                what: "permission type",
                value: "ANY",
            });
        }
        bounded("resource name", &p.name)?;
        bounded("principal", &e.principal)?;
        bounded("host", &e.host)?;
        if p.name.is_empty() {
            return Err(AclError::EmptyName);
        }
        if p.resource_type == ResourceType::Cluster && p.name != CLUSTER_NAME {
            return Err(AclError::ClusterName(p.name.clone()));
        }
        match e.principal.split_once(':') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
            _ => return Err(AclError::Principal(e.principal.clone())),
        }
        if e.host.is_empty() {
            return Err(AclError::EmptyHost);
        }
        Ok(())
    }

    /// kmirror's stored form of one binding: JSON of this struct (the key of a record in the
    /// ACL log; the set of live keys is the set of ACLs).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an AclBinding serialises")
    }

    /// The binding a stored record holds, checked like a new one: a record that does not
    /// decode or validate is an error, never a silently different ACL.
    pub fn decode(bytes: &[u8]) -> Result<AclBinding, String> {
        let b: AclBinding = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        b.validate().map_err(|e| e.to_string())?;
        Ok(b)
    }
}

impl std::fmt::Display for AclBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{} {} {} {} from {}",
            self.pattern.resource_type.name(),
            self.pattern.pattern_type.name(),
            self.pattern.name,
            self.entry.principal,
            self.entry.permission.name(),
            self.entry.operation.name(),
            self.entry.host
        )
    }
}

/// Kafka's `AclBindingFilter`: which bindings DescribeAcls lists and DeleteAcls removes.
/// `None` fields match anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: ResourceType,
    pub name: Option<String>,
    pub pattern_type: PatternType,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Operation,
    pub permission: Permission,
}

impl AclFilter {
    /// A filter from the wire fields of DescribeAcls/DeleteAcls.
    #[allow(clippy::too_many_arguments)]
    pub fn from_wire(
        resource_type: i8,
        name: Option<&str>,
        pattern_type: i8,
        principal: Option<&str>,
        host: Option<&str>,
        operation: i8,
        permission: i8,
    ) -> Result<AclFilter, AclError> {
        Ok(AclFilter {
            resource_type: code("resource type", resource_type, ResourceType::from_code)?,
            name: name.map(str::to_string),
            pattern_type: code("pattern type", pattern_type, PatternType::from_code)?,
            principal: principal.map(str::to_string),
            host: host.map(str::to_string),
            operation: code("operation", operation, Operation::from_code)?,
            permission: code("permission type", permission, Permission::from_code)?,
        })
    }

    /// Every binding.
    pub fn any() -> AclFilter {
        AclFilter {
            resource_type: ResourceType::Any,
            name: None,
            pattern_type: PatternType::Any,
            principal: None,
            host: None,
            operation: Operation::Any,
            permission: Permission::Any,
        }
    }

    /// Whether `b` passes this filter (Kafka's `AclBindingFilter.matches`). MATCH selects
    /// the patterns that would apply to the named resource: the same LITERAL name, the
    /// LITERAL wildcard, and PREFIXED patterns the name starts with.
    pub fn matches(&self, b: &AclBinding) -> bool {
        let p = &b.pattern;
        let e = &b.entry;
        let rtype =
            self.resource_type == ResourceType::Any || self.resource_type == p.resource_type;
        let pattern = match (self.pattern_type, &self.name) {
            (PatternType::Any, None) => true,
            (PatternType::Any, Some(n)) => &p.name == n,
            (PatternType::Match, None) => true,
            (PatternType::Match, Some(n)) => p.covers(n),
            (t, None) => p.pattern_type == t,
            (t, Some(n)) => p.pattern_type == t && &p.name == n,
        };
        let principal = self.principal.as_ref().is_none_or(|x| x == &e.principal);
        let host = self.host.as_ref().is_none_or(|x| x == &e.host);
        let op = self.operation == Operation::Any || self.operation == e.operation;
        let perm = self.permission == Permission::Any || self.permission == e.permission;
        rtype && pattern && principal && host && op && perm
    }
}

/// A binding from its parts (tests).
#[cfg(test)]
pub(crate) fn acl(
    rtype: ResourceType,
    name: &str,
    ptype: PatternType,
    principal: &str,
    host: &str,
    op: Operation,
    perm: Permission,
) -> AclBinding {
    AclBinding {
        pattern: ResourcePattern {
            resource_type: rtype,
            name: name.into(),
            pattern_type: ptype,
        },
        entry: AclEntry {
            principal: principal.into(),
            host: host.into(),
            operation: op,
            permission: perm,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_kafkas() {
        assert_eq!(ResourceType::Topic.code(), 2);
        assert_eq!(ResourceType::TransactionalId.code(), 5);
        assert_eq!(PatternType::Prefixed.code(), 4);
        assert_eq!(Operation::IdempotentWrite.code(), 12);
        assert_eq!(Permission::Allow.code(), 3);
        assert_eq!(Operation::from_code(0), None, "UNKNOWN is never accepted");
        assert_eq!(Operation::from_code(15), None);
    }

    #[test]
    fn new_bindings_are_validated() {
        let ok = AclBinding::from_wire(2, "t", 3, "User:a", "*", 3, 3).unwrap();
        assert_eq!(ok.to_string(), "TOPIC:LITERAL:t User:a ALLOW READ from *");
        let bad = [
            (1, "t", 3, "User:a", "*", 3, 3),
            (2, "t", 2, "User:a", "*", 3, 3),
            (2, "t", 3, "User:a", "*", 1, 3),
            (2, "t", 3, "User:a", "*", 3, 1),
            (2, "", 3, "User:a", "*", 3, 3),
            (4, "c", 3, "User:a", "*", 3, 3),
            (2, "t", 3, "alice", "*", 3, 3),
            (2, "t", 3, "User:", "*", 3, 3),
            (2, "t", 3, "User:a", "", 3, 3),
            (9, "t", 3, "User:a", "*", 3, 3),
        ];
        for (rt, n, pt, p, h, o, pm) in bad {
            assert!(
                AclBinding::from_wire(rt, n, pt, p, h, o, pm).is_err(),
                "{rt} {n:?} {pt} {p:?} {h:?} {o} {pm} was accepted"
            );
        }
    }

    #[test]
    fn stored_form_round_trips_and_refuses_garbage() {
        let b = acl(
            ResourceType::Group,
            "g-",
            PatternType::Prefixed,
            "User:*",
            "10.0.0.1",
            Operation::Read,
            Permission::Deny,
        );
        assert_eq!(AclBinding::decode(&b.encode()).unwrap(), b);
        assert!(AclBinding::decode(b"{}").is_err());
        assert!(AclBinding::decode(b"\xff").is_err());
        let mut any = b.clone();
        any.entry.operation = Operation::Any;
        assert!(AclBinding::decode(&any.encode()).is_err());
    }

    #[test]
    fn filters_match_as_kafkas() {
        let lit = acl(
            ResourceType::Topic,
            "foo",
            PatternType::Literal,
            "User:a",
            "*",
            Operation::Read,
            Permission::Allow,
        );
        let wild = acl(
            ResourceType::Topic,
            "*",
            PatternType::Literal,
            "User:a",
            "*",
            Operation::Read,
            Permission::Allow,
        );
        let pre = acl(
            ResourceType::Topic,
            "fo",
            PatternType::Prefixed,
            "User:b",
            "*",
            Operation::Write,
            Permission::Deny,
        );
        let mut f = AclFilter::any();
        assert!(f.matches(&lit) && f.matches(&wild) && f.matches(&pre));
        f.pattern_type = PatternType::Match;
        f.name = Some("foo".into());
        assert!(f.matches(&lit) && f.matches(&wild) && f.matches(&pre));
        f.name = Some("bar".into());
        assert!(!f.matches(&lit) && f.matches(&wild) && !f.matches(&pre));
        f.pattern_type = PatternType::Literal;
        f.name = Some("*".into());
        assert!(!f.matches(&lit) && f.matches(&wild) && !f.matches(&pre));
        let mut f = AclFilter::any();
        f.pattern_type = PatternType::Prefixed;
        assert!(!f.matches(&lit) && f.matches(&pre));
        f.principal = Some("User:a".into());
        assert!(!f.matches(&pre));
        let mut f = AclFilter::any();
        f.resource_type = ResourceType::Group;
        assert!(!f.matches(&lit));
        f.resource_type = ResourceType::Topic;
        f.operation = Operation::Write;
        f.permission = Permission::Deny;
        assert!(f.matches(&pre) && !f.matches(&lit));
    }
}
