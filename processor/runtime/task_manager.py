"""The worker's task management: which tasks this worker runs, and how they open and close.

Assignment (librdkafka's eager rebalance callbacks): tasks are created for assigned partition
numbers (the range assignor keeps partition ``i`` of co-partitioned topics on one worker). A task
suspended by the previous revocation and assigned again resumes at once (nobody else can have
owned it in between). Every other task is restored before it processes anything: its database
is brought up to its changelogs' last commit (``processor/runtime/changelog.py``) and it resumes
its inputs from the positions in that commit; a group offset beyond them means the changelogs
lost data: ``ChangelogMismatch``, never a silent skip.

The restore is a phase of the main loop, not of the assignment callback: the new tasks'
partitions stay paused while the loop calls ``_restore_step`` (``RESTORE_STEP_S`` of whole
restore batches) between polls, so the group sees a live member however long it takes (no
``max.poll.interval.ms`` expiry), a revocation or a stop aborts it cleanly (what it restored up to
its last intermediate commit is kept locally), and the tasks already open keep processing.
Tasks reopened from local state restore first (usually a short catch-up), then those restored
from scratch. Tasks with table sinks then read their sinks' tails (``sink_tails``).

Revocation: the revoked tasks' deferred emissions are flushed and committed, then the tasks are
kept open ("suspended") until the next assignment. Lost partitions: closed without a commit.

A mixin of ``processor.runtime.worker.Worker``: it keeps ``tasks``, ``_writers``,
``_suspended``, ``_restoring``, ``_assigned``, ``_at_eof`` and ``_group_offsets``, and uses the
worker's topology, consumer, collector and settings.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from processor.engine.task import Task, max_record_bytes_of
from processor.errors import ChangelogMismatch, KafkaIOError, ProcessorError
from processor.kafka import clients as kafka
from processor.runtime import sink_tails
from processor.runtime.changelog import ChangelogWriter, RestoreTarget, restore_steps, restore_tasks
from processor.state.rocksdb import RocksDBDatabase

log = logging.getLogger("processor.worker")

# the main loop restores for this long between two polls of the group consumer
RESTORE_STEP_S = 0.2


class TaskManagement:
    # the user topics the cluster had at the last look (``_topic_exists``) and when that was
    _known_topics: frozenset = frozenset()
    _topics_looked_at: float = float("-inf")
    TOPIC_REFRESH_S = 5.0

    def _topic_exists(self, topic: str) -> bool:
        """Whether ``topic`` exists (a topic extractor's sink sends only there): the cluster's
        topics as last listed, listed again on a miss at most every ``TOPIC_REFRESH_S`` seconds
        (a topic created since may be reported missing, and its record dead-lettered, that long)."""
        if topic in self._known_topics:
            return True
        now = time.monotonic()
        if now - self._topics_looked_at >= self.TOPIC_REFRESH_S:
            self._topics_looked_at = now
            try:
                self._known_topics = frozenset(kafka.topic_partitions(self.bootstrap_servers, timeout_s=5.0))
            except ProcessorError as exc:
                # no answer: whether the topic exists is unknown, and a record is not dead-lettered
                # on a guess (exit 7; a restart resumes at the last commit)
                raise KafkaIOError(f"cannot list the cluster's topics to check topic {topic!r}, named by a "
                                   f"topic extractor: {exc}") from exc
        return topic in self._known_topics

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
                targets.append(RestoreTarget(db, f"{sub}_{partition}", partition, self.topology.changelogs_of(sub),
                                             self.topology.source_changelogs_of(sub),
                                             self.topology.table_source_stores_of(sub),
                                             {name: self.topology.changelog_topic(name)
                                              for name in self.topology.source_changelogs_of(sub)}))
        except BaseException:
            for t in targets:
                t.db.close()
            raise
        return targets

    def _discard_targets(self, keys, targets) -> None:
        for key, t in zip(keys, targets, strict=False):
            self.tasks.pop(key, None)
            self._writers.pop(key, None)
            t.db.close()

    def _build_tasks(self, keys, targets) -> None:
        """Tasks over restored databases; then the table sinks' tails of those that have some."""
        for (sub, partition), t in zip(keys, targets, strict=False):
            self.restored_records += t.restored
            task = Task(self.topology, sub, partition, t.stores, self.collector, lambda: int(time.time() * 1000),
                        on_error=self.on_error, dlq_topic=self.dlq_topic, routing=self.routing,
                        max_record_bytes=max_record_bytes_of(self._producer_config),
                        origin=self.application_id if self._table_sinks.get(sub) else None,
                        stage_internal=self._stage_internal,
                        coalesce_fk_records=self.coalesce_fk_records, topic_exists=self._topic_exists,
                        global_stores=self.global_tables.stores if self.global_tables is not None else None)
            self._writers[(sub, partition)] = ChangelogWriter(task, t.changelogs, self.collector.send_changelog,
                                                            self.collector.send_changelog_records)
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
        # (a lower bound is all a floor needs: the high watermark, read uncommitted, never waits
        # for an open transaction, this worker's own included)
        ends = sink_tails.partition_ends(self.bootstrap_servers, topics,
                                         {**self._restore_consumer_config(), "isolation.level": "read_uncommitted"})
        starts = {}
        for key in keys:
            writer = self._writers[key]
            writer.sink_partitions = sink_tails.sink_partitions(self._table_sinks[key[0]], self._parts)
            writer.sink_floor = {tp: ends[tp] for tp in writer.sink_partitions}
            if writer.sink_ends is not None:
                starts[key] = {tp: writer.sink_ends.get(tp, 0) for tp in writer.sink_partitions}
            else:   # no commit record, or one naming no sink ends (a backfill's, an older build's)
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
                    tp.offset = self._start_offset(tp.topic, tp.partition) or OFFSET_BEGINNING
                else:
                    # paused until restored, then sought to the task's position. A concrete offset
                    # (the group's, never above that position), not a logical one: librdkafka would
                    # resolve OFFSET_BEGINNING asynchronously and could overwrite the later seek.
                    tp.offset = self._group_offsets[(tp.topic, tp.partition)]
            if new:
                # tasks reopened from local state first (usually a short catch-up: they start
                # processing while the others restore), then those restored from scratch
                targets = self._restore_targets(new)
                for local in (True, False):
                    group = [(k, t) for k, t in zip(new, targets, strict=False) if bool(t.local) is local]
                    if group:
                        keys = [k for k, _ in group]
                        ts = [t for _, t in group]
                        tps = [tp for tp in waiting if (self._sub_of_topic[tp.topic], tp.partition) in set(keys)]
                        self._restoring.append(_Restoration(
                            keys, ts, tps, restore_steps(ts, self._restore_consumer_config(), self._stop),
                            self.records_processed))
            consumer.assign(partitions)
            self._ever_assigned = True
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
        it means the changelogs lost data); 0 for a task that never committed."""
        task = self.tasks[(self._sub_of_topic[topic], partition)]
        start = task.positions.get((topic, partition), 0)
        group = self._group_offsets.get((topic, partition), 0)
        if group > start:
            raise ChangelogMismatch(
                f"task {task.id}: the group committed {topic}[{partition}] up to offset "
                f"{group}, but the task's changelogs reflect it only up to {start}; the changelog "
                f"topics were deleted or recreated: reset the application (its group offsets "
                f"and state) to rebuild")
        return start

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
        targets = self._seek_offsets({(tp.topic, tp.partition): self._start_offset(tp.topic, tp.partition)
                                      for tp in r.partitions})
        for tp in r.partitions:
            tp.offset = targets[(tp.topic, tp.partition)]
            self.consumer.seek(tp)
            # records fetched before the seek must not reach the task (the loop drops them)
            self._resumed.add((tp.topic, tp.partition))
        self.consumer.resume(r.partitions)
        self._wake_fetchers(r.partitions)
        self._resumed_at = time.monotonic()   # (after the wake-ups: the guard lasts 5 s from here)
        log.info("restored and resumed %s after %.1f s; meanwhile the open tasks processed %d records",
                 ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in r.partitions),
                 time.monotonic() - r.started, meanwhile)

    def _seek_offsets(self, positions: dict, budget_s: float = 0.2) -> dict:
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
        out = {}
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

    def _wake_fetchers(self, partitions, budget_s: float = 0.1) -> None:
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
                self._resumed.discard((tp.topic, tp.partition))
            self._forget_gaps((tp.topic, tp.partition) for tp in partitions)
            self._drop_groups(keys)
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
            self._resumed.discard((tp.topic, tp.partition))
        self._forget_gaps((tp.topic, tp.partition) for tp in partitions)
        self._close_tasks({(self._sub_of_topic[tp.topic], tp.partition) for tp in partitions})

    def _close_tasks(self, keys, table=None):
        table = self.tasks if table is None else table
        if table is self.tasks:
            self._drop_groups(keys)
        errors = []
        for key in keys:
            task = table.pop(key, None)
            self._writers.pop(key, None)
            if task is not None:
                self._retire_metrics(task)
                try:
                    task.close()
                except Exception as exc:  # close the others before reporting
                    errors.append(exc)
        if errors:
            raise errors[0]


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
