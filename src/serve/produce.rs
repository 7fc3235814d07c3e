//! Produce: refused on every partition kmirror mirrors.
//!
//! KIP-1279 proposes a new READ_ONLY_TOPIC error, which stock clients do not know (an unknown
//! code becomes UnknownServerException). kmirror answers INVALID_TOPIC_EXCEPTION (17) with an
//! explanatory message instead: it is what Kafka itself answers for writes to topics clients
//! may read but not write (internal topics), it is non-retriable in the Java client
//! (InvalidTopicException) and in kafka-python (InvalidTopicError), so producers fail at once
//! with the message rather than retrying until their delivery timeout. POLICY_VIOLATION would
//! read well too but clients treat it as an admin-request error; TOPIC_AUTHORIZATION_FAILED
//! would send operators looking for ACLs that do not exist.
//!
//! With acks=0 there is no response to carry the error, so the connection is closed, as Kafka
//! does. A failed-over (writable) partition takes the write through `serve::writes`.

use std::sync::Arc;

use kafka_protocol::messages::produce_request::PartitionProduceData;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;

use crate::ids::TopicPartition;
use crate::log::partition_log::ProduceOutcome;
use crate::log::read_view::ReadCatalog;
use crate::serve::authz::acl::{Operation, ResourceType};
use crate::serve::authz::{TOPIC_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED};
use crate::serve::dispatch::{ApiHandler, Outcome, Request};
use crate::serve::metadata::{topic_by_id, topics, UNKNOWN_TOPIC_ID, UNKNOWN_TOPIC_OR_PARTITION};
use crate::serve::writes::{error_code, WriteError, WriterSlot};
use crate::serve::ServeError;

/// The error code a produce to a mirrored partition gets.
pub const INVALID_TOPIC_EXCEPTION: i16 = 17;

/// First Produce version that names topics by id.
const FIRST_TOPIC_ID: i16 = 13;

pub struct ProduceApi {
    pub catalog: Arc<ReadCatalog>,
    /// The owner of writable (failed-over) partitions, once the control plane is up.
    pub writer: WriterSlot,
}

impl ProduceApi {
    /// Appends one partition's records as the leader and fills in its answer.
    fn write(
        &self,
        tp: &TopicPartition,
        p: &PartitionProduceData,
        pr: &mut PartitionProduceResponse,
    ) {
        let Some(writer) = self.writer.get() else {
            pr.error_code = error_code(&WriteError::NotWritable(tp.clone()));
            return;
        };
        // The leader stamps offsets and its epoch into the batch, so it needs its own copy.
        let mut batch = p.records.as_ref().map_or_else(Vec::new, |r| r.to_vec());
        match writer.produce(tp, &mut batch) {
            Ok(ProduceOutcome::Appended { base_offset, .. })
            | Ok(ProduceOutcome::Duplicate { base_offset, .. }) => {
                pr.error_code = 0;
                pr.base_offset = base_offset.0;
            }
            Err(e) => {
                tracing::debug!(partition = %tp, error = %e, "produce refused");
                pr.error_code = error_code(&e);
                pr.error_message = Some(StrBytes::from_string(e.to_string()));
            }
        }
    }
}

pub fn read_only_message(tp: &TopicPartition) -> String {
    format!(
        "{tp} is a mirror of a source cluster (KIP-1279) and is read-only until it is failed \
         over with `kmirror mirrors stop`"
    )
}

impl ApiHandler for ProduceApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request: ProduceRequest = req.decode()?;
        let topics = topics(&self.catalog);
        let mut resp = ProduceResponse::default();
        let mut any_error = false;
        // Kafka's handleProduceRequest: a transactional produce needs WRITE on its
        // transactional id (else every partition gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
        // and each topic WRITE (else TOPIC_AUTHORIZATION_FAILED for its partitions).
        let txn_denied = request.transactional_id.as_ref().is_some_and(|id| {
            !req.authorized(Operation::Write, ResourceType::TransactionalId, id.as_str())
        });
        for t in &request.topic_data {
            let name = if req.version >= FIRST_TOPIC_ID {
                topic_by_id(&topics, t.topic_id).map(str::to_string)
            } else {
                Some(t.name.0.to_string())
            };
            let mut tr = TopicProduceResponse::default();
            if req.version >= FIRST_TOPIC_ID {
                tr.topic_id = t.topic_id;
            } else {
                tr.name = t.name.clone();
            }
            let denied = if txn_denied {
                Some(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            } else {
                name.as_deref()
                    .is_some_and(|n| !req.authorized(Operation::Write, ResourceType::Topic, n))
                    .then_some(TOPIC_AUTHORIZATION_FAILED)
            };
            for p in &t.partition_data {
                let mut pr = PartitionProduceResponse::default();
                pr.index = p.index;
                pr.base_offset = -1;
                pr.log_append_time_ms = -1;
                pr.log_start_offset = -1;
                if let Some(code) = denied {
                    pr.error_code = code;
                    any_error = true;
                    tr.partition_responses.push(pr);
                    continue;
                }
                let known = name.as_ref().and_then(|n| {
                    let tp = TopicPartition::new(n.clone(), p.index);
                    self.catalog.get(&tp).map(|h| (tp, h))
                });
                match known {
                    Some((tp, handle)) => {
                        pr.log_start_offset = handle.view().log_start.0;
                        if handle.is_writable() {
                            self.write(&tp, p, &mut pr);
                        } else {
                            pr.error_code = INVALID_TOPIC_EXCEPTION;
                            pr.error_message = Some(StrBytes::from_string(read_only_message(&tp)));
                        }
                    }
                    None => {
                        pr.error_code = if name.is_none() {
                            UNKNOWN_TOPIC_ID
                        } else {
                            UNKNOWN_TOPIC_OR_PARTITION
                        };
                    }
                }
                any_error |= pr.error_code != 0;
                tr.partition_responses.push(pr);
            }
            resp.responses.push(tr);
        }
        if request.acks == 0 {
            if any_error {
                return Ok(Outcome::Close(
                    "produce with acks=0 to a read-only or unknown partition".to_string(),
                ));
            }
            return Ok(Outcome::NoReply);
        }
        Outcome::encode(req, &resp)
    }
}
