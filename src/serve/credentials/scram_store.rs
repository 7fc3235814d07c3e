//! SCRAM credentials as Kafka keeps them (`UserScramCredentialRecord`): per user and mechanism
//! the salt, the iteration count, StoredKey = H(HMAC(SaltedPassword, "Client Key")) and
//! ServerKey = HMAC(SaltedPassword, "Server Key"); never the password. Clients (Kafka's Admin,
//! hence `kafka-configs.sh`) send the salted password, computed on their side.
//!
//! Durable as one JSON file, rewritten whole and atomically (0600, fsync) before a change is
//! acknowledged; a change that cannot be written is not applied.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::fetch::sasl::{hash, hmac, salted_password, Mechanism};
use crate::serve::credentials::secret_file::{
    read_secret_file, write_secret_file, SecretFileError,
};

/// One user's credential for one SCRAM mechanism. `Debug` shows no key.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: u32,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("iterations", &self.iterations)
            .field("keys", &"<redacted>")
            .finish()
    }
}

impl ScramCredential {
    /// What Kafka's controller derives from an upsertion's salted password.
    pub fn from_salted_password(
        mechanism: Mechanism,
        salt: Vec<u8>,
        salted: &[u8],
        iterations: u32,
    ) -> ScramCredential {
        let client_key = hmac(mechanism, salted, b"Client Key");
        ScramCredential {
            salt,
            stored_key: hash(mechanism, &client_key),
            server_key: hmac(mechanism, salted, b"Server Key"),
            iterations,
        }
    }

    /// From a password (tests, and operators' tooling).
    pub fn from_password(
        mechanism: Mechanism,
        password: &str,
        salt: Vec<u8>,
        iterations: u32,
    ) -> ScramCredential {
        let salted = salted_password(mechanism, password, &salt, iterations);
        ScramCredential::from_salted_password(mechanism, salt, &salted, iterations)
    }
}

/// Kafka's wire code of a SCRAM mechanism (`ScramMechanism.type()`), `None` for UNKNOWN.
pub fn mechanism_of_type(t: i8) -> Option<Mechanism> {
    match t {
        1 => Some(Mechanism::ScramSha256),
        2 => Some(Mechanism::ScramSha512),
        _ => None,
    }
}

pub fn type_of_mechanism(m: Mechanism) -> i8 {
    match m {
        Mechanism::ScramSha256 => 1,
        Mechanism::ScramSha512 => 2,
        Mechanism::Plain => 0,
    }
}

