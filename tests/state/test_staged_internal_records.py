"""A sub-topology that reads two topics (a join) and feeds an aggregation: its repartition
records wait for the commit (``Task(stage_internal=True)``), so a crash and a replay in another
interleaving cannot leave the aggregate wrong. Real RocksDB databases; the crash is a task closed
without its commit (closing never writes pending state). Differential: the same history with the
records sent at once leaves a wrong aggregate, which is why the worker stages them."""

import json

import pytest

from processor import StreamsBuilder
from processor.engine import task as task_module
from processor.engine.task import Task
from processor.serde import Serdes
from processor.state.rocksdb import RocksDBDatabase
from processor.testing import TopologyTestDriver
from tests.support.collectors import TopicLog

REP = "app-per-carrier-repartition"


def topology():
    b = StreamsBuilder()
    orders = b.table("orders", key_serde=Serdes.string(), value_serde=Serdes.json())
    ships = b.table("shipments", key_serde=Serdes.string(), value_serde=Serdes.json())
    orders.join(ships, lambda o, s: {"n": o["n"], "carrier": s["carrier"]}, name="shipped") \
        .group_by(lambda k, v: (v["carrier"], v), key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .aggregate(lambda: 0, lambda k, v, a: a + v["n"], lambda k, v, a: a - v["n"], name="per-carrier") \
        .to_stream().to("out")
    return b.build()


def _j(o):
    return json.dumps(o, separators=(",", ":"), sort_keys=True).encode()


HISTORY = {"orders": [(b"o1", _j({"n": 1})), (b"o1", _j({"n": 5}))],
           "shipments": [(b"o1", _j({"carrier": "A"})), (b"o1", _j({"carrier": "B"}))]}


def run(tmp_path, stage: bool) -> dict:
    topo = topology().for_application("app")
    log = TopicLog()

    def open_up():
        return Task(topo, 0, 0, RocksDBDatabase(tmp_path / "up"), log, lambda: 0, on_error="fail",
                    stage_internal=stage)

    down = Task(topo, 1, 0, RocksDBDatabase(tmp_path / "down"), log, lambda: 0, on_error="fail")

    def deliver():   # the downstream task reads what reached the repartition topic, and commits
        recs = log.topics.get(REP, [])
        for off in range(down.positions.get((REP, 0), 0), len(recs)):
            k, v, ts, h = recs[off]
            down.process(REP, 0, off, ts, k, v, h)
        down.commit()

    def feed(t, topic, off):
        k, v = HISTORY[topic][off]
        t.process(topic, 0, off, 10 + off, k, v)

    up = open_up()
    feed(up, "orders", 0)
    feed(up, "shipments", 0)
    up.commit()
    deliver()
    # the unit that crashes: orders@1 processed (and, unstaged, its records delivered downstream)
    feed(up, "orders", 1)
    deliver()
    up.close()                      # SIGKILL: no commit
    # the replay reads the two inputs in another interleaving
    up = open_up()
    assert up.positions == {("orders", 0): 1, ("shipments", 0): 1}
    feed(up, "shipments", 1)
    feed(up, "orders", 1)
    up.commit()
    deliver()
    store = down.stores.store("per-carrier")
    got = {k: v for k, v in store.items()}
    up.close()
    down.close()
    return got


def driver_result() -> dict:
    """The from-scratch aggregate: the broker-free driver over the same history."""
    with TopologyTestDriver(topology(), application_id="app") as d:
        for topic in ("orders", "shipments"):
            for k, v in HISTORY[topic]:
                d.pipe_raw(topic, k, v, 10)
        return {k.encode(): v for k, v in d.get_store("per-carrier").items()}


@pytest.mark.parametrize("stage", [True, False])
def test_replay_in_another_interleaving(tmp_path, stage):
    got = run(tmp_path, stage)
    sums = {k: json.loads(v[8:]) for k, v in got.items()}   # (timestamped layout: 8-byte ts first)
    want = driver_result()
    assert want == {b"A": 0, b"B": 5}
    if stage:
        assert sums == want
    else:   # sent at once: the killed unit's records were applied and part of the replay's dropped
        assert sums == {b"A": 4, b"B": 1}


def test_a_large_outbox_is_kept_in_chunks_and_resent_whole_after_a_crash(tmp_path, monkeypatch):
    monkeypatch.setattr(task_module, "OUTBOX_CHUNK_BYTES", 300)
    topo = topology().for_application("app")
    log = TopicLog()
    up = Task(topo, 0, 0, RocksDBDatabase(tmp_path / "up"), log, lambda: 0, on_error="fail", stage_internal=True)
    up.process("shipments", 0, 0, 1, b"o0", _j({"carrier": "A"}))
    for i in range(1, 30):
        up.process("shipments", 0, i, 1 + i, f"o{i}".encode(), _j({"carrier": "A"}))
        up.process("orders", 0, i, 1 + i, f"o{i}".encode(), _j({"n": i}))
    assert REP not in log.topics                       # staged: nothing sent before the commit
    pos, records = up.prepare_commit()
    up.finish_commit(pos, records)
    sent = list(log.topics[REP])
    assert len(sent) == 29 and len(records) == 29
    keys = [k for k, _ in up.task_store.items() if k.startswith(b"outbox") and k != b"outbox_counter"]
    assert len(keys) > 3                                # several entries
    up.close()                                          # crash before the next commit confirmed them
    log.topics.clear()
    up = Task(topo, 0, 0, RocksDBDatabase(tmp_path / "up"), log, lambda: 0, on_error="fail", stage_internal=True)
    assert log.topics[REP] == sent                      # all of it again, in order
    pos, records = up.prepare_commit()                  # confirms: the entries go
    up.finish_commit(pos, records)
    assert [k for k, _ in up.task_store.items() if k.startswith(b"outbox") and k != b"outbox_counter"] == []
    up.close()
