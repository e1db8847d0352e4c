"""Kafka client settings and admin helpers shared by the worker, the demo, the benchmark and tests.

Every client the processor opens is built here: ``consumer_defaults`` / ``producer_defaults``
give a role's settings with the user's (``client_config.KafkaCluster``) layered over them, and
``new_consumer`` / ``new_producer`` / ``admin`` open it, logging which role opened which
settings (secrets redacted) and translating librdkafka's refusal of a setting into a
ConfigError. Each helper's ``bootstrap_servers`` is a bootstrap string or a ``KafkaCluster``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from processor.errors import BrokerUnreachable, ConfigError, KafkaIOError
from processor.kafka.client_config import ClientConfig, Cluster, KafkaCluster, describe_settings, is_secret

# Explicit retention on every topic we create: some brokers (Tansu) report back only the
# settings given at creation, and tools break on a missing retention key.
TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
# Changelogs: compaction requested (a broker without compaction, like Tansu, keeps everything;
# restore is correct either way: last write per key wins).
CHANGELOG_TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "compact"}


# librdkafka's own log lines go to Python logging instead of raw stderr.
KAFKA_LOGGER = logging.getLogger("processor.kafka")
# one DEBUG line per client opened: its role and settings (secrets redacted)
CLIENTS_LOGGER = logging.getLogger("processor.clients")
# a transient error met and retried (``retry_transient``, ``assign``)
RETRY_LOGGER = logging.getLogger("processor.kafka.retry")

# Errors of a broker that is down, paused or moving a leader or coordinator: librdkafka's own (no
# connection, a request timed out) and the broker's retriable ones. Kafka Streams retries such
# errors until ``task.timeout.ms`` (5 minutes by default); so does the worker. (Whether librdkafka
# marks one retriable varies by call: a timed-out ``list_topics`` or ``committed`` is not marked.)
TRANSIENT_CODES = frozenset({
    KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE, KafkaError._WAIT_COORD, KafkaError._WAIT_CACHE, KafkaError._NODE_UPDATE,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.UNSTABLE_OFFSET_COMMIT, KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.KAFKA_STORAGE_ERROR})
# how long the worker retries a transient error before it gives up (Kafka Streams' task.timeout.ms)
TRANSIENT_TIMEOUT_S = 300.0
# how long a topic creation that failed on a transient error (timed out) is tried again
CREATE_RETRY_S = 60.0
_T = TypeVar("_T")


def is_transient(err: KafkaError | None) -> bool:
    """Whether ``err`` is a broker outage's or a leader's/coordinator's move: retry it (never a
    fatal error)."""
    return err is not None and not err.fatal() and (err.retriable() or err.code() in TRANSIENT_CODES)


def _error_of(exc: KafkaException) -> KafkaError | None:
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


def retry_transient(call: Callable[[], _T], what: str, timeout_s: float = TRANSIENT_TIMEOUT_S,
                    unreachable: bool = False) -> _T:
    """``call()``, again after each transient error (``is_transient``: one warning line each) for
    up to ``timeout_s``; then, or at once on any other Kafka error, a ``KafkaIOError`` naming
    ``what`` (``reading the committed offsets of ...``) and the error. With ``unreachable``, a
    ``BrokerUnreachable`` (a metadata request or a read of partition ends that timed out) is
    transient too: a worker outlives a broker's pause or restart, as Kafka Streams retries until
    ``task.timeout.ms``."""
    deadline = time.monotonic() + timeout_s
    failures = 0
    while True:
        try:
            return call()
        except KafkaException as exc:
            err = _error_of(exc)
            text = err.str() if err is not None else str(exc)
            if not is_transient(err):
                raise KafkaIOError(f"{what}: {text}") from None
        except BrokerUnreachable as exc:
            if not unreachable:
                raise
            text = str(exc)
        failures += 1
        left = deadline - time.monotonic()
        if left <= 0:
            raise KafkaIOError(f"{what}: the broker did not answer within {timeout_s:.0f} s "
                               f"({failures} attempts; last: {text})") from None
        RETRY_LOGGER.warning("%s failed (%s): transient, retrying (attempt %d, giving up in %.0f s)",
                             what, text, failures + 1, left)
        time.sleep(min(0.5, left))


def raise_partition_error(partitions: list) -> list:
    """``partitions`` (what ``committed`` or a synchronous ``commit`` returns), or a
    ``KafkaException`` of the first partition's error (so that ``retry_transient`` retries a
    transient one, as a coordinator's per-partition answer can be)."""
    for tp in partitions or []:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return partitions


def cluster_of(bootstrap_servers, config: ClientConfig | None = None) -> KafkaCluster:
    """A ``KafkaCluster`` for a bootstrap string (no user settings unless ``config``) or the
    cluster itself; ``config`` replaces a given cluster's settings."""
    if isinstance(bootstrap_servers, KafkaCluster):
        return bootstrap_servers if config is None else KafkaCluster(bootstrap_servers.bootstrap_servers, config)
    return KafkaCluster(str(bootstrap_servers), config or ClientConfig())


