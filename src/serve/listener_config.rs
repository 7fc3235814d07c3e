//! `[[kafka.listeners]]`: Kafka's named listeners with their security protocol and Kafka's
//! `ssl.*` settings (PEM files), as a config section, checked before anything binds.
//!
//! ```toml
//! [[kafka.listeners]]
//! name = "SECURE"
//! listen = "0.0.0.0:9093"
//! advertised = "mirror.example:9093"
//! security_protocol = "SSL"
//! ssl_keystore_location = "/etc/kmirror/server.pem"   # chain (and key, as Kafka's PEM keystore)
//! ssl_key_location = "/etc/kmirror/server.key"        # 0600; when not in the keystore
//! ssl_truststore_location = "/etc/kmirror/clients-ca.pem"
//! ssl_client_auth = "required"                         # required | requested | none
//! ssl_enabled_protocols = ["TLSv1.2", "TLSv1.3"]
//! ```
//! Kafka's dotted spellings (`"ssl.keystore.location"`, ...) are accepted too.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

use crate::serve::listener::ListenerConfig;
use crate::serve::session::SecurityProtocol;
use crate::serve::tls::{ClientAuth, TlsProtocol, TlsSettings};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSection {
    /// Kafka's listener name: letters, digits and `_` (`PLAINTEXT`, `SSL`, `INTERNAL`).
    pub name: String,
    pub listen: SocketAddr,
    /// `host:port` told to clients of this listener; the bound address by default. Required
    /// for a wildcard `listen`.
    #[serde(default)]
    pub advertised: Option<String>,
    /// `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`.
    pub security_protocol: String,
    #[serde(default, alias = "ssl.keystore.location")]
    pub ssl_keystore_location: Option<PathBuf>,
    #[serde(default, alias = "ssl.key.location")]
    pub ssl_key_location: Option<PathBuf>,
    #[serde(default, alias = "ssl.truststore.location")]
    pub ssl_truststore_location: Option<PathBuf>,
    #[serde(default, alias = "ssl.client.auth")]
    pub ssl_client_auth: ClientAuth,
    #[serde(default = "all_protocols", alias = "ssl.enabled.protocols")]
    pub ssl_enabled_protocols: Vec<TlsProtocol>,
}

fn all_protocols() -> Vec<TlsProtocol> {
    vec![TlsProtocol::Tls12, TlsProtocol::Tls13]
}

/// Kafka's `security.protocol` names.
pub fn parse_protocol(s: &str) -> Option<SecurityProtocol> {
    [
        SecurityProtocol::Plaintext,
        SecurityProtocol::Ssl,
        SecurityProtocol::SaslPlaintext,
        SecurityProtocol::SaslSsl,
    ]
    .into_iter()
    .find(|p| p.name() == s)
}

impl ListenerSection {
    fn config(&self) -> Result<ListenerConfig, String> {
        let protocol = parse_protocol(&self.security_protocol).ok_or_else(|| {
            format!(
                "security_protocol {:?} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
                self.security_protocol
            )
        })?;
        let tls = match (&self.ssl_keystore_location, protocol.uses_tls()) {
            (Some(keystore), true) => {
                if self.ssl_client_auth != ClientAuth::None
                    && self.ssl_truststore_location.is_none()
                {
                    return Err(
                        "ssl_client_auth requested/required needs ssl_truststore_location (the CAs client certificates must chain to)".into(),
                    );
                }
                if self.ssl_enabled_protocols.is_empty() {
                    return Err("ssl_enabled_protocols is empty".into());
                }
                Some(TlsSettings {
                    keystore: keystore.clone(),
                    key: self.ssl_key_location.clone(),
                    truststore: self.ssl_truststore_location.clone(),
                    client_auth: self.ssl_client_auth,
                    protocols: self.ssl_enabled_protocols.clone(),
                })
            }
            (None, true) => {
                return Err(format!(
                    "{} needs ssl_keystore_location (PEM certificate chain)",
                    protocol.name()
                ))
            }
            (_, false) => {
                let any_ssl = self.ssl_keystore_location.is_some()
                    || self.ssl_key_location.is_some()
                    || self.ssl_truststore_location.is_some()
                    || self.ssl_client_auth != ClientAuth::None;
                if any_ssl {
                    return Err(format!(
                        "ssl_* settings on a {} listener would be ignored; use SSL or SASL_SSL",
                        protocol.name()
                    ));
                }
                None
            }
        };
        Ok(ListenerConfig {
            name: Arc::from(self.name.as_str()),
            listen: self.listen,
            advertised: self.advertised.clone(),
            protocol,
            tls,
        })
    }
}

