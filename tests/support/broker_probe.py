"""Broker transaction capability probes: what a broker really does with Kafka transactions,
measured against it, reported by name.

Brokers that speak the Kafka protocol differ in how much of the transaction protocol they honour
(Tansu, for one, accepts transactional requests but shows aborted records to read_committed
consumers and fences weakly). Exactly-once processing leans on each of these guarantees, so
they are measured, not assumed. Every probe works on its own fresh single-partition topic with
fresh ``transactional.id`` and group ids; the probes that read back do so with
``isolation.level=read_committed`` through ``assign()`` (no group join) until a record they
committed last has been seen and the partition then reports EOF (never ``list_offsets``, which
some brokers get wrong; waiting for that last record covers brokers that write transaction
markers after ``commit_transaction`` returns). Each probe is bounded by ``timeout_s``. A "no" is
an answer, not an exception: a broker or client error makes the capability False and its reason lands in ``details``.

- ``transactions_supported``: ``init_transactions`` / ``begin_transaction`` / ``produce`` /
  ``commit_transaction`` succeed and the committed record is read back by a read_committed
  consumer.
- ``read_committed_hides_aborted``: a record produced in an aborted transaction, followed by a
  record produced in a committed one, on the same partition: the read_committed consumer
  returns the committed record and NOT the aborted one. (Records of one partition are
  delivered in offset order, so once the later committed record has arrived the aborted one
  would have arrived before it.)
- ``zombie_fenced``: producer A (``init_transactions``, ``begin_transaction``, one record
  flushed into the open transaction), then producer B with the same ``transactional.id`` calls
  ``init_transactions``. A then produces again and tries to commit: that must raise a fencing
  error (``_FENCED``, ``PRODUCER_FENCED`` or ``INVALID_PRODUCER_EPOCH``), AND neither of A's
  records may be visible to read_committed (B commits a sentinel afterwards to read up to; the
  read happens before the probe tries to abort A's transaction while cleaning up, so that
  clean-up cannot hide A's records).
- ``send_offsets_to_transaction_supported``: a producer calls
  ``send_offsets_to_transaction([tp@N], consumer.consumer_group_metadata())`` inside a
  transaction and commits; then ``consumer.committed([tp])`` for that fresh group returns N.
  The consumer is never subscribed (its group metadata carries generation -1, which brokers
  accept as a simple, memberless commit), so the probe does not wait for a group join.
- ``transactions_complete_after_fencing``: what a crashed exactly-once worker and its restart
  do to the transactions around them. On one partition: A writes in an open transaction; B
  (another ``transactional.id``) writes in an open transaction; A' (A's ``transactional.id``,
  the restart) calls ``init_transactions``, which must abort A's transaction; A' writes, sends
  offsets for group GA and commits; then B sends offsets for group GB and commits. Both
  committed offsets must then be visible, and a read_committed consumer must read A''s and B's
  records up to partition EOF. (Tansu 0.6 leaves A''s transaction "prepared" for good: its
  offsets are never written and the last stable offset stays in front of its record, so a
  read_committed consumer stops there until some later transaction on that partition
  completes.)
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, fields

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processor.kafka import clients as kafka

# Error codes that mean "this producer has been fenced by a newer one with its transactional.id".
FENCING_ERRORS = frozenset({
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
})


@dataclass(frozen=True)
class TransactionCapabilities:
    """What the broker did, capability by capability; ``details`` holds what was observed."""

    transactions_supported: bool
    read_committed_hides_aborted: bool
    zombie_fenced: bool
    send_offsets_to_transaction_supported: bool
    transactions_complete_after_fencing: bool
    details: dict[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.type in (bool, "bool")]

    def as_dict(self) -> dict[str, bool]:
        """``{capability name: value}``, without the details."""
        return {name: getattr(self, name) for name in self.names()}

    def describe(self) -> list[str]:
        """One ``name: yes|no`` line per capability, then the observations, indented."""
        lines = [f"{name}: {'yes' if value else 'no'}" for name, value in self.as_dict().items()]
        lines += [f"  {key}: {value}" for key, value in self.details.items()]
        return lines


class _Deadline:
    def __init__(self, seconds: float):
        self._end = time.monotonic() + seconds

    def left(self, floor: float = 0.1) -> float:
        """Seconds left (at least ``floor``, so a call is never given a zero timeout)."""
        return max(floor, self._end - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() >= self._end


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        err = exc.args[0]
        return f"{err.name()}: {err.str()}"
    return f"{type(exc).__name__}: {exc}"


def _kafka_cause(exc: BaseException) -> BaseException:
    """The KafkaException behind ``exc``: confluent-kafka reports a fatal error raised in a
    callback during ``flush`` (Apache Kafka fencing the zombie's produce) as a SystemError of the
    next callback, with the KafkaException as its context; ``exc`` itself otherwise."""
    cause: BaseException | None = exc
    for _ in range(5):
        if cause is None:
            break
        if isinstance(cause, KafkaException):
            return cause
        cause = cause.__cause__ or cause.__context__
    return exc


def _is_fencing(exc: BaseException) -> bool:
    exc = _kafka_cause(exc)
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0].code() in FENCING_ERRORS
    return False


def _fresh(kind: str) -> str:
    return f"__probe-{kind}-{uuid.uuid4().hex[:12]}"


def _txn_producer(bootstrap: str, transactional_id: str, deadline: _Deadline,
                  quiet: bool = False) -> Producer:
    """A transactional producer; ``quiet`` keeps librdkafka from logging errors (for the zombie,
    whose fencing is expected and recorded in the details instead)."""
    conf = kafka.producer_defaults(bootstrap)
    if quiet:
        conf["log_level"] = 2  # syslog "critical": librdkafka's TXNERR lines are level 3
    conf.update({
        "transactional.id": transactional_id,
        "linger.ms": 0,
        "transaction.timeout.ms": 60000,
        "message.timeout.ms": int(deadline.left(1.0) * 1000),
    })
    return Producer(conf)


def _close(producers: list[Producer]) -> None:
    """Release probe producers without blocking: an open transaction is aborted (briefly
    bounded) and only a producer with no transaction left is ``close()``d; ``close()`` on one
    whose abort cannot finish (a fenced zombie on a broker that never answers its EndTxn) would
    block for good, so that one is only dropped (destroyed when collected)."""
    for p in producers:
        try:
            p.purge()
            p.abort_transaction(1.0)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._STATE:   # _STATE: no transaction in progress
                continue
        except Exception:
            continue
        try:
            p.close()
        except Exception:
            pass
    producers.clear()


def _produce_flushed(producer: Producer, topic: str, value: bytes, deadline: _Deadline) -> None:
    """Produce one record to partition 0 and wait for its delivery report; a delivery error or a
    flush that does not finish in time raises KafkaException."""
    errors: list[KafkaError] = []
    producer.produce(topic, value, b"probe", partition=0,
                     on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
    if producer.flush(deadline.left()) > 0:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "delivery not confirmed in time"))
    if errors:
        raise KafkaException(errors[0])


def _read_committed(bootstrap: str, topic: str, until: bytes, deadline: _Deadline) -> tuple[list[bytes], str]:
    """Values of ``topic`` partition 0 as a read_committed consumer returns them, read until the
    record ``until`` has been seen and the partition then reports EOF (or the deadline passes).
    Returns (values, note) where note says how the read ended."""
    conf = kafka.consumer_defaults(bootstrap)
    conf.update({"group.id": _fresh("reader"), "isolation.level": "read_committed",
                 "fetch.wait.max.ms": 50})
    c = Consumer(conf)
    values: list[bytes] = []
    seen_until = False
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while not deadline.passed():
            for m in c.consume(100, 0.2):
                err = m.error()
                if err is None:
                    values.append(m.value())
                    seen_until = seen_until or m.value() == until
                elif err.code() == KafkaError._PARTITION_EOF:
                    if seen_until:
                        return values, "read to partition EOF"
                else:
                    return values, f"read error {err.name()}: {err.str()}"
        return values, "deadline passed before the last committed record" + (
            "'s partition EOF" if seen_until else " was seen")
    finally:
        c.close()


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _probe_transactions_supported(bootstrap: str, timeout_s: float, details: dict[str, str]) -> bool:
    name = "transactions_supported"
    deadline = _Deadline(timeout_s)
    topic = _fresh("txn")
    committed = f"committed-{uuid.uuid4().hex}".encode()
    producers: list[Producer] = []
    try:
        kafka.create_topics(bootstrap, {topic: 1}, exist_ok=False, timeout_s=deadline.left(), retry_s=0)
        producers.append(p := _txn_producer(bootstrap, _fresh("txid"), deadline))
        p.init_transactions(deadline.left())
        p.begin_transaction()
        _produce_flushed(p, topic, committed, deadline)
        p.commit_transaction(deadline.left())
    except Exception as exc:
        details[f"{name}.error"] = _error_text(exc)
        return False
    finally:
        _close(producers)
    values, note = _read_committed(bootstrap, topic, committed, deadline)
    ok = committed in values
    details[f"{name}.committed_record_seen"] = _yes(ok)
    if not ok:
        details[f"{name}.read"] = note
    return ok


def _probe_hides_aborted(bootstrap: str, timeout_s: float, details: dict[str, str]) -> bool:
    name = "read_committed_hides_aborted"
    deadline = _Deadline(timeout_s)
    topic = _fresh("abort")
    aborted = f"aborted-{uuid.uuid4().hex}".encode()
    committed = f"committed-{uuid.uuid4().hex}".encode()
    producers: list[Producer] = []
    try:
        kafka.create_topics(bootstrap, {topic: 1}, exist_ok=False, timeout_s=deadline.left(), retry_s=0)
        producers.append(p := _txn_producer(bootstrap, _fresh("txid"), deadline))
        p.init_transactions(deadline.left())
        p.begin_transaction()
        _produce_flushed(p, topic, aborted, deadline)
        p.abort_transaction(deadline.left())
        p.begin_transaction()
        _produce_flushed(p, topic, committed, deadline)
        p.commit_transaction(deadline.left())
    except Exception as exc:
        details[f"{name}.error"] = _error_text(exc)
        return False
    finally:
        _close(producers)
    values, note = _read_committed(bootstrap, topic, committed, deadline)
    aborted_seen, committed_seen = aborted in values, committed in values
    details[f"{name}.aborted_record_seen"] = _yes(aborted_seen)
    details[f"{name}.committed_record_seen"] = _yes(committed_seen)
    if not committed_seen:
        details[f"{name}.read"] = note
    return committed_seen and not aborted_seen


def _probe_zombie_fenced(bootstrap: str, timeout_s: float, details: dict[str, str]) -> bool:
    name = "zombie_fenced"
    deadline = _Deadline(timeout_s)
    topic = _fresh("zombie")
    txid = _fresh("txid")
    # open: produced before the successor's init_transactions (the broker should abort it);
    # late: produced after it (the broker should reject it, or the commit should fail).
    zombie_open = f"zombie-open-{uuid.uuid4().hex}".encode()
    zombie_late = f"zombie-late-{uuid.uuid4().hex}".encode()
    sentinel = f"successor-{uuid.uuid4().hex}".encode()
    producers: list[Producer] = []
    try:
        try:
            kafka.create_topics(bootstrap, {topic: 1}, exist_ok=False, timeout_s=deadline.left(), retry_s=0)
            producers.append(zombie := _txn_producer(bootstrap, txid, deadline, quiet=True))
            zombie.init_transactions(deadline.left())
            zombie.begin_transaction()
            _produce_flushed(zombie, topic, zombie_open, deadline)
            producers.append(successor := _txn_producer(bootstrap, txid, deadline))
            successor.init_transactions(deadline.left())
        except Exception as exc:
            details[f"{name}.error"] = f"before the zombie's commit: {_error_text(exc)}"
            return False

        fenced = False
        try:
            _produce_flushed(zombie, topic, zombie_late, deadline)
            zombie.commit_transaction(deadline.left())
            details[f"{name}.zombie_commit"] = "succeeded"
        except Exception as exc:
            fenced = _is_fencing(exc)
            details[f"{name}.zombie_commit"] = f"raised {_error_text(_kafka_cause(exc))}"

        try:
            successor.begin_transaction()
            _produce_flushed(successor, topic, sentinel, deadline)
            successor.commit_transaction(deadline.left())
        except Exception as exc:
            details[f"{name}.error"] = f"successor's commit: {_error_text(exc)}"
            return False
        # Read while the zombie still exists: the abort that _close attempts on it must not
        # decide what is visible.
        values, note = _read_committed(bootstrap, topic, sentinel, deadline)
    finally:
        _close(producers)
    if sentinel not in values:
        details[f"{name}.read"] = f"successor's record not read back ({note})"
        return False
    open_seen, late_seen = zombie_open in values, zombie_late in values
    details[f"{name}.zombie_record_seen"] = (
        f"{_yes(open_seen or late_seen)} (open-transaction record: {_yes(open_seen)}, "
        f"after-fencing record: {_yes(late_seen)})")
    return fenced and not (open_seen or late_seen)


def _probe_send_offsets(bootstrap: str, timeout_s: float, details: dict[str, str]) -> bool:
    name = "send_offsets_to_transaction_supported"
    deadline = _Deadline(timeout_s)
    topic = _fresh("offsets")
    sent_offset = 3
    conf = kafka.consumer_defaults(bootstrap)
    # Never subscribed: its group metadata has generation -1 (a memberless commit), no join wait.
    conf.update({"group.id": _fresh("group"), "isolation.level": "read_committed"})
    consumer = Consumer(conf)
    producers: list[Producer] = []
    try:
        kafka.create_topics(bootstrap, {topic: 1}, exist_ok=False, timeout_s=deadline.left(), retry_s=0)
        producers.append(p := _txn_producer(bootstrap, _fresh("txid"), deadline))
        p.init_transactions(deadline.left())
        p.begin_transaction()
        for i in range(sent_offset):
            _produce_flushed(p, topic, f"record-{i}".encode(), deadline)
        p.send_offsets_to_transaction([TopicPartition(topic, 0, sent_offset)],
                                      consumer.consumer_group_metadata(), deadline.left())
        p.commit_transaction(deadline.left())
        got = consumer.committed([TopicPartition(topic, 0)], timeout=deadline.left())[0]
    except Exception as exc:
        details[f"{name}.error"] = _error_text(exc)
        return False
    finally:
        _close(producers)
        consumer.close()
    if got.error is not None:
        details[f"{name}.error"] = f"committed(): {got.error.name()}: {got.error.str()}"
        return False
    details[f"{name}.committed_offset"] = f"{got.offset} (sent {sent_offset})"
    return got.offset == sent_offset


def _probe_complete_after_fencing(bootstrap: str, timeout_s: float, details: dict[str, str]) -> bool:
    name = "transactions_complete_after_fencing"
    deadline = _Deadline(timeout_s)
    topic = _fresh("fencing")
    txid_a, txid_b = _fresh("txid"), _fresh("txid")
    records = {w: f"{w}-{uuid.uuid4().hex}".encode() for w in ("a", "b", "a2")}
    consumers = {}
    for g in ("A", "B"):
        conf = kafka.consumer_defaults(bootstrap)
        conf.update({"group.id": _fresh(f"group{g}"), "isolation.level": "read_committed"})
        consumers[g] = Consumer(conf)   # never subscribed: memberless commits, as above
    producers: list[Producer] = []
    try:
        kafka.create_topics(bootstrap, {topic: 1}, exist_ok=False, timeout_s=deadline.left(), retry_s=0)
        producers.append(a := _txn_producer(bootstrap, txid_a, deadline, quiet=True))
        producers.append(b := _txn_producer(bootstrap, txid_b, deadline))
        a.init_transactions(deadline.left())
        b.init_transactions(deadline.left())
        a.begin_transaction()
        _produce_flushed(a, topic, records["a"], deadline)
        b.begin_transaction()
        _produce_flushed(b, topic, records["b"], deadline)
        producers.append(a2 := _txn_producer(bootstrap, txid_a, deadline))
        a2.init_transactions(deadline.left())      # the restart: A's transaction is aborted
        a2.begin_transaction()
        _produce_flushed(a2, topic, records["a2"], deadline)
        a2.send_offsets_to_transaction([TopicPartition(topic, 0, 1)],
                                       consumers["A"].consumer_group_metadata(), deadline.left())
        a2.commit_transaction(deadline.left())
        b.send_offsets_to_transaction([TopicPartition(topic, 0, 2)],
                                      consumers["B"].consumer_group_metadata(), deadline.left())
        b.commit_transaction(deadline.left())
        got = {g: c.committed([TopicPartition(topic, 0)], timeout=deadline.left())[0].offset
               for g, c in consumers.items()}
    except Exception as exc:
        details[f"{name}.error"] = _error_text(exc)
        return False
    finally:
        _close(producers)
        for c in consumers.values():
            c.close()
    details[f"{name}.committed_offsets"] = f"restarted producer {got['A']} (sent 1), other producer {got['B']} (sent 2)"
    # A transaction left unfinished never finishes by waiting: a few seconds show it.
    values, note = _read_committed(bootstrap, topic, records["a2"], _Deadline(min(deadline.left(), 5.0)))
    seen = records["a2"] in values and records["b"] in values
    details[f"{name}.records_read_committed"] = f"{_yes(seen)} ({note})"
    return got == {"A": 1, "B": 2} and seen


def probe_transactions(bootstrap_servers: str, timeout_s: float = 30.0) -> TransactionCapabilities:
    """Run every transaction probe against the broker at ``bootstrap_servers``. Each probe is
    bounded by ``timeout_s``; none raises for a "no" (see the module docstring)."""
    details: dict[str, str] = {}
    return TransactionCapabilities(
        transactions_supported=_probe_transactions_supported(bootstrap_servers, timeout_s, details),
        read_committed_hides_aborted=_probe_hides_aborted(bootstrap_servers, timeout_s, details),
        zombie_fenced=_probe_zombie_fenced(bootstrap_servers, timeout_s, details),
        send_offsets_to_transaction_supported=_probe_send_offsets(bootstrap_servers, timeout_s, details),
        transactions_complete_after_fencing=_probe_complete_after_fencing(bootstrap_servers, timeout_s, details),
        details=details,
    )
