//! Goal: an operator runs `kmirror serve` with an `[admin]` section and manages mirrors with the
//! `kmirror mirrors` CLI, and the real shards move the records. Method: a real Kafka 4.1.1 KRaft
//! broker and its Java producer; the `kmirror` binary both as the server and as the CLI. A
//! mirror is created and a topic started through the CLI; we wait until our `.log` bytes equal
//! the broker's; pause (the log end reported must be exactly what was mirrored, and records
//! produced while paused must not arrive), resume (bytes equal again, so no gap), then SIGTERM
//! (clean-shutdown marker, clean stop) and restart: `describe --json` must show the same mirror
//! and partition states and offsets, and the restarted server must keep mirroring.

mod harness;

use std::time::{Duration, Instant};

use harness::dump::{dump_log_segments, segment_files, DumpFlags};
use harness::mirrors_cli::{
    cli_ok, describe_rows, free_loopback_port, wait_admin, write_admin_config,
};
use harness::serve::{log_bytes, wait_mirrored, Serve};
use harness::ProduceOpts;

/// (topic, partition, state, destination offset) of every partition of the mirror.
fn describe(admin: &str, mirror: &str) -> Vec<(String, i64, String, Option<i64>)> {
    describe_rows(admin, mirror)
        .iter()
        .map(|r| {
            (
                r["topic"].as_str().unwrap().to_owned(),
                r["partition"].as_i64().unwrap(),
                r["state"].as_str().unwrap().to_owned(),
                r["destinationOffset"].as_i64(),
            )
        })
        .collect()
}

/// (name and source as JSON, mirror epoch) of every mirror.
fn mirrors(admin: &str) -> Vec<(String, i64)> {
    let json = cli_ok(admin, &["list", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let mut r = r.clone();
            let epoch = r["mirror_epoch"].take().as_i64().expect("mirror_epoch");
            (r.to_string(), epoch)
        })
        .collect()
}

#[test]
fn serve_runs_the_control_plane_for_the_cli() {
    let k = harness::shared();
    let topic = harness::unique_topic("serve-ctl");
    k.create_topic(&topic, 1, &[]);
    k.produce(&topic, 0, 300, &ProduceOpts::default());

    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_admin_config(&config, &admin, &data_dir, "");
    let props = work.path().join("source.properties");
    std::fs::write(&props, format!("bootstrap.servers={}\n", k.bootstrap())).unwrap();
    let ours = data_dir.join(format!("{topic}-0"));
    let theirs = k.partition_dir(&topic, 0);

    let mut serve = Serve::start(&config, work.path().join("serve1.log"));
    wait_admin(&mut serve, &admin);
    let created = cli_ok(
        &admin,
        &[
            "create",
            "--mirror",
            "m",
            "--mirror-config",
            props.to_str().unwrap(),
        ],
    );
    assert!(created.starts_with("Created mirror m"), "{created}");
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &topic]);
    wait_mirrored(&mut serve, &theirs, &ours);

    // Paused: the log is back on the control thread, its end is exactly what was mirrored, and
    // records produced now are not fetched.
    cli_ok(&admin, &["pause", "--mirror", "m", "--topics", &topic]);
    let paused = describe(&admin, "m");
    assert_eq!(
        paused,
        [(topic.clone(), 0, "PAUSED".into(), Some(300))],
        "{}",
        serve.log_text()
    );
    let before = log_bytes(&ours);
    k.produce(&topic, 0, 200, &ProduceOpts::default());
    assert_eq!(describe(&admin, "m"), paused);
    assert_eq!(
        log_bytes(&ours),
        before,
        "a paused partition was written to"
    );

    cli_ok(&admin, &["resume", "--mirror", "m", "--topics", &topic]);
    wait_mirrored(&mut serve, &theirs, &ours);
    // Pause again so the exact log end is known for the restart check.
    cli_ok(&admin, &["pause", "--mirror", "m", "--topics", &topic]);
    cli_ok(&admin, &["resume", "--mirror", "m", "--topics", &topic]);
    let running = describe(&admin, "m");
    assert_eq!(running[0].2, "MIRRORING");
    let list_before = mirrors(&admin);

    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
    assert!(
        data_dir.join(".kafka_cleanshutdown").exists(),
        "no clean-shutdown marker after SIGTERM:\n{text}"
    );
    let dump = dump_log_segments(&segment_files(&ours), DumpFlags::DEEP_SANITY);
    dump.assert_clean();
    let mut next = 0;
    for b in dump
        .batches
        .iter()
        .filter(|b| b.file.extension().is_some_and(|e| e == "log"))
    {
        assert_eq!(b.base_offset, next, "gap or overlap before batch {b:?}");
        next = b.last_offset + 1;
    }
    assert_eq!(next, 500);

    let mut serve = Serve::start(&config, work.path().join("serve2.log"));
    wait_admin(&mut serve, &admin);
    // Same mirror and source; its epoch grows on every start of kmirror.
    let list_after = mirrors(&admin);
    assert_eq!(list_after.len(), 1);
    assert_eq!(list_after[0].0, list_before[0].0);
    assert!(
        list_after[0].1 > list_before[0].1,
        "{list_after:?} after {list_before:?}"
    );
    let after = describe(&admin, "m");
    assert_eq!(after.len(), 1);
    assert_eq!(
        (&after[0].0, after[0].1, &after[0].2),
        (&topic, 0, &"MIRRORING".to_owned())
    );
    // The restarted server hands the partition back to a shard, which keeps mirroring.
    k.produce(&topic, 0, 100, &ProduceOpts::default());
    wait_mirrored(&mut serve, &theirs, &ours);
    cli_ok(&admin, &["pause", "--mirror", "m", "--topics", &topic]);
    assert_eq!(
        describe(&admin, "m"),
        [(topic.clone(), 0, "PAUSED".into(), Some(600))]
    );
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");

    // A paused partition stays paused across a restart.
    let mut serve = Serve::start(&config, work.path().join("serve3.log"));
    wait_admin(&mut serve, &admin);
    assert_eq!(
        describe(&admin, "m"),
        [(topic.clone(), 0, "PAUSED".into(), Some(600))]
    );
    serve.sigterm_and_wait();
}

