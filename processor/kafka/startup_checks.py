"""The checks both hosts (the worker and the backfill) run before they read a record, written once.

Invariant: a host that passes them reads topics that exist, co-partitioned topics with equal
partition counts, and (under ``on_error="dlq"``) has a dead-letter topic to write to; a host that
fails them has changed nothing on the broker and stops with one ``ConfigError`` naming the topics
and the application (exit code 2). Internal topics are created and checked by
``processor.kafka.internal_topics``; the hosts call the two in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from processor.errors import ConfigError


def require_topics(cluster: Any, partitions: Mapping[str, int], topics: Iterable[str], application_id: str,
                   before: str) -> None:
    """Refuse to go on when one of ``topics`` is not among ``partitions`` (the topics on the
    broker); ``before`` says what the user creates them before (``"starting"``, ``"backfilling"``)."""
    missing = sorted({t for t in topics if t not in partitions})
    if missing:
        raise ConfigError(f"topic(s) {', '.join(missing)} do not exist on {cluster}; create them before "
                          f"{before} application {application_id!r}")


def check_co_partitioning(topology: Any, partitions: Mapping[str, int | None]) -> None:
    """Refuse a sub-topology whose source topics found in ``partitions`` have different partition
    counts: a task reads partition *p* of each, so they must be equal (Kafka Streams'
    co-partitioning requirement). The caller chooses which topics to compare by what it passes."""
    for i in range(len(topology.subtopologies)):
        counts = {t: partitions[t] for t in topology.source_topics(i) if t in partitions}
        if len(set(counts.values())) > 1:
            listing = ", ".join(f"{t}={n}" for t, n in sorted(counts.items()))
            raise ConfigError(f"co-partitioned source topics of sub-topology {i} have different "
                              f"partition counts ({listing}); they must be equal")


def create_dead_letter_topic(cluster: Any, on_error: str, topic: str, partitions: Mapping[str, int],
                             replication_factor: int | None) -> bool:
    """Under ``on_error="dlq"``: create the dead-letter ``topic`` (one partition; the internal
    topics' replication factor, default min(3, brokers)) unless it is among ``partitions``.
    Returns whether it was created."""
    if on_error != "dlq" or topic in partitions:
        return False
    from processor.kafka import clients as kafka
    from processor.kafka import internal_topics

    rf = replication_factor if replication_factor is not None else internal_topics.default_replication_factor(cluster)
    kafka.create_topics(cluster, {topic: 1}, replication_factor=rf)
    return True
