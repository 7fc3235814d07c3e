#!/usr/bin/env bash
# kmirror vs MirrorMaker 2, side by side on the same data.
#
# Starts two real Kafka 4.1.1 KRaft brokers (A, B) from the cached jars, preloads SIZE_GB of
# text-like records (CODEC, default lz4; PARTS partitions, default 16) into A with Kafka's ProducerPerformance, then
#   (a) `kmirror serve` mirrors A's topic into its own data dir;
#   (b) MirrorMaker 2 (dedicated mode, IdentityReplicationPolicy, heartbeats/checkpoints/offset
#       syncs of groups off) mirrors it from A into B.
# For each it reports catch-up time from launch, MB/s (the source's on-disk bytes over the time
# from the first mirrored record to the last) and CPU seconds per GB (of the mirror process, from
# its launch, start-up included, and "steady" from its first mirrored record; for MM2 also broker
# B, which MM2 needs as its destination and kmirror does not; broker A serves both). Completion is "every partition's end offset on the target equals the source's", read
# from the log files by benches/mm2/watch_mirror.py (headers only, so MM2's re-batched,
# recompressed output is counted by records, not bytes).
#
#   bash benches/mm2/fetch-jars.sh          # once: MirrorMaker 2 jars into ~/.cache/kmirror
#   cargo build --release --bin kmirror
#   SIZE_GB=0.1 benches/mm2_compare.sh      # validate
#   SIZE_GB=3 benches/mm2_compare.sh        # measure
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tests/kafka/kraft.sh
. tests/kafka/kraft.sh
REPO=$PWD
SIZE_GB=${SIZE_GB:-3}
PARTS=${PARTS:-16}
TOPIC=${TOPIC:-bench}
CODEC=${CODEC:-lz4}                    # compression.type of the preload and of MM2's producer
RECORD_BYTES=${RECORD_BYTES:-1000}     # average payload line length
KMIRROR_SHARDS=${KMIRROR_SHARDS:-2}
MM2_TASKS=${MM2_TASKS:-2}
BIN=${BIN:-target/release}
TIMEOUT=${TIMEOUT:-900}
KAFKA_LIBS=${KAFKA_LIBS:-$HOME/.cache/kmirror/kafka-4.1.1/libs}
MM2_LIBS=${MM2_LIBS:-$HOME/.cache/kmirror/mm2-4.1.1/libs}
JAVA=${JAVA_HOME:+$JAVA_HOME/bin/}java
[[ -x $BIN/kmirror ]] || { echo "build first: cargo build --release --bin kmirror" >&2; exit 1; }
[[ -f $KAFKA_LIBS/kafka-clients-4.1.1.jar ]] || { echo "run: bash tests/kafka/fetch-jars.sh" >&2; exit 1; }
[[ -f $MM2_LIBS/.complete ]] || bash benches/mm2/fetch-jars.sh
HZ=$(getconf CLK_TCK)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-mm2.XXXXXX")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
log() { echo "# $(date -u +%T) $*"; }

cat >"$WORK/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.apache.kafka.clients=WARN
log4j.logger.org.apache.kafka.common.utils.AppInfoParser=WARN
EOF
printf 'status=error\nrootLogger.level=warn\n' >"$WORK/log4j2.properties"
LOGFLAGS=("-Dlog4j.configuration=file:$WORK/log4j.properties" "-Dlog4j2.configurationFile=$WORK/log4j2.properties")
tool() { # class args...: a short-lived Kafka tool JVM
    "$JAVA" -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 "${LOGFLAGS[@]}" -cp "$KAFKA_LIBS/*" "$@"
}

declare -A PORT BROKER_PID
start_broker() { # name: the shared one-node start-up, with Kafka's own start script heap and GC
    mkdir -p "$WORK/$1"
    kraft_start "$WORK/$1" "$KAFKA_LIBS/*" -Xmx1G -Xms1G -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:InitiatingHeapOccupancyPercent=35 -Djava.awt.headless=true || exit 1
    PORT[$1]=$PORT
    BROKER_PID[$1]=$BROKER_PID
    PIDS+=("$BROKER_PID")
}

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

log "starting brokers A and B"
start_broker A
start_broker B
A=127.0.0.1:${PORT[A]} B=127.0.0.1:${PORT[B]}
log "A=$A (pid ${BROKER_PID[A]}) B=$B (pid ${BROKER_PID[B]})"

tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$A" --create --topic "$TOPIC" \
    --partitions "$PARTS" --replication-factor 1 >/dev/null
# Text-like payload lines (words and numbers), so lz4/zstd compress them the way they do real
# payloads; ProducerPerformance picks a random line per record.
python3 - "$WORK/payload.txt" "$RECORD_BYTES" <<'EOF'
import random, sys
words = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu order "
         "payment customer shipment invoice account").split()
rnd = random.Random(7)
size = int(sys.argv[2])
with open(sys.argv[1], "w") as f:
    for _ in range(20000):
        line = []
        n = 0
        while n < size:
            w = rnd.choice(words) if rnd.random() < 0.8 else str(rnd.randrange(100000))
            line.append(w)
            n += len(w) + 1
        f.write(" ".join(line)[:size] + "\n")
EOF
records=$(awk -v g="$SIZE_GB" -v r="$RECORD_BYTES" 'BEGIN {printf "%d", g * 1e9 / r}')
log "preloading $records records of ~$RECORD_BYTES bytes ($CODEC, batch.size 64 KiB) into $TOPIC on A"
t=$(date +%s.%N)
tool org.apache.kafka.tools.ProducerPerformance --topic "$TOPIC" --num-records "$records" \
    --throughput -1 --payload-file "$WORK/payload.txt" \
    --producer-props bootstrap.servers="$A" compression.type="$CODEC" batch.size=65536 linger.ms=20 \
    acks=1 buffer.memory=134217728 2>&1 | tail -1
log "preload took $(awk -v t="$t" -v n="$(date +%s.%N)" 'BEGIN {printf "%.1f", n - t}') s"

watch() { # target_dir pids -> watcher line
    python3 benches/mm2/watch_mirror.py --source-dir "$WORK/A/broker-data" --target-dir "$1" \
        --topic "$TOPIC" --partitions "$PARTS" --pids "$2" --timeout "$TIMEOUT"
}

# (a) kmirror
sleep 2
cat >"$WORK/kmirror.toml" <<EOF
[source]
bootstrap_servers = ["$A"]
[topics]
names = ["$TOPIC"]
[storage]
data_dir = "$WORK/kmirror-data"
[runtime]
shards = $KMIRROR_SHARDS
EOF
load_k=$(cut -d' ' -f1 /proc/loadavg)
log "kmirror serve ($KMIRROR_SHARDS shards) from A, load1=$load_k"
"$BIN/kmirror" serve --config "$WORK/kmirror.toml" >"$WORK/kmirror.log" 2>&1 &
kpid=$!
PIDS+=($kpid)
kline=$(watch "$WORK/kmirror-data" "kmirror=$kpid,brokerA=${BROKER_PID[A]},brokerB=${BROKER_PID[B]}")
khwm=$(awk '/^VmHWM/ {print $2}' "/proc/$kpid/status" 2>/dev/null) || khwm=0
kill "$kpid"; wait "$kpid" 2>/dev/null || true
echo "kmirror: $kline hwm_kB=$khwm"
grep -q "status=ok" <<<"$kline" || { echo "kmirror did not finish; its log:" >&2; tail -20 "$WORK/kmirror.log" >&2; exit 1; }
rm -rf "$WORK/kmirror-data"

# (b) MirrorMaker 2
sleep 2
cat >"$WORK/mm2.properties" <<EOF
clusters = A, B
A.bootstrap.servers = $A
B.bootstrap.servers = $B
A->B.enabled = true
A->B.topics = $TOPIC
B->A.enabled = false
replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy
tasks.max = $MM2_TASKS
refresh.topics.interval.seconds = 5
emit.heartbeats.enabled = false
emit.checkpoints.enabled = false
sync.group.offsets.enabled = false
sync.topic.acls.enabled = false
replication.factor = 1
checkpoints.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset-syncs.topic.replication.factor = 1
offset.storage.replication.factor = 1
status.storage.replication.factor = 1
config.storage.replication.factor = 1
# Keep the mirrored data compressed as at the source (MM2's producer default is none).
B.producer.compression.type = $CODEC
B.producer.batch.size = 65536
B.producer.linger.ms = 20
EOF
load_m=$(cut -d' ' -f1 /proc/loadavg)
log "MirrorMaker 2 (dedicated, tasks.max=$MM2_TASKS) A -> B, load1=$load_m"
"$JAVA" -Xmx1G -Xms1G -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true "${LOGFLAGS[@]}" \
    -cp "$KAFKA_LIBS/*:$MM2_LIBS/*" org.apache.kafka.connect.mirror.MirrorMaker \
    "$WORK/mm2.properties" --clusters B >"$WORK/mm2.log" 2>&1 &
