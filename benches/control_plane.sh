# Shared by the benchmarks that drive a control-plane `kmirror serve` against a KRaft broker
# started with tests/kafka/kraft.sh (sourced after it: uses CP, PORT and KRAFT_QUIET).

# topic_with_partitions TOPIC PARTITIONS LOG: creates TOPIC with that many partitions. Kafka's
# controller refuses a request that makes more than 10,000 metadata records ("Excessively
# large number of partitions per request"; the topic's own records count too), so a bigger
# topic is created at 5,000 partitions and grown by 5,000 per --alter.
topic_with_partitions() {
  local topic=$1 want=$2 log=$3 have
  have=$(( want < 5000 ? want : 5000 ))
  java -Xmx256m -XX:+UseSerialGC "${KRAFT_QUIET[@]}" -cp "$CP" org.apache.kafka.tools.TopicCommand \
    --bootstrap-server "127.0.0.1:$PORT" --create --topic "$topic" \
    --partitions "$have" --replication-factor 1 >>"$log" 2>&1 || { cat "$log" >&2; return 1; }
  topic_grow_to "$topic" "$have" "$want" "$log"
}

# topic_grow_to TOPIC FROM TO LOG: adds partitions to TOPIC, 5,000 per --alter, and waits
# until the broker's metadata lists them all.
topic_grow_to() {
  local topic=$1 have=$2 want=$3 log=$4
  while (( have < want )); do
    have=$(( want - have > 5000 ? have + 5000 : want ))
    java -Xmx256m -XX:+UseSerialGC "${KRAFT_QUIET[@]}" -cp "$CP" org.apache.kafka.tools.TopicCommand \
      --bootstrap-server "127.0.0.1:$PORT" --alter --topic "$topic" \
      --partitions "$have" >>"$log" 2>&1 || { cat "$log" >&2; return 1; }
  done
  topic_wait_partitions "$topic" "$want"
}

# topic_wait_partitions TOPIC N: waits (up to 5 minutes) until the broker's Metadata answer
# lists N partitions of TOPIC. The broker answers --alter before it has made the new
# partitions' logs, and lists them only after: a start right after an --alter to 16,384 saw
# 10,000, and the rest came with later source syncs (the benchmark then timed the broker).
topic_wait_partitions() {
  local n
  for _ in $(seq 1 100); do
    n=$(java -Xmx256m -XX:+UseSerialGC "${KRAFT_QUIET[@]}" -cp "$CP" org.apache.kafka.tools.TopicCommand \
      --bootstrap-server "127.0.0.1:$PORT" --describe --topic "$1" 2>/dev/null | grep -c 'Partition: ' || true)
    (( n >= $2 )) && return 0
    sleep 2
  done
  echo "topic $1: the broker lists $n of $2 partitions after 5 minutes" >&2
  return 1
}

# control_plane_config FILE ADMIN DATA_DIR SHARDS: a control-plane kmirror.toml with the fetch
# sizes these benchmarks use (8 MiB responses, 1 MiB per partition, 4 arena slots of 9 MiB).
control_plane_config() {
  cat >"$1" <<EOF
[admin]
listen = "$2"
[storage]
data_dir = "$3"
[runtime]
shards = $4
arena_slot_bytes = 9437184
arena_slots = 4
[fetch]
max_wait_ms = 500
max_bytes = 8388608
partition_max_bytes = 1048576
EOF
}

# state_writes ADMIN: `__mirror_state` appends so far (one write and one sync each), from the
# admin API's /metrics.
state_writes() {
  curl -sf "http://$1/metrics" | awk '$1 == "kmirror_mirror_state_writes_total" { printf "%.0f\n", $2; found = 1 }
    END { if (!found) print "?" }'
}
