"""In-memory key-value store (test driver, backfill replay).

Invariant: ordered reads (`range`, `prefix`, `items`) see keys in bytewise order, exactly as
RocksDB's default comparator would. Point reads and writes go to a plain dict; the sorted key
index (sortedcontainers) is built on the first ordered read and kept up to date from then on,
so a store that is only ever read by key (most aggregate and table stores) never pays for
ordering until its contents are written out.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from processor.state.store import prefix_upper_bound

_MISSING = object()


class MemoryStore:
    def __init__(self, name: str):
        self.name = name
        self.journal: list | None = None   # see RocksDBStore: entries to undo one record's writes
        self._data: dict = {}
        self._sorted: SortedList | None = None  # built on the first ordered read

    def get(self, key):
        return self._data.get(key)

    def put(self, key, value):
        if self.journal is not None:
            self.journal.append((self, key, self._data.get(key, _MISSING)))
        if self._sorted is not None and key not in self._data:
            self._sorted.add(key)
        self._data[key] = value

    def delete(self, key):
        if self.journal is not None:
            self.journal.append((self, key, self._data.get(key, _MISSING)))
        if self._data.pop(key, _MISSING) is not _MISSING and self._sorted is not None:
            self._sorted.remove(key)

    def undo(self, key, previous) -> None:
        """Put ``key`` back as a journal entry found it (see ``RocksDBStore.undo``)."""
        journal, self.journal = self.journal, None
        try:
            if previous is _MISSING:
                self.delete(key)
            else:
                self.put(key, previous)
        finally:
            self.journal = journal

    def put_all(self, entries):
        for k, v in entries:
            if v is None:
                self.delete(k)
            else:
                self.put(k, v)

    def range(self, lo=None, hi=None):
        if self._sorted is None:
            self._sorted = SortedList(self._data)
        data = self._data
        for k in list(self._sorted.irange(lo, hi, inclusive=(True, False))):
            yield k, data[k]

    def prefix(self, prefix):
        return self.range(prefix, prefix_upper_bound(prefix))

    def items(self):
        return self.range()

    def __len__(self):
        return len(self._data)


class MemoryStores:
    """Store provider for a task whose state lives in memory only."""

    def __init__(self):
        self.stores: dict[str, MemoryStore] = {}
        self.checkpoint: dict[tuple[str, int], int] = {}
        self.writer = None  # provenance of the record in hand (unused: no changelog in memory)
        self.journal: list | None = None   # given to every store opened (see RocksDBStore)

    def store(self, name: str) -> MemoryStore:
        if name not in self.stores:
            s = self.stores[name] = MemoryStore(name)
            s.journal = self.journal
        return self.stores[name]

    def read_checkpoint(self) -> dict[tuple[str, int], int]:
        return dict(self.checkpoint)

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        self.checkpoint.update(offsets)

    def close(self) -> None:
        pass
