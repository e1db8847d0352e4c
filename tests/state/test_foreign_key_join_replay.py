"""Foreign-key join under crashes and replays, on real RocksDB (one database per task).

A tiny in-memory log stands in for the topics so the test decides exactly what is delivered
before a crash and in which order partitions are consumed (a crash = closing the database
without committing: pending writes are lost, as after SIGKILL). Each scenario is a case where
a versioning or deduplication scheme weaker than ours leaves a wrong result for good."""

from __future__ import annotations

from collections import defaultdict

import pytest

from processor import StreamsBuilder
from processor.engine.task import Task
from processor.errors import ProcessingError
from processor.serde import Serdes
from processor.state.rocksdb import RocksDBDatabase

SS, JS = Serdes.string(), Serdes.json()


class Log:
    """Topic partitions as lists; ``route(topic, key) -> partition`` when none is explicit."""

    def __init__(self, route):
        self.parts = defaultdict(list)
        self.route = route

    def append(self, topic, key, value, ts, headers=(), partition=None):
        p = partition if partition is not None else self.route(topic, key)
        self.parts[(topic, p)].append((key, value, ts, list(headers or ())))
        return len(self.parts[(topic, p)]) - 1

    def put(self, topic, key, value, ts, partition=0):
        return self.append(topic, SS.serialize(key), JS.serialize(value), ts, partition=partition)


class Host:
    """One task over RocksDB in ``path``; its sends stay pending until ``deliver``."""

    def __init__(self, topo, sub, partition, log, path, on_error="fail"):
        self.topo, self.sub, self.partition, self.log, self.path = topo, sub, partition, log, path
        self.on_error = on_error
        self.open()

    def open(self):
        self.pending = []
        self.task = Task(self.topo, self.sub, self.partition, RocksDBDatabase(self.path), self, lambda: 0,
                         on_error=self.on_error, dlq_topic="dlq")

    def send(self, topic, key, value, ts, headers, partition=None):   # the task's collector
        self.pending.append((topic, key, value, ts, headers, partition))

    def process(self, topic, offset):
        key, value, ts, headers = self.log.parts[(topic, self.partition)][offset]
        self.task.process(topic, self.partition, offset, ts, key, value, headers)

    def drain(self, topic):
        """Process every record of ``topic`` in this task's partition from its position on."""
        start = self.task.positions.get((topic, self.partition), 0)
        for off in range(start, len(self.log.parts[(topic, self.partition)])):
            self.process(topic, off)

    def deliver(self, n=None):
        recs, self.pending = (self.pending, []) if n is None else (self.pending[:n], self.pending[n:])
        for r in recs:
            self.log.append(*r)

    def commit(self):
        self.deliver()
        self.task.commit()
        self.deliver()

    def crash(self):
        self.pending = []
        self.task.stores.close()
        self.open()

    def result(self, store, key):
        raw = self.task.stores.store(store).get(SS.serialize(key))
        return None if raw is None else JS.deserialize(raw[8:])


