//! The per-connection SASL gate, in front of the dispatcher: on a listener whose protocol needs
//! SASL, until the client has authenticated only ApiVersions, SaslHandshake and
//! SaslAuthenticate are served and anything else closes the connection (as Kafka's
//! `SaslServerAuthenticator` does); on success the connection's `Session` becomes
//! `User:<name>`, authenticated.
//!
//! KIP-368: with `connections.max.reauth.ms` set, SaslAuthenticate v1+ tells the client its
//! session lifetime; a SaslHandshake on the authenticated connection starts a
//! re-authentication (same mechanism, same principal), and any other request after the
//! session expired closes the connection.
//!
//! Sans-IO: `dispatch_at` takes the times; the connection loop calls `dispatch` with the
//! instant the frame's last byte was read. A session's expiry is checked against that
//! instant, as Kafka's processor checks it on the completed receive: time a request then
//! waits for a handler thread is the server's, not the client's lateness.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Encodable, StrBytes};

use crate::fetch::sasl::Mechanism;
use crate::serve::dispatch::{
    decode_body, encode_body, split_header, Dispatcher, Outcome, Part, Response,
};
use crate::serve::sasl::plain;
use crate::serve::sasl::scram::{random_nonce, ScramServer, ScramStep};
use crate::serve::sasl::{SaslServer, SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM};
use crate::serve::session::{KafkaPrincipal, SecurityProtocol, Session};
use crate::serve::ServeError;

#[derive(Debug)]
enum Exchange {
    Plain,
    Scram(Box<ScramServer>),
}

#[derive(Debug)]
enum State {
    /// Waiting for ApiVersions or SaslHandshake (or, re-authenticating, SaslHandshake).
    Handshake,
    Authenticate {
        mechanism: Mechanism,
        exchange: Exchange,
    },
    Complete,
    /// An authentication failed and its answer went out: the next request closes.
    Failed(String),
}

/// One connection's authentication state.
#[derive(Debug)]
pub struct ConnAuth {
    server: Option<Arc<SaslServer>>,
    state: State,
    /// The mechanism and user of the last completed authentication (re-authentication must
    /// keep both).
    done: Option<(Mechanism, String)>,
    /// When the current session ends (KIP-368), if it does.
    expires_at: Option<Instant>,
    /// The client sent SaslAuthenticate v1+, so it knows to re-authenticate.
    client_reauthenticates: bool,
}

/// One authentication step: Ok((bytes to send, the user once done)) or Err((what the client
/// is told, if not the generic text; the reason for the log)).
type StepResult = Result<(Vec<u8>, Option<String>), (Option<String>, String)>;

/// What a gate answers or refuses.
type Dispatched = Result<(ApiKey, i16, Response), ServeError>;

fn closed(why: String) -> ServeError {
    ServeError::Io(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        why,
    ))
}

impl ConnAuth {
    /// A gate for a new connection; `server` is the listener's SASL configuration
    /// (`Dispatcher::sasl`), `None` where none is configured.
    pub fn new(server: Option<Arc<SaslServer>>) -> ConnAuth {
        ConnAuth {
            server,
            state: State::Handshake,
            done: None,
            expires_at: None,
            client_reauthenticates: false,
        }
    }

    /// The session a new connection starts with on the single `[kafka]` listener: SASL_PLAINTEXT
    /// and not yet authenticated when `[kafka.sasl]` is configured, else plaintext. (Named
    /// listeners build their sessions themselves and only use `new` + `dispatch`.)
    pub fn first_session(&self, peer: Option<std::net::SocketAddr>) -> Arc<Session> {
        let mut s = Session::plaintext(peer);
        if self.server.is_some() {
            s.listener = Arc::from("SASL_PLAINTEXT");
            s.protocol = SecurityProtocol::SaslPlaintext;
            s.authenticated = false;
        }
        Arc::new(s)
    }

