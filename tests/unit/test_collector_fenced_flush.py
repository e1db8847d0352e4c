"""A fatal producer error that confluent-kafka had pending when it called a delivery callback comes
out of ``flush`` as a SystemError caused by it; the collector raises the KafkaException it is, so
the commit's transaction-failure path sees a fence (``processor/runtime/collector.py``)."""

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.runtime.collector import KafkaCollector

FENCED = KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))


class _Flushing:
    def __init__(self, exc):
        self.exc = exc

    def flush(self, timeout):
        raise self.exc


def _collector(exc):
    c = KafkaCollector({"bootstrap.servers": "127.0.0.1:1"})
    c.producer = c.changelog_producer = _Flushing(exc)
    return c


def test_a_system_error_caused_by_a_fence_is_the_fence():
    err = SystemError("<cyfunction _track> returned a result with an exception set")
    err.__cause__ = FENCED
    with pytest.raises(KafkaException) as got:
        _collector(err).flush(1)
    assert got.value is FENCED


def test_any_other_system_error_is_left_as_it_is():
    with pytest.raises(SystemError):
        _collector(SystemError("something else")).flush(1)
