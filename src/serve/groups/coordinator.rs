//! The group coordinator as the endpoint sees it: decoded `kafka-protocol` requests in,
//! response structs out, for FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
//! TxnOffsetCommit (its offsets held pending until the transaction coordinator ends them),
//! OffsetCommit, OffsetFetch, DescribeGroups and ListGroups. No sockets and no clock: the
//! caller passes `now` (ms, monotonic) and drives `tick` at `next_deadline`.
//!
//! JoinGroup and SyncGroup may return `None`: the request is parked under the caller's
//! `Waiter` and its response comes out of `take_replies` later (after another member's
//! request or a `tick`). Committed offsets are written to the `OffsetStore` before a commit is
//! answered.

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeGroupsRequest, DescribeGroupsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest,
    ListGroupsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
    OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse, TopicName, TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::ids::{LeaderEpoch, Offset, ProducerId, TimestampMs, TopicPartition};
use crate::limits::{
    GROUPS_MAX, GROUP_ID_BYTES_MAX, GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT,
    GROUP_MEMBER_BLOB_BYTES_MAX, GROUP_REBALANCE_TIMEOUT_MS_MAX, GROUP_SESSION_TIMEOUT_MS_MAX,
    GROUP_SESSION_TIMEOUT_MS_MIN, OFFSET_METADATA_BYTES_MAX,
};
use crate::serve::groups::group::{
    Group, GroupState, JoinArgs, JoinResult, Reply, SyncResult, Waiter,
};
use crate::serve::groups::offsets::{
    CommittedOffset, OffsetKey, OffsetStore, OffsetStoreError, PendingOffset,
};

/// Where clients find the coordinator (kmirror itself) and how groups behave.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
    pub initial_rebalance_delay_ms: i64,
}

impl CoordinatorConfig {
    pub fn new(node_id: i32, host: &str, port: i32) -> CoordinatorConfig {
        CoordinatorConfig {
            node_id,
            host: host.to_owned(),
            port,
            initial_rebalance_delay_ms: GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT,
        }
    }
}

/// Who sent a request (for DescribeGroups' member rows).
#[derive(Debug, Clone, Default)]
pub struct ClientInfo {
    pub client_id: String,
    pub host: String,
}

/// Which partitions exist on kmirror (a commit for another one is refused).
pub trait PartitionCatalog {
    fn exists(&self, tp: &TopicPartition) -> bool;
}

impl<F: Fn(&TopicPartition) -> bool> PartitionCatalog for F {
    fn exists(&self, tp: &TopicPartition) -> bool {
        self(tp)
    }
}

/// A parked JoinGroup/SyncGroup answered.
#[derive(Debug, Clone)]
pub enum Deferred {
    Join(Waiter, JoinGroupResponse),
    Sync(Waiter, SyncGroupResponse),
}

/// Why an offset could not be written by the group-offset sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncWriteError {
    #[error("group {0} has active members on kmirror")]
    Active(String),
    #[error("group id is invalid")]
    InvalidGroup,
    #[error(transparent)]
    Store(#[from] OffsetStoreError),
}

/// One OffsetFetch answer row: partition, offset, error code.
type FetchRow = (i32, CommittedOffset, i16);

