"""The snapshot of source partitions a backfill reads: ``processor/kafka/partition_ends.py``
(the worker finds its table sinks' ends the same way)."""

from processor.kafka.partition_ends import snapshot_end_offsets, snapshot_offsets, snapshot_start_offsets, to_ranges

__all__ = ["snapshot_end_offsets", "snapshot_offsets", "snapshot_start_offsets", "to_ranges"]
