"""PartitionGroup: a task's input buffers, and which buffered record the task processes next.

A task reading more than one input partition (a join, a merge, a shared store, a table beside
a stream) must see its inputs in time order, or a backlog gives another answer than a live
feed: a stream-table join over topics that already hold their history would join every click
before any user row arrived. The worker buffers each such task's fetched records here and hands
them to the task by Kafka Streams' rule (``PartitionGroup``, KIP-353, KIP-695):

- each partition in offset order;
- across the task's partitions, the record whose partition head has the lowest timestamp
  first, ties by topic and partition (``processor/engine/record_order.py``, the backfill's
  ``backfill.rows.merge`` too);
- a partition with nothing buffered that is not known to be at its end (no end-of-partition
  event since its last fetched record: it has data on the broker, or its first fetch has not
  answered yet) is waited for: the task processes nothing until it is fetched;
- a partition with nothing buffered that is at its end is waited for ``max_task_idle_ms``
  (0, the default: not at all; -1: the whole rule is off, buffered records are processed as
  they come) from the moment it was first seen empty; past that the task processes what it has
  (``enforced_processing``, counted per record, as Kafka Streams' sensor).

Counters (on the task, operator ``task`` of ``/metrics``): ``enforced_processing`` (records
processed while a partition the task was waiting for had nothing), ``idle_waits`` (times the
task stopped to wait for a partition), ``buffer_pauses`` (times a partition was paused because
its buffer was full).

The timestamp a record is ordered by is its event time: the task's timestamp extractor's
result for its topic where one is set (``Task.event_time``, extracted once: the task processes
the record at that time), else the record's timestamp. A record whose extraction fails is
ordered first (``UNORDERED``): it changes nothing (it is dead-lettered, skipped or fatal) and
holds back no record behind it, as Kafka Streams drops it at its queue's head.

Invariant: the buffers hold consecutive fetched records after the task's positions; what the
worker commits is the task's positions, so a buffered record that was never processed is
fetched again after a crash or a revocation (the buffers are dropped with the task).

A task with one input partition needs none of this: the worker hands it records as fetched.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from processor.engine.record_order import next_record_key
from processor.engine.task import UNORDERED

# a partition whose buffer holds this many records is paused until the task caught up
# (Kafka Streams' buffered.records.per.partition)
BUFFERED_RECORDS_PER_PARTITION = 1000


class PartitionGroup:
    __slots__ = ("task", "partitions", "buffers", "max_idle_ms", "at_eof", "idle_deadlines",
                 "waiting", "paused", "buffered", "_event_time", "limit")

    def __init__(self, task, partitions, max_idle_ms: int, at_eof: set,
                 limit: int = BUFFERED_RECORDS_PER_PARTITION):
        self.task = task
        self.partitions = sorted(partitions)
        self.buffers: dict[tuple[str, int], deque[tuple[int, Any]]] = {tp: deque() for tp in self.partitions}
        self.max_idle_ms = max_idle_ms
        self.at_eof = at_eof                 # the worker's: partitions read to their end
        self.idle_deadlines: dict = {}
        self.waiting = False
        self.paused: set = set()             # partitions paused because their buffer is full
        self.buffered = 0
        self.limit = limit
        self._event_time = task.event_time if task.extracts_time else None

    def expected(self, tp) -> int | None:
        """The next offset of ``tp`` to fetch: after the last buffered record, else the task's
        position."""
        buf = self.buffers[tp]
        if buf:
            return buf[-1][1].offset() + 1
        return self.task.positions.get(tp)

    def add(self, tp, m) -> bool:
        """Buffer fetched record ``m`` of ``tp``; True when the buffer is now full (pause ``tp``)."""
        buf = self.buffers[tp]
        if buf:
            if m.offset() <= buf[-1][1].offset():
                return False     # fetched again (after a seek): buffered already
        else:
            pos = self.task.positions.get(tp)
            if pos is not None and m.offset() < pos:
                return False     # processed already
        ts = m.timestamp()[1]
        if self._event_time is not None:
            ts = self._event_time(tp[0], m.key(), m.value(), ts)   # UNORDERED (-1): extraction failed
        buf.append((ts, m))
        self.buffered += 1
        return len(buf) >= self.limit and tp not in self.paused

    def _ready(self, now_ms: int) -> bool | None:
        """Kafka Streams' ``readyToProcess``: True (all buffered), None (ready, enforced: some
        partition given up on), False (wait)."""
        if self.max_idle_ms < 0:
            return True
        enforced = False
        for tp, buf in self.buffers.items():
            if buf:
                if self.idle_deadlines:
                    self.idle_deadlines.pop(tp, None)
                continue
            if tp not in self.at_eof:   # data on the broker, or not fetched yet: wait for it
                self.idle_deadlines.pop(tp, None)
                return False
            deadline = self.idle_deadlines.get(tp)
            if deadline is None:
                deadline = self.idle_deadlines[tp] = now_ms + self.max_idle_ms
            if now_ms < deadline:
                return False
            enforced = True
        return None if enforced else True

    def process_ready(self, now_ms: int, stop) -> list:
        """Process buffered records while the task is ready; returns the partitions whose
        buffers went below the limit (to resume)."""
        task = self.task
        buffers = self.buffers
        resume = []
        while self.buffered and not stop.is_set():
            ready = self._ready(now_ms)
            if ready is False:
                if not self.waiting:
                    self.waiting = True
                    task.idle_waits += 1
                break
            self.waiting = False
            if ready is None:
                task.enforced_processing += 1
            best: Any = None   # (topic, partition): some buffer holds a record (buffered > 0)
            best_key: Any = None
            for tp, buf in buffers.items():
                if buf:
                    key = next_record_key(buf[0][0], tp[0], tp[1])
                    if best is None or key < best_key:
                        best, best_key = tp, key
            buf = buffers[best]
            ts, m = buf.popleft()
            self.buffered -= 1
            if best in self.paused and len(buf) < self.limit // 2:
                self.paused.discard(best)
                resume.append(best)
            if self._event_time is None:
                task.process(best[0], best[1], m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers())
            else:   # extracted once: ordered and processed at the same time (a failed one: again, to fail)
                task.process(best[0], best[1], m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers(),
                             None if ts == UNORDERED else ts)
        return resume
