"""Real Kafka clients against Rill's Kafka listener, driven by tests/kafka_protocol.rs.

Usage: python kafka_clients.py COMMAND BOOTSTRAP TOPIC [N]

  create            confluent-kafka AdminClient: create TOPIC (3 partitions)
  produce           confluent-kafka Producer (acks=all, idempotence on): N records
                    record(i) for i in 0..N, then flush; every delivery must succeed
  consume           confluent-kafka Consumer, assign() from the beginning: read N
                    records and check each against record(i)
  consume-committed the same with isolation.level=read_committed (Fetch isolation 1)
  consume-python    kafka-python KafkaConsumer, assign() from the beginning: read N
                    records and check each against record(i)
  consume-plain     kafka-python: read N records, print "key\\tvalue" per line (for
                    records written by `rill produce`)
  commit            confluent-kafka: commit offset N+p for each partition p of TOPIC
                    in group "commit-<TOPIC>" (assign, no subscription), then read
                    them back with a new consumer's committed()
  admin             confluent-kafka AdminClient: describe_cluster, describe_configs
                    of TOPIC (retention.ms and cleanup.policy present),
                    incremental_alter_configs (SET, APPEND; a bad value refused
                    naming its key), alter_configs (replaces the overrides) and
                    create_partitions (3 -> 5; shrinking refused)
  group-resume      kafka-python, group "resume-<TOPIC>" (subscribe, range assignor):
                    read about half of N records, commit, close; a new consumer of
                    the group resumes from the commits and reads the rest: every
                    record exactly once
  produce-failover  confluent-kafka Producer (acks=all, idempotence on): first prints
                    "brokers <id>=<host>:<port> ..." from the cluster's metadata,
                    then N records key "fo-<i>", value "fo-<i>" in chunks of 100,
                    flushing each and printing "acked <count>" (the test kills the
                    partition's leader meanwhile); every delivery must succeed
  tls-acl           TLS listener with client certificates (env RILL_CA, ALICE_CERT,
                    ALICE_KEY, BOB_CERT, BOB_KEY; TOPIC and TOPIC-secret exist,
                    alice may write and read TOPIC only, bob nothing): alice
                    produces N records idempotently and reads them back; alice's
                    write to TOPIC-secret and bob's to TOPIC are refused with
                    TOPIC_AUTHORIZATION_FAILED; a client without a certificate
                    gets no metadata
  sasl-acl          SASL_SSL (env RILL_CA, ALICE_PASSWORD, BOB_PASSWORD; alice may
                    write and read TOPIC and read group "sasl-TOPIC", bob nothing):
                    alice produces N records with SCRAM-SHA-256 (idempotent), one
                    with SCRAM-SHA-512 and one with PLAIN, and reads all back; bob's
                    write is refused with TOPIC_AUTHORIZATION_FAILED; a wrong
                    password gets no metadata
  sasl-login        SASL_SSL SCRAM-SHA-256 as SASL_USER/SASL_PASSWORD (env): prints
                    "login ok" or "login failed: <error>"
  group-848         confluent-kafka with group.protocol=consumer (KIP-848, the broker
                    assigns), group "kip848-<TOPIC>", TOPIC with 6 partitions: two
                    consumers get three partitions each, `rill group describe` and
                    the AdminClient show both; one closes, the other gets all six,
                    reads all N records to the end of every partition and commits
  group-rebalance   confluent-kafka, group "rebalance-<TOPIC>" (cooperative-sticky),
                    TOPIC with 6 partitions: three consumers get two partitions
                    each, `rill group describe` (RILL_BIN, RILL_BOOTSTRAP,
                    RILL_HOME) and the AdminClient show the three members; one
                    closes, the other two get three each; all N records are read
                    and the two commit
  transactions      confluent-kafka transactional producer (transactional.id
                    "txn-<TOPIC>"): N records aborted, then N committed; a second
                    producer with the same id fences the first (its commit fails
                    as fenced); the group offset sent with the committed
                    transaction (send_offsets_to_transaction) is committed, the
                    aborted one's is not; a read_committed consumer reads exactly the N
                    committed records, a read_uncommitted one all 2N (and the
                    fenced producer's, if any reached the log)

record(i): key b"key-<i>", value b"value-<i>" (every 97th a tombstone: None),
headers [("i", b"<i>"), ("bin", b"\\x00\\xff")], timestamp BASE_MS + i.
Exits non-zero with a message on the first mismatch.
"""

