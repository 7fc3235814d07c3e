//! A mirror's connection settings (Kafka's property vocabulary, from `mirror_def`) turned into
//! the source client's `SourceSecurity`: credentials for SASL, and a rustls config built from
//! the PEM files for TLS. Each mirror gets its own, never shared with another mirror.

use crate::control::fault::Fault;
use crate::control::mirror_def::{SaslMechanism, SourceConnection};
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

/// A blocking client's error as a `Fault`: refused credentials or certificates are permanent.
pub fn fault_of(addr: &str, e: &BlockingError) -> Fault {
    Fault {
        message: format!("{addr}: {e}"),
        retryable: !e.is_authentication(),
        timed_out: e.is_timeout(),
    }
}
