//! TLS to source brokers with `rustls`, sans-IO: the driver hands over the ciphertext it
//! received and sends the ciphertext this side produces; decrypted bytes land in a plaintext
//! buffer the framing reads from. Decryption necessarily writes the records into that buffer,
//! so on TLS connections the records are copied once more than on PLAINTEXT ones (see
//! ARCHITECTURE.md).
//!
//! Trust and client identity come from PEM files (`ssl.truststore.location`,
//! `ssl.keystore.location` with the certificate chain and an unencrypted PKCS#8/PKCS#1/SEC1
//! key). Without a trust store the Mozilla roots (`webpki-roots`) are trusted.

use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct};

/// Where a mirror's TLS material lives and how strictly the broker's name is checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct TlsSettings {
    /// PEM CA certificates to trust; `None` trusts the Mozilla roots.
    pub truststore: Option<PathBuf>,
    /// PEM client certificate chain and private key, for brokers that require client auth.
    pub keystore: Option<PathBuf>,
    /// Check the broker's host name or IP against its certificate (Kafka's default, `https`).
    pub verify_hostname: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    File { path: String, reason: String },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("{path} holds no unencrypted PEM private key (encrypted keys are not supported: decrypt it with `openssl pkcs8 -nocrypt`)")]
    NoKey { path: String },
    #[error("TLS settings: {0}")]
    Config(String),
    #[error("{0:?} is not a valid TLS server name")]
    ServerName(String),
    /// The handshake failed on certificates (ours or the broker's): Kafka calls this an SSL
    /// authentication failure and so do we; retrying cannot help.
    #[error("authentication failed: TLS: {0}")]
    Authentication(String),
    #[error("TLS: {0}")]
    Protocol(String),
}

impl TlsError {
    pub fn is_authentication(&self) -> bool {
        !matches!(self, TlsError::Protocol(_))
    }
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> TlsError {
        match e {
            rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::AlertReceived(
                rustls::AlertDescription::BadCertificate
                | rustls::AlertDescription::CertificateRequired
                | rustls::AlertDescription::UnknownCA
                | rustls::AlertDescription::CertificateUnknown
                | rustls::AlertDescription::AccessDenied
                | rustls::AlertDescription::HandshakeFailure,
            ) => TlsError::Authentication(e.to_string()),
            other => TlsError::Protocol(other.to_string()),
        }
    }
}

fn file_err(path: &Path, e: impl fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.display().to_string(),
        });
    }
    Ok(certs)
}

/// Builds the client config for one mirror (reads the PEM files now, so a bad file is reported
/// when the mirror is created, not at the first connection).
pub fn client_config(settings: &TlsSettings) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    match &settings.truststore {
        Some(path) => {
            for cert in certificates(path)? {
                roots
                    .add(cert)
                    .map_err(|e| file_err(path, format!("bad CA certificate: {e}")))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = if settings.verify_hostname {
        builder.with_webpki_verifier(verifier)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly(verifier)))
    };
    let config = match &settings.keystore {
        Some(path) => {
            let chain = certificates(path)?;
            let key = PrivateKeyDer::from_pem_file(path).map_err(|_| TlsError::NoKey {
                path: path.display().to_string(),
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| file_err(path, e))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// `ssl.endpoint.identification.algorithm=` (empty): the chain must still lead to a trusted
/// CA, only the name check is skipped.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// One TLS session, driven by whoever owns the socket.
pub struct TlsStream {
    conn: ClientConnection,
}

impl fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsStream")
            .field("handshaking", &self.conn.is_handshaking())
            .finish()
    }
}

impl TlsStream {
    /// A session to `host` (the broker's advertised host or IP, checked against its
    /// certificate). The ClientHello is ready in `take_outgoing` at once.
    pub fn new(config: &Arc<ClientConfig>, host: &str) -> Result<TlsStream, TlsError> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|_| TlsError::ServerName(host.to_owned()))?;
        let mut conn = ClientConnection::new(Arc::clone(config), name)?;
        // Our callers drain both directions after every call, so rustls' own buffers never
        // hold more than one response; the frame size bound applies to what we keep.
        conn.set_buffer_limit(None);
        Ok(TlsStream { conn })
    }

    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Feeds received ciphertext; decrypted bytes are appended to `plain`.
    pub fn receive(&mut self, mut data: &[u8], plain: &mut BytesMut) -> Result<(), TlsError> {
        while !data.is_empty() {
            let n = self
                .conn
                .read_tls(&mut data)
                .map_err(|e| TlsError::Protocol(e.to_string()))?;
            let state = self.conn.process_new_packets()?;
            let ready = state.plaintext_bytes_to_read();
            if ready > 0 {
                let start = plain.len();
                plain.resize(start + ready, 0);
                self.conn
                    .reader()
                    .read_exact(&mut plain[start..])
                    .map_err(|e| TlsError::Protocol(e.to_string()))?;
            }
            if state.peer_has_closed() && !data.is_empty() {
                return Err(TlsError::Protocol("bytes after close_notify".into()));
            }
            if n == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Encrypts `plain` for sending (buffered until `take_outgoing`).
    pub fn send(&mut self, plain: &[u8]) -> Result<(), TlsError> {
        self.conn
            .writer()
            .write_all(plain)
            .map_err(|e| TlsError::Protocol(e.to_string()))
    }

    /// Appends every ciphertext byte waiting to go out (handshake messages, records, alerts).
    pub fn take_outgoing(&mut self, out: &mut BytesMut) -> Result<(), TlsError> {
        let mut w = out.writer();
        while self.conn.wants_write() {
            self.conn
                .write_tls(&mut w)
                .map_err(|e| TlsError::Protocol(e.to_string()))?;
        }
        Ok(())
    }
}