/// (state, retry attempt, error message) of one partition from `describe --json`.
fn failure(admin: &str, mirror: &str) -> (String, i64, Option<String>) {
    let json = cli_ok(admin, &["describe", "--mirror", mirror, "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    let r = &rows.as_array().unwrap()[0];
    (
        r["state"].as_str().unwrap().to_owned(),
        r["retryAttempt"].as_i64().unwrap_or(0),
        r["errorMessage"].as_str().map(str::to_owned),
    )
}

// Goal: in control-plane mode a source topic deleted and recreated under the same name makes
// its partition FAILED with the reason and no automatic retry, visible in `mirrors describe`,
// and our log is never rewritten. The shard detects it (new topic id after a leader look-up);
// the controller's periodic source sync (every 30 s) would also fail it as deleted, so either
// reason is accepted in `describe`, and the serve log tells which one came first.
#[test]
fn recreated_source_topic_fails_the_partition_in_describe() {
    let k = harness::shared();
    let topic = harness::unique_topic("serve-ctl-div");
    k.create_topic(&topic, 1, &[]);
    k.produce(&topic, 0, 200, &ProduceOpts::default());
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_admin_config(&config, &admin, &data_dir, "");
    let props = work.path().join("source.properties");
    std::fs::write(&props, format!("bootstrap.servers={}\n", k.bootstrap())).unwrap();
    let ours = data_dir.join(format!("{topic}-0"));

    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_admin(&mut serve, &admin);
    let mirror_config = props.to_str().unwrap();
    cli_ok(
        &admin,
        &["create", "--mirror", "m", "--mirror-config", mirror_config],
    );
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &topic]);
    wait_mirrored(&mut serve, &k.partition_dir(&topic, 0), &ours);
    let held = log_bytes(&ours);

    k.delete_topic(&topic);
    k.create_topic(&topic, 1, &[]);
    let new_data = ProduceOpts {
        seed: 5,
        ..Default::default()
    };
    k.produce(&topic, 0, 50, &new_data);

    let start = Instant::now();
    let (state, retry, message) = loop {
        serve.assert_running();
        let f = failure(&admin, "m");
        if f.0 == "FAILED" {
            break f;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "partition not FAILED: {f:?}\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let message = message.expect("a FAILED partition has an error message");
    println!("describe: {state} retry={retry} {message}");
    assert!(
        message.contains("deleted and recreated") || message == "source topic is deleted",
        "{message}"
    );
    assert_eq!(retry, -1, "divergence is not retried automatically");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(failure(&admin, "m").0, "FAILED");
    assert_eq!(log_bytes(&ours), held, "our log changed after divergence");
    serve.sigterm_and_wait();
}
