"""Topologies of the partitioning tests (issue 12), in-process (functions with topic arguments) and
as ``processor run tests.integration.partitioning_apps:<factory>`` (zero-argument factories that
take their topic names from the environment).

Domain: orders (pk -> {"customer": fk | None, "n": int, "qty": int}), customers
(fk -> {"region": str, "name": str}), shipments (keyed like orders -> {"carrier": str, "status": str}).
"""

import os

from processor import StreamsBuilder

NO_REGION = "(none)"


def order_customer(order):
    return order["customer"]


def join_order_customer(order, customer):
    """The foreign-key (left) join's row."""
    return {"n": order["n"], "qty": order["qty"], "customer": order["customer"],
            "region": None if customer is None else customer["region"],
            "name": None if customer is None else customer["name"]}


def join_order_shipment(order, shipment):
    """The primary-key (inner) join's row."""
    return {"n": order["n"], "qty": order["qty"], "carrier": shipment["carrier"], "status": shipment["status"]}


def by_region(key, row):
    return (row["region"] or NO_REGION, row)


def _zero():
    return 0


def add_qty(key, row, total):
    return total + row["qty"]


def sub_qty(key, row, total):
    return total - row["qty"]


def issue12_topology(orders: str, customers: str, shipments: str, fk_out: str, pk_out: str,
                     count_out: str, sum_out: str, partitioner: str | None = None):
    """The issue's topology: ``orders`` left-joined on a foreign key with ``customers``
    (``fk_out``, store ``orders-customers``), ``orders`` inner-joined on the primary key with
    ``shipments`` (``pk_out``, store ``orders-shipments``), and over the foreign-key join's result
    the number of orders (``count_out``) and the sum of their "qty" (``sum_out``) per customer
    region (``NO_REGION`` for an order without a customer), both through repartition topics.
    ``partitioner``: declared on all three sources (None: detected at start)."""
    b = StreamsBuilder()
    o = b.table(orders, partitioner=partitioner)
    c = b.table(customers, partitioner=partitioner)
    s = b.table(shipments, partitioner=partitioner)
    fk = o.join_on_foreign_key(c, order_customer, join_order_customer, how="left", name="orders-customers")
    fk.to_stream().to(fk_out)
    o.join(s, join_order_shipment, name="orders-shipments").to_stream().to(pk_out)
    fk.group_by(by_region).count(name="orders-per-region").to_stream().to(count_out)
    fk.group_by(by_region).aggregate(_zero, add_qty, sub_qty, name="qty-per-region").to_stream().to(sum_out)
    return b.build()


def fk_topology(orders: str, customers: str, out: str, customers_partitioner: str | None = None):
    """``orders`` left-joined on a foreign key with ``customers`` (declared ``customers_partitioner``)."""
    b = StreamsBuilder()
    o = b.table(orders)
    c = b.table(customers, partitioner=customers_partitioner)
    o.join_on_foreign_key(c, order_customer, join_order_customer, how="left", name="orders-customers") \
        .to_stream().to(out)
    return b.build()


def pk_topology(orders: str, shipments: str, out: str):
    """``orders`` inner-joined on the primary key with ``shipments``."""
    b = StreamsBuilder()
    b.table(orders).join(b.table(shipments), join_order_shipment, name="orders-shipments").to_stream().to(out)
    return b.build()


# -- for `processor run` ---------------------------------------------------------------------------

def fk_declared_murmur2():
    """$APP_ORDERS left-joined on a foreign key with $APP_CUSTOMERS, declared ``murmur2``, to $APP_OUTPUT."""
    return fk_topology(os.environ["APP_ORDERS"], os.environ["APP_CUSTOMERS"], os.environ["APP_OUTPUT"],
                       customers_partitioner="murmur2")


def fk_detected():
    """$APP_ORDERS left-joined on a foreign key with $APP_CUSTOMERS (partitioner detected), to $APP_OUTPUT."""
    return fk_topology(os.environ["APP_ORDERS"], os.environ["APP_CUSTOMERS"], os.environ["APP_OUTPUT"])


def pk_detected():
    """$APP_ORDERS inner-joined on the primary key with $APP_SHIPMENTS, to $APP_OUTPUT."""
    return pk_topology(os.environ["APP_ORDERS"], os.environ["APP_SHIPMENTS"], os.environ["APP_OUTPUT"])
