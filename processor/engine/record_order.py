"""Which record a task with several input partitions processes next: the one rule of the worker's
``PartitionGroup`` (``processor/runtime/partition_group.py``) and the backfill's merge of a
task's rows (``backfill/rows.py``: ``merge``), so a backlog and a replay see one order.

Kafka Streams' ``PartitionGroup`` (KIP-353): each partition in offset order; across partitions,
the record whose partition head has the lowest event time first; ties by topic name, then
partition. A record whose timestamp extraction failed (``UNORDERED``, -1) sorts first: it changes
nothing and holds back nothing behind it. (When the task may process at all, waiting for an
empty partition, is the worker's: ``PartitionGroup``.)
"""

from __future__ import annotations


def next_record_key(event_time: int, topic: str, partition: int) -> tuple[int, str, int]:
    """The order of a partition's head record among a task's heads: the lowest key goes first."""
    return (event_time, topic, partition)
