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

The rule "does this row pass" is ``TableFilterRule.passes``, the one place it lives (Kafka
Streams' ``KTableFilter.computeValue``): the operator applies it to both sides of a change, the
table's value getter (``FilterValueGetter``) to the row it looks up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from processor.operators import replay as replay_semantics
from processor.operators.base import Processor, user_function_error
from processor.operators.value_getter import Row, ValueGetter
from processor.records import Change

Predicate = Callable[[Any, Any], Any]   # predicate(key, value): truthy keeps the row


class TableFilterRule:
    """A filtered table's rule: ``passes(key, value)``; an absent value never passes."""

    __slots__ = ("predicate", "negate", "step")

    def __init__(self, predicate: Predicate, negate: bool, step: str):
        self.predicate = predicate
        self.negate = negate
        self.step = step   # the filter's name, for error translation

    def passes(self, key: Any, value: Any) -> bool:
        if value is None:
            return False
        try:
            return bool(self.predicate(key, value)) is not self.negate
        except Exception as exc:
            raise user_function_error(self.step, self.predicate, exc) from exc


class StreamFilter(Processor):
    kind = "filter"
    replay = replay_semantics.STATELESS

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
    replay = replay_semantics.TABLE_STEP

    def __init__(self, name: str, predicate: Predicate, negate: bool = False):
        super().__init__(name)
        self.rule = TableFilterRule(predicate, negate, name)
        self.skipped_both_fail = 0

    def process(self, key, change, timestamp):
        new_ok = self.rule.passes(key, change.new)
        old_ok = self.rule.passes(key, change.old)
        if new_ok:
            self.forward(key, change if old_ok else Change(change.new, None), timestamp)
        elif old_ok:
            self.forward(key, Change(None, change.old), timestamp)
        else:
            self.skipped_both_fail += 1

    def metrics(self):
        return {"skipped_both_fail": self.skipped_both_fail}


class FilterValueGetter:
    """A filtered table's row: the parent's, if it passes the filter's rule."""

    def __init__(self, parent: ValueGetter, rule: TableFilterRule):
        self.parent = parent
        self.passes = rule.passes   # the filter operator's own rule (operators/filter.py)

    def get(self, key: Any, kb: bytes) -> Row | None:
        row = self.parent.get(key, kb)
        if row is None:
            return None
        return row if self.passes(key, row[0]) else None
