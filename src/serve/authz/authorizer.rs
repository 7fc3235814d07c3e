//! The authorization decision, with the rules of Kafka's `StandardAuthorizer`
//! (`StandardAuthorizerData.findAclRule`/`findResult`), sans-IO:
//!
//! 1. a principal named in `super.users` may do everything;
//! 2. the ACLs that apply to a resource are those of its type whose pattern covers its name:
//!    LITERAL with the same name, LITERAL `*`, PREFIXED with a prefix of the name;
//! 3. of those, an ACL matches the request when its principal is the client's or `User:*`, its
//!    host is the client's IP or `*`, and its operation is the requested one or ALL; an ALLOW
//!    ACL for READ, WRITE, DELETE or ALTER also grants DESCRIBE, and one for ALTER_CONFIGS also
//!    grants DESCRIBE_CONFIGS (a DENY ACL denies only the operation it names, or ALL);
//! 4. any matching DENY wins; else any matching ALLOW allows; else, when no ACL at all applies
//!    to the resource (whoever it names), `allow.everyone.if.no.acl.found` decides; else denied.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::serve::authz::acl::{
    AclBinding, AclEntry, Operation, PatternType, Permission, ResourceType, WILDCARD,
    WILDCARD_PRINCIPAL,
};

/// The settings the decision depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthzSettings {
    /// `false`: every request is allowed and no ACL is looked at.
    pub enabled: bool,
    /// Principals (`User:admin`) allowed everything.
    pub super_users: BTreeSet<String>,
    /// Kafka's `allow.everyone.if.no.acl.found`.
    pub allow_if_no_acl: bool,
}

impl AuthzSettings {
    /// Everything allowed (no `[kafka]` authorizer, unit tests of other modules).
    pub fn allow_all() -> AuthzSettings {
        AuthzSettings {
            enabled: false,
            super_users: BTreeSet::new(),
            allow_if_no_acl: true,
        }
    }
}

/// Why a request was allowed or denied (logged at debug, shown by tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Disabled,
    SuperUser,
    Allowed(AclEntry),
    Denied(AclEntry),
    DefaultAllow,
    DefaultDeny,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        matches!(
            self,
            Decision::Disabled
                | Decision::SuperUser
                | Decision::Allowed(_)
                | Decision::DefaultAllow
        )
    }
}

/// The ACLs in force, indexed for the decision: LITERAL ones by exact (type, name) — the
/// wildcard `*` is just another name here — and PREFIXED ones per type.
#[derive(Debug, Default, Clone)]
pub struct AclIndex {
    literal: HashMap<(ResourceType, String), Vec<AclEntry>>,
    prefixed: BTreeMap<ResourceType, Vec<(String, AclEntry)>>,
    len: usize,
}

impl AclIndex {
    pub fn build<'a>(acls: impl IntoIterator<Item = &'a AclBinding>) -> AclIndex {
        let mut idx = AclIndex::default();
        let unique: BTreeSet<&AclBinding> = acls.into_iter().collect();
        for b in unique {
            let p = &b.pattern;
            match p.pattern_type {
                PatternType::Literal => idx
                    .literal
                    .entry((p.resource_type, p.name.clone()))
                    .or_default()
                    .push(b.entry.clone()),
                PatternType::Prefixed => idx
                    .prefixed
                    .entry(p.resource_type)
                    .or_default()
                    .push((p.name.clone(), b.entry.clone())),
                // Filters only; `AclBinding::validate` keeps them out of every set.
                PatternType::Any | PatternType::Match => continue,
            }
            idx.len += 1;
        }
        idx
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every ACL entry that applies to resource `name` of type `rtype`.
    fn applying<'a>(
        &'a self,
        rtype: ResourceType,
        name: &'a str,
    ) -> impl Iterator<Item = &'a AclEntry> + 'a {
        let exact = self.literal.get(&(rtype, name.to_string()));
        let wildcard = if name == WILDCARD {
            None
        } else {
            self.literal.get(&(rtype, WILDCARD.to_string()))
        };
        let prefixed = self
            .prefixed
            .get(&rtype)
            .into_iter()
            .flatten()
            .filter(move |(prefix, _)| name.starts_with(prefix.as_str()))
            .map(|(_, e)| e);
        exact
            .into_iter()
            .flatten()
            .chain(wildcard.into_iter().flatten())
            .chain(prefixed)
    }

    /// Every entry of resource type `rtype`, with the pattern it came with.
    fn of_type(
        &self,
        rtype: ResourceType,
    ) -> impl Iterator<Item = (PatternType, &str, &AclEntry)> + '_ {
        let literal = self
            .literal
            .iter()
            .filter(move |((t, _), _)| *t == rtype)
            .flat_map(|((_, n), es)| {
                es.iter()
                    .map(move |e| (PatternType::Literal, n.as_str(), e))
            });
        let prefixed = self
            .prefixed
            .get(&rtype)
            .into_iter()
            .flatten()
            .map(|(n, e)| (PatternType::Prefixed, n.as_str(), e));
        literal.chain(prefixed)
    }
}

