"""DSL stores in ``process()`` (issue 34, item 5): a KTable's materialized store connected with
``process(P, stores=[name])`` is read-only there and reads as the table's current rows;
``get_with_timestamp`` gives each row's timestamp (``ValueAndTimestamp``) on every key-value
store a processor sees; a Processor API store's ``put`` keeps the current record's timestamp.
In the test driver against a plain-Python model of Kafka Streams' semantics (a table source
skips no-op updates and keeps the timestamp of the last real change; a count's timestamp is
the largest of its records'). The topologies here are also run on the broker
(``tests/integration/test_processor_api_dsl_stores_e2e.py``) and by the backfill
(``tests/backfill/test_backfill_differential.py``, case ``dsl_stores``)."""

import random

import pytest

from processor import Processor, Stores, StreamsBuilder
from processor.errors import TopologyError, UserFunctionError
from processor.papi import ReadOnlyStoreError, ValueAndTimestamp
from processor.serde import Serdes
from processor.testing import TopologyTestDriver


def _row(vt):
    return None if vt is None else [vt.value, vt.timestamp]


class Enrich(Processor):
    """Each click with its user's row ([value, timestamp] or None) from the table's store, and the
    previous click of the key ([x, timestamp]) from its own store ``last``."""

    def init(self, context):
        self.ctx = context
        self.users = context.get_state_store("users")
        self.last = context.get_state_store("last")

    def process(self, record):
        row = self.users.get_with_timestamp(record.key)
        prev = self.last.get_with_timestamp(record.key)
        self.last.put(record.key, record.value["x"])
        self.ctx.forward(record._replace(value={"x": record.value["x"], "row": _row(row), "prev": _row(prev)}))


class RowStamp(Processor):
    """The motivating port: each change of a table, read back from the table's own store with the
    row's timestamp (Kafka Streams' ``TimestampedKeyValueStore`` of a ``KTable``)."""

    def init(self, context):
        self.ctx = context
        self.store = context.get_state_store("users")

    def process(self, record):
        row = _row(self.store.get_with_timestamp(record.key))
        self.ctx.forward(record._replace(value={"v": record.value, "row": row}))


class CountReader(Processor):
    """Each click with its key's count so far ([count, timestamp]) from the aggregate's store."""

    def init(self, context):
        self.ctx = context
        self.counts = context.get_state_store("clicks-per-user")

    def process(self, record):
        self.ctx.forward(record._replace(value=_row(self.counts.get_with_timestamp(record.key))))


def dsl_stores_topology(t: dict):
    """``users`` table (store ``users``), ``clicks`` stream; outputs ``enriched`` (Enrich),
    ``stamped`` (RowStamp over the table's changes), ``counted`` (CountReader after the count
    ``clicks-per-user``); the enriched clicks are also reduced into a table (store
    ``enriched-last``), so the backfill compares what the processor read."""
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("last", key_serde=Serdes.string(), value_serde=Serdes.json()))
    users = b.table(t["users"], store_name="users")
    clicks = b.stream(t["clicks"])
    clicks.group_by_key().count(name="clicks-per-user")
    enriched = clicks.process(Enrich, stores=["users", "last"])
    enriched.to(t["enriched"])
    enriched.to_table(name="enriched-last")
    users.to_stream().process(RowStamp, stores=["users"]).to(t["stamped"])
    clicks.process(CountReader, stores=["clicks-per-user"]).to(t["counted"])
    return b.build()


TOPICS = {n: n for n in ("users", "clicks", "enriched", "stamped", "counted")}


def history(seed: int, n: int = 400, users: int = 8, t0: int = 1000):
    """``[(topic name, key, value, timestamp)]``: table rows from a small domain (many no-op
    updates), deletes (some of absent keys), clicks; timestamps increasing, some equal."""
    rnd = random.Random(seed)
    out, ts = [], t0
    for _ in range(n):
        ts += rnd.choice((0, 1, 3, 10))
        k = f"u{rnd.randrange(users)}"
        if rnd.random() < 0.45:
            v = None if rnd.random() < 0.15 else {"tier": rnd.choice("ab"), "region": rnd.choice("xy")}
            out.append(("users", k, v, ts))
        else:
            out.append(("clicks", k, {"x": rnd.randrange(100)}, ts))
    return out


