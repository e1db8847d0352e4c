"""map_values for streams and tables.

Table invariant: forwards ``Change(f(new), f(old))`` only when the mapped result changes. When
``f`` maps an update onto the value it already had (compared by the output serde's bytes when a
serde is known, else by type and equality), nothing is forwarded and ``unchanged_skipped``
counts it. ``f`` is not called on an absent side.

The mapping of one value is ``TableMapValuesRule.apply``, the one place it lives (Kafka
Streams' ``KTableMapValues.computeValue``): the operator applies it to both sides of a change,
the table's value getter (``MapValuesGetter``) to the row it looks up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from processor.operators import replay as replay_semantics
from processor.operators.base import MapperOperator, Processor, user_function_error
from processor.operators.value_getter import Row, ValueGetter
from processor.records import Change

ValueMapper = Callable[[Any], Any]   # mapper(value) -> new value


class TableMapValuesRule:
    """A mapped table's rule: ``apply(value)`` is ``mapper(value)``, None for an absent value."""

    __slots__ = ("mapper", "step")

    def __init__(self, mapper: ValueMapper, step: str):
        self.mapper = mapper
        self.step = step   # the operator's name, for error translation

    def apply(self, value: Any) -> Any:
        if value is None:
            return None
        try:
            return self.mapper(value)
        except Exception as exc:
            raise user_function_error(self.step, self.mapper, exc) from exc


class StreamMapValues(MapperOperator):
    kind = "map-values"
    replay = replay_semantics.STATELESS

    def process(self, key, value, timestamp):
        try:
            out = self.mapper(value)
        except Exception as exc:
            raise self.user_error(self.mapper, exc) from exc
        self.forward(key, out, timestamp)


class TableMapValues(Processor):
    kind = "table-map-values"
    replay = replay_semantics.TABLE_MAP

    def __init__(self, name: str, mapper: ValueMapper, value_serde=None):
        super().__init__(name)
        self.rule = TableMapValuesRule(mapper, name)
        self._map = self.rule.apply   # bound once: the per-record call costs what a method's does
        self.value_serde = value_serde
        self.unchanged_skipped = 0

    def _same(self, a, b) -> bool:
        if a is None or b is None:
            return a is b
        if self.value_serde is not None:
            return self.value_serde.serialize(a) == self.value_serde.serialize(b)
        return type(a) is type(b) and a == b

    def process(self, key, change, timestamp):
        new = self._map(change.new)
        old = self._map(change.old)
        if self._same(new, old):
            self.unchanged_skipped += 1
            return
        self.forward(key, Change(new, old), timestamp)

    def metrics(self):
        return {"unchanged_skipped": self.unchanged_skipped}


class MapValuesGetter:
    """A mapped table's row: the parent's, its value mapped by the operator's rule."""

    def __init__(self, parent: ValueGetter, rule: TableMapValuesRule):
        self.parent = parent
        self.apply = rule.apply   # the map_values operator's own rule (operators/map_values.py)

    def get(self, key: Any, kb: bytes) -> Row | None:
        row = self.parent.get(key, kb)
        if row is None:
            return None
        return self.apply(row[0]), row[1]