pub struct GroupCoordinator<S> {
    config: CoordinatorConfig,
    groups: BTreeMap<String, Group>,
    offsets: BTreeMap<String, BTreeMap<TopicPartition, CommittedOffset>>,
    /// Offsets committed inside open transactions, per producer id: invisible to OffsetFetch
    /// until the transaction coordinator commits them (`end_txn_offsets`).
    pending: BTreeMap<ProducerId, BTreeMap<OffsetKey, CommittedOffset>>,
    store: S,
    replies: Vec<Reply>,
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Why one partition of a commit is refused, if it is: the group's error, then the
/// partition's own (metadata too large, unknown partition).
fn refused(
    group_error: Option<i16>,
    metadata: &str,
    catalog: &dyn PartitionCatalog,
    tp: &TopicPartition,
) -> Option<i16> {
    if group_error.is_some() {
        group_error
    } else if metadata.len() > OFFSET_METADATA_BYTES_MAX {
        Some(ResponseError::OffsetMetadataTooLarge.code())
    } else if !catalog.exists(tp) {
        Some(ResponseError::UnknownTopicOrPartition.code())
    } else {
        None
    }
}

fn group_id_ok(id: &str) -> bool {
    !id.is_empty() && id.len() <= GROUP_ID_BYTES_MAX
}

impl<S: OffsetStore> GroupCoordinator<S> {
    /// Loads every committed offset from the store.
    pub fn open(config: CoordinatorConfig, store: S) -> Result<Self, OffsetStoreError> {
        let mut offsets: BTreeMap<String, BTreeMap<TopicPartition, CommittedOffset>> =
            BTreeMap::new();
        for (k, v) in store.load()? {
            offsets.entry(k.group).or_default().insert(k.tp, v);
        }
        let mut pending: BTreeMap<ProducerId, BTreeMap<OffsetKey, CommittedOffset>> =
            BTreeMap::new();
        for p in store.load_pending()? {
            pending
                .entry(p.producer)
                .or_default()
                .insert(p.key, p.value);
        }
        Ok(GroupCoordinator {
            config,
            groups: BTreeMap::new(),
            offsets,
            pending,
            store,
            replies: Vec::new(),
        })
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    #[cfg(test)]
    pub(crate) fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// Where FindCoordinator sends clients: known only once the endpoint has bound its port.
    pub fn set_address(&mut self, host: &str, port: i32) {
        self.config.host = host.to_owned();
        self.config.port = port;
    }

    /// Gives the store back (to close it).
    pub fn into_store(self) -> S {
        self.store
    }

    /// Answers to parked requests produced since the last call.
    pub fn take_replies(&mut self) -> Vec<Deferred> {
        self.replies
            .drain(..)
            .map(|r| match r {
                Reply::Join(w, j) => Deferred::Join(w, join_response(w.version, j)),
                Reply::Sync(w, r) => Deferred::Sync(w, sync_response(r)),
            })
            .collect()
    }

    /// True when answers to parked requests wait to be taken.
    pub fn has_replies(&self) -> bool {
        !self.replies.is_empty()
    }

    /// The answer to the parked request `token`, once it exists.
    pub fn take_reply(&mut self, token: u64) -> Option<Deferred> {
        let i = self.replies.iter().position(|r| match r {
            Reply::Join(w, _) | Reply::Sync(w, _) => w.token == token,
        })?;
        Some(match self.replies.remove(i) {
            Reply::Join(w, j) => Deferred::Join(w, join_response(w.version, j)),
            Reply::Sync(w, r) => Deferred::Sync(w, sync_response(r)),
        })
    }

    /// The earliest `now` at which `tick` has work.
    pub fn next_deadline(&self) -> Option<i64> {
        self.groups.values().filter_map(Group::next_deadline).min()
    }

    /// Session expiry, join-round timeouts; then drops member-less groups with no offsets.
    pub fn tick(&mut self, now: i64) {
        for g in self.groups.values_mut() {
            g.tick(now, &mut self.replies);
        }
        let offsets = &self.offsets;
        self.groups.retain(|id, g| {
            !(g.is_empty() && g.state() == GroupState::Empty) || offsets.contains_key(id)
        });
    }

    /// True when the group has a member (or one about to join) on kmirror.
    pub fn is_active(&self, group: &str) -> bool {
        self.groups.get(group).is_some_and(|g| !g.is_empty())
    }

    pub fn committed(&self, group: &str, tp: &TopicPartition) -> Option<&CommittedOffset> {
        self.offsets.get(group)?.get(tp)
    }

    /// Every group's committed offset of `tp` (a drill copies them for its clone).
    pub fn committed_by_groups(&self, tp: &TopicPartition) -> Vec<(String, CommittedOffset)> {
        self.offsets
            .iter()
            .filter_map(|(g, m)| m.get(tp).map(|o| (g.clone(), o.clone())))
            .collect()
    }

    /// Deletes every group's committed offset of `tp` (a drill's clone, deleted with it);
    /// returns how many there were. Each is deleted in the store before memory, so a failure
    /// part-way leaves the rest in both and a repeat finishes the job.
    pub fn delete_partition_offsets(
        &mut self,
        tp: &TopicPartition,
    ) -> Result<usize, OffsetStoreError> {
        let groups: Vec<String> = self
            .offsets
            .iter()
            .filter(|(_, m)| m.contains_key(tp))
            .map(|(g, _)| g.clone())
            .collect();
        for g in &groups {
            let key = OffsetKey {
                group: g.clone(),
                tp: tp.clone(),
            };
            self.store.delete(&key)?;
            if let Some(m) = self.offsets.get_mut(g) {
                m.remove(tp);
                if m.is_empty() {
                    self.offsets.remove(g);
                }
            }
        }
        Ok(groups.len())
    }

    pub fn group(&self, group: &str) -> Option<&Group> {
        self.groups.get(group)
    }

    fn known_groups(&self) -> usize {
        self.groups.len()
            + self
                .offsets
                .keys()
                .filter(|k| !self.groups.contains_key(*k))
                .count()
    }

    pub fn find_coordinator(
        &self,
        version: i16,
        req: &FindCoordinatorRequest,
    ) -> FindCoordinatorResponse {
        // Key type 0 is a group, 1 a transactional id: kmirror is the only node for both.
        let key_type_ok = (0..=1).contains(&req.key_type);
        let error = if key_type_ok {
            0
        } else {
            ResponseError::InvalidRequest.code()
        };
        let mut resp = FindCoordinatorResponse::default();
        if version >= 4 {
            resp.coordinators = req
                .coordinator_keys
                .iter()
                .map(|k| {
                    let mut c = Coordinator::default()
                        .with_key(k.clone())
                        .with_error_code(error);
                    if key_type_ok {
                        c = c
                            .with_node_id(BrokerId(self.config.node_id))
                            .with_host(s(&self.config.host))
                            .with_port(self.config.port);
                    } else {
                        c = c.with_node_id(BrokerId(-1)).with_port(-1);
                    }
                    c
                })
                .collect();
        } else if key_type_ok {
            resp.node_id = BrokerId(self.config.node_id);
            resp.host = s(&self.config.host);
            resp.port = self.config.port;
        } else {
            resp.error_code = error;
            resp.node_id = BrokerId(-1);
            resp.port = -1;
        }
        resp
    }

    pub fn join_group(
        &mut self,
        now: i64,
        waiter: Waiter,
        client: &ClientInfo,
        req: &JoinGroupRequest,
    ) -> Option<JoinGroupResponse> {
        let version = waiter.version;
        let member_id = req.member_id.to_string();
        let fail =
            |e: ResponseError| Some(join_response(version, JoinResult::error(e, &member_id)));
        let group_id = req.group_id.0.as_str();
        if !group_id_ok(group_id) || member_id.len() > GROUP_ID_BYTES_MAX {
            return fail(ResponseError::InvalidGroupId);
        }
        if !(GROUP_SESSION_TIMEOUT_MS_MIN..=GROUP_SESSION_TIMEOUT_MS_MAX)
            .contains(&req.session_timeout_ms)
        {
            return fail(ResponseError::InvalidSessionTimeout);
        }
        if req
            .protocols
            .iter()
            .any(|p| p.metadata.len() > GROUP_MEMBER_BLOB_BYTES_MAX)
        {
            return fail(ResponseError::InvalidRequest);
        }
        if !self.groups.contains_key(group_id) {
            if !member_id.is_empty() {
                return fail(ResponseError::UnknownMemberId);
            }
            if self.known_groups() >= GROUPS_MAX && !self.offsets.contains_key(group_id) {
                return fail(ResponseError::CoordinatorNotAvailable);
            }
            let g = Group::new(group_id, self.config.initial_rebalance_delay_ms);
            self.groups.insert(group_id.to_owned(), g);
        }
        let g = self.groups.get_mut(group_id).expect("inserted above");
        let args = JoinArgs {
            member_id,
            instance_id: req.group_instance_id.as_ref().map(|i| i.to_string()),
            client_id: client.client_id.clone(),
            client_host: client.host.clone(),
            session_timeout_ms: req.session_timeout_ms,
            // v0 has no rebalance timeout: Kafka uses the session timeout. The bound keeps a
            // parked JoinGroup (a waiting endpoint thread) from waiting without end.
            rebalance_timeout_ms: if version >= 1 {
                req.rebalance_timeout_ms
            } else {
                req.session_timeout_ms
            }
            .clamp(0, GROUP_REBALANCE_TIMEOUT_MS_MAX),
            protocol_type: req.protocol_type.to_string(),
            protocols: req
                .protocols
                .iter()
                .map(|p| (p.name.to_string(), p.metadata.clone()))
                .collect(),
            require_known_member_id: version >= 4,
        };
        g.join(now, waiter, args, &mut self.replies)
            .map(|r| join_response(version, r))
    }

    pub fn sync_group(
        &mut self,
        now: i64,
        waiter: Waiter,
        req: &SyncGroupRequest,
    ) -> Option<SyncGroupResponse> {
        let Some(g) = self.groups.get_mut(req.group_id.0.as_str()) else {
            return Some(sync_response(SyncResult::error(
                ResponseError::UnknownMemberId,
            )));
        };
        if req
            .assignments
            .iter()
            .any(|a| a.assignment.len() > GROUP_MEMBER_BLOB_BYTES_MAX)
        {
            return Some(sync_response(SyncResult::error(
                ResponseError::InvalidRequest,
            )));
        }
        let assignments = req
            .assignments
            .iter()
            .map(|a| (a.member_id.to_string(), a.assignment.clone()))
            .collect();
        g.sync(
            now,
            waiter,
            req.generation_id,
            req.member_id.as_str(),
            req.protocol_type.as_deref(),
            req.protocol_name.as_deref(),
            assignments,
            &mut self.replies,
        )
        .map(sync_response)
    }

    pub fn heartbeat(&mut self, now: i64, req: &HeartbeatRequest) -> HeartbeatResponse {
        let error = match self.groups.get_mut(req.group_id.0.as_str()) {
            Some(g) => g.heartbeat(now, req.generation_id, req.member_id.as_str()),
            None => ResponseError::UnknownMemberId.code(),
        };
        HeartbeatResponse::default().with_error_code(error)
    }

    pub fn leave_group(
        &mut self,
        now: i64,
        version: i16,
        req: &LeaveGroupRequest,
    ) -> LeaveGroupResponse {
        let ids: Vec<(String, Option<StrBytes>)> = if version >= 3 {
            req.members
                .iter()
                .map(|m| (m.member_id.to_string(), m.group_instance_id.clone()))
                .collect()
        } else {
            vec![(req.member_id.to_string(), None)]
        };
        let group = self.groups.get_mut(req.group_id.0.as_str());
        let mut resp = LeaveGroupResponse::default();
        let Some(g) = group else {
            resp.error_code = ResponseError::UnknownMemberId.code();
            if version >= 3 {
                resp.error_code = 0;
                resp.members = ids
                    .into_iter()
                    .map(|(id, inst)| {
                        MemberResponse::default()
                            .with_member_id(s(&id))
                            .with_group_instance_id(inst)
                            .with_error_code(ResponseError::UnknownMemberId.code())
                    })
                    .collect();
            }
            return resp;
        };
        let mut errors = Vec::with_capacity(ids.len());
        for (id, inst) in ids {
            errors.push((g.leave(now, &id, &mut self.replies), id, inst));
        }
        if version >= 3 {
            resp.members = errors
                .into_iter()
                .map(|(e, id, inst)| {
                    MemberResponse::default()
                        .with_member_id(s(&id))
                        .with_group_instance_id(inst)
                        .with_error_code(e)
                })
                .collect();
        } else {
            resp.error_code = errors.first().map_or(0, |(e, _, _)| *e);
        }
        resp
    }

    pub fn offset_commit(
        &mut self,
        catalog: &dyn PartitionCatalog,
        req: &OffsetCommitRequest,
    ) -> OffsetCommitResponse {
        let group_id = req.group_id.0.as_str();
        let group_error = if !group_id_ok(group_id) {
            Some(ResponseError::InvalidGroupId.code())
        } else {
            match self.groups.get(group_id) {
                Some(g) => g
                    .check_commit(req.generation_id_or_member_epoch, req.member_id.as_str())
                    .err(),
                None => self.commit_without_group(group_id, req.generation_id_or_member_epoch),
            }
        };
        let now_wall = TimestampMs(wall_ms());
        let mut topics = Vec::with_capacity(req.topics.len());
        for t in &req.topics {
            let mut parts = Vec::with_capacity(t.partitions.len());
            for p in &t.partitions {
                let tp = TopicPartition::new(t.name.0.as_str(), p.partition_index);
                let metadata = p.committed_metadata.as_deref().unwrap_or("");
                let error = if let Some(e) = refused(group_error, metadata, catalog, &tp) {
                    e
                } else {
                    let value = CommittedOffset {
                        offset: Offset(p.committed_offset),
                        leader_epoch: LeaderEpoch(p.committed_leader_epoch.max(-1)),
                        metadata: metadata.to_owned(),
                        commit_timestamp: now_wall,
                    };
                    self.write_offset(group_id, tp, value)
                };
                parts.push(
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(error),
                );
            }
            topics.push(
                OffsetCommitResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_partitions(parts),
            );
        }
        OffsetCommitResponse::default().with_topics(topics)
    }

    /// A commit (plain or transactional) to a group with no members here: only one with no
    /// generation may create it (an admin, a consumer with manual assignment, a producer).
    fn commit_without_group(&self, group_id: &str, generation: i32) -> Option<i16> {
        if generation >= 0 {
            return Some(ResponseError::IllegalGeneration.code());
        }
        (self.known_groups() >= GROUPS_MAX && !self.offsets.contains_key(group_id))
            .then(|| ResponseError::CoordinatorNotAvailable.code())
    }

    fn write_offset(&mut self, group: &str, tp: TopicPartition, value: CommittedOffset) -> i16 {
        let key = OffsetKey {
            group: group.to_owned(),
            tp,
        };
        match self.store.put(&key, &value) {
            Ok(()) => {
                self.offsets
                    .entry(key.group)
                    .or_default()
                    .insert(key.tp, value);
                0
            }
            Err(e) => {
                tracing::error!(group, partition = %key.tp, "cannot store a committed offset: {e}");
                // Retriable for the client: it commits again once storage recovers.
                ResponseError::CoordinatorNotAvailable.code()
            }
        }
    }

    /// Records a transactional offset as pending for its producer (store first), as
    /// `write_offset` does for a committed one.
    fn write_pending(&mut self, pending: PendingOffset) -> i16 {
        match self.store.put_pending(&pending) {
            Ok(()) => {
                self.pending
                    .entry(pending.producer)
                    .or_default()
                    .insert(pending.key, pending.value);
                0
            }
            Err(e) => {
                tracing::error!(
                    group = pending.key.group,
                    "cannot store a transactional offset: {e}"
                );
                // Retriable for the client, as for a plain commit.
                ResponseError::CoordinatorNotAvailable.code()
            }
        }
    }

    /// TxnOffsetCommit: the offsets are held as pending for `producer` (recorded in the store
    /// first) until the transaction coordinator ends its transaction. The caller (the
    /// transaction coordinator) has already checked that `producer` is the current producer of
    /// the transactional id, with this group in its open transaction.
    pub fn txn_offset_commit(
        &mut self,
        catalog: &dyn PartitionCatalog,
        producer: ProducerId,
        req: &TxnOffsetCommitRequest,
    ) -> TxnOffsetCommitResponse {
        let group_id = req.group_id.0.as_str();
        let group_error = if !group_id_ok(group_id) {
            Some(ResponseError::InvalidGroupId.code())
        } else {
            match self.groups.get(group_id) {
                // v0-2 carry no generation (-1, ""): accepted, the producer epoch fences.
                Some(g) => g
                    .check_txn_commit(req.generation_id, req.member_id.as_str())
                    .err(),
                None => self.commit_without_group(group_id, req.generation_id),
            }
        };
        let now_wall = TimestampMs(wall_ms());
        let mut topics = Vec::with_capacity(req.topics.len());
        for t in &req.topics {
            let mut parts = Vec::with_capacity(t.partitions.len());
            for p in &t.partitions {
                let tp = TopicPartition::new(t.name.0.as_str(), p.partition_index);
                let metadata = p.committed_metadata.as_deref().unwrap_or("");
                let error = if let Some(e) = refused(group_error, metadata, catalog, &tp) {
                    e
                } else {
                    let pending = PendingOffset {
                        producer,
                        key: OffsetKey {
                            group: group_id.to_owned(),
                            tp,
                        },
                        value: CommittedOffset {
                            offset: Offset(p.committed_offset),
                            leader_epoch: LeaderEpoch(p.committed_leader_epoch.max(-1)),
                            metadata: metadata.to_owned(),
                            commit_timestamp: now_wall,
                        },
                    };
                    self.write_pending(pending)
                };
                parts.push(
                    TxnOffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(error),
                );
            }
            topics.push(
                TxnOffsetCommitResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_partitions(parts),
            );
        }
        TxnOffsetCommitResponse::default().with_topics(topics)
    }

    /// The end of `producer`'s transaction: on commit its pending offsets become the committed
    /// ones, on abort they are dropped. Each offset is written, then its pending record
    /// deleted, so a failure part-way leaves the rest pending and a repeat finishes the job.
    /// Returns how many pending offsets there were.
    pub fn end_txn_offsets(
        &mut self,
        producer: ProducerId,
        commit: bool,
    ) -> Result<usize, OffsetStoreError> {
        let Some(mut held) = self.pending.remove(&producer) else {
            return Ok(0);
        };
        let n = held.len();
        while let Some((key, value)) = held.pop_first() {
            let step = (|| {
                if commit {
                    self.store.put(&key, &value)?;
                }
                self.store.delete_pending(producer, &key)
            })();
            if let Err(e) = step {
                held.insert(key, value);
                self.pending.insert(producer, held);
                return Err(e);
            }
            if commit {
                self.offsets
                    .entry(key.group)
                    .or_default()
                    .insert(key.tp, value);
            }
        }
        Ok(n)
    }

    /// Producers holding pending transactional offsets (checked against the transaction
    /// coordinator at start).
    pub fn pending_producers(&self) -> Vec<ProducerId> {
        self.pending.keys().copied().collect()
    }

    /// True when an open transaction holds an offset for `group`'s `tp`.
    pub fn has_pending(&self, group: &str, tp: &TopicPartition) -> bool {
        let key = OffsetKey {
            group: group.to_owned(),
            tp: tp.clone(),
        };
        self.pending.values().any(|m| m.contains_key(&key))
    }

    /// Writes an offset taken from a mirror's source (group-offset sync). Refused while the
    /// group has members on kmirror: their own commits win.
    pub fn sync_offset(
        &mut self,
        group: &str,
        tp: TopicPartition,
        offset: Offset,
        leader_epoch: LeaderEpoch,
        metadata: &str,
    ) -> Result<bool, SyncWriteError> {
        if !group_id_ok(group) {
            return Err(SyncWriteError::InvalidGroup);
        }
        if self.is_active(group) {
            return Err(SyncWriteError::Active(group.to_owned()));
        }
        if let Some(cur) = self.committed(group, &tp) {
            if cur.offset == offset && cur.leader_epoch == leader_epoch && cur.metadata == metadata
            {
                return Ok(false);
            }
        }
        let metadata: String = metadata
            .chars()
            .take(OFFSET_METADATA_BYTES_MAX / 4)
            .collect();
        let value = CommittedOffset {
            offset,
            leader_epoch,
            metadata,
            commit_timestamp: TimestampMs(wall_ms()),
        };
        let key = OffsetKey {
            group: group.to_owned(),
            tp,
        };
        self.store.put(&key, &value)?;
        self.offsets
            .entry(key.group)
            .or_default()
            .insert(key.tp, value);
        Ok(true)
    }

    /// OffsetFetch. With `require_stable` (v7+) a partition whose offset an open transaction
    /// holds answers UNSTABLE_OFFSET_COMMIT (the client retries once the transaction ends).
    pub fn offset_fetch(&self, version: i16, req: &OffsetFetchRequest) -> OffsetFetchResponse {
        let stable = version >= 7 && req.require_stable;
        let mut resp = OffsetFetchResponse::default();
        if version >= 8 {
            resp.groups = req
                .groups
                .iter()
                .map(|g| {
                    let wanted: Option<Vec<(String, Vec<i32>)>> = g.topics.as_ref().map(|ts| {
                        ts.iter()
                            .map(|t| (t.name.0.to_string(), t.partition_indexes.clone()))
                            .collect()
                    });
                    let rows = self.fetch_rows(g.group_id.0.as_str(), wanted, stable);
                    OffsetFetchResponseGroup::default()
                        .with_group_id(g.group_id.clone())
                        .with_topics(
                            rows.into_iter()
                                .map(|(topic, parts)| {
                                    OffsetFetchResponseTopics::default()
                                        .with_name(TopicName(s(&topic)))
                                        .with_partitions(
                                            parts
                                                .into_iter()
                                                .map(|(p, c, error)| {
                                                    OffsetFetchResponsePartitions::default()
                                                        .with_partition_index(p)
                                                        .with_committed_offset(c.offset.0)
                                                        .with_committed_leader_epoch(
                                                            c.leader_epoch.0,
                                                        )
                                                        .with_metadata(Some(s(&c.metadata)))
                                                        .with_error_code(error)
                                                })
                                                .collect(),
                                        )
                                })
                                .collect(),
                        )
                })
                .collect();
        } else {
            let wanted = req.topics.as_ref().map(|ts| {
                ts.iter()
                    .map(|t| (t.name.0.to_string(), t.partition_indexes.clone()))
                    .collect()
            });
            let rows = self.fetch_rows(req.group_id.0.as_str(), wanted, stable);
            resp.topics = rows
                .into_iter()
                .map(|(topic, parts)| {
                    OffsetFetchResponseTopic::default()
                        .with_name(TopicName(s(&topic)))
                        .with_partitions(
                            parts
                                .into_iter()
                                .map(|(p, c, error)| {
                                    OffsetFetchResponsePartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(c.offset.0)
                                        .with_committed_leader_epoch(c.leader_epoch.0)
                                        .with_metadata(Some(s(&c.metadata)))
                                        .with_error_code(error)
                                })
                                .collect(),
                        )
                })
                .collect();
        }
        resp
    }

    /// The offsets asked for (all of the group's when `wanted` is `None`), each with its error
    /// code; a partition with no commit reads as offset -1 with empty metadata, as Kafka
    /// answers, and so does one held by an open transaction when `stable` is asked for.
    fn fetch_rows(
        &self,
        group: &str,
        wanted: Option<Vec<(String, Vec<i32>)>>,
        stable: bool,
    ) -> Vec<(String, Vec<FetchRow>)> {
        let none = CommittedOffset {
            offset: Offset(-1),
            leader_epoch: LeaderEpoch::NONE,
            metadata: String::new(),
            commit_timestamp: TimestampMs::NONE,
        };
        let table = self.offsets.get(group);
        let row = |tp: &TopicPartition, c: Option<&CommittedOffset>| {
            if stable && self.has_pending(group, tp) {
                (
                    tp.partition,
                    none.clone(),
                    ResponseError::UnstableOffsetCommit.code(),
                )
            } else {
                (tp.partition, c.cloned().unwrap_or_else(|| none.clone()), 0)
            }
        };
        match wanted {
            Some(topics) => topics
                .into_iter()
                .map(|(topic, parts)| {
                    let rows = parts
                        .into_iter()
                        .map(|p| {
                            let tp = TopicPartition::new(topic.as_str(), p);
                            row(&tp, table.and_then(|t| t.get(&tp)))
                        })
                        .collect();
                    (topic, rows)
                })
                .collect(),
            None => {
                let mut by_topic: BTreeMap<String, Vec<FetchRow>> = BTreeMap::new();
                for (tp, c) in table.into_iter().flatten() {
                    by_topic
                        .entry(tp.topic.clone())
                        .or_default()
                        .push(row(tp, Some(c)));
                }
                by_topic.into_iter().collect()
            }
        }
    }

    pub fn describe_groups(
        &self,
        version: i16,
        req: &DescribeGroupsRequest,
    ) -> DescribeGroupsResponse {
        let groups = req
            .groups
            .iter()
            .map(|id| self.describe_one(version, id))
            .collect();
        DescribeGroupsResponse::default().with_groups(groups)
    }

    fn describe_one(&self, version: i16, id: &GroupId) -> DescribedGroup {
        let name = id.0.as_str();
        let d = DescribedGroup::default().with_group_id(id.clone());
        if !group_id_ok(name) {
            return d
                .with_error_code(ResponseError::InvalidGroupId.code())
                .with_group_state(s("Dead"));
        }
        match self.groups.get(name) {
            Some(g) => {
                let protocol = g.protocol().unwrap_or("");
                let stable = g.state() == GroupState::Stable;
                let members = g
                    .members()
                    .into_iter()
                    .map(|m| {
                        DescribedGroupMember::default()
                            .with_member_id(s(&m.id))
                            .with_group_instance_id(m.instance_id.as_deref().map(s))
                            .with_client_id(s(&m.client_id))
                            .with_client_host(s(&m.client_host))
                            .with_member_metadata(if stable {
                                m.metadata(protocol)
                            } else {
                                Bytes::new()
                            })
                            .with_member_assignment(if stable {
                                m.assignment.clone()
                            } else {
                                Bytes::new()
                            })
                    })
                    .collect();
                d.with_group_state(s(g.state().as_str()))
                    .with_protocol_type(s(g.protocol_type().unwrap_or("")))
                    .with_protocol_data(s(protocol))
                    .with_members(members)
            }
            None if self.offsets.contains_key(name) => d.with_group_state(s("Empty")),
            None => {
                // Kafka 4 answers an unknown group with GROUP_ID_NOT_FOUND from v6 and with a
                // Dead group before.
                let d = d.with_group_state(s("Dead"));
                if version >= 6 {
                    d.with_error_code(ResponseError::GroupIdNotFound.code())
                        .with_error_message(Some(s(&format!("Group {name} not found."))))
                } else {
                    d
                }
            }
        }
    }

    pub fn list_groups(&self, version: i16, req: &ListGroupsRequest) -> ListGroupsResponse {
        let mut listed: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
        for id in self.offsets.keys() {
            listed.insert(id, ("", "Empty"));
        }
        for (id, g) in &self.groups {
            if g.is_empty() && g.state() == GroupState::Empty && !self.offsets.contains_key(id) {
                continue;
            }
            listed.insert(id, (g.protocol_type().unwrap_or(""), g.state().as_str()));
        }
        let states: Vec<String> = if version >= 4 {
            req.states_filter
                .iter()
                .map(|s| s.to_ascii_lowercase())
                .collect()
        } else {
            Vec::new()
        };
        let types: Vec<String> = if version >= 5 {
            req.types_filter
                .iter()
                .map(|s| s.to_ascii_lowercase())
                .collect()
        } else {
            Vec::new()
        };
        let groups = listed
            .into_iter()
            .filter(|(_, (_, st))| states.is_empty() || states.contains(&st.to_ascii_lowercase()))
            .filter(|_| types.is_empty() || types.iter().any(|t| t == "classic"))
            .map(|(id, (pt, st))| {
                let mut lg = ListedGroup::default()
                    .with_group_id(GroupId(s(id)))
                    .with_protocol_type(s(pt));
                if version >= 4 {
                    lg = lg.with_group_state(s(st));
                }
                if version >= 5 {
                    lg = lg.with_group_type(s("classic"));
                }
                lg
            })
            .collect();
        ListGroupsResponse::default().with_groups(groups)
    }
}

/// A JoinGroup error answer (for a parked request that could not wait any longer).
/// The transaction coordinator ends transactional offsets through the shared coordinator.
impl<S: OffsetStore + Send> crate::serve::txn::TxnOffsets
    for std::sync::Mutex<GroupCoordinator<S>>
{
    fn end_offsets(&self, producer: ProducerId, commit: bool) -> Result<(), String> {
        // A panic elsewhere under this lock leaves every offset either written or pending, and
        // ending them again is safe.
        self.lock()
            .unwrap_or_else(|p| p.into_inner())
            .end_txn_offsets(producer, commit)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn pending_producers(&self) -> Vec<ProducerId> {
        self.lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending_producers()
    }
}

pub fn join_error(version: i16, error: ResponseError, member_id: &str) -> JoinGroupResponse {
    join_response(version, JoinResult::error(error, member_id))
}

/// A SyncGroup error answer.
pub fn sync_error(error: ResponseError) -> SyncGroupResponse {
    sync_response(SyncResult::error(error))
}

fn join_response(version: i16, r: JoinResult) -> JoinGroupResponse {
    // Before v7 the protocol name is a non-nullable string.
    let protocol_name = match r.protocol_name {
        Some(n) => Some(s(&n)),
        None if version < 7 => Some(StrBytes::default()),
        None => None,
    };
    JoinGroupResponse::default()
        .with_error_code(r.error)
        .with_generation_id(r.generation)
        .with_protocol_type(r.protocol_type.as_deref().map(s))
        .with_protocol_name(protocol_name)
        .with_leader(s(&r.leader))
        .with_member_id(s(&r.member_id))
        .with_members(
            r.members
                .into_iter()
                .map(|(id, inst, meta)| {
                    JoinGroupResponseMember::default()
                        .with_member_id(s(&id))
                        .with_group_instance_id(inst.as_deref().map(s))
                        .with_metadata(meta)
                })
                .collect(),
        )
}

fn sync_response(r: SyncResult) -> SyncGroupResponse {
    SyncGroupResponse::default()
        .with_error_code(r.error)
        .with_protocol_type(r.protocol_type.as_deref().map(s))
        .with_protocol_name(r.protocol_name.as_deref().map(s))
        .with_assignment(r.assignment)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::groups::offsets::MemoryStore;
    use crate::serve::groups::versions::GROUP_APIS;
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::leave_group_request::MemberIdentity;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_fetch_request::{
        OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
    };
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    use kafka_protocol::protocol::Encodable;

    fn coord() -> GroupCoordinator<MemoryStore> {
        let mut c = CoordinatorConfig::new(7, "kmirror.local", 9092);
        c.initial_rebalance_delay_ms = 0;
        GroupCoordinator::open(c, MemoryStore::default()).unwrap()
    }

    #[test]
    fn a_partitions_offsets_are_listed_by_group_and_deleted_in_the_store_too() {
        let mut c = coord();
        let a = TopicPartition::new("drill.d.t", 0);
        let b = TopicPartition::new("t", 0);
        c.sync_offset("g1", a.clone(), Offset(5), LeaderEpoch(1), "m")
            .unwrap();
        c.sync_offset("g2", a.clone(), Offset(7), LeaderEpoch(1), "")
            .unwrap();
        c.sync_offset("g2", b.clone(), Offset(9), LeaderEpoch(1), "")
            .unwrap();
        let listed: Vec<(String, i64)> = c
            .committed_by_groups(&a)
            .into_iter()
            .map(|(g, o)| (g, o.offset.0))
            .collect();
        assert_eq!(listed, [("g1".to_owned(), 5), ("g2".to_owned(), 7)]);
        assert_eq!(c.delete_partition_offsets(&a).unwrap(), 2);
        assert!(c.committed_by_groups(&a).is_empty());
        assert_eq!(c.committed("g2", &b).map(|o| o.offset), Some(Offset(9)));
        // What a restart loads: only the other partition's offset.
        let stored: Vec<_> = c.store().load().unwrap();
        assert_eq!(stored.len(), 1, "{stored:?}");
        assert_eq!(stored[0].0.tp, b);
        assert_eq!(c.delete_partition_offsets(&a).unwrap(), 0);
    }

    fn client() -> ClientInfo {
        ClientInfo {
            client_id: "app".into(),
            host: "/10.0.0.1".into(),
        }
    }

    fn all(_: &TopicPartition) -> bool {
        true
    }

    fn encodes<T: Encodable>(msg: &T, version: i16) {
        let mut buf = bytes::BytesMut::new();
        msg.encode(&mut buf, version)
            .unwrap_or_else(|e| panic!("encode v{version}: {e}"));
    }

    fn join_req(member: &str) -> JoinGroupRequest {
        JoinGroupRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(20_000)
            .with_member_id(s(member))
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Bytes::from_static(b"sub"))])
    }

