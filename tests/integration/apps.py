"""Topologies the integration tests start as separate worker processes (`processor run`)."""

import os

from processor import StreamsBuilder
from processor.serde import Serdes


def filter_topology(reuse_source_topics: bool = False):
    """orders (table) -> amount > 100 -> output; topic names from the environment."""
    b = StreamsBuilder()
    b.table(os.environ["APP_INPUT"], key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .filter(lambda k, v: v["amount"] > 100).to_stream().to(os.environ["APP_OUTPUT"])
    return b.build(reuse_source_topics=reuse_source_topics)


# -- aggregations (issue 3) ----------------------------------------------------------------------
# Input: a stream keyed by user, value {"amount": int, "region": str}.

def _max_amount(agg, value):
    return agg if agg["amount"] >= value["amount"] else value


def _add_amount(key, value, agg):
    return agg + value["amount"]


def _level(key, value, agg):
    return value["amount"] % 4


def _zero():
    return 0


POLICY_OUTPUTS = ("on-update", "on-change", "every-1000", "window-close", "sum-by-region")


def aggregate_policies_topology():
    """One input stream, five aggregates, one output topic each (``$APP_OUTPUT_PREFIX-<suffix>``,
    suffixes in ``POLICY_OUTPUTS``): max amount per user under ``Emit.on_update()``,
    ``Emit.on_change()`` and ``Emit.every(1000)`` (stream clock); a 10 s tumbling count per user
    with 1 s grace under ``Emit.on_window_close()``; the sum of amounts per region (through the
    repartition topic ``<app>-sum-by-region-repartition``, default ``Emit.on_change()``)."""
    from processor import Emit, TimeWindows

    out = os.environ["APP_OUTPUT_PREFIX"]
    b = StreamsBuilder()
    s = b.stream(os.environ["APP_INPUT"], key_serde=Serdes.string(), value_serde=Serdes.json())
    s.group_by_key().reduce(_max_amount, emit=Emit.on_update(), name="max-on-update") \
        .to_stream().to(f"{out}-on-update")
    s.group_by_key().reduce(_max_amount, emit=Emit.on_change(), name="max-on-change") \
        .to_stream().to(f"{out}-on-change")
    s.group_by_key().reduce(_max_amount, emit=Emit.every(1000), name="max-every-1000") \
        .to_stream().to(f"{out}-every-1000")
    s.group_by_key().windowed_by(TimeWindows.of(10_000).grace(1_000)) \
        .count(emit=Emit.on_window_close(), name="count-10s") \
        .to_stream().to(f"{out}-window-close")
    s.group_by(lambda k, v: v["region"]).aggregate(_zero, _add_amount, name="sum-by-region") \
        .to_stream().to(f"{out}-sum-by-region")
    return b.build()


CRASH_OUTPUTS = ("level", "sum-by-region")


def crash_aggregates_topology():
    """For the crash test: per user the latest ``amount % 4`` under ``Emit.on_change()`` (a third
    of the updates or so are no-ops, so the last-emitted column decides what goes out), and the
    sum of amounts per region through a repartition topic (``Emit.on_change()``). Outputs
    ``$APP_OUTPUT_PREFIX-level`` and ``$APP_OUTPUT_PREFIX-sum-by-region``."""
    from processor import Emit

    out = os.environ["APP_OUTPUT_PREFIX"]
    b = StreamsBuilder()
    s = b.stream(os.environ["APP_INPUT"], key_serde=Serdes.string(), value_serde=Serdes.json())
    s.group_by_key().aggregate(_zero, _level, emit=Emit.on_change(), name="level-on-change") \
        .to_stream().to(f"{out}-level")
    s.group_by(lambda k, v: v["region"]).aggregate(_zero, _add_amount, emit=Emit.on_change(),
                                                   name="sum-by-region") \
        .to_stream().to(f"{out}-sum-by-region")
    return b.build()


# -- foreign-key joins (issue: KIP-213) ----------------------------------------------------------
# Left table: orders, pk -> {"customer": fk | None, "n": int}; right table: customers,
# fk -> {"name": str, "tier": str, "visits": int}. The joiner ignores "visits", so a customer
# update that changes only "visits" leaves every result unchanged (nothing may be re-emitted).

def order_customer(order):
    return order["customer"]


def join_order_customer(order, customer):
    return {"n": order["n"], "customer": order["customer"],
            "name": None if customer is None else customer["name"],
            "tier": None if customer is None else customer["tier"]}


FK_JOINS = ("fk-inner", "fk-left")


def fk_joins_topology(orders: str, customers: str, inner_out: str, left_out: str, optimize: bool = True):
    """ONE topology with two foreign-key joins of the same two tables: ``fk-inner`` (how="inner")
    to ``inner_out`` and ``fk-left`` (how="left") to ``left_out``. Internal topics:
    ``<app>-fk-inner-subscription-registration-topic`` etc."""
    b = StreamsBuilder()
    o = b.table(orders, key_serde=Serdes.string(), value_serde=Serdes.json())
    c = b.table(customers, key_serde=Serdes.string(), value_serde=Serdes.json())
    o.join_on_foreign_key(c, order_customer, join_order_customer, how="inner", name="fk-inner") \
        .to_stream().to(inner_out)
    o.join_on_foreign_key(c, order_customer, join_order_customer, how="left", name="fk-left") \
        .to_stream().to(left_out)
    return b.build(optimize=optimize)


def pair_amounts(a, b):
    return {"a": a["amount"], "b": b["amount"], "sum": a["amount"] + b["amount"]}


def table_self_join_topology(inp: str, out: str, optimize: bool = True):
    """A table joined with itself on its primary key (inner), rewritten by the ``self-join``
    pass when ``optimize`` is on (one store fewer)."""
    b = StreamsBuilder()
    t = b.table(inp, key_serde=Serdes.string(), value_serde=Serdes.json())
    t.join(t, pair_amounts).to_stream().to(out)
    return b.build(optimize=optimize)


def table_join_topology():
    """``$APP_LEFT`` (table) joined with ``$APP_RIGHT`` (table) on the primary key, pairs of
    amounts to ``$APP_OUTPUT``: one sub-topology whose two sources must be co-partitioned."""
    b = StreamsBuilder()
    left = b.table(os.environ["APP_LEFT"], key_serde=Serdes.string(), value_serde=Serdes.json())
    right = b.table(os.environ["APP_RIGHT"], key_serde=Serdes.string(), value_serde=Serdes.json())
    left.join(right, pair_amounts).to_stream().to(os.environ["APP_OUTPUT"])
    return b.build()


# -- reliability (issue 5): a grouped aggregation and a foreign-key join ---------------------------
# orders: pk -> {"customer": fk | None, "n": int, "amount": int}; customers as above.

def _totals_init():
    return {"sum": 0, "orders": 0}


def _totals_add(key, order, agg):
    return {"sum": agg["sum"] + order["amount"], "orders": agg["orders"] + 1}


def _totals_sub(key, order, agg):
    return {"sum": agg["sum"] - order["amount"], "orders": agg["orders"] - 1}


def reliability_topology():
    """Orders (``$APP_ORDERS``) left-joined on their customer (``$APP_CUSTOMERS``) into the table
    ``enriched`` (-> ``$APP_OUTPUT_PREFIX-enriched``), and grouped by customer into ``totals``
    (sum of amounts and number of orders, ``Emit.on_change()``, -> ``$APP_OUTPUT_PREFIX-totals``)
    through the repartition topic ``<app>-totals-repartition``. ``$APP_REUSE_SOURCE_TOPICS=1``:
    built with ``reuse_source_topics``."""
    from processor import Emit

    out = os.environ["APP_OUTPUT_PREFIX"]
    b = StreamsBuilder()
    o = b.table(os.environ["APP_ORDERS"], key_serde=Serdes.string(), value_serde=Serdes.json(),
                store_name="orders-store")
    c = b.table(os.environ["APP_CUSTOMERS"], key_serde=Serdes.string(), value_serde=Serdes.json(),
                store_name="customers-store")
    o.join_on_foreign_key(c, order_customer, join_order_customer, how="left", name="enriched") \
        .to_stream().to(f"{out}-enriched")
    o.group_by(lambda k, v: (v["customer"], v), key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .aggregate(_totals_init, _totals_add, _totals_sub, emit=Emit.on_change(), name="totals") \
        .to_stream().to(f"{out}-totals")
    # $APP_REUSE_SOURCE_TOPICS=1: the two tables restored from their source topics
    return b.build(reuse_source_topics=os.environ.get("APP_REUSE_SOURCE_TOPICS") == "1")


def _ship(enriched, shipment):
    return {"n": enriched["n"], "customer": enriched["customer"], "tier": enriched["tier"],
            "carrier": shipment["carrier"]}


def _carrier_init():
    return {"shipments": 0, "n_sum": 0, "gold": 0}


def _carrier_add(key, v, agg):
    return {"shipments": agg["shipments"] + 1, "n_sum": agg["n_sum"] + v["n"],
            "gold": agg["gold"] + (v["tier"] == "gold")}


def _carrier_sub(key, v, agg):
    return {"shipments": agg["shipments"] - 1, "n_sum": agg["n_sum"] - v["n"],
            "gold": agg["gold"] - (v["tier"] == "gold")}


def convergence_topology():
    """Three table sinks over joins: orders (``$APP_ORDERS``) left-joined on their customer
    (``$APP_CUSTOMERS``) into ``enriched`` (FK join, -> ``$APP_OUTPUT_PREFIX-enriched``); that
    joined on the order id with shipments (``$APP_SHIPMENTS``) into ``shipped`` (PK table-table
    join, -> ``-shipped``); ``shipped`` aggregated per carrier into ``carriers`` (an aggregation
    fed by the join, through a repartition topic, -> ``-carriers``). ``$APP_PARTITIONER``, if
    set, declares the partitioner that wrote the three inputs."""
    from processor import Emit

    out = os.environ["APP_OUTPUT_PREFIX"]
    declared = {"partitioner": os.environ["APP_PARTITIONER"]} if os.environ.get("APP_PARTITIONER") else {}
    b = StreamsBuilder()
    o = b.table(os.environ["APP_ORDERS"], key_serde=Serdes.string(), value_serde=Serdes.json(),
                store_name="orders-store", **declared)
    c = b.table(os.environ["APP_CUSTOMERS"], key_serde=Serdes.string(), value_serde=Serdes.json(),
                store_name="customers-store", **declared)
    s = b.table(os.environ["APP_SHIPMENTS"], key_serde=Serdes.string(), value_serde=Serdes.json(),
                store_name="shipments-store", **declared)
    enriched = o.join_on_foreign_key(c, order_customer, join_order_customer, how="left", name="enriched")
    enriched.to_stream().to(f"{out}-enriched")
    shipped = enriched.join(s, _ship, name="shipped")
    shipped.to_stream().to(f"{out}-shipped")
    shipped.group_by(lambda k, v: (v["carrier"], v), key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .aggregate(_carrier_init, _carrier_add, _carrier_sub, emit=Emit.on_change(), name="carriers") \
        .to_stream().to(f"{out}-carriers")
    return b.build()


def restore_topology():
    """A table of ``$APP_INPUT`` (store ``in-store``, restored from its changelog) forwarded to
    ``$APP_OUTPUT``."""
    b = StreamsBuilder()
    b.table(os.environ["APP_INPUT"], key_serde=Serdes.string(), value_serde=Serdes.json(),
            store_name="in-store").to_stream().to(os.environ["APP_OUTPUT"])
    return b.build()


def _region_of(key, v):
    if v.get("sleep_s"):   # the health test: a user function that hangs for a while
        import time

        time.sleep(v["sleep_s"])
    return v["region"], v


def _region_init():
    return {"accounts": 0, "balance": 0}


def _region_add(key, v, agg):
    return {"accounts": agg["accounts"] + 1, "balance": agg["balance"] + v["balance"]}


def _region_sub(key, v, agg):
    return {"accounts": agg["accounts"] - 1, "balance": agg["balance"] - v["balance"]}


def http_topology():
    """Accounts (``$APP_INPUT``, a table in store ``accounts``, keys placed by confluent-kafka's
    default partitioner) aggregated per region into ``by-region`` (through a repartition topic,
    -> ``$APP_OUTPUT``). An account value with ``sleep_s`` makes the region selector sleep that
    long (a stuck user function)."""
    b = StreamsBuilder()
    accounts = b.table(os.environ["APP_INPUT"], key_serde=Serdes.string(), value_serde=Serdes.json(),
                       store_name="accounts", partitioner="consistent_random")
    accounts.group_by(_region_of, key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .aggregate(_region_init, _region_add, _region_sub, name="by-region") \
        .to_stream().to(os.environ["APP_OUTPUT"])
    return b.build()


def counts_topology():
    """Events of ``$APP_INPUT`` (string keys placed by murmur2) counted per key into store
    ``counts`` (one sub-topology, no repartition), the counts -> ``$APP_OUTPUT``."""
    b = StreamsBuilder()
    b.stream(os.environ["APP_INPUT"], key_serde=Serdes.string(), value_serde=Serdes.json(), partitioner="murmur2") \
        .group_by_key().count(name="counts").to_stream().to(os.environ["APP_OUTPUT"])
    return b.build()


# -- standby replicas (issue 36): orders summed per customer -------------------------------------

def customer_totals_topology(orders: str, out: str):
    """Orders ``{"customer", "amount"}`` of ``orders`` summed per customer into store ``totals``
    (``{"n", "sum"}``, behind a repartition topic), the totals -> ``out``."""
    b = StreamsBuilder()
    (b.stream(orders, key_serde=Serdes.string(), value_serde=Serdes.json())
     .group_by(lambda k, v: v["customer"], key_serde=Serdes.string(), value_serde=Serdes.json())
     .aggregate(lambda: {"n": 0, "sum": 0}, lambda k, v, a: {"n": a["n"] + 1, "sum": a["sum"] + v["amount"]},
                name="totals", value_serde=Serdes.json())
     .to_stream().to(out))
    return b.build()


def customer_orders(lo: int, hi: int, customers: int) -> list[tuple[bytes, bytes]]:
    """Orders ``lo`` to ``hi`` (key: the order number) over ``customers`` customers."""
    import json

    return [(str(i).encode(), json.dumps({"customer": f"c{i % customers}", "amount": i % 13}).encode())
            for i in range(lo, hi)]
