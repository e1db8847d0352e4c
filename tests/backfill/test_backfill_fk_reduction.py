"""The reduction through a transparent foreign-key join (``backfill.compaction.transparent_joins``):
an aggregation of a foreign-key join's results, backfilled with its tables reduced to their last
real changes, against the same backfill with ``compaction=False`` (every record replayed), on
random histories where orders move between customers, lose their foreign key and are deleted,
and customers move between regions (real local Spark, real broker). Every column family of
every task database, ``_bookkeeping`` included, must be byte-identical, timestamps too: the
reduction is sound only if nothing downstream can tell."""

import json
import random

import pytest

import backfill
from processor import Emit, StreamsBuilder
from processor.kafka import clients as kafka
from tests.backfill.test_backfill_differential import T0, _backfilled, interleave
from tests.integration.helpers import produce


def _js(v):
    return json.dumps(v, separators=(",", ":"), sort_keys=True).encode()


def topology(t, how):
    b = StreamsBuilder()
    orders, customers = b.table(t["o"], store_name="orders"), b.table(t["c"], store_name="customers")
    joined = orders.join_on_foreign_key(customers, lambda v: v["fk"], lambda o, c: {"a": o["a"], "r": c and c["r"]},
                                        how=how, name=f"fk-{how}")
    by_region = joined.group_by(lambda k, v: (str(v["r"]), v["a"]))
    by_region.aggregate(lambda: [0, 0], lambda k, v, agg: [agg[0] + 1, agg[1] + v],
                        lambda k, v, agg: [agg[0] - 1, agg[1] - v], name="orders-by-region")
    by_region.count(emit=Emit.on_change(), name="count-by-region")
    return b.build()


def history(rnd):
    """2,500 order updates over 200 orders (6 % deletes, 4 % without a foreign key) and 900
    customer updates over 55 customers (5 % deletes) in 60 regions: groups that only an
    intermediate customer row or foreign key reaches."""
    orders = [(f"o{rnd.randrange(200):03d}".encode(), None if rnd.random() < 0.06 else _js(
        {"a": rnd.randrange(100), "fk": None if rnd.random() < 0.04 else f"f{rnd.randrange(50):02d}"}))
        for _ in range(2500)]
    customers = [(f"f{rnd.randrange(55):02d}".encode(), None if rnd.random() < 0.05 else _js({"r": rnd.randrange(60)}))
                 for _ in range(900)]
    return interleave(rnd, {"o": orders, "c": customers})


@pytest.mark.integration
@pytest.mark.parametrize("how,parts", [("inner", 1), ("inner", 3), ("left", 3)])
def test_reduced_tables_leave_the_stores_of_every_record_replayed(how, parts, kafka_bootstrap, spark, tmp_path,
                                                                  unique, report):
    t = {n: f"fkr-{n}-{how}-{parts}-{unique}" for n in ("o", "c")}
    kafka.create_topics(kafka_bootstrap, {x: parts for x in t.values()})
    h = history(random.Random(f"{how}-{parts}"))
    for name in ("o", "c"):
        idx = [i for i, (n, _, _) in enumerate(h) if n == name]
        produce(kafka_bootstrap, t[name], [h[i][1:] for i in idx], timestamps=[T0 + i for i in idx])
    names = list(topology(t, how).stores) + ["_bookkeeping"]
    got = {}
    for mode in ("reduced", "every-record"):
        app = f"fkr-{how}-{parts}-{mode}-{unique}"
        rep = backfill.run(topology(t, how), bootstrap_servers=kafka_bootstrap, application_id=app,
                           state_dir=tmp_path / mode, spark=spark, compaction=mode == "reduced")
        a = app.encode()   # (internal topics in _bookkeeping's keys name the application)
        got[mode] = (rep, {n: [(k.replace(a, b"<app>"), v.replace(a, b"<app>")) for k, v in entries]
                           for n, entries in _backfilled(tmp_path / mode, app, names).items()})
    reduced, full = got["reduced"][0], got["every-record"][0]
    # an inner join is transparent from both sides; a left join from its right side only
    assert sorted(reduced.compaction) == sorted([t["c"], t["o"]])
    assert reduced.compaction[t["c"]] == "last real changes per key (foreign-key join)"
    if how == "inner":
        assert reduced.compaction[t["o"]] == "last real changes per key (foreign-key join)"
    else:   # the left join's results are read by an aggregation: named
        assert reduced.compaction[t["o"]].startswith("every record replayed (KTABLE-")
        assert "(group-by): its state depends on the history" in reduced.compaction[t["o"]]
    assert set(full.compaction.values()) == {"every record replayed (--no-compaction)"}
    assert full.rows_read == reduced.rows_read == len(h) == full.rows_replayed > reduced.rows_replayed
    a, b = got["reduced"][1], got["every-record"][1]
    for name in names:
        assert [k for k, _ in a[name]] == [k for k, _ in b[name]], f"keys of {name}"
        assert a[name] == b[name], f"values of {name}"
    assert len(a["orders-by-region"]) > 20 and len(a[f"fk-{how}"]) > 100
    report(f"fk {how} join + aggregations, {parts} partition(s): {len(h)} rows, {reduced.rows_replayed} replayed "
           f"after reduction; every store byte-identical to --no-compaction's "
           f"({', '.join(f'{n}: {len(a[n])}' for n in names)})")


