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

from processor.config import StreamsConfig
from processor.engine.task import Task, dlq_topic_for
from processor.errors import ConfigError
from processor.records import OutputRecord
from processor.state import emitted as emitted_codec
from processor.state import timestamped
from processor.state.memory import MemoryStores


class _MemoryCollector:
    def __init__(self, driver):
        self._driver = driver

    def send(self, topic, key, value, timestamp, headers, partition=None):
        # one partition per topic here: an explicit partition is always 0 (the task's own)
        self._driver._deliver(topic, key, value, timestamp, headers)

    def flush(self):
        pass


def _same_serde(a, b) -> bool:
    return a is b or (type(a) is type(b) and getattr(a, "__dict__", None) == getattr(b, "__dict__", None))


class ReadOnlyStore:
    """Read-only, deserialized view of a store: ``get(key)``, ``get_with_timestamp(key)``, ``items()``."""

    def __init__(self, spec, stores: list):
        self.name = spec.name
        self.kind = spec.kind
        self._key_serde = spec.key_serde
        self._value_serde = spec.value_serde
        self._stores = stores

    def _raw(self, key):
        kb = self._key_serde.serialize(key)
        for s in self._stores:
            v = s.get(kb)
            if v is not None:
                return v
        return None

    def _decode(self, raw):
        if self.kind in ("version", "subscription"):  # internal bookkeeping: raw bytes
            return raw, None
        if self.kind == "emitted":
            e = emitted_codec.decode(raw)
            return (None if e.value is None else self._value_serde.deserialize(e.value)), e.timestamp, e.emitted_at
        ts, vb = timestamped.decode(raw)
        return self._value_serde.deserialize(vb), ts

    def get(self, key):
        """The value; for a last-emitted column ``(value, timestamp, emitted_at)``."""
        v = self._raw(key)
        if v is None:
            return None
        d = self._decode(v)
        return d if self.kind == "emitted" else d[0]

    def get_with_timestamp(self, key):
        """``(value, timestamp)`` or None."""
        v = self._raw(key)
        return None if v is None else self._decode(v)[:2]

    def items(self):
        """``[(key, value)]`` in key-byte order (last-emitted column: ``(key, (value, ts, emitted_at))``)."""
        rows = sorted((k, v) for s in self._stores for k, v in s.items())
        return [(self._key_serde.deserialize(k), self._decode(v) if self.kind == "emitted" else self._decode(v)[0])
                for k, v in rows]

    def __len__(self):
        return sum(1 for s in self._stores for _ in s.items())


class TopologyTestDriver:
    def __init__(self, topology, application_id: str = "test-app", on_error: str = "dlq",
                 initial_wall_clock_ms: int = 0, topics=None):
        """``topics``: the user topics that exist, for a topic extractor's sink (``to(extractor)``
        sends only to one that does; default: every topic exists, as in Kafka Streams' driver).
        ``on_error`` is validated as the worker's (``processor.config.StreamsConfig``)."""
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
        collector = _MemoryCollector(self)
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
    def pipe_input(self, topic: str, key, value, timestamp: int | None = None, headers=None) -> None:
        """Serialize with the source's serdes and process, to completion."""
        if topic in self._global_of_topic:
            g = self._global_of_topic[topic]
            kb, vb = g.key_serde.serialize(key), None if value is None else g.value_serde.serialize(value)
            self.pipe_raw(topic, kb, vb, timestamp, headers)
            return
        if topic not in self._sub_of_topic:
            raise ConfigError(f"topic {topic!r} is not a source of this topology "
                              f"(sources: {sorted(self._sub_of_topic)})")
        node = self.topology.source_node(topic)
        kb = node.attrs.key_serde.serialize(key)
        vb = node.attrs.value_serde.serialize(value)
        self.pipe_raw(topic, kb, vb, timestamp, headers)

    def pipe_raw(self, topic: str, key: bytes | None, value: bytes | None, timestamp: int | None = None,
                 headers=None) -> None:
        """Process a record given as bytes (for poison-record tests)."""
        ts = self.wall_clock_ms if timestamp is None else timestamp
        if topic in self._global_of_topic:   # a global table's record: applied at once, as a host's
            from processor.engine.global_tables import apply_global_record

            apply_global_record(self.global_stores[self._global_of_topic[topic].name],
                                self._global_of_topic[topic], key, value, ts)
            return
        self._queue.append((topic, key, value, ts, headers))
        self._drain()

    def _deliver(self, topic, key, value, ts, headers):
        self._topics[topic].append((key, value, ts, tuple(headers or ())))
        if topic in self._sub_of_topic:
            self._queue.append((topic, key, value, ts, headers))

    def _drain(self):
        while self._queue:
            topic, kb, vb, ts, headers = self._queue.popleft()
            offset = self._offsets[topic]
            self._offsets[topic] += 1
            task = self.tasks[self._sub_of_topic[topic]]
            task.process(topic, 0, offset, ts, kb, vb, headers)
            task.commit()

    def advance_wall_clock(self, ms: int) -> None:
        """Move the wall clock and run wall-clock punctuation (``Emit.every(n, clock="wall")``)."""
        self.wall_clock_ms += ms
        for task in self.tasks:
            task.punctuate_wall(self.wall_clock_ms)
            task.commit()
            self._drain()

    def flush(self) -> None:
        """Forward every deferred emission now, as a graceful shutdown does."""
        for task in self.tasks:
            task.flush()
            task.commit()
            self._drain()

    # -- output --------------------------------------------------------------------------------
    def read_output(self, topic: str, key_serde=None, value_serde=None) -> list[OutputRecord]:
        """Deserialize and drain everything written to ``topic`` so far."""
        recs = self._topics.pop(topic, [])
        # a topic named by a topic extractor: read with that sink's serdes
        sinks = self.topology.sink_nodes(topic) or [n for n in self.topology.nodes
                                                    if n.kind == "sink" and n.attrs.extractor is not None]
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

    def get_store(self, name: str) -> ReadOnlyStore:
        """A store by name: a task store (all tasks' partitions) or a global table's; a
        Processor API window or session store gives its reads (``fetch``, ``fetch_all``,
        ``find_sessions``...) and ``raw()``."""
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

    def metrics(self) -> dict:
        out = {}
        for t in self.tasks:
            out.update(t.metrics())
        return out

    def close(self) -> None:
        """Flush deferred emissions (as a graceful shutdown does) and close the tasks."""
        if not self._closed:
            self._closed = True
            try:
                self.flush()
            finally:
                for t in self.tasks:
                    t.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
