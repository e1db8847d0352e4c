"""Session and sliding windows (issue 29) on a real broker: a ``Worker`` over 3,000 records on 3 partitions
(Java's murmur2 placing them), with arrivals out of order within grace, against the test driver
per input partition: every session result per key (count on change, sum on window close), in
order, and the session stores byte for byte, the worker's task by task; the same for a sliding
window count (KIP-450) over the same stream."""

import json
import random
from collections import defaultdict

from processor import Emit, SessionWindows, SlidingWindows, StreamsBuilder
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import by_key, driver_store_bytes, task_store_bytes

STORES = ("sessions", "sessions.emitted", "sums", "sums.emitted", "sliding", "sliding.emitted")


def topology_for(t):
    b = StreamsBuilder()
    w = b.stream(t["in"]).group_by_key().windowed_by(SessionWindows.with_inactivity_gap(40).grace(60))
    w.count(name="sessions").to_stream().to(t["counts"])
    w.aggregate(lambda: 0, lambda k, v, agg: agg + v["x"], lambda k, a, c: a + c, emit=Emit.on_window_close(),
                name="sums").to_stream().to(t["sums"])
    b_stream = b.stream(t["in2"])
    b_stream.group_by_key().windowed_by(SlidingWindows.of_time_difference_and_grace(30, 60)).count(
        name="sliding").to_stream().to(t["sliding"])
    return b.build()


def test_session_windows_on_the_broker_equal_the_driver(kafka_bootstrap, unique, tmp_path):
    t = {n: f"sw-{n}-{unique}" for n in ("in", "in2", "counts", "sums", "sliding")}
    kafka.create_topics(kafka_bootstrap, {v: 3 for v in t.values()})
    rnd = random.Random(41)
    recs, clock = [], 1_000_000
    for _ in range(3000):
        clock += rnd.choice([0, 1, 3, 10, 90])
        ts = clock - rnd.randrange(50)   # out of order, within grace
        recs.append((ts, f"u{rnd.randrange(60):02d}".encode(), json.dumps({"x": rnd.randrange(10)}).encode()))
    # produced in arrival order, each record its own timestamp
    from confluent_kafka import Producer

    conf = kafka.producer_defaults(kafka_bootstrap)
    conf["partitioner"] = "murmur2_random"
    p = Producer(conf)
    for ts, k, v in recs:
        p.produce(t["in"], v, k, timestamp=ts)
        p.produce(t["in2"], v, k, timestamp=ts)
    assert p.flush(30) == 0
    app = f"sw-{unique}"
    w = Worker(topology_for(t), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)

    inputs = kafka.read_topic(kafka_bootstrap, t["in"])
    inputs2 = kafka.read_topic(kafka_bootstrap, t["in2"])
    assert len(inputs) == len(inputs2) == 3000
    want: dict = {o: defaultdict(list) for o in (t["counts"], t["sums"], t["sliding"])}
    for part in range(3):
        with TopologyTestDriver(topology_for(t), application_id=app) as d:
            for m in (m for m in inputs if m.partition() == part):
                d.pipe_raw(t["in"], m.key(), m.value(), m.timestamp()[1])
            for m in (m for m in inputs2 if m.partition() == part):
                d.pipe_raw(t["in2"], m.key(), m.value(), m.timestamp()[1])
            for o in want:
                for r in d.read_output(o, Serdes.bytes(), Serdes.bytes()):
                    want[o][r.key].append((r.value, r.timestamp))
            stores = driver_store_bytes(d, STORES)
        got = task_store_bytes([tmp_path / app / f"task-{sub}_{part}" for sub in (0, 1)], STORES)
        assert got == stores, part
    for o in want:
        assert by_key(kafka.read_topic(kafka_bootstrap, o)) == want[o], o
    assert sum(v is None for seq in want[t["counts"]].values() for v, _ in seq) > 50   # merged sessions
    assert sum(map(len, want[t["sums"]].values())) > 300                               # closed sessions
    assert sum(map(len, want[t["sliding"]].values())) > 3000                           # sliding windows
