//! The calls failback makes to the original cluster (the mirror's source), over the blocking
//! client with the mirror's own connection settings: leaders, log ends, the divergent tail
//! scan (Fetch), InitProducerId, Produce (acks=all) and the group cut-over (FindCoordinator,
//! OffsetCommit). Only the failback's own threads call these; never the control thread.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ApiKey, BrokerId, EndTxnRequest, FetchRequest,
    FindCoordinatorRequest, GroupId, InitProducerIdRequest, OffsetCommitRequest, ProduceRequest,
    ProducerId as WireProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;

use crate::control::group_sync::pick_version;
use crate::control::mirror_def::MirrorDefinition;
use crate::control::source_security::security_of;
use crate::fetch::blocking::{BlockingClient, BlockingError};
use crate::fetch::metadata::ClusterMetadata;
use crate::fetch::security::SourceSecurity;
use crate::ids::{Offset, ProducerId, TimestampMs, TopicPartition};
use crate::limits::{
    FAILBACK_COORDINATOR_RETRY_MS, FAILBACK_FETCH_BYTES, FAILBACK_REQUEST_TIMEOUT_MS,
};
use crate::wire::batch::{Batch, Peek};

/// Versions we speak as a client of the original (Produce v3 is the first with transactional
/// ids and v2 batches only; v13 names topics by id, which we do not).
const PRODUCE: (i16, i16) = (3, 12);
const INIT_PRODUCER_ID: (i16, i16) = (0, 4);
const FETCH: (i16, i16) = (4, 12);
const FIND_COORDINATOR: (i16, i16) = (1, 3);
const OFFSET_COMMIT: (i16, i16) = (2, 8);
/// The transaction calls of KIP-98 as a producer makes them before KIP-890's second part:
/// AddPartitionsToTxn up to v3 (v4+ are for brokers), EndTxn up to v4 and transactional
/// Produce up to v11 (v5 and v12 would switch the original to per-transaction epoch bumps).
const ADD_PARTITIONS_TO_TXN: (i16, i16) = (0, 3);
const END_TXN: (i16, i16) = (0, 4);
const PRODUCE_TXN_MAX: i16 = 11;

/// A failed call, and whether trying again (a new session) may help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub message: String,
    pub retryable: bool,
}

/// Kafka's INVALID_TRANSACTION_TIMEOUT: the asked timeout exceeds `transaction.max.timeout.ms`.
const INVALID_TRANSACTION_TIMEOUT: i16 = 50;

impl CallError {
    fn retry(message: impl Into<String>) -> CallError {
        CallError {
            message: message.into(),
            retryable: true,
        }
    }
    fn permanent(message: impl Into<String>) -> CallError {
        CallError {
            message: message.into(),
            retryable: false,
        }
    }
    fn of(addr: &str, e: &BlockingError) -> CallError {
        CallError {
            message: format!("{addr}: {e}"),
            retryable: !e.is_authentication(),
        }
    }
}

/// The original cluster as the mirror definition names it.
pub struct Original {
    servers: Vec<String>,
    client_id: String,
    security: SourceSecurity,
}

impl Original {
    pub fn of(def: &MirrorDefinition) -> Result<Original, CallError> {
        let security = security_of(&def.source).map_err(|f| CallError::permanent(f.message))?;
        Ok(Original {
            servers: def.source.bootstrap_servers.clone(),
            client_id: format!("{}-failback", def.source.client_id),
            security,
        })
    }

    /// A connection whose every read and write is bounded by the request timeout.
    pub fn connect(&self, addr: &str) -> Result<BlockingClient, CallError> {
        BlockingClient::connect_secure_within(
            addr,
            &self.client_id,
            &self.security,
            Duration::from_millis(FAILBACK_REQUEST_TIMEOUT_MS),
        )
        .map_err(|e| CallError::of(addr, &e))
    }

