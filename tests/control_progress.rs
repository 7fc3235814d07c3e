//! Goal: `describe` reports real progress, and a mirror's start position is honoured, against a
//! real Kafka 4.1.1 broker through `kmirror serve` and the `kmirror mirrors` CLI.
//! - Lag: after catch-up the source high watermark and the local log end are both the broker's
//!   log end and lag is 0 (0 s); records produced while PAUSED show as lag (the source HW comes
//!   from ListOffsets on the source, the local end stays); right after resume lag is unknown
//!   (null) until the first fetch measures it, and resume brings lag back to 0.
//! - Start position: `latest` starts the local log at the source's log end at start time, so
//!   only records produced afterwards arrive (our `.log` is exactly the tail of the broker's
//!   from that offset); a timestamp starts at the first record at or after it (the offset
//!   Kafka's ListOffsets gives, known here by construction: the first record of a second
//!   produce run whose timestamps all follow the first run's). Several `latest` partitions
//!   each start at their own end, and a resume goes on from the local end: records produced
//!   while paused arrive, none are skipped to the source's new end.

mod harness;

use std::path::Path;
use std::time::Duration;

use harness::mirrors_cli::{
    cli_ok, create_mirror, describe_rows, free_loopback_port, wait_admin, write_admin_config,
};
use harness::serve::{log_bytes, Serve};
use harness::ProduceOpts;
use kmirror::wire::batch::Batches;

/// Failure guard for describe to show the expected progress, not a performance claim.
const PROGRESS_LIMIT: Duration = Duration::from_secs(120);

/// Polls describe for `mirror` until `want` holds for its rows; returns them.
fn wait_describe(
    serve: &mut Serve,
    admin: &str,
    mirror: &str,
    want: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    serve.poll(
        "describe showing the expected progress",
        (PROGRESS_LIMIT, Duration::from_millis(300)),
        |_| describe_rows(admin, mirror),
        |rows| want(rows),
    )
}

/// Waits until the first partition of `mirror` satisfies `want`; returns its row.
fn wait_row(
    serve: &mut Serve,
    admin: &str,
    mirror: &str,
    want: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let rows = wait_describe(serve, admin, mirror, |rows| rows.first().is_some_and(&want));
    rows[0].clone()
}

/// Waits until describe shows `n` partitions of `mirror`, each satisfying `want`.
fn wait_rows(
    serve: &mut Serve,
    admin: &str,
    mirror: &str,
    n: usize,
    want: impl Fn(&serde_json::Value) -> bool,
) {
    wait_describe(serve, admin, mirror, |rows| {
        rows.len() == n && rows.iter().all(&want)
    });
}

/// Base offset of the first batch and max timestamp of the last one in a partition dir.
fn first_offset_and_last_timestamp(dir: &Path) -> (i64, i64) {
    let bytes = log_bytes(dir);
    let batches: Vec<_> = Batches::new(&bytes).map(|b| b.unwrap().1).collect();
    (
        batches.first().unwrap().base_offset().0,
        batches.last().unwrap().max_timestamp().0,
    )
}