import sys
import time

BASE_MS = 1_700_000_000_000
PARTITIONS = 3
DEADLINE_S = 90


def record(i):
    value = None if i % 97 == 0 else b"value-%d" % i
    return b"key-%d" % i, value, [("i", b"%d" % i), ("bin", b"\x00\xff")], BASE_MS + i


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def create(bootstrap, topic):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    for name, f in futures.items():
        f.result(timeout=30)
    md = admin.list_topics(topic, timeout=30)
    parts = md.topics[topic].partitions
    if len(parts) != PARTITIONS:
        fail("topic %s has %d partitions, expected %d" % (topic, len(parts), PARTITIONS))
    print("created %s" % topic)


def produce(bootstrap, topic, n):
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    errors = []
    delivered = [0]

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            delivered[0] += 1

    for i in range(n):
        key, value, headers, ts = record(i)
        while True:
            try:
                p.produce(topic, key=key, value=value, headers=headers, timestamp=ts, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    left = p.flush(DEADLINE_S)
    if left:
        fail("%d records not delivered within %ds" % (left, DEADLINE_S))
    if errors:
        fail("delivery errors: %s" % errors[:5])
    if delivered[0] != n:
        fail("delivered %d of %d" % (delivered[0], n))
    print("produced %d" % n)


def produce_failover(bootstrap, topic, n):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    brokers = sorted(md.brokers.values(), key=lambda b: b.id)
    print("brokers " + " ".join("%d=%s:%d" % (b.id, b.host, b.port) for b in brokers), flush=True)
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 60000,
        }
    )
    errors = []
    delivered = [0]

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            delivered[0] += 1

    for start in range(0, n, 100):
        for i in range(start, min(start + 100, n)):
            v = b"fo-%d" % i
            p.produce(topic, key=v, value=v, on_delivery=on_delivery)
        left = p.flush(DEADLINE_S)
        if left:
            fail("%d records not delivered within %ds" % (left, DEADLINE_S))
        if errors:
            fail("delivery errors: %s" % errors[:5])
        print("acked %d" % delivered[0], flush=True)
        time.sleep(0.05)
    if delivered[0] != n:
        fail("delivered %d of %d" % (delivered[0], n))
    print("produced %d" % n, flush=True)


def tls_config(bootstrap, who):
    import os

    c = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "ssl",
        "ssl.ca.location": os.environ["RILL_CA"],
        "broker.address.family": "v4",
    }
    if who is not None:
        c["ssl.certificate.location"] = os.environ[who + "_CERT"]
        c["ssl.key.location"] = os.environ[who + "_KEY"]
    return c


def produce_as(config, topic, n):
    """Produces n records; the delivery errors (empty when all were delivered)."""
    from confluent_kafka import Producer

    p = Producer(dict(config, **{"acks": "all", "message.timeout.ms": 20000}))
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)

    for i in range(n):
        v = b"tls-%d" % i
        p.produce(topic, key=v, value=v, on_delivery=on_delivery)
    left = p.flush(DEADLINE_S)
    if left:
        fail("%d records to %s neither delivered nor failed within %ds" % (left, topic, DEADLINE_S))
    return errors


def expect_denied(errors, who, topic):
    from confluent_kafka import KafkaError

    if not errors:
        fail("%s's write to %s was accepted" % (who, topic))
    codes = set(e.code() for e in errors)
    if codes != {KafkaError.TOPIC_AUTHORIZATION_FAILED}:
        fail("%s's write to %s failed with %s, expected TOPIC_AUTHORIZATION_FAILED" % (who, topic, errors[:3]))
    print("%s denied %s: %s" % (who, topic, errors[0].name()), flush=True)