    /// Metadata of `topics` from the first bootstrap server that answers.
    pub fn metadata(&self, topics: &[&str]) -> Result<ClusterMetadata, CallError> {
        let mut errors = Vec::new();
        for addr in &self.servers {
            match self.connect(addr).and_then(|mut c| {
                c.metadata(Some(topics))
                    .map_err(|e| CallError::of(addr, &e))
            }) {
                Ok(md) => return Ok(md),
                Err(e) if !e.retryable => return Err(e),
                Err(e) => errors.push(e.message),
            }
        }
        Err(CallError::retry(if errors.is_empty() {
            "no bootstrap server".to_owned()
        } else {
            errors.join("; ")
        }))
    }

    /// The address of `tp`'s leader.
    pub fn leader_addr(md: &ClusterMetadata, tp: &TopicPartition) -> Result<String, CallError> {
        let leader = md
            .partition(&tp.topic, tp.partition)
            .and_then(|p| p.leader)
            .ok_or_else(|| CallError::retry(format!("{tp} has no leader on the original")))?;
        let b = md
            .broker(leader)
            .ok_or_else(|| CallError::retry(format!("leader {leader} of {tp} is not listed")))?;
        Ok(format!("{}:{}", b.host, b.port))
    }

    /// Commits `offsets` for `group` on its coordinator, as an admin client does for a group
    /// with no members (generation -1): each partition's error code (0 = committed).
    pub fn commit_group(
        &self,
        group: &str,
        offsets: &[(TopicPartition, Offset)],
    ) -> Result<Vec<(TopicPartition, i16)>, CallError> {
        // A cluster whose __consumer_offsets does not exist yet answers COORDINATOR_NOT_AVAILABLE
        // while it creates it (the first group ever); a moving coordinator, NOT_COORDINATOR or
        // COORDINATOR_LOAD_IN_PROGRESS: asked again for up to the request timeout.
        let until = std::time::Instant::now() + Duration::from_millis(FAILBACK_REQUEST_TIMEOUT_MS);
        loop {
            let answer = self.commit_group_once(group, offsets);
            let again = match &answer {
                Err(e) => e.retryable,
                Ok(codes) => codes.iter().any(|(_, c)| matches!(c, 14..=16)),
            };
            if !again || std::time::Instant::now() >= until {
                return answer;
            }
            std::thread::sleep(Duration::from_millis(FAILBACK_COORDINATOR_RETRY_MS));
        }
    }

    fn commit_group_once(
        &self,
        group: &str,
        offsets: &[(TopicPartition, Offset)],
    ) -> Result<Vec<(TopicPartition, i16)>, CallError> {
        let coord = self.find_coordinator(group, 0)?;
        let mut c = self.connect(&coord)?;
        let v = version(&mut c, &coord, ApiKey::OffsetCommit, OFFSET_COMMIT)?;
        let mut req = OffsetCommitRequest::default();
        req.group_id = GroupId(StrBytes::from_string(group.to_owned()));
        req.generation_id_or_member_epoch = -1;
        req.member_id = StrBytes::from_static_str("");
        req.retention_time_ms = -1;
        for (tp, offset) in offsets {
            let mut p = OffsetCommitRequestPartition::default();
            p.partition_index = tp.partition;
            p.committed_offset = offset.0;
            p.committed_leader_epoch = -1;
            p.committed_metadata = Some(StrBytes::from_static_str(""));
            match req
                .topics
                .iter_mut()
                .find(|t| t.name.0.as_str() == tp.topic)
            {
                Some(t) => t.partitions.push(p),
                None => {
                    let mut t = OffsetCommitRequestTopic::default();
                    t.name = TopicName(StrBytes::from_string(tp.topic.clone()));
                    t.partitions.push(p);
                    req.topics.push(t);
                }
            }
        }
        let resp = c
            .request::<OffsetCommitRequest>(v, &req)
            .map_err(|e| CallError::of(&coord, &e))?;
        Ok(resp
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| {
                    (
                        TopicPartition::new(t.name.0.as_str(), p.partition_index),
                        p.error_code,
                    )
                })
            })
            .collect())
    }
}

