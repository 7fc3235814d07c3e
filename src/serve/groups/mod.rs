//! Consumer groups on kmirror: the classic group protocol and committed offsets.
//!
//! | module        | job                                                                  |
//! |---------------|----------------------------------------------------------------------|
//! | `group`       | one group's members, generations and rebalance state machine (pure)  |
//! | `coordinator` | Kafka request structs in, response structs out; offsets table        |
//! | `offsets`     | `__consumer_offsets-0`: committed offsets in Kafka's record schemas  |
//! | `versions`    | the group API versions advertised                                    |
//! | `service`     | the coordinator on the endpoint: handlers, parked requests, timer    |
//!
//! The coordinator is sans-IO: it never touches a socket or a clock. One `GroupCoordinator`
//! serves the whole process behind a mutex (`SharedCoordinator`): the endpoint thread that
//! decodes a group request locks it for that one call, and the control thread's group-offset
//! sync locks it to write offsets taken from a source.

pub mod coordinator;
pub mod group;
pub mod offsets;
pub mod service;
pub mod versions;

pub use coordinator::{
    ClientInfo, CoordinatorConfig, Deferred, GroupCoordinator, PartitionCatalog,
};
pub use group::Waiter;
pub use offsets::{MemoryStore, OffsetStore, OffsetsLog};
pub use service::{GroupService, GroupServiceError};

/// The one coordinator of a kmirror process, shared by the endpoint and the control thread.
pub type SharedCoordinator = std::sync::Arc<std::sync::Mutex<GroupCoordinator<OffsetsLog>>>;
