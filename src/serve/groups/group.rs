//! One classic consumer group: members, generations and the rebalance state machine
//! (Empty → PreparingRebalance → CompletingRebalance → Stable), with no I/O and an explicit
//! `now` (milliseconds on the caller's monotonic clock).
//!
//! A JoinGroup or SyncGroup that must wait for other members is parked with its `Waiter`; its
//! answer comes out later, through the `Vec<Reply>` every mutating call takes, when the round
//! completes (all members rejoined, the leader's assignment arrived, or a timeout fired).
//! Static membership (`group.instance.id`) is recorded and shown, but members are always
//! treated as dynamic ones.

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::ResponseError;

use crate::limits::GROUP_MEMBERS_MAX;

/// Where a parked request's answer must go: the serving side's handle for the request (for
/// example connection and correlation id) and the version the answer is encoded in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    pub token: u64,
    pub version: i16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    /// The names Kafka's DescribeGroups and ListGroups use.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// What a joining member sends.
#[derive(Debug, Clone)]
pub struct JoinArgs {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a member without an id gets one and must join again with it.
    pub require_known_member_id: bool,
}

/// A JoinGroup answer, before encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinResult {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Only for the leader: every member with its metadata for the chosen protocol.
    pub members: Vec<(String, Option<String>, Bytes)>,
}

impl JoinResult {
    pub fn error(error: ResponseError, member_id: &str) -> JoinResult {
        JoinResult {
            error: error.code(),
            generation: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            member_id: member_id.to_owned(),
            members: Vec::new(),
        }
    }
}

/// A SyncGroup answer, before encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncResult {
    pub error: i16,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncResult {
    pub fn error(error: ResponseError) -> SyncResult {
        SyncResult {
            error: error.code(),
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }
}

/// An answer to a parked request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Join(Waiter, JoinResult),
    Sync(Waiter, SyncResult),
}

#[derive(Debug, Clone)]
pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    last_heard_ms: i64,
    awaiting_join: Option<Waiter>,
    awaiting_sync: Option<Waiter>,
    /// Join order, to pick a leader deterministically.
    seq: u64,
}

impl Member {
    fn expires_at(&self) -> i64 {
        self.last_heard_ms
            .saturating_add(i64::from(self.session_timeout_ms))
    }

    /// The metadata this member sent for `protocol`.
    pub fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

/// One classic group.
#[derive(Debug, Clone)]
pub struct Group {
    pub id: String,
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// Ids handed out with MEMBER_ID_REQUIRED, until the member joins with them or expires.
    pending: BTreeMap<String, i64>,
    /// PreparingRebalance: when the round completes even if members are missing.
    join_deadline_ms: i64,
    /// The first round of an empty group always waits until `join_deadline_ms`.
    initial_delay: bool,
    initial_delay_ms: i64,
    next_seq: u64,
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

impl Group {
    pub fn new(id: &str, initial_delay_ms: i64) -> Group {
        Group {
            id: id.to_owned(),
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: BTreeMap::new(),
            join_deadline_ms: 0,
            initial_delay: false,
            initial_delay_ms,
            next_seq: 0,
        }
    }

    pub fn state(&self) -> GroupState {
        self.state
    }

    pub fn generation(&self) -> i32 {
        self.generation
    }

    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }

