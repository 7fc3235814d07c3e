//! Goal: a source quota on a mirror's client id slows that mirror without errors. Method: a
//! real Kafka 4.1.1 broker with a `consumer_byte_rate` quota set by Kafka's own `kafka-configs`
//! on the client id `kmirror-<mirror>` (kmirror's default), about 3 MB to mirror, and
//! `kmirror serve` driven by the CLI. The broker answers with throttle_time_ms; kmirror must
//! honour it (no error, no reconnect, the copy completes byte for byte) and report it:
//! describe's `throttleTimeMs` is the throttle the source imposed, so it must be positive.
//! No wall-clock assertion.

mod harness;

use harness::mirrors_cli::{
    cli_ok, describe_rows, free_loopback_port, wait_admin, write_admin_config,
};
use harness::serve::{wait_mirrored, Serve};
use harness::ProduceOpts;

#[test]
fn consumer_byte_rate_quota_throttles_without_errors() {
    let k = harness::shared();
    let topic = harness::unique_topic("quota");
    k.create_topic(&topic, 1, &[]);
    let opts = ProduceOpts {
        value_bytes: 1000,
        ..ProduceOpts::default()
    };
    k.produce(&topic, 0, 3000, &opts);
    let mirror = format!("quota-{}", std::process::id());
    let client_id = format!("kmirror-{mirror}");
    harness::kafka_configs(
        &k.bootstrap(),
        &[
            "--alter",
            "--add-config",
            "consumer_byte_rate=300000",
            "--entity-type",
            "clients",
            "--entity-name",
            &client_id,
        ],
    );

    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_admin_config(&config, &admin, &data_dir, "");
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_admin(&mut serve, &admin);
    let props = work.path().join("m.properties");
    std::fs::write(&props, format!("bootstrap.servers={}\n", k.bootstrap())).unwrap();
    cli_ok(
        &admin,
        &[
            "create",
            "--mirror",
            &mirror,
            "--mirror-config",
            props.to_str().unwrap(),
        ],
    );
    cli_ok(&admin, &["start", "--mirror", &mirror, "--topics", &topic]);
    wait_mirrored(
        &mut serve,
        &k.partition_dir(&topic, 0),
        &data_dir.join(format!("{topic}-0")),
    );

    let rows = describe_rows(&admin, &mirror);
    let row = &rows[0];
    assert_eq!(row["state"], "MIRRORING", "{row}");
    assert!(row["errorMessage"].is_null(), "{row}");
    let throttled = row["throttleTimeMs"].as_i64().unwrap_or(0);
    assert!(
        throttled > 0,
        "the source's quota throttle was not seen: {row}"
    );
    let log = serve.log_text();
    assert!(
        !log.contains("reconnecting"),
        "throttling broke the connection:\n{log}"
    );
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
}
