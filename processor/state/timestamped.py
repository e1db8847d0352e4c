"""Store value codec (a contract, shared by the worker, the driver and the backfill).

Layout::

    {8-byte big-endian signed timestamp (ms)}{value bytes}

``value bytes`` are exactly the value serde's bytes. The layout itself carries no version byte
(it is fixed by docs/architecture.md); the format version of a whole database is kept in its ``__meta``
column family and checked when the database is opened.
"""

from __future__ import annotations

import struct

_TS = struct.Struct(">q")
TIMESTAMP_SIZE = 8


def encode(timestamp: int, value: bytes) -> bytes:
    return _TS.pack(timestamp) + value


def decode(data: bytes) -> tuple[int, bytes]:
    if len(data) < TIMESTAMP_SIZE:
        raise ValueError(f"timestamped store value too short ({len(data)} bytes)")
    return _TS.unpack_from(data)[0], data[TIMESTAMP_SIZE:]


def timestamp_of(data: bytes) -> int:
    return _TS.unpack_from(data)[0]
