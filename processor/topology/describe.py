"""``Topology.describe()``: the text of Kafka Streams' ``TopologyDescription`` (sub-topologies,
sources, processors with their stores, sinks), then stores, partitioning and optimizations.

Invariant: describes, never changes; every store and internal topic a host creates appears.
"""

from __future__ import annotations

from typing import cast

from processor.graph import AggregateAttrs, JoinSideAttrs, SourceAttrs, UserProcessorAttrs
from processor.topology.nodes import LogicalNode


def _describe_partitioner(topo, n: LogicalNode, relevant: set[str]) -> str | None:
    choice = topo.partitioning.get(n.source_topic)
    if choice is not None:
        return str(choice)
    attrs = cast(SourceAttrs, n.attrs)   # n is a source
    if attrs.partitioning == "explicit":
        return "explicit partitions (foreign-key join internal topic)"
    if attrs.internal:
        return "murmur2 (internal topic)"
    if attrs.partitioner:
        return f"{attrs.partitioner} (declared; checked as consumed)"
    if n.source_topic in relevant:
        return "determined from the data at start, then checked as consumed"
    return None


def describe(topo) -> str:
    relevant = set(topo.partitioning_relevant_topics())
    lines = ["Topologies:"]
    for i, sub in enumerate(topo.subtopologies):
        lines.append(f"   Sub-topology: {i}")
        for n in sub:
            if n.kind in ("source", "table-source"):
                head = f"    Source: {n.name} (topics: [{n.source_topic}])"
                if n.stores:
                    head += f" (stores: [{', '.join(n.stores)}])"
                placed = _describe_partitioner(topo, n, relevant)
                if placed:
                    head += f" (partitioner: {placed})"
            elif n.kind == "sink":
                if n.attrs.extractor is not None:
                    from processor.operators.base import describe_function

                    head = f"    Sink: {n.name} (extractor: {describe_function(n.attrs.extractor)})"
                else:
                    head = f"    Sink: {n.name} (topic: {n.sink_topic})"
            else:
                from processor.operators.value_getter import getter_stores

                # the stores it reads through lookups, resolved now (after the rewrites)
                used = [] if isinstance(n.attrs, UserProcessorAttrs) else \
                    [st for x in n.lookups for st in getter_stores(x)]   # (a processor's: its stores)
                self_join_of = n.attrs.self_join_of if isinstance(n.attrs, JoinSideAttrs) else None
                if self_join_of is not None:
                    used += getter_stores(n.parents[0])
                used += [st for st in n.stores if st not in used]
                head = f"    Processor: {n.name} (stores: [{', '.join(used)}])"
                if isinstance(n.attrs, AggregateAttrs):
                    head += f" (emit: {n.attrs.emit!r})"
                if self_join_of is not None:
                    head += f" (self-join of {self_join_of}: one side, one store)"
            lines.append(head)
            lines.append(f"      --> {', '.join(c.name for c in n.children) or 'none'}")
            if n.parents:
                lines.append(f"      <-- {', '.join(p.name for p in n.parents)}")
    lines.append("Stores:")
    reused = {name: topic for i in range(len(topo.subtopologies))
              for name, topic in topo.source_changelogs_of(i).items()}
    for s in topo.stores.values():
        changelog = (f"the source topic {reused[s.name]} (reused)" if s.name in reused
                     else topo.changelog_topic(s.name))
        lines.append(f"    {s.name} ({s.kind}; owner: {s.owner}; changelog: {changelog})")
    if topo.global_stores:
        lines.append("Global stores:")
        for g in topo.global_stores.values():
            lines.append(f"    {g.name} (topic: {g.topic}; every host holds all of it, bootstrapped before processing)")
    constraints = topo.copartition_constraints()
    routes = topo.routed_by_source()
    if constraints or routes:
        lines.append("Partitioning:")
        for name, left, right in constraints:
            lines.append(f"    {name}: co-partitioned, one partitioner for {', '.join(left)} and {', '.join(right)}")
        for sink, like in sorted(routes.items()):
            lines.append(f"    {sink}: routed by the partitioner of {', '.join(like)}")
    opt = "on" if topo.optimize else "off"
    applied = ", ".join(f"{n}: {c} rewrite(s)" for n, c in topo.applied_passes) or "none applicable"
    lines.append(f"Optimizations: {opt} (passes: {applied})"
                 + ("; source topics reused as changelogs" if topo.reuse_source_topics else ""))
    return "\n".join(lines) + "\n"
