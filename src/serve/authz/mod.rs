//! Authorization of Kafka requests with ACLs, as Kafka's `StandardAuthorizer` does it.
//!
//! | module | job |
//! |---|---|
//! | `acl` | ACL bindings, filters, wire codes, stored form; no I/O |
//! | `authorizer` | the decision (super users, patterns, deny wins, implied operations, default), sans-IO |
//! | `store` | `__kmirror_acls-0`, the durable set of ACLs created on kmirror |
//! | `apis` | CreateAcls, DescribeAcls, DeleteAcls |
//! | `sync` | what a source's DescribeAcls answer means and which ACLs a mirror takes |
//! | `group_checks` | what the consumer-group APIs need and how they refuse, sans-IO |
//!
//! `Authz` (here) is the one instance a process has: the ACLs created on kmirror (`local`,
//! persisted in the store) and those synced from each mirror's source (`synced`, persisted by
//! the control plane in `__mirror_state`), merged into one immutable index that request
//! handlers read without a lock (`ArcSwap`); every change builds a new index.

pub mod acl;
pub mod apis;
pub mod authorizer;
pub mod group_checks;
pub mod store;
pub mod sync;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Deserialize;

use crate::serve::authz::acl::{AclBinding, AclFilter, Operation, ResourceType, CLUSTER_NAME};
use crate::serve::authz::authorizer::{decide, decide_any, AclIndex, AuthzSettings, Requester};
use crate::serve::authz::store::{AclLog, AclStore, AclStoreError, MemoryStore};
use crate::serve::session::Session;

/// Kafka's authorization error codes.
pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;

/// `[kafka.authorizer]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorizerConfig {
    /// `false`: no request is checked (as a Kafka broker without `authorizer.class.name`);
    /// the ACL APIs then answer SECURITY_DISABLED.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Kafka's `super.users`, as principals (`User:admin`).
    #[serde(default)]
    pub super_users: Vec<String>,
    /// Kafka's `allow.everyone.if.no.acl.found`. Default: `true` (see `settings_for`: also with
    /// SSL/SASL listeners for now), so that a deployment without ACLs keeps working as before
    /// ACLs existed (resources without ACLs stay open).
    #[serde(default)]
    pub allow_everyone_if_no_acl_found: Option<bool>,
}

fn yes() -> bool {
    true
}

impl Default for AuthorizerConfig {
    fn default() -> AuthorizerConfig {
        AuthorizerConfig {
            enabled: true,
            super_users: Vec::new(),
            allow_everyone_if_no_acl_found: None,
        }
    }
}

impl AuthorizerConfig {
    /// The settings in force, given whether any listener authenticates its clients.
    pub fn settings(&self, authenticated_listener: bool) -> AuthzSettings {
        AuthzSettings {
            enabled: self.enabled,
            super_users: self.super_users.iter().cloned().collect(),
            allow_if_no_acl: self
                .allow_everyone_if_no_acl_found
                .unwrap_or(!authenticated_listener),
        }
    }

    /// Checks each super user is `Type:name`.
    pub fn validate(&self) -> Result<(), String> {
        for u in &self.super_users {
            match u.split_once(':') {
                Some((k, n)) if !k.is_empty() && !n.is_empty() => {}
                _ => return Err(format!("{u:?} is not a principal of the form User:name")),
            }
        }
        Ok(())
    }
}

/// The authorizer settings of a `kmirror serve` config. `allow.everyone.if.no.acl.found`
/// defaults to true for now, also with SSL/SASL listeners: turning it to false there (the
/// issue's and Kafka's rule) needs the TLS and SASL tests to create their ACLs first, which is
/// not done yet. `[kafka.authorizer] allow_everyone_if_no_acl_found = false` sets it.
pub fn settings_for(config: &crate::config::ServeConfig) -> AuthzSettings {
    match &config.kafka {
        Some(k) => k.authorizer.settings(false),
        None => AuthzSettings::allow_all(),
    }
}

/// Opens the authorizer of a `kmirror serve` config: with a `[kafka]` section whose
/// authorizer is enabled, the ACLs under the data dir; otherwise one that allows everything.
pub fn open_configured(
    config: &crate::config::ServeConfig,
    data_dir: &Path,
) -> Result<Arc<Authz>, AclStoreError> {
    let settings = settings_for(config);
    if settings.enabled {
        Authz::open(settings, data_dir)
    } else {
        Ok(Authz::allow_all())
    }
}

