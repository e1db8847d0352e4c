"""Sampling source topics for the partitioner that placed their keys (Kafka I/O only; the
decision is ``processor.engine.routing.decide_partitioners``)."""

from __future__ import annotations

import logging
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from processor.engine.routing import PartitionerChoice, decide_partitioners
from processor.errors import ConfigError
from processor.runtime import kafka

log = logging.getLogger("processor.partitioning")

SAMPLE_PER_PARTITION = 1000


def sample_keys(bootstrap_servers: str, topics: dict[str, int], per_partition: int = SAMPLE_PER_PARTITION,
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
    c = Consumer(conf)
    out: dict[str, list] = {t: [] for t in topics}
    counts: dict[tuple[str, int], int] = {}
    tps = [TopicPartition(t, p, OFFSET_BEGINNING) for t, n in topics.items() for p in range(n)]
    done: set[tuple[str, int]] = set()
    try:
        c.assign(tps)
        deadline = time.monotonic() + timeout_s
        while len(done) < len(tps):
            if time.monotonic() > deadline:
                raise ConfigError(f"sampling keys of {sorted(topics)} for their partitioner did not "
                                  f"reach the end of {sorted(set((tp.topic, tp.partition) for tp in tps) - done)} "
                                  f"within {timeout_s:.0f} s")
            for m in c.consume(1000, 0.2):
                tp = (m.topic(), m.partition())
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(tp)
                        continue
                    raise ConfigError(f"sampling {tp[0]}[{tp[1]}] for its partitioner: {err.str()}")
                if tp in done:
                    continue
                out[tp[0]].append((m.key(), tp[1], m.offset()))
                counts[tp] = counts.get(tp, 0) + 1
                if counts[tp] >= per_partition:
                    done.add(tp)
                    c.pause([TopicPartition(*tp)])
    finally:
        c.close()
    return out


def determine_partitioners(topology, bootstrap_servers: str, partition_counts: dict[str, int],
                           consumer_config: dict | None = None) -> dict[str, PartitionerChoice]:
    """Declared or detected partitioner of every source topic a join depends on; logs one line
    per topic. Raises ``PartitioningError`` (exit 2) as ``decide_partitioners`` does."""
    relevant = topology.partitioning_relevant_topics()
    declared = topology.declared_partitioners()
    to_sample = {t: partition_counts[t] for t in relevant if partition_counts[t] > 1}
    # declared topics are sampled too: a declaration the data contradicts stops at start
    samples = sample_keys(bootstrap_servers, to_sample, consumer_config=consumer_config)
    choices = decide_partitioners(topology, partition_counts, samples)
    for t, c in sorted(choices.items()):
        log.info("partitioner of %s: %s%s", t, c, " [declared]" if t in declared else "")
    return choices
