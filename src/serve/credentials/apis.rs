//! The Kafka APIs that manage the SCRAM store, answered as Kafka's controller answers them
//! (`ScramControlManager`, `ScramImage.describe`), so `kafka-configs.sh --entity-type users`
//! works against kmirror; and DescribeClientQuotas, which that tool's `--describe` asks first
//! (kmirror enforces no client quotas, so the answer is honestly empty).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeClientQuotasRequest, DescribeClientQuotasResponse, DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::fetch::sasl::Mechanism;
use crate::limits::{
    SCRAM_CREDENTIALS_MAX, SCRAM_ITERATIONS_MAX, SCRAM_ITERATIONS_MIN, SCRAM_SALT_BYTES_MAX,
};
use crate::serve::credentials::scram_store::{mechanism_of_type, type_of_mechanism};
use crate::serve::credentials::{ScramCredential, ScramStore};
use crate::serve::dispatch::{ApiHandler, Outcome, Request};
use crate::serve::ServeError;

const RESOURCE_NOT_FOUND: i16 = 91;
const DUPLICATE_RESOURCE: i16 = 92;
const UNACCEPTABLE_CREDENTIAL: i16 = 93;
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const KAFKA_STORAGE_ERROR: i16 = 56;

type Refusal = (i16, String);

/// AlterUserScramCredentials v0.
#[derive(Debug)]
pub struct AlterScramApi {
    pub store: Arc<ScramStore>,
}

/// DescribeUserScramCredentials v0.
#[derive(Debug)]
pub struct DescribeScramApi {
    pub store: Arc<ScramStore>,
}

/// DescribeClientQuotas v0–1: no quotas.
#[derive(Debug)]
pub struct DescribeQuotasApi;

fn validate_name_and_mechanism(name: &str, mechanism: i8) -> Result<Mechanism, Refusal> {
    if name.is_empty() {
        return Err((UNACCEPTABLE_CREDENTIAL, "Username must not be empty".into()));
    }
    mechanism_of_type(mechanism)
        .ok_or_else(|| (UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism".into()))
}

impl ApiHandler for AlterScramApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let body: AlterUserScramCredentialsRequest = req.decode()?;
        // Per user: the first refusal, or the alterations to apply. A user with any refused
        // alteration gets none of them.
        let mut refused: BTreeMap<String, Refusal> = BTreeMap::new();
        let mut seen: BTreeSet<(String, i8)> = BTreeSet::new();
        let mut deletions: Vec<(String, Mechanism)> = Vec::new();
        let mut upsertions: Vec<(String, Mechanism, ScramCredential)> = Vec::new();
        let mut order: Vec<String> = Vec::new();
        let refuse = |user: &str, r: Refusal, refused: &mut BTreeMap<String, Refusal>| {
            refused.entry(user.to_owned()).or_insert(r);
        };
        for d in &body.deletions {
            let user = d.name.as_str();
            order.push(user.to_owned());
            if !seen.insert((user.to_owned(), d.mechanism)) {
                refuse(user, duplicate(), &mut refused);
                continue;
            }
            match validate_name_and_mechanism(user, d.mechanism) {
                Err(r) => refuse(user, r, &mut refused),
                Ok(m) if self.store.get(user, m).is_none() => refuse(
                    user,
                    (
                        RESOURCE_NOT_FOUND,
                        "Attempt to delete a user credential that does not exist".into(),
                    ),
                    &mut refused,
                ),
                Ok(m) => deletions.push((user.to_owned(), m)),
            }
        }
        for u in &body.upsertions {
            let user = u.name.as_str();
            order.push(user.to_owned());
            if !seen.insert((user.to_owned(), u.mechanism)) {
                refuse(user, duplicate(), &mut refused);
                continue;
            }
            match validate_upsertion(user, u.mechanism, u.iterations, &u.salt, &u.salted_password) {
                Err(r) => refuse(user, r, &mut refused),
                Ok((m, c)) => upsertions.push((user.to_owned(), m, c)),
            }
        }
        deletions.retain(|(u, _)| !refused.contains_key(u));
        upsertions.retain(|(u, _, _)| !refused.contains_key(u));
        let new_keys = upsertions
            .iter()
            .filter(|(u, m, _)| self.store.get(u, *m).is_none())
            .count();
        if self.store.len() + new_keys > SCRAM_CREDENTIALS_MAX + deletions.len() {
            for (u, _, _) in &upsertions {
                refuse(
                    u,
                    (
                        UNACCEPTABLE_CREDENTIAL,
                        format!("kmirror stores at most {SCRAM_CREDENTIALS_MAX} SCRAM credentials"),
                    ),
                    &mut refused,
                );
            }
            upsertions.clear();
        }
        if !deletions.is_empty() || !upsertions.is_empty() {
            let changed: Vec<String> = deletions
                .iter()
                .map(|(u, m)| format!("{u} {m} deleted"))
                .chain(
                    upsertions
                        .iter()
                        .map(|(u, m, c)| format!("{u} {m} set ({} iterations)", c.iterations)),
                )
                .collect();
            let users: BTreeSet<String> = deletions
                .iter()
                .map(|(u, _)| u.clone())
                .chain(upsertions.iter().map(|(u, _, _)| u.clone()))
                .collect();
            match self.store.apply(&deletions, upsertions) {
                Ok(()) => tracing::info!(
                    principal = %req.session.principal,
                    host = %req.session.host(),
                    "SCRAM credentials changed: {}",
                    changed.join(", ")
                ),
                Err(e) => {
                    tracing::error!(error = %e, "SCRAM credentials not changed");
                    for u in users {
                        refuse(
                            &u,
                            (KAFKA_STORAGE_ERROR, format!("credential store: {e}")),
                            &mut refused,
                        );
                    }
                }
            }
        }
        let mut resp = AlterUserScramCredentialsResponse::default();
        let mut answered = BTreeSet::new();
        for user in order {
            if !answered.insert(user.clone()) {
                continue;
            }
            let mut r = AlterUserScramCredentialsResult::default();
            r.user = StrBytes::from_string(user.clone());
            if let Some((code, msg)) = refused.get(&user) {
                r.error_code = *code;
                r.error_message = Some(StrBytes::from_string(msg.clone()));
            }
            resp.results.push(r);
        }
        Outcome::encode(req, &resp)
    }
}