/// Why an ACL change was refused.
#[derive(Debug, thiserror::Error)]
pub enum AclChangeError {
    #[error("the authorizer is disabled ([kafka.authorizer] enabled = false)")]
    Disabled,
    #[error("kmirror holds {max} ACLs, the most it keeps")]
    Full { max: usize },
    #[error("storing the ACL: {0}")]
    Store(#[from] AclStoreError),
}

struct Sets {
    local: BTreeSet<AclBinding>,
    /// Per mirror, the ACLs last read from its source.
    synced: BTreeMap<String, BTreeSet<AclBinding>>,
    store: Option<Box<dyn AclStore>>,
}

impl Sets {
    fn count(&self) -> usize {
        self.local.len() + self.synced.values().map(BTreeSet::len).sum::<usize>()
    }
}

/// The process's authorizer: settings, ACL sets, and the index requests are checked against.
pub struct Authz {
    settings: AuthzSettings,
    sets: Mutex<Sets>,
    index: ArcSwap<AclIndex>,
}

impl std::fmt::Debug for Authz {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authz")
            .field("settings", &self.settings)
            .field("acls", &self.index.load().len())
            .finish()
    }
}

impl Authz {
    /// Allows everything and keeps nothing (no authorizer configured; unit tests).
    pub fn allow_all() -> Arc<Authz> {
        Authz::with_store(AuthzSettings::allow_all(), Box::<MemoryStore>::default())
            .expect("a memory store loads")
    }

    /// Opens `__kmirror_acls-0` under `data_dir` and enforces `settings` with its ACLs.
    pub fn open(settings: AuthzSettings, data_dir: &Path) -> Result<Arc<Authz>, AclStoreError> {
        Authz::with_store(settings, Box::new(AclLog::open(data_dir)?))
    }

    pub fn with_store(
        settings: AuthzSettings,
        store: Box<dyn AclStore>,
    ) -> Result<Arc<Authz>, AclStoreError> {
        let local: BTreeSet<AclBinding> = store.load()?.into_iter().collect();
        let authz = Authz {
            settings,
            sets: Mutex::new(Sets {
                local,
                synced: BTreeMap::new(),
                store: Some(store),
            }),
            index: ArcSwap::from_pointee(AclIndex::default()),
        };
        authz.rebuild(&authz.sets.lock().expect("acl sets"));
        Ok(Arc::new(authz))
    }

    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    fn rebuild(&self, sets: &Sets) {
        let all = sets.local.iter().chain(sets.synced.values().flatten());
        self.index.store(Arc::new(AclIndex::build(all)));
    }

    /// May the client of `session` do `op` on resource `name` of type `rtype`?
    pub fn authorize(
        &self,
        session: &Session,
        op: Operation,
        rtype: ResourceType,
        name: &str,
    ) -> bool {
        self.with_requester(session, |who| {
            let d = decide(&self.settings, &self.index.load(), who, op, rtype, name);
            if !d.allowed() {
                tracing::debug!(principal = who.principal, host = who.host, op = op.name(), resource = rtype.name(), name, decision = ?d, "denied");
            }
            d.allowed()
        })
    }

