"""Session store key codec (a contract; Kafka Streams' ``SessionKeySchema`` layout).

Layout::

    {key bytes}{8-byte BE session end (ms)}{8-byte BE session start (ms)}

Key first, so one key's sessions are one prefix scan, ordered by end (a record's candidates for
merging: the sessions of its key ending at or after ``ts - gap``). The key's length is the
entry's length minus 16, so a scan by a key's bytes skips the entries of longer keys sharing
that prefix. The end is the session's last record time (inclusive), the start its first.
"""

from __future__ import annotations

import struct

_TIMES = struct.Struct(">qq")
TIMES_SIZE = 16


def encode(key: bytes, start: int, end: int) -> bytes:
    return key + _TIMES.pack(end, start)


def decode(data: bytes) -> tuple[bytes, int, int]:
    """``(key bytes, start, end)``."""
    if len(data) < TIMES_SIZE:
        raise ValueError(f"session store key too short ({len(data)} bytes)")
    end, start = _TIMES.unpack_from(data, len(data) - TIMES_SIZE)
    return data[:-TIMES_SIZE], start, end


def end_bound(key: bytes, end: int) -> bytes:
    """The first possible entry of ``key`` whose session ends at or after ``end``."""
    return key + _TIMES.pack(end, 0)
