"""The logical graph's node and store declarations (what the DSL creates).

Invariant: a node's ``attrs`` is one frozen ``processor.graph.NodeAttrs`` class per node kind;
``clone_graph`` copies nodes and edges, never attributes (passes replace them, never mutate).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from processor.graph import NodeAttrs, ProcessorAttrs, UserProcessorAttrs


@dataclass(eq=False)
class LogicalNode:
    name: str
    kind: str                                    # source | table-source | processor | sink
    factory: Callable[[LogicalNode], object]   # builds the operator for one task
    parents: list[LogicalNode] = field(default_factory=list)
    children: list[LogicalNode] = field(default_factory=list)
    source_topic: str | None = None
    sink_topic: str | None = None
    stores: list[str] = field(default_factory=list)
    value_preserving: bool = False               # forwards the value object it received
    # What this kind of node declares: one class per node kind (``processor/graph.py``).
    attrs: NodeAttrs = field(default_factory=ProcessorAttrs)
    # Tables whose current values this node reads (joins): not an edge records flow along, but
    # it puts both in one sub-topology, so the table's store is in the same task.
    lookups: list[LogicalNode] = field(default_factory=list)

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
    key_serde: Any = None        # a Serde (a windowed store's: one with ``inner``), bound or not
    value_serde: Any = None
    kind: str = "kv"             # kv | aggregate | emitted (last-emitted column) |
    #                              windowed-aggregate / session-aggregate (DSL) |
    #                              window / session (Processor API: processor/papi_windowed.py) |
    #                              version / subscription (FK join) | join-window / join-outer


def clone_graph(nodes: list[LogicalNode]) -> list[LogicalNode]:
    """Copies of ``nodes`` wired to each other (attributes shared: they are immutable)."""
    clones = {id(n): copy.copy(n) for n in nodes}
    for n in nodes:
        c = clones[id(n)]
        c.parents = [clones[id(p)] for p in n.parents]
        c.children = [clones[id(x)] for x in n.children]
        c.lookups = [clones[id(x)] for x in n.lookups]
        c.stores = list(n.stores)
    return [clones[id(n)] for n in nodes]




@dataclass(frozen=True)
class GlobalStoreSpec:
    """A global table's store (``StreamsBuilder.global_table``): every host holds all of
    ``topic`` (all partitions) in it, outside the tasks; the topic is its changelog."""

    name: str
    topic: str
    key_serde: object
    value_serde: object
    kind: str = "kv"        # read as a key-value store (interactive queries, state dump, the driver)
    timestamp_extractor: object = None   # fn(key, value, record_timestamp) -> the row's timestamp


def user_store_sharers(topo) -> dict[str, list[LogicalNode]]:
    """``{store: its processors}`` for each Processor API store connected to several
    ``process()`` nodes (one store: their sub-topologies are one, their inputs co-partitioned)."""
    users: dict[str, list[LogicalNode]] = {}
    for n in topo.nodes:
        if isinstance(n.attrs, UserProcessorAttrs):
            for name in n.stores:
                users.setdefault(name, []).append(n)
    # (a DSL table's store connected to processors: each looks the table up instead)
    owners = {name: spec.owner for name, spec in topo.stores.items()}
    return {name: ns for name, ns in users.items()
            if len(ns) > 1 and any(n.name == owners.get(name) for n in ns)}
