#!/usr/bin/env bash
# Lifecycle commands over thousands of partitions (issue 13 item 4): how long `kmirror mirrors
# start`, `pause`, `resume`, `describe` and `stop` take as the partition count grows, against a
# real Kafka 4.x KRaft broker, and what `describe` says right after `resume` (it must not report
# a lag it has not measured since the pause).
#
# For each count in PARTS: a topic of that many partitions on the broker with RECORDS_PER_PART
# records each, a fresh `kmirror serve` (control-plane mode, SHARDS shards), then, each timed
# from the CLI call to its answer:
#   create, start (Metadata + DescribeConfigs on a source worker, the partitions handed to the
#   shards), caught-up (until describe shows every partition at the source's end, not a
#   command), pause, describe (paused), resume, describe right after resume (how many partitions
#   report a lag at all, and how many a non-zero one), describe once caught up again, stop
#   (the failover of every partition).
# Also printed per command: how many appends it made to `__mirror_state` (state_writes, from
# /metrics' kmirror_mirror_state_writes_total: one write and one sync each) and how many record
# batches they added (read from the state log's segment files with `kmirror log dump`; one
# append carries up to KEYED_LOG_RECORDS_PER_BATCH_MAX records per batch). One write per
# command step, not one per partition.
#
# Usage (build first: cargo build --release --bin kmirror):
#   benches/lifecycle_scale.sh                       # PARTS="1000 5000"
#   PARTS="500 2000 8000" benches/lifecycle_scale.sh
#   KAFKA  Kafka release whose jars to use (default 4.4.0, ~/.cache/kmirror/kafka-X/libs)
set -euo pipefail

PARTS=${PARTS:-"1000 5000"}
RECORDS_PER_PART=${RECORDS_PER_PART:-20}
SHARDS=${SHARDS:-2}
KAFKA=${KAFKA:-4.4.0}
LIMIT_S=${LIMIT_S:-600}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/kafka/kraft.sh
. "$ROOT/tests/kafka/kraft.sh"
BIN=${BIN:-$ROOT/target/release}
LIBS=${KAFKA_LIBS:-$HOME/.cache/kmirror/kafka-$KAFKA/libs}
[ -x "$BIN/kmirror" ] || { echo "build first: cargo build --release --bin kmirror" >&2; exit 1; }
[ -d "$LIBS" ] || { echo "no Kafka jars in $LIBS: run tests/kafka/fetch-jars.sh" >&2; exit 1; }
CP="$LIBS/*"

WORK=$(mktemp -d /tmp/kmirror-lifecycle-XXXXXX)
BROKER_PID="" SERVE_PID=""
stop_pid() { [ -n "$1" ] && kill "$1" 2>/dev/null && wait "$1" 2>/dev/null || true; }
cleanup() { stop_pid "$SERVE_PID"; stop_pid "$BROKER_PID"; rm -rf "$WORK"; }
trap cleanup EXIT

kraft_start "$WORK" "$CP" -Xmx2g -Xms512m
QUIET=("${KRAFT_QUIET[@]}")
echo "# $(date -u +%FT%TZ) $(uname -r) nproc=$(nproc) kafka=$KAFKA shards=$SHARDS records_per_partition=$RECORDS_PER_PART bin=$BIN"

now() { date +%s.%N; }
secs_since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$1" "$(now)"; }

# describe --json on stdin -> "rows lag_known lag_nonzero at_end"
describe_summary() {
  python3 -c '
import json, sys
rows = json.load(sys.stdin)
known = [r for r in rows if r.get("lag") is not None]
print(len(rows), len(known), sum(1 for r in known if r["lag"] != 0),
      sum(1 for r in rows if r.get("sourceOffset") is not None
          and r.get("destinationOffset") == r.get("sourceOffset")))'
}

# Record batches in __mirror_state's segment files (the state log kmirror appends to).
state_batches() {
  local dir="$1/__mirror_state-0"
  [ -d "$dir" ] || { echo 0; return; }
  "$BIN/kmirror" log dump "$dir" 2>/dev/null | grep -c '^baseOffset:' || true
}

# shellcheck source=benches/control_plane.sh
. "$ROOT/benches/control_plane.sh"

