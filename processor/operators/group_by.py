"""Re-keying before an aggregation (the records then go through a repartition topic).

``TableGroupBy`` invariant: for a table update ``Change(new, old)`` of row ``k``, with
``selector(k, v) -> (group, value)``:
- both sides map to the same group (equal key bytes): ONE record ``(group, Change(new', old'))``,
  so the aggregate subtracts and adds in a single step and never forwards a transient value
  (Kafka Streams since KIP-904);
- otherwise ``(old_group, Change(None, old'))`` then ``(new_group, Change(new', None))``, as two
  records (the subtraction first, as in Kafka Streams);
- a side that is absent, or whose selector returns None or a pair whose group or value is None,
  sends nothing (``no_group`` counts new values that join no group), as Kafka Streams'
  KTableRepartitionMap; the other side goes on alone (a row leaving its group for none is
  subtracted from the old group).

``StreamGroupBy``: ``selector(k, v) -> group``; records with a null group or a null value are
dropped before the repartition topic (an aggregation would skip them) and counted.
"""

from __future__ import annotations

from processor.operators.base import Processor
from processor.records import Change


class TableGroupBy(Processor):
    kind = "group-by"

    def __init__(self, name, selector, key_serde):
        super().__init__(name)
        self.selector = selector
        self.key_serde = key_serde
        self.no_group = 0

    def _select(self, key, value, count=False):
        if value is None:
            return None
        try:
            pair = self.selector(key, value)
            group, new_value = (None, None) if pair is None else pair
        except Exception as exc:
            raise self.user_error(self.selector, exc) from exc
        if group is None or new_value is None:
            if count:
                self.no_group += 1
            return None
        return group, new_value

    def process(self, key, change, timestamp):
        new = self._select(key, change.new, count=True)
        old = self._select(key, change.old)
        if new is not None and old is not None and \
                self.key_serde.serialize(new[0]) == self.key_serde.serialize(old[0]):
            self.forward(new[0], Change(new[1], old[1]), timestamp)
            return
        if old is not None:
            self.forward(old[0], Change(None, old[1]), timestamp)
        if new is not None:
            self.forward(new[0], Change(new[1], None), timestamp)

    def metrics(self):
        return {"no_group": self.no_group} if self.no_group else {}


class StreamGroupBy(Processor):
    kind = "group-by"

    def __init__(self, name, selector):
        super().__init__(name)
        self.selector = selector
        self.skipped_null = 0

    def process(self, key, value, timestamp):
        if value is None:
            self.skipped_null += 1
            return
        try:
            group = self.selector(key, value)
        except Exception as exc:
            raise self.user_error(self.selector, exc) from exc
        if group is None:
            self.skipped_null += 1
            return
        self.forward(group, value, timestamp)

    def metrics(self):
        return {"skipped_null": self.skipped_null} if self.skipped_null else {}
