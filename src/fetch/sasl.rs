//! SASL authentication to a source broker, sans-IO: SaslHandshake v1 names the mechanism, then
//! SaslAuthenticate requests carry the mechanism's messages (KIP-152), as ordinary Kafka
//! frames on the connection's own correlation ids.
//!
//! Mechanisms: PLAIN (RFC 4616, one round) and SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802 with
//! RFC 7677's hash; two rounds, and the server's signature is checked so a broker that does not
//! know the password cannot pass as the source). Like Kafka's own client, the password is used
//! as its UTF-8 bytes (no SASLprep) and channel binding is not used (`n,,`).

use std::fmt;

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use hmac::{Hmac, Mac};
use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sha2::{Digest, Sha256, Sha512};

use crate::fetch::conn::{ConnError, Connection};
use crate::limits::{SCRAM_ITERATIONS_MAX, SCRAM_ITERATIONS_MIN, SCRAM_NONCE_BYTES};

/// SaslHandshake v1: the mechanism exchange is wrapped in SaslAuthenticate requests. Every
/// broker since 1.0 speaks it and 4.x removed v0.
pub const SASL_HANDSHAKE_VERSION: i16 = 1;
/// SaslAuthenticate v0: every broker since 1.0 speaks it and 4.x kept it. (v1 adds a session
/// lifetime that asks for re-authentication; kmirror instead reconnects when a broker closes
/// an expired session.)
pub const SASL_AUTHENTICATE_VERSION: i16 = 0;

/// The SASL mechanisms kmirror's source client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A SASL identity. `Debug` never prints the password.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Credentials {
    pub mechanism: Mechanism,
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why SASL did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SaslError {
    /// The broker refused the credentials, or proved it does not know them: retrying with the
    /// same settings cannot help.
    #[error("authentication failed: {0}")]
    Rejected(String),
    #[error("authentication failed: the source does not enable {wanted} (it offers {offered})")]
    MechanismNotOffered { wanted: Mechanism, offered: String },
    #[error("SASL exchange broke: {0}")]
    Protocol(String),
    #[error(transparent)]
    Conn(#[from] ConnError),
}

impl SaslError {
    /// Whether the failure is about the credentials or the source's security settings (and so
    /// not worth retrying), as opposed to a broken connection.
    pub fn is_authentication(&self) -> bool {
        matches!(
            self,
            SaslError::Rejected(_) | SaslError::MechanismNotOffered { .. }
        )
    }
}

/// What the exchange wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslStep {
    /// A request was framed into the output buffer; send it and hand back its response.
    Sent,
    /// Authenticated: the connection may carry ordinary requests now.
    Done,
}

#[derive(Debug)]
enum Phase {
    Idle,
    Handshake,
    Plain,
    ScramFirst(ScramClient),
    ScramFinal { server_signature: Vec<u8> },
    Done,
}

/// One authentication on one connection.
#[derive(Debug)]
pub struct SaslExchange {
    credentials: Credentials,
    phase: Phase,
}

