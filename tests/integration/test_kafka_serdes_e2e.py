"""Kafka's number serdes on a real broker: a topic written as a Java application writes it
(Integer keys, Long values: big-endian two's complement, the bytes of Kafka's IntegerSerializer and
LongSerializer), a few records of the wrong size among them. A ``Worker`` counts and sums through a
repartition topic with Long keys and Long state, against the test driver over the same records:
stores byte for byte, each output key's counts in order, the wrong-sized records dead-lettered."""

import random
import struct
from collections import defaultdict

from processor import StreamsBuilder
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import by_key, driver_store_bytes, produce, task_store_bytes

STORES = ("count-by-mod", "sum-by-user")


def topology_for(t):
    b = StreamsBuilder()
    s = b.stream(t["in"], key_serde=Serdes.integer(), value_serde=Serdes.long())
    s.group_by(lambda user, amount: amount % 7, key_serde=Serdes.long()) \
        .count(name="count-by-mod", value_serde=Serdes.long()) \
        .to_stream().to(t["counts"], key_serde=Serdes.long(), value_serde=Serdes.long())
    s.group_by_key().aggregate(lambda: 0, lambda user, amount, total: total + amount, name="sum-by-user",
                               value_serde=Serdes.long())
    return b.build()


def test_java_longs_on_the_broker_equal_the_driver(kafka_bootstrap, unique, tmp_path):
    t = {n: f"ks-{n}-{unique}" for n in ("in", "counts")}
    kafka.create_topics(kafka_bootstrap, {t["in"]: 2, t["counts"]: 2})
    rnd = random.Random(34)
    records, bad = [], []
    for i in range(2000):
        key = struct.pack(">i", rnd.randrange(-20, 40))              # Java's IntegerSerializer
        if i % 250 == 17:                                             # an Integer where a Long belongs
            value = struct.pack(">i", i)
            bad.append((key, value))
        else:
            value = struct.pack(">q", rnd.randrange(-2 ** 40, 2 ** 40))   # Java's LongSerializer
        records.append((key, value))
    produce(kafka_bootstrap, t["in"], records)
    app = f"ks-{unique}"
    w = Worker(topology_for(t), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert w.records_processed >= 2000

    inputs = kafka.read_topic(kafka_bootstrap, t["in"])
    assert len({m.partition() for m in inputs}) == 2
    with TopologyTestDriver(topology_for(t), application_id=app) as d:
        for m in sorted(inputs, key=lambda m: m.timestamp()[1]):
            d.pipe_raw(t["in"], m.key(), m.value(), m.timestamp()[1])
        want_stores = driver_store_bytes(d, STORES)
    got_stores = task_store_bytes(sorted((tmp_path / app).glob("task-*")), STORES)
    for s in STORES:
        assert sorted(got_stores[s].items()) == sorted(want_stores[s].items()), s
    assert len(want_stores["count-by-mod"]) == 7 and len(want_stores["sum-by-user"]) == 60

    # counts per group key: 1, 2, ..., n as Java longs, n the number of good records in the group
    groups = defaultdict(int)
    for _k, v in records:
        if len(v) == 8:
            groups[struct.unpack(">q", v)[0] % 7] += 1
    got = by_key(kafka.read_topic(kafka_bootstrap, t["counts"]))
    assert {struct.unpack(">q", k)[0]: [v for v, _ in seq] for k, seq in got.items()} == \
        {g: [struct.pack(">q", c) for c in range(1, n + 1)] for g, n in groups.items()}
    # the stores hold Java's bytes: an 8-byte timestamp, then the long
    assert {k: struct.unpack(">q", v[8:])[0] for k, v in want_stores["count-by-mod"].items()} == \
        {struct.pack(">q", g): n for g, n in groups.items()}

    dead = kafka.read_topic(kafka_bootstrap, f"{app}-dlq")
    assert sorted((m.key(), m.value()) for m in dead) == sorted(bad) and len(bad) == 8
    assert all(dict(m.headers())["__streams.errors.message"].decode().endswith(
        "value deserialization with Serdes.long() failed: ValueError: long serde expects exactly 8 bytes "
        "(Kafka's LongDeserializer), got 4") for m in dead)