impl Original {
    /// The transaction coordinator of `transactional_id` (FindCoordinator, key type 1), asked
    /// again while the original is loading or moving it, for up to the request timeout.
    pub fn txn_coordinator(&self, transactional_id: &str) -> Result<TxnConn, CallError> {
        let until = std::time::Instant::now() + Duration::from_millis(FAILBACK_REQUEST_TIMEOUT_MS);
        loop {
            let found = self.find_coordinator(transactional_id, 1);
            match found {
                Err(e) if e.retryable && std::time::Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(FAILBACK_COORDINATOR_RETRY_MS));
                }
                Err(e) => return Err(e),
                Ok(addr) => {
                    let client = self.connect(&addr)?;
                    return Ok(TxnConn { addr, client });
                }
            }
        }
    }

    /// The address of the coordinator of `key` (key type 0: a group, 1: a transactional id).
    fn find_coordinator(&self, key: &str, key_type: i8) -> Result<String, CallError> {
        let md = self.metadata(&[])?;
        let any = md
            .brokers
            .first()
            .ok_or_else(|| CallError::retry("the original lists no broker"))?;
        let addr = format!("{}:{}", any.host, any.port);
        let mut c = self.connect(&addr)?;
        let v = version(&mut c, &addr, ApiKey::FindCoordinator, FIND_COORDINATOR)?;
        let mut find = FindCoordinatorRequest::default();
        find.key = StrBytes::from_string(key.to_owned());
        find.key_type = key_type;
        let found = c
            .request::<FindCoordinatorRequest>(v, &find)
            .map_err(|e| CallError::of(&addr, &e))?;
        if found.error_code != 0 {
            return Err(CallError::retry(format!(
                "FindCoordinator {key} (key type {key_type}): error {}",
                found.error_code
            )));
        }
        Ok(format!("{}:{}", found.host, found.port))
    }
}

/// Transaction-coordinator errors that clear by themselves: CONCURRENT_TRANSACTIONS (the
/// previous transaction's markers are still being written), COORDINATOR_LOAD_IN_PROGRESS,
/// COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR (the last two end the session to find it again).
fn txn_again(code: i16) -> bool {
    matches!(code, 51 | 14)
}

/// A connection to a transactional id's coordinator, for InitProducerId, AddPartitionsToTxn
/// and EndTxn (the Produce goes to the partition's leader, `ProducerConn::produce_txn`).
pub struct TxnConn {
    pub addr: String,
    client: BlockingClient,
}

impl TxnConn {
    /// Repeats `call` while it answers an error that clears by itself, for up to the request
    /// timeout; any other error code is returned.
    fn until_settled(
        &mut self,
        what: &str,
        mut call: impl FnMut(&mut BlockingClient) -> Result<i16, BlockingError>,
    ) -> Result<i16, CallError> {
        let until = std::time::Instant::now() + Duration::from_millis(FAILBACK_REQUEST_TIMEOUT_MS);
        loop {
            let code = call(&mut self.client).map_err(|e| CallError::of(&self.addr, &e))?;
            if !txn_again(code) {
                return Ok(code);
            }
            if std::time::Instant::now() >= until {
                return Err(CallError::retry(format!(
                    "{what} on {}: error {code} for longer than the request timeout",
                    self.addr
                )));
            }
            std::thread::sleep(Duration::from_millis(FAILBACK_COORDINATOR_RETRY_MS));
        }
    }

