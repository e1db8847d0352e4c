"""Last-emitted column codec (a contract): what an aggregate last forwarded for a key.

Every aggregate store ``<store>`` has a sibling column family ``<store>.emitted`` with, per key,
the bytes it last emitted, the timestamp those bytes carried, and when (on the emission policy's
clock) they were emitted. It is written in the same batch as the aggregate itself and the input
offsets, so after a crash both columns and the offsets agree and a replayed record re-emits.

Layout::

    {version = 1}{flags}{8-byte BE value timestamp}{8-byte BE emitted-at}{value bytes}
    flags: bit 0 = a value was emitted (clear: the last emission was a tombstone; no value bytes)

Unknown versions and flag bits are rejected.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

VERSION = 1
_HAS_VALUE = 1
_HEAD = struct.Struct(">BBqq")
HEADER_SIZE = _HEAD.size


class Emitted(NamedTuple):
    value: bytes | None     # None: the last emission was a tombstone
    timestamp: int          # the timestamp the emitted record carried
    emitted_at: int         # when it was emitted, on the policy's clock


def encode(value: bytes | None, timestamp: int, emitted_at: int) -> bytes:
    head = _HEAD.pack(VERSION, _HAS_VALUE if value is not None else 0, timestamp, emitted_at)
    return head if value is None else head + value


def decode(data: bytes) -> Emitted:
    if len(data) < HEADER_SIZE:
        raise ValueError(f"last-emitted entry too short ({len(data)} bytes)")
    version, flags, ts, at = _HEAD.unpack_from(data)
    if version != VERSION:
        raise ValueError(f"unknown last-emitted entry version {version} (this build reads {VERSION})")
    if flags & ~_HAS_VALUE:
        raise ValueError(f"unknown last-emitted entry flags {flags:#04x}")
    if flags & _HAS_VALUE:
        return Emitted(data[HEADER_SIZE:], ts, at)
    if len(data) != HEADER_SIZE:
        raise ValueError("a tombstone last-emitted entry carries value bytes")
    return Emitted(None, ts, at)


def value_of(data: bytes) -> bytes | None:
    """``decode(data).value``, checked as ``decode`` checks it (an entry with a value: a slice,
    no tuple built)."""
    if len(data) >= HEADER_SIZE and data[0] == VERSION and data[1] == _HAS_VALUE:
        return data[HEADER_SIZE:]
    return decode(data).value
