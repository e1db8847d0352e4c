"""The history reader: exactly the records below the snapshot, split into many input partitions,
with Spark's kafka-source columns; archives fill offsets below what Kafka holds."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from backfill.kafka_source import ARROW_SCHEMA, SCHEMA, read_history, split_ranges
from backfill.snapshot import snapshot_offsets, to_ranges
from processor.errors import ConfigError
from processor.kafka.clients import producer_defaults

from .helpers import new_topic, produce, records, row_tuples


def test_arrow_schema_is_the_one_spark_checks_batches_against():
    assert ARROW_SCHEMA.equals(to_arrow_schema(SCHEMA, timezone="UTC"))
    assert SCHEMA.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                                     "timestamp:timestamp,timestampType:int,"
                                     "headers:array<struct<key:string,value:binary>>>")


def test_splits_cover_each_range_once_and_skip_empty_ones():
    splits = split_ranges({"t": {"1": [10, 25], "0": [0, 7], "2": [5, 5]}}, 7)
    assert [(s.topic, s.partition, s.start, s.end) for s in splits] == [
        ("t", 0, 0, 7), ("t", 1, 10, 15), ("t", 1, 15, 20), ("t", 1, 20, 25)]


def test_history_is_exactly_the_records_below_the_snapshot(spark, kafka_bootstrap, unique):
    topic = new_topic(kafka_bootstrap, f"history-{unique}", 3)
    expected = produce(kafka_bootstrap, topic, records(25, 3))
    # partition 2 ends with a committed transaction: its commit marker takes an offset.
    tx = Producer({**producer_defaults(kafka_bootstrap), "transactional.id": f"history-{unique}"})
    tx.init_transactions()
    tx.begin_transaction()
    # a timestamp of the past, apart from the others' (Apache Kafka refuses one more than an hour
    # ahead of its clock: log.message.timestamp.after.max.ms, 1 hour by default since 4.0)
    expected += produce(kafka_bootstrap, topic, [(2, b"tx", b"in-a-transaction", 1_750_000_000_000, None)] * 3,
                        producer=tx)
    tx.commit_transaction()
    expected.sort()

    offsets = snapshot_offsets(kafka_bootstrap, [topic])
    last_tx_offset = expected[-1][2]
    assert offsets == {(topic, 0): (0, 25), (topic, 1): (0, 25), (topic, 2): (0, last_tx_offset + 2)}

    produce(kafka_bootstrap, topic, records(4, 3, tag="after-the-snapshot"))   # must not be read
    df = read_history(spark, kafka_bootstrap, to_ranges(offsets), max_records_per_split=7)
    assert df.rdd.getNumPartitions() == 4 + 4 + 5   # 25 -> 4 splits, 25 -> 4, 30 -> 5
    assert row_tuples(df) == expected


def test_a_split_holding_only_a_transaction_marker_ends_at_partition_eof(spark, kafka_bootstrap, unique):
    topic = new_topic(kafka_bootstrap, f"marker-{unique}", 1)
    expected = produce(kafka_bootstrap, topic, records(3, 1))
    tx = Producer({**producer_defaults(kafka_bootstrap), "transactional.id": f"marker-{unique}"})
    tx.init_transactions()
    tx.begin_transaction()
    expected += produce(kafka_bootstrap, topic, records(2, 1, tag="tx"), producer=tx)
    tx.commit_transaction()

    offsets = snapshot_offsets(kafka_bootstrap, [topic])
    assert offsets == {(topic, 0): (0, 6)}   # 5 records and the commit marker at 5
    df = read_history(spark, kafka_bootstrap, to_ranges(offsets), max_records_per_split=1)
    started = time.monotonic()
    assert row_tuples(df) == sorted(expected)
    assert time.monotonic() - started < 30


def test_archive_rows_fill_the_offsets_below_what_kafka_holds(spark, kafka_bootstrap, unique, tmp_path):
    """Tansu has no retention or DeleteRecords, so the history Kafka "no longer holds" is
    simulated by ranges that start above 0. The archive holds every record of both partitions
    below offset 15 with marked values, so each row shows where it came from: the archive below
    a partition's start, Kafka from it on, never both."""
    topic = new_topic(kafka_bootstrap, f"archived-{unique}", 2)
    kafka_rows = produce(kafka_bootstrap, topic, records(20, 2))
    offsets = snapshot_offsets(kafka_bootstrap, [topic])
    assert offsets == {(topic, 0): (0, 20), (topic, 1): (0, 20)}

    archive = str(tmp_path / "archive")
    full = read_history(spark, kafka_bootstrap, to_ranges(offsets))
    (full.where(F.col("offset") < 15)
     .withColumn("value", F.when(F.col("value").isNotNull(), F.concat(F.lit(b"archived:"), "value")))
     .write.parquet(archive))

    starts = {0: 12, 1: 5}
    ranges = {topic: {p: (starts[p], end) for (_, p), (_, end) in offsets.items()}}
    df = read_history(spark, kafka_bootstrap, ranges, archives={topic: archive}, max_records_per_split=4)

    def archived(row):
        return row[:4] + (None if row[4] is None else b"archived:" + row[4],) + row[5:]

    assert row_tuples(df) == [archived(r) if r[2] < starts[r[1]] else r for r in kafka_rows]


