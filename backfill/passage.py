"""How what a backfill task leaves reaches its next run and the driver: ``TaskPassage``, with one
implementation per kind of master.

- ``SparkItems`` (any master but ``local``): everything travels as Spark data. A task's inputs
  are the ``(task, ResultItem)`` pairs of its Spark partition (``backfill.runs.ClusterRuns``
  brings them together); what it leaves is yielded as result items, big payloads in pieces
  (``backfill.pieces``); its database goes back to the driver as a ``db`` item
  (``backfill.handoff.encode_database``).
- ``LocalFiles`` (a ``local`` master, whose executors are processes of the driver's machine):
  the same pieces pass through files under the driver's build root, and a task builds its
  database there itself (``backfill.runs.LocalRuns``): measured ~1 s faster per run than
  Spark's cache and shuffle on one machine (docs/backfill.md "Backfill on a cluster").

Invariant: a task reads what its previous runs left and leaves what its next runs read through
its ``TaskPassage`` only; the driver's side of the same choice is ``backfill.runs.Runs``.
"""

from __future__ import annotations

import os
from typing import Protocol, cast

from backfill.items import ResultItem, RowsBatch
from processor.engine.task_id import TaskId


class TaskPassage(Protocol):
    """The executor's side: a task's inputs, what it leaves, and its database."""

    def task_inputs(self, sub: int, partition: int, pending: list, reads, items) -> tuple[bytes | None,
                                                                                         list[RowsBatch]]:
        """(the stores the task's previous run left or None, the rows batches of the ``pending``
        runs on ``reads`` addressed to it, in run order); ``items`` is its Spark partition."""
        ...

    def keep(self, run_no: int, task_id: str, out: list[ResultItem]) -> list[ResultItem]:
        """What a task run leaves (``out``) kept for the next runs and the driver; returns what
        the task yields (beside its stats)."""
        ...

    def database(self, sub: int, partition: int, contents: dict, checkpoint: dict) -> dict:
        """A task's final stores for the state directory: ``{"built": 1}`` (built in place) or
        ``{"db": bytes}`` (for the driver to build)."""
        ...


class SparkItems:
    """Any master but ``local``: a task's inputs and what it leaves are Spark data."""

    def __init__(self, item_bytes: int):
        self.item_bytes = item_bytes   # the largest bytes one item carries (pieces.to_pieces)

    def task_inputs(self, sub, partition, pending, reads, items):
        from backfill.pieces import split_inputs

        return split_inputs(items)

    def keep(self, run_no, task_id, out):
        from backfill.pieces import in_pieces

        return in_pieces(out, self.item_bytes)

    def database(self, sub, partition, contents, checkpoint):
        from backfill.handoff import encode_database

        return {"db": encode_database(sub, partition, contents, checkpoint)}


class LocalFiles:
    """Where the tasks of a ``local`` master keep what passes between runs, under the build root:

    - ``staging/state/task-<sub>_<partition>``: a task's stores for its next run;
    - ``staging/rows/run-<run>/<topic>/<partition>/<origin>``: the internal rows one task sent to
      one partition in one run, pickled, in send order;
    - ``staging/output/run-<run>-<origin>-<n>``: a task run's output rows (Arrow IPC), in items
      of about ``item_bytes`` each (``RowCollector.items``), numbered in order;
    - ``task-<sub>_<partition>/``: the task databases, built where the job installs them from.

    Files are written to a temporary name and renamed, so a reader sees whole files only."""

    def __init__(self, root: str):
        self.root = root

    # -- TaskPassage
    def task_inputs(self, sub, partition, pending, reads, items) -> tuple[bytes | None, list[RowsBatch]]:
        # (``items`` are the task numbers only: what the task's previous runs left is in files)
        return self.read_state(str(TaskId(sub, partition))), self.read_rows(pending, reads, partition)

    def keep(self, run_no, task_id, out: list[ResultItem]) -> list[ResultItem]:
        outputs = 0
        for item in out:
            if item.kind == "state":
                self.write_state(task_id, item.payload)
            elif item.kind == "rows":
                self.write_rows(item.partition, item.payload)
            elif item.kind == "output":
                self.write_output(run_no, task_id, outputs, item.payload)
                outputs += 1
            else:
                raise RuntimeError(f"backfill: internal error: a {item.kind!r} item on a local master")
        return []

    def database(self, sub, partition, contents, checkpoint) -> dict:
        from backfill.sst import build_task_database

        build_task_database(os.path.join(self.root, TaskId(sub, partition).dirname), contents, checkpoint)
        return {"built": 1}

    # -- the files

    def _write(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def state_path(self, task_id: str) -> str:
        return os.path.join(self.root, "staging", "state", TaskId.parse(task_id).dirname)

    def write_state(self, task_id: str, blob: bytes) -> None:
        self._write(self.state_path(task_id), blob)

    def read_state(self, task_id: str) -> bytes | None:
        try:
            with open(self.state_path(task_id), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def rows_dir(self, run: int) -> str:
        return os.path.join(self.root, "staging", "rows", f"run-{run:05d}")

    def write_rows(self, part: int, batch: RowsBatch) -> None:
        blob = cast(bytes, batch.blob)   # (a local master's rows are never cut into pieces)
        self._write(os.path.join(self.rows_dir(batch.run), batch.topic, str(part), batch.origin), blob)

    def read_rows(self, runs, topics, part: int) -> list[RowsBatch]:
        """The ``RowsBatch``es of ``runs`` and ``topics`` to partition ``part``."""
        out = []
        for run in runs:
            for topic in topics:
                d = os.path.join(self.rows_dir(run), topic, str(part))
                if not os.path.isdir(d):
                    continue
                for origin in sorted(os.listdir(d)):
                    if ".tmp-" in origin:
                        continue
                    with open(os.path.join(d, origin), "rb") as f:
                        out.append(RowsBatch(run, topic, origin, f.read()))
        return out

    def write_output(self, run: int, origin: str, number: int, blob: bytes) -> None:
        self._write(os.path.join(self.root, "staging", "output", f"run-{run:05d}-{origin}-{number:05d}"), blob)

    def read_outputs(self) -> list[bytes]:
        d = os.path.join(self.root, "staging", "output")
        if not os.path.isdir(d):
            return []
        out = []
        for name in sorted(os.listdir(d)):
            if ".tmp-" not in name:
                with open(os.path.join(d, name), "rb") as f:
                    out.append(f.read())
        return out
