//! Server-side SASL on the Kafka endpoint (KIP-43/KIP-152 framing, KIP-368 re-authentication):
//! a client on a SASL listener must complete SaslHandshake + SaslAuthenticate before anything
//! but ApiVersions is served; its connection's `Session` then carries `User:<name>`.
//!
//! | module | job |
//! |---|---|
//! | `gate` | per-connection state machine in front of the dispatcher (sans-IO) |
//! | `scram` | SCRAM-SHA-256/512 server exchange and message parsing (sans-IO) |
//! | `plain` | PLAIN message parsing and check (sans-IO) |
//!
//! Configuration is `[kafka.sasl]`; until named listeners exist, its presence makes the single
//! `[kafka]` listener a SASL_PLAINTEXT one.

pub mod gate;
pub mod plain;
pub mod scram;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use serde::Deserialize;

use crate::config::ConfigError;
use crate::fetch::sasl::Mechanism;
use crate::limits::{SASL_REAUTH_MS_DEFAULT, SASL_REAUTH_MS_MIN};
use crate::serve::credentials::apis::{AlterScramApi, DescribeQuotasApi, DescribeScramApi};
use crate::serve::credentials::{PlainUsers, ScramStore};
use crate::serve::dispatch::{ApiHandler, Dispatcher, Outcome, Request};
use crate::serve::ServeError;

pub use gate::ConnAuth;

/// Kafka's ILLEGAL_SASL_STATE.
pub const ILLEGAL_SASL_STATE: i16 = 34;
/// Kafka's UNSUPPORTED_SASL_MECHANISM.
pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
/// Kafka's SASL_AUTHENTICATION_FAILED.
pub const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// `[kafka.sasl]`: the server side of SASL.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaslSection {
    /// Kafka's `sasl.enabled.mechanisms`: any of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512.
    #[serde(default = "default_mechanisms")]
    pub enabled_mechanisms: Vec<String>,
    /// PLAIN users (`name = "password"` lines); required when PLAIN is enabled; must be 0600.
    #[serde(default)]
    pub plain_users_file: Option<PathBuf>,
    /// The SCRAM credential store; `<storage.data_dir>/scram-credentials.json` by default.
    #[serde(default)]
    pub scram_credentials_file: Option<PathBuf>,
    /// Kafka's `connections.max.reauth.ms`: 0 never expires a session; otherwise a client
    /// must re-authenticate within this (KIP-368) or its connection is closed.
    #[serde(default = "default_reauth_ms")]
    pub connections_max_reauth_ms: u64,
}

fn default_mechanisms() -> Vec<String> {
    vec!["SCRAM-SHA-512".into(), "SCRAM-SHA-256".into()]
}

fn default_reauth_ms() -> u64 {
    SASL_REAUTH_MS_DEFAULT
}

fn parse_mechanism(name: &str) -> Option<Mechanism> {
    [
        Mechanism::Plain,
        Mechanism::ScramSha256,
        Mechanism::ScramSha512,
    ]
    .into_iter()
    .find(|m| m.name() == name)
}

impl SaslSection {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, why: String| ConfigError::Invalid { key, why };
        if self.enabled_mechanisms.is_empty() {
            return Err(invalid(
                "kafka.sasl.enabled_mechanisms",
                "must name at least one mechanism".into(),
            ));
        }
        for m in &self.enabled_mechanisms {
            if parse_mechanism(m).is_none() {
                return Err(invalid(
                    "kafka.sasl.enabled_mechanisms",
                    format!("{m:?} is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
                ));
            }
        }
        if self.enabled_mechanisms.iter().any(|m| m == "PLAIN") && self.plain_users_file.is_none() {
            return Err(invalid(
                "kafka.sasl.plain_users_file",
                "required when PLAIN is enabled".into(),
            ));
        }
        let r = self.connections_max_reauth_ms;
        if r != 0 && r < SASL_REAUTH_MS_MIN {
            return Err(invalid(
                "kafka.sasl.connections_max_reauth_ms",
                format!("must be 0 (off) or at least {SASL_REAUTH_MS_MIN}"),
            ));
        }
        Ok(())
    }
}

