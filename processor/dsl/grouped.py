"""Grouped tables and streams: ``count``, ``reduce``, ``aggregate``, ``windowed_by``.

Each aggregation creates its store ``<name>`` and the last-emitted column ``<name>.emitted``
(``name`` defaults to ``KTABLE-AGGREGATE-STATE-STORE-<index>``). When grouping changes the key,
the records first go through the internal topic ``<application-id>-<name>-repartition``, which
starts a new sub-topology. Emission is a policy, ``emit=`` (default ``Emit.on_change()``).
"""

from __future__ import annotations

from processor.dsl.emit import Emit
from processor.dsl.repartition import repartition_through
from processor.errors import TopologyError
from processor.graph import AggregateAttrs, GetterSpec
from processor.operators.aggregate import StreamAggregate, TableAggregate, WindowedStreamAggregate
from processor.operators.group_by import StreamGroupBy, TableGroupBy
from processor.operators.value_getter import EmittedValueGetter
from processor.serde import Serdes
from processor.serde.change import ChangeSerde
from processor.state.window_key import WindowStoreKeySerde
from processor.topology import LogicalNode, StoreSpec
from processor.topology.naming import repartition_topic


def _check_emit(emit, windowed: bool) -> Emit:
    emit = emit or Emit.on_change()
    if not isinstance(emit, Emit):
        raise TopologyError(f"emit= takes an Emit policy (Emit.on_change(), ...), not {emit!r}")
    if emit.mode == "on_window_close" and not windowed:
        raise TopologyError("Emit.on_window_close() needs a windowed aggregation "
                            "(group_by_key().windowed_by(TimeWindows.of(...)))")
    return emit


def _count_init():
    return 0


def _count_add(key, value, agg):
    return agg + 1


def _count_sub(key, value, agg):
    return agg - 1


def _repartition(builder, parent: LogicalNode, select: LogicalNode | None, store: str, key_serde, value_serde):
    """[select ->] sink(<store>-repartition) | source(<store>-repartition); returns the source node."""
    if select is not None:
        builder.add_node(select, parent)
        parent = select
    return repartition_through(builder, parent, repartition_topic(store), key_serde, value_serde)


def _aggregate_node(builder, parent, store, key_serde, value_serde, factory, kind, emit, windows=None,
                    store_key_serde=None, store_kind="windowed-aggregate"):
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
    """``table.group_by(selector)``: ``selector(key, value) -> (group_key, group_value)``."""

    def __init__(self, table, selector, key_serde, value_serde):
        self._table = table
        self._selector = selector
        self.key_serde = key_serde
        self.value_serde = value_serde

    def _build(self, kind, initializer, adder, subtractor, emit, name, value_serde):
        emit = _check_emit(emit, windowed=False)
        b = self._table._builder
        store = b.peek_name("KTABLE-AGGREGATE-STATE-STORE", name)
        b.check_store_names_free(store)
        ks = self.key_serde
        select = LogicalNode(name=b.new_name("KTABLE-SELECT"), kind="processor",
                             factory=lambda n: TableGroupBy(n.name, self._selector, ks))
        source = _repartition(b, self._table._node, select, store, ks, ChangeSerde(self.value_serde))
        node = _aggregate_node(
            b, source, store, ks, value_serde,
            lambda n: TableAggregate(n.name, store, ks, value_serde, emit, initializer, adder, subtractor),
            kind, emit)
        return b.table_of(node, ks, value_serde, store_name=store)

    def count(self, emit: Emit | None = None, name: str | None = None, value_serde=None):
        """Rows per group; stays 0 (not deleted) when the last row leaves, as in Kafka Streams."""
        return self._build("count", _count_init, _count_add, _count_sub, emit, name, value_serde or Serdes.json())

    def reduce(self, adder, subtractor, emit: Emit | None = None, name: str | None = None, value_serde=None):
        """``adder(agg, value)``, ``subtractor(agg, value)``; a None result deletes the group."""
        return self._build("reduce", None, adder, subtractor, emit, name, value_serde or self.value_serde)

    def aggregate(self, initializer, adder, subtractor, emit: Emit | None = None, name: str | None = None,
                  value_serde=None):
        """``initializer()``, ``adder(key, value, agg)``, ``subtractor(key, value, agg)``; the
        value serde defaults to JSON; a None result deletes the group.
        """
        return self._build("aggregate", initializer, adder, subtractor, emit, name, value_serde or Serdes.json())


