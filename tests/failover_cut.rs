//! Goal: `kmirror mirrors stop --cut-at-timestamp T` truncates every partition it fails over to
//! the same source timestamp and keeps what it cut in the quarantine, byte for byte in Kafka's
//! segment format (issue 16 item 4).
//!
//! Method: the shared broker, two topics; the Java producer writes a first set of records to
//! both, the test takes T after every one was acknowledged (so their CreateTime is at most T)
//! and waits until the clock is past T, then writes a second set (CreateTime above T). kmirror
//! mirrors all of it and is stopped with the cut at T. Both logs must end exactly where the
//! first set ended on the source and equal the source's bytes up to there; each quarantine
//! `.log` must equal the source's bytes after that point (the second set's batches), be read
//! cleanly by Kafka's DumpLogSegments, and its report must list those batches; the loss report
//! counts the cut records as lost (the source still has them).
//!
//! The second test kills kmirror with `kill -9` in the middle of a cut: one topic's cut cannot
//! write its quarantine (the quarantine path is a file), so that partition stays STOPPING while
//! the other is already STOPPED. The restart must finish the cut at the same T (recorded in
//! `kmirror-cuts/`), never fail the partition over uncut.

mod harness;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use harness::dump::{dump_log_segments, DumpFlags};
use harness::mirrors_cli::{cli_ok, describe_rows, wait_admin, ControlPlane};
use harness::serve::{log_bytes, wait_all_mirrored, Serve};
use harness::{shared, unique_topic, Kafka, ProduceOpts};
use serde_json::Value;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Produces `first[i]` records to `topics[i]` (partition 0), takes T once all are
/// acknowledged, waits for the clock to pass T, then produces `second[i]` (CreateTime above
/// T). Returns T and each source log's bytes after the first and after the second set.
fn two_sets(
    k: &Kafka,
    topics: &[String],
    first: &[usize],
    second: &[usize],
) -> (i64, Vec<Vec<u8>>, Vec<Vec<u8>>) {
    for t in topics {
        k.create_topic(t, 1, &[]);
    }
    for (i, t) in topics.iter().enumerate() {
        let w = k.produce(
            t,
            0,
            first[i],
            &ProduceOpts {
                seed: 1,
                ..ProduceOpts::default()
            },
        );
        assert_eq!(w.offsets.len(), first[i]);
    }
    let cut_at = now_ms();
    // The second set must carry CreateTime above T: wait for the clock (bounded).
    let start = Instant::now();
    while now_ms() <= cut_at + 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "clock stands still"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let source_dirs: Vec<_> = topics.iter().map(|t| k.partition_dir(t, 0)).collect();
    let kept: Vec<Vec<u8>> = source_dirs.iter().map(|d| log_bytes(d)).collect();
    for (i, t) in topics.iter().enumerate() {
        if second[i] == 0 {
            continue;
        }
        let w = k.produce(
            t,
            0,
            second[i],
            &ProduceOpts {
                seed: 2,
                ..ProduceOpts::default()
            },
        );
        assert_eq!(w.offsets.len(), second[i]);
    }
    let full: Vec<Vec<u8>> = source_dirs.iter().map(|d| log_bytes(d)).collect();
    for i in 0..topics.len() {
        assert!(full[i].starts_with(&kept[i]) && full[i].len() >= kept[i].len());
    }
    (cut_at, kept, full)
}

/// kmirror mirroring `topics` (partition 0 each) as mirror "m", every log equal to the
/// source's; with our partition directories.
fn mirror_all(k: &Kafka, topics: &[String]) -> (ControlPlane, Vec<std::path::PathBuf>) {
    let mut cp = ControlPlane::start(&k.bootstrap(), false, "sync.group.offsets.enabled=false\n");
    cli_ok(
        &cp.admin,
        &["start", "--mirror", "m", "--topics", &topics.join(",")],
    );
    let ours: Vec<_> = topics
        .iter()
        .map(|t| cp.data_dir.join(format!("{t}-0")))
        .collect();
    let pairs: Vec<_> = topics
        .iter()
        .map(|t| k.partition_dir(t, 0))
        .zip(ours.iter().cloned())
        .collect();
    wait_all_mirrored(&mut cp.serve, &pairs);
    (cp, ours)
}

/// `stop --cut-at-timestamp` of every topic, its JSON answer.
fn stop_with_cut(admin: &str, topics: &[String], cut_at: i64) -> Value {
    let ts = cut_at.to_string();
    let pattern = topics.join(",");
    let out = cli_ok(
        admin,
        &[
            "stop",
            "--mirror",
            "m",
            "--topics",
            &pattern,
            "--cut-at-timestamp",
            &ts,
            "--json",
        ],
    );
    serde_json::from_str(&out).unwrap()
}

