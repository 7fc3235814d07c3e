#!/usr/bin/env bash
# Restart time of `kmirror serve` after kill -9 with many partitions, against the synthetic
# source (kmirror-synth-source, in memory, no Kafka). Static mode, release build:
#   1. mirror PARTITIONS partitions (BATCHES batches of BATCH_BYTES each) to the end;
#   2. wait for a recovery-point checkpoint round (storage.recovery_checkpoint_interval_ms =
#      CHECKPOINT_MS), then kill -9 kmirror (no clean-shutdown marker);
#   3. start it again and time exec -> its "mirroring" log line (log dir opened and recovered,
#      shards started, every partition handed out), printing kmirror's own "log dir opened"
#      figures (elapsed_ms, threads, recovered, revalidated_bytes).
# With FULL=1 the restart is repeated after deleting recovery-point-offset-checkpoint, i.e.
# what the restart costs when every byte must be revalidated (no checkpoint).
#
#   cargo build --release -j 2 --bin kmirror --bin kmirror-synth-source
#   PARTITIONS=16384 benches/restart_scale.sh
#
# It also prints the first start (exec -> "mirroring" with every partition directory created),
# kmirror's descriptors and RSS when the data is mirrored and after the restart, and RSS per
# partition (RSS / PARTITIONS: an upper bound, it includes the fixed arenas and rings; run a
# small PARTITIONS too and take the difference for the marginal cost).
#
# Descriptors (log/lazy_file): a partition holds its active .log once written, index files are
# held only within limits::INDEX_FILES_HELD_MAX (1,024) for the whole process, so PARTITIONS
# needs about PARTITIONS + 2,048 (the script raises the soft RLIMIT_NOFILE to the hard one).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
PARTITIONS=${PARTITIONS:-16384}
BATCH_BYTES=${BATCH_BYTES:-4096}
BATCHES=${BATCHES:-4}
SHARDS=${SHARDS:-2}
CHECKPOINT_MS=${CHECKPOINT_MS:-5000}
LIMIT_S=${LIMIT_S:-900}
FULL=${FULL:-0}
for b in kmirror kmirror-synth-source; do
    [[ -x $BIN/$b ]] || { echo "build first: cargo build --release -j 2 --bin kmirror --bin kmirror-synth-source" >&2; exit 1; }
