"""Exactly once, a failed transaction (``processor/runtime/commit_unit.py``): aborted (an abort
that times out: a new producer takes over the transactional id), the tasks rebuilt; a producer
fenced after its transaction outlived ``transaction.timeout.ms`` (the broker aborted it on its
timeout) is renewed; one fenced sooner means a newer instance owns the transactional id: fatal,
as before."""

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.errors import ConfigError, KafkaIOError
from processor.runtime.collector import ProduceFailed
from processor.runtime.commit_unit import Committer

FENCED = KafkaError(KafkaError._FENCED, "Producer fenced by newer instance", fatal=True)
ABORT_TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "Timed out waiting for operation to finish", retriable=True)


class _Collector:
    transactional = True

    def __init__(self, aborts=(), opened_s=1.0, timeout_s=10.0):
        self.aborts = list(aborts)   # errors the next abort() calls raise, then success
        self.in_transaction = True
        self.began_at = time.monotonic() - opened_s
        self.transaction_timeout_s = timeout_s
        self.renewed = 0
        self.begun = 0

    def abort(self):
        if self.aborts:
            err = self.aborts.pop(0)
            if not err.retriable():
                self.in_transaction = False
            raise KafkaException(err)
        self.in_transaction = False

    def renew(self, timeout_s):
        self.renewed += 1
        self.in_transaction = False

    def begin(self):
        self.in_transaction = True
        self.begun += 1


class _Tasks:
    def __init__(self, collector):
        self.collector = collector
        self.reopened = 0

    def reopen_all(self):
        self.reopened += 1


class _Gaps:
    def clear(self):
        pass


def _committer(collector):
    tasks = _Tasks(collector)
    return Committer(tasks, _Gaps(), None), tasks


def test_abort_then_tasks_rebuilt():
    c = _Collector()
    committer, tasks = _committer(c)
    committer.transaction_failed(ProduceFailed("producing a record to out: Local: Erroneous state",
                                               KafkaError(KafkaError._STATE)))
    assert (c.renewed, c.begun, tasks.reopened, c.in_transaction) == (0, 1, 1, True)


def test_abort_timing_out_renews_the_producer():
    # (the broker not answering, or refusing the epoch bump the abort needs: Tansu)
    c = _Collector(aborts=[ABORT_TIMED_OUT])
    committer, tasks = _committer(c)
    committer.transaction_failed(KafkaIOError("task 0_1: 3 changelog record(s) failed delivery"))
    assert (c.renewed, c.begun, tasks.reopened, c.in_transaction) == (1, 1, 1, True)


def test_abort_failing_otherwise_is_fatal():
    c = _Collector(aborts=[KafkaError(KafkaError._STATE, "Operation not valid in state Ready")])
    committer, tasks = _committer(c)
    with pytest.raises(KafkaIOError, match="aborting the failed transaction failed: Operation not valid"):
        committer.transaction_failed(KafkaIOError("x"))
    assert tasks.reopened == 0


def test_fenced_after_the_transaction_timeout_renews_the_producer():
    c = _Collector(aborts=[FENCED], opened_s=25.0, timeout_s=10.0)
    committer, tasks = _committer(c)
    committer.transaction_failed(KafkaIOError("task 0_1: 5 changelog record(s) failed delivery"))
    assert (c.renewed, c.begun, tasks.reopened) == (1, 1, 1)


def test_fenced_within_the_transaction_timeout_is_fatal():
    c = _Collector(opened_s=1.0, timeout_s=10.0)
    committer, tasks = _committer(c)
    with pytest.raises(ConfigError, match="fenced by a newer instance"):
        committer.transaction_failed(KafkaException(FENCED))
    assert (c.renewed, tasks.reopened) == (0, 0)


def test_failing_without_a_commit_for_too_long_is_fatal():
    c = _Collector()
    committer, tasks = _committer(c)
    committer.transaction_failed(KafkaIOError("first"))
    assert c.renewed == 0
    committer.transaction_failed(KafkaIOError("second"))   # (an idle spell before the first: no matter)
    assert c.renewed == 1   # failing again at once: a new producer (librdkafka's may be stuck)
    committer.failing_since -= 1000
    with pytest.raises(KafkaIOError, match="failing for 1000 s, none committed \\(3 failed\\); the last: third"):
        committer.transaction_failed(KafkaIOError("third"))


def test_a_stop_during_the_rebuild_leaves_the_tasks_closed():
    from processor.runtime.changelog_reader import RestoreInterrupted

    c = _Collector()
    committer, tasks = _committer(c)

    def interrupted():
        raise RestoreInterrupted()
    tasks.reopen_all = interrupted
    committer.transaction_failed(KafkaIOError("records timed out"))   # (no exception: the worker stops)
    assert c.begun == 1


def test_send_offsets_that_never_returns_is_abandoned(monkeypatch):
    # librdkafka's send_offsets_to_transaction can wait forever on a group coordinator that is
    # down (librdkafka issues 5456, 5511): the collector gives up on it
    import threading

    from processor.kafka import clients as kafka
    from processor.runtime import collector as collector_module

    class _Stuck:
        def __init__(self):
            self.release = threading.Event()

        def send_offsets_to_transaction(self, offsets, metadata, timeout):
            self.release.wait()

    monkeypatch.setattr(collector_module, "SEND_OFFSETS_GRACE_S", 0.05)
    c = collector_module.KafkaCollector(kafka.producer_defaults("127.0.0.1:9"))
    c.producer = stuck = _Stuck()
    try:
        with pytest.raises(collector_module.SendOffsetsHung, match="did not return within 0 s"):
            c.send_offsets(["an offset"], None, timeout_s=0.05)
    finally:
        stuck.release.set()


def test_a_hung_producer_is_renewed_without_an_abort():
    from processor.runtime.collector import SendOffsetsHung

    c = _Collector(aborts=[KafkaError(KafkaError._CONFLICT, "Conflicting send_offsets_to_transaction call")])
    committer, tasks = _committer(c)
    committer.transaction_failed(SendOffsetsHung("sending the group offsets ... did not return"))
    assert (c.renewed, c.begun, tasks.reopened, len(c.aborts)) == (1, 1, 1, 1)   # (abort never called)
