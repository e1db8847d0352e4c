"""The worker's record collector: where every task's outputs, internal records, dead-letter
records and changelog records are produced, and the producer side of a commit unit (flush,
delivery errors, the Kafka transaction under exactly_once). ``processor/runtime/worker.py``
drives it; ``Task`` sees only ``send``.

Invariant: a record handed to ``send`` or ``send_changelog`` is either delivered by the next
``flush`` or that flush raises (``DeliveryFailed``, exit 7): no delivery error is dropped.
Exactly once, the open transaction fails instead (``processor/runtime/commit_unit.py`` aborts it
and rebuilds the tasks); a producer fenced because the broker aborted its transaction on its
timeout is replaced (``renew``: a new producer with the same transactional id).
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaError, KafkaException

from processor.errors import KafkaIOError
from processor.kafka import clients as kafka

log = logging.getLogger("processor.worker")

# librdkafka's RD_KAFKA_PARTITION_UA: the producer's partitioner picks the partition
_ANY_PARTITION = -1


class DeliveryFailed(KafkaIOError):
    """Records the producer could not deliver (exit 7)."""


class SendOffsetsHung(KafkaIOError):
    """``send_offsets_to_transaction`` did not return: its producer is abandoned (exactly once
    renews it)."""


# ``send_offsets_to_transaction``'s timeout (it takes milliseconds; one that times out is resumed by
# the committer) and how long past it the call may take before it is abandoned
SEND_OFFSETS_TIMEOUT_S = 10.0
SEND_OFFSETS_GRACE_S = 5.0


class ProduceFailed(KafkaIOError):
    """The producer refused a record at once (exit 7, unless exactly once recovers from it:
    a transactional producer refuses records once its transaction failed); ``error`` is
    librdkafka's."""

    def __init__(self, message: str, error: KafkaError | None = None) -> None:
        super().__init__(message)
        self.error = error