class KGroupedStream:
    """``stream.group_by_key()`` or ``stream.group_by(selector)`` (then through a repartition topic)."""

    def __init__(self, stream, selector, key_serde, value_serde, repartition: bool = False):
        self._stream = stream
        self._selector = selector   # None: group by the existing key
        self.key_serde = key_serde
        self.value_serde = value_serde
        # by the existing key after a key-changing operator: through a repartition topic
        self._repartition = repartition

    def _input(self, store):
        b = self._stream._builder
        if self._selector is None:
            if self._repartition:
                return _repartition(b, self._stream._node, None, store, self.key_serde, self.value_serde)
            return self._stream._node
        select = LogicalNode(name=b.new_name("KSTREAM-KEY-SELECT"), kind="processor",
                             factory=lambda n: StreamGroupBy(n.name, self._selector))
        return _repartition(b, self._stream._node, select, store, self.key_serde, self.value_serde)

    def _build(self, kind, initializer, aggregator, emit, name, value_serde, windows=None):
        emit = _check_emit(emit, windowed=windows is not None)
        b = self._stream._builder
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

    def count(self, emit: Emit | None = None, name: str | None = None, value_serde=None):
        return self._build("count", _count_init, _count_add, emit, name, value_serde or Serdes.json())

    def reduce(self, reducer, emit: Emit | None = None, name: str | None = None, value_serde=None):
        """``reducer(agg, value)``; the first value of a key is its aggregate."""
        return self._build("reduce", None, reducer, emit, name, value_serde or self.value_serde)

    def aggregate(self, initializer, aggregator, emit: Emit | None = None, name: str | None = None,
                  value_serde=None):
        """``initializer()``, ``aggregator(key, value, agg)``; the value serde defaults to JSON."""
        return self._build("aggregate", initializer, aggregator, emit, name, value_serde or Serdes.json())

    def windowed_by(self, windows):
        """``TimeWindows`` -> a ``TimeWindowedKStream``; ``SessionWindows`` -> a
        ``SessionWindowedKStream``.
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

    def _build_windowed(self, kind, emit, name, value_serde, windows, make, store_key_serde, result_key_serde,
                        store_kind):
        """A session- or sliding-windowed aggregate: ``make(node name, store, emit)`` its
        operator, keyed in its store by ``store_key_serde`` and in its result by ``result_key_serde``.
        """
        emit = _check_emit(emit, windowed=True)
        b = self._stream._builder
        store = b.peek_name("KTABLE-AGGREGATE-STATE-STORE", name)
        b.check_store_names_free(store)
        parent = self._input(store)
        node = _aggregate_node(b, parent, store, self.key_serde, value_serde, lambda n: make(n.name, store, emit),
                               kind, emit, windows, store_key_serde=store_key_serde, store_kind=store_kind)
        return b.table_of(node, result_key_serde, value_serde, store_name=store)

    def _build_sliding(self, kind, initializer, aggregator, emit, name, value_serde, windows):
        from processor.operators.sliding_aggregate import SlidingWindowedStreamAggregate
        from processor.state.sliding_key import SlidingStoreKeySerde

        ks = self.key_serde
        return self._build_windowed(
            kind, emit, name, value_serde, windows,
            lambda node, store, em: SlidingWindowedStreamAggregate(node, store, ks, value_serde, em, initializer,
                                                                   aggregator, windows),
            SlidingStoreKeySerde(ks, windows.diff_ms), Serdes.windowed(ks, windows.diff_ms), "windowed-aggregate")

    def _build_sessions(self, kind, initializer, aggregator, merger, emit, name, value_serde, windows):
        from processor.operators.session_aggregate import SessionWindowedStreamAggregate
        from processor.serde.windowed import SessionWindowedSerde

        ks = self.key_serde
        session_keys = SessionWindowedSerde(ks)   # the store's key layout is the result's
        return self._build_windowed(
            kind, emit, name, value_serde, windows,
            lambda node, store, em: SessionWindowedStreamAggregate(node, store, ks, value_serde, em, initializer,
                                                                   aggregator, merger, windows),
            session_keys, session_keys, "session-aggregate")


class TimeWindowedKStream:
    """Tumbling (``TimeWindows.of(size)``) or hopping (``.advance_by(step)``) windows, with
    ``.grace(ms)``; the result table's keys are ``Windowed(key, start, end)``.
    """

    def __init__(self, grouped: KGroupedStream, windows):
        self._grouped = grouped
        self.windows = windows

    def count(self, emit: Emit | None = None, name: str | None = None, value_serde=None):
        return self._grouped._build("count", _count_init, _count_add, emit, name,
                                    value_serde or Serdes.json(), self.windows)

    def reduce(self, reducer, emit: Emit | None = None, name: str | None = None, value_serde=None):
        return self._grouped._build("reduce", None, reducer, emit, name,
                                    value_serde or self._grouped.value_serde, self.windows)

    def aggregate(self, initializer, aggregator, emit: Emit | None = None, name: str | None = None,
                  value_serde=None):
        return self._grouped._build("aggregate", initializer, aggregator, emit, name,
                                    value_serde or Serdes.json(), self.windows)


def _merge_counts(key, a, b):
    return a + b


class SessionWindowedKStream:
    """``group_by_key().windowed_by(SessionWindows.with_inactivity_gap(gap).grace(ms))``: one
    aggregate per session of a key; result keys ``Windowed(key, start, end)``, ``end`` the
    session's last record time (inclusive). Sessions merged into another are tombstoned.
    """

    def __init__(self, grouped: KGroupedStream, windows):
        self._grouped = grouped
        self.windows = windows

    def count(self, emit: Emit | None = None, name: str | None = None, value_serde=None):
        return self._grouped._build_sessions("count", _count_init, _count_add, _merge_counts, emit, name,
                                             value_serde or Serdes.json(), self.windows)

    def reduce(self, reducer, emit: Emit | None = None, name: str | None = None, value_serde=None):
        """``reducer(agg, value)``; merging two sessions is ``reducer(agg1, agg2)``."""
        return self._grouped._build_sessions("reduce", None, reducer, reducer, emit, name,
                                             value_serde or self._grouped.value_serde, self.windows)

    def aggregate(self, initializer, aggregator, merger, emit: Emit | None = None, name: str | None = None,
                  value_serde=None):
        """``initializer()``, ``aggregator(key, value, agg)``, ``merger(key, agg1, agg2)``."""
        return self._grouped._build_sessions("aggregate", initializer, aggregator, merger, emit, name,
                                             value_serde or Serdes.json(), self.windows)


class SlidingWindowedKStream:
    """``group_by_key().windowed_by(SlidingWindows.of_time_difference_and_grace(diff, grace))``
    (KIP-450); result keys ``Windowed(key, start, start + diff)``.
    """

    def __init__(self, grouped: KGroupedStream, windows):
        self._grouped = grouped
        self.windows = windows

    def count(self, emit: Emit | None = None, name: str | None = None, value_serde=None):
        return self._grouped._build_sliding("count", _count_init, _count_add, emit, name,
                                            value_serde or Serdes.json(), self.windows)

    def reduce(self, reducer, emit: Emit | None = None, name: str | None = None, value_serde=None):
        return self._grouped._build_sliding("reduce", None, reducer, emit, name,
                                            value_serde or self._grouped.value_serde, self.windows)

    def aggregate(self, initializer, aggregator, emit: Emit | None = None, name: str | None = None,
                  value_serde=None):
        return self._grouped._build_sliding("aggregate", initializer, aggregator, emit, name,
                                            value_serde or Serdes.json(), self.windows)
