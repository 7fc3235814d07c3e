//! The transaction coordinator for producers writing to kmirror after failover.
//!
//! kmirror is the only broker its clients see, so it is also their transaction coordinator:
//! FindCoordinator (served by the group service for both key types) sends transactional
//! producers here. The classic protocol (transaction version 1) is served: InitProducerId with
//! a transactional id, AddPartitionsToTxn v0–3, EndTxn v0–4. kmirror does not advertise the
//! `transaction.version` feature, so clients do not use KIP-890's implicit partition adds.
//! AddOffsetsToTxn v0–4 and TxnOffsetCommit v0–4 serve `sendOffsetsToTransaction`: the
//! offsets are held as pending by the group coordinator (`TxnOffsets`) and committed or
//! dropped when the transaction ends.
//!
//! | module        | job                                                                   |
//! |---------------|-----------------------------------------------------------------------|
//! | `meta`        | the durable record per transactional id: producer id and epoch, state  |
//! | `coordinator` | the rules: state changes per transactional id, fencing, timeouts      |
//! | `store`       | `__transaction_state-0`: one keyed JSON record per transactional id    |
//! | `service`     | the API handlers on the endpoint and the timeout timer thread         |
//!
//! Every state change is written to `__transaction_state-0` before it is acted on. EndTxn
//! writes PrepareCommit/PrepareAbort, then the markers into each partition (through the
//! leader store), then ends the transaction's pending group offsets, then
//! CompleteCommit/CompleteAbort, and only then answers. A crash between
//! the two records leaves Prepare*: the next start writes the markers still missing (a
//! partition whose producer has no open transaction already has its marker) and completes it.

pub mod coordinator;
pub mod meta;
pub mod service;
pub mod store;

pub use coordinator::{TxnCoordinator, TxnError, TxnOffsets};
pub use meta::{TxnMeta, TxnState};
pub use service::TxnService;
pub use store::TxnLog;