def new_consumer(conf: dict, role: str) -> Consumer:
    return _open(Consumer, "consumer", conf, role)


def new_producer(conf: dict, role: str) -> Producer:
    return _open(Producer, "producer", conf, role)


def _open(cls, kind: str, conf: dict, role: str):
    shown = {k: v for k, v in conf.items() if k not in ("logger", "on_delivery", "error_cb")}
    if CLIENTS_LOGGER.isEnabledFor(logging.DEBUG):
        CLIENTS_LOGGER.debug("opening %s for %s: %s", kind, role, describe_settings(shown))
    try:
        return cls(conf)
    except (KafkaException, ValueError, TypeError) as exc:
        text = str(exc.args[0].str() if isinstance(exc, KafkaException) and exc.args else exc)
        for k, v in conf.items():
            if is_secret(k) and isinstance(v, str) and v:
                text = text.replace(v, "*****")
        raise ConfigError(f"Kafka client settings of the {kind} for {role} refused: {text}") from None


def assign(consumer: Consumer, partitions: list, timeout_s: float = 10.0) -> None:
    """``consumer.assign(partitions)``, with the metadata of their topics fetched first where
    a partition starts at a logical offset (BEGINNING, END): librdkafka queries such an offset
    at once only if it knows the partition's leader, and otherwise on a 500 ms retry timer
    (measured on the local broker: first record 0.52 s after assign, 0.08 s with the metadata
    known). Explicit offsets need no query.

    The metadata saves time only: when the broker does not give it (a transient error: down,
    paused, electing leaders) the partitions are assigned without it, with one warning line
    (librdkafka finds the leaders itself and its fetches wait for them); any other error is a
    ``KafkaIOError``."""
    if any(tp.offset < 0 for tp in partitions):
        for topic in dict.fromkeys(tp.topic for tp in partitions if tp.offset < 0):
            try:
                consumer.list_topics(topic, timeout=timeout_s)
            except KafkaException as exc:
                err = _error_of(exc)
                text = err.str() if err is not None else str(exc)
                if not is_transient(err):
                    raise KafkaIOError(f"fetching the metadata of topic {topic!r}: {text}") from None
                RETRY_LOGGER.warning("the metadata of topic %s did not come (%s): transient, assigning its "
                                     "partitions without it (librdkafka looks the leaders up itself)", topic, text)
                break   # (the broker is not answering: not another wait for each topic)
    consumer.assign(partitions)


def consumer_defaults(bootstrap_servers: Cluster) -> dict:
    """A consumer's settings: the defaults below, then the cluster's common and consumer settings."""
    cluster = cluster_of(bootstrap_servers)
    return {**{
        "bootstrap.servers": cluster.bootstrap_servers,
        "logger": KAFKA_LOGGER,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "range",
        # librdkafka's default (1000 ms) caps a fast consumer near 170k msg/s.
        "fetch.queue.backoff.ms": 10,
        "queued.min.messages": 100000,
        "enable.partition.eof": True,
        "allow.auto.create.topics": False,
    }, **cluster.config.for_kind("consumer")}


def producer_defaults(bootstrap_servers: Cluster) -> dict:
    """A producer's settings: the defaults below, then the cluster's common and producer settings."""
    cluster = cluster_of(bootstrap_servers)
    return {**{
        "bootstrap.servers": cluster.bootstrap_servers,
        "logger": KAFKA_LOGGER,
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 1000000,
        "acks": "all",
        # Idempotence keeps each partition in send order across retries: the provenance
        # high-water marks on internal topics rely on per-partition order.
        "enable.idempotence": True,
        # Java's partitioner: the same key lands on the same partition as with Kafka Streams.
        "partitioner": "murmur2_random",
    }, **cluster.config.for_kind("producer")}


def admin(bootstrap_servers: Cluster, role: str = "topic administration") -> AdminClient:
    cluster = cluster_of(bootstrap_servers)
    return _open(AdminClient, "admin client", {"bootstrap.servers": cluster.bootstrap_servers,
                                               "logger": KAFKA_LOGGER, **cluster.config.for_kind("admin")},
                 role)


def topic_partitions(bootstrap_servers: Cluster, timeout_s: float = 10.0) -> dict[str, int]:
    """Partition counts of every topic; BrokerUnreachable (one line) if the broker does not answer."""
    try:
        md = admin(bootstrap_servers).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise BrokerUnreachable(f"cannot reach Kafka at {bootstrap_servers} within {timeout_s:g} s "
                                f"({exc.args[0].str() if exc.args else exc})") from None
    return {name: len(t.partitions) for name, t in md.topics.items() if not t.error}


