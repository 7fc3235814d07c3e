#!/usr/bin/env bash
# A mirrored topic that starts big and grows (issue 13 item 4 at scale): against a real Kafka
# 4.x KRaft broker, a topic of P0 partitions (RECORDS_PER_PART records each) is mirrored by a
# control-plane `kmirror serve` (`mirrors create` + `start`), then grown to P1 partitions on the
# source and produced to again; kmirror's source sync must find the new partitions and mirror
# them all. Printed, each timed from the `mirrors start` call:
#   start        seconds the `start` command took;
#   every partition fetched: seconds until `describe` shows a source offset for all P0
#                partitions and every one at the source's end (one line per poll with
#                VERBOSE=1);
# then, from the end of the growth's produce:
#   grown        seconds until all P1 partitions are at the source's end, and the
#                `__mirror_state` writes the sync made for them (kmirror_mirror_state_writes_total).
# Fails when kmirror serve exits (a shard declared stalled exits the process) or a phase does
# not finish within LIMIT_S.
#
# Usage (build first: cargo build --release --bin kmirror):
#   benches/partition_growth.sh                      # P0=10000 P1=16384
#   P0=1000 P1=4000 benches/partition_growth.sh
#   SERVE_LOG=info  kmirror's log level (prints the start's directory creation steps)
#   PERF=40   also `perf record -g` kmirror serve for that many seconds from the start call
#             (perf.data is kept in the printed work dir: KEEP=1)
set -euo pipefail

P0=${P0:-10000}
P1=${P1:-16384}
RECORDS_PER_PART=${RECORDS_PER_PART:-20}
SHARDS=${SHARDS:-2}
KAFKA=${KAFKA:-4.4.0}
LIMIT_S=${LIMIT_S:-300}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/kafka/kraft.sh
. "$ROOT/tests/kafka/kraft.sh"
BIN=${BIN:-$ROOT/target/release}
LIBS=${KAFKA_LIBS:-$HOME/.cache/kmirror/kafka-$KAFKA/libs}
[ -x "$BIN/kmirror" ] || { echo "build first: cargo build --release --bin kmirror" >&2; exit 1; }
[ -d "$LIBS" ] || { echo "no Kafka jars in $LIBS: run tests/kafka/fetch-jars.sh" >&2; exit 1; }
(( P1 >= P0 )) || { echo "P1 must be at least P0" >&2; exit 1; }
CP="$LIBS/*"

WORK=$(mktemp -d /tmp/kmirror-growth-XXXXXX)
BROKER_PID="" SERVE_PID=""
stop_pid() { [ -n "$1" ] && kill "$1" 2>/dev/null && wait "$1" 2>/dev/null || true; }
cleanup() { stop_pid "$SERVE_PID"; stop_pid "$BROKER_PID"; [ -n "${KEEP:-}" ] || rm -rf "$WORK"; }
trap cleanup EXIT

kraft_start "$WORK" "$CP" -Xmx2g -Xms512m
QUIET=("${KRAFT_QUIET[@]}")
echo "# $(date -u +%FT%TZ) $(uname -r) nproc=$(nproc) kafka=$KAFKA shards=$SHARDS p0=$P0 p1=$P1 records_per_partition=$RECORDS_PER_PART bin=$BIN"
TOPIC=growth
# shellcheck source=benches/control_plane.sh
. "$ROOT/benches/control_plane.sh"
produce() { # records
  java -Xmx512m -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" org.apache.kafka.tools.ProducerPerformance \
    --topic "$TOPIC" --num-records "$1" --record-size 200 --throughput -1 \
    --producer-props bootstrap.servers="127.0.0.1:$PORT" acks=1 linger.ms=5 batch.size=16384 \
    partitioner.ignore.keys=true >>"$WORK/produce.log" 2>&1
}
topic_with_partitions "$TOPIC" "$P0" "$WORK/topic.log"
produce $(( P0 * RECORDS_PER_PART ))

ADMIN="127.0.0.1:$(kraft_free_port)"
control_plane_config "$WORK/kmirror.toml" "$ADMIN" "$WORK/data" "$SHARDS"
KMIRROR_LOG=${SERVE_LOG:-warn} "$BIN/kmirror" serve --config "$WORK/kmirror.toml" >"$WORK/serve.log" 2>&1 &
SERVE_PID=$!
mirrors() { "$BIN/kmirror" mirrors --admin "$ADMIN" "$@"; }
for _ in $(seq 1 300); do mirrors list >/dev/null 2>&1 && break; sleep 0.1; done
printf 'bootstrap.servers=127.0.0.1:%s\n' "$PORT" >"$WORK/source.properties"
mirrors create --mirror g --mirror-config "$WORK/source.properties" >/dev/null

now() { date +%s.%N; }
secs_since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
# describe --json -> "rows without_source_offset behind"
summary() {
  mirrors --json describe --mirror g | python3 -c '
import json, sys
rows = json.load(sys.stdin)
print(len(rows), sum(1 for r in rows if r.get("sourceOffset") is None),
      sum(1 for r in rows if r.get("sourceOffset") is not None
          and r.get("destinationOffset") != r.get("sourceOffset")))'
}
wait_all() { # label partitions t0
  local s rows none behind
  while :; do
    kill -0 "$SERVE_PID" 2>/dev/null || {
      echo "$1: kmirror serve exited: $(tail -1 "$WORK/serve.log")"; exit 1; }
    s=$(summary)
    read -r rows none behind <<<"$s"
    [ -n "${VERBOSE:-}" ] && echo "  $1 t=$(secs_since "$3") rows=$rows without_source_offset=$none behind=$behind"
    [ "$rows" = "$2" ] && [ "$none" = 0 ] && [ "$behind" = 0 ] && break
    python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > $LIMIT_S else 1)" "$(secs_since "$3")" && {
      echo "$1: not done after ${LIMIT_S}s (rows=$rows without_source_offset=$none behind=$behind)"; exit 1; }
    sleep 1
  done
  echo "partitions=$2 $1 seconds=$(secs_since "$3")"
}

[ -n "${PERF:-}" ] && { perf record -F 499 -g -p "$SERVE_PID" -o "$WORK/perf.data" -- sleep "$PERF" >"$WORK/perf.log" 2>&1 & }
# Dirty page cache before the start (the broker's writes not yet on disk): the start's
# syncfs writes it all back, since it shares the filesystem.
echo "dirty_before_start_kb=$(awk '/^Dirty:/{print $2}' /proc/meminfo)"
T0=$(now)
mirrors start --mirror g --topics "$TOPIC" >/dev/null
echo "partitions=$P0 start seconds=$(secs_since "$T0")"
# With SERVE_LOG=info: the start's directory creation, split into its steps.
grep -h "partition directories created" "$WORK/serve.log" | sed 's/^/  /' || true
wait_all every_partition_fetched "$P0" "$T0"
W0=$(state_writes "$ADMIN")
topic_grow_to "$TOPIC" "$P0" "$P1" "$WORK/topic.log"
produce $(( P1 * RECORDS_PER_PART ))
T1=$(now)
wait_all grown "$P1" "$T1"
echo "partitions=$P1 grown_from=$P0 state_writes=$(( $(state_writes "$ADMIN") - W0 ))"
[ -n "${KEEP:-}" ] && echo "# work dir: $WORK"
exit 0
