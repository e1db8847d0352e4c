"""StreamsBuilder: creates sources and collects the logical graph that ``build()`` freezes."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from processor.engine.partitioners import resolve as resolve_partitioner
from processor.errors import TopologyError
from processor.graph import GetterSpec, SinkAttrs, SourceAttrs, TableSourceAttrs
from processor.operators.sink import Sink
from processor.operators.source import RequireKey, StreamSource, TableSource
from processor.operators.value_getter import StoreValueGetter
from processor.serde import Serde, Serdes
from processor.topology import LogicalNode, StoreSpec, Topology

if TYPE_CHECKING:  # pragma: no cover
    from processor.dsl.global_table import GlobalKTable
    from processor.dsl.kstream import KStream
    from processor.dsl.ktable import KTable
    from processor.functions import TimestampExtractor
    from processor.papi import StoreBuilder
    from processor.topology.nodes import GlobalStoreSpec


class StreamsBuilder:
    """Builds a topology: its sources, then the operators over them (Kafka Streams: ``StreamsBuilder``).

    ``stream``, ``table`` and ``global_table`` read topics; the ``KStream``/``KTable`` they
    return add operators to this builder's graph; ``build()`` freezes it into a ``Topology``, run
    by a worker or by ``processor.testing.TopologyTestDriver``. A builder is built once.

    Example:
        >>> from processor import StreamsBuilder
        >>> from processor.testing import TopologyTestDriver
        >>> builder = StreamsBuilder()
        >>> builder.stream("input").map_values(lambda v: v * 2).to("output")
        >>> topology = builder.build()
        >>> with TopologyTestDriver(topology) as driver:
        ...     driver.pipe_input("input", "k", 21, timestamp=0)
        ...     driver.read_output("output")
        [OutputRecord(key='k', value=42, timestamp=0, headers=())]
    """
    def __init__(self) -> None:
        self._nodes: list[LogicalNode] = []
        self._stores: dict[str, StoreSpec] = {}
        self._user_stores: dict[str, StoreBuilder] = {}   # Processor API stores added, connected by process()
        self._global_stores: dict[str, GlobalStoreSpec] = {}  # global tables: {store name: GlobalStoreSpec}
        self._index = 0
        self._built = False

    # -- naming and graph bookkeeping: the API the DSL (KStream, KTable, joins...) builds with ---
    def new_name(self, prefix: str, name: str | None = None) -> str:
        """``name``, or ``<prefix>-<index>`` (Kafka Streams' numbering); either way takes the next index.

        Args:
            prefix: The kind of node (``KSTREAM-FILTER``...).
            name: The name the user gave, if any.

        Returns:
            The node's name.
        """
        n = name or f"{prefix}-{self._index:010d}"
        self._index += 1
        return n

    def peek_name(self, prefix: str, name: str | None = None) -> str:
        """``name``, or ``<prefix>-<index>`` with the index the next ``new_name`` will take, without taking it.

        Default store names are numbered like the node created next.

        Args:
            prefix: The kind of store (``KTABLE-AGGREGATE-STATE-STORE``...).
            name: The name the user gave, if any.

        Returns:
            The store's name.
        """
        return name or f"{prefix}-{self._index:010d}"

    def stream_of(self, node: LogicalNode, key_serde: Serde, value_serde: Serde,
                  repartition_required: bool = False) -> KStream:
        """The ``KStream`` of ``node``.

        The DSL modules below this one create streams and tables through the builder, so none
        of them imports another upward.

        Args:
            node: The node whose output the stream is.
            key_serde: The stream's key serde.
            value_serde: The stream's value serde.
            repartition_required: A key-changing operator came before.

        Returns:
            The stream.
        """
        from processor.dsl.kstream import KStream

        return KStream(self, node, key_serde, value_serde, repartition_required)

    def table_of(self, node: LogicalNode, key_serde: Serde, value_serde: Serde,
                 store_name: str | None = None) -> KTable:
        """The ``KTable`` of ``node`` (see ``stream_of``).

        Args:
            node: The node whose output the table is.
            key_serde: The table's key serde.
            value_serde: The table's value serde.
            store_name: The store it is materialized in, if any.

        Returns:
            The table.
        """
        from processor.dsl.ktable import KTable

        return KTable(self, node, key_serde, value_serde, store_name=store_name)

    def add_node(self, node: LogicalNode, *parents: LogicalNode) -> LogicalNode:
        """Adds ``node`` to the graph, fed by ``parents`` (in this order).

        Args:
            node: The new node.
            *parents: The nodes whose records it receives.

        Returns:
            ``node``.

        Raises:
            TopologyError: The builder was already built.
        """
        if self._built:
            raise TopologyError("this StreamsBuilder was already built; make a new one")
        for p in parents:
            p.children.append(node)
            node.parents.append(p)
        self._nodes.append(node)
        return node

    def check_store_names_free(self, *names: str) -> None:
        """Refuses store names already taken (before creating the nodes that would use them).

        Args:
            *names: The store names.

        Raises:
            TopologyError: A name is taken.
        """
        for name in names:
            if name in self._stores:
                raise TopologyError(f"store name {name!r} is used twice")

    def add_state_store(self, store: StoreBuilder) -> StreamsBuilder:
        """Adds a Processor API store (Kafka Streams: ``StreamsBuilder#addStateStore``).

        The store is connected to a processor by ``KStream.process(P, stores=[name])``.

        Args:
            store: ``Stores.key_value(...)``, ``Stores.window(...)`` or ``Stores.session(...)``.

        Returns:
            This builder.

        Raises:
            TopologyError: ``store`` is no store builder, or its name is taken.
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
        """Gives store ``name`` (added by ``add_state_store``) to processor ``node_name``.

        A store connected to several processors is one store; they share a sub-topology (the
        graph's split joins them, as Kafka Streams does: their inputs must be co-partitioned),
        and its owner is the first.

        Args:
            name: The store's name.
            node_name: The processor node's name.

        Returns:
            The store's spec.

        Raises:
            TopologyError: No store ``name`` was added.
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

    def dsl_store_for_process(self, name: str, node_name: str) -> tuple[StoreSpec, LogicalNode] | None:
        """The DSL table store ``name`` for ``process(P, stores=[name])`` (read-only there).

        Key-value stores of tables only: a table source's, ``to_table``'s, a join result's, a
        (non-windowed) aggregate's; the table must be defined first.

        Args:
            name: The store's name.
            node_name: The processor node's name.

        Returns:
            ``(StoreSpec, owner node)``, or None when ``name`` is no DSL store (then a Processor
            API store).

        Raises:
            TopologyError: ``name`` is a global table's store, or a store of another kind.
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
        """Adds a DSL store to the graph.

        Args:
            spec: The store.

        Raises:
            TopologyError: Its name is taken.
        """
        self.check_store_names_free(spec.name)
        self._stores[spec.name] = spec

    # -- sources -------------------------------------------------------------------------------
    @staticmethod
    def _checked_partitioner(partitioner: str | None) -> str | None:
        """``partitioner``, checked: the librdkafka name of the partitioner that wrote the topic.

        ``murmur2``/``murmur2_random`` = Java's, ``consistent``/``consistent_random`` =
        confluent-kafka's default, ``fnv1a``/``fnv1a_random``; None: determined from the data
        at start where a join depends on it (docs/semantics.md "Partitioning").
        """
        if partitioner is None:
            return None
        try:
            resolve_partitioner(partitioner)
        except ValueError as exc:
            raise TopologyError(str(exc)) from None
        return partitioner

    def stream(self, topic: str, key_serde: Serde | None = None, value_serde: Serde | None = None,
               name: str | None = None, partitioner: str | None = None, repartition: bool = False,
               timestamp_extractor: TimestampExtractor | None = None) -> KStream:
        """A stream read from ``topic`` (Kafka Streams: ``StreamsBuilder#stream``).

        Args:
            topic: The topic.
            key_serde: Its key serde (default string).
            value_serde: Its value serde (default JSON).
            name: The source's name (default ``KSTREAM-SOURCE-<index>``).
            partitioner: The librdkafka name of the partitioner that wrote the topic
                (``murmur2``, ``consistent_random``, ``fnv1a``...); None: determined from the data
                at start where a join depends on it (docs/semantics.md "Partitioning").
            repartition: Read it through the internal topic ``<app>-<node name>-repartition``,
                placed by murmur2 first, so co-partitioned joins over it are right whatever
                partitioner wrote ``topic``.
            timestamp_extractor: ``(key, value, record timestamp) -> int``, the record's event
                time in milliseconds, its time everywhere (the order a task reads its inputs in,
                windows, joins, grace, stream time, output timestamps). An extractor that raises
                or returns anything but a non-negative integer makes the record a bad one (the
                on-error policy), never silently its broker timestamp.

        Returns:
            The stream.

        Raises:
            TopologyError: Both ``partitioner`` and ``repartition``, an unknown partitioner, or
                an extractor that is no function.

        Example:
            >>> from processor import StreamsBuilder
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> clicks = builder.stream("clicks", timestamp_extractor=lambda k, v, ts: v["at"])
            >>> clicks.to("clicks-by-event-time")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     driver.pipe_input("clicks", "u1", {"at": 1234}, timestamp=99)
            ...     [r.timestamp for r in driver.read_output("clicks-by-event-time")]
            [1234]
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
            factory=_stream_source,
            attrs=SourceAttrs(key_serde=key_serde, value_serde=value_serde, internal_topic=internal_topic,
                              partitioner=self._checked_partitioner(partitioner),
                              timestamp_extractor=timestamp_extractor),
        )
        self.add_node(node)
        return KStream(self, node, key_serde, value_serde)

    @staticmethod
    def _no_declaration_with_repartition(topic: str, partitioner: str | None, repartition: bool) -> None:
        if partitioner is not None and repartition:
            raise TopologyError(f"source {topic!r}: declare a partitioner or repartition, not both "
                                f"(a repartitioned source is placed by murmur2 whatever wrote the topic)")

    def table(self, topic: str, key_serde: Serde | None = None, value_serde: Serde | None = None,
              name: str | None = None, store_name: str | None = None, partitioner: str | None = None,
              repartition: bool = False, timestamp_extractor: TimestampExtractor | None = None) -> KTable:
        """A table read from ``topic``, each record an update of its key (Kafka Streams: ``StreamsBuilder#table``).

        Always materialized: in a store with its own changelog or, under
        ``build(reuse_source_topics=True)``, restored from ``topic`` itself. A None value
        deletes its key.

        Args:
            topic: The topic.
            key_serde: Its key serde (default string).
            value_serde: Its value serde (default JSON).
            name: The source's name (default ``KTABLE-SOURCE-<index>``).
            store_name: The store's name (default ``<topic>-STATE-STORE-<index>``).
            partitioner: As ``stream``'s.
            repartition: The records first go through the internal topic
                ``<app>-<node name>-repartition``, placed by murmur2, and the table is read from
                there, so joins over it are right whatever partitioner (or none) wrote ``topic``
                (docs/semantics.md "Partitioning"). Costs one more topic write and read per record.
            timestamp_extractor: As ``stream``'s; the row's timestamp is its event time.

        Returns:
            The table.

        Raises:
            TopologyError: As ``stream``'s, or a store name used twice.

        Example:
            >>> from processor import StreamsBuilder
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> builder.table("balances").to_stream().to("balance-changes")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     driver.pipe_input("balances", "acct-1", 100, timestamp=1)
            ...     driver.pipe_input("balances", "acct-1", 100, timestamp=2)
            ...     driver.pipe_input("balances", "acct-1", None, timestamp=3)
            ...     [(r.key, r.value) for r in driver.read_output("balance-changes")]
            ...     driver.get_store("balances-STATE-STORE-0000000000").get("acct-1") is None
            [('acct-1', 100), ('acct-1', None)]
            True
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
            factory=_table_source,
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

    def global_table(self, topic: str, key_serde: Serde | None = None, value_serde: Serde | None = None,
                     name: str | None = None,
                     timestamp_extractor: TimestampExtractor | None = None) -> GlobalKTable:
        """A table every host holds whole (Kafka Streams: ``StreamsBuilder#globalTable``).

        All partitions of ``topic``, outside the tasks, bootstrapped to the topic's end before
        any task processes a record, then kept current; the topic is its changelog. Streams join
        it by a key selector (``KStream.join(table, joiner, key_selector=...)``).

        Args:
            topic: The topic, read by this global table alone.
            key_serde: Its key serde (default string).
            value_serde: Its value serde (default JSON).
            name: The global store's name (default ``<topic>-GLOBAL-STORE-<index>``).
            timestamp_extractor: The rows' timestamps (as ``stream``'s; a record it fails on is
                skipped and counted, as one that does not deserialize: a global table has no
                task).

        Returns:
            The global table.

        Raises:
            TopologyError: The store name is taken, or the topic is read by another source.
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

    def _repartitioned_input(self, topic: str, node_name: str, key_serde: Serde, value_serde: Serde,
                             require_key: bool, timestamp_extractor: TimestampExtractor | None = None) -> str:
        """Adds ``source(topic) [-> require a key] -> sink(<node name>-repartition)``; returns the internal topic.

        Records that do not deserialize (and, for a table, have no key) are poison at the
        source (the topology's on-error policy), before they reach the internal topic.
        """
        source = LogicalNode(
            name=self.new_name("KSTREAM-SOURCE"), kind="source", source_topic=topic,
            factory=_stream_source,
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
            factory=_internal_sink,
            attrs=SinkAttrs(key_serde=key_serde, value_serde=value_serde, internal_topic=internal))
        self.add_node(sink, last)
        return internal

    def build(self, optimize: bool = True, reuse_source_topics: bool = False) -> Topology:
        """Freezes the graph into a ``Topology`` (Kafka Streams: ``StreamsBuilder#build``).

        Args:
            optimize: Run the topology's optimization passes (repartition merging, self-joins...).
            reuse_source_topics: A table read from a user topic as it is gets no changelog topic;
                its store is restored from the source topic up to the task's committed position
                (Kafka Streams' ``reuse.ktable.source.topics``: one produce per input record
                less). Only for topics that keep every key's latest record (compacted, or
                retained forever): a restore cannot bring back what the broker deleted
                (docs/semantics.md "A source topic as its table's changelog").

        Returns:
            The topology.

        Raises:
            TopologyError: The graph is empty, a store was added but connected to no processor,
                sources of one topic have different timestamp extractors, or
                ``reuse_source_topics`` with a table that has an extractor.
        """
        if not self._nodes:
            raise TopologyError("the topology is empty: add a stream or table first")
        unconnected = sorted(set(self._user_stores) - set(self._stores))
        if unconnected:
            raise TopologyError(f"store(s) {', '.join(unconnected)} added but connected to no processor "
                                f"(KStream.process(P, stores=[...]))")
        extractors: dict[str, set[TimestampExtractor | None]] = {}
        for n in self._nodes:
            if n.source_topic and isinstance(n.attrs, SourceAttrs):
                extractors.setdefault(n.source_topic, set()).add(n.attrs.timestamp_extractor)
        mixed = sorted(t for t, fns in extractors.items() if len(fns) > 1)
        if mixed:
            # a record has one time: the order its task reads it in is decided before any source sees it
            raise TopologyError(f"topic(s) {', '.join(mixed)} are read by sources with different timestamp "
                                f"extractors (or with and without one); give every source of a topic the same")
        if reuse_source_topics:
            extracted = sorted(cast(str, n.source_topic) for n in self._nodes if n.kind == "table-source"
                               and cast(TableSourceAttrs, n.attrs).timestamp_extractor is not None)
            if extracted:
                # a restore from the topic would give the rows their broker timestamps
                raise TopologyError(f"reuse_source_topics=True: the table(s) of {', '.join(extracted)} have a "
                                    f"timestamp extractor; their stores need changelog topics of their own")
        self._built = True
        return Topology(self._nodes, self._stores, optimize=optimize, reuse_source_topics=reuse_source_topics,
                        global_stores=self._global_stores)


def _check_extractor(fn: object) -> None:
    if fn is not None and not callable(fn):
        raise TopologyError(f"timestamp_extractor must be a function (key, value, record_timestamp) -> "
                            f"milliseconds, not {fn!r}")


def _stream_source(n: LogicalNode) -> StreamSource:
    """The operator of a stream source node (serdes and extractor: its attrs', as the topology binds them)."""
    a = cast(SourceAttrs, n.attrs)
    return StreamSource(n.name, n.source_topic, a.key_serde, a.value_serde, a.timestamp_extractor)


def _table_source(n: LogicalNode) -> TableSource:
    """The operator of a table source node."""
    a = cast(TableSourceAttrs, n.attrs)
    return TableSource(n.name, n.source_topic, a.key_serde, a.value_serde, n.stores[0], a.timestamp_extractor)


def _internal_sink(n: LogicalNode) -> Sink:
    """The operator of the sink of a repartitioned source's internal topic."""
    a = cast(SinkAttrs, n.attrs)
    return Sink(n.name, n.sink_topic, a.key_serde, a.value_serde, passthrough=a.passthrough, internal=True)
