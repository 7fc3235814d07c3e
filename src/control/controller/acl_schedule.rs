//! When ACL syncs run and what their answers do (`control::acl_sync` has the selection rule).
//!
//! Every `mirror.acls.interval.ms` per mirror the tick starts a DescribeAcls of the mirror's
//! source on a source worker; a later tick applies the answer: the selected ACLs are written
//! to `__mirror_state` (one record per ACL, type 110: new ones put, ones the source no longer
//! has tombstoned), then put in force as the mirror's synced set in the authorizer. Synced
//! ACLs are kept apart from those created on kmirror (`__kmirror_acls`): a round replaces only
//! its mirror's synced set, so an operator's own ACLs are never removed by a sync, and
//! DeleteAcls on kmirror leaves synced ones to their source.
//!
//! - A source without an authorizer (SECURITY_DISABLED) or an error keeps the synced set in
//!   force and says so in `describe`; mirroring is not affected.
//! - Rounds run while the mirror has a partition that is not failed over (STOPPING/STOPPED).
//!   Once every partition is, the source is gone or no longer authoritative: no more rounds,
//!   and the last synced set stays in force (it survives restarts in `__mirror_state`). An
//!   answer that comes back after that is dropped.
//! - `delete` of a mirror hands its synced ACLs to the local set, so they stay in force.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::*;
use crate::control::acl_sync::SourceAclReader;
use crate::control::records::SyncedAclValue;
use crate::control::source_worker::JobKind;
use crate::limits::ACL_SYNC_MIRROR_MAX;
use crate::serve::authz::acl::AclBinding;
use crate::serve::authz::sync::{select, SourceAcls};
use crate::serve::authz::Authz;

/// What the controller needs to sync ACLs: the authorizer they go into, and the source side.
pub struct AclSyncPlane {
    pub authz: Arc<Authz>,
    /// Read on the source workers.
    pub source: Arc<dyn SourceAclReader + Send + Sync>,
}

/// One mirror's synced ACLs (as stored, with when each first came) and its last round.
#[derive(Debug, Clone, Default)]
pub(super) struct MirrorAcls {
    pub(super) acls: BTreeMap<AclBinding, i64>,
    next_due_ms: i64,
    /// When a round last answered with the source's ACLs (or that it has no authorizer).
    last_sync_ms: Option<i64>,
    message: Option<String>,
    error: Option<String>,
    /// How many of `acls` the authorizer took (the total is bounded by `ACLS_MAX`).
    in_force: usize,
}

/// `describe`'s view of a mirror's ACL sync.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AclSyncStatus {
    /// `syncing`, `stopped` (failed over: the synced ACLs stay in force), `off`
    /// (`mirror.acls.include=none`) or `waiting` (not started yet).
    pub state: String,
    /// Synced ACLs of this mirror in force.
    pub synced: usize,
    /// Wall-clock ms of the last round the source answered.
    pub last_sync_ms: Option<i64>,
    /// What the last answered round said (counts, or that the source has no authorizer).
    pub message: Option<String>,
    /// Why the last round failed, when it did (the previous ACLs stay in force).
    pub error: Option<String>,
}

