# Shell helpers for the scripts that start a one-node KRaft broker from the cached jars
# (quickstart.sh, benches/mirror_real_kafka.sh, benches/mm2_compare.sh). Source it; it defines
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
