"""A task's outbox in its task store: the records of its last commit, kept until confirmed.

Invariant: from the commit that persists an outbox (in the same batch as the state that emitted
its records) until the next commit after the host flushed its collector, the task store holds
that outbox's records under ``outbox``, ``outbox/1``, ... (each entry one changelog record of at
most about ``OUTBOX_CHUNK_BYTES``, in the layout of ``processor/state/outbox.py``) and the number
of commits that persisted an outbox under ``outbox_counter``. A task that opens with entries
sends their records again (``load``); the receiving task drops the copies by provenance.
"""

from __future__ import annotations

from collections.abc import Iterator

from processor.state import outbox as outbox_codec
from processor.state.store import KeyValueStore

_OUTBOX = b"outbox"
_OUTBOX_COUNTER = b"outbox_counter"
# An outbox larger than this is kept in several entries (``outbox``, ``outbox/1``, ...): each is
# one changelog record, far below message.max.bytes.
OUTBOX_CHUNK_BYTES = 256 * 1024


def entry_key(i: int) -> bytes:
    return _OUTBOX if i == 0 else _OUTBOX + b"/%d" % i


def chunks(records: list, chunk_bytes: int = OUTBOX_CHUNK_BYTES) -> Iterator[list]:
    """``records`` in order, cut into runs of about ``chunk_bytes`` (encoded) each."""
    chunk: list = []
    size = 0
    for r in records:
        n = 64 + len(r[0]) + (len(r[1]) if r[1] else 0) + (len(r[2]) if r[2] else 0) + \
            sum(len(h[0]) + (len(h[1]) if h[1] else 0) + 8 for h in r[4] or ())
        if chunk and size + n > chunk_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append(r)
        size += n
    if chunk:
        yield chunk


class StoredOutbox:
    """The outbox entries of one task store. ``counter``: commits that persisted an outbox."""

    def __init__(self, task_store: KeyValueStore, chunk_bytes: int = OUTBOX_CHUNK_BYTES):
        self.task_store = task_store
        self.chunk_bytes = chunk_bytes
        raw = task_store.get(_OUTBOX_COUNTER)
        self.counter = 0 if raw is None else int.from_bytes(raw, "big")
        self.unconfirmed = False    # its records were sent; the next commit removes the entries
        self._keys: list[bytes] = []

    def load(self) -> list:
        """The records of the entries in the store (a crash left them: maybe not delivered)."""
        records: list = []
        for i in range(1 << 30):   # the entry and its chunks (entry_key)
            raw = self.task_store.get(entry_key(i))
            if raw is None:
                break
            self._keys.append(entry_key(i))
            records += outbox_codec.decode(raw)
        return records

    def confirm(self) -> None:
        """The host flushed the collector since the records were sent: remove the entries."""
        if self.unconfirmed:
            for k in self._keys:
                self.task_store.delete(k)
            self._keys = []
            self.unconfirmed = False

    def persist(self, records: list, counter: int) -> None:
        """Write ``records`` (stamped with ``counter``, the commit's number) as pending writes."""
        self.counter = counter
        for i, chunk in enumerate(chunks(records, self.chunk_bytes)):
            self.task_store.put(entry_key(i), outbox_codec.encode(chunk))
            self._keys.append(entry_key(i))
        self.task_store.put(_OUTBOX_COUNTER, counter.to_bytes(8, "big"))
