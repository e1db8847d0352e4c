"""KStream: a record stream, and ``BranchedKStream`` (``split()``).

Invariant: a ``KStream`` is a handle on one node of its builder's graph, with its serdes and
whether a key-changing operator came before; its operators only add nodes after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from processor.dsl.abstract_stream import AbstractStream, builder_of, graph_node_of
from processor.dsl.repartition import repartition_through
from processor.errors import TopologyError
from processor.graph import GetterSpec, GlobalJoinAttrs, SinkAttrs, TableAttrs, UserProcessorAttrs
from processor.operators.filter import StreamFilter
from processor.operators.global_join import StreamGlobalTableJoin
from processor.operators.map_values import StreamMapValues
from processor.operators.sink import PassThrough, Sink
from processor.operators.stream_map import (
    StreamBranch,
    StreamFlatMap,
    StreamFlatMapValues,
    StreamMap,
    StreamPeek,
    StreamSelectKey,
)
from processor.operators.to_table import StreamToTable
from processor.operators.user_processor import UserProcessor
from processor.operators.value_getter import StoreValueGetter
from processor.serde import Serde, Serdes
from processor.topology import LogicalNode, StoreSpec
from processor.topology.naming import repartition_topic

if TYPE_CHECKING:  # pragma: no cover
    from processor.dsl.builder import StreamsBuilder
    from processor.dsl.global_table import GlobalKTable
    from processor.dsl.grouped import KGroupedStream
    from processor.dsl.ktable import KTable
    from processor.dsl.windows import JoinWindows
    from processor.functions import (
        FlatValueMapper,
        ForeachAction,
        KeySelector,
        KeyValueMapper,
        Predicate,
        ProcessorSupplier,
        TopicNameExtractor,
        ValueJoiner,
        ValueMapper,
    )


class KStream(AbstractStream):
    """A record stream: each record an independent fact (Kafka Streams: ``KStream``).

    Made by ``StreamsBuilder.stream``, ``KTable.to_stream`` and the stream operators. After a
    key-changing operator (``map``, ``select_key``, ``flat_map``, ``process``) a later
    ``group_by_key``, ``join`` or ``to_table`` goes through a repartition topic first, as in
    Kafka Streams.

    Attributes:
        key_serde: The serde of the stream's keys.
        value_serde: The serde of the stream's values.
        repartition_required: A key-changing operator came before.

    Example:
        >>> from processor import StreamsBuilder
        >>> from processor.testing import TopologyTestDriver
        >>> builder = StreamsBuilder()
        >>> builder.stream("words").filter(lambda k, v: len(v) > 3).to("long-words")
        >>> with TopologyTestDriver(builder.build()) as driver:
        ...     for word in ["a", "stream", "of", "words"]:
        ...         driver.pipe_input("words", None, word, timestamp=1)
        ...     [r.value for r in driver.read_output("long-words")]
        ['stream', 'words']
    """
    dsl_kind = "stream"

    def __init__(self, builder: StreamsBuilder, node: LogicalNode, key_serde: Serde, value_serde: Serde,
                 repartition_required: bool = False):
        super().__init__(builder, node)
        self.key_serde = key_serde
        self.value_serde = value_serde
        # a key-changing operator (map, select_key, flat_map) came before: a later group_by_key,
        # join or to_table goes through a repartition topic by the new key first (Kafka Streams)
        self.repartition_required = repartition_required

    def _then(self, prefix: str, factory: Callable[[LogicalNode], Any], name: str | None = None,
              value_serde: Serde | None = None, value_preserving: bool = False, key_serde: Serde | None = None,
              key_changing: bool = False) -> KStream:
        b = self._builder
        node = LogicalNode(name=b.new_name(prefix, name), kind="processor", factory=factory,
                           value_preserving=value_preserving)
        b.add_node(node, self._node)
        return KStream(b, node, key_serde or self.key_serde, value_serde or self.value_serde,
                       self.repartition_required or key_changing)

    # -- stateless record-at-a-time operators (processor/operators/stream_map.py) --------------
    def map(self, mapper: KeyValueMapper, key_serde: Serde | None = None, value_serde: Serde | None = None,
            name: str | None = None) -> KStream:
        """Each record mapped to a new key and value (Kafka Streams: ``KStream#map``).

        Changes the key: a later ``group_by_key``, ``join`` or ``to_table`` repartitions first.

        Args:
            mapper: ``(key, value) -> (new key, new value)``.
            key_serde: The result's key serde (default: this stream's).
            value_serde: The result's value serde (default JSON).
            name: The operator's name (default ``KSTREAM-MAP-<index>``).

        Returns:
            The mapped stream.

        Example:
            >>> from processor import StreamsBuilder
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> builder.stream("visits").map(lambda k, v: (v["page"], 1)).to("page-hits")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     driver.pipe_input("visits", "u1", {"page": "/home"}, timestamp=1)
            ...     [(r.key, r.value) for r in driver.read_output("page-hits")]
            [('/home', 1)]
        """
        return self._then("KSTREAM-MAP", lambda n: StreamMap(n.name, mapper), name,
                          value_serde=value_serde or Serdes.json(), key_serde=key_serde, key_changing=True)

    def select_key(self, mapper: KeySelector, key_serde: Serde | None = None,
                   name: str | None = None) -> KStream:
        """Each record with a new key, its value unchanged (Kafka Streams: ``KStream#selectKey``).

        Changes the key, as ``map``.

        Args:
            mapper: ``(key, value) -> new key``.
            key_serde: The result's key serde (default: this stream's).
            name: The operator's name (default ``KSTREAM-KEY-SELECT-<index>``).

        Returns:
            The re-keyed stream.
        """
        return self._then("KSTREAM-KEY-SELECT", lambda n: StreamSelectKey(n.name, mapper), name,
                          value_preserving=True, key_serde=key_serde, key_changing=True)

    def flat_map(self, mapper: KeyValueMapper, key_serde: Serde | None = None, value_serde: Serde | None = None,
                 name: str | None = None) -> KStream:
        """Each record mapped to zero or more records (Kafka Streams: ``KStream#flatMap``).

        Changes the key, as ``map``.

        Args:
            mapper: ``(key, value) ->`` an iterable of ``(new key, new value)``, forwarded in its
                order.
            key_serde: The result's key serde (default: this stream's).
            value_serde: The result's value serde (default JSON).
            name: The operator's name (default ``KSTREAM-FLATMAP-<index>``).

        Returns:
            The stream of the mapped records.
        """
        return self._then("KSTREAM-FLATMAP", lambda n: StreamFlatMap(n.name, mapper), name,
                          value_serde=value_serde or Serdes.json(), key_serde=key_serde, key_changing=True)

    def flat_map_values(self, mapper: FlatValueMapper, value_serde: Serde | None = None,
                        name: str | None = None) -> KStream:
        """Each record's value mapped to zero or more values (Kafka Streams: ``KStream#flatMapValues``).

        Args:
            mapper: ``(value) ->`` an iterable of values, each forwarded with the record's key,
                in its order.
            value_serde: The result's value serde (default JSON).
            name: The operator's name (default ``KSTREAM-FLATMAPVALUES-<index>``).

        Returns:
            The stream of the mapped records (the key is unchanged).
        """
        return self._then("KSTREAM-FLATMAPVALUES", lambda n: StreamFlatMapValues(n.name, mapper), name,
                          value_serde=value_serde or Serdes.json())

    def peek(self, action: ForeachAction, name: str | None = None) -> KStream:
        """Calls ``action`` on each record, which goes on unchanged (Kafka Streams: ``KStream#peek``).

        Args:
            action: ``(key, value) -> None``.
            name: The operator's name (default ``KSTREAM-PEEK-<index>``).

        Returns:
            This stream's records, unchanged.
        """
        return self._then("KSTREAM-PEEK", lambda n: StreamPeek(n.name, action), name, value_preserving=True)

    def foreach(self, action: ForeachAction, name: str | None = None) -> None:
        """Calls ``action`` on each record; a terminal operation (Kafka Streams: ``KStream#foreach``).

        Args:
            action: ``(key, value) -> None``.
            name: The operator's name (default ``KSTREAM-FOREACH-<index>``).
        """
        self._then("KSTREAM-FOREACH", lambda n: StreamPeek(n.name, action), name, value_preserving=True)

    def process(self, processor: ProcessorSupplier, stores: str | Iterable[str] = (),
                name: str | None = None) -> KStream:
        """A user ``Processor`` over this stream (Kafka Streams: ``KStream#process``, Processor API).

        One processor instance per task. A store of ``stores`` is either added with
        ``builder.add_state_store`` (read and written), or a DSL table's store (read-only; the
        processor then joins the table's sub-topology, co-partitioned with it).

        Args:
            processor: A ``processor.Processor`` subclass, or a zero-argument factory of one.
            stores: The names of the stores it uses (one name, or several).
            name: The operator's name (default ``KSTREAM-PROCESSOR-<index>``).

        Returns:
            The stream of what the processor forwards (serdes: this stream's; the key may
            change, so a later keyed operator repartitions).

        Raises:
            TopologyError: ``processor`` is not callable, or a store is unknown or cannot be
                connected.
        """
        if not callable(processor):
            raise TopologyError(f"process() takes a Processor class or a factory of one, not {processor!r}")
        if isinstance(stores, str):
            stores = [stores]
        b = self._builder
        node_name = b.new_name("KSTREAM-PROCESSOR", name)
        # a DSL table's store (table(store_name=), to_table(name), an aggregate's name=...) is
        # connected read-only; the processor looks its table up, so it joins the table's
        # sub-topology (co-partitioned with it, as Kafka Streams requires)
        specs: dict[str, StoreSpec] = {}
        read_only: dict[str, str] = {}
        lookups: list[LogicalNode] = []
        for s in stores:
            dsl = b.dsl_store_for_process(s, node_name)
            if dsl is None:
                specs[s] = b.connect_user_store(s, node_name)
                continue
            specs[s], owner = dsl
            read_only[s] = owner.name
            if all(x is not owner for x in lookups):
                lookups.append(owner)
        node = LogicalNode(name=node_name, kind="processor", stores=list(specs), lookups=lookups,
                           attrs=UserProcessorAttrs(store_specs=tuple(specs.items())),
                           factory=lambda n: UserProcessor(n.name, processor,
                                                           dict(cast(UserProcessorAttrs, n.attrs).store_specs),
                                                           read_only))
        b.add_node(node, self._node)
        return KStream(b, node, self.key_serde, self.value_serde, True)

    def split(self, name: str | None = None) -> BranchedKStream:
        """Branches of this stream, each record to the first whose predicate holds (Kafka Streams: ``KStream#split``).

        Add branches with ``.branch(predicate, name=...)``, then finish with
        ``.default_branch()`` or ``.no_default_branch()``, which return ``{branch name: KStream}``.

        Args:
            name: The prefix of the branches' names.

        Returns:
            The ``BranchedKStream`` to add branches to.
        """
        return BranchedKStream(self, name)

    def repartition(self, key_serde: Serde | None = None, value_serde: Serde | None = None,
                    partitions: int | None = None, name: str | None = None) -> KStream:
        """This stream through a repartition topic, placed by its key (Kafka Streams: ``KStream#repartition``).

        The internal topic is ``<application-id>-<name>-repartition``; records are placed by
        murmur2 of the key's bytes, as Kafka's default partitioner.

        Args:
            key_serde: The topic's key serde (default: this stream's).
            value_serde: The topic's value serde (default: this stream's).
            partitions: The topic's partition count (default: as its writers' source topics).
            name: The topic's base name (default ``KSTREAM-REPARTITION-<index>``).

        Returns:
            The stream read back from the repartition topic.

        Raises:
            TopologyError: ``partitions`` is not a positive number.
        """
        if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
            raise TopologyError(f"repartition(partitions=...) takes a positive number, not {partitions!r}")
        return self._through_repartition(name, key_serde, value_serde, partitions)

    def _through_repartition(self, name: str | None, key_serde: Serde | None = None,
                             value_serde: Serde | None = None, partitions: int | None = None) -> KStream:
        b = self._builder
        base = b.new_name("KSTREAM-REPARTITION", name)
        ks, vs = key_serde or self.key_serde, value_serde or self.value_serde
        source = repartition_through(b, self._node, repartition_topic(base), ks, vs, partitions)
        return KStream(b, source, ks, vs)

    def _by_key(self, key_serde: Serde | None = None, value_serde: Serde | None = None) -> KStream:
        """This stream, or, after a key-changing operator, this stream through a repartition topic.

        Written with ``key_serde``/``value_serde`` when given: the serdes of what follows, as
        Kafka Streams' Materialized ones.
        """
        return self._through_repartition(None, key_serde, value_serde) if self.repartition_required else self

    def filter(self, predicate: Predicate, name: str | None = None) -> KStream:
        """The records for which ``predicate(key, value)`` holds (Kafka Streams: ``KStream#filter``).

        Args:
            predicate: ``(key, value) -> bool``.
            name: The operator's name (default ``KSTREAM-FILTER-<index>``).

        Returns:
            The filtered stream.

        Example:
            >>> from processor import StreamsBuilder
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> builder.stream("orders").filter(lambda k, v: v["total"] >= 100).to("big-orders")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     driver.pipe_input("orders", "o1", {"total": 20}, timestamp=1)
            ...     driver.pipe_input("orders", "o2", {"total": 250}, timestamp=2)
            ...     [r.key for r in driver.read_output("big-orders")]
            ['o2']
        """
        return self._then("KSTREAM-FILTER", lambda n: StreamFilter(n.name, predicate), name,
                          value_preserving=True)

    def filter_not(self, predicate: Predicate, name: str | None = None) -> KStream:
        """The records for which ``predicate(key, value)`` does not hold (Kafka Streams: ``KStream#filterNot``).

        Args:
            predicate: ``(key, value) -> bool``; the records for which it is false are kept.
            name: The operator's name (default ``KSTREAM-FILTER-<index>``).

        Returns:
            The filtered stream.
        """
        return self._then("KSTREAM-FILTER", lambda n: StreamFilter(n.name, predicate, negate=True), name,
                          value_preserving=True)

    def map_values(self, mapper: ValueMapper, value_serde: Serde | None = None,
                   name: str | None = None) -> KStream:
        """Each record's value mapped by ``mapper``, the key unchanged (Kafka Streams: ``KStream#mapValues``).

        Args:
            mapper: ``(value) -> new value``.
            value_serde: The result's value serde (default JSON).
            name: The operator's name (default ``KSTREAM-MAPVALUES-<index>``).

        Returns:
            The mapped stream.
        """
        return self._then("KSTREAM-MAPVALUES", lambda n: StreamMapValues(n.name, mapper), name,
                          value_serde=value_serde or Serdes.json())

    def merge(self, other: KStream, name: str | None = None) -> KStream:
        """The records of both streams, each in its own order (Kafka Streams: ``KStream#merge``).

        Both sources join one sub-topology, so their topics must be co-partitioned (equal
        partition counts).

        Args:
            other: The other stream.
            name: The operator's name (default ``KSTREAM-MERGE-<index>``).

        Returns:
            The merged stream, with this stream's serdes.
        """
        b = self._builder
        node = LogicalNode(name=b.new_name("KSTREAM-MERGE", name), kind="processor",
                           factory=lambda n: PassThrough(n.name), value_preserving=True)
        b.add_node(node, self._node, graph_node_of(other))
        return KStream(b, node, self.key_serde, self.value_serde,
                       self.repartition_required or other.repartition_required)

    def group_by_key(self, key_serde: Serde | None = None, value_serde: Serde | None = None) -> KGroupedStream:
        """The records grouped by their key, for an aggregation (Kafka Streams: ``KStream#groupByKey``).

        No repartition unless a key-changing operator came before.

        Args:
            key_serde: The keys' serde in the store (and repartition topic) (default: this stream's).
            value_serde: The values' serde there (default: this stream's).

        Returns:
            The grouped stream, to ``count``, ``reduce``, ``aggregate`` or ``windowed_by``.

        Example:
            >>> from processor import StreamsBuilder
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> counts = builder.stream("clicks").group_by_key().count()
            >>> counts.to_stream().to("click-counts")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     for user in ["ann", "bob", "ann"]:
            ...         driver.pipe_input("clicks", user, {}, timestamp=1)
            ...     [(r.key, r.value) for r in driver.read_output("click-counts")]
            [('ann', 1), ('bob', 1), ('ann', 2)]
        """
        from processor.dsl.grouped import KGroupedStream

        ks, vs = key_serde or self.key_serde, value_serde or self.value_serde
        return KGroupedStream(self, None, ks, vs, repartition=self.repartition_required)

    def to_table(self, name: str | None = None, key_serde: Serde | None = None,
                 value_serde: Serde | None = None) -> KTable:
        """The stream as a table: each record an update of its key (Kafka Streams: ``KStream#toTable``).

        A None value is a delete; records without a key are dropped (and counted). After a
        key-changing operator, through a repartition topic first.

        Args:
            name: The table's store name (default ``KSTREAM-TOTABLE-<index>-STATE-STORE``).
            key_serde: The store's key serde (default: this stream's).
            value_serde: The store's value serde (default: this stream's).

        Returns:
            The table, materialized in store ``name``.
        """
        src = self._by_key(key_serde, value_serde)
        b = self._builder
        ks, vs = key_serde or src.key_serde, value_serde or src.value_serde
        node_name = b.new_name("KSTREAM-TOTABLE")
        store = name or f"{node_name}-STATE-STORE"
        b.check_store_names_free(store)
        node = LogicalNode(
            name=node_name, kind="processor", stores=[store],
            factory=lambda n: StreamToTable(n.name, store, ks, vs),
            attrs=TableAttrs(getter=GetterSpec(lambda n, ctx: StoreValueGetter(ctx.get_store(store), vs),
                                               stores=(store,))))
        b.add_node(node, graph_node_of(src))
        b.add_store(StoreSpec(store, node_name, None, ks, vs))
        return b.table_of(node, ks, vs, store_name=store)

    def group_by(self, selector: KeySelector, key_serde: Serde | None = None,
                 value_serde: Serde | None = None) -> KGroupedStream:
        """The records grouped by a new key, for an aggregation (Kafka Streams: ``KStream#groupBy``).

        Goes through a repartition topic by the new key.

        Args:
            selector: ``(key, value) -> group key``.
            key_serde: The group keys' serde (default string).
            value_serde: The values' serde (default: this stream's).

        Returns:
            The grouped stream.
        """
        from processor.dsl.grouped import KGroupedStream

        return KGroupedStream(self, selector, key_serde or Serdes.string(), value_serde or self.value_serde)

    # -- joins -------------------------------------------------------------------------------
    def _join(self, other: Any, joiner: ValueJoiner, windows: JoinWindows | None,
              how: str, name: str | None, value_serde: Serde | None,
              key_selector: KeySelector | None = None) -> KStream:
        kind = getattr(other, "dsl_kind", None)
        if kind == "global-table":
            return self._join_global(other, joiner, key_selector, how, name, value_serde, windows)
        if key_selector is not None:
            raise TopologyError("key_selector= is for a join with a GlobalKTable")
        me = self._by_key()
        if me is not self:
            return me._join(other, joiner, windows, how, name, value_serde)
        if kind == "stream" and other.repartition_required:
            other = other._by_key()
        if kind == "table":
            if windows is not None:
                raise TopologyError("a stream-table join takes no JoinWindows")
            if how == "outer":
                raise TopologyError("a stream-table join is inner or left; outer_join needs two streams")
            from processor.dsl.joins import stream_table_join

            out = stream_table_join(self, other, joiner, how, name)
            out.value_serde = value_serde or Serdes.json()
            return out
        if kind == "stream":
            from processor.dsl.stream_join import stream_stream_join

            return stream_stream_join(self, other, joiner, windows, how, name, value_serde)
        raise TopologyError(f"join takes a KStream or a KTable, not {type(other).__name__}")

    def join(self, other: KStream | KTable | GlobalKTable, joiner: ValueJoiner, windows: JoinWindows | None = None,
             name: str | None = None, value_serde: Serde | None = None,
             key_selector: KeySelector | None = None) -> KStream:
        """This stream joined with a table, a global table or a stream (Kafka Streams: ``KStream#join``).

        With a ``KTable``: each record joined with the table's current row for its key (no row,
        no output); the two are co-partitioned. With a ``GlobalKTable``: with the row of
        ``key_selector(key, value)`` (no repartition: every task holds the whole table). With a
        ``KStream``: the records of both streams whose keys are equal and whose timestamps are
        within ``windows``.

        Args:
            other: The table, global table or stream to join with.
            joiner: ``(value, other value) -> joined value``.
            windows: For a stream-stream join, ``JoinWindows.of(ms).grace(ms)``; else None.
            name: The join's name (default ``KSTREAM-JOIN-<index>``...).
            value_serde: The result's value serde (default JSON).
            key_selector: For a global table, ``(key, value) -> table key``.

        Returns:
            The stream of joined records, keyed like this one.

        Raises:
            TopologyError: The arguments do not fit the kind of ``other``.

        Example:
            >>> from processor import StreamsBuilder
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> users = builder.table("users")
            >>> clicks = builder.stream("clicks")
            >>> clicks.join(users, lambda click, user: f"{user} on {click}").to("named-clicks")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     driver.pipe_input("clicks", "u1", "/home", timestamp=1)
            ...     driver.pipe_input("users", "u1", "Ann", timestamp=2)
            ...     driver.pipe_input("clicks", "u1", "/cart", timestamp=3)
            ...     [(r.key, r.value) for r in driver.read_output("named-clicks")]
            [('u1', 'Ann on /cart')]
        """
        return self._join(other, joiner, windows, "inner", name, value_serde, key_selector)

    def left_join(self, other: KStream | KTable | GlobalKTable, joiner: ValueJoiner,
                  windows: JoinWindows | None = None, name: str | None = None, value_serde: Serde | None = None,
                  key_selector: KeySelector | None = None) -> KStream:
        """As ``join``, and every record without a match too (Kafka Streams: ``KStream#leftJoin``).

        A record without a match gets ``joiner(value, None)``; in a stream-stream join, once its
        window has closed.

        Args:
            other: The table, global table or stream to join with.
            joiner: ``(value, other value or None) -> joined value``.
            windows: For a stream-stream join, ``JoinWindows``; else None.
            name: The join's name.
            value_serde: The result's value serde (default JSON).
            key_selector: For a global table, ``(key, value) -> table key``.

        Returns:
            The stream of joined records.
        """
        return self._join(other, joiner, windows, "left", name, value_serde, key_selector)

    def _join_global(self, table: GlobalKTable, joiner: ValueJoiner, key_selector: KeySelector | None, how: str,
                     name: str | None, value_serde: Serde | None, windows: JoinWindows | None) -> KStream:
        if windows is not None:
            raise TopologyError("a join with a GlobalKTable takes no JoinWindows")
        if how == "outer":
            raise TopologyError("a join with a GlobalKTable is inner or left")
        if not callable(key_selector):
            raise TopologyError("a join with a GlobalKTable needs key_selector=(key, value) -> table key")
        b = self._builder
        store, ks, vs = table.store_name, table.key_serde, table.value_serde
        node = LogicalNode(name=b.new_name("KSTREAM-GLOBALJOIN" if how == "inner" else "KSTREAM-GLOBALLEFTJOIN",
                                           name),
                           kind="processor",
                           attrs=GlobalJoinAttrs(global_store=store, table_key_serde=ks, table_value_serde=vs),
                           # the serdes of the node's attrs: bound to the table's topic by the topology
                           factory=lambda n: StreamGlobalTableJoin(n.name, store, key_selector, joiner, how,
                                                                   cast(GlobalJoinAttrs, n.attrs).table_key_serde,
                                                                   cast(GlobalJoinAttrs, n.attrs).table_value_serde))
        b.add_node(node, self._node)
        # the key is unchanged: nothing after it repartitions because of this join
        return KStream(b, node, self.key_serde, value_serde or Serdes.json(), self.repartition_required)

    def outer_join(self, other: KStream, joiner: ValueJoiner, windows: JoinWindows | None = None,
                   name: str | None = None, value_serde: Serde | None = None) -> KStream:
        """Stream-stream only: as ``left_join`` for both sides (Kafka Streams: ``KStream#outerJoin``).

        Args:
            other: The other stream.
            joiner: ``(left value or None, right value or None) -> joined value``.
            windows: ``JoinWindows.of(ms).grace(ms)``.
            name: The join's name.
            value_serde: The result's value serde (default JSON).

        Returns:
            The stream of joined records.
        """
        return self._join(other, joiner, windows, "outer", name, value_serde)

    def to(self, topic_or_extractor: str | TopicNameExtractor, key_serde: Serde | None = None,
           value_serde: Serde | None = None, name: str | None = None) -> None:
        """Writes the stream to a topic (Kafka Streams: ``KStream#to``).

        Args:
            topic_or_extractor: A topic name, or ``(key, value) -> topic``: each record to the
                topic it names (which must exist, else the record is an ``OutputError`` under
                the on-error policy).
            key_serde: The key serde to write with (default: this stream's).
            value_serde: The value serde to write with (default: this stream's).
            name: The sink's name (default ``KSTREAM-SINK-<index>``).

        Raises:
            TopologyError: ``topic_or_extractor`` is neither.
        """
        b = self._builder
        ks = key_serde or self.key_serde
        vs = value_serde or self.value_serde
        if callable(topic_or_extractor):
            topic, extractor = None, topic_or_extractor
        elif isinstance(topic_or_extractor, str) and topic_or_extractor:
            topic, extractor = topic_or_extractor, None
        else:
            raise TopologyError(f"to() takes a topic name or a topic extractor (key, value) -> topic, "
                                f"not {topic_or_extractor!r}")
        node = LogicalNode(
            name=b.new_name("KSTREAM-SINK", name), kind="sink", sink_topic=topic,
            factory=_sink,
            attrs=SinkAttrs(key_serde=ks, value_serde=vs, stream_key_serde=self.key_serde, extractor=extractor),
        )
        b.add_node(node, self._node)


def _sink(n: LogicalNode) -> Sink:
    """The operator of a ``to()`` node, with the serdes of its attrs (bound to its topic by the topology)."""
    a = cast(SinkAttrs, n.attrs)
    return Sink(n.name, n.sink_topic, a.key_serde, a.value_serde, passthrough=a.passthrough,
                carries_table=a.carries_table, extractor=a.extractor)


class BranchedKStream:
    """The branches of ``KStream.split(name)`` (Kafka Streams: ``BranchedKStream``).

    Branches are added in order; the first predicate that holds wins. The result maps each
    branch's name (prefixed by the split's name when given) to its stream; a branch without a
    name is numbered from 1, as in Kafka Streams.

    Example:
        >>> from processor import StreamsBuilder
        >>> from processor.testing import TopologyTestDriver
        >>> builder = StreamsBuilder()
        >>> branches = (builder.stream("numbers").split("n-")
        ...             .branch(lambda k, v: v < 0, name="negative").default_branch("other"))
        >>> sorted(branches)
        ['n-negative', 'n-other']
        >>> branches["n-negative"].to("negatives")
        >>> with TopologyTestDriver(builder.build()) as driver:
        ...     for n in [3, -1, 4, -5]:
        ...         driver.pipe_input("numbers", None, n, timestamp=1)
        ...     [r.value for r in driver.read_output("negatives")]
        [-1, -5]
    """

    def __init__(self, stream: KStream, name: str | None):
        self._stream = stream
        self._name = name
        self._branches: list[tuple[str, object]] = []
        self._done = False

    def _full(self, name: str | None, default: bool) -> str:
        part = name if name is not None else ("0" if default else str(len(self._branches) + 1))
        return f"{self._name}{part}" if self._name else part

    def branch(self, predicate: Predicate, name: str | None = None) -> BranchedKStream:
        """Adds a branch for the records ``predicate`` holds for (Kafka Streams: ``BranchedKStream#branch``).

        Args:
            predicate: ``(key, value) -> bool``.
            name: The branch's name (default: its number, from 1).

        Returns:
            This ``BranchedKStream``.

        Raises:
            TopologyError: The split is finished, ``predicate`` is not callable, or the name is
                taken.
        """
        if self._done:
            raise TopologyError("this split() is finished (default_branch/no_default_branch was called)")
        if not callable(predicate):
            raise TopologyError(f"branch() takes a predicate (key, value) -> bool, not {predicate!r}")
        full = self._full(name, False)
        if any(full == n for n, _ in self._branches):
            raise TopologyError(f"split(): branch name {full!r} is used twice")
        self._branches.append((full, predicate))
        return self

    def default_branch(self, name: str | None = None) -> dict[str, KStream]:
        """Finishes the split with a branch for the records no predicate holds for (``defaultBranch``).

        Args:
            name: The default branch's name (default ``"0"``).

        Returns:
            ``{branch name: KStream}``, the default branch included.
        """
        return self._finish(self._full(name, True))

    def no_default_branch(self) -> dict[str, KStream]:
        """Finishes the split; records no predicate holds for are dropped (``noDefaultBranch``).

        Returns:
            ``{branch name: KStream}``.
        """
        return self._finish(None)

    def _finish(self, default: str | None) -> dict[str, KStream]:
        if self._done:
            raise TopologyError("this split() is finished already")
        self._done = True
        s = self._stream
        b = builder_of(s)
        names = [n for n, _ in self._branches] + ([default] if default is not None else [])
        if default is not None and default in names[:-1]:
            raise TopologyError(f"split(): branch name {default!r} is used twice")
        preds = [p for _, p in self._branches]
        has_default = default is not None
        router = LogicalNode(name=b.new_name("KSTREAM-BRANCH", self._name), kind="processor",
                             factory=lambda n: StreamBranch(n.name, preds, has_default), value_preserving=True)
        b.add_node(router, graph_node_of(s))
        out = {}
        for branch_name in names:
            child = LogicalNode(name=b.new_name("KSTREAM-BRANCHCHILD", None), kind="processor",
                                factory=lambda n: PassThrough(n.name), value_preserving=True)
            b.add_node(child, router)
            out[branch_name] = KStream(b, child, s.key_serde, s.value_serde, s.repartition_required)
        return out
