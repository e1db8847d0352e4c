"""Standby replicas: tasks a worker does not run, kept warm by reading their changelogs.

A standby replica of a task is the task's database in this worker's state directory, brought
up to its changelogs' last commit again and again by the restore a task runs before it
processes anything (``processor/runtime/changelog.py``): no processing, no outputs, no
changelog writes. Kafka Streams' standby tasks (``num.standby.replicas``).

Invariant: after a completed pass, a standby's database holds the task's state as of one of
its commits, with that commit's changelog ends as its checkpoint (a pass applies whole commit
units only). A pass cut short (the standby set changed, a promotion, a stop) may leave it
partway, as an interrupted restore does: its checkpoint then names how far each changelog was
applied, and the next restore (a pass, or the active task's) goes on from there. Either way the
worker that is given the task as active reads only the changelog records after that checkpoint,
not the whole history. Nothing a pass leaves uncommitted stays: the rewrites of a commit's tail
(``changelog._finish``, step 4) are the active task's to send, so a standby drops them. A
standby's database is the one an active task of this worker would open (``task-<sub>_<partition>``):
promoting a standby is ``release`` then opening the task as usual.

Passes run in steps (``step``, a budget of whole restore batches), between the worker's polls,
like the active tasks' restores; a pass starts ``interval_s`` after the previous one ended. Every
pass reads through the worker's one restore consumer, the task manager's ``ChangelogReader``
(``processor/runtime/changelog_reader.py``: its reads take turns between batches).

A standby whose database cannot be opened, or whose pass fails on it (its local state does not
match its changelogs: ``ChangelogMismatch``), is set aside: one log line, the other standbys go
on, and it is tried again every ``retry_s`` (a line again only if the reason changes). A pass
failing for no one task (the broker) sets every standby of the pass aside the same way; the worker
and its active tasks run on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from processor.engine.task_id import TaskId
from processor.runtime.changelog_reader import ChangelogReader, RestoreInterrupted, RestoreTarget, restore_target
from processor.state.rocksdb import RocksDBDatabase
from processor.state.state_directory import StateDirectory

if TYPE_CHECKING:
    from processor.topology.core import Topology

log = logging.getLogger("processor.standby")

TaskKey = tuple[int, int]   # (sub-topology, partition)
# a standby set aside (its database could not be opened or restored) is tried again this often
RETRY_S = 30.0


class StandbyTasks:
    """This worker's standby replicas: which tasks, their databases, the pass under way."""

    def __init__(self, topology: Topology, state_dir: Path, consumer_config: dict, stop: threading.Event,
                 interval_s: float = 1.0, retry_s: float = RETRY_S, reader: ChangelogReader | None = None) -> None:
        self.topology = topology
        self.state_dir = Path(state_dir)
        self.state_directory = StateDirectory(self.state_dir, topology)
        self.consumer_config = consumer_config   # assign() only, never commits (the restore's)
        self.stop = stop
        self.interval_s = interval_s
        self.retry_s = retry_s
        self.wanted: set[TaskKey] = set()     # the standbys asked for (``update``): open or set aside
        self.dbs: dict[TaskKey, RocksDBDatabase] = {}
        self.set_aside: dict[TaskKey, float] = {}   # -> when to try again (time.monotonic())
        self._reasons: dict[TaskKey, str] = {}      # why each was set aside, as last logged
        # the passes read through the worker's restore consumer (its task manager's), or their own
        self.reader = reader or ChangelogReader(consumer_config, stop)
        self._own_reader = reader is None
        self.records_read: dict[TaskKey, int] = {}   # changelog records applied, per task, in all passes
        self.passes = 0
        self._lag: dict[TaskKey, int] = {}   # as the last pass found it (0 when it caught up)
        self._pass: Generator[None, None, None] | None = None
        self._targets: dict[TaskKey, RestoreTarget] = {}
        self._next_pass_at = 0.0

    @property
    def keys(self) -> set[TaskKey]:
        """The tasks this worker keeps standby replicas of (set aside ones not included)."""
        return set(self.dbs)

    def update(self, keys: Iterable[TaskKey]) -> None:
        """Keep standby replicas of exactly ``keys``: open the new ones (a pass starts at once),
        close the others."""
        keys = set(keys)
        dropped = self.wanted - keys
        added = keys - self.wanted
        if not dropped and not added:
            return
        self._abort_pass()
        for key in dropped:
            self._forget(key)
        self.wanted = keys
        for key in sorted(added):
            self._open(key)
        self._next_pass_at = 0.0
        log.info("standby replicas: %s", ", ".join(str(TaskId(*k)) for k in sorted(self.wanted)) or "none")

    @property
    def consumers_opened(self) -> int:
        """Restore consumers opened for the passes (one, unless a pass failed for no one task)."""
        return self.reader.consumers_opened

    def release(self, key: TaskKey) -> None:
        """Stop keeping ``key`` (it becomes an active task here, or goes): its database closes,
        as of its last completed commit unit."""
        if key in self.wanted:
            if key in self.dbs:
                self._abort_pass()
            self._forget(key)
            self.wanted.discard(key)
            self._next_pass_at = 0.0

    def _forget(self, key: TaskKey) -> None:
        db = self.dbs.pop(key, None)
        if db is not None:
            db.close()
        self._lag.pop(key, None)
        self.set_aside.pop(key, None)
        self._reasons.pop(key, None)

    def _open(self, key: TaskKey) -> None:
        try:
            self.dbs[key] = self.state_directory.open(key)
        except Exception as exc:
            self._put_aside(key, exc)
            return
        self.records_read.setdefault(key, 0)
        self.set_aside.pop(key, None)

    def _put_aside(self, key: TaskKey, exc: BaseException) -> None:
        """A standby whose database cannot be opened or restored: closed, tried again in ``retry_s``
        (a log line when first set aside, or when the reason changes)."""
        db = self.dbs.pop(key, None)
        if db is not None:
            try:
                db.close()
            except Exception as close_exc:
                log.debug("closing the standby database of task %s: %s", TaskId(*key), close_exc)
        self._lag.pop(key, None)
        self.set_aside[key] = time.monotonic() + self.retry_s
        reason = f"{type(exc).__name__}: {exc}"
        if self._reasons.get(key) != reason:
            self._reasons[key] = reason
            log.warning("standby replica of task %s set aside (tried again every %g s; the other standbys "
                        "go on): %s", TaskId(*key), self.retry_s, reason)

    def _retry_set_aside(self, now: float) -> None:
        for key, at in sorted(self.set_aside.items()):
            if at <= now:
                self.set_aside.pop(key)
                self._open(key)

    def step(self, budget_s: float = 0.2) -> bool:
        """Run the pass under way (or start one when due) for up to ``budget_s`` of whole restore
        batches. Returns whether a pass ended in this call."""
        if not self.wanted:
            return False
        if self._pass is None:
            now = time.monotonic()
            if self.set_aside:
                self._retry_set_aside(now)
            if not self.dbs or now < self._next_pass_at:
                return False
            targets = {}
            for key, db in list(self.dbs.items()):
                try:
                    targets[key] = restore_target(self.topology, db, *key)
                except Exception as exc:
                    self._put_aside(key, exc)
            if not targets:
                return False
            self._targets = targets
            self._pass = self.reader.restore_steps(list(targets.values()), quiet=True)
        deadline = time.monotonic() + budget_s
        try:
            while time.monotonic() < deadline:
                next(self._pass)
            return False
        except StopIteration:
            pass
        except RestoreInterrupted:
            self._abort_pass()
            raise
        except Exception as exc:
            self._pass_failed(exc)
            return False
        except BaseException:
            self._abort_pass()
            raise
        for key, t in self._targets.items():
            self.records_read[key] += t.restored
            self._lag[key] = 0
            if self._reasons.pop(key, None) is not None:
                log.info("standby replica of task %s caught up: it is kept again", TaskId(*key))
        self._pass = None
        self._targets = {}
        self._drop_uncommitted()
        self.passes += 1
        self._next_pass_at = time.monotonic() + self.interval_s
        return True

    def _pass_failed(self, exc: Exception) -> None:
        """The pass failed: the standby it names is set aside (``exc.task_id``), or every standby
        of the pass when it names none (the consumer too is opened anew); the others go on at once."""
        task_id = getattr(exc, "task_id", None)
        named = [key for key in self._targets if str(TaskId(*key)) == task_id]
        keys = named or list(self._targets)
        self._abort_pass()
        if not named:
            self.reader.reset()
        for key in keys:
            self._put_aside(key, exc)
        self._next_pass_at = 0.0

    def catch_up(self, timeout_s: float = 60.0) -> None:
        """One whole pass from now (tests, and a worker about to report its standbys)."""
        if not self.dbs:
            return
        self._abort_pass()
        self._next_pass_at = 0.0
        deadline = time.monotonic() + timeout_s
        while not self.step(budget_s=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"standby replicas {sorted(self.dbs)} did not catch up in {timeout_s:.0f} s")

    def caught_up_once(self, key: TaskKey) -> bool:
        """Whether a pass over ``key`` has completed since it became a standby here and since the
        last pass cut short (which may leave it partway)."""
        return key in self._lag

    def lags(self) -> dict[TaskKey, int]:
        """Per standby, the changelog records it is behind: during a pass, what the pass has left
        to apply; between passes, 0 (the last pass reached the changelogs' ends as they were when
        it started). A standby whose first pass has not measured it yet is left out."""
        out = {}
        for key in self.dbs:
            t = self._targets.get(key)
            if t is not None and t.to_restore is not None:
                out[key] = max(0, t.to_restore - t.store_restored)
            elif key in self._lag:
                out[key] = self._lag[key]
        return out

    def offset_sums(self) -> dict[TaskKey, int]:
        """Per standby, the sum of its changelog checkpoint: how far its state reaches (what a
        member reports to the group's leader, which compares it with the other members')."""
        return {key: self.state_directory.offset_sum(key, db.read_checkpoint()) for key, db in self.dbs.items()}

    def _abort_pass(self) -> None:
        if self._pass is not None:
            for key in self._targets:   # a pass cut short may leave a copy partway: not caught up
                self._lag.pop(key, None)
            try:
                self._pass.close()
            finally:
                self._pass = None
                self._targets = {}
                self._drop_uncommitted()

    def _drop_uncommitted(self) -> None:
        """Forget writes a pass left pending (past its last intermediate commit, or a tail's
        rewrites): the next pass reads them again from the checkpoint."""
        for db in self.dbs.values():
            for store in db.stores.values():
                store.clear_pending()

    def close(self) -> None:
        """Close every standby's database, and the passes' consumer if it is their own (the worker
        stops; the task manager closes its own)."""
        try:
            self._abort_pass()
            for db in self.dbs.values():
                db.close()
        finally:
            self.dbs.clear()
            self.wanted.clear()
            self.set_aside.clear()
            self._reasons.clear()
            self._lag.clear()
            if self._own_reader:   # (the task manager's own reader: it closes it)
                self.reader.close()
