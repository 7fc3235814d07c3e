//! The transaction coordinator on the Kafka endpoint: API handlers that lock the coordinator
//! for one call each (markers are written under the lock, at client rates: transactions after
//! failover are ordinary application traffic), and a `txn-timer` thread that aborts
//! transactions past their timeout.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, ApiKey, EndTxnRequest, EndTxnResponse, TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
};

use crate::ids::{ProducerId, TopicPartition};
use crate::limits::{TXN_ID_EXPIRATION_MS_DEFAULT, TXN_TIMER_TICK_MS};
use crate::serve::authz::acl::{Operation, ResourceType};
use crate::serve::authz::{
    GROUP_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
};
use crate::serve::dispatch::{ApiHandler, Dispatcher, Outcome, Request};
use crate::serve::groups::GroupService;
use crate::serve::txn::coordinator::{TxnCoordinator, TxnError};
use crate::serve::txn::store::{TxnLog, TxnStoreError};
use crate::serve::writes::{InitProducerIdApi, PartitionWriter, WriterSlot};
use crate::serve::ServeError;

/// Kafka's OPERATION_NOT_ATTEMPTED: the other partitions of a refused AddPartitionsToTxn.
const OPERATION_NOT_ATTEMPTED: i16 = 55;

#[derive(Debug, thiserror::Error)]
pub enum TxnServiceError {
    #[error("opening __transaction_state-0: {0}")]
    Store(#[from] TxnStoreError),
    #[error("recovering transactions: {0}")]
    Recover(#[from] TxnError),
    #[error("starting the transaction timer thread: {0}")]
    Thread(#[from] std::io::Error),
}

pub struct TxnService {
    coordinator: Mutex<Option<TxnCoordinator<TxnLog>>>,
    /// Where TxnOffsetCommit holds offsets; let go at `close` so the group service can close
    /// `__consumer_offsets-0` after us.
    groups: Mutex<Option<Arc<GroupService>>>,
    stop: AtomicBool,
    timer: Mutex<Option<JoinHandle<()>>>,
    /// `transactional.id.expiration.ms`, applied by the timer (`set_id_expiration_ms`).
    id_expiration_ms: AtomicI64,
}

impl std::fmt::Debug for TxnService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnService").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every coordinator step records its state before acting, so a panic mid-way leaves a
    // state that the next call (or the next start) continues from.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl TxnService {
    /// Opens `<data_dir>/__transaction_state-0`, completes prepared transactions through
    /// `writer` (the failed-over partitions must already be in it) and `groups` (their
    /// transactional offsets), and starts the timer.
    pub fn open(
        data_dir: &Path,
        writer: Arc<dyn PartitionWriter>,
        groups: Arc<GroupService>,
    ) -> Result<Arc<TxnService>, TxnServiceError> {
        let offsets: Arc<dyn crate::serve::txn::TxnOffsets> = groups.clone();
        let coordinator = TxnCoordinator::open(TxnLog::open(data_dir)?, writer, offsets)?;
        let service = Arc::new(TxnService {
            coordinator: Mutex::new(Some(coordinator)),
            groups: Mutex::new(Some(groups)),
            stop: AtomicBool::new(false),
            timer: Mutex::new(None),
            id_expiration_ms: AtomicI64::new(TXN_ID_EXPIRATION_MS_DEFAULT),
        });
        let me = Arc::clone(&service);
        let timer = std::thread::Builder::new()
            .name("txn-timer".into())
            .spawn(move || {
                while !me.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(TXN_TIMER_TICK_MS));
                    if let Some(c) = lock(&me.coordinator).as_mut() {
                        if let Err(e) = c.expire(now_ms()) {
                            tracing::error!("aborting timed-out transactions: {e}");
                        }
                        let expiration = me.id_expiration_ms.load(Ordering::Relaxed);
                        if let Err(e) = c.expire_ids(now_ms(), expiration) {
                            tracing::error!("expiring transactional ids: {e}");
                        }
                    }
                }
            })?;
        *lock(&service.timer) = Some(timer);
        Ok(service)
    }