@pytest.mark.integration
def test_a_partition_whose_timestamps_go_backwards_is_replayed_whole(kafka_bootstrap, spark, tmp_path, unique,
                                                                     report):
    """Found in review: customer f1 changed at 500, then at 20 and 30 (timestamps going backwards
    in its partition). Replaying every record, the change at 500 holds the customers back, so
    the order's subscription at 100 comes first, finds no row and the changes at 20 and 30
    answer it (the result's timestamp 30, its window [0, 50)); reduced to the last two changes,
    they come first and the subscription's answer has timestamp 100 (window [100, 150)). Such a
    partition is replayed whole, and the stores equal --no-compaction's."""
    from processor import TimeWindows

    t = {n: f"fkr-{n}-back-{unique}" for n in ("o", "c")}
    kafka.create_topics(kafka_bootstrap, {x: 1 for x in t.values()})
    produce(kafka_bootstrap, t["o"], [(b"o1", _js({"a": 1, "fk": "f1"})), (b"o2", _js({"a": 2, "fk": "f2"}))],
            timestamps=[100, 110])
    produce(kafka_bootstrap, t["c"], [(b"f1", _js({"r": 1})), (b"f1", _js({"r": 2})), (b"f1", _js({"r": 3})),
                                      (b"f2", _js({"r": 1}))], timestamps=[500, 20, 30, 40])

    def topo():
        b = StreamsBuilder()
        orders, customers = b.table(t["o"], store_name="orders"), b.table(t["c"], store_name="customers")
        joined = orders.join_on_foreign_key(customers, lambda v: v["fk"], lambda o, c: {"a": o["a"], "r": c["r"]},
                                            name="fk")
        joined.group_by(lambda k, v: (str(v["r"]), v["a"])).count(name="by-region")
        joined.to_stream().group_by(lambda k, v: str(v["r"])).windowed_by(TimeWindows.of(50)).count(
            name="windowed")
        return b.build()

    names = list(topo().stores) + ["_bookkeeping"]
    got = {}
    for mode in ("reduced", "every-record"):
        app = f"fkr-back-{mode}-{unique}"
        rep = backfill.run(topo(), bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path / mode,
                           spark=spark, compaction=mode == "reduced")
        a = app.encode()
        got[mode] = (rep, {n: [(k.replace(a, b"<app>"), v.replace(a, b"<app>")) for k, v in entries]
                           for n, entries in _backfilled(tmp_path / mode, app, names).items()})
    reduced = got["reduced"][0]
    for name in names:
        assert got["reduced"][1][name] == got["every-record"][1][name], name
    assert reduced.unordered == [f"{t['c']}[0]"] and got["every-record"][0].unordered == []
    assert f"  replayed whole, their timestamps going backwards: {t['c']}[0]" in reduced.lines()
    assert reduced.rows_replayed == 6   # the orders (in time order: both kept), every customer record
    windows = got["reduced"][1]["windowed"]
    assert len(windows) == 2, windows
    report(f"timestamps going backwards: {reduced.unordered} replayed whole; stores equal --no-compaction's "
           f"({len(windows)} windows)")
