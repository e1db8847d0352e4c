"""StreamsBuilder: creates sources and collects the logical graph that ``build()`` freezes."""

from __future__ import annotations

from processor.engine.partitioners import resolve as resolve_partitioner
from processor.errors import TopologyError
from processor.operators.sink import Sink
from processor.operators.source import RequireKey, StreamSource, TableSource
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
    @staticmethod
    def _partitioner_attrs(partitioner: str | None) -> dict:
        """``partitioner``: the librdkafka name of the partitioner that wrote the topic
        (``murmur2``/``murmur2_random`` = Java's, ``consistent``/``consistent_random`` =
        confluent-kafka's default, ``fnv1a``/``fnv1a_random``); None: determined from the data
        at start where a join depends on it (README "Partitioning")."""
        if partitioner is None:
            return {}
        try:
            resolve_partitioner(partitioner)
        except ValueError as exc:
            raise TopologyError(str(exc)) from None
        return {"partitioner": partitioner}

    def stream(self, topic: str, key_serde=None, value_serde=None, name: str | None = None,
               partitioner: str | None = None):
        from processor.dsl.kstream import KStream

        key_serde = key_serde or Serdes.string()
        value_serde = value_serde or Serdes.json()
        node = LogicalNode(
            name=self._name("KSTREAM-SOURCE", name), kind="source", source_topic=topic,
            factory=lambda n: StreamSource(n.name, n.source_topic, n.attrs["key_serde"], n.attrs["value_serde"]),
            attrs={"key_serde": key_serde, "value_serde": value_serde, **self._partitioner_attrs(partitioner)},
        )
        self._add(node)
        return KStream(self, node, key_serde, value_serde)

    def table(self, topic: str, key_serde=None, value_serde=None, name: str | None = None,
              store_name: str | None = None, partitioner: str | None = None, repartition: bool = False):
        """A table read from ``topic``; always materialized (in a store with its own changelog).

        ``repartition=True``: the topic's records are first sent through the internal topic
        ``<app>-<node name>-repartition``, placed by our own partitioner (murmur2), and the table is
        read from there, so joins over it are right whatever partitioner (or none) wrote ``topic``
        (README "Partitioning"). Costs one more topic write and read per record."""
        from processor.dsl.ktable import KTable

        key_serde = key_serde or Serdes.string()
        value_serde = value_serde or Serdes.json()
        node_name = self._name("KTABLE-SOURCE", name)
        store = store_name or f"{topic}-STATE-STORE-{self._index - 1:010d}"
        extra = {}
        if repartition:
            topic, extra = self._repartitioned_table_input(topic, node_name, key_serde, value_serde,
                                                           partitioner), {"internal": True}
            extra["internal_topic"] = topic
            partitioner = None
        node = LogicalNode(
            name=node_name, kind="table-source", source_topic=topic, stores=[store],
            factory=lambda n: TableSource(n.name, n.source_topic, n.attrs["key_serde"],
                                          n.attrs["value_serde"], n.stores[0]),
            attrs={"key_serde": key_serde, "value_serde": value_serde,
                   "getter": lambda n, ctx: StoreValueGetter(ctx.get_store(n.stores[0]), n.attrs["value_serde"]),
                   "getter_stores": [store], **self._partitioner_attrs(partitioner), **extra},
        )
        self._add(node)
        self._add_store(StoreSpec(store, node_name, source_topic=topic,
                                  key_serde=key_serde, value_serde=value_serde))
        return KTable(self, node, key_serde, value_serde, store_name=store)

    def _repartitioned_table_input(self, topic, node_name, key_serde, value_serde, partitioner) -> str:
        """source(topic) -> require a key -> sink(<node name>-repartition); returns the internal
        topic. Records that do not deserialize, or have no key, are poison at the source (the
        topology's on-error policy), before they reach the internal topic."""
        source = LogicalNode(
            name=self._name("KSTREAM-SOURCE"), kind="source", source_topic=topic,
            factory=lambda n: StreamSource(n.name, n.source_topic, n.attrs["key_serde"], n.attrs["value_serde"]),
            attrs={"key_serde": key_serde, "value_serde": value_serde, **self._partitioner_attrs(partitioner)})
        self._add(source)
        keyed = LogicalNode(name=self._name("KTABLE-REQUIRE-KEY"), kind="processor",
                            factory=lambda n: RequireKey(n.name), value_preserving=True)
        self._add(keyed, source)
        internal = f"{node_name}-repartition"
        sink = LogicalNode(
            name=self._name("KTABLE-SINK"), kind="sink", sink_topic=internal,
            factory=lambda n: Sink(n.name, n.sink_topic, n.attrs["key_serde"], n.attrs["value_serde"],
                                   passthrough=n.attrs.get("passthrough", False), internal=True),
            attrs={"key_serde": key_serde, "value_serde": value_serde, "internal": True,
                   "internal_topic": internal})
        self._add(sink, keyed)
        return internal

    def build(self, optimize: bool = True) -> Topology:
        if not self._nodes:
            raise TopologyError("the topology is empty: add a stream or table first")
        self._built = True
        return Topology(self._nodes, self._stores, optimize=optimize)
