"""The consumer-group worker: the only place that consumes, produces and commits.

Loop: consume a batch -> route each record to the Task of (sub-topology, partition) -> the
task's operators send outputs and internal records through the producer; stores write into the
task's write buffer -> every ``commit_interval_ms`` one commit unit per task
(``processor/runtime/changelog.py``): the buffered store writes go to the changelog topics;
flush (outputs, internal records, changelog durable; delivery errors fatal); each task's commit
record (input positions + changelog end offsets) goes to its task changelog; flush; the group
offsets are committed (with ``processing_guarantee="exactly_once"`` all of this is one Kafka
transaction, offsets via ``send_offsets_to_transaction``); then each task writes its buffered
state, positions and changelog ends to RocksDB as one batch. The changelogs up to the last
commit record are the truth: a crash anywhere leaves a state that a restore rebuilds exactly,
with the input positions it belongs to.

Assignment: tasks are created for assigned partition numbers (range assignor keeps partition
``i`` of co-partitioned topics on one worker). Before a task processes anything its database is
brought up to its changelogs' last commit (restore, with progress logged); the task resumes its
inputs from the positions in that commit. The restore is a phase of the main loop, not of the
assignment callback: the new tasks' partitions stay paused while the loop restores in steps of
``RESTORE_STEP_S`` between polls, so the group sees a live member however long it takes, a
revocation stops it cleanly, and the tasks already open keep processing meanwhile. A group offset beyond them means the changelogs lost
data: ``ChangelogMismatch``, never a silent skip. Tasks revoked by a rebalance are flushed and
committed, then kept open ("suspended") until the assignment: if they come back, they resume
without a restore (nobody else can have owned them in between).

Internal topics (repartition, FK subscription/response) and changelog topics (one partition per
task, ``cleanup.policy=compact``) are created and checked at start-up
(``processor/runtime/internal_topics.py``), before any record could auto-create them on a broker
that does that. What a commit unit produces goes through ``processor/runtime/collector.py``.

Stop: SIGTERM/SIGINT finish the record in hand, flush deferred emissions (``Emit.every``),
commit, close stores and return.

Test hook: ``PROCESSOR_TEST_RESTORE_STEP_DELAY_MS=D`` sleeps D ms after each restore step (a
restore longer than ``max.poll.interval.ms`` without a huge changelog).

Test hook: with ``PROCESSOR_TEST_KILL_BEFORE_COMMIT=N`` the worker SIGKILLs itself at its N-th
commit with new records, after outputs and changelog records were flushed to Kafka and before
the commit records, group offsets or local state are written (the crash window that leaves an
uncommitted changelog tail and outputs that the replay sends again).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from processor.engine.routing import Routing
from processor.errors import ChangelogMismatch, ConfigError
from processor.graph import AggregateAttrs
from processor.runtime import internal_topics, kafka, sink_tails
from processor.runtime.client_config import ClientConfig
from processor.runtime.partitioning import determine_partitioners
from processor.runtime.changelog import (ChangelogWriter, RestoreInterrupted, RestoreTarget, restore_steps,
                                        restore_tasks)
from processor.runtime.state_lock import StateDirLock
from processor.engine.task import Task, dlq_topic_for, max_record_bytes_of
from processor.runtime.collector import KafkaCollector
from processor.state.rocksdb import RocksDBDatabase

log = logging.getLogger("processor.worker")

_EOF = KafkaError._PARTITION_EOF


GUARANTEES = ("at_least_once", "exactly_once")
# the main loop restores for this long between two polls of the group consumer
RESTORE_STEP_S = 0.2
# an idle task with table sinks writes a fresh commit record this often when the sinks moved on
SINK_ENDS_REFRESH_S = 30.0
# group offset commit errors that mean "a rebalance is under way", not a broken worker
_REBALANCING = (KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS, KafkaError.UNKNOWN_MEMBER_ID)


class Worker:
    def __init__(self, topology, bootstrap_servers: str, application_id: str, state_dir: str | Path,
                 *, commit_interval_ms: int = 1000, on_error: str = "dlq",
                 consumer_config: dict | None = None, producer_config: dict | None = None,
                 batch_size: int = 1000, startup_timeout_s: float = 10.0,
                 processing_guarantee: str = "at_least_once", client_config: ClientConfig | None = None,
                 replication_factor: int | None = None, topic_configs: dict[str, dict] | None = None):
        if processing_guarantee not in GUARANTEES:
            raise ConfigError(f"processing_guarantee must be one of {GUARANTEES}, not {processing_guarantee!r}")
        self.processing_guarantee = processing_guarantee
        # internal topics created with these (processor/runtime/internal_topics.py); None: min(3, brokers)
        self.replication_factor = replication_factor
        self.topic_configs = internal_topics.check_kind_configs(topic_configs)
        # every client below is opened with the user's settings: common (client_config), then
        # per kind (consumer_config / producer_config layered over client_config's)
        config = ((client_config or ClientConfig()).with_kind("consumer", consumer_config)
                  .with_kind("producer", producer_config))
        # serdes bound to their topics; Schema Registry serdes get the registry settings
        topology = topology.for_application(application_id, config.registry)
        topology.check_serde_settings()
        self.topology = topology
        self.bootstrap_servers = kafka.cluster_of(bootstrap_servers, config)   # str(): the servers
        self.application_id = application_id
        self.state_dir = Path(state_dir) / application_id
        self.commit_interval_s = commit_interval_ms / 1000.0
        self.on_error = on_error
        self.dlq_topic = dlq_topic_for(application_id)
        self.batch_size = batch_size
        self.startup_timeout_s = startup_timeout_s
        self._consumer_config = config.for_kind("consumer")
        # As in Kafka Streams: read_committed under exactly_once, read_uncommitted otherwise;
        # a consumer-config ``isolation.level`` overrides it for every consumer the worker opens
        # (group, restore, end-of-partition probes). On a broker whose read_committed hides no
        # aborted record and whose last stable offset can stay behind a transaction it never
        # completes (Tansu: README "Reliability"), read_uncommitted loses nothing and cannot block.
        self.isolation_level = self._consumer_config.get(
            "isolation.level", "read_committed" if processing_guarantee == "exactly_once" else "read_uncommitted")
        self._producer_config = config.for_kind("producer")
        # A sub-topology reading several topics replays them in another interleaving after a
        # crash; its repartition records wait for the commit (Task ``stage_internal``) unless the
        # readers never see an uncommitted record (exactly once, read_committed).
        self._stage_internal = not (processing_guarantee == "exactly_once" and self.isolation_level == "read_committed")
        from processor.engine.partitioners import INTERNAL, PARTITIONERS

        chosen = self._producer_config.get("partitioner")
        if chosen is not None and PARTITIONERS.get(chosen) is not INTERNAL:
            raise ConfigError(f"producer setting partitioner={chosen!r}: internal topics (repartition) "
                              f"are placed by murmur2 by every host (worker, driver, backfill); the "
                              f"worker's producer must use murmur2_random (the default)")
        self.tasks: dict[tuple[int, int], Task] = {}
        self._writers: dict[tuple[int, int], ChangelogWriter] = {}
        self._suspended: dict[tuple[int, int], Task] = {}   # revoked, committed, maybe coming back
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
        self._skipped_offsets: dict[tuple[str, int], int] = {}   # at least once, see commit()
        self._wall_punctuation = any(
            isinstance(n.attrs, AggregateAttrs) and n.attrs.emit.mode == "every"
            and n.attrs.emit.clock == "wall" for n in topology.nodes)
        delay = os.environ.get("PROCESSOR_TEST_RESTORE_STEP_DELAY_MS")   # test hook: a slow restore
        self._restore_step_delay_s = int(delay) / 1000 if delay else 0.0
        kill = os.environ.get("PROCESSOR_TEST_KILL_BEFORE_COMMIT")
        self._kill_at_commit = int(kill) if kill else None
        self._commits_with_records = 0
        self._sent_at_drain_check = 0
        self._internal_topics = set(topology.internal_topics())
        self._processed_at_last_commit = 0
        self._table_sinks: dict[int, list[str]] = {}
        self._parts: dict[str, int] = {}
        self._initial_commit_due = False
        self._restoring: list[_Restoration] = []   # restores under way, the first one running

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
        wanted = internal_topics.wanted_topics(topo, parts)
        internal = {t: n for t, (n, kind) in wanted.items() if kind != "changelog"}
        # existing internal topics first (one with another partition count is named as such),
        # then co-partitioning; only then is anything created
        internal_topics.check_existing(self.bootstrap_servers, self.application_id, wanted, parts)
        for i in range(len(self.topology.subtopologies)):
            counts = {t: parts.get(t, internal.get(t)) for t in self.topology.source_topics(i)}
            if len(set(counts.values())) > 1:
                listing = ", ".join(f"{t}={n}" for t, n in sorted(counts.items()))
                raise ConfigError(f"co-partitioned source topics of sub-topology {i} have different "
                                  f"partition counts ({listing}); they must be equal")
        created = internal_topics.create_missing(self.bootstrap_servers, wanted, parts,
                                                 self.replication_factor, self.topic_configs)
        if self.on_error == "dlq" and self.dlq_topic not in parts:
            rf = (self.replication_factor if self.replication_factor is not None
                  else internal_topics.default_replication_factor(self.bootstrap_servers))
            kafka.create_topics(self.bootstrap_servers, {self.dlq_topic: 1}, replication_factor=rf)
        if created:
            parts = {**parts, **{t: wanted[t][0] for t in created}}
        # which partitioner placed each source a join depends on (README "Partitioning")
        choices = determine_partitioners(self.topology, self.bootstrap_servers, parts,
                                         self._consumer_config, self.application_id)
        self.topology = self.topology.with_partitioning(choices)
        self.routing = Routing(choices, parts)
        self._parts = parts
        self._table_sinks = {sub: sorted(self.topology.table_sinks(sub))
                             for sub in range(len(self.topology.subtopologies))}
        return parts

    # -- task management ----------------------------------------------------------------------
    def _restore_consumer_config(self) -> dict:
        conf = kafka.consumer_defaults(self.bootstrap_servers)
        conf["group.id"] = f"{self.application_id}-restore"   # assign() only; never commits
        conf["isolation.level"] = self.isolation_level
        return conf

    def _open_tasks(self, keys) -> None:
        """Open the tasks' databases, bring them up to their changelogs (all at once, here and
        now: the rebuild after an aborted transaction), build the tasks."""
        targets = self._restore_targets(keys)
        try:
            restore_tasks(targets, self._restore_consumer_config(), self._stop)
            self._build_tasks(keys, targets)
        except BaseException:
            self._discard_targets(keys, targets)
            raise

    def _restore_targets(self, keys) -> list[RestoreTarget]:
        targets = []
        try:
            for sub, partition in keys:
                db = RocksDBDatabase(self.state_dir / f"task-{sub}_{partition}")
                targets.append(RestoreTarget(db, f"{sub}_{partition}", partition, self.topology.changelogs_of(sub)))
        except BaseException:
            for t in targets:
                t.db.close()
            raise
        return targets

    def _discard_targets(self, keys, targets) -> None:
        for key, t in zip(keys, targets):
            self.tasks.pop(key, None)
            self._writers.pop(key, None)
            t.db.close()

    def _build_tasks(self, keys, targets) -> None:
        """Tasks over restored databases; then the table sinks' tails of those that have some."""
        for (sub, partition), t in zip(keys, targets):
            self.restored_records += t.restored
            task = Task(self.topology, sub, partition, t.db, self.collector, lambda: int(time.time() * 1000),
                        on_error=self.on_error, dlq_topic=self.dlq_topic, routing=self.routing,
                        max_record_bytes=max_record_bytes_of(self._producer_config),
                        origin=self.application_id if self._table_sinks.get(sub) else None,
                        stage_internal=self._stage_internal)
            self._writers[(sub, partition)] = ChangelogWriter(task, t.changelogs, self.collector.send_changelog)
            self.tasks[(sub, partition)] = task
        self._open_table_sinks(keys)

    def _open_table_sinks(self, keys) -> None:
        """Tasks with table sinks (``processor/runtime/sink_tails.py``): their sinks' ends now
        (before they send anything) are the floor of what their commit records name; a task whose
        last commit record names ends hands its tail to its sink convergence; a task without a
        commit record commits before it processes anything."""
        keys = [k for k in keys if self._table_sinks.get(k[0])]
        if not keys:
            return
        topics = sorted({t for k in keys for t in self._table_sinks[k[0]]})
        ends = sink_tails.partition_ends(self.bootstrap_servers, topics, self._restore_consumer_config())
        starts = {}
        for key in keys:
            writer = self._writers[key]
            writer.sink_partitions = sink_tails.sink_partitions(self._table_sinks[key[0]], self._parts)
            writer.sink_floor = {tp: ends[tp] for tp in writer.sink_partitions}
            if writer.sink_ends is not None:
                starts[key] = {tp: writer.sink_ends.get(tp, 0) for tp in writer.sink_partitions}
            elif not writer.has_commit:
                self._initial_commit_due = True
        if starts:
            found = sink_tails.read_tails(self.bootstrap_servers, self._restore_consumer_config(),
                                          self.application_id, starts, ends)
            for key, tail in found.items():
                self.tasks[key].start_convergence(tail.tails, tail.targets)

    def _on_assign(self, consumer, partitions):
        """Suspended tasks assigned again resume at once; the others are restored by the main
        loop (``_restore_step``) while their partitions stay paused, so the worker keeps polling
        (no ``max.poll.interval.ms`` expiry) and the tasks already open keep processing."""
        try:
            keys = {(self._sub_of_topic[tp.topic], tp.partition) for tp in partitions}
            # suspended tasks not assigned again go now; the others resume without a restore
            self._close_tasks(set(self._suspended) - keys, self._suspended)
            committed = {(tp.topic, tp.partition): tp.offset
                         for tp in consumer.committed(partitions, timeout=30)}
            for key in sorted(keys):
                if key not in self.tasks and key in self._suspended:
                    self.tasks[key] = self._suspended.pop(key)
            new = [key for key in sorted(keys) if key not in self.tasks]
            waiting = [tp for tp in partitions if (self._sub_of_topic[tp.topic], tp.partition) in set(new)]
            for tp in partitions:
                self._assigned.add((tp.topic, tp.partition))
                self._at_eof.discard((tp.topic, tp.partition))
                self._group_offsets[(tp.topic, tp.partition)] = max(committed.get((tp.topic, tp.partition), -1), 0)
                if (self._sub_of_topic[tp.topic], tp.partition) in self.tasks:
                    tp.offset = self._start_offset(tp.topic, tp.partition)
                else:
                    tp.offset = OFFSET_BEGINNING   # paused until restored, then sought
            if new:
                # tasks reopened from local state first (usually a short catch-up: they start
                # processing while the others restore), then those restored from scratch
                targets = self._restore_targets(new)
                for local in (True, False):
                    group = [(k, t) for k, t in zip(new, targets) if bool(t.local) is local]
                    if group:
                        keys = [k for k, _ in group]
                        ts = [t for _, t in group]
                        tps = [tp for tp in waiting if (self._sub_of_topic[tp.topic], tp.partition) in set(keys)]
                        self._restoring.append(_Restoration(
                            keys, ts, tps, restore_steps(ts, self._restore_consumer_config(), self._stop),
                            self.records_processed))
            consumer.assign(partitions)
            if waiting:
                consumer.pause(waiting)
            log.info("assigned %s%s", ", ".join(f"{tp.topic}[{tp.partition}]@{'restoring' if tp in waiting else tp.offset}"
                                                for tp in partitions),
                     f"; restoring task(s) {', '.join(f'{a}_{b}' for a, b in new)} first" if new else "")
        except Exception as exc:  # callbacks cannot raise into librdkafka: stop the worker instead
            self._fatal = self._fatal or exc
            self._stop.set()

    def _start_offset(self, topic: str, partition: int) -> int:
        """Where a task resumes an input partition: its committed position (a group offset beyond
        it means the changelogs lost data)."""
        task = self.tasks[(self._sub_of_topic[topic], partition)]
        start = task.positions.get((topic, partition), 0)
        group = self._group_offsets.get((topic, partition), 0)
        if group > start:
            raise ChangelogMismatch(
                f"task {task.id}: the group committed {topic}[{partition}] up to offset "
                f"{group}, but the task's changelogs reflect it only up to {start}; the changelog "
                f"topics were deleted or recreated: reset the application (its group offsets "
                f"and state) to rebuild")
        return start if start > 0 else OFFSET_BEGINNING

    def _restore_step(self, budget_s: float = RESTORE_STEP_S) -> None:
        """Restore for up to ``budget_s`` (whole batches); when done, the tasks are built and
        their partitions sought to their positions and resumed."""
        r = self._restoring[0]
        deadline = time.monotonic() + budget_s
        try:
            while time.monotonic() < deadline:
                next(r.steps)
                if self._restore_step_delay_s:
                    time.sleep(self._restore_step_delay_s)
            return
        except StopIteration:
            pass
        except BaseException:
            self._abort_restoration()
            raise
        self._restoring.pop(0)
        meanwhile = self.records_processed - r.processed_before
        try:
            self._build_tasks(r.keys, r.targets)
        except BaseException:
            self._discard_targets(r.keys, r.targets)
            raise
        for tp in r.partitions:
            tp.offset = self._start_offset(tp.topic, tp.partition)
            self.consumer.seek(tp)
        self.consumer.resume(r.partitions)
        log.info("restored and resumed %s after %.1f s; meanwhile the open tasks processed %d records",
                 ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in r.partitions),
                 time.monotonic() - r.started, meanwhile)

    def _abort_restoration(self) -> None:
        """A revocation (or a stop, or an error) during a restore: drop it; what it restored up to
        its last intermediate commit is kept locally."""
        while self._restoring:
            r = self._restoring.pop(0)
            try:
                r.steps.close()
            finally:
                for t in r.targets:
                    t.db.close()

    def _on_revoke(self, consumer, partitions):
        try:
            self._abort_restoration()
            keys = {(self._sub_of_topic[tp.topic], tp.partition) for tp in partitions}
            if not self._closing and self._fatal is None:
                for key in keys:
                    task = self.tasks.get(key)
                    if task is not None:
                        task.flush()
                self.commit()
                # the flush's outbox records were sent after that commit: one more unit makes
                # them durable and confirms them (exactly once: commits their transaction)
                self.commit()
            for tp in partitions:
                self._assigned.discard((tp.topic, tp.partition))
                self._at_eof.discard((tp.topic, tp.partition))
            for key in keys:
                task = self.tasks.pop(key, None)
                if task is not None:
                    if self._closing or self._fatal is not None:
                        self._close_tasks({key}, {key: task})
                    else:
                        self._suspended[key] = task
        except Exception as exc:
            self._fatal = self._fatal or exc
            self._stop.set()

    def _on_lost(self, consumer, partitions):
        # Another member may own these now: close without committing (closing a task never
        # writes its pending state), so only what was committed survives.
        self._abort_restoration()
        for tp in partitions:
            self._assigned.discard((tp.topic, tp.partition))
            self._at_eof.discard((tp.topic, tp.partition))
        self._close_tasks({(self._sub_of_topic[tp.topic], tp.partition) for tp in partitions})

    def _close_tasks(self, keys, table=None):
        table = self.tasks if table is None else table
        errors = []
        for key in keys:
            task = table.pop(key, None)
            self._writers.pop(key, None)
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
        """One commit unit for every task that has work (see the module docstring). Never after
        a fatal error, and never moves a group offset backwards. (Every record sent belongs to
        a unit: outputs advance positions; outbox records leave the outbox entry to delete.)"""
        if self._fatal is not None:
            return
        collector = self.collector
        units = []
        delivered = collector.delivered_ends
        now = time.monotonic()
        for key, task in self.tasks.items():
            pos, outbox = task.prepare_commit()
            writer = self._writers[key]
            if writer.has_work(pos) or outbox or task.converged_in_unit or \
                    writer.sink_ends_stale(delivered, now, SINK_ENDS_REFRESH_S):
                task.converged_in_unit = False
                units.append((task, writer, pos, outbox))
        if not units:
            self._retry_skipped_offsets()
            return
        for task, writer, pos, outbox in units:
            writer.write_pending()
        collector.flush()               # outputs, internal records, changelog records durable
        if self._kill_at_commit is not None and self.records_processed > self._processed_at_last_commit:
            self._commits_with_records += 1
            if self._commits_with_records >= self._kill_at_commit:
                log.warning("test hook: SIGKILL after forwarding, before committing")
                os.kill(os.getpid(), signal.SIGKILL)
        self._processed_at_last_commit = self.records_processed
        for task, writer, pos, outbox in units:
            writer.settle_sink_ends(delivered, task.convergence_pending)
            writer.write_commit_record(pos)
        offsets = []
        for task, writer, pos, outbox in units:
            for (topic, part), off in pos.items():
                if off > self._group_offsets.get((topic, part), 0):
                    offsets.append(TopicPartition(topic, part, off))
        if collector.transactional:
            try:
                collector.commit_transaction(offsets, self.consumer.consumer_group_metadata())
            except KafkaException as exc:
                self._transaction_failed(exc)
                return
        else:
            collector.flush()           # the commit records: the units are durable now
            offsets = self._commit_group_offsets(offsets)
        for tp in offsets:
            self._group_offsets[(tp.topic, tp.partition)] = tp.offset
        collector.begin()               # outbox records below go into the next transaction
        for task, writer, pos, outbox in units:
            task.finish_commit(pos, outbox, writer.committed_ends(pos))

    def _commit_group_offsets(self, offsets: list) -> list:
        """At least once: commit the group offsets of durable units; returns those committed.
        The units are durable in the changelogs (the truth about positions), so a group that
        rebalances under us loses nothing: the next owner resumes from the commit records. Only
        the offsets shown to tools lag; they are retried at the next commit, with or without
        new work (``_retry_skipped_offsets``)."""
        if not offsets:
            return []
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() not in _REBALANCING:
                raise
            log.warning("group offset commit skipped (%s): the group is rebalancing; the "
                        "commit units are durable in the changelogs", exc.args[0].name())
            for tp in offsets:
                self._skipped_offsets[(tp.topic, tp.partition)] = tp.offset
            return []
        for tp in offsets:
            self._skipped_offsets.pop((tp.topic, tp.partition), None)
        return offsets

    def _retry_skipped_offsets(self) -> None:
        """Group offsets skipped during a rebalance, of partitions still assigned here."""
        retry = [TopicPartition(t, p, off) for (t, p), off in sorted(self._skipped_offsets.items())
                 if (t, p) in self._assigned and off > self._group_offsets.get((t, p), 0)]
        self._skipped_offsets = {tp: off for tp, off in self._skipped_offsets.items() if tp in self._assigned}
        for tp in self._commit_group_offsets(retry):
            self._group_offsets[(tp.topic, tp.partition)] = tp.offset

    def _transaction_failed(self, exc) -> None:
        """Exactly once: the transaction did not commit. Fatal if this producer was fenced (a
        newer instance owns the transactional id); otherwise (the group rebalanced under us) abort
        it, drop every task's uncommitted state and rebuild the tasks from their changelogs."""
        err = exc.args[0]
        if err.fatal() or not err.txn_requires_abort():
            raise ConfigError(f"exactly_once: the transaction could not commit ({err.str()}); "
                              f"this worker was fenced by a newer instance") from None
        log.warning("exactly_once: transaction aborted (%s); rebuilding tasks from their changelogs",
                    err.str())
        self.collector.abort()
        keys = sorted(self.tasks)
        for key in keys:
            self._writers.pop(key, None)
            task = self.tasks.pop(key)
            self.finished_tasks_metrics.append(task.metrics())
            task.close()                 # closing never writes pending state
        self._open_tasks(keys)
        for key in keys:
            task = self.tasks[key]
            for tp in [tp for tp in self._assigned if (self._sub_of_topic[tp[0]], tp[1]) == key]:
                off = task.positions.get(tp, 0)
                self.consumer.seek(TopicPartition(tp[0], tp[1], off if off > 0 else OFFSET_BEGINNING))
        self.collector.begin()

    def _worker_id(self) -> str:
        """A stable id of this state directory (the transactional id's suffix: a restarted
        worker fences its own zombie)."""
        path = self.state_dir / "worker.id"
        if not path.exists():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(uuid.uuid4().hex + "\n")
        return path.read_text().strip()

    def _drained(self) -> bool:
        """Every assigned partition is at its end, and so is every internal partition this worker
        reads after the records it wrote itself reached the broker."""
        if self._restoring:
            return False
        if self.collector.sent == self._sent_at_drain_check:
            return True
        if self.collector.transactional:
            # records in an open transaction are invisible to a read_committed probe: commit
            # them first, or an internal partition looks drained while its records are pending
            # (a commit that sends outbox records opens the next transaction with them: commit
            # that one too)
            for _ in range(3):
                before = self.collector.sent
                self.commit()
                if self.collector.sent == before:
                    break
        self.collector.flush()
        self._sent_at_drain_check = self.collector.sent
        internal = {tp: self.tasks[(self._sub_of_topic[tp[0]], tp[1])].positions.get(tp, 0)
                    for tp in self._assigned if tp[0] in self._internal_topics}
        more = kafka.partitions_with_records_from(self.bootstrap_servers, internal,
                                                  isolation_level=self.isolation_level)
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
        # First of all: one worker process per state directory (StateDirLocked, exit code 4).
        self._state_lock = StateDirLock(self.state_dir)
        self._state_lock.acquire()
        try:
            self._run_locked(until_drained, install_signal_handlers, max_seconds)
        finally:
            self._state_lock.release()

    def _run_locked(self, until_drained: bool, install_signal_handlers: bool,
                    max_seconds: float | None) -> None:
        self._fatal = None
        self.check_topics()
        txn_id = None
        if self.processing_guarantee == "exactly_once":
            txn_id = f"{self.application_id}-{self._worker_id()}"
        self.collector = KafkaCollector({**kafka.producer_defaults(self.bootstrap_servers),
                                         **self._producer_config}, transactional_id=txn_id,
                                        track_ends=any(self._table_sinks.values()))
        if txn_id is not None:
            try:
                self.collector.producer.init_transactions(self.startup_timeout_s * 3)
            except Exception as exc:
                raise ConfigError(f"processing_guarantee='exactly_once': the broker at "
                                  f"{self.bootstrap_servers} did not initialise transactions for "
                                  f"{txn_id!r}: {exc}") from None
            self.collector.begin()
        cconf = kafka.consumer_defaults(self.bootstrap_servers)
        cconf.update({"group.id": self.application_id, "session.timeout.ms": 10000,
                      "heartbeat.interval.ms": 1000, "isolation.level": self.isolation_level})
        cconf.update(self._consumer_config)
        self.consumer = kafka.new_consumer(cconf, "the consumer group")
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
            self.commit()  # confirms the outbox records the last commit sent
            self.collector.flush()
        finally:
            self._closing = True
            try:
                self.consumer.close()
            finally:
                try:
                    self.collector.abort()   # an unfinished transaction (after a fatal error)
                except Exception as exc:
                    log.warning("aborting the open transaction failed: %s", exc)
                self._abort_restoration()
                self._close_tasks(list(self.tasks))
                self._close_tasks(list(self._suspended), self._suspended)
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
            if self._restoring:
                try:
                    self._restore_step()
                except RestoreInterrupted:
                    break
            msgs = consumer.consume(batch, 0.0 if self._restoring else 0.1)
            if self._fatal is not None:
                break
            if self._initial_commit_due:
                # tasks opened without a commit record: one names their table sinks' ends before
                # they send anything (processor/runtime/sink_tails.py)
                self._initial_commit_due = False
                self.commit()
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
                self.collector.poll()
            if until_drained and self._assigned and self._at_eof >= self._assigned and self._drained():
                break
            if max_seconds is not None and now - started > max_seconds:
                break


class _Restoration:
    """Tasks of an assignment being restored by the main loop: their keys, restore targets,
    paused input partitions and the restore's steps (``changelog.restore_steps``)."""

    def __init__(self, keys, targets, partitions, steps, processed_before: int):
        self.started = time.monotonic()
        self.processed_before = processed_before
        self.keys = keys
        self.targets = targets
        self.partitions = partitions
        self.steps = steps
