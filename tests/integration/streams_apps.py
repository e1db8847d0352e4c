"""What the tests that run Kafka Streams applications beside ``processor run`` on a broker share
(``test_kafka_streams_on_broker.py``, ``test_kafka_streams_interop.py``): producing a twin's
input steps, reading a topic whole, an application's internal topics and the wait for it to
drain, outputs per key, and a Kafka Streams application (``tests/reference/java/StreamsApp.java``)
started and closed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from confluent_kafka import Producer

from processor.kafka import clients as kafka
from tests.integration.helpers import wait_until_group_drained
from tests.reference import kafka_streams


def produce_steps(bootstrap: str, prefix: str, steps: list[tuple], base_ts: int) -> None:
    """The records of ``steps`` (``(topic, key, value, ts)``; advances skipped) to ``prefix + topic``,
    stamped ``base_ts + ts``, partitioned as Java's clients do (murmur2)."""
    p = Producer({**kafka.producer_defaults(bootstrap), "partitioner": "murmur2_random"})
    for s in steps:
        if s[0] != "advance":
            p.produce(prefix + s[0], key=s[1], value=s[2], timestamp=base_ts + s[3])
    assert p.flush(60) == 0


def read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None, int, int, int]]:
    """Every record of ``topic``: (key, value, timestamp, partition, offset)."""
    return [(m.key(), m.value(), m.timestamp()[1], m.partition(), m.offset())
            for m in kafka.read_topic(bootstrap, topic, isolation_level="read_uncommitted")]


def internal_topics(bootstrap: str, app: str) -> dict[str, int]:
    """The topics an application reads besides its inputs: repartition and foreign-key join topics."""
    md = kafka.admin(bootstrap).list_topics(timeout=10)
    return {t: len(m.partitions) for t, m in md.topics.items()
            if t.startswith(app + "-") and (t.endswith("-repartition") or t.endswith("-topic"))}


def wait_until_app_drained(bootstrap: str, app: str, inputs: dict[str, int], timeout_s: float = 180,
                           check=None) -> None:
    """``app`` (this project's or Kafka Streams') has committed every partition of its ``inputs``,
    then of its inputs and internal topics together, to its end. Internal topics are made at an
    application's first rebalance: they are listed once its inputs are drained, not before."""
    wait_until_group_drained(bootstrap, app, inputs, timeout_s=timeout_s, check=check)
    wait_until_group_drained(bootstrap, app, {**inputs, **internal_topics(bootstrap, app)}, timeout_s=timeout_s,
                             check=check)


def per_key(records, kind: str) -> dict:
    """A ``table`` output: the final non-null value of each key (a key lives in one partition); a
    ``stream``: each key's records as a sorted list of (value, timestamp)."""
    if kind == "table":
        last: dict = {}
        for k, v, _ts, _p, _o in sorted(records, key=lambda r: (r[3], r[4])):
            last[k] = v
        return {k: v for k, v in last.items() if v is not None}
    per: dict = {}
    for k, v, ts, _p, _o in records:
        per.setdefault(k, []).append((v, ts))
    return {k: sorted(vs, key=lambda x: (x[1], x[0] or b"")) for k, vs in per.items()}


def start_kafka_streams(topology: str, params: dict, bootstrap: str, app: str, state_dir: Path, log: Path,
                        settings: dict | None = None) -> subprocess.Popen:
    """``StreamsApp`` running ``topology`` (a twin's name, ``bench:<workload>``, ``interop:reader``)
    with ``params`` and Kafka Streams ``settings``, its output in ``log``; runs until
    ``close_kafka_streams``."""
    with open(log, "w") as out:   # the child keeps its own copy of the descriptor
        return subprocess.Popen(kafka_streams.java_command("StreamsApp", topology, json.dumps(params), bootstrap, app,
                                                           str(state_dir),
                                                           *[f"{k}={v}" for k, v in (settings or {}).items()]),
                                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)


def close_kafka_streams(proc: subprocess.Popen) -> None:
    """Ends its stdin: Kafka Streams closes (flushing its caches, committing); killed after 60 s."""
    if proc.stdin:
        proc.stdin.close()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