    fn commit_req(gen: i32, member: &str, offset: i64) -> OffsetCommitRequest {
        OffsetCommitRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_generation_id_or_member_epoch(gen)
            .with_member_id(s(member))
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(s("orders")))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(offset)
                    .with_committed_leader_epoch(3)
                    .with_committed_metadata(Some(s("meta")))])])
    }

    fn commit_errors(r: &OffsetCommitResponse) -> Vec<i16> {
        r.topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
            .collect()
    }

    /// A full round with the v9 dance; returns the member id.
    fn join_stable(c: &mut GroupCoordinator<MemoryStore>) -> String {
        let w = Waiter {
            token: 1,
            version: 9,
        };
        let r = c.join_group(0, w, &client(), &join_req("")).unwrap();
        assert_eq!(r.error_code, ResponseError::MemberIdRequired.code());
        let id = r.member_id.to_string();
        assert_eq!(c.join_group(0, w, &client(), &join_req(&id)), None);
        let replies = c.take_replies();
        let Deferred::Join(_, j) = &replies[0] else {
            panic!("expected a join reply")
        };
        assert_eq!((j.error_code, j.generation_id), (0, 1));
        let sync = SyncGroupRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_generation_id(1)
            .with_member_id(s(&id))
            .with_assignments(vec![SyncGroupRequestAssignment::default()
                .with_member_id(s(&id))
                .with_assignment(Bytes::from_static(b"orders-0"))]);
        assert_eq!(
            c.sync_group(
                1,
                Waiter {
                    token: 2,
                    version: 5
                },
                &sync
            ),
            None
        );
        let replies = c.take_replies();
        let Deferred::Sync(w, r) = &replies[0] else {
            panic!("expected a sync reply")
        };
        assert_eq!((w.token, r.error_code), (2, 0));
        assert_eq!(r.assignment, Bytes::from_static(b"orders-0"));
        id
    }

    #[test]
    fn find_coordinator_names_kmirror_in_old_and_batched_forms() {
        let c = coord();
        let r = c.find_coordinator(3, &FindCoordinatorRequest::default().with_key(s("g")));
        assert_eq!(
            (r.error_code, r.node_id.0, r.host.as_str(), r.port),
            (0, 7, "kmirror.local", 9092)
        );
        let r = c.find_coordinator(
            6,
            &FindCoordinatorRequest::default().with_coordinator_keys(vec![s("a"), s("b")]),
        );
        assert_eq!(r.coordinators.len(), 2);
        assert!(r
            .coordinators
            .iter()
            .all(|k| k.node_id.0 == 7 && k.error_code == 0));
        let r = c.find_coordinator(
            6,
            &FindCoordinatorRequest::default()
                .with_key_type(2)
                .with_coordinator_keys(vec![s("share")]),
        );
        assert_eq!(
            r.coordinators[0].error_code,
            ResponseError::InvalidRequest.code()
        );
        for v in 0..=6 {
            encodes(
                &c.find_coordinator(v, &FindCoordinatorRequest::default().with_key(s("g"))),
                v,
            );
        }
    }

    #[test]
    fn commit_and_fetch_in_a_stable_group_and_fencing() {
        let mut c = coord();
        let id = join_stable(&mut c);
        let r = c.offset_commit(&all, &commit_req(1, &id, 42));
        assert_eq!(commit_errors(&r), [0]);
        let r = c.offset_commit(&all, &commit_req(0, &id, 43));
        assert_eq!(commit_errors(&r), [ResponseError::IllegalGeneration.code()]);
        let r = c.offset_commit(&all, &commit_req(1, "stranger", 43));
        assert_eq!(commit_errors(&r), [ResponseError::UnknownMemberId.code()]);
        let r = c.offset_commit(&all, &commit_req(-1, "", 43));
        assert_eq!(
            commit_errors(&r),
            [ResponseError::UnknownMemberId.code()],
            "group has members"
        );
        assert_eq!(c.store().map.len(), 1);
        let got = c.committed("g", &TopicPartition::new("orders", 0)).unwrap();
        assert_eq!(
            (got.offset, got.leader_epoch, got.metadata.as_str()),
            (Offset(42), LeaderEpoch(3), "meta")
        );
        // Fetch: v1-7 layout and v8+ layout, one known and one unknown partition.
        let req = OffsetFetchRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(s("orders")))
                .with_partition_indexes(vec![0, 1])]));
        let r = c.offset_fetch(7, &req);
        let p = &r.topics[0].partitions;
        assert_eq!(
            (p[0].committed_offset, p[0].committed_leader_epoch),
            (42, 3)
        );
        assert_eq!(p[1].committed_offset, -1);
        for v in 1..=7 {
            encodes(&c.offset_fetch(v, &req), v);
        }
        let req = OffsetFetchRequest::default().with_groups(vec![
            OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s("g")))
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_name(TopicName(s("orders")))
                    .with_partition_indexes(vec![0])])),
            OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s("g")))
                .with_topics(None),
        ]);
        let r = c.offset_fetch(9, &req);
        assert_eq!(r.groups[0].topics[0].partitions[0].committed_offset, 42);
        assert_eq!(
            r.groups[1].topics[0].partitions[0].committed_offset, 42,
            "all topics"
        );
        encodes(&r, 8);
        encodes(&r, 9);
    }

    #[test]
    fn commit_without_members_creates_the_group_and_unknown_partitions_are_refused() {
        let mut c = coord();
        let only_orders = |tp: &TopicPartition| tp.topic == "orders";
        let r = c.offset_commit(&only_orders, &commit_req(-1, "", 5));
        assert_eq!(commit_errors(&r), [0]);
        let mut req = commit_req(-1, "", 5);
        req.topics[0].name = TopicName(s("nope"));
        let r = c.offset_commit(&only_orders, &req);
        assert_eq!(
            commit_errors(&r),
            [ResponseError::UnknownTopicOrPartition.code()]
        );
        let mut req = commit_req(-1, "", 5);
        req.topics[0].partitions[0].committed_metadata = Some(s(&"x".repeat(5000)));
        let r = c.offset_commit(&only_orders, &req);
        assert_eq!(
            commit_errors(&r),
            [ResponseError::OffsetMetadataTooLarge.code()]
        );
        let r = c.offset_commit(&only_orders, &commit_req(3, "m", 5));
        assert_eq!(commit_errors(&r), [ResponseError::IllegalGeneration.code()]);
        for v in 2..=9 {
            encodes(&c.offset_commit(&only_orders, &commit_req(-1, "", 6)), v);
        }
        // A group with offsets only is listed and described as Empty.
        let l = c.list_groups(5, &ListGroupsRequest::default());
        assert_eq!(l.groups.len(), 1);
        assert_eq!(
            (
                l.groups[0].group_state.as_str(),
                l.groups[0].group_type.as_str()
            ),
            ("Empty", "classic")
        );
        let d = c.describe_groups(
            5,
            &DescribeGroupsRequest::default().with_groups(vec![GroupId(s("g"))]),
        );
        assert_eq!(
            (d.groups[0].error_code, d.groups[0].group_state.as_str()),
            (0, "Empty")
        );
    }

    #[test]
    fn store_failure_is_a_retriable_error_and_nothing_is_remembered() {
        let mut c = coord();
        c.store.fail = true;
        let r = c.offset_commit(&all, &commit_req(-1, "", 5));
        assert_eq!(
            commit_errors(&r),
            [ResponseError::CoordinatorNotAvailable.code()]
        );
        assert!(c
            .committed("g", &TopicPartition::new("orders", 0))
            .is_none());
    }

    #[test]
    fn offsets_reload_from_the_store() {
        let mut c = coord();
        c.offset_commit(&all, &commit_req(-1, "", 11));
        let store = c.into_store();
        let c2 = GroupCoordinator::open(CoordinatorConfig::new(1, "h", 1), store).unwrap();
        assert_eq!(
            c2.committed("g", &TopicPartition::new("orders", 0))
                .unwrap()
                .offset,
            Offset(11)
        );
    }

    #[test]
    fn describe_list_heartbeat_leave_and_every_version_encodes() {
        let mut c = coord();
        let id = join_stable(&mut c);
        assert!(c.is_active("g"));
        let d = c.describe_groups(
            6,
            &DescribeGroupsRequest::default()
                .with_groups(vec![GroupId(s("g")), GroupId(s("none"))]),
        );
        let g = &d.groups[0];
        assert_eq!(
            (
                g.group_state.as_str(),
                g.protocol_type.as_str(),
                g.protocol_data.as_str()
            ),
            ("Stable", "consumer", "range")
        );
        assert_eq!(g.members[0].member_id.as_str(), id);
        assert_eq!(g.members[0].client_id.as_str(), "app");
        assert_eq!(
            g.members[0].member_assignment,
            Bytes::from_static(b"orders-0")
        );
        assert_eq!(
            d.groups[1].error_code,
            ResponseError::GroupIdNotFound.code()
        );
        for v in 0..=6 {
            encodes(
                &c.describe_groups(
                    v,
                    &DescribeGroupsRequest::default().with_groups(vec![GroupId(s("g"))]),
                ),
                v,
            );
        }
        let l = c.list_groups(
            4,
            &ListGroupsRequest::default().with_states_filter(vec![s("stable")]),
        );
        assert_eq!(l.groups.len(), 1);
        let l = c.list_groups(
            4,
            &ListGroupsRequest::default().with_states_filter(vec![s("Empty")]),
        );
        assert_eq!(l.groups.len(), 0);
        for v in 0..=5 {
            encodes(&c.list_groups(v, &ListGroupsRequest::default()), v);
        }
        let hb = HeartbeatRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_generation_id(1)
            .with_member_id(s(&id));
        assert_eq!(c.heartbeat(2, &hb).error_code, 0);
        for v in 0..=4 {
            encodes(&c.heartbeat(2, &hb), v);
        }
        let leave = LeaveGroupRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_members(vec![
                MemberIdentity::default().with_member_id(s(&id)),
                MemberIdentity::default().with_member_id(s("ghost")),
            ]);
        let r = c.leave_group(3, 5, &leave);
        let errs: Vec<i16> = r.members.iter().map(|m| m.error_code).collect();
        assert_eq!(errs, [0, ResponseError::UnknownMemberId.code()]);
        assert!(!c.is_active("g"));
        for v in 0..=5 {
            encodes(
                &c.leave_group(3, v, &leave.clone().with_member_id(s("x"))),
                v,
            );
        }
        assert_eq!(
            c.heartbeat(4, &hb).error_code,
            ResponseError::UnknownMemberId.code()
        );
        // Join and sync answers encode in every version, including errors with no protocol.
        for v in 0..=9 {
            let mut c = coord();
            let r = c.join_group(
                0,
                Waiter {
                    token: 1,
                    version: v,
                },
                &client(),
                &join_req(""),
            );
            let r = match r {
                Some(r) if r.error_code == ResponseError::MemberIdRequired.code() => c
                    .join_group(
                        0,
                        Waiter {
                            token: 1,
                            version: v,
                        },
                        &client(),
                        &join_req(r.member_id.as_str()),
                    )
                    .unwrap_or_else(|| take_join(&mut c)),
                Some(r) => r,
                None => take_join(&mut c),
            };
            assert_eq!((r.error_code, r.generation_id), (0, 1), "v{v}");
            encodes(&r, v);
            let bad = c
                .join_group(
                    0,
                    Waiter {
                        token: 2,
                        version: v,
                    },
                    &client(),
                    &join_req("ghost"),
                )
                .unwrap();
            encodes(&bad, v);
        }
        for v in 0..=5 {
            let sync = SyncGroupRequest::default().with_group_id(GroupId(s("none")));
            encodes(
                &c.sync_group(
                    0,
                    Waiter {
                        token: 1,
                        version: v,
                    },
                    &sync,
                )
                .unwrap(),
                v,
            );
        }
        assert_eq!(GROUP_APIS.len(), 9);
    }

    fn take_join(c: &mut GroupCoordinator<MemoryStore>) -> JoinGroupResponse {
        match c.take_replies().pop() {
            Some(Deferred::Join(_, r)) => r,
            other => panic!("expected a join reply, got {other:?}"),
        }
    }

    #[test]
    fn a_parked_join_is_taken_by_its_token_only() {
        let mut c = coord();
        c.config.initial_rebalance_delay_ms = 0;
        let w1 = Waiter {
            token: 11,
            version: 9,
        };
        let id = c
            .join_group(0, w1, &client(), &join_req(""))
            .unwrap()
            .member_id;
        assert_eq!(c.join_group(0, w1, &client(), &join_req(id.as_str())), None);
        assert!(c.take_reply(12).is_none());
        match c.take_reply(11) {
            Some(Deferred::Join(w, r)) => assert_eq!((w.token, r.generation_id), (11, 1)),
            other => panic!("{other:?}"),
        }
        assert!(c.take_reply(11).is_none(), "taken once");
        assert_eq!(
            join_error(9, ResponseError::RebalanceInProgress, "m").error_code,
            ResponseError::RebalanceInProgress.code()
        );
        assert_eq!(
            sync_error(ResponseError::RebalanceInProgress).error_code,
            ResponseError::RebalanceInProgress.code()
        );
    }

    #[test]
    fn join_validation() {
        let mut c = coord();
        let w = Waiter {
            token: 1,
            version: 9,
        };
        let r = c
            .join_group(0, w, &client(), &join_req("").with_session_timeout_ms(10))
            .unwrap();
        assert_eq!(r.error_code, ResponseError::InvalidSessionTimeout.code());
        let r = c
            .join_group(0, w, &client(), &join_req("").with_group_id(GroupId(s(""))))
            .unwrap();
        assert_eq!(r.error_code, ResponseError::InvalidGroupId.code());
        let r = c.join_group(0, w, &client(), &join_req("m-1")).unwrap();
        assert_eq!(r.error_code, ResponseError::UnknownMemberId.code());
    }

    #[test]
    fn sync_writes_only_into_groups_without_members() {
        let mut c = coord();
        let tp = TopicPartition::new("orders", 0);
        assert!(c
            .sync_offset("idle", tp.clone(), Offset(9), LeaderEpoch(2), "")
            .unwrap());
        assert!(
            !c.sync_offset("idle", tp.clone(), Offset(9), LeaderEpoch(2), "")
                .unwrap(),
            "unchanged"
        );
        join_stable(&mut c);
        assert!(matches!(
            c.sync_offset("g", tp.clone(), Offset(1), LeaderEpoch(0), ""),
            Err(SyncWriteError::Active(_))
        ));
        assert_eq!(c.committed("idle", &tp).unwrap().offset, Offset(9));
    }

    #[test]
    fn tick_expires_members_and_drops_idle_groups_without_offsets() {
        let mut c = coord();
        join_stable(&mut c);
        assert_eq!(c.next_deadline(), Some(1 + 10_000));
        c.tick(20_000);
        assert!(!c.is_active("g"));
        assert!(c.group("g").is_none(), "no offsets, no members: forgotten");
        let l = c.list_groups(5, &ListGroupsRequest::default());
        assert!(l.groups.is_empty());
    }

    fn txn_req(gen: i32, member: &str, partition: i32) -> TxnOffsetCommitRequest {
        TxnOffsetCommitRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_generation_id(gen)
            .with_member_id(s(member))
            .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(s("orders")))
                .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(partition)
                    .with_committed_offset(77)
                    .with_committed_leader_epoch(2)])])
    }

    fn txn_errors(r: &TxnOffsetCommitResponse) -> Vec<i16> {
        r.topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
            .collect()
    }

    #[test]
    fn txn_offset_commit_checks_the_member_and_holds_offsets_until_the_end() {
        let mut c = coord();
        let pid = ProducerId(1 << 40);
        // No group: only a commit without a generation may write (and create it).
        let r = c.txn_offset_commit(&all, pid, &txn_req(3, "m", 0));
        assert_eq!(txn_errors(&r), [ResponseError::IllegalGeneration.code()]);
        let id = join_stable(&mut c);
        let r = c.txn_offset_commit(&all, pid, &txn_req(0, &id, 0));
        assert_eq!(txn_errors(&r), [ResponseError::IllegalGeneration.code()]);
        let r = c.txn_offset_commit(&all, pid, &txn_req(1, "stranger", 0));
        assert_eq!(txn_errors(&r), [ResponseError::UnknownMemberId.code()]);
        let only_orders_0 = |tp: &TopicPartition| tp.partition == 0;
        let r = c.txn_offset_commit(&only_orders_0, pid, &txn_req(1, &id, 1));
        assert_eq!(
            txn_errors(&r),
            [ResponseError::UnknownTopicOrPartition.code()]
        );
        assert!(c.pending_producers().is_empty());
        // The member at its generation, and a v0-2 request without one (the epoch fences).
        let r = c.txn_offset_commit(&all, pid, &txn_req(1, &id, 0));
        assert_eq!(txn_errors(&r), [0]);
        let r = c.txn_offset_commit(&all, ProducerId(5), &txn_req(-1, "", 1));
        assert_eq!(txn_errors(&r), [0]);
        for v in 0..=4 {
            encodes(&r, v);
        }
        let orders0 = TopicPartition::new("orders", 0);
        assert!(c.committed("g", &orders0).is_none());
        assert!(c.has_pending("g", &orders0));
        assert_eq!(c.store().pending.len(), 2);
        // All-partitions fetch with require_stable: a committed row held by a transaction
        // answers UNSTABLE_OFFSET_COMMIT.
        c.offset_commit(&all, &commit_req(1, &id, 42));
        let req = OffsetFetchRequest::default()
            .with_require_stable(true)
            .with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s("g")))
                .with_topics(None)]);
        let r = c.offset_fetch(9, &req);
        let p = &r.groups[0].topics[0].partitions[0];
        assert_eq!(
            (p.committed_offset, p.error_code),
            (-1, ResponseError::UnstableOffsetCommit.code())
        );
        let r = c.offset_fetch(9, &req.clone().with_require_stable(false));
        assert_eq!(r.groups[0].topics[0].partitions[0].committed_offset, 42);
        // Commit moves them into the table; abort of the other drops its one.
        assert_eq!(c.end_txn_offsets(pid, true).unwrap(), 1);
        assert_eq!(c.committed("g", &orders0).unwrap().offset, Offset(77));
        assert_eq!(c.end_txn_offsets(ProducerId(5), false).unwrap(), 1);
        assert!(c
            .committed("g", &TopicPartition::new("orders", 1))
            .is_none());
        assert!(c.store().pending.is_empty());
        assert_eq!(c.end_txn_offsets(pid, true).unwrap(), 0, "repeatable");
    }

    #[test]
    fn a_failed_store_keeps_transactional_offsets_pending() {
        let mut c = coord();
        let pid = ProducerId(9);
        let r = c.txn_offset_commit(&all, pid, &txn_req(-1, "", 0));
        assert_eq!(txn_errors(&r), [0]);
        c.store_mut().fail = true;
        assert!(c.end_txn_offsets(pid, true).is_err());
        assert_eq!(
            c.pending_producers(),
            vec![pid],
            "still pending, to finish later"
        );
        c.store_mut().fail = false;
        assert_eq!(c.end_txn_offsets(pid, true).unwrap(), 1);
        assert_eq!(
            c.committed("g", &TopicPartition::new("orders", 0))
                .unwrap()
                .offset,
            Offset(77)
        );
    }
}
