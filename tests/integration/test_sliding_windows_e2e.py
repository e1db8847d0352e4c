"""Sliding windows (KIP-450, issue 29) on a real broker: a ``Worker`` over 3,000 records on 3
partitions (Java's murmur2 placing them), with arrivals out of order within grace and beyond it
(late records dropped), against the test driver per input partition: every window result per key
(count on change, sum on window close), in order, and the window stores byte for byte."""

from processor import Emit, SlidingWindows, StreamsBuilder
from processor.kafka import clients as kafka
from tests.integration.helpers import produce_out_of_order, worker_equals_driver_per_partition

STORES = ("sliding", "sliding.emitted", "sliding-sums", "sliding-sums.emitted")


def topology_for(t):
    b = StreamsBuilder()
    w = b.stream(t["in"]).group_by_key().windowed_by(SlidingWindows.of_time_difference_and_grace(30, 40))
    w.count(name="sliding").to_stream().to(t["counts"])
    w.aggregate(lambda: 0, lambda k, v, agg: agg + v["x"], emit=Emit.on_window_close(),
                name="sliding-sums").to_stream().to(t["sums"])
    return b.build()


def test_sliding_windows_on_the_broker_equal_the_driver(kafka_bootstrap, unique, tmp_path):
    t = {n: f"slw-{n}-{unique}" for n in ("in", "counts", "sums")}
    kafka.create_topics(kafka_bootstrap, {v: 3 for v in t.values()})
    produce_out_of_order(kafka_bootstrap, t["in"], 3000, seed=43, lateness=80)   # some beyond grace
    want, metrics = worker_equals_driver_per_partition(kafka_bootstrap, topology_for, t, f"slw-{unique}", tmp_path,
                                                       t["in"], [t["counts"], t["sums"]], STORES)
    assert sum(map(len, want[t["counts"]].values())) > 2000    # windows updated
    assert sum(map(len, want[t["sums"]].values())) > 500       # closed windows
    assert metrics["late_records_dropped"] > 10                # some arrived beyond grace
