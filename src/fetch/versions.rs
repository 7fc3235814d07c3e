//! ApiVersions: find, per API we use, the highest version both we and the source broker speak.
//!
//! Sources range from Kafka 2.1 to 4.x (kafka-formats.md §6.1). We first ask with our newest
//! ApiVersions version. A broker older than that version answers UNSUPPORTED_VERSION in the v0
//! layout (and, from 2.4, lists its own ApiVersions range); we then ask again with the version it
//! offers, or v0.

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::{Decodable, StrBytes};
use kafka_protocol::ResponseError;

use crate::wire::api::{self, ApiRange};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionsError {
    #[error("ApiVersions response could not be decoded at v{version} nor v0: {reason}")]
    Undecodable { version: i16, reason: String },
    #[error("broker rejected ApiVersions v0")]
    UnsupportedAtV0,
    #[error("ApiVersions failed with error code {0}")]
    Broker(i16),
    #[error("broker does not offer {api:?} (we need v{min}..=v{max})")]
    Missing { api: ApiKey, min: i16, max: i16 },
    #[error("broker offers {api:?} v{broker_min}..=v{broker_max}, we speak v{min}..=v{max}")]
    NoCommonVersion {
        api: ApiKey,
        broker_min: i16,
        broker_max: i16,
        min: i16,
        max: i16,
    },
}

/// The versions chosen for one source broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    pub api_versions: i16,
    pub metadata: i16,
    pub fetch: i16,
    pub list_offsets: i16,
    pub offset_for_leader_epoch: i16,
}

impl Versions {
    /// Fetch sessions (KIP-227).
    pub fn fetch_has_sessions(&self) -> bool {
        self.fetch >= 7
    }

    /// LastFetchedEpoch in the request and DivergingEpoch in the response (KIP-595/320).
    pub fn fetch_has_divergence(&self) -> bool {
        self.fetch >= 12
    }

    /// Fetch by topic id instead of name (KIP-516).
    pub fn fetch_uses_topic_ids(&self) -> bool {
        self.fetch >= 13
    }

    /// Metadata carries partition leader epochs.
    pub fn metadata_has_leader_epoch(&self) -> bool {
        self.metadata >= 7
    }

    /// Metadata carries topic ids.
    pub fn metadata_has_topic_ids(&self) -> bool {
        self.metadata >= 10
    }
}

/// What to do with an ApiVersions answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Negotiation {
    Done(Versions),
    /// The broker does not speak the ApiVersions version we sent; ask again with this one.
    RetryWith(i16),
}

/// The ApiVersions request we send at `version`.
pub fn api_versions_request(version: i16) -> ApiVersionsRequest {
    let mut req = ApiVersionsRequest::default();
    if version >= 3 {
        req.client_software_name = StrBytes::from_static_str("kmirror");
        req.client_software_version = StrBytes::from_static_str(env!("CARGO_PKG_VERSION"));
    }
    req
}

/// Decode an ApiVersions response body (header already stripped) sent at `version`. A broker
/// that did not understand `version` writes its error in the v0 layout, so a body that fails to
/// decode at `version` is tried again as v0.
pub fn decode_api_versions(
    body: Bytes,
    version: i16,
) -> Result<ApiVersionsResponse, VersionsError> {
    let mut first = body.clone();
    match ApiVersionsResponse::decode(&mut first, version) {
        Ok(resp) if first.is_empty() => Ok(resp),
        first_err => {
            let reason = match first_err {
                Ok(_) => "bytes left over".to_owned(),
                Err(e) => format!("{e:#}"),
            };
            let mut v0 = body;
            match ApiVersionsResponse::decode(&mut v0, 0) {
                Ok(resp) if v0.is_empty() && version > 0 => Ok(resp),
                _ => Err(VersionsError::Undecodable { version, reason }),
            }
        }
    }
}

