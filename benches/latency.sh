#!/usr/bin/env bash
# End-to-end latency of `kmirror serve` at a fixed rate (issue 7: half the maximum rate).
#
# A rate-limited synthetic source (--rate-mb-s) makes batches appear round-robin over the
# partitions, each stamped with the wall-clock ms it appeared as its maxTimestamp; kmirror's
# telemetry records end_to_end = append done - maxTimestamp per append into HdrHistogram interval
# logs under <data_dir>/latency. After SECS seconds the script stops kmirror, copies the interval
# log to OUT (default benches/results/), prints `kmirror latency FILE --plot OUT.svg` for it (the
# percentile table and plot) and cross-checks the table with benches/latency_plot.py's own
# decoding. The data dir is deleted.
#
#   RATE_MB_S=100 benches/latency.sh                 # half of a measured maximum of 200 MB/s
#   QUICK=1 BIN=target/debug RATE_MB_S=5 benches/latency.sh
#   CATCH_UP=0 RATE_MB_S=100 benches/latency.sh      # without fetch.catch_up_pipelining
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
[[ ${QUICK:-0} == 1 ]] && { SECS=${SECS:-5}; OUT=${OUT:-/tmp/bench-latency-quick}; }
RATE_MB_S=${RATE_MB_S:?set RATE_MB_S (half of the measured max MB/s of the same cell)}
SECS=${SECS:-20}
PARTS=${PARTS:-16}
BATCH=${BATCH:-16384}
CODEC=${CODEC:-lz4}
SHARDS=${SHARDS:-1}
CATCH_UP=${CATCH_UP:-1}
OUT=${OUT:-benches/results}
NAME=${NAME:-latency-p${PARTS}-b${BATCH}-${CODEC}-s${SHARDS}-r${RATE_MB_S}$([[ $CATCH_UP == 0 ]] && echo -nocatchup || true)}
for b in kmirror kmirror-synth-source; do
    [[ -x $BIN/$b ]] || { echo "build first: cargo build --release --bin kmirror --bin kmirror-synth-source" >&2; exit 1; }
done
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-latency.XXXXXX")
src_pid="" serve_pid=""
cleanup() {
    for p in $serve_pid $src_pid; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/kmirror-synth-source" --listen 127.0.0.1:0 --partitions "$PARTS" --codec "$CODEC" \
    --batch-bytes "$BATCH" --rate-mb-s "$RATE_MB_S" >"$WORK/source.out" 2>"$WORK/source.err" &
src_pid=$!
for _ in $(seq 1 600); do
    grep -q '^listening on' "$WORK/source.out" 2>/dev/null && break
    kill -0 "$src_pid" 2>/dev/null || { cat "$WORK/source.err" >&2; exit 1; }
    sleep 0.1
done
read -r _ _ addr layout <"$WORK/source.out"
cat >"$WORK/kmirror.toml" <<EOF
[source]
bootstrap_servers = ["$addr"]
[topics]
names = ["synth"]
[storage]
data_dir = "$WORK/data"
[runtime]
shards = $SHARDS
[fetch]
catch_up_pipelining = $([[ $CATCH_UP == 0 ]] && echo false || echo true)
EOF
load=$(cut -d' ' -f1 /proc/loadavg)
echo "# $(date -u +%FT%TZ) $(uname -r) nproc=$(nproc) load1=$load partitions=$PARTS codec=$CODEC shards=$SHARDS catch_up=$CATCH_UP secs=$SECS $layout"
"$BIN/kmirror" serve --config "$WORK/kmirror.toml" >"$WORK/serve.log" 2>&1 &
serve_pid=$!
sleep "$SECS"
cpu=$(awk '{print ($14 + $15) / 100}' "/proc/$serve_pid/stat")
kill "$serve_pid"; wait "$serve_pid" 2>/dev/null || true; serve_pid=""
kill "$src_pid"; wait "$src_pid" 2>/dev/null || true; src_pid=""
bytes=$(find "$WORK/data" -name '*.log' -printf '%s\n' | awk '{s += $1} END {printf "%.0f\n", s}')
echo "mirrored_bytes=$bytes MBps=$(awk -v b="$bytes" -v s="$SECS" 'BEGIN {printf "%.1f", b / 1e6 / s}') kmirror_cpu_s=$cpu load1_end=$(cut -d' ' -f1 /proc/loadavg)"
logs=("$WORK"/data/latency/*.hlog)
[[ -f ${logs[0]} ]] || { echo "no latency log under $WORK/data/latency" >&2; tail "$WORK/serve.log" >&2; exit 1; }
cat "${logs[@]}" >"$OUT/$NAME.hlog"
"$BIN/kmirror" latency "$OUT/$NAME.hlog" --plot "$OUT/$NAME.svg"
# An independent decoding of the same log (stdlib Python), as a cross-check of the table.
python3 benches/latency_plot.py "$OUT/$NAME.hlog" "$WORK/crosscheck.svg" --tag end_to_end \
    --title "kmirror end-to-end latency, $PARTS partitions, $CODEC ~$BATCH B batches, $RATE_MB_S MB/s, $SHARDS shard(s)"
echo "wrote $OUT/$NAME.hlog $OUT/$NAME.svg"
