//! TLS for `SSL` and `SASL_SSL` listeners: the rustls server configuration built from Kafka's
//! PEM settings, and the principal a client certificate stands for.
//!
//! The principal follows Kafka's `DefaultKafkaPrincipalBuilder` with
//! `ssl.principal.mapping.rules=DEFAULT`: `User:` plus the subject's distinguished name as
//! Java's `X500Principal.getName()` prints it (RFC 2253: most specific attribute first, commas
//! without spaces, `CN=client,OU=eng,O=acme,C=US`), so ACLs written for a Kafka broker match
//! kmirror's principals unchanged. A client without a certificate is `User:ANONYMOUS`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use x509_cert::der::{Decode, Encode, Tag, Tagged};

use crate::serve::session::KafkaPrincipal;

/// Kafka's `ssl.client.auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// Asked for; a client without one is `User:ANONYMOUS`, one with a certificate the
    /// truststore does not vouch for is refused.
    Requested,
    /// A client without a certificate the truststore vouches for is refused.
    Required,
}

/// A TLS version of Kafka's `ssl.enabled.protocols`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub enum TlsProtocol {
    #[serde(rename = "TLSv1.2")]
    Tls12,
    #[serde(rename = "TLSv1.3")]
    Tls13,
}

/// One listener's TLS settings (PEM files, as Kafka's `ssl.keystore.type=PEM`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The server's certificate chain, PEM; may also hold the private key.
    pub keystore: PathBuf,
    /// The private key, PEM, when not in `keystore`; must not be readable by others.
    pub key: Option<PathBuf>,
    /// CA certificates, PEM, that client certificates must chain to.
    pub truststore: Option<PathBuf>,
    pub client_auth: ClientAuth,
    pub protocols: Vec<TlsProtocol>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("client certificate: {0}")]
    Certificate(String),
}

fn file_error(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM CERTIFICATE in the file"));
    }
    Ok(certs)
}

/// The private key file must be for kmirror's user only: a key others can read is a key
/// others may have copied.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| file_error(path, e))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(file_error(
            path,
            format!(
                "holds a private key but its mode is {:o}; make it 0600",
                mode & 0o777
            ),
        ));
    }
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        file_error(
            path,
            format!("no unencrypted PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
        )
    })
}

/// The rustls configuration of one listener: read once at start, errors name the file.
pub fn server_config(s: &TlsSettings) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&s.keystore)?;
    let key = private_key(s.key.as_deref().unwrap_or(&s.keystore))?;
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = s
        .protocols
        .iter()
        .map(|p| match p {
            TlsProtocol::Tls12 => &rustls::version::TLS12,
            TlsProtocol::Tls13 => &rustls::version::TLS13,
        })
        .collect();
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match s.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        auth => {
            let path = s.truststore.as_deref().ok_or_else(|| {
                TlsError::Config("ssl_client_auth needs ssl_truststore_location".into())
            })?;
            let mut roots = RootCertStore::empty();
            for cert in certificates(path)? {
                roots.add(cert).map_err(|e| file_error(path, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if auth == ClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?,
            )
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("certificate and key: {e}")))?;
    Ok(Arc::new(config))
}

/// The principal of a verified client certificate chain (its first, end-entity certificate).
pub fn principal_of(chain: Option<&[CertificateDer<'_>]>) -> Result<KafkaPrincipal, TlsError> {
    match chain.and_then(|c| c.first()) {
        None => Ok(KafkaPrincipal::anonymous()),
        Some(cert) => Ok(KafkaPrincipal::user(subject_name(cert)?)),
    }
}

/// The subject of `cert` as Java's `X500Principal.getName()` (RFC 2253) prints it.
pub fn subject_name(cert: &CertificateDer<'_>) -> Result<String, TlsError> {
    let cert = x509_cert::Certificate::from_der(cert.as_ref())
        .map_err(|e| TlsError::Certificate(e.to_string()))?;
    let mut out = String::new();
    for (i, rdn) in cert.tbs_certificate.subject.0.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, atv) in rdn.0.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            attribute(&mut out, &atv.oid, &atv.value)?;
        }
    }
    Ok(out)
}