def tls_acl(bootstrap, topic, n):
    from confluent_kafka import Consumer, KafkaException, TopicPartition, OFFSET_BEGINNING
    from confluent_kafka.admin import AdminClient

    alice = tls_config(bootstrap, "ALICE")
    errors = produce_as(dict(alice, **{"enable.idempotence": True}), topic, n)
    if errors:
        fail("alice's writes to %s failed: %s" % (topic, errors[:3]))
    print("alice produced %d" % n, flush=True)
    expect_denied(produce_as(alice, topic + "-secret", 1), "alice", topic + "-secret")
    expect_denied(produce_as(tls_config(bootstrap, "BOB"), topic, 1), "bob", topic)

    try:
        AdminClient(tls_config(bootstrap, None)).list_topics(timeout=5)
        fail("a client without a certificate got metadata")
    except KafkaException as e:
        print("no certificate refused: %s" % e.args[0].name(), flush=True)

    c = Consumer(dict(alice, **{"group.id": "tls-" + topic, "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen = set()
    deadline = time.time() + DEADLINE_S
    while len(seen) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            fail("alice's read of %s: %s" % (topic, m.error()))
        seen.add(m.value())
    c.close()
    if seen != set(b"tls-%d" % i for i in range(n)):
        fail("alice read %d distinct records of %d" % (len(seen), n))
    print("alice read %d" % len(seen), flush=True)


def sasl_config(bootstrap, mechanism, user, password):
    import os

    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "sasl_ssl",
        "ssl.ca.location": os.environ["RILL_CA"],
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
        "broker.address.family": "v4",
    }


def sasl_acl(bootstrap, topic, n):
    import os
    from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING, KafkaException
    from confluent_kafka.admin import AdminClient

    alice_pw = os.environ["ALICE_PASSWORD"]
    alice = sasl_config(bootstrap, "SCRAM-SHA-256", "alice", alice_pw)
    errors = produce_as(dict(alice, **{"enable.idempotence": True}), topic, n)
    if errors:
        fail("alice's SCRAM-SHA-256 writes failed: %s" % errors[:3])
    print("alice SCRAM-SHA-256 produced %d" % n, flush=True)
    for mechanism in ["SCRAM-SHA-512", "PLAIN"]:
        errors = produce_as(sasl_config(bootstrap, mechanism, "alice", alice_pw), topic, 1)
        if errors:
            fail("alice's %s write failed: %s" % (mechanism, errors[:3]))
        print("alice %s produced 1" % mechanism, flush=True)
    bob = sasl_config(bootstrap, "SCRAM-SHA-256", "bob", os.environ["BOB_PASSWORD"])
    expect_denied(produce_as(bob, topic, 1), "bob", topic)
    try:
        AdminClient(sasl_config(bootstrap, "SCRAM-SHA-256", "alice", alice_pw + "x")).list_topics(timeout=5)
        fail("a wrong password got metadata")
    except KafkaException as e:
        print("wrong password refused: %s" % e.args[0].name(), flush=True)

    c = Consumer(dict(alice, **{"group.id": "sasl-" + topic, "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    count = 0
    deadline = time.time() + DEADLINE_S
    while count < n + 2 and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            fail("alice's read of %s: %s" % (topic, m.error()))
        count += 1
    c.close()
    if count != n + 2:
        fail("alice read %d records of %d" % (count, n + 2))
    print("alice read %d" % count, flush=True)


def sasl_login(bootstrap):
    import os
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config = sasl_config(bootstrap, "SCRAM-SHA-256", os.environ["SASL_USER"], os.environ["SASL_PASSWORD"])
    try:
        AdminClient(config).list_topics(timeout=5)
        print("login ok", flush=True)
    except KafkaException as e:
        print("login failed: %s" % e.args[0].name(), flush=True)


def check(seen, i, key, value, headers, ts):
    ekey, evalue, eheaders, ets = record(i)
    if key != ekey or value != evalue:
        fail("record %d: key/value %r/%r, expected %r/%r" % (i, key, value, ekey, evalue))
    if headers != eheaders:
        fail("record %d: headers %r, expected %r" % (i, headers, eheaders))
    if ts != ets:
        fail("record %d: timestamp %r, expected %r" % (i, ts, ets))
    if i in seen:
        fail("record %d read twice" % i)
    seen.add(i)


def index_of(key):
    if key is None or not key.startswith(b"key-"):
        fail("unexpected key %r" % (key,))
    return int(key[4:])


def consume(bootstrap, topic, n, isolation="read_uncommitted"):
    from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kafka-clients-test",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen = set()
    last = {}
    deadline = time.time() + DEADLINE_S
    while len(seen) < n and time.time() < deadline:
        for msg in c.consume(num_messages=1000, timeout=1.0):
            if msg.error():
                fail("consume error: %s" % msg.error())
            p, off = msg.partition(), msg.offset()
            if last.get(p, -1) >= off:
                fail("partition %d: offset %d after %d" % (p, off, last[p]))
            last[p] = off
            ts_type, ts = msg.timestamp()
            headers = [(k, v) for k, v in (msg.headers() or [])]
            check(seen, index_of(msg.key()), msg.key(), msg.value(), headers, ts)
    c.close()
    if len(seen) != n:
        fail("read %d of %d records" % (len(seen), n))
    print("consumed %d" % n)


def python_consumer(bootstrap, topic):
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    c.assign(parts)
    c.seek_to_beginning(*parts)
    return c


def consume_python(bootstrap, topic, n):
    c = python_consumer(bootstrap, topic)
    seen = set()
    deadline = time.time() + DEADLINE_S
    while len(seen) < n and time.time() < deadline:
        for tp, msgs in c.poll(timeout_ms=1000).items():
            for msg in msgs:
                headers = [(k, v) for k, v in msg.headers]
                check(seen, index_of(msg.key), msg.key, msg.value, headers, msg.timestamp)
    c.close()
    if len(seen) != n:
        fail("read %d of %d records" % (len(seen), n))
    print("consumed %d" % n)


def consume_plain(bootstrap, topic, n):
    c = python_consumer(bootstrap, topic)
    out = []
    deadline = time.time() + DEADLINE_S
    while len(out) < n and time.time() < deadline:
        for tp, msgs in c.poll(timeout_ms=1000).items():
            for msg in msgs:
                out.append("%s\t%s" % ((msg.key or b"").decode(), (msg.value or b"").decode()))
    c.close()
    if len(out) != n:
        fail("read %d of %d records" % (len(out), n))
    for line in out:
        print(line)


def commit(bootstrap, topic, n):
    from confluent_kafka import Consumer, TopicPartition

    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": "commit-" + topic,
        "enable.auto.commit": False,
    }
    c = Consumer(conf)
    wanted = [TopicPartition(topic, p, n + p) for p in range(PARTITIONS)]
    c.assign(wanted)
    c.commit(offsets=wanted, asynchronous=False)
    c.close()
    c = Consumer(conf)
    got = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    c.close()
    for tp in got:
        if tp.error is not None or tp.offset != n + tp.partition:
            fail("committed offset of %s-%d: %r (error %r), expected %d" % (topic, tp.partition, tp.offset, tp.error, n + tp.partition))
    print("committed %d" % len(got))


def admin(bootstrap, topic):
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    a = AdminClient({"bootstrap.servers": bootstrap})
    cluster = a.describe_cluster(request_timeout=30).result(timeout=30)
    if len(cluster.nodes) != 1 or cluster.controller is None:
        fail("describe_cluster: %r" % cluster)
    host, port = bootstrap.rsplit(":", 1)
    node = cluster.nodes[0]
    if node.host != host or node.port != int(port):
        fail("describe_cluster names %s:%s, expected %s" % (node.host, node.port, bootstrap))
    res = ConfigResource(ResourceType.TOPIC, topic)
    configs = a.describe_configs([res])[res].result(timeout=30)
    for key in ("retention.ms", "cleanup.policy"):
        if key not in configs:
            fail("describe_configs of %s lacks %s: %s" % (topic, key, sorted(configs)))
    # IncrementalAlterConfigs: SET one key, APPEND to a list; then the older
    # AlterConfigs, which replaces every key set on the topic.
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    res = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        ],
    )
    a.incremental_alter_configs([res])[res].result(timeout=30)
    res = ConfigResource(ResourceType.TOPIC, topic)
    configs = a.describe_configs([res])[res].result(timeout=30)
    if configs["retention.ms"].value != "3600000":
        fail("retention.ms after SET: %r" % configs["retention.ms"].value)
    if sorted(configs["cleanup.policy"].value.split(",")) != ["compact", "delete"]:
        fail("cleanup.policy after APPEND compact: %r" % configs["cleanup.policy"].value)
    bad = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)],
    )
    try:
        a.incremental_alter_configs([bad])[bad].result(timeout=30)
        fail("retention.ms=soon was accepted")
    except Exception as e:
        if "retention.ms" not in str(e):
            fail("the refusal of retention.ms=soon does not name the key: %s" % e)
    res = ConfigResource(ResourceType.TOPIC, topic, set_config={"segment.ms": "600000"})
    a.alter_configs([res])[res].result(timeout=30)
    res = ConfigResource(ResourceType.TOPIC, topic)
    configs = a.describe_configs([res])[res].result(timeout=30)
    if configs["segment.ms"].value != "600000" or configs["retention.ms"].value == "3600000":
        fail("after AlterConfigs: segment.ms %r, retention.ms %r" % (configs["segment.ms"].value, configs["retention.ms"].value))
    from confluent_kafka.admin import NewPartitions

    a.create_partitions([NewPartitions(topic, PARTITIONS + 2)])[topic].result(timeout=30)
    try:
        a.create_partitions([NewPartitions(topic, PARTITIONS)])[topic].result(timeout=30)
        fail("shrinking %s to %d partitions was accepted" % (topic, PARTITIONS))
    except Exception as e:
        if "can only grow" not in str(e):
            fail("the refusal to shrink does not say why: %s" % e)
    parts = a.list_topics(topic, timeout=30).topics[topic].partitions
    if len(parts) != PARTITIONS + 2:
        fail("after CreatePartitions %s has %d partitions" % (topic, len(parts)))
    print("admin ok: cluster %s, %d configs, %d partitions" % (cluster.cluster_id, len(configs), len(parts)))


