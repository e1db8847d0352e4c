"""The key-value store protocol every operator sees.

Keys and values are bytes. Iteration is in unsigned byte order of the keys. ``range(lo, hi)``
is half-open ``[lo, hi)``; ``hi=None`` means to the end. ``prefix(p)`` yields every key that
starts with ``p``. Writes made since the last commit are visible to reads at once; they reach
durable storage when the owning task commits (see ``RocksDBDatabase.commit``), together with the
input offsets they belong to.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable


@runtime_checkable
class KeyValueStore(Protocol):
    name: str

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def put_all(self, entries) -> None:
        """Write a batch of ``(key, value-or-None)`` pairs; ``None`` deletes."""

    def range(self, lo: bytes | None = None, hi: bytes | None = None) -> Iterator[tuple[bytes, bytes]]: ...

    def prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...

    def items(self) -> Iterator[tuple[bytes, bytes]]: ...


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


def merge_sorted(base: Iterator[tuple[bytes, bytes]], overlay: list[tuple[bytes, bytes | None]]):
    """Merge a sorted base iterator with a sorted overlay of pending writes (None = deleted)."""
    ov = iter(overlay)
    o = next(ov, None)
    for k, v in base:
        while o is not None and o[0] < k:
            if o[1] is not None:
                yield o
            o = next(ov, None)
        if o is not None and o[0] == k:
            if o[1] is not None:
                yield o
            o = next(ov, None)
        else:
            yield k, v
    while o is not None:
        if o[1] is not None:
            yield o
        o = next(ov, None)


# The task's host-local store (``__`` prefix: may differ between hosts): the outbox of records
# waiting for the next commit and the commit record.
TASK_STORE = "__task"
# The task's bookkeeping that decides future output, a contract column family like the stores
# (byte-identical between hosts after the same history): an aggregate's observed stream time, a
# stream join's time and purge marks, the high-water marks of internal topics. (The outbox and its
# counter, which numbers commits that sent records outside an input record, stay host-local.)
BOOKKEEPING_STORE = "_bookkeeping"