    pub fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }

    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }

    /// Members in join order.
    pub fn members(&self) -> Vec<&Member> {
        let mut m: Vec<&Member> = self.members.values().collect();
        m.sort_by_key(|m| m.seq);
        m
    }

    /// True when no member is in the group or about to join it.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.pending.is_empty()
    }

    /// The earliest moment `tick` has work to do.
    pub fn next_deadline(&self) -> Option<i64> {
        let members = self
            .members
            .values()
            .filter(|m| m.awaiting_join.is_none())
            .map(Member::expires_at);
        let join = (self.state == GroupState::PreparingRebalance).then_some(self.join_deadline_ms);
        members
            .chain(self.pending.values().copied())
            .chain(join)
            .min()
    }

    pub fn join(
        &mut self,
        now: i64,
        waiter: Waiter,
        a: JoinArgs,
        out: &mut Vec<Reply>,
    ) -> Option<JoinResult> {
        if a.protocol_type.is_empty() || a.protocols.is_empty() {
            return Some(JoinResult::error(
                ResponseError::InconsistentGroupProtocol,
                &a.member_id,
            ));
        }
        if !self.members.is_empty() && !self.supports(&a.protocol_type, &a.protocols) {
            return Some(JoinResult::error(
                ResponseError::InconsistentGroupProtocol,
                &a.member_id,
            ));
        }
        if a.member_id.is_empty() {
            if self.members.len() + self.pending.len() >= GROUP_MEMBERS_MAX {
                return Some(JoinResult::error(ResponseError::GroupMaxSizeReached, ""));
            }
            let id = format!("{}-{}", a.client_id, uuid::Uuid::new_v4());
            if a.require_known_member_id {
                // The client must come back with this id; until then it counts as joining,
                // so a rebalance in progress waits for it.
                self.pending.insert(
                    id.clone(),
                    now.saturating_add(i64::from(a.session_timeout_ms)),
                );
                return Some(JoinResult::error(ResponseError::MemberIdRequired, &id));
            }
            return self.add_member(now, waiter, id, a, out);
        }
        if self.pending.remove(&a.member_id).is_some() {
            let id = a.member_id.clone();
            return self.add_member(now, waiter, id, a, out);
        }
        let Some(member) = self.members.get_mut(&a.member_id) else {
            return Some(JoinResult::error(
                ResponseError::UnknownMemberId,
                &a.member_id,
            ));
        };
        let changed = member.protocols != a.protocols;
        member.protocols = a.protocols;
        member.session_timeout_ms = a.session_timeout_ms;
        member.rebalance_timeout_ms = a.rebalance_timeout_ms;
        member.client_id = a.client_id;
        member.client_host = a.client_host;
        member.instance_id = a.instance_id;
        member.last_heard_ms = now;
        let id = a.member_id;
        match self.state {
            GroupState::PreparingRebalance => {
                self.park_join(&id, waiter, out);
                self.maybe_complete_join(now, out);
                None
            }
            GroupState::CompletingRebalance | GroupState::Stable
                if !changed
                    && (self.state == GroupState::CompletingRebalance
                        || self.leader.as_deref() != Some(id.as_str())) =>
            {
                // Nothing changed for this member: it gets the current generation again.
                Some(self.join_result(&id))
            }
            _ => {
                self.park_join(&id, waiter, out);
                self.prepare_rebalance(now, out);
                self.maybe_complete_join(now, out);
                None
            }
        }
    }

    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols.iter().any(|(name, _)| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == name))
            })
    }

    fn add_member(
        &mut self,
        now: i64,
        waiter: Waiter,
        id: String,
        a: JoinArgs,
        out: &mut Vec<Reply>,
    ) -> Option<JoinResult> {
        if self.members.is_empty() {
            self.protocol_type = Some(a.protocol_type.clone());
        }
        self.next_seq += 1;
        self.members.insert(
            id.clone(),
            Member {
                id: id.clone(),
                instance_id: a.instance_id,
                client_id: a.client_id,
                client_host: a.client_host,
                session_timeout_ms: a.session_timeout_ms,
                rebalance_timeout_ms: a.rebalance_timeout_ms,
                protocols: a.protocols,
                assignment: Bytes::new(),
                last_heard_ms: now,
                awaiting_join: Some(waiter),
                awaiting_sync: None,
                seq: self.next_seq,
            },
        );
        if self.state != GroupState::PreparingRebalance {
            self.prepare_rebalance(now, out);
        }
        self.maybe_complete_join(now, out);
        None
    }

    fn park_join(&mut self, id: &str, waiter: Waiter, out: &mut Vec<Reply>) {
        if let Some(m) = self.members.get_mut(id) {
            if let Some(old) = m.awaiting_join.replace(waiter) {
                out.push(Reply::Join(
                    old,
                    JoinResult::error(ResponseError::RebalanceInProgress, id),
                ));
            }
        }
    }

    fn prepare_rebalance(&mut self, now: i64, out: &mut Vec<Reply>) {
        if self.state == GroupState::CompletingRebalance {
            for m in self.members.values_mut() {
                m.assignment = Bytes::new();
                if let Some(w) = m.awaiting_sync.take() {
                    out.push(Reply::Sync(
                        w,
                        SyncResult::error(ResponseError::RebalanceInProgress),
                    ));
                }
            }
        }
        let was_empty = self.state == GroupState::Empty;
        self.state = GroupState::PreparingRebalance;
        let rebalance_timeout = self
            .members
            .values()
            .map(|m| i64::from(m.rebalance_timeout_ms))
            .max()
            .unwrap_or(0);
        if was_empty {
            self.initial_delay = true;
            self.join_deadline_ms =
                now.saturating_add(self.initial_delay_ms.min(rebalance_timeout));
        } else {
            self.initial_delay = false;
            self.join_deadline_ms = now.saturating_add(rebalance_timeout);
        }
    }

    fn all_joined(&self) -> bool {
        self.pending.is_empty() && self.members.values().all(|m| m.awaiting_join.is_some())
    }

    fn maybe_complete_join(&mut self, now: i64, out: &mut Vec<Reply>) {
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let timed_out = now >= self.join_deadline_ms;
        if !(timed_out || (!self.initial_delay && self.all_joined())) {
            return;
        }
        if self.initial_delay && !timed_out {
            return;
        }
        // Members that did not rejoin in time leave the group.
        self.members.retain(|_, m| m.awaiting_join.is_some());
        if self
            .leader
            .as_ref()
            .is_some_and(|l| !self.members.contains_key(l))
        {
            self.leader = None;
        }
        self.generation = self.generation.wrapping_add(1).max(1);
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol = None;
            self.protocol_type = None;
            self.leader = None;
            return;
        }
        self.protocol = self.select_protocol();
        if self.leader.is_none() {
            self.leader = self.members().first().map(|m| m.id.clone());
        }
        self.state = GroupState::CompletingRebalance;
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let result = self.join_result(&id);
            if let Some(m) = self.members.get_mut(&id) {
                m.last_heard_ms = now;
                if let Some(w) = m.awaiting_join.take() {
                    out.push(Reply::Join(w, result));
                }
            }
        }
    }

    /// The protocol every member supports that the most members list first (ties: the
    /// earliest-joined member's order), as Kafka's vote does.
    fn select_protocol(&self) -> Option<String> {
        let members = self.members();
        let first = members.first()?;
        let candidates: Vec<&String> = first
            .protocols
            .iter()
            .map(|(n, _)| n)
            .filter(|n| {
                members
                    .iter()
                    .all(|m| m.protocols.iter().any(|(p, _)| p == *n))
            })
            .collect();
        let mut best: Option<(&String, usize)> = None;
        for c in &candidates {
            let votes = members
                .iter()
                .filter(|m| {
                    m.protocols
                        .iter()
                        .map(|(n, _)| n)
                        .find(|n| candidates.contains(n))
                        == Some(*c)
                })
                .count();
            if best.is_none_or(|(_, v)| votes > v) {
                best = Some((c, votes));
            }
        }
        best.map(|(c, _)| c.clone())
    }

    fn join_result(&self, id: &str) -> JoinResult {
        let protocol = self.protocol.clone().unwrap_or_default();
        let leader = self.leader.clone().unwrap_or_default();
        let members = if leader == id {
            self.members()
                .into_iter()
                .map(|m| (m.id.clone(), m.instance_id.clone(), m.metadata(&protocol)))
                .collect()
        } else {
            Vec::new()
        };
        JoinResult {
            error: 0,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader,
            member_id: id.to_owned(),
            members,
        }
    }

    fn check_member(&self, generation: i32, member_id: &str) -> Result<(), i16> {
        if !self.members.contains_key(member_id) {
            return Err(code(ResponseError::UnknownMemberId));
        }
        if generation != self.generation {
            return Err(code(ResponseError::IllegalGeneration));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn sync(
        &mut self,
        now: i64,
        waiter: Waiter,
        generation: i32,
        member_id: &str,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        assignments: Vec<(String, Bytes)>,
        out: &mut Vec<Reply>,
    ) -> Option<SyncResult> {
        if let Err(e) = self.check_member(generation, member_id) {
            return Some(SyncResult {
                error: e,
                protocol_type: None,
                protocol_name: None,
                assignment: Bytes::new(),
            });
        }
        let type_ok = protocol_type.is_none_or(|t| self.protocol_type.as_deref() == Some(t));
        let name_ok = protocol_name.is_none_or(|n| self.protocol.as_deref() == Some(n));
        if !type_ok || !name_ok {
            return Some(SyncResult::error(ResponseError::InconsistentGroupProtocol));
        }
        let leader = self.leader.as_deref() == Some(member_id);
        let m = self.members.get_mut(member_id).expect("checked above");
        m.last_heard_ms = now;
        match self.state {
            GroupState::Empty | GroupState::PreparingRebalance => {
                Some(SyncResult::error(ResponseError::RebalanceInProgress))
            }
            GroupState::Stable => Some(self.sync_result(member_id)),
            GroupState::CompletingRebalance => {
                if let Some(old) = m.awaiting_sync.replace(waiter) {
                    out.push(Reply::Sync(
                        old,
                        SyncResult::error(ResponseError::RebalanceInProgress),
                    ));
                }
                if leader {
                    let mut given: BTreeMap<String, Bytes> = assignments.into_iter().collect();
                    for m in self.members.values_mut() {
                        m.assignment = given.remove(&m.id).unwrap_or_default();
                    }
                    self.state = GroupState::Stable;
                    let ids: Vec<String> = self.members.keys().cloned().collect();
                    for id in ids {
                        let result = self.sync_result(&id);
                        if let Some(w) = self
                            .members
                            .get_mut(&id)
                            .and_then(|m| m.awaiting_sync.take())
                        {
                            out.push(Reply::Sync(w, result));
                        }
                    }
                }
                None
            }
        }
    }

    fn sync_result(&self, id: &str) -> SyncResult {
        SyncResult {
            error: 0,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            assignment: self
                .members
                .get(id)
                .map(|m| m.assignment.clone())
                .unwrap_or_default(),
        }
    }

    pub fn heartbeat(&mut self, now: i64, generation: i32, member_id: &str) -> i16 {
        if let Err(e) = self.check_member(generation, member_id) {
            return e;
        }
        if let Some(m) = self.members.get_mut(member_id) {
            m.last_heard_ms = now;
        }
        match self.state {
            GroupState::PreparingRebalance => code(ResponseError::RebalanceInProgress),
            _ => 0,
        }
    }

    /// Whether `member_id` at `generation` may commit offsets now (Kafka's classic rules: a
    /// commit with no generation is only for groups without members).
    pub fn check_commit(&self, generation: i32, member_id: &str) -> Result<(), i16> {
        if generation < 0 && member_id.is_empty() {
            return if self.members.is_empty() {
                Ok(())
            } else {
                Err(code(ResponseError::UnknownMemberId))
            };
        }
        self.check_member(generation, member_id)?;
        if self.state == GroupState::CompletingRebalance {
            return Err(code(ResponseError::RebalanceInProgress));
        }
        Ok(())
    }

    /// Whether a TxnOffsetCommit may write for `member_id` at `generation`. Clients older than
    /// KIP-447 (TxnOffsetCommit v0-2) send no generation: accepted, since the transaction's
    /// producer epoch fences them. Unlike a plain commit, one during CompletingRebalance is
    /// accepted (Kafka's rule: the transaction holds it until it ends).
    pub fn check_txn_commit(&self, generation: i32, member_id: &str) -> Result<(), i16> {
        if generation < 0 && member_id.is_empty() {
            return Ok(());
        }
        self.check_member(generation, member_id)
    }

    pub fn leave(&mut self, now: i64, member_id: &str, out: &mut Vec<Reply>) -> i16 {
        if self.pending.remove(member_id).is_some() {
            self.maybe_complete_join(now, out);
            return 0;
        }
        let Some(m) = self.members.remove(member_id) else {
            return code(ResponseError::UnknownMemberId);
        };
        self.member_gone(now, m, out);
        0
    }

    fn member_gone(&mut self, now: i64, m: Member, out: &mut Vec<Reply>) {
        if let Some(w) = m.awaiting_join {
            out.push(Reply::Join(
                w,
                JoinResult::error(ResponseError::UnknownMemberId, &m.id),
            ));
        }
        if let Some(w) = m.awaiting_sync {
            out.push(Reply::Sync(
                w,
                SyncResult::error(ResponseError::UnknownMemberId),
            ));
        }
        if self.leader.as_deref() == Some(m.id.as_str()) {
            self.leader = None;
        }
        if matches!(
            self.state,
            GroupState::Stable | GroupState::CompletingRebalance
        ) {
            self.prepare_rebalance(now, out);
        }
        self.maybe_complete_join(now, out);
    }

    /// Expires members whose session ran out and pending ids never used, and completes a join
    /// round whose time is up.
    pub fn tick(&mut self, now: i64, out: &mut Vec<Reply>) {
        let before = self.pending.len();
        self.pending.retain(|_, deadline| *deadline > now);
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| m.awaiting_join.is_none() && m.expires_at() <= now)
            .map(|m| m.id.clone())
            .collect();
        for id in expired {
            if let Some(m) = self.members.remove(&id) {
                tracing::info!(group = %self.id, member = %id, "session timed out; member removed");
                self.member_gone(now, m, out);
            }
        }
        if before != self.pending.len() || self.state == GroupState::PreparingRebalance {
            self.maybe_complete_join(now, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(token: u64) -> Waiter {
        Waiter { token, version: 9 }
    }

    fn args(member_id: &str, protocols: &[&str]) -> JoinArgs {
        JoinArgs {
            member_id: member_id.into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: protocols
                .iter()
                .map(|p| (p.to_string(), Bytes::from(format!("meta-{p}"))))
                .collect(),
            require_known_member_id: true,
        }
    }

    /// Joins a new member through the MEMBER_ID_REQUIRED dance; returns its id.
    fn new_member(g: &mut Group, now: i64, token: u64, out: &mut Vec<Reply>) -> String {
        let r = g.join(now, w(token), args("", &["range"]), out).unwrap();
        assert_eq!(r.error, ResponseError::MemberIdRequired.code());
        assert!(r.member_id.starts_with("c-"));
        assert_eq!(
            g.join(now, w(token), args(&r.member_id, &["range"]), out),
            None
        );
        r.member_id
    }

    fn joins(out: &mut Vec<Reply>) -> Vec<(u64, JoinResult)> {
        let mut v = Vec::new();
        out.retain(|r| match r {
            Reply::Join(w, j) => {
                v.push((w.token, j.clone()));
                false
            }
            _ => true,
        });
        v
    }

    fn syncs(out: &mut Vec<Reply>) -> Vec<(u64, SyncResult)> {
        let mut v = Vec::new();
        out.retain(|r| match r {
            Reply::Sync(w, s) => {
                v.push((w.token, s.clone()));
                false
            }
            _ => true,
        });
        v
    }

    #[test]
    fn first_member_waits_the_initial_delay_then_leads_generation_1() {
        let mut g = Group::new("g", 3_000);
        let mut out = Vec::new();
        let a = new_member(&mut g, 0, 1, &mut out);
        assert_eq!(g.state(), GroupState::PreparingRebalance);
        assert!(out.is_empty());
        assert_eq!(g.next_deadline(), Some(3_000));
        g.tick(2_999, &mut out);
        assert!(out.is_empty());
        g.tick(3_000, &mut out);
        let j = joins(&mut out);
        assert_eq!(j.len(), 1);
        let (token, r) = &j[0];
        assert_eq!((*token, r.error, r.generation), (1, 0, 1));
        assert_eq!(r.leader, a);
        assert_eq!(r.protocol_name.as_deref(), Some("range"));
        assert_eq!(
            r.members,
            vec![(a.clone(), None, Bytes::from("meta-range"))]
        );
        assert_eq!(g.state(), GroupState::CompletingRebalance);
        // The leader's SyncGroup completes the round.
        let s = g.sync(
            3_001,
            w(2),
            1,
            &a,
            Some("consumer"),
            Some("range"),
            vec![(a.clone(), Bytes::from("A"))],
            &mut out,
        );
        assert_eq!(s, None);
        let s = syncs(&mut out);
        assert_eq!(
            s,
            vec![(
                2,
                SyncResult {
                    error: 0,
                    protocol_type: Some("consumer".into()),
                    protocol_name: Some("range".into()),
                    assignment: Bytes::from("A")
                }
            )]
        );
        assert_eq!(g.state(), GroupState::Stable);
        assert_eq!(g.heartbeat(3_002, 1, &a), 0);
    }

    #[test]
    fn second_member_triggers_a_rebalance_both_get_generation_2() {
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let a = new_member(&mut g, 0, 1, &mut out);
        assert_eq!(joins(&mut out).len(), 1, "no delay: generation 1 at once");
        g.sync(
            1,
            w(2),
            1,
            &a,
            None,
            None,
            vec![(a.clone(), Bytes::from("all"))],
            &mut out,
        );
        assert_eq!(syncs(&mut out).len(), 1);
        // b arrives: the group prepares a rebalance, a learns it from its heartbeat.
        let b = new_member(&mut g, 10, 3, &mut out);
        assert_eq!(g.state(), GroupState::PreparingRebalance);
        assert_eq!(
            g.heartbeat(11, 1, &a),
            ResponseError::RebalanceInProgress.code()
        );
        assert!(joins(&mut out).is_empty(), "waits for a to rejoin");
        assert_eq!(g.join(12, w(4), args(&a, &["range"]), &mut out), None);
        let mut j = joins(&mut out);
        j.sort_by_key(|(t, _)| *t);
        assert_eq!(j.len(), 2);
        assert!(j.iter().all(|(_, r)| r.generation == 2 && r.leader == a));
        assert_eq!(j[1].1.members.len(), 2, "the leader (a, token 4) sees both");
        assert_eq!(
            j[0].1.members.len(),
            0,
            "the follower (b, token 3) sees none"
        );
        // The follower syncs first and waits; the leader's assignment answers both.
        assert_eq!(g.sync(13, w(5), 2, &b, None, None, vec![], &mut out), None);
        assert!(syncs(&mut out).is_empty());
        g.sync(
            14,
            w(6),
            2,
            &a,
            None,
            None,
            vec![
                (a.clone(), Bytes::from("p0")),
                (b.clone(), Bytes::from("p1")),
            ],
            &mut out,
        );
        let mut s = syncs(&mut out);
        s.sort_by_key(|(t, _)| *t);
        assert_eq!(s[0].1.assignment, Bytes::from("p1"));
        assert_eq!(s[1].1.assignment, Bytes::from("p0"));
        // Old generation is fenced.
        assert_eq!(
            g.heartbeat(15, 1, &a),
            ResponseError::IllegalGeneration.code()
        );
        assert_eq!(
            g.check_commit(1, &a),
            Err(ResponseError::IllegalGeneration.code())
        );
        assert_eq!(g.check_commit(2, &a), Ok(()));
    }

    #[test]
    fn session_timeout_removes_a_silent_member_and_rebalances() {
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let a = new_member(&mut g, 0, 1, &mut out);
        joins(&mut out);
        g.sync(0, w(2), 1, &a, None, None, vec![], &mut out);
        syncs(&mut out);
        let b = new_member(&mut g, 0, 3, &mut out);
        g.join(0, w(4), args(&a, &["range"]), &mut out);
        joins(&mut out);
        g.sync(1, w(5), 2, &a, None, None, vec![], &mut out);
        syncs(&mut out);
        // a keeps heartbeating, b goes silent.
        for t in (1_000..=10_000).step_by(1_000) {
            assert_eq!(g.heartbeat(t, 2, &a), 0);
            g.tick(t, &mut out);
        }
        g.tick(10_001, &mut out);
        assert_eq!(g.state(), GroupState::PreparingRebalance);
        assert_eq!(
            g.heartbeat(10_002, 2, &b),
            ResponseError::UnknownMemberId.code()
        );
        g.join(10_003, w(6), args(&a, &["range"]), &mut out);
        let j = joins(&mut out);
        assert_eq!(j.len(), 1);
        assert_eq!((j[0].1.generation, j[0].1.members.len()), (3, 1));
    }

    #[test]
    fn rebalance_timeout_drops_members_that_never_rejoin() {
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let a = new_member(&mut g, 0, 1, &mut out);
        joins(&mut out);
        g.sync(0, w(2), 1, &a, None, None, vec![], &mut out);
        let _b = new_member(&mut g, 100, 3, &mut out);
        // a keeps heartbeating (so no session expiry) but never rejoins.
        for t in (1_000..30_100).step_by(1_000) {
            g.heartbeat(t, 1, &a);
            g.tick(t, &mut out);
        }
        assert!(joins(&mut out).is_empty());
        g.heartbeat(30_100, 1, &a);
        g.tick(30_100, &mut out);
        let j = joins(&mut out);
        assert_eq!(j.len(), 1, "b alone forms generation 2");
        assert_eq!(j[0].1.generation, 2);
        assert_eq!(
            g.heartbeat(30_101, 1, &a),
            ResponseError::UnknownMemberId.code()
        );
    }

    #[test]
    fn leave_of_last_member_empties_the_group() {
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let a = new_member(&mut g, 0, 1, &mut out);
        joins(&mut out);
        g.sync(0, w(2), 1, &a, None, None, vec![], &mut out);
        syncs(&mut out);
        assert_eq!(g.leave(5, &a, &mut out), 0);
        assert_eq!(g.state(), GroupState::Empty);
        assert!(g.is_empty());
        assert_eq!(g.generation(), 2);
        assert_eq!(
            g.leave(6, &a, &mut out),
            ResponseError::UnknownMemberId.code()
        );
        assert_eq!(g.check_commit(-1, ""), Ok(()));
    }

    #[test]
    fn follower_sync_during_completing_gets_rebalance_error_when_a_member_leaves() {
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let a = new_member(&mut g, 0, 1, &mut out);
        let b = new_member(&mut g, 0, 2, &mut out);
        // a was already complete (generation 1) when b came; a rejoins.
        joins(&mut out);
        g.sync(0, w(3), 1, &a, None, None, vec![], &mut out);
        g.join(0, w(4), args(&a, &["range"]), &mut out);
        joins(&mut out);
        syncs(&mut out);
        assert_eq!(g.state(), GroupState::CompletingRebalance);
        assert_eq!(g.sync(1, w(5), 2, &b, None, None, vec![], &mut out), None);
        assert_eq!(g.leave(2, &a, &mut out), 0);
        let s = syncs(&mut out);
        assert_eq!(
            s,
            vec![(5, SyncResult::error(ResponseError::RebalanceInProgress))]
        );
    }

    #[test]
    fn join_errors() {
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let r = g
            .join(0, w(1), args("nobody", &["range"]), &mut out)
            .unwrap();
        assert_eq!(r.error, ResponseError::UnknownMemberId.code());
        let mut a = args("", &["range"]);
        a.protocols.clear();
        let r = g.join(0, w(1), a, &mut out).unwrap();
        assert_eq!(r.error, ResponseError::InconsistentGroupProtocol.code());
        let m = new_member(&mut g, 0, 1, &mut out);
        joins(&mut out);
        let r = g
            .join(0, w(2), args("", &["roundrobin"]), &mut out)
            .unwrap();
        assert_eq!(r.error, ResponseError::InconsistentGroupProtocol.code());
        // Old clients (v0-3) join without the member-id round trip.
        let mut old = args("", &["range"]);
        old.require_known_member_id = false;
        assert_eq!(g.join(1, w(3), old, &mut out), None);
        assert_eq!(g.state(), GroupState::PreparingRebalance);
        assert_ne!(m, "");
    }

    #[test]
    fn unused_pending_member_id_expires() {
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let r = g.join(0, w(1), args("", &["range"]), &mut out).unwrap();
        assert_eq!(r.error, ResponseError::MemberIdRequired.code());
        assert!(!g.is_empty());
        g.tick(10_000, &mut out);
        assert!(g.is_empty());
        let r = g
            .join(10_001, w(2), args(&r.member_id, &["range"]), &mut out)
            .unwrap();
        assert_eq!(r.error, ResponseError::UnknownMemberId.code());
    }

    #[test]
    fn protocol_vote_prefers_the_common_first_choice() {
        let mut g = Group::new("g", 0);
        let mut out = Vec::new();
        let mut a = args("", &["cooperative-sticky", "range"]);
        a.require_known_member_id = false;
        g.join(0, w(1), a, &mut out);
        assert_eq!(g.protocol(), Some("cooperative-sticky"));
        let mut b = args("", &["range"]);
        b.require_known_member_id = false;
        g.join(1, w(2), b, &mut out);
        let a_id = g.leader().unwrap().to_owned();
        g.join(
            2,
            w(3),
            args(&a_id, &["cooperative-sticky", "range"]),
            &mut out,
        );
        assert_eq!(
            g.protocol(),
            Some("range"),
            "the only protocol both support"
        );
    }
}
