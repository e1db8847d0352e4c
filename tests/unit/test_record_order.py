"""One next-record rule (``processor/engine/record_order.py``): the worker's ``PartitionGroup``
and the backfill's ``merge`` hand a task the same heads in the same order: lowest event time
first, ties by topic then partition, a failed extraction (-1) first."""

import threading

from backfill.rows import merge
from processor.runtime.partition_group import PartitionGroup

# (topic, partition) -> the timestamps of its records, in offset order
HEADS = {("b", 0): [5, 5, 9, -1, 12], ("a", 1): [5, 7, 7, 20], ("a", 0): [3, 5, 9, 9], ("c", 0): [-1, 1, 30]}


class _Msg:
    def __init__(self, offset, ts):
        self._offset, self._ts = offset, ts

    def offset(self):
        return self._offset

    def timestamp(self):
        return (1, self._ts)

    def key(self):
        return None

    def value(self):
        return None

    def headers(self):
        return None


class _Task:
    """What a PartitionGroup calls on its task; records what it processed."""

    extracts_time = False
    event_time = None
    idle_waits = enforced_processing = 0

    def __init__(self):
        self.positions = {}
        self.order = []

    def process(self, topic, partition, offset, ts, key, value, headers):
        self.order.append((topic, partition, offset))


def test_partition_group_and_backfill_merge_agree():
    task = _Task()
    group = PartitionGroup(task, list(HEADS), max_idle_ms=-1, at_eof=set())
    for tp, stamps in HEADS.items():
        for off, ts in enumerate(stamps):
            group.add(tp, _Msg(off, ts))
    group.process_ready(0, threading.Event())
    streams = {(0, t, p, ""): [("input", t, p, None, None, ts, None, "", off, 0) for off, ts in enumerate(stamps)]
               for (t, p), stamps in HEADS.items()}
    merged = [(r[1], r[2], r[8]) for r in merge(streams)]
    assert task.order == merged
    assert merged[:6] == [("c", 0, 0), ("c", 0, 1), ("a", 0, 0), ("a", 0, 1), ("a", 1, 0), ("b", 0, 0)]