def test_archive_path_must_exist_and_name_a_topic_that_is_read(spark, kafka_bootstrap, tmp_path):
    ranges = {"orders": {0: (0, 0)}}
    with pytest.raises(ConfigError, match="does not exist"):
        read_history(spark, kafka_bootstrap, ranges, archives={"orders": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError, match="'customers', which is not read"):
        read_history(spark, kafka_bootstrap, ranges, archives={"customers": str(tmp_path)})


def test_read_throughput(spark, kafka_bootstrap, unique, report):
    topic = new_topic(kafka_bootstrap, f"throughput-{unique}", 2)
    n = 100_000
    p = Producer(producer_defaults(kafka_bootstrap))
    for i in range(2 * n):
        p.produce(topic, key=b"%08d" % i, value=b"v" * 60, partition=i % 2)
        if i % 20_000 == 0:
            p.poll(0)
    p.flush()
    offsets = snapshot_offsets(kafka_bootstrap, [topic])
    assert offsets == {(topic, 0): (0, n), (topic, 1): (0, n)}
    # warm up: the first Python data source job of a session starts its Python workers (seconds)
    read_history(spark, kafka_bootstrap, {topic: {0: (0, 10), 1: (0, 10)}}).collect()
    df = read_history(spark, kafka_bootstrap, to_ranges(offsets))
    started = time.monotonic()
    df.write.format("noop").mode("overwrite").save()   # every column of every row, nothing kept
    elapsed = time.monotonic() - started
    report(f"read {2 * n} records (8-byte keys, 60-byte values, 2 partitions, local[2], warm workers) "
           f"in {elapsed:.2f} s: {2 * n / elapsed:,.0f} rows/s")
    (count, key_bytes, value_bytes, max_offset, ts, types, headers, topic_name, partitions), = df.select(
        F.count("*"), F.sum(F.length("key")), F.sum(F.length("value")), F.max("offset"),
        F.count("timestamp"), F.sum("timestampType"), F.count("headers"), F.max("topic"),
        F.sum("partition")).collect()
    assert (count, key_bytes, value_bytes, max_offset, ts, types, headers, topic_name, partitions) == (
        2 * n, 16 * n, 120 * n, n - 1, 2 * n, 0, 0, topic, n)


def test_empty_ranges_read_nothing(spark, kafka_bootstrap, unique):
    topic = new_topic(kafka_bootstrap, f"empty-{unique}", 2)
    offsets = snapshot_offsets(kafka_bootstrap, [topic])
    assert offsets == {(topic, 0): (0, 0), (topic, 1): (0, 0)}
    assert row_tuples(read_history(spark, kafka_bootstrap, to_ranges(offsets))) == []


def test_history_shorter_than_the_ranges_fails_the_read(spark, kafka_bootstrap, unique):
    """A range ending beyond the partition's end (as after a topic was recreated) or starting
    beyond it is an error, never a silently shorter history."""
    topic = new_topic(kafka_bootstrap, f"short-{unique}", 1)
    produce(kafka_bootstrap, topic, records(20, 1))
    with pytest.raises(Exception, match=rf"{topic}\[0\] offsets \[0, 25\): the partition ends at 20"):
        read_history(spark, kafka_bootstrap, {topic: {0: (0, 25)}}).collect()
    with pytest.raises(Exception, match=rf"{topic}\[0\] offsets \[30, 35\): the partition ends at 20"):
        read_history(spark, kafka_bootstrap, {topic: {0: (30, 35)}}).collect()


def test_history_deleted_below_the_ranges_fails_the_read(spark, apache_kafka_bootstrap, unique):
    """A range starting below the partition's log start (records deleted by retention or
    DeleteRecords after the range was taken) is an error naming where the partition starts.
    On Apache Kafka whatever the run's broker: Tansu has no DeleteRecords."""
    kafka_bootstrap = apache_kafka_bootstrap
    from confluent_kafka import TopicPartition

    from processor.kafka.clients import admin

    topic = new_topic(kafka_bootstrap, f"deleted-{unique}", 1)
    produce(kafka_bootstrap, topic, records(20, 1))
    a = admin(kafka_bootstrap)   # (held until its answer: a client destroyed first fails the future)
    for f in a.delete_records([TopicPartition(topic, 0, 10)]).values():
        try:
            f.result(timeout=30)
        except Exception as exc:
            pytest.fail(f"the broker refused DeleteRecords, which this test needs: {exc}")
    with pytest.raises(Exception, match=rf"{topic}\[0\] offsets \[0, 20\): the partition starts at 10"):
        read_history(spark, kafka_bootstrap, {topic: {0: (0, 20)}}).collect()
