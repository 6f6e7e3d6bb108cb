"""Throughput of a real Kafka client (confluent-kafka, librdkafka's batching
producer) through Rill's Kafka listener; driven by tests/scale/kafka_vs_quic.sh.

Usage: python kafka_bench.py produce BOOTSTRAP TOPIC N SIZE
       python kafka_bench.py consume BOOTSTRAP TOPIC N

produce: N records of SIZE bytes (no key), acks=1, linger.ms=5, batch.size
65536 (as `rill bench produce`'s defaults), no compression; the time from the
first produce() to the end of flush().
consume: N records from the beginning of every partition (assign); the time
from the first poll to the N-th record.
"""

import sys
import time


def produce(bootstrap, topic, n, size):
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": 1,
            "linger.ms": 5,
            "batch.size": 65536,
            "queue.buffering.max.messages": 1000000,
            "queue.buffering.max.kbytes": 1048576,
            "enable.idempotence": False,
        }
    )
    value = b"x" * size
    errors = [0]

    def on_delivery(err, msg):
        if err is not None:
            errors[0] += 1

    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(120)
    took = time.perf_counter() - start
    if errors[0]:
        sys.exit("%d delivery errors" % errors[0])
    print("produce: %d records in %.2f s: %.0f records/s, %.1f MB/s" % (n, took, n / took, n * size / took / 1e6))


def consume(bootstrap, topic, n):
    from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
    from confluent_kafka.admin import AdminClient

    parts = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30).topics[topic].partitions
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    count = 0
    size = 0
    start = None
    while count < n:
        for m in c.consume(num_messages=10000, timeout=1.0):
            if m.error():
                continue
            if start is None:
                start = time.perf_counter()
            count += 1
            size += len(m.value())
    took = time.perf_counter() - start
    c.close()
    print("consume: %d records in %.2f s: %.0f records/s, %.1f MB/s" % (count, took, count / took, size / took / 1e6))


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        consume(sys.argv[2], sys.argv[3], int(sys.argv[4]))
