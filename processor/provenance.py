"""Provenance header of internal records (a contract): which input record caused this one.

Every record a task writes to an internal topic (repartition now; subscription and response
topics of joins) carries the header ``processor.source``::

    {version = 1}{4-byte BE source partition}{8-byte BE source offset}{4-byte BE sequence}{source topic, UTF-8}

``sequence`` numbers the internal records one input record caused (0, 1, ...), in the order it
caused them; processing is deterministic, so a replayed input record produces the same records
with the same sequence numbers. The receiving task keeps, per (its input topic, source topic,
source partition), the highest ``(offset, sequence)`` it has applied, committed with its stores,
and drops anything at or below it: a replay upstream can then never be applied twice
downstream, whatever the broker does with duplicates. Records without the header (emissions of
a wall-clock punctuation or a shutdown flush, which no input record caused) are always applied.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

HEADER = "processor.source"
VERSION = 1
# Headers only internal topics carry; sinks never copy them onward (a sink to an internal topic
# writes its own). The second is the foreign-key join's echo (processor/serde/subscription.py).
INTERNAL_HEADERS = frozenset({HEADER, "processor.fk.subscription"})
_HEAD = struct.Struct(">BiqI")


class Provenance(NamedTuple):
    topic: str
    partition: int
    offset: int
    sequence: int


def encode(topic: str, partition: int, offset: int, sequence: int) -> bytes:
    return _HEAD.pack(VERSION, partition, offset, sequence) + topic.encode("utf-8")


def decode(data: bytes) -> Provenance:
    if len(data) < _HEAD.size:
        raise ValueError(f"{HEADER} header too short ({len(data)} bytes)")
    version, partition, offset, seq = _HEAD.unpack_from(data)
    if version != VERSION:
        raise ValueError(f"unknown {HEADER} header version {version} (this build reads {VERSION})")
    return Provenance(data[_HEAD.size:].decode("utf-8"), partition, offset, seq)


def find(headers) -> bytes | None:
    """The raw ``processor.source`` header value, or None."""
    if headers:
        for k, v in headers:
            if k == HEADER:
                return v
    return None


# High-water mark entry in the task store: {8-byte BE offset}{4-byte BE sequence}
_MARK = struct.Struct(">qI")


def mark_key(input_topic: str, source_topic: str, source_partition: int) -> bytes:
    return f"hwm\x00{input_topic}\x00{source_topic}\x00{source_partition}".encode("utf-8")


def mark_source(key: bytes) -> str | None:
    """The source topic of a high-water mark key (``mark_key``); None for any other key."""
    if not key.startswith(b"hwm\x00"):
        return None
    parts = key.split(b"\x00")
    return parts[2].decode("utf-8") if len(parts) == 4 else None


def encode_mark(offset: int, sequence: int) -> bytes:
    return _MARK.pack(offset, sequence)


def decode_mark(data: bytes) -> tuple[int, int]:
    return _MARK.unpack(data)
