//! The admin API over TLS: an `axum` listener whose connections are TLS streams.
//!
//! Handshakes run in their own tasks with a deadline, so one client that connects and never
//! speaks cannot hold up the others; finished ones are queued for the HTTP server.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::limits::{ADMIN_TLS_HANDSHAKE_TIMEOUT_MS, ADMIN_TLS_READY_MAX};

/// The server side of TLS from a PEM certificate chain and its unencrypted private key.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|_| {
        format!(
            "{} holds no unencrypted PEM private key (decrypt it with `openssl pkcs8 -nocrypt`)",
            key.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    Ok(Arc::new(config))
}

/// Accepts TCP connections and hands out those whose TLS handshake finished in time.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Starts accepting on `listener` (inside a tokio runtime).
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(ADMIN_TLS_READY_MAX);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // EMFILE and the like: back off instead of spinning.
                        tracing::warn!("admin API accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let deadline = Duration::from_millis(ADMIN_TLS_HANDSHAKE_TIMEOUT_MS);
                    match tokio::time::timeout(deadline, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "admin API TLS handshake: {e}"),
                        Err(_) => tracing::debug!(%peer, "admin API TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { local, ready })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept task ended (runtime shutting down): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
