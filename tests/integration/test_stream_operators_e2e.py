"""The stateless stream operators (issue 29) on a real broker: a ``Worker`` over 4,000 records on
3 partitions, produced by confluent-kafka's default partitioner (CRC32) and by Java's murmur2,
against the test driver over the same records.

- Outputs (flat_map_values, split branches, a topic extractor, repartition(partitions=2)): per
  key, exactly the driver's sequence (value bytes and timestamps), as lists.
- A topic extractor naming a topic that does not exist: those records are dead-lettered with
  the reason (never a created topic), exactly the ones the driver (told which topics exist)
  dead-letters; all or nothing: such a record's outputs on other branches are not sent either.
- Stores behind a key change (map -> group_by_key().count(), select_key -> to_table): the
  worker went through repartition topics; every key's records come from one input partition,
  so its stores equal, byte for byte, the driver's over the whole input."""

import json
import random
from collections import defaultdict

import pytest

from processor import StreamsBuilder
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import by_key, driver_store_bytes, produce, produce_with_partitioner, task_store_bytes

STORES = ("by-upper", "by-upper.emitted", "last")


def topology_for(t):
    b = StreamsBuilder()
    s = b.stream(t["in"])
    s.map(lambda k, v: (k.upper(), {"x": v["x"]})).group_by_key().count(name="by-upper")
    s.select_key(lambda k, v: k + "!").to_table(name="last")
    s.flat_map_values(lambda v: [v["x"]] * (v["x"] % 3)).to(t["fmv"])
    br = s.split(name="b-").branch(lambda k, v: v["x"] < 15, name="low").default_branch(name="rest")
    br["b-low"].peek(lambda k, v: None).to(t["low"])
    br["b-rest"].to(lambda k, v: t["missing"] if v["x"] % 7 == 0 else t["even"] if v["x"] % 2 == 0 else t["odd"])
    s.repartition(partitions=2, name="rp").to(t["rp"])
    return b.build()


@pytest.mark.parametrize("partitioner", ["consistent_random", "murmur2_random"])
def test_stream_operators_on_the_broker_equal_the_driver(kafka_bootstrap, unique, tmp_path, partitioner):
    t = {n: f"so-{n}-{unique}" for n in ("in", "fmv", "low", "even", "odd", "rp", "missing")}
    kafka.create_topics(kafka_bootstrap, {t[n]: 3 for n in ("in", "fmv", "low", "even", "odd", "rp")})
    rnd = random.Random(29)
    records = [(f"k{rnd.randrange(300):03d}".encode(), json.dumps({"x": rnd.randrange(60)}).encode())
               for _ in range(4000)]
    if partitioner == "consistent_random":
        produce(kafka_bootstrap, t["in"], records)
    else:
        produce_with_partitioner(kafka_bootstrap, [(t["in"], k, v) for k, v in records], partitioner)
    app = f"so-{unique}"
    w = Worker(topology_for(t), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert w.records_processed >= 4000

    inputs = kafka.read_topic(kafka_bootstrap, t["in"])
    assert len({m.partition() for m in inputs}) == 3
    existing = list(kafka.topic_partitions(kafka_bootstrap))
    assert t["missing"] not in existing   # never created
    # the driver per input partition (the order a task sees), the same topics existing
    want: dict = defaultdict(lambda: defaultdict(list))
    for p in range(3):
        with TopologyTestDriver(topology_for(t), application_id=app, topics=existing) as d:
            for m in (m for m in inputs if m.partition() == p):
                d.pipe_raw(t["in"], m.key(), m.value(), m.timestamp()[1])
            for topic in [t[n] for n in ("fmv", "low", "even", "odd", "rp")] + [d.dlq_topic]:
                for r in d.read_output(topic, Serdes.bytes(), Serdes.bytes()):
                    want[topic][r.key].append((r.value, r.timestamp))
    for n in ("fmv", "low", "even", "odd", "rp"):
        got = by_key(kafka.read_topic(kafka_bootstrap, t[n]))
        assert got == want[t[n]], n
        assert sum(map(len, got.values())) > 100, n
    dead = kafka.read_topic(kafka_bootstrap, f"{app}-dlq")
    assert by_key(dead) == want[f"{app}-dlq"]
    assert all(f"named topic {t['missing']!r}, which does not exist"
               in dict(m.headers())["__streams.errors.message"].decode() for m in dead)
    assert len(dead) > 20

    with TopologyTestDriver(topology_for(t), application_id=app, topics=existing) as d:
        for m in sorted(inputs, key=lambda m: m.timestamp()[1]):
            d.pipe_raw(t["in"], m.key(), m.value(), m.timestamp()[1])
        want_stores = driver_store_bytes(d, STORES)
    got_stores = task_store_bytes(sorted((tmp_path / app).glob("task-*")), STORES)
    for s in STORES:
        assert sorted(got_stores[s].items()) == sorted(want_stores[s].items()), s
    assert len(want_stores["last"]) == 300 and len(want_stores["by-upper"]) == 300