/// The attribute keywords RFC 2253 (and so Java) prints by name; any other attribute is its
/// dotted OID and the hex of its DER value.
const KEYWORDS: [(&str, &str); 9] = [
    ("2.5.4.3", "CN"),
    ("2.5.4.6", "C"),
    ("2.5.4.7", "L"),
    ("2.5.4.8", "ST"),
    ("2.5.4.10", "O"),
    ("2.5.4.11", "OU"),
    ("2.5.4.9", "STREET"),
    ("0.9.2342.19200300.100.1.25", "DC"),
    ("0.9.2342.19200300.100.1.1", "UID"),
];

fn attribute(
    out: &mut String,
    oid: &x509_cert::der::asn1::ObjectIdentifier,
    value: &x509_cert::der::Any,
) -> Result<(), TlsError> {
    let dotted = oid.to_string();
    let keyword = KEYWORDS.iter().find(|(o, _)| *o == dotted).map(|(_, k)| *k);
    let text = match value.tag() {
        Tag::PrintableString | Tag::Utf8String | Tag::Ia5String | Tag::TeletexString => {
            std::str::from_utf8(value.value()).ok()
        }
        _ => None,
    };
    match (keyword, text) {
        (Some(k), Some(v)) => {
            out.push_str(k);
            out.push('=');
            escape_into(out, v);
        }
        _ => {
            out.push_str(&dotted);
            out.push_str("=#");
            let der = value
                .to_der()
                .map_err(|e| TlsError::Certificate(e.to_string()))?;
            for b in der {
                out.push_str(&format!("{b:02x}"));
            }
        }
    }
    Ok(())
}

/// RFC 2253 section 2.4 escaping, as Java applies it.
fn escape_into(out: &mut String, v: &str) {
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
}

/// (listener, principal, TLS connections that completed the handshake as it).
pub type PrincipalCount = (String, String, u64);

/// TLS connections per listener and principal, and refused handshakes per listener, for
/// `/metrics` (process-wide, like `admission::CONN_STATS`).
#[derive(Debug)]
pub struct TlsStats {
    counts: Mutex<TlsCounts>,
}

#[derive(Debug)]
struct TlsCounts {
    failed: BTreeMap<String, u64>,
    principals: BTreeMap<(String, String), u64>,
}

pub static TLS_STATS: TlsStats = TlsStats {
    counts: Mutex::new(TlsCounts {
        failed: BTreeMap::new(),
        principals: BTreeMap::new(),
    }),
};

impl TlsStats {
    fn lock(&self) -> std::sync::MutexGuard<'_, TlsCounts> {
        // Plain counters: consistent across a panic.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn handshake_failed(&self, listener: &str) {
        *self.lock().failed.entry(listener.to_owned()).or_insert(0) += 1;
    }

    /// A connection on `listener` completed its handshake as `principal`.
    pub fn authenticated(&self, listener: &str, principal: &KafkaPrincipal) {
        let mut c = self.lock();
        let mut key = (listener.to_owned(), principal.to_string());
        if !c.principals.contains_key(&key)
            && c.principals.len() >= crate::limits::SERVE_TLS_PRINCIPALS_TRACKED
        {
            key.1 = "other".into();
        }
        *c.principals.entry(key).or_insert(0) += 1;
    }

    /// (listener, principal, connections) and (listener, refused handshakes), sorted.
    pub fn snapshot(&self) -> (Vec<PrincipalCount>, Vec<(String, u64)>) {
        let c = self.lock();
        (
            c.principals
                .iter()
                .map(|((l, p), n)| (l.clone(), p.clone(), *n))
                .collect(),
            c.failed.iter().map(|(l, n)| (l.clone(), *n)).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_follows_rfc_2253() {
        let mut s = String::new();
        escape_into(&mut s, "#a, b+c ");
        assert_eq!(s, "\\#a\\, b\\+c\\ ");
    }

    #[test]
    fn no_certificate_is_anonymous() {
        assert_eq!(principal_of(None).unwrap(), KafkaPrincipal::anonymous());
        assert_eq!(
            principal_of(Some(&[])).unwrap(),
            KafkaPrincipal::anonymous()
        );
    }

    #[test]
    fn garbage_is_a_certificate_error() {
        let junk = CertificateDer::from(vec![0x30, 0x03, 1, 2, 3]);
        assert!(matches!(subject_name(&junk), Err(TlsError::Certificate(_))));
    }
}
