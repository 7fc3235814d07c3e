//! Who may talk to the admin API: a bearer token read from a 0600 file, and a Host-header
//! check against DNS rebinding.
//!
//! The admin API can delete mirrors and fail partitions over, so anything that can reach it
//! must be the operator. On loopback without a token that is whoever is on the host, as
//! before; any other bind address needs `[admin] token_file`. A web page the operator opens
//! can make the browser send requests to 127.0.0.1 under a name the attacker's DNS points
//! there (DNS rebinding): such requests carry the attacker's name in `Host`, so only IP
//! literals, `localhost` and the names in `allowed_hosts` are served.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sha2::{Digest, Sha256};

use crate::control::admin::ErrorBody;
use crate::limits::ADMIN_TOKEN_CHARS_MIN;

/// Why the guard's settings cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GuardError {
    #[error("cannot read the admin token file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error(
        "the admin token file {path} is readable by others (mode {mode:o}): chmod 600 it, a \
         token anyone on the host can read protects nothing"
    )]
    Exposed { path: String, mode: u32 },
    #[error(
        "the admin token in {path} has {chars} characters; at least {ADMIN_TOKEN_CHARS_MIN} are \
         required (e.g. `openssl rand -hex 32 > {path}`)"
    )]
    Short { path: String, chars: usize },
}

/// Reads a secret from `path`: the file must not be readable by group or others; surrounding
/// whitespace (a trailing newline) is not part of it.
pub fn read_secret_file(path: &Path) -> Result<String, GuardError> {
    let shown = path.display().to_string();
    let read_err = |e: std::io::Error| GuardError::Read {
        path: shown.clone(),
        reason: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(read_err)?;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(GuardError::Exposed { path: shown, mode });
    }
    let text = std::fs::read_to_string(path).map_err(read_err)?;
    Ok(text.trim().to_owned())
}

/// The admin API's access rules, applied to every request.
#[derive(Clone, Default)]
pub struct AdminGuard {
    /// SHA-256 of the token; compared digest to digest so that the comparison's time says
    /// nothing about how much of a guess was right.
    token_digest: Option<[u8; 32]>,
    /// Host names served besides IP literals and `localhost`, lower case.
    allowed_hosts: Arc<Vec<String>>,
}

impl std::fmt::Debug for AdminGuard {
    // The digest is not the token, but nothing about it belongs in a log either.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminGuard")
            .field("token", &self.token_digest.map(|_| "<set>"))
            .field("allowed_hosts", &self.allowed_hosts)
            .finish()
    }
}

impl AdminGuard {
    /// No token; the Host check with `allowed_hosts`.
    pub fn open(allowed_hosts: &[String]) -> AdminGuard {
        AdminGuard {
            token_digest: None,
            allowed_hosts: Arc::new(allowed_hosts.iter().map(|h| h.to_lowercase()).collect()),
        }
    }

    /// Requires the token in `token_file` (see `read_secret_file`).
    pub fn with_token_file(
        token_file: &Path,
        allowed_hosts: &[String],
    ) -> Result<AdminGuard, GuardError> {
        let token = read_secret_file(token_file)?;
        let chars = token.chars().count();
        if chars < ADMIN_TOKEN_CHARS_MIN {
            return Err(GuardError::Short {
                path: token_file.display().to_string(),
                chars,
            });
        }
        Ok(AdminGuard {
            token_digest: Some(Sha256::digest(token.as_bytes()).into()),
            ..AdminGuard::open(allowed_hosts)
        })
    }

    pub fn requires_token(&self) -> bool {
        self.token_digest.is_some()
    }

    /// Whether a request with this `Host` header (absent: HTTP/1.0 or a raw client, which no
    /// browser sends) may be served.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        let Some(host) = host else {
            return true;
        };
        let name = strip_port(host.trim()).to_lowercase();
        name.parse::<std::net::IpAddr>().is_ok()
            || name == "localhost"
            || self.allowed_hosts.contains(&name)
    }

    /// Whether an `Authorization` header value carries the token (always, without one).
    pub fn authorized(&self, authorization: Option<&str>) -> bool {
        let Some(want) = &self.token_digest else {
            return true;
        };
        let Some(given) = authorization.and_then(|a| a.strip_prefix("Bearer ")) else {
            return false;
        };
        let got: [u8; 32] = Sha256::digest(given.trim().as_bytes()).into();
        // Fixed-length digests: fold every byte, no early exit.
        got.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// `host` without a trailing `:port`; IPv6 literals come bracketed (`[::1]:9190`).
fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    }
}