def test_left_replay_in_another_order_gives_the_same_versions(tmp_path):
    """The left table's changes come from two inputs (a PK outer join of A and B). After a
    crash the left task replays them in another order; a response to x's first foreign key,
    answered late by a lagging right partition, must not be applied to x's second version."""
    b = StreamsBuilder()
    a, bt, c = b.table("A"), b.table("B"), b.table("C")
    a.outer_join(bt, lambda x, y: x or y).join_on_foreign_key(
        c, lambda v: v["c"], lambda lv, r: {"l": lv["n"], "r": r["name"]}, name="j").to_stream().to("out")
    topo = b.build().for_application("app")
    subs = topo.subtopology_of_topic()
    sub_t, resp_t = "app-j-subscription-registration-topic", "app-j-subscription-response-topic"
    log = Log(lambda topic, key: {b"c1": 1}.get(key, 0))
    left = Host(topo, subs["A"], 0, log, tmp_path / "left")
    r0, r1 = (Host(topo, subs["C"], p, log, tmp_path / f"right{p}") for p in (0, 1))
    log.put("C", "c1", {"name": "C-ONE"}, 1, partition=1)
    log.put("C", "c2", {"name": "C-TWO"}, 1, partition=0)
    for h in (r0, r1):
        h.drain("C")
        h.commit()
    y = log.put("B", "y", {"n": 9, "c": "c2"}, 5)
    x1 = log.put("A", "x", {"n": 1, "c": "c1"}, 6)
    x2 = log.put("A", "x", {"n": 2, "c": "c2"}, 7)
    for topic, off in (("B", y), ("A", x1), ("A", x2)):   # first run ...
        left.process(topic, off)
    left.deliver()
    left.crash()                                            # ... sent, not committed
    for topic, off in (("A", x1), ("A", x2), ("B", y)):   # the replay, in another order
        left.process(topic, off)
    left.commit()
    r0.drain(sub_t)
    r0.commit()
    r1.drain(sub_t)                                         # the c1 partition lags behind
    r1.commit()
    left.drain(resp_t)
    left.commit()
    assert left.result("j", "x") == {"l": 2, "r": "C-TWO"}
    assert left.result("j", "y") == {"l": 9, "r": "C-TWO"}
    assert list(r1.task.stores.store("j-subscription-store").items()) == []
    assert left.task.metrics()[next(n.name for n in topo.nodes if "RESOLVE" in n.name)][
        "stale_responses_dropped"] >= 1


def test_right_replay_with_a_newer_row_is_not_dropped_as_a_duplicate(tmp_path):
    """The right task answers a subscription, then a right update; only the first response is
    delivered before it crashes. On replay it reads the update first and answers the same
    subscription with the NEWER row: that response must be applied."""
    b = StreamsBuilder()
    b.table("orders").join_on_foreign_key(b.table("customers"), lambda v: v["c"],
                                          lambda o, c: {"o": o["n"], "c": c["name"]}, name="oc") \
        .to_stream().to("out")
    topo = b.build().for_application("app")
    subs = topo.subtopology_of_topic()
    sub_t, resp_t = "app-oc-subscription-registration-topic", "app-oc-subscription-response-topic"
    log = Log(lambda topic, key: 0)
    left = Host(topo, subs["orders"], 0, log, tmp_path / "left")
    right = Host(topo, subs["customers"], 0, log, tmp_path / "right")
    c_old = log.put("customers", "c1", {"name": "old"}, 1)
    right.process("customers", c_old)
    right.commit()
    left.process("orders", log.put("orders", "x", {"n": 1, "c": "c1"}, 2))
    left.commit()
    c_new = log.put("customers", "c1", {"name": "new"}, 3)
    right.process(sub_t, 0)
    right.process("customers", c_new)
    assert len(right.pending) == 2
    right.deliver(1)
    right.crash()
    left.drain(resp_t)
    left.commit()
    assert left.result("oc", "x") == {"o": 1, "c": "old"}
    right.process("customers", c_new)                      # the replay, in another order
    right.process(sub_t, 0)
    right.commit()
    left.drain(resp_t)
    left.commit()
    assert left.result("oc", "x") == {"o": 1, "c": "new"}
    assert left.task.duplicates_dropped == 0


def test_an_unreadable_internal_record_stops_the_task_whatever_the_error_policy(tmp_path):
    b = StreamsBuilder()
    b.table("orders").join_on_foreign_key(b.table("customers"), lambda v: v["c"], lambda o, c: o,
                                          name="oc").to_stream().to("out")
    topo = b.build().for_application("app")
    subs = topo.subtopology_of_topic()
    log = Log(lambda topic, key: 0)
    right = Host(topo, subs["customers"], 0, log, tmp_path / "right", on_error="skip")
    sub_t = "app-oc-subscription-registration-topic"
    log.append(sub_t, b"c1", b"\x07\x01\x00\x00\x00\x00pk", 1)   # version 7: a newer build's
    with pytest.raises(ProcessingError, match=r"internal record this build cannot read.*version 7"):
        right.process(sub_t, 0)
    assert right.task.skipped_poison == 0 and right.pending == []
