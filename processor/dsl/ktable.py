"""KTable: a changelog stream of a table; its operators forward ``Change(new, old)``.

Invariant: a ``KTable`` is a handle on one node of its builder's graph, with the serdes of its
keys and values and, when it is materialized, its store's name; its operators only add nodes
after it (the table itself never changes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from processor.dsl.abstract_stream import AbstractStream
from processor.graph import GetterSpec, TableAttrs, ToStreamAttrs
from processor.operators.filter import FilterValueGetter, TableFilter, TableFilterRule
from processor.operators.map_values import MapValuesGetter, TableMapValues, TableMapValuesRule
from processor.operators.sink import TableToStream
from processor.operators.value_getter import table_getter
from processor.serde import Serde, Serdes
from processor.topology import LogicalNode

if TYPE_CHECKING:  # pragma: no cover
    from processor.dsl.builder import StreamsBuilder
    from processor.dsl.grouped import KGroupedTable
    from processor.dsl.kstream import KStream
    from processor.functions import ForeignKeyExtractor, KeyValueMapper, Predicate, ValueJoiner, ValueMapper


def _filter_getter(predicate: Predicate, negate: bool) -> GetterSpec:
    """The filtered table's getter: its parent's rows through the filter's rule."""
    return GetterSpec(lambda n, ctx: FilterValueGetter(table_getter(n.parents[0], ctx),
                                                       TableFilterRule(predicate, negate, n.name)))


def _map_values_getter(mapper: ValueMapper) -> GetterSpec:
    """The mapped table's getter: its parent's rows through the operator's rule."""
    return GetterSpec(lambda n, ctx: MapValuesGetter(table_getter(n.parents[0], ctx),
                                                     TableMapValuesRule(mapper, n.name)))


