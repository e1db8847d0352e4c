"""A user topic as its table's changelog (``build(reuse_source_topics=True)``): the update rule a
table source applies, and the offsets of the topic's records the task rejected.

Invariant: a reused table's store after the task's records up to position P of its source
partition equals, applied in offset order to every record of that partition below P that the
broker still holds: ``apply_table_record`` for the records the task applied, and for each record
the task rejected (dead-lettered or skipped, its writes undone) ``restore_row`` with the row its
key had then, which the task kept (``failed_key`` / ``encode_failed``) in its task store. With the
whole history that row is already there; under compaction, where the records before may be
gone, it is what puts it back. The live table source (``processor/operators/source.py``) and the
restore (``processor/runtime/changelog.py``) both use ``apply_table_record``; the task
(``processor/engine/task.py``) records each rejected record of a reused topic, and its task
changelog carries the entries, so a restore from any earlier point knows them. Every host of the
task records them, the backfill's included.

Failed-record entry in the task store (``__task``, host-local; its changelog carries it)::

    key:   b"failed\x00" {4-byte big-endian partition}{8-byte big-endian offset}{topic UTF-8}
    value: {version byte 1}{0: the key had no row | 1: it had one}{the row's stored bytes}

The topic sits last for a fixed-length head; ``failed_records`` scans a partition's entries and
keeps the topic's.

Turned on for an application that ran without it, the records rejected before are not known;
so the task keeps a base entry per reused store: the store's state up to source position P is
its former changelog up to offset E (both from the last commit before the switch), and only the
records from P on are read from the topic::

    key:   b"base\x00" {store name UTF-8}
    value: {version byte 1}{8-byte big-endian E}{8-byte big-endian P}{changelog topic UTF-8}

Records the former changelog holds past E (a unit that never committed) are not part of the
base, and under compaction they may have removed the committed records of their keys below E;
so the base keeps those keys' rows at P beside it (an overlay, applied after the changelog)::

    key:   b"baserow\x00" {2-byte big-endian length of the store name}{store name UTF-8}{key}
    value: as a failed-record entry's (the row, or none)
"""

from __future__ import annotations

import struct

from processor.state import timestamped

_FAILED = b"failed\x00"
_HEAD = struct.Struct(">iq")


def failed_key(topic: str, partition: int, offset: int) -> bytes:
    return _FAILED + _HEAD.pack(partition, offset) + topic.encode("utf-8")


_VERSION = 1


def encode_failed(row: bytes | None) -> bytes:
    """The entry's value: the row (stored bytes) the key had when the record was rejected."""
    return bytes((_VERSION, 0)) if row is None else bytes((_VERSION, 1)) + row


def decode_failed(value: bytes) -> bytes | None:
    if len(value) < 2 or value[0] != _VERSION or value[1] not in (0, 1):
        raise ValueError(f"failed-record entry of version {value[0] if value else None} "
                         f"({len(value)} bytes); this build reads version {_VERSION}")
    return value[2:] if value[1] else None


def failed_records(task_store, topic: str, partition: int) -> dict[int, bytes | None]:
    """``{offset: the row its key had}`` for the records of ``topic[partition]`` the task rejected."""
    want = topic.encode("utf-8")
    start = _FAILED + _HEAD.pack(partition, 0)
    end = _FAILED + struct.pack(">i", partition + 1)
    out = {}
    n = len(_FAILED) + _HEAD.size
    for k, v in task_store.range(start, end):
        if k[n:] == want:
            out[_HEAD.unpack_from(k, len(_FAILED))[1]] = decode_failed(v)
    return out


def failed_offsets(task_store, topic: str, partition: int) -> set[int]:
    return set(failed_records(task_store, topic, partition))


_BASE = b"base\x00"
_ENDS = struct.Struct(">qq")


def base_key(store: str) -> bytes:
    return _BASE + store.encode("utf-8")


def encode_base(changelog: str, end: int, position: int) -> bytes:
    return bytes((_VERSION,)) + _ENDS.pack(end, position) + changelog.encode("utf-8")


def read_base(task_store, store: str) -> tuple[str, int, int] | None:
    """``(former changelog topic, its end E, source position P)`` of a reused store, or None."""
    raw = task_store.get(base_key(store))
    if raw is None:
        return None
    if len(raw) < 1 + _ENDS.size or raw[0] != _VERSION:
        raise ValueError(f"base entry of store {store!r} of version {raw[0] if raw else None}; this build "
                         f"reads version {_VERSION}")
    end, position = _ENDS.unpack_from(raw, 1)
    return raw[1 + _ENDS.size:].decode("utf-8"), end, position


def replay_record(store, failed: dict, offset: int, key_bytes, value_bytes, timestamp: int) -> None:
    """One record of a reused topic in a restore (``failed``: ``failed_records`` of its partition):
    a rejected record puts its key's row back as it was (absent included), any other goes
    through ``apply_table_record``; a key-less record (always rejected) changes nothing."""
    if key_bytes is None:
        return
    if offset in failed:
        restore_row(store, key_bytes, failed[offset])
    else:
        apply_table_record(store, key_bytes, value_bytes, timestamp)


_BASE_ROW = b"baserow\x00"


def _base_row_prefix(store: str) -> bytes:
    name = store.encode("utf-8")
    return _BASE_ROW + struct.pack(">H", len(name)) + name


def base_row_key(store: str, key: bytes) -> bytes:
    return _base_row_prefix(store) + key


def base_rows(task_store, store: str) -> list[tuple[bytes, bytes | None]]:
    """``[(key, row or None)]`` of a base's overlay."""
    prefix = _base_row_prefix(store)
    return [(k[len(prefix):], decode_failed(v)) for k, v in task_store.prefix(prefix)]


def restore_row(store, key_bytes: bytes, row: bytes | None) -> None:
    """Put a key's row back as a failed-record entry kept it."""
    if row is None:
        if store.get(key_bytes) is not None:
            store.delete(key_bytes)
    elif store.get(key_bytes) != row:
        store.put(key_bytes, row)


def apply_table_record(store, key_bytes: bytes, value_bytes: bytes | None, timestamp: int):
    """One record of a table's topic into its store: the old stored bytes (None: the key had no
    row), or False when the record changes nothing (a tombstone for a missing key, or the stored
    value bytes again: the row keeps the timestamp of its last real change, KIP-557)."""
    old = store.get(key_bytes)
    if value_bytes is None:
        if old is None:
            return False
        store.delete(key_bytes)
        return old
    if old is not None and old[timestamped.TIMESTAMP_SIZE:] == value_bytes:
        return False
    store.put(key_bytes, timestamped.encode(timestamp, value_bytes))
    return old