impl SaslExchange {
    pub fn new(credentials: Credentials) -> SaslExchange {
        SaslExchange {
            credentials,
            phase: Phase::Idle,
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Frames the SaslHandshake request into `out`.
    pub fn start(&mut self, conn: &mut Connection, out: &mut BytesMut) -> Result<(), SaslError> {
        let mut req = SaslHandshakeRequest::default();
        req.mechanism = StrBytes::from_static_str(self.credentials.mechanism.name());
        conn.encode(out, SASL_HANDSHAKE_VERSION, &req)?;
        self.phase = Phase::Handshake;
        Ok(())
    }

    /// Handles the response to the last request and frames the next one, if any.
    pub fn on_response(
        &mut self,
        conn: &mut Connection,
        frame: Bytes,
        out: &mut BytesMut,
    ) -> Result<SaslStep, SaslError> {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Handshake => {
                let resp = conn.decode::<SaslHandshakeRequest>(frame)?;
                if resp.error_code != 0 {
                    let offered: Vec<&str> = resp.mechanisms.iter().map(|m| m.as_str()).collect();
                    return Err(SaslError::MechanismNotOffered {
                        wanted: self.credentials.mechanism,
                        offered: if offered.is_empty() {
                            format!("nothing; error code {}", resp.error_code)
                        } else {
                            offered.join(", ")
                        },
                    });
                }
                let c = &self.credentials;
                if c.mechanism == Mechanism::Plain {
                    let mut msg = Vec::with_capacity(2 + c.username.len() + c.password.len());
                    msg.push(0);
                    msg.extend_from_slice(c.username.as_bytes());
                    msg.push(0);
                    msg.extend_from_slice(c.password.as_bytes());
                    self.authenticate(conn, out, msg)?;
                    self.phase = Phase::Plain;
                } else {
                    let scram = ScramClient::new(c.mechanism, &c.username, random_nonce());
                    let first = scram.client_first();
                    self.authenticate(conn, out, first.into_bytes())?;
                    self.phase = Phase::ScramFirst(scram);
                }
                Ok(SaslStep::Sent)
            }
            Phase::Plain => {
                self.auth_bytes(conn, frame)?;
                self.phase = Phase::Done;
                Ok(SaslStep::Done)
            }
            Phase::ScramFirst(scram) => {
                let server_first = self.auth_bytes(conn, frame)?;
                let server_first = std::str::from_utf8(&server_first)
                    .map_err(|_| SaslError::Protocol("server-first-message is not UTF-8".into()))?;
                let fin = scram.client_final(server_first, &self.credentials.password)?;
                self.authenticate(conn, out, fin.message.into_bytes())?;
                self.phase = Phase::ScramFinal {
                    server_signature: fin.server_signature,
                };
                Ok(SaslStep::Sent)
            }
            Phase::ScramFinal { server_signature } => {
                let server_final = self.auth_bytes(conn, frame)?;
                verify_server_final(&server_final, &server_signature)?;
                self.phase = Phase::Done;
                Ok(SaslStep::Done)
            }
            Phase::Idle | Phase::Done => Err(SaslError::Protocol(
                "a SASL response arrived with no SASL request outstanding".into(),
            )),
        }
    }

    fn authenticate(
        &self,
        conn: &mut Connection,
        out: &mut BytesMut,
        bytes: Vec<u8>,
    ) -> Result<(), SaslError> {
        let mut req = SaslAuthenticateRequest::default();
        req.auth_bytes = Bytes::from(bytes);
        conn.encode(out, SASL_AUTHENTICATE_VERSION, &req)?;
        Ok(())
    }

    /// The mechanism bytes of a SaslAuthenticate response, or the broker's refusal.
    fn auth_bytes(&self, conn: &mut Connection, frame: Bytes) -> Result<Bytes, SaslError> {
        let resp = conn.decode::<SaslAuthenticateRequest>(frame)?;
        if resp.error_code != 0 {
            let name = ResponseError::try_from_code(resp.error_code).map_or_else(
                || format!("error code {}", resp.error_code),
                |e| format!("{e:?}"),
            );
            let detail = resp
                .error_message
                .as_ref()
                .map_or(String::new(), |m| format!(": {}", m.as_str()));
            return Err(SaslError::Rejected(format!(
                "{} as {:?}: {name}{detail}",
                self.credentials.mechanism, self.credentials.username
            )));
        }
        Ok(resp.auth_bytes)
    }
}

fn random_nonce() -> String {
    let mut raw = [0u8; SCRAM_NONCE_BYTES];
    rand::Rng::fill(&mut rand::thread_rng(), &mut raw[..]);
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw)
}

