"""Sampling source topics for the partitioner that placed their keys (Kafka I/O only; the
decision is ``processor.engine.routing.decide_partitioners``)."""

from __future__ import annotations

import json
import logging
import time
from typing import cast

from processor.engine.routing import PartitionerChoice, decide_partitioners
from processor.errors import ConfigError, KafkaIOError
from processor.kafka import clients as kafka
from processor.kafka.client_config import Cluster
from processor.kafka.read_to_end import PartitionsToEnd

log = logging.getLogger("processor.partitioning")

SAMPLE_PER_PARTITION = 1000


def sample_keys(bootstrap_servers: Cluster, topics: dict[str, int], per_partition: int = SAMPLE_PER_PARTITION,
                consumer_config: dict | None = None, timeout_s: float = 30.0) -> dict[str, list]:
    """``{topic: [(key, partition, offset)]}``: the first ``per_partition`` records of every
    partition of ``topics`` (``{topic: partition count}``), read up to partition EOF."""
    if not topics:
        return {}
    conf = kafka.consumer_defaults(bootstrap_servers)
    conf.update({"group.id": f"partitioner-probe-{time.time_ns()}", "fetch.wait.max.ms": 50,
                 "isolation.level": "read_uncommitted"})
    conf.update({k: v for k, v in (consumer_config or {}).items() if k not in ("group.id",)})
    conf["enable.partition.eof"] = True
    c = kafka.new_consumer(conf, "sampling source keys (partitioner detection)")
    out: dict[str, list] = {t: [] for t in topics}
    counts: dict[tuple[str, int], int] = {}
    try:
        reader = PartitionsToEnd(c, {(t, p): 0 for t, n in topics.items() for p in range(n)})
        for m in reader.records(
                timeout_s, wait_s=0.05,
                error=lambda tp, err: KafkaIOError(f"sampling {tp[0]}[{tp[1]}] for its partitioner: {err.str()}"),
                timeout=lambda pending: KafkaIOError(f"sampling keys of {sorted(topics)} for their partitioner "
                                                     f"did not reach the end of {pending} within {timeout_s:.0f} s")):
            tp = cast(tuple[str, int], (m.topic(), m.partition()))
            out[tp[0]].append((m.key(), tp[1], m.offset()))
            counts[tp] = counts.get(tp, 0) + 1
            if counts[tp] >= per_partition:
                reader.finish(tp)
    finally:
        c.close()
    return out


def determine_partitioners(topology, bootstrap_servers: Cluster, partition_counts: dict[str, int],
                           consumer_config: dict | None = None,
                           application_id: str | None = None) -> dict[str, PartitionerChoice]:
    """Declared, recorded or detected partitioner of every source topic a join depends on; logs
    one line per topic; with ``application_id``, reads and writes the application's record of the
    partitioners foreign-key subscriptions are routed by. Raises ``PartitioningError`` (exit 2)
    as ``decide_partitioners`` does."""
    relevant = topology.partitioning_relevant_topics()
    declared = topology.declared_partitioners()
    recorded = read_recorded(bootstrap_servers, application_id, partition_counts) if application_id else {}
    to_sample = {t: partition_counts[t] for t in relevant if partition_counts[t] > 1}
    # declared and recorded topics are sampled too: data that contradicts them stops at start
    samples = sample_keys(bootstrap_servers, to_sample, consumer_config=consumer_config)
    choices = decide_partitioners(topology, partition_counts, samples, recorded)
    for t, c in sorted(choices.items()):
        log.info("partitioner of %s: %s%s", t, c, " [declared]" if t in declared else "")
    if application_id:
        record_decisions(bootstrap_servers, application_id, choices, recorded, partition_counts)
    return choices


# -- the record of routing decisions ------------------------------------------------------------------
# ``<application-id>-partitioning`` (1 partition, compacted): key = a source topic that routes
# foreign-key subscriptions, value = JSON {"version": 1, "partitioner": family, "how": ...}. Written
# when the application first decides that topic's partitioner (worker or backfill), read at every
# start: the subscriptions already stored sit where that partitioner put them, so it never changes.
RECORD_VERSION = 1


def partitioning_topic(application_id: str) -> str:
    return f"{application_id}-partitioning"


def read_recorded(bootstrap_servers: Cluster, application_id: str, existing: dict[str, int]) -> dict[str, str]:
    """``{topic: partitioner family}`` recorded for the application (empty before its first start)."""
    topic = partitioning_topic(application_id)
    if topic not in existing:
        return {}
    out: dict[str, str] = {}
    for m in kafka.read_topic(bootstrap_servers, topic, isolation_level="read_uncommitted"):
        if m.key() is None:
            continue
        if m.value() is None:
            out.pop(m.key().decode(), None)
            continue
        try:
            rec = json.loads(m.value())
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or rec.get("version") != RECORD_VERSION:
            raise ConfigError(f"{topic}[{m.partition()}]@{m.offset()}: a partitioning record this build "
                              f"cannot read (version {rec.get('version') if isinstance(rec, dict) else '?'}; "
                              f"this build reads {RECORD_VERSION})")
        out[m.key().decode()] = rec["partitioner"]
    return out


def record_decisions(bootstrap_servers: Cluster, application_id: str, choices: dict[str, PartitionerChoice],
                     recorded: dict[str, str], existing: dict[str, int]) -> None:
    """Record the partitioner of every routing topic not recorded yet."""
    new = {t: c for t, c in choices.items() if c.routes and t not in recorded}
    if not new:
        return
    topic = partitioning_topic(application_id)
    if topic not in existing:
        kafka.create_topics(bootstrap_servers, {topic: 1}, config=kafka.CHANGELOG_TOPIC_CONFIG)
        existing[topic] = 1
    # one record per topic, so no order to keep: not idempotent (its start costs ~0.5 s on Tansu)
    p = kafka.new_producer({**kafka.producer_defaults(bootstrap_servers), "enable.idempotence": False},
                           "recording partitioner decisions")
    for t, c in sorted(new.items()):
        p.produce(topic, json.dumps({"version": RECORD_VERSION, "partitioner": c.partitioner.name,
                                     "how": c.how}).encode(), t.encode())
    if p.flush(30):
        raise KafkaIOError(f"recording the partitioners of {sorted(new)} in {topic} did not finish within 30 s")
    for t, c in sorted(new.items()):
        log.info("recorded: foreign-key subscriptions are routed by the %s partitioner of %s", c.partitioner.name, t)