    /// Serves `frame`, read completely at `received`, through the gate; `session` is replaced
    /// when the client authenticates. An error closes the connection.
    pub fn dispatch(
        &mut self,
        received: Instant,
        dispatcher: &Dispatcher,
        frame: Bytes,
        session: &mut Arc<Session>,
    ) -> Dispatched {
        let now = Instant::now().max(received);
        self.dispatch_at(received, now, dispatcher, frame, session)
    }

    /// `received`: when the frame was read (the session expiry is checked against it);
    /// `now`: when it is handled (a session starts when its authentication completes, as
    /// Kafka's authenticationEndNanos).
    pub fn dispatch_at(
        &mut self,
        received: Instant,
        now: Instant,
        dispatcher: &Dispatcher,
        frame: Bytes,
        session: &mut Arc<Session>,
    ) -> Dispatched {
        if !session.protocol.needs_sasl() {
            return dispatcher.dispatch_from(frame, session);
        }
        let Some(server) = self.server.clone() else {
            return Err(closed(format!(
                "listener {} needs SASL but kmirror has no [kafka.sasl] configuration",
                session.listener
            )));
        };
        if frame.len() < 4 {
            return Err(ServeError::Truncated { len: frame.len() });
        }
        let key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let api = ApiKey::try_from(key).map_err(|_| ServeError::UnknownApi { api: key })?;
        match &self.state {
            State::Failed(why) => Err(closed(why.clone())),
            State::Complete => {
                if api == ApiKey::SaslHandshake
                    && self.expires_at.is_some()
                    && self.client_reauthenticates
                {
                    self.state = State::Handshake;
                    return self.counted(dispatcher, api, version, |g| {
                        g.handshake(&server, api, version, frame)
                    });
                }
                if self.expires_at.is_some_and(|at| received >= at) {
                    return Err(closed(format!(
                        "SASL session of {} expired (connections.max.reauth.ms {} ms) and the \
                         client did not re-authenticate; {api:?} refused",
                        session.principal, server.reauth_ms
                    )));
                }
                dispatcher.dispatch_from(frame, session)
            }
            State::Handshake => match api {
                ApiKey::ApiVersions if self.done.is_none() => {
                    dispatcher.dispatch_from(frame, session)
                }
                ApiKey::SaslHandshake => self.counted(dispatcher, api, version, |g| {
                    g.handshake(&server, api, version, frame)
                }),
                _ => Err(closed(format!(
                    "Unexpected Kafka request of type {api:?} during SASL handshake"
                ))),
            },
            State::Authenticate { .. } => match api {
                ApiKey::SaslAuthenticate => self.counted(dispatcher, api, version, |g| {
                    g.authenticate(&server, now, version, frame, session)
                }),
                _ => Err(closed(format!(
                    "Unexpected Kafka request of type {api:?} during SASL authentication"
                ))),
            },
        }
    }

    /// Runs `f` and counts its request in the dispatcher's stats, as dispatched ones are.
    fn counted(
        &mut self,
        dispatcher: &Dispatcher,
        api: ApiKey,
        version: i16,
        f: impl FnOnce(&mut Self) -> Dispatched,
    ) -> Dispatched {
        let result = f(self);
        match &result {
            Ok(_) => dispatcher.stats().served(api as i16, version),
            Err(e) => dispatcher.stats().failed(
                api as i16,
                version,
                crate::serve::request_stats::RequestError::of(e),
            ),
        }
        result
    }

    fn reauthenticating(&self) -> bool {
        self.done.is_some()
    }

