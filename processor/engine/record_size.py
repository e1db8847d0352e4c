"""Record size: no record a task sends is larger than the producer's ``message.max.bytes``.

Invariant: a record (an output, an outbox entry, a dead-letter record) whose size as librdkafka
counts it (``wire_size``) exceeds the host producer's ``message.max.bytes`` is never handed to the
collector: ``OutputError`` is raised instead, and the on-error policy decides (the record is
rejected whole). The check per input record is cheap: an output's headers are the input
record's plus this product's own (a provenance header, a foreign-key join's offset headers: far
below ``OWN_HEADERS_BOUND``), so comparing key + value against one bound per input record
(``room_beside``) settles almost every output; the exact count runs only near the limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from processor.engine.protocols import RecordCollector
from processor.errors import OutputError

# librdkafka's default ``message.max.bytes``: the largest record a producer sends
DEFAULT_MAX_RECORD_BYTES = 1_000_000
RECORD_OVERHEAD = 36       # librdkafka's most a v2 record adds to key + value + headers
OWN_HEADERS_BOUND = 4096   # more than the headers this product adds to an output ever take

Headers = Iterable[tuple[str | bytes, bytes | None]]


def max_record_bytes_of(producer_config: dict | None) -> int:
    """The largest record the host's producer sends (its ``message.max.bytes``)."""
    value = (producer_config or {}).get("message.max.bytes")
    return DEFAULT_MAX_RECORD_BYTES if value is None else int(value)


def room_for(max_record_bytes: int) -> int:
    """The most key + value bytes an output without input headers may take uncounted."""
    return max_record_bytes - RECORD_OVERHEAD - OWN_HEADERS_BOUND


def room_beside(room: int, headers: Headers) -> int:
    """``room`` less what ``headers`` (the input record's, copied to its outputs) take, at most
    10 bytes of varints per header included."""
    for name, hv in headers:
        room -= len(name) + (len(hv) if hv else 0) + 10
    return room


def wire_size(k: bytes | None, v: bytes | None, headers: Headers | None) -> int:
    """A record's size as librdkafka counts it against ``message.max.bytes``."""
    size = RECORD_OVERHEAD + (len(k) if k else 0) + (len(v) if v else 0)
    for name, hv in headers or ():
        n, m = len(name.encode() if isinstance(name, str) else name), (len(hv) if hv else 0)
        size += n + m + _varint_size(n) + _varint_size(m)
    return size


def _varint_size(n: int) -> int:
    z, size = n << 1, 1    # zigzag of a non-negative length
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


def check_sizes(records: Iterable[tuple], room: int, limit: int) -> None:
    """Raise ``OutputError`` for the first of ``records`` (``(topic, key, value, timestamp,
    headers, ...)``) larger than ``limit``; ``room`` is the bound under which key + value needs no
    exact count."""
    for r in records:
        k, v = r[1], r[2]
        if (len(v) if v else 0) + (len(k) if k else 0) > room:
            check_size(r[0], k, v, r[4], limit)


def check_size(topic: str, k: bytes | None, v: bytes | None, headers: Headers | None, limit: int) -> None:
    """The exact check of one output record to ``topic``."""
    size = wire_size(k, v, headers)
    if size > limit:
        raise OutputError(f"an output record to {topic!r} is {size} bytes, more than the producer's "
                          f"message.max.bytes ({limit})", step=f"sink to {topic}")


class SizeLimitedTask(Protocol):
    """What ``DirectSends`` reads from its task."""

    collector: RecordCollector
    context: Any   # the ProcessorContext: ``headers`` of the record in hand
    output_room: int
    max_record_bytes: int


class DirectSends(list):
    """``ProcessorContext.sends`` of a task built with ``journal=False``: each record goes to the
    collector at once, after the same size check (an ``OutputError`` follows the policy and
    counts in ``failed_in_processing``, so the host runs the task again with the journal). It
    stays empty (a list, so the task's ``if sends`` costs nothing): nothing to send or drop after
    a record. ``room`` is reset by the task for each record (its headers change the bound)."""

    __slots__ = ("task", "send", "room")

    def __init__(self, task: SizeLimitedTask):
        super().__init__()
        self.task = task
        self.send = task.collector.send
        self.room: int | None = None

    def append(self, r) -> None:
        k, v = r[1], r[2]
        room = self.room
        if room is None:
            task = self.task
            headers = task.context.headers
            room = self.room = room_beside(task.output_room, headers) if headers else task.output_room
        if (len(v) if v else 0) + (len(k) if k else 0) > room:
            check_size(r[0], k, v, r[4], self.task.max_record_bytes)
        self.send(*r)
