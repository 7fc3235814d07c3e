//! Metadata: kmirror is the single broker, the controller, and the leader (and only replica)
//! of every partition it stores, at the partition's latest leader epoch (the source's, since
//! batches keep their epochs; see `PartitionReadView::leader_epoch`). Topic ids are the
//! source's, from `partition.metadata`.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use crate::log::read_view::{PartitionHandle, ReadCatalog};
use crate::serve::advertised::Advertised;

use crate::serve::authz::acl::{Operation, ResourceType};
use crate::serve::dispatch::{ApiHandler, Outcome, Request};
use crate::serve::{ServeError, NODE_ID};

/// UNKNOWN_TOPIC_OR_PARTITION.
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
pub use crate::serve::authz::TOPIC_AUTHORIZATION_FAILED;
/// UNKNOWN_TOPIC_ID.
pub const UNKNOWN_TOPIC_ID: i16 = 100;

/// The cluster id of an endpoint with no data dir of its own (tests, fuzzing); `kmirror serve`
/// tells the one `serve::cluster_id` keeps under its data dir.
pub const CLUSTER_ID: &str = "kmirror";

/// The catalog grouped by topic: name → (topic id, partitions in order).
pub type Topics = BTreeMap<String, (Option<Uuid>, Vec<(i32, Arc<PartitionHandle>)>)>;

pub fn topics(catalog: &ReadCatalog) -> Topics {
    let mut out: Topics = BTreeMap::new();
    for (tp, handle) in catalog.snapshot().iter() {
        let entry = out
            .entry(tp.topic.clone())
            .or_insert_with(|| (None, Vec::new()));
        if entry.0.is_none() {
            entry.0 = handle.view().topic_id;
        }
        entry.1.push((tp.partition, Arc::clone(handle)));
    }
    out
}

/// The topic name of `id`, if kmirror stores that topic.
pub fn topic_by_id(topics: &Topics, id: Uuid) -> Option<&str> {
    topics
        .iter()
        .find(|(_, (tid, _))| *tid == Some(id))
        .map(|(name, _)| name.as_str())
}

/// Decodes a Metadata request, accepting librdkafka's padded all-topics request.
///
/// librdkafka (2.x, up to at least 2.16; confluentinc/librdkafka#5049) reserves 4 bytes for the
/// topic count and, for flexible versions (v9+), replaces them by the 1-byte compact count —
/// except when it asks for all topics: then it leaves the 4 zero bytes in place, so the body is
/// a null compact array (`00`), three zero bytes, then the real fields. Kafka's request parser
/// does not check for bytes after the body: it reads the padding as the fields (all false, no
/// tags) and ignores the last three bytes. kmirror refuses trailing bytes (they would mean we
/// misread a layout), so only when the strict decode fails and the body has exactly this shape
/// is it decoded again without the padding, which gives the fields librdkafka meant to send.
/// A correct all-topics request (`00` then the fields) decodes strictly and never gets here.
pub fn decode_request(req: &Request) -> Result<MetadataRequest, ServeError> {
    let strict = match req.decode() {
        Ok(m) => return Ok(m),
        Err(e) => e,
    };
    let padded = req.version >= 9 && req.body.len() > 4 && req.body[..4] == [0, 0, 0, 0];
    if !padded {
        return Err(strict);
    }
    let mut body = BytesMut::with_capacity(req.body.len() - 3);
    body.put_u8(0);
    body.extend_from_slice(&req.body[4..]);
    let unpadded = Request {
        body: body.freeze(),
        ..req.clone()
    };
    let request = unpadded.decode().map_err(|_| strict)?;
    tracing::debug!(
        version = req.version,
        "Metadata: all-topics request with librdkafka's 3 padding bytes (librdkafka#5049)"
    );
    Ok(request)
}

pub struct MetadataApi {
    pub catalog: Arc<ReadCatalog>,
    /// The broker address told to a client is its listener's.
    pub advertised: Arc<Advertised>,
}