    fn handshake(
        &mut self,
        server: &SaslServer,
        api: ApiKey,
        version: i16,
        frame: Bytes,
    ) -> Dispatched {
        // v0 (mechanism bytes without Kafka framing) is deprecated and not served.
        if version != 1 {
            return Err(ServeError::UnsupportedVersion {
                api: api as i16,
                version,
            });
        }
        let (header, body) = split_header(api, version, frame)?;
        let req: SaslHandshakeRequest = decode_body(api, version, body)?;
        let mut resp = SaslHandshakeResponse::default();
        resp.mechanisms = server
            .mechanism_names()
            .into_iter()
            .map(StrBytes::from_static_str)
            .collect();
        let wanted = server
            .mechanisms
            .iter()
            .copied()
            .find(|m| m.name() == req.mechanism.as_str());
        let previous = self.done.as_ref().map(|(m, _)| *m);
        match wanted {
            Some(m) if previous.is_none_or(|p| p == m) => {
                let exchange = match m {
                    Mechanism::Plain => Exchange::Plain,
                    scram => Exchange::Scram(Box::new(ScramServer::new(scram))),
                };
                self.state = State::Authenticate {
                    mechanism: m,
                    exchange,
                };
            }
            _ => {
                resp.error_code = UNSUPPORTED_SASL_MECHANISM;
                self.state = State::Failed(match previous {
                    Some(p) => format!(
                        "SASL mechanism {:?} requested for re-authentication of a {p} session",
                        req.mechanism.as_str()
                    ),
                    None => format!("Unsupported SASL mechanism {:?}", req.mechanism.as_str()),
                });
            }
        }
        reply(api, version, header.correlation_id, &resp)
    }

    fn authenticate(
        &mut self,
        server: &SaslServer,
        now: Instant,
        version: i16,
        frame: Bytes,
        session: &mut Arc<Session>,
    ) -> Dispatched {
        let api = ApiKey::SaslAuthenticate;
        let (header, body) = split_header(api, version, frame)?;
        let req: SaslAuthenticateRequest = decode_body(api, version, body)?;
        if version >= 1 {
            self.client_reauthenticates = true;
        }
        let reauth = self.reauthenticating();
        let State::Authenticate {
            mechanism,
            exchange,
        } = &mut self.state
        else {
            unreachable!("authenticate is only called in the Authenticate state")
        };
        let mechanism = *mechanism;
        let step: StepResult = match exchange {
            Exchange::Plain => plain::authenticate(&req.auth_bytes, &server.plain)
                .map(|user| (Vec::new(), Some(user)))
                .map_err(|e| (e.client_message(), e.to_string())),
            Exchange::Scram(s) => s
                .evaluate(
                    &req.auth_bytes,
                    |user| server.scram.get(user, mechanism),
                    &random_nonce(),
                )
                .map(|step| match step {
                    ScramStep::Challenge(c) => (c, None),
                    ScramStep::Done {
                        username,
                        server_final,
                    } => (server_final, Some(username)),
                })
                .map_err(|e| (e.client_message(), e.to_string())),
        };
        let step = step.and_then(|(bytes, user)| match (&self.done, &user) {
            (Some((_, before)), Some(now_user)) if before != now_user => Err((
                Some(format!(
                    "Cannot change principals during re-authentication from User:{before}: \
                     User:{now_user}"
                )),
                "principal changed".into(),
            )),
            _ => Ok((bytes, user)),
        });
        let mut resp = SaslAuthenticateResponse::default();
        match step {
            Ok((bytes, None)) => resp.auth_bytes = Bytes::from(bytes),
            Ok((bytes, Some(user))) => {
                resp.auth_bytes = Bytes::from(bytes);
                let lifetime = server.reauth_ms;
                self.expires_at = (lifetime > 0).then(|| now + Duration::from_millis(lifetime));
                if version >= 1 {
                    resp.session_lifetime_ms = lifetime as i64;
                }
                if reauth {
                    tracing::debug!(peer = ?session.peer, user, %mechanism, "SASL re-authenticated");
                } else {
                    tracing::info!(peer = ?session.peer, user, %mechanism, "SASL authenticated");
                    let mut s = (**session).clone();
                    s.principal = KafkaPrincipal::user(user.clone());
                    s.authenticated = true;
                    *session = Arc::new(s);
                }
                self.done = Some((mechanism, user));
                self.state = State::Complete;
            }
            Err((told, reason)) => {
                let phase = if reauth {
                    "re-authentication"
                } else {
                    "authentication"
                };
                let message = told.unwrap_or_else(|| {
                    format!(
                        "Authentication failed during {phase} due to invalid credentials with \
                         SASL mechanism {mechanism}"
                    )
                });
                tracing::info!(peer = ?session.peer, %mechanism, reason, "SASL {phase} failed");
                resp.error_code = SASL_AUTHENTICATION_FAILED;
                resp.error_message = Some(StrBytes::from_string(message.clone()));
                self.state = State::Failed(message);
            }
        }
        reply(api, version, header.correlation_id, &resp)
    }
}

