"""Start and end offsets of partitions, found by fetching: ``(start, end)`` per partition (the
backfill's snapshot of its sources; the worker's table sink ends, ``sink_tails``).

Invariants:

- ``end`` is where a consumer with the same config (``isolation.level`` above all) reaches
  partition EOF: the high watermark under ``read_uncommitted``, the last stable offset under
  ``read_committed``. Every offset below ``end`` is history the backfill reads; the worker
  continues at ``end``, so nothing below it is read again and nothing above it is skipped.
- ``start`` is the offset of the first record such a consumer reads from the beginning of the
  partition (``end`` if it reads none). Offsets below ``start`` are gone from Kafka
  (retention, DeleteRecords); an archive may supply them (``backfill.kafka_source``).
- The snapshot is taken from fetches, never from ListOffsets: on Tansu, ``list_offsets`` latest
  and ``get_watermark_offsets(cached=False)`` report the last batch's base offset + 1 (and 0 for a
  partition with an open transaction), not the end. Measured on Tansu 0.6 with librdkafka 2.16:
  the ``_PARTITION_EOF`` event's offset is the end under both isolation levels; the cached high
  watermark after a fetch is the true high watermark even under ``read_committed`` (so it is not
  the end there); a ``read_committed`` consumer positioned above the last stable offset gets
  neither records nor EOF.

How: one consumer reads the first event of every partition from the beginning (its offset is
``start``; the cached high watermark ``hw`` is a hint), then is positioned at
``max(start, hw - 1)`` and reads to EOF (at most a record or two per partition). A partition that
gives no event there within ``JUMP_WAIT_S`` (``read_committed`` with a transaction open below
``hw``) is read from ``start`` to EOF instead: slower, still exact.
"""

from __future__ import annotations

import time
from typing import cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from processor.errors import BrokerUnreachable, ConfigError
from processor.kafka.client_config import Cluster
from processor.kafka.clients import assign, consumer_defaults, is_transient, new_consumer, topic_partitions

TopicPartitionKey = tuple[str, int]

JUMP_WAIT_S = 2.0   # how long a partition positioned at hw - 1 may stay silent before the full read


def snapshot_offsets(bootstrap_servers: Cluster, topics, timeout_s: float = 30.0,
                     consumer_config: dict | None = None) -> dict[TopicPartitionKey, tuple[int, int]]:
    """``{(topic, partition): (start, end)}`` for every partition of ``topics``.

    ``consumer_config`` (security settings, ``isolation.level``; default ``read_uncommitted``, as
    the worker at least once) must be the one the history is then read with. Raises
    ``BrokerUnreachable`` if the broker does not answer (the partitions whose end was not reached
    within ``timeout_s`` named), ``ConfigError`` naming the missing topics."""
    topics = list(dict.fromkeys(topics))
    counts = topic_partitions(bootstrap_servers, timeout_s=min(timeout_s, 10.0))
    missing = [t for t in topics if t not in counts]
    if missing:
        raise ConfigError(f"topic(s) {', '.join(map(repr, missing))} do not exist on {bootstrap_servers}")
    keys = [(t, p) for t in topics for p in range(counts[t])]
    if not keys:
        return {}
    conf = consumer_defaults(bootstrap_servers)
    conf.update({"isolation.level": "read_uncommitted", "fetch.wait.max.ms": 10})
    conf.update(consumer_config or {})
    conf.update({"group.id": f"backfill-snapshot-{time.time_ns()}", "enable.partition.eof": True,
                 "enable.auto.commit": False, "auto.offset.reset": "error"})
    deadline = time.monotonic() + timeout_s
    c = new_consumer(conf, "the snapshot of source partitions")
    try:
        # 1. start: the first event of each partition read from the beginning.
        first = _first_events(c, {k: OFFSET_BEGINNING for k in keys}, deadline)
        start = {k: off for k, (kind, off, _) in first.items()}
        end = {k: off for k, (kind, off, _) in first.items() if kind == "eof"}
        # 2. end: EOF read from just below the cached high watermark ...
        jump = {k: max(start[k], hw - 1) for k, (kind, _, hw) in first.items() if kind == "msg"}
        end.update(_eof_offsets(c, jump, min(deadline, time.monotonic() + JUMP_WAIT_S), give_up=True))
        # 3. ... or, where that position was above the end (read_committed, open transaction), from start.
        rest = {k: start[k] for k in jump if k not in end}
        end.update(_eof_offsets(c, rest, deadline, give_up=False))
    finally:
        c.close()
    return {k: (start[k], end[k]) for k in keys}


