//! Replays the checked-in fuzz corpus (`fuzz/corpus/<target>/`) through the same entry points
//! the cargo-fuzz targets call (`kmirror::fuzz_entry`), so every seed and every input the fuzzer
//! once found is checked on stable in the normal test run. An entry point asserts its
//! invariants itself: a panic names the file.

use std::path::Path;

use kmirror::fuzz_entry::TARGETS;

/// Fewer seeds than this means the corpus was lost, not that there is nothing to check.
const SEEDS_MIN: usize = 8;

#[test]
fn every_corpus_file_replays_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (target, run) in TARGETS {
        let dir = root.join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(
            files.len() >= SEEDS_MIN,
            "{}: {} seeds, expected at least {SEEDS_MIN}",
            dir.display(),
            files.len()
        );
        for file in files {
            let data = std::fs::read(&file).unwrap();
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{} failed its invariants", file.display());
        }
    }
}

/// Goal: the `request_frame` corpus starts from a well-formed request of every API and version
/// a listener serves, so the fuzzer reaches every handler from its first run, and no served API
/// is missing from the fuzz entry's type list. Method: compare the seeds on disk with what the
/// served dispatcher advertises.
#[test]
fn request_frame_seeds_cover_every_served_api_and_version() {
    use kmirror::fuzz_entry::request_frame::{decode_served, default_body, input, served_versions};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/request_frame");
    let on_disk: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    let served = served_versions();
    assert!(
        served.len() > 100,
        "only {} API versions served",
        served.len()
    );
    let mut missing = Vec::new();
    for (api, version) in served {
        let body = default_body(api, version)
            .unwrap_or_else(|| panic!("{api:?} v{version} is served but has no seed request"));
        // A seed the decoder refuses would never reach the handler.
        decode_served(api, version, body.clone())
            .unwrap()
            .unwrap_or_else(|e| panic!("{api:?} v{version}: the seed does not decode: {e}"));
        let seed = input(api, version, &body).unwrap();
        if !on_disk.contains(&seed) {
            missing.push(format!("{api:?} v{version}"));
        }
    }
    assert!(
        missing.is_empty(),
        "no seed for {missing:?}: run `cargo test --test fuzz_corpus -- --ignored write_request_frame_seeds`"
    );
}

/// Writes the `request_frame` seeds (one default request per served API and version); run by
/// hand when the served APIs change.
#[test]
#[ignore = "writes the checked-in seed corpus; run by hand"]
fn write_request_frame_seeds() {
    use kmirror::fuzz_entry::request_frame::{default_body, input, served_versions};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/request_frame");
    std::fs::create_dir_all(&dir).unwrap();
    for (api, version) in served_versions() {
        let Some(body) = default_body(api, version) else {
            continue;
        };
        let seed = input(api, version, &body).unwrap();
        std::fs::write(dir.join(format!("{api:?}-v{version}")), seed).unwrap();
    }
}
