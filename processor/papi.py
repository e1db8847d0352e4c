"""The Processor API (Kafka Streams' ``org.apache.kafka.streams.processor.api``).

User processors with state stores and punctuation, attached with
``KStream.process(P, stores=[...])``.

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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from processor.records import Record

if TYPE_CHECKING:  # pragma: no cover
    from processor.errors import TopologyError
    from processor.functions import Punctuator
    from processor.serde import Serde

__all__ = ["Processor", "Record", "Stores", "StoreBuilder", "ProcessorContext", "KeyValueStore", "Cancellable",
           "ValueAndTimestamp", "ReadOnlyKeyValueStore", "ReadOnlyStoreError"]


class ValueAndTimestamp(NamedTuple):
    """A row of a key-value store with its timestamp (Kafka Streams' ``ValueAndTimestamp``).

    ``store.get_with_timestamp(key)`` returns one, or None for a key the store does not hold.
    The timestamp is that of the record (or punctuation) that wrote the row: for a DSL table's
    store, its last real change (no-op updates keep it).
    """

    value: Any
    timestamp: int


class ReadOnlyStoreError(Exception):
    """A write (``put``/``delete``) to a store a processor may only read.

    A DSL table's store connected with ``process(P, stores=[...])`` (Kafka Streams' read-only store decorators throw
    ``UnsupportedOperationException``). Raised in ``process()`` it is a ``UserFunctionError``
    naming the step, under the on-error policy; in a punctuation it is fatal.
    """


class Processor:
    """A user processor: subclass and override ``process``; ``init`` and ``close`` are optional.

    Kafka Streams: ``org.apache.kafka.streams.processor.api.Processor``. One instance per task,
    made by ``KStream.process(P, stores=[...])``.

    Example:
        >>> from processor import Processor, StreamsBuilder, Stores
        >>> from processor.testing import TopologyTestDriver
        >>> class Dedup(Processor):
        ...     def init(self, context):
        ...         self.ctx = context
        ...         self.seen = context.get_state_store("seen")
        ...     def process(self, record):
        ...         if self.seen.get(record.key) is None:
        ...             self.seen.put(record.key, record.value)
        ...             self.ctx.forward(record)
        >>> builder = StreamsBuilder()
        >>> builder.add_state_store(Stores.key_value("seen"))  # doctest: +ELLIPSIS
        <processor.dsl.builder.StreamsBuilder object at ...>
        >>> builder.stream("events").process(Dedup, stores=["seen"]).to("unique")
        >>> with TopologyTestDriver(builder.build()) as driver:
        ...     for key in ["a", "b", "a"]:
        ...         driver.pipe_input("events", key, 1, timestamp=1)
        ...     [r.key for r in driver.read_output("unique")]
        ['a', 'b']
    """

    def init(self, context: ProcessorContext) -> None:
        """Called once before the first record: keep ``context``, get stores, schedule punctuation.

        Args:
            context: The processor's context.
        """
        pass

    def process(self, record: Record) -> None:  # pragma: no cover
        """Processes one record; forwards what it produces with ``context.forward``.

        Args:
            record: The record (key, value, timestamp, headers).
        """
        raise NotImplementedError

    def close(self) -> None:
        """Called when the task closes."""
        pass


@dataclass(frozen=True)
class StoreBuilder:
    """What ``Stores.key_value`` / ``window`` / ``session`` return: a store for ``add_state_store``.

    Attributes:
        name: The store's name.
        key_serde: Its key serde.
        value_serde: Its value serde.
        kind: ``"kv"``, ``"window"`` or ``"session"``.
        retention_ms: A window or session store's retention.
        window_size_ms: A window store's window size.
        retain_duplicates: A window store keeps every put.
    """

    name: str
    key_serde: Any
    value_serde: Any
    kind: str = "kv"                 # kv | window | session
    retention_ms: int | None = None  # window / session stores
    window_size_ms: int | None = None
    retain_duplicates: bool = False

    def store_key_serde(self) -> Any:
        """The serde of the store's keys as stored.

        The window/session key codecs of ``processor/state/papi_window_key.py``; a key-value
        store's key serde.
        """
        from processor.state import papi_window_key

        if self.kind == "window":
            return papi_window_key.WindowStoreKeyCodec(self.key_serde, cast(int, self.window_size_ms),
                                                       cast(int, self.retention_ms), self.retain_duplicates)
        if self.kind == "session":
            return papi_window_key.SessionStoreKeyCodec(self.key_serde, cast(int, self.retention_ms))
        return self.key_serde


class Stores:
    """The stores of the Processor API (Kafka Streams: ``Stores``), for ``StreamsBuilder.add_state_store``."""

    @staticmethod
    def key_value(name: str, key_serde: Serde | None = None, value_serde: Serde | None = None) -> StoreBuilder:
        """A persistent key-value store (Kafka Streams: ``Stores.persistentTimestampedKeyValueStore``).

        Args:
            name: The store's name (not starting with ``_``).
            key_serde: Its key serde (default string).
            value_serde: Its value serde (default JSON).

        Returns:
            The store, for ``StreamsBuilder.add_state_store``.

        Raises:
            TopologyError: The name is empty or starts with ``_``.
        """
        from processor.errors import TopologyError
        from processor.serde import Serdes

        if not isinstance(name, str) or not name or name.startswith("_"):
            raise TopologyError(f"a store name is a non-empty string not starting with '_', not {name!r}")
        return StoreBuilder(name, key_serde or Serdes.string(), value_serde or Serdes.json())

    @staticmethod
    def window(name: str, retention_ms: int, window_size_ms: int, retain_duplicates: bool = False,
               key_serde: Serde | None = None, value_serde: Serde | None = None) -> StoreBuilder:
        """A persistent window store (Kafka Streams: ``Stores.persistentWindowStore``).

        ``put(key, value, window_start)``, ``fetch(key, from, to)``, ``fetch_all(from, to)``,
        ``backward_*``; entries expire ``retention_ms`` after the store's observed stream time
        (``processor/papi_windowed.py``).

        Args:
            name: The store's name.
            retention_ms: How long entries are kept, ``>= window_size_ms``.
            window_size_ms: The windows' size, ``>= 0``.
            retain_duplicates: Every put is a new entry (for stream-stream joins).
            key_serde: Its key serde (default string).
            value_serde: Its value serde (default JSON).

        Returns:
            The store, for ``StreamsBuilder.add_state_store``.

        Raises:
            TopologyError: A bad name, or sizes out of range.
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
    def session(name: str, retention_ms: int, key_serde: Serde | None = None,
                value_serde: Serde | None = None) -> StoreBuilder:
        """A persistent session store (Kafka Streams: ``Stores.persistentSessionStore``).

        ``put(Windowed(key, start, end), value)``, ``find_sessions(key, earliest_end,
        latest_start)``, ``remove(windowed)``, ``fetch(key)``; sessions expire ``retention_ms``
        after the store's observed stream time (the largest session end put).

        Args:
            name: The store's name.
            retention_ms: How long sessions are kept, ``>= 0``.
            key_serde: Its key serde (default string).
            value_serde: Its value serde (default JSON).

        Returns:
            The store, for ``StreamsBuilder.add_state_store``.

        Raises:
            TopologyError: A bad name, or a negative retention.
        """
        _check_store_name(name)
        from processor.serde import Serdes

        if not isinstance(retention_ms, int) or isinstance(retention_ms, bool) or retention_ms < 0:
            raise _topology_error(f"Stores.session({name!r}): retention_ms is an int >= 0, not {retention_ms!r}")
        return StoreBuilder(name, key_serde or Serdes.string(), value_serde or Serdes.json(), kind="session",
                            retention_ms=retention_ms)