def group_resume(bootstrap, topic, n):
    from kafka import KafkaConsumer

    def consumer():
        return KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id="resume-" + topic,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=10000,
            heartbeat_interval_ms=1000,
        )

    def read(c, until, seen):
        deadline = time.time() + DEADLINE_S
        while len(seen) < until and time.time() < deadline:
            for tp, msgs in c.poll(timeout_ms=1000).items():
                for msg in msgs:
                    i = index_of(msg.key)
                    if i in seen:
                        fail("record %d read twice (offset %s-%d@%d)" % (i, tp.topic, tp.partition, msg.offset))
                    seen.add(i)

    seen = set()
    c = consumer()
    read(c, n // 2, seen)
    first = len(seen)
    if first < n // 2:
        fail("the first consumer read %d records, expected at least %d" % (first, n // 2))
    c.commit()
    c.close()
    c = consumer()
    read(c, n, seen)
    c.close()
    if len(seen) != n:
        fail("read %d of %d records across the restart" % (len(seen), n))
    print("resumed %d+%d" % (first, len(seen) - first))


def group_poll(cs, seen):
    """One round of consume() on each consumer; record indexes go into seen."""
    from confluent_kafka import KafkaError

    for c in cs:
        for msg in c.consume(num_messages=500, timeout=0.1):
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                fail("consume error: %s" % msg.error())
            seen.add(index_of(msg.key()))


def group_settle(cs, per, seen):
    """Polls until each consumer owns `per` of the six partitions; their lists."""
    deadline = time.time() + DEADLINE_S
    while time.time() < deadline:
        group_poll(cs, seen)
        owned = [sorted(tp.partition for tp in c.assignment()) for c in cs]
        every = sorted(p for ps in owned for p in ps)
        if all(len(ps) == per for ps in owned) and every == list(range(6)):
            return owned
    fail("the group did not settle on %d partitions each: %r" % (per, [c.assignment() for c in cs]))


def group_described(bootstrap, group, consumers, marker):
    """`rill group describe` and the AdminClient show every member (and marker)."""
    import os
    import subprocess
    from confluent_kafka.admin import AdminClient

    ids = [c.memberid() for c in consumers]
    env = dict(os.environ)
    out = subprocess.run(
        [env["RILL_BIN"], "group", "describe", group], capture_output=True, text=True, timeout=60, env=env
    )
    if out.returncode != 0:
        fail("rill group describe %s failed: %s" % (group, out.stderr))
    for member in ids:
        if not member or member not in out.stdout:
            fail("rill group describe %s does not show member %r:\n%s" % (group, member, out.stdout))
    if marker not in out.stdout or "Members: %d" % len(ids) not in out.stdout:
        fail("rill group describe %s:\n%s" % (group, out.stdout))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group])[group].result(timeout=30)
    if len(desc.members) != len(ids):
        fail("describe_consumer_groups shows %d members" % len(desc.members))
    assigned = sorted(tp.partition for m in desc.members for tp in m.assignment.topic_partitions)
    if assigned != list(range(6)):
        fail("describe_consumer_groups assignments: %r" % assigned)


def group_finish(cs, seen, n):
    """Reads all n records, then on to the end of every partition (a partition
    that moved is read again from its last commit), and commits: the committed
    offsets are the log ends."""
    deadline = time.time() + DEADLINE_S
    while len(seen) < n and time.time() < deadline:
        group_poll(cs, seen)
    if len(seen) != n:
        fail("the group read %d of %d records" % (len(seen), n))

    def at_end(c):
        for tp in c.position(c.assignment()):
            low, high = c.get_watermark_offsets(tp, timeout=10, cached=False)
            if tp.offset < high:
                return False
        return True

    while not all(at_end(c) for c in cs):
        if time.time() > deadline:
            fail("the group did not reach the end of every partition")
        group_poll(cs, seen)
    for c in cs:
        c.commit(asynchronous=False)
    for c in cs:
        c.close()


def group_rebalance(bootstrap, topic, n):
    from confluent_kafka import Consumer

    group = "rebalance-" + topic
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "partition.assignment.strategy": "cooperative-sticky",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 500,
    }
    consumers = [Consumer(dict(conf, **{"client.id": "member-%d" % k})) for k in range(3)]
    for c in consumers:
        c.subscribe([topic])
    seen = set()
    owned = group_settle(consumers, 2, seen)
    print("three members: %r" % owned)
    group_described(bootstrap, group, consumers, "cooperative-sticky")
    consumers[2].close()
    rest = consumers[:2]
    owned = group_settle(rest, 3, seen)
    print("two members: %r" % owned)
    group_finish(rest, seen, n)
    print("rebalanced: read %d" % len(seen))


