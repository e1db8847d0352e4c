"""Window store key codec (a contract): windows ordered by start time, then key.

Layout::

    {8-byte BE window start (ms, >= 0)}{key bytes}

Time first, so the windows that close when stream time advances are one range scan from the
beginning of the store, and a (window, key) lookup is a point get. Window starts are never
negative (as in Kafka Streams, windows that would start before 0 are not created).
"""

from __future__ import annotations

import struct

_START = struct.Struct(">q")
START_SIZE = 8


def encode(start: int, key: bytes) -> bytes:
    return _START.pack(start) + key


def decode(data: bytes) -> tuple[int, bytes]:
    if len(data) < START_SIZE:
        raise ValueError(f"window store key too short ({len(data)} bytes)")
    return _START.unpack_from(data)[0], data[START_SIZE:]


def start_bound(start: int) -> bytes:
    """Upper bound (exclusive) of all keys of windows starting before ``start``."""
    return _START.pack(start)


class WindowStoreKeySerde:
    """Read-only views of a window store: ``Windowed(key, start, end)`` <-> store key bytes."""

    def __init__(self, inner, size_ms: int):
        self.inner = inner
        self.size_ms = size_ms

    def serialize(self, key) -> bytes:
        return encode(key.start, self.inner.serialize(key.key))

    def deserialize(self, data: bytes):
        from processor.records import Windowed

        start, kb = decode(data)
        return Windowed(self.inner.deserialize(kb), start, start + self.size_ms)
