#!/usr/bin/env bash
# Outage catch-up (issue 13, the KIP-1279 reviewers' test scaled to this box): a real Kafka 4.x
# KRaft broker with PARTITIONS partitions, a backlog of BACKLOG_MB produced while kmirror is
# stopped, then `kmirror serve` started while producers keep writing at a steady RATE_MB_S.
#
# Phases, each producer run Kafka's own ProducerPerformance (acks=1) in chunks of CHUNK_S
# seconds at RATE_MB_S, so every chunk prints its own latency percentiles:
#   0. mirror:   kmirror serve mirrors the topic as it is after the warm-up (its partitions
#                created, caught up) and is stopped (SIGTERM): the outage begins. With
#                FROM_EMPTY=1 this is skipped and phase 3 starts on an empty data dir (a first
#                start: creating every partition's directory is then part of the catch-up).
#   1. idle:     kmirror not running; IDLE_CHUNKS chunks give the source's P99 produce latency
#                without kmirror.
#   2. backlog:  BACKLOG_MB produced as fast as the broker takes it, kmirror still stopped.
#   3. catch-up: kmirror serve restarts while the steady producer keeps running; caught up =
#                kmirror's .log bytes reach the broker's .log bytes of a moment before (within
#                one poll); the chunks that ended before catch-up give the P99 produce latency
#                during catch-up. Also printed: the seconds from exec to the first new byte
#                (start-up) and the rate after it (data phase); the MB mirrored in each second
#                (the catch-up's shape); and when the backlog as it stood at the start was in
#                (`backlog_at_start_mirrored_s`), the end the raw copy's own figure has: each of
#                its partitions ends at the high watermark it last saw, without waiting for
#                what the steady producer adds after that.
# Then three limits for the same data: the raw copy from the same broker (kmirror-raw-copy
# --from-broker: the same Fetch requests, only batch headers read), which is what this broker
# can serve, alone and again while the steady producer writes (as it did during catch-up); Kafka's own ConsumerPerformance from the same broker; and the raw copy against the
# synthetic source (same partitions and fetch sizes, comparable batch size), this box's copy
# limit when the source costs nothing.
#
# Usage (build first: cargo build --release --bin kmirror --bin kmirror-synth-source --bin kmirror-raw-copy):
#   PARTITIONS=5000 BACKLOG_MB=1000 RATE_MB_S=5 benches/outage_catchup.sh
#   PARTITIONS       topic partitions (default 5000)
#   BACKLOG_MB       backlog produced while kmirror is stopped (default 1000)
#   RATE_MB_S        steady producer rate during the idle and catch-up phases (default 5)
#   RECORD_SIZE      bytes per record value (default 1000)
#   CODEC            producer compression.type (default lz4)
#   SHARDS           kmirror shards (default 2)
#   ARENA_SLOTS      64 MiB arena slots per shard (default 4; each holds one 50 MB response)
#   MAX_RATE         [fetch.source_load] max_rate_bytes_per_sec for kmirror (default 0: none)
#   MIRROR_S         seconds kmirror mirrors the steady producer before the outage, so the source
#                    serves fetches when it begins, as a real one does (default 20; 0 before session 16)
#   CATCHUP_BY       kmirror (default), or raw: phase 3 is the raw copy from the broker instead (kmirror
#                    stays paused), so the copy limit is measured at the same moment as the catch-up;
#                    alternate the two for the ratio (only the raw copy's line is printed)
#   FROM_EMPTY       1: no phase 0, the catch-up is a first start (default 0: a restart)
#   OUTAGE           restart (default): the outage is kmirror stopped (static mode, SIGTERM) and
#                    the catch-up a restart; pause: the issue's own form, a control-plane mirror
#                    (`kmirror mirrors create/start`) paused with `mirrors pause` while the backlog
#                    builds and caught up by `mirrors resume`, timed from the resume call (the
#                    process, its log dir and its shards stay up)
#   KAFKA            Kafka release whose jars to use (default 4.4.0, ~/.cache/kmirror/kafka-X/libs)
#   SERVE_LOG        KMIRROR_LOG of the catch-up's kmirror serve, kept in its serve.log (default warn; info
#                    stamps the start-up steps: log dir opened, shards started, mirroring)
#   KEEP_SERVE_LOG   copy serve.log there before the work dir is deleted
set -euo pipefail

