"""The isolation level of every consumer a worker opens: Kafka Streams' choice per processing
guarantee (read_committed under exactly_once, read_uncommitted otherwise), overridable by the
consumer config, and the same for the group consumer and the restore consumer."""

import pytest

from processor import StreamsBuilder
from processor.runtime.worker import Worker


def _worker(tmp_path, **kw):
    b = StreamsBuilder()
    b.table("orders", store_name="orders-store").to_stream().to("out")
    return Worker(b.build(), "127.0.0.1:1", "iso-app", tmp_path, **kw)


@pytest.mark.parametrize("guarantee, consumer_config, want", [
    ("at_least_once", {}, "read_uncommitted"),
    ("exactly_once", {}, "read_committed"),
    ("exactly_once", {"isolation.level": "read_uncommitted"}, "read_uncommitted"),
    ("at_least_once", {"isolation.level": "read_committed"}, "read_committed"),
])
def test_isolation_level_per_guarantee_and_override(tmp_path, guarantee, consumer_config, want):
    w = _worker(tmp_path, processing_guarantee=guarantee, consumer_config=consumer_config)
    assert w.isolation_level == want
    assert w.task_manager.restore_consumer_config()["isolation.level"] == want
