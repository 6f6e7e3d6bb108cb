"""Throughput and end-to-end latency of a real Kafka client (confluent-kafka,
librdkafka's batching producer) through a Kafka listener (Rill's, or any
Kafka-compatible broker's); driven by tests/scale/kafka_vs_quic.sh and
tests/scale/kafka_vs_tansu.sh.

Usage: python kafka_bench.py produce BOOTSTRAP TOPIC N SIZE
       python kafka_bench.py consume BOOTSTRAP TOPIC N
       python kafka_bench.py latency BOOTSTRAP TOPIC [RATE [SECONDS [SIZE [LINGER_MS [FETCH_WAIT_MS]]]]]

produce: N records of SIZE bytes (no key), acks=1, linger.ms=5, batch.size
65536 (as `rill bench produce`'s defaults), no compression; the time from the
first produce() to the end of flush().
consume: N records from the beginning of every partition (assign); the time
from the first poll to the N-th record.
latency: one producer (its own process) offers RATE records/s (default 1000)
for SECONDS (default 10), SIZE-byte values (default 100) whose first 8 bytes
are the send time (time.monotonic_ns() just before produce(); CLOCK_MONOTONIC is
one clock for every process on Linux), acks=1, linger.ms=LINGER_MS (default 0),
socket.nagle.disable; one consumer (this process) assigned every partition at
its high watermark before the producer starts, fetch.wait.max.ms=FETCH_WAIT_MS
(default 10), stamps each record with the time poll() returned it. A few
warm-up records (send time 0) go first so that connection set-up is not timed;
they are not counted. Prints p50/p99/p99.9/max of send-to-receive in ms.
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


WARMUP = 10


def _paced_producer(bootstrap, topic, rate, seconds, size, linger_ms, go):
    """The latency mode's producer, run in a process of its own."""
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": 1,
            "linger.ms": linger_ms,
            "socket.nagle.disable": True,
            "enable.idempotence": False,
        }
    )
    errors = [0]

    def on_delivery(err, msg):
        if err is not None:
            errors[0] += 1

    go.wait()
    # Warm-up: connections and metadata, not timed (send time 0).
    for _ in range(WARMUP):
        p.produce(topic, value=bytes(size), on_delivery=on_delivery)
    p.flush(30)
    time.sleep(0.5)
    n = rate * seconds
    filler = b"x" * (size - 8)
    start = time.monotonic_ns()
    for k in range(n):
        due = start + k * 1_000_000_000 // rate
        while True:
            now = time.monotonic_ns()
            if now >= due:
                break
            p.poll(0)
            left = due - now
            if left > 200_000:
                time.sleep((left - 100_000) / 1e9)
        p.produce(topic, value=time.monotonic_ns().to_bytes(8, "big") + filler, on_delivery=on_delivery)
        p.poll(0)
    p.flush(60)
    if errors[0]:
        sys.exit("%d delivery errors" % errors[0])


def latency(bootstrap, topic, rate=1000, seconds=10, size=100, linger_ms=0, fetch_wait_ms=10):
    import multiprocessing

    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    if size < 8:
        sys.exit("SIZE must be at least 8 (the send time travels in the record)")
    parts = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30).topics[topic].partitions
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-latency",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": fetch_wait_ms,
            "socket.nagle.disable": True,
        }
    )
    tps = []
    for p in parts:
        _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        tps.append(TopicPartition(topic, p, high))
    c.assign(tps)
    c.poll(0.5)  # start the fetchers before the producer
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    producer = ctx.Process(target=_paced_producer, args=(bootstrap, topic, rate, seconds, size, linger_ms, go))
    producer.start()
    go.set()
    n = rate * seconds
    lat = []
    warm = 0
    idle_since = time.monotonic()
    while len(lat) < n:
        # poll(), not consume(num_messages=K): consume() waits for K records or
        # its timeout, which would be timed as latency.
        m = c.poll(0.1)
        now = time.monotonic_ns()
        if m is None:
            if not producer.is_alive() and time.monotonic() - idle_since > 5:
                break
            continue
        idle_since = time.monotonic()
        if m.error():
            continue
        sent = int.from_bytes(m.value()[:8], "big")
        if sent == 0:
            warm += 1
            continue
        lat.append((now - sent) / 1e6)
    producer.join(60)
    c.close()
    if producer.exitcode != 0:
        sys.exit("the producer failed (exit code %s)" % producer.exitcode)
    if len(lat) < n:
        sys.exit("received %d of %d records" % (len(lat), n))
    lat.sort()

    def pct(q):
        return lat[min(len(lat) - 1, int(q * len(lat)))]

    print(
        "latency: %d records at %d records/s, %d B, linger.ms=%d, fetch.wait.max.ms=%d: "
        "p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.2f ms"
        % (len(lat), rate, size, linger_ms, fetch_wait_ms, pct(0.5), pct(0.99), pct(0.999), lat[-1])
    )


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1] == "latency":
        latency(sys.argv[2], sys.argv[3], *[int(a) for a in sys.argv[4:9]])
    else:
        consume(sys.argv[2], sys.argv[3], int(sys.argv[4]))
