//! PLAIN users from an operator's file (Kafka keeps them as `user_<name>="<password>"` in the
//! listener's JAAS config): a TOML table of `name = "password"` lines, which must be 0600.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::serve::credentials::secret_file::{read_secret_file, SecretFileError};
use crate::serve::sasl::scram::constant_time_eq;

#[derive(Debug, thiserror::Error)]
pub enum PlainUsersError {
    #[error("PLAIN users file: {0}")]
    File(#[from] SecretFileError),
    #[error("PLAIN users file {path} does not exist")]
    Missing { path: String },
    #[error("PLAIN users file {path}: {why}")]
    Parse { path: String, why: String },
}

/// User → SHA-256 of the password (so the password itself is not kept in memory, and a
/// comparison takes the same time whatever the guess).
#[derive(Clone, Default)]
pub struct PlainUsers {
    users: BTreeMap<String, [u8; 32]>,
}

impl std::fmt::Debug for PlainUsers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlainUsers")
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl PlainUsers {
    pub fn load(path: &Path) -> Result<PlainUsers, PlainUsersError> {
        let bytes = read_secret_file(path)?.ok_or_else(|| PlainUsersError::Missing {
            path: path.display().to_string(),
        })?;
        let parse = |why: String| PlainUsersError::Parse {
            path: path.display().to_string(),
            why,
        };
        let text = String::from_utf8(bytes).map_err(|_| parse("not UTF-8".into()))?;
        // The TOML error quotes the offending line, which may hold a password: say only where.
        let table: BTreeMap<String, String> = toml::from_str(&text).map_err(|e| {
            parse(match e.span() {
                Some(s) => format!(
                    "not a table of name = \"password\" lines (error at byte {})",
                    s.start
                ),
                None => "not a table of name = \"password\" lines".into(),
            })
        })?;
        let mut users = BTreeMap::new();
        for (name, password) in table {
            if name.is_empty() || password.is_empty() {
                return Err(parse(format!(
                    "user {name:?} has an empty name or password"
                )));
            }
            users.insert(name, Sha256::digest(password.as_bytes()).into());
        }
        Ok(PlainUsers { users })
    }

    pub fn from_pairs(pairs: &[(&str, &str)]) -> PlainUsers {
        PlainUsers {
            users: pairs
                .iter()
                .map(|(u, p)| (u.to_string(), Sha256::digest(p.as_bytes()).into()))
                .collect(),
        }
    }

    /// Whether `user` exists with `password`.
    pub fn check(&self, user: &str, password: &[u8]) -> bool {
        let guess: [u8; 32] = Sha256::digest(password).into();
        match self.users.get(user) {
            Some(h) => constant_time_eq(h, &guess),
            None => {
                // Same work for an unknown user as for a wrong password.
                let _ = constant_time_eq(&[0u8; 32], &guess);
                false
            }
        }
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    // Goal: a users file that others may read is refused, as is one that does not parse, and
    // neither error repeats a password.
    #[test]
    fn users_file_must_be_0600_and_well_formed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("plain.toml");
        std::fs::write(&p, "alice = \"alice-pw\"\n\"b ob\" = \"x\"\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = PlainUsers::load(&p).unwrap_err().to_string();
        assert!(err.contains("mode 0644"), "{err}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let u = PlainUsers::load(&p).unwrap();
        assert!(u.check("alice", b"alice-pw") && u.check("b ob", b"x"));
        assert!(!u.check("alice", b"alice-pX") && !u.check("carol", b"alice-pw"));
        assert!(!format!("{u:?}").contains("alice-pw"));
        std::fs::write(&p, "alice = secret-pw\n").unwrap();
        let err = PlainUsers::load(&p).unwrap_err().to_string();
        assert!(
            err.contains("not a table") && !err.contains("secret-pw"),
            "{err}"
        );
        assert!(PlainUsers::load(&dir.path().join("none"))
            .unwrap_err()
            .to_string()
            .contains("does not exist"));
    }
}
