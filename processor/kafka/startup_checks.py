"""The checks both hosts (the worker and the backfill) run before they read a record, written once.

Invariant: a host that passes them reads topics that exist, co-partitioned topics with equal
partition counts, and (under ``on_error="dlq"``) has a dead-letter topic it may write to; a host that
fails them has changed nothing on the broker and stops with one ``ConfigError`` naming the topics
and the application (exit code 2). Internal topics are created and checked by
``processor.kafka.internal_topics``.

The start-up routine of both hosts, in two steps (the backfill starts Spark between them):
``check_topics`` (nothing changes on the broker: the topics read and written exist, existing
internal topics have the partitions and policy wanted, co-partitioned topics, internal ones
included, have equal counts), then ``create_topics`` (the missing internal topics, the
dead-letter topic; a warning for a source topic that is a table's changelog).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from processor.errors import ConfigError, KafkaIOError

log = logging.getLogger("processor.topics")


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


def ensure_dead_letter_topic(cluster: Any, on_error: str, topic: str, partitions: Mapping[str, int],
                             replication_factor: int | None) -> bool:
    """Under ``on_error="dlq"``: create the dead-letter ``topic`` (one partition; the internal
    topics' replication factor, default min(3, brokers)) unless it is among ``partitions``, then
    check that this host may write to it (``check_dead_letter_topic_writable``). Returns whether
    it was created."""
    if on_error != "dlq":
        return False
    from processor.kafka import clients as kafka
    from processor.kafka import internal_topics

    created = topic not in partitions
    if created:
        rf = replication_factor if replication_factor is not None else \
            internal_topics.default_replication_factor(cluster)
        kafka.create_topics(cluster, {topic: 1}, replication_factor=rf)
    check_dead_letter_topic_writable(cluster, on_error, topic)
    return created


def check_dead_letter_topic_writable(cluster: Any, on_error: str, topic: str, timeout_s: float = 15.0) -> None:
    """Under ``on_error="dlq"``: refuse to start when the broker says this host may not write to
    the dead-letter ``topic`` (its ACLs, as DescribeTopics' authorized operations report them,
    KIP-430), so no input is read, let alone committed, that could not be dead-lettered. A broker
    that does not report authorized operations (no authorizer, or an older broker) passes: a write
    refused later fails its delivery, which stops the host before the input is committed."""
    if on_error != "dlq":
        return
    from confluent_kafka import KafkaError, KafkaException, TopicCollection
    from confluent_kafka.admin import AclOperation

    from processor.kafka import clients as kafka

    client = kafka.admin(cluster, "checking the dead-letter topic's permissions")

    def describe():
        future = client.describe_topics(TopicCollection([topic]), request_timeout=timeout_s,
                                        include_authorized_operations=True)[topic]
        try:
            return future.result()
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise ConfigError(f"the dead-letter topic {topic!r} on {cluster} refuses this application: not "
                                  f"authorized to describe it; grant it WRITE and DESCRIBE there (--on-error dlq), "
                                  f"or choose --on-error skip|fail") from None
            raise
    # a node that does not know the new topic yet answers UNKNOWN_TOPIC_OR_PART (seen on a loaded
    # three-node cluster): asked again; a check that cannot run is one line, and the host starts
    # (a refused write still stops it before its input is committed)
    deadline = time.monotonic() + 30.0
    while True:
        try:
            description = kafka.retry_transient(describe, f"describing the dead-letter topic {topic!r}",
                                                timeout_s=timeout_s)
            break
        except KafkaIOError as exc:
            if time.monotonic() >= deadline:
                log.warning(
                    "the dead-letter topic %s's permissions could not be read (%s): a write it refuses will stop "
                    "the worker when it happens", topic, exc)
                return
            time.sleep(0.5)
    operations = description.authorized_operations
    if operations and AclOperation.WRITE not in operations and AclOperation.ALL not in operations:
        raise ConfigError(f"the dead-letter topic {topic!r} on {cluster} refuses this application's writes "
                          f"(its ACLs grant {', '.join(sorted(op.name for op in operations))}, not WRITE); grant "
                          f"WRITE on it (--on-error dlq), or choose --on-error skip|fail")


# a v2 record batch's header: what a batch of one record adds to it (the broker checks the batch
# against the topic's ``max.message.bytes``)
RECORD_BATCH_OVERHEAD = 61


def dead_letter_record_limit(cluster: Any, topic: str, producer_limit: int) -> int:
    """The largest dead-letter record this host sends whole: the producer's ``message.max.bytes``,
    or less when the dead-letter ``topic``'s own ``max.message.bytes`` is smaller (created by the
    user so, or the broker's default under a producer allowed more): past it, a stub
    (``processor/engine/dead_letters.py``) rather than a delivery the broker refuses. A broker
    that reports no such setting: the producer's."""
    from processor.kafka import internal_topics

    deadline = time.monotonic() + 30.0
    while True:
        try:
            described = internal_topics.describe(cluster, [topic])
            break
        except KafkaIOError as exc:   # (a node that does not know the new topic yet: again)
            if time.monotonic() >= deadline:
                log.warning(
                    "the dead-letter topic %s's max.message.bytes could not be read (%s): dead-letter records "
                    "are kept within the producer's message.max.bytes (%d)", topic, exc, producer_limit)
                return producer_limit
            time.sleep(0.5)
    value = described.get(topic, {}).get("max.message.bytes")
    try:
        topic_limit = int(value) - RECORD_BATCH_OVERHEAD if value is not None else producer_limit
    except ValueError:
        topic_limit = producer_limit
    return min(producer_limit, topic_limit)



@dataclass
class TopicPlan:
    """What ``check_topics`` found: the partitions of every topic on the broker (``counts``), the
    internal and changelog topics the topology wants (``wanted``: topic -> (partitions, kind)),
    and the internal ones a sub-topology reads (``internal``: topic -> partitions)."""

    counts: dict[str, int]
    wanted: dict[str, tuple[int, str]]
    internal: dict[str, int]


def check_topics(cluster: Any, topology: Any, application_id: str, before: str, *, sinks: bool = True,
                 timeout_s: float = 10.0) -> TopicPlan:
    """The first step of a host's start-up (see the module docstring); ``sinks``: whether the
    host writes the topology's output topics (they must exist)."""
    from processor.kafka import clients as kafka
    from processor.kafka import internal_topics

    counts = kafka.topic_partitions(cluster, timeout_s)
    required = list(dict.fromkeys(topology.external_source_topics()))
    if sinks:
        required += topology.sink_topics(internal=False)
    require_topics(cluster, counts, required + topology.global_topics(), application_id, before)
    wanted = internal_topics.wanted_topics(topology, counts)
    internal = {t: n for t, (n, kind) in wanted.items() if kind != "changelog"}
    # existing internal topics first (one with another partition count is named as such), then
    # co-partitioning (internal sources included); only then is anything created
    internal_topics.check_existing(cluster, application_id, wanted, counts)
    check_co_partitioning(topology, {**internal, **counts})
    return TopicPlan(counts, wanted, internal)


def create_topics(cluster: Any, topology: Any, plan: TopicPlan, *, replication_factor: int | None,
                  topic_configs: Mapping[str, dict] | None, on_error: str, dead_letter_topic: str) -> dict[str, int]:
    """The second step: the missing internal and changelog topics (``replication_factor``, None:
    min(3, brokers); ``topic_configs`` per kind), the dead-letter topic under ``on_error="dlq"``;
    returns the partitions of every topic, those created included."""
    from processor.kafka import internal_topics

    created = internal_topics.create_missing(cluster, plan.wanted, plan.counts, replication_factor,
                                             dict(topic_configs or {}))
    internal_topics.warn_deleting_sources(cluster, sorted(topology.reused_source_topics()))
    ensure_dead_letter_topic(cluster, on_error, dead_letter_topic, plan.counts, replication_factor)
    return {**plan.counts, **{t: plan.wanted[t][0] for t in created}}
