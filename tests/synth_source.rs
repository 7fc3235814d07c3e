//! The synthetic bench source against a stock client: Kafka 4.1.1's own console consumer
//! (Java, from the Maven jars) consumes from it and must see exactly the records the source
//! generated, decompressed by Java's lz4/zstd and parsed by Kafka's record code.

use std::path::PathBuf;
use std::process::Command;

use kmirror::bench::records::{record_key, record_value, Catalog};
use kmirror::bench::server::SynthServer;
use kmirror::bench::{SynthCodec, SynthSpec};

fn kafka_libs() -> PathBuf {
    let home = std::env::var("HOME").expect("HOME is set");
    let libs = PathBuf::from(home).join(".cache/kmirror/kafka-4.1.1/libs");
    let tools = libs.join("kafka-tools-4.1.1.jar");
    assert!(
        tools.exists(),
        "Kafka 4.1.1 jars missing at {}: run `bash tests/kafka/fetch-jars.sh`",
        libs.display()
    );
    libs
}

struct Consumed {
    partition: i32,
    offset: i64,
    key: String,
    value: String,
}

/// Runs the console consumer and parses its `Partition:P\tOffset:O\tkey\tvalue` lines.
fn console_consume(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    offset: &str,
    max: usize,
) -> Vec<Consumed> {
    let libs = kafka_libs();
    let out = Command::new("java")
        .arg("-Xmx256m")
        .arg("-cp")
        .arg(format!("{}/*", libs.display()))
        .arg("org.apache.kafka.tools.consumer.ConsoleConsumer")
        .args(["--bootstrap-server", bootstrap, "--topic", topic])
        .args(["--partition", &partition.to_string(), "--offset", offset])
        .args(["--max-messages", &max.to_string(), "--timeout-ms", "60000"])
        .args([
            "--property",
            "print.partition=true",
            "--property",
            "print.offset=true",
        ])
        .args(["--property", "print.key=true"])
        .output()
        .expect("java runs (Java 17 is required)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "console consumer failed: {}\n{stderr}",
        out.status
    );
    stdout
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.splitn(4, '\t').collect();
            assert_eq!(
                f.len(),
                4,
                "unexpected console consumer line {line:?}\nstderr:\n{stderr}"
            );
            Consumed {
                partition: f[0]
                    .strip_prefix("Partition:")
                    .expect("partition field")
                    .parse()
                    .unwrap(),
                offset: f[1]
                    .strip_prefix("Offset:")
                    .expect("offset field")
                    .parse()
                    .unwrap(),
                key: f[2].to_string(),
                value: f[3].to_string(),
            }
        })
        .collect()
}

fn check(
    records: &[Consumed],
    partition: i32,
    first: i64,
    count: usize,
    rpb: i64,
    value_bytes: usize,
) {
    assert_eq!(records.len(), count);
    for (i, r) in records.iter().enumerate() {
        let offset = first + i as i64;
        let index = (offset % rpb) as u32;
        assert_eq!(r.partition, partition);
        assert_eq!(r.offset, offset, "record {i}");
        assert_eq!(r.key, record_key(index), "key at offset {offset}");
        assert_eq!(
            r.value,
            record_value(index, value_bytes),
            "value at offset {offset}"
        );
    }
}

fn serve(codec: SynthCodec, batches: u64) -> (String, i64, usize) {
    let mut spec = SynthSpec {
        topics: vec!["orders".into(), "synth".into()],
        partitions: 3,
        codec,
        records_per_batch: Some(50),
        value_bytes: 120,
        ..SynthSpec::default()
    };
    // The partition size is given in bytes; the template's size tells how many make `batches`.
    let batch_bytes = Catalog::new(spec.clone()).unwrap().template.size() as u64;
    spec.partition_bytes = Some(batch_bytes * batches);
    let value_bytes = spec.value_bytes;
    let server = SynthServer::bind("127.0.0.1:0", spec).unwrap();
    assert_eq!(server.catalog().batches_per_partition, Some(batches));
    let rpb = server.catalog().records_per_batch();
    let addr = server.spawn().unwrap();
    (addr.to_string(), rpb, value_bytes)
}

#[test]
fn console_consumer_reads_every_lz4_record_from_the_start() {
    let (bootstrap, rpb, vb) = serve(SynthCodec::Lz4, 20);
    let all = 20 * rpb as usize;
    let got = console_consume(&bootstrap, "synth", 2, "earliest", all);
    check(&got, 2, 0, all, rpb, vb);
}

#[test]
fn console_consumer_reads_zstd_from_a_mid_batch_offset() {
    let (bootstrap, rpb, vb) = serve(SynthCodec::Zstd, 20);
    // 137 is inside the third batch: the source returns that whole batch and the consumer
    // must skip the records before 137.
    let got = console_consume(&bootstrap, "orders", 1, "137", 500);
    check(&got, 1, 137, 500, rpb, vb);
}
