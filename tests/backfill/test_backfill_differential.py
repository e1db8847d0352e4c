"""Backfill vs the test driver, one case per operator family, on random histories (real local
Spark, real broker): every contract column family (name not starting with ``__``) of the
backfilled task databases, merged over tasks, equals byte for byte the driver's store after the
same history (records piped in timestamp order, the order a backfill task merges its inputs).

Cases whose stores depend on a task's stream time (windowed aggregates, ``Emit.every`` on the
stream clock, stream-stream joins) run on one partition, where the driver's single task and
the backfill's task see the same stream; the others on three. Foreign-key join results (and
what an aggregate downstream of them keeps) are compared as documented in docs/backfill.md "Same stores":
same keys and value bytes, the 8-byte timestamp aside."""

import json
import random

import pytest

import backfill
from processor import Emit, JoinWindows, SessionWindows, SlidingWindows, Stores, StreamsBuilder, TimeWindows
from processor.kafka import clients as kafka
from processor.serde import Serdes
from processor.state.rocksdb import RocksDBDatabase
from processor.testing import TopologyTestDriver
from tests.integration.helpers import produce

T0 = 1_000_000


def _js(v):
    return json.dumps(v, separators=(",", ":"), sort_keys=True).encode()


def table_history(rnd, n, keys, fks=None, deletes=0.08):
    out = []
    for _ in range(n):
        k = f"k{rnd.randrange(keys):03d}".encode()
        if rnd.random() < deletes:
            out.append((k, None))
        else:
            v = {"a": rnd.randrange(100), "g": f"g{rnd.randrange(5)}"}
            if fks:
                v["fk"] = None if rnd.random() < 0.05 else f"f{rnd.randrange(fks):02d}"
            out.append((k, _js(v)))
    return out


def stream_history(rnd, n, keys):
    return [(f"u{rnd.randrange(keys):02d}".encode(), _js({"x": rnd.randrange(50)})) for _ in range(n)]


def interleave(rnd, named):
    """``{name: [(key, value)]}`` -> one sequence of (name, key, value) in random interleaving,
    each list's order kept."""
    idx = {k: 0 for k in named}
    out = []
    while any(idx[k] < len(v) for k, v in named.items()):
        live = [k for k, v in named.items() if idx[k] < len(v)]
        k = rnd.choice(live)
        out.append((k, *named[k][idx[k]]))
        idx[k] += 1
    return out


# -- topologies (names -> topics given by the test) ------------------------------------------------
def filter_map(t):
    b = StreamsBuilder()
    tab = b.table(t["a"], store_name="a")
    tab.filter(lambda k, v: v["a"] > 30).map_values(lambda v: {"twice": v["a"] * 2}).to_stream().to(t["out"])
    tab.filter_not(lambda k, v: v["a"] > 30).to_stream().to(t["out2"])
    return b.build()


def table_aggregates(t):
    b = StreamsBuilder()
    tab = b.table(t["a"], store_name="a")
    g = tab.group_by(lambda k, v: (v["g"], v["a"]))
    g.aggregate(lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v,
                emit=Emit.on_change(), name="sum").to_stream().to(t["out"])
    g.count(emit=Emit.on_update(), name="count").to_stream().to(t["out2"])
    return b.build()


def table_aggregate_every(t):
    b = StreamsBuilder()
    tab = b.table(t["a"], store_name="a")
    tab.group_by(lambda k, v: (v["g"], v["a"])).aggregate(
        lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v,
        emit=Emit.every(40, clock="stream"), name="sum-every").to_stream().to(t["out"])
    return b.build()


def stream_aggregates(t):
    b = StreamsBuilder()
    s = b.stream(t["s"])
    s.group_by_key().count(name="by-key").to_stream().to(t["out"])
    s.group_by(lambda k, v: f"x{v['x'] % 4}").aggregate(lambda: 0, lambda k, v, agg: agg + v["x"], name="by-x") \
        .to_stream().to(t["out2"])
    return b.build()


