"""Topologies for backfill tests that run ``processor backfill MODULE:ATTR`` as a subprocess: topic
names come from environment variables (the command takes a module attribute, not arguments), so
each test passes its own unique topics. Each ``ATTR`` is a zero-argument function returning a
Topology; ``*_for(topics)`` builds the same topology from a dict, for the in-process side of a
comparison (the test driver, ``backfill.run``)."""

from __future__ import annotations

import os

from processor import StreamsBuilder

# -- a history that takes a while: repartition + aggregation, and a foreign-key join --------------
ORDERS_ENV = "BF_TEST_ORDERS"
CUSTOMERS_ENV = "BF_TEST_CUSTOMERS"


def fk_aggregate_for(orders: str, customers: str):
    """orders (pk -> {"customer", "amount"}) table; customers (pk -> {"tier"}) table.
    Stores: ``orders``, ``customers``; ``revenue-by-customer`` (repartition + integer sum);
    ``enriched`` (FK left join orders -> customers); ``revenue-by-tier`` (repartition of the
    join result + integer sum)."""
    b = StreamsBuilder()
    o = b.table(orders, store_name="orders")
    c = b.table(customers, store_name="customers")
    o.group_by(lambda k, v: (v["customer"], v["amount"])).aggregate(
        lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v, name="revenue-by-customer")
    enriched = o.join_on_foreign_key(
        c, lambda v: v["customer"],
        lambda order, cust: {"amount": order["amount"], "tier": cust["tier"] if cust else "none"},
        how="left", name="enriched")
    enriched.group_by(lambda k, v: (v["tier"], v["amount"])).aggregate(
        lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v, name="revenue-by-tier")
    return b.build()


def fk_aggregate():
    return fk_aggregate_for(os.environ[ORDERS_ENV], os.environ[CUSTOMERS_ENV])


# -- outputs: a table sink, a stream sink, two aggregate sinks ---------------------------------------
OUTPUT_ENVS = {"items": "BF_TEST_ITEMS", "events": "BF_TEST_EVENTS", "out_table": "BF_TEST_OUT_TABLE",
               "out_stream": "BF_TEST_OUT_STREAM", "out_sum": "BF_TEST_OUT_SUM", "out_count": "BF_TEST_OUT_COUNT"}


def sinks_for(t: dict):
    """``items`` table (pk -> {"n", "g"}), ``events`` stream (user -> {"x"}). Sinks:
    ``out_table`` = items.filter(n % 3 != 0).to_stream() (a table sink: transitions give
    tombstones); ``out_stream`` = events.filter(x even) (a stream sink); ``out_sum`` = items
    grouped by g, sum of n (table aggregate, repartition); ``out_count`` = events counted per user
    (stream aggregate)."""
    b = StreamsBuilder()
    items = b.table(t["items"], store_name="items")
    items.filter(lambda k, v: v["n"] % 3 != 0).to_stream().to(t["out_table"])
    events = b.stream(t["events"])
    events.filter(lambda k, v: v["x"] % 2 == 0).to(t["out_stream"])
    items.group_by(lambda k, v: (v["g"], v["n"])).aggregate(
        lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v, name="sum-by-g"
    ).to_stream().to(t["out_sum"])
    events.group_by_key().count(name="count-by-user").to_stream().to(t["out_count"])
    return b.build()


def sinks():
    return sinks_for({name: os.environ[env] for name, env in OUTPUT_ENVS.items()})


# -- poison records: a table and a stream whose topics hold records that do not deserialize ---------
POISON_ENVS = {"accounts": "BF_TEST_ACCOUNTS", "payments": "BF_TEST_PAYMENTS", "rich": "BF_TEST_RICH",
               "profiles": "BF_TEST_PROFILES", "vip": "BF_TEST_VIP"}


def poison_for(t: dict):
    """``accounts`` table (pk -> {"bal", "region"}) -> ``rich`` (filter, a table sink) and
    ``bal-by-region`` (repartition + integer sum): replayed record by record; ``profiles`` table
    (pk -> {"bal", "region"}) -> ``vip`` (filter, a table sink) only: compacted by the backfill
    (docs/backfill.md "What it does", step 4); ``payments`` stream counted per key (``payments-per-account``)."""
    b = StreamsBuilder()
    acc = b.table(t["accounts"], store_name="accounts")
    acc.filter(lambda k, v: v["bal"] > 10).to_stream().to(t["rich"])
    acc.group_by(lambda k, v: (v["region"], v["bal"])).aggregate(
        lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v, name="bal-by-region")
    b.table(t["profiles"], store_name="profiles").filter(lambda k, v: v["bal"] > 20).to_stream().to(t["vip"])
    b.stream(t["payments"]).group_by_key().count(name="payments-per-account")
    return b.build()


def poison():
    return poison_for({name: os.environ[env] for name, env in POISON_ENVS.items()})


# -- outputs of a table the backfill compacts (read only by a filter feeding a sink) ------------------
def compacted_sink_for(t: dict):
    """``catalog`` table (pk -> {"n"}) -> filter(n % 3 != 0) -> ``out_catalog``: a source the
    backfill reduces to the last real changes per key."""
    b = StreamsBuilder()
    b.table(t["catalog"], store_name="catalog").filter(lambda k, v: v["n"] % 3 != 0).to_stream().to(t["out_catalog"])
    return b.build()


# -- a reduced table whose filter raises on some values (on-error policy over a compacted source) -----
def failing_catalog_for(t: dict):
    """``catalog`` table (pk -> {"n"}) -> filter (raises on n % 13 == 0, passes n % 3 != 0) ->
    ``out_catalog``: compacted by plan, but a failing record makes the backfill replay the task's
    history record by record (the worker keeps a key's previous value when its update fails)."""
    b = StreamsBuilder()

    def not_three(k, v):
        if v["n"] % 13 == 0:
            raise ValueError(f"n={v['n']}: unlucky")
        return v["n"] % 3 != 0

    b.table(t["catalog"], store_name="catalog").filter(not_three).to_stream().to(t["out_catalog"])
    return b.build()


# -- Processor API window and session stores (issue 34) -------------------------------------------
class KeepAll:
    """Every record into a window store retaining duplicates (window: the record's time // 10 * 10)."""

    def init(self, context):
        self.w = context.get_state_store("dups")

    def process(self, record):
        self.w.put(record.key, record.value["x"], record.timestamp // 10 * 10)

    def close(self):
        pass


def windowed_stores_for(t: dict):
    """``s`` stream (user -> {"x"}): Kafka Streams' EventDeduplication on a window store (an id
    per key and x % 5, remembered 100 ms) -> ``out``; a sessionizer on a session store (gap 40)
    whose merged sessions are counted by key (``merges``); every record kept in a window store
    retaining duplicates (``dups``)."""
    from processor import Stores
    from processor.serde import Serdes
    from tests.unit.test_papi_session_store import Sessionizer40
    from tests.unit.test_papi_window_store import Deduplication

    b = StreamsBuilder()
    b.add_state_store(Stores.window("eventId-store", 100, 100, key_serde=Serdes.string(), value_serde=Serdes.json()))
    b.add_state_store(Stores.window("dups", 60, 10, retain_duplicates=True))
    b.add_state_store(Stores.session("sessions", 300))
    s = b.stream(t["s"])
    s.process(lambda: Deduplication(100, lambda k, v: f"{k}:{v['x'] % 5}"), stores=["eventId-store"]).to(t["out"])
    s.process(Sessionizer40, stores=["sessions"]).group_by_key().count(name="merges")
    s.process(KeepAll, stores=["dups"])
    return b.build()