PARTITIONS=${PARTITIONS:-5000}
BACKLOG_MB=${BACKLOG_MB:-1000}
RATE_MB_S=${RATE_MB_S:-5}
RECORD_SIZE=${RECORD_SIZE:-1000}
CODEC=${CODEC:-lz4}
SHARDS=${SHARDS:-2}
ARENA_SLOTS=${ARENA_SLOTS:-4}
MAX_RATE=${MAX_RATE:-0}
FROM_EMPTY=${FROM_EMPTY:-0}
OUTAGE=${OUTAGE:-restart}
case "$OUTAGE" in restart|pause) ;; *) echo "OUTAGE is restart or pause, not $OUTAGE" >&2; exit 1;; esac
[ "$OUTAGE" = pause ] && [ "$FROM_EMPTY" = 1 ] && { echo "FROM_EMPTY=1 needs OUTAGE=restart" >&2; exit 1; }
CHUNK_S=${CHUNK_S:-10}
IDLE_CHUNKS=${IDLE_CHUNKS:-2}
CATCHUP_LIMIT_S=${CATCHUP_LIMIT_S:-900}
KAFKA=${KAFKA:-4.4.0}
POLL_S=${POLL_S:-0.5}
MIRROR_S=${MIRROR_S:-20}
CATCHUP_BY=${CATCHUP_BY:-kmirror}
case "$CATCHUP_BY" in kmirror|raw) ;; *) echo "CATCHUP_BY is kmirror or raw, not $CATCHUP_BY" >&2; exit 1;; esac
[ "$CATCHUP_BY" = raw ] && [ "$OUTAGE" != pause ] && { echo "CATCHUP_BY=raw needs OUTAGE=pause" >&2; exit 1; }
[ "$FROM_EMPTY" = 1 ] && MIRROR_S=0

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/kafka/kraft.sh
. "$ROOT/tests/kafka/kraft.sh"
BIN=${BIN:-$ROOT/target/release}
LIBS=${KAFKA_LIBS:-$HOME/.cache/kmirror/kafka-$KAFKA/libs}
for b in kmirror kmirror-synth-source kmirror-raw-copy; do
  [ -x "$BIN/$b" ] || { echo "build first: cargo build --release --bin kmirror --bin kmirror-synth-source --bin kmirror-raw-copy" >&2; exit 1; }
done
[ -d "$LIBS" ] || { echo "no Kafka jars in $LIBS: run tests/kafka/fetch-jars.sh" >&2; exit 1; }
CP="$LIBS/*"

