"""Primary-key table-table joins (inner, left, outer) and the table self-join.

Invariant: the join forwards exactly the changes of its result table. The result is
materialized (``result_store``, timestamped layout); a side's change recomputes the key's
result from the changed side's new value and the other side's current value (its value getter),
compares the result's bytes with the stored ones, and forwards ``Change(new, stored)`` only when
they differ. So there is no ``(None<-None)`` (except where no consumer reads old values, which
are then not decoded: ``MaterializedResult.send_old``), no re-emission of equal bytes, and the
old value is always the result as it was forwarded, even when one record changes both sides at once (a
table joined with itself, unoptimized: the second side finds nothing left to change).

Result rows:  inner: ``joiner(l, r)`` when both exist;  left: when ``l`` exists (``r`` may be
None);  outer: when either exists. A joiner returning None deletes the row.
Timestamps: ``max(this record's, the other row's)`` when the other row exists, else this
record's (Kafka Streams' rule).

``TableSelfJoin`` is the optimized form of a table joined with itself on its primary key
(see ``topology.py``, pass ``self-join``): both sides are always the same row, so the result is
``joiner(v, v)`` of the change's new and old value, needing no store of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from processor.operators.base import Processor, user_function_error
from processor.operators.value_getter import Row, ValueGetter, table_getter
from processor.records import Change
from processor.state import timestamped

HOWS = ("inner", "left", "outer")


class Named(Protocol):
    name: str   # a step's name (an operator, or a value getter standing for its operator)


def join_values(how: str, joiner: Callable[[Any, Any], Any], left: Any, right: Any, step: Named) -> Any:
    """A primary-key join's result row for ``left`` and ``right`` (None: no row): the one rule,
    applied by both sides of the join, the self-join and the self-join's value getter. ``step``
    names the join in an error (read only then: the operators pass themselves)."""
    if left is None and right is None:
        return None
    if how == "inner" and (left is None or right is None):
        return None
    if how == "left" and left is None:
        return None
    try:
        return joiner(left, right)
    except Exception as exc:
        raise user_function_error(step.name, joiner, exc) from exc


class MaterializedResult:
    """A join's result table: compare-and-set by value bytes, returning what to forward."""

    def __init__(self, store, value_serde, step, send_old: bool = True):
        self.store = store
        self.value_serde = value_serde
        self.step = step              # the operator that owns it (errors name it)
        # False: no consumer reads ``Change.old`` (``reads_old_values``): it is not deserialized
        self.send_old = send_old
        self.new_bytes = None         # the bytes of the last update's new value

    def update(self, kb: bytes, new, timestamp: int):
        """Store ``new`` for ``kb``; the Change to forward, or None when the row is unchanged."""
        old_raw = self.store.get(kb)
        if new is None:
            if old_raw is None:
                return None
            self.store.delete(kb)
            self.new_bytes = None
            return Change(None, self._old(old_raw))
        nb = self.step.serialize(self.value_serde, new, "join result")
        if old_raw is not None and old_raw[timestamped.TIMESTAMP_SIZE:] == nb:
            return None
        self.store.put(kb, timestamped.encode(timestamp, nb))
        self.new_bytes = nb
        return Change(new, None if old_raw is None else self._old(old_raw))

    def _old(self, old_raw):
        return self.value_serde.deserialize(old_raw[timestamped.TIMESTAMP_SIZE:]) if self.send_old else None

    def emit(self, forward, key, change, timestamp: int) -> None:
        """``forward(key, change, timestamp)`` for the Change ``update`` just returned; meanwhile
        the context names the stored bytes as its new value's (a sink reached through
        value-preserving steps writes them instead of serializing the value again)."""
        ctx = self.step.context
        saved = ctx.source_value, ctx.source_value_bytes, ctx.source_value_serde
        ctx.source_value, ctx.source_value_bytes, ctx.source_value_serde = change.new, self.new_bytes, self.value_serde
        try:
            forward(key, change, timestamp)
        finally:
            ctx.source_value, ctx.source_value_bytes, ctx.source_value_serde = saved