def windowed(t):
    b = StreamsBuilder()
    b.stream(t["s"]).group_by_key().windowed_by(TimeWindows.of(50).grace(10)).count(
        emit=Emit.on_window_close(), name="win").to_stream().to(t["out"])
    return b.build()


def pk_joins(t):
    b = StreamsBuilder()
    a, c = b.table(t["a"], store_name="a"), b.table(t["c"], store_name="c")
    a.join(c, lambda x, y: {"a": x["a"], "c": y["a"]}, name="inner").to_stream().to(t["out"])
    a.left_join(c, lambda x, y: [x["a"], y and y["a"]], name="left").to_stream().to(t["out2"])
    a.outer_join(c, lambda x, y: [x and x["a"], y and y["a"]], name="outer")
    return b.build()


def stream_table(t):
    b = StreamsBuilder()
    tab = b.table(t["a"], store_name="a")
    j = b.stream(t["s"]).left_join(tab, lambda s, v: {"x": s["x"], "a": v and v["a"]})
    j.group_by(lambda k, v: str(v["a"] is None)).count(name="joined-count").to_stream().to(t["out"])
    return b.build()


def fk_joins(t):
    b = StreamsBuilder()
    a, c = b.table(t["a"], store_name="a"), b.table(t["c"], store_name="c")
    a.join_on_foreign_key(c, lambda v: v["fk"], lambda x, y: {"a": x["a"], "c": y["a"]},
                          how="inner", name="fk-inner").to_stream().to(t["out"])
    a.join_on_foreign_key(c, lambda v: v["fk"], lambda x, y: {"a": x["a"], "c": y and y["a"]},
                          how="left", name="fk-left").to_stream().to(t["out2"])
    return b.build()


def fk_self_join(t):
    """A table joined with itself on a foreign key (each row's manager): the sub-topology sends
    its subscriptions and responses to itself (found in review: the backfill never read them)."""
    b = StreamsBuilder()
    a = b.table(t["a"], store_name="a")
    a.join_on_foreign_key(a, lambda v: v["fk"], lambda x, y: {"a": x["a"], "boss": y["a"]},
                          name="fk-self").to_stream().to(t["out"])
    return b.build()


def self_joins(t):
    b = StreamsBuilder()
    a = b.table(t["a"], store_name="a")
    a.join(a, lambda x, y: x["a"] + y["a"]).group_by(lambda k, v: ("all", v)).aggregate(
        lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v, name="self-sum").to_stream().to(t["out"])
    return b.build()


def stream_stream(t):
    b = StreamsBuilder()
    s = b.stream(t["s"])
    s.join(s, lambda x, y: [x["x"], y["x"]], JoinWindows.of(20)).group_by_key().count(name="pairs") \
        .to_stream().to(t["out"])
    return b.build()


def stream_operators(t):
    """The stateless stream operators (issue 29) in front of stores: a key change before
    group_by_key and to_table (each repartitions), flat_map, flat_map_values, split, peek,
    foreach, repartition(partitions=2), a topic extractor's sink."""
    b = StreamsBuilder()
    s = b.stream(t["s"])
    s.map(lambda k, v: (f"m{v['x'] % 7}", {"x": v["x"], "from": k})).group_by_key().count(name="by-mapped")
    s.select_key(lambda k, v: f"s{v['x'] % 5}").to_table(name="last-by-selected")
    s.flat_map(lambda k, v: [(k, v["x"])] * (v["x"] % 3)).group_by_key().aggregate(
        lambda: 0, lambda k, v, agg: agg + v, name="flat-sum")
    s.flat_map_values(lambda v: range(v["x"] % 4)).peek(lambda k, v: None).group_by_key().count(name="fmv-count")
    branches = s.split(name="x-").branch(lambda k, v: v["x"] < 10, name="low") \
        .branch(lambda k, v: v["x"] < 30, name="mid").default_branch(name="high")
    branches["x-low"].group_by_key().count(name="low-count")
    branches["x-high"].repartition(partitions=2, name="high").group_by_key().count(name="high-count")
    branches["x-mid"].foreach(lambda k, v: None)
    branches["x-mid"].to(lambda k, v: t["out"] if v["x"] % 2 else t["out2"])
    return b.build()


