//! Writes after failover: Produce to a partition that is STOPPED (and so writable), and
//! InitProducerId for idempotent producers.
//!
//! The endpoint does not own any log. Writable partitions belong to the control plane's
//! leader store (`control::leader_store`), which the endpoint reaches through the
//! `PartitionWriter` set into a `WriterSlot` once the control plane is built. A mirrored
//! partition never gets here: its read handle is not writable, and Produce answers with the
//! read-only error (see `produce`).
//!
//! InitProducerId with a transactional id goes to the transaction coordinator (`serve::txn`)
//! when the endpoint has one (control-plane mode); without one it is refused, so a
//! transactional producer fails at `initTransactions()` instead of writing data nobody can
//! commit.

use std::sync::{Arc, OnceLock};

use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProducerId as WireProducerId,
};

use crate::ids::{ProducerId, TopicPartition};
use crate::log::partition_log::{ProduceError, ProduceOutcome};
use crate::serve::authz::acl::{Operation, ResourceType};
use crate::serve::authz::{CLUSTER_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED};
use crate::serve::dispatch::{ApiHandler, Outcome, Request};
use crate::serve::ServeError;

/// The owner of writable partitions, as the endpoint sees it.
pub trait PartitionWriter: Send + Sync {
    /// Appends one producer's batch to `tp` (which must be writable) as its leader.
    fn produce(&self, tp: &TopicPartition, batch: &mut [u8]) -> Result<ProduceOutcome, WriteError>;
    /// A producer id never used before and above every mirrored one.
    fn new_producer_id(&self) -> Result<ProducerId, String>;
    /// Whether `tp` takes writes here (it was failed over to kmirror).
    fn is_writable(&self, tp: &TopicPartition) -> bool;
    /// Writes the COMMIT or ABORT marker of `producer_id`'s open transaction in `tp`.
    /// `Ok(false)`, writing nothing, when the producer has no open transaction there (its
    /// marker is already written: how a transaction left prepared by a crash is completed).
    fn end_txn(
        &self,
        tp: &TopicPartition,
        producer_id: ProducerId,
        producer_epoch: i16,
        commit: bool,
    ) -> Result<bool, WriteError>;
}

/// A writer with no writable partitions (a kmirror before any failover); producer ids
/// are all `PRODUCER_ID_FLOOR`. For tests that need the write APIs registered.
#[derive(Debug, Default)]
pub struct NothingWritable;

impl PartitionWriter for NothingWritable {
    fn produce(&self, tp: &TopicPartition, _: &mut [u8]) -> Result<ProduceOutcome, WriteError> {
        Err(WriteError::NotWritable(tp.clone()))
    }
    fn new_producer_id(&self) -> Result<ProducerId, String> {
        Ok(ProducerId(crate::limits::PRODUCER_ID_FLOOR))
    }
    fn is_writable(&self, _: &TopicPartition) -> bool {
        false
    }
    fn end_txn(
        &self,
        tp: &TopicPartition,
        _: ProducerId,
        _: i16,
        _: bool,
    ) -> Result<bool, WriteError> {
        Err(WriteError::NotWritable(tp.clone()))
    }
}

/// Set once, when the control plane that owns writable partitions is up.
pub type WriterSlot = Arc<OnceLock<Arc<dyn PartitionWriter>>>;

pub fn writer_slot() -> WriterSlot {
    Arc::new(OnceLock::new())
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0} is not writable here (not failed over, or not on this kmirror)")]
    NotWritable(TopicPartition),
    #[error(transparent)]
    Produce(#[from] ProduceError),
}

// Kafka error codes (org.apache.kafka.common.protocol.Errors).
const CORRUPT_MESSAGE: i16 = 2;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const MESSAGE_TOO_LARGE: i16 = 10;
const UNSUPPORTED_FOR_MESSAGE_FORMAT: i16 = 43;
const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const KAFKA_STORAGE_ERROR: i16 = 56;
const INVALID_RECORD: i16 = 87;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;

/// The Kafka error code a refused write answers with (what a Kafka leader answers for the
/// same condition, so clients react as they would to Kafka).
pub fn error_code(e: &WriteError) -> i16 {
    match e {
        WriteError::NotWritable(_) => NOT_LEADER_OR_FOLLOWER,
        WriteError::Produce(p) => match p {
            ProduceError::BatchCount(_)
            | ProduceError::Truncated { .. }
            | ProduceError::RecordCount { .. }
            | ProduceError::ControlBatch => INVALID_RECORD,
            ProduceError::UnsupportedMagic(_) => UNSUPPORTED_FOR_MESSAGE_FORMAT,
            ProduceError::Corrupt(_) => CORRUPT_MESSAGE,
            ProduceError::TooLarge { .. } => MESSAGE_TOO_LARGE,
            ProduceError::OutOfOrderSequence { .. } => OUT_OF_ORDER_SEQUENCE_NUMBER,
            ProduceError::InvalidProducerEpoch { .. } => INVALID_PRODUCER_EPOCH,
            ProduceError::StaleLeaderEpoch { .. } => NOT_LEADER_OR_FOLLOWER,
            ProduceError::Log(_) => KAFKA_STORAGE_ERROR,
        },
    }
}

/// InitProducerId: a fresh producer id (epoch 0) for idempotent producers; transactional ids
/// are the transaction coordinator's, when there is one.
pub struct InitProducerIdApi {
    pub writer: WriterSlot,
    pub txn: Option<Arc<crate::serve::txn::TxnService>>,
}

impl ApiHandler for InitProducerIdApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request: InitProducerIdRequest = req.decode()?;
        let mut resp = InitProducerIdResponse::default();
        resp.producer_id = WireProducerId(-1);
        resp.producer_epoch = -1;
        // Kafka's handleInitProducerIdRequest: a transactional id needs WRITE on it; an
        // idempotent producer IDEMPOTENT_WRITE on the cluster or, since Kafka 3.0 (KIP-679),
        // WRITE on any topic.
        let allowed = match &request.transactional_id {
            Some(id) => {
                req.authorized(Operation::Write, ResourceType::TransactionalId, id.as_str())
            }
            None => {
                req.cluster_authorized(Operation::IdempotentWrite)
                    || req
                        .authz
                        .authorize_any(&req.session, Operation::Write, ResourceType::Topic)
            }
        };
        if !allowed {
            resp.error_code = if request.transactional_id.is_some() {
                TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            } else {
                CLUSTER_AUTHORIZATION_FAILED
            };
            return Outcome::encode(req, &resp);
        }
        if let Some(id) = &request.transactional_id {
            match &self.txn {
                Some(txn) => match txn.init_producer(id, request.transaction_timeout_ms) {
                    Ok((pid, epoch)) => {
                        resp.producer_id = WireProducerId(pid.0);
                        resp.producer_epoch = epoch;
                    }
                    Err(code) => resp.error_code = code,
                },
                None => {
                    tracing::warn!("InitProducerId with a transactional id refused: no transaction coordinator in this mode");
                    resp.error_code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
                }
            }
            return Outcome::encode(req, &resp);
        }
        match self.writer.get().map(|w| w.new_producer_id()) {
            Some(Ok(id)) => {
                resp.producer_id = WireProducerId(id.0);
                resp.producer_epoch = 0;
            }
            Some(Err(why)) => {
                tracing::error!(%why, "InitProducerId: no producer id");
                resp.error_code = KAFKA_STORAGE_ERROR;
            }
            None => resp.error_code = COORDINATOR_NOT_AVAILABLE,
        }
        Outcome::encode(req, &resp)
    }
}
