//! The dispatcher with every API this module serves, and the versions each was tested with
//! against stock clients (tests/serve_clients.rs: the Java 4.1 clients and kafka-python).
//!
//! Consumer-group APIs (FindCoordinator, JoinGroup, ...) are not here: the group coordinator
//! registers them on the same dispatcher through `KafkaListener::start`'s `extend` hook.

use std::sync::Arc;

use kafka_protocol::messages::ApiKey;

use crate::log::read_view::ReadCatalog;
use crate::serve::advertised::Advertised;
use crate::serve::describe_configs::DescribeConfigsApi;
use crate::serve::dispatch::Dispatcher;
use crate::serve::fetch::FetchApi;
use crate::serve::fetch_sessions::FetchSessions;
use crate::serve::list_offsets::ListOffsetsApi;
use crate::serve::metadata::MetadataApi;
use crate::serve::offset_for_epoch::OffsetForEpochApi;
use crate::serve::produce::ProduceApi;
use crate::serve::writes::{InitProducerIdApi, WriterSlot};

pub fn dispatcher(
    catalog: Arc<ReadCatalog>,
    advertised: Arc<Advertised>,
    writer: WriterSlot,
    sessions: Arc<FetchSessions>,
) -> Dispatcher {
    let mut d = Dispatcher::new();
    d.register(
        ApiKey::Metadata,
        0,
        12,
        Arc::new(MetadataApi {
            catalog: Arc::clone(&catalog),
            advertised,
        }),
    );
    d.register(
        ApiKey::Fetch,
        4,
        17,
        Arc::new(FetchApi {
            catalog: Arc::clone(&catalog),
            sessions,
        }),
    );
    d.register(
        ApiKey::ListOffsets,
        1,
        10,
        Arc::new(ListOffsetsApi {
            catalog: Arc::clone(&catalog),
        }),
    );
    d.register(
        ApiKey::OffsetForLeaderEpoch,
        2,
        4,
        Arc::new(OffsetForEpochApi {
            catalog: Arc::clone(&catalog),
        }),
    );
    d.register(
        ApiKey::DescribeConfigs,
        1,
        4,
        Arc::new(DescribeConfigsApi {
            catalog: Arc::clone(&catalog),
        }),
    );
    d.register(
        ApiKey::InitProducerId,
        0,
        4,
        Arc::new(InitProducerIdApi {
            writer: Arc::clone(&writer),
            txn: None,
        }),
    );
    d.register(
        ApiKey::Produce,
        3,
        12,
        Arc::new(ProduceApi { catalog, writer }),
    );
    d
}
