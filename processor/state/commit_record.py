"""Commit record codec (a contract): what one committed unit of a task covers.

The last record a task writes in each commit unit goes to its task changelog
(``<application-id>-__task-<sub-topology>-changelog``) under the key ``COMMIT_KEY`` of the
task store, and into the local task store in the same RocksDB batch. It names the input
positions the state reflects and, per changelog partition of the task, the end offset (the
offset after the last record) of that changelog as of this unit. Changelog records at or after
those ends were written by a unit that never committed (a crash between producing the changelog
and producing this record): restore does not apply them and the next unit writes the current
value of each of their keys again, so a later replay from any committed point is exact.

Version 2 also names, per partition of the task's table sinks (user topics fed by a table's
``to_stream()``), an offset below which none of the task's later records can be: every record
the task sends after this unit comes after it. After a crash the task reads its sinks from
there (``processor/runtime/sink_tails.py``). Absent (version 1, a backfill's commit, or a
topology without table sinks): nothing to read.

Layout::

    {version = 2}{8-byte BE unit number}
    {2-byte BE position count} then per input partition:
        {2-byte BE topic length}{topic UTF-8}{4-byte BE partition}{8-byte BE next offset}
    {2-byte BE changelog count} then per changelog partition:
        {2-byte BE topic length}{topic UTF-8}{4-byte BE partition}{8-byte BE end offset}
    {1 byte: 1 if sink ends follow, else 0}
    then {2-byte BE sink partition count} then per sink partition:
        {2-byte BE topic length}{topic UTF-8}{4-byte BE partition}{8-byte BE offset}

Version 1 (no sink byte and map) is still read.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

VERSION = 2
_READS = (1, 2)
COMMIT_KEY = b"commit"
_HEAD = struct.Struct(">BQ")
_U16 = struct.Struct(">H")
_ENTRY = struct.Struct(">iq")


class CommitRecord(NamedTuple):
    unit: int
    positions: dict      # (topic, partition) -> next input offset
    changelog_ends: dict  # (changelog topic, partition) -> end offset
    sink_ends: dict | None = None   # (table sink topic, partition) -> offset; None: none kept


def _encode_map(m: dict) -> list[bytes]:
    out = [_U16.pack(len(m))]
    for (topic, part), off in sorted(m.items()):
        t = topic.encode("utf-8")
        out += [_U16.pack(len(t)), t, _ENTRY.pack(part, off)]
    return out


def encode(rec: CommitRecord) -> bytes:
    """Version 1 when there are no sink ends (what an older build reads), else version 2."""
    if rec.sink_ends is None:
        return b"".join([_HEAD.pack(1, rec.unit), *_encode_map(rec.positions), *_encode_map(rec.changelog_ends)])
    return b"".join([_HEAD.pack(VERSION, rec.unit), *_encode_map(rec.positions), *_encode_map(rec.changelog_ends),
                     b"\x01", *_encode_map(rec.sink_ends)])


def decode(data: bytes) -> CommitRecord:
    if not data or data[0] not in _READS:
        raise ValueError(f"unknown commit record version {data[0] if data else None} (this build reads {_READS})")
    version, unit = _HEAD.unpack_from(data)
    pos = _HEAD.size
    positions, pos = _decode_map(data, pos)
    changelog_ends, pos = _decode_map(data, pos)
    sink_ends: dict | None = None
    if version == 1 or data[pos] == 0:   # (version 1 has no sink ends; else a flag byte)
        pos += version != 1
    else:
        sink_ends, pos = _decode_map(data, pos + 1)
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} trailing bytes after the commit record")
    return CommitRecord(unit, positions, changelog_ends, sink_ends)


def _decode_map(data: bytes, pos: int) -> tuple[dict, int]:
    """The map encoded at ``pos`` (``_encode_map``) and the position after it."""
    (n,) = _U16.unpack_from(data, pos)
    pos += 2
    m = {}
    for _ in range(n):
        (tl,) = _U16.unpack_from(data, pos)
        pos += 2
        topic = data[pos:pos + tl].decode("utf-8")
        pos += tl
        part, off = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        m[(topic, part)] = off
    return m, pos
