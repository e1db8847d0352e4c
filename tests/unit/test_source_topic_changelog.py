"""``build(reuse_source_topics=True)``: which stores lose their changelog, and the invariant of
``processor/state/source_changelog.py``: the table store equals the topic's records, but those
the task rejected, applied by ``apply_table_record`` in offset order. (The restore itself, from a
real broker: ``tests/integration/test_source_topic_changelog.py``.)"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor import StreamsBuilder
from processor.serde import Serdes
from processor.state.memory import MemoryStores
from processor.state.rocksdb import RocksDBDatabase
from processor.state.source_changelog import (
    decode_failed,
    encode_failed,
    failed_key,
    failed_offsets,
    failed_records,
    replay_record,
)
from processor.state.store import TASK_STORE
from processor.testing import TopologyTestDriver


def topo(reuse=True):
    b = StreamsBuilder()
    t = b.table("orders", key_serde=Serdes.string(), value_serde=Serdes.json(), store_name="orders")
    t.filter(lambda k, v: v["amount"] > 10).to_stream().to("big")
    b.table("moved", store_name="moved", repartition=True).to_stream().to("moved-out")
    b.stream("clicks").group_by_key().count(name="clicks").to_stream().to("counts")
    return b.build(reuse_source_topics=reuse)


def test_only_tables_read_from_user_topics_lose_their_changelog():
    t = topo().for_application("app")
    subs = range(len(t.subtopologies))
    reused = {name: topic for i in subs for name, topic in t.source_changelogs_of(i).items()}
    assert reused == {"orders": "orders"}
    changelogs = {name for i in subs for name in t.changelogs_of(i)}
    assert "orders" not in changelogs and {"moved", "clicks"} <= changelogs   # (through our repartition topic)
    assert "app-orders-changelog" not in t.changelog_topic_partitions({"orders": 2, "moved": 2, "clicks": 2})
    text = t.describe()
    assert "orders (kv; owner: KTABLE-SOURCE-0000000000; changelog: the source topic orders (reused))" in text
    assert "source topics reused as changelogs" in text
    plain = topo(reuse=False).for_application("app")
    assert all(not plain.source_changelogs_of(i) for i in subs)
    assert "orders" in {name for i in subs for name in plain.changelogs_of(i)}


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_failed_offsets_are_kept_per_topic_and_partition(tmp_path, kind):
    db = MemoryStores() if kind == "memory" else RocksDBDatabase(tmp_path / "db")
    store = db.store(TASK_STORE)
    keys = [("a", 0, 5), ("a", 0, 2**40), ("ab", 0, 7), ("a", 1, 5), ("b", 0, 1), ("a", -1, 3)]
    for i, (topic, part, off) in enumerate(keys):
        store.put(failed_key(topic, part, off), encode_failed(None if i % 2 else b"row%d" % i))
    store.put(b"commit", b"x")
    db.commit({})
    assert failed_records(store, "a", 0) == {5: b"row0", 2**40: None}
    assert failed_offsets(store, "ab", 0) == {7}
    assert failed_offsets(store, "a", 1) == {5}
    assert failed_offsets(store, "b", 1) == set()
    if kind == "rocksdb":
        db.close()


def test_failed_record_entries_carry_a_version_byte():
    assert encode_failed(None) == b"\x01\x00" and encode_failed(b"") == b"\x01\x01"
    assert decode_failed(encode_failed(b"\x00" * 8 + b"{}")) == b"\x00" * 8 + b"{}"
    for bad in (b"", b"\x01", b"\x02\x00", b"\x01\x07"):
        with pytest.raises(ValueError):
            decode_failed(bad)


def _task_failed(driver, topic="orders"):
    task = driver.tasks[driver.topology.subtopology_of_topic()[topic]]
    return sorted(failed_offsets(task.task_store, topic, 0))


def test_the_task_records_each_rejected_record_of_a_reused_topic():
    for policy in ("dlq", "skip"):
        with TopologyTestDriver(topo(), on_error=policy) as d:
            d.pipe_raw("orders", b"a", b'{"amount": 50}')
            d.pipe_raw("orders", b"b", b"{not json")            # 1: the source rejects it
            d.pipe_raw("orders", b"a", b'{"x": 1}')             # 2: the filter fails after the write
            d.pipe_raw("orders", None, b'{"amount": 50}')       # 3: a table record needs a key
            d.pipe_raw("moved", b"m", b"{not json")             # (not a reused topic)
            assert _task_failed(d) == [1, 2, 3]
            assert _task_failed(d, "moved") == []
            assert d.get_store("orders").get("a") == {"amount": 50}
    with TopologyTestDriver(topo(reuse=False)) as d:
        d.pipe_raw("orders", b"b", b"{not json")
        assert _task_failed(d) == []


records = st.lists(st.tuples(st.sampled_from([b"k1", b"k2", b"k3", b"k4", b"k5"]),
                             st.sampled_from([None, b'{"amount": 5}', b'{"amount": 50}', b'{"amount": 50}',
                                              b'{"x": 1}', b"{bad"])),
                   max_size=40)


@settings(max_examples=200, deadline=None)
@given(records)
def test_store_equals_the_topic_replayed_with_the_rejected_records_rows(recs):
    with TopologyTestDriver(topo(), on_error="skip") as d:
        for i, (k, v) in enumerate(recs):
            d.pipe_raw("orders", k, v, timestamp=100 + i)
        task = d.tasks[0]
        live = dict(task.stores.store("orders").items())
        failed = failed_records(task.task_store, "orders", 0)

    def restore(offsets):
        store = MemoryStores().store("orders")
        for i in offsets:     # (the restore's own per-record step)
            replay_record(store, failed, i, *recs[i], 100 + i)
        return dict(store.items())

    # the whole history: the rejected records change nothing
    assert restore(range(len(recs))) == live
    # compacted (each key's last record only): the same rows; a row whose last record repeated
    # its value keeps the timestamp of its last real change live, the repeat's in the restore
    last = sorted({k: i for i, (k, _) in enumerate(recs)}.values())
    compacted = restore(last)
    assert {k: v[8:] for k, v in compacted.items()} == {k: v[8:] for k, v in live.items()}
    for i in last:
        k = recs[i][0]
        if i in failed or k not in live or live[k][8:] != recs[i][1]:
            assert compacted.get(k) == live.get(k)
    # the rejected ones are exactly those the source or the filter could not take
    def bad(v):
        return v is not None and (v == b"{bad" or "amount" not in json.loads(v))
    assert set(failed) == {i for i, (_, v) in enumerate(recs) if bad(v)}
