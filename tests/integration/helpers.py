"""Helpers for the integration tests: load data, read it back, compute the driver's answer."""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict

from confluent_kafka import Consumer, Producer, TopicPartition

from processor.runtime import kafka
from processor.serde import Serdes
from processor.testing import TopologyTestDriver


def table_updates(n: int, keys: int, seed: int = 1, delete_rate: float = 0.1):
    """(key bytes, json value bytes | None) updates with tombstones and repeated values."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        k = f"k{rnd.randrange(keys):05d}".encode()
        if rnd.random() < delete_rate:
            out.append((k, None))
        else:
            out.append((k, json.dumps({"amount": rnd.randrange(0, 200)}, separators=(",", ":")).encode()))
    return out


def produce(bootstrap: str, topic: str, records, timestamp0: int = 1_000_000, timestamps=None) -> dict[int, int]:
    """Produce (key, value) pairs, record ``i`` at ``timestamp0 + i`` (or ``timestamps[i]``);
    returns {partition: end offset} from the delivery reports."""
    return produce_paced(bootstrap, topic, records, chunk=0, pause_s=0, timestamp0=timestamp0, timestamps=timestamps)


def produce_paced(bootstrap: str, topic: str, records, chunk: int, pause_s: float, timestamp0: int = 1_000_000,
                  hurry=lambda: False, timestamps=None) -> dict[int, int]:
    """Produce (key, value) pairs, record ``i`` at ``timestamp0 + i`` (or ``timestamps[i]``),
    through one producer; with ``chunk`` > 0 in chunks of ``chunk`` records each flushed and
    followed by ``pause_s`` of quiet, so a worker sees input arrive steadily; once ``hurry()`` is
    true the rest goes out at once. Returns {partition: end offset} from the delivery reports."""
    ends: dict[int, int] = {}
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    p = Producer(kafka.producer_defaults(bootstrap))
    paced = chunk > 0
    for i, (k, v) in enumerate(records):
        ts = timestamp0 + i if timestamps is None else timestamps[i]
        while True:
            try:
                p.produce(topic, v, k, timestamp=ts, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        if paced and (i + 1) % chunk == 0:
            assert p.flush(30) == 0
            paced = not hurry()
            if paced:
                time.sleep(pause_s)
    assert p.flush(30) == 0
    assert not errors, errors
    return ends


def skewed_events(n: int, keys: int, seed: int = 1, exponent: float = 1.1, amounts: int = 1000,
                  regions=("eu", "us", "apac", "latam", "mea")):
    """(key bytes, json value bytes) stream events: user keys with a Zipf-like skew (the key of
    rank r has weight 1 / (r + 1) ** exponent), value ``{"amount": int, "region": str}`` with
    regions skewed the same way."""
    rnd = random.Random(seed)
    user_keys = [f"user-{i:05d}".encode() for i in range(keys)]
    user_w = [1 / (r + 1) ** exponent for r in range(keys)]
    region_w = [1 / (r + 1) for r in range(len(regions))]
    users = rnd.choices(user_keys, weights=user_w, k=n)
    regs = rnd.choices(regions, weights=region_w, k=n)
    return [(u, json.dumps({"amount": rnd.randrange(amounts), "region": r}, separators=(",", ":")).encode())
            for u, r in zip(users, regs)]


def by_key(messages) -> dict[bytes, list]:
    """{key: [(value bytes, timestamp), ...]} in topic order (each key lives in one partition)."""
    out = defaultdict(list)
    for m in messages:
        out[m.key()].append((m.value(), m.timestamp()[1]))
    return dict(out)


def driver_output_by_key(topology_factory, input_topic, output_topic, input_messages) -> dict[bytes, list]:
    """What the broker-free driver produces for the same input, partition by partition."""
    return driver_outputs_by_key(topology_factory, input_topic, [output_topic], input_messages)[output_topic]


def driver_outputs_by_key(topology_factory, input_topic, output_topics, input_messages,
                          per_partition: bool = True) -> dict[str, dict[bytes, list]]:
    """``{output topic: {key: [(value bytes, timestamp), ...]}}`` the broker-free driver produces
    for the same input: one driver per input partition (the order a task sees), or with
    ``per_partition=False`` one driver over all of it. Read after ``close()``, which flushes
    deferred emissions as a graceful worker shutdown does."""
    out = {t: defaultdict(list) for t in output_topics}
    parts = defaultdict(list)
    for m in input_messages:
        parts[m.partition() if per_partition else 0].append(m)
    for p in sorted(parts):
        d = TopologyTestDriver(topology_factory(), on_error="skip")
        with d:
            for m in parts[p]:
                d.pipe_raw(input_topic, m.key(), m.value(), m.timestamp()[1])
        for t in output_topics:
            for r in d.read_output(t, key_serde=Serdes.bytes(), value_serde=Serdes.bytes()):
                out[t][r.key].append((r.value, r.timestamp))
    return {t: dict(v) for t, v in out.items()}



def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition (negative: none)."""
    conf = kafka.consumer_defaults(bootstrap)
    conf["group.id"] = group
    c = Consumer(conf)
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()