/// What every SASL connection shares: enabled mechanisms, the credentials, the session
/// lifetime.
#[derive(Debug)]
pub struct SaslServer {
    pub mechanisms: Vec<Mechanism>,
    pub scram: Arc<ScramStore>,
    pub plain: PlainUsers,
    /// `connections.max.reauth.ms`, 0 = sessions do not expire.
    pub reauth_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SaslSetupError {
    #[error(transparent)]
    Scram(#[from] crate::serve::credentials::scram_store::StoreError),
    #[error(transparent)]
    Plain(#[from] crate::serve::credentials::plain_users::PlainUsersError),
}

impl SaslServer {
    /// Loads the credentials `section` names (the SCRAM store under `data_dir` by default).
    pub fn open(section: &SaslSection, data_dir: &Path) -> Result<SaslServer, SaslSetupError> {
        let scram_path = section
            .scram_credentials_file
            .clone()
            .unwrap_or_else(|| data_dir.join("scram-credentials.json"));
        let scram = Arc::new(ScramStore::open(&scram_path)?);
        let plain = match &section.plain_users_file {
            Some(p) => PlainUsers::load(p)?,
            None => PlainUsers::default(),
        };
        let mechanisms = section
            .enabled_mechanisms
            .iter()
            .filter_map(|m| parse_mechanism(m))
            .collect();
        tracing::info!(
            mechanisms = ?section.enabled_mechanisms,
            scram_credentials = scram.len(),
            plain_users = plain.len(),
            reauth_ms = section.connections_max_reauth_ms,
            "SASL enabled on the Kafka listener"
        );
        Ok(SaslServer {
            mechanisms,
            scram,
            plain,
            reauth_ms: section.connections_max_reauth_ms,
        })
    }

    /// Registers the SASL and credential APIs and makes `d` hand this server to its
    /// connections' gates.
    pub fn register(self: &Arc<Self>, d: &mut Dispatcher) {
        register_sasl_apis(d);
        d.register(
            ApiKey::AlterUserScramCredentials,
            0,
            0,
            Arc::new(AlterScramApi {
                store: Arc::clone(&self.scram),
            }),
        );
        d.register(
            ApiKey::DescribeUserScramCredentials,
            0,
            0,
            Arc::new(DescribeScramApi {
                store: Arc::clone(&self.scram),
            }),
        );
        d.register(
            ApiKey::DescribeClientQuotas,
            0,
            1,
            Arc::new(DescribeQuotasApi),
        );
        d.set_sasl(Arc::clone(self));
    }

    pub fn mechanism_names(&self) -> Vec<&'static str> {
        self.mechanisms.iter().map(|m| m.name()).collect()
    }
}

/// SaslHandshake v1 and SaslAuthenticate v0–2 as the dispatcher serves them: only requests
/// that did not go through a gate (a plaintext listener, or after authentication without
/// re-authentication) reach these, and Kafka's request handler answers them with
/// ILLEGAL_SASL_STATE. Registered so that ApiVersions advertises them.
pub fn register_sasl_apis(d: &mut Dispatcher) {
    d.register(ApiKey::SaslHandshake, 1, 1, Arc::new(AfterAuthentication));
    d.register(
        ApiKey::SaslAuthenticate,
        0,
        2,
        Arc::new(AfterAuthentication),
    );
}

#[derive(Debug)]
struct AfterAuthentication;

impl ApiHandler for AfterAuthentication {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        if req.api_key == ApiKey::SaslHandshake {
            let _: SaslHandshakeRequest = req.decode()?;
            let mut resp = SaslHandshakeResponse::default();
            resp.error_code = ILLEGAL_SASL_STATE;
            return Outcome::encode(req, &resp);
        }
        let _: kafka_protocol::messages::SaslAuthenticateRequest = req.decode()?;
        let mut resp = SaslAuthenticateResponse::default();
        resp.error_code = ILLEGAL_SASL_STATE;
        resp.error_message = Some(kafka_protocol::protocol::StrBytes::from_static_str(
            "SaslAuthenticate request received after successful authentication",
        ));
        Outcome::encode(req, &resp)
    }
}