def processor_api(t):
    """Processor API (issue 29): a dedup with a store, and a counter whose stream-time
    punctuation forwards the count every 40 ms into a count by key."""
    from tests.unit.test_processor_api import Dedup, Ticker

    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("seen", key_serde=Serdes.string(), value_serde=Serdes.json()))
    b.add_state_store(Stores.key_value("n"))
    s = b.stream(t["s"])
    s.process(Dedup, stores=["seen"]).to(t["out"])
    s.process(lambda: Ticker("stream", 40), stores=["n"]).group_by_key().count(name="ticks")
    return b.build()


def shared_store(t):
    """Two processors on two topics connected to one store (one sub-topology): a dedup across
    both streams."""
    from tests.unit.test_processor_api import Dedup

    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("seen", key_serde=Serdes.string(), value_serde=Serdes.json()))
    b.stream(t["s"]).process(Dedup, stores=["seen"]).to(t["out"])
    b.stream(t["s2"]).process(Dedup, stores=["seen"]).group_by_key().count(name="firsts")
    return b.build()


def dsl_stores(t):
    """DSL stores in process() (issue 34): a table's store read with each row's timestamp by a
    processor on the clicks and by one on the table's own changes, a count's store, a Processor
    API store (``tests/unit/test_processor_api_dsl_stores.py``)."""
    from tests.unit.test_processor_api_dsl_stores import dsl_stores_topology

    return dsl_stores_topology({"users": t["a"], "clicks": t["s"], "enriched": t["out"], "stamped": t["out2"],
                                "counted": t["s2"]})


def windowed_stores(t):
    """Processor API window and session stores (issue 34): tests/backfill/apps.py."""
    from tests.backfill.apps import windowed_stores_for

    return windowed_stores_for(t)


def session_windows(t):
    b = StreamsBuilder()
    w = b.stream(t["s"]).group_by_key().windowed_by(SessionWindows.with_inactivity_gap(12).grace(30))
    w.count(name="sessions").to_stream().to(t["out"])
    w.aggregate(lambda: 0, lambda k, v, agg: agg + v["x"], lambda k, a, c: a + c, emit=Emit.on_window_close(),
                name="session-sums").to_stream().to(t["out2"])
    return b.build()


def sliding_windows(t):
    b = StreamsBuilder()
    w = b.stream(t["s"]).group_by_key().windowed_by(SlidingWindows.of_time_difference_and_grace(15, 20))
    w.count(name="sliding").to_stream().to(t["out"])
    w.aggregate(lambda: 0, lambda k, v, agg: agg + v["x"], emit=Emit.on_window_close(),
                name="sliding-sums").to_stream().to(t["out2"])
    return b.build()


def global_table(t):
    """A stream joined with a global table (every task holds all of it) through a key
    selector, then counted by the row it met."""
    b = StreamsBuilder()
    g = b.global_table(t["c"], key_serde=Serdes.bytes(), name="global-c")
    b.stream(t["s"]).left_join(g, lambda s, c: [s["x"] % 3, c and c["a"] % 4],
                               key_selector=lambda k, v: f"k{v['x'] % 40:03d}".encode()) \
        .group_by(lambda k, v: str(v)).count(name="by-row")
    return b.build()


