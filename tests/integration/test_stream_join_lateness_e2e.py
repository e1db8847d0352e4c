"""Stream-stream joins on a real broker over records out of time order (issue 34 item 7: no record
dropped for lateness, Kafka Streams' window-store retention): a left self-join (unoptimized: two
window stores and an outer store) and an inner join, 3 partitions, records up to 80 ms older than
the clock with windows of 10 ms and grace 5 (retention 25): a worker against the test driver per
input partition, every output per key in order and every join store byte for byte."""

from processor import JoinWindows, StreamsBuilder
from processor.kafka import clients as kafka
from tests.integration.helpers import produce_out_of_order, worker_equals_driver_per_partition

STORES = ("left-this-store", "left-other-store", "left-outer-store", "inner-this-store", "inner-other-store")


def topology_for(t):
    b = StreamsBuilder()
    s = b.stream(t["in"])
    s.left_join(s, lambda a, c: [a["x"], None if c is None else c["x"]], JoinWindows.of(10).grace(5),
                name="left").to(t["left"])
    evens = s.filter(lambda k, v: v["x"] % 2 == 0)
    s.join(evens, lambda a, c: a["x"] * 10 + c["x"], JoinWindows(5, 10, 5), name="inner").to(t["inner"])
    return b.build()


def test_stream_joins_out_of_order_on_the_broker_equal_the_driver(kafka_bootstrap, unique, tmp_path):
    t = {n: f"sjl-{n}-{unique}" for n in ("in", "left", "inner")}
    kafka.create_topics(kafka_bootstrap, {v: 3 for v in t.values()})
    produce_out_of_order(kafka_bootstrap, t["in"], 3000, seed=34, lateness=80)
    want, metrics = worker_equals_driver_per_partition(kafka_bootstrap, topology_for, t, f"sjl-{unique}", tmp_path,
                                                       t["in"], [t["left"], t["inner"]], STORES)
    assert sum(map(len, want[t["left"]].values())) > 3000
    assert sum(map(len, want[t["inner"]].values())) > 1000
    assert metrics["expired_not_stored"] > 100          # too old for their own store, joined all the same
    assert metrics["unmatched_emitted"] > 100