    /// Kafka's `transactional.id.expiration.ms`: ids with no transaction under way are
    /// forgotten this long after their last one.
    pub fn set_id_expiration_ms(&self, ms: i64) {
        self.id_expiration_ms.store(ms, Ordering::Relaxed);
    }

    /// Registers AddPartitionsToTxn, EndTxn and an InitProducerId that also serves
    /// transactional ids.
    pub fn register(self: &Arc<Self>, d: &mut Dispatcher, writer: &WriterSlot) {
        let api = Arc::new(TxnApi {
            service: Arc::clone(self),
        });
        d.register(ApiKey::AddPartitionsToTxn, 0, 3, api.clone());
        // v4 of both only adds TRANSACTION_ABORTABLE, which kmirror never answers; v5 of
        // TxnOffsetCommit means transaction version 2, which kmirror does not advertise.
        d.register(ApiKey::AddOffsetsToTxn, 0, 4, api.clone());
        d.register(ApiKey::TxnOffsetCommit, 0, 4, api.clone());
        d.register(ApiKey::EndTxn, 0, 4, api);
        let init = InitProducerIdApi {
            writer: Arc::clone(writer),
            txn: Some(Arc::clone(self)),
        };
        d.register(ApiKey::InitProducerId, 0, 4, Arc::new(init));
    }

    /// InitProducerId for `transactional_id`: `Err(code)` is the Kafka error to answer.
    pub fn init_producer(
        &self,
        transactional_id: &str,
        timeout_ms: i32,
    ) -> Result<(ProducerId, i16), i16> {
        let mut c = lock(&self.coordinator);
        let c = c.as_mut().ok_or(COORDINATOR_NOT_AVAILABLE)?;
        c.init_producer(transactional_id, timeout_ms, now_ms())
            .map_err(|e| refused("InitProducerId", transactional_id, &e))
    }

    /// Stops the timer and closes `__transaction_state-0` cleanly.
    pub fn close(&self) -> Result<(), TxnStoreError> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = lock(&self.timer).take() {
            let _ = t.join();
        }
        let closed = match lock(&self.coordinator).take() {
            Some(c) => c.into_store().close(),
            None => Ok(()),
        };
        lock(&self.groups).take();
        closed
    }
}

const COORDINATOR_NOT_AVAILABLE: i16 = 15;

fn refused(api: &str, id: &str, e: &TxnError) -> i16 {
    match e {
        TxnError::Marker(_) | TxnError::Store(_) | TxnError::NoProducerId(_) => {
            tracing::error!(transactional_id = %id, "{api}: {e}")
        }
        _ => tracing::info!(transactional_id = %id, "{api} refused: {e}"),
    }
    e.code()
}