def group_848(bootstrap, topic, n):
    from confluent_kafka import Consumer

    group = "kip848-" + topic
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    consumers = [Consumer(dict(conf, **{"client.id": "kip848-%d" % k})) for k in range(2)]
    for c in consumers:
        c.subscribe([topic])
    seen = set()
    owned = group_settle(consumers, 3, seen)
    print("two members: %r" % owned, flush=True)
    group_described(bootstrap, group, consumers, "uniform")
    consumers[1].close()
    rest = consumers[:1]
    owned = group_settle(rest, 6, seen)
    print("one member: %r" % owned, flush=True)
    group_finish(rest, seen, n)
    print("kip848: read %d" % len(seen), flush=True)


def read_all(bootstrap, topic, isolation):
    """Every value of TOPIC from the beginning to its end as ISOLATION sees it."""
    from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "txn-reader",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    values = []
    at_end = set()
    deadline = time.time() + DEADLINE_S
    while len(at_end) < PARTITIONS and time.time() < deadline:
        for msg in c.consume(num_messages=1000, timeout=1.0):
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    at_end.add(msg.partition())
                    continue
                fail("consume error: %s" % msg.error())
            values.append(msg.value().decode())
    c.close()
    if len(at_end) < PARTITIONS:
        fail("%s: reached the end of %d of %d partitions" % (isolation, len(at_end), PARTITIONS))
    return values


