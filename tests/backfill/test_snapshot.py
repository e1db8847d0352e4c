"""The snapshot: start and end of every partition from fetches (partition EOF), not ListOffsets."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from backfill.kafka_source import read_history
from backfill.snapshot import snapshot_end_offsets, snapshot_offsets, snapshot_start_offsets, to_ranges
from processor.errors import BrokerUnreachable, ConfigError
from processor.kafka.clients import producer_defaults

from .helpers import new_topic, produce, records, row_tuples


def test_end_is_the_partition_eof_after_several_batches(kafka_bootstrap, unique):
    """ListOffsets latest reports the last batch's base offset + 1 on Tansu; the snapshot must not."""
    topic = new_topic(kafka_bootstrap, f"snap-{unique}", 3)
    produce(kafka_bootstrap, topic, [r for r in records(30, 2)], chunks=6)
    assert snapshot_offsets(kafka_bootstrap, [topic]) == {(topic, 0): (0, 30), (topic, 1): (0, 30),
                                                          (topic, 2): (0, 0)}
    assert snapshot_end_offsets(kafka_bootstrap, [topic]) == {(topic, 0): 30, (topic, 1): 30, (topic, 2): 0}
    assert snapshot_start_offsets(kafka_bootstrap, [topic]) == {(topic, 0): 0, (topic, 1): 0, (topic, 2): 0}
    assert to_ranges(snapshot_offsets(kafka_bootstrap, [topic])) == {topic: {0: (0, 30), 1: (0, 30), 2: (0, 0)}}


def test_read_committed_end_stops_below_an_open_transaction(spark, kafka_bootstrap, unique):
    topic = new_topic(kafka_bootstrap, f"open-tx-{unique}", 1)
    committed = produce(kafka_bootstrap, topic, records(4, 1))
    tx = Producer({**producer_defaults(kafka_bootstrap), "transactional.id": f"open-tx-{unique}"})
    tx.init_transactions()
    tx.begin_transaction()
    produce(kafka_bootstrap, topic, records(3, 1, tag="open"), producer=tx)
    produce(kafka_bootstrap, topic, records(2, 1, tag="after"))
    try:
        committed_cfg = {"isolation.level": "read_committed"}
        assert snapshot_offsets(kafka_bootstrap, [topic]) == {(topic, 0): (0, 9)}
        offsets = snapshot_offsets(kafka_bootstrap, [topic], consumer_config=committed_cfg)
        assert offsets == {(topic, 0): (0, 4)}
        df = read_history(spark, kafka_bootstrap, to_ranges(offsets), consumer_config=committed_cfg)
        assert row_tuples(df) == committed
    finally:
        tx.abort_transaction()


def test_missing_topic_is_named(kafka_bootstrap, unique):
    topic = new_topic(kafka_bootstrap, f"present-{unique}", 1)
    with pytest.raises(ConfigError, match=f"'absent-{unique}'"):
        snapshot_offsets(kafka_bootstrap, [topic, f"absent-{unique}"])


def test_unreachable_broker():
    with pytest.raises(BrokerUnreachable):
        snapshot_offsets("127.0.0.1:1", ["orders"], timeout_s=1)
