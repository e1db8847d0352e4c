"""Progress of the backfill's Spark jobs on the driver's stderr (tqdm).

Invariant: progress is observation only. Nothing the job computes passes through it, so a lost
or stale counter changes a bar, never a store. Rows-read counters are files the tasks rewrite
(``RowCounter``) and exist only where the executors share the driver's filesystem (a ``local``
master); on a cluster the bar counts Spark tasks from Spark's status tracker.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path


class StageProgress:
    """A progress bar of the Spark jobs started inside the block. With ``rows_dir`` (a run on a
    local master): rows read / ``total_rows``, rows/s, and the Spark tasks done as a postfix, from
    the counters the run's tasks write there; otherwise Spark tasks done / total."""

    def __init__(self, spark, what: str, rows_dir: str | os.PathLike | None = None, total_rows: int | None = None):
        self.spark = spark
        self.what = what
        self.rows_dir = rows_dir
        self.total_rows = total_rows
        self._stop = threading.Event()

    @staticmethod
    def _tasks(tracker, before) -> tuple[int, int]:
        done = total = 0
        for job in set(tracker.getJobIdsForGroup(None)) - before:
            info = tracker.getJobInfo(job)
            for sid in (info.stageIds if info else ()):
                st = tracker.getStageInfo(sid)
                if st:
                    done += st.numCompletedTasks
                    total += st.numTasks
        return done, total

    def __enter__(self):
        from tqdm import tqdm

        tracker = self.spark.sparkContext.statusTracker()
        before = set(tracker.getJobIdsForGroup(None))
        stop = self._stop = threading.Event()
        rows_dir = self.rows_dir
        by_rows = rows_dir is not None
        bar = tqdm(desc=self.what, unit="row" if by_rows else "task", unit_scale=by_rows, leave=True,
                   file=sys.stderr, disable=None, total=self.total_rows if by_rows else None)

        def poll():
            while True:
                done, total = self._tasks(tracker, before)
                if rows_dir is not None:
                    bar.n = RowCounter.total(rows_dir)
                    if total:
                        bar.set_postfix_str(f"tasks {done}/{total}", refresh=False)
                else:
                    if total:
                        bar.total = total
                    bar.n = done
                bar.refresh()
                if stop.wait(0.5):
                    bar.close()
                    return

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


class RowCounter:
    """Rows a task has read so far, in ``<rows dir>/task-<id>`` (rewritten at most every 0.25 s,
    and at the end), for the driver's progress bar. ``rows_dir`` None (a cluster): counts only."""

    def __init__(self, rows_dir: str | None, task_id: str):
        self.path = None if rows_dir is None else Path(rows_dir) / f"task-{task_id}"
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.n = 0
        self._written = 0.0

    def add(self, n: int) -> None:
        self.n += n
        if self.path is not None and time.monotonic() - self._written > 0.25:
            self.write()

    def write(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(str(self.n))
        os.replace(tmp, self.path)
        self._written = time.monotonic()

    @staticmethod
    def total(rows_dir: str | os.PathLike) -> int:
        n = 0
        for f in Path(rows_dir).glob("task-*"):
            try:
                n += int(f.read_text() or 0)
            except (OSError, ValueError):   # being replaced
                pass
        return n
