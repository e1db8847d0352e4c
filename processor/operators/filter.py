"""Filters for streams and tables.

Table filter invariant (KAFKA-3902): the filter forwards exactly the changes of the filtered
table. The predicate is applied to both sides of ``Change(new, old)`` (an absent side counts as
failing):

    old passes | new passes | forwarded
    -----------+------------+--------------------------------------------
        no     |     no     | nothing (counted in ``skipped_both_fail``)
        no     |    yes     | (new<-None)
        yes    |     no     | (None<-old)   -> a tombstone at an output topic
        yes    |    yes     | (new<-old)

Table sources are always materialized, so the old value is always known; no ``(None<-None)``
is ever forwarded. ``filter_not`` is the same with the predicate negated.
"""

from __future__ import annotations

from processor.operators.base import Processor
from processor.records import Change


class StreamFilter(Processor):
    kind = "filter"

    def __init__(self, name, predicate, negate=False):
        super().__init__(name)
        self.predicate = predicate
        self.negate = negate
        self.dropped = 0

    def process(self, key, value, timestamp):
        try:
            ok = bool(self.predicate(key, value)) is not self.negate
        except Exception as exc:
            raise self.user_error(self.predicate, exc) from exc
        if ok:
            self.forward(key, value, timestamp)
        else:
            self.dropped += 1

    def metrics(self):
        return {"dropped": self.dropped}


class TableFilter(Processor):
    kind = "table-filter"

    def __init__(self, name, predicate, negate=False):
        super().__init__(name)
        self.predicate = predicate
        self.negate = negate
        self.skipped_both_fail = 0

    def _passes(self, key, value) -> bool:
        if value is None:
            return False
        try:
            return bool(self.predicate(key, value)) is not self.negate
        except Exception as exc:
            raise self.user_error(self.predicate, exc) from exc

    def process(self, key, change, timestamp):
        new_ok = self._passes(key, change.new)
        old_ok = self._passes(key, change.old)
        if new_ok:
            self.forward(key, change if old_ok else Change(change.new, None), timestamp)
        elif old_ok:
            self.forward(key, Change(None, change.old), timestamp)
        else:
            self.skipped_both_fail += 1

    def metrics(self):
        return {"skipped_both_fail": self.skipped_both_fail}
