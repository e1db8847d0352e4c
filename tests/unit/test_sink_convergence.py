"""Table sink convergence in the engine (``processor/engine/sink_convergence.py``): the origin
header on table sinks, which sinks carry a table, the commit record's sink ends, and what a task
sends once its replay has caught up with the tail its host read after a crash. Real Task, real
operators and serdes over in-memory stores; the worker's side runs in
``tests/integration/test_outputs_converge.py``."""

import json

from processor import StreamsBuilder, provenance
from processor.engine.task import Task
from processor.serde import Serdes
from processor.state import commit_record
from processor.state.memory import MemoryStores


class ListCollector:
    def __init__(self):
        self.records = []

    def send(self, topic, key, value, timestamp, headers, partition=None):
        self.records.append((topic, key, value, timestamp, headers))


def _topology():
    b = StreamsBuilder()
    t = b.table("in", key_serde=Serdes.string(), value_serde=Serdes.json())
    t.filter(lambda k, v: v["keep"]).to_stream().to("out")
    b.stream("events", key_serde=Serdes.string(), value_serde=Serdes.json()).to("events-out")
    return b.build().for_application("app")


def _v(keep, n):
    return json.dumps({"keep": keep, "n": n}, separators=(",", ":"), sort_keys=True).encode()


def _task(collector):
    return Task(_topology(), 0, 3, MemoryStores(), collector, lambda: 42_000, on_error="fail", origin="app")


def test_only_a_sink_fed_straight_by_a_table_carries_one():
    topo = _topology()
    sinks = {n.sink_topic: n.attrs.carries_table for n in topo.nodes if n.kind == "sink"}
    assert sinks == {"out": True, "events-out": False}
    b = StreamsBuilder()   # two sinks writing one topic: neither can be said to carry a table
    t = b.table("a", key_serde=Serdes.string(), value_serde=Serdes.json())
    t.to_stream().to("both")
    b.table("b", key_serde=Serdes.string(), value_serde=Serdes.json()).to_stream().to("both")
    assert [n.attrs.carries_table for n in b.build().nodes if n.kind == "sink"] == [False, False]


def test_table_sink_records_carry_their_origin_and_stream_sinks_do_not():
    c = ListCollector()
    task = _task(c)
    task.process("in", 3, 17, 1000, b"k1", _v(True, 1), [("user", b"h")])
    topo = _topology()
    events = Task(topo, topo.subtopology_of_topic()["events"], 3, MemoryStores(), c, lambda: 0, on_error="fail",
                  origin="app")
    events.process("events", 3, 5, 1001, b"e", b'{"x":1}', None)
    (out, ev) = c.records
    assert out[:4] == ("out", b"k1", _v(True, 1), 1000)
    assert out[4][0] == ("user", b"h") and out[4][1][0] == provenance.ORIGIN_HEADER
    assert provenance.decode_origin(out[4][1][1]) == provenance.Origin("app", 0, 3, "in", 17)
    assert ev == ("events-out", b"e", b'{"x":1}', 1001, None)
    # without ``origin`` (the driver, the backfill) no header is added
    c2 = ListCollector()
    Task(_topology(), 0, 3, MemoryStores(), c2, lambda: 0, on_error="fail").process("in", 3, 0, 5, b"k", _v(True, 1))
    assert c2.records == [("out", b"k", _v(True, 1), 5, None)]


def test_after_the_replay_reaches_the_targets_only_differing_tail_keys_are_sent_again():
    c = ListCollector()
    task = _task(c)
    task.process("in", 3, 0, 100, b"k1", _v(True, 1))
    task.process("in", 3, 1, 101, b"k2", _v(True, 2))
    c.records.clear()
    # what the crashed instance left after its last commit (read by the host)
    tails = {"out": {b"k1": _v(True, 9),      # the table has n=1 now: send it again
                     b"k2": _v(True, 2),      # equal to the table: nothing
                     b"k3": _v(True, 3),      # no row in the table: a tombstone
                     b"k4": _v(True, 4)}}     # the replay writes it again: nothing more
    task.start_convergence(tails, {("in", 3): 5})
    assert task.convergence_pending
    task.process("in", 3, 2, 102, b"k4", _v(True, 40))
    task.prepare_commit()                       # positions 3 < 5: not yet
    assert [r[:3] for r in c.records] == [("out", b"k4", _v(True, 40))]
    task.process("in", 3, 3, 103, b"k5", _v(False, 5))   # filtered out: no record
    task.process("in", 3, 4, 104, b"k6", _v(True, 6))
    task.prepare_commit()
    assert not task.convergence_pending
    assert [r[:4] for r in c.records] == [("out", b"k4", _v(True, 40), 102), ("out", b"k6", _v(True, 6), 104),
                                          ("out", b"k1", _v(True, 1), 100), ("out", b"k3", None, 42_000)]
    assert provenance.decode_origin(c.records[2][4][0][1]) == provenance.Origin("app", 0, 3, "", -1)
    assert task.metrics()["sink convergence"] == {"tail_keys": 4, "rewritten_by_replay": 1, "resent": 2,
                                                  "already_equal": 1}
    task.prepare_commit()
    assert len(c.records) == 4                  # once


def test_commit_record_keeps_sink_ends_and_reads_version_1():
    rec = commit_record.CommitRecord(7, {("in", 3): 10}, {("cl", 3): 4}, {("out", 0): 12, ("out", 1): 0})
    assert commit_record.decode(commit_record.encode(rec)) == rec
    assert commit_record.encode(rec)[0] == 2
    none = rec._replace(sink_ends=None)
    assert commit_record.encode(none)[0] == 1           # what an older build reads
    assert commit_record.decode(commit_record.encode(none)) == none
    v2_without = b"\x02" + commit_record.encode(none)[1:] + b"\x00"   # version 2, sink byte 0
    assert commit_record.decode(v2_without) == none
