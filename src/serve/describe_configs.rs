//! DescribeConfigs for topics: the settings of the local log (the topic's configs as kmirror
//! applies them). The source topic's own overrides as copied (`LogConfig::topic_configs`,
//! see `control::topic_configs`) are DYNAMIC_TOPIC_CONFIG, as on the source; so is the topic's
//! lineage (`kmirror.lineage`, `control::lineage::chain`), which the controller puts there for
//! a downstream kmirror to read.
//! Broker resources are answered with no entries: kmirror has no broker configs a client could
//! act on.

use std::sync::Arc;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::log::config::{FlushPolicy, LogConfig};
use crate::log::read_view::ReadCatalog;
use crate::serve::authz::acl::{Operation, ResourceType};
use crate::serve::authz::{CLUSTER_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED};
use crate::serve::dispatch::{ApiHandler, Outcome, Request};
use crate::serve::metadata::{topics, UNKNOWN_TOPIC_OR_PARTITION};
use crate::serve::ServeError;

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// INVALID_REQUEST, for resource types kmirror has nothing to say about.
const INVALID_REQUEST: i16 = 42;
/// ConfigSource: DYNAMIC_TOPIC_CONFIG and DEFAULT_CONFIG.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DEFAULT: i8 = 5;
/// ConfigType: INT, LONG, LIST.
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;
const TYPE_LIST: i8 = 7;
/// ConfigType UNKNOWN, for copied configs kmirror does not interpret.
const TYPE_UNKNOWN: i8 = 0;

pub struct DescribeConfigsApi {
    pub catalog: Arc<ReadCatalog>,
}

/// (name, value, type, is default) of a log config, in Kafka's names and units, then the
/// topic's other copied configs (kmirror keeps but does not act on them). A setting the
/// topic's own configs set is never "default", even when its value equals the default.
pub fn topic_configs(c: &LogConfig) -> Vec<(String, String, i8, bool)> {
    let mut all: Vec<(String, String, i8, bool)> = local_configs(c)
        .into_iter()
        .map(|(name, value, ty, default)| {
            let default = default && !c.topic_configs.contains_key(name);
            (name.to_owned(), value, ty, default)
        })
        .collect();
    for (name, value) in &c.topic_configs {
        if !all.iter().any(|(n, ..)| n == name) {
            all.push((name.clone(), value.clone(), TYPE_UNKNOWN, false));
        }
    }
    all
}

fn local_configs(c: &LogConfig) -> Vec<(&'static str, String, i8, bool)> {
    let d = LogConfig::default();
    let opt = |v: Option<i64>| v.unwrap_or(-1).to_string();
    let (flush_messages, flush_ms) = match c.flush {
        FlushPolicy::PageCache => (i64::MAX, i64::MAX),
        FlushPolicy::EveryAppend => (1, i64::MAX),
        FlushPolicy::Interval { messages, ms } => (messages as i64, ms),
    };
    vec![
        (
            "segment.bytes",
            c.segment_bytes.to_string(),
            TYPE_INT,
            c.segment_bytes == d.segment_bytes,
        ),
        (
            "segment.ms",
            c.segment_ms.to_string(),
            TYPE_LONG,
            c.segment_ms == d.segment_ms,
        ),
        (
            "segment.index.bytes",
            c.segment_index_bytes.to_string(),
            TYPE_INT,
            c.segment_index_bytes == d.segment_index_bytes,
        ),
        (
            "index.interval.bytes",
            c.index_interval_bytes.to_string(),
            TYPE_INT,
            c.index_interval_bytes == d.index_interval_bytes,
        ),
        (
            "retention.bytes",
            opt(c.retention_bytes.map(|b| b as i64)),
            TYPE_LONG,
            c.retention_bytes == d.retention_bytes,
        ),
        (
            "retention.ms",
            opt(c.retention_ms),
            TYPE_LONG,
            c.retention_ms == d.retention_ms,
        ),
        (
            "cleanup.policy",
            c.cleanup.kafka_value(),
            TYPE_LIST,
            c.cleanup == d.cleanup,
        ),
        (
            "max.message.bytes",
            c.max_message_bytes.to_string(),
            TYPE_INT,
            c.max_message_bytes == d.max_message_bytes,
        ),
        (
            "flush.messages",
            flush_messages.to_string(),
            TYPE_LONG,
            c.flush == d.flush,
        ),
        (
            "flush.ms",
            flush_ms.to_string(),
            TYPE_LONG,
            c.flush == d.flush,
        ),
    ]
}

impl ApiHandler for DescribeConfigsApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request: DescribeConfigsRequest = req.decode()?;
        let topics = topics(&self.catalog);
        let mut resp = DescribeConfigsResponse::default();
        for res in &request.resources {
            let mut r = DescribeConfigsResult::default();
            r.resource_type = res.resource_type;
            r.resource_name = res.resource_name.clone();
            // DESCRIBE_CONFIGS on the topic, or on the cluster for a broker (Kafka's
            // handleDescribeConfigsRequest), per resource.
            let denied = match res.resource_type {
                RESOURCE_TOPIC => (!req.authorized(
                    Operation::DescribeConfigs,
                    ResourceType::Topic,
                    res.resource_name.as_str(),
                ))
                .then_some(TOPIC_AUTHORIZATION_FAILED),
                RESOURCE_BROKER => (!req.cluster_authorized(Operation::DescribeConfigs))
                    .then_some(CLUSTER_AUTHORIZATION_FAILED),
                _ => None,
            };
            if let Some(code) = denied {
                r.error_code = code;
                r.error_message = Some(StrBytes::from_static_str("Authorization failed."));
                resp.results.push(r);
                continue;
            }
            match res.resource_type {
                RESOURCE_TOPIC => match topics.get(res.resource_name.as_str()) {
                    Some((_, parts)) if !parts.is_empty() => {
                        let view = parts[0].1.view();
                        for (name, value, ty, default) in topic_configs(&view.config) {
                            let wanted = res
                                .configuration_keys
                                .as_ref()
                                .is_none_or(|keys| keys.iter().any(|k| k.as_str() == name));
                            if !wanted {
                                continue;
                            }
                            let mut e = DescribeConfigsResourceResult::default();
                            e.name = StrBytes::from_string(name);
                            e.value = Some(StrBytes::from_string(value));
                            // Mirrored topic configs are kmirror's to set, not the client's.
                            e.read_only = true;
                            e.config_source = if default {
                                SOURCE_DEFAULT
                            } else {
                                SOURCE_TOPIC
                            };
                            if req.version >= 3 {
                                e.config_type = ty;
                            }
                            r.configs.push(e);
                        }
                    }
                    _ => {
                        r.error_code = UNKNOWN_TOPIC_OR_PARTITION;
                        r.error_message = Some(StrBytes::from_string(format!(
                            "kmirror stores no topic {}",
                            res.resource_name.as_str()
                        )));
                    }
                },
                RESOURCE_BROKER => {}
                other => {
                    r.error_code = INVALID_REQUEST;
                    r.error_message = Some(StrBytes::from_string(format!(
                        "kmirror describes topic and broker resources only, not type {other}"
                    )));
                }
            }
            resp.results.push(r);
        }
        Outcome::encode(req, &resp)
    }
}