/// A periodic DescribeAcls answer.
pub(super) struct AclsAnswer {
    mirror: MirrorName,
    at_ms: i64,
    read: Result<SourceAcls, String>,
}

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// Starts the ACL sync of every mirror and puts the synced ACLs `__mirror_state` holds in
    /// force at once (before the Kafka listener serves anyone after a restart).
    pub fn attach_acl_sync(&mut self, plane: AclSyncPlane) {
        for (name, m) in &mut self.synced_acls {
            m.in_force = plane
                .authz
                .set_synced(name.as_str(), m.acls.keys().cloned().collect());
        }
        self.acl_sync = Some(plane);
    }

    /// Whether `name`'s source still governs its ACLs: sync is on and some partition is not
    /// failed over.
    fn acl_sync_active(&self, name: &MirrorName) -> bool {
        let e = &self.mirrors[name];
        e.record.definition.acls.enabled()
            && e.partitions.values().any(|p| {
                !matches!(
                    p.machine.state(),
                    Some(StateName::Stopped | StateName::Stopping)
                )
            })
    }

    /// Starts the DescribeAcls of every mirror whose round is due, on the workers (a read of
    /// the same mirror still in flight skips the round).
    pub(super) fn start_acl_syncs(&mut self, now_ms: i64) {
        let Some(plane) = self.acl_sync.as_ref() else {
            return;
        };
        let source = Arc::clone(&plane.source);
        let names: Vec<MirrorName> = self.mirrors.keys().cloned().collect();
        for name in names {
            if !self.acl_sync_active(&name) {
                continue;
            }
            let def = self.mirrors[&name].record.definition.clone();
            let m = self.synced_acls.entry(name.clone()).or_default();
            if now_ms < m.next_due_ms {
                continue;
            }
            m.next_due_ms =
                now_ms.saturating_add(i64::try_from(def.acls.interval_ms).unwrap_or(i64::MAX));
            let source = Arc::clone(&source);
            let mirror = name.clone();
            self.run_periodic(JobKey::new(name.as_str(), JobKind::Acls), move |by| {
                let read = source.read(&def, by.at);
                SourceResult::Acls(AclsAnswer {
                    mirror,
                    at_ms: super::now_ms(),
                    read,
                })
            });
        }
    }

    /// A DescribeAcls answer: the selection persisted, then put in force.
    pub(super) fn apply_acl_sync(&mut self, a: AclsAnswer) -> Result<(), ControlError> {
        let name = a.mirror;
        if !self.mirrors.contains_key(&name) || !self.acl_sync_active(&name) {
            tracing::debug!(mirror = %name, "ACL sync answer dropped: the mirror is deleted or failed over");
            return Ok(());
        }
        let Some(plane) = self.acl_sync.as_ref() else {
            return Ok(());
        };
        let authz = Arc::clone(&plane.authz);
        let (acls, skipped) = match a.read {
            Ok(SourceAcls::Acls { acls, skipped }) => (acls, skipped),
            Ok(SourceAcls::NoAuthorizer) => {
                let m = self.synced_acls.entry(name.clone()).or_default();
                let msg = SourceAcls::NoAuthorizer.describe();
                if m.message.as_ref() != Some(&msg) {
                    tracing::warn!(mirror = %name, "ACL sync: {msg}; the mirror keeps mirroring");
                }
                m.message = Some(msg);
                m.error = None;
                m.last_sync_ms = Some(a.at_ms);
                return Ok(());
            }
            Ok(other) => {
                self.acl_sync_failed(&name, other.describe());
                return Ok(());
            }
            Err(reason) => {
                self.acl_sync_failed(&name, format!("DescribeAcls on the source: {reason}"));
                return Ok(());
            }
        };
        let e = &self.mirrors[&name];
        let topics: BTreeSet<String> = e.partitions.keys().map(|tp| tp.topic.clone()).collect();
        let kinds = e.record.definition.acls.include;
        let mut selected: BTreeSet<AclBinding> = BTreeSet::new();
        let mut over = 0usize;
        for b in select(&acls, &topics, kinds) {
            if selected.len() < ACL_SYNC_MIRROR_MAX {
                selected.insert(b.clone());
            } else {
                over += 1;
            }
        }
        let m = self.synced_acls.entry(name.clone()).or_default();
        let added: Vec<(StateKey, StateValue)> = selected
            .iter()
            .filter(|b| !m.acls.contains_key(*b))
            .map(|b| {
                (
                    StateKey::SyncedAcl(name.clone(), b.clone()),
                    StateValue::SyncedAcl(SyncedAclValue {
                        synced_at_ms: a.at_ms,
                    }),
                )
            })
            .collect();
        let removed: Vec<AclBinding> = m
            .acls
            .keys()
            .filter(|b| !selected.contains(*b))
            .cloned()
            .collect();
        // Durable before in force: a restart puts exactly what is stored back.
        self.store.put_many(&added)?;
        for b in &removed {
            self.store
                .delete(&StateKey::SyncedAcl(name.clone(), b.clone()))?;
        }
        let m = self.synced_acls.entry(name.clone()).or_default();
        for (k, _) in &added {
            if let StateKey::SyncedAcl(_, b) = k {
                m.acls.insert(b.clone(), a.at_ms);
            }
        }
        for b in &removed {
            m.acls.remove(b);
        }
        let n = selected.len();
        m.in_force = authz.set_synced(name.as_str(), selected);
        let mut msg = format!("{n} ACLs synced");
        if skipped > 0 {
            msg.push_str(&format!(", {skipped} not valid here skipped"));
        }
        if over > 0 {
            msg.push_str(&format!(
                ", {over} more left out (at most {ACL_SYNC_MIRROR_MAX} per mirror)"
            ));
        }
        if m.in_force < n {
            msg.push_str(&format!(
                ", {} not in force (kmirror holds at most {} ACLs)",
                n - m.in_force,
                crate::limits::ACLS_MAX
            ));
        }
        if !added.is_empty() || !removed.is_empty() {
            tracing::info!(mirror = %name, added = added.len(), removed = removed.len(), "ACL sync: {msg}");
        }
        m.message = Some(msg);
        m.error = None;
        m.last_sync_ms = Some(a.at_ms);
        Ok(())
    }

    /// A round that did not get the source's ACLs: the synced set stays, the error is shown.
    fn acl_sync_failed(&mut self, name: &MirrorName, why: String) {
        let m = self.synced_acls.entry(name.clone()).or_default();
        if m.error.as_ref() != Some(&why) {
            tracing::warn!(mirror = %name, "ACL sync: {why}; the synced ACLs in force stay");
        }
        m.error = Some(why);
    }

    /// `describe`'s ACL sync status of `name` (none when kmirror has no authorizer to sync
    /// into).
    pub(super) fn acl_sync_status(&self, name: &MirrorName) -> Option<AclSyncStatus> {
        self.acl_sync.as_ref()?;
        let e = &self.mirrors[name];
        let def = &e.record.definition;
        let m = self.synced_acls.get(name).cloned().unwrap_or_default();
        let state = if !def.acls.enabled() {
            "off".to_owned()
        } else if e.partitions.is_empty() {
            "waiting".to_owned()
        } else if self.acl_sync_active(name) {
            "syncing".to_owned()
        } else {
            "stopped".to_owned()
        };
        Some(AclSyncStatus {
            state,
            synced: m.in_force,
            last_sync_ms: m.last_sync_ms,
            message: m.message,
            error: m.error,
        })
    }

    /// `delete`: the mirror's synced ACLs become local ones (they stay in force), then their
    /// records are tombstoned.
    pub(super) fn forget_synced_acls(&mut self, name: &MirrorName) -> Result<(), ControlError> {
        let Some(m) = self.synced_acls.remove(name) else {
            return Ok(());
        };
        if let Some(plane) = &self.acl_sync {
            match plane.authz.adopt_synced(name.as_str()) {
                Ok(n) => {
                    tracing::info!(mirror = %name, "delete: {n} synced ACLs kept as kmirror's own")
                }
                Err(e) => {
                    self.synced_acls.insert(name.clone(), m);
                    return Err(ControlError::Acls(format!(
                        "keeping the synced ACLs of {name}: {e}"
                    )));
                }
            }
        }
        for b in m.acls.into_keys() {
            self.store.delete(&StateKey::SyncedAcl(name.clone(), b))?;
        }
        Ok(())
    }
}
