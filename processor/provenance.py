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
# Headers this product writes; sinks never copy them onward (a sink writes its own). The second
# is the foreign-key join's echo (processor/serde/subscription.py); the third marks the records of
# a table sink (below): a topology reading such a topic must not pass it on as its own.
INTERNAL_HEADERS = frozenset({HEADER, "processor.fk.subscription", "processor.origin"})
_HEAD = struct.Struct(">BiqI")


class Provenance(NamedTuple):
    topic: str
    partition: int
    offset: int
    sequence: int


pack_head = _HEAD.pack   # pack_head(VERSION, partition, offset, sequence) + topic bytes: the header


def encode(topic: str, partition: int, offset: int, sequence: int) -> bytes:
    return _HEAD.pack(VERSION, partition, offset, sequence) + topic.encode("utf-8")


def decode(data: bytes) -> Provenance:
    partition, offset, seq, topic = decode_raw(data)
    return Provenance(topic.decode("utf-8"), partition, offset, seq)


def decode_raw(data: bytes) -> tuple[int, int, int, bytes]:
    """``(partition, offset, sequence, source topic bytes)`` of a header (``decode`` without the
    topic's decoding: the replay filter decodes a source topic once per partition)."""
    if len(data) < _HEAD.size:
        raise ValueError(f"{HEADER} header too short ({len(data)} bytes)")
    version, partition, offset, seq = _HEAD.unpack_from(data)
    if version != VERSION:
        raise ValueError(f"unknown {HEADER} header version {version} (this build reads {VERSION})")
    return partition, offset, seq, data[_HEAD.size:]


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
    return f"hwm\x00{input_topic}\x00{source_topic}\x00{source_partition}".encode()


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


# -- origin of a table sink's records ---------------------------------------------------------------
# Every record a task writes to a user topic that carries a table (a sink fed straight by a table's
# ``to_stream()``) carries the header ``processor.origin``, naming the application, the task and
# the input record that caused it::
#
#     {version = 1}{2-byte BE sub-topology}{4-byte BE task partition}{8-byte BE input offset}
#     {2-byte BE application id length}{application id, UTF-8}{input topic, UTF-8}
#
# (input offset -1 and an empty topic: no input record caused it: a punctuation, a flush, or the
# convergence step). A task that reopens after a crash reads its table sinks from the ends its last
# commit record names and tells its own records from everyone else's by this header
# (``processor/runtime/sink_tails.py``, docs/semantics.md "What a crash costs").
ORIGIN_HEADER = "processor.origin"
ORIGIN_VERSION = 1
_ORIGIN_HEAD = struct.Struct(">BHi")
_ORIGIN_OFFSET = struct.Struct(">q")
_U16 = struct.Struct(">H")


class Origin(NamedTuple):
    application_id: str
    sub_topology: int
    partition: int
    topic: str        # "" when no input record caused the record
    offset: int       # -1 likewise


def origin_parts(application_id: str, sub_topology: int, partition: int) -> tuple[bytes, bytes]:
    """The constant head and application part of a task's origin headers (``encode_origin``)."""
    app = application_id.encode("utf-8")
    return _ORIGIN_HEAD.pack(ORIGIN_VERSION, sub_topology, partition), _U16.pack(len(app)) + app


def encode_origin(head: bytes, app: bytes, topic_bytes: bytes, offset: int) -> bytes:
    return b"".join((head, _ORIGIN_OFFSET.pack(offset), app, topic_bytes))


def decode_origin(data: bytes) -> Origin:
    if len(data) < _ORIGIN_HEAD.size + 10:
        raise ValueError(f"{ORIGIN_HEADER} header too short ({len(data)} bytes)")
    version, sub, partition = _ORIGIN_HEAD.unpack_from(data)
    if version != ORIGIN_VERSION:
        raise ValueError(f"unknown {ORIGIN_HEADER} header version {version} (this build reads {ORIGIN_VERSION})")
    pos = _ORIGIN_HEAD.size
    (offset,) = _ORIGIN_OFFSET.unpack_from(data, pos)
    pos += 8
    (n,) = _U16.unpack_from(data, pos)
    pos += 2
    app = data[pos:pos + n].decode("utf-8")
    return Origin(app, sub, partition, data[pos + n:].decode("utf-8"), offset)


def find_origin(headers) -> bytes | None:
    if headers:
        for k, v in headers:
            if k == ORIGIN_HEADER:
                return v
    return None