#[test]
fn describe_lag_and_start_positions() {
    let k = harness::shared();
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_admin_config(&config, &admin, &data_dir, "");
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_admin(&mut serve, &admin);

    // Lag while paused and after catch-up.
    let lagging = harness::unique_topic("progress-lag");
    k.create_topic(&lagging, 1, &[]);
    k.produce(&lagging, 0, 300, &ProduceOpts::default());
    create_mirror(&admin, work.path(), "lag", &k.bootstrap(), "");
    cli_ok(&admin, &["start", "--mirror", "lag", "--topics", &lagging]);
    let caught_up = |want: i64| {
        move |r: &serde_json::Value| {
            r["state"] == "MIRRORING"
                && r["sourceOffset"] == want
                && r["destinationOffset"] == want
                && r["lag"] == 0
        }
    };
    let row = wait_row(&mut serve, &admin, "lag", caught_up(300));
    assert_eq!(row["lagSeconds"], 0.0, "{row}");
    cli_ok(&admin, &["pause", "--mirror", "lag", "--topics", &lagging]);
    k.produce(&lagging, 0, 100, &ProduceOpts::default());
    // describe asks the source for its end; a slow answer falls back to the last one the
    // shard saw (300), so wait for the fresh one.
    let row = wait_row(&mut serve, &admin, "lag", |r| {
        r["state"] == "PAUSED" && r["sourceOffset"] == 400
    });
    assert_eq!(
        (&row["sourceOffset"], &row["destinationOffset"], &row["lag"]),
        (&400.into(), &300.into(), &100.into()),
        "{row}"
    );
    let secs = row["lagSeconds"]
        .as_f64()
        .expect("lag in seconds from batch timestamps");
    assert!(secs >= 0.0, "{row}");
    cli_ok(&admin, &["resume", "--mirror", "lag", "--topics", &lagging]);
    // Right after resume the fetcher has not answered yet (its leader is looked up first): the
    // high watermark seen before the pause (300) is stale, so lag is unknown, never 0 from it.
    let row = describe_rows(&admin, "lag")[0].clone();
    assert!(
        row["lag"].is_null() || row["sourceOffset"] == 400,
        "describe right after resume showed a lag it had not measured: {row}"
    );
    let row = wait_row(&mut serve, &admin, "lag", caught_up(400));
    assert_eq!(row["lagSeconds"], 0.0, "{row}");

    // Start from latest: only what is produced after the start arrives.
    let latest = harness::unique_topic("progress-latest");
    k.create_topic(&latest, 1, &[]);
    k.produce(&latest, 0, 100, &ProduceOpts::default());
    create_mirror(
        &admin,
        work.path(),
        "late",
        &k.bootstrap(),
        "mirror.start.from=latest\n",
    );
    cli_ok(&admin, &["start", "--mirror", "late", "--topics", &latest]);
    let row = wait_row(&mut serve, &admin, "late", caught_up(100));
    assert_eq!(row["destinationOffset"], 100, "{row}");
    let ours = data_dir.join(format!("{latest}-0"));
    assert!(
        log_bytes(&ours).is_empty(),
        "records from before the start were mirrored"
    );
    k.produce(&latest, 0, 50, &ProduceOpts::default());
    wait_row(&mut serve, &admin, "late", caught_up(150));
    let theirs = log_bytes(&k.partition_dir(&latest, 0));
    let mine = log_bytes(&ours);
    assert!(
        !mine.is_empty() && theirs.ends_with(&mine),
        "our log is not the broker's tail"
    );
    assert_eq!(first_offset_and_last_timestamp(&ours).0, 100);

    // Several partitions from latest (their start offsets asked of the leader together), then
    // paused, produced to and resumed: a resume goes on from the local end, so what was
    // produced while paused arrives and nothing is skipped to the source's new latest.
    let wide = harness::unique_topic("progress-latest-wide");
    k.create_topic(&wide, 3, &[]);
    for p in 0..3 {
        k.produce(&wide, p, 40 + 10 * p as usize, &ProduceOpts::default());
    }
    create_mirror(
        &admin,
        work.path(),
        "wide",
        &k.bootstrap(),
        "mirror.start.from=latest\n",
    );
    cli_ok(&admin, &["start", "--mirror", "wide", "--topics", &wide]);
    let at_latest = |r: &serde_json::Value| {
        let p = r["partition"].as_i64().expect("partition in describe");
        caught_up(40 + 10 * p)(r)
    };
    wait_rows(&mut serve, &admin, "wide", 3, at_latest);
    for p in 0..3 {
        let dir = data_dir.join(format!("{wide}-{p}"));
        assert!(
            log_bytes(&dir).is_empty(),
            "partition {p}: records from before the start were mirrored"
        );
    }
    cli_ok(&admin, &["pause", "--mirror", "wide", "--topics", &wide]);
    wait_rows(&mut serve, &admin, "wide", 3, |r| r["state"] == "PAUSED");
    for p in 0..3 {
        k.produce(&wide, p, 5, &ProduceOpts::default());
    }
    cli_ok(&admin, &["resume", "--mirror", "wide", "--topics", &wide]);
    wait_rows(&mut serve, &admin, "wide", 3, |r| {
        let p = r["partition"].as_i64().expect("partition in describe");
        caught_up(45 + 10 * p)(r)
    });
    for p in 0..3 {
        let ours = data_dir.join(format!("{wide}-{p}"));
        let theirs = log_bytes(&k.partition_dir(&wide, p));
        let mine = log_bytes(&ours);
        assert!(
            !mine.is_empty() && theirs.ends_with(&mine),
            "partition {p}: our log is not the broker's tail"
        );
        // Starts where the start found the source's end: the paused records are all here.
        assert_eq!(
            first_offset_and_last_timestamp(&ours).0,
            40 + 10 * i64::from(p)
        );
    }

    // Start from a timestamp: the first record at or after it.
    let timed = harness::unique_topic("progress-ts");
    k.create_topic(&timed, 1, &[]);
    k.produce(&timed, 0, 100, &ProduceOpts::default());
    let (_, newest_early) = first_offset_and_last_timestamp(&k.partition_dir(&timed, 0));
    let from = newest_early + 1;
    k.produce(&timed, 0, 80, &ProduceOpts::default());
    create_mirror(
        &admin,
        work.path(),
        "ts",
        &k.bootstrap(),
        &format!("mirror.start.from={from}\n"),
    );
    cli_ok(&admin, &["start", "--mirror", "ts", "--topics", &timed]);
    wait_row(&mut serve, &admin, "ts", caught_up(180));
    let ours = data_dir.join(format!("{timed}-0"));
    assert_eq!(first_offset_and_last_timestamp(&ours).0, 100);
    assert!(log_bytes(&k.partition_dir(&timed, 0)).ends_with(&log_bytes(&ours)));

    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
}
