//! Who is on the other end of a connection: the listener it came in on, its address, and the
//! principal the authorizer sees. The connection owns its `Session` and replaces it when the
//! client authenticates (SASL) or presented a certificate (mTLS); every request carries the
//! session current when it was read, so handlers and the authorizer never look at sockets.

use std::net::SocketAddr;
use std::sync::Arc;

/// Kafka's `security.protocol` of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    /// The name Kafka's configs use (`listener.security.protocol.map`).
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// Whether a client must complete SASL before any other request.
    pub fn needs_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    /// Whether the bytes travel inside TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }
}

/// A Kafka principal, `Type:name` (`User:alice`, `User:ANONYMOUS`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KafkaPrincipal {
    pub kind: String,
    pub name: String,
}

impl KafkaPrincipal {
    /// `User:<name>`.
    pub fn user(name: impl Into<String>) -> KafkaPrincipal {
        KafkaPrincipal {
            kind: "User".into(),
            name: name.into(),
        }
    }

    /// What Kafka calls an unauthenticated client (PLAINTEXT listeners, or SSL without a
    /// client certificate).
    pub fn anonymous() -> KafkaPrincipal {
        KafkaPrincipal::user("ANONYMOUS")
    }
}

impl std::fmt::Display for KafkaPrincipal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind, self.name)
    }
}

/// One connection's identity as of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The client's address; `None` for requests that did not come from a socket (tests,
    /// internal re-dispatch).
    pub peer: Option<SocketAddr>,
    /// The listener's name (`PLAINTEXT`, `INTERNAL`, …).
    pub listener: Arc<str>,
    pub protocol: SecurityProtocol,
    pub principal: KafkaPrincipal,
    /// Whether the client finished authenticating (always true where none is required).
    pub authenticated: bool,
}

impl Session {
    /// An anonymous client on a PLAINTEXT listener named `PLAINTEXT`.
    pub fn plaintext(peer: Option<SocketAddr>) -> Session {
        Session {
            peer,
            listener: Arc::from("PLAINTEXT"),
            protocol: SecurityProtocol::Plaintext,
            principal: KafkaPrincipal::anonymous(),
            authenticated: true,
        }
    }

    /// The client host as Kafka's ACLs match it (`*` when unknown).
    pub fn host(&self) -> String {
        self.peer
            .map(|p| p.ip().to_string())
            .unwrap_or_else(|| "*".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principal_prints_as_kafka_does() {
        assert_eq!(KafkaPrincipal::anonymous().to_string(), "User:ANONYMOUS");
        assert_eq!(KafkaPrincipal::user("alice").to_string(), "User:alice");
    }

    #[test]
    fn protocols_say_what_they_need() {
        assert!(SecurityProtocol::SaslSsl.needs_sasl() && SecurityProtocol::SaslSsl.uses_tls());
        assert!(!SecurityProtocol::Ssl.needs_sasl() && SecurityProtocol::Ssl.uses_tls());
        assert!(!SecurityProtocol::Plaintext.needs_sasl());
        assert_eq!(SecurityProtocol::SaslPlaintext.name(), "SASL_PLAINTEXT");
    }
}