def _history(case, rnd):
    if case in ("filter_map", "table_aggregates", "table_aggregate_every", "self_joins"):
        return interleave(rnd, {"a": table_history(rnd, 1500, 120)})
    if case in ("stream_aggregates", "windowed", "stream_stream", "stream_operators", "processor_api",
                "windowed_stores"):
        return interleave(rnd, {"s": stream_history(rnd, 1500, 30)})
    if case == "shared_store":
        return interleave(rnd, {"s": stream_history(rnd, 900, 300), "s2": stream_history(rnd, 900, 300)})
    if case == "dsl_stores":   # the clicks' keys are the table's: u00..u29; rows from a small domain
        rows = [(f"u{rnd.randrange(30):02d}".encode(),
                 None if rnd.random() < 0.1 else _js({"tier": rnd.choice("ab"), "region": rnd.choice("xy")}))
                for _ in range(700)]
        return interleave(rnd, {"a": rows, "s": stream_history(rnd, 1300, 30)})
    if case == "global_table":   # the table first: the backfill joins the table at the snapshot, as a worker
        return [("c", k, v) for k, v in table_history(rnd, 400, 40)] + \
            [("s", k, v) for k, v in stream_history(rnd, 1200, 30)]
    if case in ("session_windows", "sliding_windows"):   # sparse keys: windows open, merge and close
        return interleave(rnd, {"s": stream_history(rnd, 1500, 120)})
    if case == "pk_joins":
        return interleave(rnd, {"a": table_history(rnd, 1200, 100), "c": table_history(rnd, 800, 100)})
    if case == "stream_table":
        return interleave(rnd, {"a": table_history(rnd, 600, 40), "s": stream_history(rnd, 1200, 40)})
    if case == "fk_self_join":   # keys k000..k059, managers among the first 20
        return [("a", f"k{rnd.randrange(60):03d}".encode(),
                 None if rnd.random() < 0.08 else _js({"a": rnd.randrange(100), "fk": f"k{rnd.randrange(20):03d}"}))
                for _ in range(1200)]
    if case in ("fk_joins", "fk_joins_3"):
        return interleave(rnd, {"a": table_history(rnd, 1500, 150, fks=40),
                                "c": [(f"f{rnd.randrange(45):02d}".encode(), v)
                                      for _, v in table_history(rnd, 700, 1)]})
    raise KeyError(case)


CASES = {
    # name: (topology, partitions, stores compared without their 8-byte timestamp)
    "filter_map": (filter_map, 3, ()),
    "table_aggregates": (table_aggregates, 3, ()),
    "table_aggregate_every": (table_aggregate_every, 1, ()),
    "stream_aggregates": (stream_aggregates, 3, ()),
    "windowed": (windowed, 1, ()),
    "pk_joins": (pk_joins, 3, ()),
    "stream_table": (stream_table, 3, ()),
    # one partition: version and subscription stores hold input positions (provenance), which
    # are the driver's only where its one partition per topic is the backfill's too
    "fk_joins": (fk_joins, 1, ("fk-inner", "fk-left")),
    # three partitions: the join results (positions differ from the one-partition driver's)
    "fk_joins_3": (fk_joins, 3, ("fk-inner", "fk-left")),
    "fk_self_join": (fk_self_join, 1, ("fk-self",)),
    "self_joins": (self_joins, 3, ()),
    "stream_stream": (stream_stream, 1, ()),
    "stream_operators": (stream_operators, 3, ()),
    # one partition: stream-time punctuation follows the task's records
    "processor_api": (processor_api, 1, ()),
    "shared_store": (shared_store, 1, ()),
    "dsl_stores": (dsl_stores, 3, ()),
    # one partition: each window/session store's clock follows the task's records
    "windowed_stores": (windowed_stores, 1, ()),
    "session_windows": (session_windows, 1, ()),
    "sliding_windows": (sliding_windows, 1, ()),
    "global_table": (global_table, 3, ()),
}


def _backfilled(state_dir, app, names):
    out = {n: {} for n in names}
    for task_dir in sorted((state_dir / app).glob("task-*")):
        db = RocksDBDatabase(task_dir)
        try:
            cfs = db.column_families()
            for n in names:
                if n in cfs:
                    out[n].update(db.store(n).items())
        finally:
            db.close()
    return {n: sorted(v.items()) for n, v in out.items()}