def transactions(bootstrap, topic, n):
    from confluent_kafka import Consumer, Producer, KafkaException, TopicPartition

    def producer():
        return Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": "txn-" + topic,
                "transaction.timeout.ms": 60000,
                "linger.ms": 5,
            }
        )

    # The group whose offsets the transactions commit (consume-transform-produce).
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": "eos-" + topic})
    meta = group.consumer_group_metadata()
    p = producer()
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"aborted-%d" % i)
    p.flush(30)
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], meta, 30)
    p.abort_transaction(30)
    # librdkafka's consumers are read_committed by default: their OffsetFetch
    # asks require_stable (KIP-447), so a partition whose offsets an open
    # transaction holds answers UNSTABLE_OFFSET_COMMIT, retried until it ends.
    # The aborted transaction's pending offsets are gone: answered at once.
    started = time.monotonic()
    got = group.committed([TopicPartition(topic, 0)], 10)[0]
    if got.error is not None or got.offset >= 0:
        fail("after the abort, committed() answered %s / offset %d, expected no offset" % (got.error, got.offset))
    if time.monotonic() - started > 5:
        fail("after the abort, committed() took %.1f s: the aborted offsets stayed pending" % (time.monotonic() - started))
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"committed-%d" % i)
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], meta, 30)
    # A second call of the same transaction for another partition: the first
    # partition's offset stays pending too.
    p.send_offsets_to_transaction([TopicPartition(topic, 1, 3)], meta, 30)
    # Open: a read_committed consumer gets no offset for the partition (it
    # retries UNSTABLE_OFFSET_COMMIT until its timeout); a read_uncommitted
    # one gets the committed offset, none yet.
    unstable = None
    try:
        got = group.committed([TopicPartition(topic, 0)], 3)[0]
        if got.error is None:
            fail("committed() answered offset %d while an open transaction held the partition's offset" % got.offset)
        unstable = got.error
    except KafkaException as e:
        unstable = e.args[0]
    loose = Consumer({"bootstrap.servers": bootstrap, "group.id": "eos-" + topic, "isolation.level": "read_uncommitted"})
    got = loose.committed([TopicPartition(topic, 0)], 10)[0]
    loose.close()
    if got.error is not None or got.offset >= 0:
        fail("read_uncommitted committed() answered %s / offset %d during the transaction, expected no offset" % (got.error, got.offset))
    p.commit_transaction(30)
    committed = [tp.offset for tp in group.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], 30)]
    if committed != [7, 3]:
        fail("the committed transaction's group offsets are %s, expected [7, 3]" % committed)
    group.close()
    print("during the transaction, read_committed committed(): %s" % unstable)

    # A second instance with the same transactional id fences the first.
    second = producer()
    second.init_transactions(30)
    fenced = None
    try:
        p.begin_transaction()
        p.produce(topic, key=b"z", value=b"zombie")
        p.commit_transaction(30)
    except KafkaException as e:
        fenced = e.args[0]
    if fenced is None:
        fail("the fenced producer's commit succeeded")
    if not fenced.fatal() and "fenc" not in fenced.str().lower():
        fail("the fenced producer's error is not fatal: %s" % fenced)
    second.begin_transaction()
    second.produce(topic, key=b"s", value=b"second")
    second.commit_transaction(30)

    committed = sorted(read_all(bootstrap, topic, "read_committed"))
    want = sorted(["committed-%d" % i for i in range(n)] + ["second"])
    if committed != want:
        fail("read_committed read %d records, expected %d: %s" % (len(committed), len(want), committed[:10]))
    everything = read_all(bootstrap, topic, "read_uncommitted")
    if len([v for v in everything if v.startswith("aborted-")]) != n:
        fail("read_uncommitted did not see the %d aborted records" % n)
    print("transactions ok: fenced with %s" % fenced.name())


