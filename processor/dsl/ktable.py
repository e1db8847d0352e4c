"""KTable: a changelog stream of a table; its operators forward ``Change(new, old)``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from processor.graph import GetterSpec, TableAttrs, ToStreamAttrs
from processor.operators.base import Processor
from processor.operators.filter import TableFilter
from processor.operators.map_values import TableMapValues
from processor.operators.sink import TableToStream
from processor.operators.value_getter import FilterValueGetter, MapValuesGetter, table_getter
from processor.serde import Serdes
from processor.topology import LogicalNode

if TYPE_CHECKING:  # pragma: no cover
    from processor.dsl.kstream import KStream


def _filter_getter(predicate, negate):
    return GetterSpec(lambda n, ctx: FilterValueGetter(table_getter(n.parents[0], ctx), predicate, negate,
                                                       Processor(n.name)))


class KTable:
    dsl_kind = "table"

    def __init__(self, builder, node: LogicalNode, key_serde, value_serde, store_name=None):
        self._builder = builder
        self._node = node
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.store_name = store_name

    def _then(self, prefix, factory, name=None, value_serde=None, value_preserving=False, getter=None):
        b = self._builder
        node = LogicalNode(name=b.new_name(prefix, name), kind="processor", factory=factory,
                           value_preserving=value_preserving, attrs=TableAttrs(getter=getter))
        b.add_node(node, self._node)
        return KTable(b, node, self.key_serde, value_serde or self.value_serde)

    def filter(self, predicate, name: str | None = None) -> KTable:
        """Rows for which ``predicate(key, value)`` is true (KAFKA-3902 semantics on changes)."""
        return self._then("KTABLE-FILTER", lambda n: TableFilter(n.name, predicate), name,
                          value_preserving=True, getter=_filter_getter(predicate, False))

    def filter_not(self, predicate, name: str | None = None) -> KTable:
        return self._then("KTABLE-FILTER", lambda n: TableFilter(n.name, predicate, negate=True), name,
                          value_preserving=True, getter=_filter_getter(predicate, True))

    def map_values(self, mapper, value_serde=None, name: str | None = None) -> KTable:
        """``mapper(value) -> new value``; the result's serde defaults to JSON. Updates whose
        mapped value does not change are not forwarded.
        """
        vs = value_serde or Serdes.json()
        return self._then("KTABLE-MAPVALUES", lambda n: TableMapValues(n.name, mapper, vs), name,
                          value_serde=vs,
                          getter=GetterSpec(lambda n, ctx: MapValuesGetter(table_getter(n.parents[0], ctx),
                                                                           mapper, Processor(n.name))))

    def group_by(self, selector, key_serde=None, value_serde=None):
        """``selector(key, value) -> (group_key, group_value)`` (group_key None: the row is in no
        group). Serdes of the repartition topic: key defaults to string, value to JSON.
        """
        from processor.dsl.grouped import KGroupedTable

        return KGroupedTable(self, selector, key_serde or Serdes.string(), value_serde or Serdes.json())

    # -- joins (processor/dsl/joins.py) ------------------------------------------------------
    def join(self, other: KTable, joiner, name: str | None = None, value_serde=None) -> KTable:
        """Inner join on the primary key with a co-partitioned table: ``joiner(left, right)``
        for keys present on both sides. The result is a materialized table (store ``name``).
        """
        from processor.dsl.joins import table_table_join

        return table_table_join(self, other, joiner, "inner", name, value_serde)

    def left_join(self, other: KTable, joiner, name: str | None = None, value_serde=None) -> KTable:
        """Every left row; ``joiner(left, None)`` where the right side has no row."""
        from processor.dsl.joins import table_table_join

        return table_table_join(self, other, joiner, "left", name, value_serde)

    def outer_join(self, other: KTable, joiner, name: str | None = None, value_serde=None) -> KTable:
        """Every key present on either side; the absent side is None."""
        from processor.dsl.joins import table_table_join

        return table_table_join(self, other, joiner, "outer", name, value_serde)

    def join_on_foreign_key(self, other: KTable, fk_extractor, joiner, how: str = "inner",
                            name: str | None = None, value_serde=None) -> KTable:
        """Join each left row with the right row whose key ``fk_extractor(value)`` (or
        ``fk_extractor(key, value)``) returns; None: no foreign key. ``how``: "inner" or "left"
        (``joiner(left, None)`` without a match). The tables need not be co-partitioned. The
        result is a materialized table keyed like this one (store ``name``).
        """
        from processor.dsl.joins import foreign_key_join

        return foreign_key_join(self, other, fk_extractor, joiner, how, name, value_serde)

    def to_stream(self, name: str | None = None) -> KStream:
        b = self._builder
        node = LogicalNode(name=b.new_name("KTABLE-TOSTREAM", name), kind="processor",
                           factory=lambda n: TableToStream(n.name), value_preserving=True,
                           attrs=ToStreamAttrs())   # a sink right after it carries a table
        b.add_node(node, self._node)
        return b.stream_of(node, self.key_serde, self.value_serde)