class TableJoinSide(Processor):
    """One side (``left`` or ``right``) of a primary-key table-table join."""

    kind = "table-join"

    def __init__(self, name, side, other_node, joiner, how, result_store, key_serde, value_serde):
        super().__init__(name)
        if how not in HOWS:
            raise ValueError(f"how must be one of {HOWS}")
        self.side = side
        self.other_node = other_node
        self.joiner = joiner
        self.how = how
        self.result_store = result_store
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.unchanged_skipped = 0

    def init(self, context):
        super().init(context)
        self.other = table_getter(self.other_node, context)
        self.result = MaterializedResult(context.get_store(self.result_store), self.value_serde, self)

    def process(self, key, change, timestamp):
        kb = self.serialize(self.key_serde, key, "key")
        row = self.other.get(key, kb)
        other = None if row is None else row[0]
        if self.side == "left":
            new = join_values(self.how, self.joiner, change.new, other, self)
        else:
            new = join_values(self.how, self.joiner, other, change.new, self)
        ts = timestamp if row is None else max(timestamp, row[1])
        out = self.result.update(kb, new, ts)
        if out is None:
            self.unchanged_skipped += 1
        else:
            self.forward(key, out, ts)

    def metrics(self):
        return {"unchanged_skipped": self.unchanged_skipped}


class TableSelfJoin(Processor):
    """``table.join(table, joiner)`` after the self-join rewrite: ``joiner(v, v)`` per change.

    Inner, left and outer are the same here: the two sides of a row are always both present or
    both absent, so every kind of join yields ``joiner(v, v)`` exactly when ``v`` exists."""

    kind = "table-self-join"

    def __init__(self, name, joiner, value_serde):
        super().__init__(name)
        self.joiner = joiner
        self.value_serde = value_serde
        self.unchanged_skipped = 0

    def _join(self, v):
        return join_values("inner", self.joiner, v, v, self)

    def process(self, key, change, timestamp):
        new = self._join(change.new)
        old = self._join(change.old)
        if (new is None and old is None) or (
                new is not None and old is not None
                and self.value_serde.serialize(new) == self.value_serde.serialize(old)):
            self.unchanged_skipped += 1
            return
        self.forward(key, Change(new, old), timestamp)

    def metrics(self):
        return {"unchanged_skipped": self.unchanged_skipped}


class StreamTableJoin(Processor):
    """``stream.join(table)`` / ``left_join``: each stream record looks up the table's current
    row for its key. Inner: no row, no output (``no_match``); left: ``joiner(v, None)``. The
    output carries the stream record's timestamp (as in Kafka Streams). A record with a null
    value is dropped (``skipped_null_value``); one with a null key cannot be looked up: a left
    join forwards ``joiner(v, None)`` (KIP-962), an inner join drops it (``skipped_null_key``).
    Table updates trigger nothing."""

    kind = "stream-table-join"

    def __init__(self, name, table_node, joiner, how, key_serde):
        super().__init__(name)
        if how not in ("inner", "left"):
            raise ValueError("a stream-table join is inner or left")
        self.table_node = table_node
        self.joiner = joiner
        self.how = how
        self.key_serde = key_serde
        self.no_match = 0
        self.skipped_null_key = 0
        self.skipped_null_value = 0

    def init(self, context):
        super().init(context)
        self.table = table_getter(self.table_node, context)

    def process(self, key, value, timestamp):
        if value is None:            # Kafka Streams' KStreamKTableJoinProcessor.maybeDropRecord
            self.skipped_null_value += 1
            return
        if key is None:
            if self.how != "left":
                self.skipped_null_key += 1
                return
            row = None               # KIP-962: a left join forwards it, joined with nothing
        else:
            row = self.table.get(key, self.serialize(self.key_serde, key, "key"))
        if row is None and self.how == "inner":
            self.no_match += 1
            return
        try:
            out = self.joiner(value, None if row is None else row[0])
        except Exception as exc:
            raise self.user_error(self.joiner, exc) from exc
        self.forward(key, out, timestamp)

    def metrics(self):
        return {"no_match": self.no_match, "skipped_null_key": self.skipped_null_key,
                "skipped_null_value": self.skipped_null_value}


class SelfJoinValueGetter:
    """The result of a table joined with itself on its primary key: ``joiner(v, v)``."""

    def __init__(self, parent: ValueGetter, joiner: Callable[[Any, Any], Any], step: str):
        self.parent = parent
        self.joiner = joiner
        self.name = step   # the join's name, for error translation

    def get(self, key: Any, kb: bytes) -> Row | None:
        row = self.parent.get(key, kb)
        if row is None:
            return None
        v = row[0]
        out = join_values("inner", self.joiner, v, v, self)   # the join operator's own rule
        return None if out is None else (out, row[1])
