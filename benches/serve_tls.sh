#!/usr/bin/env bash
# What TLS costs a consumer of kmirror's Kafka endpoint: MB/s read by the Java consumer
# (org.apache.kafka.tools.ConsumerPerformance) from a PLAINTEXT listener (record bytes go with
# sendfile) and from an SSL listener (record bytes read and encrypted in user space), both of the
# same `kmirror serve`, alternating ROUNDS times in one run.
#
# Starts a throw-away KRaft broker from the cached jars, preloads one topic with
# ProducerPerformance, mirrors it with target/release/kmirror until the mirror's .log bytes equal
# the broker's, then runs the consumers. Certificates are made with the openssl CLI.
#
# Usage: MB=500 ROUNDS=2 benches/serve_tls.sh
#   MB           megabytes of record values (default 500), RECORD_SIZE bytes each (default 1000)
#   ROUNDS       plaintext/TLS pairs (default 2)
# Build first: cargo build --release --bin kmirror
set -euo pipefail

MB=${MB:-500}
RECORD_SIZE=${RECORD_SIZE:-1000}
ROUNDS=${ROUNDS:-2}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/kafka/kraft.sh
. "$ROOT/tests/kafka/kraft.sh"
KMIRROR=${KMIRROR:-$ROOT/target/release/kmirror}
LIBS=${KAFKA_LIBS:-$HOME/.cache/kmirror/kafka-4.1.1/libs}
[ -x "$KMIRROR" ] || { echo "build first: cargo build --release --bin kmirror" >&2; exit 1; }
[ -d "$LIBS" ] || { echo "no Kafka jars in $LIBS: run tests/kafka/fetch-jars.sh" >&2; exit 1; }
command -v openssl >/dev/null || { echo "needs the openssl CLI" >&2; exit 1; }
CP="$LIBS/*"

WORK=$(mktemp -d /tmp/kmirror-bench-tls-XXXXXX)
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
PLAIN=$(kraft_free_port); TLS=$(kraft_free_port)

TOPIC=bench
java -Xmx256m -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" org.apache.kafka.tools.TopicCommand \
  --bootstrap-server "127.0.0.1:$PORT" --create --topic "$TOPIC" --partitions 1 \
  --replication-factor 1 > "$WORK/topic.log" 2>&1
RECORDS=$(( MB * 1000 * 1000 / RECORD_SIZE ))
java -Xmx512m -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" org.apache.kafka.tools.ProducerPerformance \
  --topic "$TOPIC" --num-records "$RECORDS" --record-size "$RECORD_SIZE" --throughput -1 \
  --producer-props bootstrap.servers="127.0.0.1:$PORT" acks=1 linger.ms=20 batch.size=262144 \
  > "$WORK/perf.log" 2>&1

size_of() { local t=0 f; for f in "$@"; do [ -e "$f" ] && t=$((t + $(stat -c %s "$f"))); done; echo "$t"; }
TARGET=$(size_of "$WORK/broker-data/$TOPIC-0"/*.log); sleep 1
while [ "$(size_of "$WORK/broker-data/$TOPIC-0"/*.log)" != "$TARGET" ]; do
  TARGET=$(size_of "$WORK/broker-data/$TOPIC-0"/*.log); sleep 1
done

# A CA, a server certificate for 127.0.0.1, and the client's PEM truststore.
(
  cd "$WORK"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench-ca -keyout ca.key -out ca.pem \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -out server.pem -extfile server.ext 2>/dev/null
  chmod 600 server.key
)
printf 'security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location=%s\n' "$WORK/ca.pem" \
  > "$WORK/ssl.properties"
: > "$WORK/plain.properties"

cat > "$WORK/kmirror.toml" <<EOF
[source]
bootstrap_servers = ["127.0.0.1:$PORT"]
[topics]
names = ["$TOPIC"]
[storage]
data_dir = "$WORK/mirror"
[kafka]
[[kafka.listeners]]
name = "PLAIN"
listen = "127.0.0.1:$PLAIN"
security_protocol = "PLAINTEXT"
[[kafka.listeners]]
name = "TLS"
listen = "127.0.0.1:$TLS"
security_protocol = "SSL"
ssl_keystore_location = "$WORK/server.pem"
ssl_key_location = "$WORK/server.key"
EOF
KMIRROR_LOG=warn "$KMIRROR" serve --config "$WORK/kmirror.toml" > "$WORK/serve.log" 2>&1 &
SERVE_PID=$!
while [ "$(size_of "$WORK/mirror/$TOPIC-0"/*.log)" -lt "$TARGET" ]; do
  kill -0 "$SERVE_PID" 2>/dev/null || { cat "$WORK/serve.log" >&2; exit 1; }
  sleep 0.2
done

# ConsumerPerformance prints a CSV line: start, end, MB, MB/s, records, records/s,
# rebalance ms, fetch ms, fetch MB/s, fetch records/s. MB/s counts the group join too; fetch
# MB/s (the figure to compare) is the read alone.
consume() {
  local name=$1 port=$2 props=$3 group=$4
  java -Xmx512m -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" org.apache.kafka.tools.ConsumerPerformance \
    --bootstrap-server "127.0.0.1:$port" --topic "$TOPIC" --messages "$RECORDS" --group "$group" \
    --consumer.config "$props" --timeout 120000 2>"$WORK/consume-$group.err" | tail -1 \
    | awk -F', *' -v n="$name" -v l="$(cut -d' ' -f1 /proc/loadavg)" \
        '{ printf "%s MB=%s records=%s MB/s=%s rebalance_ms=%s fetch_ms=%s fetch_MB/s=%s load=%s\n", n, $3, $5, $4, $7, $8, $9, l }'
  if grep -qiE "error|exception" "$WORK/consume-$group.err"; then
    echo "$name consumer errors:" >&2; grep -iE "error|exception" "$WORK/consume-$group.err" | head -5 >&2
  fi
}
for r in $(seq 1 "$ROUNDS"); do
  consume plaintext "$PLAIN" "$WORK/plain.properties" "plain-$r"
  consume tls "$TLS" "$WORK/ssl.properties" "tls-$r"
done
