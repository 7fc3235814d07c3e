#!/usr/bin/env bash
# kmirror quickstart: mirrors a local Apache Kafka into kmirror and shows the result.
#
#   bash quickstart.sh
#
# From nothing but this repository (plus Java 17, Maven and a Rust toolchain) it:
#   1. fetches the Kafka 4.1.1 jars through Maven and builds kmirror,
#   2. starts a single-node KRaft Kafka on free loopback ports in a temp dir,
#   3. creates topics and produces compressed sample data (lz4, zstd, a committed and an aborted
#      transaction) with Kafka's own Java producer,
#   4. runs `kmirror serve` (admin API and Kafka listener), creates and starts a mirror with
#      `kmirror mirrors`, and waits until kmirror holds everything the source has,
#   5. checks kmirror's files: `kmirror log dump/verify`, Kafka's DumpLogSegments, and `cmp`
#      against the broker's own segment files,
#   6. consumes the mirrored topics back from kmirror with Kafka's Java consumer and compares
#      every record with the source's; a produce to the mirrored (read-only) topic is refused,
#   7. fails over while a source transaction is still open and a consumer group has read part of
#      orders on the source: `kmirror mirrors stop` aborts the transaction, raises the leader
#      epoch, copies the group's committed offsets and makes the topics writable; the group then
#      continues on kmirror exactly where it stopped, and an idempotent producer writes to
#      kmirror, its records continuing at the mirrored end,
#   8. stops kmirror (SIGTERM, clean shutdown) and the broker.
# The broker and kmirror are stopped and the temp dir removed however the script ends (Ctrl-C too).
#
# Environment (all optional):
#   KMIRROR_QUICKSTART_RECORDS  records to produce in total (default 20000)
#   KMIRROR_QUICKSTART_BIN      use this kmirror binary instead of running `cargo build`
#   KMIRROR_QUICKSTART_KEEP=1   keep the temp dir (broker and kmirror data) for a look afterwards
#   KMIRROR_QUICKSTART_WATCH_PID  stop (as on Ctrl-C) once this process is gone (used by the test)
#
# The build is a debug build: it compiles in about half the time of `--release` on a small machine,
# shares its target dir with `bash tests/run-all.sh`, and the sample data is small enough that
# kmirror's speed is not what the quickstart shows.
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=tests/kafka/kraft.sh
. tests/kafka/kraft.sh
repo="$(pwd)"

records="${KMIRROR_QUICKSTART_RECORDS:-20000}"
steps=8
step() { echo; echo "== [$1/$steps] $2"; }
summary() { echo "[$1/$steps] $2"; }
fail() { echo "quickstart: FAILED: $*" >&2; exit 1; }

java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
javac="${JAVA_HOME:+$JAVA_HOME/bin/}javac"

work="$(mktemp -d "${TMPDIR:-/tmp}/kmirror-quickstart-XXXXXX")"
broker_pid=""
kmirror_pid=""
watch_pid=""

