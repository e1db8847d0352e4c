"""Producing known records to the real broker and reading DataFrame rows back as plain tuples."""

from __future__ import annotations

from confluent_kafka import Producer
from pyspark.sql import functions as F

from processor.runtime.kafka import create_topics, producer_defaults


def records(n_per_partition: int, partitions: int, ts0: int = 1_700_000_000_000, tag: str = "r"):
    """(partition, key, value, timestamp ms, headers) for every partition, with null keys, null
    values (tombstones), bytes >= 0x80, no headers, several headers (a repeated key, a null
    header value)."""
    out = []
    for p in range(partitions):
        for i in range(n_per_partition):
            key = None if i % 5 == 3 else f"{tag}-k{p}-{i % 4}".encode()
            value = None if i % 7 == 6 else f"{tag}-v{p}-{i}".encode() + bytes([0x80 + i % 100])
            headers = [None, [("h", b"1")], [("a", b"x"), ("a", b"y"), ("n", None)]][i % 3]
            out.append((p, key, value, ts0 + 1000 * p + 3 * i, headers))
    return out


def produce(bootstrap: str, topic: str, recs, chunks: int = 3, producer: Producer | None = None) -> list[tuple]:
    """Produce ``recs`` in ``chunks`` flushed batches (so a partition holds several record
    batches) through ``producer`` (default: a new idempotent one; a transactional one must be in a
    transaction). Returns the expected rows in ``row_tuples``' form, offsets from the delivery
    reports, ordered by partition and offset."""
    p = producer or Producer(producer_defaults(bootstrap))
    offsets: dict[int, int] = {}

    def delivered(i):
        def on_delivery(err, msg):
            assert err is None, err
            offsets[i] = msg.offset()
        return on_delivery

    size = max(1, -(-len(recs) // chunks))
    for i, (part, key, value, ts, headers) in enumerate(recs):
        p.produce(topic, key=key, value=value, partition=part, timestamp=ts, headers=headers,
                  on_delivery=delivered(i))
        if (i + 1) % size == 0:
            p.flush()
    p.flush()
    assert len(offsets) == len(recs)
    return sorted((topic, part, offsets[i], key, value, ts * 1000, 0, headers)
                  for i, (part, key, value, ts, headers) in enumerate(recs))


def new_topic(bootstrap: str, name: str, partitions: int) -> str:
    create_topics(bootstrap, {name: partitions}, exist_ok=False)
    return name


def row_tuples(df) -> list[tuple]:
    """``(topic, partition, offset, key, value, timestamp µs, timestampType, headers)`` of every
    row, ordered by topic, partition, offset; bytes as ``bytes``, headers a list of pairs or None."""
    rows = (df.select("topic", "partition", "offset", "key", "value", F.unix_micros("timestamp").alias("ts"),
                      "timestampType", "headers")
            .orderBy("topic", "partition", "offset").collect())

    def b(x):
        return None if x is None else bytes(x)

    return [(r.topic, r.partition, r.offset, b(r.key), b(r.value), r.ts, r.timestampType,
             None if r.headers is None else [(h.key, b(h.value)) for h in r.headers])
            for r in rows]
