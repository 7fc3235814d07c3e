//! CreateAcls (30), DescribeAcls (29), DeleteAcls (31), v1–3 as Kafka 3.x/4.x serve them
//! (4.0 removed v0), so `kafka-acls.sh --bootstrap-server` manages kmirror's ACLs. As in
//! Kafka: creating and deleting need ALTER on the cluster, describing DESCRIBE on it
//! (CLUSTER_AUTHORIZATION_FAILED otherwise, per creation / per filter / for the whole describe);
//! with the authorizer disabled every answer is SECURITY_DISABLED.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    ApiKey, CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::serve::authz::acl::{AclBinding, AclFilter, Operation};
use crate::serve::authz::AclChangeError;
use crate::serve::dispatch::{ApiHandler, Dispatcher, Outcome, Request};
use crate::serve::ServeError;

/// Kafka's error codes these APIs answer with.
pub use crate::serve::authz::CLUSTER_AUTHORIZATION_FAILED;
pub const INVALID_REQUEST: i16 = 42;
pub const SECURITY_DISABLED: i16 = 54;
const UNKNOWN_SERVER_ERROR: i16 = -1;

const NO_AUTHORIZER: &str =
    "No Authorizer is configured on kmirror ([kafka.authorizer] enabled = false)";

fn text(s: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(s.into()))
}

/// An ACL change error as (code, message).
fn change_error(e: &AclChangeError) -> (i16, String) {
    match e {
        AclChangeError::Disabled => (SECURITY_DISABLED, NO_AUTHORIZER.into()),
        // Kafka has no code for "too many ACLs"; INVALID_REQUEST with the reason is what
        // its tools show best.
        AclChangeError::Full { .. } => (INVALID_REQUEST, e.to_string()),
        AclChangeError::Store(_) => (UNKNOWN_SERVER_ERROR, e.to_string()),
    }
}

/// Why CreateAcls/DeleteAcls may not change anything for this client, if so: no authorizer,
/// or no ALTER on the cluster.
fn change_refusal(req: &Request) -> Option<(i16, String)> {
    if !req.authz.enabled() {
        Some((SECURITY_DISABLED, NO_AUTHORIZER.to_string()))
    } else if !req.cluster_authorized(Operation::Alter) {
        Some((
            CLUSTER_AUTHORIZATION_FAILED,
            "Cluster authorization failed.".to_string(),
        ))
    } else {
        None
    }
}

/// Registers the three ACL APIs on `d`.
pub fn register(d: &mut Dispatcher) {
    d.register(ApiKey::DescribeAcls, 1, 3, Arc::new(DescribeAclsApi));
    d.register(ApiKey::CreateAcls, 1, 3, Arc::new(CreateAclsApi));
    d.register(ApiKey::DeleteAcls, 1, 3, Arc::new(DeleteAclsApi));
}

pub struct CreateAclsApi;

impl ApiHandler for CreateAclsApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request: CreateAclsRequest = req.decode()?;
        let mut resp = CreateAclsResponse::default();
        let refusal = change_refusal(req);
        for c in &request.creations {
            let mut r = AclCreationResult::default();
            let outcome = match &refusal {
                Some(e) => Err(e.clone()),
                None => AclBinding::from_wire(
                    c.resource_type,
                    &c.resource_name,
                    c.resource_pattern_type,
                    &c.principal,
                    &c.host,
                    c.operation,
                    c.permission_type,
                )
                .map_err(|e| (INVALID_REQUEST, e.to_string()))
                .and_then(|b| {
                    req.authz.create(&b).map_err(|e| change_error(&e))?;
                    tracing::info!(principal = %req.session.principal, acl = %b, "ACL created");
                    Ok(())
                }),
            };
            if let Err((code, message)) = outcome {
                r.error_code = code;
                r.error_message = text(message);
            }
            resp.results.push(r);
        }
        Outcome::encode(req, &resp)
    }
}

pub struct DescribeAclsApi;

/// The DescribeAcls answer for `acls`, grouped by resource pattern as Kafka does.
pub fn describe_resources(acls: &[AclBinding]) -> Vec<DescribeAclsResource> {
    let mut by: BTreeMap<_, Vec<AclDescription>> = BTreeMap::new();
    for b in acls {
        let mut d = AclDescription::default();
        d.principal = StrBytes::from_string(b.entry.principal.clone());
        d.host = StrBytes::from_string(b.entry.host.clone());
        d.operation = b.entry.operation.code();
        d.permission_type = b.entry.permission.code();
        by.entry(&b.pattern).or_default().push(d);
    }
    by.into_iter()
        .map(|(p, acls)| {
            let mut r = DescribeAclsResource::default();
            r.resource_type = p.resource_type.code();
            r.resource_name = StrBytes::from_string(p.name.clone());
            r.pattern_type = p.pattern_type.code();
            r.acls = acls;
            r
        })
        .collect()
}

