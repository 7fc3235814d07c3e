//! SASL PLAIN (RFC 4616) as Kafka's `PlainSaslServer` checks it: `authzid NUL authcid NUL
//! passwd`, one round, the texts Kafka sends the client on failure.

use crate::limits::SASL_USERNAME_BYTES_MAX;
use crate::serve::credentials::PlainUsers;

/// Why a PLAIN message was refused; `Display` is what the client is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlainError {
    /// Not three NUL-separated UTF-8 tokens (Kafka: a `SaslException`, so the client gets
    /// the generic text instead of this one).
    #[error("Invalid SASL/PLAIN response: {0}")]
    Malformed(String),
    #[error("Authentication failed: username not specified")]
    NoUser,
    #[error("Authentication failed: password not specified")]
    NoPassword,
    #[error("Authentication failed: Invalid username or password")]
    Invalid,
    #[error("Authentication failed: Client requested an authorization id that is different from username")]
    AuthzidMismatch,
}

impl PlainError {
    /// The text Kafka sends the client, if not the generic one.
    pub fn client_message(&self) -> Option<String> {
        (!matches!(self, PlainError::Malformed(_))).then(|| self.to_string())
    }
}

/// The user of a valid PLAIN message whose password `users` knows.
pub fn authenticate(msg: &[u8], users: &PlainUsers) -> Result<String, PlainError> {
    let text = std::str::from_utf8(msg).map_err(|_| PlainError::Malformed("not UTF-8".into()))?;
    let tokens: Vec<&str> = text.split('\u{0}').collect();
    let [authzid, user, password] = tokens[..] else {
        return Err(PlainError::Malformed(format!(
            "expected 3 tokens, got {}",
            tokens.len()
        )));
    };
    if user.is_empty() {
        return Err(PlainError::NoUser);
    }
    if password.is_empty() {
        return Err(PlainError::NoPassword);
    }
    if user.len() > SASL_USERNAME_BYTES_MAX || !users.check(user, password.as_bytes()) {
        return Err(PlainError::Invalid);
    }
    if !authzid.is_empty() && authzid != user {
        return Err(PlainError::AuthzidMismatch);
    }
    Ok(user.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_messages_are_checked_as_kafka_does() {
        let users = PlainUsers::from_pairs(&[("alice", "pw")]);
        assert_eq!(authenticate(b"\0alice\0pw", &users).unwrap(), "alice");
        assert_eq!(authenticate(b"alice\0alice\0pw", &users).unwrap(), "alice");
        for (msg, want) in [
            (&b"\0alice\0wrong"[..], PlainError::Invalid),
            (b"\0bob\0pw", PlainError::Invalid),
            (b"\0\0pw", PlainError::NoUser),
            (b"\0alice\0", PlainError::NoPassword),
            (b"bob\0alice\0pw", PlainError::AuthzidMismatch),
            (
                b"alice\0pw",
                PlainError::Malformed("expected 3 tokens, got 2".into()),
            ),
            (b"\xff\0a\0b", PlainError::Malformed("not UTF-8".into())),
        ] {
            assert_eq!(authenticate(msg, &users), Err(want));
        }
        assert_eq!(
            PlainError::Invalid.client_message().unwrap(),
            "Authentication failed: Invalid username or password"
        );
        assert!(PlainError::Malformed("x".into()).client_message().is_none());
    }
}
