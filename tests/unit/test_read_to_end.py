"""``PartitionsToEnd`` (processor/kafka/read_to_end.py) over a scripted consumer: what it yields,
when a partition is finished, and the caller's errors."""

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError

from processor.errors import ConfigError, KafkaIOError
from processor.kafka.read_to_end import PartitionsToEnd


class _Event:
    def __init__(self, topic, partition, offset, error=None):
        self._tp, self._offset, self._error = (topic, partition), offset, error

    def topic(self):
        return self._tp[0]

    def partition(self):
        return self._tp[1]

    def offset(self):
        return self._offset

    def error(self):
        return self._error


def _eof(topic, partition, offset):
    return _Event(topic, partition, offset, KafkaError(KafkaError._PARTITION_EOF))


class _Consumer:
    """Hands out the scripted batches, then empty ones."""

    def __init__(self, batches):
        self.batches = list(batches)
        self.assigned, self.paused = [], []

    def list_topics(self, topic, timeout):
        pass

    def assign(self, tps):
        self.assigned = [(tp.topic, tp.partition, tp.offset) for tp in tps]

    def pause(self, tps):
        self.paused += [(tp.topic, tp.partition) for tp in tps]

    def resume(self, tps):
        self.paused = [tp for tp in self.paused if tp not in {(x.topic, x.partition) for x in tps}]

    def consume(self, n, timeout):
        return self.batches.pop(0) if self.batches else []


def _never(pending):
    return KafkaIOError(f"not at the end: {pending}")


def test_reads_each_partition_to_its_eof():
    c = _Consumer([[_Event("t", 0, 0), _Event("t", 1, 5), _eof("t", 0, 1)],
                   [_Event("t", 1, 6), _eof("t", 1, 7), _Event("t", 0, 1)]])
    reader = PartitionsToEnd(c, {("t", 0): 0, ("t", 1): 5})
    got = [(m.partition(), m.offset()) for m in reader.records(5, error=None, timeout=_never)]
    # a record of a partition after its EOF (appended since) is not read
    assert got == [(0, 0), (1, 5), (1, 6)]
    assert reader.eof == {("t", 0): 1, ("t", 1): 7}
    assert c.assigned == [("t", 0, OFFSET_BEGINNING), ("t", 1, 5)]


def test_a_known_end_finishes_at_the_record_below_it():
    c = _Consumer([[_Event("t", 0, 3), _Event("t", 0, 4), _Event("t", 0, 5)]])
    reader = PartitionsToEnd(c, {("t", 0): 3, ("t", 1): 2}, ends={("t", 0): 5, ("t", 1): 2})
    assert ("t", 1) in c.paused                  # nothing below its end: finished at once
    got = [m.offset() for m in reader.records(5, error=None, timeout=_never)]
    assert got == [3, 4]
    assert reader.pending == set()


def test_the_caller_finishes_a_partition():
    c = _Consumer([[_Event("t", 0, 0), _Event("t", 0, 1), _eof("t", 0, 2)]])
    reader = PartitionsToEnd(c, {("t", 0): 0})
    got = []
    for m in reader.records(5, error=None, timeout=_never):
        got.append(m.offset())
        reader.finish(("t", 0))
    assert got == [0] and c.paused == [("t", 0)]


def test_errors_and_timeouts_are_the_callers():
    failing = _Event("t", 0, None, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    c = _Consumer([[failing]])
    with pytest.raises(KafkaIOError, match=r"reading t\[0\]: "):
        list(PartitionsToEnd(c, {("t", 0): 0}).records(
            5, error=lambda tp, err: KafkaIOError(f"reading {tp[0]}[{tp[1]}]: {err.str()}"), timeout=_never))
    # without an error of its own the event is left to librdkafka's retries
    c = _Consumer([[failing], [_eof("t", 0, 0)]])
    assert list(PartitionsToEnd(c, {("t", 0): 0}).records(5, error=None, timeout=_never)) == []
    # and so is a transient one (the broker down), whatever the caller's error
    transient = _Event("t", 0, None, KafkaError(KafkaError._TRANSPORT))
    c = _Consumer([[transient], [_eof("t", 0, 0)]])
    assert list(PartitionsToEnd(c, {("t", 0): 0}).records(
        5, error=lambda tp, err: KafkaIOError(f"reading {tp[0]}[{tp[1]}]: {err.str()}"), timeout=_never)) == []
    with pytest.raises(ConfigError, match=r"still \[\('t', 0\)\]"):
        list(PartitionsToEnd(_Consumer([]), {("t", 0): 0}).records(
            0.05, wait_s=0, error=None, timeout=lambda pending: ConfigError(f"still {pending}")))
