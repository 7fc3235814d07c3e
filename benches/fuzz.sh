#!/usr/bin/env bash
# Runs every cargo-fuzz target under fuzz/ for a bounded time, one after the other, single job.
#
#   benches/fuzz.sh                      # each target 60 s
#   FUZZ_SECONDS=300 benches/fuzz.sh     # each target 5 min
#   FUZZ_TARGETS="fetch_response" benches/fuzz.sh
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Each run starts from
# the checked-in seeds (fuzz/corpus/<target>/, read only) and writes what it finds to
# fuzz/corpus.run/<target>/ (ignored by git); crashes land in fuzz/artifacts/<target>/ and make
# this script fail. To keep a new input as a seed, copy it into fuzz/corpus/<target>/: the normal
# test run replays that directory (tests/fuzz_corpus.rs).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${FUZZ_SECONDS:-60}"
targets="${FUZZ_TARGETS:-$(cargo +nightly fuzz list)}"
max_len="${FUZZ_MAX_LEN:-16384}"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
failed=0
for t in $targets; do
    mkdir -p "corpus.run/$t" "corpus/$t"
    log="corpus.run/$t.log"
    echo "== $t: ${seconds}s (log $log)"
    if ! cargo +nightly fuzz run -j 1 "$t" "corpus.run/$t" "corpus/$t" -- \
        -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; then
        failed=1
        echo "!! $t failed: see $log and artifacts/$t/"
        tail -n 30 "$log"
    fi
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|Done [0-9]+ runs" "$log" || true
done
exit "$failed"
