//! How the CLI reaches the admin API: `host:port` (HTTP) or `https://host:port`, with the
//! bearer token read from the same kind of 0600 file the server reads (`--admin-token-file`),
//! and for HTTPS the CA that signed the server's certificate (`--admin-ca-file`; the Mozilla
//! roots otherwise). `kmirror doctor` reads all three from the `[admin]` section it checks.

use std::path::{Path, PathBuf};

use crate::control::admin_guard::read_secret_file;

/// An admin API to talk to.
#[derive(Clone)]
pub struct AdminTarget {
    /// `scheme://host:port`, no trailing slash.
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl std::fmt::Debug for AdminTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminTarget")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl AdminTarget {
    /// `addr` is `host:port`, `http://host:port` or `https://host:port`.
    pub fn new(
        addr: &str,
        token_file: Option<&Path>,
        ca_file: Option<&Path>,
    ) -> Result<AdminTarget, String> {
        let base = if addr.starts_with("http://") || addr.starts_with("https://") {
            addr.trim_end_matches('/').to_owned()
        } else {
            format!("http://{addr}")
        };
        let token = token_file
            .map(|f| read_secret_file(f).map_err(|e| e.to_string()))
            .transpose()?;
        let mut config = ureq::Agent::config_builder().http_status_as_error(false);
        if let Some(ca) = ca_file {
            let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
            let certs: Vec<_> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                return Err(format!("{} holds no PEM certificate", ca.display()));
            }
            config = config.tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
                    .build(),
            );
        }
        Ok(AdminTarget {
            base,
            token,
            agent: config.build().into(),
        })
    }

    /// From the `[admin]` section of a configuration (doctor on the server's own host).
    pub fn of_section(admin: &crate::config::AdminSection) -> Result<AdminTarget, String> {
        let scheme = if admin.tls_cert_file.is_some() {
            "https"
        } else {
            "http"
        };
        // The server's own certificate is the CA to trust when it is self-signed; a chain
        // signed by a public CA verifies against the Mozilla roots either way.
        let ca: Option<PathBuf> = admin.tls_cert_file.clone();
        AdminTarget::new(
            &format!("{scheme}://{}", admin.listen),
            admin.token_file.as_deref(),
            ca.as_deref(),
        )
    }

    /// `scheme://host:port`, for messages.
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    fn authorize<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => req.header("Authorization", format!("Bearer {t}")),
            None => req,
        }
    }

    pub fn get(&self, path: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        self.authorize(self.agent.get(self.url(path)))
    }

    pub fn post(&self, path: &str) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        self.authorize(self.agent.post(self.url(path)))
    }

    pub fn delete(&self, path: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        self.authorize(self.agent.delete(self.url(path)))
    }
}