#[test]
fn cut_at_timestamp_truncates_both_topics_and_quarantines_the_rest() {
    let k = shared();
    let topics = [unique_topic("cut-a"), unique_topic("cut-b")];
    let first = [40usize, 25];
    let second = [30usize, 45];
    let (cut_at, kept, full) = two_sets(k, &topics, &first, &second);
    let (
        ControlPlane {
            data_dir,
            admin,
            serve,
            // Holds the temp dir (data dir, serve log) until the test ends.
            work: _work,
            ..
        },
        ours,
    ) = mirror_all(k, &topics);
    let answer = stop_with_cut(&admin, &topics, cut_at);
    let cuts = answer["cut"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"));
    assert_eq!(cuts.len(), 2, "{answer}");
    let text = cli_ok(&admin, &["describe", "--mirror", "m"]);
    assert!(text.contains("STOPPED"), "{text}");

    let mut quarantined = Vec::new();
    for (i, t) in topics.iter().enumerate() {
        let c = cuts.iter().find(|c| c["topic"] == t.as_str()).unwrap();
        let end = first[i] as i64;
        assert_eq!(c["cut_offset"], end, "{c}");
        assert_eq!(c["log_end_before"], end + second[i] as i64, "{c}");
        assert_eq!(c["log_end_after"], end, "{c}");
        // The mirror now equals the source up to the cut (no marker: no transaction was open).
        assert_eq!(
            log_bytes(&ours[i]),
            kept[i],
            "{t}: kmirror's log after the cut"
        );
        let q = &c["quarantine"];
        assert_eq!(q["first_offset"], end, "{q}");
        assert_eq!(q["end_offset"], end + second[i] as i64, "{q}");
        assert_eq!(q["record_count"], second[i] as i64, "{q}");
        let batches = q["batches"].as_array().unwrap();
        assert_eq!(batches.len(), q["batch_count"].as_u64().unwrap() as usize);
        assert_eq!(batches[0]["base_offset"], end, "{q}");
        assert!(
            batches
                .iter()
                .all(|b| b["max_timestamp"].as_i64().unwrap() > cut_at),
            "every quarantined batch is newer than T: {q}"
        );
        let file = std::path::PathBuf::from(q["segment_file"].as_str().unwrap());
        assert!(
            file.starts_with(data_dir.join("kmirror-quarantine")),
            "{file:?}"
        );
        assert_eq!(
            std::fs::read(&file).unwrap(),
            full[i][kept[i].len()..],
            "{t}: the quarantine holds exactly the source's batches after the cut"
        );
        let stored: Value =
            serde_json::from_slice(&std::fs::read(file.with_file_name("report.json")).unwrap())
                .unwrap();
        assert_eq!(&stored, q, "report.json is what stop printed");
        quarantined.push(file);
    }
    let dump = dump_log_segments(&quarantined, DumpFlags::DEEP_SANITY);
    dump.assert_clean();
    let dumped: i64 = dump
        .batches
        .iter()
        .map(|b| b.last_offset - b.base_offset + 1)
        .sum();
    assert_eq!(
        dumped,
        (second[0] + second[1]) as i64,
        "DumpLogSegments reads every cut record"
    );

    // The loss report counts what was cut: the source still holds it, kmirror does not.
    let loss = &answer["loss_report"];
    for (i, t) in topics.iter().enumerate() {
        let p = loss["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["topic"] == t.as_str())
            .unwrap();
        assert_eq!(p["records"], second[i] as i64, "{p}");
        assert_eq!(p["records_exact"], true, "{p}");
    }
    drop(serve);
}

#[test]
fn a_cut_under_way_when_kmirror_is_killed_is_finished_by_the_restart() {
    let k = shared();
    // Topic a has records newer than T (its cut must write the quarantine), topic b has none.
    let topics = [unique_topic("cutkill-a"), unique_topic("cutkill-b")];
    let (cut_at, kept, full) = two_sets(k, &topics, &[20, 30], &[35, 0]);
    let (
        ControlPlane {
            data_dir,
            admin,
            serve,
            config,
            work,
        },
        ours,
    ) = mirror_all(k, &topics);

    // The quarantine cannot be written: a's cut fails (and is retried), b's needs none.
    let blocker = data_dir.join("kmirror-quarantine");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let answer = stop_with_cut(&admin, &topics, cut_at);
    let state = |rows: &[Value], t: &str| {
        rows.iter()
            .find(|r| r["topic"] == t)
            .map(|r| r["state"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let rows = describe_rows(&admin, "m");
    assert_eq!(state(&rows, &topics[0]), "STOPPING", "{answer}");
    assert_eq!(state(&rows, &topics[1]), "STOPPED", "{answer}");
    assert!(
        data_dir.join("kmirror-cuts/m.json").exists(),
        "the cut is recorded"
    );

    serve.kill9();
    std::fs::remove_file(&blocker).unwrap();
    let mut serve = Serve::start(&config, work.path().join("serve-restarted.log"));
    wait_admin(&mut serve, &admin);
    serve.wait_for(
        "a's failover after the restart",
        Duration::from_secs(60),
        || state(&describe_rows(&admin, "m"), &topics[0]) == "STOPPED",
    );
    // a was cut at T like b: its log ends where the first set ended, the rest quarantined.
    assert_eq!(
        log_bytes(&ours[0]),
        kept[0],
        "a is cut at T, not failed over uncut"
    );
    assert_eq!(log_bytes(&ours[1]), kept[1]);
    let quarantine: Vec<_> = std::fs::read_dir(&blocker)
        .unwrap()
        .map(|e| e.unwrap().path().join(format!("{}-0", topics[0])))
        .filter(|d| d.exists())
        .collect();
    assert_eq!(quarantine.len(), 1, "{quarantine:?}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(quarantine[0].join("report.json")).unwrap()).unwrap();
    assert_eq!(report["first_offset"], 20, "{report}");
    assert_eq!(report["record_count"], 35, "{report}");
    let file = std::path::PathBuf::from(report["segment_file"].as_str().unwrap());
    assert_eq!(std::fs::read(file).unwrap(), full[0][kept[0].len()..]);
    serve.wait_for("the cut record deleted", Duration::from_secs(30), || {
        !data_dir.join("kmirror-cuts/m.json").exists()
    });
    drop(serve);
}
