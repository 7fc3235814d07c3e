"""Stock-client checks with librdkafka, through confluent-kafka (pinned in requirements.txt; the
wheel bundles librdkafka). One JSON line per result on stdout; any failure exits non-zero.

  consume   BOOTSTRAP TOPIC PARTITION ISOLATION [CONFIG_JSON]
            (CONFIG_JSON: more client settings, e.g. security.protocol and ssl.*)
            assign from the beginning and read until librdkafka reports the partition's end
            (the high watermark read_uncommitted, the last stable offset read_committed):
            one line per record; a refused login (error_cb _AUTHENTICATION) fails the run at
            once with the broker's reason
  metadata  BOOTSTRAP                      -> {"topics": {name: [partition ids]}, "brokers": n}
  configs   BOOTSTRAP TOPIC                -> {name: value} (DescribeConfigs of the topic)
  offsets   BOOTSTRAP TOPIC PARTITION TS,TS,...
            -> {"earliest", "latest", "times": [offset per timestamp]} (AdminClient.list_offsets)
  group     BOOTSTRAP PATTERN GROUP MAX
            subscribe to PATTERN (a regex when it starts with ^) as a member of GROUP, read MAX
            records (read_committed), print one {"topic","partition","offset"} line each, commit
            exactly those synchronously, then print {"assignment": [...], "listed": [...],
            "described": {...}} (list/describe_consumer_groups while still a member) and leave
  produce   BOOTSTRAP TOPIC PARTITION COUNT MODE SEED
            MODE idempotent: one idempotent producer writes COUNT records;
            MODE commit,abort,...: one transactional producer, one transaction of COUNT records
            per listed outcome; one {"outcome","offsets","values"} line per transaction (or one
            for the idempotent run); values are "SEED-i" so the test knows what it wrote
  produce-refused BOOTSTRAP TOPIC PARTITION
            one plain produce; prints {"error": name, "retriable": bool, "message"}
  connect-refused BOOTSTRAP
            an admin client asks for Metadata until the client reports an error (error_cb);
            prints the first one other than _ALL_BROKERS_DOWN as {"error": name, "message"};
            fails if Metadata is answered (the connection was not refused)

Every client also gets the settings of the JSON object in $KMIRROR_CLIENT_CONFIG, if set
(security.protocol, sasl.mechanism, sasl.username, ...).

Records are printed with key/value/header values in base64 so the Rust test compares them with
what the same client read from the source broker.
"""
import base64
import json
import os
import sys
import time

from confluent_kafka import (Consumer, KafkaError, KafkaException, Producer, TopicPartition,
                             OFFSET_BEGINNING)
from confluent_kafka.admin import (AdminClient, ConfigResource, OffsetSpec, ResourceType)

# Failure guards for a loaded 2-core machine, not performance claims.
DEADLINE_S = 90
REQUEST_TIMEOUT_S = 30


def with_env(conf):
    """`conf` plus the client settings a test passed in $KMIRROR_CLIENT_CONFIG."""
    return {**conf, **json.loads(os.environ.get("KMIRROR_CLIENT_CONFIG", "{}"))}


def b64(b):
    return None if b is None else base64.b64encode(b).decode()


def emit(obj):
    print(json.dumps(obj, sort_keys=True), flush=True)


def consume(bootstrap, topic, partition, isolation, config_json="{}"):
    # librdkafka retries a refused login for ever and tells it only to error_cb: the first
    # authentication error ends the run (non-zero, with the broker's reason) instead of the
    # deadline.
    refused = []

    def on_error(e):
        if e.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            refused.append(e)

    c = Consumer(with_env({
        "bootstrap.servers": bootstrap,
        "group.id": "librdkafka-assign",  # required by the client; nothing is committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "isolation.level": isolation,
        "error_cb": on_error,
        **json.loads(config_json),
    }))
    c.assign([TopicPartition(topic, int(partition), OFFSET_BEGINNING)])
    try:
        for m in messages(c, lambda: f"no end of {topic}-{partition}", refused):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return
                raise KafkaException(m.error())
            _, ts = m.timestamp()
            emit({
                "offset": m.offset(),
                "timestamp": ts,
                "key": b64(m.key()),
                "value": b64(m.value()),
                "headers": [[k, b64(v)] for k, v in (m.headers() or [])],
            })
    finally:
        c.close()


def messages(consumer, what, refused=()):
    """Polled messages (errors included) until the caller stops; fails after DEADLINE_S, saying
    `what()` did not happen, or as soon as `refused` (filled by an error_cb) holds an error."""
    deadline = time.time() + DEADLINE_S
    while True:
        if refused:
            e = refused[0]
            raise SystemExit(f"authentication refused: {e.name()}: {e.str()}")
        if time.time() > deadline:
            raise SystemExit(f"{what()} within {DEADLINE_S} s")
        m = consumer.poll(0.5)
        if m is not None:
            yield m


def admin(bootstrap):
    return AdminClient(with_env({"bootstrap.servers": bootstrap}))


def metadata(bootstrap):
    md = admin(bootstrap).list_topics(timeout=REQUEST_TIMEOUT_S)
    topics = {}
    for name, t in md.topics.items():
        if t.error is not None:
            raise KafkaException(t.error)
        topics[name] = sorted(t.partitions)
    emit({"topics": topics, "brokers": len(md.brokers)})


