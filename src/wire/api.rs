//! The Kafka APIs kmirror speaks as a client of source clusters, with the version ranges it can
//! encode and decode. A connection uses, per API, the highest version in both this range and
//! the broker's ApiVersions answer (see `fetch::versions`).
//!
//! The ranges follow what sources from Kafka 2.1 to 4.x offer (kafka-formats.md §6.1) and what
//! the `kafka-protocol` crate implements (it dropped the versions KIP-896 removed in 4.0).

use kafka_protocol::messages::ApiKey;

/// One API and the versions we can use for it, inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiRange {
    pub key: ApiKey,
    pub min: i16,
    pub max: i16,
}

/// ApiVersions: v0 works on every broker; v3+ is flexible and a pre-2.4 broker answers it with
/// UNSUPPORTED_VERSION in v0 layout, after which we retry lower.
pub const API_VERSIONS: ApiRange = ApiRange {
    key: ApiKey::ApiVersions,
    min: 0,
    max: 3,
};

/// Metadata: v1 is the first where a null topic list means "all topics"; v7 adds the partition
/// leader epoch, v10 topic ids.
pub const METADATA: ApiRange = ApiRange {
    key: ApiKey::Metadata,
    min: 1,
    max: 12,
};

/// Fetch: v4 is the first that returns magic-2 batches without down-conversion (and the oldest
/// the crate speaks); v7 sessions, v9 current leader epoch, v12 divergence, v13 topic ids.
pub const FETCH: ApiRange = ApiRange {
    key: ApiKey::Fetch,
    min: 4,
    max: 17,
};

/// ListOffsets: v1 has a single offset per partition (v0 is gone in 4.0), v4 the leader epoch.
pub const LIST_OFFSETS: ApiRange = ApiRange {
    key: ApiKey::ListOffsets,
    min: 1,
    max: 7,
};

/// OffsetForLeaderEpoch: 2.1 speaks 0-2 and 4.x speaks 2-4, so only v2 is common ground; we
/// still take v3/v4 where offered (same fields plus replica id / flexible encoding).
pub const OFFSET_FOR_LEADER_EPOCH: ApiRange = ApiRange {
    key: ApiKey::OffsetForLeaderEpoch,
    min: 2,
    max: 4,
};

/// Every API the source client uses. A broker that lacks any of them cannot be a source.
pub const CLIENT_APIS: [ApiRange; 5] = [
    API_VERSIONS,
    METADATA,
    FETCH,
    LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
];

/// The first flexible (compact, tagged-field) version of an API we use as a client.
pub fn first_flexible_version(key: ApiKey) -> Option<i16> {
    match key {
        ApiKey::ApiVersions => Some(3),
        ApiKey::Metadata => Some(9),
        ApiKey::Fetch => Some(12),
        ApiKey::ListOffsets => Some(6),
        ApiKey::OffsetForLeaderEpoch => Some(4),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: our ranges stay inside what the crate can encode, so a negotiated version never
    // reaches the crate's "version not supported" path. Method: compare with the crate's table.
    #[test]
    fn ranges_are_within_the_crate() {
        for api in CLIENT_APIS {
            let crate_range = api.key.valid_versions();
            assert!(api.min <= api.max, "{:?}", api.key);
            assert!(
                crate_range.min <= api.min && api.max <= crate_range.max,
                "{:?}",
                api.key
            );
        }
    }

    // Goal: the flexible-version table agrees with the crate's request header versions (header
    // v2 exactly from the first flexible version).
    #[test]
    fn flexible_versions_match_header_versions() {
        for api in CLIENT_APIS {
            let flexible = first_flexible_version(api.key).unwrap();
            for v in api.min..=api.max {
                let expected = if v >= flexible { 2 } else { 1 };
                assert_eq!(
                    api.key.request_header_version(v),
                    expected,
                    "{:?} v{v}",
                    api.key
                );
            }
        }
    }
}
