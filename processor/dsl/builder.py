"""StreamsBuilder: creates sources and collects the logical graph that ``build()`` freezes."""

from __future__ import annotations

from processor.engine.partitioners import resolve as resolve_partitioner
from processor.errors import TopologyError
from processor.graph import GetterSpec, SinkAttrs, SourceAttrs, TableSourceAttrs
from processor.operators.sink import Sink
from processor.operators.source import RequireKey, StreamSource, TableSource
from processor.operators.value_getter import StoreValueGetter
from processor.serde import Serdes
from processor.topology import LogicalNode, StoreSpec, Topology


class StreamsBuilder:
    def __init__(self):
        self._nodes: list[LogicalNode] = []
        self._stores: dict[str, StoreSpec] = {}
        self._user_stores: dict = {}   # Processor API stores added, connected by process()
        self._global_stores: dict = {}  # global tables: {store name: GlobalStoreSpec}
        self._index = 0
        self._built = False

    # -- naming and graph bookkeeping: the API the DSL (KStream, KTable, joins...) builds with ---
    def new_name(self, prefix: str, name: str | None = None) -> str:
        """``name``, or ``<prefix>-<index>`` (Kafka Streams' numbering); either way takes the
        next index.
        """
        n = name or f"{prefix}-{self._index:010d}"
        self._index += 1
        return n

    def peek_name(self, prefix: str, name: str | None = None) -> str:
        """``name``, or ``<prefix>-<index>`` with the index the next ``new_name`` will take,
        without taking it (default store names numbered like the node created next).
        """
        return name or f"{prefix}-{self._index:010d}"

    def stream_of(self, node: LogicalNode, key_serde, value_serde, repartition_required: bool = False):
        """The ``KStream`` of ``node`` (the DSL modules below this one create streams and tables
        through the builder, so none of them imports another upward).
        """
        from processor.dsl.kstream import KStream

        return KStream(self, node, key_serde, value_serde, repartition_required)

    def table_of(self, node: LogicalNode, key_serde, value_serde, store_name=None):
        """The ``KTable`` of ``node`` (see ``stream_of``)."""
        from processor.dsl.ktable import KTable

        return KTable(self, node, key_serde, value_serde, store_name=store_name)

    def add_node(self, node: LogicalNode, *parents: LogicalNode) -> LogicalNode:
        """Add ``node`` to the graph, fed by ``parents`` (in this order); returns it."""
        if self._built:
            raise TopologyError("this StreamsBuilder was already built; make a new one")
        for p in parents:
            p.children.append(node)
            node.parents.append(p)
        self._nodes.append(node)
        return node

    def check_store_names_free(self, *names: str) -> None:
        """Refuse store names already taken (before creating the nodes that would use them)."""
        for name in names:
            if name in self._stores:
                raise TopologyError(f"store name {name!r} is used twice")

    def add_state_store(self, store) -> StreamsBuilder:
        """A store for the Processor API (``Stores.key_value(...)``), connected to a processor by
        ``KStream.process(P, stores=[name])``.
        """
        from processor.papi import StoreBuilder

        if not isinstance(store, StoreBuilder):
            raise TopologyError(f"add_state_store takes Stores.key_value(...), not {store!r}")
        self.check_store_names_free(store.name)
        if store.name in self._user_stores:
            raise TopologyError(f"store name {store.name!r} is used twice")
        self._user_stores[store.name] = store
        return self

    def connect_user_store(self, name: str, node_name: str) -> StoreSpec:
        """Give store ``name`` (added by ``add_state_store``) to processor ``node_name``. A store
        connected to several processors is one store; they share a sub-topology (the graph's
        split joins them, as Kafka Streams does: their inputs must be co-partitioned), and its
        owner is the first.
        """
        store = self._user_stores.get(name)
        if store is None:
            raise TopologyError(f"process(): no store {name!r} was added (builder.add_state_store"
                                f"(Stores.key_value({name!r}, ...))) or materialized by a table defined "
                                f"before this process()")
        if name in self._stores:
            return self._stores[name]
        spec = StoreSpec(name, node_name, None, store.store_key_serde(), store.value_serde, kind=store.kind)
        self.add_store(spec)
        return spec

    def dsl_store_for_process(self, name: str, node_name: str):
        """``(StoreSpec, owner node)`` of the DSL table store ``name`` for ``process(P,
        stores=[name])`` (read-only there), or None when ``name`` is no DSL store (then a
        Processor API store). Key-value stores of tables only: a table source's, ``to_table``'s,
        a join result's, a (non-windowed) aggregate's; the table must be defined first.
        """
        if name in self._user_stores or name not in self._stores:
            if name in self._global_stores:
                raise TopologyError(f"{node_name}: store {name!r} is a global table's: process() connects "
                                    f"Processor API stores and DSL tables' stores, not global ones")
            return None
        spec = self._stores[name]
        if spec.kind not in ("kv", "aggregate"):
            raise TopologyError(f"{node_name}: store {name!r} ({spec.kind}, of {spec.owner}) cannot be connected "
                                f"to process(): only a table's key-value store can (a table source's, "
                                f"to_table's, a join result's, a non-windowed aggregate's)")
        owner = next(n for n in self._nodes if n.name == spec.owner)
        return spec, owner

    def add_store(self, spec: StoreSpec) -> None:
        self.check_store_names_free(spec.name)
        self._stores[spec.name] = spec

    # -- sources -------------------------------------------------------------------------------
    @staticmethod
    def _checked_partitioner(partitioner: str | None) -> str | None:
        """``partitioner``: the librdkafka name of the partitioner that wrote the topic
        (``murmur2``/``murmur2_random`` = Java's, ``consistent``/``consistent_random`` =
        confluent-kafka's default, ``fnv1a``/``fnv1a_random``); None: determined from the data
        at start where a join depends on it (README "Partitioning").
        """
        if partitioner is None:
            return None
        try:
            resolve_partitioner(partitioner)
        except ValueError as exc:
            raise TopologyError(str(exc)) from None
        return partitioner

    def stream(self, topic: str, key_serde=None, value_serde=None, name: str | None = None,
               partitioner: str | None = None, repartition: bool = False, timestamp_extractor=None):
        """A stream read from ``topic``. ``repartition=True``: through the internal topic
        ``<app>-<node name>-repartition`` placed by murmur2 first, so co-partitioned joins over
        it are right whatever partitioner wrote ``topic`` (README "Partitioning").

        ``timestamp_extractor``: ``fn(key, value, record_timestamp) -> int``, the record's event
        time in milliseconds, its time everywhere (the order a task reads its inputs in,
        windows, joins, grace, stream time, output timestamps). An extractor that raises or
        returns anything but a non-negative integer makes the record a bad one (the on-error
        policy), never silently its broker timestamp.
        """
        from processor.dsl.kstream import KStream

        key_serde = key_serde or Serdes.string()
        value_serde = value_serde or Serdes.json()
        self._no_declaration_with_repartition(topic, partitioner, repartition)
        node_name = self.new_name("KSTREAM-SOURCE", name)
        internal_topic = None
        _check_extractor(timestamp_extractor)
        if repartition:   # (the event time is extracted before the repartition topic, its record time)
            topic = internal_topic = self._repartitioned_input(topic, node_name, key_serde, value_serde,
                                                               require_key=False,
                                                               timestamp_extractor=timestamp_extractor)
            timestamp_extractor = None
        node = LogicalNode(
            name=node_name, kind="source", source_topic=topic,
            factory=lambda n: StreamSource(n.name, n.source_topic, n.attrs.key_serde, n.attrs.value_serde,
                                           n.attrs.timestamp_extractor),
            attrs=SourceAttrs(key_serde=key_serde, value_serde=value_serde, internal_topic=internal_topic,
                              partitioner=self._checked_partitioner(partitioner),
                              timestamp_extractor=timestamp_extractor),
        )
        self.add_node(node)
        return KStream(self, node, key_serde, value_serde)

    @staticmethod
    def _no_declaration_with_repartition(topic, partitioner, repartition) -> None:
        if partitioner is not None and repartition:
            raise TopologyError(f"source {topic!r}: declare a partitioner or repartition, not both "
                                f"(a repartitioned source is placed by murmur2 whatever wrote the topic)")

    def table(self, topic: str, key_serde=None, value_serde=None, name: str | None = None,
              store_name: str | None = None, partitioner: str | None = None, repartition: bool = False,
              timestamp_extractor=None):
        """A table read from ``topic``; always materialized (in a store with its own changelog, or,
        under ``build(reuse_source_topics=True)``, restored from ``topic`` itself).

        ``repartition=True``: the topic's records are first sent through the internal topic
        ``<app>-<node name>-repartition``, placed by our own partitioner (murmur2), and the table is
        read from there, so joins over it are right whatever partitioner (or none) wrote ``topic``
        (README "Partitioning"). Costs one more topic write and read per record.

        ``timestamp_extractor``: as ``stream``'s; the row's timestamp is its event time.
        """
        from processor.dsl.ktable import KTable

        key_serde = key_serde or Serdes.string()
        value_serde = value_serde or Serdes.json()
        node_name = self.new_name("KTABLE-SOURCE", name)
        store = store_name or f"{topic}-STATE-STORE-{self._index - 1:010d}"
        self._no_declaration_with_repartition(topic, partitioner, repartition)
        internal_topic = None
        _check_extractor(timestamp_extractor)
        if repartition:
            topic = internal_topic = self._repartitioned_input(topic, node_name, key_serde, value_serde,
                                                               require_key=True,
                                                               timestamp_extractor=timestamp_extractor)
            timestamp_extractor = None
        node = LogicalNode(
            name=node_name, kind="table-source", source_topic=topic, stores=[store],
            factory=lambda n: TableSource(n.name, n.source_topic, n.attrs.key_serde,
                                          n.attrs.value_serde, n.stores[0], n.attrs.timestamp_extractor),
            attrs=TableSourceAttrs(
                key_serde=key_serde, value_serde=value_serde, internal_topic=internal_topic,
                partitioner=self._checked_partitioner(partitioner), timestamp_extractor=timestamp_extractor,
                getter=GetterSpec(lambda n, ctx: StoreValueGetter(ctx.get_store(n.stores[0]), n.attrs.value_serde),
                                  stores=(store,))),
        )
        self.add_node(node)
        self.add_store(StoreSpec(store, node_name, source_topic=topic,
                                 key_serde=key_serde, value_serde=value_serde))
        return KTable(self, node, key_serde, value_serde, store_name=store)

    def global_table(self, topic: str, key_serde=None, value_serde=None, name: str | None = None,
                     timestamp_extractor=None):
        """A table every host holds whole (all partitions of ``topic``, outside the tasks),
        bootstrapped to the topic's end before any task processes a record, then kept current;
        the topic is its changelog. Streams join it by a key selector (``KStream.join``).
        ``timestamp_extractor``: the rows' timestamps (as ``stream``'s; a record it fails on is
        skipped and counted, as one that does not deserialize: a global table has no task).
        """
        from processor.dsl.global_table import GlobalKTable
        from processor.topology.nodes import GlobalStoreSpec

        key_serde = key_serde or Serdes.string()
        value_serde = value_serde or Serdes.json()
        store = name or f"{topic}-GLOBAL-STORE-{self._index:010d}"
        self._index += 1
        self.check_store_names_free(store)
        if store in self._global_stores:
            raise TopologyError(f"store name {store!r} is used twice")
        if any(g.topic == topic for g in self._global_stores.values()) or \
                any(n.source_topic == topic for n in self._nodes):
            raise TopologyError(f"topic {topic!r} is read twice: a global table's topic is read by it alone")
        _check_extractor(timestamp_extractor)
        self._global_stores[store] = GlobalStoreSpec(store, topic, key_serde, value_serde,
                                                     timestamp_extractor=timestamp_extractor)
        return GlobalKTable(store, topic, key_serde, value_serde)

    def _repartitioned_input(self, topic, node_name, key_serde, value_serde, require_key: bool,
                             timestamp_extractor=None) -> str:
        """source(topic) [-> require a key] -> sink(<node name>-repartition); returns the internal
        topic. Records that do not deserialize (and, for a table, have no key) are poison at the
        source (the topology's on-error policy), before they reach the internal topic.
        """
        source = LogicalNode(
            name=self.new_name("KSTREAM-SOURCE"), kind="source", source_topic=topic,
            factory=lambda n: StreamSource(n.name, n.source_topic, n.attrs.key_serde, n.attrs.value_serde,
                                           n.attrs.timestamp_extractor),
            attrs=SourceAttrs(key_serde=key_serde, value_serde=value_serde, timestamp_extractor=timestamp_extractor))
        self.add_node(source)
        last = source
        if require_key:
            last = LogicalNode(name=self.new_name("KTABLE-REQUIRE-KEY"), kind="processor",
                               factory=lambda n: RequireKey(n.name), value_preserving=True)
            self.add_node(last, source)
        internal = f"{node_name}-repartition"
        sink = LogicalNode(
            name=self.new_name("KSTREAM-SINK" if not require_key else "KTABLE-SINK"), kind="sink",
            sink_topic=internal,
            factory=lambda n: Sink(n.name, n.sink_topic, n.attrs.key_serde, n.attrs.value_serde,
                                   passthrough=n.attrs.passthrough, internal=True),
            attrs=SinkAttrs(key_serde=key_serde, value_serde=value_serde, internal_topic=internal))
        self.add_node(sink, last)
        return internal

    def build(self, optimize: bool = True, reuse_source_topics: bool = False) -> Topology:
        """``reuse_source_topics=True``: a table read from a user topic as it is gets no changelog
        topic; its store is restored from the source topic up to the task's committed position
        (Kafka Streams' ``reuse.ktable.source.topics``: one produce per input record less). Only
        for topics that keep every key's latest record (compacted, or retained forever): a restore
        cannot bring back what the broker deleted. README "Reliability".
        """
        if not self._nodes:
            raise TopologyError("the topology is empty: add a stream or table first")
        unconnected = sorted(set(self._user_stores) - set(self._stores))
        if unconnected:
            raise TopologyError(f"store(s) {', '.join(unconnected)} added but connected to no processor "
                                f"(KStream.process(P, stores=[...]))")
        extractors: dict[str, set] = {}
        for n in self._nodes:
            if n.source_topic and isinstance(n.attrs, SourceAttrs):
                extractors.setdefault(n.source_topic, set()).add(n.attrs.timestamp_extractor)
        mixed = sorted(t for t, fns in extractors.items() if len(fns) > 1)
        if mixed:
            # a record has one time: the order its task reads it in is decided before any source sees it
            raise TopologyError(f"topic(s) {', '.join(mixed)} are read by sources with different timestamp "
                                f"extractors (or with and without one); give every source of a topic the same")
        if reuse_source_topics:
            extracted = sorted(n.source_topic for n in self._nodes if n.kind == "table-source"
                               and n.attrs.timestamp_extractor is not None)
            if extracted:
                # a restore from the topic would give the rows their broker timestamps
                raise TopologyError(f"reuse_source_topics=True: the table(s) of {', '.join(extracted)} have a "
                                    f"timestamp extractor; their stores need changelog topics of their own")
        self._built = True
        return Topology(self._nodes, self._stores, optimize=optimize, reuse_source_topics=reuse_source_topics,
                        global_stores=self._global_stores)


def _check_extractor(fn) -> None:
    if fn is not None and not callable(fn):
        raise TopologyError(f"timestamp_extractor must be a function (key, value, record_timestamp) -> "
                            f"milliseconds, not {fn!r}")
