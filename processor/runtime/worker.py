"""The consumer-group worker: the only place that consumes, produces and commits.

Loop: consume a batch -> route each record to the Task of (sub-topology, partition) -> the
task's operators send outputs through the producer -> every ``commit_interval_ms``: flush the
producer (outputs durable, delivery errors fatal) -> commit each task's stores and positions as
one RocksDB write -> commit the same offsets to the group. This order gives at-least-once: a
crash anywhere replays from a point whose outputs are durable and whose state matches.

Assignment: tasks are created for assigned partition numbers (range assignor keeps partition
``i`` of co-partitioned topics on one worker). A task's start offset is the larger of the
group's committed offset and its local checkpoint; when the local state is behind the group
(the partition was processed elsewhere), its stores are caught up from their changelog (for a
table source, the source topic itself) before processing resumes.

Internal topics (repartition) are created at start-up with the partition count of the topics
their writers read, before any record could auto-create them on a broker that does that.

Stop: SIGTERM/SIGINT finish the record in hand, flush deferred emissions (``Emit.every``),
commit, close stores and return. Revoked partitions are flushed and committed before they go.

Test hook: with ``PROCESSOR_TEST_KILL_BEFORE_COMMIT=N`` the worker SIGKILLs itself at its N-th
commit with new records, after the outputs were forwarded and flushed to Kafka and before any
state or offset is committed (the crash window emit-on-change must survive).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from processor.errors import ConfigError, ProcessorError
from processor.runtime import kafka
from processor.runtime.task import Task, dlq_topic_for
from processor.state.rocksdb import RocksDBDatabase

log = logging.getLogger("processor.worker")

_EOF = KafkaError._PARTITION_EOF


RESTORE_COMMIT_EVERY = 10_000
RESTORE_STALL_S = 60.0


class DeliveryFailed(ProcessorError):
    pass


class _RestoreInterrupted(Exception):
    pass


class KafkaCollector:
    """Sends task output through its producer; delivery failures are collected and fatal."""

    def __init__(self, producer_config: dict):
        self.sent = 0
        self.errors: list[str] = []
        # delivery reports only for failures: no per-record callback on the hot path
        self.producer = Producer({**producer_config, "delivery.report.only.error": True,
                                  "on_delivery": self.on_delivery_error})

    def send(self, topic, key, value, timestamp, headers, partition=None):
        produce = self.producer.produce
        while True:
            try:
                if partition is not None:
                    produce(topic, value, key, partition=partition, timestamp=timestamp, headers=headers)
                elif headers:
                    produce(topic, value, key, timestamp=timestamp, headers=headers)
                else:
                    produce(topic, value, key, timestamp=timestamp)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.sent += 1

    def on_delivery_error(self, err, msg):  # only called for failures (delivery.report.only.error)
        if err is not None:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")

    def flush(self, timeout_s: float = 60.0) -> None:
        remaining = self.producer.flush(timeout_s)
        if remaining:
            raise DeliveryFailed(f"{remaining} output record(s) not delivered within {timeout_s:.0f} s")
        if self.errors:
            first = self.errors[0]
            raise DeliveryFailed(f"{len(self.errors)} output record(s) failed delivery, first: {first}")


class Worker:
    def __init__(self, topology, bootstrap_servers: str, application_id: str, state_dir: str | Path,
                 *, commit_interval_ms: int = 1000, on_error: str = "dlq",
                 consumer_config: dict | None = None, producer_config: dict | None = None,
                 batch_size: int = 1000, startup_timeout_s: float = 10.0):
        topology = topology.for_application(application_id)
        self.topology = topology
        self.bootstrap_servers = bootstrap_servers
        self.application_id = application_id
        self.state_dir = Path(state_dir) / application_id
        self.commit_interval_s = commit_interval_ms / 1000.0
        self.on_error = on_error
        self.dlq_topic = dlq_topic_for(application_id)
        self.batch_size = batch_size
        self.startup_timeout_s = startup_timeout_s
        self._consumer_config = consumer_config or {}
        self._producer_config = producer_config or {}
        self.tasks: dict[tuple[int, int], Task] = {}
        self._sub_of_topic = topology.subtopology_of_topic()
        self._stop = threading.Event()
        self._assigned: set[tuple[str, int]] = set()
        self._at_eof: set[tuple[str, int]] = set()
        self._closing = False
        self.first_record_at: float | None = None
        self.last_record_at: float | None = None
        self.records_processed = 0
        self.restored_records = 0
        self.finished_tasks_metrics: list[dict] = []
        self._fatal: BaseException | None = None
        self._group_offsets: dict[tuple[str, int], int] = {}
        self._wall_punctuation = any(
            (e := n.attrs.get("emit")) is not None and e.mode == "every" and e.clock == "wall"
            for n in topology.nodes)
        kill = os.environ.get("PROCESSOR_TEST_KILL_BEFORE_COMMIT")
        self._kill_at_commit = int(kill) if kill else None
        self._commits_with_records = 0
        self._sent_at_drain_check = 0
        self._internal_topics = set(topology.internal_topics())
        self._processed_at_last_commit = 0

    # -- startup checks -----------------------------------------------------------------------
    def check_topics(self) -> dict[str, int]:
        """Refuse to start, with one clear message, on a missing topic or a partition mismatch."""
        parts = kafka.topic_partitions(self.bootstrap_servers, self.startup_timeout_s)
        topo = self.topology
        missing = [t for t in topo.external_source_topics() + topo.sink_topics(internal=False) if t not in parts]
        if missing:
            raise ConfigError(f"topic(s) {', '.join(sorted(set(missing)))} do not exist on "
                              f"{self.bootstrap_servers}; create them before starting "
                              f"application {self.application_id!r}")
        wanted = topo.internal_topic_partitions(parts)
        for t, n in wanted.items():
            if t in parts and parts[t] != n:
                raise ConfigError(f"internal topic {t} has {parts[t]} partitions, but application "
                                  f"{self.application_id!r} needs {n} (the partition count of its input); "
                                  f"delete it or reset the application")
        create = {t: n for t, n in wanted.items() if t not in parts}
        if create:
            kafka.create_topics(self.bootstrap_servers, create)
            parts.update(create)
        for i in range(len(self.topology.subtopologies)):
            counts = {t: parts[t] for t in self.topology.source_topics(i)}
            if len(set(counts.values())) > 1:
                listing = ", ".join(f"{t}={n}" for t, n in sorted(counts.items()))
                raise ConfigError(f"co-partitioned source topics of sub-topology {i} have different "
                                  f"partition counts ({listing}); they must be equal")
        if self.on_error == "dlq" and self.dlq_topic not in parts:
            kafka.create_topics(self.bootstrap_servers, {self.dlq_topic: 1})
        return parts

    # -- task management ----------------------------------------------------------------------
    def _open_task(self, sub: int, partition: int) -> Task:
        db = RocksDBDatabase(self.state_dir / f"task-{sub}_{partition}")
        try:
            return Task(self.topology, sub, partition, db, self.collector, lambda: int(time.time() * 1000),
                        on_error=self.on_error, dlq_topic=self.dlq_topic)
        except BaseException:
            db.close()
            raise

    def _on_assign(self, consumer, partitions):
        try:
            committed = {(tp.topic, tp.partition): tp.offset
                         for tp in consumer.committed(partitions, timeout=30)}
            for tp in partitions:
                key = (self._sub_of_topic[tp.topic], tp.partition)
                if key not in self.tasks:
                    self.tasks[key] = self._open_task(*key)
            for tp in partitions:
                task = self.tasks[(self._sub_of_topic[tp.topic], tp.partition)]
                local = task.positions.get((tp.topic, tp.partition), 0)
                group = max(committed.get((tp.topic, tp.partition), -1), 0)
                self._group_offsets[(tp.topic, tp.partition)] = group
                if local < group:
                    if self._unrestorable(task):
                        # Stores with no changelog yet (aggregates): rebuild them by reprocessing
                        # from the local checkpoint; downstream sees those emissions again.
                        log.warning("task %s: local state of %s[%d] is at %d, the group at %d; "
                                    "reprocessing to rebuild stores that have no changelog",
                                    task.id, tp.topic, tp.partition, local, group)
                        group = local
                    else:
                        self._restore(task, tp.topic, tp.partition, local, group)
                start = max(local, group)
                if start > 0:
                    task.positions[(tp.topic, tp.partition)] = start
                tp.offset = start if start > 0 else OFFSET_BEGINNING
                self._assigned.add((tp.topic, tp.partition))
                self._at_eof.discard((tp.topic, tp.partition))
            consumer.assign(partitions)
            log.info("assigned %s", ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in partitions))
        except _RestoreInterrupted:
            self._stop.set()  # stop requested mid-restore; progress so far is committed locally
        except Exception as exc:  # callbacks cannot raise into librdkafka: stop the worker instead
            self._fatal = self._fatal or exc
            self._stop.set()

    @staticmethod
    def _unrestorable(task: Task) -> bool:
        return any(s.changelog_topic is None for s in task.store_specs)

    def _restore(self, task: Task, topic: str, partition: int, start: int, end: int) -> None:
        """Bring the stores whose changelog is ``topic`` from offset ``start`` up to ``end``."""
        if not any(s.changelog_topic == topic for s in task.store_specs):
            return
        log.info("restoring task %s from %s[%d] offsets %d..%d", task.id, topic, partition, start, end)
        conf = kafka.consumer_defaults(self.bootstrap_servers)
        conf["group.id"] = f"{self.application_id}-restore"  # assign() only; never commits
        restorer = Consumer(conf)
        n, t0, last_log = 0, time.monotonic(), time.monotonic()
        last_progress = t0
        try:
            restorer.assign([TopicPartition(topic, partition, start if start > 0 else OFFSET_BEGINNING)])
            done = start >= end
            while not done:
                for m in restorer.consume(self.batch_size, 1.0):
                    err = m.error()
                    if err is not None:
                        if err.code() == _EOF:
                            done = True
                            break
                        raise ConfigError(f"restore of {topic}[{partition}] failed: {err.str()}")
                    off = m.offset()
                    if off >= end:
                        done = True
                        break
                    task.restore(topic, partition, off, m.timestamp()[1], m.key(), m.value())
                    n += 1
                    last_progress = time.monotonic()
                    if n % RESTORE_COMMIT_EVERY == 0:
                        task.commit()  # bounded memory; state and position stay consistent
                    if off + 1 >= end:
                        done = True
                        break
                now = time.monotonic()
                if self._stop.is_set():
                    task.commit()
                    raise _RestoreInterrupted()
                if now - last_progress > RESTORE_STALL_S:
                    raise ConfigError(f"restore of {topic}[{partition}] made no progress for "
                                      f"{RESTORE_STALL_S:.0f} s at offset {task.positions.get((topic, partition))}")
                if now - last_log > 5:
                    last_log = now
                    log.info("restoring task %s from %s[%d]: %d of %d records", task.id, topic, partition,
                             n, end - start)
        finally:
            restorer.close()
        task.positions[(topic, partition)] = end
        task.commit()
        self.restored_records += n
        log.info("restored task %s from %s[%d]: %d records in %.1f s", task.id, topic, partition, n,
                 time.monotonic() - t0)

    def _on_revoke(self, consumer, partitions):
        try:
            if not self._closing:
                for key in {(self._sub_of_topic[tp.topic], tp.partition) for tp in partitions}:
                    task = self.tasks.get(key)
                    if task is not None and self._fatal is None:
                        task.flush()
                self.commit()
                if self._fatal is None:
                    self.collector.flush()  # the flush's outbox records, sent by the commit
            self._close_tasks_for(partitions)
        except Exception as exc:
            self._fatal = self._fatal or exc
            self._stop.set()

    def _on_lost(self, consumer, partitions):
        # Another member may own these now: close without committing (closing a task never
        # writes its pending state), so only what was committed survives.
        self._close_tasks_for(partitions)

    def _close_tasks_for(self, partitions):
        for tp in partitions:
            self._assigned.discard((tp.topic, tp.partition))
            self._at_eof.discard((tp.topic, tp.partition))
        self._close_tasks({(self._sub_of_topic[tp.topic], tp.partition) for tp in partitions})

    def _close_tasks(self, keys):
        errors = []
        for key in keys:
            task = self.tasks.pop(key, None)
            if task is not None:
                self.finished_tasks_metrics.append(task.metrics())
                try:
                    task.close()
                except Exception as exc:  # close the others before reporting
                    errors.append(exc)
        if errors:
            raise errors[0]

    # -- commit -------------------------------------------------------------------------------
    def commit(self) -> None:
        """Flush outputs, then state+positions per task, then the group offsets. Never after a
        fatal error, and never moves a group offset backwards."""
        if self._fatal is not None:
            return
        self.collector.flush()
        if self._kill_at_commit is not None and self.records_processed > self._processed_at_last_commit:
            self._commits_with_records += 1
            if self._commits_with_records >= self._kill_at_commit:
                log.warning("test hook: SIGKILL after forwarding, before committing")
                os.kill(os.getpid(), signal.SIGKILL)
        self._processed_at_last_commit = self.records_processed
        offsets = []
        for task in self.tasks.values():
            for (topic, part), off in task.commit().items():
                if off > self._group_offsets.get((topic, part), 0):
                    offsets.append(TopicPartition(topic, part, off))
        if offsets:
            self.consumer.commit(offsets=offsets, asynchronous=False)
            for tp in offsets:
                self._group_offsets[(tp.topic, tp.partition)] = tp.offset

    def _drained(self) -> bool:
        """Every assigned partition is at its end, and so is every internal partition this worker
        reads after the records it wrote itself reached the broker."""
        if self.collector.sent == self._sent_at_drain_check:
            return True
        self.collector.flush()
        self._sent_at_drain_check = self.collector.sent
        internal = {tp: self.tasks[(self._sub_of_topic[tp[0]], tp[1])].positions.get(tp, 0)
                    for tp in self._assigned if tp[0] in self._internal_topics}
        more = kafka.partitions_with_records_from(self.bootstrap_servers, internal)
        self._at_eof -= more
        return not more

    # -- main loop ----------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def metrics(self) -> dict:
        """Counters of every operator, summed over live and closed tasks."""
        total: dict[str, dict[str, int]] = {}
        for m in self.finished_tasks_metrics + [t.metrics() for t in self.tasks.values()]:
            for node, counters in m.items():
                agg = total.setdefault(node, {})
                for k, v in counters.items():
                    agg[k] = agg.get(k, 0) + v
        return total

    def run(self, until_drained: bool = False, install_signal_handlers: bool = True,
            max_seconds: float | None = None) -> None:
        """Process until stopped (signal or ``stop()``), or with ``until_drained`` until every
        assigned partition has been read to its end."""
        self._fatal = None
        self.check_topics()
        self.collector = KafkaCollector({**kafka.producer_defaults(self.bootstrap_servers),
                                         **self._producer_config})
        cconf = kafka.consumer_defaults(self.bootstrap_servers)
        cconf.update({"group.id": self.application_id, "session.timeout.ms": 10000,
                      "heartbeat.interval.ms": 1000})
        cconf.update(self._consumer_config)
        self.consumer = Consumer(cconf)
        previous = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self._stop.set())
        try:
            self.consumer.subscribe(sorted(self._sub_of_topic), on_assign=self._on_assign,
                                    on_revoke=self._on_revoke, on_lost=self._on_lost)
            while True:
                self._loop(until_drained, max_seconds)
                if self._fatal is not None:
                    raise self._fatal
                sent = self.collector.sent
                for task in self.tasks.values():
                    task.flush()
                self.commit()  # sends the flush's internal records (outbox) after persisting them
                # Drained, but the flush sent deferred emissions: if some went to internal
                # topics this worker reads, process them too before stopping.
                if not until_drained or self._stop.is_set() or self.collector.sent == sent:
                    break
            self.collector.flush()
        finally:
            self._closing = True
            try:
                self.consumer.close()
            finally:
                self._close_tasks(list(self.tasks))
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    def _loop(self, until_drained: bool, max_seconds: float | None) -> None:
        consumer = self.consumer
        tasks = self.tasks
        sub_of = self._sub_of_topic
        stop = self._stop
        at_eof = self._at_eof
        started = time.monotonic()
        last_commit = started
        batch = self.batch_size
        while not stop.is_set():
            msgs = consumer.consume(batch, 0.1)
            if self._fatal is not None:
                break
            if msgs and self.first_record_at is None:
                self.first_record_at = time.monotonic()
            n = 0
            for m in msgs:
                if stop.is_set():
                    break
                err = m.error()
                if err is not None:
                    if err.code() == _EOF:
                        self._at_eof.add((m.topic(), m.partition()))
                        continue
                    if err.fatal():
                        raise ConfigError(f"fatal Kafka error: {err.str()}")
                    # librdkafka recovers from the rest itself (broker down, leader moves)
                    log.warning("Kafka error (librdkafka retries): %s", err.str())
                    continue
                topic = m.topic()
                part = m.partition()
                task = tasks.get((sub_of[topic], part))
                if task is None:  # revoked while in flight: not processed, not committed
                    continue
                task.process(topic, part, m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers())
                n += 1
                if at_eof:
                    at_eof.discard((topic, part))
            if n:
                self.records_processed += n
                self.last_record_at = time.monotonic()
            if self._wall_punctuation:
                now_ms = int(time.time() * 1000)
                for task in tasks.values():
                    task.punctuate_wall(now_ms)
            now = time.monotonic()
            if now - last_commit >= self.commit_interval_s:
                self.commit()
                last_commit = now
            else:
                self.collector.producer.poll(0)
            if until_drained and self._assigned and self._at_eof >= self._assigned and self._drained():
                break
            if max_seconds is not None and now - started > max_seconds:
                break
