"""Stock-client checks with kafka-python (from PyPI, pinned in .ci/run).

  consume  BOOTSTRAP TOPIC PARTITION MAX ISOLATION  -> one JSON line per record
  produce  BOOTSTRAP TOPIC PARTITION                -> one JSON line: the error class and message
  group    BOOTSTRAP TOPIC GROUP MAX                -> one JSON line per record consumed as a
           member of GROUP (subscribe: JoinGroup/SyncGroup/Heartbeat), then commits exactly the
           records it printed and leaves the group; exits 1 when it got fewer than MAX

Records are printed with key/value/header values in base64 so the Rust test can compare them
with what the Java consumer read from the source broker.
"""
import base64
import json
import sys
import time

import kafka
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata


def b64(b):
    return None if b is None else base64.b64encode(b).decode()


def consume(bootstrap, topic, partition, max_records, isolation):
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level=isolation,
        consumer_timeout_ms=1000,
    )
    tp = TopicPartition(topic, int(partition))
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    got = 0
    deadline = time.time() + 60
    while got < int(max_records) and time.time() < deadline:
        batches = consumer.poll(timeout_ms=500)
        for records in batches.values():
            for r in records:
                if got == int(max_records):
                    break
                print(json.dumps({
                    "offset": r.offset,
                    "timestamp": r.timestamp,
                    "key": b64(r.key),
                    "value": b64(r.value),
                    "headers": [[k, b64(v)] for k, v in r.headers],
                }))
                got += 1
    consumer.close()


def produce(bootstrap, topic, partition):
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, retries=0)
    future = producer.send(topic, key=b"k", value=b"v", partition=int(partition))
    try:
        meta = future.get(timeout=30)
        print(json.dumps({"error": None, "offset": meta.offset}))
    except Exception as e:  # the test checks which error the client raised
        print(json.dumps({"error": type(e).__name__, "message": str(e),
                          "retriable": bool(getattr(e, "retriable", False))}))
    producer.close(timeout=5)


def group(bootstrap, topic, group_id, max_records):
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=10000,
        heartbeat_interval_ms=1000,
    )
    consumer.subscribe([topic])
    want = int(max_records)
    got = 0
    commit = {}
    deadline = time.time() + 60
    while got < want and time.time() < deadline:
        batches = consumer.poll(timeout_ms=200)
        for tp, records in batches.items():
            for r in records:
                if got == want:
                    break
                print(json.dumps({"partition": r.partition, "offset": r.offset}))
                commit[tp] = OffsetAndMetadata(r.offset + 1, "", -1)
                got += 1
    if commit:
        consumer.commit(commit)
    consumer.close()
    if got < want:
        print(f"consumed {got} of {want}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    print(json.dumps({"kafka_python": kafka.__version__}), file=sys.stderr)
    {"consume": consume, "produce": produce, "group": group}[sys.argv[1]](*sys.argv[2:])