def snapshot_end_offsets(bootstrap_servers: Cluster, topics, timeout_s: float = 30.0,
                         consumer_config: dict | None = None) -> dict[TopicPartitionKey, int]:
    """``{(topic, partition): end}``: see ``snapshot_offsets``."""
    return {k: e for k, (_, e) in snapshot_offsets(bootstrap_servers, topics, timeout_s, consumer_config).items()}


def snapshot_start_offsets(bootstrap_servers: Cluster, topics, timeout_s: float = 30.0,
                           consumer_config: dict | None = None) -> dict[TopicPartitionKey, int]:
    """``{(topic, partition): start}`` (earliest offset a consumer reads): see ``snapshot_offsets``."""
    return {k: s for k, (s, _) in snapshot_offsets(bootstrap_servers, topics, timeout_s, consumer_config).items()}


def to_ranges(offsets: dict[TopicPartitionKey, tuple[int, int]]) -> dict[str, dict[int, tuple[int, int]]]:
    """``{(topic, partition): (start, end)}`` -> ``{topic: {partition: (start, end)}}``, the form
    ``backfill.kafka_source.read_history`` takes."""
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for (topic, partition), rng in sorted(offsets.items()):
        out.setdefault(topic, {})[partition] = (rng[0], rng[1])
    return out


def _where(key: TopicPartitionKey) -> str:
    return f"{key[0]}[{key[1]}]"


def _first_events(c: Consumer, positions: dict[TopicPartitionKey, int], deadline: float) -> dict:
    """``{key: ("msg", offset, cached high watermark) | ("eof", offset, None)}``: the first event
    of each partition read from ``positions``."""
    assign(c, [TopicPartition(t, p, off) for (t, p), off in positions.items()])
    out: dict = {}
    while len(out) < len(positions):
        if time.monotonic() > deadline:
            raise BrokerUnreachable("snapshot: no record or end of partition seen within the timeout on "
                              + ", ".join(_where(k) for k in sorted(set(positions) - set(out))))
        for m in c.consume(1000, 0.02):   # (consume() waits its whole timeout unless the batch fills)
            key = cast(TopicPartitionKey, (m.topic(), m.partition()))   # (set on these events)
            if key in out:
                continue
            err = m.error()
            if err is None:
                out[key] = ("msg", m.offset(), c.get_watermark_offsets(TopicPartition(*key), cached=True)[1])
            elif err.code() == KafkaError._PARTITION_EOF:
                out[key] = ("eof", m.offset(), None)
            elif is_transient(err):   # the broker down or paused: librdkafka retries (the deadline holds)
                continue
            else:
                raise ConfigError(f"snapshot of {_where(key)}: {err.str()}")
            c.pause([TopicPartition(*key)])   # one event is all this step needs
    return out


def _eof_offsets(c: Consumer, positions: dict[TopicPartitionKey, int], deadline: float,
                 give_up: bool) -> dict[TopicPartitionKey, int]:
    """``{key: offset of its partition EOF}`` read from ``positions``; at ``deadline`` return what
    was found (``give_up``) or raise ``ConfigError``."""
    if not positions:
        return {}
    tps = [TopicPartition(t, p, off) for (t, p), off in positions.items()]
    c.assign(tps)
    c.resume(tps)   # a pause (``_first_events``) outlives a new assignment
    out: dict[TopicPartitionKey, int] = {}
    while len(out) < len(positions):
        if time.monotonic() > deadline:
            if give_up:
                return out
            raise BrokerUnreachable("snapshot: did not reach the end of "
                              + ", ".join(_where(k) for k in sorted(set(positions) - set(out)))
                              + " within the timeout")
        for m in c.consume(10000, 0.02):
            err = m.error()
            if err is None:
                continue
            key = cast(TopicPartitionKey, (m.topic(), m.partition()))   # (set on these events)
            if err.code() == KafkaError._PARTITION_EOF:
                out.setdefault(key, cast(int, m.offset()))
            elif not is_transient(err):   # (a transient one: librdkafka retries, the deadline holds)
                raise ConfigError(f"snapshot of {_where(key)}: {err.str()}")
    return out
