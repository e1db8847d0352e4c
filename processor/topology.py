"""The logical graph, its optimization passes, sub-topologies and ``describe()``.

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
from dataclasses import dataclass, field, replace
from typing import Callable

from processor.errors import TopologyError
from processor.serde import Serde
from processor.serde.registry import RegistryAvroSerde
from processor.graph import (AggregateAttrs, JoinResultAttrs, JoinSideAttrs, NodeAttrs, ProcessorAttrs,
                             SinkAttrs, SourceAttrs)
from processor.state.store import BOOKKEEPING_STORE, TASK_STORE


@dataclass(eq=False)
class LogicalNode:
    name: str
    kind: str                                    # source | table-source | processor | sink
    factory: Callable[["LogicalNode"], object]   # builds the operator for one task
    parents: list["LogicalNode"] = field(default_factory=list)
    children: list["LogicalNode"] = field(default_factory=list)
    source_topic: str | None = None
    sink_topic: str | None = None
    stores: list[str] = field(default_factory=list)
    value_preserving: bool = False               # forwards the value object it received
    # What this kind of node declares: one class per node kind (``processor/graph.py``).
    attrs: NodeAttrs = field(default_factory=ProcessorAttrs)
    # Tables whose current values this node reads (joins): not an edge records flow along, but
    # it puts both in one sub-topology, so the table's store is in the same task.
    lookups: list["LogicalNode"] = field(default_factory=list)

    def __post_init__(self):
        if not isinstance(self.attrs, NodeAttrs):
            raise TypeError(f"node {self.name}: attrs must be a processor.graph.NodeAttrs, "
                            f"not {type(self.attrs).__name__}")

    def __repr__(self):
        return f"<{self.name}>"


@dataclass
class StoreSpec:
    name: str
    owner: str                   # node name
    source_topic: str | None     # the topic a table source reads (its store mirrors it), or None
    key_serde: object = None
    value_serde: object = None
    kind: str = "kv"             # kv | aggregate | emitted (last-emitted column) | window |
    #                              version / subscription (FK join) | join-window / join-outer


def _clone_graph(nodes: list[LogicalNode]) -> list[LogicalNode]:
    """Copies of ``nodes`` wired to each other (attributes shared: they are immutable)."""
    clones = {id(n): copy.copy(n) for n in nodes}
    for n in nodes:
        c = clones[id(n)]
        c.parents = [clones[id(p)] for p in n.parents]
        c.children = [clones[id(x)] for x in n.children]
        c.lookups = [clones[id(x)] for x in n.lookups]
        c.stores = list(n.stores)
    return [clones[id(n)] for n in nodes]


def _holds_registry_serde(serde, depth: int = 0) -> bool:
    """Whether ``serde`` is, or wraps (``inner`` and the like), a Schema Registry serde."""
    if serde is None or depth > 4:
        return False
    if isinstance(serde, RegistryAvroSerde):
        return True
    return any(_holds_registry_serde(v, depth + 1) for v in getattr(serde, "__dict__", {}).values()
               if isinstance(v, Serde))


# -- the self-join pass (KIP-862) ------------------------------------------------------------------
def same_input(a: LogicalNode, b: LogicalNode) -> bool:
    """Whether two join inputs are provably one stream/table: the same node, or two stream
    sources of one topic with equal key and value serdes (nothing in between: the join's
    parents ARE the sources). Two sources of one topic deliver every record to both, in the
    same order, so they are the same stream."""
    if a is b:
        return True
    return (a.kind == b.kind == "source" and a.source_topic == b.source_topic
            and a.attrs.key_serde == b.attrs.key_serde
            and a.attrs.value_serde == b.attrs.value_serde)


def _merge_sources(topology: "Topology", keep: LogicalNode, drop: LogicalNode) -> None:
    """Give ``drop``'s children to ``keep`` (after its own, so records reach them in the same
    order as before) and remove ``drop``."""
    for c in drop.children:
        c.parents = [keep if p is drop else p for p in c.parents]
        keep.children.append(c)
    drop.children = []
    topology.remove_node(drop)


def rewrite_self_joins(topology: "Topology") -> int:
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
OPTIMIZATION_PASSES: list[tuple[str, Callable[["Topology"], int]]] = [
    ("self-join", rewrite_self_joins),
]


class Topology:
    def __init__(self, nodes: list[LogicalNode], stores: dict[str, StoreSpec], optimize: bool = True,
                 reuse_source_topics: bool = False):
        # Optimization passes rewrite the graph in place: work on a copy, so a builder's nodes
        # (and a topology built from them without optimization) stay as they were.
        self.nodes = _clone_graph(nodes) if optimize else list(nodes)
        self.stores = dict(stores)
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
        self._mark_passthrough_sinks()
        self._mark_table_sinks()
        self.subtopologies = self._split()
        self.partitioning: dict[str, object] = {}   # topic -> PartitionerChoice, once a host decided
        self._resolve_routes()
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
                    bool(n.sink_topic) != isinstance(n.attrs, SinkAttrs):
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
            sub_of = {id(n): i for i, sub in enumerate(self._split()) for n in sub}
            for t, ns in sorted(dup.items()):
                if any(n.kind != "source" for n in ns) or len({sub_of[id(n)] for n in ns}) > 1:
                    raise TopologyError(f"topic {t!r} is read by more than one source; "
                                        f"read a topic once and reuse the stream/table")
        for s in self.stores.values():
            if s.owner not in names:
                raise TopologyError(f"store {s.name!r} belongs to unknown node {s.owner!r}")

    def _mark_passthrough_sinks(self) -> None:
        """A sink whose value comes, through value-preserving steps only (filters, to_stream), from
        a source, an aggregate or a materialized join result with the same value serde writes the
        bytes it was read from or stored as, instead of serializing the value again
        (``Sink.passthrough``)."""
        from processor.graph import AggregateAttrs

        def origin(cur):
            return (cur.kind in ("source", "table-source") or isinstance(cur.attrs, AggregateAttrs)
                    or getattr(cur.attrs, "result_store", None) is not None)

        for n in self.nodes:
            if n.kind != "sink":
                continue
            cur, ok = n, True
            while not origin(cur):
                if len(cur.parents) != 1:
                    ok = False
                    break
                cur = cur.parents[0]
                if not origin(cur) and not cur.value_preserving:
                    ok = False
                    break
            if ok:
                if isinstance(cur.attrs, AggregateAttrs):
                    serde = self.stores[cur.stores[0]].value_serde
                elif getattr(cur.attrs, "result_store", None) is not None:
                    serde = self.stores[cur.attrs.result_store].value_serde
                else:
                    serde = cur.attrs.value_serde
                ok = n.attrs.value_serde is serde
            n.attrs = replace(n.attrs, passthrough=ok)

    def _mark_table_sinks(self) -> None:
        from processor.graph import ToStreamAttrs, getter_spec

        writers: dict[str, int] = {}
        for n in self.nodes:
            if n.kind == "sink":
                writers[n.sink_topic] = writers.get(n.sink_topic, 0) + 1
        for n in self.nodes:
            if n.kind != "sink" or n.attrs.internal:
                continue
            ok = (writers[n.sink_topic] == 1 and len(n.parents) == 1
                  and isinstance(n.parents[0].attrs, ToStreamAttrs) and len(n.parents[0].parents) == 1
                  and getter_spec(n.parents[0].parents[0]) is not None)
            if ok != n.attrs.carries_table:
                n.attrs = replace(n.attrs, carries_table=ok)

    def deduplicated_topics(self) -> frozenset:
        """Internal topics whose readers drop replayed records by provenance (repartition)."""
        return frozenset(n.source_topic for n in self.nodes
                         if n.source_topic and n.attrs.internal and n.attrs.dedup)

    def table_sinks(self, sub: int) -> dict:
        """``{topic: (sink node, table node)}``: the sinks of sub-topology ``sub`` that carry a
        table (``SinkAttrs.carries_table``)."""
        return {n.sink_topic: (n, n.parents[0].parents[0]) for n in self.subtopologies[sub]
                if n.kind == "sink" and n.attrs.carries_table}

    def _split(self) -> list[list[LogicalNode]]:
        seen: dict[int, int] = {}
        subs: list[list[LogicalNode]] = []
        lookers: dict[int, list[LogicalNode]] = {}
        for n in self.nodes:
            for x in n.lookups:
                lookers.setdefault(id(x), []).append(n)
        for start in self.nodes:
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
            order = {id(n): i for i, n in enumerate(self.nodes)}
            comp.sort(key=lambda n: order[id(n)])
            subs.append(comp)
        return subs

    # -- application binding ------------------------------------------------------------------
    def for_application(self, application_id: str, serde_config: dict | None = None) -> "Topology":
        """A copy whose internal topics are named ``<application_id>-<name>`` and whose serdes are
        bound to their topics (``_bind_serdes``), with the host's serde settings ``serde_config``
        (Schema Registry settings: ``ClientConfig.registry``)."""
        if self.application_id == application_id and not serde_config:
            return self
        nodes = _clone_graph(self.nodes)
        for n in nodes:
            base = n.attrs.internal_topic if isinstance(n.attrs, (SourceAttrs, SinkAttrs)) else None
            if base:
                topic = f"{application_id}-{base}"
                if n.source_topic:
                    n.source_topic = topic
                if n.sink_topic:
                    n.sink_topic = topic
        bound = Topology.__new__(Topology)
        bound.nodes = nodes
        bound.stores = dict(self.stores)
        bound.optimize = self.optimize
        bound.reuse_source_topics = self.reuse_source_topics
        bound.application_id = application_id
        bound.applied_passes = list(self.applied_passes)
        bound.subtopologies = bound._split()
        bound.partitioning = dict(self.partitioning)
        bound._bind_serdes(serde_config)
        bound._mark_passthrough_sinks()
        bound._resolve_routes()
        return bound

    def _bind_serdes(self, config: dict | None) -> None:
        """Give every serde its topic (``Serde.for_topic``): sources and sinks that of their node
        (user and internal topics alike), a store's serdes its changelog topic, as Kafka Streams
        configures store serdes, or, for a table source's store (which holds the source topic's
        bytes), the source topic. Serdes that do not depend on their topic return themselves, so
        nodes whose serdes are all such keep their attributes (and their hot paths) unchanged.

        A Schema Registry serde (``processor/serde/registry.py``) is refused as the serde of
        operator state (aggregates, joins): operators receive their state serdes when the graph
        is built, before any topic name is complete, so they could not be bound."""
        for n in self.nodes:
            topic = n.source_topic or n.sink_topic
            if not topic or not isinstance(n.attrs, (SourceAttrs, SinkAttrs)):
                continue
            ks, vs = n.attrs.key_serde, n.attrs.value_serde
            bk = ks.for_topic(topic, True, config) if isinstance(ks, Serde) else ks
            bv = vs.for_topic(topic, False, config) if isinstance(vs, Serde) else vs
            if bk is not ks or bv is not vs:
                n.attrs = replace(n.attrs, key_serde=bk, value_serde=bv)
        for name, spec in list(self.stores.items()):
            if spec.source_topic is None:
                for serde in (spec.key_serde, spec.value_serde):
                    if _holds_registry_serde(serde):
                        raise TopologyError(
                            f"store {name!r} ({spec.kind}, of {spec.owner}) has the Schema Registry serde "
                            f"{serde!r}: operator state cannot use one; give the operator a key_serde/"
                            f"value_serde such as Serdes.json() or Serdes.avro(schema) (fixed schema)")
            topic = spec.source_topic or self.changelog_topic(name)
            ks, vs = spec.key_serde, spec.value_serde
            bk = ks.for_topic(topic, True, config) if isinstance(ks, Serde) else ks
            bv = vs.for_topic(topic, False, config) if isinstance(vs, Serde) else vs
            if bk is not ks or bv is not vs:
                self.stores[name] = replace(spec, key_serde=bk, value_serde=bv)

    def registry_serdes(self) -> list:
        """The Schema Registry serdes of the sources, sinks and stores (wrapped ones included)."""
        found, seen = [], set()

        def walk(serde, depth=0):
            if serde is None or depth > 4 or id(serde) in seen:
                return
            seen.add(id(serde))
            if isinstance(serde, RegistryAvroSerde):
                found.append(serde)
                return
            for v in getattr(serde, "__dict__", {}).values():
                if isinstance(v, Serde):
                    walk(v, depth + 1)

        for n in self.nodes:
            if isinstance(n.attrs, (SourceAttrs, SinkAttrs)):
                walk(n.attrs.key_serde)
                walk(n.attrs.value_serde)
        for spec in self.stores.values():
            walk(spec.key_serde)
            walk(spec.value_serde)
        return found

    def check_serde_settings(self) -> None:
        """A host's start-up check: registry serdes whose settings their client refuses are a
        ``ConfigError`` now, not a failure of every record."""
        for serde in self.registry_serdes():
            serde.check_settings()

    def with_partitioning(self, choices: dict) -> "Topology":
        """A copy that knows which partitioner placed each source topic (``{topic:
        PartitionerChoice}``, decided by a host: ``processor/kafka/partitioning.py``); shown by
        ``describe()``."""
        bound = copy.copy(self)
        bound.partitioning = {**self.partitioning, **choices}
        return bound

    # -- partitioning (README "Partitioning") --------------------------------------------------
    def roots(self, node: LogicalNode) -> list[str]:
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
                if n.attrs.partitioning != "explicit" and n.source_topic not in out:
                    out.append(n.source_topic)
                continue
            stack.extend(n.parents)
        return sorted(out)

    def copartition_constraints(self) -> list[tuple[str, list[str], list[str]]]:
        """``(node, left topics, right topics)`` for every place where the same key must land on
        the same partition number on both sides, so both sides' topics must be placed by one
        partitioner: primary-key table joins, stream-table joins, stream-stream joins, and a merge
        of several inputs that reaches key-grouped state (an aggregation by key, a join) with no
        repartition in between. Sides read from the very same topics need no check."""
        out = []
        for n in self.nodes:
            other = n.attrs.copartition_with if isinstance(n.attrs, JoinSideAttrs) else None
            if n.lookups:
                sides = [[t for p in n.parents for t in self.roots(p)],
                         [t for x in n.lookups for t in self.roots(x)]]
            elif other and any(x.name == other for x in self.nodes):  # (a self-join keeps one side)
                sides = [[t for p in n.parents for t in self.roots(p)],
                         [t for p in self.node(other).parents for t in self.roots(p)]]
            elif len(n.parents) > 1 and not isinstance(n.attrs, JoinResultAttrs) and self._reaches_keyed_state(n):
                sides = [self.roots(n.parents[0]), [t for p in n.parents[1:] for t in self.roots(p)]]
            else:
                continue
            left, right = sorted(set(sides[0])), sorted(set(sides[1]))
            if left and right and left != right:
                out.append((n.name, left, right))
        return out

    def _reaches_keyed_state(self, node: LogicalNode) -> bool:
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

    def check_declared_partitioners(self) -> None:
        """Co-partitioned sides declared with different partitioners can never run: refuse at
        ``build()``, before any host."""
        from processor.engine.partitioners import resolve

        declared = {t: resolve(name) for t, name in self.declared_partitioners().items()}
        for name, left, right in self.copartition_constraints():
            fams = {declared[t].name: t for t in left + right if t in declared}
            if len(fams) > 1:
                listing = ", ".join(f"{t} ({f})" for f, t in sorted(fams.items()))
                raise TopologyError(f"{name} needs its inputs placed by one partitioner, but they are "
                                    f"declared with different ones: {listing}")

    def routed_by_source(self) -> dict[str, list[str]]:
        """Sink topic -> the source topics whose partitioner routes its records (a foreign-key
        join's subscriptions go to the right table's partition of the foreign key)."""
        return {n.sink_topic: list(n.attrs.route_like_topics) for n in self.nodes
                if n.sink_topic and n.attrs.route_like_topics}

    def partitioning_relevant_topics(self) -> list[str]:
        """External source topics whose partitioner decides a result (co-partitioned join sides,
        tables a foreign-key join routes to) or was declared: their placement is determined at
        start and every key is checked as it is consumed."""
        internal = {n.source_topic for n in self.nodes if n.source_topic and n.attrs.internal}
        topics = set()
        for _, left, right in self.copartition_constraints():
            topics.update(left + right)
        for like in self.routed_by_source().values():
            topics.update(like)
        for n in self.nodes:
            if n.source_topic and n.attrs.partitioner:
                topics.add(n.source_topic)
        return sorted(topics - internal)

    def declared_partitioners(self) -> dict[str, str]:
        return {n.source_topic: n.attrs.partitioner for n in self.nodes
                if n.source_topic and n.attrs.partitioner}

    def _resolve_routes(self) -> None:
        """Sinks marked ``route_like`` (a node name) route by the partitioner of that node's
        source topics: resolved to topic names now (after rewrites and internal-topic naming)."""
        for n in self.nodes:
            if n.sink_topic and n.attrs.route_like:
                n.attrs = replace(n.attrs, route_like_topics=tuple(self.roots(self.node(n.attrs.route_like))))

    # -- changelogs ------------------------------------------------------------------------------
    def changelog_topic(self, store: str, sub_id: int | None = None) -> str:
        """``<application-id>-<store>-changelog``; the task store (``__task``) and the bookkeeping
        store (``_bookkeeping``), one per sub-topology, are ``<application-id>-<store>-<sub>-changelog``."""
        app = self.application_id or "<application-id>"
        if store in (TASK_STORE, BOOKKEEPING_STORE):
            return f"{app}-{store}-{sub_id}-changelog"
        return f"{app}-{store}-changelog"

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
            if owner.kind == "table-source" and not owner.attrs.internal:
                out[s.name] = owner.source_topic
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
                if n.sink_topic and n.attrs.internal:
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
                        if n.sink_topic and n.attrs.partitions_from == "reader"}
        counts: dict[str, int] = {}
        while len(counts) < len(writers):
            progress = False
            for topic, subs in writers.items():
                if topic in counts:
                    continue
                if topic in reader_sized:
                    sources = [t for t in self.source_topics(readers[topic]) if t not in reader_sized]
                else:
                    sources = [t for i in subs for t in self.source_topics(i)]
                known = [counts.get(t, partitions.get(t)) if t in writers else partitions.get(t) for t in sources]
                if all(k is not None for k in known) and known:
                    counts[topic] = max(known)
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
                       and (internal is None or n.attrs.internal == internal)})

    def external_source_topics(self) -> list[str]:
        return [n.source_topic for n in self.nodes if n.source_topic and not n.attrs.internal]

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
    def instantiate(self, sub_id: int, context) -> dict[str, object]:
        """Fresh operators for one task of sub-topology ``sub_id``, wired and initialised."""
        nodes = self.subtopologies[sub_id]
        ops = {n.name: n.factory(n) for n in nodes}
        for n in nodes:
            ops[n.name].children = [ops[c.name] for c in n.children]
        for n in nodes:
            ops[n.name].init(context)
        return ops

    # -- describe -----------------------------------------------------------------------------
    def _describe_partitioner(self, n: LogicalNode, relevant: set[str]) -> str | None:
        choice = self.partitioning.get(n.source_topic)
        if choice is not None:
            return str(choice)
        if n.attrs.partitioning == "explicit":
            return "explicit partitions (foreign-key join internal topic)"
        if n.attrs.internal:
            return "murmur2 (internal topic)"
        if n.attrs.partitioner:
            return f"{n.attrs.partitioner} (declared; checked as consumed)"
        if n.source_topic in relevant:
            return "determined from the data at start, then checked as consumed"
        return None

    def describe(self) -> str:
        relevant = set(self.partitioning_relevant_topics())
        lines = ["Topologies:"]
        for i, sub in enumerate(self.subtopologies):
            lines.append(f"   Sub-topology: {i}")
            for n in sub:
                if n.kind in ("source", "table-source"):
                    head = f"    Source: {n.name} (topics: [{n.source_topic}])"
                    if n.stores:
                        head += f" (stores: [{', '.join(n.stores)}])"
                    placed = self._describe_partitioner(n, relevant)
                    if placed:
                        head += f" (partitioner: {placed})"
                elif n.kind == "sink":
                    head = f"    Sink: {n.name} (topic: {n.sink_topic})"
                else:
                    from processor.operators.value_getter import getter_stores

                    # the stores it reads through lookups, resolved now (after the rewrites)
                    used = [st for x in n.lookups for st in getter_stores(x)]
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
        reused = {name: topic for i in range(len(self.subtopologies))
                  for name, topic in self.source_changelogs_of(i).items()}
        for s in self.stores.values():
            changelog = (f"the source topic {reused[s.name]} (reused)" if s.name in reused
                         else self.changelog_topic(s.name))
            lines.append(f"    {s.name} ({s.kind}; owner: {s.owner}; changelog: {changelog})")
        constraints = self.copartition_constraints()
        routes = self.routed_by_source()
        if constraints or routes:
            lines.append("Partitioning:")
            for name, left, right in constraints:
                lines.append(f"    {name}: co-partitioned, one partitioner for {', '.join(left)} and {', '.join(right)}")
            for sink, like in sorted(routes.items()):
                lines.append(f"    {sink}: routed by the partitioner of {', '.join(like)}")
        opt = "on" if self.optimize else "off"
        applied = ", ".join(f"{n}: {c} rewrite(s)" for n, c in self.applied_passes) or "none applicable"
        lines.append(f"Optimizations: {opt} (passes: {applied})"
                     + ("; source topics reused as changelogs" if self.reuse_source_topics else ""))
        return "\n".join(lines) + "\n"

    def __repr__(self):
        return self.describe()
