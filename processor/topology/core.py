"""The ``Topology``: the logical graph frozen by ``build()``, its sub-topologies, and what a
host asks of it (topics, stores, changelogs, operators for one task).

A ``Topology`` is a DAG of ``LogicalNode``s built by the DSL. ``build()`` runs the named
optimization passes (each followed by a sanity check of the graph) when optimization is on,
then splits the graph into sub-topologies: connected components, each read from its own source
topics; partition ``i`` of every source topic of one sub-topology belongs to task ``<sub>_<i>``.

Internal topics (repartition) are named ``<application-id>-<name>-repartition``. The logical
graph knows only ``<name>-repartition``; ``for_application(application_id)`` returns a copy
whose internal topic names are complete, which is what every host (worker, test driver) runs.
A sub-topology boundary is exactly such a topic: its sink ends one connected component and its
source starts another.

The physical side: ``instantiate(sub_id, context)`` creates fresh operator instances for one
task, so every task (worker, test driver, backfill) runs its own copy of the same operator code.
"""

from __future__ import annotations

import copy
from typing import Any, cast

from processor.errors import TopologyError
from processor.graph import SinkAttrs, SourceAttrs
from processor.state.store import BOOKKEEPING_STORE, TASK_STORE
from processor.topology import describe as description
from processor.topology import marks, naming, partitioning, serdes
from processor.topology.nodes import LogicalNode, StoreSpec, clone_graph, user_store_sharers
from processor.topology.passes import OPTIMIZATION_PASSES


def split(topo) -> list[list[LogicalNode]]:
    """The sub-topologies: connected components of the graph along parent, child and lookup
    edges and shared stores (processors connected to one store), each in graph order."""
    seen: dict[int, int] = {}
    subs: list[list[LogicalNode]] = []
    lookers: dict[int, list[LogicalNode]] = {}
    for n in topo.nodes:
        for x in n.lookups:
            lookers.setdefault(id(x), []).append(n)
    for sharing in user_store_sharers(topo).values():   # as if each looked the others up
        for n in sharing:
            lookers.setdefault(id(n), []).extend(m for m in sharing if m is not n)
    for start in topo.nodes:
        if id(start) in seen:
            continue
        comp, stack = [], [start]
        seen[id(start)] = len(subs)
        while stack:
            n = stack.pop()
            comp.append(n)
            for m in n.parents + n.children + n.lookups + lookers.get(id(n), []):
                if id(m) not in seen:
                    seen[id(m)] = len(subs)
                    stack.append(m)
        order = {id(n): i for i, n in enumerate(topo.nodes)}
        comp.sort(key=lambda n: order[id(n)])
        subs.append(comp)
    return subs