done
ulimit -n "$(ulimit -Hn)"
need=$((PARTITIONS + 2048))
if (($(ulimit -n) < need)); then
    echo "RLIMIT_NOFILE is $(ulimit -n) (hard $(ulimit -Hn)); $PARTITIONS partitions need about $need descriptors" >&2
    exit 1
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-restart-scale.XXXXXX")
src_pid="" serve_pid=""
cleanup() {
    [[ -n $serve_pid ]] && kill -9 "$serve_pid" 2>/dev/null || true
    [[ -n $src_pid ]] && kill "$src_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/kmirror-synth-source" --listen 127.0.0.1:0 --partitions "$PARTITIONS" --codec lz4 \
    --batch-bytes "$BATCH_BYTES" --partition-bytes $((BATCH_BYTES * BATCHES)) \
    >"$WORK/source.out" 2>"$WORK/source.err" &
src_pid=$!
for _ in $(seq 1 600); do
    grep -q '^listening on' "$WORK/source.out" 2>/dev/null && break
    kill -0 "$src_pid" 2>/dev/null || { cat "$WORK/source.err" >&2; exit 1; }
    sleep 0.1
done
read -r _ _ addr layout <"$WORK/source.out"
bb=$(sed -n 's/.*batch_bytes=\([0-9]*\).*/\1/p' <<<"$layout")
bpp=$(sed -n 's/.*batches_per_partition=\([0-9]*\).*/\1/p' <<<"$layout")
expected=$((PARTITIONS * bpp * bb))
data="$WORK/data"
cat >"$WORK/kmirror.toml" <<TOML
[source]
bootstrap_servers = ["$addr"]
[topics]
names = ["synth"]
[storage]
data_dir = "$data"
recovery_checkpoint_interval_ms = $CHECKPOINT_MS
[runtime]
shards = $SHARDS
arena_slot_bytes = 4194304
arena_slots = 4
[fetch]
max_bytes = 2097152
partition_max_bytes = 65536
TOML

fds() { find "/proc/$serve_pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
rss_kib() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$serve_pid/status"; }
usage() { # label
    local r
    r=$(rss_kib)
    echo "$1: fds=$(fds) rss_kib=$r rss_per_partition_kib=$(awk -v r="$r" -v p="$PARTITIONS" 'BEGIN {printf "%.1f", r / p}')"
}
log_bytes() { { find "$data" -name '*.log' -printf '%s\n' 2>/dev/null || true; } | awk '{s += $1} END {printf "%.0f\n", s}'; }
start() { # log file -> sets serve_pid, t_exec
    t_exec=$(date +%s.%N)
    "$BIN/kmirror" serve --config "$WORK/kmirror.toml" >>"$1" 2>&1 &
    serve_pid=$!
}
wait_line() { # log file, pattern, nth occurrence
    local start=$SECONDS
    until (($(sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -c -- "$2" || true) >= $3)); do
        kill -0 "$serve_pid" 2>/dev/null || { tail -20 "$1" >&2; exit 1; }
        ((SECONDS - start < LIMIT_S)) || { echo "timeout waiting for '$2'" >&2; tail -5 "$1" >&2; exit 1; }
        sleep 0.02
    done
}
field() { sed 's/\x1b\[[0-9;]*m//g' | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }

echo "# $(date -u +%FT%TZ) $(uname -r) nproc=$(nproc) $(git log -1 --format=%h) partitions=$PARTITIONS batch_bytes=$bb batches_per_partition=$bpp total_bytes=$expected shards=$SHARDS checkpoint_ms=$CHECKPOINT_MS load1=$(cut -d' ' -f1 /proc/loadavg)"
start "$WORK/serve.log"
start_s=$SECONDS
wait_line "$WORK/serve.log" " mirroring partitions=" 1
awk -v a="$t_exec" -v b="$(date +%s.%N)" 'BEGIN {printf "first start (create): exec_to_mirroring_s=%.2f\n", b - a}'
until (($(log_bytes) >= expected)); do
    kill -0 "$serve_pid" 2>/dev/null || { tail -20 "$WORK/serve.log" >&2; exit 1; }
    ((SECONDS - start_s < LIMIT_S)) || { echo "mirror did not finish" >&2; exit 1; }
    sleep 0.5
done
echo "mirrored: $(log_bytes) bytes in $((SECONDS - start_s)) s"
usage "mirrored"
# A checkpoint round flushes every partition and rewrites the file a second later: wait for
# two rounds after the data is complete, so one started after the last append.
sleep $((2 * CHECKPOINT_MS / 1000 + 2))
kill -9 "$serve_pid"; wait "$serve_pid" 2>/dev/null || true; serve_pid=""
[[ ! -e $data/.kafka_cleanshutdown ]] || { echo "clean marker after kill -9?" >&2; exit 1; }

restart() { # label
    local log="$WORK/restart-$1.log"
    : >"$log"
    start "$log"
    wait_line "$log" " mirroring partitions=" 1
    local t_mirroring
    t_mirroring=$(date +%s.%N)
    local opened
    opened=$(sed -e 's/\x1b\[[0-9;]*m//g' -n -e '/log dir opened/{p;q}' "$log")
    awk -v a="$t_exec" -v b="$t_mirroring" -v l="$1" 'BEGIN {printf "restart(%s): exec_to_mirroring_s=%.2f", l, b - a}'
    for f in partitions clean_shutdown recovered revalidated_bytes revalidated_batches threads elapsed_ms; do
        printf ' %s=%s' "$f" "$(field "$f" <<<"$opened")"
    done
    echo
    usage "restart($1) at mirroring"
    kill -9 "$serve_pid"; wait "$serve_pid" 2>/dev/null || true; serve_pid=""
}
restart after-checkpoint
if [[ $FULL == 1 ]]; then
    rm -f "$data/recovery-point-offset-checkpoint"
    restart no-checkpoint
fi
