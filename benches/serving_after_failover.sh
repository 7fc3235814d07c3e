#!/usr/bin/env bash
# Serving after failover: kmirror's Kafka listener vs a Kafka broker holding the same data, on
# this machine, measured with Kafka's own perf tools (issue 13, item 4).
#
# Starts a throw-away single-node KRaft broker (Kafka $KAFKA_VERSION from the cached jars,
# ~/.cache/kmirror/kafka-$KAFKA_VERSION/libs), preloads topic `bench` with ProducerPerformance,
# runs `kmirror serve` in control-plane mode with a [kafka] listener, mirrors the topic
# (`kmirror mirrors create/start`), waits until kmirror's .log bytes equal the broker's, fails
# over (`kmirror mirrors stop`), and then, alternating broker and kmirror, RUNS times each:
#   consume  ConsumerPerformance reads every record of `bench` (a fresh group each run)
#   produce  ProducerPerformance acks=all enable.idempotence=true, PRODUCE_MB into `bench`
# Prints each run's line and the best MB/s of each side with the ratio kmirror / broker.
#
# Usage: PARTITIONS=16 MB=500 benches/serving_after_failover.sh
#   PARTITIONS   partitions of the topic (default 16)
#   MB           megabytes of record values to preload (default 500)
#   RECORD_SIZE  bytes per record value (default 1000)
#   CODEC        producer compression.type of the preload and the produce runs (default lz4)
#   PRODUCE_MB   megabytes each produce run writes (default 200)
#   RUNS         runs per side and tool, alternating (default 2)
#   SHARDS       kmirror shards (default 2)
#   KEEP=1       keep the work dir (tool.log with the clients' errors, serve.log, broker.log)
#                and print its path, to see why a run failed
# Build first: cargo build --release --bin kmirror
set -euo pipefail

PARTITIONS=${PARTITIONS:-16}
MB=${MB:-500}
RECORD_SIZE=${RECORD_SIZE:-1000}
CODEC=${CODEC:-lz4}
PRODUCE_MB=${PRODUCE_MB:-200}
RUNS=${RUNS:-2}
SHARDS=${SHARDS:-2}
KEEP=${KEEP:-0}
KAFKA_VERSION=${KAFKA_VERSION:-4.4.0}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/kafka/kraft.sh
. "$ROOT/tests/kafka/kraft.sh"
KMIRROR=${KMIRROR:-$ROOT/target/release/kmirror}
LIBS=${KAFKA_LIBS:-$HOME/.cache/kmirror/kafka-$KAFKA_VERSION/libs}
[ -x "$KMIRROR" ] || { echo "build first: cargo build --release --bin kmirror" >&2; exit 1; }
[ -d "$LIBS" ] || { echo "no Kafka jars in $LIBS: run tests/kafka/fetch-jars.sh" >&2; exit 1; }
CP="$LIBS/*"