WORK=$(mktemp -d /tmp/kmirror-outage-XXXXXX)
BROKER_PID="" SERVE_PID="" PRODUCER_PID="" SRC_PID=""
stop_pid() { [ -n "$1" ] && kill "$1" 2>/dev/null && wait "$1" 2>/dev/null || true; }
cleanup() {
  stop_pid "$PRODUCER_PID"; stop_pid "$SERVE_PID"; stop_pid "$SRC_PID"; stop_pid "$BROKER_PID"
  [ -n "${KEEP_SERVE_LOG:-}" ] && cp -L "$WORK/serve.log" "$KEEP_SERVE_LOG" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

kraft_start "$WORK" "$CP" -Xmx2g -Xms512m
QUIET=("${KRAFT_QUIET[@]}")

TOPIC=outage
T0=$(date +%s)
java -Xmx256m -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" org.apache.kafka.tools.TopicCommand \
  --bootstrap-server "127.0.0.1:$PORT" --create --topic "$TOPIC" \
  --partitions "$PARTITIONS" --replication-factor 1 > "$WORK/topic.log" 2>&1
echo "# $(date -u +%FT%TZ) kafka=$KAFKA partitions=$PARTITIONS created in $(( $(date +%s) - T0 ))s nproc=$(nproc) load1=$(cut -d' ' -f1 /proc/loadavg)" >&2

PROPS=(bootstrap.servers="127.0.0.1:$PORT" acks=1 linger.ms=5 batch.size=65536 compression.type="$CODEC")
perf() { # records throughput(records/s or -1) -> ProducerPerformance's summary line
  java -Xmx512m -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" org.apache.kafka.tools.ProducerPerformance \
    --topic "$TOPIC" --num-records "$1" --record-size "$RECORD_SIZE" --throughput "$2" \
    --producer-props "${PROPS[@]}" 2>/dev/null | tail -1
}
STEADY_RPS=$(( RATE_MB_S * 1000000 / RECORD_SIZE ))
CHUNK_RECORDS=$(( STEADY_RPS * CHUNK_S ))
steady_chunks() { # file: chunks of the steady producer until killed, one summary line each
  while :; do perf "$CHUNK_RECORDS" "$STEADY_RPS" >> "$1"; done
}

# 0. warm-up, not counted: the producer's first chunk against 5,000 fresh partitions pays for
#    their metadata and first batches, which no later chunk does.
perf "$CHUNK_RECORDS" "$STEADY_RPS" > "$WORK/warmup.txt"
broker_bytes() { find "$WORK/broker-data" -path "*/$TOPIC-*" -name '*.log' -printf '%s\n' | awk '{s += $1} END {printf "%.0f\n", s}'; }
ours_bytes() { find "$WORK/mirror" -path "*/$TOPIC-*" -name '*.log' -printf '%s\n' 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'; }
ADMIN="127.0.0.1:$(kraft_free_port)"
if [ "$OUTAGE" = pause ]; then
  # Control-plane mode: the source and the topics come with `mirrors create` and `start`.
  cat > "$WORK/kmirror.toml" <<EOF
[admin]
listen = "$ADMIN"
EOF
  printf 'bootstrap.servers=127.0.0.1:%s\n' "$PORT" > "$WORK/source.properties"
else
  cat > "$WORK/kmirror.toml" <<EOF
[source]
bootstrap_servers = ["127.0.0.1:$PORT"]
[topics]
names = ["$TOPIC"]
EOF
fi
cat >> "$WORK/kmirror.toml" <<EOF
[storage]
data_dir = "$WORK/mirror"
[runtime]
shards = $SHARDS
arena_slot_bytes = 67108864
arena_slots = $ARENA_SLOTS
[fetch]
max_wait_ms = 500
max_bytes = 52428800
partition_max_bytes = 1048576
[fetch.source_load]
max_rate_bytes_per_sec = $MAX_RATE
EOF
mirrors() { "$BIN/kmirror" mirrors --admin "$ADMIN" "$@"; }
# 0. (after the warm-up) kmirror mirrors the topic as it stands, then the outage begins: with
#    OUTAGE=restart it stops, with OUTAGE=pause its mirror is paused and it keeps running.
if [ "$FROM_EMPTY" != 1 ]; then
  KMIRROR_LOG=${SERVE_LOG:-warn} "$BIN/kmirror" serve --config "$WORK/kmirror.toml" > "$WORK/serve0.log" 2>&1 &
  SERVE_PID=$!
  if [ "$OUTAGE" = pause ]; then
    for _ in $(seq 1 300); do mirrors list > /dev/null 2>&1 && break; sleep 0.1; done
    mirrors create --mirror outage --mirror-config "$WORK/source.properties" > /dev/null
    mirrors start --mirror outage --topics "$TOPIC" > /dev/null
  fi
  target=$(broker_bytes)
  for _ in $(seq 1 1200); do
    (( $(ours_bytes) >= target )) && break
    kill -0 "$SERVE_PID" 2>/dev/null || { tail -5 "$WORK/serve0.log" >&2; exit 1; }
    sleep 0.5
  done
  (( $(ours_bytes) >= target )) || { echo "phase 0: kmirror did not mirror the warm-up" >&2; exit 1; }
  # A real outage hits a mirror that was running: the source has been serving its fetches.
  # MIRROR_S seconds of the steady producer mirrored before the outage give the broker that
  # state. Without them (session 16) the first responses after the resume took 2-3 s while
  # kmirror's shards waited on their sockets and the broker's request handlers and JIT
  # compiler threads took most of the CPU (perf -a, /proc wchan).
  if (( MIRROR_S > 0 )); then
    perf $(( STEADY_RPS * MIRROR_S )) "$STEADY_RPS" > "$WORK/mirrored.txt"
    target=$(broker_bytes)
    for _ in $(seq 1 600); do (( $(ours_bytes) >= target )) && break; sleep 0.5; done
    (( $(ours_bytes) >= target )) || { echo "phase 0: kmirror did not keep up with the steady producer" >&2; exit 1; }
  fi
  if [ "$OUTAGE" = pause ]; then
    T0=$(date +%s.%N)
    mirrors pause --mirror outage --topics "$TOPIC" > /dev/null
    echo "# pause of $PARTITIONS partitions: $(python3 -c "import time; print(round(time.time() - $T0, 2))") s" >&2
  else
    kill "$SERVE_PID"
    wait "$SERVE_PID" || { echo "phase 0: kmirror serve exited with $? on SIGTERM" >&2; tail -5 "$WORK/serve0.log" >&2; exit 1; }
    SERVE_PID=""
  fi
fi
# 1. idle: kmirror not running (OUTAGE=pause: running, its mirror paused).
for _ in $(seq 1 "$IDLE_CHUNKS"); do perf "$CHUNK_RECORDS" "$STEADY_RPS" >> "$WORK/idle.txt"; done
# 2. backlog, kmirror still stopped.
BACKLOG_RECORDS=$(( BACKLOG_MB * 1000000 / RECORD_SIZE ))
T0=$(date +%s.%N)
perf "$BACKLOG_RECORDS" -1 > "$WORK/backlog.txt"
echo "# backlog: $(cat "$WORK/backlog.txt") in $(python3 -c "import time; print(round(time.time() - $T0, 1))") s" >&2

# The same broker's copy limit: the raw copy from the broker itself (`--from-broker`: the same
# Fetch requests as kmirror's, incremental sessions, one connection per shard, responses written
# to a file, only batch headers read), the whole topic from offset 0 to its high watermark.
# Its output files are left for the caller to delete, after its clock stops.
broker_raw_copy() {
  mkdir -p "$WORK/raw-broker"
  "$BIN/kmirror-raw-copy" --from-broker --bootstrap "127.0.0.1:$PORT" --topic "$TOPIC" \
    --partitions "$PARTITIONS" --out-dir "$WORK/raw-broker" --connections "$SHARDS" --seconds 600 \
    --max-bytes 52428800 --partition-max-bytes 1048576
}

# 3. catch-up with the steady producer running.
steady_chunks "$WORK/catchup.txt" &
PRODUCER_PID=$!
if [ "$CATCHUP_BY" = raw ]; then
  # The same moment caught up by the raw copy instead of kmirror (kmirror stays paused): the
  # broker as it is right after the backlog, with the steady producer, which the raw copies
  # after kmirror's catch-up below never see. It copies the whole topic from offset 0 (the
  # backlog and the ~5 % before it) and ends at the high watermarks it saw.
  T0=$(date +%s.%N)
  RAW_CATCHUP=$(broker_raw_copy)
  T1=$(date +%s.%N)
  stop_pid "$PRODUCER_PID"; PRODUCER_PID=""
  python3 - "$T0" "$T1" "$RAW_CATCHUP" "$PARTITIONS" "$KAFKA" <<'EOF'
import sys
t0, t1, out, parts, kafka = sys.argv[1:]
kv = dict(x.split("=", 1) for x in out.split() if "=" in x)
secs = float(t1) - float(t0)
print(f"kafka={kafka} partitions={parts} catchup_by=raw exec_to_exit_s={secs:.1f} "
      f"exec_to_exit_MBps={int(kv['record_bytes']) / secs / 1e6:.1f} own_MBps={kv['MB/s']} "
      f"cpu_s_per_GB={kv['cpu_s_per_GB']} responses={kv['responses']}")
EOF
  exit 0
fi
OURS_AT_START=$(ours_bytes)
START=$(date +%s.%N)
BACKLOG_BYTES=$(broker_bytes)
if [ "$OUTAGE" = pause ]; then
  mirrors resume --mirror outage --topics "$TOPIC" > /dev/null
  echo "# resume of $PARTITIONS partitions: $(python3 -c "import time; print(round(time.time() - $START, 2))") s" >&2
  ln -sf serve0.log "$WORK/serve.log"
else
  KMIRROR_LOG=${SERVE_LOG:-warn} "$BIN/kmirror" serve --config "$WORK/kmirror.toml" > "$WORK/serve.log" 2>&1 &
  SERVE_PID=$!
fi
CHUNKS_AT_START=$(wc -l < "$WORK/catchup.txt")
# The catch-up's end, polled by one Python process that keeps the .log paths and stats only
# them (both trees are walked again every 2 s, for new segments). A `find` over both trees per
# poll took ~9 % of this 2-core box during catch-up (perf -a, session 16): CPU that the raw
# copy it is compared with never paid.
eval "$(python3 - "$WORK/broker-data" "$WORK/mirror" "$TOPIC" "$POLL_S" "$OURS_AT_START" "$BACKLOG_BYTES" \
  "${SERVE_PID:-0}" "$START" "$CATCHUP_LIMIT_S" "$WORK/progress.txt" <<'POLL'
import os, sys, time
broker, mirror, topic, poll, ours0, backlog, pid, start, limit, progress = sys.argv[1:]
poll, ours0, backlog, pid = float(poll), int(ours0), int(backlog), int(pid)
start, limit = float(start), float(limit)

class Tree:
    """Bytes of the .log files in the root's topic-* dirs (find -path '*/topic-*' -name '*.log')."""
    def __init__(self, root):
        self.root, self.paths, self.walked = root, [], 0.0
    def walk(self):
        self.paths = [os.path.join(d, f) for d, _, files in os.walk(self.root)
                      if f"/{topic}-" in d for f in files if f.endswith(".log")]
        self.walked = time.time()
    def total(self):
        if time.time() - self.walked > 2.0:
            self.walk()
        try:
            return sum(os.stat(p).st_size for p in self.paths)
        except FileNotFoundError:  # a segment deleted or renamed meanwhile: walk again
            self.walk()
            return self.total()

theirs, ours_tree = Tree(broker), Tree(mirror)
first = backlog_at = ""
status = "ok"
with open(progress, "a") as out:
    while True:
        target = theirs.total()
        time.sleep(poll)
        ours = ours_tree.total()
        now = time.time()
        out.write(f"{now:.6f} {ours}\n")
        if not first and ours > ours0:
            first = f"{now:.6f}"
        # The backlog as it stood at the start is in: what the raw copy's end means too (each
        # of its partitions ends at the high watermark it last saw), while the catch-up's end
        # also waits for what the steady producer added meanwhile.
        if not backlog_at and ours >= backlog:
            backlog_at = f"{now:.6f}"
        if ours >= target:
            break
        if pid:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                status = "serve-exited"
                break
        if now - start > limit:
            status = "timeout"
            break
print(f"FIRST={first} BACKLOG_AT={backlog_at} status={status}")
POLL
)"
END=$(date +%s.%N)
CHUNKS_DONE=$(wc -l < "$WORK/catchup.txt")
END_BYTES=$(broker_bytes)
# Chunks that ended during catch-up (the one running at its start is dropped, it began idle).
sed -n "$((CHUNKS_AT_START + 2)),${CHUNKS_DONE}p" "$WORK/catchup.txt" > "$WORK/during.txt"
stop_pid "$PRODUCER_PID"; PRODUCER_PID=""
stop_pid "$SERVE_PID"; SERVE_PID=""
[ "$status" = ok ] || { echo "catch-up $status"; tail -5 "$WORK/serve.log" >&2; }
# The catch-up's shape: MB/s mirrored in each whole second from the start (a ramp as partitions
# join their shards reads differently from a rate that is low throughout).
awk -v t0="$START" -v b0="$OURS_AT_START" '
  { s = int($1 - t0); last[s] = $2; if (s > n) n = s }
  END { prev = b0; line = ""; for (i = 0; i <= n; i++) { if (i in last) { line = line sprintf(" %.0f", (last[i] - prev) / 1e6); prev = last[i] } else line = line " -" }
        print "# catch-up MB per second from the start:" line }' "$WORK/progress.txt" >&2
# With SERVE_LOG=info, the start-up steps as serve logged them, beside the exec and first-byte
# instants (all UTC), so a start-up can be read step by step.
if [ "${SERVE_LOG:-warn}" != warn ]; then
  echo "# serve exec $(date -u -d "@$START" +%H:%M:%S.%N), first new byte $(date -u -d "@${FIRST:-$END}" +%H:%M:%S.%N) (poll every $POLL_S s)" >&2
  { grep -E 'source answered|log dir opened|directories created|shard started|mirroring' "$WORK/serve.log" | head -8
    grep -m 1 'partition added' "$WORK/serve.log"
    # The last partition handed to its shard: when the whole catch-up was under way.
    grep 'partition added' "$WORK/serve.log" | tail -1; } | sed 's/^/# serve: /' >&2 || true
  echo "# serve: $(grep -c 'partition added' "$WORK/serve.log" || true) 'partition added' lines in all" >&2
fi

# The source's own serve limit for the same data: Kafka's ConsumerPerformance reading the whole
# topic from the broker (no group join: --num-records the topic's records, a fresh group).
RECORDS_AT_START=$(( BACKLOG_RECORDS + (IDLE_CHUNKS + 1) * CHUNK_RECORDS + STEADY_RPS * MIRROR_S ))
KAFKA_READ=$(java -Xmx1g -XX:+UseSerialGC "${QUIET[@]}" -cp "$CP" org.apache.kafka.tools.ConsumerPerformance \
  --bootstrap-server "127.0.0.1:$PORT" --topic "$TOPIC" --num-records "$BACKLOG_RECORDS" \
  --group outage-read-limit --timeout 120000 --hide-header 2>/dev/null | tail -1)
# The broker's copy limit (broker_raw_copy, above), alone.
RAW_BROKER=$(broker_raw_copy)
rm -rf "$WORK/raw-broker"
# The same copy while the steady producer writes, as during kmirror's catch-up: the broker and
# the producer's JVM then share the cores with the copy, as they did with kmirror.
steady_chunks "$WORK/loaded.txt" &
PRODUCER_PID=$!
sleep "$CHUNK_S"
RAW_BROKER_LOADED=$(broker_raw_copy)
rm -rf "$WORK/raw-broker"
stop_pid "$PRODUCER_PID"; PRODUCER_PID=""
# The copy limit for the same partitions: raw copy from the synthetic source.
PBYTES=$(( END_BYTES / PARTITIONS ))
"$BIN/kmirror-synth-source" --listen 127.0.0.1:0 --codec lz4 --batch-bytes 65536 \
  --partitions "$PARTITIONS" --partition-bytes "$PBYTES" > "$WORK/source.out" 2>"$WORK/source.err" &
SRC_PID=$!
for _ in $(seq 1 600); do grep -q '^listening on' "$WORK/source.out" 2>/dev/null && break; sleep 0.1; done
read -r _ _ SADDR _ < "$WORK/source.out"
mkdir -p "$WORK/raw"
RAW=$("$BIN/kmirror-raw-copy" --bootstrap "$SADDR" --codec lz4 --batch-bytes 65536 \
  --partitions "$PARTITIONS" --partition-bytes "$PBYTES" --out-dir "$WORK/raw" \
  --connections "$SHARDS" --seconds 300 --max-bytes 52428800 --partition-max-bytes 1048576)
stop_pid "$SRC_PID"; SRC_PID=""

python3 - "$START" "$END" "$BACKLOG_BYTES" "$END_BYTES" "$status" "$RAW" "$WORK/idle.txt" "$WORK/during.txt" \
  "$PARTITIONS" "$RATE_MB_S" "$MAX_RATE" "$CODEC" "$KAFKA" "$KAFKA_READ" "$RECORDS_AT_START" "$RAW_BROKER" \
  "$OURS_AT_START" "${FIRST:-$END}" "$FROM_EMPTY" "$RAW_BROKER_LOADED" "$OUTAGE" "${BACKLOG_AT:-$END}" <<'EOF'
import re, sys
start, end, backlog, end_bytes, status, raw, idle, during, parts, rate, cap, codec, kafka, kread, at_start, rawb, ours0, first, empty, rawl, outage, backlog_at = sys.argv[1:]
secs = float(end) - float(start)
# What the catch-up moved: the broker's bytes at its end less what kmirror held before.
moved = int(end_bytes) - int(ours0)
startup = float(first) - float(start)
data_secs = max(float(end) - float(first), 1e-9)
kv = dict(x.split("=", 1) for x in raw.split() if "=" in x)
raw_mbps = float(kv["MB/s"])  # response bytes incl. framing: a slightly generous limit
def p99(path):
    v = [float(m.group(1)) for m in (re.search(r", ([0-9.]+) ms 99th,", l) for l in open(path)) if m]
    return (max(v) if v else float("nan")), len(v)
ip, ni = p99(idle)
dp, nd = p99(during)
print(f"kafka={kafka} partitions={parts} codec={codec} steady_MBps={rate} max_rate={cap} status={status} "
      f"backlog_bytes={int(backlog)} mirrored_bytes={moved} catchup_s={secs:.1f} "
      f"catchup_MBps={moved / secs / 1e6:.1f} raw_MBps={raw_mbps:.1f} ratio={moved / secs / 1e6 / raw_mbps:.2f} "
      f"p99_idle_ms={ip} (worst of {ni} chunks) p99_catchup_ms={dp} (worst of {nd} chunks)")
kind = "first_start" if empty == "1" else outage
print(f"{kind}: startup_s={startup:.1f} ({'resume call' if outage == 'pause' else 'exec'} to the first new byte, "
      f"within one poll) data_phase_MBps={moved / data_secs / 1e6:.1f} held_before_bytes={int(ours0)}")
# ConsumerPerformance: start, end, MB (MiB of values), MB.sec, nMsg, nMsg.sec, rebalance ms,
# fetch ms, fetch.MB.sec, fetch.nMsg.sec. Its records/s (group join excluded) times the on-disk
# bytes per record at the catch-up's start gives the broker's own read rate in the bytes
# kmirror's figure counts.
f = [x.strip() for x in kread.split(",")]
if len(f) >= 10 and float(f[9]) > 0:
    kafka_mbps = float(f[9]) * int(backlog) / int(at_start) / 1e6
    print(f"kafka_consumer_MBps={kafka_mbps:.1f} ratio_to_kafka_consumer={moved / secs / 1e6 / kafka_mbps:.2f} "
          f"(ConsumerPerformance from the same broker, {f[4]} records, fetch {f[7]} ms)")
else:
    print(f"kafka_consumer: no figure ({kread!r})")
kb = dict(x.split("=", 1) for x in rawb.split() if "=" in x)
rawb_mbps = float(kb["MB/s"])  # whole record batches, the bytes kmirror's .log files count
print(f"raw_copy_from_broker_MBps={rawb_mbps:.1f} cpu_s_per_GB={kb['cpu_s_per_GB']} "
      f"responses={kb['responses']} ratio_to_broker_raw_copy={moved / secs / 1e6 / rawb_mbps:.2f}")
kl = dict(x.split("=", 1) for x in rawl.split() if "=" in x)
rawl_mbps = float(kl["MB/s"])
print(f"raw_copy_from_broker_with_producer_MBps={rawl_mbps:.1f} cpu_s_per_GB={kl['cpu_s_per_GB']} "
      f"ratio_to_it={moved / secs / 1e6 / rawl_mbps:.2f} data_phase_ratio_to_it={moved / data_secs / 1e6 / rawl_mbps:.2f}")
held = int(backlog) - int(ours0)
backlog_secs = max(float(backlog_at) - float(start), 1e-9)
print(f"backlog_at_start_mirrored_s={backlog_secs:.1f} (first poll holding it) bytes={held} "
      f"MBps={held / backlog_secs / 1e6:.1f} ratio_to_raw_copy_with_producer={held / backlog_secs / 1e6 / rawl_mbps:.2f}")
EOF
