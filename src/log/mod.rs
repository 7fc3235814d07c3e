//! Storage in Apache Kafka's own on-disk format: partition directories with segments, indexes,
//! checkpoints and producer state, written so that Kafka's tools and brokers can read them.

pub mod checkpoint;
pub mod checkpoint_cell;
pub mod clean_shutdown;
pub mod clock;
pub mod config;
pub mod epoch_cache;
pub mod error;
pub mod flush_plan;
pub mod index_file;
pub mod index_pending;
pub mod io;
pub mod keyed_log;
pub mod lazy_file;
pub mod log_dir;
pub mod offset_index;
pub mod on_threads;
pub mod partition_log;
pub mod partition_meta;
pub mod preallocate;
pub mod producer_state;
pub mod quarantine;
pub mod read_view;
pub mod recovery;
pub mod retention;
pub mod scan;
pub mod segment;
pub mod time_index;
pub mod txn_index;

pub use error::LogError;
