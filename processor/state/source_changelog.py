"""A user topic as its table's changelog (``build(reuse_source_topics=True)``): the update rule a
table source applies, and the offsets of the topic's records the task rejected.

Invariant: a reused table's store after the task's records up to position P of its source
partition equals ``apply_table_record`` applied, in offset order, to every record of that
partition below P except the offsets ``failed_offsets`` returns. The live table source
(``processor/operators/source.py``) and the restore (``processor/runtime/changelog.py``) both use
``apply_table_record``; the task (``processor/engine/task.py``) records each rejected record of a
reused topic (dead-lettered or skipped, its writes undone) in its task store, which its task
changelog carries, so a restore from any earlier point skips the same records. Every host of the
task records them, the backfill's included.

Failed-offset key in the task store (``__task``, host-local; its changelog carries it)::

    b"failed\\x00" {4-byte big-endian partition}{8-byte big-endian offset}{topic UTF-8}

with the empty value; ``failed_prefix`` groups a (topic, partition): the topic sits last only for
a fixed-length head, so the prefix is the head with the offset left out, filtered by topic.
"""

from __future__ import annotations

import struct

from processor.state import timestamped

_FAILED = b"failed\x00"
_HEAD = struct.Struct(">iq")


def failed_key(topic: str, partition: int, offset: int) -> bytes:
    return _FAILED + _HEAD.pack(partition, offset) + topic.encode("utf-8")


def failed_offsets(task_store, topic: str, partition: int) -> set[int]:
    """The offsets of ``topic[partition]`` the task rejected, from its task store."""
    want = topic.encode("utf-8")
    start = _FAILED + _HEAD.pack(partition, 0)
    end = _FAILED + struct.pack(">i", partition + 1)
    out = set()
    n = len(_FAILED) + _HEAD.size
    for k, _ in task_store.range(start, end):
        if k[n:] == want:
            out.add(_HEAD.unpack_from(k, len(_FAILED))[1])
    return out


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
