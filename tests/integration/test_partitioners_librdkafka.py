"""Our pure-Python partitioners against librdkafka itself, on a real broker.

For every librdkafka partitioner name (``murmur2``, ``murmur2_random``, ``consistent``,
``consistent_random``, ``fnv1a``, ``fnv1a_random``) and partition counts 3 and 7, thousands of keys
(random bytes of length 0..20, many empty ones among them, plus typical string keys) are produced
through a confluent-kafka ``Producer({"partitioner": name})``; the partition of every record is
read from its delivery report and must equal ``PARTITIONERS[name].partition(key, n)`` for every
key the family ``places``. The keys not placed must be exactly the empty keys for the
``consistent`` family (``consistent_random`` spreads them like NULL) and none otherwise."""

import random
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer

from processor.engine.partitioners import CONSISTENT, PARTITIONERS
from processor.kafka import clients as kafka

NAMES = ("murmur2", "murmur2_random", "consistent", "consistent_random", "fnv1a", "fnv1a_random")
COUNTS = (3, 7)
RANDOM_KEYS = 4_000


def _keys() -> list[bytes]:
    rnd = random.Random(12)
    keys = [rnd.randbytes(rnd.randrange(0, 21)) for _ in range(RANDOM_KEYS)]
    keys += [f"order-{i:05d}".encode() for i in range(300)]
    keys += [f"cust-{i}".encode() for i in range(200)]
    keys += [str(i).encode() for i in range(200)]
    keys += [str(uuid.UUID(int=rnd.getrandbits(128))).encode() for _ in range(150)]
    keys += [f"user@example-{i}.com".encode() for i in range(50)]
    keys += [f"ключ-{i}-東京".encode() for i in range(50)]
    keys += [b'{"id":%d}' % i for i in range(50)]
    keys += [b"\x00" * i for i in range(1, 21)] + [b"\xff" * i for i in range(1, 21)]
    keys += [b""] * 40   # more empty keys: enough to see how each partitioner treats them
    return keys


KEYS = _keys()
N_EMPTY = sum(1 for k in KEYS if k == b"")


@pytest.fixture(scope="module")
def topics(kafka_bootstrap):
    """One topic per (partitioner name, partition count)."""
    suffix = uuid.uuid4().hex[:8]
    names = {(name, n): f"plib-{name}-{n}-{suffix}" for name in NAMES for n in COUNTS}
    kafka.create_topics(kafka_bootstrap, {t: n for (_, n), t in names.items()})
    return names


def produce_with(bootstrap: str, topic: str, partitioner: str, keys) -> list[tuple[bytes, int, int]]:
    """``[(key, partition, offset)]`` from the delivery reports, in production order (value = index)."""
    got: dict[int, tuple[bytes, int, int]] = {}
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            got[int(msg.value())] = (msg.key(), msg.partition(), msg.offset())

    # sticky.partitioning.linger.ms 0: a record the partitioner spreads at random (NULL key, or an
    # empty key under consistent_random) gets its own random partition instead of sticking to
    # one partition for 10 ms, so spreading is visible in a burst
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": partitioner, "linger.ms": 5,
                  "sticky.partitioning.linger.ms": 0, "logger": kafka.KAFKA_LOGGER})
    for i, k in enumerate(keys):
        while True:
            try:
                p.produce(topic, str(i).encode(), k, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    assert not errors, errors[:5]
    assert sorted(got) == list(range(len(keys)))
    return [got[i] for i in range(len(keys))]


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("name", NAMES)
def test_pure_python_partitioner_equals_librdkafka(kafka_bootstrap, topics, name, n, report):
    assert N_EMPTY > 100
    t0 = time.monotonic()
    reports = produce_with(kafka_bootstrap, topics[(name, n)], name, KEYS)
    seconds = time.monotonic() - t0
    # the broker holds every record where the delivery report says
    stored = [(m.key(), m.partition(), m.offset()) for m in kafka.read_topic(kafka_bootstrap, topics[(name, n)])]
    assert stored == sorted(reports, key=lambda r: (r[1], r[2]))
    delivered = [(k, p) for k, p, _ in reports]
    # the delivery reports carry the keys as produced (b"" stays b"", not None)
    assert [k for k, _ in delivered] == KEYS
    ours = PARTITIONERS[name]
    placed = [(k, p) for k, p in delivered if ours.places(k)]
    unplaced = [k for k, _ in delivered if not ours.places(k)]
    mismatches = [(k, p, ours.partition(k, n)) for k, p in placed if ours.partition(k, n) != p]
    assert mismatches == [], mismatches[:10]
    if ours is CONSISTENT:
        assert unplaced == [b""] * N_EMPTY
    else:
        assert unplaced == []
    assert len(placed) == len(KEYS) - len(unplaced)
    # every partition is used: the comparison covered all of them
    assert {p for _, p in delivered} == set(range(n))

    empty_parts = Counter(p for k, p in delivered if k == b"")
    if name == "consistent_random":
        # spread like a null key (so no partitioner can place it, hence places(b"") is False)
        assert len(empty_parts) == n and max(empty_parts.values()) < N_EMPTY * 0.8, empty_parts
    elif name == "consistent":
        # the deterministic variant hashes the empty key: crc32(b"") = 0 -> partition 0
        assert dict(empty_parts) == {0: N_EMPTY}
    else:
        assert dict(empty_parts) == {ours.partition(b"", n): N_EMPTY}
    report(f"{name}, {n} partitions: {len(KEYS)} keys ({N_EMPTY} empty) produced in {seconds:.2f} s; "
           f"{len(placed)} placed keys all agree; empty keys on partitions {dict(sorted(empty_parts.items()))}")


def test_families_disagree_on_these_keys():
    """The comparison above can tell the families apart: on these keys they place differently."""
    from processor.engine.partitioners import KNOWN

    for n in COUNTS:
        for a in KNOWN:
            for b in KNOWN:
                if a is not b:
                    differ = sum(a.partition(k, n) != b.partition(k, n) for k in KEYS if k)
                    assert differ > len(KEYS) * 0.5, (a, b, n, differ)