    /// Runs `f` with the session's principal and host as the decision takes them; `true`
    /// without running it when the authorizer is disabled.
    fn with_requester(&self, session: &Session, f: impl FnOnce(Requester<'_>) -> bool) -> bool {
        if !self.settings.enabled {
            return true;
        }
        let principal = session.principal.to_string();
        let host = session.host();
        f(Requester {
            principal: &principal,
            host: &host,
        })
    }

    /// `authorize` on the cluster resource.
    pub fn authorize_cluster(&self, session: &Session, op: Operation) -> bool {
        self.authorize(session, op, ResourceType::Cluster, CLUSTER_NAME)
    }

    /// May the client do `op` on at least one resource of type `rtype`?
    pub fn authorize_any(&self, session: &Session, op: Operation, rtype: ResourceType) -> bool {
        self.with_requester(session, |who| {
            decide_any(&self.settings, &self.index.load(), who, op, rtype)
        })
    }

    /// Adds `acl` to the local set, durably; already present is success (as in Kafka).
    pub fn create(&self, acl: &AclBinding) -> Result<(), AclChangeError> {
        if !self.settings.enabled {
            return Err(AclChangeError::Disabled);
        }
        let mut sets = self.sets.lock().expect("acl sets");
        if sets.local.contains(acl) {
            return Ok(());
        }
        let max = crate::limits::ACLS_MAX;
        if sets.count() >= max {
            return Err(AclChangeError::Full { max });
        }
        if let Some(s) = sets.store.as_mut() {
            s.put(acl)?;
        }
        sets.local.insert(acl.clone());
        self.rebuild(&sets);
        Ok(())
    }

    /// Removes every local ACL `filter` matches, durably. Returns the removed ones and the
    /// synced ones it matched (left in place: their source owns them, the next sync would
    /// bring them back), with the mirror each came from.
    #[allow(clippy::type_complexity)]
    pub fn delete(
        &self,
        filter: &AclFilter,
    ) -> Result<(Vec<AclBinding>, Vec<(String, AclBinding)>), AclChangeError> {
        if !self.settings.enabled {
            return Err(AclChangeError::Disabled);
        }
        let mut sets = self.sets.lock().expect("acl sets");
        let doomed: Vec<AclBinding> = sets
            .local
            .iter()
            .filter(|b| filter.matches(b))
            .cloned()
            .collect();
        let mut removed = Vec::with_capacity(doomed.len());
        let mut failed = None;
        for b in doomed {
            if let Some(s) = sets.store.as_mut() {
                if let Err(e) = s.delete(&b) {
                    failed = Some(e);
                    break;
                }
            }
            sets.local.remove(&b);
            removed.push(b);
        }
        let kept = sets
            .synced
            .iter()
            .flat_map(|(m, acls)| acls.iter().map(move |b| (m, b)))
            .filter(|(_, b)| filter.matches(b))
            .map(|(m, b)| (m.clone(), b.clone()))
            .collect();
        self.rebuild(&sets);
        match failed {
            Some(e) => Err(e.into()),
            None => Ok((removed, kept)),
        }
    }

    /// Every ACL in force (local and synced, each once) that `filter` matches.
    pub fn describe(&self, filter: &AclFilter) -> Vec<AclBinding> {
        let sets = self.sets.lock().expect("acl sets");
        let all: BTreeSet<&AclBinding> = sets
            .local
            .iter()
            .chain(sets.synced.values().flatten())
            .filter(|b| filter.matches(b))
            .collect();
        all.into_iter().cloned().collect()
    }

    /// Puts `acls` in force as mirror `mirror`'s synced set, replacing the one before (an
    /// empty set removes the mirror's). Returns how many were kept: the total is bounded by
    /// `ACLS_MAX`.
    pub fn set_synced(&self, mirror: &str, acls: BTreeSet<AclBinding>) -> usize {
        let mut sets = self.sets.lock().expect("acl sets");
        sets.synced.remove(mirror);
        let room = crate::limits::ACLS_MAX.saturating_sub(sets.count());
        let kept: BTreeSet<AclBinding> = acls.into_iter().take(room).collect();
        let n = kept.len();
        if n > 0 {
            sets.synced.insert(mirror.to_string(), kept);
        }
        self.rebuild(&sets);
        n
    }

    /// Makes `mirror`'s synced ACLs local ones (durably, in `__kmirror_acls`), for a mirror
    /// that is deleted: they stay in force, now managed with kafka-acls.sh. Returns how many
    /// were moved; on a store error the ones not yet stored stay synced.
    pub fn adopt_synced(&self, mirror: &str) -> Result<usize, AclChangeError> {
        let mut sets = self.sets.lock().expect("acl sets");
        let Some(synced) = sets.synced.remove(mirror) else {
            return Ok(0);
        };
        let mut moved = 0;
        let mut left = BTreeSet::new();
        let mut failed = None;
        for b in synced {
            if failed.is_some() {
                left.insert(b);
                continue;
            }
            if !sets.local.contains(&b) {
                if let Some(s) = sets.store.as_mut() {
                    if let Err(e) = s.put(&b) {
                        failed = Some(e);
                        left.insert(b);
                        continue;
                    }
                }
                sets.local.insert(b);
            }
            moved += 1;
        }
        if !left.is_empty() {
            sets.synced.insert(mirror.to_string(), left);
        }
        self.rebuild(&sets);
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(moved),
        }
    }

