"""Internal topics (changelogs, repartition topics, foreign-key subscription/response topics):
created as the application needs them, checked when they exist.

Invariant: a worker or backfill runs only on internal topics that are what the application
needs: the partition count its tasks need, and the cleanup policy of the topic's kind
(``compact`` for changelogs, a restore reads the last write per key; ``delete`` for repartition
and foreign-key topics, whose every record is read once and which compaction would thin). An
existing topic that differs is reported by name (``ConfigError``, exit 2), never used.

Created topics get the replication factor asked for (default ``min(3, brokers in the cluster)``,
as Kafka Streams' ``replication.factor=-1`` defers to the broker's default of 3 where there are
three brokers) and, per kind, this product's settings (explicit retention: ``-1``) under the
user's (``--changelog-topic-config``, ``--repartition-topic-config``,
``--foreign-key-topic-config``). All existing topics are described in one admin request.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import ConfigResource, ResourceType

from processor.errors import ConfigError, KafkaIOError
from processor.kafka import clients as kafka
from processor.kafka.topic_kinds import KINDS, NEEDS_COMPACT, check_kind_configs, is_compact, need

log = logging.getLogger("processor.topics")

DEFAULT_CONFIGS = {"changelog": kafka.CHANGELOG_TOPIC_CONFIG, "repartition": kafka.TOPIC_CONFIG,
                   "foreign-key": kafka.TOPIC_CONFIG}


def wanted_topics(topology, partitions: dict[str, int]) -> dict[str, tuple[int, str]]:
    """``{topic: (partition count, kind)}`` of every internal topic of ``topology`` (for an
    application: ``topology.for_application(...)``), given the partition counts of its sources."""
    internal = topology.internal_topic_partitions(partitions)
    fk = {n.sink_topic for n in topology.nodes if n.sink_topic and n.attrs.partitions_from == "reader"}
    out = {t: (n, "foreign-key" if t in fk else "repartition") for t, n in internal.items()}
    counts = {**partitions, **internal}
    out.update({t: (n, "changelog") for t, n in topology.changelog_topic_partitions(counts).items()})
    return out


def default_replication_factor(cluster) -> int:
    """``min(3, brokers in the cluster)``."""
    client = kafka.admin(cluster)
    md = kafka.retry_transient(lambda: client.list_topics(timeout=10), "reading the cluster's brokers",
                               kafka.CREATE_RETRY_S)
    return max(1, min(3, len(md.brokers)))


def ensure(cluster, application_id: str, wanted: dict[str, tuple[int, str]], existing: dict[str, int],
           replication_factor: int | None = None, kind_configs: dict[str, dict] | None = None) -> list[str]:
    """Check the ``wanted`` topics that exist (partition count, cleanup policy) and create the
    others; returns the topics created."""
    check_existing(cluster, application_id, wanted, existing)
    return create_missing(cluster, wanted, existing, replication_factor, kind_configs)


def check_existing(cluster, application_id: str, wanted: dict[str, tuple[int, str]],
                   existing: dict[str, int]) -> None:
    """Refuse (ConfigError) a ``wanted`` topic that exists with another partition count or the
    wrong cleanup policy; creates nothing."""
    for t, (n, kind) in sorted(wanted.items()):
        if t in existing and existing[t] != n:
            raise ConfigError(f"{kind} topic {t} has {existing[t]} partitions, but application "
                              f"{application_id!r} needs {n}; delete it or reset the application")
    present = sorted(t for t in wanted if t in existing)
    if present:
        described = describe(cluster, present)
        for t in present:
            kind = wanted[t][1]
            # a topic created without the setting reports nothing on some brokers (Tansu): the
            # broker's default, delete
            policy = described.get(t, {}).get("cleanup.policy", "delete")
            if is_compact(policy) != NEEDS_COMPACT[kind]:
                raise ConfigError(f"{kind} topic {t} has cleanup.policy={policy}, but application "
                                  f"{application_id!r} needs {need(kind)}; delete it or reset the application")


def create_missing(cluster, wanted: dict[str, tuple[int, str]], existing: dict[str, int],
                   replication_factor: int | None = None, kind_configs: dict[str, dict] | None = None) -> list[str]:
    """Create the ``wanted`` topics that do not exist; returns them."""
    kind_configs = check_kind_configs(kind_configs)
    create = {t: nk for t, nk in wanted.items() if t not in existing}
    if not create:
        return []
    rf = replication_factor if replication_factor is not None else default_replication_factor(cluster)
    for kind in KINDS:
        topics = {t: n for t, (n, k) in create.items() if k == kind}
        if topics:
            kafka.create_topics(cluster, topics, config={**DEFAULT_CONFIGS[kind], **kind_configs.get(kind, {})},
                                replication_factor=rf)
            log.info("created %s topic(s) %s (replication factor %d)", kind, ", ".join(sorted(topics)), rf)
    return sorted(create)


def warn_deleting_sources(cluster, topics: list[str]) -> list[str]:
    """Source topics that are their tables' changelogs (``build(reuse_source_topics=True)``) and
    may delete records (not ``cleanup.policy=compact``, and a finite ``retention.ms`` or
    ``retention.bytes``, or a broker that does not say): a warning each, since a restore from
    such a topic cannot bring back a row whose last record the broker deleted (it stops with an
    error naming the partition instead). Returns them."""
    if not topics:
        return []
    described = describe(cluster, topics)
    risky = []
    for t in topics:
        conf = described.get(t, {})
        policy, retention = conf.get("cleanup.policy"), conf.get("retention.ms")
        if policy is not None and is_compact(policy) and "delete" not in str(policy):
            continue
        if policy is not None and str(retention) == "-1" and str(conf.get("retention.bytes", "-1")) == "-1":
            continue
        risky.append(t)
        log.warning("topic %s is a table's changelog (reuse_source_topics), but its cleanup.policy=%s and "
                    "retention.ms=%s%s: a restore from it cannot bring back rows whose records the broker "
                    "deleted; compact the topic, or build without reuse_source_topics",
                    t, policy or "(not reported)", retention or "(not reported)",
                    "" if policy is not None else " (the broker reports neither: assuming its default, delete)")
    return risky


def describe(cluster, topics: list[str]) -> dict[str, dict[str, str]]:
    """``{topic: {setting: value}}`` in one admin request."""
    client = kafka.admin(cluster, "describing internal topics")
    futures = client.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics])
    out = {}
    for res, fut in futures.items():
        try:
            out[res.name] = {k: v.value for k, v in fut.result().items()}
        except KafkaException as exc:
            raise KafkaIOError(f"describing topic {res.name}: {exc.args[0].str() if exc.args else exc}") from None
    return out
