"""Key partitioners, in pure Python, bit for bit as the producers that place users' records.

Invariant: ``PARTITIONERS[name].partition(key, n)`` is the partition that a producer configured
with librdkafka's ``partitioner=name`` (or Java's default partitioner, for ``murmur2``) puts a
record with the non-null key bytes ``key`` on, in a topic of ``n`` partitions. Checked against
librdkafka itself in ``tests/integration/test_partitioners_librdkafka.py``.

| family         | librdkafka names                          | placement of a non-null key                |
|----------------|-------------------------------------------|--------------------------------------------|
| ``murmur2``    | ``murmur2``, ``murmur2_random``           | ``(murmur2(key) & 0x7fffffff) % n`` (Java) |
| ``consistent`` | ``consistent``, ``consistent_random`` (1) | ``crc32(key) % n`` (2)                     |
| ``fnv1a``      | ``fnv1a``, ``fnv1a_random``               | ``fnv1a_32(key) % n``                      |

(1) ``consistent_random`` is librdkafka's default. (2) ``consistent_random``: an empty key is
spread like NULL.

The ``*_random`` variants differ only for NULL keys (spread at random instead of one partition),
so for keyed records each family is one placement. ``random`` places nothing by key and is not
a partitioner a join can route by.

Internal topics (repartition) always use ``murmur2``: ``INTERNAL``. Every host routes internal
records with it, so the worker, the test driver and the backfill agree on the task that owns a key.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_M = 0x5BD1E995


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), unsigned 32-bit."""
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    words = length >> 2
    if words:
        for k in struct.unpack_from(f"<{words}I", data):
            k = (k * _M) & 0xFFFFFFFF
            k ^= k >> 24
            h = ((h * _M) & 0xFFFFFFFF) ^ ((k * _M) & 0xFFFFFFFF)
    end = words << 2
    rem = length & 3
    if rem == 3:
        h ^= data[end + 2] << 16
    if rem >= 2:
        h ^= data[end + 1] << 8
    if rem >= 1:
        h ^= data[end]
        h = (h * _M) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * _M) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def fnv1a(data: bytes) -> int:
    """32-bit FNV-1a (librdkafka ``rd_fnv1a``)."""
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def _fnv1a_partition(key: bytes, n: int) -> int:
    # librdkafka: the hash as a signed 32-bit int, its absolute value modulo n (Sarama's rule)
    h = fnv1a(key)
    if h & 0x80000000:
        h -= 1 << 32
    return abs(h) % n


@dataclass(frozen=True)
class Partitioner:
    name: str                                   # the family (librdkafka's deterministic name)
    aliases: tuple[str, ...]
    partition_of: Callable[[bytes, int], int]    # (non-null key bytes, partition count) -> partition
    description: str
    empty_key_unplaced: bool = False              # the *_random variant spreads b"" like NULL

    def partition(self, key: bytes, partitions: int) -> int:
        return self.partition_of(key, partitions)

    def places(self, key: bytes | None) -> bool:
        """Whether every variant of this family puts ``key`` by its bytes (NULL keys never are;
        librdkafka's ``consistent_random`` treats an empty key as NULL, measured)."""
        return key is not None and (bool(key) or not self.empty_key_unplaced)

    def __repr__(self):
        return self.name


MURMUR2 = Partitioner("murmur2", ("murmur2", "murmur2_random"),
                      lambda k, n: (murmur2(k) & 0x7FFFFFFF) % n,
                      "Java's default partitioner; librdkafka murmur2 / murmur2_random")
CONSISTENT = Partitioner("consistent", ("consistent", "consistent_random"),
                         lambda k, n: zlib.crc32(k) % n,
                         "CRC32; librdkafka consistent / consistent_random (confluent-kafka's default)",
                         empty_key_unplaced=True)
FNV1A = Partitioner("fnv1a", ("fnv1a", "fnv1a_random"), _fnv1a_partition,
                    "FNV-1a; librdkafka fnv1a / fnv1a_random")

# In order of preference when several explain the same keys (few keys, one partition).
KNOWN: tuple[Partitioner, ...] = (MURMUR2, CONSISTENT, FNV1A)
PARTITIONERS: dict[str, Partitioner] = {alias: p for p in KNOWN for alias in p.aliases}
INTERNAL = MURMUR2


def resolve(name: str) -> Partitioner:
    """The partitioner a librdkafka name (or Java's ``murmur2``) places keyed records with."""
    try:
        return PARTITIONERS[name]
    except KeyError:
        raise ValueError(f"unknown partitioner {name!r}; known: {', '.join(sorted(PARTITIONERS))} "
                         f"('random' places nothing by key, so no join can route by it)") from None


def explaining(samples: Iterable[tuple[bytes, int]], partitions: int) -> list[Partitioner]:
    """The known partitioners that map every sampled ``(key bytes, partition)`` to the partition it
    is in (a key a family does not place by its bytes, such as a null key, or an empty key under
    ``consistent_random``, says nothing against that family)."""
    left = list(KNOWN)
    for key, part in samples:
        if key is None:
            continue
        left = [p for p in left if not p.places(key) or p.partition(key, partitions) == part]
        if not left:
            break
    return left
