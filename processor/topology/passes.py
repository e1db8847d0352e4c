"""The optimization passes: named rewrites of the logical graph (Kafka Streams' optimizer).

Invariant: each pass is a function ``(topology) -> number of rewrites`` that leaves a graph
which passes ``Topology.check()`` (the ``Topology`` runs the check after each one and names
the pass that broke it) and computes the same outputs and stores as before it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from processor.graph import JoinSideAttrs, SourceAttrs
from processor.topology.nodes import LogicalNode

if TYPE_CHECKING:  # pragma: no cover
    from processor.topology.core import Topology


def same_input(a: LogicalNode, b: LogicalNode) -> bool:
    """Whether two join inputs are provably one stream/table: the same node, or two stream
    sources of one topic with equal key and value serdes (nothing in between: the join's
    parents ARE the sources). Two sources of one topic deliver every record to both, in the
    same order, so they are the same stream."""
    if a is b:
        return True
    if not (a.kind == b.kind == "source" and a.source_topic == b.source_topic):
        return False
    sa, sb = cast(SourceAttrs, a.attrs), cast(SourceAttrs, b.attrs)
    return sa.key_serde == sb.key_serde and sa.value_serde == sb.value_serde


def _merge_sources(topology: Topology, keep: LogicalNode, drop: LogicalNode) -> None:
    """Give ``drop``'s children to ``keep`` (after its own, so records reach them in the same
    order as before) and remove ``drop``."""
    for c in drop.children:
        c.parents = [keep if p is drop else p for p in c.parents]
        keep.children.append(c)
    drop.children = []
    topology.remove_node(drop)


def rewrite_self_joins(topology: Topology) -> int:
    """KIP-862: a join whose two sides are the same stream or table keeps one state store.

    Join builders mark their first side node with ``attrs.self_join`` (a ``SelfJoin``): ``kind``
    (stream or table), ``how``, ``other`` (the second side node's name) and ``rewrite(topology, node)``,
    which replaces both sides by one operator over one store. This pass decides WHERE it is
    safe, and the rewrite functions say why the result is the same:

    * table-table primary-key joins (inner, left and outer): rewritten. A table's row is the
      same on both sides, so all three kinds give ``joiner(v, v)`` exactly when ``v`` exists
      (``processor/dsl/joins.py``). Not when the join's store was named (``name=``): a named
      store is a queryable result and is kept.
    * stream-stream joins: only inner joins with symmetric windows (``before == after``; the
      join builder marks no other) are rewritten (``processor/dsl/stream_join.py``). With
      asymmetric windows one side may admit a record the other drops as late, so the two
      stores differ and one store cannot stand for both. Left and outer self-joins keep two
      stores: each record passes through the outer store of unmatched records (and out again
      when it matches itself), and a rewrite would silently drop that store, which is state a
      running application already has.
    """
    count = 0
    for node in list(topology.nodes):
        info = node.attrs.self_join if isinstance(node.attrs, JoinSideAttrs) else None
        if info is None or not any(n is node for n in topology.nodes):
            continue
        other = topology.node(info.other)
        a, b = node.parents[0], other.parents[0]
        if not same_input(a, b):
            continue
        if info.kind == "table" and info.named:
            continue
        if info.kind == "stream" and info.how != "inner":
            continue
        if a is not b:
            _merge_sources(topology, a, b)
        info.rewrite(topology, node)
        count += 1
    return count


# Optimization passes: (name, function(topology) -> number of rewrites). Each is a separate,
# named rewrite of the logical graph; a sanity check of the graph runs after each one.
OPTIMIZATION_PASSES: list[tuple[str, Callable[[Topology], int]]] = [
    ("self-join", rewrite_self_joins),
]