    /// InitProducerId for `transactional_id`: its producer id and a new epoch. The coordinator
    /// aborts a transaction of that id still open (fencing), so this is called only for a
    /// replay that has no transaction open.
    pub fn init_producer_id(
        &mut self,
        transactional_id: &str,
        timeout_ms: i32,
    ) -> Result<(ProducerId, i16), CallError> {
        let v = version(
            &mut self.client,
            &self.addr,
            ApiKey::InitProducerId,
            INIT_PRODUCER_ID,
        )?;
        let req = init_request(Some(transactional_id), timeout_ms);
        let mut answer = (ProducerId(-1), -1);
        let code = self.until_settled("InitProducerId", |c| {
            let resp = c.request::<InitProducerIdRequest>(v, &req)?;
            answer = (ProducerId(resp.producer_id.0), resp.producer_epoch);
            Ok(resp.error_code)
        })?;
        if code == INVALID_TRANSACTION_TIMEOUT {
            // A setting of the original, not a passing state: retrying cannot succeed.
            return Err(CallError::permanent(format!(
                "InitProducerId {transactional_id} on {}: error {code} INVALID_TRANSACTION_TIMEOUT: the original's transaction.max.timeout.ms is below the {timeout_ms} ms failback replays transactions with; raise it on the original",
                self.addr
            )));
        }
        if code != 0 {
            return Err(CallError::retry(format!(
                "InitProducerId {transactional_id} on {}: error {code}",
                self.addr
            )));
        }
        Ok(answer)
    }

    /// AddPartitionsToTxn of `tp`: 0 or the partition's error code.
    pub fn add_partition(
        &mut self,
        transactional_id: &str,
        stamp: (ProducerId, i16),
        tp: &TopicPartition,
    ) -> Result<i16, CallError> {
        let v = version(
            &mut self.client,
            &self.addr,
            ApiKey::AddPartitionsToTxn,
            ADD_PARTITIONS_TO_TXN,
        )?;
        let mut req = AddPartitionsToTxnRequest::default();
        req.v3_and_below_transactional_id =
            TransactionalId(StrBytes::from_string(transactional_id.to_owned()));
        req.v3_and_below_producer_id = WireProducerId(stamp.0 .0);
        req.v3_and_below_producer_epoch = stamp.1;
        let mut t = AddPartitionsToTxnTopic::default();
        t.name = TopicName(StrBytes::from_string(tp.topic.clone()));
        t.partitions.push(tp.partition);
        req.v3_and_below_topics.push(t);
        let partition = tp.partition;
        self.until_settled("AddPartitionsToTxn", |c| {
            let resp = c.request::<AddPartitionsToTxnRequest>(v, &req)?;
            Ok(resp
                .results_by_topic_v3_and_below
                .iter()
                .flat_map(|t| &t.results_by_partition)
                .find(|p| p.partition_index == partition)
                .map_or(-1, |p| p.partition_error_code))
        })
    }

    /// EndTxn with `commit`: 0 or the error code. Sent again after a restart with the same
    /// outcome and epoch, the coordinator answers it as done.
    pub fn end_txn(
        &mut self,
        transactional_id: &str,
        stamp: (ProducerId, i16),
        commit: bool,
    ) -> Result<i16, CallError> {
        let v = version(&mut self.client, &self.addr, ApiKey::EndTxn, END_TXN)?;
        let mut req = EndTxnRequest::default();
        req.transactional_id = TransactionalId(StrBytes::from_string(transactional_id.to_owned()));
        req.producer_id = WireProducerId(stamp.0 .0);
        req.producer_epoch = stamp.1;
        req.committed = commit;
        self.until_settled("EndTxn", |c| {
            Ok(c.request::<EndTxnRequest>(v, &req)?.error_code)
        })
    }
}

/// InitProducerId for a new producer (no id or epoch yet), transactional when an id is given.
fn init_request(transactional_id: Option<&str>, timeout_ms: i32) -> InitProducerIdRequest {
    let mut req = InitProducerIdRequest::default();
    req.transactional_id =
        transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.to_owned())));
    req.transaction_timeout_ms = timeout_ms;
    req.producer_id = WireProducerId(-1);
    req.producer_epoch = -1;
    req
}

