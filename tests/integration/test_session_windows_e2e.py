"""Session windows (issue 29) on a real broker: a ``Worker`` over 3,000 records on 3 partitions
(Java's murmur2 placing them), with arrivals out of order within grace, against the test driver
per input partition: every session result per key (count on change, sum on window close), in
order, and the session stores byte for byte, the worker's task by task."""

from collections import defaultdict

from processor import Emit, SessionWindows, StreamsBuilder
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import by_key, driver_store_bytes, produce_out_of_order, task_store_bytes

STORES = ("sessions", "sessions.emitted", "sums", "sums.emitted")


def topology_for(t):
    b = StreamsBuilder()
    w = b.stream(t["in"]).group_by_key().windowed_by(SessionWindows.with_inactivity_gap(40).grace(60))
    w.count(name="sessions").to_stream().to(t["counts"])
    w.aggregate(lambda: 0, lambda k, v, agg: agg + v["x"], lambda k, a, c: a + c, emit=Emit.on_window_close(),
                name="sums").to_stream().to(t["sums"])
    return b.build()


def test_session_windows_on_the_broker_equal_the_driver(kafka_bootstrap, unique, tmp_path):
    t = {n: f"sw-{n}-{unique}" for n in ("in", "counts", "sums")}
    kafka.create_topics(kafka_bootstrap, {v: 3 for v in t.values()})
    produce_out_of_order(kafka_bootstrap, t["in"], 3000, seed=41)
    app = f"sw-{unique}"
    w = Worker(topology_for(t), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)

    inputs = kafka.read_topic(kafka_bootstrap, t["in"])
    assert len(inputs) == 3000
    want: dict = {o: defaultdict(list) for o in (t["counts"], t["sums"])}
    for part in range(3):
        with TopologyTestDriver(topology_for(t), application_id=app) as d:
            for m in (m for m in inputs if m.partition() == part):
                d.pipe_raw(t["in"], m.key(), m.value(), m.timestamp()[1])
            for o in want:
                for r in d.read_output(o, Serdes.bytes(), Serdes.bytes()):
                    want[o][r.key].append((r.value, r.timestamp))
            stores = driver_store_bytes(d, STORES)
        got = task_store_bytes([tmp_path / app / f"task-0_{part}"], STORES)
        assert got == stores, part
    for o in want:
        assert by_key(kafka.read_topic(kafka_bootstrap, o)) == want[o], o
    assert sum(v is None for seq in want[t["counts"]].values() for v, _ in seq) > 50   # merged sessions
    assert sum(map(len, want[t["sums"]].values())) > 300                               # closed sessions