def _topology_error(message: str) -> TopologyError:
    from processor.errors import TopologyError

    return TopologyError(message)


def _check_store_name(name: object) -> None:
    if not isinstance(name, str) or not name or name.startswith("_"):
        raise _topology_error(f"a store name is a non-empty string not starting with '_', not {name!r}")


class Cancellable:
    """``schedule()``'s result (Kafka Streams: ``Cancellable``).

    ``cancel()`` stops the punctuation for good: a schedule made again after a restore or a
    rebuild stays cancelled.
    """

    def __init__(self, on_cancel: Callable[[], None] | None = None):
        self.cancelled = False
        self._on_cancel = on_cancel

    def cancel(self) -> None:
        """Stops the punctuation (Kafka Streams: ``Cancellable#cancel``)."""
        if not self.cancelled:
            self.cancelled = True
            if self._on_cancel is not None:
                self._on_cancel()


class KeyValueStore:
    """A state store as a user processor sees it (Kafka Streams: ``TimestampedKeyValueStore``).

    Keys and values as objects, through the store's serdes; ``range(lo, hi)`` is inclusive of
    both ends (Kafka Streams'), in the order of the keys' bytes; ``prefix_scan(prefix)`` every
    key whose bytes start with the prefix's.
    """

    def __init__(self, name: str, raw: Any, key_serde: Any, value_serde: Any, clock: Callable[[], int]):
        self.name = name
        self._raw = raw
        self._ks = key_serde
        self._vs = value_serde
        self._clock = clock   # the timestamp of what is being processed

    def get(self, key: Any) -> Any:
        """The key's value, or None (Kafka Streams: ``KeyValueStore#get``)."""
        raw = self._raw.get(self._ks.serialize(key))
        return None if raw is None else self._vs.deserialize(raw[8:])

    def get_with_timestamp(self, key: Any) -> ValueAndTimestamp | None:
        """The key's value with the timestamp of what wrote it, or None (``TimestampedKeyValueStore#get``).

        Rows keep ``{8-byte timestamp}{value bytes}`` (``processor/state/timestamped.py``), in
        the changelog too: a restored store gives the same timestamps.
        """
        raw = self._raw.get(self._ks.serialize(key))
        if raw is None:
            return None
        from processor.state import timestamped

        ts, vb = timestamped.decode(raw)
        return ValueAndTimestamp(self._vs.deserialize(vb), ts)

    def put(self, key: Any, value: Any) -> None:
        """Sets the key's value, stamped with the current record's timestamp (``KeyValueStore#put``).

        Args:
            key: The key.
            value: The value; None deletes the key.
        """
        if value is None:
            self.delete(key)
            return
        from processor.state import timestamped

        self._raw.put(self._ks.serialize(key), timestamped.encode(self._clock(), self._vs.serialize(value)))

    def delete(self, key: Any) -> Any:
        """Deletes the key (Kafka Streams: ``KeyValueStore#delete``).

        Returns:
            The value it had, or None.
        """
        kb = self._ks.serialize(key)
        old = self._raw.get(kb)
        if old is not None:
            self._raw.delete(kb)
        return None if old is None else self._vs.deserialize(old[8:])

    def _pairs(self, it: Any) -> Iterator[tuple[Any, Any]]:
        for k, v in it:
            yield self._ks.deserialize(k), self._vs.deserialize(v[8:])

    def range(self, from_key: Any, to_key: Any) -> Iterator[tuple[Any, Any]]:
        """The rows with keys in ``[from_key, to_key]``, by key bytes (Kafka Streams: ``KeyValueStore#range``).

        Args:
            from_key: The first key (None: from the first row).
            to_key: The last key, inclusive (None: to the last row).

        Returns:
            ``(key, value)`` pairs.
        """
        lo = None if from_key is None else self._ks.serialize(from_key)
        hi = None if to_key is None else self._ks.serialize(to_key) + b"\x00"   # the next key: inclusive
        return self._pairs(self._raw.range(lo, hi))

    def prefix_scan(self, prefix: Any) -> Iterator[tuple[Any, Any]]:
        """The rows whose key bytes start with ``prefix``'s (Kafka Streams: ``KeyValueStore#prefixScan``).

        Args:
            prefix: A key (serialized with the key serde) or bytes.

        Returns:
            ``(key, value)`` pairs, by key bytes.
        """
        pb = prefix if isinstance(prefix, bytes) else self._ks.serialize(prefix)
        return self._pairs(self._raw.prefix(pb))

    def all(self) -> Iterator[tuple[Any, Any]]:
        """Every row, by key bytes (Kafka Streams: ``KeyValueStore#all``)."""
        return self._pairs(self._raw.items())