/// Who is asking, from where.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    /// `Type:name`.
    pub principal: &'a str,
    /// The client's IP as text, `*` when unknown.
    pub host: &'a str,
}

/// Whether an entry's principal and host are the requester's.
fn names(e: &AclEntry, who: Requester<'_>) -> bool {
    (e.principal == who.principal || e.principal == WILDCARD_PRINCIPAL)
        && (e.host == WILDCARD || e.host == who.host)
}

/// Whether `e` (principal and host already matched) grants or denies `op`; `None` if it says
/// nothing about it.
fn verdict(e: &AclEntry, op: Operation) -> Option<Permission> {
    let applies = e.operation == Operation::All
        || e.operation == op
        || (e.permission == Permission::Allow
            && match op {
                Operation::Describe => matches!(
                    e.operation,
                    Operation::Read | Operation::Write | Operation::Delete | Operation::Alter
                ),
                Operation::DescribeConfigs => e.operation == Operation::AlterConfigs,
                _ => false,
            });
    applies.then_some(e.permission)
}

/// May `who` do `op` on resource `name` of type `rtype`?
pub fn decide(
    settings: &AuthzSettings,
    acls: &AclIndex,
    who: Requester<'_>,
    op: Operation,
    rtype: ResourceType,
    name: &str,
) -> Decision {
    if !settings.enabled {
        return Decision::Disabled;
    }
    if settings.super_users.contains(who.principal) {
        return Decision::SuperUser;
    }
    let mut any = false;
    let mut allow = None;
    for e in acls.applying(rtype, name) {
        any = true;
        if !names(e, who) {
            continue;
        }
        match verdict(e, op) {
            Some(Permission::Deny) => return Decision::Denied(e.clone()),
            Some(Permission::Allow) if allow.is_none() => allow = Some(e.clone()),
            _ => {}
        }
    }
    match (allow, any) {
        (Some(e), _) => Decision::Allowed(e),
        (None, false) if settings.allow_if_no_acl => Decision::DefaultAllow,
        (None, _) => Decision::DefaultDeny,
    }
}

