"""End to end on a real broker: 10,000 table updates on 4 partitions through filter; the
broker's output equals the test driver's, key by key and in order."""


from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import by_key, driver_output_by_key, produce, table_updates


def test_filter_on_broker_equals_driver(kafka_bootstrap, unique, tmp_path, monkeypatch):
    inp, out = f"orders-{unique}", f"big-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: 4, out: 4})
    records = table_updates(10_000, keys=1_500)
    assert sum(v is None for _, v in records) > 500
    ends = produce(kafka_bootstrap, inp, records)
    assert sorted(ends) == [0, 1, 2, 3]

    w = Worker(apps.filter_topology(), kafka_bootstrap, f"app-{unique}", tmp_path,
               commit_interval_ms=200, consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert w.records_processed == 10_000

    got = by_key(kafka.read_topic(kafka_bootstrap, out))
    want = driver_output_by_key(apps.filter_topology, inp, out, kafka.read_topic(kafka_bootstrap, inp))
    assert sum(map(len, want.values())) > 3_000
    assert sum(v is None for seq in want.values() for v, _ in seq) > 300   # tombstones reach the topic
    assert got == want
    m = w.metrics()
    assert m["KSTREAM-SINK-0000000003"]["records_out"] == sum(map(len, want.values()))
    assert m["KTABLE-FILTER-0000000001"]["skipped_both_fail"] > 0

    # The group's committed offsets and the local checkpoints both sit at the end of the input.
    from processor.state.rocksdb import RocksDBDatabase

    for p in range(4):
        db = RocksDBDatabase(tmp_path / f"app-{unique}" / f"task-0_{p}")
        cp = db.read_checkpoint()
        assert cp[(inp, p)] == ends[p]
        # ... beside the end offsets of the task's three changelogs (store, bookkeeping, task store)
        assert sorted(t for t, _ in cp) == sorted([inp, f"app-{unique}-__task-0-changelog",
                                                    f"app-{unique}-_bookkeeping-0-changelog",
                                                    f"app-{unique}-{inp}-STATE-STORE-0000000000-changelog"])
        db.close()
