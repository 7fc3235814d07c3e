//! The group APIs and versions kmirror advertises. Only versions exercised by stock clients in
//! the tests are listed (see `tests/groups_*.rs`): the Java 4.1 clients (consumer, admin,
//! kafka-consumer-groups) use the highest of each range, kafka-python the lower ones.

use kafka_protocol::messages::ApiKey;

use crate::wire::api::ApiRange;

pub const FIND_COORDINATOR: ApiRange = ApiRange {
    key: ApiKey::FindCoordinator,
    min: 0,
    max: 6,
};
pub const JOIN_GROUP: ApiRange = ApiRange {
    key: ApiKey::JoinGroup,
    min: 0,
    max: 9,
};
pub const SYNC_GROUP: ApiRange = ApiRange {
    key: ApiKey::SyncGroup,
    min: 0,
    max: 5,
};
pub const HEARTBEAT: ApiRange = ApiRange {
    key: ApiKey::Heartbeat,
    min: 0,
    max: 4,
};
pub const LEAVE_GROUP: ApiRange = ApiRange {
    key: ApiKey::LeaveGroup,
    min: 0,
    max: 5,
};
pub const OFFSET_COMMIT: ApiRange = ApiRange {
    key: ApiKey::OffsetCommit,
    min: 2,
    max: 9,
};
pub const OFFSET_FETCH: ApiRange = ApiRange {
    key: ApiKey::OffsetFetch,
    min: 1,
    max: 9,
};
pub const DESCRIBE_GROUPS: ApiRange = ApiRange {
    key: ApiKey::DescribeGroups,
    min: 0,
    max: 6,
};
pub const LIST_GROUPS: ApiRange = ApiRange {
    key: ApiKey::ListGroups,
    min: 0,
    max: 5,
};

/// Every group API the coordinator answers, for the endpoint's ApiVersions.
pub const GROUP_APIS: [ApiRange; 9] = [
    FIND_COORDINATOR,
    JOIN_GROUP,
    SYNC_GROUP,
    HEARTBEAT,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    DESCRIBE_GROUPS,
    LIST_GROUPS,
];
