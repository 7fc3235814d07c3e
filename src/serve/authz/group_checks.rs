//! Authorization of the consumer-group APIs as Kafka's `KafkaApis` does it, kept out of the
//! group service's handler: each function takes the request (or the coordinator's answer) and
//! the client's permission check, and says what to refuse or rewrites the answer. Sans-IO.
//!
//! | API | needs | refused with |
//! |---|---|---|
//! | FindCoordinator | DESCRIBE on the group / transactional id | GROUP_ / TRANSACTIONAL_ID_AUTHORIZATION_FAILED per key |
//! | JoinGroup, SyncGroup, Heartbeat, LeaveGroup | READ on the group | GROUP_AUTHORIZATION_FAILED |
//! | OffsetCommit | READ on the group, READ on each topic | GROUP_ for all partitions, TOPIC_ per topic |
//! | OffsetFetch | DESCRIBE on the group, DESCRIBE on each topic | GROUP_ (top level or per group), TOPIC_ per named topic; unauthorized topics left out of "all" |
//! | DescribeGroups | DESCRIBE on each group | GROUP_ per group |
//! | ListGroups | DESCRIBE on the cluster, else the groups it may DESCRIBE | (filtered) |

use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    DescribeGroupsResponse, FindCoordinatorResponse, ListGroupsResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetFetchResponse,
};

use crate::serve::authz::acl::{Operation, ResourceType, CLUSTER_NAME};
use crate::serve::authz::{
    GROUP_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
};

/// The client's permission check: may it do this operation on this resource?
pub type Check<'a> = &'a dyn Fn(Operation, ResourceType, &str) -> bool;

/// FindCoordinator key type 1 (transaction); 0 is a group.
const KEY_TYPE_TRANSACTION: i8 = 1;

/// Rewrites a FindCoordinator answer: keys the client may not DESCRIBE get the error instead
/// of the coordinator. `keys` are the keys asked for in the request's order (v0–3: one key).
pub fn find_coordinator(
    check: Check<'_>,
    key_type: i8,
    keys: &[String],
    resp: &mut FindCoordinatorResponse,
) {
    let (rtype, code) = if key_type == KEY_TYPE_TRANSACTION {
        (
            ResourceType::TransactionalId,
            TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        )
    } else {
        (ResourceType::Group, GROUP_AUTHORIZATION_FAILED)
    };
    let denied = |k: &str| !check(Operation::Describe, rtype, k);
    if resp.coordinators.is_empty() {
        if keys.first().is_some_and(|k| denied(k)) {
            resp.error_code = code;
            resp.error_message = None;
            resp.node_id = kafka_protocol::messages::BrokerId(-1);
            resp.host = Default::default();
            resp.port = -1;
        }
        return;
    }
    for c in &mut resp.coordinators {
        if denied(&c.key) {
            c.error_code = code;
            c.error_message = None;
            c.node_id = kafka_protocol::messages::BrokerId(-1);
            c.host = Default::default();
            c.port = -1;
        }
    }
}

/// Whether a membership request (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) for `group` is
/// allowed.
pub fn membership(check: Check<'_>, group: &str) -> bool {
    check(Operation::Read, ResourceType::Group, group)
}

/// Splits an OffsetCommit: `Err(all topics)` when the group is not readable (every partition
/// answers GROUP_AUTHORIZATION_FAILED); otherwise removes the topics the client may not READ
/// from `req` and returns their answers (TOPIC_AUTHORIZATION_FAILED), to be appended to the
/// coordinator's answer for the rest.
pub fn offset_commit(
    check: Check<'_>,
    req: &mut OffsetCommitRequest,
) -> Result<Vec<OffsetCommitResponseTopic>, Vec<OffsetCommitResponseTopic>> {
    let answer = |t: &kafka_protocol::messages::offset_commit_request::OffsetCommitRequestTopic,
                  code: i16| {
        let mut r = OffsetCommitResponseTopic::default();
        r.name = t.name.clone();
        r.topic_id = t.topic_id;
        r.partitions = t
            .partitions
            .iter()
            .map(|p| {
                let mut rp = OffsetCommitResponsePartition::default();
                rp.partition_index = p.partition_index;
                rp.error_code = code;
                rp
            })
            .collect();
        r
    };
    if !check(Operation::Read, ResourceType::Group, req.group_id.as_str()) {
        return Err(req
            .topics
            .iter()
            .map(|t| answer(t, GROUP_AUTHORIZATION_FAILED))
            .collect());
    }
    let (ok, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut req.topics)
        .into_iter()
        .partition(|t| check(Operation::Read, ResourceType::Topic, t.name.as_str()));
    req.topics = ok;
    Ok(denied
        .iter()
        .map(|t| answer(t, TOPIC_AUTHORIZATION_FAILED))
        .collect())
}