impl ApiHandler for MetadataApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request = decode_request(req)?;
        let topics = topics(&self.catalog);
        let mut resp = MetadataResponse::default();
        let mut broker = MetadataResponseBroker::default();
        broker.node_id = BrokerId(NODE_ID);
        let (host, port) = self.advertised.of(&req.session.listener);
        broker.host = StrBytes::from_string(host.to_owned());
        broker.port = port;
        resp.brokers = vec![broker];
        resp.cluster_id = Some(StrBytes::from_string(
            self.catalog.cluster_id().unwrap_or(CLUSTER_ID).to_owned(),
        ));
        resp.controller_id = BrokerId(NODE_ID);
        // v0: an empty list means every topic; v1+: null does.
        let wanted: Option<Vec<(Option<String>, Uuid)>> = match request.topics {
            None => None,
            Some(t) if t.is_empty() && req.version == 0 => None,
            Some(t) => Some(
                t.into_iter()
                    .map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id))
                    .collect(),
            ),
        };
        // Authorization as Kafka's KafkaApis.handleTopicMetadataRequest: an all-topics request
        // lists only the topics the client may DESCRIBE; a named topic it may not gets
        // TOPIC_AUTHORIZATION_FAILED (whether or not kmirror stores it, so that the error does
        // not tell which topics exist).
        let may_describe =
            |name: &str| req.authorized(Operation::Describe, ResourceType::Topic, name);
        resp.topics = match wanted {
            None => topics
                .iter()
                .filter(|(name, _)| may_describe(name))
                .map(|(name, (id, parts))| topic_entry(name, *id, parts))
                .collect(),
            Some(list) => list
                .into_iter()
                .map(|(name, id)| {
                    let name = name.or_else(|| topic_by_id(&topics, id).map(str::to_string));
                    if let Some(n) = name.as_ref().filter(|n| !may_describe(n)) {
                        let mut t = MetadataResponseTopic::default();
                        t.error_code = TOPIC_AUTHORIZATION_FAILED;
                        t.name = Some(TopicName(StrBytes::from_string(n.clone())));
                        t.topic_id = id;
                        return t;
                    }
                    match name.as_ref().and_then(|n| topics.get(n).map(|t| (n, t))) {
                        Some((n, (tid, parts))) => topic_entry(n, *tid, parts),
                        None => {
                            let mut t = MetadataResponseTopic::default();
                            t.error_code = if name.is_none() {
                                UNKNOWN_TOPIC_ID
                            } else {
                                UNKNOWN_TOPIC_OR_PARTITION
                            };
                            t.name = name.map(|n| TopicName(StrBytes::from_string(n)));
                            t.topic_id = id;
                            t
                        }
                    }
                })
                .collect(),
        };
        Outcome::encode(req, &resp)
    }
}

