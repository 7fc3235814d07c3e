//! The server side of SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802 with RFC 7677's hash), as
//! Kafka's `ScramSaslServer` runs it: client-first → server-first (salt, iterations, our nonce
//! appended to the client's), client-final → server-final (our signature), no channel binding.
//! Sans-IO: the caller looks the user up and supplies the server nonce.
//!
//! Failures are typed so the gate can answer as Kafka does: only a different authorization id
//! is told to the client in so many words; everything else (unknown user, bad proof, a
//! malformed message) gets Kafka's generic "invalid credentials" text, which names nothing
//! about the user.

use base64::Engine as _;

use crate::fetch::sasl::{hash, hmac, Mechanism};
use crate::limits::{SASL_USERNAME_BYTES_MAX, SCRAM_ITERATIONS_MAX, SCRAM_ITERATIONS_MIN};
use crate::serve::credentials::ScramCredential;

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// A message that does not follow RFC 5802's grammar (Kafka: `SaslException`).
    #[error("malformed SCRAM message: {0}")]
    Malformed(String),
    /// The client asked to act as someone else (Kafka tells the client this text).
    #[error("Authentication failed: Client requested an authorization id that is different from username")]
    AuthzidMismatch,
    /// No credential for this user and mechanism.
    #[error("unknown user")]
    UnknownUser,
    /// Delegation tokens (`tokenauth=true`) are not issued by kmirror.
    #[error("delegation token authentication is not supported")]
    TokenAuth,
    /// The final message does not carry the nonce of this exchange.
    #[error("Invalid client nonce in the final client message.")]
    BadNonce,
    /// The proof does not match the stored key: wrong password.
    #[error("Invalid client credentials")]
    BadProof,
    /// A message after the exchange ended.
    #[error("unexpected SCRAM message in state {0}")]
    State(&'static str),
}

impl ScramError {
    /// The text Kafka sends the client for this failure, if it is not the generic one.
    pub fn client_message(&self) -> Option<String> {
        matches!(self, ScramError::AuthzidMismatch).then(|| self.to_string())
    }
}

/// A parsed `client-first-message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFirst {
    /// `a=` of the GS2 header, empty when absent.
    pub authzid: String,
    /// The user, `saslname` unescaped.
    pub username: String,
    pub nonce: String,
    /// `n=…,r=…[,ext…]`: the part that enters the AuthMessage.
    pub bare: String,
    /// `tokenauth=true` among the extensions.
    pub token_auth: bool,
    /// The GS2 header (`n,,` / `n,a=x,`), which `c=` of the final message must repeat.
    pub gs2_header: String,
}

/// A parsed `client-final-message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFinal {
    /// `c=`, decoded.
    pub channel_binding: Vec<u8>,
    pub nonce: String,
    /// Everything before `,p=`: the part that enters the AuthMessage.
    pub without_proof: String,
    pub proof: Vec<u8>,
}

fn malformed(why: impl Into<String>) -> ScramError {
    ScramError::Malformed(why.into())
}

