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