    /// The synced set of `mirror`.
    pub fn synced(&self, mirror: &str) -> BTreeSet<AclBinding> {
        let sets = self.sets.lock().expect("acl sets");
        sets.synced.get(mirror).cloned().unwrap_or_default()
    }

    /// Closes the store; later changes fail.
    pub fn close(&self) -> Result<(), AclStoreError> {
        let store = self.sets.lock().expect("acl sets").store.take();
        match store {
            Some(s) => s.close(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::authz::acl::{acl, PatternType, Permission};
    use crate::serve::session::KafkaPrincipal;

    fn enabled() -> AuthzSettings {
        AuthorizerConfig {
            super_users: vec!["User:admin".into()],
            ..AuthorizerConfig::default()
        }
        .settings(true)
    }

    fn session(user: &str) -> Session {
        let mut s = Session::plaintext(Some("10.1.1.1:5000".parse().unwrap()));
        s.principal = KafkaPrincipal::user(user);
        s
    }

    fn read(name: &str, user: &str) -> AclBinding {
        acl(
            ResourceType::Topic,
            name,
            PatternType::Literal,
            &format!("User:{user}"),
            "*",
            Operation::Read,
            Permission::Allow,
        )
    }

    #[test]
    fn default_follows_the_listeners() {
        let c = AuthorizerConfig::default();
        assert!(
            c.settings(false).allow_if_no_acl,
            "plaintext-only keeps working"
        );
        assert!(
            !c.settings(true).allow_if_no_acl,
            "authenticated listener: deny by default"
        );
        let c = AuthorizerConfig {
            allow_everyone_if_no_acl_found: Some(true),
            ..c
        };
        assert!(c.settings(true).allow_if_no_acl);
        assert!(AuthorizerConfig {
            super_users: vec!["admin".into()],
            ..AuthorizerConfig::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn local_and_synced_sets_merge_and_delete_only_local() {
        let a = Authz::with_store(enabled(), Box::<MemoryStore>::default()).unwrap();
        let s = session("alice");
        assert!(!a.authorize(&s, Operation::Read, ResourceType::Topic, "t"));
        assert!(a.authorize(&session("admin"), Operation::Read, ResourceType::Topic, "t"));
        a.create(&read("t", "alice")).unwrap();
        a.create(&read("t", "alice")).unwrap();
        assert!(a.authorize(&s, Operation::Read, ResourceType::Topic, "t"));
        assert!(a.authorize(&s, Operation::Describe, ResourceType::Topic, "t"));
        assert!(!a.authorize(&s, Operation::Write, ResourceType::Topic, "t"));
        assert_eq!(
            a.set_synced("m1", [read("u", "alice"), read("t", "alice")].into()),
            2
        );
        assert!(a.authorize(&s, Operation::Read, ResourceType::Topic, "u"));
        assert_eq!(
            a.describe(&AclFilter::any()).len(),
            2,
            "the same ACL counts once"
        );
        let (removed, kept) = a.delete(&AclFilter::any()).unwrap();
        assert_eq!(removed, vec![read("t", "alice")]);
        assert_eq!(kept.len(), 2);
        assert!(
            a.authorize(&s, Operation::Read, ResourceType::Topic, "t"),
            "synced still"
        );
        a.set_synced("m1", BTreeSet::new());
        assert!(!a.authorize(&s, Operation::Read, ResourceType::Topic, "u"));
        assert!(a.describe(&AclFilter::any()).is_empty());
        // A deleted mirror's synced ACLs become local ones and stay in force.
        a.set_synced("m1", [read("u", "alice")].into());
        assert_eq!(a.adopt_synced("m1").unwrap(), 1);
        assert!(a.synced("m1").is_empty());
        assert!(a.authorize(&s, Operation::Read, ResourceType::Topic, "u"));
        let (removed, kept) = a.delete(&AclFilter::any()).unwrap();
        assert_eq!((removed.len(), kept.len()), (1, 0), "now local: deletable");
    }

    #[test]
    fn disabled_allows_and_refuses_changes() {
        let a = Authz::allow_all();
        assert!(a.authorize(
            &session("x"),
            Operation::Alter,
            ResourceType::Cluster,
            CLUSTER_NAME
        ));
        assert!(matches!(
            a.create(&read("t", "x")),
            Err(AclChangeError::Disabled)
        ));
    }
}
