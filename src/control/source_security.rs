//! A mirror's connection settings (Kafka's property vocabulary, from `mirror_def`) turned into
//! the source client's `SourceSecurity`: credentials for SASL, and a rustls config built from
//! the PEM files for TLS. Each mirror gets its own, never shared with another mirror.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use crate::control::fault::Fault;
use crate::control::mirror_def::{MirrorName, SaslMechanism, SourceConnection};
use crate::fetch::blocking::BlockingError;
use crate::fetch::sasl::{Credentials, Mechanism};
use crate::fetch::security::{SourceSecurity, TlsClient};
use crate::fetch::tls::TlsSettings;

/// Builds the security layer for one mirror. Unreadable or bad PEM files are the operator's to
/// fix, so they are not retried.
pub fn security_of(conn: &SourceConnection) -> Result<SourceSecurity, Fault> {
    let tls = match &conn.tls {
        Some(files) => Some(
            TlsClient::new(TlsSettings {
                truststore: files.truststore.clone(),
                keystore: files.keystore.clone(),
                verify_hostname: files.verify_hostname,
            })
            .map_err(|e| Fault::permanent(e.to_string()))?,
        ),
        None => None,
    };
    let sasl = conn.sasl.as_ref().map(|c| Credentials {
        mechanism: match c.mechanism {
            SaslMechanism::Plain => Mechanism::Plain,
            SaslMechanism::ScramSha256 => Mechanism::ScramSha256,
            SaslMechanism::ScramSha512 => Mechanism::ScramSha512,
        },
        username: c.username.clone(),
        password: c.password.clone(),
    });
    Ok(SourceSecurity { tls, sasl })
}

/// Each mirror's built security, reused while its connection settings and PEM files stay the
/// same. A start or resume adds every partition of a mirror one by one; building per partition
/// read and parsed the truststore (and keystore) thousands of times. A rotated file (another
/// inode, size or modification time) is read again at the next add. One entry per mirror name,
/// replaced when its settings change; a deleted mirror's entry holds no more than its
/// definition did.
#[derive(Default)]
pub struct SecurityCache {
    built: HashMap<MirrorName, Built>,
}

struct Built {
    conn: SourceConnection,
    files: Vec<Option<FileStamp>>,
    security: Arc<SourceSecurity>,
}

/// What tells a rewritten PEM file from the one read: inode, size, modification time (ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        ino: meta.ino(),
        len: meta.len(),
        mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
    })
}

fn stamps(conn: &SourceConnection) -> Vec<Option<FileStamp>> {
    conn.tls
        .iter()
        .flat_map(|t| [t.truststore.as_deref(), t.keystore.as_deref()])
        .flatten()
        .map(stamp)
        .collect()
}

impl SecurityCache {
    /// `mirror`'s security for `conn`: the one built before if nothing it was built from
    /// changed, else a new one (errors are not kept: the next call reads the files again).
    pub fn get(
        &mut self,
        mirror: &MirrorName,
        conn: &SourceConnection,
    ) -> Result<Arc<SourceSecurity>, Fault> {
        let files = stamps(conn);
        if let Some(built) = self.built.get(mirror) {
            if built.conn == *conn && built.files == files {
                return Ok(Arc::clone(&built.security));
            }
        }
        let security = Arc::new(security_of(conn)?);
        self.built.insert(
            mirror.clone(),
            Built {
                conn: conn.clone(),
                files,
                security: Arc::clone(&security),
            },
        );
        Ok(security)
    }
}

/// A blocking client's error as a `Fault`: refused credentials or certificates are permanent.
pub fn fault_of(addr: &str, e: &BlockingError) -> Fault {
    Fault {
        message: format!("{addr}: {e}"),
        retryable: !e.is_authentication(),
        timed_out: e.is_timeout(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::mirror_def::{SecurityProtocol, TlsFiles};
    use std::process::Command;

    /// A self-signed CA certificate in PEM, made now by the `openssl` CLI.
    fn write_ca(path: &Path, cn: &str) {
        let key = path.with_extension("key");
        let out = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-days", "2", "-subj", &format!("/CN={cn}")])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(path)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn tls_conn(truststore: &Path, client_id: &str) -> SourceConnection {
        SourceConnection {
            bootstrap_servers: vec!["127.0.0.1:9093".into()],
            security_protocol: SecurityProtocol::Ssl,
            sasl: None,
            tls: Some(TlsFiles {
                truststore: Some(truststore.to_owned()),
                keystore: None,
                verify_hostname: true,
            }),
            client_id: client_id.into(),
        }
    }

    #[test]
    fn a_mirrors_security_is_built_once_until_its_settings_or_files_change() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        write_ca(&ca, "first-ca");
        let name = MirrorName::try_from("dr".to_owned()).unwrap();
        let conn = tls_conn(&ca, "kmirror");
        let mut cache = SecurityCache::default();

        let first = cache.get(&name, &conn).unwrap();
        for _ in 0..100 {
            assert!(Arc::ptr_eq(&first, &cache.get(&name, &conn).unwrap()));
        }

        // Other settings: built again.
        let other = cache.get(&name, &tls_conn(&ca, "kmirror-2")).unwrap();
        assert!(!Arc::ptr_eq(&first, &other));

        // A rotated truststore (a new file renamed over the old one): read again.
        let rotated = dir.path().join("ca-new.pem");
        write_ca(&rotated, "second-ca-with-a-longer-name");
        std::fs::rename(&rotated, &ca).unwrap();
        let again = cache.get(&name, &tls_conn(&ca, "kmirror-2")).unwrap();
        assert!(!Arc::ptr_eq(&other, &again));

        // A truststore that became unreadable is an error, not the old security.
        std::fs::write(&ca, b"not a certificate").unwrap();
        assert!(cache.get(&name, &tls_conn(&ca, "kmirror-2")).is_err());
    }
}
