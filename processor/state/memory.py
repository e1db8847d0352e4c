"""In-memory key-value store (test driver, backfill replay). Keys kept sorted (sortedcontainers)."""

from __future__ import annotations

from sortedcontainers import SortedDict

from processor.state.store import prefix_upper_bound


class MemoryStore:
    def __init__(self, name: str):
        self.name = name
        self._data = SortedDict()

    def get(self, key):
        return self._data.get(key)

    def put(self, key, value):
        self._data[key] = value

    def delete(self, key):
        self._data.pop(key, None)

    def put_all(self, entries):
        for k, v in entries:
            if v is None:
                self._data.pop(k, None)
            else:
                self._data[k] = v

    def range(self, lo=None, hi=None):
        for k in list(self._data.irange(lo, hi, inclusive=(True, False))):
            yield k, self._data[k]

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

    def store(self, name: str) -> MemoryStore:
        if name not in self.stores:
            self.stores[name] = MemoryStore(name)
        return self.stores[name]

    def read_checkpoint(self) -> dict[tuple[str, int], int]:
        return dict(self.checkpoint)

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        self.checkpoint.update(offsets)

    def close(self) -> None:
        pass
