"""Processor base class and the context every operator runs in.

A processor receives ``process(key, value, timestamp)`` and forwards zero or more records to its
children. Table processors receive and forward ``Change(new, old)`` values; stream processors
plain values. The context carries the provenance of the record in hand (topic, partition,
offset, headers) and gives access to stores and to the record collector.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from processor import provenance
from processor.engine.routing import Routing
from processor.errors import ConfigError, ProcessorError, SerializationError, UserFunctionError
from processor.operators import replay as replay_semantics


def describe_function(fn: Callable) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    code = getattr(fn, "__code__", None)
    if code is not None:
        return f"{name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"
    return name


def user_function_error(step: str, fn: Callable, exc: BaseException) -> ProcessorError:
    """The error for ``exc``, raised by user function ``fn`` in step ``step``: a
    ``UserFunctionError`` naming the step and the function (its file:line), or ``exc`` itself
    when it is already one of ours. The caller raises it ``from exc``.

    The one place a user function's failure is translated. Operators call user functions
    directly inside their own ``try`` (free in CPython 3.11+ until something raises) and build
    the error here; a wrapper closure around each function would add a Python call per record."""
    if isinstance(exc, ProcessorError):
        return exc
    name = describe_function(fn)
    return UserFunctionError(f"user function {name} raised {type(exc).__name__}: {exc}", step=step, function=name)


def _every_topic_exists(topic: str) -> bool:
    return True


class ProcessorContext:
    """Per-task context. The task sets the ``record_*`` fields before each record."""

    def __init__(self, task_id, stores, collector, wall_clock: Callable[[], int], partition: int = 0):
        self.task_id = task_id
        self.task_partition = partition   # the partition number this task owns
        self._stores = stores
        self.collector = collector
        self.wall_clock = wall_clock
        self.routing = Routing()      # the host's (processor/engine/routing.py); set by the Task
        # whether a user topic exists (a topic extractor's sink sends only to one that does); the
        # host's, set by the Task (the test driver's: every topic exists, as Kafka Streams')
        self.topic_exists: Callable[[str], bool] = _every_topic_exists
        self.global_stores: dict = {}   # {global store name: store}, the host's (set by the Task)
        self.stream_time = -1           # the task's stream time (kept by the Task)
        # wall-clock schedules' next times, {(operator, index): next or None once cancelled}: kept
        # by the task across its operators' rebuilds (not persisted: a new task starts them again)
        self.wall_schedules: dict = {}
        # Provenance of what is being processed: the input record's topic, partition and offset;
        # during a punctuation or flush, a synthetic one (``"__punctuation:<sub>"``, the task's
        # partition, the commit that will persist it) with ``in_record`` False.
        self.topic: str | None = None
        self.partition: int | None = None
        self.offset: int | None = None
        self.in_record = False
        self.headers: list[tuple[str, bytes]] | None = None
        self.sequence = 0            # internal records caused so far by the record in hand
        self.outbox: list = []       # internal records waiting for the next commit
        self.staged_topics: frozenset = frozenset()   # internal topics always sent through the outbox
        self.sends: list = []        # records of the record in hand, sent by the task once it is done
        # Pass-through serialization: the value object the source deserialized, its bytes and
        # serde. A sink fed only through value-preserving steps reuses the bytes.
        self.source_value: Any = None
        self.source_value_bytes: bytes | None = None
        self.source_value_serde = None
        # Set by a task whose table sinks mark their records (``processor.origin``): the header's
        # constant parts (``processor/provenance.py``); None: no header.
        self.origin_head: bytes | None = None
        self.origin_app = b""
        self._origin_topics: dict = {}

    def origin(self) -> bytes:
        """The ``processor.origin`` header of a record caused by what is being processed."""
        head, topic, offset = self.origin_head, self.topic, self.offset
        assert head is not None, "origin() is called only by a task whose table sinks mark their records"
        if not self.in_record or topic is None or offset is None:
            return provenance.encode_origin(head, self.origin_app, b"", -1)
        tb = self._origin_topics.get(topic)
        if tb is None:
            tb = self._origin_topics[topic] = topic.encode("utf-8")
        return provenance.encode_origin(head, self.origin_app, tb, offset)

    def get_store(self, name: str):
        return self._stores.store(name)

    def get_global_store(self, name: str):
        """A global table's store: the host's, shared by every task (read only to operators)."""
        store = self.global_stores.get(name)
        if store is None:
            raise ConfigError(f"task {self.task_id}: no global store {name!r} (the host holds "
                              f"{sorted(self.global_stores)})")
        return store

    def send(self, topic: str, key: bytes | None, value: bytes | None, timestamp: int, headers) -> None:
        """Send to a user topic. Held in ``sends`` until the record in hand (or the punctuation)
        has been processed: the task sends them then, or drops them if it failed."""
        self.sends.append((topic, key, value, timestamp, headers, None))

    def send_internal(self, topic: str, key, value, timestamp: int, headers, partition: int | None = None) -> None:
        """Send to an internal topic (``partition`` None: by the key's hash, as the producer's
        partitioner does). Outside an input record (punctuation, flush), and behind such a
        record, it goes to the task's outbox instead (``processor/state/outbox.py``); so do the
        records of ``staged_topics`` (set by a Task whose replay is not deterministic)."""
        if not self.in_record or self.outbox or topic in self.staged_topics:
            self.outbox.append((topic, key, value, timestamp, headers, partition))
        else:
            self.sends.append((topic, key, value, timestamp, headers, partition))


class Processor:
    """Base operator: a named node with children. Subclasses override ``process``."""

    kind = "processor"
    replay = replay_semantics.HISTORY

    def __init__(self, name: str):
        self.name = name
        self.children: list[Processor] = []
        # set by init(), before any record: an operator never runs without its context
        self.context: ProcessorContext = cast(ProcessorContext, None)

    def init(self, context: ProcessorContext) -> None:
        self.context = context

    def process(self, key: Any, value: Any, timestamp: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def forward(self, key: Any, value: Any, timestamp: int) -> None:
        for child in self.children:
            child.process(key, value, timestamp)

    def metrics(self) -> dict[str, int]:
        return {}

    # Optional hooks, called by the task: punctuate_wall(now_ms) as the wall clock moves, for a
    # processor that sets ``punctuates_wall``; flush() on graceful shutdown and partition
    # revocation (deferred emissions go out); punctuate_task_time(stream_time) after each record
    # that advanced the task's stream time, for a processor that sets ``punctuates_task_time`` (a
    # user processor: the DSL's own windows and emission policies run on their operator's stream
    # time, ``punctuates_stream``/``punctuate_stream``, as Kafka Streams' do).
    punctuates_wall = False
    punctuates_task_time = False
    # closed when the task rebuilds its operators after a failed record (a user processor)
    closes_on_rebuild = False

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def serialize(self, serde, value, what: str) -> bytes:
        """``serde.serialize(value)`` (of a value that is not None); a failure is a
        SerializationError naming this step (it follows the on_error policy: a user's value that
        its serde cannot write)."""
        try:
            return serde.serialize(value)
        except Exception as exc:
            raise self.serialize_error(serde, value, what, exc) from exc

    def serialize_error(self, serde, value, what: str, exc: BaseException) -> SerializationError:
        """The SerializationError of ``serialize`` (for hot paths that inline the call)."""
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return SerializationError(f"{what} {shown} does not serialize with {serde!r}: "
                                  f"{type(exc).__name__}: {exc}", step=self.name)

    def user_error(self, fn: Callable, exc: BaseException) -> ProcessorError:
        """``user_function_error`` for this step (the caller raises it ``from exc``)."""
        return user_function_error(self.name, fn, exc)


class MapperOperator(Processor):
    """An operator applying one user function, ``mapper``, to each record (map, select_key,
    flat_map, flat_map_values, map_values on a stream); it calls it inside its own ``try`` and
    translates a failure with ``user_error``."""

    def __init__(self, name: str, mapper: Callable):
        super().__init__(name)
        self.mapper = mapper
