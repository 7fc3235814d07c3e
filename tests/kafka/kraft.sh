# Shell helpers for the scripts that start a one-node KRaft broker from the cached jars
# (quickstart.sh and the scripts under benches/). Source it; it defines
# functions only. The Rust test harness (tests/harness/broker.rs) writes the same settings.

# kraft_properties LOG_DIR PORT CONTROLLER_PORT: server.properties of a broker+controller on
# loopback with every internal topic at one replica and one partition (creating 50 internal
# partitions costs seconds at every start).
kraft_properties() {
  local log_dir="$1" port="$2" cport="$3"
  cat <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$log_dir
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
PROPS
}

# kraft_cluster_id: a random cluster id for StorageTool format, which reads an id starting
# with '-' as an option, so none does.
kraft_cluster_id() {
  python3 -c 'import base64, uuid
while True:
    s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not s.startswith("-"):
        print(s)
        break'
}

# kraft_free_port: a free loopback port (bound and released; the caller binds it soon after).
kraft_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# kraft_quiet WORK: writes log4j (Kafka < 4) and log4j2 (Kafka 4) configs that log warnings
# only, and sets the array KRAFT_QUIET to the JVM flags that select them.
kraft_quiet() {
  local work="$1"
  printf 'log4j.rootLogger=WARN, stderr\nlog4j.appender.stderr=org.apache.log4j.ConsoleAppender\nlog4j.appender.stderr.Target=System.err\nlog4j.appender.stderr.layout=org.apache.log4j.PatternLayout\nlog4j.appender.stderr.layout.ConversionPattern=[%%d] %%p %%m (%%c)%%n\n' \
    >"$work/log4j.properties"
  printf 'status=error\nrootLogger.level=warn\n' >"$work/log4j2.properties"
  KRAFT_QUIET=(-Dlog4j.configuration=file:"$work/log4j.properties" -Dlog4j2.configurationFile="$work/log4j2.properties")
}

# kraft_start WORK CLASSPATH [JVM OPTIONS...]: formats and starts a one-node broker with its
# data in WORK/broker-data and its output in WORK/broker.log, and waits (up to 120 s) until it
# accepts connections. Sets PORT, CPORT and BROKER_PID; returns 1 (after printing the log's
# tail) if the broker does not come up. JVM options default to a 1 GiB serial-GC heap.
kraft_start() {
  local work="$1" cp="$2"
  shift 2
  local jvm=("$@")
  [ ${#jvm[@]} -gt 0 ] || jvm=(-Xmx1g -Xms256m -XX:+UseSerialGC)
  kraft_quiet "$work"
  PORT=$(kraft_free_port)
  CPORT=$(kraft_free_port)
  kraft_properties "$work/broker-data" "$PORT" "$CPORT" >"$work/server.properties"
  java -Xmx256m -XX:+UseSerialGC "${KRAFT_QUIET[@]}" -cp "$cp" kafka.tools.StorageTool \
    format -t "$(kraft_cluster_id)" -c "$work/server.properties" >"$work/format.log" 2>&1
  java "${jvm[@]}" "${KRAFT_QUIET[@]}" -cp "$cp" kafka.Kafka "$work/server.properties" \
    >"$work/broker.log" 2>&1 &
  BROKER_PID=$!
  local _
  for _ in $(seq 1 240); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1',$PORT),1)" 2>/dev/null && return 0
    kill -0 "$BROKER_PID" 2>/dev/null || break
    sleep 0.5
  done
  tail -20 "$work/broker.log" >&2
  echo "kraft_start: the broker did not come up on 127.0.0.1:$PORT" >&2
  return 1
}
