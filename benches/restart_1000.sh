#!/usr/bin/env bash
# Restart time of `kmirror serve` with 1,000 mirrored partitions, after a clean stop (SIGTERM:
# recovery skipped) and, for comparison, after SIGKILL (every partition recovered).
# Runs tests/ops_shutdown.rs (a real Kafka 4.1.1 broker from the test harness, a 1,000-partition
# topic mirrored by the kmirror binary, stopped and restarted) and prints the times it measured:
#   exec_to_mirroring_ms  kmirror started -> its "mirroring" log line (source metadata, log dir
#                         open, shards started, partitions handed out)
#   log_dir_open_ms       opening and loading the 1,000 partition directories (kmirror's own
#                         "log dir opened" line)
# The test asserts only that recovery was skipped after SIGTERM (and ran after SIGKILL).
#
#   benches/restart_1000.sh             # debug build, like the test suite
#   PROFILE=--release benches/restart_1000.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/kafka/fetch-jars.sh >/dev/null
echo "# $(date -u +%FT%TZ) $(uname -r) nproc=$(nproc) $(git log -1 --format=%h) ${PROFILE:-debug}"
# shellcheck disable=SC2086
cargo test -q ${PROFILE:-} --test ops_shutdown -- --nocapture 2>/dev/null | grep '^restart:'
