"""TopologyTestDriver: deterministic, broker-free execution of a topology.

It drives the same ``Task`` code as the worker, with in-memory topics and stores, a commit after
every input record, and a wall clock that moves only when told (``advance_wall_clock``, which
runs wall-clock punctuation). ``close()`` (also on leaving a ``with`` block) flushes deferred
emissions, as a graceful worker shutdown does; the output stays readable after it.
Records a topology sends to one of its own source topics (internal topics) are fed back in
before ``pipe_input`` returns, so processing is synchronous: after ``pipe_input`` returns, every
consequence of that record is in the output topics.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from processor.config import StreamsConfig
from processor.engine.task import Task, dlq_topic_for
from processor.errors import ConfigError
from processor.graph import SinkAttrs
from processor.records import OutputRecord
from processor.state import emitted as emitted_codec
from processor.state import timestamped
from processor.state.memory import MemoryStores

if TYPE_CHECKING:  # pragma: no cover
    from processor.engine.protocols import RecordCollector
    from processor.papi_windowed import ReadOnlyWindowedStore
    from processor.serde import Serde
    from processor.topology import StoreSpec, Topology


class _MemoryCollector:
    def __init__(self, driver: TopologyTestDriver):
        self._driver = driver

    def send(self, topic: str, key: bytes | None, value: bytes | None, timestamp: int, headers: Any,
             partition: int | None = None) -> None:
        self._driver._deliver(topic, key, value, timestamp, headers)

    def flush(self) -> None:
        pass


def _same_serde(a: object, b: object) -> bool:
    return a is b or (type(a) is type(b) and getattr(a, "__dict__", None) == getattr(b, "__dict__", None))


class ReadOnlyStore:
    """A read-only, deserialized view of a key-value store (Kafka Streams: ``ReadOnlyKeyValueStore``).

    What ``TopologyTestDriver.get_store`` returns for a table's, an aggregate's or a Processor
    API key-value store: over every task's partition of it.

    Attributes:
        name: The store's name.
        kind: The store's kind (``"kv"``, ``"aggregate"``, ``"emitted"``...).
    """

    def __init__(self, spec: StoreSpec, stores: list[Any]):
        self.name = spec.name
        self.kind = spec.kind
        self._key_serde: Any = spec.key_serde
        self._value_serde: Any = spec.value_serde
        self._stores = stores

    def _raw(self, key: Any) -> bytes | None:
        kb = self._key_serde.serialize(key)
        for s in self._stores:
            v = s.get(kb)
            if v is not None:
                return v
        return None

    def _decode(self, raw: bytes) -> tuple[Any, ...]:
        if self.kind in ("version", "subscription"):  # internal bookkeeping: raw bytes
            return raw, None
        if self.kind == "emitted":
            e = emitted_codec.decode(raw)
            return (None if e.value is None else self._value_serde.deserialize(e.value)), e.timestamp, e.emitted_at
        ts, vb = timestamped.decode(raw)
        return self._value_serde.deserialize(vb), ts

    def get(self, key: Any) -> Any:
        """The key's value, or None (Kafka Streams: ``ReadOnlyKeyValueStore#get``).

        Args:
            key: The key.

        Returns:
            The value; for a last-emitted column ``(value, timestamp, emitted_at)``.
        """
        v = self._raw(key)
        if v is None:
            return None
        d = self._decode(v)
        return d if self.kind == "emitted" else d[0]

    def get_with_timestamp(self, key: Any) -> tuple[Any, ...] | None:
        """The key's value with its timestamp (Kafka Streams: ``TimestampedKeyValueStore#get``).

        Args:
            key: The key.

        Returns:
            ``(value, timestamp)``, or None.
        """
        v = self._raw(key)
        return None if v is None else self._decode(v)[:2]

    def items(self) -> list[tuple[Any, Any]]:
        """Every row, in key-byte order (Kafka Streams: ``ReadOnlyKeyValueStore#all``).

        Returns:
            ``[(key, value)]`` (last-emitted column: ``(key, (value, ts, emitted_at))``).
        """
        rows = sorted((k, v) for s in self._stores for k, v in s.items())
        return [(self._key_serde.deserialize(k), self._decode(v) if self.kind == "emitted" else self._decode(v)[0])
                for k, v in rows]

    def __len__(self) -> int:
        return sum(1 for s in self._stores for _ in s.items())


class TopologyTestDriver:
    """Runs a topology without a broker, one record at a time (Kafka Streams: ``TopologyTestDriver``).

    The same ``Task`` code as the worker, with in-memory topics and stores; see this module's
    docstring for its clock and its flushing. Use it as a context manager, or call ``close()``.

    Attributes:
        topology: The topology, bound to ``application_id``.
        application_id: The application id (it names internal topics and the DLQ).
        dlq_topic: The dead-letter topic, readable with ``read_output``.
        wall_clock_ms: The wall clock, moved by ``advance_wall_clock``.

    Example:
        >>> from processor import StreamsBuilder
        >>> from processor.testing import TopologyTestDriver
        >>> builder = StreamsBuilder()
        >>> builder.stream("in").filter(lambda k, v: v % 2 == 0).to("even")
        >>> driver = TopologyTestDriver(builder.build())
        >>> for n in range(5):
        ...     driver.pipe_input("in", str(n), n, timestamp=n)
        >>> [(r.key, r.value, r.timestamp) for r in driver.read_output("even")]
        [('0', 0, 0), ('2', 2, 2), ('4', 4, 4)]
        >>> driver.read_output("even")   # read_output drains
        []
        >>> driver.close()
    """
    def __init__(self, topology: Topology, application_id: str = "test-app", on_error: str = "dlq",
                 initial_wall_clock_ms: int = 0, topics: Iterable[str] | None = None):
        """Starts one task per sub-topology of ``topology``, all on partition 0.

        Args:
            topology: What ``StreamsBuilder.build()`` returned.
            application_id: The application id.
            on_error: The on-error policy for bad records: ``"dlq"``, ``"skip"`` or ``"fail"``.
            initial_wall_clock_ms: The wall clock's start.
            topics: The user topics that exist, for a topic extractor's sink (``to(extractor)``
                sends only to one that does; default: every topic exists, as in Kafka Streams'
                driver).

        Raises:
            ConfigError: ``on_error`` is not a policy (validated as the worker's:
                ``processor.config.StreamsConfig``).
        """
        on_error = StreamsConfig(on_error=on_error).on_error
        topology = topology.for_application(application_id)
        self.topology = topology
        self.application_id = application_id
        self.dlq_topic = dlq_topic_for(application_id)
        self.wall_clock_ms = initial_wall_clock_ms
        self._topics: dict[str, list] = defaultdict(list)   # topic -> [(key, value, ts, headers)]
        self._offsets: dict[str, int] = defaultdict(int)
        self._queue: deque = deque()
        self._sub_of_topic = topology.subtopology_of_topic()
        collector: RecordCollector = _MemoryCollector(self)   # (mypy: the engine's protocol)
        # global tables: one store each, shared by every task, updated as their topics are piped
        from processor.state.memory import MemoryStore

        self.global_stores = {name: MemoryStore(name) for name in topology.global_stores}
        self._global_of_topic = {g.topic: g for g in topology.global_stores.values()}
        self.tasks = [
            Task(topology, sub, 0, MemoryStores(), collector, lambda: self.wall_clock_ms,
                 on_error=on_error, dlq_topic=self.dlq_topic,
                 topic_exists=None if topics is None else set(topics).__contains__,
                 global_stores=self.global_stores)
            for sub in range(len(topology.subtopologies))
        ]
        self._closed = False

    # -- input ---------------------------------------------------------------------------------
    def pipe_input(self, topic: str, key: Any, value: Any, timestamp: int | None = None,
                   headers: Iterable[tuple[str, bytes]] | None = None) -> None:
        """Serializes a record with its source's serdes and processes it, to completion (``TestInputTopic#pipeInput``).

        Args:
            topic: A source topic of the topology (or a global table's).
            key: The record's key.
            value: The record's value (None: a tombstone).
            timestamp: Its timestamp in ms (default: the wall clock).
            headers: Its headers, ``(name, bytes)`` pairs.

        Raises:
            ConfigError: ``topic`` is no source of the topology.
        """
        if topic in self._global_of_topic:
            g = self._global_of_topic[topic]
            kb, vb = g.key_serde.serialize(key), None if value is None else g.value_serde.serialize(value)
            self.pipe_raw(topic, kb, vb, timestamp, headers)
            return
        if topic not in self._sub_of_topic:
            raise ConfigError(f"topic {topic!r} is not a source of this topology "
                              f"(sources: {sorted(self._sub_of_topic)})")
        node = self.topology.source_node(topic)
        attrs: Any = node.attrs   # a source's: SourceAttrs
        kb = attrs.key_serde.serialize(key)
        vb = attrs.value_serde.serialize(value)
        self.pipe_raw(topic, kb, vb, timestamp, headers)

    def pipe_raw(self, topic: str, key: bytes | None, value: bytes | None, timestamp: int | None = None,
                 headers: Iterable[tuple[str, bytes]] | None = None) -> None:
        """Processes a record given as bytes (for poison-record tests).

        Args:
            topic: A source topic of the topology (or a global table's).
            key: The key's bytes.
            value: The value's bytes.
            timestamp: Its timestamp in ms (default: the wall clock).
            headers: Its headers.
        """
        ts = self.wall_clock_ms if timestamp is None else timestamp
        if topic in self._global_of_topic:   # a global table's record: applied at once, as a host's
            from processor.engine.global_tables import apply_global_record

            apply_global_record(self.global_stores[self._global_of_topic[topic].name],
                                self._global_of_topic[topic], key, value, ts)
            return
        self._queue.append((topic, key, value, ts, headers))
        self._drain()

    def _deliver(self, topic: str, key: bytes | None, value: bytes | None, ts: int, headers: Any) -> None:
        self._topics[topic].append((key, value, ts, tuple(headers or ())))
        if topic in self._sub_of_topic:
            self._queue.append((topic, key, value, ts, headers))

    def _drain(self) -> None:
        while self._queue:
            topic, kb, vb, ts, headers = self._queue.popleft()
            offset = self._offsets[topic]
            self._offsets[topic] += 1
            task = self.tasks[self._sub_of_topic[topic]]
            task.process(topic, 0, offset, ts, kb, vb, headers)
            task.commit()

    def advance_wall_clock(self, ms: int) -> None:
        """Moves the wall clock and runs wall-clock punctuation (``TopologyTestDriver#advanceWallClockTime``).

        Args:
            ms: How far, in ms.
        """
        self.wall_clock_ms += ms
        for task in self.tasks:
            task.punctuate_wall(self.wall_clock_ms)
            task.commit()
            self._drain()

    def flush(self) -> None:
        """Forwards every deferred emission now, as a graceful shutdown does."""
        for task in self.tasks:
            task.flush()
            task.commit()
            self._drain()

    # -- output --------------------------------------------------------------------------------
    def read_output(self, topic: str, key_serde: Serde | None = None,
                    value_serde: Serde | None = None) -> list[OutputRecord]:
        """Deserializes and drains everything written to ``topic`` so far (``TestOutputTopic#readRecordsToList``).

        Args:
            topic: A topic the topology writes (or the DLQ).
            key_serde: The key serde (default: the sink's).
            value_serde: The value serde (default: the sink's).

        Returns:
            The records, oldest first.

        Raises:
            ConfigError: The topology does not write ``topic``, or its topic extractors' sinks
                have different serdes and none was given.
        """
        recs = self._topics.pop(topic, [])
        # a topic named by a topic extractor: read with that sink's serdes
        sinks: list[Any] = self.topology.sink_nodes(topic) or [
            n for n in self.topology.nodes if n.kind == "sink" and cast(SinkAttrs, n.attrs).extractor is not None]
        if key_serde is None or value_serde is None:
            if not sinks and topic != self.dlq_topic:
                raise ConfigError(f"topic {topic!r} is not written by this topology "
                                  f"(sinks: {self.topology.sink_topics()})")
            if not self.topology.sink_nodes(topic) and any(
                    not _same_serde(a.attrs.key_serde, b.attrs.key_serde) and key_serde is None or
                    not _same_serde(a.attrs.value_serde, b.attrs.value_serde) and value_serde is None
                    for a, b in zip(sinks, sinks[1:], strict=False)):
                raise ConfigError(f"topic {topic!r} is named by topic extractors whose sinks have different serdes "
                                  f"({', '.join(n.name for n in sinks)}): pass key_serde= and value_serde=")
            ks = key_serde or (sinks[0].attrs.key_serde if sinks else None)
            vs = value_serde or (sinks[0].attrs.value_serde if sinks else None)
        else:
            ks, vs = key_serde, value_serde
        out = []
        for kb, vb, ts, headers in recs:
            k = kb if ks is None else ks.deserialize(kb)
            v = vb if vs is None else vs.deserialize(vb)
            out.append(OutputRecord(k, v, ts, headers))
        return out

    def get_store(self, name: str) -> ReadOnlyStore | ReadOnlyWindowedStore:
        """A store by name, to read (Kafka Streams: ``TopologyTestDriver#getKeyValueStore``...).

        A task store (all tasks' partitions) or a global table's; a Processor API window or
        session store gives its reads (``fetch``, ``fetch_all``, ``find_sessions``...) and
        ``raw()``.

        Args:
            name: The store's name.

        Returns:
            The read-only store.

        Raises:
            ConfigError: No store has that name.
        """
        if name in self.topology.global_stores:
            return ReadOnlyStore(self.topology.global_stores[name], [self.global_stores[name]])
        if name not in self.topology.stores:
            raise ConfigError(f"no store named {name!r} (stores: "
                              f"{sorted(self.topology.stores) + sorted(self.topology.global_stores)})")
        spec = self.topology.stores[name]
        owners = [t for t in self.tasks if any(s.name == name for s in t.store_specs)]
        if spec.kind in ("window", "session"):   # Processor API window/session stores: their reads
            from processor import papi_windowed
            from processor.state.store import BOOKKEEPING_STORE

            task = owners[0]   # (one sub-topology, one partition here)
            cls = papi_windowed.WindowStore if spec.kind == "window" else papi_windowed.SessionStore
            raw = task.stores.store(name)
            return papi_windowed.ReadOnlyWindowedStore(
                spec.kind, cls(name, raw, task.stores.store(BOOKKEEPING_STORE), spec.key_serde, spec.value_serde,
                               lambda: 0), raw)
        return ReadOnlyStore(spec, [t.stores.store(name) for t in owners])

    def metrics(self) -> dict[str, dict[str, int]]:
        """The operators' counters (skipped records, dropped late records...), by operator name.

        Returns:
            ``{operator name: {counter: value}}``.
        """
        out: dict[str, dict[str, int]] = {}
        for t in self.tasks:
            out.update(t.metrics())
        return out

    def close(self) -> None:
        """Flushes deferred emissions (as a graceful shutdown does) and closes the tasks."""
        if not self._closed:
            self._closed = True
            try:
                self.flush()
            finally:
                for t in self.tasks:
                    t.close()

    def __enter__(self) -> TopologyTestDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