# Stops what we started, by pid: kmirror first (it is a client of the broker), then the broker.
stop_pid() {
  local pid="$1" name="$2" limit="$3"
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 $((limit * 10))); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "quickstart: $name (pid $pid) did not stop in ${limit}s; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [ -z "$watch_pid" ] || kill "$watch_pid" 2>/dev/null || true
  stop_pid "$kmirror_pid" kmirror 30
  stop_pid "$broker_pid" broker 60
  wait 2>/dev/null || true
  if [ "${KMIRROR_QUICKSTART_KEEP:-0}" = 1 ]; then
    echo "quickstart: kept $work"
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ -n "${KMIRROR_QUICKSTART_WATCH_PID:-}" ]; then
  (while kill -0 "$KMIRROR_QUICKSTART_WATCH_PID" 2>/dev/null; do sleep 1; done; kill -TERM $$) &
  watch_pid=$!
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Polls `$1` (a shell command) every 0.2 s until it succeeds or `$2` seconds pass.
wait_until() {
  local cond="$1" limit="$2"
  local deadline=$((SECONDS + limit))
  until eval "$cond"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

# ---------------------------------------------------------------------------------------------
step 1 "fetch the Kafka jars and build kmirror"
bash tests/kafka/fetch-jars.sh
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' tests/kafka/pom.xml)"
libs="${KMIRROR_KAFKA_LIBS:-$HOME/.cache/kmirror/kafka-$version/libs}"
[ -f "$libs/.complete" ] || fail "Kafka jars missing in $libs"
if [ -n "${KMIRROR_QUICKSTART_BIN:-}" ]; then
  kmirror="$KMIRROR_QUICKSTART_BIN"
else
  cargo build --bin kmirror
  kmirror="$repo/target/debug/kmirror"
fi
[ -x "$kmirror" ] || fail "no kmirror binary at $kmirror"
summary 1 "Kafka $version jars in $libs; kmirror at $kmirror"

# ---------------------------------------------------------------------------------------------
step 2 "start a single-node KRaft Kafka $version"
broker_dir="$work/broker"
mkdir -p "$broker_dir"
port="$(free_port)"
controller_port="$(free_port)"
bootstrap="127.0.0.1:$port"
kraft_properties "$broker_dir/data" "$port" "$controller_port" >"$broker_dir/server.properties"
# The broker logs everything at INFO to its own file; tools print only warnings.
cat >"$broker_dir/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
cat >"$work/log4j-quiet.properties" <<'EOF'
log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
printf 'status=error\nrootLogger.level=warn\n' >"$work/log4j2-quiet.properties"
log4j2="-Dlog4j2.configurationFile=$work/log4j2-quiet.properties"
tool_jvm=(-Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto
  "-Dlog4j.configuration=file:$work/log4j-quiet.properties" "$log4j2")

cluster_id="$(kraft_cluster_id)"
"$java" "${tool_jvm[@]}" -cp "$libs/*" kafka.tools.StorageTool format -t "$cluster_id" \
  -c "$broker_dir/server.properties" >"$broker_dir/format.log" 2>&1 ||
  { cat "$broker_dir/format.log" >&2; fail "StorageTool format"; }

(cd "$broker_dir" && exec "$java" -Xmx512m -Xms128m -XX:+UseSerialGC -Djava.awt.headless=true \
  "-Dlog4j.configuration=file:$broker_dir/log4j.properties" "$log4j2" \
  -cp "$libs/*" kafka.Kafka "$broker_dir/server.properties" >"$broker_dir/broker.log" 2>&1) &
broker_pid=$!
broker_up() {
  kill -0 "$broker_pid" 2>/dev/null || { tail -40 "$broker_dir/broker.log" >&2; fail "broker exited"; }
  grep -qs "Kafka Server started" "$broker_dir/broker.log" &&
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}
wait_until broker_up 180 || { tail -40 "$broker_dir/broker.log" >&2; fail "broker not up in 180s"; }
summary 2 "Kafka $version (KRaft) serving on $bootstrap, pid $broker_pid, log $broker_dir/broker.log"

# ---------------------------------------------------------------------------------------------
step 3 "create topics and produce compressed sample data with Kafka's Java producer"
# tests/java/KafkaTool.java wraps the real Java clients (the test harness uses it too).
mkdir -p "$work/tool"
"$javac" -nowarn -d "$work/tool" -cp "$libs/*" tests/java/KafkaTool.java
# Client warnings (retries while a fresh partition gets its leader) go to a file, shown on failure.
tool() {
  "$java" "${tool_jvm[@]}" -cp "$work/tool:$libs/*" KafkaTool "$@" 2>>"$work/tool.log" ||
    { tail -20 "$work/tool.log" >&2; fail "KafkaTool $1"; }
}
json_field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1"; }

tool create-topic --bootstrap "$bootstrap" --topic orders --partitions 2 >/dev/null
tool create-topic --bootstrap "$bootstrap" --topic payments --partitions 1 >/dev/null
per_orders=$((records / 4))
per_payments=$((records - 2 * per_orders))
# The log end offset each partition must reach: `partitions` lists topic:partition:end.
partitions=()
for p in 0 1; do
  last="$(tool produce --bootstrap "$bootstrap" --topic orders --partition "$p" \
    --count "$per_orders" --codec lz4 --seed "$((p + 1))" | json_field last_offset)"
  partitions+=("orders:$p:$((last + 1))")
done
# Two transactions, the first committed, the second aborted; each ends with a marker batch.
last="$(tool produce --bootstrap "$bootstrap" --topic payments --partition 0 \
  --count "$per_payments" --codec zstd --seed 3 --txns commit,abort | json_field last_offset)"
partitions+=("payments:0:$((last + 2))")
# The transaction coordinator writes the markers after the producer's call returns.
for tpe in "${partitions[@]}"; do
  IFS=: read -r t p e <<<"$tpe"
  wait_until "[ \"\$(tool offsets --bootstrap $bootstrap --topic $t --partition $p | json_field log_end_offset)\" = $e ]" 120 ||
    fail "source $t-$p never reached log end $e"
done
summary 3 "produced $records records (lz4 to orders-0/1, zstd with a committed and an aborted transaction to payments-0); source log ends: ${partitions[*]}"

# ---------------------------------------------------------------------------------------------
step 4 "run kmirror serve, create and start a mirror, wait until it holds everything the source has"
mirror_dir="$work/kmirror-data"
admin="127.0.0.1:$(free_port)"
# Small arenas: they are locked in memory and the default RLIMIT_MEMLOCK is often only 8 MiB.
cat >"$work/kmirror.toml" <<EOF
[admin]
listen = "$admin"

[kafka]
listen = "127.0.0.1:0"

[storage]
data_dir = "$mirror_dir"

[runtime]
shards = 1
arena_slot_bytes = 2097152
arena_slots = 2

[fetch]
max_wait_ms = 200
max_bytes = 1048576
partition_max_bytes = 1048576
EOF
echo "config $work/kmirror.toml:"
sed 's/^/    /' "$work/kmirror.toml"
"$kmirror" serve --config "$work/kmirror.toml" >"$work/kmirror.log" 2>&1 &
kmirror_pid=$!
kmirror_alive() {
  kill -0 "$kmirror_pid" 2>/dev/null || { tail -40 "$work/kmirror.log" >&2; fail "kmirror serve exited"; }
}
mirrors() { "$kmirror" mirrors --admin "$admin" "$@"; }
admin_up() { kmirror_alive; mirrors list >/dev/null 2>&1; }
wait_until admin_up 60 || { tail -40 "$work/kmirror.log" >&2; fail "kmirror admin API not up in 60s"; }
# The Kafka listener's port (asked of the kernel) is in its start-up log line.
listener="$(sed 's/\x1b\[[0-9;]*m//g' "$work/kmirror.log" | sed -n 's/.*Kafka listener serving on \([^ ]*\).*/\1/p' | head -1)"
[ -n "$listener" ] || fail "no Kafka listener line in $work/kmirror.log"

# A mirror is named and carries its own source connection settings (Kafka's property names).
# The last group-offset sync at failover may wait up to 60 s for the source (default 10 s).
printf 'bootstrap.servers=%s\nclient.id=kmirror-quickstart\nsync.group.offsets.final.timeout.ms=60000\n' \
  "$bootstrap" >"$work/source.properties"
echo "--- kmirror mirrors create --mirror quickstart --mirror-config source.properties"
mirrors create --mirror quickstart --mirror-config "$work/source.properties"
echo "--- kmirror mirrors start --mirror quickstart --topics 'orders,payments'"
mirrors start --mirror quickstart --topics 'orders,payments'

# kmirror's log end: one past the last offset of the last batch `kmirror log dump` shows.
mirror_end() {
  "$kmirror" log dump "$mirror_dir/$1" 2>/dev/null |
    sed -n 's/^baseOffset: [0-9]* lastOffset: \([0-9]*\) .*/\1/p' | tail -1 |
    awk '{ print $1 + 1 }'
}
caught_up() {
  kmirror_alive
  local tpe t p e
  for tpe in "${partitions[@]}"; do
    IFS=: read -r t p e <<<"$tpe"
    [ -d "$mirror_dir/$t-$p" ] || return 1
    [ "$(mirror_end "$t-$p")" = "$e" ] || return 1
  done
}
wait_until caught_up 120 || { tail -40 "$work/kmirror.log" >&2; fail "kmirror did not catch up in 120s"; }
echo "--- kmirror mirrors describe --mirror quickstart"
mirrors describe --mirror quickstart
summary 4 "kmirror serve (pid $kmirror_pid, admin $admin, Kafka listener $listener) caught up: every partition's log end equals the source's"

# ---------------------------------------------------------------------------------------------
step 5 "look at what kmirror wrote"
echo "--- kmirror log dump $mirror_dir/payments-0 (first and last batches)"
"$kmirror" log dump "$mirror_dir/payments-0" >"$work/payments-0.dump"
head -4 "$work/payments-0.dump" | cut -c1-220
echo "    ..."
tail -3 "$work/payments-0.dump" | cut -c1-220
for tpe in "${partitions[@]}"; do
  IFS=: read -r t p _ <<<"$tpe"
  echo "--- kmirror log verify $t-$p"
  "$kmirror" log verify "$mirror_dir/$t-$p" || fail "kmirror log verify $t-$p"
done

echo "--- Kafka's DumpLogSegments --deep-iteration on kmirror's segments"
files="$(ls "$mirror_dir"/{orders-0,orders-1,payments-0}/*.log | paste -sd, -)"
"$java" "${tool_jvm[@]}" -cp "$libs/*" kafka.tools.DumpLogSegments --deep-iteration \
  --files "$files" >"$work/dumplogsegments.txt" 2>&1 || { tail -20 "$work/dumplogsegments.txt" >&2; fail "DumpLogSegments"; }
grep -m 2 "isvalid: true" "$work/dumplogsegments.txt" | cut -c1-220
valid="$(grep -c "isvalid: true" "$work/dumplogsegments.txt" || true)"
invalid="$(grep -c "isvalid: false" "$work/dumplogsegments.txt" || true)"
[ "$valid" -gt 0 ] && [ "$invalid" = 0 ] ||
  fail "DumpLogSegments: $valid valid, $invalid invalid batches (see $work/dumplogsegments.txt)"
summary 5 "DumpLogSegments: $valid batches isvalid: true, 0 invalid"

echo "--- cmp of kmirror's .log segments with the broker's"
compared=0
for tpe in "${partitions[@]}"; do
  IFS=: read -r t p _ <<<"$tpe"
  ours=("$mirror_dir/$t-$p"/*.log)
  theirs=("$broker_dir/data/$t-$p"/*.log)
  [ "${#ours[@]}" = "${#theirs[@]}" ] || fail "$t-$p: kmirror has ${#ours[@]} segments, broker ${#theirs[@]}"
  for f in "${theirs[@]}"; do
    cmp "$f" "$mirror_dir/$t-$p/$(basename "$f")" || fail "$t-$p/$(basename "$f") differs"
    echo "    $t-$p/$(basename "$f"): $(stat -c %s "$f") bytes identical"
    compared=$((compared + 1))
  done
done
[ "$compared" -ge "${#partitions[@]}" ] || fail "only $compared segment files compared"
summary 5 "$compared segment files mirrored byte-for-byte: OK"

# ---------------------------------------------------------------------------------------------
step 6 "consume the mirrored topics from kmirror with Kafka's Java consumer"
# Records as the Java consumer sees them: offset, timestamp, key, value, headers (one JSON line each).
consume() {
  local from_where="$1" t="$2" p="$3" max="$4" isolation="$5"
  tool consume --bootstrap "$from_where" --topic "$t" --partition "$p" --max "$max" \
    --isolation "$isolation"
}
committed_payments=$((per_payments / 2))  # the producer's first (committed) transaction
for spec in "orders:0:$per_orders:read_committed" "orders:1:$per_orders:read_committed" \
  "payments:0:$per_payments:read_uncommitted" "payments:0:$committed_payments:read_committed"; do
  IFS=: read -r t p n iso <<<"$spec"
  consume "$bootstrap" "$t" "$p" "$n" "$iso" >"$work/source-$t-$p-$iso.json"
  consume "$listener" "$t" "$p" "$n" "$iso" >"$work/kmirror-$t-$p-$iso.json"
  got="$(wc -l <"$work/kmirror-$t-$p-$iso.json")"
  [ "$got" = "$n" ] || fail "$t-$p $iso: kmirror gave $got records, expected $n"
  cmp -s "$work/source-$t-$p-$iso.json" "$work/kmirror-$t-$p-$iso.json" ||
    fail "$t-$p $iso: kmirror's records differ from the source's"
  echo "    $t-$p $iso: $got records from kmirror equal the source's (offset, timestamp, key, value, headers)"
done
echo "    first record of orders-0 from kmirror: $(head -1 "$work/kmirror-orders-0-read_committed.json" | cut -c1-160)"
# One record past the committed transaction would be an aborted one: read_committed must not
# return it (the consumer reads up to the last stable offset, then stops).
read_to_end() {
  tool consume --bootstrap "$1" --topic "$2" --partition 0 --max "$3" \
    --isolation read_committed --timeout-ms 120000 --until-end true
}
extra="$(read_to_end "$listener" payments $((committed_payments + 1)) | wc -l)"
[ "$extra" = "$committed_payments" ] || fail "read_committed from kmirror returned $extra records (aborted ones?)"

echo "--- produce to the mirrored topic orders (read-only while mirroring)"
if "$java" "${tool_jvm[@]}" -cp "$work/tool:$libs/*" KafkaTool produce --bootstrap "$listener" \
  --topic orders --partition 0 --count 1 >"$work/refused.out" 2>"$work/refused.err"; then
  fail "kmirror accepted a produce to a mirrored topic"
fi
refusal="$(grep -o 'read-only[^"]*' "$work/refused.err" | head -1)"
[ -n "$refusal" ] || { tail -5 "$work/refused.err" >&2; fail "the refusal does not say why"; }
echo "    refused: ...$refusal"
summary 6 "Java consumer on kmirror ($listener): every record equals the source's; read_committed hides the aborted transaction; produce refused while mirroring"

# ---------------------------------------------------------------------------------------------
step 7 "fail over with a source transaction still open, then produce to kmirror"
# A transaction the source never finishes (its producer halts; the broker would only abort it
# after the 10-minute timeout): kmirror mirrors its records as they are.
open_txn="$(tool produce --bootstrap "$bootstrap" --topic payments --partition 0 --count 50 \
  --codec zstd --seed 4 --txns open --txn-id quickstart-open --txn-timeout-ms 600000)"
open_first="$(json_field first_offset <<<"$open_txn")"
open_last="$(json_field last_offset <<<"$open_txn")"
partitions[2]="payments:0:$((open_last + 1))"
wait_until caught_up 120 || fail "kmirror did not mirror the open transaction in 120s"
echo "    source transaction left open at payments-0 offsets $open_first..$open_last; kmirror holds it"

# An application's consumer group reads part of orders from the source and commits.
group_read=$((per_orders / 2 + per_orders / 5))
tool group-consume --bootstrap "$bootstrap" --group billing --topic orders --max "$group_read" \
  >"$work/group-source.json"
# The next offset the group will read, per partition (the source's commits).
group_next() { python3 -c '
import json, sys
nxt = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    nxt[r["partition"]] = max(nxt.get(r["partition"], 0), r["offset"] + 1)
print(" ".join(f"{p}:{nxt.get(p, 0)}" for p in (0, 1)))' "$1"; }
committed_at="$(group_next "$work/group-source.json")"
echo "    consumer group billing read $group_read orders records from the source and committed (partition:next offset) $committed_at"

echo "--- kmirror mirrors stop --mirror quickstart --topics 'orders,payments'   (the failover)"
mirrors stop --mirror quickstart --topics 'orders,payments' | tee "$work/stop.txt"
grep -q "Last group-offset sync: done" "$work/stop.txt" || fail "the last group-offset sync did not run"
echo "--- kmirror mirrors describe --mirror quickstart"
mirrors describe --mirror quickstart | tee "$work/describe-after-stop.txt"
grep -q STOPPED "$work/describe-after-stop.txt" || fail "describe shows no STOPPED partition"
echo "--- the last batches of kmirror's payments-0 after the failover"
# Promotion also rolls a fresh segment for the new leader epoch: batch lines only.
"$kmirror" log dump "$mirror_dir/payments-0" | grep '^baseOffset' | tail -2 | cut -c1-220
tail_batch="$("$kmirror" log dump "$mirror_dir/payments-0" | grep '^baseOffset' | tail -1)"
grep -q "isControl: true" <<<"$tail_batch" || fail "no ABORT marker closes the open transaction"
# read_committed on kmirror: the committed transaction only; the open one is now aborted.
after="$(read_to_end "$listener" payments $((committed_payments + 1)) | wc -l)"
[ "$after" = "$committed_payments" ] || fail "read_committed after failover returned $after records"
echo "    read_committed on payments-0 after failover: $after records (the open transaction was aborted)"

echo "--- kafka-consumer-groups.sh --describe --group billing, against kmirror"
"$java" "${tool_jvm[@]}" -cp "$libs/*" org.apache.kafka.tools.consumer.group.ConsumerGroupCommand \
  --bootstrap-server "$listener" --describe --group billing 2>>"$work/tool.log" |
  sed '/^$/d' | tee "$work/group-describe.txt"
grep -q "billing" "$work/group-describe.txt" || fail "kmirror does not know group billing"
echo "--- the group continues on kmirror"
rest=$((2 * per_orders - group_read))
tool group-consume --bootstrap "$listener" --group billing --topic orders --max "$rest" \
  >"$work/group-kmirror.json"
python3 - "$work/group-source.json" "$work/group-kmirror.json" "$per_orders" <<'EOF' ||
import json, sys
before = [json.loads(l) for l in open(sys.argv[1])]
after = [json.loads(l) for l in open(sys.argv[2])]
end = int(sys.argv[3])
for p in (0, 1):
    seen = sorted(r["offset"] for r in before + after if r["partition"] == p)
    # Every offset of the partition exactly once across both sides: no gap, no duplicate.
    assert seen == list(range(end)), f"orders-{p}: {len(seen)} offsets, not 0..{end - 1} once each"
EOF
  fail "the group did not continue on kmirror exactly where it stopped"
resumed_at="$(python3 -c '
import json, sys
first = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    first[r["partition"]] = min(first.get(r["partition"], 1 << 62), r["offset"])
print(" ".join(f"{p}:{first[p]}" for p in sorted(first)))' "$work/group-kmirror.json")"
echo "    group billing resumed on kmirror at (partition:offset) $resumed_at: every orders offset read exactly once"

echo "--- an idempotent Java producer writes 100 lz4 records to kmirror's orders-0"
written="$(tool produce --bootstrap "$listener" --topic orders --partition 0 --count 100 \
  --codec lz4 --seed 9 --idempotent true)"
w_first="$(json_field first_offset <<<"$written")"
w_last="$(json_field last_offset <<<"$written")"
[ "$w_first" = "$per_orders" ] && [ "$w_last" = $((per_orders + 99)) ] ||
  fail "new records at $w_first..$w_last, expected $per_orders..$((per_orders + 99))"
back="$(consume "$listener" orders 0 $((per_orders + 100)) read_committed | wc -l)"
[ "$back" = $((per_orders + 100)) ] || fail "consumed $back records from orders-0 after the produce"
echo "--- the last batch of kmirror's orders-0 (written by kmirror as leader, new leader epoch)"
"$kmirror" log dump "$mirror_dir/orders-0" | grep '^baseOffset' | tail -1 | cut -c1-220
summary 7 "failover: open source transaction aborted, group billing resumed on kmirror at its source commits ($resumed_at) with no gap or duplicate, topics writable; idempotent producer wrote offsets $w_first..$w_last of orders-0, right after the mirrored end; $back records read back"

# ---------------------------------------------------------------------------------------------
step 8 "stop kmirror (SIGTERM) and the broker"
kill -TERM "$kmirror_pid"
status=0
wait "$kmirror_pid" || status=$?
kmirror_pid=""
[ "$status" = 0 ] || { tail -20 "$work/kmirror.log" >&2; fail "kmirror serve exited with $status after SIGTERM"; }
grep "stopped cleanly" "$work/kmirror.log" | sed 's/\x1b\[[0-9;]*m//g' | tail -1 || fail "kmirror did not log a clean stop"
for tpe in "${partitions[@]}"; do
  IFS=: read -r t p _ <<<"$tpe"
  "$kmirror" log verify "$mirror_dir/$t-$p" >/dev/null || fail "verify $t-$p after shutdown"
done
stop_pid "$broker_pid" broker 60
broker_pid=""
summary 8 "kmirror stopped cleanly (exit 0, logs verify after shutdown); broker stopped"
echo
echo "quickstart: OK"
