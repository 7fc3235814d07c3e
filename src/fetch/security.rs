//! A connection's security layer, sans-IO: TLS (SSL, SASL_SSL) and SASL (SASL_PLAINTEXT,
//! SASL_SSL) between the TCP connect and the first ordinary request.
//!
//! The driver feeds every received byte to `SecureLink::receive` until it reports `Ready`, and
//! sends what `take_outgoing` hands it. After that, on TLS connections, the driver keeps
//! feeding ciphertext and reads whole frames with `next_frame`, and seals requests with
//! `seal`; on SASL_PLAINTEXT connections the link is done and the driver reads frames straight
//! from the socket again (the zero-copy path).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rustls::ClientConfig;

use crate::fetch::conn::Connection;
use crate::fetch::sasl::{Credentials, SaslError, SaslExchange, SaslStep};
use crate::fetch::tls::{self, TlsError, TlsSettings, TlsStream};
use crate::wire::frame::{self, FrameError};

/// The start of every authentication failure's message, so operators can grep for it.
pub const AUTHENTICATION_FAILED: &str = "authentication failed";

/// TLS settings with their built rustls config. Equality is by settings.
#[derive(Clone)]
pub struct TlsClient {
    pub settings: TlsSettings,
    pub config: Arc<ClientConfig>,
}

impl TlsClient {
    pub fn new(settings: TlsSettings) -> Result<TlsClient, TlsError> {
        let config = tls::client_config(&settings)?;
        Ok(TlsClient { settings, config })
    }
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.settings.fmt(f)
    }
}

impl PartialEq for TlsClient {
    fn eq(&self, other: &Self) -> bool {
        self.settings == other.settings
    }
}
impl Eq for TlsClient {}

/// How a connection to a source broker is secured; the default is PLAINTEXT.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SourceSecurity {
    pub tls: Option<TlsClient>,
    pub sasl: Option<Credentials>,
}

impl SourceSecurity {
    pub fn is_plaintext(&self) -> bool {
        self.tls.is_none() && self.sasl.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecurityError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Sasl(#[from] SaslError),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("the source sent {0} bytes nobody asked for after authentication")]
    Unsolicited(usize),
}

impl SecurityError {
    /// Credentials or certificates were refused: retrying with the same settings cannot help.
    pub fn is_authentication(&self) -> bool {
        match self {
            SecurityError::Tls(e) => e.is_authentication(),
            SecurityError::Sasl(e) => e.is_authentication(),
            _ => false,
        }
    }
}

/// Where the link stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkStatus {
    Handshaking,
    Ready,
}

/// The security layer of one connection.
#[derive(Debug)]
pub struct SecureLink {
    tls: Option<TlsStream>,
    sasl: Option<SaslExchange>,
    /// SASL requests' own correlation ids (the fetcher's connection starts afresh after).
    conn: Connection,
    /// Received bytes not yet framed (decrypted, with TLS).
    plain: BytesMut,
    outgoing: BytesMut,
    ready: bool,
}

impl SecureLink {
    /// `host` is the broker's host as addressed (checked against its certificate).
    pub fn new(
        security: &SourceSecurity,
        host: &str,
        client_id: &str,
    ) -> Result<SecureLink, SecurityError> {
        let tls = match &security.tls {
            Some(t) => Some(TlsStream::new(&t.config, host)?),
            None => None,
        };
        Ok(SecureLink {
            tls,
            sasl: security.sasl.clone().map(SaslExchange::new),
            conn: Connection::new(client_id),
            plain: BytesMut::new(),
            outgoing: BytesMut::new(),
            ready: false,
        })
    }

    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Right after the TCP connect: queues the ClientHello, or the SaslHandshake.
    pub fn start(&mut self) -> Result<LinkStatus, SecurityError> {
        match &mut self.tls {
            Some(tls) => {
                tls.take_outgoing(&mut self.outgoing)?;
                Ok(LinkStatus::Handshaking)
            }
            None => self.begin_sasl(),
        }
    }

    fn begin_sasl(&mut self) -> Result<LinkStatus, SecurityError> {
        let Some(sasl) = &mut self.sasl else {
            self.ready = true;
            return Ok(LinkStatus::Ready);
        };
        let mut req = BytesMut::new();
        sasl.start(&mut self.conn, &mut req)?;
        self.seal(&req)?;
        Ok(LinkStatus::Handshaking)
    }

    /// Bytes received from the socket.
    pub fn receive(&mut self, data: &[u8]) -> Result<LinkStatus, SecurityError> {
        match &mut self.tls {
            Some(tls) => {
                let was_handshaking = tls.is_handshaking();
                tls.receive(data, &mut self.plain)?;
                tls.take_outgoing(&mut self.outgoing)?;
                if was_handshaking && !tls.is_handshaking() {
                    self.begin_sasl()?;
                }
            }
            None => self.plain.extend_from_slice(data),
        }
        if !self.ready {
            self.advance_sasl()?;
        }
        Ok(if self.ready {
            LinkStatus::Ready
        } else {
            LinkStatus::Handshaking
        })
    }

    fn advance_sasl(&mut self) -> Result<(), SecurityError> {
        let Some(sasl) = &mut self.sasl else {
            return Ok(());
        };
        if self.tls.as_ref().is_some_and(TlsStream::is_handshaking) {
            return Ok(());
        }
        while let Some(frame) = frame::split_frame(&mut self.plain)? {
            let mut req = BytesMut::new();
            match sasl.on_response(&mut self.conn, frame, &mut req)? {
                SaslStep::Sent => match &mut self.tls {
                    Some(tls) => {
                        tls.send(&req)?;
                        tls.take_outgoing(&mut self.outgoing)?;
                    }
                    None => self.outgoing.extend_from_slice(&req),
                },
                SaslStep::Done => {
                    self.ready = true;
                    if self.tls.is_none() && !self.plain.is_empty() {
                        return Err(SecurityError::Unsolicited(self.plain.len()));
                    }
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Queues `plain` for sending: encrypted with TLS, as is without.
    pub fn seal(&mut self, plain: &[u8]) -> Result<(), SecurityError> {
        match &mut self.tls {
            Some(tls) => {
                tls.send(plain)?;
                tls.take_outgoing(&mut self.outgoing)?;
            }
            None => self.outgoing.extend_from_slice(plain),
        }
        Ok(())
    }

    /// The bytes to send now, if any.
    pub fn take_outgoing(&mut self) -> Option<Bytes> {
        (!self.outgoing.is_empty()).then(|| self.outgoing.split().freeze())
    }

    /// The next whole response frame body received after the link became ready (TLS only).
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        frame::split_frame(&mut self.plain)
    }
}