/// The listeners of `sections`, or why they cannot run (the message names the listener).
/// `host_port` is the config's `host:port` check for advertised addresses.
pub fn listener_configs(
    sections: &[ListenerSection],
    host_port: impl Fn(&str) -> bool,
) -> Result<Vec<ListenerConfig>, String> {
    use crate::limits::SERVE_LISTENERS_MAX;
    if sections.len() > SERVE_LISTENERS_MAX {
        return Err(format!("at most {SERVE_LISTENERS_MAX} listeners"));
    }
    let mut names = HashSet::new();
    let mut addrs = HashSet::new();
    let mut out = Vec::with_capacity(sections.len());
    for s in sections {
        let named = |why: String| format!("listener {:?}: {why}", s.name);
        let name_ok = !s.name.is_empty()
            && s.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !name_ok {
            return Err(named("a name is letters, digits and _".into()));
        }
        if !names.insert(s.name.clone()) {
            return Err(named("named twice".into()));
        }
        if s.listen.port() != 0 && !addrs.insert(s.listen) {
            return Err(named(format!("{} is another listener's address", s.listen)));
        }
        match &s.advertised {
            None if s.listen.ip().is_unspecified() => {
                return Err(named(format!(
                    "advertised is required when listen ({}) is a wildcard address",
                    s.listen
                )))
            }
            Some(a) if !host_port(a) => {
                return Err(named(format!("advertised {a:?} is not host:port")))
            }
            _ => {}
        }
        out.push(s.config().map_err(named)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<Vec<ListenerConfig>, String> {
        #[derive(Deserialize)]
        struct Doc {
            listeners: Vec<ListenerSection>,
        }
        let doc: Doc = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        listener_configs(&doc.listeners, |a| a.contains(':'))
    }

    /// Goal: Kafka's listener vocabulary loads (both spellings), and every combination that
    /// could not serve as written is refused with the listener's name.
    #[test]
    fn listeners_load_and_inconsistent_ones_are_refused() {
        let ok = parse(
            r#"
[[listeners]]
name = "PLAIN"
listen = "127.0.0.1:9092"
security_protocol = "PLAINTEXT"
[[listeners]]
name = "SECURE"
listen = "0.0.0.0:9093"
advertised = "mirror.example:9093"
security_protocol = "SSL"
"ssl.keystore.location" = "/k/server.pem"
ssl_truststore_location = "/k/ca.pem"
ssl_client_auth = "required"
ssl_enabled_protocols = ["TLSv1.3"]
"#,
        )
        .unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(&*ok[1].name, "SECURE");
        assert_eq!(ok[1].protocol, SecurityProtocol::Ssl);
        let tls = ok[1].tls.as_ref().unwrap();
        assert_eq!(tls.client_auth, ClientAuth::Required);
        assert_eq!(tls.protocols, vec![TlsProtocol::Tls13]);
        assert_eq!(tls.keystore, PathBuf::from("/k/server.pem"));
        assert!(ok[0].tls.is_none());

        let one = |body: &str| {
            parse(&format!(
                "[[listeners]]\nname = \"L\"\nlisten = \"127.0.0.1:1\"\n{body}"
            ))
            .unwrap_err()
        };
        for (body, says) in [
            ("security_protocol = \"TLS\"", "is not PLAINTEXT"),
            ("security_protocol = \"SSL\"", "needs ssl_keystore_location"),
            (
                "security_protocol = \"SSL\"\nssl_keystore_location = \"/k\"\nssl_client_auth = \"required\"",
                "needs ssl_truststore_location",
            ),
            (
                "security_protocol = \"PLAINTEXT\"\nssl_keystore_location = \"/k\"",
                "would be ignored",
            ),
            (
                "security_protocol = \"PLAINTEXT\"\nadvertised = \"nohost\"",
                "not host:port",
            ),
        ] {
            let e = one(body);
            assert!(e.contains("listener \"L\"") && e.contains(says), "{body}: {e}");
        }
        let twice = parse(
            "[[listeners]]\nname = \"A\"\nlisten = \"127.0.0.1:5\"\nsecurity_protocol = \"PLAINTEXT\"\n\
             [[listeners]]\nname = \"A\"\nlisten = \"127.0.0.1:6\"\nsecurity_protocol = \"PLAINTEXT\"\n",
        );
        assert!(twice.unwrap_err().contains("named twice"));
        let wildcard = parse(
            "[[listeners]]\nname = \"A\"\nlisten = \"0.0.0.0:5\"\nsecurity_protocol = \"PLAINTEXT\"\n",
        );
        assert!(wildcard.unwrap_err().contains("wildcard"));
    }
}
