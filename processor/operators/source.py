"""Sources: deserialize a record's bytes; table sources also materialize it.

Invariant (table source): the store holds, per key, the latest value bytes read from the topic
and the timestamp of the last REAL change; the source forwards ``Change(new, old)`` exactly when
the key's value changes. An update whose value bytes equal the stored bytes is a no-op: nothing is
forwarded, the stored timestamp is kept, ``noop_updates_skipped`` counts it (KIP-557). A
tombstone for an absent key is likewise a no-op. Restoring from the source topic applies the same
rule without forwarding, so a restored store equals the one built by processing.
"""

from __future__ import annotations

import numbers

from processor.errors import DeserializationError, UserFunctionError, is_operational
from processor.operators import replay as replay_semantics
from processor.operators.base import Processor, describe_function
from processor.records import Change
from processor.state import timestamped
from processor.state.source_changelog import apply_table_record


class StreamSource(Processor):
    kind = "source"

    def __init__(self, name, topic, key_serde, value_serde, timestamp_extractor=None):
        super().__init__(name)
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.records_in = 0
        # fn(key, value, record_timestamp) -> event time in ms (None: the record's timestamp)
        self.timestamp_extractor = timestamp_extractor
        self._read_ahead = None   # (key bytes, value bytes, key, value) that event_time read

    def deserialize(self, key_bytes, value_bytes):
        try:
            key = self.key_serde.deserialize(key_bytes)
        except Exception as exc:
            if is_operational(exc):   # not the record's (a registry outage): never rejects it
                raise
            raise DeserializationError(f"key deserialization with {self.key_serde!r} failed: "
                                     f"{type(exc).__name__}: {exc}", step=self.name) from exc
        try:
            value = self.value_serde.deserialize(value_bytes)
        except Exception as exc:
            if is_operational(exc):
                raise
            raise DeserializationError(f"value deserialization with {self.value_serde!r} failed: "
                                     f"{type(exc).__name__}: {exc}", step=self.name) from exc
        return key, value

    def event_time(self, key_bytes, value_bytes, timestamp) -> int:
        """The record's event time by the timestamp extractor (which only sources that have one
        are asked): the time it has everywhere (ordering, windows, joins, grace, stream time,
        output timestamps). The extractor raising, or returning anything but a non-negative
        integer, makes the record a bad one (``UserFunctionError``: the on-error policy), never
        silently its broker timestamp. The record read here is not deserialized again by
        ``process_bytes``."""
        key, value = self.deserialize(key_bytes, value_bytes)
        self._read_ahead = (key_bytes, value_bytes, key, value)
        return extract_event_time(self.timestamp_extractor, key, value, timestamp, self.name)

    def _read(self, key_bytes, value_bytes):
        ahead = self._read_ahead
        if ahead is not None:
            self._read_ahead = None
            if ahead[0] is key_bytes and ahead[1] is value_bytes:
                return ahead[2], ahead[3]
        return self.deserialize(key_bytes, value_bytes)

    def process_bytes(self, key_bytes, value_bytes, timestamp):
        if self._read_ahead is None:   # (no timestamp extractor read it: the hot path, inline)
            key, value = self.deserialize(key_bytes, value_bytes)
        else:
            key, value = self._read(key_bytes, value_bytes)
        self.records_in += 1
        ctx = self.context
        ctx.source_value = value
        ctx.source_value_bytes = value_bytes
        ctx.source_value_serde = self.value_serde
        self.forward(key, value, timestamp)

    def metrics(self):
        return {"records_in": self.records_in}


def extract_event_time(fn, key, value, timestamp: int, step: str) -> int:
    """``fn(key, value, record_timestamp)``, checked: an event time is a non-negative integer
    of milliseconds; anything else (or an exception) is a ``UserFunctionError`` naming ``step``
    and the extractor (one rule for every source: a stream's, a table's, a global table's)."""
    try:
        ts = fn(key, value, timestamp)
    except Exception as exc:
        name = describe_function(fn)
        raise UserFunctionError(f"timestamp extractor {name} raised {type(exc).__name__}: {exc}",
                                step=step, function=name) from exc
    if type(ts) is not int or ts < 0:
        if isinstance(ts, numbers.Integral) and not isinstance(ts, bool) and int(ts) >= 0:
            return int(ts)   # numpy's integers, an int subclass
        name = describe_function(fn)
        raise UserFunctionError(f"timestamp extractor {name} returned {ts!r}: an event time must be a "
                                f"non-negative integer of milliseconds", step=step, function=name)
    return ts


class RequireKey(Processor):
    """Before a table's repartition topic: a record without a key is poison here, at the user's
    topic (dead-lettered by policy), never on the internal topic, where it would be fatal."""

    kind = "require-key"

    def process(self, key, value, timestamp):
        if key is None:
            raise DeserializationError("a table record needs a non-null key", step=self.name)
        self.forward(key, value, timestamp)


class TableSource(StreamSource):
    kind = "table-source"
    replay = replay_semantics.TABLE_SOURCE

    def __init__(self, name, topic, key_serde, value_serde, store_name, timestamp_extractor=None):
        super().__init__(name, topic, key_serde, value_serde, timestamp_extractor)
        self.store_name = store_name
        self.noop_updates_skipped = 0
        self.store = None

    def init(self, context):
        super().init(context)
        self.store = context.get_store(self.store_name)

    def process_bytes(self, key_bytes, value_bytes, timestamp):
        if self._read_ahead is None:
            key, value = self.deserialize(key_bytes, value_bytes)
        else:
            key, value = self._read(key_bytes, value_bytes)
        self.records_in += 1
        if key_bytes is None:
            raise DeserializationError("a table record needs a non-null key", step=self.name)
        # the old stored bytes, or False for a no-op (the rule a restore from the topic repeats)
        old = apply_table_record(self.store, key_bytes, value_bytes, timestamp)
        if old is False:
            self.noop_updates_skipped += 1
            return
        old_value = None if old is None else self.value_serde.deserialize(old[timestamped.TIMESTAMP_SIZE:])
        ctx = self.context
        ctx.source_value = value
        ctx.source_value_bytes = value_bytes
        ctx.source_value_serde = self.value_serde
        self.forward(key, Change(value, old_value), timestamp)

    def metrics(self):
        return {"records_in": self.records_in, "noop_updates_skipped": self.noop_updates_skipped}
