"""The backfill against the driver (stores and bookkeeping byte for byte) for issue 34's items 3
and 7: Kafka's Long serde as repartition keys and aggregate state, and a left stream-stream join
over records out of time order (about every other record older than the one before, by up to
10 ms, with a retention of 2 + 2 + 1 = 5 ms: records too old for their own window store, unmatched
records emitted at once, matches of records already emitted unmatched)."""

import random

import pytest

import backfill
from processor import JoinWindows, StreamsBuilder
from processor.kafka import clients as kafka
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.backfill.test_backfill_differential import T0, _backfilled, stream_history
from tests.integration.helpers import produce


def topology_for(t):
    b = StreamsBuilder()
    s = b.stream(t["s"])
    joined = s.left_join(s, lambda a, c: [a["x"], None if c is None else c["x"]], JoinWindows.of(2).grace(1),
                         name="pairs")
    joined.group_by(lambda k, v: v[0] + (-1 if v[1] is None else v[1]), key_serde=Serdes.long()) \
        .count(name="pairs-by-sum", value_serde=Serdes.long())
    s.group_by(lambda k, v: v["x"] % 9 - 4, key_serde=Serdes.long()) \
        .aggregate(lambda: 0, lambda k, v, total: total + v["x"] * 1_000_000_007, name="sum-by-mod",
                   value_serde=Serdes.long())
    return b.build()


def timestamp(i: int) -> int:
    return T0 + i - (i * 37) % 11


@pytest.mark.integration
def test_backfill_of_long_serdes_and_a_left_join_out_of_order_equals_the_driver(kafka_bootstrap, spark, tmp_path,
                                                                                 unique):
    t = {"s": f"bk-s-{unique}"}
    history = stream_history(random.Random("kafka-serdes-join"), 1200, 20)
    kafka.create_topics(kafka_bootstrap, {t["s"]: 1})
    produce(kafka_bootstrap, t["s"], history, timestamps=[timestamp(i) for i in range(len(history))])
    topo = topology_for(t)
    app = f"bk-{unique}"
    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path, spark=spark)
    assert rep.rows_read == len(history)

    names = sorted([*topo.stores, "_bookkeeping"])
    got = _backfilled(tmp_path, app, names)
    with TopologyTestDriver(topo, application_id=app) as d:
        for i, (k, v) in enumerate(history):
            d.pipe_raw(t["s"], k, v, timestamp=timestamp(i))
        d.flush()
        want = {n: sorted((k, v) for task in d.tasks
                          if n == "_bookkeeping" or any(spec.name == n for spec in task.store_specs)
                          for k, v in task.stores.store(n).items()) for n in names}
        joins = d.metrics()
    for n in names:
        assert got[n] == want[n], n
    assert len(want["pairs-by-sum"]) > 50 and len(want["sum-by-mod"]) == 9
    assert all(len(v) == 16 for _, v in want["pairs-by-sum"])   # timestamp + a Java long
    # the history did reach the rules: records not stored, unmatched ones emitted
    side = joins["pairs-join-this"]
    assert side["expired_not_stored"] > 10 and side["unmatched_emitted"] + joins["pairs-join-other"][
        "unmatched_emitted"] > 10