impl ApiHandler for DescribeAclsApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request: DescribeAclsRequest = req.decode()?;
        let mut resp = DescribeAclsResponse::default();
        if !req.authz.enabled() {
            resp.error_code = SECURITY_DISABLED;
            resp.error_message = text(NO_AUTHORIZER);
            return Outcome::encode(req, &resp);
        }
        if !req.cluster_authorized(Operation::Describe) {
            resp.error_code = CLUSTER_AUTHORIZATION_FAILED;
            resp.error_message = text("Cluster authorization failed.");
            return Outcome::encode(req, &resp);
        }
        match AclFilter::from_wire(
            request.resource_type_filter,
            request.resource_name_filter.as_deref(),
            request.pattern_type_filter,
            request.principal_filter.as_deref(),
            request.host_filter.as_deref(),
            request.operation,
            request.permission_type,
        ) {
            Ok(f) => resp.resources = describe_resources(&req.authz.describe(&f)),
            Err(e) => {
                resp.error_code = INVALID_REQUEST;
                resp.error_message = text(e.to_string());
            }
        }
        Outcome::encode(req, &resp)
    }
}

pub struct DeleteAclsApi;

fn matching(b: &AclBinding, error: Option<(i16, String)>) -> DeleteAclsMatchingAcl {
    let mut m = DeleteAclsMatchingAcl::default();
    if let Some((code, message)) = error {
        m.error_code = code;
        m.error_message = text(message);
    }
    m.resource_type = b.pattern.resource_type.code();
    m.resource_name = StrBytes::from_string(b.pattern.name.clone());
    m.pattern_type = b.pattern.pattern_type.code();
    m.principal = StrBytes::from_string(b.entry.principal.clone());
    m.host = StrBytes::from_string(b.entry.host.clone());
    m.operation = b.entry.operation.code();
    m.permission_type = b.entry.permission.code();
    m
}

