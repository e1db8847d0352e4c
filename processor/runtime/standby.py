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
like the active tasks' restores; a pass starts ``interval_s`` after the previous one ended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from processor.runtime.changelog import RestoreTarget, restore_steps, restore_target
from processor.state.rocksdb import RocksDBDatabase
from processor.state.task_owner import claim_task_dir, owner_of

if TYPE_CHECKING:
    from processor.topology.core import Topology

log = logging.getLogger("processor.standby")

TaskKey = tuple[int, int]   # (sub-topology, partition)


class StandbyTasks:
    """This worker's standby replicas: which tasks, their databases, the pass under way."""

    def __init__(self, topology: Topology, state_dir: Path, consumer_config: dict, stop: threading.Event,
                 interval_s: float = 1.0) -> None:
        self.topology = topology
        self.state_dir = Path(state_dir)
        self.consumer_config = consumer_config   # assign() only, never commits (the restore's)
        self.stop = stop
        self.interval_s = interval_s
        self.dbs: dict[TaskKey, RocksDBDatabase] = {}
        self.records_read: dict[TaskKey, int] = {}   # changelog records applied, per task, in all passes
        self.passes = 0
        self._lag: dict[TaskKey, int] = {}   # as the last pass found it (0 when it caught up)
        self._pass: Generator[None, None, None] | None = None
        self._targets: dict[TaskKey, RestoreTarget] = {}
        self._next_pass_at = 0.0

    @property
    def keys(self) -> set[TaskKey]:
        """The tasks this worker keeps standby replicas of."""
        return set(self.dbs)

    def update(self, keys: Iterable[TaskKey]) -> None:
        """Keep standby replicas of exactly ``keys``: open the new ones (a pass starts at once),
        close the others."""
        keys = set(keys)
        dropped = set(self.dbs) - keys
        added = keys - set(self.dbs)
        if not dropped and not added:
            return
        self._abort_pass()
        for key in dropped:
            self.dbs.pop(key).close()
            self._lag.pop(key, None)
        for sub, partition in sorted(added):
            claim_task_dir(self.state_dir / f"task-{sub}_{partition}", owner_of(self.topology, sub, partition))
            self.dbs[(sub, partition)] = RocksDBDatabase(self.state_dir / f"task-{sub}_{partition}")
            self.records_read.setdefault((sub, partition), 0)
        self._next_pass_at = 0.0
        if added or dropped:
            log.info("standby replicas: %s", ", ".join(f"{s}_{p}" for s, p in sorted(self.dbs)) or "none")

    def release(self, key: TaskKey) -> None:
        """Stop keeping ``key`` (it becomes an active task here, or goes): its database closes,
        as of its last completed commit unit."""
        if key in self.dbs:
            self._abort_pass()
            self.dbs.pop(key).close()
            self._lag.pop(key, None)
            self._next_pass_at = 0.0

    def step(self, budget_s: float = 0.2) -> bool:
        """Run the pass under way (or start one when due) for up to ``budget_s`` of whole restore
        batches. Returns whether a pass ended in this call."""
        if not self.dbs:
            return False
        if self._pass is None:
            if time.monotonic() < self._next_pass_at:
                return False
            self._targets = {key: restore_target(self.topology, db, *key) for key, db in self.dbs.items()}
            self._pass = restore_steps(list(self._targets.values()), self.consumer_config, self.stop, quiet=True)
        deadline = time.monotonic() + budget_s
        try:
            while time.monotonic() < deadline:
                next(self._pass)
            return False
        except StopIteration:
            pass
        except BaseException:
            self._abort_pass()
            raise
        for key, t in self._targets.items():
            self.records_read[key] += t.restored
            self._lag[key] = 0
        self._pass = None
        self._targets = {}
        self._drop_uncommitted()
        self.passes += 1
        self._next_pass_at = time.monotonic() + self.interval_s
        return True

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
        out = {}
        for (sub, partition), db in self.dbs.items():
            changelogs = {(t, partition) for t in self.topology.changelogs_of(sub).values()}
            out[(sub, partition)] = sum(v for tp, v in db.read_checkpoint().items() if tp in changelogs)
        return out

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
        """Close every standby's database (the worker stops)."""
        self._abort_pass()
        for db in self.dbs.values():
            db.close()
        self.dbs.clear()
