"""The worker's commit unit: what makes a task's progress durable, every ``commit_interval_ms``.

One unit per task with work (``processor/runtime/changelog.py``): the buffered store writes go
to the changelog topics; flush (outputs, internal records, changelog durable; delivery errors
fatal); each task's commit record (input positions + changelog end offsets + table sink ends)
goes to its task changelog; flush; the group offsets are committed (with
``processing_guarantee="exactly_once"`` all of this is one Kafka transaction, offsets via
``send_offsets_to_transaction``); then each task writes its buffered state, positions and
changelog ends to RocksDB as one batch and sends its outbox. The changelogs up to the last
commit record are the truth: a crash anywhere leaves a state that a restore rebuilds exactly,
with the input positions it belongs to.

``Committer`` runs the units over the tasks, writers, clients and group offsets of the worker's
``TaskManager`` (``processor/runtime/task_manager.py``), which owns it and calls it, and keeps the
group offsets the group has not accepted yet (at least once). Its group offsets go through the
group's membership (``GroupMembership``: the fleet), with its generation. Invariant: a group
offset never moves backwards, and is committed only after the commit records of the units it
belongs to are durable.

Import circle: this module and ``task_manager.py`` import each other, on purpose: the committer
works over the task manager that owns it (its tasks, writers and clients) and has it rebuild
every task after an aborted transaction (``reopen_all``).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import TYPE_CHECKING, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.errors import ConfigError, KafkaIOError
from processor.kafka import clients as kafka
from processor.runtime.changelog_reader import RestoreInterrupted
from processor.runtime.collector import ProduceFailed, SendOffsetsHung

if TYPE_CHECKING:
    from processor.runtime.fetch_gaps import FetchGaps
    from processor.runtime.task_manager import TaskManager
    from processor.runtime.worker_metrics import WorkerMetrics

log = logging.getLogger("processor.worker")

# an idle task with table sinks writes a fresh commit record this often when the sinks moved on
SINK_ENDS_REFRESH_S = 30.0


class GroupMembership(Protocol):
    """What a commit unit needs of the group (``processor/runtime/fleet.py``: ``WorkerFleet``)."""

    def in_doubt(self) -> bool:
        """Whether another member may run this member's tasks already (expelled, fenced)."""
        ...

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        """Send group offsets without waiting (at least once)."""
        ...

    def unaccepted(self, offsets: dict[tuple[str, int], int] | None = None) -> dict[tuple[str, int], int]:
        """Of ``offsets`` (default: every one sent), those the group has not accepted (yet)."""
        ...

    def group_metadata(self) -> bytes | None:
        """What an exactly-once unit sends its offsets with; None while in doubt."""
        ...

    def member_generation(self) -> tuple[int, str]:
        """This member's (generation, member id) now."""
        ...


