"""Typed attributes of the logical graph's nodes: one small class per node kind.

Every ``LogicalNode`` (``processor/topology.py``) carries ``attrs``, an instance of one of these
classes; the DSL creates them, and the graph code, the hosts (worker, test driver) and the
backfill planner read their fields. Which class a node has says what kind of node it is:

=====================  ===============================================================================
``SourceAttrs``        a stream source (node kind ``source``): serdes, internal topic, partitioner
``TableSourceAttrs``   a table source (``table-source``): a source whose table can be looked up
``SinkAttrs``          a sink (``sink``): serdes, internal topic, routing of internal records
``ProcessorAttrs``     a processor with nothing to declare (stream filter, map_values, merge, ...)
``TableAttrs``         a processor whose output is a table (table filter/map_values, FK join output)
``AggregateAttrs``     a grouped aggregation (count/reduce/aggregate): its emission policy, windows
``JoinSideAttrs``      one side of a two-sided join (``JOINTHIS``/``JOINOTHER``): self-join rewrite
``JoinResultAttrs``    the node that merges a two-sided join's sides into its result
``ToStreamAttrs``      ``KTable.to_stream()``: a sink right after it carries a table's changelog
=====================  ===============================================================================

The classes are frozen: a graph pass that changes a node's attributes (the self-join rewrite,
``Topology`` marking pass-through sinks and resolving routes) gives the node a changed copy
(``dataclasses.replace``), so graphs cloned from one another never share a change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from processor.dsl.emit import Emit
    from processor.dsl.windows import TimeWindows


@dataclass(frozen=True)
class GetterSpec:
    """How to look up the current value of the table a node produces (joins do).

    ``factory(node, context)`` returns a value getter for one task (``processor/operators/
    value_getter.py``). ``stores``: the stores such a lookup reads, shown by ``describe()``;
    ``None`` when the node reads through its first parent's table (a filter, a mapper)."""

    factory: Callable[[Any, Any], Any]
    stores: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class NodeAttrs:
    """Base of every node kind's attributes."""


@dataclass(frozen=True, kw_only=True)
class ProcessorAttrs(NodeAttrs):
    """A processor with nothing to declare: stream filter/map_values/merge, group-by selectors,
    a stream-table join, the steps of a foreign-key join."""


@dataclass(frozen=True, kw_only=True)
class SourceAttrs(NodeAttrs):
    """A stream source (node kind ``source``) of ``LogicalNode.source_topic``."""

    key_serde: Any
    value_serde: Any
    # The base name (``<name>-repartition``, ``<name>-subscription-...-topic``) of the internal
    # topic it reads; the application's copy of the topology reads ``<application-id>-<base>``.
    # None: a user topic.
    internal_topic: str | None = None
    # An internal topic's replays are dropped by provenance; False where applying a record twice
    # is harmless and a replay must be applied again (foreign-key subscriptions and responses).
    dedup: bool = True
    # "explicit": its records are sent to a partition they name (foreign-key join internal
    # topics), so its partitioning places no key; None: placed by a partitioner.
    partitioning: str | None = None
    # The librdkafka name of the partitioner declared for this (user) topic; None: undeclared.
    partitioner: str | None = None
    # fn(key, value, record_timestamp) -> event time in ms (StreamsBuilder ``timestamp_extractor``)
    timestamp_extractor: Any = None

    @property
    def internal(self) -> bool:
        return self.internal_topic is not None


@dataclass(frozen=True, kw_only=True)
class TableSourceAttrs(SourceAttrs):
    """A table source (node kind ``table-source``): a source materialized in a store."""

    getter: GetterSpec


@dataclass(frozen=True, kw_only=True)
class SinkAttrs(NodeAttrs):
    """A sink (node kind ``sink``) to ``LogicalNode.sink_topic``."""

    key_serde: Any
    value_serde: Any
    internal_topic: str | None = None        # as ``SourceAttrs.internal_topic``
    # "reader": the internal topic is sized like the sub-topology that reads it (foreign-key
    # subscription and response topics), not like the ones that write it.
    partitions_from: str | None = None
    # The name of a node whose source topics' partitioner routes this sink's records (foreign-key
    # subscriptions go to the right table's partition); resolved by the ``Topology`` to those
    # topics, ``route_like_topics``.
    route_like: str | None = None
    route_like_topics: tuple[str, ...] = ()
    # "subscription" / "response": a foreign-key join's internal topic whose records a task may
    # hold until its commit, a later one replacing an earlier (processor/engine/fk_join_coalescing.py)
    coalesce: str | None = None
    # Set by the ``Topology``: the sink forwards its source's value bytes unchanged (every node
    # between them preserves the value object and the serdes are the same).
    passthrough: bool = False
    # Set by the ``Topology``: the sink is a user topic fed straight by one table's
    # ``to_stream()``, the only sink of its topic, and that table can be looked up: its records
    # carry their origin and a task reopened after a crash makes the topic converge to the table
    # (``processor/runtime/sink_tails.py``).
    carries_table: bool = False
    # the key serde of the stream the sink was attached to (the table's), when ``to()`` named another
    stream_key_serde: Any = None
    # ``to(extractor)``: ``extractor(key, value) -> topic`` names each record's topic (the node
    # has no ``sink_topic``)
    extractor: Any = None
    # ``repartition(partitions=n)``: the internal topic's partition count, as declared
    partitions: int | None = None

    @property
    def internal(self) -> bool:
        return self.internal_topic is not None