# cases whose records come out of time order (windows within and beyond grace, punctuation)
OUT_OF_ORDER = ("session_windows", "sliding_windows", "processor_api", "windowed_stores")


def _timestamp(case, i: int) -> int:
    """Record ``i``'s timestamp: ``T0 + i``, less 0-10 ms for ``OUT_OF_ORDER`` cases (about
    every other record is older than the one before it)."""
    return T0 + i - (i * 37) % 11 if case in OUT_OF_ORDER else T0 + i


def _driver(topology, topics, history, app, case=None):
    with TopologyTestDriver(topology, application_id=app) as d:   # internal topic names as the backfill's
        for i, (name, k, v) in enumerate(history):
            d.pipe_raw(topics[name], k, v, timestamp=_timestamp(case, i))
        d.flush()
        out = {}
        for name in topology.stores:
            owners = [t for t in d.tasks if any(s.name == name for s in t.store_specs)]
            out[name] = sorted((k, v) for t in owners for k, v in t.stores.store(name).items())
        out["_bookkeeping"] = sorted((k, v) for t in d.tasks for k, v in t.stores.store("_bookkeeping").items())
        return out


def case_input(case, kafka_bootstrap, unique, prefix="d"):
    """``(topology, topics, history)`` of ``case``, its topics created and its history produced."""
    make, parts, _ = CASES[case]
    rnd = random.Random(f"{case}-7")
    topics = {n: f"{prefix}-{case}-{n}-{unique}" for n in ("a", "c", "s", "s2", "out", "out2")}
    topo = make(topics)
    history = _history(case, rnd)
    kafka.create_topics(kafka_bootstrap, {t: parts for t in topics.values()})
    for name in {n for n, _, _ in history}:
        idx = [i for i, (n, _, _) in enumerate(history) if n == name]
        produce(kafka_bootstrap, topics[name], [history[i][1:] for i in idx],
                timestamps=[_timestamp(case, i) for i in idx])
    return topo, topics, history


def check_stores(case, topo, topics, history, state_dir, app) -> dict:
    """The differential: every compared store of the backfilled databases in ``state_dir`` equals
    the driver's after the same history. Returns entries per store."""
    _, parts, ts_free = CASES[case]
    got = _backfilled(state_dir, app, list(topo.stores) + ["_bookkeeping"])
    want = _driver(topo, topics, history, app, case)
    assert sorted([*topo.stores, "_bookkeeping"]) == sorted(want)
    compared = [n for n in sorted(topo.stores) if case != "fk_joins_3" or n in ts_free or n in ("a", "c")]
    if parts == 1:   # the task's bookkeeping (stream times, high-water marks) is a contract too
        compared.append("_bookkeeping")
    for name in compared:
        assert not name.startswith("__")
        g, w = got[name], want[name]
        if name in ts_free:
            g, w = [(k, v[8:]) for k, v in g], [(k, v[8:]) for k, v in w]
        assert [k for k, _ in g] == [k for k, _ in w], f"{case}: keys of store {name}"
        assert g == w, f"{case}: values of store {name}"
    sizes = {n: len(v) for n, v in got.items()}
    assert sum(sizes.values()) > 0
    return sizes


@pytest.mark.integration
@pytest.mark.parametrize("case", sorted(CASES))
def test_backfill_stores_equal_the_drivers(case, kafka_bootstrap, spark, tmp_path, unique, report):
    _, parts, _ = CASES[case]
    topo, topics, history = case_input(case, kafka_bootstrap, unique)
    app = f"d-{case}-{unique}"
    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path, spark=spark)
    assert rep.rows_read + rep.global_records == len(history)   # (a global table's topic is read apart)
    sizes = check_stores(case, topo, topics, history, tmp_path, app)
    if parts == 1:
        report(f"{case}: bookkeeping entries compared: {sizes['_bookkeeping']}")
    report(f"{case}: {len(history)} records, {parts} partition(s), {len(rep.runs)} run(s), stores {sizes}, "
           f"{sum(rep.seconds.values()):.1f} s")