class KTable(AbstractStream):
    """A table: a changelog stream where each record is an update of its key (Kafka Streams: ``KTable``).

    Made by ``StreamsBuilder.table``, ``KStream.to_table``, aggregations and table joins. Its
    operators forward ``Change(new, old)`` and never a no-op where Kafka Streams does not.

    Attributes:
        key_serde: The serde of the table's keys.
        value_serde: The serde of the table's values.
        store_name: The store the table is materialized in, or None when it is not (a filter's or
            a mapper's result is looked up through its parent's store).

    Example:
        >>> from processor import StreamsBuilder
        >>> from processor.testing import TopologyTestDriver
        >>> builder = StreamsBuilder()
        >>> builder.table("prices").filter(lambda k, v: v > 10).to_stream().to("expensive")
        >>> with TopologyTestDriver(builder.build()) as driver:
        ...     for key, price in [("a", 5), ("b", 20), ("b", 3)]:
        ...         driver.pipe_input("prices", key, price, timestamp=1)
        ...     [(r.key, r.value) for r in driver.read_output("expensive")]
        [('b', 20), ('b', None)]
    """
    dsl_kind = "table"

    def __init__(self, builder: StreamsBuilder, node: LogicalNode, key_serde: Serde, value_serde: Serde,
                 store_name: str | None = None):
        super().__init__(builder, node)
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.store_name = store_name

    def _then(self, prefix: str, factory: Callable[[LogicalNode], Any], name: str | None = None,
              value_serde: Serde | None = None, value_preserving: bool = False,
              getter: GetterSpec | None = None) -> KTable:
        b = self._builder
        node = LogicalNode(name=b.new_name(prefix, name), kind="processor", factory=factory,
                           value_preserving=value_preserving, attrs=TableAttrs(getter=getter))
        b.add_node(node, self._node)
        return KTable(b, node, self.key_serde, value_serde or self.value_serde)

    def filter(self, predicate: Predicate, name: str | None = None) -> KTable:
        """The rows for which ``predicate(key, value)`` holds (Kafka Streams: ``KTable#filter``).

        A row that stops matching is deleted from the result (a ``Change(None, old)``), and
        a change between two rows that both fail is not forwarded (KAFKA-3902).

        Args:
            predicate: ``(key, value) -> bool``, called on both sides of each change.
            name: The operator's name (default ``KTABLE-FILTER-<index>``).

        Returns:
            The filtered table (not materialized: looked up through this table).

        Example:
            >>> from processor import StreamsBuilder
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> adults = builder.table("people").filter(lambda name, age: age >= 18)
            >>> adults.to_stream().to("adults")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     driver.pipe_input("people", "ann", 17, timestamp=1)
            ...     driver.pipe_input("people", "ann", 18, timestamp=2)
            ...     [(r.key, r.value) for r in driver.read_output("adults")]
            [('ann', 18)]
        """
        return self._then("KTABLE-FILTER", lambda n: TableFilter(n.name, predicate), name,
                          value_preserving=True, getter=_filter_getter(predicate, False))

    def filter_not(self, predicate: Predicate, name: str | None = None) -> KTable:
        """The rows for which ``predicate(key, value)`` does not hold (Kafka Streams: ``KTable#filterNot``).

        Args:
            predicate: ``(key, value) -> bool``; the rows for which it is false are kept.
            name: The operator's name (default ``KTABLE-FILTER-<index>``).

        Returns:
            The filtered table, as ``filter``'s.
        """
        return self._then("KTABLE-FILTER", lambda n: TableFilter(n.name, predicate, negate=True), name,
                          value_preserving=True, getter=_filter_getter(predicate, True))

    def map_values(self, mapper: ValueMapper, value_serde: Serde | None = None,
                   name: str | None = None) -> KTable:
        """Each row's value mapped by ``mapper`` (Kafka Streams: ``KTable#mapValues``).

        An update whose mapped value does not change is not forwarded; ``mapper`` is not called
        on an absent value (a delete stays a delete).

        Args:
            mapper: ``(value) -> new value``.
            value_serde: The result's value serde (default JSON).
            name: The operator's name (default ``KTABLE-MAPVALUES-<index>``).

        Returns:
            The mapped table (not materialized: looked up through this table).

        Example:
            >>> from processor import StreamsBuilder
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> builder.table("users").map_values(lambda v: v["name"]).to_stream().to("names")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     driver.pipe_input("users", "u1", {"name": "Ann", "age": 30}, timestamp=1)
            ...     driver.pipe_input("users", "u1", {"name": "Ann", "age": 31}, timestamp=2)
            ...     [(r.key, r.value) for r in driver.read_output("names")]
            [('u1', 'Ann')]
        """
        vs = value_serde or Serdes.json()
        return self._then("KTABLE-MAPVALUES", lambda n: TableMapValues(n.name, mapper, vs), name,
                          value_serde=vs, getter=_map_values_getter(mapper))

    def group_by(self, selector: KeyValueMapper, key_serde: Serde | None = None,
                 value_serde: Serde | None = None) -> KGroupedTable:
        """The rows regrouped by a new key, for an aggregation (Kafka Streams: ``KTable#groupBy``).

        Each change goes through a repartition topic: the old row is subtracted from its old
        group and the new one added to its new group.

        Args:
            selector: ``(key, value) -> (group_key, group_value)``; a None ``group_key`` puts the
                row in no group.
            key_serde: The group keys' serde in the repartition topic (default string).
            value_serde: The group values' serde in the repartition topic (default JSON).

        Returns:
            The grouped table, to ``count``, ``reduce`` or ``aggregate``.

        Example:
            >>> from processor import StreamsBuilder
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> per_city = builder.table("people").group_by(lambda name, city: (city, name)).count()
            >>> per_city.to_stream().to("city-counts")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     driver.pipe_input("people", "ann", "Oslo", timestamp=1)
            ...     driver.pipe_input("people", "bob", "Oslo", timestamp=2)
            ...     driver.pipe_input("people", "ann", "Rome", timestamp=3)
            ...     [(r.key, r.value) for r in driver.read_output("city-counts")]
            [('Oslo', 1), ('Oslo', 2), ('Oslo', 1), ('Rome', 1)]
        """
        from processor.dsl.grouped import KGroupedTable

        return KGroupedTable(self, selector, key_serde or Serdes.string(), value_serde or Serdes.json())

    # -- joins (processor/dsl/joins.py) ------------------------------------------------------
    def join(self, other: KTable, joiner: ValueJoiner, name: str | None = None,
             value_serde: Serde | None = None) -> KTable:
        """Inner join on the primary key with a co-partitioned table (Kafka Streams: ``KTable#join``).

        A change on either side looks the other side up; keys present on both sides get
        ``joiner(left, right)``, a key that leaves either side is deleted from the result.

        Args:
            other: The right table; its topic must have as many partitions as this one's.
            joiner: ``(left value, right value) -> joined value``.
            name: The result's store name (default ``KTABLE-JOIN-STATE-STORE-<index>``).
            value_serde: The result's value serde (default JSON).

        Returns:
            The joined table, materialized in store ``name``.

        Raises:
            TopologyError: ``other`` is not a table that can be looked up, or comes from
                another builder.

        Example:
            >>> from processor import StreamsBuilder
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> names, ages = builder.table("names"), builder.table("ages")
            >>> names.join(ages, lambda n, a: f"{n} ({a})").to_stream().to("people")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     driver.pipe_input("names", "u1", "Ann", timestamp=1)
            ...     driver.pipe_input("ages", "u1", 30, timestamp=2)
            ...     [(r.key, r.value) for r in driver.read_output("people")]
            [('u1', 'Ann (30)')]
        """
        from processor.dsl.joins import table_table_join

        return table_table_join(self, other, joiner, "inner", name, value_serde)

    def left_join(self, other: KTable, joiner: ValueJoiner, name: str | None = None,
                  value_serde: Serde | None = None) -> KTable:
        """Every left row joined with the right row of its key (Kafka Streams: ``KTable#leftJoin``).

        Args:
            other: The right table, co-partitioned with this one.
            joiner: ``(left value, right value or None) -> joined value``.
            name: The result's store name (default ``KTABLE-JOIN-STATE-STORE-<index>``).
            value_serde: The result's value serde (default JSON).

        Returns:
            The joined table, materialized in store ``name``.
        """
        from processor.dsl.joins import table_table_join

        return table_table_join(self, other, joiner, "left", name, value_serde)

    def outer_join(self, other: KTable, joiner: ValueJoiner, name: str | None = None,
                   value_serde: Serde | None = None) -> KTable:
        """Every key present on either side, joined (Kafka Streams: ``KTable#outerJoin``).

        Args:
            other: The right table, co-partitioned with this one.
            joiner: ``(left value or None, right value or None) -> joined value``; the absent
                side is None.
            name: The result's store name (default ``KTABLE-JOIN-STATE-STORE-<index>``).
            value_serde: The result's value serde (default JSON).

        Returns:
            The joined table, materialized in store ``name``.
        """
        from processor.dsl.joins import table_table_join

        return table_table_join(self, other, joiner, "outer", name, value_serde)

    def join_on_foreign_key(self, other: KTable, fk_extractor: ForeignKeyExtractor, joiner: ValueJoiner,
                            how: str = "inner", name: str | None = None,
                            value_serde: Serde | None = None) -> KTable:
        """Each left row joined with the right row its foreign key names (Kafka Streams: ``KTable#join`` by FK).

        KIP-213: the tables need not be co-partitioned; subscriptions and responses go through
        two internal topics. A change on either side updates every left row it concerns.

        Args:
            other: The right table, keyed by the foreign key.
            fk_extractor: ``(value) -> foreign key`` or ``(key, value) -> foreign key``; None:
                the row has no foreign key.
            joiner: ``(left value, right value) -> joined value``.
            how: ``"inner"``, or ``"left"``: ``joiner(left, None)`` for a row without a match.
            name: The join's base name and result store (default ``KTABLE-FK-JOIN-<index>``).
            value_serde: The result's value serde (default JSON).

        Returns:
            The joined table, keyed like this one, materialized in store ``name``.

        Raises:
            TopologyError: ``how`` is neither, a table cannot be looked up, or the right
                table has a Schema Registry serde.

        Example:
            >>> from processor import StreamsBuilder
            >>> from processor.testing import TopologyTestDriver
            >>> builder = StreamsBuilder()
            >>> orders, customers = builder.table("orders"), builder.table("customers")
            >>> enriched = orders.join_on_foreign_key(customers, lambda order: order["customer"],
            ...                                       lambda order, customer: {**order, "name": customer})
            >>> enriched.to_stream().to("enriched")
            >>> with TopologyTestDriver(builder.build()) as driver:
            ...     driver.pipe_input("customers", "c1", "Ann", timestamp=1)
            ...     driver.pipe_input("orders", "o1", {"customer": "c1"}, timestamp=2)
            ...     [(r.key, r.value) for r in driver.read_output("enriched")]
            [('o1', {'customer': 'c1', 'name': 'Ann'})]
        """
        from processor.dsl.joins import foreign_key_join

        return foreign_key_join(self, other, fk_extractor, joiner, how, name, value_serde)

    def to_stream(self, name: str | None = None) -> KStream:
        """The table's changelog as a stream: each change's new value (Kafka Streams: ``KTable#toStream``).

        A delete is a record with a None value (a tombstone).

        Args:
            name: The operator's name (default ``KTABLE-TOSTREAM-<index>``).

        Returns:
            The stream of the table's updates, keyed like the table.
        """
        b = self._builder
        node = LogicalNode(name=b.new_name("KTABLE-TOSTREAM", name), kind="processor",
                           factory=lambda n: TableToStream(n.name), value_preserving=True,
                           attrs=ToStreamAttrs())   # a sink right after it carries a table
        b.add_node(node, self._node)
        return b.stream_of(node, self.key_serde, self.value_serde)