class Topology:
    def __init__(self, nodes: list[LogicalNode], stores: dict[str, StoreSpec], optimize: bool = True,
                 reuse_source_topics: bool = False, global_stores: dict | None = None):
        # Optimization passes rewrite the graph in place: work on a copy, so a builder's nodes
        # (and a topology built from them without optimization) stay as they were.
        self.nodes = clone_graph(nodes) if optimize else list(nodes)
        self.stores = dict(stores)
        # global tables: {store name: GlobalStoreSpec}, held by every host outside the tasks
        self.global_stores = dict(global_stores or {})
        self.optimize = optimize
        # a table source's store restored from its (user) source topic instead of a changelog
        # (Kafka Streams' reuse.ktable.source.topics): ``source_changelogs_of``
        self.reuse_source_topics = reuse_source_topics
        self.application_id: str | None = None
        self.applied_passes: list[tuple[str, int]] = []
        self.check()
        if optimize:
            for name, rewrite in OPTIMIZATION_PASSES:
                n = rewrite(self)
                self.applied_passes.append((name, n))
                try:
                    self.check()
                except TopologyError as exc:
                    raise TopologyError(f"optimization pass {name!r} broke the topology: {exc}") from exc
        marks.mark_passthrough_sinks(self)
        marks.mark_table_sinks(self)
        self.subtopologies = split(self)
        self.partitioning: dict[str, object] = {}   # topic -> PartitionerChoice, once a host decided
        partitioning.resolve_routes(self)
        self.check_declared_partitioners()

    # -- graph checks -------------------------------------------------------------------------
    def check(self) -> None:
        names = set()
        for n in self.nodes:
            if n.name in names:
                raise TopologyError(f"duplicate node name {n.name!r}")
            names.add(n.name)
        known = set(map(id, self.nodes))
        for n in self.nodes:
            for c in n.children:
                if id(c) not in known or n not in c.parents:
                    raise TopologyError(f"edge {n.name} -> {c.name} is not symmetric or leaves the graph")
            for p in n.parents:
                if id(p) not in known or n not in p.children:
                    raise TopologyError(f"edge {p.name} -> {n.name} is not symmetric or leaves the graph")
            if n.kind in ("source", "table-source") and n.parents:
                raise TopologyError(f"source {n.name} has parents")
            if n.kind not in ("source", "table-source") and not n.parents:
                raise TopologyError(f"processor {n.name} has no input")
            if bool(n.source_topic) != isinstance(n.attrs, SourceAttrs) or \
                    bool(n.sink_topic or getattr(n.attrs, "extractor", None)) != isinstance(n.attrs, SinkAttrs):
                raise TopologyError(f"{n.kind} {n.name} has attributes of another kind of node "
                                    f"({type(n.attrs).__name__})")
            for x in n.lookups:
                if id(x) not in known:
                    raise TopologyError(f"{n.name} looks up {x.name}, which is not in the graph")
        by_topic: dict[str, list[LogicalNode]] = {}
        for n in self.nodes:
            if n.source_topic:
                by_topic.setdefault(n.source_topic, []).append(n)
        dup = {t: ns for t, ns in by_topic.items() if len(ns) > 1}
        if dup:
            # Two stream sources of one topic are allowed inside one sub-topology (a task then
            # hands each record to both, in graph order): that is the unoptimized form of a
            # stream self-join. Anything else would make two tasks consume one topic.
            sub_of = {id(n): i for i, sub in enumerate(split(self)) for n in sub}
            for t, ns in sorted(dup.items()):
                if any(n.kind != "source" for n in ns) or len({sub_of[id(n)] for n in ns}) > 1:
                    raise TopologyError(f"topic {t!r} is read by more than one source; "
                                        f"read a topic once and reuse the stream/table")
        for s in self.stores.values():
            if s.owner not in names:
                raise TopologyError(f"store {s.name!r} belongs to unknown node {s.owner!r}")

    def deduplicated_topics(self) -> frozenset:
        """Internal topics whose readers drop replayed records by provenance (repartition)."""
        return frozenset(n.source_topic for n in self.nodes
                         if n.source_topic and cast(SourceAttrs, n.attrs).internal and cast(SourceAttrs, n.attrs).dedup)

    def table_sinks(self, sub: int) -> dict:
        """``{topic: (sink node, table node)}``: the sinks of sub-topology ``sub`` that carry a
        table (``SinkAttrs.carries_table``)."""
        return {n.sink_topic: (n, n.parents[0].parents[0]) for n in self.subtopologies[sub]
                if n.kind == "sink" and cast(SinkAttrs, n.attrs).carries_table}

    # -- application binding ------------------------------------------------------------------
    def for_application(self, application_id: str, serde_config: dict | None = None) -> Topology:
        """A copy whose internal topics are named ``<application_id>-<name>`` and whose serdes are
        bound to their topics (``serdes.bind_serdes``), with the host's serde settings ``serde_config``
        (Schema Registry settings: ``ClientConfig.registry``)."""
        if self.application_id == application_id and not serde_config:
            return self
        nodes = clone_graph(self.nodes)
        naming.name_internal_topics(nodes, application_id)
        bound = Topology.__new__(Topology)
        bound.nodes = nodes
        bound.stores = dict(self.stores)
        bound.global_stores = dict(self.global_stores)
        bound.optimize = self.optimize
        bound.reuse_source_topics = self.reuse_source_topics
        bound.application_id = application_id
        bound.applied_passes = list(self.applied_passes)
        bound.subtopologies = split(bound)
        bound.partitioning = dict(self.partitioning)
        serdes.bind_serdes(bound, serde_config)
        marks.mark_passthrough_sinks(bound)
        partitioning.resolve_routes(bound)
        return bound

    def registry_serdes(self) -> list:
        """``serdes.registry_serdes``."""
        return serdes.registry_serdes(self)

    def check_serde_settings(self) -> None:
        """A host's start-up check: registry serdes whose settings their client refuses are a
        ``ConfigError`` now, not a failure of every record."""
        for serde in self.registry_serdes():
            serde.check_settings()

    def with_partitioning(self, choices: dict) -> Topology:
        """A copy that knows which partitioner placed each source topic (``{topic:
        PartitionerChoice}``, decided by a host: ``processor/kafka/partitioning.py``); shown by
        ``describe()``."""
        bound = copy.copy(self)
        bound.partitioning = {**self.partitioning, **choices}
        return bound

    # -- partitioning (docs/semantics.md "Partitioning") --------------------------------------------------
    def roots(self, node: LogicalNode) -> list[str]:
        """``partitioning.roots``: the source topics whose partitioner places ``node``'s keys."""
        return partitioning.roots(self, node)

    def copartition_constraints(self) -> list[tuple[str, list[str], list[str]]]:
        """``partitioning.copartition_constraints``."""
        return partitioning.copartition_constraints(self)

    def check_declared_partitioners(self) -> None:
        partitioning.check_declared_partitioners(self)

    def routed_by_source(self) -> dict[str, list[str]]:
        return partitioning.routed_by_source(self)

    def partitioning_relevant_topics(self) -> list[str]:
        return partitioning.partitioning_relevant_topics(self)

    def declared_partitioners(self) -> dict[str, str]:
        return partitioning.declared_partitioners(self)

    # -- changelogs ------------------------------------------------------------------------------
    def changelog_topic(self, store: str, sub_id: int | None = None) -> str:
        """``naming.changelog_topic`` of this application."""
        return naming.changelog_topic(self.application_id, store, sub_id)

    def changelogs_of(self, sub_id: int) -> dict[str, str]:
        """Store name -> changelog topic, for every store of the sub-topology's tasks (but those
        restored from their source topic: ``source_changelogs_of``)."""
        reused = self.source_changelogs_of(sub_id)
        out = {s.name: self.changelog_topic(s.name) for s in self.stores_of(sub_id) if s.name not in reused}
        out[BOOKKEEPING_STORE] = self.changelog_topic(BOOKKEEPING_STORE, sub_id)
        out[TASK_STORE] = self.changelog_topic(TASK_STORE, sub_id)
        return out

    def source_changelogs_of(self, sub_id: int) -> dict[str, str]:
        """Store name -> source topic, for the table-source stores of the sub-topology that have no
        changelog of their own under ``reuse_source_topics``: a table read from a user topic as
        it is holds exactly that topic's records (key bytes -> timestamp + value bytes, no-ops
        skipped), so the topic up to the task's committed position is its changelog. Tables read
        through our own repartition topic keep a changelog (that topic's replays are dropped by
        provenance, which a restore could not repeat)."""
        return self.table_source_stores_of(sub_id) if self.reuse_source_topics else {}

    def table_source_stores_of(self, sub_id: int) -> dict[str, str]:
        """Store name -> source topic, for the stores of tables the sub-topology reads from user
        topics as they are (with or without ``reuse_source_topics``: a restore reads the topic
        where a store's changelog does not cover its last commit, ``processor/runtime/changelog.py``)."""
        out = {}
        for s in self.stores_of(sub_id):
            if s.source_topic is None:
                continue
            owner = self.node(s.owner)
            if owner.kind == "table-source" and not cast(SourceAttrs, owner.attrs).internal:
                out[s.name] = cast(str, owner.source_topic)   # a table source reads a topic
        return out

    def reused_source_topics(self) -> set[str]:
        """Every user topic that is a store's changelog (``source_changelogs_of``)."""
        return {t for i in range(len(self.subtopologies)) for t in self.source_changelogs_of(i).values()}

    def changelog_topic_partitions(self, partitions: dict[str, int]) -> dict[str, int]:
        """Changelog topic -> partition count (one partition per task of its sub-topology)."""
        counts = {**partitions, **self.internal_topic_partitions(partitions)}
        out = {}
        for i in range(len(self.subtopologies)):
            n = max(counts[t] for t in self.source_topics(i))
            for topic in self.changelogs_of(i).values():
                out[topic] = n
        return out

    def internal_topics(self) -> dict[str, list[int]]:
        """Internal topic -> the sub-topologies that write it."""
        out: dict[str, list[int]] = {}
        for i, sub in enumerate(self.subtopologies):
            for n in sub:
                if n.sink_topic and cast(SinkAttrs, n.attrs).internal:
                    out.setdefault(n.sink_topic, []).append(i)
        return out

    def internal_topic_partitions(self, partitions: dict[str, int]) -> dict[str, int]:
        """Partition count of each internal topic: the largest partition count among the source
        topics of the sub-topologies that write it (as Kafka Streams), resolved through chains.
        A topic whose sink says ``partitions_from="reader"`` (foreign-key join subscription and
        response topics) is instead co-partitioned with the sub-topology that READS it: its
        count is that of the reader's other source topics."""
        writers = self.internal_topics()
        readers = self.subtopology_of_topic()
        reader_sized = {n.sink_topic for n in self.nodes
                        if n.sink_topic and cast(SinkAttrs, n.attrs).partitions_from == "reader"}
        counts: dict[str, int] = {}
        while len(counts) < len(writers):
            progress = False
            for topic, subs in writers.items():
                if topic in counts:
                    continue
                declared = [p for n in self.nodes if n.sink_topic == topic
                            for p in (cast(SinkAttrs, n.attrs).partitions,) if p is not None]
                if declared:   # repartition(partitions=n)
                    counts[topic] = declared[0]
                    progress = True
                    continue
                if topic in reader_sized:
                    sources = [t for t in self.source_topics(readers[topic]) if t not in reader_sized]
                else:
                    sources = [t for i in subs for t in self.source_topics(i)]
                known = [counts.get(t, partitions.get(t)) if t in writers else partitions.get(t) for t in sources]
                if all(k is not None for k in known) and known:
                    counts[topic] = max(cast(list[int], known))
                    progress = True
            if not progress:
                missing = sorted(set(writers) - set(counts))
                raise TopologyError(f"cannot size internal topic(s) {missing}: their writers read no "
                                    f"topic of known size")
        return counts

    # -- queries ------------------------------------------------------------------------------
    def source_topics(self, sub_id: int | None = None) -> list[str]:
        subs = self.subtopologies if sub_id is None else [self.subtopologies[sub_id]]
        return list(dict.fromkeys(n.source_topic for s in subs for n in s if n.source_topic))

    def sink_topics(self, internal: bool | None = None) -> list[str]:
        """Sink topics; ``internal=False``: only user topics, ``True``: only internal ones."""
        return sorted({n.sink_topic for n in self.nodes if n.sink_topic
                       and (internal is None or cast(SinkAttrs, n.attrs).internal == internal)})

    def global_topics(self) -> list[str]:
        """The topics of the global tables (read whole by every host, not by the group)."""
        return [g.topic for g in self.global_stores.values()]

    def external_source_topics(self) -> list[str]:
        return [n.source_topic for n in self.nodes if n.source_topic and not cast(SourceAttrs, n.attrs).internal]

    def subtopology_of_topic(self) -> dict[str, int]:
        return {n.source_topic: i for i, s in enumerate(self.subtopologies) for n in s if n.source_topic}

    def stores_of(self, sub_id: int) -> list[StoreSpec]:
        names = {n.name for n in self.subtopologies[sub_id]}
        return [s for s in self.stores.values() if s.owner in names]

    def node(self, name: str) -> LogicalNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def remove_node(self, node: LogicalNode) -> None:
        """Take ``node`` out of the graph with all its edges (for rewrite passes)."""
        for p in node.parents:
            p.children = [c for c in p.children if c is not node]
        for c in node.children:
            c.parents = [p for p in c.parents if p is not node]
        for n in self.nodes:
            if node in n.lookups:
                raise TopologyError(f"cannot remove {node.name}: {n.name} looks it up")
        self.nodes = [n for n in self.nodes if n is not node]

    def source_nodes(self, topic: str) -> list[LogicalNode]:
        return [n for n in self.nodes if n.source_topic == topic]

    def source_node(self, topic: str) -> LogicalNode:
        for n in self.nodes:
            if n.source_topic == topic:
                return n
        raise KeyError(topic)

    def sink_nodes(self, topic: str) -> list[LogicalNode]:
        return [n for n in self.nodes if n.sink_topic == topic]

    # -- physical -----------------------------------------------------------------------------
    def instantiate(self, sub_id: int, context) -> dict[str, Any]:
        """Fresh operators for one task of sub-topology ``sub_id``, wired and initialised."""
        nodes = self.subtopologies[sub_id]
        ops: dict[str, Any] = {n.name: n.factory(n) for n in nodes}
        for n in nodes:
            ops[n.name].children = [ops[c.name] for c in n.children]
        for n in nodes:
            ops[n.name].init(context)
        return ops

    # -- describe -----------------------------------------------------------------------------
    def describe(self) -> str:
        """Kafka Streams' ``TopologyDescription`` text (``describe.describe``)."""
        return description.describe(self)

    def __repr__(self):
        return self.describe()
