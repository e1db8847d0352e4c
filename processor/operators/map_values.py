"""map_values for streams and tables.

Table invariant: forwards ``Change(f(new), f(old))`` only when the mapped result changes. When
``f`` maps an update onto the value it already had (compared by the output serde's bytes when a
serde is known, else by type and equality), nothing is forwarded and ``unchanged_skipped``
counts it. ``f`` is not called on an absent side.
"""

from __future__ import annotations

from processor.operators.base import Processor
from processor.records import Change


class StreamMapValues(Processor):
    kind = "map-values"

    def __init__(self, name, mapper):
        super().__init__(name)
        self.mapper = mapper

    def process(self, key, value, timestamp):
        try:
            out = self.mapper(value)
        except Exception as exc:
            raise self.user_error(self.mapper, exc) from exc
        self.forward(key, out, timestamp)


class TableMapValues(Processor):
    kind = "table-map-values"

    def __init__(self, name, mapper, value_serde=None):
        super().__init__(name)
        self.mapper = mapper
        self.value_serde = value_serde
        self.unchanged_skipped = 0

    def _map(self, value):
        if value is None:
            return None
        try:
            return self.mapper(value)
        except Exception as exc:
            raise self.user_error(self.mapper, exc) from exc

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
