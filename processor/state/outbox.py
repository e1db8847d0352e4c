"""Outbox codec (a contract): internal records a task must send, persisted with its state.

Records a task sends to internal topics outside an input record (a wall-clock punctuation, a
shutdown or revocation flush) cannot be reproduced by a replay: their content depends on when
they happened. So they are not sent at once: they wait in the task's outbox, are written in the
task store (key ``outbox``) in the SAME batch as the state that emitted them (the last-emitted
column), and are sent right after that commit; the entry is removed at the next commit, once
the host has flushed them to Kafka. A task that opens with an outbox entry sends it again; the
receiving task drops the copies by provenance. Internal records that follow an outbox record in
the same commit interval wait behind it, so per-partition order is kept. A sub-topology that
reads several topics sends all its repartition records this way (``Task(stage_internal=True)``:
its replay is not deterministic, see ``processor/engine/task.py``). An outbox larger than
``OUTBOX_CHUNK_BYTES`` is kept in several entries (``outbox``, ``outbox/1``, ...), each in this
layout (``processor/state/stored_outbox.py`` keeps the entries).

Layout::

    {version = 2}{4-byte BE count} then per record:
    {2-byte BE topic length}{topic UTF-8}{4-byte BE signed partition, -1 = by key}{key}{value}
    {8-byte BE timestamp}
    {2-byte BE header count} then per header {2-byte BE name length}{name UTF-8}{value}
    where key, value and header values are {4-byte BE length, 0xFFFFFFFF = null}{bytes}

Version 1 (still read) had no partition field. Records are ``(topic, key, value, timestamp,
headers, partition)``.
"""

from __future__ import annotations

import struct

VERSION = 2
_READS = (1, 2)
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_TS = struct.Struct(">q")
_NULL = 0xFFFFFFFF


def _blob(b: bytes | None) -> bytes:
    return _U32.pack(_NULL) if b is None else _U32.pack(len(b)) + b


def encode(records) -> bytes:
    out = [bytes([VERSION]), _U32.pack(len(records))]
    for topic, key, value, ts, headers, partition in records:
        t = topic.encode("utf-8")
        out += [_U16.pack(len(t)), t, _I32.pack(-1 if partition is None else partition), _blob(key), _blob(value),
                _TS.pack(ts), _U16.pack(len(headers or ()))]
        for name, hv in headers or ():
            n = name.encode("utf-8")
            out += [_U16.pack(len(n)), n, _blob(hv)]
    return b"".join(out)


def decode(data: bytes) -> list:
    if not data or data[0] not in _READS:
        raise ValueError(f"unknown outbox version {data[0] if data else None} (this build reads {_READS})")
    version = data[0]
    pos = 1

    def u16():
        nonlocal pos
        v = _U16.unpack_from(data, pos)[0]
        pos += 2
        return v

    def blob():
        nonlocal pos
        n = _U32.unpack_from(data, pos)[0]
        pos += 4
        if n == _NULL:
            return None
        v = data[pos:pos + n]
        pos += n
        return v

    (count,) = _U32.unpack_from(data, pos)
    pos += 4
    records = []
    for _ in range(count):
        n = u16()
        topic = data[pos:pos + n].decode("utf-8")
        pos += n
        partition = None
        if version >= 2:
            partition = _I32.unpack_from(data, pos)[0]
            pos += 4
            partition = None if partition < 0 else partition
        key, value = blob(), blob()
        ts = _TS.unpack_from(data, pos)[0]
        pos += 8
        headers = []
        for _ in range(u16()):
            n = u16()
            name = data[pos:pos + n].decode("utf-8")
            pos += n
            headers.append((name, blob()))
        records.append((topic, key, value, ts, headers, partition))
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} trailing bytes after the outbox")
    return records
