"""Stream-stream joins on real RocksDB: the window, outer and task stores survive closing and
reopening the task, so the output of a restarted run is the output of an uninterrupted one."""

import json
import random

import pytest

from processor import JoinWindows, StreamsBuilder
from processor.engine.task import Task
from processor.state.rocksdb import RocksDBDatabase
from tests.support.collectors import RecordLog


def outer_join():
    b = StreamsBuilder()
    b.stream("l").outer_join(b.stream("r"), lambda a, c: [a, c], JoinWindows.of(10).grace(5)).to("out")
    return b.build().for_application("app")


def self_join():
    b = StreamsBuilder()
    s = b.stream("l")
    s.join(s, lambda a, c: [a, c], JoinWindows.of(8).grace(3)).to("out")
    topo = b.build()
    assert topo.applied_passes == [("self-join", 1)]
    return topo.for_application("app")


def inputs(topics, n=300, seed=5):
    rnd = random.Random(seed)
    offsets = dict.fromkeys(topics, 0)
    out = []
    for i in range(n):
        topic = rnd.choice(topics)
        ts = max(0, i * 2 + rnd.randrange(-20, 6))      # mostly increasing, some out of order / late
        out.append((topic, offsets[topic], ts, f"k{rnd.randrange(4)}".encode(), json.dumps(i).encode()))
        offsets[topic] += 1
    return out


def run(topology, records, path, log, stop=None):
    """Process ``records`` from the task's checkpoint on, committing every 5; stop (after a
    commit) before index ``stop``. Returns the join's stores' contents."""
    task = Task(topology, 0, 0, RocksDBDatabase(path), log, lambda: 0, on_error="fail")
    try:
        for i, (topic, off, ts, k, v) in enumerate(records):
            if stop is not None and i == stop:
                task.commit()
                return None
            if off < task.positions.get((topic, 0), 0):
                continue
            task.process(topic, 0, off, ts, k, v)
            if i % 5 == 0:
                task.commit()
        task.commit()
        return {s.name: list(task.stores.store(s.name).items()) for s in task.store_specs}
    finally:
        task.close()


@pytest.mark.parametrize("make, topics", [(outer_join, ["l", "r"]), (self_join, ["l"])])
def test_join_state_survives_close_and_reopen(tmp_path, make, topics):
    records = inputs(topics)
    clean = RecordLog()
    clean_stores = run(make(), records, tmp_path / "clean", clean)

    restarted = RecordLog()
    for stop in (97, 201):
        assert run(make(), records, tmp_path / "restarted", restarted, stop=stop) is None
    stores = run(make(), records, tmp_path / "restarted", restarted)

    assert restarted.records == clean.records
    assert len(clean.records) > 50
    assert stores == clean_stores
    assert any(stores.values())          # windows still open at the end: state was kept
    db = RocksDBDatabase(tmp_path / "restarted")
    try:
        assert set(clean_stores) | {"__task"} <= set(db.column_families())
    finally:
        db.close()
