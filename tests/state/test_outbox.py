"""Internal records sent by a punctuation or a flush go through the task's outbox: persisted with
the state that emitted them, sent after the commit, resent after a crash and deduplicated
downstream, so a wall-clock ``Emit.every`` feeding a repartition topic stays exact under replay."""

import json
import struct

import pytest

from processor import Emit, StreamsBuilder
from processor.engine.task import Task
from processor.state import outbox
from processor.state.rocksdb import RocksDBDatabase
from tests.support.collectors import TopicLog

REP = "app-total-repartition"


def topology():
    b = StreamsBuilder()
    counts = b.stream("events").group_by_key().count(emit=Emit.every(1000, clock="wall"), name="c")
    counts.group_by(lambda k, v: ("all", v)).aggregate(
        lambda: 0, lambda k, v, a: a + v, lambda k, v, a: a - v, name="total").to_stream().to("total")
    return b.build().for_application("app")


class Harness:
    def __init__(self, path):
        self.path, self.log, self.wall = path, TopicLog(), [0]
        self.topo = topology()
        self.open()

    def open(self):
        self.up = Task(self.topo, 0, 0, RocksDBDatabase(self.path / "up"), self.log, lambda: self.wall[0],
                       on_error="fail")
        self.down = Task(self.topo, 1, 0, RocksDBDatabase(self.path / "down"), self.log, lambda: self.wall[0],
                         on_error="fail")

    def close(self):
        self.up.close()
        self.down.close()

    def drain(self):
        recs = self.log.topics.get(REP, [])
        for off in range(self.down.positions.get((REP, 0), 0), len(recs)):
            k, v, ts, h = recs[off]
            self.down.process(REP, 0, off, ts, k, v, h)
        self.down.commit()

    def event(self, offset, wall):
        self.wall[0] = wall
        self.up.process("events", 0, offset, offset, b"k1", b'"x"')
        self.up.commit()
        self.drain()

    def total(self):
        raw = self.down.stores.store("total").get(b"all")
        return json.loads(raw[8:])


def test_outbox_records_resent_after_a_crash_are_applied_once(tmp_path):
    h = Harness(tmp_path)
    h.event(0, wall=0)        # count 1, emitted at once
    h.event(1, wall=100)      # count 2, deferred
    assert h.total() == 1
    h.wall[0] = 1000
    h.up.punctuate_wall(1000)
    assert REP not in h.log.topics or len(h.log.topics[REP]) == 1   # waits in the outbox
    h.up.commit()             # persisted with the state, then sent
    h.drain()
    assert h.total() == 2
    h.close()                 # crash: the outbox was never confirmed by a later commit
    h.open()                  # reopening sends it again ...
    h.drain()
    assert h.total() == 2     # ... and the copy is dropped downstream
    assert h.down.duplicates_dropped == 1
    h.up.commit()
    h.up.commit()
    assert h.up.task_store.get(b"outbox") is None   # confirmed, removed
    h.close()


def test_a_punctuation_lost_before_its_commit_is_emitted_again(tmp_path):
    h = Harness(tmp_path)
    h.event(0, wall=0)
    h.event(1, wall=100)
    h.wall[0] = 1000
    h.up.punctuate_wall(1000)  # emitted into the outbox ...
    h.close()                  # ... crash before the commit: nothing was sent
    h.open()
    h.up.punctuate_wall(1000)  # the pending key was rebuilt from the two columns
    h.up.commit()
    h.drain()
    assert h.total() == 2
    h.close()


def test_outbox_codec_round_trip_and_version():
    recs = [("t", b"k", None, 5, [("h", b"v"), ("n", None)], None), ("u", None, b"v", -1, [], 3)]
    data = outbox.encode(recs)
    assert data[0] == 2 and outbox.decode(data) == recs
    with pytest.raises(ValueError, match="unknown outbox version"):
        outbox.decode(b"\x03" + data[1:])
    # version 1 (no partition field) is still read
    v1 = b"\x01" + struct.pack(">I", 1) + struct.pack(">H", 1) + b"t" + struct.pack(">I", 1) + b"k" \
        + struct.pack(">I", 0xFFFFFFFF) + struct.pack(">q", 7) + struct.pack(">H", 0)
    assert outbox.decode(v1) == [("t", b"k", None, 7, [], None)]
