//! `<data_dir>/kmirror-acls/__kmirror_acls-0`: the ACLs created on kmirror (CreateAcls), a compacted keyed
//! log in Kafka's on-disk format (the same `KeyedLog` as `__transaction_state`). Each live key
//! is one ACL in its stored form (`AclBinding::encode`); the value is a one-byte marker (a
//! tombstone, an empty value, deletes). Fsynced per change: an ACL is in force, and survives a
//! crash, once CreateAcls answers. kmirror's own schema: nothing but kmirror reads it. ACLs
//! synced from a source are not here; they live in `__mirror_state` with their mirror.

use std::path::Path;

use crate::log::config::FlushPolicy;
use crate::log::keyed_log::{KeyedLog, KeyedLogError};
use crate::serve::authz::acl::AclBinding;

pub const TOPIC: &str = "__kmirror_acls";
/// The directory under the data dir that holds the log. Not a partition directory name, so
/// the data dir's partition scan skips it and this store is the log's only opener, whenever
/// it is opened (no hand-off from the log dir needed).
pub const DIR: &str = "kmirror-acls";

/// The value of a live record (a non-empty value; only its presence matters).
const PRESENT: &[u8] = &[1];

#[derive(Debug, thiserror::Error)]
pub enum AclStoreError {
    #[error(transparent)]
    Log(#[from] KeyedLogError),
    #[error("creating {path}: {source}")]
    Dir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("__kmirror_acls record {index}: {why}")]
    Decode { index: usize, why: String },
}

/// Where local ACLs are kept (a trait so the rules are testable without disk).
pub trait AclStore: Send {
    fn load(&self) -> Result<Vec<AclBinding>, AclStoreError>;
    /// Durable before it returns.
    fn put(&mut self, acl: &AclBinding) -> Result<(), AclStoreError>;
    /// Durable before it returns.
    fn delete(&mut self, acl: &AclBinding) -> Result<(), AclStoreError>;
    fn close(self: Box<Self>) -> Result<(), AclStoreError>;
}

#[derive(Debug)]
pub struct AclLog {
    log: KeyedLog,
}

impl AclLog {
    pub fn open(data_dir: &Path) -> Result<AclLog, AclStoreError> {
        let dir = data_dir.join(DIR);
        std::fs::create_dir_all(&dir).map_err(|source| AclStoreError::Dir {
            path: dir.clone(),
            source,
        })?;
        Ok(AclLog {
            log: KeyedLog::open(&dir, TOPIC, FlushPolicy::EveryAppend)?,
        })
    }
}

impl AclStore for AclLog {
    fn load(&self) -> Result<Vec<AclBinding>, AclStoreError> {
        self.log
            .live()
            .keys()
            .enumerate()
            .map(|(index, k)| {
                AclBinding::decode(k).map_err(|why| AclStoreError::Decode { index, why })
            })
            .collect()
    }

    fn put(&mut self, acl: &AclBinding) -> Result<(), AclStoreError> {
        Ok(self.log.put(acl.encode(), PRESENT.to_vec())?)
    }

    fn delete(&mut self, acl: &AclBinding) -> Result<(), AclStoreError> {
        Ok(self.log.delete(&acl.encode())?)
    }

    fn close(self: Box<Self>) -> Result<(), AclStoreError> {
        Ok(self.log.close()?)
    }
}

/// A store in memory (tests, and a disabled authorizer with nothing to keep).
#[derive(Debug, Default)]
pub struct MemoryStore {
    pub acls: std::collections::BTreeSet<AclBinding>,
}

impl AclStore for MemoryStore {
    fn load(&self) -> Result<Vec<AclBinding>, AclStoreError> {
        Ok(self.acls.iter().cloned().collect())
    }

    fn put(&mut self, acl: &AclBinding) -> Result<(), AclStoreError> {
        self.acls.insert(acl.clone());
        Ok(())
    }

    fn delete(&mut self, acl: &AclBinding) -> Result<(), AclStoreError> {
        self.acls.remove(acl);
        Ok(())
    }

    fn close(self: Box<Self>) -> Result<(), AclStoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::authz::acl::{acl, Operation, PatternType, Permission, ResourceType};

    #[test]
    fn acls_survive_reopen_and_deletes_stick() {
        let dir = tempfile::tempdir().unwrap();
        let a = acl(
            ResourceType::Topic,
            "t",
            PatternType::Literal,
            "User:a",
            "*",
            Operation::Read,
            Permission::Allow,
        );
        let mut b = a.clone();
        b.entry.permission = Permission::Deny;
        let mut log = AclLog::open(dir.path()).unwrap();
        log.put(&a).unwrap();
        log.put(&b).unwrap();
        log.delete(&a).unwrap();
        Box::new(log).close().unwrap();
        let log = AclLog::open(dir.path()).unwrap();
        assert_eq!(log.load().unwrap(), vec![b]);
    }
}
