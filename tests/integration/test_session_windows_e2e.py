"""Session windows (issue 29) on a real broker: a ``Worker`` over 3,000 records on 3 partitions
(Java's murmur2 placing them), with arrivals out of order within grace, against the test driver
per input partition: every session result per key (count on change, sum on window close), in
order, and the session stores byte for byte, the worker's task by task."""

from processor import Emit, SessionWindows, StreamsBuilder
from processor.kafka import clients as kafka
from tests.integration.helpers import produce_out_of_order, worker_equals_driver_per_partition

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
    want, _ = worker_equals_driver_per_partition(kafka_bootstrap, topology_for, t, f"sw-{unique}", tmp_path,
                                                 t["in"], [t["counts"], t["sums"]], STORES)
    assert sum(v is None for seq in want[t["counts"]].values() for v, _ in seq) > 50   # merged sessions
    assert sum(map(len, want[t["sums"]].values())) > 300                               # closed sessions
