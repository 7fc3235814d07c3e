#!/usr/bin/env bash
# Catch-up throughput of `kmirror serve` against a real Kafka 4.1.1 broker on this machine.
#
# Starts a throw-away single-node KRaft broker from the cached jars
# (~/.cache/kmirror/kafka-4.1.1/libs, fetched by tests/kafka/fetch-jars.sh), preloads one topic
# with kafka-producer-perf-test (org.apache.kafka.tools.ProducerPerformance), then starts
# `target/release/kmirror serve` on an empty data dir and times how long it takes until the
# mirror's .log bytes equal the broker's for every partition (checked by size each POLL_MS, then
# confirmed byte-for-byte with cmp). Prints one line: partitions, bytes, seconds, MB/s.
#
# Usage: PARTITIONS=100 MB=1000 benches/mirror_real_kafka.sh
#   PARTITIONS   partitions of the topic (default 1)
#   MB           megabytes of record values to preload (default 1000)
#   RECORD_SIZE  bytes per record value (default 1000)
#   CODEC        producer compression.type (default none)
#   SHARDS       kmirror shards (default 2)
#   SESSIONS     fetch.sessions_per_connection: fetch groups (requests in flight) per connection
#                (default 1)
# Build first: cargo build --release --bin kmirror
set -euo pipefail

PARTITIONS=${PARTITIONS:-1}
MB=${MB:-1000}
RECORD_SIZE=${RECORD_SIZE:-1000}
CODEC=${CODEC:-none}
SHARDS=${SHARDS:-2}
SESSIONS=${SESSIONS:-1}
POLL_MS=${POLL_MS:-100}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/kafka/kraft.sh
. "$ROOT/tests/kafka/kraft.sh"
KMIRROR=${KMIRROR:-$ROOT/target/release/kmirror}
LIBS=${KAFKA_LIBS:-$HOME/.cache/kmirror/kafka-4.1.1/libs}
[ -x "$KMIRROR" ] || { echo "build first: cargo build --release --bin kmirror" >&2; exit 1; }
[ -d "$LIBS" ] || { echo "no Kafka jars in $LIBS: run tests/kafka/fetch-jars.sh" >&2; exit 1; }
CP="$LIBS/*"

WORK=$(mktemp -d /tmp/kmirror-bench-XXXXXX)
BROKER_PID=""
SERVE_PID=""
cleanup() {
  [ -n "$SERVE_PID" ] && kill "$SERVE_PID" 2>/dev/null && wait "$SERVE_PID" 2>/dev/null || true
  [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null && wait "$BROKER_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

kraft_start "$WORK" "$CP" -Xmx1g -Xms256m -XX:+UseSerialGC
QUIET=("${KRAFT_QUIET[@]}")

TOPIC=bench
java -Xmx256m -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" org.apache.kafka.tools.TopicCommand \
  --bootstrap-server "127.0.0.1:$PORT" --create --topic "$TOPIC" \
  --partitions "$PARTITIONS" --replication-factor 1 > "$WORK/topic.log" 2>&1
RECORDS=$(( MB * 1000 * 1000 / RECORD_SIZE ))
java -Xmx512m -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" org.apache.kafka.tools.ProducerPerformance \
  --topic "$TOPIC" --num-records "$RECORDS" --record-size "$RECORD_SIZE" --throughput -1 \
  --producer-props bootstrap.servers="127.0.0.1:$PORT" acks=1 linger.ms=20 batch.size=262144 \
  compression.type="$CODEC" > "$WORK/perf.log" 2>&1
tail -1 "$WORK/perf.log" >&2

broker_bytes() {
  local total=0 p f
  for p in $(seq 0 $((PARTITIONS - 1))); do
    for f in "$WORK/broker-data/$TOPIC-$p"/*.log; do total=$((total + $(stat -c %s "$f"))); done
  done
  echo "$total"
}
ours_bytes() {
  local total=0 f
  for f in "$WORK"/mirror/"$TOPIC"-*/*.log; do
    [ -e "$f" ] && total=$((total + $(stat -c %s "$f")))
  done
  echo "$total"
}
# The broker's files stop growing once the producer is done; wait until two reads agree.
TARGET=$(broker_bytes); sleep 1
while [ "$(broker_bytes)" != "$TARGET" ]; do TARGET=$(broker_bytes); sleep 1; done

cat > "$WORK/kmirror.toml" <<EOF
[source]
bootstrap_servers = ["127.0.0.1:$PORT"]
[topics]
names = ["$TOPIC"]
[storage]
data_dir = "$WORK/mirror"
[runtime]
shards = $SHARDS
arena_slot_bytes = 67108864
arena_slots = 4
[fetch]
max_wait_ms = 500
max_bytes = 52428800
partition_max_bytes = 1048576
sessions_per_connection = $SESSIONS
EOF

START=$(date +%s.%N)
KMIRROR_LOG=warn "$KMIRROR" serve --config "$WORK/kmirror.toml" > "$WORK/serve.log" 2>&1 &
SERVE_PID=$!
while [ "$(ours_bytes)" -lt "$TARGET" ]; do
  if ! kill -0 "$SERVE_PID" 2>/dev/null; then cat "$WORK/serve.log" >&2; exit 1; fi
  sleep "$(python3 -c "print($POLL_MS/1000)")"
done
END=$(date +%s.%N)
for p in $(seq 0 $((PARTITIONS - 1))); do
  cmp <(cat "$WORK/broker-data/$TOPIC-$p"/*.log) <(cat "$WORK/mirror/$TOPIC-$p"/*.log) \
    || { echo "partition $p differs from the broker" >&2; exit 1; }
done
python3 - "$PARTITIONS" "$TARGET" "$START" "$END" "$CODEC" "$RECORD_SIZE" "$SHARDS" "$SESSIONS" <<'EOF'
import sys
parts, total, start, end, codec, size, shards, sessions = sys.argv[1:]
secs = float(end) - float(start)
print(f"partitions={parts} shards={shards} sessions={sessions} codec={codec} record_size={size} "
      f"bytes={int(total)} "
      f"seconds={secs:.2f} MB/s={int(total) / secs / 1e6:.1f} (byte-equal: yes)")
EOF
