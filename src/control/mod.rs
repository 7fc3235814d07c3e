//! The control thread: mirror lifecycle, `__mirror_state`, discovery and sync.
//!
//! | module       | job                                                                  |
//! |--------------|----------------------------------------------------------------------|
//! | `state`      | the per-partition KIP-1279 state machine (pure, no I/O)              |
//! | `mirror_def` | mirror names, source connection properties, topic filters, start     |
//! | `records`    | keys and values of `__mirror_state` records                          |
//! | `state_log`  | `__mirror_state-0`: durable puts, replay, compaction at start        |
//! | `controller` | owns all mirrors: commands, persistence, data-plane orders, describe |
//! | `fault`      | why a source or data-plane step failed, retryable or not, timed out |
//! | `source_worker` | where source calls run: bounded, one per mirror and kind, answers as messages |
//! | `admin`      | HTTP/JSON admin API and the control thread that serves it           |
//! | `admin_guard` | who may use the admin API: bearer token (0600 file), Host check     |
//! | `admin_tls`  | the admin API over TLS (handshakes with a deadline, off the accept path) |
//! | `source_catalog` | source topics and cluster id with the blocking client           |
//! | `source_epochs` | the highest source leader epoch per partition, for failover        |
//! | `source_security` | a mirror's TLS/SASL settings as the source client's security     |
//! | `shard_plane` | `DataPlane` over the real shards and the log dir                    |
//! | `leader_refresh` | finding a partition's leader again when its shard asks       |
//! | `leader_store` | failed-over partitions: client writes under one mutex, lock-free reads |
//! | `producer_ids` | producer ids for writes after failover: above every mirrored id, never reused |
//! | `mirror_run` | resolving a configured mirror against the source and driving shards  |
//! | `control_run` | `kmirror serve` with `[admin]`: controller, shards and admin API     |
//! | `topic_configs` | which source topic configs are copied, and how they apply locally  |
//! | `acl_sync` | which source ACLs a mirror takes (`mirror.acls.*`), DescribeAcls on the source |
//! | `audit` | continuous integrity audit: local scrub, comparison with the source, verified marks |
//! | `unclean_recovery` | truncating to the source's divergence point after its unclean election, the cut to the quarantine |
//! | `json_records` | durable JSON records of drills and consistent cuts under way, one file each |

pub mod acl_sync;
pub mod admin;
pub mod admin_failback;
pub mod admin_guard;
pub mod admin_tls;
pub mod audit;

pub mod consistent_cut;
pub mod control_run;
pub mod controller;
pub mod drill;
pub mod failback;
pub mod fault;
pub mod group_sync;
pub mod json_records;
pub mod leader_refresh;
pub mod leader_store;
pub mod lineage;
pub mod loss_report;
pub mod mirror_def;
pub mod mirror_run;
pub mod producer_ids;
pub mod records;
pub mod shard_plane;
pub mod source_catalog;
pub mod source_epochs;
pub mod source_security;
pub mod source_worker;
pub mod start_offsets;
pub mod state;
pub mod state_log;
pub mod topic_configs;
pub mod unclean_recovery;