fn version(
    c: &mut BlockingClient,
    addr: &str,
    key: ApiKey,
    ours: (i16, i16),
) -> Result<i16, CallError> {
    pick_version(c, key, ours)
        .map_err(|e| CallError::of(addr, &e))?
        .ok_or_else(|| CallError::permanent(format!("{addr} does not offer {key:?} {ours:?}")))
}

/// An idempotent producer session on one broker connection.
pub struct ProducerConn {
    pub addr: String,
    client: BlockingClient,
    produce_v: i16,
}

impl ProducerConn {
    pub fn open(original: &Original, addr: &str) -> Result<ProducerConn, CallError> {
        let mut client = original.connect(addr)?;
        let produce_v = version(&mut client, addr, ApiKey::Produce, PRODUCE)?;
        Ok(ProducerConn {
            addr: addr.to_owned(),
            client,
            produce_v,
        })
    }

    /// A new idempotent producer id (no transactional id).
    pub fn init_producer_id(&mut self) -> Result<(ProducerId, i16), CallError> {
        let v = version(
            &mut self.client,
            &self.addr,
            ApiKey::InitProducerId,
            INIT_PRODUCER_ID,
        )?;
        let req = init_request(None, i32::MAX);
        let resp = self
            .client
            .request::<InitProducerIdRequest>(v, &req)
            .map_err(|e| CallError::of(&self.addr, &e))?;
        if resp.error_code != 0 {
            return Err(CallError::retry(format!(
                "InitProducerId on {}: error {}",
                self.addr, resp.error_code
            )));
        }
        Ok((ProducerId(resp.producer_id.0), resp.producer_epoch))
    }

    /// Produces one batch to `tp` with acks=all: the base offset the original gave it, or the
    /// partition's error code.
    pub fn produce(&mut self, tp: &TopicPartition, batch: Vec<u8>) -> Result<Produced, CallError> {
        self.produce_as(tp, batch, None)
    }

    /// Produces one transactional batch of `transactional_id`'s open transaction.
    pub fn produce_txn(
        &mut self,
        tp: &TopicPartition,
        batch: Vec<u8>,
        transactional_id: &str,
    ) -> Result<Produced, CallError> {
        self.produce_as(tp, batch, Some(transactional_id))
    }

    fn produce_as(
        &mut self,
        tp: &TopicPartition,
        batch: Vec<u8>,
        transactional_id: Option<&str>,
    ) -> Result<Produced, CallError> {
        let mut part = PartitionProduceData::default();
        part.index = tp.partition;
        part.records = Some(Bytes::from(batch));
        let mut topic = TopicProduceData::default();
        topic.name = TopicName(StrBytes::from_string(tp.topic.clone()));
        topic.partition_data.push(part);
        let mut req = ProduceRequest::default();
        req.acks = -1;
        req.timeout_ms = FAILBACK_REQUEST_TIMEOUT_MS as i32;
        req.topic_data.push(topic);
        req.transactional_id =
            transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.to_owned())));
        let v = if transactional_id.is_some() {
            self.produce_v.min(PRODUCE_TXN_MAX)
        } else {
            self.produce_v
        };
        let resp = self
            .client
            .request::<ProduceRequest>(v, &req)
            .map_err(|e| CallError::of(&self.addr, &e))?;
        let p = resp
            .responses
            .iter()
            .filter(|t| t.name.0.as_str() == tp.topic)
            .flat_map(|t| &t.partition_responses)
            .find(|p| p.index == tp.partition)
            .ok_or_else(|| CallError::retry(format!("{}: no answer for {tp}", self.addr)))?;
        Ok(if p.error_code == 0 {
            Produced::At(Offset(p.base_offset))
        } else {
            Produced::Error(
                p.error_code,
                p.error_message
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            )
        })
    }
}

/// A Produce answer for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Produced {
    At(Offset),
    Error(i16, String),
}