class KafkaCollector:
    """Sends task output through its producer; delivery failures are collected and fatal.

    At least once: outputs go through a producer reporting only failures (no per-record
    callback on the hot path); changelog records through a second producer whose last record per
    partition reports its offset. Exactly once: one transactional producer for both; a failed
    record fails the transaction's commit.

    ``track_ends`` (a topology with table sinks): every delivered output reports its offset, and
    ``delivered_ends`` keeps, per partition, the offset after the last one delivered. After a
    ``flush`` every record sent later lands at or above it: that is what a commit record keeps
    per table sink partition (``processor/runtime/sink_tails.py``). It costs a callback per
    output record (measured ~0.4 us on this machine kind), so only such topologies pay it."""

    def __init__(self, producer_config: dict, transactional_id: str | None = None, track_ends: bool = False):
        self.sent = 0
        self.errors: list[str] = []
        self.delivered_ends: dict[tuple[str, int], int] = {}
        self.transactional = transactional_id is not None
        on_delivery = self.on_delivery_tracking if track_ends else self.on_delivery_error
        # exactly once: the transactional producer's settings (``renew`` opens another), how long
        # the broker lets a transaction stay open, and when the open one began
        self._transactional_config: dict = {}
        self.transaction_timeout_s = int(producer_config.get("transaction.timeout.ms", 60_000)) / 1000
        self.began_at = time.monotonic()
        if self.transactional:
            self._transactional_config = {**producer_config, "transactional.id": transactional_id,
                                          "delivery.report.only.error": False,
                                          # (a failed record fails the commit: not collected)
                                          **({"on_delivery": self._track} if track_ends else {})}
            self.producer = kafka.new_producer(self._transactional_config,
                                               "outputs, changelogs and offsets (transactional)")
            self.changelog_producer = self.producer
        else:
            self.producer = kafka.new_producer({**producer_config, "delivery.report.only.error": not track_ends,
                                                "on_delivery": on_delivery}, "outputs")
            self.changelog_producer = kafka.new_producer({**producer_config, "delivery.report.only.error": False,
                                                          "on_delivery": self.on_delivery_error},
                                                         "changelogs")
        self.in_transaction = False

    def send(self, topic, key, value, timestamp, headers, partition=None):
        produce = self.producer.produce
        if partition is None:
            partition = _ANY_PARTITION
        while True:
            try:
                # positional: confluent-kafka parses keyword arguments at ~0.35 us more per call
                # (topic, value, key, partition, callback, on_delivery, timestamp, headers): the
                # callback slot comes first and wins even as None, so a callback goes there
                produce(topic, value, key, partition, None, None, timestamp, headers or None)
                break
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as exc:   # refused at once (the task checked sizes before)
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                raise ProduceFailed(f"producing a record to {topic}"
                                    f"{'' if partition == _ANY_PARTITION else f'[{partition}]'}: "
                                    f"{err.str() if err is not None else exc}", err) from None
        self.sent += 1

    def send_changelog(self, topic, key, value, partition, headers, on_delivery):
        produce = self.changelog_producer.produce
        while True:
            try:
                produce(topic, value, key, partition, on_delivery, None, 0, headers)   # (callback slot)
                break
            except BufferError:
                self.changelog_producer.poll(0.05)

    def send_changelog_records(self, topic, partition, records, on_last_delivery) -> None:
        """``records`` (``(key, value, headers)``) to one changelog partition, in order; the last
        one reports its delivery to ``on_last_delivery``."""
        producer = self.changelog_producer
        produce = producer.produce
        end = len(records) - 1
        i = 0
        while i < end:
            j = i
            try:
                for j in range(i, end):
                    k, v, h = records[j]
                    produce(topic, v, k, partition, None, None, 0, h)
                i = end
            except BufferError:
                i = j
                producer.poll(0.05)
        if end >= 0:
            k, v, h = records[end]
            self.send_changelog(topic, k, v, partition, h, on_last_delivery)

    def on_delivery_error(self, err, msg):
        if err is not None:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")

    def _track(self, err, msg):
        if err is None:
            self.delivered_ends[(msg.topic(), msg.partition())] = msg.offset() + 1

    def on_delivery_tracking(self, err, msg):
        if err is not None:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
        else:
            self.delivered_ends[(msg.topic(), msg.partition())] = msg.offset() + 1

    def flush(self, timeout_s: float = 60.0) -> None:
        """Every record sent so far delivered, or ``DeliveryFailed``. Records still queued after
        ``timeout_s`` (the broker not answering: down, paused) are waited for again, one warning
        line each time, up to ``TRANSIENT_TIMEOUT_S`` in all: librdkafka fails them itself at
        ``message.timeout.ms`` (capped at ``transaction.timeout.ms`` under exactly once)."""
        started = time.monotonic()
        while True:
            try:
                remaining = self.producer.flush(timeout_s)
                if self.changelog_producer is not self.producer:
                    remaining += self.changelog_producer.flush(timeout_s)
            except SystemError as exc:
                # a fatal producer error (fenced) that confluent-kafka had pending when it called a
                # delivery callback comes out as a SystemError caused by it (seen under exactly
                # once, a zombie fenced under load): the KafkaException it is, for the commit's
                # transaction-failure path
                if isinstance(exc.__cause__, KafkaException):
                    raise exc.__cause__ from None
                raise
            waited = time.monotonic() - started
            if not remaining or self.errors or waited >= kafka.TRANSIENT_TIMEOUT_S:
                break
            log.warning("%d record(s) not delivered after %.0f s: the broker is not answering (transient); "
                        "waiting on (librdkafka fails them at message.timeout.ms)", remaining, waited)
        if remaining:
            raise DeliveryFailed(f"{remaining} output record(s) not delivered within {waited:.0f} s")
        if self.errors:
            first = self.errors[0]
            raise DeliveryFailed(f"{len(self.errors)} output record(s) failed delivery, first: {first}")

    def poll(self) -> None:
        self.producer.poll(0)
        if self.changelog_producer is not self.producer:
            self.changelog_producer.poll(0)

    # -- exactly once ---------------------------------------------------------------------------
    def begin(self) -> None:
        if self.transactional and not self.in_transaction:
            self.producer.begin_transaction()
            self.in_transaction = True
            self.began_at = time.monotonic()

    def send_offsets(self, offsets, group_metadata, timeout_s: float = SEND_OFFSETS_TIMEOUT_S) -> None:
        """The group offsets of the open transaction (none: nothing to send). librdkafka's call can
        ignore its timeout and wait forever when the group coordinator is down or unknown
        (librdkafka issues 5456, 5511; seen here after a broker pause): it runs on a thread of its
        own, and one still waiting ``SEND_OFFSETS_GRACE_S`` after its timeout is abandoned with
        its producer (``SendOffsetsHung``: the caller renews the producer)."""
        if not offsets:
            return
        producer = self.producer
        outcome: list[BaseException | None] = []

        def call() -> None:
            try:
                producer.send_offsets_to_transaction(offsets, group_metadata, timeout_s)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)
        t = threading.Thread(target=call, name="send-offsets-to-transaction", daemon=True)
        t.start()
        t.join(timeout_s + SEND_OFFSETS_GRACE_S)
        if not outcome:
            raise SendOffsetsHung(f"sending the group offsets to the transaction did not return within "
                                  f"{timeout_s + SEND_OFFSETS_GRACE_S:.0f} s (librdkafka waits on the group "
                                  f"coordinator past its timeout)")
        if outcome[0] is not None:
            raise outcome[0]

    def commit_transaction(self, offsets, group_metadata) -> None:
        self.send_offsets(offsets, group_metadata)
        self.producer.commit_transaction(60)
        self.in_transaction = False

    def abort(self) -> None:
        """Abort the open transaction. A retriable error (timed out: the broker did not answer)
        leaves it open, to be aborted again; any other error closes it here."""
        if self.transactional and self.in_transaction:
            try:
                self.producer.abort_transaction(30)
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is None or err.fatal() or not err.retriable():
                    self.in_transaction = False
                raise
            self.in_transaction = False

    def renew(self, timeout_s: float) -> None:
        """Exactly once, after the broker fenced this producer (it aborted the open transaction on
        its timeout and bumped the producer's epoch): a new producer with the same transactional
        id, its transactions initialised (which fences the old one for good); no transaction open.
        The old producer's records are dropped: their transaction is aborted."""
        old = self.producer
        try:
            old.purge()
        except Exception:   # a fatal producer may refuse even that: it is dropped anyway
            pass
        self.in_transaction = False
        self.producer = self.changelog_producer = kafka.new_producer(
            self._transactional_config, "outputs, changelogs and offsets (transactional, renewed)")
        txn_id = self._transactional_config["transactional.id"]
        kafka.retry_transient(lambda: self.producer.init_transactions(timeout_s),
                              f"initialising transactions of a new producer for {txn_id!r}")
