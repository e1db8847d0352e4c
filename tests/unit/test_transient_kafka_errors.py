"""A broker that is down or paused must not stop the worker: transient Kafka errors are retried
(``processor.kafka.clients.is_transient`` / ``retry_transient``), the metadata lookup before an
assignment is skipped when the broker does not answer, and a restore or a read to the end skips
transient error events (librdkafka retries them); any other error still fails with its text."""

import logging
import threading

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.errors import KafkaIOError
from processor.kafka import clients as kafka
from processor.kafka.read_to_end import PartitionsToEnd
from processor.runtime.changelog_reader import ChangelogReader, _Reader

TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "Failed to get metadata: Local: Timed out")
DENIED = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed")


class _Msg:
    def __init__(self, topic, partition, offset, err=None, key=b"k", value=b"v"):
        self._t, self._p, self._o, self._e, self._k, self._v = topic, partition, offset, err, key, value

    def topic(self):
        return self._t

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def error(self):
        return self._e

    def key(self):
        return self._k

    def value(self):
        return self._v

    def timestamp(self):
        return (1, 0)


class _Consumer:
    """Answers ``consume`` from a script of batches; ``list_topics`` raises ``metadata_error``."""

    def __init__(self, batches, metadata_error=None):
        self.batches = list(batches)
        self.metadata_error = metadata_error
        self.assigned = None
        self.metadata_calls = 0

    def list_topics(self, topic=None, timeout=None):
        self.metadata_calls += 1
        if self.metadata_error is not None:
            raise KafkaException(self.metadata_error)

    def assign(self, partitions):
        self.assigned = partitions

    def unassign(self):
        self.assigned = None

    def pause(self, partitions):
        pass

    def resume(self, partitions):
        pass

    def consume(self, n, timeout):
        return self.batches.pop(0) if self.batches else []


def test_transient_and_other_errors():
    assert kafka.is_transient(TIMED_OUT)
    assert kafka.is_transient(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS))
    assert kafka.is_transient(KafkaError(KafkaError.UNKNOWN, retriable=True))
    assert not kafka.is_transient(DENIED)
    assert not kafka.is_transient(KafkaError(KafkaError._TIMED_OUT, fatal=True))
    assert not kafka.is_transient(None)


def test_retry_transient_retries_then_answers(caplog):
    calls = []

    def call():
        calls.append(1)
        if len(calls) < 3:
            raise KafkaException(TIMED_OUT)
        return "answer"

    with caplog.at_level(logging.WARNING, "processor.kafka.retry"):
        assert kafka.retry_transient(call, "reading the committed offsets") == "answer"
    assert len(calls) == 3
    assert sum("transient, retrying" in r.getMessage() for r in caplog.records) == 2


def test_retry_transient_gives_up_with_the_error():
    def call():
        raise KafkaException(TIMED_OUT)

    with pytest.raises(KafkaIOError, match="reading x: the broker did not answer within 0 s .*Timed out"):
        kafka.retry_transient(call, "reading x", timeout_s=0.0)


def test_retry_transient_other_errors_at_once():
    calls = []

    def call():
        calls.append(1)
        raise KafkaException(DENIED)

    with pytest.raises(KafkaIOError, match="reading x: Broker: Topic authorization failed"):
        kafka.retry_transient(call, "reading x")
    assert len(calls) == 1


def test_assign_without_metadata_when_the_broker_does_not_answer(caplog):
    c = _Consumer([], metadata_error=TIMED_OUT)
    tps = [TopicPartition("a", 0, -2), TopicPartition("b", 0, -2)]
    with caplog.at_level(logging.WARNING, "processor.kafka.retry"):
        kafka.assign(c, tps)
    assert c.assigned == tps
    assert c.metadata_calls == 1   # not one wait per topic
    assert "assigning its partitions without it" in caplog.text


def test_assign_other_metadata_errors_fail():
    c = _Consumer([], metadata_error=DENIED)
    with pytest.raises(KafkaIOError, match="metadata of topic 'a': Broker: Topic authorization failed"):
        kafka.assign(c, [TopicPartition("a", 0, -2)])
    assert c.assigned is None


def test_read_to_end_skips_transient_error_events():
    eof = KafkaError(KafkaError._PARTITION_EOF)
    c = _Consumer([[_Msg(None, -1, -1, KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))],
                   [_Msg("t", 0, 0), _Msg("t", 0, 1, eof)]])
    got = list(PartitionsToEnd(c, {("t", 0): 0}).records(
        5.0, error=lambda tp, e: KafkaIOError(e.str()), timeout=lambda p: KafkaIOError(str(p))))
    assert [m.offset() for m in got] == [0]


def test_read_to_end_other_error_events_fail():
    c = _Consumer([[_Msg("t", 0, -1, DENIED)]])
    with pytest.raises(KafkaIOError, match="authorization"):
        list(PartitionsToEnd(c, {("t", 0): 0}).records(
            5.0, error=lambda tp, e: KafkaIOError(e.str()), timeout=lambda p: KafkaIOError(str(p))))


def test_restore_reader_goes_on_through_transient_errors(caplog):
    eof = KafkaError(KafkaError._PARTITION_EOF)
    c = _Consumer([[_Msg(None, -1, -1, KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))],
                   [_Msg("cl", 0, 0), _Msg("cl", 0, 1, eof)]])
    reader = _Reader(ChangelogReader({}, consumer=c), {("cl", 0): "0_0"}, threading.Event(), {})
    with caplog.at_level(logging.WARNING, "processor.restore"):
        got = [x for x in reader.read_many({("cl", 0): 0}) if x is not None]
    assert [off for _, off, *_ in got] == [0]
    assert "transient" in caplog.text


def test_restore_reader_other_errors_fail():
    c = _Consumer([[_Msg("cl", 0, -1, DENIED)]])
    reader = _Reader(ChangelogReader({}, consumer=c), {("cl", 0): "0_0"}, threading.Event(), {})
    with pytest.raises(KafkaIOError, match="restoring task 0_0 from cl\\[0\\]: Broker: Topic authorization"):
        list(reader.read_many({("cl", 0): 0}))


class _Flushing:
    """A producer whose flushes leave ``remaining`` records, one value per call."""

    def __init__(self, remaining):
        self.remaining = list(remaining)

    def flush(self, timeout):
        return self.remaining.pop(0)


def test_collector_flush_waits_on_records_the_broker_has_not_taken_yet(caplog):
    from processor.runtime.collector import KafkaCollector

    c = KafkaCollector(kafka.producer_defaults("127.0.0.1:9"))
    c.producer, c.changelog_producer = _Flushing([3, 1, 0]), _Flushing([0, 0, 0])
    with caplog.at_level(logging.WARNING, "processor.worker"):
        c.flush(0.01)
    assert sum("not delivered after" in r.getMessage() for r in caplog.records) == 2


def test_collector_flush_fails_on_delivery_errors_at_once():
    from processor.runtime.collector import DeliveryFailed, KafkaCollector

    c = KafkaCollector(kafka.producer_defaults("127.0.0.1:9"))
    c.producer, c.changelog_producer = _Flushing([2]), _Flushing([0])
    c.errors.append("out[0]: Broker: Topic authorization failed")
    with pytest.raises(DeliveryFailed, match="2 output record\\(s\\) not delivered"):
        c.flush(0.01)
