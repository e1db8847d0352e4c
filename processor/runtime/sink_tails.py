"""The worker's side of table sink convergence (``processor/engine/sink_convergence.py``): where
each task's records in its table sinks may start, and reading the tails after a crash.

- **Ends kept per commit.** Each commit record of a task with table sinks names, per partition
  of those sinks, an offset below which none of the task's later records can land: the largest
  of the previous one, the partition's end found when the task opened (before it sent
  anything), and the end of what this worker's producer had delivered there when the unit's
  flush returned (``KafkaCollector.delivered_ends``). A task whose tail is not settled yet
  (``Task.convergence_pending``) keeps its previous ends, so a second crash reads the same tail.
  A task with no commit record commits before it processes anything, so its first records are
  always behind a commit record that names where they may start.
- **Reading a tail.** When tasks open, their sinks' ends are found by fetching
  (``partition_ends``, never a latest-offset query); each partition is read from the smallest
  end any opening task's commit record names up to that end, with the worker's isolation level.
  A record belongs to a task when its ``processor.origin`` header names this application and the
  task, and lies at or after that task's own end. The last value per key is the tail; the offset
  after the last input record that caused one, per input partition, is the target.
"""

from __future__ import annotations

import logging
import time
from typing import cast

from processor import provenance
from processor.errors import KafkaIOError
from processor.kafka import clients as kafka
from processor.kafka.partition_ends import snapshot_end_offsets
from processor.kafka.read_to_end import PartitionsToEnd

log = logging.getLogger("processor.restore")

READ_TIMEOUT_S = 120.0


def sink_partitions(topics, parts: dict[str, int]) -> list[tuple[str, int]]:
    return [(t, p) for t in sorted(topics) for p in range(parts[t])]


def partition_ends(bootstrap_servers, topics, consumer_config: dict) -> dict[tuple[str, int], int]:
    return snapshot_end_offsets(bootstrap_servers, sorted(topics), consumer_config=consumer_config)


class TaskTail:
    """What one task finds in its table sinks: ``tails`` ``{topic: {key: last value}}`` and
    ``targets`` ``{(input topic, partition): offset}``."""

    def __init__(self):
        self.tails: dict[str, dict] = {}
        self.targets: dict[tuple[str, int], int] = {}
        self.records = 0


def read_tails(bootstrap_servers, consumer_config: dict, application_id: str,
               starts: dict[tuple[int, int], dict[tuple[str, int], int]],
               ends: dict[tuple[str, int], int]) -> dict[tuple[int, int], TaskTail]:
    """``starts``: per task (sub-topology, partition), the offset of each of its sink partitions
    from which its records may be; ``ends``: each partition's end. Returns each task's tail."""
    t0 = time.monotonic()
    out = {key: TaskTail() for key in starts}
    lows: dict[tuple[str, int], int] = {}
    for tps in starts.values():
        for tp, off in tps.items():
            if off < ends.get(tp, 0):
                lows[tp] = min(lows.get(tp, off), off)
    if not lows:
        return out
    conf = dict(consumer_config)
    conf.update({"group.id": f"{application_id}-sink-tails", "enable.partition.eof": True,
                 "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50})
    c = kafka.new_consumer(conf, "reading table sinks after a crash")
    read = 0
    try:
        for m in PartitionsToEnd(c, lows, ends).records(
                READ_TIMEOUT_S, batch=2000, wait_s=0.05,
                error=lambda tp, err: KafkaIOError(f"reading table sink {tp[0]}[{tp[1]}] after a crash: {err.str()}"),
                timeout=lambda pending: KafkaIOError(f"reading table sinks after a crash: {pending} did not reach "
                                                     f"their ends within {READ_TIMEOUT_S:.0f} s")):
            tp = cast(tuple[str, int], (m.topic(), m.partition()))
            off = cast(int, m.offset())
            read += 1
            raw = provenance.find_origin(m.headers())
            if raw is None:
                continue
            try:
                origin = provenance.decode_origin(raw)
            except ValueError:
                continue      # not ours to judge: a newer build's or someone else's header
            if origin.application_id != application_id:
                continue
            key = (origin.sub_topology, origin.partition)
            mine = starts.get(key)
            if mine is None or off < mine.get(tp, 0):
                continue
            tail = out[key]
            tail.records += 1
            tail.tails.setdefault(tp[0], {})[m.key()] = m.value()
            if origin.offset >= 0:
                itp = (origin.topic, origin.partition)
                if tail.targets.get(itp, 0) <= origin.offset:
                    tail.targets[itp] = origin.offset + 1
    finally:
        c.close()
    found = sum(t.records for t in out.values())
    log.info("read %d record(s) of table sinks after the last commits of %d task(s) in %.1f s: %d were theirs, "
             "%d key(s) to check once their replay catches up", read, len(starts), time.monotonic() - t0, found,
             sum(len(k) for t in out.values() for k in t.tails.values()))
    return out