fn mechanism_named(name: &str) -> Option<Mechanism> {
    match name {
        "SCRAM-SHA-256" => Some(Mechanism::ScramSha256),
        "SCRAM-SHA-512" => Some(Mechanism::ScramSha512),
        _ => None,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("SCRAM credential store: {0}")]
    File(#[from] SecretFileError),
    #[error("SCRAM credential store {path}: {why}")]
    Corrupt { path: String, why: String },
}

#[derive(Serialize, Deserialize)]
struct FileRecord {
    user: String,
    mechanism: String,
    iterations: u32,
    salt: String,
    stored_key: String,
    server_key: String,
}

#[derive(Serialize, Deserialize)]
struct FileBody {
    version: u32,
    credentials: Vec<FileRecord>,
}

const FILE_VERSION: u32 = 1;

type Key = (String, i8);

/// The store: every credential in memory, the file rewritten on each change.
#[derive(Debug)]
pub struct ScramStore {
    path: PathBuf,
    creds: RwLock<BTreeMap<Key, ScramCredential>>,
}

impl ScramStore {
    /// Opens `path` (an absent file is an empty store).
    pub fn open(path: &Path) -> Result<ScramStore, StoreError> {
        let creds = match read_secret_file(path)? {
            None => BTreeMap::new(),
            Some(bytes) => decode(path, &bytes)?,
        };
        Ok(ScramStore {
            path: path.to_owned(),
            creds: RwLock::new(creds),
        })
    }

    pub fn get(&self, user: &str, mechanism: Mechanism) -> Option<ScramCredential> {
        self.read()
            .get(&(user.to_owned(), type_of_mechanism(mechanism)))
            .cloned()
    }

    /// Users with their (mechanism, iterations), all users when `users` is `None`.
    pub fn list(&self) -> BTreeMap<String, Vec<(Mechanism, u32)>> {
        let mut out: BTreeMap<String, Vec<(Mechanism, u32)>> = BTreeMap::new();
        for ((user, t), c) in self.read().iter() {
            let m = mechanism_of_type(*t).expect("only SCRAM mechanisms are stored");
            out.entry(user.clone()).or_default().push((m, c.iterations));
        }
        out
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies deletions and upsertions together: written to the file, then made visible.
    /// On a write error nothing changes.
    pub fn apply(
        &self,
        deletions: &[(String, Mechanism)],
        upsertions: Vec<(String, Mechanism, ScramCredential)>,
    ) -> Result<(), StoreError> {
        let mut creds = self.creds.write().unwrap_or_else(|e| e.into_inner());
        let mut next = creds.clone();
        for (u, m) in deletions {
            next.remove(&(u.clone(), type_of_mechanism(*m)));
        }
        for (u, m, c) in upsertions {
            next.insert((u, type_of_mechanism(m)), c);
        }
        write_secret_file(&self.path, &encode(&next))?;
        *creds = next;
        Ok(())
    }

    /// Sets `user`'s `mechanism` credential from a password, with a fresh random salt (what
    /// Kafka's tools compute client-side; for tests and local tooling).
    pub fn set_password(
        &self,
        user: &str,
        mechanism: Mechanism,
        password: &str,
        iterations: u32,
    ) -> Result<(), StoreError> {
        let mut salt = vec![0u8; 32];
        rand::Rng::fill(&mut rand::thread_rng(), &mut salt[..]);
        let c = ScramCredential::from_password(mechanism, password, salt, iterations);
        self.apply(&[], vec![(user.to_owned(), mechanism, c)])
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Key, ScramCredential>> {
        self.creds.read().unwrap_or_else(|e| e.into_inner())
    }
}

fn encode(creds: &BTreeMap<Key, ScramCredential>) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = FileBody {
        version: FILE_VERSION,
        credentials: creds
            .iter()
            .map(|((user, t), c)| FileRecord {
                user: user.clone(),
                mechanism: mechanism_of_type(*t)
                    .expect("only SCRAM mechanisms are stored")
                    .name()
                    .to_owned(),
                iterations: c.iterations,
                salt: b64.encode(&c.salt),
                stored_key: b64.encode(&c.stored_key),
                server_key: b64.encode(&c.server_key),
            })
            .collect(),
    };
    serde_json::to_vec_pretty(&body).expect("credentials serialise")
}

fn decode(path: &Path, bytes: &[u8]) -> Result<BTreeMap<Key, ScramCredential>, StoreError> {
    let corrupt = |why: String| StoreError::Corrupt {
        path: path.display().to_string(),
        why,
    };
    let body: FileBody =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not valid JSON: {e}")))?;
    if body.version != FILE_VERSION {
        return Err(corrupt(format!("unknown version {}", body.version)));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = BTreeMap::new();
    for r in body.credentials {
        let m = mechanism_named(&r.mechanism)
            .ok_or_else(|| corrupt(format!("unknown mechanism {:?}", r.mechanism)))?;
        let field = |name: &str, v: &str| {
            b64.decode(v)
                .map_err(|_| corrupt(format!("{name} of user {:?} is not base64", r.user)))
        };
        let c = ScramCredential {
            salt: field("salt", &r.salt)?,
            stored_key: field("stored_key", &r.stored_key)?,
            server_key: field("server_key", &r.server_key)?,
            iterations: r.iterations,
        };
        out.insert((r.user, type_of_mechanism(m)), c);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: changes survive a reopen, the file holds no password, and the keys are Kafka's
    // derivation of the salted password.
    #[test]
    fn credentials_survive_reopen_and_the_file_holds_only_derived_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scram.json");
        let s = ScramStore::open(&path).unwrap();
        assert!(s.is_empty());
        let m = Mechanism::ScramSha512;
        let c = ScramCredential::from_password(m, "hunter2-password", b"salt".to_vec(), 4096);
        s.apply(&[], vec![("alice".into(), m, c.clone())]).unwrap();
        s.apply(
            &[],
            vec![(
                "bob".into(),
                Mechanism::ScramSha256,
                ScramCredential::from_password(Mechanism::ScramSha256, "b", b"s".to_vec(), 8192),
            )],
        )
        .unwrap();
        let again = ScramStore::open(&path).unwrap();
        assert_eq!(again.get("alice", m), Some(c));
        assert_eq!(again.get("alice", Mechanism::ScramSha256), None);
        assert_eq!(
            again.list().get("bob"),
            Some(&vec![(Mechanism::ScramSha256, 8192)])
        );
        again.apply(&[("alice".into(), m)], vec![]).unwrap();
        assert_eq!(ScramStore::open(&path).unwrap().get("alice", m), None);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("hunter2"));
        assert!(!format!("{:?}", again.get("bob", Mechanism::ScramSha256)).contains("stored"));
    }

    #[test]
    fn a_corrupt_store_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scram.json");
        write_secret_file(&path, b"{\"version\":1,\"credentials\":[{\"user\":\"a\"}]}").unwrap();
        let err = ScramStore::open(&path).unwrap_err().to_string();
        assert!(err.contains("not valid JSON"), "{err}");
    }
}