def configs(bootstrap, topic):
    res = ConfigResource(ResourceType.TOPIC, topic)
    a = admin(bootstrap)  # kept alive until the result is in
    got = a.describe_configs([res])[res].result(timeout=REQUEST_TIMEOUT_S)
    emit({name: entry.value for name, entry in got.items()})


def offsets(bootstrap, topic, partition, stamps):
    a = admin(bootstrap)
    tp = TopicPartition(topic, int(partition))

    def one(spec):
        r = a.list_offsets({tp: spec}, request_timeout=REQUEST_TIMEOUT_S)[tp]
        return r.result(timeout=REQUEST_TIMEOUT_S).offset

    emit({
        "earliest": one(OffsetSpec.earliest()),
        "latest": one(OffsetSpec.latest()),
        "times": [one(OffsetSpec.for_timestamp(int(t))) for t in stamps.split(",") if t],
    })


def group(bootstrap, pattern, group_id, max_records):
    want = int(max_records)
    c = Consumer(with_env({
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 1000,
        # A new topic matching the pattern would be found within this (none is expected).
        "topic.metadata.refresh.interval.ms": 2000,
    }))
    c.subscribe([pattern])
    got, commit = 0, {}
    for m in messages(c, lambda: f"consumed {got} of {want}") if want > 0 else ():
        if m.error():
            raise KafkaException(m.error())
        emit({"topic": m.topic(), "partition": m.partition(), "offset": m.offset()})
        commit[(m.topic(), m.partition())] = m.offset() + 1
        got += 1
        if got == want:
            break
    if commit:
        c.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in commit.items()],
                 asynchronous=False)
    assignment = sorted([tp.topic, tp.partition] for tp in c.assignment())
    a = admin(bootstrap)
    listed = a.list_consumer_groups(request_timeout=REQUEST_TIMEOUT_S).result(
        timeout=REQUEST_TIMEOUT_S)
    d = a.describe_consumer_groups([group_id], request_timeout=REQUEST_TIMEOUT_S)[group_id]
    d = d.result(timeout=REQUEST_TIMEOUT_S)
    emit({
        "assignment": assignment,
        "listed": sorted(g.group_id for g in listed.valid),
        "described": {
            "group_id": d.group_id,
            "state": str(d.state).split(".")[-1],
            "assignor": d.partition_assignor,
            "simple": d.is_simple_consumer_group,
            "coordinator": d.coordinator.id,
            "members": [sorted([tp.topic, tp.partition]
                               for tp in m.assignment.topic_partitions)
                        for m in d.members],
        },
    })
    c.close()


def produce(bootstrap, topic, partition, count, mode, seed):
    count, partition = int(count), int(partition)
    conf = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    outcomes = None
    if mode != "idempotent":
        outcomes = mode.split(",")
        conf["transactional.id"] = f"librdkafka-{topic}-{seed}"
    p = Producer(with_env(conf))
    delivered = {}

    def on_delivery(err, msg):
        if err is not None:
            raise SystemExit(f"delivery failed: {err}")
        delivered[msg.value().decode()] = msg.offset()

    def write(values):
        for v in values:
            p.produce(topic, value=v.encode(), key=b"k", partition=partition,
                      on_delivery=on_delivery)
        left = p.flush(REQUEST_TIMEOUT_S)
        if left:
            raise SystemExit(f"{left} records not delivered")

    if outcomes is None:
        values = [f"{seed}-{i}" for i in range(count)]
        write(values)
        emit({"outcome": "idempotent", "values": values,
              "offsets": [delivered[v] for v in values]})
        return
    p.init_transactions(REQUEST_TIMEOUT_S)
    for t, outcome in enumerate(outcomes):
        values = [f"{seed}-{t}-{i}" for i in range(count)]
        p.begin_transaction()
        write(values)
        if outcome == "commit":
            p.commit_transaction(REQUEST_TIMEOUT_S)
        elif outcome == "abort":
            p.abort_transaction(REQUEST_TIMEOUT_S)
        else:
            raise SystemExit(f"unknown outcome {outcome}")
        emit({"outcome": outcome, "values": values, "offsets": [delivered[v] for v in values]})


def produce_refused(bootstrap, topic, partition):
    p = Producer(with_env({"bootstrap.servers": bootstrap, "enable.idempotence": False,
                  "message.timeout.ms": 20000, "retries": 0}))
    result = {}

    def on_delivery(err, msg):
        result["err"] = err

    p.produce(topic, value=b"v", partition=int(partition), on_delivery=on_delivery)
    p.flush(REQUEST_TIMEOUT_S)
    err = result.get("err")
    if err is None:
        emit({"error": None})
    else:
        emit({"error": err.name(), "retriable": err.retriable(), "message": err.str()})


def connect_refused(bootstrap):
    errors = []
    a = AdminClient(with_env({"bootstrap.servers": bootstrap, "error_cb": errors.append}))
    deadline = time.time() + DEADLINE_S
    while True:
        told = [e for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN]
        if told:
            emit({"error": told[0].name(), "message": told[0].str()})
            return
        if time.time() > deadline:
            raise SystemExit(f"no error reported within {DEADLINE_S} s: {errors}")
        try:
            a.list_topics(timeout=1)
            raise SystemExit("Metadata was answered: the connection was not refused")
        except KafkaException:
            pass
        a.poll(0.2)


COMMANDS = {
    "consume": consume,
    "metadata": metadata,
    "configs": configs,
    "offsets": offsets,
    "group": group,
    "produce": produce,
    "produce-refused": produce_refused,
    "connect-refused": connect_refused,
}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