for P in $PARTS; do
  TOPIC="lc-$P"
  topic_with_partitions "$TOPIC" "$P" "$WORK/topic-$P.log"
  # Records spread over the partitions by the default partitioner (keyless: sticky batches,
  # so not every partition gets exactly RECORDS_PER_PART; describe's at_end counts compare
  # with the source's own end, whatever it is).
  java -Xmx512m -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" org.apache.kafka.tools.ProducerPerformance \
    --topic "$TOPIC" --num-records $((P * RECORDS_PER_PART)) --record-size 200 --throughput -1 \
    --producer-props bootstrap.servers="127.0.0.1:$PORT" acks=1 linger.ms=5 batch.size=16384 \
    partitioner.ignore.keys=true >"$WORK/produce-$P.log" 2>&1

  DATA="$WORK/data-$P"
  ADMIN="127.0.0.1:$(kraft_free_port)"
  control_plane_config "$WORK/kmirror-$P.toml" "$ADMIN" "$DATA" "$SHARDS"
  KMIRROR_LOG=warn "$BIN/kmirror" serve --config "$WORK/kmirror-$P.toml" >"$WORK/serve-$P.log" 2>&1 &
  SERVE_PID=$!
  mirrors() { "$BIN/kmirror" mirrors --admin "$ADMIN" "$@"; }
  for _ in $(seq 1 300); do mirrors list >/dev/null 2>&1 && break; sleep 0.1; done
  printf 'bootstrap.servers=127.0.0.1:%s\n' "$PORT" >"$WORK/source.properties"

  # cmd NAME ARGS...: runs `kmirror mirrors ARGS`, prints its time and the state log's growth.
  cmd() {
    local name=$1 before t0 took after w0 w1
    shift
    before=$(state_batches "$DATA")
    w0=$(state_writes "$ADMIN")
    t0=$(now)
    mirrors "$@" >"$WORK/$name-$P.out"
    took=$(secs_since "$t0")
    after=$(state_batches "$DATA")
    w1=$(state_writes "$ADMIN")
    echo "partitions=$P command=$name seconds=$took state_writes=$((w1 - w0)) state_batches_added=$((after - before))"
  }
  wait_caught_up() { # label
    local t0 s
    t0=$(now)
    while :; do
      s=$(mirrors --json describe --mirror lc | describe_summary)
      read -r rows known nonzero at_end <<<"$s"
      [ "$rows" = "$P" ] && [ "$at_end" = "$P" ] && [ "$nonzero" = 0 ] && break
      python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > $LIMIT_S else 1)" "$(secs_since "$t0")" && {
        echo "partitions=$P $1: not caught up after ${LIMIT_S}s ($s)"; return 1; }
      kill -0 "$SERVE_PID" || { tail -5 "$WORK/serve-$P.log"; return 1; }
      sleep 0.2
    done
    echo "partitions=$P $1 seconds=$(secs_since "$t0")"
  }

  cmd create create --mirror lc --mirror-config "$WORK/source.properties"
  cmd start start --mirror lc --topics "$TOPIC"
  wait_caught_up caught_up_after_start
  cmd pause pause --mirror lc --topics "$TOPIC"
  t0=$(now)
  s=$(mirrors --json describe --mirror lc | describe_summary)
  echo "partitions=$P command=describe_paused seconds=$(secs_since "$t0") rows_lag_known_nonzero_at_end=${s// /,}"
  cmd resume resume --mirror lc --topics "$TOPIC"
  t0=$(now)
  s=$(mirrors --json describe --mirror lc | describe_summary)
  read -r rows known nonzero at_end <<<"$s"
  echo "partitions=$P command=describe_after_resume seconds=$(secs_since "$t0") rows=$rows lag_known=$known lag_nonzero=$nonzero"
  wait_caught_up caught_up_after_resume
  t0=$(now)
  mirrors --json describe --mirror lc >/dev/null
  echo "partitions=$P command=describe_mirroring seconds=$(secs_since "$t0")"
  cmd stop stop --mirror lc --topics "$TOPIC"
  stop_pid "$SERVE_PID"
  SERVE_PID=""
  rm -rf "$DATA"
  # The broker keeps a file open per partition: 5,000 + 16,384 on one broker ran it out of
  # this box's 20,000 descriptors ("Too many open files", all log dirs failed, broker down).
  java -Xmx256m -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" org.apache.kafka.tools.TopicCommand \
    --bootstrap-server "127.0.0.1:$PORT" --delete --topic "$TOPIC" >>"$WORK/topic-$P.log" 2>&1
done