impl ApiHandler for DeleteAclsApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request: DeleteAclsRequest = req.decode()?;
        let mut resp = DeleteAclsResponse::default();
        let refusal = change_refusal(req);
        for f in &request.filters {
            let mut r = DeleteAclsFilterResult::default();
            let outcome = match &refusal {
                Some(e) => Err(e.clone()),
                None => AclFilter::from_wire(
                    f.resource_type_filter,
                    f.resource_name_filter.as_deref(),
                    f.pattern_type_filter,
                    f.principal_filter.as_deref(),
                    f.host_filter.as_deref(),
                    f.operation,
                    f.permission_type,
                )
                .map_err(|e| (INVALID_REQUEST, e.to_string()))
                .and_then(|filter| req.authz.delete(&filter).map_err(|e| change_error(&e))),
            };
            match outcome {
                Ok((removed, kept)) => {
                    for b in &removed {
                        tracing::info!(principal = %req.session.principal, acl = %b, "ACL deleted");
                    }
                    r.matching_acls = removed.iter().map(|b| matching(b, None)).collect();
                    // An ACL synced from a source stays: the source owns it, and the next
                    // sync would bring it back. Said per ACL, as Kafka reports ACLs it could
                    // not delete.
                    r.matching_acls.extend(kept.iter().map(|(mirror, b)| {
                        matching(
                            b,
                            Some((
                                INVALID_REQUEST,
                                format!(
                                    "synced from the source of mirror {mirror}; delete it there"
                                ),
                            )),
                        )
                    }));
                }
                Err((code, message)) => {
                    r.error_code = code;
                    r.error_message = text(message);
                }
            }
            resp.filter_results.push(r);
        }
        Outcome::encode(req, &resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::authz::authorizer::AuthzSettings;
    use crate::serve::authz::store::MemoryStore;
    use crate::serve::authz::Authz;
    use crate::serve::session::{KafkaPrincipal, Session};
    use bytes::{BufMut, Bytes, BytesMut};
    use kafka_protocol::messages::create_acls_request::AclCreation;
    use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
    use kafka_protocol::messages::RequestHeader;
    use kafka_protocol::protocol::{Decodable, Encodable};

    fn dispatcher(authz: Arc<Authz>) -> Dispatcher {
        let mut d = Dispatcher::new();
        register(&mut d);
        d.authorize_with(authz);
        d
    }

    fn call<Q: Encodable, R: Decodable>(
        d: &Dispatcher,
        who: &str,
        key: ApiKey,
        version: i16,
        body: &Q,
    ) -> R {
        let mut frame = BytesMut::new();
        let mut h = RequestHeader::default();
        h.request_api_key = key as i16;
        h.request_api_version = version;
        h.correlation_id = 7;
        h.encode(&mut frame, key.request_header_version(version))
            .unwrap();
        body.encode(&mut frame, version).unwrap();
        let mut s = Session::plaintext(Some("127.0.0.1:4000".parse().unwrap()));
        s.principal = KafkaPrincipal::user(who);
        let (_, _, resp) = d.dispatch_from(frame.freeze(), &Arc::new(s)).unwrap();
        let Outcome::Reply(parts) = resp.outcome else {
            panic!("no reply")
        };
        let mut body = BytesMut::new();
        for p in parts {
            let crate::serve::dispatch::Part::Bytes(b) = p else {
                panic!("file part")
            };
            body.put(b);
        }
        let mut body: Bytes = body.freeze();
        R::decode(&mut body, version).unwrap()
    }

    fn creation(name: &str, principal: &str) -> AclCreation {
        let mut c = AclCreation::default();
        c.resource_type = 2;
        c.resource_name = StrBytes::from_string(name.into());
        c.resource_pattern_type = 3;
        c.principal = StrBytes::from_string(principal.into());
        c.host = StrBytes::from_static_str("*");
        c.operation = 3;
        c.permission_type = 3;
        c
    }

    fn describe_all() -> DescribeAclsRequest {
        let mut r = DescribeAclsRequest::default();
        r.resource_type_filter = 1;
        r.resource_name_filter = None;
        r.pattern_type_filter = 1;
        r.principal_filter = None;
        r.host_filter = None;
        r.operation = 1;
        r.permission_type = 1;
        r
    }

    fn settings() -> AuthzSettings {
        AuthzSettings {
            enabled: true,
            super_users: ["User:admin".to_string()].into(),
            allow_if_no_acl: false,
        }
    }

    #[test]
    fn create_describe_delete_round_trip_for_every_version() {
        for v in 1..=3 {
            let authz = Authz::with_store(settings(), Box::<MemoryStore>::default()).unwrap();
            let d = dispatcher(authz);
            let mut req = CreateAclsRequest::default();
            req.creations = vec![
                creation("t", "User:alice"),
                creation("u", "alice"),
                creation("u", "User:bob"),
            ];
            let r: CreateAclsResponse = call(&d, "admin", ApiKey::CreateAcls, v, &req);
            let codes: Vec<i16> = r.results.iter().map(|r| r.error_code).collect();
            assert_eq!(codes, vec![0, INVALID_REQUEST, 0], "v{v}");
            let r: DescribeAclsResponse =
                call(&d, "admin", ApiKey::DescribeAcls, v, &describe_all());
            assert_eq!(r.error_code, 0);
            let names: Vec<&str> = r.resources.iter().map(|r| &*r.resource_name).collect();
            assert_eq!(names, vec!["t", "u"]);
            assert_eq!(&*r.resources[0].acls[0].principal, "User:alice");
            let mut del = DeleteAclsRequest::default();
            let mut f = DeleteAclsFilter::default();
            f.resource_type_filter = 2;
            f.resource_name_filter = Some(StrBytes::from_static_str("t"));
            f.pattern_type_filter = 3;
            f.principal_filter = None;
            f.host_filter = None;
            f.operation = 1;
            f.permission_type = 1;
            del.filters = vec![f];
            let r: DeleteAclsResponse = call(&d, "admin", ApiKey::DeleteAcls, v, &del);
            assert_eq!(r.filter_results[0].error_code, 0);
            assert_eq!(r.filter_results[0].matching_acls.len(), 1);
            let r: DescribeAclsResponse =
                call(&d, "admin", ApiKey::DescribeAcls, v, &describe_all());
            assert_eq!(r.resources.len(), 1);
        }
    }

    #[test]
    fn management_needs_cluster_permissions() {
        let authz = Authz::with_store(settings(), Box::<MemoryStore>::default()).unwrap();
        let d = dispatcher(authz);
        let mut req = CreateAclsRequest::default();
        req.creations = vec![creation("t", "User:alice")];
        let r: CreateAclsResponse = call(&d, "alice", ApiKey::CreateAcls, 3, &req);
        assert_eq!(r.results[0].error_code, CLUSTER_AUTHORIZATION_FAILED);
        let r: DescribeAclsResponse = call(&d, "alice", ApiKey::DescribeAcls, 3, &describe_all());
        assert_eq!(r.error_code, CLUSTER_AUTHORIZATION_FAILED);
        let mut del = DeleteAclsRequest::default();
        del.filters = vec![DeleteAclsFilter::default()];
        let r: DeleteAclsResponse = call(&d, "alice", ApiKey::DeleteAcls, 3, &del);
        assert_eq!(r.filter_results[0].error_code, CLUSTER_AUTHORIZATION_FAILED);
    }

    #[test]
    fn disabled_authorizer_says_security_disabled() {
        let d = dispatcher(Authz::allow_all());
        let r: DescribeAclsResponse = call(&d, "alice", ApiKey::DescribeAcls, 2, &describe_all());
        assert_eq!(r.error_code, SECURITY_DISABLED);
        let mut req = CreateAclsRequest::default();
        req.creations = vec![creation("t", "User:alice")];
        let r: CreateAclsResponse = call(&d, "alice", ApiKey::CreateAcls, 2, &req);
        assert_eq!(r.results[0].error_code, SECURITY_DISABLED);
    }
}