@dataclass(frozen=True, kw_only=True)
class TableAttrs(NodeAttrs):
    """A processor whose output is a table. ``getter``: how joins look that table up (None: it
    cannot be looked up)."""

    getter: GetterSpec | None = None
    # The store holding the bytes of every value this node forwards (a foreign-key join's result):
    # a sink below it through value-preserving steps with that store's serde writes those bytes
    # (``Sink.passthrough``; the operator names them while it forwards, ``MaterializedResult.emit``).
    result_store: str | None = None


@dataclass(frozen=True, kw_only=True)
class AggregateAttrs(TableAttrs):
    """A grouped aggregation: ``kind`` is count, reduce or aggregate; ``emit`` its emission
    policy; ``windows`` its ``TimeWindows`` (None: not windowed; a windowed aggregate has no
    getter)."""

    kind: str
    emit: Emit
    windows: TimeWindows | None = None


@dataclass(frozen=True, kw_only=True)
class JoinResultAttrs(TableAttrs):
    """The node that merges the two sides of a join into its result (``KTABLE-MERGE``,
    ``KSTREAM-MERGE`` of a stream-stream join). Its inputs are co-partitioned by the join itself,
    so the merge needs no check of its own. ``getter``: the result table's (None for a stream)."""


@dataclass(frozen=True, kw_only=True)
class SelfJoin:
    """Set by a join builder on the first side of a join that the ``self-join`` pass
    (``topology.passes.rewrite_self_joins``) may rewrite when both sides are the same input.

    ``kind``: "table" or "stream"; ``how``: inner/left/outer; ``other``: the second side node's
    name; ``rewrite(topology, node)`` replaces both sides by one operator over one store.
    Table joins also name their ``merge`` node and result ``store``, and whether that store was
    ``named`` (a named store is a queryable result and is kept)."""

    kind: str
    how: str
    other: str
    rewrite: Callable[[Any, Any], None]
    merge: str | None = None
    store: str | None = None
    named: bool = False


@dataclass(frozen=True, kw_only=True)
class JoinSideAttrs(NodeAttrs):
    """One side of a two-sided join (``KTABLE-JOINTHIS``/``JOINOTHER``, ``KSTREAM-JOINTHIS``/
    ``JOINOTHER``).

    ``copartition_with``: the other side's node name, where the sides' inputs must be
    co-partitioned and the node does not say so by a lookup (stream-stream joins).
    ``self_join``: the rewrite offered to the ``self-join`` pass; once applied, None and
    ``self_join_of`` names the one input both sides read."""

    copartition_with: str | None = None
    self_join: SelfJoin | None = None
    self_join_of: str | None = None


@dataclass(frozen=True, kw_only=True)
class ToStreamAttrs(NodeAttrs):
    """``KTable.to_stream()``: the stream of a table's changes, so a sink fed only by such nodes
    carries a table (the backfill emits its last record per key)."""


def getter_spec(node) -> GetterSpec | None:
    """The getter of the table ``node`` produces; None when it produces no table that can be
    looked up (a stream, a windowed aggregate)."""
    a = node.attrs
    return a.getter if isinstance(a, (TableSourceAttrs, TableAttrs)) else None


@dataclass(frozen=True, kw_only=True)
class UserProcessorAttrs(NodeAttrs):
    """``KStream.process(P, stores=[...])``: a user processor (it may punctuate on the wall clock).
    ``store_specs``: ``((name, StoreSpec), ...)`` of the stores it is connected to, bound to their
    topics with the rest of the topology (a DSL table's store may have a registry serde)."""

    store_specs: tuple = ()


@dataclass(frozen=True, kw_only=True)
class GlobalJoinAttrs(NodeAttrs):
    """A stream joined with a global table: ``global_store`` names the global store it reads;
    ``table_key_serde`` / ``table_value_serde`` are the global table's serdes, bound to its topic
    with the topology's (a Schema Registry serde is bound to nothing before that)."""

    global_store: str
    table_key_serde: Any = None
    table_value_serde: Any = None