fn reply<M: Encodable>(api: ApiKey, version: i16, correlation_id: i32, body: &M) -> Dispatched {
    Ok((
        api,
        version,
        Response {
            correlation_id,
            outcome: Outcome::Reply(vec![Part::Bytes(encode_body(api, version, body)?)]),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::sasl::ScramClient;
    use crate::serve::credentials::{PlainUsers, ScramStore};
    use bytes::BytesMut;
    use kafka_protocol::messages::{MetadataRequest, RequestHeader};
    use kafka_protocol::protocol::Decodable;

    struct Fixture {
        _dir: tempfile::TempDir,
        dispatcher: Dispatcher,
        server: Arc<SaslServer>,
    }

    fn fixture(reauth_ms: u64) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let scram = Arc::new(ScramStore::open(&dir.path().join("s.json")).unwrap());
        scram
            .set_password("alice", Mechanism::ScramSha512, "alice-pw", 4096)
            .unwrap();
        let server = Arc::new(SaslServer {
            mechanisms: vec![Mechanism::ScramSha512, Mechanism::Plain],
            scram,
            plain: PlainUsers::from_pairs(&[("bob", "bob-pw"), ("alice", "x")]),
            reauth_ms,
        });
        let mut dispatcher = Dispatcher::new();
        server.register(&mut dispatcher);
        Fixture {
            _dir: dir,
            dispatcher,
            server,
        }
    }

    fn frame<M: Encodable>(api: ApiKey, version: i16, body: &M) -> Bytes {
        let mut h = RequestHeader::default();
        h.request_api_key = api as i16;
        h.request_api_version = version;
        h.correlation_id = 7;
        let mut b = BytesMut::new();
        h.encode(&mut b, api.request_header_version(version))
            .unwrap();
        body.encode(&mut b, version).unwrap();
        b.freeze()
    }

    fn body<M: Decodable>(r: &Dispatched, version: i16) -> M {
        let (_, _, resp) = r.as_ref().expect("answered");
        let Outcome::Reply(parts) = &resp.outcome else {
            panic!("no reply")
        };
        let Part::Bytes(b) = &parts[0] else { panic!() };
        M::decode(&mut b.clone(), version).unwrap()
    }

    struct Conn<'f> {
        f: &'f Fixture,
        gate: ConnAuth,
        session: Arc<Session>,
        now: Instant,
    }

    impl<'f> Conn<'f> {
        fn new(f: &'f Fixture) -> Conn<'f> {
            let gate = ConnAuth::new(f.dispatcher.sasl());
            let session = gate.first_session(None);
            Conn {
                f,
                gate,
                session,
                now: Instant::now(),
            }
        }

        fn send<M: Encodable>(&mut self, api: ApiKey, version: i16, b: &M) -> Dispatched {
            let now = self.now;
            self.send_at(now, now, api, version, b)
        }

        /// `send` of a frame read at `received` and handled at `now`.
        fn send_at<M: Encodable>(
            &mut self,
            received: Instant,
            now: Instant,
            api: ApiKey,
            version: i16,
            b: &M,
        ) -> Dispatched {
            let fr = frame(api, version, b);
            self.gate
                .dispatch_at(received, now, &self.f.dispatcher, fr, &mut self.session)
        }

        fn handshake(&mut self, mech: &str) -> SaslHandshakeResponse {
            let mut h = SaslHandshakeRequest::default();
            h.mechanism = StrBytes::from_string(mech.into());
            body(&self.send(ApiKey::SaslHandshake, 1, &h), 1)
        }

        fn auth(&mut self, version: i16, bytes: &[u8]) -> SaslAuthenticateResponse {
            let mut a = SaslAuthenticateRequest::default();
            a.auth_bytes = Bytes::copy_from_slice(bytes);
            body(&self.send(ApiKey::SaslAuthenticate, version, &a), version)
        }

        fn scram(&mut self, version: i16, user: &str, pw: &str) -> SaslAuthenticateResponse {
            let c = ScramClient::new(Mechanism::ScramSha512, user, "cnonce".into());
            let first = self.auth(version, c.client_first().as_bytes());
            if first.error_code != 0 {
                return first;
            }
            let fin = c
                .client_final(std::str::from_utf8(&first.auth_bytes).unwrap(), pw)
                .unwrap();
            self.auth(version, fin.message.as_bytes())
        }

        fn metadata(&mut self) -> Dispatched {
            self.send(ApiKey::Metadata, 12, &MetadataRequest::default())
        }
    }

    fn closed_with(r: Dispatched, needle: &str) {
        let err = r.expect_err("connection closes").to_string();
        assert!(err.contains(needle), "{err}");
    }

    // Goal: nothing but ApiVersions and the SASL exchange is served before authentication;
    // SCRAM-SHA-512 then makes the session User:alice.
    #[test]
    fn only_the_sasl_exchange_is_served_before_authentication() {
        let f = fixture(0);
        let mut c = Conn::new(&f);
        assert!(!c.session.authenticated);
        closed_with(
            c.metadata(),
            "Unexpected Kafka request of type Metadata during SASL handshake",
        );
        let mut c = Conn::new(&f);
        let v = c.send(
            ApiKey::ApiVersions,
            3,
            &kafka_protocol::messages::ApiVersionsRequest::default(),
        );
        let v: kafka_protocol::messages::ApiVersionsResponse = body(&v, 3);
        assert!(v
            .api_keys
            .iter()
            .any(|k| k.api_key == ApiKey::SaslHandshake as i16));
        let h = c.handshake("SCRAM-SHA-512");
        assert_eq!(h.error_code, 0);
        assert_eq!(h.mechanisms.len(), 2);
        closed_with(c.metadata(), "during SASL authentication");
        let mut c = Conn::new(&f);
        c.handshake("SCRAM-SHA-512");
        let done = c.scram(2, "alice", "alice-pw");
        assert_eq!((done.error_code, done.session_lifetime_ms), (0, 0));
        assert!(done.auth_bytes.starts_with(b"v="));
        assert_eq!(c.session.principal, KafkaPrincipal::user("alice"));
        assert!(c.session.authenticated);
        // Reaches the dispatcher now (which has no Metadata handler in this fixture).
        assert!(matches!(
            c.metadata(),
            Err(ServeError::UnsupportedApi { .. })
        ));
        // A handshake after authentication, re-authentication being off, is Kafka's
        // ILLEGAL_SASL_STATE answer.
        assert_eq!(c.handshake("SCRAM-SHA-512").error_code, 34);
    }

    // Goal: wrong password, unknown user and an unknown mechanism are refused with Kafka's
    // codes and texts, and the connection is closed at the next request.
    #[test]
    fn refusals_use_kafkas_codes_and_texts() {
        let f = fixture(0);
        for (user, pw) in [("alice", "wrong"), ("nobody", "alice-pw")] {
            let mut c = Conn::new(&f);
            c.handshake("SCRAM-SHA-512");
            let r = c.scram(1, user, pw);
            assert_eq!(r.error_code, SASL_AUTHENTICATION_FAILED);
            assert_eq!(
                r.error_message.as_deref(),
                Some(
                    "Authentication failed during authentication due to invalid credentials \
                     with SASL mechanism SCRAM-SHA-512"
                )
            );
            closed_with(c.metadata(), "invalid credentials");
        }
        let mut c = Conn::new(&f);
        c.handshake("PLAIN");
        let r = c.auth(0, b"\0bob\0nope");
        assert_eq!(r.error_code, SASL_AUTHENTICATION_FAILED);
        assert_eq!(
            r.error_message.as_deref(),
            Some("Authentication failed: Invalid username or password")
        );
        let mut c = Conn::new(&f);
        let h = c.handshake("GSSAPI");
        assert_eq!(h.error_code, UNSUPPORTED_SASL_MECHANISM);
        closed_with(c.metadata(), "Unsupported SASL mechanism");
        let mut c = Conn::new(&f);
        c.handshake("PLAIN");
        assert_eq!(c.auth(0, b"\0bob\0bob-pw").error_code, 0);
        assert_eq!(c.session.principal, KafkaPrincipal::user("bob"));
    }

    // Goal (KIP-368): the lifetime is announced, re-authentication on the same connection is
    // accepted and extends the session, a request after expiry without it closes, and a
    // re-authentication as someone else fails.
    #[test]
    fn sessions_expire_unless_the_client_reauthenticates() {
        let f = fixture(5_000);
        assert_eq!(f.server.reauth_ms, 5_000);
        let mut c = Conn::new(&f);
        c.handshake("SCRAM-SHA-512");
        assert_eq!(c.scram(2, "alice", "alice-pw").session_lifetime_ms, 5_000);
        c.now += Duration::from_millis(4_500);
        assert!(matches!(
            c.metadata(),
            Err(ServeError::UnsupportedApi { .. })
        ));
        assert_eq!(c.handshake("SCRAM-SHA-512").error_code, 0);
        assert_eq!(c.scram(2, "alice", "alice-pw").error_code, 0);
        c.now += Duration::from_millis(4_500);
        assert!(matches!(
            c.metadata(),
            Err(ServeError::UnsupportedApi { .. })
        ));
        c.now += Duration::from_millis(600);
        closed_with(c.metadata(), "expired");

        let mut c = Conn::new(&f);
        c.handshake("PLAIN");
        assert_eq!(c.auth(2, b"\0bob\0bob-pw").error_code, 0);
        assert_eq!(c.handshake("PLAIN").error_code, 0);
        let r = c.auth(2, b"\0alice\0x");
        assert_eq!(r.error_code, SASL_AUTHENTICATION_FAILED);
        assert!(r
            .error_message
            .unwrap()
            .contains("Cannot change principals"));
        assert_eq!(c.session.principal, KafkaPrincipal::user("bob"));

        let mut c = Conn::new(&f);
        c.handshake("PLAIN");
        c.auth(2, b"\0bob\0bob-pw");
        let h = c.handshake("SCRAM-SHA-512");
        assert_eq!(h.error_code, UNSUPPORTED_SASL_MECHANISM);
    }

    // Goal: the expiry is judged by when a request arrived, not by when a busy handler thread
    // got to it (Kafka checks on the completed receive): a request read before the session
    // ended is served however late it is handled; one read after it closes.
    #[test]
    fn expiry_is_judged_at_the_requests_arrival() {
        let f = fixture(2_000);
        let mut c = Conn::new(&f);
        c.handshake("PLAIN");
        assert_eq!(c.auth(2, b"\0bob\0bob-pw").error_code, 0);
        let at = |ms| c.now + Duration::from_millis(ms);
        let (read_before_end, handled_after_it, at_end) = (at(1_990), at(2_500), at(2_000));
        let md = MetadataRequest::default();
        let late = c.send_at(read_before_end, handled_after_it, ApiKey::Metadata, 12, &md);
        assert!(matches!(late, Err(ServeError::UnsupportedApi { .. })));
        let after = c.send_at(at_end, at_end, ApiKey::Metadata, 12, &md);
        closed_with(after, "expired");
    }

    #[test]
    fn plaintext_sessions_pass_straight_through() {
        let f = fixture(0);
        let mut gate = ConnAuth::new(None);
        let mut session = gate.first_session(None);
        assert_eq!(session.protocol, SecurityProtocol::Plaintext);
        let r = gate.dispatch(
            Instant::now(),
            &f.dispatcher,
            frame(ApiKey::Metadata, 12, &MetadataRequest::default()),
            &mut session,
        );
        assert!(matches!(r, Err(ServeError::UnsupportedApi { .. })));
    }
}