def main():
    if len(sys.argv) < 4:
        fail(__doc__)
    command, bootstrap, topic = sys.argv[1:4]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    if command == "create":
        create(bootstrap, topic)
    elif command == "produce":
        produce(bootstrap, topic, n)
    elif command == "consume":
        consume(bootstrap, topic, n)
    elif command == "consume-committed":
        # read_committed: Fetch isolation_level 1, up to the last stable offset.
        consume(bootstrap, topic, n, "read_committed")
    elif command == "consume-python":
        consume_python(bootstrap, topic, n)
    elif command == "consume-plain":
        consume_plain(bootstrap, topic, n)
    elif command == "commit":
        commit(bootstrap, topic, n)
    elif command == "admin":
        admin(bootstrap, topic)
    elif command == "group-resume":
        group_resume(bootstrap, topic, n)
    elif command == "produce-failover":
        produce_failover(bootstrap, topic, n)
    elif command == "tls-acl":
        tls_acl(bootstrap, topic, n)
    elif command == "sasl-acl":
        sasl_acl(bootstrap, topic, n)
    elif command == "sasl-login":
        sasl_login(bootstrap)
    elif command == "group-848":
        group_848(bootstrap, topic, n)
    elif command == "group-rebalance":
        group_rebalance(bootstrap, topic, n)
    elif command == "transactions":
        transactions(bootstrap, topic, n)
    else:
        fail("unknown command %r" % command)


if __name__ == "__main__":
    main()
