"""The worker's per-message loop: one consumed batch handed to its tasks (compiled, issue 37).

Invariant: every message of a batch reaches exactly one place, in the batch's order: an error
(a partition's end marks it at its end; a fatal error raises; the rest are logged, librdkafka
retries), the floor (a message of a task revoked while in flight, one below a just-restored
task's position, one fetched before the seek back to a fetch gap: dropped, neither processed
nor committed), a time-ordered task's partition group (processed later, in time order, by
``TaskManager.process_buffered``), or its task's ``process``. ``dispatch`` returns how many went
to ``process`` directly. A stop request ends a batch within 64 messages: the rest is neither
processed nor committed.

``Worker._loop`` (``processor/runtime/worker.py``) owns everything else of a loop turn (the
fleet, the restore, commits, punctuation); this is only the per-message part, kept apart so the
compiled build runs it as C (``dispatch.pxd``: the task's ``process`` is a C call).
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from processor.errors import ConfigError

log = logging.getLogger("processor.worker")

_EOF = KafkaError._PARTITION_EOF


class MessageDispatch:
    """One loop's per-message part over the task manager's containers and the fetch-gap guard,
    read at the start of every batch (a container rebound meanwhile is never read stale)."""

    def __init__(self, consumer, task_manager, fetch_gaps, stop) -> None:
        self.consumer = consumer
        self.tm = task_manager
        self.fetch_gaps = fetch_gaps
        self.stop = stop

    def dispatch(self, msgs: list[Any]) -> int:
        """Hand ``msgs`` (one ``consume``) to their tasks; the number processed directly."""
        tm = self.tm
        gaps = self.fetch_gaps
        tasks = tm.tasks
        at_eof = tm.at_eof
        resumed = tm.resumed
        ordered = tm.ordered_inputs
        groups = tm.groups
        sub_of = tm.sub_of_topic
        guarded = gaps.guarded
        open_gaps = gaps.gaps
        stop = self.stop
        n = 0
        seen = 0
        refetching: set[tuple[str, int]] | None = None
        for m in msgs:
            # a stop request ends the batch within 64 messages (``is_set`` is a Python call)
            if seen & 63 == 0 and stop.is_set():
                break
            seen += 1
            err = m.error()
            if err is not None:
                if err.code() == _EOF:
                    if not (refetching and (m.topic(), m.partition()) in refetching):
                        at_eof.add((m.topic(), m.partition()))
                    continue
                if err.fatal():
                    raise ConfigError(f"fatal Kafka error: {err.str()}")
                # librdkafka recovers from the rest itself (broker down, leader moves)
                log.warning("Kafka error (librdkafka retries): %s", err.str())
                continue
            topic = m.topic()
            part = m.partition()
            sub = sub_of[topic]
            task = tasks.get((sub, part))
            if task is None:  # revoked while in flight: not processed, not committed
                continue
            group = None
            if ordered and sub in ordered:   # (its next offset: after what its buffers hold)
                group = groups.get((sub, part))
                if group is None or group.task is not task:
                    group = tm.new_group((sub, part), task)
            if resumed and (topic, part) in resumed and m.offset() < (
                    (task.positions.get((topic, part)) if group is None else group.expected((topic, part))) or 0):
                continue   # just restored: a record below its position is already in its state
            if topic in guarded:
                if refetching and (topic, part) in refetching:
                    continue   # fetched before the seek back to a gap
                pos = task.positions.get((topic, part)) if group is None else group.expected((topic, part))
                if (open_gaps or (pos is not None and m.offset() > pos)) and \
                        gaps.check(topic, part, pos, m.offset()):
                    refetching = refetching or set()
                    refetching.add((topic, part))
                    at_eof.discard((topic, part))   # not at its end: the gap is read again
                    continue
            if at_eof:
                at_eof.discard((topic, part))
            if group is not None:   # processed below, in time order
                if group.add((topic, part), m):
                    group.paused.add((topic, part))
                    task.buffer_pauses += 1
                    self.consumer.pause([TopicPartition(topic, part)])
                continue
            task.process(topic, part, m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers())
            n += 1
        return n
