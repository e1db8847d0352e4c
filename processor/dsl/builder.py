"""StreamsBuilder: creates sources and collects the logical graph that ``build()`` freezes."""

from __future__ import annotations

from processor.errors import TopologyError
from processor.operators.source import StreamSource, TableSource
from processor.operators.value_getter import StoreValueGetter
from processor.serde import Serdes
from processor.topology import LogicalNode, StoreSpec, Topology


class StreamsBuilder:
    def __init__(self):
        self._nodes: list[LogicalNode] = []
        self._stores: dict[str, StoreSpec] = {}
        self._index = 0
        self._built = False

    # -- naming and graph bookkeeping (used by KStream/KTable) ---------------------------------
    def _name(self, prefix: str, name: str | None = None) -> str:
        n = name or f"{prefix}-{self._index:010d}"
        self._index += 1
        return n

    def _add(self, node: LogicalNode, *parents: LogicalNode) -> LogicalNode:
        if self._built:
            raise TopologyError("this StreamsBuilder was already built; make a new one")
        for p in parents:
            p.children.append(node)
            node.parents.append(p)
        self._nodes.append(node)
        return node

    def _add_store(self, spec: StoreSpec) -> None:
        if spec.name in self._stores:
            raise TopologyError(f"store name {spec.name!r} is used twice")
        self._stores[spec.name] = spec

    # -- sources -------------------------------------------------------------------------------
    def stream(self, topic: str, key_serde=None, value_serde=None, name: str | None = None):
        from processor.dsl.kstream import KStream

        key_serde = key_serde or Serdes.string()
        value_serde = value_serde or Serdes.json()
        node = LogicalNode(
            name=self._name("KSTREAM-SOURCE", name), kind="source", source_topic=topic,
            factory=lambda n: StreamSource(n.name, n.source_topic, n.attrs["key_serde"], n.attrs["value_serde"]),
            attrs={"key_serde": key_serde, "value_serde": value_serde},
        )
        self._add(node)
        return KStream(self, node, key_serde, value_serde)

    def table(self, topic: str, key_serde=None, value_serde=None, name: str | None = None,
              store_name: str | None = None):
        """A table read from ``topic``; always materialized (in a store with its own changelog)."""
        from processor.dsl.ktable import KTable

        key_serde = key_serde or Serdes.string()
        value_serde = value_serde or Serdes.json()
        node_name = self._name("KTABLE-SOURCE", name)
        store = store_name or f"{topic}-STATE-STORE-{self._index - 1:010d}"
        node = LogicalNode(
            name=node_name, kind="table-source", source_topic=topic, stores=[store],
            factory=lambda n: TableSource(n.name, n.source_topic, n.attrs["key_serde"],
                                          n.attrs["value_serde"], n.stores[0]),
            attrs={"key_serde": key_serde, "value_serde": value_serde,
                   "getter": lambda n, ctx: StoreValueGetter(ctx.get_store(n.stores[0]), n.attrs["value_serde"]),
                   "getter_stores": [store]},
        )
        self._add(node)
        self._add_store(StoreSpec(store, node_name, source_topic=topic,
                                  key_serde=key_serde, value_serde=value_serde))
        return KTable(self, node, key_serde, value_serde, store_name=store)

    def build(self, optimize: bool = True) -> Topology:
        if not self._nodes:
            raise TopologyError("the topology is empty: add a stream or table first")
        self._built = True
        return Topology(self._nodes, self._stores, optimize=optimize)