/// May `who` do `op` on at least one resource of type `rtype`? Kafka's
/// `Authorizer.authorizeByResourceType` (InitProducerId uses it: an idempotent producer may
/// start with WRITE on any topic instead of IDEMPOTENT_WRITE on the cluster). Allowed when some
/// ALLOW ACL of the requester for `op` (or ALL) is not cancelled by one of its DENY ACLs: a
/// LITERAL `*` DENY cancels all, a PREFIXED DENY cancels the patterns it is a prefix of, a
/// LITERAL DENY the same LITERAL name. With no ACL of that type at all the default decides,
/// as it would for a resource no ACL names.
pub fn decide_any(
    settings: &AuthzSettings,
    acls: &AclIndex,
    who: Requester<'_>,
    op: Operation,
    rtype: ResourceType,
) -> bool {
    if !settings.enabled || settings.super_users.contains(who.principal) {
        return true;
    }
    let mut any = false;
    let mut denies: Vec<(PatternType, &str)> = Vec::new();
    let mut allows: Vec<(PatternType, &str)> = Vec::new();
    for (ptype, name, e) in acls.of_type(rtype) {
        any = true;
        if !names(e, who) || !(e.operation == op || e.operation == Operation::All) {
            continue;
        }
        match e.permission {
            Permission::Deny => denies.push((ptype, name)),
            Permission::Allow => allows.push((ptype, name)),
            Permission::Any => {}
        }
    }
    if !any {
        return settings.allow_if_no_acl;
    }
    if denies
        .iter()
        .any(|(t, n)| *t == PatternType::Literal && *n == WILDCARD)
    {
        return false;
    }
    allows.iter().any(|(at, an)| {
        !denies.iter().any(|(dt, dn)| match dt {
            PatternType::Prefixed => an.starts_with(dn),
            _ => *at == PatternType::Literal && an == dn,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::authz::acl::acl;
    use Operation::*;
    use PatternType::{Literal as L, Prefixed as P};
    use Permission::{Allow as A, Deny as D};
    use ResourceType::*;

    fn settings(allow_if_no_acl: bool) -> AuthzSettings {
        AuthzSettings {
            enabled: true,
            super_users: ["User:admin".to_string()].into(),
            allow_if_no_acl,
        }
    }

    const ALICE: Requester<'static> = Requester {
        principal: "User:alice",
        host: "10.0.0.1",
    };
    const BOB: Requester<'static> = Requester {
        principal: "User:bob",
        host: "10.0.0.2",
    };

    /// One row: the ACLs in force, the request, and Kafka's documented answer.
    struct Case {
        why: &'static str,
        acls: Vec<AclBinding>,
        who: Requester<'static>,
        op: Operation,
        rtype: ResourceType,
        name: &'static str,
        allow_if_no_acl: bool,
        allowed: bool,
    }

    fn a(
        rt: ResourceType,
        n: &str,
        pt: PatternType,
        p: &str,
        h: &str,
        o: Operation,
        pm: Permission,
    ) -> AclBinding {
        acl(rt, n, pt, p, h, o, pm)
    }

    #[test]
    fn kafka_rules_table() {
        let t = |n: &str, pt, p: &str, o, pm| a(Topic, n, pt, p, "*", o, pm);
        let cases = vec![
            Case {
                why: "no ACL, default false",
                acls: vec![],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "no ACL, default true",
                acls: vec![],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: true,
                allowed: true,
            },
            Case {
                why: "super user without ACLs",
                acls: vec![],
                who: Requester {
                    principal: "User:admin",
                    host: "1.2.3.4",
                },
                op: Alter,
                rtype: Cluster,
                name: "kafka-cluster",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "super user even when denied",
                acls: vec![t("t", L, "User:admin", All, D)],
                who: Requester {
                    principal: "User:admin",
                    host: "1.2.3.4",
                },
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "literal allow",
                acls: vec![t("t", L, "User:alice", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "literal allow names another topic",
                acls: vec![t("t", L, "User:alice", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t2",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "literal name is not a prefix",
                acls: vec![t("t", L, "User:alice", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "tt",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "ACLs for someone else: not 'no ACL found'",
                acls: vec![t("t", L, "User:bob", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: true,
                allowed: false,
            },
            Case {
                why: "ACLs on another resource leave the default",
                acls: vec![t("u", L, "User:bob", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: true,
                allowed: true,
            },
            Case {
                why: "same name, other resource type",
                acls: vec![a(Group, "t", L, "User:alice", "*", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "prefixed allow",
                acls: vec![t("orders-", P, "User:alice", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "orders-eu",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "prefixed does not match shorter",
                acls: vec![t("orders-", P, "User:alice", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "orders",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "prefix equal to the name matches",
                acls: vec![t("orders", P, "User:alice", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "orders",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "wildcard resource",
                acls: vec![t("*", L, "User:alice", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "anything",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "prefixed '*' is a literal star prefix",
                acls: vec![t("*", P, "User:alice", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "anything",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "wildcard principal",
                acls: vec![t("t", L, "User:*", Read, A)],
                who: BOB,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "deny wins over allow",
                acls: vec![
                    t("t", L, "User:alice", Read, A),
                    t("t", L, "User:alice", Read, D),
                ],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "wildcard deny wins over literal allow",
                acls: vec![
                    t("t", L, "User:alice", Read, A),
                    t("*", L, "User:*", Read, D),
                ],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "prefixed deny wins over literal allow",
                acls: vec![
                    t("t", L, "User:alice", All, A),
                    t("", P, "User:alice", Write, D),
                ],
                who: ALICE,
                op: Write,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "deny for another principal",
                acls: vec![
                    t("t", L, "User:alice", Read, A),
                    t("t", L, "User:bob", Read, D),
                ],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "host exact",
                acls: vec![a(Topic, "t", L, "User:alice", "10.0.0.1", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "host other",
                acls: vec![a(Topic, "t", L, "User:alice", "10.0.0.9", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: true,
                allowed: false,
            },
            Case {
                why: "deny from one host only",
                acls: vec![
                    t("t", L, "User:*", Read, A),
                    a(Topic, "t", L, "User:*", "10.0.0.2", Read, D),
                ],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "deny from that host",
                acls: vec![
                    t("t", L, "User:*", Read, A),
                    a(Topic, "t", L, "User:*", "10.0.0.2", Read, D),
                ],
                who: BOB,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "READ implies DESCRIBE",
                acls: vec![t("t", L, "User:alice", Read, A)],
                who: ALICE,
                op: Describe,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "WRITE implies DESCRIBE",
                acls: vec![t("t", L, "User:alice", Write, A)],
                who: ALICE,
                op: Describe,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "DELETE implies DESCRIBE",
                acls: vec![t("t", L, "User:alice", Delete, A)],
                who: ALICE,
                op: Describe,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "ALTER implies DESCRIBE",
                acls: vec![t("t", L, "User:alice", Alter, A)],
                who: ALICE,
                op: Describe,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "CREATE does not imply DESCRIBE",
                acls: vec![t("t", L, "User:alice", Create, A)],
                who: ALICE,
                op: Describe,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "DESCRIBE does not imply READ",
                acls: vec![t("t", L, "User:alice", Describe, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "ALTER_CONFIGS implies DESCRIBE_CONFIGS",
                acls: vec![t("t", L, "User:alice", AlterConfigs, A)],
                who: ALICE,
                op: DescribeConfigs,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "READ does not imply DESCRIBE_CONFIGS",
                acls: vec![t("t", L, "User:alice", Read, A)],
                who: ALICE,
                op: DescribeConfigs,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "DENY READ does not deny DESCRIBE",
                acls: vec![
                    t("t", L, "User:alice", Describe, A),
                    t("t", L, "User:alice", Read, D),
                ],
                who: ALICE,
                op: Describe,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "ALL allows any operation",
                acls: vec![t("t", L, "User:alice", All, A)],
                who: ALICE,
                op: Delete,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "DENY ALL denies DESCRIBE",
                acls: vec![
                    t("t", L, "User:alice", Describe, A),
                    t("t", L, "User:alice", All, D),
                ],
                who: ALICE,
                op: Describe,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: false,
            },
            Case {
                why: "group READ",
                acls: vec![a(Group, "g", L, "User:alice", "*", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Group,
                name: "g",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "cluster ALTER",
                acls: vec![a(Cluster, "kafka-cluster", L, "User:alice", "*", Alter, A)],
                who: ALICE,
                op: Alter,
                rtype: Cluster,
                name: "kafka-cluster",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "transactional id prefixed WRITE",
                acls: vec![a(TransactionalId, "app-", P, "User:alice", "*", Write, A)],
                who: ALICE,
                op: Write,
                rtype: TransactionalId,
                name: "app-1",
                allow_if_no_acl: false,
                allowed: true,
            },
            Case {
                why: "principal type matters",
                acls: vec![t("t", L, "Group:alice", Read, A)],
                who: ALICE,
                op: Read,
                rtype: Topic,
                name: "t",
                allow_if_no_acl: false,
                allowed: false,
            },
        ];
        for c in cases {
            let idx = AclIndex::build(&c.acls);
            let d = decide(
                &settings(c.allow_if_no_acl),
                &idx,
                c.who,
                c.op,
                c.rtype,
                c.name,
            );
            assert_eq!(d.allowed(), c.allowed, "{}: {d:?}", c.why);
        }
    }

    #[test]
    fn disabled_allows_everything() {
        let idx = AclIndex::build(&[a(Topic, "t", L, "User:*", "*", All, D)]);
        let d = decide(&AuthzSettings::allow_all(), &idx, ALICE, Read, Topic, "t");
        assert_eq!(d, Decision::Disabled);
    }

    #[test]
    fn by_resource_type() {
        let s = settings(false);
        let w = |n: &str, pt, pm| a(Topic, n, pt, "User:alice", "*", Write, pm);
        let any =
            |acls: Vec<AclBinding>, who| decide_any(&s, &AclIndex::build(&acls), who, Write, Topic);
        assert!(!any(vec![], ALICE), "no ACLs, default deny");
        assert!(decide_any(
            &settings(true),
            &AclIndex::default(),
            ALICE,
            Write,
            Topic
        ));
        assert!(any(vec![w("t", L, A)], ALICE));
        assert!(!any(vec![w("t", L, A)], BOB));
        assert!(!any(vec![w("t", L, A), w("t", L, D)], ALICE));
        assert!(any(vec![w("t", L, A), w("u", L, D)], ALICE));
        assert!(!any(vec![w("t", L, A), w("*", L, D)], ALICE));
        assert!(!any(vec![w("orders-eu", P, A), w("orders-", P, D)], ALICE));
        assert!(any(vec![w("orders-", P, A), w("orders-eu", P, D)], ALICE));
        assert!(any(vec![a(Topic, "t", L, "User:*", "*", All, A)], BOB));
        assert!(!any(
            vec![a(Topic, "t", L, "User:alice", "*", Read, A)],
            ALICE
        ));
    }
}