fn duplicate() -> Refusal {
    (
        DUPLICATE_RESOURCE,
        "A user credential cannot be altered twice in the same request".into(),
    )
}

fn validate_upsertion(
    user: &str,
    mechanism: i8,
    iterations: i32,
    salt: &[u8],
    salted: &[u8],
) -> Result<(Mechanism, ScramCredential), Refusal> {
    let m = validate_name_and_mechanism(user, mechanism)?;
    if iterations < SCRAM_ITERATIONS_MIN as i32 {
        return Err((UNACCEPTABLE_CREDENTIAL, "Too few iterations".into()));
    }
    if iterations > SCRAM_ITERATIONS_MAX as i32 {
        return Err((UNACCEPTABLE_CREDENTIAL, "Too many iterations".into()));
    }
    let hash_len = match m {
        Mechanism::ScramSha512 => 64,
        _ => 32,
    };
    if salted.len() != hash_len {
        return Err((
            UNACCEPTABLE_CREDENTIAL,
            format!("salted password must be {hash_len} bytes for {m}"),
        ));
    }
    if salt.is_empty() || salt.len() > SCRAM_SALT_BYTES_MAX {
        return Err((
            UNACCEPTABLE_CREDENTIAL,
            format!("salt must be 1..={SCRAM_SALT_BYTES_MAX} bytes"),
        ));
    }
    Ok((
        m,
        ScramCredential::from_salted_password(m, salt.to_vec(), salted, iterations as u32),
    ))
}

impl ApiHandler for DescribeScramApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let body: DescribeUserScramCredentialsRequest = req.decode()?;
        let all = self.store.list();
        // User → listed more than once.
        let mut wanted: BTreeMap<String, bool> = BTreeMap::new();
        match body.users.as_deref() {
            None | Some([]) => {
                for u in all.keys() {
                    wanted.insert(u.clone(), false);
                }
            }
            Some(users) => {
                for u in users {
                    *wanted.entry(u.name.to_string()).or_insert(false) |=
                        users.iter().filter(|x| x.name == u.name).count() > 1;
                }
            }
        }
        let mut resp = DescribeUserScramCredentialsResponse::default();
        for (user, dup) in wanted {
            let mut r = DescribeUserScramCredentialsResult::default();
            r.user = StrBytes::from_string(user.clone());
            if dup {
                r.error_code = DUPLICATE_RESOURCE;
                r.error_message = Some(StrBytes::from_string(format!(
                    "Cannot describe SCRAM credentials for the same user twice in a single request: {user}"
                )));
            } else if let Some(infos) = all.get(&user) {
                for (m, iterations) in infos {
                    let mut i = CredentialInfo::default();
                    i.mechanism = type_of_mechanism(*m);
                    i.iterations = *iterations as i32;
                    r.credential_infos.push(i);
                }
            } else {
                r.error_code = RESOURCE_NOT_FOUND;
                r.error_message = Some(StrBytes::from_string(format!(
                    "Attempt to describe a user credential that does not exist: {user}"
                )));
            }
            resp.results.push(r);
        }
        Outcome::encode(req, &resp)
    }
}

impl ApiHandler for DescribeQuotasApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let _: DescribeClientQuotasRequest = req.decode()?;
        let mut resp = DescribeClientQuotasResponse::default();
        resp.entries = Some(Vec::new());
        Outcome::encode(req, &resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upsertions_are_validated_as_kafka_does() {
        let salted = vec![7u8; 64];
        assert_eq!(
            validate_upsertion("", 2, 4096, b"s", &salted)
                .unwrap_err()
                .0,
            UNACCEPTABLE_CREDENTIAL
        );
        assert_eq!(
            validate_upsertion("a", 0, 4096, b"s", &salted).unwrap_err(),
            (UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism".into())
        );
        assert_eq!(
            validate_upsertion("a", 2, 4095, b"s", &salted)
                .unwrap_err()
                .1,
            "Too few iterations"
        );
        assert_eq!(
            validate_upsertion("a", 2, 16385, b"s", &salted)
                .unwrap_err()
                .1,
            "Too many iterations"
        );
        assert!(validate_upsertion("a", 1, 4096, b"s", &salted).is_err());
        let (m, c) = validate_upsertion("a", 2, 4096, b"s", &salted).unwrap();
        assert_eq!((m, c.iterations), (Mechanism::ScramSha512, 4096));
    }
}
