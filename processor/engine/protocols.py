"""What a host gives the engine: a store provider, a record collector and a wall clock.

The worker (``processor/runtime``: RocksDB databases, a Kafka producer), the test driver
(``processor/testing.py``: memory stores, in-memory topics) and the Spark backfill
(``backfill/task_run.py``: memory stores written out as SST files, rows for other tasks) each
implement these; ``Task`` and the operators see nothing else, so the three run the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from processor.state.store import KeyValueStore


class StoreProvider(Protocol):
    """One task's stores (one column family each in the worker) and its local checkpoint."""

    writer: object  # provenance (topic, partition, offset) of the record in hand, for changelog headers
    stores: dict    # name -> the stores opened so far
    # None, or the task's journal: every store (opened so far and from now on) appends
    # ``(store, key, previous entry)`` to it before a write, and ``store.undo(key, previous)``
    # puts the entry back (a failed record leaves no write behind)
    journal: list | None

    def store(self, name: str) -> KeyValueStore: ...

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