/// Turn a decoded ApiVersions response into versions, or a retry at a lower ApiVersions version.
pub fn negotiate(resp: &ApiVersionsResponse, sent: i16) -> Result<Negotiation, VersionsError> {
    if resp.error_code == ResponseError::UnsupportedVersion.code() {
        if sent == 0 {
            return Err(VersionsError::UnsupportedAtV0);
        }
        let offered = resp
            .api_keys
            .iter()
            .find(|k| k.api_key == ApiKey::ApiVersions as i16)
            .map(|k| k.max_version.min(sent - 1))
            .unwrap_or(0);
        return Ok(Negotiation::RetryWith(offered.max(0)));
    }
    if resp.error_code != 0 {
        return Err(VersionsError::Broker(resp.error_code));
    }
    let pick = |range: ApiRange| -> Result<i16, VersionsError> {
        let broker = resp
            .api_keys
            .iter()
            .find(|k| k.api_key == range.key as i16)
            .ok_or(VersionsError::Missing {
                api: range.key,
                min: range.min,
                max: range.max,
            })?;
        let high = broker.max_version.min(range.max);
        let low = broker.min_version.max(range.min);
        if high < low {
            return Err(VersionsError::NoCommonVersion {
                api: range.key,
                broker_min: broker.min_version,
                broker_max: broker.max_version,
                min: range.min,
                max: range.max,
            });
        }
        Ok(high)
    };
    Ok(Negotiation::Done(Versions {
        api_versions: sent,
        metadata: pick(api::METADATA)?,
        fetch: pick(api::FETCH)?,
        list_offsets: pick(api::LIST_OFFSETS)?,
        offset_for_leader_epoch: pick(api::OFFSET_FOR_LEADER_EPOCH)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::protocol::Encodable;

    fn broker(ranges: &[(ApiKey, i16, i16)]) -> ApiVersionsResponse {
        let mut resp = ApiVersionsResponse::default();
        resp.api_keys = ranges
            .iter()
            .map(|(k, min, max)| {
                ApiVersion::default()
                    .with_api_key(*k as i16)
                    .with_min_version(*min)
                    .with_max_version(*max)
            })
            .collect();
        resp
    }

    /// Ranges from kafka-formats.md §6.1 (read from the Kafka branches, not from our code).
    fn kafka_2_1() -> ApiVersionsResponse {
        broker(&[
            (ApiKey::Fetch, 0, 10),
            (ApiKey::ListOffsets, 0, 4),
            (ApiKey::Metadata, 0, 7),
            (ApiKey::OffsetForLeaderEpoch, 0, 2),
            (ApiKey::ApiVersions, 0, 2),
        ])
    }

    fn kafka_4_1() -> ApiVersionsResponse {
        broker(&[
            (ApiKey::Fetch, 4, 18),
            (ApiKey::ListOffsets, 1, 10),
            (ApiKey::Metadata, 0, 13),
            (ApiKey::OffsetForLeaderEpoch, 2, 4),
            (ApiKey::ApiVersions, 0, 4),
        ])
    }

    #[test]
    fn kafka_2_1_gets_the_overlap() {
        let Negotiation::Done(v) = negotiate(&kafka_2_1(), 2).unwrap() else {
            panic!()
        };
        assert_eq!(
            (
                v.fetch,
                v.metadata,
                v.list_offsets,
                v.offset_for_leader_epoch
            ),
            (10, 7, 4, 2)
        );
        assert!(v.fetch_has_sessions() && !v.fetch_has_divergence() && !v.fetch_uses_topic_ids());
    }

    #[test]
    fn kafka_4_1_gets_our_maximum() {
        let Negotiation::Done(v) = negotiate(&kafka_4_1(), 3).unwrap() else {
            panic!()
        };
        assert_eq!(v.fetch, api::FETCH.max);
        assert_eq!(v.metadata, api::METADATA.max);
        assert!(v.fetch_uses_topic_ids() && v.metadata_has_topic_ids());
    }

    #[test]
    fn missing_or_disjoint_api_is_an_error() {
        let no_fetch = broker(&[(ApiKey::Metadata, 0, 7)]);
        assert!(matches!(
            negotiate(&no_fetch, 0),
            Err(VersionsError::Missing { .. })
        ));
        let mut old = kafka_2_1();
        old.api_keys[0].max_version = 3; // a Fetch that stops before v4
        assert!(matches!(
            negotiate(&old, 0),
            Err(VersionsError::NoCommonVersion { .. })
        ));
    }

    // Goal: a pre-2.4 broker answers a v3 ApiVersions request with UNSUPPORTED_VERSION in the v0
    // layout; we decode that, and retry at the version it lists (or v0 when it lists nothing).
    #[test]
    fn unsupported_version_answer_in_v0_layout_leads_to_retry() {
        let mut resp = broker(&[(ApiKey::ApiVersions, 0, 2)]);
        resp.error_code = ResponseError::UnsupportedVersion.code();
        let mut body = BytesMut::new();
        resp.encode(&mut body, 0).unwrap();
        let decoded = decode_api_versions(body.freeze(), 3).unwrap();
        assert_eq!(negotiate(&decoded, 3).unwrap(), Negotiation::RetryWith(2));

        let mut bare = ApiVersionsResponse::default();
        bare.error_code = ResponseError::UnsupportedVersion.code();
        assert_eq!(negotiate(&bare, 3).unwrap(), Negotiation::RetryWith(0));
        assert_eq!(negotiate(&bare, 0), Err(VersionsError::UnsupportedAtV0));
    }

    #[test]
    fn garbage_is_a_typed_error() {
        let err = decode_api_versions(Bytes::from_static(&[0, 0, 0xff]), 3);
        assert!(matches!(err, Err(VersionsError::Undecodable { .. })));
    }
}
