"""The application's state directory: one RocksDB database per task (Kafka Streams' ``StateDirectory``).

``<state-dir>/<application-id>/task-<sub>_<partition>`` (``processor/engine/task_id.py``) holds a
task's stores, its input positions and its changelog checkpoint (``processor/state/rocksdb.py``).
``StateDirectory`` is the one place that names, claims, opens and sums those directories, for the
task manager (active tasks), the standby replicas and the fleet's report of local state.

- **Claim before open** (``processor/state/task_owner.py``): a directory another application or
  topology wrote is moved aside or wiped, and the task is rebuilt from its changelogs.
- **A database this process still has open** (another worker of this process, as Kafka Streams'
  stream threads share a state directory, hands a task over before closing it in its own main
  loop) is waited for up to ``wait_s`` (``open``), as Kafka Streams retries a task directory's
  lock; any other failure, or a lock still held then, raises.
- **The offset sum** of a task's state is the sum of its checkpoint over the task's own changelog
  partitions: how far it reaches, what a member reports to the group's leader.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from processor.engine.task_id import DIR_GLOB, TaskId
from processor.errors import StateError
from processor.state.rocksdb import RocksDBDatabase
from processor.state.task_owner import Verdict, claim_task_dir, owner_of

if TYPE_CHECKING:
    from processor.topology.core import Topology

log = logging.getLogger("processor.state")


class StateDirectory:
    """The task directories of one application's state directory (see the module docstring)."""

    def __init__(self, root: Path, topology: Topology) -> None:
        self.root = Path(root)
        self.topology = topology

    def task_dir(self, task: tuple[int, int]) -> Path:
        return self.root / TaskId(*task).dirname

    def task_ids(self) -> list[TaskId]:
        """The tasks with a directory here, in order."""
        return sorted(t for p in self.root.glob(DIR_GLOB) if (t := TaskId.of_dirname(p.name)) is not None)

    def claim(self, task: tuple[int, int]) -> Verdict:
        """Make ``task``'s directory this application's (``claim_task_dir``): what was done."""
        sub, partition = task
        return claim_task_dir(self.task_dir(task), owner_of(self.topology, sub, partition))

    def open(self, task: tuple[int, int], wait_s: float = 0.0,
             stop: threading.Event | None = None) -> RocksDBDatabase:
        """Claim ``task``'s directory and open its database, waiting up to ``wait_s`` (unless
        ``stop`` is set) while this process still has it open."""
        self.claim(task)
        path = self.task_dir(task)
        deadline = time.monotonic() + wait_s
        waited = False
        while True:
            try:
                db = RocksDBDatabase(path)
            except StateError as exc:
                if "lock hold by current process" not in str(exc) or time.monotonic() >= deadline \
                        or (stop is not None and stop.is_set()):
                    raise
                if not waited:
                    waited = True
                    log.info("task database %s is still open in this process (another worker's task): "
                             "waiting up to %.0f s for it to close", path, wait_s)
                time.sleep(0.05)
                continue
            if waited:
                log.info("task database %s opened after waiting %.1f s", path, wait_s - (deadline - time.monotonic()))
            return db

    def offset_sum(self, task: tuple[int, int], checkpoint: dict[tuple[str, int], int]) -> int:
        """The sum of ``checkpoint`` (a task database's) over ``task``'s own changelog partitions."""
        sub, partition = task
        changelogs = {(t, partition) for t in self.topology.changelogs_of(sub).values()}
        return sum(v for tp, v in checkpoint.items() if tp in changelogs)

    def offset_sums(self, tasks: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
        """The offset sum of each of ``tasks`` that has a directory here, from its checkpoint (the
        database opened and closed again). A directory that cannot be opened is named in a log
        line and left out, and so is one another application or topology wrote (put out of the
        way by the claim: nothing of this task's state is there)."""
        wanted = {TaskId(*t) for t in tasks}
        out: dict[tuple[int, int], int] = {}
        for task in self.task_ids():
            if task not in wanted:
                continue
            try:
                if self.claim(task) in ("moved", "wiped"):
                    continue
                db = RocksDBDatabase(self.task_dir(task))
            except Exception as exc:
                log.warning("local state of task %s not reported to the group (%s)", task, exc)
                continue
            try:
                out[task] = self.offset_sum(task, db.read_checkpoint())
            finally:
                db.close()
        return out
