"""Reading one Kafka offset range with confluent-kafka: what the data source's readers and the
backfill's tasks run in the executors (kept apart from ``backfill.kafka_source`` so that a task
imports no Spark SQL, pandas or Arrow to read its partitions).

Invariant (``iter_range``): exactly the records at offsets ``start <= offset < end`` of the
split's partition, in offset order, each once; it stops at the first record at or beyond ``end``
or at partition EOF at or beyond it (offsets taken by transaction markers or aborted records hold
no record). EOF below ``end``, or ``start`` no longer in the log, fails the read
(``auto.offset.reset=error``: Apache Kafka's OFFSET_OUT_OF_RANGE, explained by the partition's
offsets; a high watermark below ``start``, which Tansu answers with an empty fetch instead): the
error names where the partition ends (or starts). History is never silently shorter than the
snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import NamedTuple

from processor.errors import ConfigError

BATCH_ROWS = 10_000          # records per batch a reader yields
STALL_TIMEOUT_S = 60.0       # a split that sees no record and no EOF this long fails
# consume() waits its whole timeout unless the batch fills, so the last (short) batch of every
# split costs this much idle time: keep it short (librdkafka prefetches in the background anyway)
CONSUME_WAIT_S = 0.01


class Range(NamedTuple):
    """Offsets ``[start, end)`` of ``topic[partition]`` (``kafka_source.OffsetRange`` is the
    data source's form of it)."""

    topic: str
    partition: int
    start: int
    end: int


def iter_range(bootstrap_servers: str, split, consumer_config: dict | None = None,
               batch_rows: int = BATCH_ROWS) -> Iterator[list]:
    """The records of ``split`` as lists of confluent-kafka Messages, in offset order: exactly the
    offsets ``start <= offset < end`` (see the module invariants; the backfill's tasks read their
    partitions with it directly)."""
    from confluent_kafka import KafkaError, TopicPartition

    from processor.kafka.clients import consumer_defaults, new_consumer

    where = f"{split.topic}[{split.partition}] offsets [{split.start}, {split.end})"
    if split.end <= split.start:
        return
    conf = consumer_defaults(bootstrap_servers)
    conf.update({"isolation.level": "read_uncommitted", "fetch.wait.max.ms": 50,
                 "max.partition.fetch.bytes": 8 << 20})
    conf.update(consumer_config or {})
    conf.update({"group.id": f"backfill-reader-{time.time_ns()}", "enable.partition.eof": True,
                 "enable.auto.commit": False, "auto.offset.reset": "error"})
    c = new_consumer(conf, f"reading {where}")
    try:
        tp = TopicPartition(split.topic, split.partition, split.start)
        c.assign([tp])
        quiet_since = time.monotonic()
        while True:
            msgs = c.consume(batch_rows, CONSUME_WAIT_S)
            if not msgs:
                # Tansu answers a fetch above the high watermark with nothing, not OFFSET_OUT_OF_RANGE.
                high = c.get_watermark_offsets(tp, cached=True)[1]
                if 0 <= high < split.start:
                    raise ConfigError(f"reading {where}: the partition ends at {high}, below the range "
                                      "(topic truncated or recreated)")
                if time.monotonic() - quiet_since > STALL_TIMEOUT_S:
                    raise ConfigError(f"reading {where}: no record and no end of partition "
                                      f"within {STALL_TIMEOUT_S:.0f} s")
                continue
            quiet_since = time.monotonic()
            out = []
            done = False
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise ConfigError(f"reading {where}: {_out_of_range(c, tp, split, err.str())}")
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise ConfigError(f"reading {where}: {err.str()}")
                    if m.offset() < split.end:
                        raise ConfigError(f"reading {where}: the partition ends at {m.offset()}, below "
                                          "the snapshot (topic truncated or recreated, or the snapshot "
                                          "was taken with another isolation.level)")
                    done = True
                    break
                if m.offset() >= split.end:
                    done = True
                    break
                out.append(m)
            if out:
                yield out
            if done:
                return
    finally:
        c.close()


def _out_of_range(consumer, tp, split, error: str) -> str:
    """Why a fetch from ``split.start`` was out of range (Apache Kafka answers OFFSET_OUT_OF_RANGE,
    which ``auto.offset.reset=error`` makes an error): the partition ends below the range (as
    Tansu's empty fetch is reported), or its log starts above ``start`` (retention, DeleteRecords);
    the broker's own error when its offsets cannot be asked or explain neither."""
    try:
        low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
    except Exception as exc:   # noqa: BLE001 (the read fails anyway: say what was met)
        return f"{error} (the partition's offsets could not be read: {exc})"
    if 0 <= high < split.start:
        return f"the partition ends at {high}, below the range (topic truncated or recreated)"
    if low > split.start:
        return (f"the partition starts at {low}, above the range's start (records deleted by retention or "
                f"DeleteRecords since the range was taken)")
    return f"{error} (the partition holds offsets [{low}, {high}))"
