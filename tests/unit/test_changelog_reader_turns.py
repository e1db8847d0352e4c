"""Reads take turns on a ChangelogReader's one consumer (``processor/runtime/changelog_reader.py``):
a read whose turn another read took assigns its partitions again where it was and reads on, none
reads another's records, and the wait for its turn is not taken for a silent broker."""

import time

from confluent_kafka import KafkaError

from processor.runtime import changelog_reader
from processor.runtime.changelog_reader import ChangelogReader, _Reader


class _Msg:
    def __init__(self, tp, offset, value=None, error=None):
        self._tp, self._offset, self._value, self._error = tp, offset, value, error

    def topic(self):
        return self._tp[0]

    def partition(self):
        return self._tp[1]

    def offset(self):
        return self._offset

    def error(self):
        return self._error

    def key(self):
        return b"k"

    def value(self):
        return self._value

    def timestamp(self):
        return (1, 0)


class _Logs:
    """A consumer over in-memory logs: one record per assigned partition per fetch, then EOF."""

    def __init__(self, logs):
        self.logs, self.pos, self.paused, self.eof_sent, self.assigns = logs, {}, set(), set(), []

    def assign(self, tps):
        self.pos = {(tp.topic, tp.partition): tp.offset for tp in tps}
        self.eof_sent = set()
        self.assigns.append(sorted(self.pos.items()))

    def unassign(self):
        self.pos = {}

    def pause(self, tps):
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps):
        self.paused -= {(tp.topic, tp.partition) for tp in tps}

    def consume(self, n, timeout):
        out = []
        for tp, off in list(self.pos.items()):
            if tp in self.paused:
                continue
            if off < len(self.logs[tp]):
                out.append(_Msg(tp, off, self.logs[tp][off]))
                self.pos[tp] = off + 1
            elif tp not in self.eof_sent:
                self.eof_sent.add(tp)
                out.append(_Msg(tp, off, error=KafkaError(KafkaError._PARTITION_EOF)))
        return out


def _values(items):
    return [(tp, off, value) for tp, off, _, value, _ in (x for x in items if x is not None)]


def test_reads_take_turns_and_resume_where_they_were(monkeypatch):
    monkeypatch.setattr(changelog_reader, "SILENT_S", 0.01)

    def no_probe(conf, tp):
        raise AssertionError(f"probed {tp}: the wait for a turn was taken for silence")
    monkeypatch.setattr(changelog_reader, "_end_offset", no_probe)
    logs = _Logs({("a", 0): [b"a0", b"a1", b"a2", b"a3"], ("b", 0): [b"b0", b"b1", b"b2"]})
    owner = ChangelogReader({}, consumer=logs)
    first = _Reader(owner, {("a", 0): "0_0"}, None, {}).read_many({("a", 0): 1})
    got_a = _values([next(first), next(first)])           # a1, then the end of a fetch
    got_b = _values(_Reader(owner, {("b", 0): "1_0"}, None, {}).read_many({("b", 0): 1}))
    time.sleep(0.05)                                      # longer than SILENT_S: its turn came late
    got_a += _values(first)
    assert got_a == [(("a", 0), 1, b"a1"), (("a", 0), 2, b"a2"), (("a", 0), 3, b"a3")]
    assert got_b == [(("b", 0), 1, b"b1"), (("b", 0), 2, b"b2")]
    assert logs.assigns == [[(("a", 0), 1)], [(("b", 0), 1)], [(("a", 0), 2)]]
    assert logs.pos == {} and owner.reading is None      # the last read unassigned its partitions