/// What the original holds of one partition past the failover point, read with Fetch.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TailScan {
    pub records: i64,
    pub batches: i64,
    pub first_offset: Option<i64>,
    pub last_offset: Option<i64>,
    pub first_timestamp_ms: Option<i64>,
    pub last_timestamp_ms: Option<i64>,
    /// False when the scan stopped at its byte budget before the end.
    pub complete: bool,
}

/// Reads `[from, to)` of `tp` on its leader (READ_UNCOMMITTED, as the mirror did), at most
/// `budget` bytes, counting data records (control records are not data).
pub fn scan_tail(
    original: &Original,
    md: &ClusterMetadata,
    tp: &TopicPartition,
    from: Offset,
    to: Offset,
    budget: u64,
) -> Result<TailScan, CallError> {
    let mut out = TailScan::default();
    if from >= to {
        out.complete = true;
        return Ok(out);
    }
    let addr = Original::leader_addr(md, tp)?;
    let mut c = original.connect(&addr)?;
    let v = version(&mut c, &addr, ApiKey::Fetch, FETCH)?;
    let mut next = from.0;
    let mut read = 0u64;
    while next < to.0 {
        if read >= budget {
            return Ok(out);
        }
        let mut part = FetchPartition::default();
        part.partition = tp.partition;
        part.fetch_offset = next;
        part.current_leader_epoch = -1;
        part.last_fetched_epoch = -1;
        part.log_start_offset = -1;
        part.partition_max_bytes = FAILBACK_FETCH_BYTES as i32;
        let mut topic = FetchTopic::default();
        topic.topic = TopicName(StrBytes::from_string(tp.topic.clone()));
        topic.partitions.push(part);
        let mut req = FetchRequest::default();
        req.replica_id = BrokerId(-1);
        req.max_wait_ms = 0;
        req.min_bytes = 1;
        req.max_bytes = FAILBACK_FETCH_BYTES as i32;
        req.isolation_level = 0;
        req.session_epoch = -1;
        req.topics.push(topic);
        let resp = c
            .request::<FetchRequest>(v, &req)
            .map_err(|e| CallError::of(&addr, &e))?;
        let p = resp
            .responses
            .iter()
            .flat_map(|t| &t.partitions)
            .find(|p| p.partition_index == tp.partition)
            .ok_or_else(|| CallError::retry(format!("{addr}: no fetch answer for {tp}")))?;
        if p.error_code == 1 {
            // OFFSET_OUT_OF_RANGE: retention moved the original's log start past `next`.
            if p.log_start_offset > next {
                next = p.log_start_offset;
                continue;
            }
        }
        if p.error_code != 0 {
            return Err(CallError::retry(format!(
                "{addr}: Fetch {tp} at {next}: error {}",
                p.error_code
            )));
        }
        let bytes = p.records.clone().unwrap_or_default();
        read += bytes.len() as u64;
        let before = next;
        let mut buf: &[u8] = &bytes;
        while let Ok(Peek::Complete(b)) = Batch::peek(buf) {
            buf = &buf[b.size()..];
            if b.next_offset().0 <= next {
                continue;
            }
            if b.base_offset() >= to {
                next = to.0;
                break;
            }
            next = b.next_offset().0;
            if b.is_control() {
                continue;
            }
            out.batches += 1;
            out.records += i64::from(b.records_count().max(0));
            out.first_offset.get_or_insert(b.base_offset().0);
            out.last_offset = Some(b.last_offset().0.min(to.0 - 1));
            let first_ts = if b.is_legacy() {
                b.max_timestamp()
            } else {
                b.base_timestamp()
            };
            out.first_timestamp_ms
                .get_or_insert(first_ts.0.min(TimestampMs(i64::MAX).0));
            out.last_timestamp_ms = Some(
                out.last_timestamp_ms
                    .map_or(b.max_timestamp().0, |t| t.max(b.max_timestamp().0)),
            );
        }
        if next == before {
            // Nothing whole came back (an empty answer, or a batch above the budget).
            return Ok(out);
        }
    }
    out.complete = true;
    Ok(out)
}