mpid=$!
PIDS+=($mpid)
mline=$(watch "$WORK/B/broker-data" "mm2=$mpid,brokerA=${BROKER_PID[A]},brokerB=${BROKER_PID[B]}")
mhwm=$(awk '/^VmHWM/ {print $2}' "/proc/$mpid/status" 2>/dev/null) || mhwm=0
kill "$mpid"; wait "$mpid" 2>/dev/null || true
echo "mm2: $mline hwm_kB=$mhwm"
grep -q "status=ok" <<<"$mline" || { echo "MM2 did not finish; its log:" >&2; grep -E "ERROR|Exception|error" "$WORK/mm2.log" | head -20 >&2; exit 1; }

python3 - "$kline" "$mline" "$HZ" "$load_k" "$load_m" <<'EOF'
import sys
def parse(line):
    return dict(kv.split("=", 1) for kv in line.split())
k, m, hz = parse(sys.argv[1]), parse(sys.argv[2]), int(sys.argv[3])
def figures(d, proc):
    gb = int(d["source_bytes"]) / 1e9
    first, done = float(d["first_s"]), float(d["done_s"])
    t = {n[:-6]: [int(x) for x in v.split("/")] for n, v in d.items() if n.endswith("_ticks")}
    window = max(done - first, 1e-9)
    cpu = lambda n: (t[n][2] - t[n][0]) / hz   # launch -> done
    steady = lambda n: (t[n][2] - t[n][1]) / hz  # first record -> done
    return {
        "gb": gb, "catch_up_s": done, "first_s": first,
        "mbps": gb * 1e3 / window, "mbps_from_launch": gb * 1e3 / done,
        "cpu_s": cpu(proc), "cpu_s_per_gb": cpu(proc) / gb,
        "steady_cpu_s_per_gb": steady(proc) / gb,
        "steady_brokerB_cpu_s_per_gb": steady("brokerB") / gb,
        "brokerA_cpu_s_per_gb": cpu("brokerA") / gb, "brokerB_cpu_s_per_gb": cpu("brokerB") / gb,
    }
fk, fm = figures(k, "kmirror"), figures(m, "mm2")
for name, f, d in (("kmirror", fk, k), ("mm2", fm, m)):
    print(f"{name}: status={d['status']} source_GB={f['gb']:.3f} target_bytes={d['target_bytes']} "
          f"catch_up_s={f['catch_up_s']:.1f} first_record_s={f['first_s']:.1f} "
          f"MBps={f['mbps']:.1f} MBps_from_launch={f['mbps_from_launch']:.1f} "
          f"cpu_s={f['cpu_s']:.1f} cpu_s_per_GB={f['cpu_s_per_gb']:.2f} "
          f"steady_cpu_s_per_GB={f['steady_cpu_s_per_gb']:.2f} "
          f"brokerA_cpu_s_per_GB={f['brokerA_cpu_s_per_gb']:.2f} brokerB_cpu_s_per_GB={f['brokerB_cpu_s_per_gb']:.2f}")
mm2_total = fm["cpu_s_per_gb"] + fm["brokerB_cpu_s_per_gb"]
steady_ratio = fm["steady_cpu_s_per_gb"] / max(fk["steady_cpu_s_per_gb"], 1e-9)
print(f"ratios: MBps={fk['mbps'] / fm['mbps']:.2f}x MBps_from_launch={fk['mbps_from_launch'] / fm['mbps_from_launch']:.2f}x "
      f"MB_per_cpu_s={fm['cpu_s_per_gb'] / fk['cpu_s_per_gb']:.1f}x "
      f"MB_per_cpu_s_with_brokerB={mm2_total / fk['cpu_s_per_gb']:.1f}x "
      f"steady_MB_per_cpu_s={steady_ratio:.1f}x "
      f"(load1 at start: kmirror {sys.argv[4]}, mm2 {sys.argv[5]})")
EOF