def model(records):
    """Kafka Streams' result: ``{output name: [(key, value, timestamp)]}``."""
    table, last, counts = {}, {}, {}
    out = {"enriched": [], "stamped": [], "counted": []}
    for name, k, v, ts in records:
        if name == "users":
            old = table.get(k)
            if v is None:
                if old is None:
                    continue                        # a tombstone of nothing: no change
                del table[k]
                out["stamped"].append((k, {"v": None, "row": None}, ts))
            elif old is not None and old[0] == v:
                continue                            # a no-op update keeps the last real change's time
            else:
                table[k] = (v, ts)
                out["stamped"].append((k, {"v": v, "row": [v, ts]}, ts))
        else:
            c, cts = counts.get(k, (0, ts))
            counts[k] = (c + 1, max(cts, ts))
            row, prev = table.get(k), last.get(k)
            last[k] = (v["x"], ts)
            out["enriched"].append((k, {"x": v["x"], "row": None if row is None else list(row),
                                        "prev": None if prev is None else list(prev)}, ts))
            out["counted"].append((k, list(counts[k]), ts))
    return out, table, last


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_processors_read_dsl_stores_with_row_timestamps_as_the_model(seed):
    recs = history(seed)
    want, table, last = model(recs)
    with TopologyTestDriver(dsl_stores_topology(TOPICS)) as d:
        for name, k, v, ts in recs:
            d.pipe_input(name, k, v, timestamp=ts)
        got = {n: [(r.key, r.value, r.timestamp) for r in d.read_output(n)] for n in want}
        users, own = d.get_store("users"), d.get_store("last")
        for k in {k for _, k, _, _ in recs}:
            assert users.get_with_timestamp(k) == table.get(k)
            assert own.get_with_timestamp(k) == last.get(k)
    assert got == want
    # the histories exercise what the model distinguishes
    assert any(e[1]["row"] is None for e in want["enriched"]) and any(e[1]["row"] for e in want["enriched"])
    assert any(e[1]["row"] and e[1]["row"][1] < e[2] for e in want["enriched"])
    assert any(v is None for n, _, v, _ in recs if n == "users")


def test_a_no_op_update_keeps_the_rows_timestamp_and_put_keeps_the_records():
    with TopologyTestDriver(dsl_stores_topology(TOPICS)) as d:
        d.pipe_input("users", "u1", {"tier": "a"}, timestamp=10)
        d.pipe_input("users", "u1", {"tier": "a"}, timestamp=20)    # no-op: the row keeps 10
        d.pipe_input("clicks", "u1", {"x": 1}, timestamp=30)
        d.pipe_input("clicks", "u1", {"x": 2}, timestamp=25)        # older: the count keeps 30
        d.pipe_input("users", "u1", {"tier": "b"}, timestamp=40)
        d.pipe_input("clicks", "u1", {"x": 3}, timestamp=50)
        assert [(r.value, r.timestamp) for r in d.read_output("enriched")] == [
            ({"x": 1, "row": [{"tier": "a"}, 10], "prev": None}, 30),
            ({"x": 2, "row": [{"tier": "a"}, 10], "prev": [1, 30]}, 25),
            ({"x": 3, "row": [{"tier": "b"}, 40], "prev": [2, 25]}, 50)]
        assert [(r.value, r.timestamp) for r in d.read_output("counted")] == [([1, 30], 30), ([2, 30], 25),
                                                                             ([3, 50], 50)]
        assert [(r.value, r.timestamp) for r in d.read_output("stamped")] == [
            ({"v": {"tier": "a"}, "row": [{"tier": "a"}, 10]}, 10),
            ({"v": {"tier": "b"}, "row": [{"tier": "b"}, 40]}, 40)]
        assert d.get_store("users").get_with_timestamp("u1") == ValueAndTimestamp({"tier": "b"}, 40)
        assert d.get_store("users").get_with_timestamp("nobody") is None


class Writer(Processor):
    """Writes the table's store on a record whose x is 13 (``put``) or 14 (``delete``)."""

    def init(self, context):
        self.ctx = context
        self.users = context.get_state_store("users")

    def process(self, record):
        if record.value["x"] == 13:
            self.users.put(record.key, {"tier": "hacked"})
        elif record.value["x"] == 14:
            self.users.delete(record.key)
        self.ctx.forward(record._replace(value=_row(self.users.get_with_timestamp(record.key))))


def _writer_topology():
    b = StreamsBuilder()
    b.table("users", store_name="users")
    b.stream("clicks").process(Writer, stores=["users"], name="writer").to("out")
    return b.build()


