//! The real-Kafka test harness shared by the integration test binaries (`mod harness;`).
//!
//! It starts Apache Kafka brokers from the Maven jars cached by `tests/kafka/fetch-jars.sh`,
//! drives them with the real Java clients (`tests/java/KafkaTool.java`) and runs Kafka's own
//! `DumpLogSegments` on any partition directory. Nothing here imitates Kafka: every answer a
//! test checks comes from Kafka's code.
//!
//! * [`shared`]: one KRaft broker per test binary, started on first use and killed when the test
//!   process exits, however it exits.
//! * [`Kafka::start_dedicated`] / [`Kafka::start_version`]: a broker owned by one test, for tests
//!   that stop, kill or restart it, or need an older Kafka.
#![allow(dead_code, unused_imports)] // each test binary uses a different part of the harness

mod broker;
pub mod certs;
pub mod client_login;
pub mod cluster;
pub mod dump;
pub mod files;
pub mod groups;
mod jars;
pub mod mirrors_cli;
pub mod notify;
pub mod ports;
mod process;
pub mod proxy;
pub mod python_clients;
pub mod serve;
mod tool;

pub use broker::{Kafka, KafkaVersion, SaslSslSetup};
pub use dump::{dump_log_segments, DumpBatch, DumpFlags, DumpOutput};
pub use jars::kafka_libs;
pub use process::run_bounded;
pub use tool::{
    acl_lines, add_scram_user, kafka_acls_allow, kafka_cluster_id, tool_command, try_consume,
    with_client_config,
};
pub use tool::{
    console_consumer, consume, consume_to_end, describe_topic_config_sources,
    describe_topic_configs, kafka_acls, kafka_configs, kafka_topics, offsets, offsets_for_times,
    produce, run_tool_unchecked, Codec, ConsumedRecord, Isolation, ProduceOpts, Produced,
    TimeOffset, TxnEnd,
};
pub use tool::{
    consume_to_end_configured, consume_to_end_with, produce_with, run_tool_with, tool_command_with,
    with_tool_session,
};

use std::sync::OnceLock;

/// The broker shared by every test of this test binary (Kafka 4.1.1, KRaft).
///
/// Tests sharing it must use their own topic names. It lives until the test process exits; the
/// process watchdog in `process.rs` then kills the JVM and removes its directory.
pub fn shared() -> &'static Kafka {
    static SHARED: OnceLock<Kafka> = OnceLock::new();
    SHARED.get_or_init(|| Kafka::start_shared(KafkaVersion::DEFAULT))
}

/// A topic name unique within this process, readable in broker logs.
pub fn unique_topic(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The project virtualenv's Python (`.venv`, made by `tests/setup.sh` with the pinned clients of
/// `tests/python/requirements.txt`: kafka-python, lz4, confluent-kafka). Panics, so the test
/// fails rather than skips, when the virtualenv is missing.
pub fn python() -> std::path::PathBuf {
    let py = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run `bash tests/setup.sh` (README's test command does)",
        py.display()
    );
    py
}
