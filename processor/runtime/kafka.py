"""Kafka client settings and admin helpers shared by the worker, the demo, the benchmark and tests."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from processor.errors import ConfigError

# Explicit retention on every topic we create: some brokers (Tansu) report back only the
# settings given at creation, and tools break on a missing retention key.
TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


def consumer_defaults(bootstrap_servers: str) -> dict:
    return {
        "bootstrap.servers": bootstrap_servers,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "range",
        # librdkafka's default (1000 ms) caps a fast consumer near 170k msg/s.
        "fetch.queue.backoff.ms": 10,
        "queued.min.messages": 100000,
        "enable.partition.eof": True,
        "allow.auto.create.topics": False,
    }


def producer_defaults(bootstrap_servers: str) -> dict:
    return {
        "bootstrap.servers": bootstrap_servers,
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 1000000,
        "acks": "all",
        # Java's partitioner: the same key lands on the same partition as with Kafka Streams.
        "partitioner": "murmur2_random",
    }


def admin(bootstrap_servers: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap_servers})


def topic_partitions(bootstrap_servers: str, timeout_s: float = 10.0) -> dict[str, int]:
    """Partition counts of every topic; a clear ConfigError if the broker does not answer."""
    try:
        md = admin(bootstrap_servers).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise ConfigError(f"cannot reach Kafka at {bootstrap_servers} within {timeout_s:.0f} s "
                          f"({exc.args[0].str() if exc.args else exc})") from None
    return {name: len(t.partitions) for name, t in md.topics.items() if not t.error}


def create_topics(bootstrap_servers: str, topics: dict[str, int], exist_ok: bool = True,
                  timeout_s: float = 15.0) -> None:
    """Create ``{topic: partitions}`` (replication 1, explicit retention)."""
    if not topics:
        return
    client = admin(bootstrap_servers)  # must outlive the futures
    futures = client.create_topics(
        [NewTopic(t, n, 1, config=dict(TOPIC_CONFIG)) for t, n in topics.items()],
        operation_timeout=timeout_s, request_timeout=timeout_s)
    for topic, fut in futures.items():
        try:
            fut.result()
        except KafkaException as exc:
            err = exc.args[0]
            if exist_ok and err.name() == "TOPIC_ALREADY_EXISTS":
                continue
            raise ConfigError(f"cannot create topic {topic!r}: {err.str()}") from None
