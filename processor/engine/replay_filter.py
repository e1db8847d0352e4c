"""Replay filter: an internal record is applied at most once, whatever upstream replays.

Invariant: the task's ``_bookkeeping`` store holds, per (input topic, source topic, source
partition), the highest ``(offset, sequence)`` of a provenance header (``processor/provenance.py``)
applied; the task writes the mark returned by ``check`` once the record is processed, so it
commits with the state the record changed. ``check`` returns ``False`` for a record at or below
its mark (a replay: dropped and counted as a duplicate).
"""

from __future__ import annotations

from typing import Literal

from processor import provenance
from processor.errors import DeserializationError
from processor.state.store import KeyValueStore

# the high-water mark entry to write once a record is processed: (key, value) in _bookkeeping
Mark = tuple[bytes, bytes]


class ReplayFilter:
    __slots__ = ("bookkeeping", "step", "_mark_keys")

    def __init__(self, bookkeeping: KeyValueStore, step: str):
        self.bookkeeping = bookkeeping
        self.step = step   # the task, named in a bad header's error
        # (input topic, source topic bytes, source partition) -> its mark key (a few per task)
        self._mark_keys: dict[tuple[str, bytes, int], bytes] = {}

    def check(self, topic: str, headers) -> Mark | Literal[False] | None:
        """``False`` for a record already applied; else the high-water mark entry to write once
        it is processed (None when the record carries no provenance)."""
        raw = provenance.find(headers)
        if raw is None:
            return None
        try:
            partition, offset, sequence, source = provenance.decode_raw(raw)
            mk = self._mark_keys.get((topic, source, partition))
            if mk is None:
                if len(self._mark_keys) >= 4096:   # (bounded: a topic's partitions, a few topics)
                    self._mark_keys.clear()
                mk = self._mark_keys[(topic, source, partition)] = provenance.mark_key(
                    topic, source.decode("utf-8"), partition)
        except ValueError as exc:
            raise DeserializationError(f"bad {provenance.HEADER} header: {exc}", step=self.step) from exc
        seen = self.bookkeeping.get(mk)
        if seen is not None and (offset, sequence) <= provenance.decode_mark(seen):
            return False
        return mk, provenance.encode_mark(offset, sequence)