WORK=$(mktemp -d /tmp/kmirror-serving-XXXXXX)
BROKER_PID=""
SERVE_PID=""
cleanup() {
  [ -n "$SERVE_PID" ] && kill "$SERVE_PID" 2>/dev/null && wait "$SERVE_PID" 2>/dev/null || true
  [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null && wait "$BROKER_PID" 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
fail() { echo "serving_after_failover: $*" >&2; exit 1; }

kraft_start "$WORK" "$CP" -Xmx1g -Xms256m -XX:+UseG1GC || fail "broker not up"
QUIET=("${KRAFT_QUIET[@]}")
ADMIN="127.0.0.1:$(kraft_free_port)"
LISTENER="127.0.0.1:$(kraft_free_port)"
tool() { java -Xmx512m -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" "$@"; }
BROKER="127.0.0.1:$PORT"

TOPIC=bench
tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BROKER" --create --topic "$TOPIC" \
  --partitions "$PARTITIONS" --replication-factor 1 > "$WORK/topic.log" 2>&1
RECORDS=$(( MB * 1000 * 1000 / RECORD_SIZE ))
tool org.apache.kafka.tools.ProducerPerformance --topic "$TOPIC" --num-records "$RECORDS" \
  --record-size "$RECORD_SIZE" --throughput -1 \
  --producer-props bootstrap.servers="$BROKER" acks=1 linger.ms=20 batch.size=262144 \
  compression.type="$CODEC" > "$WORK/preload.log" 2>&1
echo "# preload: $(tail -1 "$WORK/preload.log")"

log_bytes() { { find "$1" -path "*/$TOPIC-*" -name '*.log' -printf '%s\n' 2>/dev/null || true; } | awk '{s += $1} END {printf "%.0f\n", s}'; }
TARGET=$(log_bytes "$WORK/broker-data"); sleep 1
while [ "$(log_bytes "$WORK/broker-data")" != "$TARGET" ]; do TARGET=$(log_bytes "$WORK/broker-data"); sleep 1; done

cat > "$WORK/kmirror.toml" <<EOF
[admin]
listen = "$ADMIN"
[kafka]
listen = "$LISTENER"
# As the broker's (tests/kafka/kraft.sh): both sides answer the first JoinGroup at once.
group_initial_rebalance_delay_ms = 0
[storage]
data_dir = "$WORK/mirror"
[runtime]
shards = $SHARDS
arena_slot_bytes = 9437184
arena_slots = 8
[fetch]
max_bytes = 8388608
partition_max_bytes = 1048576
EOF
KMIRROR_LOG=warn "$KMIRROR" serve --config "$WORK/kmirror.toml" > "$WORK/serve.log" 2>&1 &
SERVE_PID=$!
mirrors() { "$KMIRROR" mirrors --admin "$ADMIN" "$@"; }
for _ in $(seq 1 120); do
  kill -0 "$SERVE_PID" 2>/dev/null || { tail -20 "$WORK/serve.log" >&2; fail "kmirror exited"; }
  mirrors list >/dev/null 2>&1 && break
  sleep 0.5
done
# The listener is asked for a fixed port: its "serving on" line is an info line, below warn.
for _ in $(seq 1 60); do
  python3 -c "import socket; socket.create_connection(('${LISTENER%:*}', ${LISTENER##*:}), 1)" 2>/dev/null && break
  sleep 0.5
done
printf 'bootstrap.servers=%s\nclient.id=kmirror-serving-bench\n' "$BROKER" > "$WORK/source.properties"
mirrors create --mirror bench --mirror-config "$WORK/source.properties" > /dev/null
mirrors start --mirror bench --topics "$TOPIC" > /dev/null
for _ in $(seq 1 1200); do
  kill -0 "$SERVE_PID" 2>/dev/null || { tail -20 "$WORK/serve.log" >&2; fail "kmirror exited"; }
  [ "$(log_bytes "$WORK/mirror")" -ge "$TARGET" ] && break
  sleep 0.2
done
[ "$(log_bytes "$WORK/mirror")" -ge "$TARGET" ] || fail "kmirror did not catch up"
for p in $(seq 0 $((PARTITIONS - 1))); do
  cmp -s <(cat "$WORK/broker-data/$TOPIC-$p"/*.log) <(cat "$WORK/mirror/$TOPIC-$p"/*.log) \
    || fail "partition $p differs from the broker"
done
mirrors stop --mirror bench --topics "$TOPIC" > "$WORK/stop.txt" 2>&1 || { cat "$WORK/stop.txt" >&2; fail "failover failed"; }
echo "# mirrored $TARGET bytes byte-equal into kmirror (listener $LISTENER), failed over; broker $BROKER; load1 $(cut -d' ' -f1 /proc/loadavg)"

# ConsumerPerformance's data line: start, end, MB, MB.sec, nMsg, nMsg.sec, rebalance ms,
# fetch ms, fetch.MB.sec, fetch.nMsg.sec. Prints MB.sec.
consume() { # side bootstrap run
  local out
  out=$(tool org.apache.kafka.tools.ConsumerPerformance --bootstrap-server "$2" --topic "$TOPIC" \
    --num-records "$RECORDS" --group "perf-$1-$3" --timeout 60000 --hide-header 2>>"$WORK/tool.log" | tail -1)
  echo "consume side=$1 run=$3 load1=$(cut -d' ' -f1 /proc/loadavg) $out" >&2
  awk -F', *' '{print $4}' <<<"$out"
}
# ProducerPerformance's summary: "N records sent, R records/sec (X MB/sec), ...". Prints X.
produce() { # side bootstrap run
  local out n=$(( PRODUCE_MB * 1000 * 1000 / RECORD_SIZE ))
  out=$(tool org.apache.kafka.tools.ProducerPerformance --topic "$TOPIC" --num-records "$n" \
    --record-size "$RECORD_SIZE" --throughput -1 \
    --producer-props bootstrap.servers="$2" acks=all enable.idempotence=true linger.ms=20 \
    batch.size=262144 compression.type="$CODEC" 2>>"$WORK/tool.log" | tail -1)
  echo "produce side=$1 run=$3 load1=$(cut -d' ' -f1 /proc/loadavg) $out" >&2
  sed -n 's/.*(\([0-9.]*\) MB\/sec).*/\1/p' <<<"$out"
}
best() { sort -g | tail -1; }
declare -A got
for kind in consume produce; do
  b="" k=""
  for run in $(seq 1 "$RUNS"); do
    b+="$($kind broker "$BROKER" "$run") "
    k+="$($kind kmirror "$LISTENER" "$run") "
  done
  got[$kind-broker]=$(tr ' ' '\n' <<<"$b" | grep . | best)
  got[$kind-kmirror]=$(tr ' ' '\n' <<<"$k" | grep . | best)
  [ -n "${got[$kind-broker]}" ] && [ -n "${got[$kind-kmirror]}" ] || { tail -20 "$WORK/tool.log" >&2; fail "$kind produced no figure"; }
done
for kind in consume produce; do
  awk -v k="$kind" -v b="${got[$kind-broker]}" -v m="${got[$kind-kmirror]}" -v p="$PARTITIONS" -v c="$CODEC" \
    'BEGIN {printf "%s partitions=%s codec=%s broker_MBps=%s kmirror_MBps=%s ratio=%.2f\n", k, p, c, b, m, m / b}'
done
