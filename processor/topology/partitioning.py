"""Partitioning constraints of a topology (docs/semantics.md "Partitioning"): which source topics place
which node's keys, where two sides must be co-partitioned, which sinks route like a source.

Invariant: read-only over the graph, but ``resolve_routes``, which names the topics a
``route_like`` sink routes by once internal topics have their application's names.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from processor.errors import TopologyError
from processor.graph import JoinResultAttrs, JoinSideAttrs, SourceAttrs
from processor.topology.nodes import LogicalNode, user_store_sharers


def roots(topo, node: LogicalNode) -> list[str]:
    """The source topics whose partitioning places ``node``'s keys: the sources upstream of it
    along parent edges, except internal topics whose records are sent to an explicit
    partition (foreign-key subscriptions and responses follow their reader)."""
    out, seen, stack = [], set(), [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.source_topic:
            if cast(SourceAttrs, n.attrs).partitioning != "explicit" and n.source_topic not in out:
                out.append(n.source_topic)
            continue
        stack.extend(n.parents)
    return sorted(out)


def copartition_constraints(topo) -> list[tuple[str, list[str], list[str]]]:
    """``(node, left topics, right topics)`` for every place where the same key must land on
    the same partition number on both sides, so both sides' topics must be placed by one
    partitioner: primary-key table joins, stream-table joins, stream-stream joins, a merge of
    several inputs that reaches key-grouped state (an aggregation by key, a join) with no
    repartition in between, and processors sharing a store. Sides read from the very same
    topics need no check."""
    out = []
    for n in topo.nodes:
        other = n.attrs.copartition_with if isinstance(n.attrs, JoinSideAttrs) else None
        if n.lookups:
            sides = [[t for p in n.parents for t in roots(topo, p)],
                     [t for x in n.lookups for t in roots(topo, x)]]
        elif other and any(x.name == other for x in topo.nodes):  # (a self-join keeps one side)
            sides = [[t for p in n.parents for t in roots(topo, p)],
                     [t for p in topo.node(other).parents for t in roots(topo, p)]]
        elif len(n.parents) > 1 and not isinstance(n.attrs, JoinResultAttrs) and reaches_keyed_state(topo, n):
            sides = [roots(topo, n.parents[0]), [t for p in n.parents[1:] for t in roots(topo, p)]]
        else:
            continue
        left, right = sorted(set(sides[0])), sorted(set(sides[1]))
        if left and right and left != right:
            out.append((n.name, left, right))
    for sharing in user_store_sharers(topo).values():   # processors sharing a store: keys meet in it
        left = sorted({t for p in sharing[0].parents for t in roots(topo, p)})
        right = sorted({t for m in sharing[1:] for p in m.parents for t in roots(topo, p)})
        if left and right and left != right:
            out.append((sharing[0].name, left, right))
    return out


def reaches_keyed_state(topo, node: LogicalNode) -> bool:
    """Whether records from ``node`` reach a store or a lookup by their key before any sink
    (a repartition starts a new placement)."""
    seen, stack = set(), list(node.children)
    while stack:
        n = stack.pop()
        if id(n) in seen or n.kind == "sink":
            continue
        seen.add(id(n))
        if n.stores or n.lookups or (isinstance(n.attrs, JoinSideAttrs) and n.attrs.copartition_with):
            return True
        stack.extend(n.children)
    return False


def check_declared_partitioners(topo) -> None:
    """Co-partitioned sides declared with different partitioners can never run: refuse at
    ``build()``, before any host."""
    from processor.engine.partitioners import resolve

    declared = {t: resolve(name) for t, name in declared_partitioners(topo).items()}
    for name, left, right in copartition_constraints(topo):
        fams = {declared[t].name: t for t in left + right if t in declared}
        if len(fams) > 1:
            listing = ", ".join(f"{t} ({f})" for f, t in sorted(fams.items()))
            raise TopologyError(f"{name} needs its inputs placed by one partitioner, but they are "
                                f"declared with different ones: {listing}")


def routed_by_source(topo) -> dict[str, list[str]]:
    """Sink topic -> the source topics whose partitioner routes its records (a foreign-key
    join's subscriptions go to the right table's partition of the foreign key)."""
    return {n.sink_topic: list(n.attrs.route_like_topics) for n in topo.nodes
            if n.sink_topic and n.attrs.route_like_topics}


def partitioning_relevant_topics(topo) -> list[str]:
    """External source topics whose partitioner decides a result (co-partitioned join sides,
    tables a foreign-key join routes to) or was declared: their placement is determined at
    start and every key is checked as it is consumed."""
    internal = {n.source_topic for n in topo.nodes if n.source_topic and n.attrs.internal}
    topics = set()
    for _, left, right in copartition_constraints(topo):
        topics.update(left + right)
    for like in routed_by_source(topo).values():
        topics.update(like)
    for n in topo.nodes:
        if n.source_topic and n.attrs.partitioner:
            topics.add(n.source_topic)
    return sorted(topics - internal)


def declared_partitioners(topo) -> dict[str, str]:
    return {n.source_topic: n.attrs.partitioner for n in topo.nodes
            if n.source_topic and n.attrs.partitioner}


def resolve_routes(topo) -> None:
    """Sinks marked ``route_like`` (a node name) route by the partitioner of that node's
    source topics: resolved to topic names now (after rewrites and internal-topic naming)."""
    for n in topo.nodes:
        if n.sink_topic and n.attrs.route_like:
            n.attrs = replace(n.attrs, route_like_topics=tuple(roots(topo, topo.node(n.attrs.route_like))))