@pytest.mark.parametrize("policy", ["dlq", "skip", "fail"])
def test_a_write_to_a_dsl_store_is_an_error_naming_the_store_and_step_under_the_policy(policy):
    recs = [("u1", {"x": 1}), ("u1", {"x": 13}), ("u1", {"x": 2}), ("u1", {"x": 14}), ("u1", {"x": 3})]
    with TopologyTestDriver(_writer_topology(), on_error=policy) as d:
        d.pipe_input("users", "u1", {"tier": "a"}, timestamp=5)
        if policy == "fail":
            d.pipe_input("clicks", *recs[0], timestamp=10)
            with pytest.raises(UserFunctionError) as err:
                d.pipe_input("clicks", *recs[1], timestamp=11)
            assert isinstance(err.value.__cause__, ReadOnlyStoreError)
            assert err.value.step == "writer"
            assert "store 'users' is read-only in writer" in str(err.value)
            assert d.get_store("users").get_with_timestamp("u1") == ValueAndTimestamp({"tier": "a"}, 5)
            return
        for i, (k, v) in enumerate(recs):
            d.pipe_input("clicks", k, v, timestamp=10 + i)
        assert [(r.value, r.timestamp) for r in d.read_output("out")] == [
            ([{"tier": "a"}, 5], 10), ([{"tier": "a"}, 5], 12), ([{"tier": "a"}, 5], 14)]
        assert d.get_store("users").get_with_timestamp("u1") == ValueAndTimestamp({"tier": "a"}, 5)
        dead = d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes())
    if policy == "dlq":
        assert [(r.value, r.timestamp) for r in dead] == [(b'{"x":13}', 11), (b'{"x":14}', 13)]
        msgs = [dict(r.headers)["__streams.errors.message"].decode() for r in dead]
        assert "ReadOnlyStoreError: store 'users' is read-only in writer" in msgs[0]
        assert "may read but not put into" in msgs[0] and "may read but not delete from" in msgs[1]
    else:
        assert dead == []


def test_a_processor_reading_a_table_shares_its_sub_topology_and_is_co_partitioned_with_it():
    topo = dsl_stores_topology({n: f"t-{n}" for n in TOPICS})
    # the table, the clicks, the count and the three processors: one sub-topology (to_table
    # after a process() repartitions: the key may have changed)
    assert [[n.name for n in sub if n.source_topic] for sub in topo.subtopologies] == [
        ["KTABLE-SOURCE-0000000000", "KSTREAM-SOURCE-0000000001"], ["KSTREAM-SOURCE-0000000007"]]
    assert {n.name for n in topo.subtopologies[0]} >= {"KSTREAM-PROCESSOR-0000000003", "KSTREAM-PROCESSOR-0000000010",
                                                       "KSTREAM-PROCESSOR-0000000012", "KTABLE-AGGREGATE-0000000002"}
    assert topo.copartition_constraints() == [("KSTREAM-PROCESSOR-0000000003", ["t-clicks"], ["t-users"])]
    text = topo.describe()
    assert "Processor: KSTREAM-PROCESSOR-0000000003 (stores: [users, last])" in text
    assert "Processor: KSTREAM-PROCESSOR-0000000010 (stores: [users])" in text
    assert "users (kv; owner: KTABLE-SOURCE-0000000000;" in text


def test_which_dsl_stores_connect_and_which_are_refused():
    from processor import TimeWindows

    b = StreamsBuilder()
    b.global_table("g", name="g-store")
    s = b.stream("s")
    s.group_by_key().windowed_by(TimeWindows.of(10)).count(name="windowed")
    with pytest.raises(TopologyError, match="store 'windowed' \\(windowed-aggregate, of .*\\) cannot be connected"):
        s.process(Writer, stores=["windowed"])
    with pytest.raises(TopologyError, match="store 'windowed.emitted' \\(emitted"):
        s.process(Writer, stores=["windowed.emitted"])
    with pytest.raises(TopologyError, match="store 'g-store' is a global table's"):
        s.process(Writer, stores=["g-store"])
    with pytest.raises(TopologyError, match="no store 'later' was added .* or materialized by a table defined "
                                            "before this process"):
        s.process(Writer, stores=["later"])
    # to_table's and a named join result's stores connect
    t = s.to_table(name="latest")
    t.join(b.table("other", store_name="o"), lambda a, c: [a, c], name="joined")
    s.process(Writer, stores=["latest", "joined", "o"]).to("out")
    topo = b.build()
    assert len([sub for sub in topo.subtopologies if any(n.source_topic == "s" for n in sub)]) == 1
