"""Reading partitions from a start offset to their end, written once: ``PartitionsToEnd``.

Invariant: ``records()`` yields, per partition in offset order, every record at or after the
partition's start offset and below its end, then stops once every partition is *finished*:

- at its partition-EOF event (the consumer is opened with ``enable.partition.eof``, as every
  consumer of ``processor.kafka.clients.consumer_defaults`` is): the end is where the broker's
  fetch ends at the consumer's isolation level (the high watermark under ``read_uncommitted``,
  the last stable offset under ``read_committed``), found by fetching, never by a
  list-offsets query (wrong on some brokers: ``processor.kafka.partition_ends``);
- or, where the caller knows the end offset (``ends``), at the record just below it: records at
  or past it are not yielded;
- or when the caller says so (``finish``: it has read what it needs of that partition).

A finished partition is paused and its later records are not yielded. A start offset of 0 or
less reads from the beginning (``OFFSET_BEGINNING``: whatever retention left). An error event
other than EOF raises the caller's error for it (``KafkaIOError`` naming the partition and what
was being read, as a rule; without one the event is left to librdkafka, which retries), except a
transient one (``clients.is_transient``: the broker down or paused, a leader moving), which
librdkafka retries (one warning line every few seconds); not finishing within ``timeout_s``
raises the caller's error naming the partitions still pending.
The consumer is the caller's to open and close.

``steps()`` is the same read without a time limit, with a None after each fetch: a caller that
reads in steps between other work (a restore, ``processor/runtime/changelog_reader.py``) keeps
its own clock, and may lend the consumer to another read meanwhile: ``assign()`` assigns the
partitions still pending again, each where it is read from next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from processor.kafka import clients as kafka

TopicPartitionKey = tuple[str, int]
# (topic, partition), the error event -> the error to raise
ReadFailed = Callable[[TopicPartitionKey, KafkaError], Exception]
# the partitions not finished, sorted -> the error to raise
EndNotReached = Callable[[list[TopicPartitionKey]], Exception]
# a transient error event is named in the log at most this often
TRANSIENT_WARN_EVERY_S = 5.0


class PartitionsToEnd:
    """The partitions ``starts`` (``{(topic, partition): start offset}``) of ``consumer``, read to
    their ends (see the module docstring). Assigns them when made. ``exact``: a start of 0 is
    offset 0, not the beginning (a broker that deleted the records there answers out of range,
    where ``OFFSET_BEGINNING`` would skip them silently)."""

    def __init__(self, consumer: Consumer, starts: Mapping[TopicPartitionKey, int],
                 ends: Mapping[TopicPartitionKey, int] | None = None, *, exact: bool = False) -> None:
        self.consumer = consumer
        self.ends: Mapping[TopicPartitionKey, int] = ends or {}
        self.exact = exact
        self.pending: set[TopicPartitionKey] = set(starts)
        # partition -> where it is read from next: its start, then after each record yielded
        self.next: dict[TopicPartitionKey, int] = dict(starts)
        # partition -> the offset of its EOF event (the end), for the partitions finished by one
        self.eof: dict[TopicPartitionKey, int] = {}
        self.assign()
        for tp, end in self.ends.items():
            if tp in self.pending and end <= starts[tp]:
                self.finish(tp)

    def assign(self) -> None:
        """Assign the partitions still pending, each where it is read from next, and resume them
        (librdkafka keeps a partition paused across an unassign and a new assign: one an earlier
        read of the same consumer finished would stay paused)."""
        tps = [TopicPartition(t, p, off if off > 0 or self.exact else OFFSET_BEGINNING)
               for (t, p), off in self.next.items() if (t, p) in self.pending]
        kafka.assign(self.consumer, tps)
        self.consumer.resume(tps)

    def finish(self, tp: TopicPartitionKey) -> None:
        """Read no further in ``tp``."""
        if tp in self.pending:
            self.pending.discard(tp)
            self.consumer.pause([TopicPartition(*tp)])

    def records(self, timeout_s: float, *, error: ReadFailed | None, timeout: EndNotReached,
                batch: int = 1000, wait_s: float = 0.2) -> Iterator[Message]:
        """The records (see the module docstring), fetched ``batch`` at a time, each fetch
        waiting up to ``wait_s`` (``consume`` waits all of it unless the batch fills)."""
        deadline = time.monotonic() + timeout_s
        for m in self.steps(error=error, batch=batch, wait_s=wait_s):
            if m is not None:
                yield m
            elif self.pending and time.monotonic() > deadline:
                raise timeout(sorted(self.pending))

    def steps(self, *, error: ReadFailed | None, batch: int = 1000,
              wait_s: float = 0.2) -> Iterator[Message | None]:
        """The records, and None after each fetch, until every partition is finished (no time
        limit: the caller's)."""
        pending, ends, next_offset = self.pending, self.ends, self.next
        warned = float("-inf")
        while pending:
            for m in self.consumer.consume(batch, wait_s):
                # (confluent_kafka types topic, partition and offset optional: set on these events)
                tp = cast(TopicPartitionKey, (m.topic(), m.partition()))
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if tp in pending:
                            self.eof[tp] = cast(int, m.offset())
                            self.finish(tp)
                    elif kafka.is_transient(err):
                        now = time.monotonic()
                        if now - warned >= TRANSIENT_WARN_EVERY_S:
                            warned = now
                            kafka.RETRY_LOGGER.warning("reading partitions to their end: %s (transient: "
                                                       "librdkafka retries)", err.str())
                    elif error is not None and tp in next_offset:
                        # (an event of a partition this read does not read: an earlier read's of the
                        # same consumer, late; not this read's to fail on)
                        raise error(tp, err)
                    continue
                if tp not in pending:
                    continue
                off = cast(int, m.offset())
                end = ends.get(tp)
                if end is not None and off >= end - 1:
                    self.finish(tp)
                    if off >= end:
                        continue
                next_offset[tp] = off + 1
                yield m
            yield None