/// Finishes an OffsetCommit answer with the refused topics.
pub fn offset_commit_answer(
    resp: &mut OffsetCommitResponse,
    refused: Vec<OffsetCommitResponseTopic>,
) {
    resp.topics.extend(refused);
}

/// Rewrites an OffsetFetch answer. `named`: whether the request named its topics (per group
/// for v8+, in the groups' order) — named topics the client may not DESCRIBE answer
/// TOPIC_AUTHORIZATION_FAILED, and are left out of an all-topics answer; a group it may not
/// DESCRIBE answers GROUP_AUTHORIZATION_FAILED with no topics.
pub fn offset_fetch(
    check: Check<'_>,
    version: i16,
    group_v0_7: &str,
    named: &[bool],
    resp: &mut OffsetFetchResponse,
) {
    let may_group = |g: &str| check(Operation::Describe, ResourceType::Group, g);
    let may_topic = |t: &str| check(Operation::Describe, ResourceType::Topic, t);
    if version < 8 {
        if !may_group(group_v0_7) {
            resp.topics.clear();
            resp.error_code = GROUP_AUTHORIZATION_FAILED;
            return;
        }
        let named = named.first().copied().unwrap_or(true);
        resp.topics.retain(|t| named || may_topic(t.name.as_str()));
        for t in &mut resp.topics {
            if !may_topic(t.name.as_str()) {
                for p in &mut t.partitions {
                    p.committed_offset = -1;
                    p.committed_leader_epoch = -1;
                    p.metadata = None;
                    p.error_code = TOPIC_AUTHORIZATION_FAILED;
                }
            }
        }
        return;
    }
    for (i, g) in resp.groups.iter_mut().enumerate() {
        if !may_group(g.group_id.as_str()) {
            g.topics.clear();
            g.error_code = GROUP_AUTHORIZATION_FAILED;
            continue;
        }
        let named = named.get(i).copied().unwrap_or(true);
        g.topics.retain(|t| named || may_topic(t.name.as_str()));
        for t in &mut g.topics {
            if !may_topic(t.name.as_str()) {
                for p in &mut t.partitions {
                    p.committed_offset = -1;
                    p.committed_leader_epoch = -1;
                    p.metadata = None;
                    p.error_code = TOPIC_AUTHORIZATION_FAILED;
                }
            }
        }
    }
}

/// Replaces, in a DescribeGroups answer, each group the client may not DESCRIBE by an entry
/// with GROUP_AUTHORIZATION_FAILED and nothing else.
pub fn describe_groups(check: Check<'_>, resp: &mut DescribeGroupsResponse) {
    for g in &mut resp.groups {
        if !check(
            Operation::Describe,
            ResourceType::Group,
            g.group_id.as_str(),
        ) {
            let mut d = DescribedGroup::default();
            d.group_id = g.group_id.clone();
            d.error_code = GROUP_AUTHORIZATION_FAILED;
            *g = d;
        }
    }
}