class ReadOnlyKeyValueStore(KeyValueStore):
    """A DSL table's store as a processor connected to it sees it (Kafka Streams: ``ReadOnlyKeyValueStore``).

    ``process(P, stores=[name])``: every read of ``KeyValueStore`` (the table's current rows and
    their timestamps), and ``put``/``delete`` raise ``ReadOnlyStoreError`` naming the store and
    the step (the table's operator alone writes its store).
    """

    def __init__(self, name: str, raw: Any, key_serde: Any, value_serde: Any, clock: Callable[[], int], step: str,
                 owner: str):
        super().__init__(name, raw, key_serde, value_serde, clock)
        self._step = step
        self._owner = owner

    def _refuse(self, what: str) -> ReadOnlyStoreError:
        return ReadOnlyStoreError(f"store {self.name!r} is read-only in {self._step}: it is the store of the "
                                  f"DSL table of {self._owner}, which process() may read but not {what}")

    def put(self, key: Any, value: Any) -> None:
        """Refused: raises ``ReadOnlyStoreError``."""
        raise self._refuse("put into")

    def delete(self, key: Any) -> Any:
        """Refused: raises ``ReadOnlyStoreError``."""
        raise self._refuse("delete from")


class ProcessorContext:
    """What ``Processor.init`` receives, one per processor instance, i.e. per task (``ProcessorContext``)."""

    def __init__(self, node: Any):
        self._node = node

    @property
    def task_id(self) -> str:
        """The task's id, ``<sub-topology>_<partition>`` (Kafka Streams: ``ProcessorContext#taskId``)."""
        return self._node.context.task_id

    @property
    def partition(self) -> int:
        """The task's partition."""
        return self._node.context.task_partition

    def forward(self, record: Record) -> None:
        """Sends ``record`` to the next operators: its key, value, timestamp and headers (``forward``)."""
        self._node.forward_record(record)

    def get_state_store(self, name: str) -> KeyValueStore:
        """A store connected to this processor, by name (Kafka Streams: ``ProcessorContext#getStateStore``).

        Args:
            name: A name given in ``process(P, stores=[...])``.

        Returns:
            The store: a ``KeyValueStore``, a read-only one for a DSL table's store, or a window
            or session store (``processor/papi_windowed.py``).
        """
        return self._node.user_store(name)

    def schedule(self, interval_ms: int, punctuation_type: str, callback: Punctuator) -> Cancellable:
        """Runs ``callback`` every ``interval_ms`` (Kafka Streams: ``ProcessorContext#schedule``).

        The rules of each clock are in this module's docstring.

        Args:
            interval_ms: The interval, in ms.
            punctuation_type: ``"stream"`` (stream time) or ``"wall"`` (wall-clock time).
            callback: ``(time in ms) -> None``.

        Returns:
            The schedule, to ``cancel()``.
        """
        return self._node.schedule(interval_ms, punctuation_type, callback)

    def current_stream_time_ms(self) -> int:
        """The task's stream time (Kafka Streams: ``ProcessorContext#currentStreamTimeMs``)."""
        return self._node.observed_time

    def current_system_time_ms(self) -> int:
        """The task's wall clock (Kafka Streams: ``ProcessorContext#currentSystemTimeMs``)."""
        return self._node.context.wall_clock()
