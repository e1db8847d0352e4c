"""The worker's task manager: which tasks this worker runs, how they open, commit and close.

It owns every change of the assignment and every commit (Kafka Streams' ``TaskManager``): the
fleet's listener (``processor/runtime/fleet.py``, the group's cooperative callbacks: only what
moves) calls ``handle_assignment``, ``handle_revocation`` and ``handle_lost``; the main loop calls
``commit``, which runs one commit unit (``processor/runtime/commit_unit.py``: ``Committer``, owned
here) over these tasks.

Assignment: tasks are created for newly assigned partitions (the fleet's assignor gives a task,
partition ``i`` of every co-partitioned topic, whole). Every new task is restored before it
processes anything: its database is brought up to its changelogs' last commit
(``processor/runtime/changelog.py``) and it resumes its inputs from the positions in that commit;
a group offset beyond them means the changelogs lost data: ``ChangelogMismatch``, never a silent
skip.

The restore is a phase of the main loop, not of the assignment callback: the new tasks'
partitions stay paused while the loop calls ``restore_step`` (``RESTORE_STEP_S`` of whole
restore batches) between polls, so the group sees a live member however long it takes (no
``max.poll.interval.ms`` expiry), a revocation or a stop aborts it cleanly (what it restored up to
its last intermediate commit is kept locally), and the tasks already open keep processing.
Tasks reopened from local state restore first (usually a short catch-up), then those restored
from scratch. Tasks with table sinks then read their sinks' tails (``sink_tails``).

Revocation: the revoked tasks' deferred emissions are flushed and committed, then the tasks are
closed (a cooperative rebalance revokes only what moves, so nothing is kept open for a return).
Lost partitions: closed without a commit (exactly once: the open transaction is aborted and the
tasks still here rebuilt). Both end in one teardown (``_release``).

``TaskManager`` keeps this worker's tasks and everything per task or per assigned partition
(writers, restorations, end-of-partition marks, group offsets, time-ordering partition groups,
the records processed). Invariant: a task key is in at most one of ``tasks`` (open, processing)
and a restoration (being restored, its partitions paused); a task is only ever closed through
``close_tasks`` (its counters kept in ``finished_tasks_metrics``); the containers the main loop
reads (``tasks``, ``at_eof``, ``resumed``, ``groups``) are changed in place, never rebound. It is
built with the worker's settings; the clients (consumer, collector), the routing and the global
tables are handed to it by ``open`` when the worker runs.

Import circle: this module and ``commit_unit.py`` import each other, on purpose. The task
manager owns its committer; the committer's units run over the task manager's tasks and rebuild
them (``reopen_all``) after an aborted transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from processor.engine.task import Task, max_record_bytes_of
from processor.engine.task_id import TaskId
from processor.errors import ChangelogMismatch
from processor.kafka import clients as kafka
from processor.runtime import sink_tails
from processor.runtime.changelog import ChangelogWriter
from processor.runtime.changelog_reader import ChangelogReader, RestoreTarget, restore_target
from processor.runtime.commit_unit import Committer
from processor.runtime.fetch_gaps import FetchGaps
from processor.runtime.partition_group import PartitionGroup
from processor.runtime.worker_metrics import WorkerMetrics, add_counters
from processor.state.state_directory import StateDirectory

if TYPE_CHECKING:
    from processor.engine.routing import Routing
    from processor.kafka.clients import KafkaCluster
    from processor.runtime.collector import KafkaCollector
    from processor.runtime.global_tables import GlobalTables
    from processor.topology.core import Topology

log = logging.getLogger("processor.worker")

# the main loop restores for this long between two polls of the group consumer
RESTORE_STEP_S = 0.2
# a task database another worker of this process still has open (it closes the task in its own
# main loop, on its revocation or loss) is waited for this long before the open fails
DB_LOCK_WAIT_S = 30.0

TaskKey = tuple[int, int]   # (sub-topology, partition)
TopicPart = tuple[str, int]   # (topic, partition)


class TaskManager:
    """The tasks of one worker: assignment, restore, revocation, closing, time-ordered input."""

    TOPIC_REFRESH_S = 5.0
    # set by ``open`` when the worker runs
    consumer: Consumer
    collector: KafkaCollector
    routing: Routing
    global_tables: GlobalTables | None

    def __init__(self, topology: Topology, *, application_id: str, bootstrap_servers: str | KafkaCluster,
                 state_dir: Path, isolation_level: str, on_error: str, dlq_topic: str,
                 producer_config: dict, stage_internal: bool, coalesce_fk_records: bool,
                 max_task_idle_ms: int, stop: threading.Event, fetch_gaps: FetchGaps | None = None,
                 metrics: WorkerMetrics | None = None, restore_step_delay_s: float = 0.0,
                 kill_at_commit: int | None = None, stop_at_commit: int | None = None) -> None:
        self.topology = topology
        self.application_id = application_id
        self.bootstrap_servers = bootstrap_servers
        self.state_dir = state_dir
        self.state_directory = StateDirectory(state_dir, topology)
        self.isolation_level = isolation_level
        self.on_error = on_error
        self.dlq_topic = dlq_topic
        self.producer_config = producer_config
        self.dead_letter_max_bytes: int | None = None   # (open)
        self.stage_internal = stage_internal
        self.coalesce_fk_records = coalesce_fk_records
        self.max_task_idle_ms = max_task_idle_ms
        self.stop = stop
        self.restore_step_delay_s = restore_step_delay_s   # test hook: a slow restore
        self.sub_of_topic: dict[str, int] = topology.subtopology_of_topic()
        # sub-topology -> its input topics, where it has several (their tasks buffer and order)
        self.ordered_inputs: dict[int, list[str]] = {
            i: sorted(topology.source_topics(i)) for i in range(len(topology.subtopologies))
            if len(topology.source_topics(i)) > 1}
        self.tasks: dict[TaskKey, Task] = {}
        self.writers: dict[TaskKey, ChangelogWriter] = {}
        self.restoring: list[Restoration] = []   # restores under way, the first one running
        # a task with several input partitions processes them in time order
        # (processor/runtime/partition_group.py)
        self.groups: dict[TaskKey, PartitionGroup] = {}
        self.assigned: set[TopicPart] = set()
        self.at_eof: set[TopicPart] = set()
        self.group_offsets: dict[TopicPart, int] = {}
        # partitions just restored, for a few seconds: records below the task's position are
        # dropped (fetched before the seek to it)
        self.resumed: set[TopicPart] = set()
        self.resumed_at = 0.0
        # task id -> counters of its closed instances, summed (bounded by the task ids: a long-lived
        # worker through many rebalances keeps one entry per task, not one per closing)
        self.finished_tasks_metrics: dict[str, dict[str, dict[str, int]]] = {}
        self.restored_records = 0
        # every restore of this worker's (its tasks', its standbys') reads through this one consumer
        self.changelog_reader = ChangelogReader(self.restore_consumer_config(), stop)
        # input records processed by the tasks of this worker (the main loop counts them)
        self.records_processed = 0
        # internal partitions read through the fetch-gap guard (processor/runtime/fetch_gaps.py)
        self.fetch_gaps = fetch_gaps or FetchGaps(frozenset())
        # the commit unit over these tasks (processor/runtime/commit_unit.py)
        self.committer = Committer(self, self.fetch_gaps, metrics or WorkerMetrics(), kill_at_commit=kill_at_commit,
                                   stop_at_commit=stop_at_commit)
        # exactly once: tasks closed without their uncommitted state and rebuilt from their
        # changelogs after an aborted transaction (``reopen_all``), summed over the worker's life
        self.tasks_rebuilt = 0
        self.ever_assigned = False
        self.initial_commit_due = False
        self.closing = False
        self.table_sinks: dict[int, list[str]] = {}
        self.parts: dict[str, int] = {}
        # the user topics the cluster had at the last look (``_topic_exists``) and when that was
        self._known_topics: frozenset[str] = frozenset()
        self._topics_looked_at = float("-inf")

    def open(self, topology: Topology, *, routing: Routing, parts: dict[str, int],
             table_sinks: dict[int, list[str]], consumer: Consumer, collector: KafkaCollector,
             global_tables: GlobalTables | None, dead_letter_max_bytes: int | None = None) -> None:
        """The worker runs: the topology as partitioned at start-up, and the clients tasks use;
        ``dead_letter_max_bytes``: the dead-letter topic's own limit (None: the producer's)."""
        self.dead_letter_max_bytes = dead_letter_max_bytes
        self.topology = self.state_directory.topology = topology
        self.routing = routing
        self.parts = parts
        self.table_sinks = table_sinks
        self.consumer = consumer
        self.collector = collector
        self.global_tables = global_tables

    def keys_of(self, partitions: Iterable[TopicPart]) -> set[TaskKey]:
        """The task keys of assigned partitions."""
        return {(self.sub_of_topic[t], p) for t, p in partitions}

    def _topic_exists(self, topic: str) -> bool:
        """Whether ``topic`` exists (a topic extractor's sink sends only there): the cluster's
        topics as last listed, listed again on a miss at most every ``TOPIC_REFRESH_S`` seconds
        (a topic created since may be reported missing, and its record dead-lettered, that long)."""
        if topic in self._known_topics:
            return True
        now = time.monotonic()
        if now - self._topics_looked_at >= self.TOPIC_REFRESH_S:
            self._topics_looked_at = now
            # no answer: whether the topic exists is unknown, and a record is not dead-lettered on a
            # guess: asked again while the broker does not answer, then exit 7 (a restart resumes
            # at the last commit)
            self._known_topics = frozenset(kafka.retry_transient(
                lambda: kafka.topic_partitions(self.bootstrap_servers, timeout_s=5.0),
                f"listing the cluster's topics to check topic {topic!r}, named by a topic extractor",
                unreachable=True))
        return topic in self._known_topics

    def restore_consumer_config(self) -> dict:
        """The settings of the consumers that read changelogs and probe ends (assign() only)."""
        conf = kafka.consumer_defaults(self.bootstrap_servers)
        conf["group.id"] = f"{self.application_id}-restore"   # assign() only; never commits
        conf["isolation.level"] = self.isolation_level
        return conf

    def sink_ends(self, topics: list[str]) -> dict[TopicPart, int]:
        """The table sinks' ends now (high watermarks). A lower bound is all a floor needs: the
        high watermark, read uncommitted, never waits for an open transaction, this worker's own
        included."""
        conf = {**self.restore_consumer_config(), "isolation.level": "read_uncommitted"}
        return kafka.retry_transient(lambda: sink_tails.partition_ends(self.bootstrap_servers, topics, conf),
                                     f"reading the ends of table sink(s) {', '.join(topics)}", unreachable=True)

    def open_tasks(self, keys: list[TaskKey]) -> None:
        """Open the tasks' databases, bring them up to their changelogs (all at once, here and
        now: the rebuild after an aborted transaction), build the tasks."""
        targets = self._restore_targets(keys)
        try:
            self.changelog_reader.restore(targets)
            self._build_tasks(keys, targets)
        except BaseException:
            self._discard_targets(keys, targets)
            raise

    def _restore_targets(self, keys: list[TaskKey]) -> list[RestoreTarget]:
        targets: list[RestoreTarget] = []
        topology = self.topology
        try:
            for sub, partition in keys:
                # (another writer's directory is put aside: rebuilt; one this process still has open,
                # another worker's task not closed yet, is waited for)
                db = self.state_directory.open((sub, partition), DB_LOCK_WAIT_S, self.stop)
                targets.append(restore_target(topology, db, sub, partition))
        except BaseException:
            for t in targets:
                t.db.close()
            raise
        return targets

    def _discard_targets(self, keys: list[TaskKey], targets: list[RestoreTarget]) -> None:
        for key, t in zip(keys, targets, strict=False):
            self.tasks.pop(key, None)
            self.writers.pop(key, None)
            t.db.close()

    def _build_tasks(self, keys: list[TaskKey], targets: list[RestoreTarget]) -> None:
        """Tasks over restored databases; then the table sinks' tails of those that have some."""
        for (sub, partition), t in zip(keys, targets, strict=False):
            self.restored_records += t.restored
            task = Task(self.topology, sub, partition, t.stores, self.collector, lambda: int(time.time() * 1000),
                        on_error=self.on_error, dlq_topic=self.dlq_topic, routing=self.routing,
                        max_record_bytes=max_record_bytes_of(self.producer_config),
                        origin=self.application_id if self.table_sinks.get(sub) else None,
                        stage_internal=self.stage_internal,
                        coalesce_fk_records=self.coalesce_fk_records, topic_exists=self._topic_exists,
                        global_stores=self.global_tables.stores if self.global_tables is not None else None,
                        dead_letter_max_bytes=self.dead_letter_max_bytes)
            self.writers[(sub, partition)] = ChangelogWriter(task, t.changelogs, self.collector.send_changelog,
                                                             self.collector.send_changelog_records)
            self.tasks[(sub, partition)] = task
        self._open_table_sinks(keys)

    def _open_table_sinks(self, keys: list[TaskKey]) -> None:
        """Tasks with table sinks (``processor/runtime/sink_tails.py``): their sinks' ends now
        (before they send anything) are the floor of what their commit records name; a task whose
        last commit record names ends hands its tail to its sink convergence; a task without a
        commit record commits before it processes anything."""
        keys = [k for k in keys if self.table_sinks.get(k[0])]
        if not keys:
            return
        topics = sorted({t for k in keys for t in self.table_sinks[k[0]]})
        ends = self.sink_ends(topics)
        starts = {}
        for key in keys:
            writer = self.writers[key]
            writer.sink_partitions = sink_tails.sink_partitions(self.table_sinks[key[0]], self.parts)
            writer.sink_floor = {tp: ends[tp] for tp in writer.sink_partitions}
            if writer.sink_ends is not None:
                starts[key] = {tp: writer.sink_ends.get(tp, 0) for tp in writer.sink_partitions}
            else:   # no commit record, or one naming no sink ends (a backfill's, an older build's)
                self.initial_commit_due = True
        if starts:
            found = sink_tails.read_tails(self.bootstrap_servers, self.restore_consumer_config(),
                                          self.application_id, starts, ends)
            for key, tail in found.items():
                self.tasks[key].start_convergence(tail.tails, tail.targets)

    # -- rebalances: the fleet's listener calls these (cooperative: only what moves) -------------
    def handle_assignment(self, assigned: list[TopicPart]) -> None:
        """New tasks for newly assigned partitions, restored by the main loop (``restore_step``)
        while their partitions stay paused, so the worker keeps polling (no
        ``max.poll.interval.ms`` expiry) and the tasks already open keep processing."""
        consumer = self.consumer
        sub_of_topic = self.sub_of_topic
        partitions = [TopicPartition(t, p) for t, p in assigned]
        keys = self.keys_of(assigned)
        # (after a broker pause the coordinator may take a while to answer again: retried, as
        # Kafka Streams does, up to ``TRANSIENT_TIMEOUT_S``; the group's heartbeats go on meanwhile)
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in kafka.retry_transient(lambda: consumer.committed(partitions, timeout=10),
                                                     f"reading the group's committed offsets of {len(partitions)} "
                                                     f"assigned partition(s)")}
        new = [key for key in sorted(keys) if key not in self.tasks]
        waiting = [tp for tp in partitions if (sub_of_topic[tp.topic], tp.partition) in set(new)]
        for tp in partitions:
            self.assigned.add((tp.topic, tp.partition))
            self.at_eof.discard((tp.topic, tp.partition))
            self.group_offsets[(tp.topic, tp.partition)] = max(committed.get((tp.topic, tp.partition), -1), 0)
            if (sub_of_topic[tp.topic], tp.partition) in self.tasks:
                tp.offset = self._start_offset(tp.topic, tp.partition) or OFFSET_BEGINNING
            else:
                # paused until restored, then sought to the task's position. A concrete offset
                # (the group's, never above that position), not a logical one: librdkafka would
                # resolve OFFSET_BEGINNING asynchronously and could overwrite the later seek.
                tp.offset = self.group_offsets[(tp.topic, tp.partition)]
        if new:
            self._start_restoring(new, waiting)
        consumer.incremental_assign(partitions)
        self.ever_assigned = True
        if waiting:
            consumer.pause(waiting)
        added = {(tp.topic, tp.partition): "restoring" if tp in waiting else str(tp.offset) for tp in partitions}
        log.info("assigned %s%s", self.describe_assignment(added),
                 f"; restoring task(s) {', '.join(str(TaskId(*k)) for k in new)} first" if new else "")

    def handle_revocation(self, revoked: list[TopicPart], *, commit: bool = True) -> None:
        """The revoked tasks move to another worker: their restorations stop, their deferred
        emissions are flushed and committed (unless ``commit`` is False: the worker failed, or it
        is closing and every task is committed by its stop), then they are closed and their
        partitions unassigned."""
        keys = self.keys_of(revoked)
        commit = commit and not self.closing
        if commit:
            self.abort_restoration_of(keys)
        else:
            self.abort_restoration()
        if commit:
            self.flush(keys)
            self.commit()
            # the flush's outbox records were sent after that commit: one more unit makes
            # them durable and confirms them (exactly once: commits their transaction)
            self.commit()
        self._release(revoked, keys)
        if not self.closing:
            log.info("assigned %s; revoked %s (they move to another worker)", self.describe_assignment(),
                     ", ".join(f"{t}[{p}]" for t, p in revoked))

    def handle_lost(self, lost: list[TopicPart]) -> None:
        """Another member may own these now: closed without committing (closing a task never
        writes its pending state), so only what was committed survives."""
        self.abort_restoration()
        self._release(lost, self.keys_of(lost))
        collector = getattr(self, "collector", None)
        if collector is not None and collector.transactional and not self.closing:
            # exactly once: the open transaction holds the lost tasks' outputs since their last
            # commit, which their new owner produces again: abort it (the tasks still here, if
            # any, are rebuilt from their changelogs, as after any aborted transaction; a producer
            # the broker fenced on the transaction's timeout is renewed: ``abort_and_rebuild``)
            self.committer.abort_and_rebuild(rebuild=bool(self.tasks))
        log.warning("assigned %s; lost %s (the group gave them to another worker: closed without committing)",
                    self.describe_assignment(), ", ".join(f"{t}[{p}]" for t, p in lost))

    def _release(self, partitions: list[TopicPart], keys: set[TaskKey]) -> None:
        """Revoked or lost: the partitions are no longer assigned, at their end, just resumed or
        guarded for gaps here; their tasks are closed and the partitions unassigned."""
        for tp in partitions:
            self.assigned.discard(tp)
            self.at_eof.discard(tp)
            self.resumed.discard(tp)
        self.fetch_gaps.forget(partitions)
        self.close_tasks(keys)
        self.consumer.incremental_unassign([TopicPartition(t, p) for t, p in partitions])

    def commit(self) -> None:
        """One commit unit for every task that has work (``Committer.commit``)."""
        self.committer.commit(self.records_processed)

    def describe_assignment(self, added: dict[TopicPart, str] | None = None) -> str:
        """The whole assignment for a log line: ``topic[partition]@...`` each, ``@running`` for
        a partition assigned before (a cooperative rebalance names only what moves), else the
        offset it starts at or ``@restoring``; ``nothing`` when empty."""
        added = added or {}
        return ", ".join(f"{t}[{p}]@{added.get((t, p), 'running')}" for t, p in sorted(self.assigned)) or "nothing"

    def _start_restoring(self, keys: list[TaskKey], partitions: list[TopicPartition]) -> None:
        """Restorations of ``keys`` (their input ``partitions`` paused): tasks reopened from local
        state first (usually a short catch-up: they start processing while the others restore),
        then those restored from scratch."""
        targets = self._restore_targets(keys)
        for local in (True, False):
            group = [(k, t) for k, t in zip(keys, targets, strict=False) if bool(t.local) is local]
            if group:
                group_keys = [k for k, _ in group]
                ts = [t for _, t in group]
                tps = [tp for tp in partitions if (self.sub_of_topic[tp.topic], tp.partition) in set(group_keys)]
                self.restoring.append(Restoration(
                    group_keys, ts, tps, self.changelog_reader.restore_steps(ts),
                    self.records_processed))

    def abort_restoration_of(self, keys: set[TaskKey]) -> None:
        """Revoked tasks being restored: their restorations stop; the other tasks of those
        restorations start again (from what their databases kept)."""
        hit = [r for r in self.restoring if set(r.keys) & keys]
        if not hit:
            return
        for r in hit:
            self.restoring.remove(r)
            try:
                r.steps.close()
            finally:
                for t in r.targets:
                    t.db.close()
        rest = [k for r in hit for k in r.keys if k not in keys]
        if rest:
            self._start_restoring(rest, [tp for r in hit for tp in r.partitions
                                         if (self.sub_of_topic[tp.topic], tp.partition) in set(rest)])

    def _start_offset(self, topic: str, partition: int) -> int:
        """Where a task resumes an input partition: its committed position (a group offset beyond
        it means the changelogs lost data); 0 for a task that never committed."""
        task = self.tasks[(self.sub_of_topic[topic], partition)]
        start = task.positions.get((topic, partition), 0)
        group = self.group_offsets.get((topic, partition), 0)
        if group > start:
            raise ChangelogMismatch(
                f"task {task.id}: the group committed {topic}[{partition}] up to offset "
                f"{group}, but the task's changelogs reflect it only up to {start}; the changelog "
                f"topics were deleted or recreated: reset the application (its group offsets "
                f"and state) to rebuild")
        return start

    def restore_step(self, budget_s: float = RESTORE_STEP_S) -> None:
        """Restore for up to ``budget_s`` (whole batches); when done, the tasks are built and
        their partitions sought to their positions and resumed."""
        r = self.restoring[0]
        deadline = time.monotonic() + budget_s
        try:
            while time.monotonic() < deadline:
                next(r.steps)
                if self.restore_step_delay_s:
                    time.sleep(self.restore_step_delay_s)
            return
        except StopIteration:
            pass
        except BaseException:
            self.abort_restoration()
            raise
        self.restoring.pop(0)
        meanwhile = self.records_processed - r.processed_before
        try:
            self._build_tasks(r.keys, r.targets)
        except BaseException:
            self._discard_targets(r.keys, r.targets)
            raise
        targets = self._seek_offsets({(tp.topic, tp.partition): self._start_offset(tp.topic, tp.partition)
                                      for tp in r.partitions})
        for tp in r.partitions:
            tp.offset = targets[(tp.topic, tp.partition)]
            self.consumer.seek(tp)
            # records fetched before the seek must not reach the task (the loop drops them)
            self.resumed.add((tp.topic, tp.partition))
        self.consumer.resume(r.partitions)
        self._wake_fetchers(r.partitions)
        self.resumed_at = time.monotonic()   # (after the wake-ups: the guard lasts 5 s from here)
        log.info("restored and resumed %s after %.1f s, %d changelog records read; meanwhile the open tasks "
                 "processed %d records", ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in r.partitions),
                 time.monotonic() - r.started, sum(t.restored for t in r.targets), meanwhile)
    def _seek_offsets(self, positions: dict[TopicPart, int], budget_s: float = 0.2) -> dict[TopicPart, int]:
        """Where to seek each ``(topic, partition)`` to resume at ``position``: the position itself,
        a concrete offset, wherever one is known. A logical one (OFFSET_BEGINNING) makes
        librdkafka look the offset up first, and that lookup waits behind the fetch in flight (a
        long poll of ``fetch.wait.max.ms``, 500 ms, when the other partitions are at their end):
        measured, two of four partitions of a new application started 0.4-0.6 s late. So a
        position of 0 becomes offset 0 when the partition's log starts there, asked with one
        offsets request (50 ms at most each, ``budget_s`` in all: the main loop waits for them).
        When the log starts later (retention), or no answer came in time (a broker busy with a long
        poll answers after it), it stays OFFSET_BEGINNING: the first record there, whatever
        ``auto.offset.reset`` says."""
        out: dict[TopicPart, int] = {}
        deadline = time.monotonic() + budget_s
        for (topic, part), pos in positions.items():
            if pos > 0:
                out[(topic, part)] = pos
                continue
            low = -1
            left = deadline - time.monotonic()
            if left > 0.005:
                try:
                    low, _ = self.consumer.get_watermark_offsets(TopicPartition(topic, part),
                                                                 timeout=min(0.05, left), cached=False)
                except Exception:
                    pass
            out[(topic, part)] = 0 if low == 0 else OFFSET_BEGINNING
        return out

    def _wake_fetchers(self, partitions: list[TopicPartition], budget_s: float = 0.1) -> None:
        """librdkafka's fetcher (one thread per broker) sees a resumed partition only at its next
        wake-up: up to a second later when it has nothing in flight (at start-up every partition
        was paused), otherwise when the fetch in flight returns. A request to the partition's
        leader wakes an idle one at once: one offsets query per partition, 20 ms at most each and
        ``budget_s`` in all (the answer is not used; the request is sent whether or not it comes
        in time)."""
        deadline = time.monotonic() + budget_s
        for tp in partitions:
            left = deadline - time.monotonic()
            if left <= 0.005:
                break
            try:
                self.consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition),
                                                    timeout=min(0.02, left), cached=False)
            except Exception:
                pass

    def abort_restoration(self) -> None:
        """A revocation (or a stop, or an error) during a restore: drop it; what it restored up to
        its last intermediate commit is kept locally."""
        while self.restoring:
            r = self.restoring.pop(0)
            try:
                r.steps.close()
            finally:
                for t in r.targets:
                    t.db.close()

    def flush(self, keys: Iterable[TaskKey]) -> None:
        """The deferred emissions of the open tasks among ``keys`` (before their last commit)."""
        for key in keys:
            task = self.tasks.get(key)
            if task is not None:
                task.flush()


    def close_tasks(self, keys: Iterable[TaskKey]) -> None:
        """Close the open tasks of ``keys`` (revoked, lost, or the worker stops), keeping their
        counters; every one is closed before the first error is raised."""
        self.drop_groups(keys)
        errors = []
        for key in keys:
            task = self.tasks.pop(key, None)
            self.writers.pop(key, None)
            if task is not None:
                self.retire_metrics(task)
                try:
                    task.close()
                except Exception as exc:  # close the others before reporting
                    errors.append(exc)
        if errors:
            raise errors[0]

    def close_all(self) -> None:
        """The worker stops: every restore and open task closed."""
        self.abort_restoration()
        try:
            self.close_tasks(list(self.tasks))
        finally:
            self.changelog_reader.close()

    def reopen_all(self) -> None:
        """Exactly once, after an aborted transaction: every open task closed without writing its
        uncommitted state, rebuilt from its changelogs, and its partitions sought back to its
        positions."""
        keys = sorted(self.tasks)
        self.tasks_rebuilt += len(keys)
        for key in keys:
            self.writers.pop(key, None)
            task = self.tasks.pop(key)
            self.retire_metrics(task)
            task.close()                 # closing never writes pending state
        self.open_tasks(keys)
        for key in keys:
            task = self.tasks[key]
            tps = [tp for tp in self.assigned if (self.sub_of_topic[tp[0]], tp[1]) == key]
            for tp, off in self._seek_offsets({tp: task.positions.get(tp, 0) for tp in tps}).items():
                self.consumer.seek(TopicPartition(tp[0], tp[1], off))
                self.resumed.add(tp)   # records fetched before the seek must not reach the task
                self.at_eof.discard(tp)   # read again from there
        self.resumed_at = time.monotonic()

    def offset_sums(self) -> dict[TaskKey, int]:
        """The changelog offset sum of every open task (its writer's ends): how far its state
        reaches, for the fleet's report."""
        return {key: sum(writer.ends.values()) for key, writer in self.writers.items()}

    def retire_metrics(self, task: Task) -> None:
        """Keep a closing task's counters (summed into its id's entry)."""
        add_counters(self.finished_tasks_metrics.setdefault(task.id, {}), task.metrics())

    def metrics(self) -> dict[str, dict[str, int]]:
        """Counters of every operator, summed over live and closed tasks."""
        total: dict[str, dict[str, int]] = {}
        for m in [*self.finished_tasks_metrics.values(), *(t.metrics() for t in self.tasks.values())]:
            add_counters(total, m)
        return total

    # -- time-ordered input of tasks with several partitions ------------------------------------
    def new_group(self, key: TaskKey, task: Task) -> PartitionGroup:
        """Input buffers for ``task`` (replacing those of an instance it replaced: rebuilt after
        an aborted transaction, which sought its partitions back to its positions)."""
        old = self.groups.get(key)
        if old is not None and old.paused:
            self.consumer.resume([TopicPartition(*tp) for tp in old.paused])
        group = self.groups[key] = PartitionGroup(
            task, [(t, key[1]) for t in self.ordered_inputs[key[0]]], self.max_task_idle_ms, self.at_eof)
        return group

    def process_buffered(self) -> int:
        """Run every task with buffered input as far as Kafka Streams' rule lets it; returns the
        records processed."""
        n = 0
        now_ms = int(time.time() * 1000)
        tasks = self.tasks
        for key, group in list(self.groups.items()):
            if not group.buffered:
                continue
            if tasks.get(key) is not group.task:   # its task is gone: so are its buffers
                self.drop_groups([key])
                continue
            before = group.buffered
            resume = group.process_ready(now_ms, self.stop)
            n += before - group.buffered
            if resume:
                self.consumer.resume([TopicPartition(*tp) for tp in resume])
        return n

    def drop_groups(self, keys: Iterable[TaskKey]) -> None:
        """Revoked, lost or closed tasks: their buffered records are dropped (never processed,
        so never committed: fetched again by whoever runs the task next)."""
        for key in keys:
            group = self.groups.pop(key, None)
            if group is not None and group.paused and not self.closing:
                try:
                    self.consumer.resume([TopicPartition(*tp) for tp in group.paused])
                except Exception:   # not assigned any more
                    pass


class Restoration:
    """Tasks of an assignment being restored by the main loop: their keys, restore targets,
    paused input partitions and the restore's steps (``ChangelogReader.restore_steps``)."""

    def __init__(self, keys: list[TaskKey], targets: list[RestoreTarget], partitions: list[TopicPartition],
                 steps: Generator[Any, None, None], processed_before: int) -> None:
        self.started = time.monotonic()
        self.processed_before = processed_before
        self.keys = keys
        self.targets = targets
        self.partitions = partitions
        self.steps = steps
