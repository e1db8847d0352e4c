"""What the driver gives every backfill Spark task (``JobContext``, ``RunSpec``: pickled into the
task), and what comes back when a task fails on purpose (errors as data).

Invariant: on any master but ``local``, a task reads nothing from the driver's filesystem and
leaves nothing in its own: everything it needs is in these objects (the topology, the routing,
the snapshot) or in Kafka, and everything it leaves travels back as Spark data
(``backfill.runs``). On a ``local`` master the executors are processes of the driver's machine,
and ``local_root`` (the build root) is where they keep what passes between runs, their
rows-read counters and the task databases (``backfill.passage.LocalFiles``): measured faster than Spark's cache
and shuffle on one machine (docs/backfill.md "Backfill on a cluster").
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backfill.passage import TaskPassage

ITEM_BYTES = 256 << 20


class JobContext:
    """What executors need (pickled into every Spark task)."""

    def __init__(self, topo, routing, counts, bootstrap_servers, on_error, dlq, producer_config,
                 emit_outputs=False, build_databases=True, local_root=None):
        self.emit_outputs = emit_outputs
        # whether the tasks send their final stores back to the driver (a --state-dir to fill)
        self.build_databases = build_databases
        self.local_root = local_root   # the driver's build root, shared by the executors of a local master
        # the largest bytes one item of a run's result carries on a cluster (pieces.to_pieces)
        self.item_bytes = int(os.environ.get("PROCESSOR_BACKFILL_ITEM_BYTES", ITEM_BYTES))
        # set once the snapshot is taken (what the checkpoints and commit records say)
        self.snapshot: dict = {}          # (source topic, partition) -> (start, end)
        self.internal_ends: dict = {}     # (internal topic, partition) -> end
        self.changelog_ends: dict = {}    # (changelog topic, partition) -> end before the backfill
        self.output_ends: dict = {}       # (user sink topic, partition) -> (start, end) (--emit-outputs)
        # the global tables at the snapshot, the same for every task: {store: [(key, stored bytes)]}
        self.global_tables: dict = {}
        # the table sources reduced to their last real changes (backfill.compaction): set by the
        # job once it knows which sink topics already hold records
        self.compacted: set = set()
        self.topo = topo
        self.routing = routing
        self.counts = counts
        self.bootstrap_servers = bootstrap_servers
        self.on_error = on_error
        self.dlq = dlq
        self.producer_config = producer_config
        # executors log as the driver does (in local mode their stderr is the driver's console)
        self.log_level = logging.getLogger().getEffectiveLevel()
        from processor.logs import JsonFormatter  # executors log as the driver does (--log-format)
        self.log_json = any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
        self.internal = set(topo.internal_topics())
        # a foreign-key join's internal topics -> "subscription" or "response"
        # (processor/engine/fk_join_coalescing.py: within a run, a later record of a pair replaces
        # an earlier one, as in the worker within a commit interval)
        self.fk_topics = {n.sink_topic: n.attrs.coalesce for n in topo.nodes
                          if n.sink_topic and getattr(n.attrs, "coalesce", None)}

    def global_stores(self) -> dict | None:
        """A task's view of the global tables (its own copies: a task only reads them)."""
        if not self.global_tables:
            return None
        from processor.state.memory import MemoryStore

        out = {}
        for name, entries in self.global_tables.items():
            store = out[name] = MemoryStore(name)
            store.put_all(entries)
        return out

    def tasks_of(self, sub: int) -> int:
        return max(self.counts[t] for t in self.topo.source_topics(sub))

    def progress_dir(self, run: int) -> str | None:
        if self.local_root is None:
            return None
        return os.path.join(self.local_root, "progress", f"run-{run:05d}")

    @property
    def passage(self) -> TaskPassage:
        """How what a task leaves reaches its next run and the driver (``backfill.passage``)."""
        from backfill.passage import LocalFiles, SparkItems

        return SparkItems(self.item_bytes) if self.local_root is None else LocalFiles(self.local_root)


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