fn topic_entry(
    name: &str,
    id: Option<Uuid>,
    parts: &[(i32, Arc<PartitionHandle>)],
) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.name = Some(TopicName(StrBytes::from_string(name.to_string())));
    t.topic_id = id.unwrap_or(Uuid::nil());
    t.partitions = parts
        .iter()
        .map(|(p, handle)| {
            let mut m = MetadataResponsePartition::default();
            m.partition_index = *p;
            m.leader_id = BrokerId(NODE_ID);
            m.leader_epoch = handle.view().leader_epoch().0;
            m.replica_nodes = vec![BrokerId(NODE_ID)];
            m.isr_nodes = vec![BrokerId(NODE_ID)];
            m
        })
        .collect();
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::dispatch::{Dispatcher, Part};
    use kafka_protocol::messages::ApiKey;
    use kafka_protocol::protocol::Decodable;

    /// Frames librdkafka 2.16.0 (confluent-kafka 2.16.1) sent to kmirror for
    /// `AdminClient.list_topics()`, captured on loopback (length prefix removed): header v2
    /// (api 3, v12, correlation id, client id "rdkafka", no tags), then the body.
    const BROKERS_ONLY_V12: &str = "0003000c00000002000772646b61666b610001000000";
    const ALL_TOPICS_V12: &str = "0003000c00000003000772646b61666b610000000000010000";

    fn frame(hex: &str) -> bytes::Bytes {
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        bytes.into()
    }

    fn dispatcher() -> Dispatcher {
        let mut d = Dispatcher::new();
        d.register(
            ApiKey::Metadata,
            0,
            12,
            Arc::new(MetadataApi {
                catalog: ReadCatalog::new(),
                advertised: Advertised::single("127.0.0.1", 9092),
            }),
        );
        d
    }

    fn request(version: i16, body: &[u8]) -> Request {
        Request {
            api_key: ApiKey::Metadata,
            version,
            header: Default::default(),
            body: bytes::Bytes::copy_from_slice(body),
            session: std::sync::Arc::new(crate::serve::session::Session::plaintext(None)),
            authz: crate::serve::authz::Authz::allow_all(),
        }
    }

    #[test]
    fn librdkafka_all_topics_request_is_served() {
        // The body after the 18-byte header: null array, 3 padding bytes, then
        // allow_auto_topic_creation = true, include_topic_authorized_operations = false, no tags.
        let all = frame(ALL_TOPICS_V12);
        assert_eq!(&all[18..], &[0, 0, 0, 0, 1, 0, 0]);
        let strict = request(12, &all[18..])
            .decode::<MetadataRequest>()
            .unwrap_err();
        assert!(
            strict.to_string().contains("3 bytes left after the body"),
            "{strict}"
        );
        let r = decode_request(&request(12, &all[18..])).unwrap();
        assert_eq!(r.topics, None, "all topics");
        assert!(r.allow_auto_topic_creation, "the field librdkafka meant");
        assert!(!r.include_topic_authorized_operations);

        let d = dispatcher();
        for hex in [BROKERS_ONLY_V12, ALL_TOPICS_V12] {
            let (api, version, resp) = d.dispatch(frame(hex)).unwrap();
            assert_eq!((api, version), (ApiKey::Metadata, 12));
            let Outcome::Reply(parts) = resp.outcome else {
                panic!("no reply")
            };
            let [Part::Bytes(body)] = &parts[..] else {
                panic!("one byte part")
            };
            let m = MetadataResponse::decode(&mut body.clone(), 12).unwrap();
            assert_eq!(m.brokers.len(), 1);
            assert_eq!(m.cluster_id.as_deref(), Some(CLUSTER_ID));
        }
        // Both were counted as answered; a body with other trailing bytes is counted refused.
        let mut bad = frame(ALL_TOPICS_V12).to_vec();
        bad.push(0xff);
        assert!(d.dispatch(bad.into()).is_err());
        let counts = d.stats().snapshot();
        assert_eq!(counts.len(), 1, "{counts:?}");
        assert_eq!((counts[0].api_key, counts[0].version), (3, 12));
        assert_eq!(counts[0].served, 2);
        assert_eq!(counts[0].errors, [1, 0, 0], "one decode error");
    }

    #[test]
    fn only_the_exact_padding_shape_is_accepted() {
        // A correct all-topics v12 request with every field false is four zero bytes and
        // decodes strictly (the padding rule never reinterprets it).
        let r = decode_request(&request(12, &[0, 0, 0, 0])).unwrap();
        assert_eq!(r.topics, None);
        assert!(!r.allow_auto_topic_creation);
        let r = decode_request(&request(12, &[0, 1, 0, 0])).unwrap();
        assert!(r.allow_auto_topic_creation);
        // Other trailing bytes, padding before v9 (the count is an i32 there) and non-zero
        // padding stay errors.
        for (version, body) in [
            (12, &[0, 0, 0, 0, 1, 0, 0, 0xff][..]),
            (12, &[0, 1, 0, 0, 0]),
            (12, &[0, 0, 0, 1, 1, 0, 0]),
            (8, &[0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0]),
        ] {
            let e = decode_request(&request(version, body)).unwrap_err();
            assert!(e.to_string().contains("left after the body"), "{e}");
        }
    }
}