def create_topics(bootstrap_servers: Cluster, topics: dict[str, int], exist_ok: bool = True,
                  timeout_s: float = 15.0, config: dict | None = None, replication_factor: int = 1,
                  retry_s: float = CREATE_RETRY_S) -> None:
    """Create ``{topic: partitions}`` (explicit retention, or ``config``), and return once the
    broker's metadata lists every one of them with its partitions: Apache Kafka answers
    CreateTopics when its controller has the topic, and a broker's metadata may show it a
    moment later (a client that looks it up at once would find it missing)."""
    if not topics:
        return
    client = admin(bootstrap_servers)  # must outlive the futures
    # a transient error (the controller too busy to answer in time) is retried for up to
    # ``retry_s``; a topic a retry finds existing was created by the attempt that timed out
    pending, retried = dict(topics), set()
    retry_until = time.monotonic() + retry_s
    while pending:
        futures = client.create_topics(
            [NewTopic(t, n, replication_factor, config=dict(config or TOPIC_CONFIG)) for t, n in pending.items()],
            operation_timeout=timeout_s, request_timeout=timeout_s)
        again: dict[str, int] = {}
        for topic, fut in futures.items():
            try:
                fut.result()
            except KafkaException as exc:
                err = exc.args[0]
                if err.name() == "TOPIC_ALREADY_EXISTS" and (exist_ok or topic in retried):
                    continue
                if is_transient(err) and time.monotonic() < retry_until:
                    again[topic] = pending[topic]
                    continue
                raise ConfigError(f"cannot create topic {topic!r}: {err.str()}") from None
        if again:
            RETRY_LOGGER.warning("creating topic(s) %s failed (%s): transient, retrying for up to %.0f s more",
                                 ", ".join(sorted(again)), "the broker did not answer in time",
                                 max(0.0, retry_until - time.monotonic()))
            retried |= set(again)
            time.sleep(0.5)
        pending = again
    # (a wait, not a check: a metadata request that times out, on a broker too busy to answer,
    # ends it; whoever uses the topics next finds out for itself)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            listed = client.list_topics(timeout=max(1.0, deadline - time.monotonic())).topics
        except KafkaException as exc:
            CLIENTS_LOGGER.warning("created topics %s; the broker's metadata did not answer (%s)", sorted(topics), exc)
            return
        missing = [t for t in topics if t not in listed or listed[t].error is not None or not listed[t].partitions]
        if not missing or time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def read_topic(bootstrap_servers: Cluster, topic: str, timeout_s: float = 30.0,
               isolation_level: str = "read_committed") -> list:
    """Every record of ``topic`` from the beginning to its current end, partition by partition
    (a list of confluent_kafka Messages, ordered by partition then offset). Uses partition EOF,
    not list_offsets, to find the end (list_offsets latest is wrong on some brokers); with
    read_committed that end is the last stable offset."""
    parts = topic_partitions(bootstrap_servers).get(topic)
    if parts is None:
        raise ConfigError(f"topic {topic!r} does not exist on {bootstrap_servers}")
    conf = consumer_defaults(bootstrap_servers)
    conf["group.id"] = f"reader-{topic}-{time.time_ns()}"
    conf["isolation.level"] = isolation_level
    conf["fetch.wait.max.ms"] = 50   # a one-off reader: reach partition EOF quickly
    from processor.kafka.read_to_end import PartitionsToEnd

    c = new_consumer(conf, f"reading {topic}")
    by_part: dict[int, list] = {p: [] for p in range(parts)}
    try:
        reader = PartitionsToEnd(c, {(topic, p): 0 for p in range(parts)})
        for m in reader.records(
                timeout_s,
                error=lambda tp, err: KafkaIOError(f"reading {topic!r}: {err.str()}"),
                timeout=lambda pending: KafkaIOError(f"reading {topic!r} did not reach the end of partitions "
                                                     f"{[p for _, p in pending]} within {timeout_s:.0f} s")):
            by_part[cast(int, m.partition())].append(m)
    finally:
        c.close()
    return [m for p in range(parts) for m in by_part[p]]


def partitions_with_records_from(bootstrap_servers: Cluster, positions: dict[tuple[str, int], int],
                                 timeout_s: float = 30.0,
                                 isolation_level: str = "read_uncommitted") -> set[tuple[str, int]]:
    """Which of ``{(topic, partition): offset}`` hold a record at or after ``offset`` (found by
    reading up to partition EOF, not by list_offsets; with read_committed, EOF is the last
    stable offset)."""
    if not positions:
        return set()
    conf = consumer_defaults(bootstrap_servers)
    conf["group.id"] = f"probe-{time.time_ns()}"
    conf["isolation.level"] = isolation_level
    conf["fetch.wait.max.ms"] = 50
    from processor.kafka.read_to_end import PartitionsToEnd

    c = new_consumer(conf, "probing partition ends")
    more: set[tuple[str, int]] = set()
    try:
        reader = PartitionsToEnd(c, positions)
        for m in reader.records(
                timeout_s, batch=100,
                error=lambda tp, err: KafkaIOError(f"probing {tp[0]}[{tp[1]}]: {err.str()}"),
                timeout=lambda pending: KafkaIOError(f"probing {pending} did not reach the end "
                                                     f"within {timeout_s:.0f} s")):
            key = cast(tuple[str, int], (m.topic(), m.partition()))
            more.add(key)           # one record there is enough
            reader.finish(key)
    finally:
        c.close()
    return more
