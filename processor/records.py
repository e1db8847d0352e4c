"""Records and changes: the two values that flow between operators.

``Record`` is one Kafka record as the runtime saw it (deserialized key and value plus
provenance). ``Change(new, old)`` is what table operators forward: the new and the old value of
one key of the result table, either of which may be ``None`` (absent). Its repr is
``(new<-old)``, as in Kafka Streams' ``Change``.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Record(NamedTuple):
    key: Any
    value: Any
    timestamp: int
    headers: tuple = ()
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None


class Change:
    """The new and old value of one key of a table. Immutable."""

    __slots__ = ("new", "old")

    def __init__(self, new: Any, old: Any):
        self.new = new
        self.old = old

    def __repr__(self) -> str:
        return f"({self.new!r}<-{self.old!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Change) and self.new == other.new and self.old == other.old

    def __hash__(self) -> int:
        return hash((repr(self.new), repr(self.old)))


class Windowed(NamedTuple):
    """A key of a windowed aggregate: the grouping key and its window ``[start, end)`` in ms."""

    key: Any
    start: int
    end: int

    def __repr__(self) -> str:
        return f"[{self.key!r}@{self.start}/{self.end}]"


class OutputRecord(NamedTuple):
    """A record read back from an output topic by the test driver."""

    key: Any
    value: Any
    timestamp: int
    headers: tuple = ()
