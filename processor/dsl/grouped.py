"""Grouped tables and streams: ``count``, ``reduce``, ``aggregate``, ``windowed_by``.

Each aggregation creates its store ``<name>`` and the last-emitted column ``<name>.emitted``
(``name`` defaults to ``KTABLE-AGGREGATE-STATE-STORE-<index>``). When grouping changes the key,
the records first go through the internal topic ``<application-id>-<name>-repartition``, which
starts a new sub-topology. Emission is a policy, ``emit=`` (default ``Emit.on_change()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from processor.dsl.abstract_stream import builder_of, graph_node_of
from processor.dsl.emit import Emit
from processor.dsl.repartition import repartition_through
from processor.errors import TopologyError
from processor.graph import AggregateAttrs, GetterSpec
from processor.operators.aggregate import StreamAggregate, TableAggregate, WindowedStreamAggregate
from processor.operators.group_by import StreamGroupBy, TableGroupBy
from processor.operators.value_getter import EmittedValueGetter
from processor.serde import Serde, Serdes
from processor.serde.change import ChangeSerde
from processor.state.window_key import WindowStoreKeySerde
from processor.topology import LogicalNode, StoreSpec
from processor.topology.naming import repartition_topic

if TYPE_CHECKING:  # pragma: no cover
    from processor.dsl.builder import StreamsBuilder
    from processor.dsl.kstream import KStream
    from processor.dsl.ktable import KTable
    from processor.dsl.windows import SessionWindows, SlidingWindows, TimeWindows
    from processor.functions import Aggregator, Initializer, KeySelector, KeyValueMapper, Merger, Reducer


def _check_emit(emit: Emit | None, windowed: bool) -> Emit:
    emit = emit or Emit.on_change()
    if not isinstance(emit, Emit):
        raise TopologyError(f"emit= takes an Emit policy (Emit.on_change(), ...), not {emit!r}")
    if emit.mode == "on_window_close" and not windowed:
        raise TopologyError("Emit.on_window_close() needs a windowed aggregation "
                            "(group_by_key().windowed_by(TimeWindows.of(...)))")
    return emit


def _count_init() -> int:
    return 0


def _count_add(key: Any, value: Any, agg: int) -> int:
    return agg + 1


def _count_sub(key: Any, value: Any, agg: int) -> int:
    return agg - 1


def _repartition(builder: StreamsBuilder, parent: LogicalNode, select: LogicalNode | None, store: str,
                 key_serde: Serde, value_serde: Serde) -> LogicalNode:
    """Adds ``[select ->] sink(<store>-repartition) | source(<store>-repartition)``; returns the source node."""
    if select is not None:
        builder.add_node(select, parent)
        parent = select
    return repartition_through(builder, parent, repartition_topic(store), key_serde, value_serde)


def _aggregate_node(builder: StreamsBuilder, parent: LogicalNode, store: str, key_serde: Serde, value_serde: Serde,
                    factory: Callable[[LogicalNode], Any], kind: str, emit: Emit, windows: Any = None,
                    store_key_serde: Any = None, store_kind: str = "windowed-aggregate") -> LogicalNode:
    b = builder
    getter = None
    if store_key_serde is None:  # a windowed aggregate cannot be looked up by its table key
        # joins see the aggregate as last forwarded: its last-emitted column
        getter = GetterSpec(lambda n, ctx: EmittedValueGetter(ctx.get_store(store + ".emitted"), value_serde),
                            stores=(store + ".emitted",))
    node = LogicalNode(name=b.new_name("KTABLE-AGGREGATE"), kind="processor", factory=factory,
                       stores=[store, store + ".emitted"],
                       attrs=AggregateAttrs(kind=kind, emit=emit, windows=windows, getter=getter))
    b.add_node(node, parent)
    b.add_store(StoreSpec(store, node.name, None, store_key_serde or key_serde, value_serde,
                          kind=store_kind if store_key_serde else "aggregate"))
    b.add_store(StoreSpec(store + ".emitted", node.name, None, store_key_serde or key_serde, value_serde,
                          kind="emitted"))
    return node


class KGroupedTable:
    """A table regrouped by ``KTable.group_by``, to aggregate (Kafka Streams: ``KGroupedTable``).

    Each aggregation adds a row's value to its group and subtracts its old value from its old
    group, so an aggregate follows the table's current rows.

    Attributes:
        key_serde: The group keys' serde.
        value_serde: The grouped values' serde.
    """

    def __init__(self, table: KTable, selector: KeyValueMapper, key_serde: Serde, value_serde: Serde):
        self._table = table
        self._selector = selector
        self.key_serde = key_serde
        self.value_serde = value_serde

    def _build(self, kind: str, initializer: Initializer | None, adder: Callable[..., Any],
               subtractor: Callable[..., Any], emit: Emit | None, name: str | None, value_serde: Serde) -> KTable:
        emit = _check_emit(emit, windowed=False)
        b = builder_of(self._table)
        store = b.peek_name("KTABLE-AGGREGATE-STATE-STORE", name)
        b.check_store_names_free(store)
        ks = self.key_serde
        select = LogicalNode(name=b.new_name("KTABLE-SELECT"), kind="processor",
                             factory=lambda n: TableGroupBy(n.name, self._selector, ks))
        source = _repartition(b, graph_node_of(self._table), select, store, ks, ChangeSerde(self.value_serde))
        node = _aggregate_node(
            b, source, store, ks, value_serde,
            lambda n: TableAggregate(n.name, store, ks, value_serde, emit, initializer, adder, subtractor),
            kind, emit)
        return b.table_of(node, ks, value_serde, store_name=store)

    def count(self, emit: Emit | None = None, name: str | None = None,
              value_serde: Serde | None = None) -> KTable:
        """Rows per group (Kafka Streams: ``KGroupedTable#count``).

        A group stays at 0 (not deleted) when its last row leaves, as in Kafka Streams.

        Args:
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The counts' serde (default JSON).

        Returns:
            The table of counts per group.
        """
        return self._build("count", _count_init, _count_add, _count_sub, emit, name, value_serde or Serdes.json())

    def reduce(self, adder: Reducer, subtractor: Reducer, emit: Emit | None = None, name: str | None = None,
               value_serde: Serde | None = None) -> KTable:
        """Each group's rows reduced to one value (Kafka Streams: ``KGroupedTable#reduce``).

        Args:
            adder: ``(aggregate, value) -> aggregate``: a row joins the group.
            subtractor: ``(aggregate, old value) -> aggregate``: a row leaves the group; a None
                result deletes the group.
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The aggregates' serde (default: the grouped values').

        Returns:
            The table of aggregates per group.
        """
        return self._build("reduce", None, adder, subtractor, emit, name, value_serde or self.value_serde)

    def aggregate(self, initializer: Initializer, adder: Aggregator, subtractor: Aggregator,
                  emit: Emit | None = None, name: str | None = None, value_serde: Serde | None = None) -> KTable:
        """Each group's rows aggregated (Kafka Streams: ``KGroupedTable#aggregate``).

        Args:
            initializer: ``() -> aggregate``: a new group's aggregate.
            adder: ``(key, value, aggregate) -> aggregate``: a row joins the group.
            subtractor: ``(key, old value, aggregate) -> aggregate``: a row leaves the group; a
                None result deletes the group.
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The aggregates' serde (default JSON).

        Returns:
            The table of aggregates per group.
        """
        return self._build("aggregate", initializer, adder, subtractor, emit, name, value_serde or Serdes.json())


class KGroupedStream:
    """A stream grouped by key, to aggregate (Kafka Streams: ``KGroupedStream``).

    Made by ``KStream.group_by_key()`` or ``KStream.group_by(selector)`` (the latter, and the
    former after a key-changing operator, through a repartition topic).

    Attributes:
        key_serde: The group keys' serde.
        value_serde: The values' serde.

    Example:
        >>> from processor import StreamsBuilder
        >>> from processor.testing import TopologyTestDriver
        >>> builder = StreamsBuilder()
        >>> totals = builder.stream("payments").group_by_key().aggregate(
        ...     lambda: 0, lambda user, amount, total: total + amount)
        >>> totals.to_stream().to("totals")
        >>> with TopologyTestDriver(builder.build()) as driver:
        ...     for user, amount in [("ann", 5), ("bob", 1), ("ann", 7)]:
        ...         driver.pipe_input("payments", user, amount, timestamp=1)
        ...     [(r.key, r.value) for r in driver.read_output("totals")]
        [('ann', 5), ('bob', 1), ('ann', 12)]
    """

    def __init__(self, stream: KStream, selector: KeySelector | None, key_serde: Serde, value_serde: Serde,
                 repartition: bool = False):
        self._stream = stream
        self._selector = selector   # None: group by the existing key
        self.key_serde = key_serde
        self.value_serde = value_serde
        # by the existing key after a key-changing operator: through a repartition topic
        self._repartition = repartition

    def _input(self, store: str) -> LogicalNode:
        b = builder_of(self._stream)
        if self._selector is None:
            if self._repartition:
                return _repartition(b, graph_node_of(self._stream), None, store, self.key_serde, self.value_serde)
            return graph_node_of(self._stream)
        select = LogicalNode(name=b.new_name("KSTREAM-KEY-SELECT"), kind="processor",
                             factory=lambda n: StreamGroupBy(n.name, self._selector))
        return _repartition(b, graph_node_of(self._stream), select, store, self.key_serde, self.value_serde)

    def _build(self, kind: str, initializer: Initializer | None, aggregator: Callable[..., Any], emit: Emit | None,
               name: str | None, value_serde: Serde, windows: TimeWindows | None = None) -> KTable:
        emit = _check_emit(emit, windowed=windows is not None)
        b = builder_of(self._stream)
        store = b.peek_name("KTABLE-AGGREGATE-STATE-STORE", name)
        b.check_store_names_free(store)
        parent = self._input(store)
        ks = self.key_serde
        if windows is None:
            node = _aggregate_node(
                b, parent, store, ks, value_serde,
                lambda n: StreamAggregate(n.name, store, ks, value_serde, emit, initializer, aggregator),
                kind, emit)
            table_key_serde = ks
        else:
            node = _aggregate_node(
                b, parent, store, ks, value_serde,
                lambda n: WindowedStreamAggregate(n.name, store, ks, value_serde, emit, initializer,
                                                  aggregator, windows),
                kind, emit, windows, store_key_serde=WindowStoreKeySerde(ks, windows.size_ms))
            table_key_serde = Serdes.windowed(ks, windows.size_ms)
        return b.table_of(node, table_key_serde, value_serde, store_name=store)

    def count(self, emit: Emit | None = None, name: str | None = None,
              value_serde: Serde | None = None) -> KTable:
        """Records per key (Kafka Streams: ``KGroupedStream#count``).

        Args:
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The counts' serde (default JSON).

        Returns:
            The table of counts per key.
        """
        return self._build("count", _count_init, _count_add, emit, name, value_serde or Serdes.json())

    def reduce(self, reducer: Reducer, emit: Emit | None = None, name: str | None = None,
               value_serde: Serde | None = None) -> KTable:
        """Each key's values reduced to one (Kafka Streams: ``KGroupedStream#reduce``).

        Args:
            reducer: ``(aggregate, value) -> aggregate``; the first value of a key is its
                aggregate.
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The aggregates' serde (default: the values').

        Returns:
            The table of aggregates per key.
        """
        return self._build("reduce", None, reducer, emit, name, value_serde or self.value_serde)

    def aggregate(self, initializer: Initializer, aggregator: Aggregator, emit: Emit | None = None,
                  name: str | None = None, value_serde: Serde | None = None) -> KTable:
        """Each key's values aggregated (Kafka Streams: ``KGroupedStream#aggregate``).

        Args:
            initializer: ``() -> aggregate``: a new key's aggregate.
            aggregator: ``(key, value, aggregate) -> aggregate``.
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The aggregates' serde (default JSON).

        Returns:
            The table of aggregates per key.
        """
        return self._build("aggregate", initializer, aggregator, emit, name, value_serde or Serdes.json())

    def windowed_by(self, windows: TimeWindows | SessionWindows | SlidingWindows,
                    ) -> TimeWindowedKStream | SessionWindowedKStream | SlidingWindowedKStream:
        """The grouped stream cut into windows, to aggregate per key and window (``KGroupedStream#windowedBy``).

        Args:
            windows: ``TimeWindows`` (tumbling or hopping), ``SessionWindows`` or
                ``SlidingWindows``.

        Returns:
            A ``TimeWindowedKStream``, ``SessionWindowedKStream`` or ``SlidingWindowedKStream``.

        Raises:
            TopologyError: ``windows`` is none of them.

        Example:
            >>> from processor import StreamsBuilder, TimeWindows
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> per_minute = builder.stream("clicks").group_by_key().windowed_by(TimeWindows.of(60_000)).count()
            >>> per_minute.to_stream().to("clicks-per-minute")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     for ts in [1_000, 2_000, 61_000]:
            ...         driver.pipe_input("clicks", "ann", {}, timestamp=ts)
            ...     [(r.key, r.value) for r in driver.read_output("clicks-per-minute")]
            [(['ann'@0/60000], 1), (['ann'@0/60000], 2), (['ann'@60000/120000], 1)]
        """
        from processor.dsl.windows import SessionWindows, SlidingWindows, TimeWindows

        if isinstance(windows, SessionWindows):
            return SessionWindowedKStream(self, windows)
        if isinstance(windows, SlidingWindows):
            return SlidingWindowedKStream(self, windows)
        if not isinstance(windows, TimeWindows):
            raise TopologyError(f"windowed_by takes TimeWindows.of(size)..., SessionWindows."
                                f"with_inactivity_gap(gap)... or SlidingWindows.of_time_difference_and_grace"
                                f"(diff, grace), not {windows!r}")
        return TimeWindowedKStream(self, windows)

    def _build_windowed(self, kind: str, emit: Emit | None, name: str | None, value_serde: Serde,
                        windows: SessionWindows | SlidingWindows, make: Callable[[str, str, Emit], Any],
                        store_key_serde: Any, result_key_serde: Serde, store_kind: str) -> KTable:
        """A session- or sliding-windowed aggregate.

        ``make(node name, store, emit)`` is its operator, keyed in its store by
        ``store_key_serde`` and in its result by ``result_key_serde``.
        """
        emit = _check_emit(emit, windowed=True)
        b = builder_of(self._stream)
        store = b.peek_name("KTABLE-AGGREGATE-STATE-STORE", name)
        b.check_store_names_free(store)
        parent = self._input(store)
        node = _aggregate_node(b, parent, store, self.key_serde, value_serde, lambda n: make(n.name, store, emit),
                               kind, emit, windows, store_key_serde=store_key_serde, store_kind=store_kind)
        return b.table_of(node, result_key_serde, value_serde, store_name=store)

    def _build_sliding(self, kind: str, initializer: Initializer | None, aggregator: Callable[..., Any],
                       emit: Emit | None, name: str | None, value_serde: Serde, windows: SlidingWindows) -> KTable:
        from processor.operators.sliding_aggregate import SlidingWindowedStreamAggregate
        from processor.state.sliding_key import SlidingStoreKeySerde

        ks = self.key_serde
        return self._build_windowed(
            kind, emit, name, value_serde, windows,
            lambda node, store, em: SlidingWindowedStreamAggregate(node, store, ks, value_serde, em, initializer,
                                                                   aggregator, windows),
            SlidingStoreKeySerde(ks, windows.diff_ms), Serdes.windowed(ks, windows.diff_ms), "windowed-aggregate")

    def _build_sessions(self, kind: str, initializer: Initializer | None, aggregator: Callable[..., Any],
                        merger: Callable[..., Any], emit: Emit | None, name: str | None, value_serde: Serde,
                        windows: SessionWindows, retention_ms: int | None = None) -> KTable:
        from processor.operators.session_aggregate import SessionWindowedStreamAggregate
        from processor.serde.windowed import SessionWindowedSerde

        ks = self.key_serde
        if retention_ms is not None and retention_ms < windows.gap_ms + windows.grace_ms:
            raise ValueError(f"a session store's retention ({retention_ms} ms) must be at least the inactivity gap "
                             f"plus the grace period ({windows.gap_ms} + {windows.grace_ms} ms), as in Kafka Streams")
        session_keys = SessionWindowedSerde(ks)   # the store's key layout is the result's
        return self._build_windowed(
            kind, emit, name, value_serde, windows,
            lambda node, store, em: SessionWindowedStreamAggregate(node, store, ks, value_serde, em, initializer,
                                                                   aggregator, merger, windows, retention_ms),
            session_keys, session_keys, "session-aggregate")


class _WindowedKStream:
    """The aggregations of a grouped stream in time or sliding windows.

    ``count``, ``reduce`` and ``aggregate``; a subclass's ``_aggregate`` builds the windowed aggregate.
    """

    _grouped: KGroupedStream

    def _aggregate(self, kind: str, initializer: Initializer | None, aggregator: Callable[..., Any],
                   emit: Emit | None, name: str | None, value_serde: Serde) -> KTable:
        raise NotImplementedError

    def count(self, emit: Emit | None = None, name: str | None = None,
              value_serde: Serde | None = None) -> KTable:
        """Records per key and window (Kafka Streams: ``TimeWindowedKStream#count``).

        Args:
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The counts' serde (default JSON).

        Returns:
            The table of counts, keyed by ``Windowed(key, start, end)``.
        """
        return self._aggregate("count", _count_init, _count_add, emit, name, value_serde or Serdes.json())

    def reduce(self, reducer: Reducer, emit: Emit | None = None, name: str | None = None,
               value_serde: Serde | None = None) -> KTable:
        """Each key's values in each window reduced to one (Kafka Streams: ``TimeWindowedKStream#reduce``).

        Args:
            reducer: ``(aggregate, value) -> aggregate``.
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The aggregates' serde (default: the values').

        Returns:
            The table of aggregates, keyed by ``Windowed(key, start, end)``.
        """
        return self._aggregate("reduce", None, reducer, emit, name, value_serde or self._grouped.value_serde)

    def aggregate(self, initializer: Initializer, aggregator: Aggregator, emit: Emit | None = None,
                  name: str | None = None, value_serde: Serde | None = None) -> KTable:
        """Each key's values in each window aggregated (Kafka Streams: ``TimeWindowedKStream#aggregate``).

        Args:
            initializer: ``() -> aggregate``: a new window's aggregate.
            aggregator: ``(key, value, aggregate) -> aggregate``.
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The aggregates' serde (default JSON).

        Returns:
            The table of aggregates, keyed by ``Windowed(key, start, end)``.
        """
        return self._aggregate("aggregate", initializer, aggregator, emit, name, value_serde or Serdes.json())


class TimeWindowedKStream(_WindowedKStream):
    """A grouped stream in time windows (Kafka Streams: ``TimeWindowedKStream``).

    Tumbling (``TimeWindows.of(size)``) or hopping (``.advance_by(step)``) windows, with
    ``.grace(ms)``; the result table's keys are ``Windowed(key, start, end)``.

    Attributes:
        windows: The windows.
    """

    def __init__(self, grouped: KGroupedStream, windows: TimeWindows):
        self._grouped = grouped
        self.windows = windows

    def _aggregate(self, kind: str, initializer: Initializer | None, aggregator: Callable[..., Any],
                   emit: Emit | None, name: str | None, value_serde: Serde) -> KTable:
        return self._grouped._build(kind, initializer, aggregator, emit, name, value_serde, self.windows)


def _merge_counts(key: Any, a: int, b: int) -> int:
    return a + b


class SessionWindowedKStream:
    """A grouped stream in session windows (Kafka Streams: ``SessionWindowedKStream``).

    ``group_by_key().windowed_by(SessionWindows.with_inactivity_gap(gap).grace(ms))``: one
    aggregate per session of a key; result keys ``Windowed(key, start, end)``, ``end`` the
    session's last record time (inclusive). Sessions merged into another are tombstoned.

    Attributes:
        windows: The session windows.
    """

    def __init__(self, grouped: KGroupedStream, windows: SessionWindows):
        self._grouped = grouped
        self.windows = windows

    def count(self, emit: Emit | None = None, name: str | None = None,
              value_serde: Serde | None = None, retention_ms: int | None = None) -> KTable:
        """Records per key and window (Kafka Streams: ``SessionWindowedKStream#count``).

        Args:
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The counts' serde (default JSON).
            retention_ms: How long the session store keeps a session by its own clock (Kafka
                Streams: ``Materialized.withRetention``; default and least: gap + grace). A
                closed session still within it is read, and merged by a record within the gap.

        Returns:
            The table of counts, keyed by ``Windowed(key, start, end)``.
        """
        return self._grouped._build_sessions("count", _count_init, _count_add, _merge_counts, emit, name,
                                             value_serde or Serdes.json(), self.windows, retention_ms)

    def reduce(self, reducer: Reducer, emit: Emit | None = None, name: str | None = None,
               value_serde: Serde | None = None, retention_ms: int | None = None) -> KTable:
        """Each session's values reduced to one (Kafka Streams: ``SessionWindowedKStream#reduce``).

        Args:
            reducer: ``(aggregate, value) -> aggregate``; merging two sessions is
                ``reducer(aggregate1, aggregate2)``.
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The aggregates' serde (default: the values').
            retention_ms: How long the session store keeps a session by its own clock (Kafka
                Streams: ``Materialized.withRetention``; default and least: gap + grace). A
                closed session still within it is read, and merged by a record within the gap.

        Returns:
            The table of aggregates, keyed by ``Windowed(key, start, end)``.
        """
        return self._grouped._build_sessions("reduce", None, reducer, reducer, emit, name,
                                             value_serde or self._grouped.value_serde, self.windows, retention_ms)

    def aggregate(self, initializer: Initializer, aggregator: Aggregator, merger: Merger,
                  emit: Emit | None = None, name: str | None = None, value_serde: Serde | None = None,
                  retention_ms: int | None = None) -> KTable:
        """Each session's values aggregated (Kafka Streams: ``SessionWindowedKStream#aggregate``).

        Args:
            initializer: ``() -> aggregate``: a new session's aggregate.
            aggregator: ``(key, value, aggregate) -> aggregate``.
            merger: ``(key, aggregate1, aggregate2) -> aggregate``: two sessions become one.
            emit: The emission policy (default ``Emit.on_change()``).
            name: The store's name (default ``KTABLE-AGGREGATE-STATE-STORE-<index>``).
            value_serde: The aggregates' serde (default JSON).
            retention_ms: How long the session store keeps a session by its own clock (Kafka
                Streams: ``Materialized.withRetention``; default and least: gap + grace). A
                closed session still within it is read, and merged by a record within the gap.

        Returns:
            The table of aggregates, keyed by ``Windowed(key, start, end)``.
        """
        return self._grouped._build_sessions("aggregate", initializer, aggregator, merger, emit, name,
                                             value_serde or Serdes.json(), self.windows, retention_ms)


class SlidingWindowedKStream(_WindowedKStream):
    """A grouped stream in sliding windows (Kafka Streams: ``TimeWindowedKStream`` over ``SlidingWindows``).

    ``group_by_key().windowed_by(SlidingWindows.of_time_difference_and_grace(diff, grace))``
    (KIP-450); result keys ``Windowed(key, start, start + diff)``.

    Attributes:
        windows: The sliding windows.
    """

    def __init__(self, grouped: KGroupedStream, windows: SlidingWindows):
        self._grouped = grouped
        self.windows = windows

    def _aggregate(self, kind: str, initializer: Initializer | None, aggregator: Callable[..., Any],
                   emit: Emit | None, name: str | None, value_serde: Serde) -> KTable:
        return self._grouped._build_sliding(kind, initializer, aggregator, emit, name, value_serde, self.windows)