/// RFC 5802 `saslname`: `=` and `,` are escaped.
pub(crate) fn sasl_name(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

pub(crate) fn hmac(mech: Mechanism, key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length, so new_from_slice cannot fail.
    match mech {
        Mechanism::ScramSha512 => {
            let mut m = Hmac::<Sha512>::new_from_slice(key).expect("HMAC takes any key length");
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        _ => {
            let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
    }
}

pub(crate) fn hash(mech: Mechanism, data: &[u8]) -> Vec<u8> {
    match mech {
        Mechanism::ScramSha512 => Sha512::digest(data).to_vec(),
        _ => Sha256::digest(data).to_vec(),
    }
}

/// RFC 5802 `Hi()`: PBKDF2 with HMAC of the mechanism's hash.
pub(crate) fn salted_password(
    mech: Mechanism,
    password: &str,
    salt: &[u8],
    iterations: u32,
) -> Vec<u8> {
    match mech {
        Mechanism::ScramSha512 => {
            let mut out = vec![0u8; 64];
            pbkdf2::pbkdf2_hmac::<Sha512>(password.as_bytes(), salt, iterations, &mut out);
            out
        }
        _ => {
            let mut out = vec![0u8; 32];
            pbkdf2::pbkdf2_hmac::<Sha256>(password.as_bytes(), salt, iterations, &mut out);
            out
        }
    }
}

/// The client side of one SCRAM exchange.
#[derive(Debug)]
pub(crate) struct ScramClient {
    mechanism: Mechanism,
    nonce: String,
    first_bare: String,
}

pub(crate) struct ClientFinal {
    pub(crate) message: String,
    pub(crate) server_signature: Vec<u8>,
}

impl ScramClient {
    pub(crate) fn new(mechanism: Mechanism, username: &str, nonce: String) -> ScramClient {
        let first_bare = format!("n={},r={nonce}", sasl_name(username));
        ScramClient {
            mechanism,
            nonce,
            first_bare,
        }
    }

    pub(crate) fn client_first(&self) -> String {
        format!("n,,{}", self.first_bare)
    }

    pub(crate) fn client_final(
        &self,
        server_first: &str,
        password: &str,
    ) -> Result<ClientFinal, SaslError> {
        let bad = |m: &str| SaslError::Protocol(format!("server-first-message {m}"));
        if let Some(err) = server_first.strip_prefix("e=") {
            return Err(SaslError::Rejected(err.to_owned()));
        }
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for attr in server_first.split(',') {
            match attr.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = Some(v),
                Some(("i", v)) => iterations = Some(v),
                Some(("m", _)) => return Err(bad("asks for an extension we do not know")),
                _ => {}
            }
        }
        let nonce = nonce.ok_or_else(|| bad("has no nonce"))?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(bad("does not extend our nonce"));
        }
        let salt = base64::engine::general_purpose::STANDARD
            .decode(salt.ok_or_else(|| bad("has no salt"))?)
            .map_err(|_| bad("has a salt that is not base64"))?;
        let iterations: u32 = iterations
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| bad("has no iteration count"))?;
        if !(SCRAM_ITERATIONS_MIN..=SCRAM_ITERATIONS_MAX).contains(&iterations) {
            return Err(bad(&format!(
                "asks for {iterations} iterations (we accept {SCRAM_ITERATIONS_MIN}..={SCRAM_ITERATIONS_MAX})"
            )));
        }
        let m = self.mechanism;
        let salted = salted_password(m, password, &salt, iterations);
        let client_key = hmac(m, &salted, b"Client Key");
        let stored_key = hash(m, &client_key);
        // "biws" is base64("n,,"): no channel binding.
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.first_bare);
        let client_signature = hmac(m, &stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&client_signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = hmac(m, &salted, b"Server Key");
        let server_signature = hmac(m, &server_key, auth_message.as_bytes());
        Ok(ClientFinal {
            message: format!(
                "{without_proof},p={}",
                base64::engine::general_purpose::STANDARD.encode(proof)
            ),
            server_signature,
        })
    }
}

fn verify_server_final(server_final: &[u8], expected: &[u8]) -> Result<(), SaslError> {
    let text = std::str::from_utf8(server_final)
        .map_err(|_| SaslError::Protocol("server-final-message is not UTF-8".into()))?;
    if let Some(err) = text.strip_prefix("e=") {
        return Err(SaslError::Rejected(err.to_owned()));
    }
    let sig = text
        .split(',')
        .find_map(|a| a.strip_prefix("v="))
        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
        .ok_or_else(|| SaslError::Protocol("server-final-message has no verifier".into()))?;
    if sig != expected {
        return Err(SaslError::Rejected(
            "the source's SCRAM signature is wrong: it does not know this user's credentials"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7677 §3 gives a complete SCRAM-SHA-256 exchange; our messages must match it
    // byte for byte, and its server signature must verify.
    #[test]
    fn scram_sha_256_matches_rfc_7677() {
        let c = ScramClient::new(
            Mechanism::ScramSha256,
            "user",
            "rOprNGfwEbeRWgbNEkqO".to_owned(),
        );
        assert_eq!(c.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                            s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let fin = c.client_final(server_first, "pencil").unwrap();
        assert_eq!(
            fin.message,
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        verify_server_final(
            b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
            &fin.server_signature,
        )
        .unwrap();
        let forged = verify_server_final(
            b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
            &fin.server_signature,
        );
        assert!(matches!(forged, Err(SaslError::Rejected(_))));
    }

    #[test]
    fn hostile_server_first_messages_are_refused() {
        let c = ScramClient::new(Mechanism::ScramSha512, "a=b,c", "abc".to_owned());
        assert_eq!(c.client_first(), "n,,n=a=3Db=2Cc,r=abc");
        for (msg, want) in [
            ("r=xyz123,s=AAAA,i=4096", "does not extend our nonce"),
            ("r=abc,s=AAAA,i=4096", "does not extend our nonce"),
            ("r=abcd,s=!!,i=4096", "not base64"),
            ("r=abcd,s=AAAA,i=10", "iterations"),
            ("r=abcd,s=AAAA,i=99999999", "iterations"),
            ("r=abcd,s=AAAA", "no iteration count"),
            ("m=ext,r=abcd,s=AAAA,i=4096", "extension"),
        ] {
            let err = c.client_final(msg, "pw").err().unwrap().to_string();
            assert!(err.contains(want), "{msg}: {err}");
        }
        assert!(matches!(
            c.client_final("e=unknown-user", "pw"),
            Err(SaslError::Rejected(_))
        ));
    }

    #[test]
    fn credentials_debug_hides_the_password() {
        let c = Credentials {
            mechanism: Mechanism::Plain,
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
