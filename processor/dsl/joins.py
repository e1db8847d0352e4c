"""Join builders behind the table joins and the stream-table joins.

They build ``KTable.join/left_join/outer_join``, ``KTable.join_on_foreign_key`` and
``KStream.join/left_join`` with a table. (Stream-stream joins: ``processor/dsl/stream_join.py``.)

Graph shapes (node names as in Kafka Streams):

* table-table, primary key: ``KTABLE-JOINTHIS`` (left changes, looks up the right table) and
  ``KTABLE-JOINOTHER`` (right changes, looks up the left) both write the result store and feed
  ``KTABLE-MERGE``, the result table. A table joined with itself is rewritten by the
  ``self-join`` pass (``topology.py``) into one ``KTABLE-JOINTHIS`` running ``TableSelfJoin``.
* stream-table: ``KSTREAM-JOIN`` looks up the table; both are in one sub-topology
  (co-partitioned).
* foreign key: see ``processor/operators/foreign_key_join.py``; two internal topics,
  ``<app>-<name>-subscription-registration-topic`` (partitioned like the right table) and
  ``<app>-<name>-subscription-response-topic`` (partitioned like the left table).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from processor.dsl.abstract_stream import builder_of, graph_node_of
from processor.errors import TopologyError
from processor.graph import (
    GetterSpec,
    JoinResultAttrs,
    JoinSideAttrs,
    SelfJoin,
    SinkAttrs,
    SourceAttrs,
    TableAttrs,
    getter_spec,
)
from processor.operators.foreign_key_join import (
    ForeignKeyJoinResponder,
    ForeignKeyJoinResponseResolver,
    ForeignKeyJoinSubscriptionReceiver,
    ForeignKeyJoinSubscriptionSender,
)
from processor.operators.sink import PassThrough, Sink
from processor.operators.source import StreamSource
from processor.operators.table_join import HOWS, SelfJoinValueGetter, StreamTableJoin, TableJoinSide, TableSelfJoin
from processor.operators.value_getter import StoreValueGetter, table_getter
from processor.serde import Serde, Serdes
from processor.topology import LogicalNode, StoreSpec

if TYPE_CHECKING:  # pragma: no cover
    from processor.dsl.kstream import KStream
    from processor.dsl.ktable import KTable
    from processor.functions import ForeignKeyExtractor, ValueJoiner


def _check_table(other: Any, what: str) -> None:
    if getattr(other, "dsl_kind", None) != "table":
        raise TopologyError(f"{what} takes a KTable, not {type(other).__name__}")
    if getter_spec(graph_node_of(other)) is None:
        raise TopologyError(f"{what}: the table produced by {graph_node_of(other).name} cannot be looked up "
                            f"(a windowed aggregate, or a table built from a stream)")


def _store_getter(store: str, value_serde: Serde) -> GetterSpec:
    return GetterSpec(lambda n, ctx: StoreValueGetter(ctx.get_store(store), value_serde), stores=(store,))


# -- primary-key table-table joins ------------------------------------------------------------
def table_table_join(left: KTable, right: KTable, joiner: ValueJoiner, how: str, name: str | None,
                     value_serde: Serde | None) -> KTable:
    """``KTable.join/left_join/outer_join``: the two join sides, their merge and the result store."""
    if how not in HOWS:
        raise TopologyError(f"how must be one of {HOWS}, not {how!r}")
    _check_table(left, "join")
    _check_table(right, "join")
    if builder_of(left) is not builder_of(right):
        raise TopologyError("both tables of a join must come from one StreamsBuilder")
    b = builder_of(left)
    vs = value_serde or Serdes.json()
    ks = left.key_serde
    result_store = b.peek_name("KTABLE-JOIN-STATE-STORE", name)
    b.check_store_names_free(result_store)
    this_name, other_name, merge_name = (b.new_name("KTABLE-JOINTHIS"), b.new_name("KTABLE-JOINOTHER"),
                                         b.new_name("KTABLE-MERGE"))
    this = LogicalNode(
        name=this_name, kind="processor",
        factory=lambda n: TableJoinSide(n.name, "left", n.lookups[0], joiner, how, result_store, ks, vs),
        stores=[result_store], lookups=[graph_node_of(right)],
        attrs=JoinSideAttrs(self_join=SelfJoin(kind="table", how=how, other=other_name, merge=merge_name,
                                               store=result_store, named=name is not None,
                                               rewrite=_rewrite_table_self_join(joiner, vs))))
    other = LogicalNode(
        name=other_name, kind="processor",
        factory=lambda n: TableJoinSide(n.name, "right", n.lookups[0], joiner, how, result_store, ks, vs),
        stores=[result_store], lookups=[graph_node_of(left)], attrs=JoinSideAttrs())
    b.add_node(this, graph_node_of(left))
    b.add_node(other, graph_node_of(right))
    merge = LogicalNode(name=merge_name, kind="processor", factory=lambda n: PassThrough(n.name),
                        value_preserving=True, attrs=JoinResultAttrs(getter=_store_getter(result_store, vs)))
    b.add_node(merge, this, other)
    b.add_store(StoreSpec(result_store, this.name, None, ks, vs))
    return b.table_of(merge, ks, vs, store_name=result_store)


def _rewrite_table_self_join(joiner: ValueJoiner, vs: Serde) -> Callable[[Any, Any], None]:
    """The ``self-join`` rewrite of a table joined with itself on its primary key.

    Provably equal for inner, left AND outer joins: both sides of a key are the same row, so
    they are present or absent together, and every kind yields ``joiner(v, v)`` exactly when
    ``v`` exists. The unoptimized join computes the same: its result store holds
    ``joiner(old, old)``, the first side's pass finds ``joiner(new, new)`` (the table's store
    is already updated) and the second side's pass finds nothing left to change. The result
    store becomes unnecessary: the result is read through the table's own store.
    """

    def rewrite(topology: Any, this: Any) -> None:
        info = this.attrs.self_join
        other = topology.node(info.other)
        merge = topology.node(info.merge)
        topology.remove_node(other)
        del topology.stores[info.store]
        table = this.parents[0]
        this.factory = lambda n: TableSelfJoin(n.name, joiner, vs)
        this.lookups = []
        this.stores = []   # it owns none; describe() shows the table's, which it reads
        this.attrs = replace(this.attrs, self_join=None, self_join_of=table.name)
        merge.attrs = replace(merge.attrs, getter=GetterSpec(
            lambda n, ctx: SelfJoinValueGetter(table_getter(n.parents[0].parents[0], ctx), joiner, n.name)))
    return rewrite


# -- stream-table joins -----------------------------------------------------------------------
def stream_table_join(stream: KStream, table: KTable, joiner: ValueJoiner, how: str, name: str | None) -> KStream:
    """``KStream.join/left_join`` with a table: one node that looks the table up."""
    _check_table(table, "stream-table join")
    b = builder_of(stream)
    ks = stream.key_serde
    node = LogicalNode(name=b.new_name("KSTREAM-JOIN", name), kind="processor",
                       factory=lambda n: StreamTableJoin(n.name, n.lookups[0], joiner, how, ks),
                       lookups=[graph_node_of(table)])
    b.add_node(node, graph_node_of(stream))
    return b.stream_of(node, ks, Serdes.json())


# -- foreign-key joins (KIP-213) --------------------------------------------------------------
def foreign_key_join(left: KTable, right: KTable, fk_extractor: ForeignKeyExtractor, joiner: ValueJoiner, how: str,
                     name: str | None, value_serde: Serde | None) -> KTable:
    """``KTable.join_on_foreign_key``: the subscription and response topics and their five operators."""
    if how not in ("inner", "left"):
        raise TopologyError(f"a foreign-key join is how='inner' or how='left', not {how!r}")
    _check_table(left, "join_on_foreign_key")
    _check_table(right, "join_on_foreign_key")
    b = builder_of(left)
    base = b.new_name("KTABLE-FK-JOIN", name)
    result_store, version_store, sub_store = base, f"{base}-version-store", f"{base}-subscription-store"
    b.check_store_names_free(result_store, version_store, sub_store)
    sub_topic = f"{base}-subscription-registration-topic"
    resp_topic = f"{base}-subscription-response-topic"
    lks, rks, rvs = left.key_serde, right.key_serde, right.value_serde
    from processor.topology.serdes import holds_registry_serde

    for what, serde in (("key", rks), ("value", rvs)):
        if holds_registry_serde(serde):
            # (the response topic carries the right row re-serialized with it, and a registry
            # serde is bound to a topic only for sources, sinks and stores)
            raise TopologyError(
                f"join_on_foreign_key {base!r}: the right table's {what} serde {serde!r} is a Schema "
                f"Registry serde, which a foreign-key join cannot use yet (it sends right rows through "
                f"its response topic); read the right table with a fixed-schema Serdes.avro(schema) or "
                f"Serdes.json()" + (", or map it into a table of such values first (right.map_values("
                                      "lambda v: v))" if what == "value" else ""))
    vs = value_serde or Serdes.json()
    raw = Serdes.bytes()

    def internal_sink(topic: str, parents: list[LogicalNode], coalesce: str,
                      route_like: str | None = None) -> LogicalNode:
        # Subscriptions go to the right table's partition of the foreign key under the RIGHT
        # TABLE'S partitioner (``route_like``, resolved to its source topics by the topology);
        # responses name the left row's partition themselves (``Routed``).
        node = LogicalNode(
            name=b.new_name("KTABLE-SINK"), kind="sink", sink_topic=topic,
            factory=lambda n: Sink(n.name, n.sink_topic, raw, raw, internal=True,
                                   route_like=(cast(SinkAttrs, n.attrs).route_like_topics or (None,))[0]),
            attrs=SinkAttrs(key_serde=raw, value_serde=raw, internal_topic=topic, partitions_from="reader",
                            route_like=route_like, coalesce=coalesce))
        b.add_node(node, *parents)
        return node

    def internal_source(topic: str, dedup: bool) -> LogicalNode:
        node = LogicalNode(
            name=b.new_name("KTABLE-SOURCE"), kind="source", source_topic=topic,
            factory=lambda n: StreamSource(n.name, n.source_topic, raw, raw),
            attrs=SourceAttrs(key_serde=raw, value_serde=raw, internal_topic=topic, dedup=dedup,
                              partitioning="explicit"))
        b.add_node(node)
        return node

    send = LogicalNode(
        name=b.new_name("KTABLE-FK-JOIN-SUBSCRIPTION-SEND"), kind="processor",
        factory=lambda n: ForeignKeyJoinSubscriptionSender(n.name, fk_extractor, lks, rks, joiner, how,
                                                          version_store, result_store, vs),
        stores=[version_store, result_store])
    b.add_node(send, graph_node_of(left))
    internal_sink(sub_topic, [send], "subscription", route_like=graph_node_of(right).name)
    sub_source = internal_source(sub_topic, dedup=False)
    receive = LogicalNode(
        name=b.new_name("KTABLE-FK-JOIN-SUBSCRIPTION-RECEIVE"), kind="processor",
        factory=lambda n: ForeignKeyJoinSubscriptionReceiver(n.name, n.lookups[0], sub_store, rks, rvs),
        stores=[sub_store], lookups=[graph_node_of(right)])
    b.add_node(receive, sub_source)
    respond = LogicalNode(
        name=b.new_name("KTABLE-FK-JOIN-RESPOND"), kind="processor",
        factory=lambda n: ForeignKeyJoinResponder(n.name, sub_store, rks, rvs), stores=[sub_store])
    b.add_node(respond, graph_node_of(right))
    internal_sink(resp_topic, [receive, respond], "response")
    resp_source = internal_source(resp_topic, dedup=False)
    resolve = LogicalNode(
        name=b.new_name("KTABLE-FK-JOIN-RESOLVE"), kind="processor",
        factory=lambda n: ForeignKeyJoinResponseResolver(n.name, n.lookups[0], fk_extractor, lks, rks, rvs,
                                                        joiner, how, version_store, result_store, vs),
        stores=[version_store, result_store], lookups=[graph_node_of(left)])
    b.add_node(resolve, resp_source)
    output = LogicalNode(name=b.new_name("KTABLE-FK-JOIN-OUTPUT"), kind="processor",
                         factory=lambda n: PassThrough(n.name), value_preserving=True,
                         attrs=TableAttrs(getter=_store_getter(result_store, vs), result_store=result_store))
    b.add_node(output, send, resolve)
    b.add_store(StoreSpec(result_store, send.name, None, lks, vs))
    b.add_store(StoreSpec(version_store, send.name, None, lks, None, kind="version"))
    b.add_store(StoreSpec(sub_store, receive.name, None, raw, None, kind="subscription"))
    return b.table_of(output, lks, vs, store_name=result_store)
