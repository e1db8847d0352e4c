"""The topology of ``benchmarks/backfill.py``, in a module of its own so that ``processor
backfill backfill_topology:topology_from_env`` runs it as a user runs the command (the topics
named by ``BENCH_BACKFILL_ORDERS``, ``BENCH_BACKFILL_CUSTOMERS``, ``BENCH_BACKFILL_OUT``)::

    orders.join_on_foreign_key(customers, order -> customer, -> {amount, region})
          .group_by(region).aggregate({orders: count, amount: sum}) -> output topic
"""

from __future__ import annotations

import os

from processor import StreamsBuilder

JOIN_STORE = "orders-customers"
AGG_STORE = "revenue-by-region"
ENV = ("BENCH_BACKFILL_ORDERS", "BENCH_BACKFILL_CUSTOMERS", "BENCH_BACKFILL_OUT")


def topology(orders, customers, out):
    b = StreamsBuilder()
    o = b.table(orders, store_name="orders")
    c = b.table(customers, store_name="customers")
    enriched = o.join_on_foreign_key(
        c, lambda v: v["customer"], lambda ov, cv: {"amount": ov["amount"], "region": cv["region"]},
        name=JOIN_STORE)
    enriched.group_by(lambda k, v: (v["region"], v["amount"])).aggregate(
        lambda: {"orders": 0, "amount": 0},
        lambda k, v, agg: {"orders": agg["orders"] + 1, "amount": agg["amount"] + v},
        lambda k, v, agg: {"orders": agg["orders"] - 1, "amount": agg["amount"] - v},
        name=AGG_STORE).to_stream().to(out)
    return b.build()


def topology_from_env():
    return topology(*(os.environ[name] for name in ENV))
