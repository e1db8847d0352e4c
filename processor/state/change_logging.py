"""Change-logging stores: the write side of a changelog, around any store provider.

Invariant: between two commits, ``ChangeLoggingStore.changes`` names every key written through
the store since the last commit, once, in the order of its first write, with the provenance
``(topic, partition, offset)`` of the record that wrote it last; the value to log is what the
inner store reads for the key now (``None``: a tombstone). ``ChangeLoggingStores.commit`` clears
the changes once the inner provider has committed. A write undone through the task's journal
(``processor/engine/task.py``) leaves the changes as they were before it.

The wrapper knows nothing of Kafka or RocksDB: the worker wraps each task's ``RocksDBDatabase``
and its ``ChangelogWriter`` (``processor/runtime/changelog.py``) produces ``changed()``; writes
that must not be logged (a restore applying changelog records) go to the inner provider, as do
the writes of a store whose source topic is its changelog (``unlogged``).
"""

from __future__ import annotations

_MISSING = object()


class ChangeLoggingStore:
    """A store whose writes are remembered for the changelog (see the module invariant)."""

    def __init__(self, inner, provider: ChangeLoggingStores):
        self.name = inner.name
        self.inner = inner
        self.changes: dict[bytes, tuple | None] = {}   # key -> provenance of its last writer
        self._provider = provider
        self._journal: list | None = None
        # reads go straight to the inner store
        self.get = inner.get
        self.range = inner.range
        self.prefix = inner.prefix
        self.items = inner.items

    @property
    def journal(self) -> list | None:
        return self._journal

    @journal.setter
    def journal(self, journal: list | None) -> None:
        self._journal = journal
        self.inner.journal = journal

    def put(self, key, value):
        if self._journal is not None:
            self._journal.append((self, key, self.changes.get(key, _MISSING)))
        self.changes[key] = self._provider.writer
        self.inner.put(key, value)

    def delete(self, key):
        if self._journal is not None:
            self._journal.append((self, key, self.changes.get(key, _MISSING)))
        self.changes[key] = self._provider.writer
        self.inner.delete(key)

    def put_all(self, entries):
        entries = list(entries)
        writer = self._provider.writer
        changes = self.changes
        journal = self._journal
        for k, _ in entries:
            if journal is not None:
                journal.append((self, k, changes.get(k, _MISSING)))
            changes[k] = writer
        self.inner.put_all(entries)

    def undo(self, key, previous) -> None:
        """Forget the change a journal entry recorded (the inner store undoes its own entry)."""
        if previous is _MISSING:
            self.changes.pop(key, None)
        else:
            self.changes[key] = previous

    def changed(self):
        """``(key, value or None, writer provenance)`` for every key written since the last commit."""
        get = self.inner.get
        return [(k, get(k), w) for k, w in self.changes.items()]


class ChangeLoggingStores:
    """A store provider (``processor/engine/protocols.py``) whose stores log their changes."""

    def __init__(self, inner, unlogged=()):
        self.inner = inner
        # stores whose changelog is their source topic (processor/state/source_changelog.py):
        # handed out as the inner store, their writes logged nowhere
        self.unlogged = frozenset(unlogged)
        self._unlogged_open: set[str] = set()
        self.stores: dict[str, ChangeLoggingStore] = {}
        self.writer: tuple | None = None   # provenance of the record in hand, set by the task
        self._journal: list | None = None

    @property
    def journal(self) -> list | None:
        return self._journal

    @journal.setter
    def journal(self, journal: list | None) -> None:
        self._journal = journal
        self.inner.journal = journal
        for name in self._unlogged_open:
            self.inner.store(name).journal = journal

    def store(self, name: str) -> ChangeLoggingStore:
        s = self.stores.get(name)
        if s is None:
            if name in self.unlogged:
                self._unlogged_open.add(name)
                inner = self.inner.store(name)
                inner.journal = self._journal
                return inner
            s = self.stores[name] = ChangeLoggingStore(self.inner.store(name), self)
            s.journal = self._journal
        return s

    def has_changes(self) -> bool:
        return any(s.changes for s in self.stores.values())

    def read_checkpoint(self) -> dict[tuple[str, int], int]:
        return self.inner.read_checkpoint()

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        self.inner.commit(offsets)
        for s in self.stores.values():
            s.changes.clear()

    def close(self) -> None:
        self.stores.clear()
        self.inner.close()