/// RFC 5802 `saslname` → user name: `=2C` is `,` and `=3D` is `=`; any other `=` is invalid.
pub fn unescape_sasl_name(name: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        let esc = rest.get(i..i + 3);
        match esc {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(malformed("invalid '=' escape in user name")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A nonce is printable ASCII other than `,` (RFC 5802 `printable`).
fn valid_nonce(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

pub fn parse_client_first(msg: &[u8]) -> Result<ClientFirst, ScramError> {
    let text = std::str::from_utf8(msg).map_err(|_| malformed("client-first is not UTF-8"))?;
    // gs2-header: "n," (no channel binding; kmirror, like Kafka, offers none) then [a=authzid] ","
    let rest = text
        .strip_prefix("n,")
        .ok_or_else(|| malformed("client-first must start with the GS2 flag 'n,'"))?;
    let (authz, bare) = rest
        .split_once(',')
        .ok_or_else(|| malformed("client-first has no GS2 header end"))?;
    let authzid = match authz {
        "" => String::new(),
        a => unescape_sasl_name(
            a.strip_prefix("a=")
                .ok_or_else(|| malformed("GS2 authzid must be 'a=…'"))?,
        )?,
    };
    let gs2_header = format!("n,{authz},");
    let mut attrs = bare.split(',');
    let user = attrs
        .next()
        .and_then(|a| a.strip_prefix("n="))
        .ok_or_else(|| malformed("client-first has no user name"))?;
    if user.len() > SASL_USERNAME_BYTES_MAX {
        return Err(malformed("user name too long"));
    }
    let username = unescape_sasl_name(user)?;
    if username.is_empty() {
        return Err(malformed("empty user name"));
    }
    let nonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .ok_or_else(|| malformed("client-first has no nonce"))?;
    if !valid_nonce(nonce) {
        return Err(malformed("client nonce is empty or not printable"));
    }
    let mut token_auth = false;
    for ext in attrs {
        let (k, v) = ext
            .split_once('=')
            .ok_or_else(|| malformed("extension is not key=value"))?;
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(malformed("extension key is not alphanumeric"));
        }
        if k == "tokenauth" && v.eq_ignore_ascii_case("true") {
            token_auth = true;
        }
    }
    Ok(ClientFirst {
        authzid,
        username,
        nonce: nonce.to_owned(),
        bare: bare.to_owned(),
        token_auth,
        gs2_header,
    })
}

pub fn parse_client_final(msg: &[u8]) -> Result<ClientFinal, ScramError> {
    let text = std::str::from_utf8(msg).map_err(|_| malformed("client-final is not UTF-8"))?;
    let (without_proof, proof) = text
        .rsplit_once(",p=")
        .ok_or_else(|| malformed("client-final has no proof"))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let proof = b64
        .decode(proof)
        .map_err(|_| malformed("proof is not base64"))?;
    let mut attrs = without_proof.split(',');
    let channel_binding = attrs
        .next()
        .and_then(|a| a.strip_prefix("c="))
        .ok_or_else(|| malformed("client-final has no channel binding"))?;
    let channel_binding = b64
        .decode(channel_binding)
        .map_err(|_| malformed("channel binding is not base64"))?;
    let nonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .ok_or_else(|| malformed("client-final has no nonce"))?;
    Ok(ClientFinal {
        channel_binding,
        nonce: nonce.to_owned(),
        without_proof: without_proof.to_owned(),
        proof,
    })
}

/// What the exchange answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScramStep {
    /// The server-first-message; the client's final message comes next.
    Challenge(Vec<u8>),
    /// Authenticated as `username`; send `server_final` (our signature) and finish.
    Done {
        username: String,
        server_final: Vec<u8>,
    },
}

#[derive(Debug)]
enum Phase {
    First,
    Final(Box<Pending>),
    Ended,
}

/// What the final message is checked against.
#[derive(Debug)]
struct Pending {
    first: ClientFirst,
    server_first: String,
    nonce: String,
    credential: ScramCredential,
}

/// One SCRAM exchange on one connection.
#[derive(Debug)]
pub struct ScramServer {
    mechanism: Mechanism,
    phase: Phase,
}

impl ScramServer {
    pub fn new(mechanism: Mechanism) -> ScramServer {
        assert!(
            mechanism != Mechanism::Plain,
            "PLAIN is not a SCRAM mechanism"
        );
        ScramServer {
            mechanism,
            phase: Phase::First,
        }
    }

    /// Handles the client's next message. `lookup` finds the stored credential of a user;
    /// `server_nonce` is fresh randomness (printable, no `,`). Any error ends the exchange.
    pub fn evaluate(
        &mut self,
        msg: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
        server_nonce: &str,
    ) -> Result<ScramStep, ScramError> {
        match std::mem::replace(&mut self.phase, Phase::Ended) {
            Phase::First => {
                let first = parse_client_first(msg)?;
                if first.token_auth {
                    return Err(ScramError::TokenAuth);
                }
                let credential = lookup(&first.username).ok_or(ScramError::UnknownUser)?;
                if !first.authzid.is_empty() && first.authzid != first.username {
                    return Err(ScramError::AuthzidMismatch);
                }
                if !(SCRAM_ITERATIONS_MIN..=SCRAM_ITERATIONS_MAX).contains(&credential.iterations) {
                    return Err(malformed(
                        "stored credential has an invalid iteration count",
                    ));
                }
                debug_assert!(valid_nonce(server_nonce));
                let nonce = format!("{}{server_nonce}", first.nonce);
                let server_first = format!(
                    "r={nonce},s={},i={}",
                    base64::engine::general_purpose::STANDARD.encode(&credential.salt),
                    credential.iterations
                );
                let challenge = server_first.clone().into_bytes();
                self.phase = Phase::Final(Box::new(Pending {
                    first,
                    server_first,
                    nonce,
                    credential,
                }));
                Ok(ScramStep::Challenge(challenge))
            }
            Phase::Final(pending) => {
                let Pending {
                    first,
                    server_first,
                    nonce,
                    credential,
                } = *pending;
                let fin = parse_client_final(msg)?;
                if fin.nonce != nonce {
                    return Err(ScramError::BadNonce);
                }
                if fin.channel_binding != first.gs2_header.as_bytes() {
                    return Err(malformed("channel binding does not repeat the GS2 header"));
                }
                let m = self.mechanism;
                let auth_message = format!("{},{server_first},{}", first.bare, fin.without_proof);
                let client_signature = hmac(m, &credential.stored_key, auth_message.as_bytes());
                if fin.proof.len() != client_signature.len() {
                    return Err(ScramError::BadProof);
                }
                let client_key: Vec<u8> = fin
                    .proof
                    .iter()
                    .zip(&client_signature)
                    .map(|(p, s)| p ^ s)
                    .collect();
                if !constant_time_eq(&hash(m, &client_key), &credential.stored_key) {
                    return Err(ScramError::BadProof);
                }
                let server_signature = hmac(m, &credential.server_key, auth_message.as_bytes());
                Ok(ScramStep::Done {
                    username: first.username,
                    server_final: format!(
                        "v={}",
                        base64::engine::general_purpose::STANDARD.encode(server_signature)
                    )
                    .into_bytes(),
                })
            }
            Phase::Ended => Err(ScramError::State("ended")),
        }
    }
}

/// Compares without an early exit, so timing says nothing about where keys differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A fresh server nonce: 24 random bytes, base64 (printable, never `,`).
pub fn random_nonce() -> String {
    let mut raw = [0u8; crate::limits::SCRAM_NONCE_BYTES];
    rand::Rng::fill(&mut rand::thread_rng(), &mut raw[..]);
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::sasl::ScramClient;

    fn rfc_credential() -> ScramCredential {
        let salt = base64::engine::general_purpose::STANDARD
            .decode("W22ZaJ0SNY7soEsUEjb6gQ==")
            .unwrap();
        ScramCredential::from_password(Mechanism::ScramSha256, "pencil", salt, 4096)
    }

    // RFC 7677 §3: with the RFC's nonces, salt and password our server-first and
    // server-final are the RFC's bytes, and the RFC's client proof is accepted.
    #[test]
    fn scram_sha_256_server_matches_rfc_7677() {
        let mut s = ScramServer::new(Mechanism::ScramSha256);
        let step = s
            .evaluate(
                b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
                |u| (u == "user").then(rfc_credential),
                "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
            )
            .unwrap();
        assert_eq!(
            step,
            ScramStep::Challenge(
                b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
                    .to_vec()
            )
        );
        let step = s
            .evaluate(
                b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
                |_| unreachable!("looked up once"),
                "unused",
            )
            .unwrap();
        assert_eq!(
            step,
            ScramStep::Done {
                username: "user".into(),
                server_final: b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_vec()
            }
        );
    }

    fn run(
        mech: Mechanism,
        stored: &ScramCredential,
        user: &str,
        password: &str,
    ) -> Result<String, ScramError> {
        let client = ScramClient::new(mech, user, "clientnonce123".into());
        let mut s = ScramServer::new(mech);
        let ScramStep::Challenge(first) = s.evaluate(
            client.client_first().as_bytes(),
            |_| Some(stored.clone()),
            "servernonce",
        )?
        else {
            panic!("first step ends nothing")
        };
        let fin = client
            .client_final(std::str::from_utf8(&first).unwrap(), password)
            .unwrap();
        match s.evaluate(fin.message.as_bytes(), |_| None, "x")? {
            ScramStep::Done {
                username,
                server_final,
            } => {
                let b64 = base64::engine::general_purpose::STANDARD;
                let v = std::str::from_utf8(&server_final).unwrap();
                assert_eq!(b64.decode(&v[2..]).unwrap(), fin.server_signature);
                Ok(username)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sha_512_right_password_passes_and_wrong_one_fails() {
        let m = Mechanism::ScramSha512;
        let cred = ScramCredential::from_password(m, "alice-secret", b"salty".to_vec(), 4096);
        assert_eq!(run(m, &cred, "a,l=ice", "alice-secret").unwrap(), "a,l=ice");
        assert_eq!(run(m, &cred, "alice", "wrong"), Err(ScramError::BadProof));
    }

    #[test]
    fn hostile_client_messages_fail_with_a_typed_error() {
        let cred = rfc_credential();
        for (first, want) in [
            (&b"y,,n=user,r=abc"[..], "GS2"),
            (b"n,,r=abc", "user name"),
            (b"n,,n=us=er,r=abc", "escape"),
            (b"n,,n=user", "nonce"),
            (b"n,,n=user,r=a b", "nonce"),
            (b"n,x,n=user,r=abc", "authzid"),
            (b"n,,n=,r=abc", "empty"),
            (b"n,,n=user,r=abc,noequals", "extension"),
            (b"\xff", "UTF-8"),
        ] {
            let mut s = ScramServer::new(Mechanism::ScramSha256);
            let err = s.evaluate(first, |_| Some(cred.clone()), "n").unwrap_err();
            assert!(err.to_string().contains(want), "{first:?}: {err}");
            // The exchange is over after a failure.
            assert_eq!(
                s.evaluate(b"n,,n=user,r=abc", |_| Some(cred.clone()), "n"),
                Err(ScramError::State("ended"))
            );
        }
        let mut s = ScramServer::new(Mechanism::ScramSha256);
        assert_eq!(
            s.evaluate(b"n,a=bob,n=user,r=abc", |_| Some(cred.clone()), "n"),
            Err(ScramError::AuthzidMismatch)
        );
        let mut s = ScramServer::new(Mechanism::ScramSha256);
        assert_eq!(
            s.evaluate(b"n,,n=ghost,r=abc", |_| None, "n"),
            Err(ScramError::UnknownUser)
        );
        let mut s = ScramServer::new(Mechanism::ScramSha256);
        assert_eq!(
            s.evaluate(
                b"n,,n=user,r=abc,tokenauth=true",
                |_| Some(cred.clone()),
                "n"
            ),
            Err(ScramError::TokenAuth)
        );
        // A final message with another nonce, a short proof, or a different channel binding.
        for (fin, want) in [
            (&b"c=biws,r=abcX,p=AAAA"[..], ScramError::BadNonce),
            (b"c=biws,r=abcn,p=AAAA", ScramError::BadProof),
            (
                b"c=eSws,r=abcn,p=AAAA",
                malformed("channel binding does not repeat the GS2 header"),
            ),
            (b"c=biws,r=abcn", malformed("client-final has no proof")),
        ] {
            let mut s = ScramServer::new(Mechanism::ScramSha256);
            s.evaluate(b"n,,n=user,r=abc", |_| Some(cred.clone()), "n")
                .unwrap();
            assert_eq!(s.evaluate(fin, |_| None, "n"), Err(want));
        }
    }
}
