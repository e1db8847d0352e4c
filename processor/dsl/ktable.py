"""KTable: a changelog stream of a table; its operators forward ``Change(new, old)``."""

from __future__ import annotations

from processor.dsl.kstream import KStream
from processor.operators.filter import TableFilter
from processor.operators.map_values import TableMapValues
from processor.operators.sink import TableToStream
from processor.serde import Serdes
from processor.topology import LogicalNode


class KTable:
    def __init__(self, builder, node: LogicalNode, key_serde, value_serde, store_name=None):
        self._builder = builder
        self._node = node
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.store_name = store_name

    def _then(self, prefix, factory, name=None, value_serde=None, value_preserving=False):
        b = self._builder
        node = LogicalNode(name=b._name(prefix, name), kind="processor", factory=factory,
                           value_preserving=value_preserving)
        b._add(node, self._node)
        return KTable(b, node, self.key_serde, value_serde or self.value_serde)

    def filter(self, predicate, name: str | None = None) -> "KTable":
        """Rows for which ``predicate(key, value)`` is true (KAFKA-3902 semantics on changes)."""
        return self._then("KTABLE-FILTER", lambda n: TableFilter(n.name, predicate), name,
                          value_preserving=True)

    def filter_not(self, predicate, name: str | None = None) -> "KTable":
        return self._then("KTABLE-FILTER", lambda n: TableFilter(n.name, predicate, negate=True), name,
                          value_preserving=True)

    def map_values(self, mapper, value_serde=None, name: str | None = None) -> "KTable":
        """``mapper(value) -> new value``; the result's serde defaults to JSON. Updates whose
        mapped value does not change are not forwarded."""
        vs = value_serde or Serdes.json()
        return self._then("KTABLE-MAPVALUES", lambda n: TableMapValues(n.name, mapper, vs), name,
                          value_serde=vs)

    def group_by(self, selector, key_serde=None, value_serde=None):
        """``selector(key, value) -> (group_key, group_value)`` (group_key None: the row is in no
        group). Serdes of the repartition topic: key defaults to string, value to JSON."""
        from processor.dsl.grouped import KGroupedTable

        return KGroupedTable(self, selector, key_serde or Serdes.string(), value_serde or Serdes.json())

    def to_stream(self, name: str | None = None) -> KStream:
        b = self._builder
        node = LogicalNode(name=b._name("KTABLE-TOSTREAM", name), kind="processor",
                           factory=lambda n: TableToStream(n.name), value_preserving=True)
        b._add(node, self._node)
        return KStream(b, node, self.key_serde, self.value_serde)
