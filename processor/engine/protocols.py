"""What a host gives the engine: a store provider, a record collector and a wall clock.

The worker (``processor/runtime``: RocksDB databases behind change-logging stores, a Kafka
producer), the test driver (``processor/testing.py``: memory stores, in-memory topics) and the
Spark backfill (``backfill/task_run.py``: memory stores written out as SST files, rows for other
tasks) each implement these; ``Task`` and the operators see nothing else, so the three run the
same code. ``Task``'s constructor is annotated with them, and the block at the end of this module
has mypy check that each host's classes provide them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from processor.state.store import KeyValueStore


class JournaledStore(KeyValueStore, Protocol):
    """A store a task can undo one record's writes in: before each write it appends
    ``(store, key, previous entry)`` to ``journal`` (when not None), and ``undo(key, previous)``
    puts the entry back."""

    journal: list | None

    def undo(self, key: bytes, previous: object) -> None: ...


class StoreProvider(Protocol):
    """One task's stores (one column family each in the worker) and its local checkpoint."""

    # provenance (topic, partition, offset) of the record in hand, for changelog headers
    writer: tuple | None
    stores: dict    # name -> the stores opened so far
    # None, or the task's journal: every store (opened so far and from now on) appends
    # ``(store, key, previous entry)`` to it before a write, and ``store.undo(key, previous)``
    # puts the entry back (a failed record leaves no write behind)
    journal: list | None

    def store(self, name: str) -> JournaledStore: ...

    def read_checkpoint(self) -> dict[tuple[str, int], int]: ...

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        """Persist every pending store write with ``offsets`` as one unit."""

    def close(self) -> None: ...


class RecordCollector(Protocol):
    """Where a task's records go: user sinks, internal topics, the dead-letter topic."""

    def send(self, topic: str, key: bytes | None, value: bytes | None, timestamp: int, headers,
             partition: int | None = None) -> None: ...

    def flush(self) -> None: ...


WallClock = Callable[[], int]   # milliseconds since the epoch


if TYPE_CHECKING:   # each host provides the protocols (checked by mypy, never run)
    from backfill.rows import RowCollector
    from processor.runtime.collector import KafkaCollector
    from processor.state.change_logging import ChangeLoggingStores
    from processor.state.memory import MemoryStores

    # (the test driver's collector is checked where it is made: ``processor/testing.py``)
    def _hosts_provide_the_protocols(worker_stores: ChangeLoggingStores, worker_collector: KafkaCollector,
                                     driver_and_backfill_stores: MemoryStores,
                                     backfill_collector: RowCollector) -> None:
        stores: list[StoreProvider] = [worker_stores, driver_and_backfill_stores]
        collectors: list[RecordCollector] = [worker_collector, backfill_collector]
        del stores, collectors
