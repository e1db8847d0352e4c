"""What the driver gives every backfill Spark task (``JobContext``, ``RunSpec``: pickled into the
task), and what comes back when a task fails on purpose (errors as data).

Invariant: a task reads nothing from the driver's filesystem. Everything it needs is in these
objects (the topology, the routing, the snapshot) or in Kafka; everything it leaves travels back
as Spark data (``backfill.runs``). The one exception is observation only: on a ``local`` master
the tasks write their rows-read counters under ``progress_root`` (``backfill.progress``).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass


class JobContext:
    """What executors need (pickled into every Spark task)."""

    def __init__(self, topo, routing, counts, bootstrap_servers, on_error, dlq, producer_config,
                 emit_outputs=False, build_databases=True, progress_root=None):
        from backfill.compaction import compaction_plan

        self.emit_outputs = emit_outputs
        # whether the tasks send their final stores back to the driver (a --state-dir to fill)
        self.build_databases = build_databases
        self.progress_root = progress_root   # rows-read counters (a local master only)
        # set once the snapshot is taken (what the checkpoints and commit records say)
        self.snapshot: dict = {}          # (source topic, partition) -> (start, end)
        self.internal_ends: dict = {}     # (internal topic, partition) -> end
        self.changelog_ends: dict = {}    # (changelog topic, partition) -> end before the backfill
        # with outputs emitted, nothing is compacted: a key whose last changes fail a filter would
        # lose the tombstone its earlier passing value needs at the sink
        self.compacted = set() if emit_outputs else set(compaction_plan(topo))
        self.topo = topo
        self.routing = routing
        self.counts = counts
        self.bootstrap_servers = bootstrap_servers
        self.on_error = on_error
        self.dlq = dlq
        self.producer_config = producer_config
        # executors log as the driver does (in local mode their stderr is the driver's console)
        self.log_level = logging.getLogger().getEffectiveLevel()
        from processor.logs import JsonFormatter   # executors log as the driver does (--log-format)
        self.log_json = any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
        self.internal = set(topo.internal_topics())
        # foreign-key subscription topics (their sinks route like the right table)
        self.subscription_topics = {n.sink_topic for n in topo.nodes
                                    if n.sink_topic and getattr(n.attrs, "route_like", None)}

    def tasks_of(self, sub: int) -> int:
        return max(self.counts[t] for t in self.topo.source_topics(sub))

    def progress_dir(self, run: int) -> str | None:
        if self.progress_root is None:
            return None
        return os.path.join(self.progress_root, f"run-{run:05d}")


@dataclass
class RunSpec:
    sub: int
    run_no: int
    flush: bool
    external: dict          # (topic, partition) -> (start, end): history to read (first run only)
    pending: list           # earlier runs whose internal rows this sub-topology reads
    reads: list             # topics the sub-topology reads
    archives: dict          # topic -> Parquet path
    consumer_config: dict | None
    final: bool = False     # the sub-topology's last run: its tasks write their changelogs (handoff)


def executor_logging(level: int, json_lines: bool = False) -> None:
    """In an executor's Python worker: log to stderr at the driver's level and format, once per
    process."""
    root = logging.getLogger()
    if not root.handlers:
        if json_lines:
            from processor import logs

            logs.configure(level, "json")
        else:
            logging.basicConfig(level=level, stream=sys.stderr,
                                format=f"%(asctime)s %(levelname)s %(name)s [executor {os.getpid()}]: %(message)s")




def error_info(exc) -> dict:
    return {"type": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}


def raise_task_errors(results) -> None:
    """A task that failed on purpose (a record under ``--on-error fail``, a user function that
    raised, a partitioning error...) returned its error as data: raise it here, in the driver, as
    the same class of error with the same message and exit code as the worker would."""
    import processor.engine.routing as routing
    import processor.errors as errors

    for r in results:
        info = r.get("error") if isinstance(r, dict) else None
        if info is None:
            continue
        cls = getattr(errors, info["type"], None) or getattr(routing, info["type"], None)
        if not (isinstance(cls, type) and issubclass(cls, errors.ProcessorError)):
            cls = errors.ProcessorError
        exc = cls.__new__(cls)
        Exception.__init__(exc, info["message"])
        exc.exit_code = info["exit_code"]
        raise exc


