"""The peer benchmark's workloads (``benchmarks/peers.py``) as this project's topologies: the same
topics, JSON values and results as ``tests/reference/java/BenchTopologies.java`` for Kafka
Streams. ``benchmarks.peer_topologies:topology`` builds the one named by ``$PEER_WORKLOAD``
with the parameters in ``$PEER_PARAMS`` (JSON: ``prefix`` of the input topics, ``out``)."""

from __future__ import annotations

import json
import os

from processor import StreamsBuilder
from processor.serde import Serdes
from processor.topology import Topology

S, J = Serdes.string(), Serdes.json()


def joined(order: dict, customer: dict) -> dict:
    return {"customer": customer, "order": order}


def build(workload: str, prefix: str, out: str) -> Topology:
    b = StreamsBuilder()
    if workload == "stream_filter":
        b.stream(prefix + "orders", S, J).filter(lambda k, v: v["amount"] > 500).to(out, S, J)
    elif workload == "table_filter":
        b.table(prefix + "customer_updates", S, J).filter(lambda k, v: v["amount"] > 500).to_stream().to(out, S, J)
    elif workload == "count":
        b.stream(prefix + "orders_by_customer", S, J).group_by_key().count(value_serde=Serdes.long()).to_stream().to(
            out, S, Serdes.long())
    elif workload == "count_repartition":
        b.stream(prefix + "orders", S, J).group_by(lambda k, v: str(v["customer_id"]), S, J).count(
            value_serde=Serdes.long()).to_stream().to(out, S, Serdes.long())
    elif workload == "stream_table_join":
        customers = b.table(prefix + "customers", S, J)
        b.stream(prefix + "orders_by_customer", S, J).join(customers, joined).to(out, S, J)
    elif workload == "fk_join":
        customers = b.table(prefix + "customers", S, J)
        b.table(prefix + "orders", S, J).join_on_foreign_key(
            customers, lambda v: str(v["customer_id"]), joined).to_stream().to(out, S, J)
    else:
        raise ValueError(f"no workload named {workload!r}")
    return b.build()


def topology() -> Topology:
    params = json.loads(os.environ["PEER_PARAMS"])
    return build(os.environ["PEER_WORKLOAD"], params.get("prefix", ""), params["out"])