class Committer:
    """The commit unit of one worker (see the module docstring)."""

    def __init__(self, tasks: TaskManager, fetch_gaps: FetchGaps, metrics: WorkerMetrics,
                 kill_at_commit: int | None = None, stop_at_commit: int | None = None) -> None:
        self.tasks = tasks
        self.fetch_gaps = fetch_gaps
        self.metrics = metrics
        self.skipped_offsets: dict[tuple[str, int], int] = {}   # at least once, see commit()
        self.sink_floors_at = time.monotonic()   # the table sinks' floors refreshed
        # test hooks (worker.py): SIGKILL, or SIGSTOP, at the N-th commit with new records
        self.kill_at_commit = kill_at_commit
        self.stop_at_commit = stop_at_commit
        self.commits_with_records = 0
        self.processed_at_last_commit = 0
        # the group membership (set when the worker runs): group offsets are committed through
        # it, with its generation; no unit is committed while it is in doubt
        self.group: GroupMembership | None = None
        self.units_held = 0   # commits put off while the membership was in doubt
        self.resent_at = 0.0  # group offsets not acknowledged were last sent again then
        # exactly once: transactions failed since the last one committed, the first of them then
        self.failed_since_commit = 0
        self.failing_since = 0.0

    def commit(self, records_processed: int) -> None:
        """One commit unit for every task that has work (see the module docstring); never moves
        a group offset backwards. (Every record sent belongs to a unit: outputs advance
        positions; outbox records leave the outbox entry to delete.)"""
        tm = self.tasks
        group_metadata = None   # exactly once: what this unit's offsets go with
        started_as = (-1, "")   # (generation, member id) when it was read
        if self.group is not None and tm.tasks:
            if tm.collector.transactional:
                # (read at the start: a generation read later could be -1 by then, and Kafka does
                # not fence that; see _renewed_group_metadata for a later one)
                started_as = self.group.member_generation()
                group_metadata = self.group.group_metadata()
                in_doubt = group_metadata is None
            else:
                in_doubt = self.group.in_doubt()
        else:
            in_doubt = False
        if in_doubt:
            # another member may run these tasks already (this member's session expired or it was
            # fenced): writing their commit records could interleave with the new owner's. The
            # group client's next poll reports the partitions lost, and they close uncommitted.
            self.units_held += 1
            if self.units_held == 1 or self.units_held % 100 == 0:
                log.warning("commit put off: this worker's group membership is in doubt (%d so far)",
                            self.units_held)
            return
        if tm.global_tables is not None:
            tm.global_tables.commit()
        if tm.resumed and time.monotonic() - tm.resumed_at > 5.0:
            tm.resumed.clear()   # (worker.py: the loop's guard after a restore)
        if time.monotonic() - self.sink_floors_at > SINK_ENDS_REFRESH_S:
            self._refresh_sink_floors()
        collector = tm.collector
        units = []
        delivered = collector.delivered_ends
        now = time.monotonic()
        writers = tm.writers
        try:
            for key, task in tm.tasks.items():
                # (a task's held foreign-key records are sent here: into the open transaction)
                pos, outbox = task.prepare_commit()
                writer = writers[key]
                if writer.has_work(pos) or outbox or task.converged_in_unit or \
                        writer.sink_ends_stale(delivered, now, SINK_ENDS_REFRESH_S):
                    task.converged_in_unit = False
                    units.append((task, writer, pos, outbox))
        except ProduceFailed as exc:
            # exactly once: the producer refuses records once its transaction failed (its records
            # timed out while the broker did not answer): aborted, the tasks rebuilt
            if not collector.transactional:
                raise
            self.transaction_failed(exc)
            return
        if not units:
            self._retry_skipped_offsets()
            return
        started = time.monotonic()
        group_offsets = tm.group_offsets
        offsets = []
        try:
            for _task, writer, _pos, _outbox in units:
                writer.write_pending()
            collector.flush()               # outputs, internal records, changelog records durable
            if records_processed > self.processed_at_last_commit:
                self._signal_hooks()
            self.processed_at_last_commit = records_processed
            for task, writer, pos, _outbox in units:
                writer.settle_sink_ends(delivered, task.convergence_pending)
                writer.write_commit_record(pos)
            for _task, _writer, pos, _outbox in units:
                for (topic, part), off in pos.items():
                    if off > group_offsets.get((topic, part), 0):
                        offsets.append(TopicPartition(topic, part, off))
            if collector.transactional:
                group_metadata = self._renewed_group_metadata(started_as, group_metadata)
                self._commit_transaction(offsets, group_metadata)
            else:
                collector.flush()           # the commit records: the units are durable now
                offsets = self._commit_group_offsets(offsets)
        except (KafkaException, KafkaIOError) as exc:
            # exactly once, whatever failed (a record not delivered: timed out while the broker was
            # paused; the commit refused) fails the transaction, and nothing of it is kept
            if not collector.transactional:
                raise
            self.transaction_failed(exc)
            return
        for tp in offsets:
            group_offsets[(tp.topic, tp.partition)] = tp.offset
        collector.begin()               # outbox records below go into the next transaction
        try:
            for task, writer, pos, outbox in units:
                task.finish_commit(pos, outbox, writer.committed_ends(pos))
        except ProduceFailed as exc:
            # exactly once: the next transaction failed at once (this unit is committed: every task
            # is rebuilt from its changelogs, this unit's commit records included)
            if not collector.transactional:
                raise
            self.transaction_failed(exc)
            return
        self.metrics.observe_commit(started)

    def _signal_hooks(self) -> None:
        """Test hooks, at a commit with new records, outputs and changelog records flushed and
        nothing committed yet: SIGKILL at the ``kill_at_commit``-th (a crash), SIGSTOP at the
        ``stop_at_commit``-th (a process frozen past its session: the test sends SIGCONT)."""
        self.commits_with_records += 1
        if self.kill_at_commit is not None and self.commits_with_records >= self.kill_at_commit:
            log.warning("test hook: SIGKILL after forwarding, before committing")
            os.kill(os.getpid(), signal.SIGKILL)
        if self.stop_at_commit is not None and self.commits_with_records == self.stop_at_commit:
            log.warning("test hook: SIGSTOP after forwarding, before committing")
            os.kill(os.getpid(), signal.SIGSTOP)

    def unsettled(self) -> str | None:
        """What keeps the group from holding what this worker committed, or None: its membership
        in doubt, or (at least once) offsets it sent for partitions it owns that the group has
        not accepted (exactly once they went in the transactions). A worker run until drained stops
        only once this is None: a member expelled while frozen past its session has its commits
        refused, and leaving at once would leave the group's offsets behind its changelogs."""
        group = self.group
        if group is None:
            return None
        if group.in_doubt():
            return "its group membership is in doubt (expelled, or not joined yet)"
        tm = self.tasks
        if self.failed_since_commit or tm.restoring:
            return "its tasks are being rebuilt (a transaction failed, or an assignment restores)"
        if tm.collector.transactional:
            return None
        left = {tp: off for tp, off in group.unaccepted().items() if tp in tm.assigned}
        if not left:
            return None
        return "offsets not accepted: " + ", ".join(f"{t}[{p}]@{off}" for (t, p), off in sorted(left.items()))

    def _refresh_sink_floors(self) -> None:
        """Every ``SINK_ENDS_REFRESH_S``: the table sinks' ends now (high watermarks) become the
        floor of every task's sink ends. Any end found before a record is sent is below it, so
        this is always a valid floor; without it a partition this worker never writes would keep
        the floor of the task's opening, and a reopening after a crash would read everything the
        other workers wrote there since."""
        self.sink_floors_at = time.monotonic()
        writers = [w for w in self.tasks.writers.values() if w.sink_partitions]
        if not writers:
            return
        topics = sorted({tp[0] for w in writers for tp in w.sink_partitions})
        try:
            ends = self.tasks.sink_ends(topics)
        except Exception as exc:   # an optimization: the floors kept are still valid
            log.warning("refreshing the table sinks' ends failed (kept the previous ones): %s", exc)
            return
        for w in writers:
            w.sink_floor = {tp: max(w.sink_floor.get(tp, 0), ends.get(tp, 0)) for tp in w.sink_partitions}

    def _commit_group_offsets(self, offsets: list[TopicPartition]) -> list[TopicPartition]:
        """At least once: send the group offsets of durable units; returns them. They go without
        waiting (the membership's thread may be waiting on this one); what the group does not
        accept (a rebalance, a coordinator moving) is sent again when the worker is idle
        (``_retry_skipped_offsets``). The units are durable in the changelogs (the truth about
        positions), so a group that rebalances under us loses nothing: the next owner resumes
        from the commit records. Only the offsets shown to tools lag."""
        if not offsets:
            return []
        group = self.group
        assert group is not None, "commit units run only while the worker is in its group"
        group.commit({(tp.topic, tp.partition): tp.offset for tp in offsets})
        for tp in offsets:
            self.skipped_offsets.pop((tp.topic, tp.partition), None)
        return offsets

    def _renewed_group_metadata(self, started_as: tuple[int, str], read: bytes | None) -> bytes | None:
        """The group metadata an exactly-once unit commits its offsets with: the one read at its
        start, or the member's current one when the same member (same member id) is in a later
        generation now. A cooperative rebalance completed meanwhile (on the membership's thread,
        while this unit flushed), and Kafka refuses the older generation (ILLEGAL_GENERATION:
        the transaction would abort and every task be rebuilt). The member still owns every
        partition of the unit: a partition leaves only through a revocation, which the owner
        runs between two batches, never during a commit; a member fenced meanwhile rejoins
        under a new member id, and keeps the metadata read at the start (Kafka fences it)."""
        group = self.group
        assert group is not None
        gen, member = group.member_generation()
        if read is None or member != started_as[1] or not member or gen <= started_as[0]:
            return read
        return group.group_metadata() or read

    def _retry_skipped_offsets(self) -> None:
        """Group offsets skipped during a rebalance, of partitions still assigned here; at least
        once, also the positions of idle tasks above the group's offset (a task taken over whose
        previous owner's last group commit never landed: its changelogs hold the position, and
        with no new input no unit would ever commit it)."""
        tm = self.tasks
        assigned = tm.assigned
        group_offsets = tm.group_offsets
        if not tm.collector.transactional:
            for (t, p) in assigned:
                task = tm.tasks.get((tm.sub_of_topic[t], p))
                pos = task.positions.get((t, p), 0) if task is not None else 0
                if pos > group_offsets.get((t, p), 0) and pos > self.skipped_offsets.get((t, p), 0):
                    self.skipped_offsets[(t, p)] = pos
        if self.group is not None:
            # what the group refused or never answered (a rebalance, a coordinator moving)
            now = time.monotonic()
            if now - self.resent_at >= 1.0:
                self.resent_at = now
                again = self.group.unaccepted({tp: off for tp, off in group_offsets.items() if tp in assigned})
                if again:
                    self.group.commit(again)
        retry = [TopicPartition(t, p, off) for (t, p), off in sorted(self.skipped_offsets.items())
                 if (t, p) in assigned and off > group_offsets.get((t, p), 0)]
        self.skipped_offsets = {tp: off for tp, off in self.skipped_offsets.items() if tp in assigned}
        for tp in self._commit_group_offsets(retry):
            group_offsets[(tp.topic, tp.partition)] = tp.offset

    def _commit_transaction(self, offsets: list[TopicPartition], group_metadata) -> None:
        """Exactly once: commit the open transaction (with ``offsets``); a commit that timed out
        (the broker not answering: librdkafka goes on with it) is resumed, up to
        ``TRANSIENT_TIMEOUT_S``, as librdkafka asks: calling it again."""
        collector = self.tasks.collector
        deadline = time.monotonic() + kafka.TRANSIENT_TIMEOUT_S
        sent = False
        while True:
            try:
                if not sent:
                    collector.send_offsets(offsets, group_metadata)
                    sent = True
                collector.commit_transaction([], None)
                break
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if not isinstance(err, KafkaError) or not err.retriable() or err.fatal() or \
                        err.txn_requires_abort() or time.monotonic() > deadline:
                    raise
                log.warning("exactly_once: %s timed out (%s): transient, resuming it",
                            "the commit" if sent else "sending the offsets", err.str())
        self.failed_since_commit = 0

    def transaction_failed(self, exc: Exception) -> None:
        """Exactly once: the open transaction failed (``exc``: a record the producer refused or did
        not deliver, the commit refused, the group rebalanced under us). Abort it, drop every
        task's uncommitted state and rebuild the tasks from their changelogs
        (``abort_and_rebuild``). Fatal: a producer fenced by a newer instance (see there), and
        transactions failing for ``TRANSIENT_TIMEOUT_S`` without one committed since the first."""
        err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else getattr(exc, "error", None)
        err = err if isinstance(err, KafkaError) else None
        text = err.str() if err is not None else str(exc)
        now = time.monotonic()
        if self.failed_since_commit == 0:
            self.failing_since = now
        self.failed_since_commit += 1
        since = now - self.failing_since
        if self.failed_since_commit > 1 and since > kafka.TRANSIENT_TIMEOUT_S:
            raise KafkaIOError(f"exactly_once: transactions failing for {since:.0f} s, none committed "
                               f"({self.failed_since_commit} failed); the last: {text}") from None
        log.warning("exactly_once: transaction aborted (%s); rebuilding tasks from their changelogs", text)
        # (failing again at once: the producer may be stuck in librdkafka, a partition's records
        # timing out after every abort, as seen after a broker pause: renewed)
        # (a producer whose send_offsets_to_transaction never returned is not touched again)
        hung = isinstance(exc, SendOffsetsHung)
        self.abort_and_rebuild(err, renew=hung or self.failed_since_commit >= 2, abort=not hung)

    def abort_and_rebuild(self, err: KafkaError | None = None, rebuild: bool = True, renew: bool = False,
                          abort: bool = True) -> None:
        """Exactly once: abort the open transaction, begin the next, and (``rebuild``) rebuild
        every task from its changelogs. The producer is replaced by a new one with the same
        transactional id (``KafkaCollector.renew``: its initialisation aborts the open
        transaction, waiting while the broker does not answer) when asked (``renew``), when the abort timed out (the
        broker not answering; or refusing the epoch bump librdkafka's abort of timed-out records
        needs: Tansu), or when the producer was fenced (``err`` or the abort's error fatal) after
        its transaction had been open longer than ``transaction.timeout.ms``: the broker aborted
        it on its timeout and fenced the producer's epoch. Fenced sooner, a newer instance owns
        the transactional id: fatal (``ConfigError``)."""
        collector = self.tasks.collector
        fatal = err if err is not None and err.fatal() else None
        timed_out = None
        if fatal is None and abort:
            try:
                collector.abort()
            except KafkaException as exc:
                abort_err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                text = abort_err.str() if abort_err is not None else str(exc)
                if abort_err is not None and abort_err.fatal():
                    fatal = abort_err
                elif collector.in_transaction:   # (retriable: timed out)
                    timed_out = text
                else:
                    raise KafkaIOError(f"exactly_once: aborting the failed transaction failed: {text}") from None
        if fatal is not None:
            opened = time.monotonic() - collector.began_at
            if opened < collector.transaction_timeout_s:
                raise ConfigError(f"exactly_once: the transaction could not commit ({fatal.str()}); "
                                  f"this worker was fenced by a newer instance") from None
            log.warning("exactly_once: the producer was fenced (%s) after its transaction stayed open %.0f s, "
                        "longer than transaction.timeout.ms (%.0f s): the broker aborted it on its timeout; "
                        "a new transactional producer takes over the transactional id",
                        fatal.str(), opened, collector.transaction_timeout_s)
            collector.renew(30)
        elif timed_out is not None:
            log.warning("exactly_once: aborting the transaction timed out (%s): a new transactional producer "
                        "takes over the transactional id (its initialisation aborts the transaction)", timed_out)
            collector.renew(30)
        elif renew:
            log.warning("exactly_once: %s: a new transactional producer takes over the transactional id",
                        f"transactions failed {self.failed_since_commit} times in a row" if abort else
                        "the producer is stuck")
            collector.renew(30)
        self.fetch_gaps.clear()
        # the rebuilt tasks resend their outboxes at once: into the next transaction (a
        # transactional producer refuses a record outside one)
        collector.begin()
        if rebuild:
            try:
                self.tasks.reopen_all()
            except RestoreInterrupted:
                # the worker stops meanwhile: the tasks stay closed (what they committed is in
                # their changelogs; the next owner restores it)
                log.info("exactly_once: stopping: the tasks are not rebuilt")
