"""Sliding-window store key codec (a contract): one key's windows together, ordered by start.

Layout::

    {key bytes}{8-byte BE window start (ms, >= 0)}

Key first, so the windows a record of a key meets (starts within ``[ts - 2 * diff, ts + 1]``)
are one range scan. The key's length is the entry's length minus 8, so a scan by a key's bytes
skips the entries of longer keys sharing that prefix. A window is ``[start, start + diff]``, both
ends inclusive (KIP-450).
"""

from __future__ import annotations

import struct

_START = struct.Struct(">q")
START_SIZE = 8


def encode(key: bytes, start: int) -> bytes:
    return key + _START.pack(start)


def decode(data: bytes) -> tuple[bytes, int]:
    """``(key bytes, start)``."""
    if len(data) < START_SIZE:
        raise ValueError(f"sliding window store key too short ({len(data)} bytes)")
    return data[:-START_SIZE], _START.unpack_from(data, len(data) - START_SIZE)[0]


class SlidingStoreKeySerde:
    """Read-only views of a sliding-window store: ``Windowed(key, start, start + diff)``."""

    def __init__(self, inner, diff_ms: int):
        self.inner = inner
        self.diff_ms = diff_ms

    def serialize(self, key) -> bytes:
        return encode(self.inner.serialize(key.key), key.start)

    def deserialize(self, data: bytes):
        from processor.records import Windowed

        kb, start = decode(data)
        return Windowed(self.inner.deserialize(kb), start, start + self.diff_ms)
