//! How a stock client logs in to an authenticating listener: SASL mechanism and credentials,
//! TLS trust and client certificate, written once and rendered for each client family — a Java
//! properties file (KafkaTool's and kafka-*.sh's `--command-config`) and librdkafka settings
//! (`$KMIRROR_CLIENT_CONFIG` of the Python scripts).

use std::path::{Path, PathBuf};

/// SASL credentials.
#[derive(Debug, Clone, Copy)]
pub struct Sasl<'a> {
    pub mechanism: &'a str,
    pub user: &'a str,
    pub password: &'a str,
}

/// TLS trust (the CA's PEM) and, for mTLS, a client certificate and key (PEM).
#[derive(Debug, Clone, Copy)]
pub struct Tls<'a> {
    pub ca: &'a Path,
    pub cert: Option<(&'a Path, &'a Path)>,
}

#[derive(Debug, Clone, Copy)]
pub struct ClientLogin<'a> {
    pub sasl: Option<Sasl<'a>>,
    pub tls: Option<Tls<'a>>,
}

impl<'a> ClientLogin<'a> {
    /// SASL with `mechanism` as `user` (SASL_PLAINTEXT until `over_tls`).
    pub fn sasl(mechanism: &'a str, user: &'a str, password: &'a str) -> ClientLogin<'a> {
        ClientLogin {
            sasl: Some(Sasl {
                mechanism,
                user,
                password,
            }),
            tls: None,
        }
    }

    /// TLS trusting `ca`, presenting `cert` (certificate, key) if given (SSL).
    pub fn tls(ca: &'a Path, cert: Option<(&'a Path, &'a Path)>) -> ClientLogin<'a> {
        ClientLogin {
            sasl: None,
            tls: Some(Tls { ca, cert }),
        }
    }

    /// The same login inside TLS trusting `ca` (SASL_SSL).
    pub fn over_tls(self, ca: &'a Path) -> ClientLogin<'a> {
        ClientLogin {
            tls: Some(Tls { ca, cert: None }),
            ..self
        }
    }

    /// Kafka's `security.protocol` of this login.
    pub fn protocol(&self) -> &'static str {
        match (self.sasl.is_some(), self.tls.is_some()) {
            (false, false) => "PLAINTEXT",
            (false, true) => "SSL",
            (true, false) => "SASL_PLAINTEXT",
            (true, true) => "SASL_SSL",
        }
    }

    /// Writes the Java client properties of this login to `dir/<name>.properties` (a client
    /// certificate goes into `dir/<name>-keystore.pem`, key and chain in one file, as Kafka's
    /// `ssl.keystore.type=PEM` reads it).
    pub fn java_properties(&self, dir: &Path, name: &str) -> PathBuf {
        let mut props = format!("security.protocol={}\n", self.protocol());
        if let Some(s) = self.sasl {
            let module = if s.mechanism == "PLAIN" {
                "org.apache.kafka.common.security.plain.PlainLoginModule"
            } else {
                "org.apache.kafka.common.security.scram.ScramLoginModule"
            };
            props.push_str(&format!(
                "sasl.mechanism={}\nsasl.jaas.config={module} required username=\"{}\" \
                 password=\"{}\";\n",
                s.mechanism, s.user, s.password
            ));
        }
        if let Some(t) = self.tls {
            props.push_str(&format!(
                "ssl.truststore.type=PEM\nssl.truststore.location={}\n",
                t.ca.display()
            ));
            if let Some((cert, key)) = t.cert {
                let store = dir.join(format!("{name}-keystore.pem"));
                let mut pem = std::fs::read_to_string(key).unwrap();
                pem.push_str(&std::fs::read_to_string(cert).unwrap());
                std::fs::write(&store, pem).unwrap();
                props.push_str(&format!(
                    "ssl.keystore.type=PEM\nssl.keystore.location={}\n",
                    store.display()
                ));
            }
        }
        let path = dir.join(format!("{name}.properties"));
        std::fs::write(&path, props).unwrap();
        path
    }

    /// The librdkafka settings of this login.
    pub fn librdkafka(&self) -> serde_json::Value {
        let mut c = serde_json::json!({ "security.protocol": self.protocol() });
        if let Some(s) = self.sasl {
            c["sasl.mechanism"] = s.mechanism.into();
            c["sasl.username"] = s.user.into();
            c["sasl.password"] = s.password.into();
        }
        if let Some(t) = self.tls {
            c["ssl.ca.location"] = t.ca.to_str().unwrap().into();
            if let Some((cert, key)) = t.cert {
                c["ssl.certificate.location"] = cert.to_str().unwrap().into();
                c["ssl.key.location"] = key.to_str().unwrap().into();
            }
        }
        c
    }
}

/// Writes `text` to `path` with mode 0600 (a users file or token kmirror reads only when no one
/// else can).
pub fn write_secret(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}
