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
    assert sorted(reduced.compaction.items()) == sorted(
        [(t["c"], "last real changes per key (foreign-key join)")] +
        ([(t["o"], "last real changes per key (foreign-key join)")] if how == "inner" else
         [(t["o"], "every record replayed (a reader's state depends on the history)")]))
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
