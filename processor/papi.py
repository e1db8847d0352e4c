"""The Processor API (Kafka Streams' ``org.apache.kafka.streams.processor.api``): user processors
with state stores and punctuation, attached with ``KStream.process(P, stores=[...])``.

    from processor import Processor, Record, Stores

    class Dedup(Processor):
        def init(self, context):
            self.ctx = context
            self.seen = context.get_state_store("seen")
        def process(self, record):
            if self.seen.get(record.key) is None:
                self.seen.put(record.key, record.value)
                self.ctx.forward(record)

    builder.add_state_store(Stores.key_value("seen", key_serde=Serdes.string(), value_serde=Serdes.json()))
    stream.process(Dedup, stores=["seen"]).to("unique")

Invariants:
- A store added with ``Stores.key_value`` is a key-value store like every other one: its
  changelog, restore, checkpoint, ``/stores``, ``processor state dump`` and the backfill treat it
  alike. Each entry holds the value bytes behind the 8-byte timestamp of the record (or
  punctuation) that wrote it; ``get_with_timestamp`` returns both (``ValueAndTimestamp``).
- A DSL table's store connected with ``process(P, stores=[name])`` is the table's own store,
  read through ``ReadOnlyKeyValueStore``: every read, and ``put``/``delete`` raise
  ``ReadOnlyStoreError`` (the table's operator alone writes it). The processor looks the table
  up (``LogicalNode.lookups``), so it is in the table's sub-topology, co-partitioned with it.
- ``context.schedule(interval, "stream", cb)``: ``cb(stream_time)`` runs when the task's stream
  time (Kafka Streams': the largest timestamp of the task's input records, the current one
  included, whether or not it reaches this processor; kept in the task's bookkeeping with each
  schedule's next time, and committed with the state) reaches the next punctuation time, once
  per advance, however many intervals it jumped (the next time is then the first interval
  boundary after it), as Kafka Streams' ``PunctuationSchedule``: the first at the first record.
  It runs right after the task has processed the record that advanced stream time, and its
  forwards go out with that record's. ``"wall"``: ``cb(now)`` when the task's wall clock reaches
  ``now + interval`` from the schedule, then every ``interval``, missed intervals skipped alike;
  its forwards are records outside an input record. A punctuation that raises is fatal on
  either clock (it is no record's doing: nothing to dead-letter). A failed record leaves stream
  time where it was (all or nothing). Schedules are made again in ``init``, numbered in the
  order they are made: a task whose operators were rebuilt after a failed record continues each
  schedule where it was (or leaves it cancelled); a restored task does so for stream schedules,
  while its wall schedules start their interval again (Kafka Streams keeps none across a
  restart). A ``cancel()`` made while processing a record that then fails is undone with the
  record for a stream schedule (its state is the task's), kept for a wall schedule.
- ``process()`` raising is a ``UserFunctionError`` under the on-error policy, all or nothing:
  its store writes are undone and its forwards dropped when the record is dead-lettered or
  skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from processor.records import Record

__all__ = ["Processor", "Record", "Stores", "StoreBuilder", "ProcessorContext", "KeyValueStore", "Cancellable",
           "ValueAndTimestamp", "ReadOnlyKeyValueStore", "ReadOnlyStoreError"]


class ValueAndTimestamp(NamedTuple):
    """A row of a key-value store with its timestamp (Kafka Streams' ``ValueAndTimestamp``):
    ``store.get_with_timestamp(key)`` returns one, or None for a key the store does not hold.
    The timestamp is that of the record (or punctuation) that wrote the row: for a DSL table's
    store, its last real change (no-op updates keep it).
    """

    value: Any
    timestamp: int


class ReadOnlyStoreError(Exception):
    """A write (``put``/``delete``) to a store a processor may only read: a DSL table's store
    connected with ``process(P, stores=[...])`` (Kafka Streams' read-only store decorators throw
    ``UnsupportedOperationException``). Raised in ``process()`` it is a ``UserFunctionError``
    naming the step, under the on-error policy; in a punctuation it is fatal.
    """


class Processor:
    """Subclass and override ``process``; ``init`` and ``close`` are optional."""

    def init(self, context: ProcessorContext) -> None:
        pass

    def process(self, record: Record) -> None:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class StoreBuilder:
    """What ``Stores.key_value`` / ``window`` / ``session`` return: a store for
    ``StreamsBuilder.add_state_store``.
    """

    name: str
    key_serde: Any
    value_serde: Any
    kind: str = "kv"                 # kv | window | session
    retention_ms: int | None = None  # window / session stores
    window_size_ms: int | None = None
    retain_duplicates: bool = False

    def store_key_serde(self):
        """The serde of the store's keys as stored (the window/session key codecs of
        ``processor/state/papi_window_key.py``; a key-value store's key serde).
        """
        from processor.state import papi_window_key

        if self.kind == "window":
            return papi_window_key.WindowStoreKeyCodec(self.key_serde, self.window_size_ms, self.retention_ms,
                                                       self.retain_duplicates)
        if self.kind == "session":
            return papi_window_key.SessionStoreKeyCodec(self.key_serde, self.retention_ms)
        return self.key_serde


class Stores:
    @staticmethod
    def key_value(name: str, key_serde=None, value_serde=None) -> StoreBuilder:
        """A persistent key-value store (serdes default to string keys and JSON values)."""
        from processor.errors import TopologyError
        from processor.serde import Serdes

        if not isinstance(name, str) or not name or name.startswith("_"):
            raise TopologyError(f"a store name is a non-empty string not starting with '_', not {name!r}")
        return StoreBuilder(name, key_serde or Serdes.string(), value_serde or Serdes.json())

    @staticmethod
    def window(name: str, retention_ms: int, window_size_ms: int, retain_duplicates: bool = False,
               key_serde=None, value_serde=None) -> StoreBuilder:
        """A persistent window store (Kafka Streams' ``Stores.persistentWindowStore``):
        ``put(key, value, window_start)``, ``fetch(key, from, to)``, ``fetch_all(from, to)``,
        ``backward_*``; entries expire ``retention_ms`` after the store's observed stream time
        (``processor/papi_windowed.py``). ``retention_ms >= window_size_ms >= 0``.
        """
        _check_store_name(name)
        from processor.serde import Serdes

        for what, v in (("retention_ms", retention_ms), ("window_size_ms", window_size_ms)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise _topology_error(f"Stores.window({name!r}): {what} is an int >= 0, not {v!r}")
        if window_size_ms > retention_ms:
            raise _topology_error(f"Stores.window({name!r}): the retention period ({retention_ms} ms) must be "
                                  f"no smaller than the window size ({window_size_ms} ms)")
        return StoreBuilder(name, key_serde or Serdes.string(), value_serde or Serdes.json(), kind="window",
                            retention_ms=retention_ms, window_size_ms=window_size_ms,
                            retain_duplicates=bool(retain_duplicates))

    @staticmethod
    def session(name: str, retention_ms: int, key_serde=None, value_serde=None) -> StoreBuilder:
        """A persistent session store (Kafka Streams' ``Stores.persistentSessionStore``):
        ``put(Windowed(key, start, end), value)``, ``find_sessions(key, earliest_end,
        latest_start)``, ``remove(windowed)``, ``fetch(key)``; sessions expire ``retention_ms``
        after the store's observed stream time (the largest session end put).
        """
        _check_store_name(name)
        from processor.serde import Serdes

        if not isinstance(retention_ms, int) or isinstance(retention_ms, bool) or retention_ms < 0:
            raise _topology_error(f"Stores.session({name!r}): retention_ms is an int >= 0, not {retention_ms!r}")
        return StoreBuilder(name, key_serde or Serdes.string(), value_serde or Serdes.json(), kind="session",
                            retention_ms=retention_ms)


def _topology_error(message: str):
    from processor.errors import TopologyError

    return TopologyError(message)


def _check_store_name(name) -> None:
    if not isinstance(name, str) or not name or name.startswith("_"):
        raise _topology_error(f"a store name is a non-empty string not starting with '_', not {name!r}")


class Cancellable:
    """``schedule()``'s result: ``cancel()`` stops the punctuation (for good: a schedule made
    again after a restore or a rebuild stays cancelled).
    """

    def __init__(self, on_cancel: Callable[[], None] | None = None):
        self.cancelled = False
        self._on_cancel = on_cancel

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if self._on_cancel is not None:
                self._on_cancel()


class KeyValueStore:
    """A state store as a user processor sees it: keys and values as objects, through the
    store's serdes; ``range(lo, hi)`` is inclusive of both ends (Kafka Streams'), in the order
    of the keys' bytes; ``prefix_scan(prefix)`` every key whose bytes start with the prefix's.
    """

    def __init__(self, name, raw, key_serde, value_serde, clock: Callable[[], int]):
        self.name = name
        self._raw = raw
        self._ks = key_serde
        self._vs = value_serde
        self._clock = clock   # the timestamp of what is being processed

    def get(self, key):
        raw = self._raw.get(self._ks.serialize(key))
        return None if raw is None else self._vs.deserialize(raw[8:])

    def get_with_timestamp(self, key) -> ValueAndTimestamp | None:
        """The key's value with the timestamp of what wrote it, or None (Kafka Streams'
        ``TimestampedKeyValueStore.get``). Rows keep ``{8-byte timestamp}{value bytes}``
        (``processor/state/timestamped.py``), in the changelog too: a restored store gives the
        same timestamps.
        """
        raw = self._raw.get(self._ks.serialize(key))
        if raw is None:
            return None
        from processor.state import timestamped

        ts, vb = timestamped.decode(raw)
        return ValueAndTimestamp(self._vs.deserialize(vb), ts)

    def put(self, key, value) -> None:
        if value is None:
            self.delete(key)
            return
        from processor.state import timestamped

        self._raw.put(self._ks.serialize(key), timestamped.encode(self._clock(), self._vs.serialize(value)))

    def delete(self, key):
        kb = self._ks.serialize(key)
        old = self._raw.get(kb)
        if old is not None:
            self._raw.delete(kb)
        return None if old is None else self._vs.deserialize(old[8:])

    def _pairs(self, it):
        for k, v in it:
            yield self._ks.deserialize(k), self._vs.deserialize(v[8:])

    def range(self, from_key, to_key):
        lo = None if from_key is None else self._ks.serialize(from_key)
        hi = None if to_key is None else self._ks.serialize(to_key) + b"\x00"   # the next key: inclusive
        return self._pairs(self._raw.range(lo, hi))

    def prefix_scan(self, prefix):
        pb = prefix if isinstance(prefix, bytes) else self._ks.serialize(prefix)
        return self._pairs(self._raw.prefix(pb))

    def all(self):
        return self._pairs(self._raw.items())


class ReadOnlyKeyValueStore(KeyValueStore):
    """A DSL table's store as a processor connected to it sees it (``process(P,
    stores=[name])``): every read of ``KeyValueStore`` (the table's current rows and their
    timestamps), and ``put``/``delete`` raise ``ReadOnlyStoreError`` naming the store and the
    step (the table's operator alone writes its store).
    """

    def __init__(self, name, raw, key_serde, value_serde, clock, step: str, owner: str):
        super().__init__(name, raw, key_serde, value_serde, clock)
        self._step = step
        self._owner = owner

    def _refuse(self, what: str):
        return ReadOnlyStoreError(f"store {self.name!r} is read-only in {self._step}: it is the store of the "
                                  f"DSL table of {self._owner}, which process() may read but not {what}")

    def put(self, key, value) -> None:
        raise self._refuse("put into")

    def delete(self, key):
        raise self._refuse("delete from")


class ProcessorContext:
    """What ``Processor.init`` receives (one per processor instance, i.e. per task)."""

    def __init__(self, node):
        self._node = node

    @property
    def task_id(self) -> str:
        return self._node.context.task_id

    @property
    def partition(self) -> int:
        return self._node.context.task_partition

    def forward(self, record: Record) -> None:
        """Send ``record`` to the next operators (its key, value, timestamp and headers)."""
        self._node.forward_record(record)

    def get_state_store(self, name: str) -> KeyValueStore:
        return self._node.user_store(name)

    def schedule(self, interval_ms: int, punctuation_type: str, callback: Callable[[int], None]) -> Cancellable:
        """``punctuation_type``: ``"stream"`` (stream time) or ``"wall"`` (wall-clock time)."""
        return self._node.schedule(interval_ms, punctuation_type, callback)

    def current_stream_time_ms(self) -> int:
        return self._node.observed_time

    def current_system_time_ms(self) -> int:
        return self._node.context.wall_clock()
