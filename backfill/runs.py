"""The runs: sub-topologies processed in Spark until no internal row is pending, then the tasks
no run wrote, then every database the driver builds.

A run is one Spark job over one sub-topology, with one Spark partition per task: partition ``i``
holds task ``i``'s stores as its previous run left them and the internal rows earlier runs
addressed to it, brought together by Spark (``union`` + ``partitionBy``, a shuffle), and its task
reads its own input partitions' history from Kafka (``backfill.task_run``). The run's result is
an RDD persisted by Spark (memory, spilling to each executor's Spark-managed disk); the next
runs take their inputs from it. Nothing passes between runs through an executor's files or the
driver's, so executors on other machines (a standalone, YARN or Kubernetes cluster) run it as
``local[*]`` does.

That is ``ClusterRuns``. On a ``local`` master, whose executors are processes of the driver's
machine, the same pieces pass through files under the driver's build root instead
(``LocalRuns``, with the tasks' ``backfill.passage.LocalFiles``): Spark's cache and shuffle cost
~1 s more per run there (docs/backfill.md "Backfill on a cluster").

Invariant: a result is unpersisted only once nothing can read it any more (every reader of its
rows has run after it, and its stores have been taken by the sub-topology's next run or written).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from backfill.context import RunSpec, raise_task_errors
from backfill.items import ResultItem, RunRecord, TaskStats, as_input, is_piece
from backfill.plan import defers_emissions, is_last_run, run_order
from backfill.progress import StageProgress
from processor.engine.task_id import DIR_GLOB

if TYPE_CHECKING:
    from pyspark import RDD

log = logging.getLogger("processor.backfill")

# up to this many bytes of task stores come to the driver in one Spark job; above it one task at
# a time (toLocalIterator: a job per partition, ~0.1 s each)
COLLECT_AT_ONCE_BYTES = 256 << 20


def _payload(item: ResultItem):
    return item.payload


def _is(kind):
    return lambda item: item.kind == kind


def _rows_for(topics):
    topics = frozenset(topics)
    return lambda item: item.kind == "rows" and item.payload.topic in topics


def _final_item(item: ResultItem) -> bool:
    return item.kind in ("output", "db")


def _identity(k):
    return k


class Runs:
    """The driver's side of the runs: which result holds what, and the Spark jobs. Two
    implementations, chosen by the master as the tasks' ``backfill.passage`` is: ``ClusterRuns``
    (results as Spark data) and ``LocalRuns`` (a local master's files under the build root)."""

    def __init__(self, spark, ctx):
        self.spark = spark
        self.sc = spark.sparkContext
        self.ctx = ctx
        self.state_of: dict[int, int] = {}       # sub-topology -> run whose result holds its stores
        self.outputs = 0                         # "output" items in all
        self.db_bytes = 0                        # bytes of the "db" items in all
        self.built = 0                           # databases the tasks built (a local master)

    def inputs(self, sub: int, pending: list, reads) -> RDD:
        """Task ``i`` of ``sub`` at partition ``i``, with what its passage carries to it."""
        raise NotImplementedError

    def run(self, spec, reads, task_fn, what: str, total_rows=None) -> list[TaskStats]:
        """One Spark job: ``task_fn`` over the tasks of ``spec.sub``; returns each task's stats."""
        raise NotImplementedError

    def final_job(self, rdd: RDD) -> RDD:
        """The job that writes the tasks no run wrote (``finalize``), before it runs: on a
        cluster persisted and kept, for ``items`` to find its databases."""
        return rdd

    def release(self, keep) -> None:
        """Let go of every run's result not in ``keep`` (run numbers)."""
        raise NotImplementedError

    def items(self, kind: str):
        """The payloads of every ``kind`` item (outputs, databases) of every run (None: no run had
        any): an RDD, or on a local master the outputs as a list of bytes (its tasks keep no
        databases as items: ``build_databases``)."""
        raise NotImplementedError

    def build_databases(self, build_root) -> int:
        """Every task's database under ``build_root``. Returns how many."""
        raise NotImplementedError

    def discard(self) -> None:
        """Forget everything the runs left (a retry starts afresh)."""
        self.close()

    def close(self) -> None:
        pass

    def _count_final_items(self, stats) -> int:
        outputs = sum(s.get("outputs", 0) for s in stats)
        db = sum(s.get("db", 0) for s in stats)
        self.outputs += outputs
        self.db_bytes += db
        self.built += sum(s.get("built", 0) for s in stats)
        return outputs + db


def open_runs(spark, ctx) -> Runs:
    """The runs for this master (``ctx.local_root``: a local one's build root)."""
    return ClusterRuns(spark, ctx) if ctx.local_root is None else LocalRuns(spark, ctx)


class ClusterRuns(Runs):
    """Every master but ``local`` (it would serve there too, slower): each run's result is an RDD
    persisted by Spark, from which the next runs take their inputs (a shuffle) and the driver its
    outputs and databases."""

    def __init__(self, spark, ctx):
        from pyspark import StorageLevel

        super().__init__(spark, ctx)
        self.level = StorageLevel.MEMORY_AND_DISK
        self.results: dict[int, RDD] = {}        # run -> its persisted result RDD
        self.with_final_items: set[int] = set()  # runs whose results hold "output" or "db" items
        self.final_results: list = []            # those items, kept apart from released results

    def inputs(self, sub: int, pending: list, reads) -> RDD:
        n = self.ctx.tasks_of(sub)
        parts = []
        if sub in self.state_of:
            parts.append(self.results[self.state_of[sub]].filter(_is("state")).map(as_input))
        for r in pending:
            parts.append(self.results[r].filter(_rows_for(reads)).map(as_input))
        if not parts:   # a first run that reads only Kafka: no shuffle
            return self.sc.parallelize(range(n), n)
        return self.sc.union([self.sc.parallelize([(i, None) for i in range(n)], n), *parts]).partitionBy(
            n, _identity)

    def run(self, spec, reads, task_fn, what: str, total_rows=None) -> list[TaskStats]:
        rdd = self.inputs(spec.sub, spec.pending, reads).mapPartitionsWithIndex(task_fn).persist(self.level)
        with StageProgress(self.spark, what, self.ctx.progress_dir(spec.run_no), total_rows):
            stats = rdd.filter(_is("stats")).map(_payload).collect()
        self.results[spec.run_no] = rdd
        if self._count_final_items(stats):
            self.with_final_items.add(spec.run_no)
        return stats

    def final_job(self, rdd: RDD) -> RDD:
        rdd = rdd.persist(self.level)
        self.final_results.append(rdd)
        return rdd

    def release(self, keep) -> None:
        """(What such a result holds for the end, outputs and databases, is kept apart first,
        persisted on its own.)"""
        for r in [r for r in self.results if r not in keep]:
            rdd = self.results.pop(r)
            if r in self.with_final_items:
                kept = rdd.filter(_final_item).persist(self.level)
                kept.count()
                self.final_results.append(kept)
            rdd.unpersist()

    def items(self, kind: str):
        if not (self.outputs if kind == "output" else self.db_bytes):
            return None
        self.release(set())
        parts = [r.filter(_is(kind)).map(_payload) for r in self.final_results]
        return self.sc.union(parts) if parts else None

    def build_databases(self, build_root) -> int:
        """Built by the driver from the ``db`` items of the final results."""
        from backfill.handoff import build_database
        from backfill.pieces import join_pieces

        items = self.items("db")
        if items is None:
            return 0
        n = 0
        with StageProgress(self.spark, "building the task databases on the driver"):
            blobs = items.collect() if self.db_bytes <= COLLECT_AT_ONCE_BYTES else items.toLocalIterator()
            pending: list = []   # the pieces of a database, until all have come
            for blob in blobs:
                if is_piece(blob):
                    pending.append(blob)
                    joined = join_pieces([b for b in pending if b.group == blob.group]) \
                        if sum(1 for b in pending if b.group == blob.group) == blob.total else None
                    if joined is None:
                        continue
                    pending = [b for b in pending if b.group != blob.group]
                    blob = joined[0]
                build_database(build_root, blob)
                n += 1
            if pending:
                raise RuntimeError(f"backfill: internal error: {len(pending)} pieces of task databases left over")
        return n

    def close(self) -> None:
        for rdd in [*self.results.values(), *self.final_results]:
            try:
                rdd.unpersist()
            except Exception:   # noqa: BLE001 (the session may be gone)
                pass
        self.results.clear()
        self.final_results.clear()


class LocalRuns(Runs):
    """A ``local`` master: the tasks read and leave their pieces in files under the build root
    (``backfill.passage.LocalFiles``) and build their databases there; a run's job yields the
    tasks' stats only."""

    def __init__(self, spark, ctx):
        from backfill.passage import LocalFiles

        super().__init__(spark, ctx)
        self.files = LocalFiles(ctx.local_root)

    def inputs(self, sub: int, pending: list, reads) -> RDD:
        n = self.ctx.tasks_of(sub)
        return self.sc.parallelize(range(n), n)

    def run(self, spec, reads, task_fn, what: str, total_rows=None) -> list[TaskStats]:
        rdd = self.inputs(spec.sub, spec.pending, reads).mapPartitionsWithIndex(task_fn)
        with StageProgress(self.spark, what, self.ctx.progress_dir(spec.run_no), total_rows):
            stats = rdd.map(_payload).collect()
        self._count_final_items(stats)
        return stats

    def release(self, keep) -> None:
        """(The rows of such runs are deleted from the build root.)"""
        import shutil

        for r in range(max(keep, default=-1)):
            if r not in keep:
                shutil.rmtree(self.files.rows_dir(r), ignore_errors=True)

    def items(self, kind: str):
        if kind != "output":
            raise RuntimeError(f"backfill: internal error: no {kind!r} items on a local master")
        return (self.files.read_outputs() or None) if self.outputs else None   # bytes (outputs.emit)

    def build_databases(self, build_root) -> int:
        """Built by the tasks, where they are installed from."""
        return self.built

    def discard(self) -> None:
        """(And the files and task databases under the build root.)"""
        import glob
        import os
        import shutil

        super().discard()

        for scratch in ("staging", "progress"):
            shutil.rmtree(os.path.join(self.files.root, scratch), ignore_errors=True)
        for d in glob.glob(os.path.join(self.files.root, DIR_GLOB)):
            shutil.rmtree(d, ignore_errors=True)


def process(runs: Runs, snapshot, archives, consumer_config, report) -> None:
    """Runs of sub-topologies until nothing is pending (see the module docstring)."""
    from backfill.task_run import TaskRun

    ctx = runs.ctx
    topo = ctx.topo
    order = run_order(topo)
    reads = {i: set(topo.source_topics(i)) for i in order}
    last_run = {i: -1 for i in order}
    produced: list[tuple[int, dict[str, int]]] = []    # run -> internal rows per topic
    external_done: set[int] = set()
    flushed: set[int] = set()
    run_no = 0

    def pending_runs(sub):
        # (run last_run[sub] is the sub-topology's own: what it sent to itself is pending too,
        # e.g. a foreign-key join of a table with itself)
        return [r for r, per_topic in produced if r >= last_run[sub] and any(per_topic.get(t) for t in reads[sub])]

    while True:
        late = sorted(i for i in report.finalized if pending_runs(i))
        if late:   # the sanity check of is_last_run(): a written task can take no more records
            raise RuntimeError(f"backfill: internal error: rows for sub-topology {late[0]} after its last run")
        sub, flush = None, False
        for i in order:
            has_external = i not in external_done and any(
                e > s or t in (archives or {}) for (t, _), (s, e) in snapshot.items() if t in reads[i])
            if has_external or pending_runs(i):
                sub = i
                break
        if sub is None:
            sub = next((i for i in order if i not in flushed and defers_emissions(topo, i)), None)
            flush = True
            if sub is None:
                break
        t0 = time.monotonic()
        external = {}
        if sub not in external_done:
            # (a partition whose history is all in an archive, beyond Kafka's retention, counts too)
            external = {tp: r for tp, r in snapshot.items()
                        if tp[0] in reads[sub] and (r[1] > r[0] or tp[0] in (archives or {}))}
            external_done.add(sub)
        # the run is the sub-topology's last if nothing that may still run can send it a row (no
        # flush to come either): its tasks then write their changelogs at its end
        final = False
        if not flush:
            run_topics = {t for t, _ in external} | {
                t for r, per_topic in produced if r in pending_runs(sub) for t, c in per_topic.items()
                if c and t in reads[sub]}
            later_topics = {i: set(reads[i]) if i not in external_done or (defers_emissions(topo, i)
                                                                         and i not in flushed)
                            else {t for r, per_topic in produced if r >= last_run[i]
                                  for t, c in per_topic.items() if c and t in reads[i]}
                            for i in order if i != sub}
            final = is_last_run(topo, sub, run_topics, order, later_topics)
        spec = RunSpec(sub, run_no, flush, external, pending_runs(sub), sorted(reads[sub]),
                       {t: p for t, p in (archives or {}).items() if t in reads[sub]}, consumer_config, final)
        n_tasks = ctx.tasks_of(sub)
        total_rows = None if spec.archives else sum(e - s for (s, e) in external.values()) + sum(
            c for r, per_topic in produced if r in spec.pending for t, c in per_topic.items() if t in reads[sub])
        stats = runs.run(spec, reads[sub], TaskRun(ctx, spec),
                         f"run {run_no}: sub-topology {sub}{' (flush)' if flush else ''}", total_rows)
        raise_task_errors(stats)
        per_topic: dict[str, int] = {}
        n = 0
        for r in stats:
            n += r["records"]
            report.rows_read += r["read"]
            report.rows_replayed += r["replayed"]
            for t, c in r["failed"].items():
                report.failed_in_processing[t] = report.failed_in_processing.get(t, 0) + c
            for t, c in r["internal"].items():
                per_topic[t] = per_topic.get(t, 0) + c
        produced.append((run_no, per_topic))
        last_run[sub] = run_no
        if flush:
            flushed.add(sub)
        if final:
            report.finalized.add(sub)
            runs.state_of.pop(sub, None)
            for r in stats:
                for store, c in r["entries"].items():
                    report.rows_per_store[store] = report.rows_per_store.get(store, 0) + c
        else:
            runs.state_of[sub] = run_no
        # results something can still read: the stores of each sub-topology's last run, and the
        # rows of runs whose readers have not all run since
        keep = set(runs.state_of.values()) | {
            r for r, per_topic in produced
            if any(c and last_run[topo.subtopology_of_topic()[t]] <= r for t, c in per_topic.items())}
        runs.release(keep)
        report.records_processed += n
        secs = time.monotonic() - t0
        report.runs.append(RunRecord(sub, flush, n, secs))
        task_secs = {k: sum(r["seconds"].get(k, 0) for r in stats) for k in ("read", "process", "write")}
        superseded = sum(r["superseded"] for r in stats)
        for r in stats:
            if "build" in r:
                report.executor_builds[r["build"]] = report.executor_builds.get(r["build"], 0) + 1
        report.fk_records_superseded += superseded
        for r in stats:
            for tp in r.get("unordered", ()):
                log.warning("backfill: %s is replayed whole: its timestamps go backwards, so the "
                            "reduction to the last changes per key could reorder what its tasks meet", tp)
                report.unordered.append(tp)
        log.info("backfill run %d: sub-topology %d%s: %d records processed in %d task(s), %.1f s (in the "
                 "tasks: reading %.1f s, processing %.1f s, writing %.1f s%s), %s%s",
                 run_no, sub, " (flush)" if flush else "", n, n_tasks, secs, task_secs["read"],
                 task_secs["process"], task_secs["write"],
                 "; its last run: task changelogs written" if final else "",
                 ", ".join(f"{c} rows to {t}" for t, c in sorted(per_topic.items())) or "no internal rows",
                 f" ({superseded} superseded foreign-key join records not sent)" if superseded else "")
        run_no += 1


def finalize(runs: Runs, finalized: set) -> dict[str, int]:
    """Every task of every sub-topology not in ``finalized`` (with or without records; those of
    ``finalized`` were written by their last run): changelogs and commit record, and its
    database's contents for the driver. One Spark job. Returns entries per store."""
    from backfill.task_run import FinalizeTask

    ctx = runs.ctx
    subs = [sub for sub in range(len(ctx.topo.subtopologies)) if sub not in finalized]
    if not subs:
        return {}
    parts = [runs.inputs(sub, [], ()).mapPartitionsWithIndex(FinalizeTask(ctx, sub)) for sub in subs]
    rdd = runs.final_job(runs.sc.union(parts) if len(parts) > 1 else parts[0])
    n = sum(ctx.tasks_of(sub) for sub in subs)
    with StageProgress(runs.spark, f"writing the changelogs of {n} task(s)"):
        results = rdd.filter(_is("stats")).map(_payload).collect()
    raise_task_errors(results)
    runs.db_bytes += sum(r.get("db", 0) for r in results)
    runs.built += sum(r.get("built", 0) for r in results)
    for sub in subs:
        runs.state_of.pop(sub, None)
    runs.release(set())
    total: dict[str, int] = {}
    for r in results:
        for store, c in r["entries"].items():
            total[store] = total.get(store, 0) + c
    secs = {k: sum(r["seconds"][k] for r in results) for k in ("load", "changelogs")}
    log.info("backfill: the changelogs of %d task(s) written (in the tasks: loading %.1f s, changelogs %.1f s)",
             len(results), secs["load"], secs["changelogs"])
    return total


