"""Commit record codec (a contract): what one committed unit of a task covers.

The last record a task writes in each commit unit goes to its task changelog
(``<application-id>-__task-<sub-topology>-changelog``) under the key ``COMMIT_KEY`` of the
task store, and into the local task store in the same RocksDB batch. It names the input
positions the state reflects and, per changelog partition of the task, the end offset (the
offset after the last record) of that changelog as of this unit. Changelog records at or after
those ends were written by a unit that never committed (a crash between producing the changelog
and producing this record): restore does not apply them and the next unit writes the current
value of each of their keys again, so a later replay from any committed point is exact.

Layout::

    {version = 1}{8-byte BE unit number}
    {2-byte BE position count} then per input partition:
        {2-byte BE topic length}{topic UTF-8}{4-byte BE partition}{8-byte BE next offset}
    {2-byte BE changelog count} then per changelog partition:
        {2-byte BE topic length}{topic UTF-8}{4-byte BE partition}{8-byte BE end offset}
"""

from __future__ import annotations

import struct
from typing import NamedTuple

VERSION = 1
COMMIT_KEY = b"commit"
_HEAD = struct.Struct(">BQ")
_U16 = struct.Struct(">H")
_ENTRY = struct.Struct(">iq")


class CommitRecord(NamedTuple):
    unit: int
    positions: dict      # (topic, partition) -> next input offset
    changelog_ends: dict  # (changelog topic, partition) -> end offset


def _encode_map(m: dict) -> list[bytes]:
    out = [_U16.pack(len(m))]
    for (topic, part), off in sorted(m.items()):
        t = topic.encode("utf-8")
        out += [_U16.pack(len(t)), t, _ENTRY.pack(part, off)]
    return out


def encode(rec: CommitRecord) -> bytes:
    return b"".join([_HEAD.pack(VERSION, rec.unit), *_encode_map(rec.positions), *_encode_map(rec.changelog_ends)])


def decode(data: bytes) -> CommitRecord:
    if not data or data[0] != VERSION:
        raise ValueError(f"unknown commit record version {data[0] if data else None} (this build reads {VERSION})")
    _, unit = _HEAD.unpack_from(data)
    pos = _HEAD.size
    maps = []
    for _ in range(2):
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
        maps.append(m)
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} trailing bytes after the commit record")
    return CommitRecord(unit, maps[0], maps[1])