/// Leaves in a ListGroups answer only the groups the client may DESCRIBE, unless it may
/// DESCRIBE the cluster.
pub fn list_groups(check: Check<'_>, resp: &mut ListGroupsResponse) {
    if check(Operation::Describe, ResourceType::Cluster, CLUSTER_NAME) {
        return;
    }
    resp.groups.retain(|g| {
        check(
            Operation::Describe,
            ResourceType::Group,
            g.group_id.as_str(),
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::list_groups_response::ListedGroup;
    use kafka_protocol::messages::offset_commit_request::OffsetCommitRequestTopic;
    use kafka_protocol::messages::offset_fetch_response::{
        OffsetFetchResponsePartition, OffsetFetchResponseTopic,
    };
    use kafka_protocol::messages::{GroupId, TopicName};
    use kafka_protocol::protocol::StrBytes;

    /// Allows group `g` and topic `t` (and DESCRIBE only on them), nothing else.
    fn check(op: Operation, rt: ResourceType, name: &str) -> bool {
        let _ = op;
        matches!(
            (rt, name),
            (ResourceType::Group, "g") | (ResourceType::Topic, "t")
        )
    }

    fn topic(name: &str) -> OffsetCommitRequestTopic {
        let mut t = OffsetCommitRequestTopic::default();
        t.name = TopicName(StrBytes::from_string(name.into()));
        t.partitions = vec![Default::default()];
        t
    }

    #[test]
    fn offset_commit_splits_topics_and_groups() {
        let mut req = OffsetCommitRequest::default();
        req.group_id = GroupId(StrBytes::from_static_str("g"));
        req.topics = vec![topic("t"), topic("u")];
        let refused = offset_commit(&check, &mut req).unwrap();
        assert_eq!(req.topics.len(), 1);
        assert_eq!(refused[0].name.as_str(), "u");
        assert_eq!(
            refused[0].partitions[0].error_code,
            TOPIC_AUTHORIZATION_FAILED
        );
        req.group_id = GroupId(StrBytes::from_static_str("h"));
        let all = offset_commit(&check, &mut req).unwrap_err();
        assert_eq!(all[0].partitions[0].error_code, GROUP_AUTHORIZATION_FAILED);
    }

    #[test]
    fn offset_fetch_hides_and_refuses() {
        let fetched = |names: &[&str]| {
            let mut r = OffsetFetchResponse::default();
            r.topics = names
                .iter()
                .map(|n| {
                    let mut t = OffsetFetchResponseTopic::default();
                    t.name = TopicName(StrBytes::from_string(n.to_string()));
                    let mut p = OffsetFetchResponsePartition::default();
                    p.committed_offset = 5;
                    t.partitions = vec![p];
                    t
                })
                .collect();
            r
        };
        let mut all = fetched(&["t", "u"]);
        offset_fetch(&check, 7, "g", &[false], &mut all);
        assert_eq!(all.topics.len(), 1);
        let mut named = fetched(&["t", "u"]);
        offset_fetch(&check, 7, "g", &[true], &mut named);
        assert_eq!(
            named.topics[1].partitions[0].error_code,
            TOPIC_AUTHORIZATION_FAILED
        );
        assert_eq!(named.topics[1].partitions[0].committed_offset, -1);
        let mut other = fetched(&["t"]);
        offset_fetch(&check, 7, "h", &[true], &mut other);
        assert_eq!(other.error_code, GROUP_AUTHORIZATION_FAILED);
        assert!(other.topics.is_empty());
    }

    #[test]
    fn list_and_find() {
        let mut l = ListGroupsResponse::default();
        for g in ["g", "h"] {
            let mut lg = ListedGroup::default();
            lg.group_id = GroupId(StrBytes::from_static_str(g));
            l.groups.push(lg);
        }
        list_groups(&check, &mut l);
        assert_eq!(l.groups.len(), 1);
        let mut f = FindCoordinatorResponse::default();
        f.port = 9092;
        find_coordinator(&check, 0, &["h".into()], &mut f);
        assert_eq!((f.error_code, f.port), (GROUP_AUTHORIZATION_FAILED, -1));
        let mut f = FindCoordinatorResponse::default();
        find_coordinator(&check, 1, &["g".into()], &mut f);
        assert_eq!(f.error_code, TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
}