/// Every partition of a refused TxnOffsetCommit carries the same error.
fn txn_offset_error(r: &TxnOffsetCommitRequest, code: i16) -> TxnOffsetCommitResponse {
    let topics = r
        .topics
        .iter()
        .map(|t| {
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            TxnOffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}

struct TxnApi {
    service: Arc<TxnService>,
}

impl ApiHandler for TxnApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        // Kafka's rules: every call of a transaction needs WRITE on its transactional id
        // (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), partitions added WRITE on their topic,
        // offsets READ on the group (GROUP_AUTHORIZATION_FAILED) and on their topics.
        let may_txn =
            |id: &str| req.authorized(Operation::Write, ResourceType::TransactionalId, id);
        let mut guard = lock(&self.service.coordinator);
        match req.api_key {
            ApiKey::AddPartitionsToTxn => {
                let r: AddPartitionsToTxnRequest = req.decode()?;
                let id = r.v3_and_below_transactional_id.to_string();
                let tps: Vec<TopicPartition> = r
                    .v3_and_below_topics
                    .iter()
                    .flat_map(|t| {
                        t.partitions
                            .iter()
                            .map(|p| TopicPartition::new(t.name.to_string(), *p))
                    })
                    .collect();
                let denied_topic =
                    |t: &str| !req.authorized(Operation::Write, ResourceType::Topic, t);
                let outcome = if !may_txn(&id) {
                    Err((
                        TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                        TxnError::NoProducerId("not authorized".into()),
                    ))
                } else if tps.iter().any(|tp| denied_topic(&tp.topic)) {
                    // Per partition below: the denied topics' partitions carry the error,
                    // the others OPERATION_NOT_ATTEMPTED, as Kafka answers.
                    Err((
                        TOPIC_AUTHORIZATION_FAILED,
                        TxnError::NoProducerId("not authorized".into()),
                    ))
                } else {
                    match guard.as_mut() {
                        Some(c) => c
                            .add_partitions(
                                &id,
                                r.v3_and_below_producer_id.0,
                                r.v3_and_below_producer_epoch,
                                &tps,
                                now_ms(),
                            )
                            .map_err(|e| (refused("AddPartitionsToTxn", &id, &e), e)),
                        None => Err((
                            COORDINATOR_NOT_AVAILABLE,
                            TxnError::NoProducerId("closing".into()),
                        )),
                    }
                };
                let mut resp = AddPartitionsToTxnResponse::default();
                for t in &r.v3_and_below_topics {
                    let mut tr = AddPartitionsToTxnTopicResult::default();
                    tr.name = t.name.clone();
                    for p in &t.partitions {
                        let code = match &outcome {
                            Ok(()) => 0,
                            Err((TOPIC_AUTHORIZATION_FAILED, _)) => {
                                if denied_topic(t.name.as_str()) {
                                    TOPIC_AUTHORIZATION_FAILED
                                } else {
                                    OPERATION_NOT_ATTEMPTED
                                }
                            }
                            // Only the partition at fault carries the error.
                            Err((code, TxnError::NotWritable(bad))) => {
                                if bad.topic == t.name.as_str() && bad.partition == *p {
                                    *code
                                } else {
                                    OPERATION_NOT_ATTEMPTED
                                }
                            }
                            Err((code, _)) => *code,
                        };
                        let mut pr = AddPartitionsToTxnPartitionResult::default();
                        pr.partition_index = *p;
                        pr.partition_error_code = code;
                        tr.results_by_partition.push(pr);
                    }
                    resp.results_by_topic_v3_and_below.push(tr);
                }
                Outcome::encode(req, &resp)
            }
            ApiKey::AddOffsetsToTxn => {
                let r: AddOffsetsToTxnRequest = req.decode()?;
                let id = r.transactional_id.to_string();
                let mut resp = AddOffsetsToTxnResponse::default();
                resp.error_code = if !may_txn(&id) {
                    TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                } else if !req.authorized(Operation::Read, ResourceType::Group, r.group_id.as_str())
                {
                    GROUP_AUTHORIZATION_FAILED
                } else {
                    match guard.as_mut() {
                        Some(c) => match c.add_offsets(
                            &id,
                            r.producer_id.0,
                            r.producer_epoch,
                            r.group_id.as_str(),
                            now_ms(),
                        ) {
                            Ok(()) => 0,
                            Err(e) => refused("AddOffsetsToTxn", &id, &e),
                        },
                        None => COORDINATOR_NOT_AVAILABLE,
                    }
                };
                Outcome::encode(req, &resp)
            }
            ApiKey::TxnOffsetCommit => {
                let r: TxnOffsetCommitRequest = req.decode()?;
                let id = r.transactional_id.to_string();
                // Kafka answers a denied topic per topic; kmirror refuses the whole commit
                // with TOPIC_AUTHORIZATION_FAILED on every partition (nothing is held).
                let denied = if !may_txn(&id) {
                    Some(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
                } else if !req.authorized(Operation::Read, ResourceType::Group, r.group_id.as_str())
                {
                    Some(GROUP_AUTHORIZATION_FAILED)
                } else if r
                    .topics
                    .iter()
                    .any(|t| !req.authorized(Operation::Read, ResourceType::Topic, t.name.as_str()))
                {
                    Some(TOPIC_AUTHORIZATION_FAILED)
                } else {
                    None
                };
                if let Some(code) = denied {
                    return Outcome::encode(req, &txn_offset_error(&r, code));
                }
                let checked = match guard.as_ref() {
                    Some(c) => c
                        .check_offsets(&id, r.producer_id.0, r.producer_epoch, r.group_id.as_str())
                        .map_err(|e| refused("TxnOffsetCommit", &id, &e)),
                    None => Err(COORDINATOR_NOT_AVAILABLE),
                };
                let groups = lock(&self.service.groups).clone();
                // The transaction lock stays held, so the transaction cannot end between the
                // check and the offsets being held (lock order: transactions, then groups).
                let resp = match (checked, groups) {
                    (Ok(producer), Some(g)) => g.txn_offset_commit(producer, &r),
                    (Err(code), _) => txn_offset_error(&r, code),
                    (Ok(_), None) => txn_offset_error(&r, COORDINATOR_NOT_AVAILABLE),
                };
                Outcome::encode(req, &resp)
            }
            ApiKey::EndTxn => {
                let r: EndTxnRequest = req.decode()?;
                let id = r.transactional_id.to_string();
                let mut resp = EndTxnResponse::default();
                if !may_txn(&id) {
                    resp.error_code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
                    return Outcome::encode(req, &resp);
                }
                resp.error_code = match guard.as_mut() {
                    Some(c) => match c.end(&id, r.producer_id.0, r.producer_epoch, r.committed) {
                        Ok(()) => 0,
                        Err(e) => refused("EndTxn", &id, &e),
                    },
                    None => COORDINATOR_NOT_AVAILABLE,
                };
                Outcome::encode(req, &resp)
            }
            other => Err(ServeError::UnsupportedApi { api: other as i16 }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::read_view::ReadCatalog;
    use crate::serve::dispatch::Part;
    use crate::serve::writes::{writer_slot, NothingWritable};
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{
        GroupId, InitProducerIdRequest, InitProducerIdResponse, ProducerId as KProducerId,
        RequestHeader, TopicName, TransactionalId,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    fn call<Q: Encodable, R: Decodable>(d: &Dispatcher, key: ApiKey, version: i16, body: &Q) -> R {
        let mut buf = BytesMut::new();
        let mut h = RequestHeader::default();
        h.request_api_key = key as i16;
        h.request_api_version = version;
        h.client_id = Some(StrBytes::from_static_str("unit"));
        h.encode(&mut buf, key.request_header_version(version))
            .unwrap();
        body.encode(&mut buf, version).unwrap();
        let (_, _, resp) = d.dispatch(buf.freeze()).unwrap();
        let Outcome::Reply(parts) = resp.outcome else {
            panic!("no reply")
        };
        let mut bytes = BytesMut::new();
        for p in parts {
            let Part::Bytes(b) = p else {
                panic!("file part")
            };
            bytes.extend_from_slice(&b);
        }
        // The parts are the body; the frame head is written by the connection.
        let mut bytes: Bytes = bytes.freeze();
        R::decode(&mut bytes, version).unwrap()
    }

    fn txn_offsets(pid: i64, epoch: i16, generation: i32) -> TxnOffsetCommitRequest {
        TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_static_str("t")))
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_producer_id(KProducerId(pid))
            .with_producer_epoch(epoch)
            .with_generation_id(generation)
            .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("in")))
                .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(3)])])
    }

    fn codes(r: &TxnOffsetCommitResponse) -> Vec<i16> {
        r.topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
            .collect()
    }

    /// The offset APIs are advertised at the versions served, and every one of those versions
    /// goes through the dispatcher to the coordinators.
    #[test]
    fn offset_apis_are_advertised_and_served_at_every_version() {
        let dir = tempfile::tempdir().unwrap();
        let groups = GroupService::open_with(dir.path(), ReadCatalog::new(), 0).unwrap();
        let writer: Arc<dyn PartitionWriter> = Arc::new(NothingWritable);
        let slot = writer_slot();
        let _ = slot.set(Arc::clone(&writer));
        let txn = TxnService::open(dir.path(), writer, Arc::clone(&groups)).unwrap();
        let mut d = Dispatcher::new();
        txn.register(&mut d, &slot);
        let range = |key: ApiKey| {
            d.advertised()
                .iter()
                .find(|v| v.api_key == key as i16)
                .map(|v| (v.min_version, v.max_version))
        };
        assert_eq!(range(ApiKey::AddOffsetsToTxn), Some((0, 4)));
        assert_eq!(range(ApiKey::TxnOffsetCommit), Some((0, 4)));

        let init: InitProducerIdResponse = call(
            &d,
            ApiKey::InitProducerId,
            4,
            &InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("t"))))
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(KProducerId(-1))
                .with_producer_epoch(-1),
        );
        assert_eq!(init.error_code, 0);
        let (pid, epoch) = (init.producer_id.0, init.producer_epoch);
        for v in 0..=4 {
            // Before the group joins the transaction: INVALID_TXN_STATE.
            let r: TxnOffsetCommitResponse =
                call(&d, ApiKey::TxnOffsetCommit, v, &txn_offsets(pid, epoch, -1));
            assert_eq!(codes(&r), [48], "v{v}");
            let add = AddOffsetsToTxnRequest::default()
                .with_transactional_id(TransactionalId(StrBytes::from_static_str("t")))
                .with_producer_id(KProducerId(pid))
                .with_producer_epoch(epoch)
                .with_group_id(GroupId(StrBytes::from_static_str("g")));
            let r: AddOffsetsToTxnResponse = call(&d, ApiKey::AddOffsetsToTxn, v, &add);
            assert_eq!(r.error_code, 0, "v{v}");
            let stale = add.clone().with_producer_epoch(epoch - 1);
            let r: AddOffsetsToTxnResponse = call(&d, ApiKey::AddOffsetsToTxn, v, &stale);
            assert_eq!(r.error_code, 47, "v{v}: INVALID_PRODUCER_EPOCH");
            // The group side answers now: `in-0` does not exist on this kmirror.
            let r: TxnOffsetCommitResponse =
                call(&d, ApiKey::TxnOffsetCommit, v, &txn_offsets(pid, epoch, -1));
            assert_eq!(codes(&r), [3], "v{v}: UNKNOWN_TOPIC_OR_PARTITION");
            let r: TxnOffsetCommitResponse = call(
                &d,
                ApiKey::TxnOffsetCommit,
                v,
                &txn_offsets(pid + 1, epoch, -1),
            );
            assert_eq!(codes(&r), [49], "v{v}: INVALID_PRODUCER_ID_MAPPING");
            let end = EndTxnRequest::default()
                .with_transactional_id(TransactionalId(StrBytes::from_static_str("t")))
                .with_producer_id(KProducerId(pid))
                .with_producer_epoch(epoch)
                .with_committed(v % 2 == 0);
            let r: EndTxnResponse = call(&d, ApiKey::EndTxn, 4, &end);
            assert_eq!(r.error_code, 0, "v{v}");
        }
        // v3+ carry the generation: with no such group, a generation is refused.
        let add = AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_static_str("t")))
            .with_producer_id(KProducerId(pid))
            .with_producer_epoch(epoch)
            .with_group_id(GroupId(StrBytes::from_static_str("g")));
        let _: AddOffsetsToTxnResponse = call(&d, ApiKey::AddOffsetsToTxn, 4, &add);
        let r: TxnOffsetCommitResponse =
            call(&d, ApiKey::TxnOffsetCommit, 4, &txn_offsets(pid, epoch, 5));
        assert_eq!(codes(&r), [22], "ILLEGAL_GENERATION");
        drop(d);
        txn.close().unwrap();
        drop(txn);
        groups.close().unwrap();
    }
}