fn refuse(status: StatusCode, error: String) -> Response {
    let mut resp = (status, Json(ErrorBody { error })).into_response();
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"kmirror\""),
        );
    }
    resp
}

/// The middleware every admin route runs behind.
pub async fn check(State(guard): State<AdminGuard>, req: Request, next: Next) -> Response {
    // Owned copies: a borrow of the request (whose body is not Sync) must not live across
    // the await below.
    let (host, authorization) = {
        let text = |name: header::HeaderName| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        (text(header::HOST), text(header::AUTHORIZATION))
    };
    if !guard.host_allowed(host.as_deref()) {
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "Host {:?} is not served (DNS rebinding guard): use an IP address or localhost, \
                 or add the name to [admin] allowed_hosts",
                host.unwrap_or_default()
            ),
        );
    }
    if !guard.authorized(authorization.as_deref()) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "the admin API requires `Authorization: Bearer <token>` with the token of \
             [admin] token_file (kmirror mirrors --admin-token-file)"
                .into(),
        );
    }
    next.run(req).await
}

/// Where the admin API listens and how it is protected, from `[admin]`.
#[derive(Debug, Clone)]
pub struct AdminEndpoint {
    pub addr: std::net::SocketAddr,
    pub guard: AdminGuard,
    /// PEM certificate chain and key when the API is served over TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
}

impl AdminEndpoint {
    /// Plain HTTP on a loopback address, no token (tests and the default).
    pub fn loopback(addr: std::net::SocketAddr) -> AdminEndpoint {
        AdminEndpoint {
            addr,
            guard: AdminGuard::open(&[]),
            tls: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn token_file(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let p = dir.join("token");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn the_token_file_must_be_private_and_long_enough() {
        let d = tempfile::tempdir().unwrap();
        let long = "0123456789abcdef0123456789abcdef\n";
        let p = token_file(d.path(), long, 0o644);
        assert!(matches!(
            AdminGuard::with_token_file(&p, &[]),
            Err(GuardError::Exposed { mode: 0o644, .. })
        ));
        let p = token_file(d.path(), "short", 0o600);
        assert!(matches!(
            AdminGuard::with_token_file(&p, &[]),
            Err(GuardError::Short { chars: 5, .. })
        ));
        let p = token_file(d.path(), long, 0o600);
        let g = AdminGuard::with_token_file(&p, &[]).unwrap();
        assert!(g.requires_token());
        // The trailing newline is not part of the token; the Debug form shows no secret.
        assert!(g.authorized(Some("Bearer 0123456789abcdef0123456789abcdef")));
        assert!(!g.authorized(Some("Bearer 0123456789abcdef0123456789abcdeX")));
        assert!(!g.authorized(Some("0123456789abcdef0123456789abcdef")));
        assert!(!g.authorized(None));
        assert!(!format!("{g:?}").contains("0123"));
    }

    #[test]
    fn without_a_token_every_request_is_authorized() {
        let g = AdminGuard::open(&[]);
        assert!(!g.requires_token());
        assert!(g.authorized(None));
    }

    #[test]
    fn only_ip_literals_localhost_and_listed_names_pass_the_host_check() {
        let g = AdminGuard::open(&["Kmirror-DR.example".into()]);
        for ok in [
            None,
            Some("127.0.0.1:9190"),
            Some("[::1]:9190"),
            Some("localhost:9190"),
            Some("LOCALHOST"),
            Some("10.1.2.3"),
            Some("kmirror-dr.example:9190"),
        ] {
            assert!(g.host_allowed(ok), "{ok:?}");
        }
        for bad in [
            Some("attacker.example:9190"),
            Some("localhost.attacker.example"),
            Some("127.0.0.1.nip.io:9190"),
        ] {
            assert!(!g.host_allowed(bad), "{bad:?}");
        }
    }
}
